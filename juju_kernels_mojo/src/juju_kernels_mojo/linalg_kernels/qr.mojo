# Householder QR on the CPU (geqrf and orgqr), row-major, one matrix per task
# (batches in parallel), LAPACK's conventions and blocking: PANEL columns are
# factorized one reflector at a time, then their product I - V T V^T (the
# compact WY form, dlarft) reaches the trailing columns in two passes whose
# inner work is a register-blocked matrix product (dlarfb), instead of two
# memory passes per reflector.
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import parallelize, sync_parallelize
from std.utils import StaticTuple
from std.math import copysign, iota, isnan, sqrt

from .blocks import subtract_product

comptime PANEL = 32  # reflectors per block (LAPACK's nb)
comptime COLUMNS_PER_TASK = 128


# One SIMD vector of columns [c, c + W) of _apply_reflector's rows [j, m):
# w = v^T A, then A -= tau v w^T; `masked`: only the lanes where `fresh` is
# true change.
@always_inline
def _reflect_vector[
    dtype: DType, W: Int, masked: Bool
](
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    v: Pointer[Scalar[dtype], ImmutAnyOrigin],
    tau: Scalar[dtype],
    j: Int,
    c: Int,
    m: Int,
    n: Int,
    fresh: SIMD[DType.bool, W],
):
    var w = SIMD[dtype, W](0)
    for i in range(j, m):
        var vi = Scalar[dtype](1) if i == j else v[unsafe_offset=i * n]
        w += vi * a.unsafe_offset(i * n + c).unsafe_load[width=W]()
    for i in range(j, m):
        var s = tau * (Scalar[dtype](1) if i == j else v[unsafe_offset=i * n])
        var row = a.unsafe_offset(i * n + c)
        var old = row.unsafe_load[width=W]()
        comptime if masked:
            row.unsafe_store(fresh.select(old - s * w, old))
        else:
            row.unsafe_store(old - s * w)


# H = I - tau v v^T (v[j] = 1, v below the diagonal stored in column j)
# applied from the left to the columns [c0, c1) of rows [j, m) of a row-major
# matrix with n columns: w = v^T A, then A -= tau v w^T, in blocks of 4 SIMD
# vectors of columns so that both passes read contiguous row pieces.
@always_inline
def _apply_reflector[
    dtype: DType, W: Int
](
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    v: Pointer[Scalar[dtype], ImmutAnyOrigin],
    tau: Scalar[dtype],
    j: Int,
    c0: Int,
    c1: Int,
    m: Int,
    n: Int,
):
    comptime B = 4 * W
    var c = c0
    while c + B <= c1:
        var w0 = SIMD[dtype, W](0)
        var w1 = SIMD[dtype, W](0)
        var w2 = SIMD[dtype, W](0)
        var w3 = SIMD[dtype, W](0)
        for i in range(j, m):
            var vi = Scalar[dtype](1) if i == j else v[unsafe_offset=i * n]
            var row = a.unsafe_offset(i * n + c)
            w0 += vi * row.unsafe_load[width=W]()
            w1 += vi * row.unsafe_offset(W).unsafe_load[width=W]()
            w2 += vi * row.unsafe_offset(2 * W).unsafe_load[width=W]()
            w3 += vi * row.unsafe_offset(3 * W).unsafe_load[width=W]()
        for i in range(j, m):
            var s = tau * (Scalar[dtype](1) if i == j else v[unsafe_offset=i * n])
            var row = a.unsafe_offset(i * n + c)
            row.unsafe_store(row.unsafe_load[width=W]() - s * w0)
            row.unsafe_offset(W).unsafe_store(row.unsafe_offset(W).unsafe_load[width=W]() - s * w1)
            row.unsafe_offset(2 * W).unsafe_store(
                row.unsafe_offset(2 * W).unsafe_load[width=W]() - s * w2
            )
            row.unsafe_offset(3 * W).unsafe_store(
                row.unsafe_offset(3 * W).unsafe_load[width=W]() - s * w3
            )
        c += B
    while c + W <= c1:
        _reflect_vector[dtype, W, False](a, v, tau, j, c, m, n, SIMD[DType.bool, W](fill=True))
        c += W
    # The last columns (fewer than W): one vector ending at column c1, whose
    # first W - rest lanes (done above, or left of c0) keep their values.
    # (Element by element, these tails were most of qr 64's time.)
    var rest = c1 - c
    if rest > 0 and c1 >= W:
        var fresh = iota[DType.int32, W]().ge(Int32(W - rest))
        _reflect_vector[dtype, W, True](a, v, tau, j, c1 - W, m, n, fresh)
    elif rest > 0:  # a matrix narrower than a vector
        var w = SIMD[dtype, W](0)
        for i in range(j, m):
            var vi = Scalar[dtype](1) if i == j else v[unsafe_offset=i * n]
            for t in range(rest):
                w[t] += vi * a[unsafe_offset=i * n + c + t]
        for i in range(j, m):
            var s = tau * (Scalar[dtype](1) if i == j else v[unsafe_offset=i * n])
            for t in range(rest):
                a[unsafe_offset=i * n + c + t] = a[unsafe_offset=i * n + c + t] - s * w[t]


