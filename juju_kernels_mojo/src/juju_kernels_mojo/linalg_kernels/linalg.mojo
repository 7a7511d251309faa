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
            # the order reference trsm subtracts them.
            for step in range(m):
                var i = step if Self.lower else m - 1 - step
                var xi = xs.unsafe_offset(i * k)
                for q in range(i if Self.lower else m - 1 - i):
                    var p = q if Self.lower else m - 1 - q
                    var tip = t[b, i, p]
                    var xp = xs.unsafe_offset(p * k)
                    var c = c0
                    while c + W <= c1:
                        xi.unsafe_offset(c).unsafe_store(
                            xi.unsafe_offset(c).unsafe_load[width=W]()
                            - tip * xp.unsafe_offset(c).unsafe_load[width=W]()
                        )
                        c += W
                    while c < c1:
                        xi[unsafe_offset=c] = xi[unsafe_offset=c] - tip * xp[unsafe_offset=c]
                        c += 1
                comptime if not Self.unit_diagonal:
                    var d = t[b, i, i]
                    for c in range(c0, c1):
                        xi[unsafe_offset=c] = xi[unsafe_offset=c] / d

        sync_parallelize(one, batch * blocks)


@register("juju_lu")
struct LU:
    """Getrf: L (unit diagonal, below) and U in one matrix [batch, m, n], the
    0-based pivot rows [batch, min(m, n)] and the permutation [batch, m]
    (int32) that jax derives from them."""

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
        var batch = Int(x.dim_size(0))
        var m = Int(x.dim_size(1))
        var n = Int(x.dim_size(2))
        var r = min(m, n)
        # LAPACK scales by the reciprocal unless it would overflow.
        var smallest_normal = Scalar[dtype](1.1754943508222875e-38) if dtype == DType.float32 else Scalar[dtype](2.2250738585072014e-308)

        def one(b: Int) {imm}:
            var a = lu.unsafe_ptr().unsafe_offset(b * m * n)
            var piv = pivots.unsafe_ptr().unsafe_offset(b * r)
            var perm = permutation.unsafe_ptr().unsafe_offset(b * m)
            for i in range(m):
                perm[unsafe_offset=i] = Int32(i)
                for j in range(n):
                    a[unsafe_offset=i * n + j] = x[b, i, j]
            for j in range(r):
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
                # Rank-1 update of the trailing rows, a contiguous axpy each.
                var rj = a.unsafe_offset(j * n)
                for i in range(j + 1, m):
                    var ri = a.unsafe_offset(i * n)
                    var l = ri[unsafe_offset=j]
                    var c = j + 1
                    while c + W <= n:
                        ri.unsafe_offset(c).unsafe_store(
                            ri.unsafe_offset(c).unsafe_load[width=W]()
                            - l * rj.unsafe_offset(c).unsafe_load[width=W]()
                        )
                        c += W
                    while c < n:
                        ri[unsafe_offset=c] = ri[unsafe_offset=c] - l * rj[unsafe_offset=c]
                        c += 1

        sync_parallelize(one, batch)


# Householder reflectors H = I - tau v v^T (v[j] = 1, v below the diagonal
# stored in column j) applied from the left to the columns [c0, n) of rows
# [j, m) of a row-major matrix: w = v^T A, then A -= tau v w^T, in blocks of
# 4 SIMD vectors of columns so that both passes read contiguous row pieces.
@always_inline
def _apply_reflector[
    dtype: DType, W: Int
](
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    v: Pointer[Scalar[dtype], ImmutAnyOrigin],
    tau: Scalar[dtype],
    j: Int,
    c0: Int,
    m: Int,
    n: Int,
    ldv: Int,
):
    comptime B = 4 * W
    var c = c0
    while c + B <= n:
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
    while c < n:
        var w = Scalar[dtype](0)
        for i in range(j, m):
            var vi = Scalar[dtype](1) if i == j else v[unsafe_offset=i * ldv]
            w += vi * a[unsafe_offset=i * n + c]
        for i in range(j, m):
            var vi = Scalar[dtype](1) if i == j else v[unsafe_offset=i * ldv]
            a[unsafe_offset=i * n + c] = a[unsafe_offset=i * n + c] - tau * vi * w
        c += 1


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

        def one(b: Int) {imm}:
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
                        _apply_reflector[dtype, W](
                            a, a.unsafe_offset(j), tau, j, j + 1, m, n, n
                        )
                    a[unsafe_offset=j * n + j] = beta
                tau_out[unsafe_offset=j] = tau

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

        def one(b: Int) {imm}:
            var out = q.unsafe_ptr().unsafe_offset(b * m * n)
            var reflectors = a.unsafe_ptr().unsafe_offset(b * m * n)
            for i in range(m):
                for c in range(n):
                    out[unsafe_offset=i * n + c] = Scalar[dtype](1) if i == c else Scalar[dtype](0)
            # Backwards, as orgqr: H_j touches rows and columns >= j only
            # (the columns left of j are still zero in those rows).
            for step in range(k):
                var j = k - 1 - step
                _apply_reflector[dtype, W](
                    out, reflectors.unsafe_offset(j), taus[b, j], j, j, m, n, n
                )

        sync_parallelize(one, batch)
