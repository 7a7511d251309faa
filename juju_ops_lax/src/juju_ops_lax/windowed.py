"""reduce (generic, any monoid body), reduce_window (generic and sum/max/min).

Both are decompositions into lax primitives that have rules (`lower_fun`):
- reduce: a tree of halvings along the reduced dimensions, combining the
  halves with the body applied to whole arrays (its equations are scalar
  elementwise primitives, so they apply to arrays unchanged);
- reduce_window: one `pad` (edge padding and base dilation, filled with the
  init value), then the body folds in one strided slice per window position.
Fine for the window sizes of pooling layers; a large window unrolls.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
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


def _windows(xs, inits, combine, window_dimensions, window_strides, padding,
             base_dilation, window_dilation):
    config = [(lo, hi, b - 1) for (lo, hi), b in zip(padding, base_dilation)]
    padded = [lax.pad(x, i, config) for x, i in zip(xs, inits)]
    shape = padded[0].shape
    out_shape = []
    for n, w, s, d in zip(shape, window_dimensions, window_strides, window_dilation):
        span = (w - 1) * d + 1
        out_shape.append(max(0, (n - span) // s + 1) if n >= span else 0)
    acc = [lax.broadcast_in_dim(i, out_shape, ()) for i in inits]
    if 0 in out_shape:
        return acc
    for offset in itertools.product(*(range(w) for w in window_dimensions)):
        start = [o * d for o, d in zip(offset, window_dilation)]
        limit = [st + (m - 1) * s + 1 for st, m, s in zip(start, out_shape, window_strides)]
        window = [lax.slice(p, start, limit, window_strides) for p in padded]
        acc = list(combine(*acc, *window))
    return acc


def _reduce_window(*args, jaxpr, consts, window_dimensions, window_strides, padding,
                   base_dilation, window_dilation):
    k = len(args) // 2
    return _windows(list(args[:k]), list(args[k:]), _body(jaxpr, consts), window_dimensions,
                    window_strides, padding, base_dilation, window_dilation)


rules.register(P.reduce_window_p)(lower_fun(_reduce_window, multiple_results=True))


def _monoid(op, identity):
    def reduce_window(x, *, window_dimensions, window_strides, padding, base_dilation,
                      window_dilation):
        init = np.array(identity(x.dtype), dtype=x.dtype)
        (out,) = _windows([x], [init], lambda a, b: (op(a, b),), window_dimensions,
                          window_strides, padding, base_dilation, window_dilation)
        return out

    return reduce_window


def _lowest(dtype):
    if np.dtype(dtype) == np.bool_:
        return False
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).min
    return -np.inf


def _highest(dtype):
    if np.dtype(dtype) == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return np.inf


rules.register(P.reduce_window_sum_p)(lower_fun(_monoid(lax.add, lambda d: 0)))
rules.register(P.reduce_window_max_p)(lower_fun(_monoid(lax.max, _lowest)))
rules.register(P.reduce_window_min_p)(lower_fun(_monoid(lax.min, _highest)))
