"""Small helpers shared by the lax rules."""

from __future__ import annotations

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
