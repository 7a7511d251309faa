"""Entry point of the lax pack."""

import juju

from juju_ops_lax import (
    control_flow,
    dot,
    elementwise,
    indexing,
    reductions,
    shape,
)


@juju.hookimpl
def juju_rules():
    return [
        elementwise.rules,
        shape.rules,
        reductions.rules,
        dot.rules,
        indexing.rules,
        control_flow.rules,
    ]