@always_inline
def _reflect_column[dtype: DType](a: Pointer[Scalar[dtype], MutAnyOrigin], j: Int, m: Int, n: Int) -> Scalar[dtype]:
    """Dlarfg on column j below row j: v replaces the column below the
    diagonal, beta the diagonal; returns tau. Beta takes alpha's sign bit,
    tau = 0 where the column below the diagonal is zero, the norms are scaled
    so that they do not overflow."""
    var alpha = a[unsafe_offset=j * n + j]
    # dnrm2 of the column below the diagonal, scaled by its largest magnitude.
    var scale = Scalar[dtype](0)
    for i in range(j + 1, m):
        var v = abs(a[unsafe_offset=i * n + j])
        if v > scale or isnan(v):
            scale = v
    if scale == 0:
        return 0
    var ssq = Scalar[dtype](0)
    for i in range(j + 1, m):
        var v = a[unsafe_offset=i * n + j] / scale
        ssq += v * v
    var xnorm = scale * sqrt(ssq)
    # dlapy2(alpha, xnorm)
    var big = max(abs(alpha), xnorm)
    var small = min(abs(alpha), xnorm)
    var norm = big
    if isnan(alpha) or isnan(xnorm):
        norm = alpha + xnorm
    elif small != 0:
        var q = small / big
        norm = big * sqrt(1 + q * q)
    var beta = -copysign(norm, alpha)
    var inv = 1 / (alpha - beta)
    for i in range(j + 1, m):
        a[unsafe_offset=i * n + j] = a[unsafe_offset=i * n + j] * inv
    a[unsafe_offset=j * n + j] = beta
    return (beta - alpha) / beta


# --- the block reflector -------------------------------------------------------
# V is dense here: rows x PANEL, row-major, unit diagonal and zeros above it
# written out, zero columns past the block's last reflector (so that every
# loop runs over whole groups of 4 reflectors). Work rows have `ldw` columns.


@always_inline
def _v_transpose_c[
    dtype: DType, W: Int, CV: Int
](
    c: Pointer[Scalar[dtype], MutAnyOrigin],
    ldc: Int,
    v: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    col: Int,
    work: Pointer[Scalar[dtype], MutAnyOrigin],
    wcol: Int,
    ldw: Int,
):
    """work[:, wcol : wcol + CV*W] = V^T C[:, col : col + CV*W]: 4
    reflectors times CV vectors of columns in registers over all rows."""
    for p0 in range(0, PANEL, 4):
        var acc = StaticTuple[SIMD[dtype, W], 4 * CV](fill=SIMD[dtype, W](0))
        for i in range(rows):
            var row = c.unsafe_offset(i * ldc + col)
            var vp = v.unsafe_offset(i * PANEL + p0)
            comptime for u in range(CV):
                var x = row.unsafe_offset(u * W).unsafe_load[width=W]()
                comptime for r in range(4):
                    acc[r * CV + u] += vp[unsafe_offset=r] * x
        comptime for r in range(4):
            comptime for u in range(CV):
                work.unsafe_offset((p0 + r) * ldw + wcol + u * W).unsafe_store(acc[r * CV + u])


