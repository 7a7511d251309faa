# Dense factorizations and triangular solves on the CPU, one matrix per task
# (batches in parallel), row-major, with LAPACK's conventions: potrf (lower),
# trsm (left side), getrf (partial pivoting); geqrf and orgqr in qr.mojo. The rules in linalg_rules.py
# reshape batches to one leading axis and turn every trsm variant into a
# left-side solve with an explicit triangle. The juju_ops_lax rules are loops
# of MAX ops (one MAX loop iteration per column): these run without leaving
# compiled code.
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import parallelize
from std.math import isnan, sqrt
from std.utils import IndexList, StaticTuple

from .blocks import subtract_product
from std.utils.numerics import nan


comptime CHOLESKY_PANEL = 32


# Blocked right-looking Cholesky (potrf's), lower, of a (n x n, row-major),
# in a scratch copy whose rows are padded by 4 SIMD vectors: per panel of
# CHOLESKY_PANEL columns, the diagonal block one column at a time, the rows
# below it by substitution (in `lt`, L21 transposed), then
# the trailing lower triangle minus L21 L21^T in register blocks
# (subtract_product). One thread per matrix: splitting a single matrix's
# panels across MAX's workers made the bench's cholesky 256 2.46 ms and 1024
# 44.8 ms, against 0.42 and 12.0 ms on one thread (waking MAX's sleeping
# workers for a parallel launch costs ~600 us, docs/performance.md).
# Register blocks may run past a row's diagonal into its padding or upper
# part: never read. Returns False for a pivot <= 0 (a NaN pivot flows on, as
# OpenBLAS's potrf); the lower triangle goes back to `a`, its upper triangle
# stays. (Cholesky-Banachiewicz, before it, paid a horizontal sum per inner
# product: cholesky 100's kernel took ~0.25 ms.)
def _cholesky[dtype: DType, W: Int](a: Pointer[Scalar[dtype], MutAnyOrigin], n: Int) -> Bool:
    var ld = (n + W - 1) // W * W + 4 * W
    var work_list = List[Scalar[dtype]](length=n * ld, fill=0)
    var lt_list = List[Scalar[dtype]](length=CHOLESKY_PANEL * ld, fill=0)
    var w = work_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    var lt = lt_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    for i in range(n):
        for j in range(i + 1):
            w[unsafe_offset=i * ld + j] = a[unsafe_offset=i * n + j]
    var ok = True
    for p0 in range(0, n, CHOLESKY_PANEL):
        var p1 = min(p0 + CHOLESKY_PANEL, n)
        var nb = p1 - p0
        for k in range(p0, p1):
            var d = w[unsafe_offset=k * ld + k]
            if not (d > 0 or isnan(d)):
                ok = False
                break
            d = sqrt(d)
            w[unsafe_offset=k * ld + k] = d
            for i in range(k + 1, p1):
                w[unsafe_offset=i * ld + k] = w[unsafe_offset=i * ld + k] / d
            for i in range(k + 1, p1):
                var l = w[unsafe_offset=i * ld + k]
                for j in range(k + 1, i + 1):
                    w[unsafe_offset=i * ld + j] = w[unsafe_offset=i * ld + j] - l * w[unsafe_offset=j * ld + k]
        if not ok:
            break
        if p1 == n:
            break
        # The panel's rows below the diagonal block, as columns of lt
        # (contiguous over rows): forward substitution with L11^T, one SIMD
        # axpy over the rows per term (the last runs into the padding).
        for i in range(p1, n):
            for q in range(nb):
                lt[unsafe_offset=q * ld + i] = w[unsafe_offset=i * ld + p0 + q]
        for j in range(nb):
            var target = lt.unsafe_offset(j * ld)
            for k in range(j):
                var l = w[unsafe_offset=(p0 + j) * ld + p0 + k]
                var source = lt.unsafe_offset(k * ld)
                var i = p1
                while i < n:
                    target.unsafe_offset(i).unsafe_store(
                        target.unsafe_offset(i).unsafe_load[width=W]() - l * source.unsafe_offset(i).unsafe_load[width=W]()
                    )
                    i += W
            var d = w[unsafe_offset=(p0 + j) * ld + p0 + j]
            var i = p1
            while i < n:
                target.unsafe_offset(i).unsafe_store(target.unsafe_offset(i).unsafe_load[width=W]() / d)
                i += W
        for i in range(p1, n):
            for q in range(nb):
                w[unsafe_offset=i * ld + p0 + q] = lt[unsafe_offset=q * ld + i]

        # The trailing lower triangle minus L21 L21^T.
        var i = p1
        while i < n:
            var r = min(4, n - i)
            var last = i + r - 1  # the block's last row: columns up to its diagonal
            var c = p1
            while c <= last:
                if r == 4:
                    subtract_product[dtype, W, 4, 4](
                        w.unsafe_offset(i * ld + c), ld, w.unsafe_offset(i * ld + p0), ld,
                        lt.unsafe_offset(c), ld, nb,
                    )
                else:
                    for rr in range(r):
                        subtract_product[dtype, W, 1, 4](
                            w.unsafe_offset((i + rr) * ld + c), ld, w.unsafe_offset((i + rr) * ld + p0), ld,
                            lt.unsafe_offset(c), ld, nb,
                        )
                c += 4 * W
            i += r

    if ok:
        for i in range(n):
            for j in range(i + 1):
                a[unsafe_offset=i * n + j] = w[unsafe_offset=i * ld + j]
    _ = len(work_list) + len(lt_list)  # alive until here
    return ok


