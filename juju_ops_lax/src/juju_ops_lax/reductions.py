"""Reductions: sum, prod, max, min, and/or, argmax/argmin."""

from __future__ import annotations

import math

import numpy as np
from max.graph import ops

from juju import RuleSet
from juju._compat import primitives as P
from juju.dtypes import max_shape, static_shape
from juju_ops_lax._util import is_bool, is_float, reduce_axis, scalar

rules = RuleSet()


def _reduce(op, ctx, x, axes):
    """Reduce `axes`: each run of adjacent axes merged into one (a reshape,
    free) and reduced at once, MAX keeping it as size 1; then drop them."""
    if not axes:
        return x
    shape = static_shape(ctx.avals_in[0].shape)
    if shape is None:  # symbolic dimensions: one axis at a time
        for axis in sorted(axes, reverse=True):
            x = reduce_axis(op, x, axis)
        return ops.reshape(x, max_shape(ctx.aval_out.shape))
    runs = []
    for axis in sorted(axes):
        if runs and runs[-1][-1] == axis - 1:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    for run in reversed(runs):  # from the back: earlier axes keep their index
        first, last = run[0], run[-1]
        merged = shape[:first] + [math.prod(shape[first:last + 1])] + shape[last + 1:]
        if len(run) > 1:
            x = ops.reshape(x, merged)
        x = reduce_axis(op, x, first, merged)
        shape = merged[:first] + [1] + merged[first + 1:]
    return ops.reshape(x, list(ctx.aval_out.shape))


@rules.register(P.reduce_sum_p)
def lower_reduce_sum(ctx, x, *, axes, out_sharding=None):
    if is_bool(ctx.avals_in[0].dtype):
        raise NotImplementedError("reduce_sum of bool")
    return _reduce(ops.sum, ctx, x, axes)


@rules.register(P.reduce_prod_p)
def lower_reduce_prod(ctx, x, *, axes, out_sharding=None):
    return _reduce(ops.prod, ctx, x, axes)


def _nan_aware(op):
    """XLA's max/min reductions return NaN if any element is NaN."""

    def lower(ctx, x, *, axes, out_sharding=None):
        dtype = ctx.avals_in[0].dtype
        if is_bool(dtype):  # max of bools is any, min is all
            as_int = ops.cast(x, ctx.max_dtype(np.int32))
            return ops.cast(_reduce(op, ctx, as_int, axes), ctx.max_dtype(np.bool_))
        result = _reduce(op, ctx, x, axes)
        if not is_float(dtype) or not axes:
            return result
        nan_mask = ops.cast(ops.is_nan(x), ctx.max_dtype(np.int32))
        any_nan = ops.greater(_reduce(ops.max, ctx, nan_mask, axes), scalar(ctx, 0, np.int32))
        return ops.where(any_nan, scalar(ctx, np.nan, dtype), result)

    lower.__qualname__ = f"lower_reduce_{op.__name__}"
    return lower


rules.register(P.reduce_max_p)(_nan_aware(ops.max))
rules.register(P.reduce_min_p)(_nan_aware(ops.min))


@rules.register(P.reduce_or_p)
def lower_reduce_or(ctx, x, *, axes):
    as_int = ops.cast(x, ctx.max_dtype(np.int32))
    return ops.cast(_reduce(ops.max, ctx, as_int, axes), ctx.max_dtype(np.bool_))


@rules.register(P.reduce_and_p)
def lower_reduce_and(ctx, x, *, axes):
    as_int = ops.cast(x, ctx.max_dtype(np.int32))
    return ops.cast(_reduce(ops.min, ctx, as_int, axes), ctx.max_dtype(np.bool_))


def _arg_reduce(op, name):
    def lower(ctx, x, *, axes, index_dtype):
        (axis,) = axes
        dtype = ctx.avals_in[0].dtype
        if ctx.avals_in[0].shape[axis] == 1:  # MAX's arg_max rejects a size-1 axis
            return ops.broadcast_to(scalar(ctx, 0, index_dtype), list(ctx.aval_out.shape))
        if is_bool(dtype):
            x = ops.cast(x, ctx.max_dtype(np.int32))
        elif is_float(dtype):
            # XLA treats NaN as the extreme value: the first NaN wins.
            nan = ops.is_nan(x)
            nan_as_int = ops.cast(nan, ctx.max_dtype(np.int32))
            nan_index = reduce_axis(ops.argmax, nan_as_int, axis)
            index = reduce_axis(op, x, axis)
            any_nan = reduce_axis(ops.max, nan_as_int, axis)
            index = ops.where(ops.greater(any_nan, scalar(ctx, 0, np.int32)), nan_index, index)
            return ops.reshape(ops.cast(index, ctx.max_dtype(index_dtype)), list(ctx.aval_out.shape))
        index = reduce_axis(op, x, axis)
        return ops.reshape(ops.cast(index, ctx.max_dtype(index_dtype)), list(ctx.aval_out.shape))

    lower.__qualname__ = f"lower_{name}"
    return lower


rules.register(P.argmax_p)(_arg_reduce(ops.argmax, "argmax"))
rules.register(P.argmin_p)(_arg_reduce(ops.argmin, "argmin"))
