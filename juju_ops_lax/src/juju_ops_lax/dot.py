"""dot_general: any batch/contracting dimensions, as one batched matmul.

Two rules. `lower_dot_general` serves every engine: `ops.matmul(a, b)` with
`b` as (contracting, free). On a GPU engine `lower_dot_general_gpu` wins:
where `b` already is (free, contracting) in memory (`x @ w.T`, attention's
`q @ k.T`, most backward products) the product takes the transposed-B form
MAX's own models use, `ops.matmul(a, ops.transpose(bt))`, with no copy;
elsewhere the plain form, with no copy either.

What MAX 26.7 compiles, read off MEFs compiled for a virtual sm_90a GPU
(docs/gpu.md): its Hopper (sm90) warp-specialised tensor-core kernel for
bfloat16 in the transposed-B form when `bt` is a graph input; its generic
multistage kernel for bfloat16 in the plain form (wrong for more than 8
rows: modular/modular#6883), for float32 in both forms, and for a bfloat16
`bt` computed in the graph (a copy of `b` made to get the transposed-B form
is undone: MAX fuses the transpose into the copy's kernel, through a select
or a cumsum alike). So bfloat16 products are computed in float32 unless
`JUJU_GPU_MATMUL=tensor_cores` or vendor BLAS (`JUJU_GPU_VENDOR_BLAS=1`,
cuBLAS for every product) says otherwise.
"""

from __future__ import annotations

import functools
import math
import os
import warnings

import numpy as np
from max.dtype import DType
from max.graph import ops

from juju import RuleSet
from juju import primitives as P
from juju.compile_worker import gpu_vendor_blas
from juju.dtypes import max_shape
from juju_ops_lax._util import reshape_result, scalar
from juju_ops_lax import mixed

rules = RuleSet()

#: `JUJU_GPU_MATMUL`, read whenever a product is lowered for a GPU engine:
#: `fp32` (default): bfloat16 products computed in float32 (TF32 tensor
#: cores, exact for bf16 values) and rounded once, right in every form;
#: `tensor_cores`: bfloat16 products in bfloat16 where `b` is (free,
#: contracting) in memory, MAX's sm90 tensor-core form (float32 elsewhere);
#: right only where MAX keeps that form (docs/gpu.md). With vendor BLAS
#: (`JUJU_GPU_VENDOR_BLAS=1`) bfloat16 products are bfloat16 in any form.
GPU_MATMUL_ENV = "JUJU_GPU_MATMUL"
GPU_MATMUL_MODES = ("fp32", "tensor_cores")


def gpu_matmul_mode() -> str:
    """The GPU bfloat16 product mode `JUJU_GPU_MATMUL` asks for."""
    value = os.environ.get(GPU_MATMUL_ENV, "").strip().lower() or GPU_MATMUL_MODES[0]
    if value not in GPU_MATMUL_MODES:
        warnings.warn(f"juju-ops-lax: {GPU_MATMUL_ENV}={value!r} is none of "
                      f"{', '.join(GPU_MATMUL_MODES)}; using {GPU_MATMUL_MODES[0]}",
                      RuntimeWarning, stacklevel=2)
        return GPU_MATMUL_MODES[0]
    return value


def _order(rank, batch, contract, *, contract_last):
    """The permutation to (batch, free, contract) [or (batch, contract, free)]
    and the free dims."""
    free = [d for d in range(rank) if d not in batch and d not in contract]
    return list(batch) + (free + list(contract) if contract_last else list(contract) + free), free


def _to_batched_matrix(x, shape, batch, contract, *, contract_last):
    """Permute to (batch, free, contract) [or (batch, contract, free)] and
    reshape to rank 3, or to rank 2 without batch dims: a plain matmul is much
    faster in MAX than a batch of one."""
    order, free = _order(len(shape), batch, contract, contract_last=contract_last)
    if order != list(range(len(shape))):
        x = ops.permute(x, order)
    b = math.prod(shape[d] for d in batch)
    f = math.prod(shape[d] for d in free)
    k = math.prod(shape[d] for d in contract)
    matrix = [f, k] if contract_last else [k, f]
    target = [b, *matrix] if batch else matrix
    if list(x.shape) != target:
        x = ops.reshape(x, max_shape(target))
    return x, [shape[d] for d in free]


def _is_n_by_k(shape, batch, contract) -> bool:
    """Whether operand b is (batch, free, contract) in memory already."""
    order, _ = _order(len(shape), batch, contract, contract_last=True)
    return order == list(range(len(shape)))


@rules.register(P.dot_general_p)
def lower_dot_general(ctx, lhs, rhs, *, dimension_numbers, precision,
                      preferred_element_type, out_sharding):
    return _lower(ctx, lhs, rhs, dimension_numbers, precision, transposed_b=False)


def _on_gpu(ctx) -> bool:
    return not ctx.device.is_cpu()


_on_gpu.__qualname__ = "GPU engine"


@rules.register(P.dot_general_p, priority=1, guard=_on_gpu)
def lower_dot_general_gpu(ctx, lhs, rhs, *, dimension_numbers, precision,
                          preferred_element_type, out_sharding):
    return _lower(ctx, lhs, rhs, dimension_numbers, precision, transposed_b=True)


