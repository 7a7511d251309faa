# The register block the blocked factorizations share (the inner work of
# getrf's trailing update, potrf's L21 L21^T and dlarfb's C -= V W).
from std.utils import StaticTuple


@always_inline
def subtract_product[
    dtype: DType, W: Int, R: Int, CV: Int
](
    c: Pointer[Scalar[dtype], MutAnyOrigin],
    ldc: Int,
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    lda: Int,
    b: Pointer[Scalar[dtype], MutAnyOrigin],
    ldb: Int,
    k: Int,
):
    """C[:R, :CV*W] -= A[:R, :k] B[:k, :CV*W] (row-major, leading dimensions
    ldc, lda, ldb; the pointers at each block's first element): R rows times
    CV SIMD vectors in registers, every element subtracting its k terms one
    after the other in order (an unblocked loop's rounding)."""
    var acc = StaticTuple[SIMD[dtype, W], R * CV](fill=SIMD[dtype, W](0))
    comptime for r in range(R):
        comptime for u in range(CV):
            acc[r * CV + u] = c.unsafe_offset(r * ldc + u * W).unsafe_load[width=W]()
    for q in range(k):
        var row = b.unsafe_offset(q * ldb)
        comptime for u in range(CV):
            var y = row.unsafe_offset(u * W).unsafe_load[width=W]()
            comptime for r in range(R):
                acc[r * CV + u] = acc[r * CV + u] - a[unsafe_offset=r * lda + q] * y
    comptime for r in range(R):
        comptime for u in range(CV):
            c.unsafe_offset(r * ldc + u * W).unsafe_store(acc[r * CV + u])
