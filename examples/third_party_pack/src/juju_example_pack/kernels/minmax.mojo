# Elementwise min and max of two tensors, as one kernel with two outputs.
from extensibility import register, InputTensor, OutputTensor, foreach
from max.gpu.host import DeviceContext
from std.utils.coord import Coord


@register("example_minmax")
struct MinMax:
    """Writes min(x, y) to `low` and max(x, y) to `high`."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        low: OutputTensor,
        high: OutputTensor[dtype=low.dtype, rank=low.rank, ...],
        x: InputTensor[dtype=low.dtype, rank=low.rank, ...],
        y: InputTensor[dtype=low.dtype, rank=low.rank, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert low.dtype.is_numeric(), (
            "example_minmax: unsupported dtype " + String(low.dtype)
        )

        def lower[width: Int](idx: Coord[...]) {var x, var y} -> SIMD[x.dtype, width]:
            return min(x.load[width](idx), y.load[width](idx))

        def upper[width: Int](idx: Coord[...]) {var x, var y} -> SIMD[x.dtype, width]:
            return max(x.load[width](idx), y.load[width](idx))

        foreach[target=target](lower, low, ctx)
        foreach[target=target](upper, high, ctx)