@register("juju_cholesky")
struct Cholesky[symmetrize: Bool, zero_upper: Bool]:
    """Potrf, lower: L in the lower triangle, the upper triangle as given;
    every element NaN where a pivot is <= 0 (what jax does with LAPACK's
    info). `symmetrize` factorizes (x + x^T) / 2 and `zero_upper` writes 0
    above the diagonal: what `jnp.linalg.cholesky` wraps around the
    primitive (linalg_rules.py), done here instead of in two more kernels."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=3, ...],
        x: InputTensor[dtype=output.dtype, rank=3, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_cholesky: CPU only"
        comptime dtype = output.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_cholesky: unsupported dtype " + String(dtype)
        )
        comptime W = 16 if dtype == DType.float32 else 8
        var batch = Int(x.dim_size(0))
        var n = Int(x.dim_size(1))

        def factor(b: Int) {imm}:
            var a = output.unsafe_ptr().unsafe_offset(b * n * n)
            comptime if Self.symmetrize:
                # jax's (x + x^T) / 2 (the same bits) where potrf reads it, the
                # lower triangle, in tiles so that x^T's reads stay in cache.
                comptime T = 16
                for i0 in range(0, n, T):
                    for j0 in range(0, i0 + 1, T):
                        for i in range(i0, min(i0 + T, n)):
                            for j in range(j0, min(j0 + T, i + 1)):
                                a[unsafe_offset=i * n + j] = (x[b, i, j] + x[b, j, i]) / 2
                comptime if not Self.zero_upper:
                    for i in range(n):
                        for j in range(i + 1, n):
                            a[unsafe_offset=i * n + j] = a[unsafe_offset=j * n + i]
            else:
                for i in range(n):
                    for j in range(n):
                        a[unsafe_offset=i * n + j] = x[b, i, j]
            if not _cholesky[dtype, W](a, n):  # not positive definite
                for e in range(n * n):
                    a[unsafe_offset=e] = nan[dtype]()
            comptime if Self.zero_upper:
                for i in range(n):
                    for j in range(i + 1, n):
                        a[unsafe_offset=i * n + j] = 0

        # One matrix: on this thread (no worker to wake).
        if batch == 1:
            factor(0)
        else:
            parallelize(factor, batch)


# Rows of steps [s0, s0 + R) of a left-side trsm (step s is row s, or row
# m - 1 - s for an upper triangle), columns [c, c + CV*W) of X (m rows `ld`
# apart, the right-hand sides on entry): R rows times CV vectors stay in
# registers while every finished row is subtracted, so each finished row
# piece loaded serves R rows. Row i subtracts T(i, p) X(p) in the order
# reference trsm does (p by step), whatever R is: the same bits as one row at
# a time.
@always_inline
def _trsm_rows[
    dtype: DType, W: Int, R: Int, CV: Int, lower: Bool, unit_diagonal: Bool
](
    t: Pointer[Scalar[dtype], ImmutAnyOrigin],
    xs: Pointer[Scalar[dtype], MutAnyOrigin],
    m: Int,
    ld: Int,
    s0: Int,
    c: Int,
):
    var rows = StaticTuple[Int, R](fill=0)
    comptime for r in range(R):
        rows[r] = s0 + r if lower else m - 1 - s0 - r
    var acc = StaticTuple[SIMD[dtype, W], R * CV](fill=SIMD[dtype, W](0))
    comptime for r in range(R):
        comptime for u in range(CV):
            acc[r * CV + u] = xs.unsafe_offset(rows[r] * ld + c + u * W).unsafe_load[width=W]()
    for q in range(s0):
        var p = q if lower else m - 1 - q
        var xp = xs.unsafe_offset(p * ld + c)
        comptime for u in range(CV):
            var y = xp.unsafe_offset(u * W).unsafe_load[width=W]()
            comptime for r in range(R):
                acc[r * CV + u] = acc[r * CV + u] - t[unsafe_offset=rows[r] * m + p] * y
    # The group's own earlier rows, finished one after the other.
    comptime for r in range(R):
        comptime for r2 in range(r):
            var tip = t[unsafe_offset=rows[r] * m + rows[r2]]
            comptime for u in range(CV):
                acc[r * CV + u] = acc[r * CV + u] - tip * acc[r2 * CV + u]
        comptime if not unit_diagonal:
            var d = t[unsafe_offset=rows[r] * m + rows[r]]
            comptime for u in range(CV):
                acc[r * CV + u] = acc[r * CV + u] / d
    comptime for r in range(R):
        comptime for u in range(CV):
            xs.unsafe_offset(rows[r] * ld + c + u * W).unsafe_store(acc[r * CV + u])


@register("juju_triangular_solve")
struct TriangularSolve[lower: Bool, unit_diagonal: Bool]:
    """Trsm, left side, no transpose: X with T X = B, T lower or upper
    triangular [batch, m, m], B [batch, m, k]. Tasks: matrices times blocks
    of 64 right-hand sides; within one, 4 rows at a time (_trsm_rows)."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=3, ...],
        t: InputTensor[dtype=output.dtype, rank=3, ...],
        rhs: InputTensor[dtype=output.dtype, rank=3, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_triangular_solve: CPU only"
        comptime dtype = output.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_triangular_solve: unsupported dtype " + String(dtype)
        )
        comptime W = 16 if dtype == DType.float32 else 8
        comptime BLOCK = 64
        var batch = Int(rhs.dim_size(0))
        var m = Int(rhs.dim_size(1))
        var k = Int(rhs.dim_size(2))
        var blocks = (k + BLOCK - 1) // BLOCK

        def one(task: Int) {imm}:
            var b = task // blocks
            var c0 = (task % blocks) * BLOCK
            var c1 = min(c0 + BLOCK, k)
            var width = c1 - c0
            # The block's right-hand sides packed, rows BLOCK apart: the
            # output's rows are k apart (a page at k = 1024), so each finished
            # row a step subtracts was a TLB miss (the bench's trsm 1024x1024
            # went from 0.84 to 0.40 of jax.jit's time, inv 1024 1.46 to 1.07).
            var packed_list = List[Scalar[dtype]](length=m * BLOCK, fill=0)
            var xs = packed_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            for i in range(m):
                for c in range(width):
                    xs[unsafe_offset=i * BLOCK + c] = rhs[b, i, c0 + c]
            var tb = t.unsafe_ptr().unsafe_offset(b * m * m)
            # Columns are independent: pieces of 4 vectors, then of one,
            # then one column at a time; rows in groups of 4 (_trsm_rows).
            var c = 0
            while c + 4 * W <= width:
                var s = 0
                while s + 4 <= m:
                    _trsm_rows[dtype, W, 4, 4, Self.lower, Self.unit_diagonal](tb, xs, m, BLOCK, s, c)
                    s += 4
                while s < m:
                    _trsm_rows[dtype, W, 1, 4, Self.lower, Self.unit_diagonal](tb, xs, m, BLOCK, s, c)
                    s += 1
                c += 4 * W
            while c + W <= width:
                var s = 0
                while s + 4 <= m:
                    _trsm_rows[dtype, W, 4, 1, Self.lower, Self.unit_diagonal](tb, xs, m, BLOCK, s, c)
                    s += 4
                while s < m:
                    _trsm_rows[dtype, W, 1, 1, Self.lower, Self.unit_diagonal](tb, xs, m, BLOCK, s, c)
                    s += 1
                c += W
            while c < width:
                for step in range(m):
                    var i = step if Self.lower else m - 1 - step
                    var v = xs[unsafe_offset=i * BLOCK + c]
                    for q in range(step):
                        var p = q if Self.lower else m - 1 - q
                        v = v - tb[unsafe_offset=i * m + p] * xs[unsafe_offset=p * BLOCK + c]
                    comptime if not Self.unit_diagonal:
                        v = v / tb[unsafe_offset=i * m + i]
                    xs[unsafe_offset=i * BLOCK + c] = v
                c += 1
            var out = output.unsafe_ptr().unsafe_offset(b * m * k + c0)
            for i in range(m):
                for c in range(width):
                    out[unsafe_offset=i * k + c] = xs[unsafe_offset=i * BLOCK + c]
            _ = len(packed_list)  # alive until here

        if batch * blocks == 1 and m <= 128:  # as juju_cholesky
            one(0)
        else:
            parallelize(one, batch * blocks)


