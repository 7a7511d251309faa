# Row-wise reductions over the last axis of a rank-2 tensor (the lowering
# flattens leading axes). CPU: a loop per row; GPU: one thread per row.
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.gpu import global_idx
from std.math import exp, log, isinf
from std.utils.numerics import inf


@register("juju_row_logsumexp")
struct RowLogSumExp:
    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=1, ...],
        x: InputTensor[dtype=output.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert output.dtype.is_floating_point(), (
            "juju_row_logsumexp: unsupported dtype " + String(output.dtype)
            + " (floating point only)"
        )
        var rows = x.dim_size(0)
        var cols = x.dim_size(1)

        comptime if target == "cpu":
            for i in range(rows):
                output[i] = _row_logsumexp(x, i, cols)
        else:
            def row_kernel() {var x, var output}:
                var i = Int(global_idx.x)
                if i < Int(x.dim_size(0)):
                    output[i] = _row_logsumexp(x, i, Int(x.dim_size(1)))

            comptime block = 128
            ctx.enqueue_function(
                row_kernel, grid_dim=(rows + block - 1) // block, block_dim=block
            )


@always_inline
def _row_logsumexp(x: InputTensor, i: Int, cols: Int) -> Scalar[x.dtype]:
    # Accumulate in float32 at least (float64 for float64 input).
    comptime acc = DType.float64 if x.dtype == DType.float64 else DType.float32
    comptime assert acc.is_floating_point()
    var m = Scalar[acc](-inf[acc]())
    for j in range(cols):
        m = max(m, x[i, j].cast[acc]())
    if isinf(m):  # empty row, all -inf, or some +inf: the answer is m
        return m.cast[x.dtype]()
    var s = Scalar[acc](0)
    for j in range(cols):
        s += exp(x[i, j].cast[acc]() - m)
    return (m + log(s)).cast[x.dtype]()
