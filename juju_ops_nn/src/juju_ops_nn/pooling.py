"""Windowed reductions (pooling) and the max-pool gradients.

Every window position becomes one strided slice of the (base-dilated, padded)
input; the slices are combined with the reduction's monoid. MAX fuses the
slices and the elementwise combination into one loop nest, and it handles any
rank, window dilation and base dilation. The gradients of max pooling
(`select_and_scatter_add`, `select_and_gather_add`) use the same slices and
pick the first maximum in row-major window order, like XLA's `ge` selection.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from max.dtype import DType
from max.graph import ops

from juju import RuleSet
from juju.dtypes import is_float
from juju.lowering_helpers import with_dtype
from juju import primitives as P
from juju._compat import ClosedJaxpr
from juju_ops_lax.elementwise import maximum, minimum
from juju_ops_lax import mixed
from juju_ops_nn._layout import dilate, pad_or_crop, window_slices

rules = RuleSet()


def _extreme(dtype, sign):
    """The identity of max (sign=-1) or min (sign=+1) for `dtype`."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return sign > 0
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return int(info.max if sign > 0 else info.min)
    return float("inf") * sign


def _prepare(ctx, x, shape, base_dilation, padding, init):
    """Base-dilate and pad `x` with `init` (a Python scalar)."""
    x, shape = dilate(x, shape, base_dilation, value=init)
    x = pad_or_crop(x, shape, padding, value=init)
    shape = [n + int(lo) + int(hi) for n, (lo, hi) in zip(shape, padding)]
    return x, shape


def _reduce_window(op, identity, float_op=None):
    """`float_op`, where given, combines floats: XLA's max/min propagate NaN
    and order -0.0 below +0.0, MAX's do neither."""

    def lower(ctx, x, *, window_dimensions, window_strides, padding, base_dilation,
              window_dilation):
        aval = ctx.avals_in[0]
        init = identity(aval.dtype)
        combine = float_op if float_op is not None and is_float(aval.dtype) else op
        x, shape = _prepare(ctx, x, list(aval.shape), base_dilation, padding, init)
        acc = None
        for _, view in window_slices(x, shape, window_dimensions, window_strides,
                                     window_dilation, ctx.aval_out.shape):
            acc = view if acc is None else combine(acc, view)
        return acc

    lower.__qualname__ = f"lower_reduce_window_{op.__name__}"
    return lower


rules.register(P.reduce_window_sum_p)(_reduce_window(ops.add, lambda d: 0))
rules.register(P.reduce_window_max_p)(_reduce_window(ops.max, lambda d: _extreme(d, -1), maximum))
rules.register(P.reduce_window_min_p)(_reduce_window(ops.min, lambda d: _extreme(d, +1), minimum))


@functools.lru_cache(maxsize=256)
def _vectorized_body(jaxpr, consts, n, dtypes):
    """The scalar monoid body as a jaxpr over flat vectors of length n."""
    body = jax.extend.core.jaxpr_as_fun(ClosedJaxpr(jaxpr, list(consts)))
    structs = [jax.ShapeDtypeStruct((n,), d) for d in dtypes + dtypes]
    return jax.make_jaxpr(jax.vmap(body))(*structs)


@rules.register(P.reduce_window_p)
def lower_reduce_window(ctx, *operands_and_inits, jaxpr, consts, window_dimensions,
                        window_strides, padding, base_dilation, window_dilation):
    k = len(operands_and_inits) // 2
    operands, inits = operands_and_inits[:k], operands_and_inits[k:]
    in_shape = list(ctx.avals_in[0].shape)
    out_shape = list(ctx.avals_out[0].shape)
    # XLA CPU skips the positions that padding or base dilation add: windows
    # fold only the operand's own elements into the init values.
    fills = any(int(d) != 1 for d in base_dilation) or any(int(lo) or int(hi) for lo, hi in padding)
    views_per_operand = []
    for x, init in zip(operands, inits):
        x, shape = _prepare(ctx, x, in_shape, base_dilation, padding, 0)
        views_per_operand.append(
            [v for _, v in window_slices(x, shape, window_dimensions, window_strides,
                                         window_dilation, out_shape)]
        )
    size = int(np.prod(out_shape))
    keeps = None
    if fills:
        real = ctx.constant(_real_positions(in_shape, base_dilation, padding), np.bool_)
        keeps = [ops.reshape(v, [size]) for _, v in window_slices(
            real, shape, window_dimensions, window_strides, window_dilation, out_shape)]
    dtypes = tuple(np.dtype(a.dtype) for a in ctx.avals_in[:k])
    body = _vectorized_body(jaxpr, tuple(consts), size, dtypes)
    flat = lambda v: ops.reshape(v, [size])  # noqa: E731
    # XLA folds every window from the init values (an init that is not the
    # monoid's identity counts once per output element).
    acc = [ops.broadcast_to(ops.reshape(init, [1]), [size]) for init in inits]
    for i in range(len(views_per_operand[0])):
        new = ctx.lower(body, *acc, *(flat(views[i]) for views in views_per_operand))
        acc = new if keeps is None else [mixed.where(keeps[i], n, a) for n, a in zip(new, acc)]
    return [ops.reshape(a, out_shape) for a in acc]


def _real_positions(shape, base_dilation, padding):
    """Boolean mask, in dilated+padded coordinates, of the input's elements."""
    mask = np.ones(shape, bool)
    for axis, k in enumerate(base_dilation):
        k = int(k)
        if k != 1:
            n = mask.shape[axis]
            new = list(mask.shape)
            new[axis] = (n - 1) * k + 1
            out = np.zeros(new, bool)
            index = [slice(None)] * len(new)
            index[axis] = slice(None, None, k)
            out[tuple(index)] = mask
            mask = out
    pads = []
    crops = []
    for lo, hi in padding:
        lo, hi = int(lo), int(hi)
        pads.append((max(lo, 0), max(hi, 0)))
        crops.append((max(-lo, 0), max(-hi, 0)))
    mask = np.pad(mask, pads)
    return mask[tuple(slice(lo, mask.shape[i] - hi) for i, (lo, hi) in enumerate(crops))]


