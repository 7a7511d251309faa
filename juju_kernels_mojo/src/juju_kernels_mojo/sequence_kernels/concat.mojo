# Concatenation along the last axis of row-major parts, CPU only:
# out[r] = parts[0][r] ++ parts[1][r] ++ ... for parts [rows, columns_i]
# (any axis, once the rule has flattened the axes before it into rows and
# the ones from it on into columns). MAX's own concat loads element by
# element (~1.7 GB/s on this CPU); this is a memcpy per row and part,
# blocks of rows in parallel.
from extensibility import register, InputVariadicTensors, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import parallelize
from std.memory import unsafe_memcpy

comptime TASK_ELEMENTS = 1 << 16  # elements one task copies, at least


@register("juju_concat_rows")
struct ConcatRows:
    """Output [rows, sum of columns]: each row of every part, in order."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=2, ...],
        parts: InputVariadicTensors[dtype=output.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_concat_rows: CPU only"
        var rows = Int(output.dim_size(0))
        var width = Int(output.dim_size(1))
        var per_task = max(1, TASK_ELEMENTS // max(1, width))
        var tasks = (rows + per_task - 1) // per_task

        def block(t: Int) {imm}:
            var out = output.unsafe_ptr()
            var start = t * per_task
            var stop = min(rows, start + per_task)
            var column = 0
            comptime for i in range(parts.size):
                var part = parts[i]
                var columns = Int(part.dim_size(1))
                var src = part.unsafe_ptr()
                for r in range(start, stop):
                    unsafe_memcpy(dest=out.unsafe_offset(r * width + column),
                                  src=src.unsafe_offset(r * columns), count=columns)
                column += columns

        if tasks == 1:
            block(0)
        else:
            parallelize(block, tasks)
