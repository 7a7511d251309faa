# Dense factorizations and triangular solves on the CPU, one matrix per task
# (batches in parallel), row-major, with LAPACK's conventions: potrf (lower),
# trsm (left side), getrf (partial pivoting), geqrf and orgqr (Householder). The rules in linalg_rules.py
# reshape batches to one leading axis and turn every trsm variant into a
# left-side solve with an explicit triangle. The juju_ops_lax rules are loops
# of MAX ops (one MAX loop iteration per column): these run without leaving
# compiled code.
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import sync_parallelize
from std.math import copysign, isnan, sqrt
from std.utils import IndexList
from std.utils.numerics import nan


@register("juju_cholesky")
struct Cholesky:
    """Potrf, lower: L in the lower triangle, the upper triangle as given;
    every element NaN where a pivot is <= 0 (what jax does with LAPACK's
    info)."""

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

        def one(b: Int) {imm}:
            var a = output.unsafe_ptr().unsafe_offset(b * n * n)
            for i in range(n):
                for j in range(n):
                    a[unsafe_offset=i * n + j] = x[b, i, j]
            # Cholesky-Banachiewicz: row i from the rows above it; every
            # inner product runs over two contiguous rows.
            var ok = True
            for i in range(n):
                var ri = a.unsafe_offset(i * n)
                for j in range(i + 1):
                    var rj = a.unsafe_offset(j * n)
                    var v0 = SIMD[dtype, W](0)
                    var v1 = SIMD[dtype, W](0)
                    var k = 0
                    while k + 2 * W <= j:
                        v0 += ri.unsafe_offset(k).unsafe_load[width=W]() * rj.unsafe_offset(
                            k
                        ).unsafe_load[width=W]()
                        v1 += ri.unsafe_offset(k + W).unsafe_load[width=W]() * rj.unsafe_offset(
                            k + W
                        ).unsafe_load[width=W]()
                        k += 2 * W
                    var s = (v0 + v1).reduce_add()
                    while k < j:
                        s += ri[unsafe_offset=k] * rj[unsafe_offset=k]
                        k += 1
                    var v = ri[unsafe_offset=j] - s
                    if j < i:
                        ri[unsafe_offset=j] = v / rj[unsafe_offset=j]
                    elif v > 0 or isnan(v):
                        # OpenBLAS's potrf (jax's LAPACK) fails on a pivot
                        # <= 0 only: a NaN flows on through the rows below.
                        ri[unsafe_offset=i] = sqrt(v)
                    else:  # not positive definite
                        ok = False
                if not ok:
                    break
            if not ok:
                for e in range(n * n):
                    a[unsafe_offset=e] = nan[dtype]()

        # One small matrix: no worker thread to wake. (A large one runs
        # faster on a worker: cholesky 256 took 2x as long on this thread.)
        if batch == 1 and n <= 128:
            one(0)
        else:
            sync_parallelize(one, batch)


@register("juju_triangular_solve")
struct TriangularSolve[lower: Bool, unit_diagonal: Bool]:
    """Trsm, left side, no transpose: X with T X = B, T lower or upper
    triangular [batch, m, m], B [batch, m, k]. Tasks: matrices times blocks
    of 64 right-hand sides."""

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
            var xs = output.unsafe_ptr().unsafe_offset(b * m * k)
            for i in range(m):
                for c in range(c0, c1):
                    xs[unsafe_offset=i * k + c] = rhs[b, i, c]
            # Row i of X from the finished rows: B(i) - sum T(i, p) X(p), in
            # the order reference trsm subtracts them; a piece of 4 vectors
            # of row i stays in registers while every finished row is
            # subtracted from it.
            for step in range(m):
                var i = step if Self.lower else m - 1 - step
                var xi = xs.unsafe_offset(i * k)
                var finished = i if Self.lower else m - 1 - i
                var d = Scalar[dtype](1)
                comptime if not Self.unit_diagonal:
                    d = t[b, i, i]
                var c = c0
                while c + 4 * W <= c1:
                    var v0 = xi.unsafe_offset(c).unsafe_load[width=W]()
                    var v1 = xi.unsafe_offset(c + W).unsafe_load[width=W]()
                    var v2 = xi.unsafe_offset(c + 2 * W).unsafe_load[width=W]()
                    var v3 = xi.unsafe_offset(c + 3 * W).unsafe_load[width=W]()
                    for q in range(finished):
                        var p = q if Self.lower else m - 1 - q
                        var tip = t[b, i, p]
                        var xp = xs.unsafe_offset(p * k + c)
                        v0 = v0 - tip * xp.unsafe_load[width=W]()
                        v1 = v1 - tip * xp.unsafe_offset(W).unsafe_load[width=W]()
                        v2 = v2 - tip * xp.unsafe_offset(2 * W).unsafe_load[width=W]()
                        v3 = v3 - tip * xp.unsafe_offset(3 * W).unsafe_load[width=W]()
                    comptime if not Self.unit_diagonal:
                        v0 = v0 / d
                        v1 = v1 / d
                        v2 = v2 / d
                        v3 = v3 / d
                    xi.unsafe_offset(c).unsafe_store(v0)
                    xi.unsafe_offset(c + W).unsafe_store(v1)
                    xi.unsafe_offset(c + 2 * W).unsafe_store(v2)
                    xi.unsafe_offset(c + 3 * W).unsafe_store(v3)
                    c += 4 * W
                while c < c1:
                    var v = xi[unsafe_offset=c]
                    for q in range(finished):
                        var p = q if Self.lower else m - 1 - q
                        v = v - t[b, i, p] * xs[unsafe_offset=p * k + c]
                    comptime if not Self.unit_diagonal:
                        v = v / d
                    xi[unsafe_offset=c] = v
                    c += 1

        if batch * blocks == 1 and m <= 128:  # as juju_cholesky
            one(0)
        else:
            sync_parallelize(one, batch * blocks)


