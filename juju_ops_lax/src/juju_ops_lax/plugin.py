"""Entry point of the lax pack."""

import juju

from juju_ops_lax import (
    bits,
    complex_numbers,
    cumulative,
    control_flow,
    dot,
    elementwise,
    fft,
    indexing,
    jacobi,
    linalg,
    prng,
    reduce_generic,
    reductions,
    rewrites,
    rng_bit_generator,
    shape,
    sorting,
    special,
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
        linalg.rules,
        jacobi.rules,
        fft.rules,
        prng.rules,
        complex_numbers.rules,
        rng_bit_generator.rules,
        reduce_generic.rules,
        control_flow.rules,
    ]


@juju.hookimpl
def juju_jaxpr_rewrites():
    return [rewrites.everywhere(r) for r in (rewrites.fold_transposed_dots,
                                             rewrites.fold_transposed_operands,
                                             rewrites.fold_reduced_broadcasts,
                                             rewrites.fold_constant_powers,
                                             rewrites.fold_trivial_selects,
                                             rewrites.fold_one_element_reductions,
                                             rewrites.fold_boolean_products,
                                             rewrites.hoist_loop_invariants)]
