# Elementwise kernels, generic over dtype and rank; `foreach` runs them on
# CPU (vectorised) or GPU (one thread per SIMD chunk) from the same source.
from extensibility import register, InputTensor, OutputTensor, foreach
from max.gpu.host import DeviceContext
from std.utils.coord import Coord


@register("add_one")
struct AddOne:
    """Adds one: x + 1 (the example of juju's documentation)."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor,
        x: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert output.dtype.is_numeric(), (
            "add_one: unsupported dtype " + String(output.dtype)
        )

        def func[width: Int](idx: Coord[...]) {var x} -> SIMD[x.dtype, width]:
            return x.load[width](idx) + 1

        foreach[target=target](func, output, ctx)


@register("juju_fma")
struct FusedMultiplyAdd:
    """Fused multiply-add: x * y + z in one pass over memory."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor,
        x: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        y: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        z: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert output.dtype.is_numeric(), (
            "juju_fma: unsupported dtype " + String(output.dtype)
        )

        def func[width: Int](idx: Coord[...]) {var x, var y, var z} -> SIMD[x.dtype, width]:
            return x.load[width](idx) * y.load[width](idx) + z.load[width](idx)

        foreach[target=target](func, output, ctx)
