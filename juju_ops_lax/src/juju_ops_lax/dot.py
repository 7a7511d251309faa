"""dot_general: any batch/contracting dimensions, as one batched matmul."""

from __future__ import annotations

import functools
import math

import numpy as np
from max.dtype import DType
from max.graph import ops

from juju import RuleSet
from juju import primitives as P
from juju.dtypes import max_shape
from juju_ops_lax._util import reshape_result, scalar
from juju_ops_lax import mixed

rules = RuleSet()


def _to_batched_matrix(x, shape, batch, contract, *, contract_last):
    """Permute to (batch, free, contract) [or (batch, contract, free)] and
    reshape to rank 3, or to rank 2 without batch dims: a plain matmul is much
    faster in MAX than a batch of one."""
    free = [d for d in range(len(shape)) if d not in batch and d not in contract]
    order = list(batch) + (free + list(contract) if contract_last else list(contract) + free)
    if order != list(range(len(shape))):
        x = ops.permute(x, order)
    b = math.prod(shape[d] for d in batch)
    f = math.prod(shape[d] for d in free)
    k = math.prod(shape[d] for d in contract)
    matrix = [f, k] if contract_last else [k, f]
    return ops.reshape(x, max_shape([b, *matrix] if batch else matrix)), [shape[d] for d in free]


@rules.register(P.dot_general_p)
def lower_dot_general(ctx, lhs, rhs, *, dimension_numbers, precision,
                      preferred_element_type, out_sharding):
    (lc, rc), (lb, rb) = dimension_numbers
    lhs_aval, rhs_aval = ctx.avals_in
    out_dtype = ctx.aval_out.dtype
    if any(lhs_aval.shape[d] == 0 for d in lc):
        # A sum of no products is 0; MAX's matmul over an empty contraction
        # leaves its result uninitialised.
        return ops.broadcast_to(scalar(ctx, 0, out_dtype), max_shape(ctx.aval_out.shape))
    compute = ctx.max_dtype(out_dtype)
    on_gpu = not ctx.device.is_cpu()
    if compute == DType.bool:
        # MAX cannot compile a bool matmul; XLA's is OR of ANDs: count the
        # true products in float32 (exact below 2^24 terms) and test for any.
        compute = DType.float32
    elif on_gpu and compute == DType.bfloat16:
        # MAX 26.7's GPU bf16 x bf16 -> bf16 matmul returns wrong rows (seen on
        # an H100, 64x128 @ 128x32). bf16 values are exact in fp32 (and TF32),
        # so an fp32 product rounded once is what XLA computes.
        compute = DType.float32
    if np.dtype(lhs_aval.dtype) != np.dtype(out_dtype) or compute != lhs.dtype:
        lhs = ops.cast(lhs, compute)
    if np.dtype(rhs_aval.dtype) != np.dtype(out_dtype) or compute != rhs.dtype:
        rhs = ops.cast(rhs, compute)
    a, lhs_free = _to_batched_matrix(lhs, lhs_aval.shape, lb, lc, contract_last=True)
    b, rhs_free = _to_batched_matrix(rhs, rhs_aval.shape, rb, rc, contract_last=False)
    if on_gpu and compute == DType.float32 and _wants_fp32(precision):
        product = _matmul_3xtf32(a, b)
    else:
        # CPU: fp32 throughout. GPU: MAX uses TF32 tensor cores, as XLA does
        # for jax's DEFAULT and HIGH precisions on GPU.
        product = ops.matmul(a, b)
    if ctx.max_dtype(out_dtype) == DType.bool:
        product = mixed.not_equal(product, ops.constant(0.0, DType.float32, device=product.device))
    elif product.dtype != ctx.max_dtype(out_dtype):
        product = ops.cast(product, ctx.max_dtype(out_dtype))
    batch_dims = [lhs_aval.shape[d] for d in lb]
    return reshape_result(product, batch_dims + lhs_free + rhs_free)


_FP32_PRESETS = ("F32_F32_F32", "TF32_TF32_F32_X3", "BF16_BF16_F32_X6", "BF16_BF16_F32_X9")


def _wants_fp32(precision) -> bool:
    """Whether `precision` (None, a pair of lax.Precision, or a dot algorithm
    preset) asks for full fp32 products: HIGHEST or an fp32-accurate preset."""
    if precision is None:
        return False
    if isinstance(precision, tuple):
        return any(getattr(p, "name", None) == "HIGHEST" for p in precision)
    return getattr(precision, "name", str(precision)) in _FP32_PRESETS


def _matmul_3xtf32(a, b):
    """An fp32-accurate product from TF32 matmuls: each operand is split into
    a high part of 11 significant bits (exact in TF32, by Veltkamp's split)
    and the exact remainder; hi*hi + hi*lo + lo*hi drops only lo*lo (~2^-24)."""
    a_hi, a_lo = _split_tf32(a)
    b_hi, b_lo = _split_tf32(b)
    cross = ops.matmul(a_hi, b_lo) + ops.matmul(a_lo, b_hi)
    return ops.matmul(a_hi, b_hi) + cross


def _split_tf32(x):
    # Veltkamp: c = x * (2^13 + 1), hi = c - (c - x). The select is there to
    # keep a GPU compiler from contracting x * 8193 - x into one FMA, which
    # would make hi not TF32-exact (the form without it gave TF32 accuracy on
    # an H100; the form with it has not run on a GPU yet). It also leaves huge
    # |x| whole (hi = x) instead of overflowing c.
    f32 = functools.partial(ops.constant, dtype=DType.float32, device=x.device)
    scaled = mixed.where(mixed.greater(f32(2.0 ** 100), ops.abs(x)), x * f32(8193.0), f32(0.0))
    hi = scaled - (scaled - x)
    return hi, x - hi
