"""Cholesky, LU and QR factorizations, symmetric eigendecompositions, SVDs
and triangular solves in generated kernels: LAPACK's ?potrf, ?getrf,
?geqrf, ?orgqr, ?syevd and ?gesdd and the BLAS's ?trsm (the private copy
of numpy's OpenBLAS, `juju_kernels_mojo.blas`), as XLA's CPU calls LAPACK. Written as
juju_ops_lax's decompositions (a loop over columns or rows, scalar work
O(n^3)), a Gaussian process's 2048x2048 factor and solves ran at 190x
jax.jit; Jacobi rounds of 256x256 matmuls made eigh and svd of 256x256
676x. Small matrices, complex numbers or a library without the symbols
keep the decompositions.
"""

from __future__ import annotations

import math

import numpy as np

from juju import primitives as P
from juju_kernels_mojo import blas
from juju_kernels_mojo.codegen.dot import BLAS_PARALLEL_MIN, BLAS_PARALLEL_MIN_IN_LOOP
from juju_kernels_mojo.codegen.mojo import Array, literal, mojo_dtype

#: Matrix sizes (n) from which the library is called; eigh and svd call it
#: from n = 1, since their vectors' signs are LAPACK's there only (CMA-ES
#: samples through them).
LIBRARY_MIN_N = 16