# Row i of getrf's trailing matrix, columns [c0, c1) (rows `ld` apart):
# subtract L(i, j0 + q) U(j0 + q, :) for q < qs, one q after the other (the
# order an unblocked right-looking getrf subtracts them in, so blocking does
# not change a bit), with each row piece held in registers for all qs updates.
@always_inline
def _lu_update_row[
    dtype: DType, W: Int
](a: Pointer[Scalar[dtype], MutAnyOrigin], i: Int, j0: Int, qs: Int, c0: Int, c1: Int, ld: Int):
    var l = a.unsafe_offset(i * ld + j0)
    var u = a.unsafe_offset(j0 * ld)
    var c = c0
    while c + 2 * W <= c1:
        subtract_product[dtype, W, 1, 2](a.unsafe_offset(i * ld + c), ld, l, ld, u.unsafe_offset(c), ld, qs)
        c += 2 * W
    if c + W <= c1:
        subtract_product[dtype, W, 1, 1](a.unsafe_offset(i * ld + c), ld, l, ld, u.unsafe_offset(c), ld, qs)
        c += W
    while c < c1:
        var v = a[unsafe_offset=i * ld + c]
        for q in range(qs):
            v = v - l[unsafe_offset=q] * u[unsafe_offset=q * ld + c]
        a[unsafe_offset=i * ld + c] = v
        c += 1


