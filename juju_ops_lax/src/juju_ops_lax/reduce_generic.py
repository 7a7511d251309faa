"""reduce: the generic reduction, with any monoid body and several operands.

A decomposition into lax primitives that have rules (`lower_fun`): a tree of
halvings along the reduced dimensions, combining the halves with the body
applied to whole arrays (its equations are scalar elementwise primitives, so
they apply to arrays unchanged). The reduce_window family lives in the nn
pack (juju_ops_nn/pooling.py).
"""

from __future__ import annotations

import jax
from jax import lax

from juju import ALL_DTYPES, RuleSet, lower_fun
from juju import primitives as P

# A decomposition traced in JAX on the equation's own avals (complex too).
rules = RuleSet(dtypes=ALL_DTYPES)


def _body(jaxpr, consts=()):
    """A Python function applying a (closed) jaxpr body to whole arrays."""
    if hasattr(jaxpr, "jaxpr"):  # ClosedJaxpr
        consts, jaxpr = jaxpr.consts, jaxpr.jaxpr

    def apply(*args):
        return jax.core.eval_jaxpr(jaxpr, list(consts), *args)

    return apply


def _reduce_axis(xs, combine, axis):
    """Reduce `axis` (size >= 1) of every array in `xs` to size 1 by halving."""
    n = xs[0].shape[axis]
    while n > 1:
        half = n // 2
        lo = [lax.slice_in_dim(x, 0, half, axis=axis) for x in xs]
        hi = [lax.slice_in_dim(x, half, 2 * half, axis=axis) for x in xs]
        merged = list(combine(*lo, *hi))
        if n % 2:  # fold the odd element into the first one
            first = [lax.slice_in_dim(m, 0, 1, axis=axis) for m in merged]
            last = [lax.slice_in_dim(x, n - 1, n, axis=axis) for x in xs]
            first = list(combine(*first, *last))
            merged = [lax.concatenate([f, lax.slice_in_dim(m, 1, half, axis=axis)], axis)
                      for f, m in zip(first, merged)]
        xs = merged
        n = half
    return xs


def _reduce(*args, computation, jaxpr, dimensions):
    """The init value is combined in exactly once, as XLA's CPU backend does."""
    k = len(args) // 2
    xs, inits = list(args[:k]), list(args[k:])
    combine = _body(jaxpr)
    keep = [d for d in range(xs[0].ndim) if d not in dimensions]
    out_shape = [xs[0].shape[d] for d in keep]
    if any(xs[0].shape[d] == 0 for d in dimensions):
        return [lax.broadcast_in_dim(i, out_shape, ()) for i in inits]
    for axis in dimensions:
        xs = _reduce_axis(xs, combine, axis)
    xs = [lax.reshape(x, out_shape) for x in xs]
    return list(combine(*xs, *[lax.broadcast_in_dim(i, out_shape, ()) for i in inits]))


rules.register(P.reduce_p)(lower_fun(_reduce, multiple_results=True))
