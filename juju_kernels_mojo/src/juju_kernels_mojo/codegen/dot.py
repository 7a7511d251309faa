"""dot_general. A large float32/float64 product calls the `?gemm` of the
BLAS numpy ships (operands whose axes are not (batched) matrices as they
lie or transposed are copied to such a layout first, as XLA transposes
attention's heads; `juju_kernels_mojo.blas`, split in blocks over the
cores where it is large), as XLA calls Eigen's: a scan whose body multiplies by a
256-wide matrix (an LSTM) then runs at XLA's speed, where loops ran it at a
tenth. Anything else is loops: each output element an ordered sum over the
contraction, in SIMD vectors along the output's last axis or along a
contiguous contraction where the operands allow."""

from __future__ import annotations

import math

import numpy as np

from juju import primitives as P
from juju_kernels_mojo import blas
from juju_kernels_mojo.codegen.mojo import (VECTOR_BYTES, Array, Unsupported, index_expr,
                                            mojo_dtype, scalar_type)
from juju_kernels_mojo.codegen.mojo import strides as row_major

#: Products of fewer multiply-adds stay loops (a BLAS call costs ~1 us).
BLAS_MIN_WORK = 1 << 14
#: Multiply-adds from which a product is split over the cores (see
#: emitter.PARALLEL_MIN), inside a scan or while body too (a GRU scan whose
#: steps split 1.5M-multiply-add products ran 6x jax.jit).
BLAS_PARALLEL_MIN = 1 << 23
BLAS_PARALLEL_MIN_IN_LOOP = 1 << 23
#: A product whose operand must be copied to a BLAS layout first calls the
#: BLAS only where each copied element is used this many times (min(m, n)).
COPY_MIN_REUSE = 8


def dot_general(emitter, prim, ins, outs, *, dimension_numbers, precision=None,
                preferred_element_type=None, out_sharding=None, **_):
    (lhs, rhs), (out,) = ins, outs
    (lc, rc), (lb, rb) = dimension_numbers
    if out.dtype == np.bool_:
        raise Unsupported("dot_general of bool")
    ls, rs = row_major(lhs.shape), row_major(rhs.shape)
    lf = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    out_st = row_major(out.shape)
    contract = [lhs.shape[d] for d in lc]
    nb = len(lb)
    if not out.size:
        return
    if _gemm(emitter, lhs, rhs, out, dimension_numbers):
        # As fast as MAX's matmul: its multiply-adds do not count against
        # the limits that keep large loop work on MAX's ops.
        emitter.work += out.size
        return
    emitter.work += out.size * math.prod(contract)

    def operand(st, free, batch, cdims, idx, cidx, base=()):
        terms = [*zip(idx[:nb], [st[d] for d in batch]), *zip(base, [st[d] for d in free]),
                 *zip(cidx, [st[d] for d in cdims])]
        at = index_expr(*zip(*terms)) if terms else "0"
        return at

    def load(x, at):
        value = x.at(at)
        return value if x.dtype == out.dtype else emitter.convert(value, x.dtype, out.dtype)

    width = VECTOR_BYTES // out.dtype.itemsize
    simd = f"SIMD[{mojo_dtype(out.dtype)}, {width}]"
    same = (lhs.dtype == rhs.dtype == out.dtype and isinstance(lhs, Array)
            and isinstance(rhs, Array))
    if same and rf and rs[rf[-1]] == 1 and out.shape[-1] >= width:
        # Vectorized over the output's last axis (rhs's contiguous free
        # axis): out[..., j:j+w] += lhs[..., c] * rhs[c, j:j+w], each
        # output element summed over c in order, as the scalar loop would.
        outer = out.shape[:-1]
        n = out.shape[-1]

        def body(idx):
            j = emitter.fresh("j")
            idx_l = idx[nb:nb + len(lf)]
            idx_r = idx[nb + len(lf):]
            with emitter.block(f"for {j} in range(0, {n - n % width}, {width}):"):
                acc = emitter.fresh("acc")
                emitter.emit(f"var {acc} = {simd}(0)")

                def inner(cidx):
                    a = lhs.at(operand(ls, lf, lb, lc, idx, cidx, idx_l))
                    b_at = operand(rs, rf, rb, rc, idx, cidx, [*idx_r, j])
                    emitter.emit(f"{acc} += {a} * {rhs.load(b_at, width)}")

                emitter.nest(contract, inner)
                emitter.emit(out.store(index_expr([*idx, j], out_st), acc))
            with emitter.block(f"for {j} in range({n - n % width}, {n}):"):
                scalar_dot(emitter, out, lhs, rhs, [*idx, j], contract, operand, load,
                                (ls, lf, lb, lc, idx_l), (rs, rf, rb, rc, [*idx_r, j]))

        emitter.nest(outer, body, parallel=True, work=out.size * math.prod(contract))
        return

    def body(idx):
        scalar_dot(emitter, out, lhs, rhs, idx, contract, operand, load,
                        (ls, lf, lb, lc, idx[nb:nb + len(lf)]),
                        (rs, rf, rb, rc, idx[nb + len(lf):]))

    emitter.nest(out.shape, body, parallel=True, work=out.size * math.prod(contract))