# Rows [i0, i1) of getrf's trailing matrix, columns [c0, c1): the panel's
# rows take the multipliers left of their diagonal only (qs = i - j0).
@always_inline
def _lu_update_rows[
    dtype: DType, W: Int
](a: Pointer[Scalar[dtype], MutAnyOrigin], i0: Int, i1: Int, j0: Int, jb: Int, c0: Int, c1: Int, ld: Int):
    var i = i0
    while i < i1 and i - j0 < jb:
        _lu_update_row[dtype, W](a, i, j0, i - j0, c0, c1, ld)
        i += 1
    while i + 4 <= i1:
        var c = c0
        # 4 rows at once: every piece of U's rows loaded serves the 4.
        var l = a.unsafe_offset(i * ld + j0)
        while c + 4 * W <= c1:
            subtract_product[dtype, W, 4, 4](a.unsafe_offset(i * ld + c), ld, l, ld, a.unsafe_offset(j0 * ld + c), ld, jb)
            c += 4 * W
        while c + W <= c1:
            subtract_product[dtype, W, 4, 1](a.unsafe_offset(i * ld + c), ld, l, ld, a.unsafe_offset(j0 * ld + c), ld, jb)
            c += W
        if c < c1:
            for r in range(4):
                _lu_update_row[dtype, W](a, i + r, j0, jb, c, c1, ld)
        i += 4
    while i < i1:
        _lu_update_row[dtype, W](a, i, j0, jb, c0, c1, ld)
        i += 1


