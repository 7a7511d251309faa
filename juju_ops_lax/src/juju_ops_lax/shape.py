"""Shape primitives: broadcast, reshape, transpose, slice, concatenate, tile, iota."""

from __future__ import annotations

import numpy as np
from max.graph import DeviceRef, ops

from juju import RuleSet
from juju import primitives as P
from juju.primitives import dim_as_value_p, split_p, stack_p, tile_p, unstack_p
from juju.dtypes import max_dim, max_shape
from juju_ops_lax._util import reject, reshape_result

rules = RuleSet()


@rules.register(P.broadcast_in_dim_p)
def lower_broadcast_in_dim(ctx, x, *dyn_shape, shape, broadcast_dimensions, sharding):
    if dyn_shape:
        reject(ctx, dynamic_shape=dyn_shape)
    operand_shape = ctx.avals_in[0].shape
    # Put the operand's dims at their target positions, size 1 elsewhere.
    expanded = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = operand_shape[src]
    if tuple(expanded) != tuple(operand_shape):
        x = reshape_result(x, expanded)
    if tuple(expanded) == tuple(shape):
        return x
    return ops.broadcast_to(x, max_shape(shape))


@rules.register(P.reshape_p)
def lower_reshape(ctx, x, *dyn_shape, new_sizes, dimensions, sharding):
    if dimensions is not None:
        x = ops.permute(x, list(dimensions))
    return reshape_result(x, new_sizes)


@rules.register(P.squeeze_p)
def lower_squeeze(ctx, x, *, dimensions):
    return reshape_result(x, ctx.aval_out.shape)


@rules.register(P.transpose_p)
def lower_transpose(ctx, x, *, permutation):
    if tuple(permutation) == tuple(range(len(permutation))):
        return x
    return ops.permute(x, list(permutation))


@rules.register(P.concatenate_p)
def lower_concatenate(ctx, *xs, dimension):
    nonempty = [x for x, a in zip(xs, ctx.avals_in) if a.shape[dimension] != 0]
    if len(nonempty) == 1:
        return nonempty[0]
    return ops.concat(nonempty or xs[:1], axis=dimension)


@rules.register(P.slice_p)
def lower_slice(ctx, x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * len(start_indices)
    index = [slice(int(s), int(e), int(k)) for s, e, k in zip(start_indices, limit_indices, strides)]
    return ops.slice_tensor(x, index)


@rules.register(split_p)
def lower_split(ctx, x, *, sizes, axis):
    rank = len(ctx.avals_in[0].shape)
    outs, start = [], 0
    for size in sizes:
        index = [slice(None)] * rank
        index[axis] = slice(start, start + int(size))
        outs.append(ops.slice_tensor(x, index))
        start += int(size)
    return outs


@rules.register(stack_p)
def lower_stack(ctx, *xs, axis):
    return ops.stack(list(xs), axis=axis)


@rules.register(unstack_p)
def lower_unstack(ctx, x, *, axis):
    rank = len(ctx.avals_in[0].shape)
    outs = []
    for i in range(ctx.avals_in[0].shape[axis]):
        index = [slice(None)] * rank
        index[axis] = i  # an integer index drops the axis
        outs.append(x[tuple(index)])
    return outs


@rules.register(tile_p)
def lower_tile(ctx, x, *, reps):
    # As XLA lowers it: each axis n broadcast to (rep, n), then the pairs merged.
    shape = ctx.avals_in[0].shape
    paired = [d for n in shape for d in (1, n)]
    tiled = [d for r, n in zip(reps, shape) for d in (r, n)]
    expanded = ops.broadcast_to(ops.reshape(x, paired), tiled)
    return ops.reshape(expanded, list(ctx.aval_out.shape))


@rules.register(P.rev_p)
def lower_rev(ctx, x, *, dimensions):
    # MAX's slice_tensor has no negative steps: gather with reversed indices.
    shape = ctx.avals_in[0].shape
    for d in dimensions:
        if shape[d] > 1:
            index = ctx.constant(np.arange(shape[d] - 1, -1, -1, dtype=np.int64), np.int64)
            x = ops.gather(x, index, axis=d)
    return x


@rules.register(P.pad_p)
def lower_pad(ctx, x, padding_value, *, padding_config):
    """Interior padding first, as a pad of a unit axis after each spread axis
    that a reshape merges into it; then the edges: negative ones slice,
    positive ones pad. Two MAX pads at most: a concat per axis was ~15x
    slower than XLA's pad on an average pool's gradient."""
    shape = list(ctx.avals_in[0].shape)
    config = [tuple(int(v) for v in c) for c in padding_config]  # grads emit np.int64
    # An axis of n > 1 spread by `interior` gets n * (1 + interior) cells, the
    # last `interior` of them past its last element: they come off `hi`.
    spread = [interior if n > 1 else 0 for n, (_, _, interior) in zip(shape, config)]
    spread_shape = [n * (1 + s) for n, s in zip(shape, spread)]
    edges = [(lo, hi - s) for (lo, hi, _), s in zip(config, spread)]
    if any(n + min(lo, 0) + min(hi, 0) <= 0 for n, (lo, hi) in zip(spread_shape, edges)):
        # no element left (an empty operand or result among them): all padding
        return ops.broadcast_to(padding_value, list(ctx.aval_out.shape))
    fill = padding_value if ctx.device.is_cpu() else ops.transfer_to(padding_value, DeviceRef.CPU())
    if any(spread):
        # (.., n, ..) -> (.., n, 1, ..) -> (.., n, 1 + interior, ..) -> (.., n * (1 + interior), ..)
        expanded = [m for n, s in zip(shape, spread) for m in ((n, 1) if s else (n,))]
        pads = [p for s in spread for p in ((0, 0, 0, s) if s else (0, 0))]
        x = ops.reshape(ops.pad(ops.reshape(x, expanded), pads, value=fill), spread_shape)
    if any(lo < 0 or hi < 0 for lo, hi in edges):
        x = ops.slice_tensor(x, [slice(-min(lo, 0), n + min(hi, 0))
                                 for n, (lo, hi) in zip(spread_shape, edges)])
    if any(lo > 0 or hi > 0 for lo, hi in edges):
        x = ops.pad(x, [p for lo, hi in edges for p in (max(lo, 0), max(hi, 0))], value=fill)
    return x


@rules.register(dim_as_value_p)
def lower_dim_as_value(ctx, *, dim):
    # A (symbolic) dimension as a scalar value: under jax.export shape polymorphism.
    value = ops.reshape(ops.shape_to_tensor([max_dim(dim)]), [])
    if not ctx.device.is_cpu():
        value = ops.transfer_to(value, ctx.device)
    return ops.cast(value, ctx.max_dtype(ctx.aval_out.dtype))


@rules.register(P.iota_p)
def lower_iota(ctx, *dyn_shape, dtype, shape, dimension, sharding):
    if dyn_shape:
        reject(ctx, dynamic_shape=dyn_shape)
    n = shape[dimension]
    line = ctx.constant(np.arange(n), dtype)
    expanded = [1] * len(shape)
    expanded[dimension] = n
    return ops.broadcast_to(ops.reshape(line, expanded), list(shape))