#: Written into kernels that call them (`Emitter.linalg`).
LINALG_PRELUDE = '''
def lapack_potrf[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    batch: Int, n: Int, a: UnsafePointer[Scalar[dt], MutAnyOrigin]) raises:
    """a[i] = its lower Cholesky factor for i < batch (row-major), its strict
    upper triangle zeros, NaN where a[i] is not positive definite (XLA's
    results on the CPU)."""
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    for i in range(batch):
        var m = a.unsafe_offset(i * n * n)
        var info: Int
        comptime if ilp64:
            var potrf = lib.get_function[Int64](symbol)
            info = Int(potrf(Int32(101), Int8(76), Int64(n), m, Int64(n)))
        else:
            var potrf = lib.get_function[Int32](symbol)
            info = Int(potrf(Int32(101), Int8(76), Int32(n), m, Int32(n)))
        for r in range(n):
            for c in range(r + 1, n):
                m[r * n + c] = 0
            if info != 0:
                for c in range(r + 1):
                    m[r * n + c] = nan[dt]()


def lapack_getrf[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    batch: Int, m: Int, n: Int, a: UnsafePointer[Scalar[dt], MutAnyOrigin],
    pivots: UnsafePointer[Int32, MutAnyOrigin], perm: UnsafePointer[Int32, MutAnyOrigin]
) raises:
    """a[i] = its LU factors with partial pivoting for i < batch (row-major),
    lax.linalg.lu's pivots (0-based row swaps) and the permutation they make."""
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    var k = min(m, n)
    var ipiv64 = List[Int64](length=k, fill=0)
    var ipiv32 = List[Int32](length=k, fill=0)
    for i in range(batch):
        var ai = a.unsafe_offset(i * m * n)
        comptime if ilp64:
            var getrf = lib.get_function[Int64](symbol)
            _ = getrf(Int32(101), Int64(m), Int64(n), ai, Int64(n), ipiv64.unsafe_ptr())
        else:
            var getrf = lib.get_function[Int32](symbol)
            _ = getrf(Int32(101), Int32(m), Int32(n), ai, Int32(n), ipiv32.unsafe_ptr())
        for r in range(m):
            perm[i * m + r] = Int32(r)
        for r in range(k):
            var p: Int
            comptime if ilp64:
                p = Int(ipiv64[r]) - 1
            else:
                p = Int(ipiv32[r]) - 1
            pivots[i * k + r] = Int32(p)
            var row = perm[i * m + r]
            perm[i * m + r] = perm[i * m + p]
            perm[i * m + p] = row


def lapack_geqrf[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    batch: Int, m: Int, n: Int, a: UnsafePointer[Scalar[dt], MutAnyOrigin],
    taus: UnsafePointer[Scalar[dt], MutAnyOrigin]) raises:
    """a[i] = R above its diagonal and the Householder reflectors below,
    taus[i] their scales, for i < batch (row-major)."""
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    var k = min(m, n)
    for i in range(batch):
        comptime if ilp64:
            var geqrf = lib.get_function[Int64](symbol)
            _ = geqrf(Int32(101), Int64(m), Int64(n), a.unsafe_offset(i * m * n), Int64(n),
                      taus.unsafe_offset(i * k))
        else:
            var geqrf = lib.get_function[Int32](symbol)
            _ = geqrf(Int32(101), Int32(m), Int32(n), a.unsafe_offset(i * m * n), Int32(n),
                      taus.unsafe_offset(i * k))


def lapack_orgqr[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    batch: Int, m: Int, n: Int, k: Int, a: UnsafePointer[Scalar[dt], MutAnyOrigin],
    taus: UnsafePointer[Scalar[dt], MutAnyOrigin]) raises:
    """a[i] = the first n columns of the product of its k reflectors."""
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    for i in range(batch):
        comptime if ilp64:
            var orgqr = lib.get_function[Int64](symbol)
            _ = orgqr(Int32(101), Int64(m), Int64(n), Int64(k), a.unsafe_offset(i * m * n),
                      Int64(n), taus.unsafe_offset(i * k))
        else:
            var orgqr = lib.get_function[Int32](symbol)
            _ = orgqr(Int32(101), Int32(m), Int32(n), Int32(k), a.unsafe_offset(i * m * n),
                      Int32(n), taus.unsafe_offset(i * k))


def lapack_syevd[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    batch: Int, n: Int, lower: Bool, v: UnsafePointer[Scalar[dt], MutAnyOrigin],
    w: UnsafePointer[Scalar[dt], MutAnyOrigin]) raises:
    """v[i] = the eigenvectors (columns, row-major) of the symmetric v[i],
    its lower (else upper) triangle read, w[i] its eigenvalues ascending,
    for i < batch; NaN where LAPACK fails (XLA's results on the CPU)."""
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    var uplo = Int8(76) if lower else Int8(85)
    for i in range(batch):
        var vi = v.unsafe_offset(i * n * n)
        var wi = w.unsafe_offset(i * n)
        var info: Int
        comptime if ilp64:
            var syevd = lib.get_function[Int64](symbol)
            info = Int(syevd(Int32(101), Int8(86), uplo, Int64(n), vi, Int64(n), wi))
        else:
            var syevd = lib.get_function[Int32](symbol)
            info = Int(syevd(Int32(101), Int8(86), uplo, Int32(n), vi, Int32(n), wi))
        if info != 0:
            for k in range(n * n):
                vi[k] = nan[dt]()
            for k in range(n):
                wi[k] = nan[dt]()


def lapack_gesdd[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    batch: Int, m: Int, n: Int, job: Int, a: UnsafePointer[Scalar[dt], MutAnyOrigin],
    s: UnsafePointer[Scalar[dt], MutAnyOrigin], u: UnsafePointer[Scalar[dt], MutAnyOrigin],
    vt: UnsafePointer[Scalar[dt], MutAnyOrigin]) raises:
    """The singular values s[i] (descending) of a[i] (m x n, row-major,
    overwritten) for i < batch, and where `job` is 65 ('A') or 83 ('S') its
    vectors u[i] (m x m or m x k) and vt[i] (n x n or k x n), k = min(m, n);
    job 78 ('N'): values only. NaN where LAPACK fails (XLA's results)."""
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    var k = min(m, n)
    var ucols = m if job == 65 else (k if job == 83 else 1)
    var vrows = n if job == 65 else k
    for i in range(batch):
        var ui = u.unsafe_offset(i * m * ucols) if job != 78 else u
        var vti = vt.unsafe_offset(i * vrows * n) if job != 78 else vt
        var si = s.unsafe_offset(i * k)
        var info: Int
        comptime if ilp64:
            var gesdd = lib.get_function[Int64](symbol)
            info = Int(gesdd(Int32(101), Int8(job), Int64(m), Int64(n), a.unsafe_offset(i * m * n),
                             Int64(n), si, ui, Int64(ucols), vti, Int64(n)))
        else:
            var gesdd = lib.get_function[Int32](symbol)
            info = Int(gesdd(Int32(101), Int8(job), Int32(m), Int32(n), a.unsafe_offset(i * m * n),
                             Int32(n), si, ui, Int32(ucols), vti, Int32(n)))
        if info != 0:
            for j in range(k):
                si[j] = nan[dt]()
            if job != 78:
                for j in range(m * ucols):
                    ui[j] = nan[dt]()
                for j in range(vrows * n):
                    vti[j] = nan[dt]()


def blas_trsm[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    left: Bool, lower: Bool, transpose: Bool, unit: Bool, batch: Int, n: Int, rows: Int,
    cols: Int, parallel: Bool, a: UnsafePointer[Scalar[dt], MutAnyOrigin],
    b: UnsafePointer[Scalar[dt], MutAnyOrigin]) raises:
    """b[i] = op(a[i])^-1 b[i] (left) or b[i] op(a[i])^-1 for i < batch, a[i]
    triangular n x n, b[i] rows x cols, row-major, in place; where
    `parallel`, b's columns (left) or rows (right) in one block per core."""
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    var trsm = lib.get_function[NoneType](symbol)
    var side = Int32(141) if left else Int32(142)
    var uplo = Int32(122) if lower else Int32(121)
    var trans = Int32(112) if transpose else Int32(111)
    var diag = Int32(132) if unit else Int32(131)
    var one = Scalar[dt](1)

    def block(i: Int, r0: Int, r1: Int, c0: Int, c1: Int) {var}:
        var ai = a.unsafe_offset(i * n * n)
        var bi = b.unsafe_offset(i * rows * cols + r0 * cols + c0)
        comptime if ilp64:
            trsm(Int32(101), side, uplo, trans, diag, Int64(r1 - r0), Int64(c1 - c0), one, ai,
                 Int64(n), bi, Int64(cols))
        else:
            trsm(Int32(101), side, uplo, trans, diag, Int32(r1 - r0), Int32(c1 - c0), one, ai,
                 Int32(n), bi, Int32(cols))

    var tasks = kernel_cores()
    if not parallel or tasks < 2:
        for i in range(batch):
            block(i, 0, rows, 0, cols)
        return

    def task(t: Int) {var}:
        with FlushDenormals():
            for i in range(batch):
                if left:  # columns are independent solves
                    var width = ((cols + tasks - 1) // tasks + 15) // 16 * 16
                    var c0 = min(t * width, cols)
                    if c0 < cols:
                        block(i, 0, rows, c0, min(c0 + width, cols))
                else:
                    var height = (rows + tasks - 1) // tasks
                    var r0 = min(t * height, rows)
                    if r0 < rows:
                        block(i, r0, min(r0 + height, rows), 0, cols)

    sync_parallelize(task, tasks)
'''