# Rows [i0, i1) of getrf's trailing matrix, columns [c0, n): subtract
# L(i, j0 + q) U(j0 + q, :) for q < min(jb, i - j0) (the panel's rows take
# the multipliers left of their diagonal only), one q after the other (the order an
# unblocked right-looking getrf subtracts them in, so blocking does not
# change a bit), with each row piece held in registers for all jb updates.
@always_inline
def _lu_update_rows[
    dtype: DType, W: Int
](a: Pointer[Scalar[dtype], MutAnyOrigin], i0: Int, i1: Int, j0: Int, jb: Int, c0: Int, n: Int):
    for i in range(i0, i1):
        var ri = a.unsafe_offset(i * n)
        var qs = min(jb, i - j0)
        var c = c0
        while c + 2 * W <= n:
            var v0 = ri.unsafe_offset(c).unsafe_load[width=W]()
            var v1 = ri.unsafe_offset(c + W).unsafe_load[width=W]()
            for q in range(qs):
                var l = ri[unsafe_offset=j0 + q]
                var u = a.unsafe_offset((j0 + q) * n + c)
                v0 = v0 - l * u.unsafe_load[width=W]()
                v1 = v1 - l * u.unsafe_offset(W).unsafe_load[width=W]()
            ri.unsafe_offset(c).unsafe_store(v0)
            ri.unsafe_offset(c + W).unsafe_store(v1)
            c += 2 * W
        if c + W <= n:
            var v0 = ri.unsafe_offset(c).unsafe_load[width=W]()
            for q in range(qs):
                v0 = v0 - ri[unsafe_offset=j0 + q] * a.unsafe_offset((j0 + q) * n + c).unsafe_load[width=W]()
            ri.unsafe_offset(c).unsafe_store(v0)
            c += W
        while c < n:
            var v = ri[unsafe_offset=c]
            for q in range(qs):
                v = v - ri[unsafe_offset=j0 + q] * a[unsafe_offset=(j0 + q) * n + c]
            ri[unsafe_offset=c] = v
            c += 1


