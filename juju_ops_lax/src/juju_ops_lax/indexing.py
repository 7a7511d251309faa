"""gather, scatter (all combiners), dynamic_slice, dynamic_update_slice.

All of them lower the same way: compute, for every output (gather) or update
(scatter) element, its flat index into the operand with int64 arithmetic on
iotas, then do one 1-D `ops.gather` or `ops.scatter_nd*`. That handles every
XLA dimension-number combination (offset/collapsed/batching dims, windows,
index vectors in any order) with one code path.

Index modes, as XLA: CLIP and PROMISE_IN_BOUNDS clamp a gather's start
indices so the whole slice is in bounds; FILL_OR_DROP gathers fill slices that
would be out of bounds, and scatters drop update windows that would be. A
dropped update is sent to an extra "trash" element appended to the flat
operand, which is sliced off afterwards.
"""

from __future__ import annotations

import math

import numpy as np
from max.graph import ops

from juju import RuleSet
from juju import primitives as P
from juju_ops_lax._util import exact_unfused_copy, is_bool, is_float, is_signed_int, scalar
from juju_ops_lax import mixed

rules = RuleSet()

_I64 = np.int64


def _mode_name(mode) -> str:
    return getattr(mode, "name", str(mode)).upper()


def _iota(ctx, shape, dim):
    """int64 tensor of `shape` whose value is the coordinate along `dim`."""
    n = shape[dim]
    expanded = [1] * len(shape)
    expanded[dim] = n
    line = ops.reshape(ctx.constant(np.arange(n, dtype=_I64), _I64), expanded)
    return line


def _strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return list(reversed(strides))


def _index_column(ctx, idx, k, batch_shape, out_rank, positions):
    """idx[..., k] (shape `batch_shape`) reshaped to rank `out_rank` with the
    batch dims at `positions` and size 1 elsewhere."""
    rank = len(batch_shape) + 1
    column = ops.slice_tensor(idx, [slice(None)] * (rank - 1) + [slice(k, k + 1)])
    shape = [1] * out_rank
    for i, d in enumerate(positions):
        shape[d] = batch_shape[i]
    return ops.reshape(column, shape)


def _combine_flat(ctx, parts, out_shape):
    """sum(part * stride), broadcast to out_shape, as int64."""
    total = None
    for part in parts:
        total = part if total is None else ops.add(total, part)
    if total is None:
        total = ctx.constant(np.zeros((), _I64), _I64)
    return ops.broadcast_to(total, list(out_shape))


def _all(ctx, masks, shape):
    result = None
    for m in masks:
        result = m if result is None else ops.logical_and(result, m)
    return ops.broadcast_to(result, list(shape)) if result is not None else None


def _fill_value(dtype, fill_value):
    if fill_value is not None:
        return fill_value
    if is_float(dtype):
        return np.nan
    if is_bool(dtype):
        return True
    if is_signed_int(dtype):
        return np.iinfo(dtype).min
    return np.iinfo(dtype).max


def _zeros(ctx, shape, dtype):
    return ops.broadcast_to(scalar(ctx, 0, dtype), list(shape))


# --- gather ------------------------------------------------------------------


def _gather_flat(ctx, operand, indices, dnums, slice_sizes, mode):
    """(flat operand index of every output element, validity mask or None)."""
    op_shape = ctx.avals_in[0].shape
    idx_shape = ctx.avals_in[1].shape
    out_shape = ctx.aval_out.shape
    out_rank = len(out_shape)
    batch_shape = idx_shape[:-1]
    batch_pos = [d for d in range(out_rank) if d not in dnums.offset_dims]
    idx = ops.cast(indices, ctx.max_dtype(_I64))
    strides = _strides(op_shape)
    parts, masks = [], []
    fill = _mode_name(mode) == "FILL_OR_DROP"
    for k, d in enumerate(dnums.start_index_map):
        s = _index_column(ctx, idx, k, batch_shape, out_rank, batch_pos)
        hi = scalar(ctx, op_shape[d] - slice_sizes[d], _I64)
        lo = scalar(ctx, 0, _I64)
        if fill:
            masks.append(ops.logical_and(mixed.greater_equal(s, lo), mixed.greater_equal(hi, s)))
        s = ops.min(ops.max(s, lo), hi)
        parts.append(ops.mul(s, scalar(ctx, strides[d], _I64)))
    for k, d in enumerate(dnums.operand_batching_dims):
        b = batch_pos[dnums.start_indices_batching_dims[k]]
        parts.append(ops.mul(_iota(ctx, out_shape, b), scalar(ctx, strides[d], _I64)))
    window = [
        d for d in range(len(op_shape))
        if d not in dnums.collapsed_slice_dims and d not in dnums.operand_batching_dims
    ]
    for i, d in enumerate(window):
        parts.append(ops.mul(_iota(ctx, out_shape, dnums.offset_dims[i]),
                             scalar(ctx, strides[d], _I64)))
    flat = _combine_flat(ctx, parts, out_shape)
    return flat, _all(ctx, masks, out_shape) if fill else None