def _library(dtype, n: int, table: str, min_n: int = LIBRARY_MIN_N):
    """(library, symbol) for a `table` routine of `dtype` on n x n matrices,
    or None (the decomposition is written instead)."""
    if n < min_n or dtype not in (np.float32, np.float64):
        return None
    library = blas.find()
    symbol = None if library is None else getattr(library, table).get(np.dtype(dtype).name)
    return None if symbol is None else (library, symbol)


def cholesky(emitter, prim, ins, outs, *, symmetrize_input=False):
    (a,), (out,) = ins, outs
    n = a.shape[-1]
    found = _library(out.dtype, n, "potrf") if isinstance(a, Array) else None
    if found is None:
        emitter.decomposed(prim, ins, outs, {"symmetrize_input": symmetrize_input})
        return
    batch = math.prod(a.shape[:-2])
    if symmetrize_input:  # (a + a^T) / 2, as lax does before factoring
        half = literal(0.5, out.dtype)

        def element(idx):
            b, r, c = idx
            at = f"{b} * {n * n} + {r} * {n} + {c}" if b != "0" else f"{r} * {n} + {c}"
            tr = f"{b} * {n * n} + {c} * {n} + {r}" if b != "0" else f"{c} * {n} + {r}"
            emitter.emit(f"{out.at(at)} = ({a.at(at)} + {a.at(tr)}) * {half}")

        emitter.nest([batch, n, n], element, parallel=True)
    _call(emitter, "lapack_potrf", found, out.dtype, [batch, n],
          [] if symmetrize_input else [a], [out])


def triangular_solve(emitter, prim, ins, outs, *, left_side, lower, transpose_a, conjugate_a,
                     unit_diagonal):
    (a, b), (out,) = ins, outs
    n = a.shape[-1]
    found = (_library(out.dtype, n, "trsm")
             if isinstance(a, Array) and isinstance(b, Array) else None)
    if found is None:
        emitter.decomposed(prim, ins, outs, dict(
            left_side=left_side, lower=lower, transpose_a=transpose_a, conjugate_a=conjugate_a,
            unit_diagonal=unit_diagonal))
        return
    library, symbol = found
    batch = math.prod(a.shape[:-2])
    rows, cols = b.shape[-2], b.shape[-1]
    emitter.copy(b, out)
    emitter.linalg = emitter.threads = True
    parallel = not emitter.in_task and batch * n * n * (cols if left_side else rows) >= (
        BLAS_PARALLEL_MIN_IN_LOOP if emitter.loops else BLAS_PARALLEL_MIN)
    emitter.emit(f'blas_trsm[{mojo_dtype(out.dtype)}, "{library.path}", "{symbol}", '
                 f'{library.ilp64}]({left_side}, {lower}, {transpose_a}, {unit_diagonal}, '
                 f'{batch}, {n}, {rows}, {cols}, {parallel}, {a.address()}, {out.address()})')
    emitter.work += out.size