@register("juju_lu")
struct LU:
    """Getrf: L (unit diagonal, below) and U in one matrix [batch, m, n], the
    0-based pivot rows [batch, min(m, n)] and the permutation [batch, m]
    (int32) that jax derives from them. Blocked by PANEL columns: a panel is
    factorized unblocked, then U's rows right of it, then one pass over the
    trailing matrix (in parallel over rows for a single large matrix) takes
    the panel's PANEL updates at once."""

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
        comptime PANEL = 8
        comptime ROWS_PER_TASK = 32
        var batch = Int(x.dim_size(0))
        var m = Int(x.dim_size(1))
        var n = Int(x.dim_size(2))
        var r = min(m, n)
        # LAPACK scales by the reciprocal unless it would overflow.
        var smallest_normal = Scalar[dtype](1.1754943508222875e-38) if dtype == DType.float32 else Scalar[dtype](2.2250738585072014e-308)

        def factor(b: Int, split_rows: Bool) {imm}:
            var a = lu.unsafe_ptr().unsafe_offset(b * m * n)
            var piv = pivots.unsafe_ptr().unsafe_offset(b * r)
            var perm = permutation.unsafe_ptr().unsafe_offset(b * m)
            for i in range(m):
                perm[unsafe_offset=i] = Int32(i)
                for j in range(n):
                    a[unsafe_offset=i * n + j] = x[b, i, j]
            for j0 in range(0, r, PANEL):
                var jb = min(PANEL, r - j0)
                var c_end = j0 + jb  # the panel's columns: [j0, c_end)
                for j in range(j0, c_end):
                    # idamax: the first row of largest magnitude (NaN never wins).
                    var p = j
                    var best = abs(a[unsafe_offset=j * n + j])
                    for i in range(j + 1, m):
                        var v = abs(a[unsafe_offset=i * n + j])
                        if v > best:
                            best = v
                            p = i
                    piv[unsafe_offset=j] = Int32(p)
                    if p != j:
                        for c in range(n):
                            var tmp = a[unsafe_offset=j * n + c]
                            a[unsafe_offset=j * n + c] = a[unsafe_offset=p * n + c]
                            a[unsafe_offset=p * n + c] = tmp
                        var tp = perm[unsafe_offset=j]
                        perm[unsafe_offset=j] = perm[unsafe_offset=p]
                        perm[unsafe_offset=p] = tp
                    var d = a[unsafe_offset=j * n + j]
                    if d != 0:
                        if abs(d) >= smallest_normal:
                            var inv = 1 / d
                            for i in range(j + 1, m):
                                a[unsafe_offset=i * n + j] = a[unsafe_offset=i * n + j] * inv
                        else:
                            for i in range(j + 1, m):
                                a[unsafe_offset=i * n + j] = a[unsafe_offset=i * n + j] / d
                    # The rest of the panel's columns now; the columns right
                    # of the panel wait for its last column.
                    for i in range(j + 1, m):
                        var l = a[unsafe_offset=i * n + j]
                        for c in range(j + 1, c_end):
                            a[unsafe_offset=i * n + c] = a[unsafe_offset=i * n + c] - l * a[unsafe_offset=j * n + c]
                if c_end >= n:
                    continue
                # U's rows of the panel, right of it; then the trailing rows.
                _lu_update_rows[dtype, W](a, j0 + 1, c_end, j0, jb, c_end, n)
                var rows = m - c_end
                var tasks = (rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
                if split_rows and tasks > 1 and rows * (n - c_end) >= 1 << 16:

                    def update(task: Int) {imm}:
                        var i0 = c_end + task * ROWS_PER_TASK
                        _lu_update_rows[dtype, W](
                            a, i0, min(i0 + ROWS_PER_TASK, m), j0, jb, c_end, n
                        )

                    sync_parallelize(update, tasks)
                else:
                    _lu_update_rows[dtype, W](a, c_end, m, j0, jb, c_end, n)

        def one(b: Int) {imm}:
            factor(b, False)

        if batch == 1:
            factor(0, True)
        else:
            sync_parallelize(one, batch)


# Householder reflectors H = I - tau v v^T (v[j] = 1, v below the diagonal
# stored in column j) applied from the left to the columns [c0, c1) of rows
# [j, m) of a row-major matrix with n columns: w = v^T A, then A -= tau v w^T,
# in blocks of 4 SIMD vectors of columns so that both passes read contiguous
# row pieces. Column blocks are independent: tasks may split [c0, c1).
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
    ldv: Int,
):
    comptime B = 4 * W
    var c = c0
    while c + B <= c1:
        var w0 = SIMD[dtype, W](0)
        var w1 = SIMD[dtype, W](0)
        var w2 = SIMD[dtype, W](0)
        var w3 = SIMD[dtype, W](0)
        for i in range(j, m):
            var vi = Scalar[dtype](1) if i == j else v[unsafe_offset=i * ldv]
            var row = a.unsafe_offset(i * n + c)
            w0 += vi * row.unsafe_load[width=W]()
            w1 += vi * row.unsafe_offset(W).unsafe_load[width=W]()
            w2 += vi * row.unsafe_offset(2 * W).unsafe_load[width=W]()
            w3 += vi * row.unsafe_offset(3 * W).unsafe_load[width=W]()
        for i in range(j, m):
            var s = tau * (Scalar[dtype](1) if i == j else v[unsafe_offset=i * ldv])
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
        var w = SIMD[dtype, W](0)
        for i in range(j, m):
            var vi = Scalar[dtype](1) if i == j else v[unsafe_offset=i * ldv]
            w += vi * a.unsafe_offset(i * n + c).unsafe_load[width=W]()
        for i in range(j, m):
            var s = tau * (Scalar[dtype](1) if i == j else v[unsafe_offset=i * ldv])
            var row = a.unsafe_offset(i * n + c)
            row.unsafe_store(row.unsafe_load[width=W]() - s * w)
        c += W
    # The last columns (fewer than W): still a row piece at a time.
    var rest = c1 - c
    if rest > 0:
        var w = SIMD[dtype, W](0)
        for i in range(j, m):
            var vi = Scalar[dtype](1) if i == j else v[unsafe_offset=i * ldv]
            for t in range(rest):
                w[t] += vi * a[unsafe_offset=i * n + c + t]
        for i in range(j, m):
            var s = tau * (Scalar[dtype](1) if i == j else v[unsafe_offset=i * ldv])
            for t in range(rest):
                a[unsafe_offset=i * n + c + t] = a[unsafe_offset=i * n + c + t] - s * w[t]