# x[:count] -= y[:count] * s, in SIMD vectors then one at a time (the
# arithmetic of the scalar loop, so the same bits).
@always_inline
def _subtract_scaled[
    dtype: DType, W: Int
](x: Pointer[Scalar[dtype], MutAnyOrigin], y: Pointer[Scalar[dtype], MutAnyOrigin], count: Int, s: Scalar[dtype]):
    var i = 0
    while i + W <= count:
        x.unsafe_offset(i).unsafe_store(x.unsafe_offset(i).unsafe_load[width=W]() - y.unsafe_offset(i).unsafe_load[width=W]() * s)
        i += W
    while i < count:
        x[unsafe_offset=i] = x[unsafe_offset=i] - y[unsafe_offset=i] * s
        i += 1


@always_inline
def _swap_range[
    dtype: DType
](x: Pointer[Scalar[dtype], MutAnyOrigin], y: Pointer[Scalar[dtype], MutAnyOrigin], c0: Int, c1: Int):
    for c in range(c0, c1):
        var tmp = x[unsafe_offset=c]
        x[unsafe_offset=c] = y[unsafe_offset=c]
        y[unsafe_offset=c] = tmp


# Getrf's unblocked steps for columns [j0, j1), rows [j0, m), worked in
# `panel`, a column-major copy of that piece (column c at c * (m - j0)):
# a column of the row-major matrix is one element per cache line, and
# the pivot search, scaling and updates ran three strided passes per column
# (10 of lu 1024's 20 ms). Pivot rows swap in `a` outside the panel's
# columns and in `panel` within them; the panel goes back at the end.
@always_inline
def _lu_panel[
    dtype: DType, W: Int
](
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    piv: Pointer[Int32, MutAnyOrigin],
    perm: Pointer[Int32, MutAnyOrigin],
    panel: Pointer[Scalar[dtype], MutAnyOrigin],
    j0: Int,
    j1: Int,
    m: Int,
    n: Int,
    smallest_normal: Scalar[dtype],
):
    var rows = m - j0
    var width = j1 - j0
    for i in range(rows):
        for c in range(width):
            panel[unsafe_offset=c * rows + i] = a[unsafe_offset=(j0 + i) * n + j0 + c]
    for k in range(width):  # column j0 + k; its diagonal is the panel's row k
        var column = panel.unsafe_offset(k * rows)
        # idamax: the first row of largest magnitude (NaN never wins).
        var p = k
        var best = abs(column[unsafe_offset=k])
        for i in range(k + 1, rows):
            var v = abs(column[unsafe_offset=i])
            if v > best:
                best = v
                p = i
        piv[unsafe_offset=j0 + k] = Int32(j0 + p)
        if p != k:
            for c in range(width):
                var tmp = panel[unsafe_offset=c * rows + k]
                panel[unsafe_offset=c * rows + k] = panel[unsafe_offset=c * rows + p]
                panel[unsafe_offset=c * rows + p] = tmp
            var row_k = a.unsafe_offset((j0 + k) * n)
            var row_p = a.unsafe_offset((j0 + p) * n)
            _swap_range[dtype](row_k, row_p, 0, j0)  # the panel's own columns swapped above
            _swap_range[dtype](row_k, row_p, j1, n)
            var tp = perm[unsafe_offset=j0 + k]
            perm[unsafe_offset=j0 + k] = perm[unsafe_offset=j0 + p]
            perm[unsafe_offset=j0 + p] = tp
        var below = column.unsafe_offset(k + 1)
        var count = rows - k - 1
        var d = column[unsafe_offset=k]
        if d != 0:
            if abs(d) >= smallest_normal:
                var inv = 1 / d
                for i in range(count):
                    below[unsafe_offset=i] = below[unsafe_offset=i] * inv
            else:
                for i in range(count):
                    below[unsafe_offset=i] = below[unsafe_offset=i] / d
        # The rest of the panel's columns now; the columns right of the
        # panel wait for its last column.
        for c in range(k + 1, width):
            var target = panel.unsafe_offset(c * rows)
            _subtract_scaled[dtype, W](target.unsafe_offset(k + 1), below, count, target[unsafe_offset=k])
    for i in range(rows):
        for c in range(width):
            a[unsafe_offset=(j0 + i) * n + j0 + c] = panel[unsafe_offset=c * rows + i]