@rules.register(P.gather_p)
def lower_gather(ctx, operand, indices, *, dimension_numbers, slice_sizes,
                 indices_are_sorted, unique_indices, mode, fill_value):
    if _mode_name(mode) == "ONE_HOT":
        raise NotImplementedError("gather: parameter mode=ONE_HOT is not supported")
    dtype = ctx.avals_in[0].dtype
    out_shape = list(ctx.aval_out.shape)
    if math.prod(out_shape) == 0:
        return _zeros(ctx, out_shape, dtype)
    if math.prod(ctx.avals_in[0].shape) == 0:  # only fill can produce values
        value = _fill_value(dtype, fill_value)
        return ops.broadcast_to(scalar(ctx, value, dtype), out_shape)
    flat, valid = _gather_flat(ctx, operand, indices, dimension_numbers, slice_sizes, mode)
    result = ops.gather(ops.reshape(operand, [-1]), ops.reshape(flat, [-1]), axis=0)
    result = ops.reshape(result, out_shape)
    if len(out_shape) >= 2 and all(n == 1 for n in slice_sizes):
        # MAX 26.7 fuses such a gather, through elementwise ops, into a later
        # gather's indices and then rejects its own kernel ("constraint
        # failed" in gather_scatter.mojo): jnp.searchsorted of 2-D queries,
        # any binary search. Element gathers with 1-D indices compile.
        result = exact_unfused_copy(ctx, result, dtype)
    if valid is not None:
        fill = scalar(ctx, _fill_value(dtype, fill_value), dtype)
        result = mixed.where(valid, result, fill)
    return result


# --- scatter -----------------------------------------------------------------


def _scatter_flat(ctx, indices, dnums, mode):
    """(flat operand index of every update element, validity mask or None)."""
    op_shape = ctx.avals_in[0].shape
    idx_shape = ctx.avals_in[1].shape
    upd_shape = ctx.avals_in[2].shape
    upd_rank = len(upd_shape)
    batch_shape = idx_shape[:-1]
    scatter_pos = [d for d in range(upd_rank) if d not in dnums.update_window_dims]
    window = [
        d for d in range(len(op_shape))
        if d not in dnums.inserted_window_dims and d not in dnums.operand_batching_dims
    ]
    window_size = {d: upd_shape[dnums.update_window_dims[i]] for i, d in enumerate(window)}
    idx = ops.cast(indices, ctx.max_dtype(_I64))
    strides = _strides(op_shape)
    parts, masks = [], []
    clip = _mode_name(mode) == "CLIP"
    for k, d in enumerate(dnums.scatter_dims_to_operand_dims):
        s = _index_column(ctx, idx, k, batch_shape, upd_rank, scatter_pos)
        hi = scalar(ctx, op_shape[d] - window_size.get(d, 1), _I64)
        lo = scalar(ctx, 0, _I64)
        if clip:
            s = ops.min(ops.max(s, lo), hi)
        else:
            masks.append(ops.logical_and(mixed.greater_equal(s, lo), mixed.greater_equal(hi, s)))
        parts.append(ops.mul(s, scalar(ctx, strides[d], _I64)))
    for k, d in enumerate(dnums.operand_batching_dims):
        b = scatter_pos[dnums.scatter_indices_batching_dims[k]]
        parts.append(ops.mul(_iota(ctx, upd_shape, b), scalar(ctx, strides[d], _I64)))
    for i, d in enumerate(window):
        parts.append(ops.mul(_iota(ctx, upd_shape, dnums.update_window_dims[i]),
                             scalar(ctx, strides[d], _I64)))
    flat = _combine_flat(ctx, parts, upd_shape)
    return flat, _all(ctx, masks, upd_shape)


def scatter_targets(ctx, indices, dimension_numbers, mode):
    """The flat operand index [m] (int64) of each of a scatter's m update
    elements, in the updates' order; n (one past the operand's end) for an
    update that `mode` drops. For rules of the scatter primitives (lax's and
    juju-kernels-mojo's)."""
    flat, valid = _scatter_flat(ctx, indices, dimension_numbers, mode)
    n = math.prod(ctx.avals_in[0].shape)
    if valid is not None:
        flat = mixed.where(valid, flat, scalar(ctx, n, _I64))
    return ops.reshape(flat, [math.prod(ctx.avals_in[2].shape)])