comptime COLUMNS_PER_TASK = 128


@always_inline
def _column_tasks(split: Bool, rows: Int, c0: Int, n: Int) -> Int:
    """Tasks of COLUMNS_PER_TASK columns for one reflection of a single
    large matrix (a batch runs its matrices in parallel instead)."""
    # A parallel launch per reflection costs tens of microseconds: worth it
    # only for reflections of 2^18 elements or more (n >= 512).
    if not split or rows * (n - c0) < 1 << 18:
        return 1
    return (n - c0 + COLUMNS_PER_TASK - 1) // COLUMNS_PER_TASK


@register("juju_geqrf")
struct Geqrf:
    """Geqrf: R on and above the diagonal, the reflectors' v below it, their
    scales tau [batch, min(m, n)]; dlarfg's conventions (beta = -sign(alpha)
    * norm with alpha's sign bit, tau = 0 where the column below the diagonal
    is zero, the norms scaled so that they do not overflow)."""

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
            for j in range(k):
                var alpha = a[unsafe_offset=j * n + j]
                # dnrm2 of the column below the diagonal, scaled by its
                # largest magnitude.
                var scale = Scalar[dtype](0)
                for i in range(j + 1, m):
                    var v = abs(a[unsafe_offset=i * n + j])
                    if v > scale or isnan(v):
                        scale = v
                var tau = Scalar[dtype](0)
                if scale != 0:
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
                    tau = (beta - alpha) / beta
                    var inv = 1 / (alpha - beta)
                    for i in range(j + 1, m):
                        a[unsafe_offset=i * n + j] = a[unsafe_offset=i * n + j] * inv
                    if j + 1 < n:
                        var v = a.unsafe_offset(j)
                        var tasks = _column_tasks(split, m - j, j + 1, n)
                        if tasks > 1:

                            def reflect(task: Int) {imm}:
                                var c = j + 1 + task * COLUMNS_PER_TASK
                                _apply_reflector[dtype, W](
                                    a, v, tau, j, c, min(c + COLUMNS_PER_TASK, n), m, n, n
                                )

                            sync_parallelize(reflect, tasks)
                        else:
                            _apply_reflector[dtype, W](a, v, tau, j, j + 1, n, m, n, n)
                    a[unsafe_offset=j * n + j] = beta
                tau_out[unsafe_offset=j] = tau

        def one(b: Int) {imm}:
            factor(b, False)

        if batch == 1:
            factor(0, True)
        else:
            sync_parallelize(one, batch)


@register("juju_householder_product")
struct HouseholderProduct:
    """Orgqr: Q [batch, m, n], the first n columns of H_0 H_1 ... H_{k-1}
    for the reflectors below the diagonal of a [batch, m, n] (geqrf's
    layout) and their scales [batch, k]."""

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
            for i in range(m):
                for c in range(n):
                    out[unsafe_offset=i * n + c] = Scalar[dtype](1) if i == c else Scalar[dtype](0)
            # Backwards, as orgqr: H_j touches rows and columns >= j only
            # (the columns left of j are still zero in those rows).
            for step in range(k):
                var j = k - 1 - step
                var v = reflectors.unsafe_offset(j)
                var tau = taus[b, j]
                var tasks = _column_tasks(split, m - j, j, n)
                if tasks > 1:

                    def reflect(task: Int) {imm}:
                        var c = j + task * COLUMNS_PER_TASK
                        _apply_reflector[dtype, W](
                            out, v, tau, j, c, min(c + COLUMNS_PER_TASK, n), m, n, n
                        )

                    sync_parallelize(reflect, tasks)
                else:
                    _apply_reflector[dtype, W](out, v, tau, j, j, n, m, n, n)

        def one(b: Int) {imm}:
            build(b, False)

        if batch == 1:
            build(0, True)
        else:
            sync_parallelize(one, batch)
