"""Reductions: sum, prod, max, min, and/or/xor, argmax/argmin."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
from jax import lax
from max.graph import ops

from juju import RuleSet, lower_fun
from juju import primitives as P
from juju.dtypes import max_shape, static_shape
from juju_ops_lax._util import (
    is_bool, is_float, is_negative_zero, reduce_axis, scalar, scalar_copy, sum_to_shape,
    unfused_copy,
)
from juju_ops_lax import mixed

rules = RuleSet()


def _reduce(op, ctx, x, axes, identity=None):
    """Reduce `axes`: each run of adjacent axes merged into one (a reshape,
    free) and reduced at once, MAX keeping it as size 1; then drop them.
    `identity`: the result of an empty reduction, when not op's own."""
    if not axes:
        return x
    shape = static_shape(ctx.avals_in[0].shape)
    if shape is not None and any(shape[axis] == 0 for axis in axes):
        # Nothing to reduce: the identity (MAX's reduction leaves memory unset).
        dtype = x.dtype.to_numpy()
        value = np.asarray(_identity(op, dtype) if identity is None else identity, dtype)
        return ops.broadcast_to(ctx.constant(value, value.dtype), list(ctx.aval_out.shape))
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
    if op is ops.sum:
        return sum_to_shape(x, ctx.aval_out.shape)
    if not ctx.aval_out.shape:
        return scalar_copy(x)
    return ops.reshape(x, list(ctx.aval_out.shape))


def _reduce_bools(op, ctx, x, axes):
    """max (any) or min (all) of bools, as int32 0/1."""
    as_int = ops.cast(x, ctx.max_dtype(np.int32))
    reduced = _reduce(op, ctx, as_int, axes, identity=int(op is ops.min))
    return ops.cast(reduced, ctx.max_dtype(np.bool_))


def _identity(op, dtype):
    """op's identity on `dtype`."""
    if op is ops.sum:
        return 0
    if op is ops.prod:
        return 1
    if np.issubdtype(dtype, np.floating):
        return -np.inf if op is ops.max else np.inf
    info = np.iinfo(dtype)
    return info.min if op is ops.max else info.max


@rules.register(P.reduce_sum_p)
def lower_reduce_sum(ctx, x, *, axes, out_sharding=None):
    dtype = ctx.avals_in[0].dtype
    if is_bool(dtype):
        raise NotImplementedError("reduce_sum of bool")
    if is_float(dtype) and _short_last_axis(ctx, axes):
        return _fold_short_axis(ops.add, ctx, x)
    return _reduce(ops.sum, ctx, x, axes)


@rules.register(P.reduce_prod_p)
def lower_reduce_prod(ctx, x, *, axes, out_sharding=None):
    return _reduce(ops.prod, ctx, x, axes)


#: A float sum/max/min over a last axis this short is an elementwise fold.
SHORT_AXIS = 8


def _fold_short_axis(op, ctx, x):
    """sum/max/min over the last axis of k <= SHORT_AXIS elements as k - 1
    elementwise steps over its slices (max/min with a NaN flag carried
    along): one pass MAX fuses into the producer, where its reduction kernel
    over a short last axis (and the second one for max's NaN mask) took 2-4x
    as long as XLA's loop. A sum adds in index order."""
    shape = list(ctx.avals_in[0].shape)
    keep = [slice(None)] * (len(shape) - 1)
    parts = [ops.slice_tensor(x, keep + [slice(j, j + 1)]) for j in range(shape[-1])]
    result = parts[0]
    for part in parts[1:]:
        result = op(result, part)
    if op is not ops.add:  # max/min: XLA's NaN propagation
        nan = ops.is_nan(parts[0])
        for part in parts[1:]:
            nan = ops.logical_or(nan, ops.is_nan(part))
        result = mixed.where(nan, scalar(ctx, np.nan, ctx.avals_in[0].dtype), result)
    # Written to memory: MAX would fuse the fold, and with it the producer of
    # all k slices, into each element a consumer reads (a logsumexp's
    # exp(x - max) took 5x as long). The sign of a zero max/min is MAX's
    # pick here, as in XLA's own reductions of large arrays (docs/testing.md):
    # a third chain for it recomputed the producer (vmapped log-probs 0.94 ->
    # 1.8).
    return unfused_copy(ops.reshape(result, list(ctx.aval_out.shape)))


def _short_last_axis(ctx, axes) -> bool:
    shape = static_shape(ctx.avals_in[0].shape)
    return (shape is not None and tuple(axes) == (len(shape) - 1,)
            and 2 <= shape[-1] <= SHORT_AXIS and math.prod(shape) >= 2**12)


