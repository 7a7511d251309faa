"""conv_general_dilated onto MAX's conv2d/conv3d, in full generality.

MAX convolves channels-last inputs (N, *spatial, C) with (*spatial, I, O)
filters, for 2 or 3 spatial dims, with strides, filter dilation, non-negative
padding and feature groups. Everything else is brought into that form:

- any dimension_numbers: permute lhs/rhs in, permute the result out;
- 1-D convolutions: a unit spatial dim in front, then conv2d;
- lhs_dilation (transposed convolutions, input gradients): zeros inserted
  with a reshape/pad trick, then a plain convolution;
- negative padding (from gradients): a crop;
- batch_group_count (filter gradients of grouped convs): one convolution per
  group on contiguous batch slices, concatenated along the output features;
- preferred_element_type: the operands are cast to the result type first
  (float32 for float16/bfloat16 results, rounded at the end, as XLA);
- integer convolutions: computed in float64 (exact below 2**53), in 16-bit
  limbs for wider operands, then wrapped to the integer result type;
- complex convolutions: four real convolutions of the parts (`juju.on_parts`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from max.dtype import DType
from max.graph import ops

from juju import ALL_DTYPES, RuleSet, on_parts
from juju import primitives as P
from juju.lowering_helpers import C, has_complex, with_dtype
from juju_ops_nn._layout import dilate, pad_or_crop

rules = RuleSet()


@rules.register(P.conv_general_dilated_p)
def lower_conv_general_dilated(ctx, lhs, rhs, *, window_strides, padding, lhs_dilation,
                               rhs_dilation, dimension_numbers, feature_group_count,
                               batch_group_count, precision, preferred_element_type,
                               out_sharding=None):
    # `precision` picks XLA's reduced-precision passes on TPU/GPU; MAX computes
    # float32 convolutions in float32, which is at least as precise.
    lhs_aval, rhs_aval = ctx.avals_in
    out_dtype = np.dtype(ctx.aval_out.dtype)
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    if 0 in ctx.aval_out.shape:
        # A window larger than the padded input leaves no output positions;
        # MAX's ConvOp rejects such a filter instead of returning nothing.
        return ops.broadcast_to(ctx.constant(0, out_dtype), list(ctx.aval_out.shape))
    if not (np.issubdtype(out_dtype, np.floating) or out_dtype.kind == "V"):
        return _integer_convolution(
            ctx, lhs, rhs, window_strides=window_strides, padding=padding,
            lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
            dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
            batch_group_count=batch_group_count, precision=precision,
        )
    nd = len(lhs_spec) - 2
    if nd not in (1, 2, 3):
        raise NotImplementedError(
            f"conv_general_dilated: {nd} spatial dimensions (dimension_numbers="
            f"{dimension_numbers}); MAX convolves 1-, 2- and 3-D"
        )
    # Half-precision convolutions accumulate in float32 and round once, as
    # XLA's CPU backend does (MAX's own would sum in the half type).
    compute = np.dtype(np.float32) if out_dtype.itemsize == 2 else out_dtype
    if np.dtype(lhs_aval.dtype) != compute:
        lhs = ops.cast(lhs, ctx.max_dtype(compute))
    if np.dtype(rhs_aval.dtype) != compute:
        rhs = ops.cast(rhs, ctx.max_dtype(compute))

    # Channels last: lhs (N, *S, C), rhs (*S, I, O).
    lhs_order = [lhs_spec[0], *lhs_spec[2:], lhs_spec[1]]
    rhs_order = [*rhs_spec[2:], rhs_spec[1], rhs_spec[0]]
    lhs = _permute(lhs, lhs_order)
    rhs = _permute(rhs, rhs_order)
    lhs_shape = [lhs_aval.shape[d] for d in lhs_order]
    rhs_shape = [rhs_aval.shape[d] for d in rhs_order]
    strides = [int(s) for s in window_strides]
    rhs_dil = [int(d) for d in rhs_dilation]
    pads = [(int(lo), int(hi)) for lo, hi in padding]

    if any(int(d) != 1 for d in lhs_dilation):
        lhs, lhs_shape = dilate(lhs, lhs_shape, [1, *lhs_dilation, 1])
    if any(lo < 0 or hi < 0 for lo, hi in pads) or any(int(d) != 1 for d in lhs_dilation):
        # Apply the padding explicitly (it may crop); MAX then pads nothing.
        lhs = pad_or_crop(lhs, lhs_shape, [(0, 0), *pads, (0, 0)])
        lhs_shape = [lhs_shape[0]] + [
            n + lo + hi for n, (lo, hi) in zip(lhs_shape[1:-1], pads)
        ] + [lhs_shape[-1]]
        pads = [(0, 0)] * nd

    if nd == 1:  # as 2-D with a unit spatial dim in front
        lhs = ops.reshape(lhs, [lhs_shape[0], 1, *lhs_shape[1:]])
        rhs = ops.reshape(rhs, [1, *rhs_shape])
        strides, rhs_dil, pads = [1, *strides], [1, *rhs_dil], [(0, 0), *pads]

    if batch_group_count == 1:
        out = _conv(lhs, rhs, strides, rhs_dil, pads, feature_group_count)
    else:
        groups = int(batch_group_count)
        n, o = lhs_shape[0], rhs_shape[-1]
        nb, ob = n // groups, o // groups
        parts = []
        for g in range(groups):
            lhs_g = ops.slice_tensor(
                lhs, [slice(g * nb, (g + 1) * nb)] + [slice(None)] * (lhs.rank - 1)
            )
            rhs_g = ops.slice_tensor(
                rhs, [slice(None)] * (rhs.rank - 1) + [slice(g * ob, (g + 1) * ob)]
            )
            parts.append(_conv(lhs_g, rhs_g, strides, rhs_dil, pads, feature_group_count))
        out = ops.concat(parts, axis=-1)

    # out is (N, *S_out, O) [with the extra unit dim for 1-D].
    out_shape = ctx.aval_out.shape
    n_out, o_out = out_shape[out_spec[0]], out_shape[out_spec[1]]
    spatial_out = [out_shape[d] for d in out_spec[2:]]
    out = ops.reshape(out, [n_out, *spatial_out, o_out])
    perm = [0] * (nd + 2)
    perm[out_spec[0]] = 0
    perm[out_spec[1]] = nd + 1
    for i, d in enumerate(out_spec[2:]):
        perm[d] = 1 + i
    out = _permute(out, perm)
    return out if compute == out_dtype else ops.cast(out, ctx.max_dtype(out_dtype))


_LIMB = 1 << 16


def _integer_convolution(ctx, lhs, rhs, **params):
    """MAX convolves floats only. Integer sums are exact in float64 while they
    stay under 2**53; the result then wraps to the output type as XLA's
    integer arithmetic does. Wider operands are split into 16-bit limbs
    (x = sum_i x_i 2^(16 i)); each pair of limbs convolves exactly in float64
    and the pairs add up in int64, wrapping like XLA's sum."""
    lhs_aval, rhs_aval = ctx.avals_in
    out_dtype = np.dtype(ctx.aval_out.dtype)
    rhs_spec = params["dimension_numbers"][1]
    terms = math.prod(rhs_aval.shape[d] for d in rhs_spec[1:])
    float_ctx = with_dtype(ctx, np.float64)

    def exact(a, b):
        product = lower_conv_general_dilated(
            float_ctx, ops.cast(a, DType.float64), ops.cast(b, DType.float64),
            preferred_element_type=np.dtype(np.float64), **params)
        return ops.cast(product, DType.int64)

    if _magnitude(lhs_aval.dtype) * _magnitude(rhs_aval.dtype) * terms < 2**53:
        return ops.cast(exact(lhs, rhs), ctx.max_dtype(out_dtype))
    if (_LIMB - 1) ** 2 * terms >= 2**53:
        raise NotImplementedError(
            f"conv_general_dilated: {terms} products per output are too many to sum "
            f"{lhs_aval.dtype} x {rhs_aval.dtype} exactly in float64, even in 16-bit limbs"
        )
    out_bits = 8 * out_dtype.itemsize
    total = None
    for i, a in enumerate(_limbs(lhs, lhs_aval.dtype)):
        for j, b in enumerate(_limbs(rhs, rhs_aval.dtype)):
            shift = 16 * (i + j)
            if shift >= out_bits:
                continue  # a multiple of 2^out_bits: wraps to zero
            part = exact(a, b)
            if shift:
                part = part * ops.constant(1 << shift, DType.int64, device=part.device)
            total = part if total is None else total + part
    return ops.cast(total, ctx.max_dtype(out_dtype))


