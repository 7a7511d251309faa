# Scatter into a flat operand, CPU only: updates applied one after another
# in their order, as XLA's CPU scatter does (so duplicate indices add up in
# the same order and the last write of a replace wins). Indices outside
# [0, n) are dropped (the rule maps updates that lax's mode drops there).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .extrema import maximum, minimum

comptime REPLACE = 0
comptime ADD = 1
comptime MUL = 2
comptime MIN = 3
comptime MAX = 4


@register("juju_scatter_flat")
struct ScatterFlat[kind: Int]:
    """Output [n]: operand with updates[i] combined into element flat[i]."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=1, ...],
        operand: InputTensor[dtype=output.dtype, rank=1, ...],
        flat: InputTensor[dtype=DType.int64, rank=1, ...],
        updates: InputTensor[dtype=output.dtype, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_scatter_flat: CPU only"
        comptime dtype = output.dtype
        var n = Int(operand.dim_size(0))
        var m = Int(flat.dim_size(0))
        var out = output.unsafe_ptr()
        var src = operand.unsafe_ptr()
        for i in range(n):
            out[unsafe_offset=i] = src[unsafe_offset=i]
        var where = flat.unsafe_ptr()
        var upd = updates.unsafe_ptr()
        for i in range(m):
            var j = Int(where[unsafe_offset=i])
            if j < 0 or j >= n:
                continue
            var u = upd[unsafe_offset=i]
            comptime if Self.kind == REPLACE:
                out[unsafe_offset=j] = u
            elif Self.kind == ADD:
                out[unsafe_offset=j] = out[unsafe_offset=j] + u
            elif Self.kind == MUL:
                out[unsafe_offset=j] = out[unsafe_offset=j] * u
            else:
                var t = out[unsafe_offset=j]
                out[unsafe_offset=j] = minimum(t, u) if Self.kind == MIN else maximum(t, u)