def lu(emitter, prim, ins, outs):
    (a,), (out, pivots, permutation) = ins, outs
    m, n = a.shape[-2], a.shape[-1]
    found = _library(out.dtype, min(m, n), "getrf") if isinstance(a, Array) else None
    if found is None or pivots.dtype != np.int32 or permutation.dtype != np.int32:
        emitter.decomposed(prim, ins, outs, {})
        return
    _call(emitter, "lapack_getrf", found, out.dtype, [math.prod(a.shape[:-2]), m, n], [a],
          [out, pivots, permutation])


def geqrf(emitter, prim, ins, outs):
    (a,), (out, taus) = ins, outs
    m, n = a.shape[-2], a.shape[-1]
    found = _library(out.dtype, min(m, n), "geqrf") if isinstance(a, Array) else None
    if found is None:
        emitter.decomposed(prim, ins, outs, {})
        return
    _call(emitter, "lapack_geqrf", found, out.dtype,
          [math.prod(a.shape[:-2]), m, n], [a], [out, taus])


def householder_product(emitter, prim, ins, outs):
    (a, taus), (out,) = ins, outs
    m, n = a.shape[-2], a.shape[-1]
    k = taus.shape[-1]
    found = (_library(out.dtype, n, "orgqr")
             if isinstance(a, Array) and isinstance(taus, Array) and m >= n >= k else None)
    if found is None:
        emitter.decomposed(prim, ins, outs, {})
        return
    _call(emitter, "lapack_orgqr", found, out.dtype,
          [math.prod(a.shape[:-2]), m, n, k], [a], [out, taus])


def eigh(emitter, prim, ins, outs, *, lower, sort_eigenvalues, subset_by_index, algorithm=None):
    # LAPACK's ?syevd, as XLA's CPU eigh (`algorithm` picks a TPU/GPU
    # method; eigenvalues come out ascending whatever `sort_eigenvalues` says)
    (a,), (v, w) = ins, outs
    n = a.shape[-1]
    whole = subset_by_index is None or tuple(subset_by_index) == (0, n)
    found = _library(v.dtype, n, "syevd", 1) if isinstance(a, Array) and whole else None
    if found is None:
        emitter.decomposed(prim, ins, outs, dict(
            lower=lower, sort_eigenvalues=sort_eigenvalues, subset_by_index=subset_by_index,
            algorithm=algorithm))
        return
    _call(emitter, "lapack_syevd", found, v.dtype, [math.prod(a.shape[:-2]), n, bool(lower)],
          [a], [v, w])


#: LAPACK's `jobz` of ?gesdd: all vectors, the reduced ones, none.
_GESDD_JOBS = {"all": 65, "reduced": 83, "none": 78}


def svd(emitter, prim, ins, outs, *, full_matrices, compute_uv, subset_by_index,
        algorithm=None):
    # LAPACK's ?gesdd, XLA's default CPU svd (other algorithms: the decomposition)
    (a,) = ins
    m, n = a.shape[-2], a.shape[-1]
    whole = subset_by_index is None or tuple(subset_by_index) == (0, min(m, n))
    default = algorithm is None or getattr(algorithm, "name", "") == "DEFAULT"
    found = (_library(a.dtype, min(m, n), "gesdd", 1)
             if isinstance(a, Array) and whole and default else None)
    if found is None:
        emitter.decomposed(prim, ins, outs, dict(
            full_matrices=full_matrices, compute_uv=compute_uv, subset_by_index=subset_by_index,
            algorithm=algorithm))
        return
    job = _GESDD_JOBS["none" if not compute_uv else "all" if full_matrices else "reduced"]
    s = outs[0]
    u, vt = outs[1:] if compute_uv else (s, s)  # not written with job 'N'
    scratch = emitter.value(a.shape, a.dtype)  # ?gesdd overwrites its input
    _call(emitter, "lapack_gesdd", found, a.dtype, [math.prod(a.shape[:-2]), m, n, job],
          [a], [scratch, s, u, vt])


def _call(emitter, routine: str, found, dtype, sizes, sources, pointers) -> None:
    """`routine`(sizes..., pointers...) on copies of `sources` in the first
    pointers' buffers (LAPACK works in place)."""
    library, symbol = found
    for src, dst in zip(sources, pointers):
        emitter.copy(src, dst)
    emitter.linalg = emitter.threads = True
    args = ", ".join([*map(str, sizes), *(p.address() for p in pointers)])
    emitter.emit(f'{routine}[{mojo_dtype(dtype)}, "{library.path}", "{symbol}", '
                 f'{library.ilp64}]({args})')
    emitter.work += pointers[0].size


EQUATIONS = {P.cholesky_p: cholesky, P.triangular_solve_p: triangular_solve, P.lu_p: lu,
             P.geqrf_p: geqrf, P.householder_product_p: householder_product, P.eigh_p: eigh,
             P.svd_p: svd}
