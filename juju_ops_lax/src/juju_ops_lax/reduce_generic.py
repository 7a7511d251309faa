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

from juju import RuleSet, lower_fun
from juju._compat import primitives as P

rules = RuleSet()


def _body(jaxpr, consts=()):
    """A Python function applying a (closed) jaxpr body to whole arrays."""
    if hasattr(jaxpr, "jaxpr"):  # ClosedJaxpr
        consts, jaxpr = jaxpr.consts, jaxpr.jaxpr

    def apply(*args):
        return jax.core.eval_jaxpr(jaxpr, list(consts), *args)

    return apply


def _reduce_axis(xs, inits, combine, axis):
    """Reduce `axis` of every array in `xs` to size 1 by halving."""
    n = xs[0].shape[axis]
    if n == 0:
        shape = list(xs[0].shape)
        shape[axis] = 1
        return [lax.broadcast_in_dim(i, shape, ()) for i in inits]
    while n > 1:
        if n % 2:
            pad_shape = list(xs[0].shape)
            pad_shape[axis] = 1
            xs = [lax.concatenate([x, lax.broadcast_in_dim(i, pad_shape, ())], axis)
                  for x, i in zip(xs, inits)]
            n += 1
        half = n // 2
        lo = [lax.slice_in_dim(x, 0, half, axis=axis) for x in xs]
        hi = [lax.slice_in_dim(x, half, n, axis=axis) for x in xs]
        xs = list(combine(*lo, *hi))
        n = half
    return xs


def _reduce(*args, computation, jaxpr, dimensions):
    k = len(args) // 2
    xs, inits = list(args[:k]), list(args[k:])
    combine = _body(jaxpr)
    for axis in dimensions:
        xs = _reduce_axis(xs, inits, combine, axis)
    keep = [d for d in range(xs[0].ndim) if d not in dimensions]
    out_shape = [xs[0].shape[d] for d in keep]
    return [lax.reshape(x, out_shape) for x in xs]


rules.register(P.reduce_p)(lower_fun(_reduce, multiple_results=True))