def _limbs(x, dtype) -> list:
    """int64 limbs x_0, x_1, ... with x = sum_i x_i 2^(16 i): all but the top
    one in [0, 2^16), the top one signed (the two's-complement bits of x)."""
    x = ops.cast(x, DType.int64)
    limb = ops.constant(_LIMB, DType.int64, device=x.device)
    limbs = []
    for _ in range(max(1, np.dtype(dtype).itemsize // 2) - 1):
        high = ops.floor_div(x, limb)
        limbs.append(x - high * limb)
        x = high
    return limbs + [x]


def _magnitude(dtype) -> int:
    """The largest absolute value of an integer (or bool) dtype."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return 1
    info = np.iinfo(dtype)
    return max(abs(int(info.min)), int(info.max))


def _permute(x, order):
    order = [int(d) for d in order]
    return x if order == list(range(len(order))) else ops.permute(x, order)


def _conv(lhs, rhs, strides, dilation, pads, groups):
    if groups == 1 and len(strides) == 2:
        out = _few_outputs_conv(lhs, rhs, strides, dilation, pads)
        if out is not None:
            return out
    padding = tuple(p for pair in pads for p in pair)
    conv = ops.conv2d if len(strides) == 2 else ops.conv3d
    return conv(lhs, rhs, stride=tuple(strides), dilation=tuple(dilation),
                padding=padding, groups=int(groups))


# At most this many output positions, with a window at least WINDOW_RATIO
# times larger: the filter gradient of a convolution (its window is the whole
# image, its output the filter's 3x3). MAX's direct convolution took 0.66 ms
# for the first conv of benchmarks/bench_nn.py's CNN (jax.jit 0.31 ms).
FEW_OUTPUTS = 16
WINDOW_RATIO = 4


def _few_outputs_conv(lhs, rhs, strides, dilation, pads):
    """A convolution with few output positions and a large window as one
    matmul, [positions * N, window * C] @ [window * C, O], of the input window
    under each output position; None when the shapes are not of that kind."""
    lhs_shape = [int(d) for d in lhs.shape]
    rhs_shape = [int(d) for d in rhs.shape]
    window, (c, o), n = rhs_shape[:-2], rhs_shape[-2:], lhs_shape[0]
    padded = [m + lo + hi for m, (lo, hi) in zip(lhs_shape[1:-1], pads)]
    out_spatial = [(m - (w - 1) * d - 1) // s + 1
                   for m, w, d, s in zip(padded, window, dilation, strides)]
    positions = math.prod(out_spatial)
    if (min(out_spatial) < 1 or positions > FEW_OUTPUTS
            or math.prod(window) < WINDOW_RATIO * positions):
        return None
    lhs = pad_or_crop(lhs, lhs_shape, [(0, 0), *pads, (0, 0)])
    k = math.prod(window) * c
    rows = []
    for position in itertools.product(*(range(m) for m in out_spatial)):
        index = [slice(None)] + [slice(p * s, p * s + (w - 1) * d + 1, d)
                                 for p, s, w, d in zip(position, strides, window, dilation)]
        rows.append(ops.reshape(ops.slice_tensor(lhs, index + [slice(None)]), [n, k]))
    out = ops.matmul(ops.concat(rows, axis=0) if len(rows) > 1 else rows[0],
                     ops.reshape(rhs, [k, o]))
    out = ops.permute(ops.reshape(out, [positions, n, o]), [1, 0, 2])
    return ops.reshape(out, [n, *out_spatial, o])


def _complex_conv(lhs, rhs, **params):
    """A convolution is bilinear: four real convolutions of the parts."""
    from jax import lax

    if params["preferred_element_type"] is not None:
        params["preferred_element_type"] = np.finfo(params["preferred_element_type"]).dtype

    def conv(a, b):
        return lax.conv_general_dilated_p.bind(a, b, **params)

    if not isinstance(lhs, C):
        return C(conv(lhs, rhs.re), conv(lhs, rhs.im))
    if not isinstance(rhs, C):
        return C(conv(lhs.re, rhs), conv(lhs.im, rhs))
    return C(conv(lhs.re, rhs.re) - conv(lhs.im, rhs.im),
             conv(lhs.re, rhs.im) + conv(lhs.im, rhs.re))


rules.register(P.conv_general_dilated_p, priority=1, guard=has_complex, dtypes=ALL_DTYPES)(
    on_parts(_complex_conv)
)
