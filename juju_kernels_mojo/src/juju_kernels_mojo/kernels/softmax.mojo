# Softmax over the last axis of a rank-2 tensor (the lowering moves the axis
# last and flattens the others), CPU only: rows in parallel, 16-wide SIMD
# (float32; 8 for float64).
# exp is the cost, so it runs once per element: the exponentials are written
# to the output, summed on the way, then scaled in place.
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import parallelize
from std.math import exp, isinf, isnan
from std.utils import IndexList
from std.utils.numerics import inf, nan


@register("juju_row_softmax")
struct RowSoftmax:
    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=output.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_row_softmax: CPU only"
        comptime assert output.dtype.is_floating_point(), (
            "juju_row_softmax: unsupported dtype " + String(output.dtype)
        )
        # Accumulate in float32 at least (float64 for float64 input).
        comptime acc = DType.float64 if x.dtype == DType.float64 else DType.float32
        comptime assert acc.is_floating_point()
        comptime W = 16 if acc == DType.float32 else 8
        var rows = Int(x.dim_size(0))
        var cols = Int(x.dim_size(1))
        var vec_end = cols - cols % W

        def row(i: Int) {imm}:
            var mv = SIMD[acc, W](-inf[acc]())
            var nan_v = SIMD[DType.bool, W](fill=False)
            for j in range(0, vec_end, W):
                var v = x.load[W](IndexList[2](i, j)).cast[acc]()
                mv = max(mv, v)
                nan_v |= isnan(v)
            var m = mv.reduce_max()
            var has_nan = nan_v.reduce_or()
            for j in range(vec_end, cols):
                var v = x[i, j].cast[acc]()
                m = max(m, v)
                has_nan |= isnan(v)
            # As jax.nn.softmax: a NaN, a +inf, or a row of -inf (x - max is
            # NaN somewhere) makes the whole row NaN. exp(NaN) is not NaN here.
            if has_nan or isinf(m):
                for j in range(cols):
                    output[i, j] = nan[output.dtype]()
                return
            var sv = SIMD[acc, W](0)
            var s = Scalar[acc](0)
            for j in range(0, vec_end, W):
                var e = exp(x.load[W](IndexList[2](i, j)).cast[acc]() - m)
                output.store[W](IndexList[2](i, j), e.cast[output.dtype]())
                sv += e
            for j in range(vec_end, cols):
                var e = exp(x[i, j].cast[acc]() - m)
                output[i, j] = e.cast[output.dtype]()
                s += e
            var r = 1 / (s + sv.reduce_add())
            # Output tensors cannot be loaded from: rescale through the
            # pointer (kernel outputs are dense and row-major).
            var out_row = output.unsafe_ptr().unsafe_offset(i * cols)
            for j in range(0, vec_end, W):
                var v = out_row.unsafe_offset(j).unsafe_load[width=W]().cast[acc]() * r
                out_row.unsafe_offset(j).unsafe_store(v.cast[output.dtype]())
            for j in range(vec_end, cols):
                out_row[unsafe_offset=j] = (
                    out_row[unsafe_offset=j].cast[acc]() * r
                ).cast[output.dtype]()

        # Rows in one task per worker (sync_parallelize would make a task per
        # row: 4096 of them for an attention block's softmax); small inputs
        # on this thread.
        if rows * cols < 1 << 14:
            for i in range(rows):
                row(i)
        else:
            parallelize(row, rows)