def _lower(ctx, lhs, rhs, dimension_numbers, precision, *, transposed_b):
    (lc, rc), (lb, rb) = dimension_numbers
    lhs_aval, rhs_aval = ctx.avals_in
    out_dtype = ctx.aval_out.dtype
    if any(lhs_aval.shape[d] == 0 for d in lc):
        # A sum of no products is 0; MAX's matmul over an empty contraction
        # leaves its result uninitialised.
        return ops.broadcast_to(scalar(ctx, 0, out_dtype), max_shape(ctx.aval_out.shape))
    on_gpu = not ctx.device.is_cpu()
    compute = _compute_dtype(ctx, out_dtype, on_gpu, transposed_b)
    lhs = _cast(lhs, lhs_aval, out_dtype, compute)
    rhs = _cast(rhs, rhs_aval, out_dtype, compute)
    a, lhs_free = _to_batched_matrix(lhs, lhs_aval.shape, lb, lc, contract_last=True)
    if transposed_b and _is_n_by_k(rhs_aval.shape, rb, rc):
        # b is (N, K) in memory: the transposed-B form costs nothing
        b, rhs_free = _to_batched_matrix(rhs, rhs_aval.shape, rb, rc, contract_last=True)
        matmul = _matmul_transposed_b
    else:
        b, rhs_free = _to_batched_matrix(rhs, rhs_aval.shape, rb, rc, contract_last=False)
        matmul = ops.matmul
    if on_gpu and a.dtype == DType.float32 and _wants_fp32(precision):
        product = _matmul_3xtf32(a, b, matmul)
    else:
        # CPU: fp32 throughout. GPU: MAX uses TF32 tensor cores, as XLA does
        # for jax's DEFAULT and HIGH precisions on GPU.
        product = matmul(a, b)
    if ctx.max_dtype(out_dtype) == DType.bool:
        product = mixed.not_equal(product, ops.constant(0.0, DType.float32, device=product.device))
    elif product.dtype != ctx.max_dtype(out_dtype):
        product = ops.cast(product, ctx.max_dtype(out_dtype))
    batch_dims = [lhs_aval.shape[d] for d in lb]
    return reshape_result(product, batch_dims + lhs_free + rhs_free)


def _compute_dtype(ctx, out_dtype, on_gpu, transposed_b):
    compute = ctx.max_dtype(out_dtype)
    if compute == DType.bool:
        # MAX cannot compile a bool matmul; XLA's is OR of ANDs: count the
        # true products in float32 (exact below 2^24 terms) and test for any.
        return DType.float32
    if on_gpu and compute == DType.bfloat16 and not (
            gpu_vendor_blas() or (transposed_b and gpu_matmul_mode() == "tensor_cores"
                                  and _sm90_bf16_form(ctx))):
        # bf16 values are exact in fp32 (and TF32), so an fp32 product rounded
        # once is what XLA computes: right, at TF32 speed.
        return DType.float32
    return compute


def _sm90_bf16_form(ctx) -> bool:
    """Whether this bf16 product takes the transposed-B form with no copy
    and shapes MAX's sm90 dispatch takes: static N and K, K a multiple of 4
    bytes (its cp.async loads), N a multiple of 8 (its output tiles)."""
    (lc, rc), (lb, rb) = ctx.params["dimension_numbers"]
    lhs_shape, rhs_shape = (aval.shape for aval in ctx.avals_in)
    if not _is_n_by_k(rhs_shape, rb, rc):
        return False
    _, free = _order(len(rhs_shape), rb, rc, contract_last=True)
    dims = [lhs_shape[d] for d in lc] + [rhs_shape[d] for d in free]
    if not all(isinstance(d, (int, np.integer)) for d in dims):
        return False  # a symbolic dimension
    return math.prod(dims[:len(lc)]) % 2 == 0 and math.prod(dims[len(lc):]) % 8 == 0


def _cast(x, aval, out_dtype, compute):
    if np.dtype(aval.dtype) != np.dtype(out_dtype) or compute != x.dtype:
        return ops.cast(x, compute)
    return x


def _matmul_transposed_b(a, bt):
    """a @ bt.T, written as MAX's models write `x @ w.T`."""
    return ops.matmul(a, ops.transpose(bt, -1, -2))


_FP32_PRESETS = ("F32_F32_F32", "TF32_TF32_F32_X3", "BF16_BF16_F32_X6", "BF16_BF16_F32_X9")


def _wants_fp32(precision) -> bool:
    """Whether `precision` (None, a pair of lax.Precision, or a dot algorithm
    preset) asks for full fp32 products: HIGHEST or an fp32-accurate preset."""
    if precision is None:
        return False
    if isinstance(precision, tuple):
        return any(getattr(p, "name", None) == "HIGHEST" for p in precision)
    return getattr(precision, "name", str(precision)) in _FP32_PRESETS


def _matmul_3xtf32(a, b, matmul=ops.matmul):
    """An fp32-accurate product from TF32 matmuls: each operand is split into
    a high part of 11 significant bits (exact in TF32, by Veltkamp's split)
    and the exact remainder; hi*hi + hi*lo + lo*hi drops only lo*lo (~2^-24).
    `matmul` is the form of each product (ops.matmul or the transposed-B one,
    whose `b` is the transposed operand: the split is elementwise)."""
    a_hi, a_lo = _split_tf32(a)
    b_hi, b_lo = _split_tf32(b)
    cross = matmul(a_hi, b_lo) + matmul(a_lo, b_hi)
    return matmul(a_hi, b_hi) + cross


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