def _select_op(select_prim):
    name = getattr(select_prim, "name", str(select_prim))
    if name not in ("ge", "le", "gt", "lt"):
        raise NotImplementedError(f"select_prim={name} is not supported")
    return name


@rules.register(P.select_and_scatter_add_p)
def lower_select_and_scatter_add(ctx, source, operand, *, select_prim, window_dimensions,
                                 window_strides, padding):
    if np.dtype(ctx.avals_in[0].dtype) == np.bool_:
        # MAX compiles no bool max/add: select on int32 copies (False < True
        # keeps the order), then a nonzero sum is XLA's bool add, an OR.
        total = lower_select_and_scatter_add(
            with_dtype(ctx, np.int32), ops.cast(source, DType.int32), ops.cast(operand, DType.int32),
            select_prim=select_prim, window_dimensions=window_dimensions,
            window_strides=window_strides, padding=padding)
        return mixed.not_equal(total, ops.constant(0, DType.int32, device=total.device))
    name = _select_op(select_prim)
    aval = ctx.avals_in[1]
    sign = -1 if name in ("ge", "gt") else +1
    x, shape = _prepare(ctx, operand, list(aval.shape), [1] * len(aval.shape), padding,
                        _extreme(aval.dtype, sign))
    out_shape = list(ctx.avals_in[0].shape)
    ones = [1] * len(shape)
    pick = ops.max if sign < 0 else ops.min
    views = list(window_slices(x, shape, window_dimensions, window_strides, ones, out_shape))
    best = views[0][1]
    for _, v in views[1:]:
        best = pick(best, v)
    zero = ops.broadcast_to(ctx.constant(0, ctx.avals_in[0].dtype), out_shape)
    tiles = _tiles(shape, window_dimensions, window_strides, padding, out_shape)
    taken = None
    total = None
    contributions = {}
    for offset, view in views:
        hit = mixed.equal(view, best)
        if taken is not None:
            hit = ops.logical_and(hit, ops.logical_not(taken))
            taken = ops.logical_or(taken, hit)
        else:
            taken = hit
        contribution = mixed.where(hit, source, zero)
        if tiles:
            contributions[offset] = contribution
            continue
        spread, spread_shape = dilate(contribution, out_shape, window_strides)
        placed = pad_or_crop(
            spread, spread_shape,
            [(o, n - o - m) for o, n, m in zip(offset, shape, spread_shape)],
        )
        total = placed if total is None else ops.add(total, placed)
    if tiles:
        return _interleave(contributions, out_shape, window_dimensions)
    return pad_or_crop(total, shape, [(-int(lo), -int(hi)) for lo, hi in padding])


def _tiles(shape, window, strides, padding, out_shape) -> bool:
    """Windows that tile the operand exactly (stride = window, no padding), as
    in ordinary max pooling: every input element is in exactly one window."""
    return all(
        int(w) == int(s) and int(lo) == 0 and int(hi) == 0 and int(n) == int(m) * int(s)
        for w, s, (lo, hi), n, m in zip(window, strides, padding, shape, out_shape)
    )


def _interleave(contributions, out_shape, window):
    """The input-shaped result from one out-shaped tensor per window offset:
    element (o * w + k) of each axis comes from offset k, output position o.
    One stack and reshape per pooled axis, instead of zero-inserting and
    padding every offset's tensor to full size."""
    items, shape = dict(contributions), list(out_shape)
    for axis in reversed(range(len(window))):
        w = int(window[axis])
        groups: dict = {}
        for offset, tensor in items.items():
            groups.setdefault(offset[:axis] + offset[axis + 1:], [None] * w)[offset[axis]] = tensor
        if w == 1:
            items = {key: parts[0] for key, parts in groups.items()}
            continue
        merged = shape[:axis] + [shape[axis] * w] + shape[axis + 1:]
        items = {
            key: ops.reshape(ops.stack(parts, axis=axis + 1), merged)
            for key, parts in groups.items()
        }
        shape = merged
    (result,) = items.values()
    return result


@rules.register(P.select_and_gather_add_p)
def lower_select_and_gather_add(ctx, tangents, operand, *, select_prim, window_dimensions,
                                window_strides, padding, base_dilation, window_dilation):
    name = _select_op(select_prim)
    aval = ctx.avals_in[1]
    sign = -1 if name in ("ge", "gt") else +1
    in_shape = list(aval.shape)
    x, shape = _prepare(ctx, operand, in_shape, base_dilation, padding, _extreme(aval.dtype, sign))
    t, _ = _prepare(ctx, tangents, in_shape, base_dilation, padding, 0)
    out_shape = list(ctx.aval_out.shape)
    x_views = [v for _, v in window_slices(x, shape, window_dimensions, window_strides,
                                           window_dilation, out_shape)]
    t_views = [v for _, v in window_slices(t, shape, window_dimensions, window_strides,
                                           window_dilation, out_shape)]
    best_x, best_t = x_views[0], t_views[0]
    for xv, tv in zip(x_views[1:], t_views[1:]):
        # Strictly better only: the first extreme in window order wins.
        better = mixed.greater(xv, best_x) if sign < 0 else mixed.greater(best_x, xv)
        best_x = mixed.where(better, xv, best_x)
        best_t = mixed.where(better, tv, best_t)
    return best_t
