"""Entry point of the lax pack."""

import juju

from juju_ops_lax import (
    bits,
    cumulative,
    control_flow,
    dot,
    elementwise,
    indexing,
    reductions,
    shape,
    sorting,
    special,
    windowed,
)


@juju.hookimpl
def juju_rules():
    return [
        elementwise.rules,
        shape.rules,
        reductions.rules,
        dot.rules,
        indexing.rules,
        special.rules,
        cumulative.rules,
        sorting.rules,
        bits.rules,
        windowed.rules,
        control_flow.rules,
    ]