def scalar_dot(emitter, out, lhs, rhs, idx, contract, operand, load, left, right):
    acc = emitter.fresh("acc")
    emitter.emit(f"var {acc} = {scalar_type(out.dtype)}(0)")
    width = VECTOR_BYTES // out.dtype.itemsize
    if (len(contract) == 1 and contract[0] >= width and lhs.dtype == rhs.dtype == out.dtype
            and isinstance(lhs, Array) and isinstance(rhs, Array)
            and left[0][left[3][0]] == 1 and right[0][right[3][0]] == 1):
        # Both operands contiguous along the contraction: a SIMD inner
        # product (partial sums per lane, then the lanes).
        n = contract[0]
        vec, c = emitter.fresh("v"), emitter.fresh("c")
        emitter.emit(f"var {vec} = SIMD[{mojo_dtype(out.dtype)}, {width}](0)")
        with emitter.block(f"for {c} in range(0, {n - n % width}, {width}):"):
            a = operand(*left[:4], idx, [c], left[4])
            b = operand(*right[:4], idx, [c], right[4])
            emitter.emit(f"{vec} += {lhs.load(a, width)} * {rhs.load(b, width)}")
        emitter.emit(f"{acc} = {vec}.reduce_add()")
        with emitter.block(f"for {c} in range({n - n % width}, {n}):"):
            a = lhs.at(operand(*left[:4], idx, [c], left[4]))
            b = rhs.at(operand(*right[:4], idx, [c], right[4]))
            emitter.emit(f"{acc} += {a} * {b}")
        emitter.emit(f"{out.at(index_expr(idx, row_major(out.shape)))} = {acc}")
        return

    def inner(cidx):
        a = load(lhs, operand(*left[:4], idx, cidx, left[4]))
        b = load(rhs, operand(*right[:4], idx, cidx, right[4]))
        emitter.emit(f"{acc} += {a} * {b}")

    emitter.nest(contract, inner)
    emitter.emit(f"{out.at(index_expr(idx, row_major(out.shape)))} = {acc}")


def _gemm(emitter, lhs, rhs, out, dimension_numbers) -> bool:
    """out = lhs . rhs through the BLAS where it is large and of one float
    dtype (else False): operands that are not [B, M, K] or [B, K, M] and
    [B, K, N] or [B, N, K] as they lie are copied to that layout first."""
    (lc, rc), (lb, rb) = dimension_numbers
    if not (isinstance(lhs, Array) and isinstance(rhs, Array)
            and lhs.dtype == rhs.dtype == out.dtype and out.dtype in (np.float32, np.float64)):
        return False
    k = math.prod(lhs.shape[d] for d in lc)
    if out.size * k < BLAS_MIN_WORK or not k:
        return False
    library = blas.find()
    if library is None:
        return False
    batch = math.prod(lhs.shape[d] for d in lb)
    m = math.prod(lhs.shape[d] for d in _free(lhs, lb, lc))
    n = math.prod(rhs.shape[d] for d in _free(rhs, rb, rc))
    ta = _matrix(len(lhs.shape), lb, lc, contract_last=True)
    tb = _matrix(len(rhs.shape), rb, rc, contract_last=False)
    if (ta is None or tb is None) and min(m, n) < COPY_MIN_REUSE:
        # Each element of the copy would be used min(m, n) times: the loops
        # read it where it lies (a decoder's step: q . K of a [B, T, H, D]
        # cache, m = 1, copied whole each token ran 2.7x jax.jit).
        return False
    if ta is None:  # e.g. attention's [B, T, H, D] heads: copied as [B, H, T, D] first
        lhs, ta = canonical(emitter, lhs, [*lb, *_free(lhs, lb, lc), *lc]), False
    if tb is None:
        rhs, tb = canonical(emitter, rhs, [*rb, *rc, *_free(rhs, rb, rc)]), False
    gemm_call(emitter, library, ta, tb, batch, m, n, k, lhs, rhs, out)
    return True