@register("juju_lu")
struct LU:
    """Getrf: L (unit diagonal, below) and U in one matrix [batch, m, n], the
    0-based pivot rows [batch, min(m, n)] and the permutation [batch, m]
    (int32) that jax derives from them. Blocked twice: a block of LU_BLOCK
    columns is factorized by panels of PANEL columns (each unblocked, in a
    column-major copy, _lu_panel), each panel updating the block's columns
    only; then U's rows right of the block, then one pass over the trailing
    matrix takes the block's LU_BLOCK updates at once. Every element still
    subtracts its terms in an unblocked getrf's order. The matrices of a
    batch in parallel."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        lu: OutputTensor[rank=3, ...],
        pivots: OutputTensor[dtype=DType.int32, rank=2, ...],
        permutation: OutputTensor[dtype=DType.int32, rank=2, ...],
        x: InputTensor[dtype=lu.dtype, rank=3, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_lu: CPU only"
        comptime dtype = lu.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_lu: unsupported dtype " + String(dtype)
        )
        comptime W = 16 if dtype == DType.float32 else 8
        comptime PANEL = 16
        comptime LU_BLOCK = 64
        var batch = Int(x.dim_size(0))
        var m = Int(x.dim_size(1))
        var n = Int(x.dim_size(2))
        var r = min(m, n)
        # LAPACK scales by the reciprocal unless it would overflow.
        var smallest_normal = Scalar[dtype](1.1754943508222875e-38) if dtype == DType.float32 else Scalar[dtype](2.2250738585072014e-308)

        def factor(b: Int) {imm}:
            var a = lu.unsafe_ptr().unsafe_offset(b * m * n)
            var piv = pivots.unsafe_ptr().unsafe_offset(b * r)
            var perm = permutation.unsafe_ptr().unsafe_offset(b * m)
            var panel_list = List[Scalar[dtype]](length=m * PANEL, fill=0)
            var panel = panel_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            for i in range(m):
                perm[unsafe_offset=i] = Int32(i)
                for j in range(n):
                    a[unsafe_offset=i * n + j] = x[b, i, j]
            for block0 in range(0, r, LU_BLOCK):
                var block1 = min(block0 + LU_BLOCK, r)
                for j0 in range(block0, block1, PANEL):
                    var j1 = min(j0 + PANEL, block1)
                    _lu_panel[dtype, W](a, piv, perm, panel, j0, j1, m, n, smallest_normal)
                    if j1 < block1:  # the panel's updates, in the block's columns
                        _lu_update_rows[dtype, W](a, j0 + 1, j1, j0, j1 - j0, j1, block1, n)
                        _lu_update_rows[dtype, W](a, j1, m, j0, j1 - j0, j1, block1, n)
                if block1 < n:
                    # U's rows of the block, right of it; then the trailing
                    # matrix takes the block's updates in one pass.
                    _lu_update_rows[dtype, W](a, block0 + 1, block1, block0, block1 - block0, block1, n, n)
                    _lu_update_rows[dtype, W](a, block1, m, block0, block1 - block0, block1, n, n)
            _ = len(panel_list)  # alive until here

        # One matrix: on this thread. Its trailing updates in parallel tasks
        # made lu_factor 1024 slower: 32.4 ms against 21.9 (rows of 32, a
        # launch per panel of 8), 13.9 ms against 9.3-11.9 (two tasks per
        # block of 64): waking MAX's workers costs more than they save.
        if batch == 1:
            factor(0)
        else:
            parallelize(factor, batch)