def _nan_aware(op):
    """XLA's float max/min reductions: NaN if any element is NaN, -inf (max)
    or +inf (min) where every element is that infinity, and +0.0 (max) or
    -0.0 (min) where that zero meets the other one.

    MAX's float max reduction starts from the lowest finite value, not -inf
    (and min from the largest), so a row of -infs (a fully masked row of
    attention logits, `jnp.max(x, where=mask, initial=-inf)`) came out as
    -3.4e38; it drops NaN and keeps whichever zero it met first. One int32
    reduction of a per-element flag finds every case: 3 for NaN, 2 for the
    zero that wins (+0.0 for max), 0 for the op's identity infinity, 1 for
    anything else."""
    is_max = op is ops.max

    def lower(ctx, x, *, axes, out_sharding=None):
        dtype = ctx.avals_in[0].dtype
        if is_bool(dtype):  # max of bools is any, min is all
            return _reduce_bools(op, ctx, x, axes)
        if is_float(dtype) and _short_last_axis(ctx, axes):
            return _fold_short_axis(op, ctx, x)
        result = _reduce(op, ctx, x, axes)
        if not is_float(dtype) or not axes:
            return result
        int32 = ctx.max_dtype(np.int32)
        zero = scalar(ctx, 0, dtype)
        on_side = mixed.greater(zero, x) if is_max else mixed.greater(x, zero)
        at_identity = ops.logical_and(ops.is_inf(x), on_side)
        is_zero = mixed.equal(x, zero)
        negative_zero = is_negative_zero(ctx, x, dtype, is_zero)
        winning_zero = (ops.logical_and(is_zero, ops.logical_not(negative_zero))
                        if is_max else negative_zero)
        flag = mixed.where(ops.is_nan(x), scalar(ctx, 3, np.int32),
                           mixed.where(winning_zero, scalar(ctx, 2, np.int32),
                                       ops.cast(ops.logical_not(at_identity), int32)))
        worst = _reduce(ops.max, ctx, flag, axes)
        identity = -np.inf if is_max else np.inf
        result = mixed.where(mixed.equal(worst, scalar(ctx, 0, np.int32)),
                             scalar(ctx, identity, dtype), result)
        meets_winner = ops.logical_and(mixed.equal(worst, scalar(ctx, 2, np.int32)),
                                       mixed.equal(result, zero))
        result = mixed.where(meets_winner, scalar(ctx, 0.0 if is_max else -0.0, dtype), result)
        return mixed.where(mixed.equal(worst, scalar(ctx, 3, np.int32)),
                           scalar(ctx, np.nan, dtype), result)

    lower.__qualname__ = f"lower_reduce_{op.__name__}"
    return lower


rules.register(P.reduce_max_p)(_nan_aware(ops.max))
rules.register(P.reduce_min_p)(_nan_aware(ops.min))


def _fold(combine, identity, x, *, axes):
    """Reduce `axes` of x with a bitwise `combine`, by halving (MAX has no
    bitwise reduction): log2(n) elementwise steps per axis."""
    from juju_ops_lax.reduce_generic import _reduce_axis

    out_shape = [n for d, n in enumerate(x.shape) if d not in axes]
    if any(x.shape[d] == 0 for d in axes):
        return lax.full(out_shape, identity(x.dtype), x.dtype)
    for axis in axes:
        (x,) = _reduce_axis([x], lambda a, b: [combine(a, b)], axis)
    return lax.reshape(x, out_shape)


def _bitwise_reduce(combine, identity, bool_op):
    """and/or/xor over axes: on bools the int32 min/max when there is one
    (`bool_op`), on integers (bitwise, XLA allows them) the halving fold."""
    fold = lower_fun(partial(_fold, combine, identity))

    def lower(ctx, x, *, axes):
        if bool_op is not None and is_bool(ctx.avals_in[0].dtype):
            return _reduce_bools(bool_op, ctx, x, axes)
        return fold(ctx, x, axes=axes)

    lower.decomposition = fold.decomposition
    return lower


def _all_ones(dtype):
    return np.array(-1).astype(dtype) if not is_bool(dtype) else True


rules.register(P.reduce_or_p)(_bitwise_reduce(lax.bitwise_or, lambda dtype: 0, ops.max))
rules.register(P.reduce_and_p)(_bitwise_reduce(lax.bitwise_and, _all_ones, ops.min))
rules.register(P.reduce_xor_p)(_bitwise_reduce(lax.bitwise_xor, lambda dtype: 0, None))


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
            nan_seen = reduce_axis(ops.max, nan_as_int, axis)
            any_nan = mixed.greater(nan_seen, scalar(ctx, 0, np.int32))
            index = mixed.where(any_nan, nan_index, index)
            return ops.reshape(ops.cast(index, ctx.max_dtype(index_dtype)), list(ctx.aval_out.shape))
        index = reduce_axis(op, x, axis)
        return ops.reshape(ops.cast(index, ctx.max_dtype(index_dtype)), list(ctx.aval_out.shape))

    lower.__qualname__ = f"lower_{name}"
    return lower


rules.register(P.argmax_p)(_arg_reduce(ops.argmax, "argmax"))
rules.register(P.argmin_p)(_arg_reduce(ops.argmin, "argmin"))
