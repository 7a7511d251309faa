# Matrix products on the CPU through the BLAS library numpy (or scipy) ships,
# opened by path at run time (blas_rules.py finds it). The kernel is the same
# for every shape, so a graph compiles it in about the time of an elementwise
# op; MAX's own matmul is instantiated per shape and costs ~25 s per graph
# on 2 cores (issue 16).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import sync_parallelize
from std.ffi import OwnedDLHandle, RTLD
from std.sys import num_physical_cores


comptime ROW_MAJOR = Int32(101)
comptime NO_TRANS = Int32(111)
comptime TRANS = Int32(112)
# Below this many multiply-adds one call on this thread beats waking workers.
comptime SERIAL_WORK = 1 << 18


@register("juju_gemm")
struct Gemm[
    library: StaticString,
    gemm_symbol: StaticString,
    ilp64: Bool,
    transpose_a: Bool,
    transpose_b: Bool,
]:
    """Out[b] = op(a[b]) op(b[b]), op a transpose where asked: a is [B, M, K]
    ([B, K, M] transposed), b is [B, K, N] ([B, N, K] transposed), out is
    [B, M, N], all row-major and contiguous. Large problems are split into
    pieces (matrices of the batch, else column or row blocks) run on MAX's
    worker threads; `library` is a copy of the BLAS set to one thread
    (blas_rules.py): BLAS's own threads would compete with MAX's for the
    same cores."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=3, ...],
        a: InputTensor[dtype=output.dtype, rank=3, ...],
        b: InputTensor[dtype=output.dtype, rank=3, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_gemm: CPU only"
        comptime dtype = output.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_gemm: unsupported dtype " + String(dtype)
        )
        var batch = Int(output.dim_size(0))
        var m = Int(output.dim_size(1))
        var n = Int(output.dim_size(2))
        var k = Int(a.dim_size(1)) if Self.transpose_a else Int(a.dim_size(2))
        if batch == 0 or m == 0 or n == 0:
            return
        var pa = a.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var pb = b.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var pc = output.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var lda = m if Self.transpose_a else k
        var ldb = k if Self.transpose_b else n
        # Local: opened globally, it would bind jaxlib's LAPACK to this BLAS (mojo.py).
        var lib = OwnedDLHandle(Self.library, RTLD.NOW | RTLD.LOCAL)
        var gemm = lib.get_function[NoneType](Self.gemm_symbol)
        var ta = TRANS if Self.transpose_a else NO_TRANS
        var tb = TRANS if Self.transpose_b else NO_TRANS
        var one = Scalar[dtype](1)
        var zero = Scalar[dtype](0)

        # C[r0:r1, c0:c1] of matrix i (a block of rows or columns of one
        # product, or the whole of it).
        def block(i: Int, r0: Int, r1: Int, c0: Int, c1: Int) {var}:
            var a0 = pa.unsafe_offset(i * m * k + (r0 if Self.transpose_a else r0 * k))
            var b0 = pb.unsafe_offset(i * k * n + (c0 * k if Self.transpose_b else c0))
            var c = pc.unsafe_offset(i * m * n + r0 * n + c0)
            comptime if Self.ilp64:
                gemm(ROW_MAJOR, ta, tb, r1 - r0, c1 - c0, k, one, a0, lda, b0, ldb, zero, c, n)
            else:
                gemm(ROW_MAJOR, ta, tb, Int32(r1 - r0), Int32(c1 - c0), Int32(k), one, a0,
                     Int32(lda), b0, Int32(ldb), zero, c, Int32(n))

        var tasks = num_physical_cores()
        if batch * m * n * k < SERIAL_WORK or tasks < 2:
            for i in range(batch):
                block(i, 0, m, 0, n)
            return

        def task(t: Int) {var}:
            if batch >= tasks:
                for i in range(t * batch // tasks, (t + 1) * batch // tasks):
                    block(i, 0, m, 0, n)
            elif n >= m:  # column blocks, whole SIMD vectors wide
                var width = ((n + tasks - 1) // tasks + 15) // 16 * 16
                for i in range(batch):
                    var c0 = min(t * width, n)
                    if c0 < n:
                        block(i, 0, m, c0, min(c0 + width, n))
            else:
                var height = (m + tasks - 1) // tasks
                for i in range(batch):
                    var r0 = min(t * height, m)
                    if r0 < m:
                        block(i, r0, min(r0 + height, m), 0, n)

        sync_parallelize(task, tasks)