def _apply_block[
    dtype: DType, W: Int, transpose: Bool
](
    c: Pointer[Scalar[dtype], MutAnyOrigin],
    ldc: Int,
    rows: Int,
    c0: Int,
    c1: Int,
    v: Pointer[Scalar[dtype], MutAnyOrigin],
    t: Pointer[Scalar[dtype], MutAnyOrigin],
):
    """Columns [c0, c1) of C (rows x ldc) become (I - V T^T V^T) C with
    `transpose` (geqrf: H_{k-1} ... H_0 C), else (I - V T V^T) C (orgqr:
    H_0 ... H_{k-1} C)."""
    var width = c1 - c0
    var ldw = (width + W - 1) // W * W
    var work_list = List[Scalar[dtype]](length=PANEL * ldw, fill=0)
    var work = work_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    # work = V^T C
    var col = 0
    while col + 4 * W <= width:
        _v_transpose_c[dtype, W, 4](c, ldc, v, rows, c0 + col, work, col, ldw)
        col += 4 * W
    while col + W <= width:
        _v_transpose_c[dtype, W, 1](c, ldc, v, rows, c0 + col, work, col, ldw)
        col += W
    for cc in range(col, width):
        for p in range(PANEL):
            var s = Scalar[dtype](0)
            for i in range(rows):
                s += v[unsafe_offset=i * PANEL + p] * c[unsafe_offset=i * ldc + c0 + cc]
            work[unsafe_offset=p * ldw + cc] = s
    # work = T^T work, or T work, in place (T upper triangular): the rows
    # still needed are read before they are overwritten.
    for step in range(PANEL):
        var p = PANEL - 1 - step if transpose else step
        var q0 = 0 if transpose else p
        var q1 = p + 1 if transpose else PANEL
        var wp = work.unsafe_offset(p * ldw)
        for cc in range(0, ldw, W):
            var s = SIMD[dtype, W](0)
            for q in range(q0, q1):
                var tq = t[unsafe_offset=q * PANEL + p] if transpose else t[unsafe_offset=p * PANEL + q]
                s += tq * work.unsafe_offset(q * ldw + cc).unsafe_load[width=W]()
            wp.unsafe_offset(cc).unsafe_store(s)
    # C -= V work
    col = 0
    while col + 4 * W <= width:
        var i = 0
        while i + 4 <= rows:
            subtract_product[dtype, W, 4, 4](
                c.unsafe_offset(i * ldc + c0 + col), ldc, v.unsafe_offset(i * PANEL), PANEL,
                work.unsafe_offset(col), ldw, PANEL,
            )
            i += 4
        while i < rows:
            subtract_product[dtype, W, 1, 4](
                c.unsafe_offset(i * ldc + c0 + col), ldc, v.unsafe_offset(i * PANEL), PANEL,
                work.unsafe_offset(col), ldw, PANEL,
            )
            i += 1
        col += 4 * W
    while col + W <= width:
        for i in range(rows):
            subtract_product[dtype, W, 1, 1](
                c.unsafe_offset(i * ldc + c0 + col), ldc, v.unsafe_offset(i * PANEL), PANEL,
                work.unsafe_offset(col), ldw, PANEL,
            )
        col += W
    for cc in range(col, width):
        for i in range(rows):
            var s = c[unsafe_offset=i * ldc + c0 + cc]
            for p in range(PANEL):
                s -= v[unsafe_offset=i * PANEL + p] * work[unsafe_offset=p * ldw + cc]
            c[unsafe_offset=i * ldc + c0 + cc] = s
    _ = len(work_list)  # alive until here: work's origin is not tracked


