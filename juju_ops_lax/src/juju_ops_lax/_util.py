"""Small helpers shared by the lax rules."""

from __future__ import annotations

import math

import numpy as np
from max.graph import ops


def full_like(ctx, value, like, dtype=None):
    """A constant `value` broadcast to the shape of `like`."""
    dtype = dtype if dtype is not None else ctx.avals_in[0].dtype
    return ops.broadcast_to(ctx.constant(value, dtype), like.shape)


def scalar(ctx, value, dtype):
    return ctx.constant(np.asarray(value, dtype=dtype), dtype)


def is_float(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating) or np.dtype(dtype).kind == "V"


def is_signed_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.signedinteger)


def is_unsigned_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.unsignedinteger)


def is_bool(dtype) -> bool:
    return np.dtype(dtype) == np.bool_


def reject(ctx, **params):
    """Raise for params whose value this rule does not implement."""
    for name, value in params.items():
        raise NotImplementedError(
            f"{ctx.primitive.name}: parameter {name}={value!r} is not supported"
        )


def reduce_axis(op, x, axis: int, shape=None):
    """`op(x, axis=axis)` (a MAX reduction keeping the axis as size 1), in a
    form MAX 26.7 computes correctly.

    MAX's graph compiler rewrites a reduction of a broadcast tensor wrongly
    when the broadcast axis precedes the reduced one: `broadcast_to` from
    [3, 1, 3] to [3, 3, 3] then `sum(axis=2)` gives wrong values, and
    non-square shapes fail to compile. Reducing the middle axis of the
    [pre, K, post] reshape never hits that rewrite; the reshapes are free.
    """
    shape = [int(d) for d in (shape if shape is not None else x.shape)]
    axis = axis % len(shape) if shape else 0
    pre, post = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    reduced = op(ops.reshape(x, [pre, shape[axis], post]), axis=1)
    return ops.reshape(reduced, shape[:axis] + [1] + shape[axis + 1:])