def gemm_call(emitter, library, ta: bool, tb: bool, batch: int, m: int, n: int, k: int,
              a: Array, b: Array, c: Array) -> None:
    """c[i] = op(a[i]) op(b[i]) for i < batch, row-major [m, n] results
    (op: transposed where `ta`/`tb`), split over the cores where large."""
    emitter.threads = True
    if (m == 1 or n == 1) and c.dtype.name in library.gemv:
        _gemv_call(emitter, library, ta, tb, batch, m, n, k, a, b, c)
        return
    symbol = library.sgemm if c.dtype == np.float32 else library.dgemm
    parallel = not emitter.in_task and batch * m * n * k >= (
        BLAS_PARALLEL_MIN_IN_LOOP if emitter.loops else BLAS_PARALLEL_MIN)
    emitter.emit(f'blas_gemm[{mojo_dtype(c.dtype)}, "{library.path}", "{symbol}", '
                 f'{library.ilp64}]({ta}, {tb}, {batch}, {m}, {n}, {k}, {parallel}, '
                 f'{a.address()}, {b.address()}, {c.address()})')


def _gemv_call(emitter, library, ta, tb, batch, m, n, k, a, b, c) -> None:
    """`gemm_call` where one side is a vector (m or n is 1): ?gemv reads the
    matrix once, where ?gemm packs it (two copies of it) first; optax's
    L-BFGS on a 4096x512 regression spent 53% of its time in ?gemm with
    n = 1. Memory-bound: split over the cores as a loop of the matrix's
    size is (`Emitter.parallel_min`)."""
    if n == 1:  # c = op(a) b: a stored [m, k], or [k, m] where ta
        matrix, vector, trans, rows, cols = a, b, ta, *((k, m) if ta else (m, k))
    else:  # c = a op(b) = op(b)^T a: b stored [k, n], or [n, k] where tb
        matrix, vector, trans, rows, cols = b, a, not tb, *((n, k) if tb else (k, n))
    parallel = not emitter.in_task and batch * rows * cols >= emitter.parallel_min()
    emitter.emit(f'blas_gemv[{mojo_dtype(c.dtype)}, "{library.path}", '
                 f'"{library.gemv[c.dtype.name]}", {library.ilp64}]({trans}, {batch}, {rows}, '
                 f'{cols}, {parallel}, {matrix.address()}, {vector.address()}, {c.address()})')


def _free(x, batch, contract) -> list[int]:
    return [d for d in range(len(x.shape)) if d not in batch and d not in contract]


def canonical(emitter, x, order) -> Array:
    """`x` with its axes in `order` (batch, then the matrices' axes), a copy:
    O(size) moves where the loops' product is O(m n k) multiply-adds."""
    shape = [x.shape[d] for d in order]
    src = row_major(x.shape)
    out = emitter.scratch(shape, x.dtype)
    emitter.copy_strided(shape, out, row_major(shape), x, [src[d] for d in order])
    emitter.work += x.size
    return out


def _matrix(rank: int, batch, contract, contract_last: bool) -> bool | None:
    """Whether an operand is its matrices transposed (False: as they lie),
    or None where it is neither: batch axes first, in order, then the free
    axes and the contraction's in order, the contraction last for an lhs
    (first for an rhs) as they lie."""
    batch, contract = list(batch), list(contract)
    if batch != list(range(len(batch))) or contract != sorted(contract):
        return None
    free = [d for d in range(rank) if d not in batch and d not in contract]
    if list(range(rank)) == batch + free + contract:
        return not contract_last
    if list(range(rank)) == batch + contract + free:
        return contract_last
    return None


EQUATIONS = {P.dot_general_p: dot_general}
