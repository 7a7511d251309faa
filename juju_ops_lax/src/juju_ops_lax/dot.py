"""dot_general: any batch/contracting dimensions, as one batched matmul.

Two rules. `lower_dot_general` serves every engine: `ops.matmul(a, b)` with
`b` as (contracting, free). On a GPU engine `lower_dot_general_gpu` wins
(unless `JUJU_GPU_MATMUL=plain`): the product takes the transposed-B form
that MAX's own models use (`x @ w.T`), `ops.matmul(a, ops.transpose(bt))`
with `bt` (free, contracting) in memory. MAX 26.7 compiles that form into its
Hopper (sm90) warp-specialised tensor-core kernel; the plain form compiles
into its generic multistage kernel only, whose bfloat16 results are wrong for
more than 8 rows (modular/modular#6883). Both facts were read off MEFs
compiled for a virtual sm_90a GPU (docs/gpu.md).
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
from juju.dtypes import max_shape
from juju_ops_lax._util import reshape_result, scalar
from juju_ops_lax import mixed

rules = RuleSet()

#: `JUJU_GPU_MATMUL`, read whenever a product is lowered for a GPU engine:
#: `transposed_b` (default): bfloat16 products on bfloat16 tensor cores,
#: float32 (TF32) and float16 (as float32) ones too, all in the transposed-B
#: form; `transposed_b_fp32`: the same form, bfloat16 products computed in
#: float32; `plain`: `ops.matmul(a, b)` with bfloat16 in float32 (juju's
#: GPU products before the transposed-B form).
GPU_MATMUL_ENV = "JUJU_GPU_MATMUL"
GPU_MATMUL_FORMS = ("transposed_b", "transposed_b_fp32", "plain")

#: With `b` in (contracting, free) order, the transposed-B form copies it
#: once (K x N elements) before the product. For float32 (whose plain form
#: is right, only slower) that copy is taken from this many rows of `a` on:
#: with MAX's sm90 kernel at ~2.6x its plain one (the issue's H200 figures),
#: the copy pays for itself from M ~ 210 (an estimate; docs/gpu.md).
F32_COPY_MIN_ROWS = 256


def gpu_matmul_form() -> str:
    """The GPU product form `JUJU_GPU_MATMUL` asks for (`GPU_MATMUL_FORMS`)."""
    value = os.environ.get(GPU_MATMUL_ENV, "").strip().lower() or GPU_MATMUL_FORMS[0]
    if value not in GPU_MATMUL_FORMS:
        warnings.warn(f"juju-ops-lax: {GPU_MATMUL_ENV}={value!r} is none of "
                      f"{', '.join(GPU_MATMUL_FORMS)}; using {GPU_MATMUL_FORMS[0]}",
                      RuntimeWarning, stacklevel=2)
        return GPU_MATMUL_FORMS[0]
    return value


def _to_batched_matrix(x, shape, batch, contract, *, contract_last):
    """Permute to (batch, free, contract) [or (batch, contract, free)] and
    reshape to rank 3, or to rank 2 without batch dims: a plain matmul is much
    faster in MAX than a batch of one. Also says whether it permuted."""
    free = [d for d in range(len(shape)) if d not in batch and d not in contract]
    order = list(batch) + (free + list(contract) if contract_last else list(contract) + free)
    moved = order != list(range(len(shape)))
    if moved:
        x = ops.permute(x, order)
    b = math.prod(shape[d] for d in batch)
    f = math.prod(shape[d] for d in free)
    k = math.prod(shape[d] for d in contract)
    matrix = [f, k] if contract_last else [k, f]
    target = [b, *matrix] if batch else matrix
    if list(x.shape) != target:
        x = ops.reshape(x, max_shape(target))
    return x, [shape[d] for d in free], moved


@rules.register(P.dot_general_p)
def lower_dot_general(ctx, lhs, rhs, *, dimension_numbers, precision,
                      preferred_element_type, out_sharding):
    return _lower(ctx, lhs, rhs, dimension_numbers, precision, transposed_b=False)


def _on_gpu_transposed_b(ctx) -> bool:
    return not ctx.device.is_cpu() and gpu_matmul_form() != "plain"


_on_gpu_transposed_b.__qualname__ = f"GPU engine and {GPU_MATMUL_ENV} != plain"


@rules.register(P.dot_general_p, priority=1, guard=_on_gpu_transposed_b)
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
    a, lhs_free, _ = _to_batched_matrix(lhs, lhs_aval.shape, lb, lc, contract_last=True)
    rows = math.prod(lhs_free)
    if transposed_b:
        b, rhs_free, moved = _to_batched_matrix(rhs, rhs_aval.shape, rb, rc, contract_last=True)
        b, matmul = _transposed_b_operand(ctx, b, moved, rows)
        if b.dtype != a.dtype:  # bfloat16 whose copy could not be kept: float32 after all
            a = ops.cast(a, b.dtype)
    else:
        b, rhs_free, _ = _to_batched_matrix(rhs, rhs_aval.shape, rb, rc, contract_last=False)
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
    if not on_gpu:
        return compute
    if compute == DType.bfloat16 and not (transposed_b and gpu_matmul_form() == "transposed_b"
                                          and _suits_sm90_bf16(ctx)):
        # bf16 values are exact in fp32 (and TF32), so an fp32 product rounded
        # once is what XLA computes: right, at CUDA-core speed.
        return DType.float32
    if compute == DType.float16 and transposed_b:
        # MAX 26.7's sm90 kernels take bf16, fp32 and fp8; float16 values are
        # exact in TF32, so fp32 products rounded once are XLA's.
        return DType.float32
    return compute


def _suits_sm90_bf16(ctx) -> bool:
    """Whether MAX's sm90 dispatch takes a bf16 product of these shapes:
    static N and K, K a multiple of 4 bytes (its cp.async loads) and N a
    multiple of 8 (its output tiles). Other shapes would fall back to the
    generic kernel, the one that is wrong in bf16 (#6883)."""
    (lc, rc), (lb, rb) = ctx.params["dimension_numbers"]
    lhs_shape, rhs_shape = (aval.shape for aval in ctx.avals_in)
    contracted = [lhs_shape[d] for d in lc]
    free = [rhs_shape[d] for d in range(len(rhs_shape)) if d not in rc and d not in rb]
    if not all(isinstance(d, (int, np.integer)) for d in contracted + free):
        return False  # a symbolic dimension
    return math.prod(contracted) % 2 == 0 and math.prod(free) % 8 == 0


def _cast(x, aval, out_dtype, compute):
    if np.dtype(aval.dtype) != np.dtype(out_dtype) or compute != x.dtype:
        return ops.cast(x, compute)
    return x


def _transposed_b_operand(ctx, bt, moved, rows):
    """`bt` ((batch,) N, K) ready for `_matmul_transposed_b`, and that matmul.

    A `bt` made by a permute must stay a copy in memory: MAX folds the two
    transposes of transpose(permute(b)) back into b, and the plain form it
    then compiles is the slow (and, in bf16, wrong) kernel. `ctx.opaque`
    makes the copy an elementwise select MAX cannot see through. Where it
    cannot (a graph without a runtime input), or where the copy costs more
    than it saves (float32 with few rows), the product takes the plain form
    and bf16 goes to float32."""
    if not moved:
        return bt, _matmul_transposed_b
    if bt.dtype == DType.float32 and rows < F32_COPY_MIN_ROWS:
        return _untranspose(bt), ops.matmul
    kept = ctx.opaque(bt)
    if kept is bt:
        if bt.dtype == DType.bfloat16:
            bt = ops.cast(bt, DType.float32)
        return _untranspose(bt), ops.matmul
    return kept, _matmul_transposed_b


def _untranspose(bt):
    return ops.transpose(bt, -1, -2)


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