@always_inline
def _block_tasks(split: Bool, rows: Int, width: Int) -> Int:
    """Tasks of COLUMNS_PER_TASK columns for one block reflector of a single
    large matrix (a batch runs its matrices in parallel instead)."""
    # A parallel launch costs tens of microseconds: one per block is worth
    # it from about 2^16 elements.
    if not split or rows * width < 1 << 16:
        return 1
    return (width + COLUMNS_PER_TASK - 1) // COLUMNS_PER_TASK


def _block_reflector[
    dtype: DType, W: Int, transpose: Bool
](
    a: Pointer[Scalar[dtype], ImmutAnyOrigin],
    taus: Pointer[Scalar[dtype], ImmutAnyOrigin],
    j: Int,
    jb: Int,
    m: Int,
    n: Int,
    target: Pointer[Scalar[dtype], MutAnyOrigin],
    c0: Int,
    split: Bool,
):
    """Applies the block of reflectors j .. j+jb-1 (below the diagonal of a,
    scales in taus) to rows [j, m), columns [c0, n) of target (m x n)."""
    var rows = m - j
    var v_list = List[Scalar[dtype]](length=rows * PANEL, fill=0)
    var v = v_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    for i in range(rows):
        for p in range(min(jb, i + 1)):
            v[unsafe_offset=i * PANEL + p] = Scalar[dtype](1) if i == p else a[unsafe_offset=(j + i) * n + j + p]
    # dlarft (forward, columnwise) from G = V^T V: T[p, p] = tau_p,
    # T[:p, p] = -tau_p T[:p, :p] G[:p, p].
    var g_list = List[Scalar[dtype]](length=PANEL * PANEL, fill=0)
    var g = g_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    _v_transpose_c[dtype, W, PANEL // W](v, PANEL, v, rows, 0, g, 0, PANEL)
    var t_list = List[Scalar[dtype]](length=PANEL * PANEL, fill=0)
    var t = t_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    for p in range(jb):
        var tau = taus[unsafe_offset=j + p]
        t[unsafe_offset=p * PANEL + p] = tau
        for q in range(p):
            var s = Scalar[dtype](0)
            for r in range(q, p):
                s += t[unsafe_offset=q * PANEL + r] * g[unsafe_offset=r * PANEL + p]
            t[unsafe_offset=q * PANEL + p] = -tau * s
    var c = target.unsafe_offset(j * n)
    var tasks = _block_tasks(split, rows, n - c0)
    if tasks > 1:

        def task(index: Int) {imm}:
            var start = c0 + index * COLUMNS_PER_TASK
            _apply_block[dtype, W, transpose](c, n, rows, start, min(start + COLUMNS_PER_TASK, n), v, t)

        sync_parallelize(task, tasks)
    else:
        _apply_block[dtype, W, transpose](c, n, rows, c0, n, v, t)
    _ = len(v_list) + len(g_list) + len(t_list)  # alive until here


@always_inline
def _blocked(rows: Int, columns: Int) -> Bool:
    """Whether a block of reflectors pays for its T and dense V: for a
    trailing matrix of at least 2 * PANEL rows and columns (qr 64: 0.25 ms
    one reflector at a time, 0.40 ms with one block)."""
    return columns >= 2 * PANEL and rows >= 2 * PANEL


@register("juju_geqrf")
struct Geqrf:
    """Geqrf: R on and above the diagonal, the reflectors' v below it, their
    scales tau [batch, min(m, n)]; dlarfg's conventions (_reflect_column)."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        r: OutputTensor[rank=3, ...],
        taus: OutputTensor[dtype=r.dtype, rank=2, ...],
        x: InputTensor[dtype=r.dtype, rank=3, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_geqrf: CPU only"
        comptime dtype = r.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_geqrf: unsupported dtype " + String(dtype)
        )
        comptime W = 16 if dtype == DType.float32 else 8
        var batch = Int(x.dim_size(0))
        var m = Int(x.dim_size(1))
        var n = Int(x.dim_size(2))
        var k = min(m, n)

        def factor(b: Int, split: Bool) {imm}:
            var a = r.unsafe_ptr().unsafe_offset(b * m * n)
            var tau_out = taus.unsafe_ptr().unsafe_offset(b * k)
            for i in range(m):
                for c in range(n):
                    a[unsafe_offset=i * n + c] = x[b, i, c]
            var j = 0
            while j < k:
                var jb = min(PANEL, k - j)
                # A panel's reflectors reach its own columns one by one,
                # the trailing columns as a block; the last columns (or a
                # small matrix) one reflector at a time.
                var end = j + jb if _blocked(m - j, n - j - jb) else k
                for jj in range(j, end):
                    var tau = _reflect_column[dtype](a, jj, m, n)
                    tau_out[unsafe_offset=jj] = tau
                    var c1 = end if end < k else n
                    if tau != 0 and jj + 1 < c1:
                        _apply_reflector[dtype, W](a, a.unsafe_offset(jj), tau, jj, jj + 1, c1, m, n)
                if end < k:
                    _block_reflector[dtype, W, True](a, tau_out, j, jb, m, n, a, end, split)
                j = end

        def one(b: Int) {imm}:
            factor(b, False)

        if batch == 1:
            factor(0, True)
        else:
            parallelize(one, batch)


@register("juju_householder_product")
struct HouseholderProduct:
    """Orgqr: Q [batch, m, n], the first n columns of H_0 H_1 ... H_{k-1}
    for the reflectors below the diagonal of a [batch, m, n] (geqrf's
    layout) and their scales [batch, k]. Backwards, as orgqr: the reflectors
    j.. touch rows and columns >= j only (the columns left of j are still
    zero in those rows)."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        q: OutputTensor[rank=3, ...],
        a: InputTensor[dtype=q.dtype, rank=3, ...],
        taus: InputTensor[dtype=q.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_householder_product: CPU only"
        comptime dtype = q.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_householder_product: unsupported dtype " + String(dtype)
        )
        comptime W = 16 if dtype == DType.float32 else 8
        var batch = Int(a.dim_size(0))
        var m = Int(a.dim_size(1))
        var n = Int(a.dim_size(2))
        var k = Int(taus.dim_size(1))

        def build(b: Int, split: Bool) {imm}:
            var out = q.unsafe_ptr().unsafe_offset(b * m * n)
            var reflectors = a.unsafe_ptr().unsafe_offset(b * m * n)
            var tau = taus.unsafe_ptr().unsafe_offset(b * k)
            for i in range(m):
                for c in range(n):
                    out[unsafe_offset=i * n + c] = Scalar[dtype](1) if i == c else Scalar[dtype](0)
            # The blocks of PANEL reflectors that pay for it (as geqrf
            # chooses them), then the rest one by one, last first.
            var blocked_end = 0
            while blocked_end < k:
                var jb = min(PANEL, k - blocked_end)
                if not _blocked(m - blocked_end, n - blocked_end - jb):
                    break
                blocked_end += jb
            for step in range(blocked_end, k):
                var j = k - 1 + blocked_end - step
                if tau[unsafe_offset=j] != 0:
                    _apply_reflector[dtype, W](
                        out, reflectors.unsafe_offset(j), tau[unsafe_offset=j], j, j, n, m, n
                    )
            var j = blocked_end
            while j > 0:
                var jb = (j - 1) % PANEL + 1 if j == blocked_end else PANEL
                j -= jb
                _block_reflector[dtype, W, False](reflectors, tau, j, jb, m, n, out, j, split)

        def one(b: Int) {imm}:
            build(b, False)

        if batch == 1:
            build(0, True)
        else:
            parallelize(one, batch)