def _scatter_rule(combine):
    def lower(ctx, operand, indices, updates, *, update_jaxpr, update_consts,
              dimension_numbers, indices_are_sorted, unique_indices, mode):
        if _mode_name(mode) == "ONE_HOT":
            raise NotImplementedError(f"{ctx.primitive.name}: parameter mode=ONE_HOT")
        op_shape = list(ctx.avals_in[0].shape)
        dtype = ctx.avals_in[0].dtype
        n = math.prod(op_shape)
        m = math.prod(ctx.avals_in[2].shape)
        if n == 0 or m == 0:
            return operand
        flat = scatter_targets(ctx, indices, dimension_numbers, mode)
        # slot n takes the dropped updates
        target = ops.concat([ops.reshape(operand, [n]),
                             ops.reshape(scalar(ctx, 0, dtype), [1])], axis=0)
        result = combine(ctx, target, ops.reshape(updates, [m]), ops.reshape(flat, [m, 1]))
        return ops.reshape(ops.slice_tensor(result, [slice(0, n)]), op_shape)

    return lower


def _scatter_replace(ctx, target, updates, flat):
    return ops.scatter_nd(target, updates, flat)


def _via_int(op):
    """Bool scatter-add/mul/min/max: as int32 (add is `or`, mul/min `and`)."""

    def combine(ctx, target, updates, flat):
        if not is_bool(ctx.avals_in[0].dtype):
            return _nan_aware(ctx, op, target, updates, flat)
        i32 = ctx.max_dtype(np.int32)
        out = op(ops.cast(target, i32), ops.cast(updates, i32), flat)
        return mixed.not_equal(out, scalar(ctx, 0, np.int32))

    return combine


def _nan_aware(ctx, op, target, updates, flat):
    """XLA's scatter-max/min propagate NaN from either side."""
    out = op(target, updates, flat)
    if op not in (ops.scatter_nd_max, ops.scatter_nd_min) or not is_float(ctx.avals_in[0].dtype):
        return out
    i32 = ctx.max_dtype(np.int32)
    hit = ops.scatter_nd_max(ops.cast(ops.is_nan(target), i32),
                             ops.cast(ops.is_nan(updates), i32), flat)
    nan = scalar(ctx, np.nan, ctx.avals_in[0].dtype)
    return mixed.where(mixed.greater(hit, scalar(ctx, 0, np.int32)), nan, out)


rules.register(P.scatter_p)(_scatter_rule(_scatter_replace))
rules.register(P.scatter_add_p)(_scatter_rule(_via_int(ops.scatter_nd_add)))
rules.register(P.scatter_mul_p)(_scatter_rule(_via_int(ops.scatter_nd_mul)))
rules.register(P.scatter_min_p)(_scatter_rule(_via_int(ops.scatter_nd_min)))
rules.register(P.scatter_max_p)(_scatter_rule(_via_int(ops.scatter_nd_max)))


# --- dynamic_slice / dynamic_update_slice -------------------------------------


def _dynamic_flat(ctx, starts, op_shape, window_shape):
    """Flat operand index of each element of a window at clamped `starts`."""
    strides = _strides(op_shape)
    parts = []
    for d, start in enumerate(starts):
        s = ops.cast(start, ctx.max_dtype(_I64))
        hi = scalar(ctx, op_shape[d] - window_shape[d], _I64)
        s = ops.min(ops.max(s, scalar(ctx, 0, _I64)), hi)
        offset = ops.add(_iota(ctx, window_shape, d), s)
        parts.append(ops.mul(offset, scalar(ctx, strides[d], _I64)))
    return _combine_flat(ctx, parts, window_shape)


@rules.register(P.dynamic_slice_p)
def lower_dynamic_slice(ctx, operand, *starts_and_dyn, slice_sizes):
    rank = len(ctx.avals_in[0].shape)
    starts = starts_and_dyn[:rank]
    if len(starts_and_dyn) != rank:
        raise NotImplementedError("dynamic_slice: dynamic slice sizes")
    out_shape = list(slice_sizes)
    if math.prod(out_shape) == 0:
        return _zeros(ctx, out_shape, ctx.avals_in[0].dtype)
    flat = _dynamic_flat(ctx, starts, ctx.avals_in[0].shape, out_shape)
    result = ops.gather(ops.reshape(operand, [-1]), ops.reshape(flat, [-1]), axis=0)
    return ops.reshape(result, out_shape)


@rules.register(P.dynamic_update_slice_p)
def lower_dynamic_update_slice(ctx, operand, update, *starts):
    op_shape = list(ctx.avals_in[0].shape)
    upd_shape = list(ctx.avals_in[1].shape)
    n, m = math.prod(op_shape), math.prod(upd_shape)
    if n == 0 or m == 0:
        return operand
    flat = _dynamic_flat(ctx, starts, op_shape, upd_shape)
    result = ops.scatter_nd(ops.reshape(operand, [n]), ops.reshape(update, [m]),
                            ops.reshape(flat, [m, 1]))
    return ops.reshape(result, op_shape)
