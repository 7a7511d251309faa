# Integer bit operations MAX has no graph op for, with XLA semantics (a
# shift by an amount outside [0, bit width) gives 0 (shift_left,
# shift_right_logical) or the sign fill (shift_right_arithmetic), also for
# unsigned types (an arithmetic shift treats the top bit as the sign)), and
# bitcasts between dtypes of one width. One source for CPU and GPU: `foreach` picks the target.
from extensibility import register, InputTensor, OutputTensor, foreach
from max.gpu.host import DeviceContext
from std.utils.coord import Coord
from std.bit import pop_count, count_leading_zeros
from std.sys import bit_width_of
from std.memory import bitcast

comptime AND = 0
comptime OR = 1
comptime XOR = 2
comptime SHIFT_LEFT = 3
comptime SHIFT_RIGHT_LOGICAL = 4
comptime SHIFT_RIGHT_ARITHMETIC = 5

comptime NOT = 0
comptime POPULATION_COUNT = 1
comptime CLZ = 2


@always_inline
def _binary[
    op: Int, dtype: DType, width: Int
](a: SIMD[dtype, width], b: SIMD[dtype, width]) -> SIMD[dtype, width]:
    comptime bits = bit_width_of[dtype]()
    comptime V = SIMD[dtype, width]
    comptime if op == AND:
        return a & b
    elif op == OR:
        return a | b
    elif op == XOR:
        return a ^ b
    else:
        var zero = V(0)
        var one = V(1)
        var top = V(bits - 1)
        var out_of_range = b.gt(top) | b.lt(zero)
        var s = out_of_range.select(zero, b)  # a shift amount in [0, bits)
        comptime if op == SHIFT_LEFT:
            return out_of_range.select(zero, a << s)
        elif op == SHIFT_RIGHT_LOGICAL:
            var shifted = a >> s
            comptime if dtype.is_signed():
                # `>>` is arithmetic on signed types: clear the top s bits.
                shifted = shifted & ~((V(-1) << (top - s)) << one)
            return out_of_range.select(zero, shifted)
        else:
            comptime assert op == SHIFT_RIGHT_ARITHMETIC
            comptime if dtype.is_signed():
                return out_of_range.select(a >> top, a >> s)
            else:
                var fill = zero - (a >> top)  # all ones when the top bit is set
                var shifted = (a >> s) | ((fill << (top - s)) << one)
                return out_of_range.select(fill, shifted)


@register("juju_bitwise_binary")
struct BitwiseBinary[op: Int]:
    """Bitwise and, or, xor and the three shifts on integers, by `op`."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor,
        x: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        y: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert output.dtype.is_integral(), (
            "juju_bitwise_binary: unsupported dtype " + String(output.dtype)
            + " (integers only)"
        )

        def func[width: Int](idx: Coord[...]) {var x, var y} -> SIMD[x.dtype, width]:
            return _binary[Self.op](x.load[width](idx), y.load[width](idx))

        foreach[target=target](func, output, ctx)


@register("juju_bitwise_unary")
struct BitwiseUnary[op: Int]:
    """Bitwise not, population_count and clz on integers, by `op`."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor,
        x: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert output.dtype.is_integral(), (
            "juju_bitwise_unary: unsupported dtype " + String(output.dtype)
            + " (integers only)"
        )

        def func[width: Int](idx: Coord[...]) {var x} -> SIMD[x.dtype, width]:
            var a = x.load[width](idx)
            comptime if Self.op == NOT:
                return ~a
            elif Self.op == POPULATION_COUNT:
                return pop_count(a)
            else:
                return count_leading_zeros(a)

        foreach[target=target](func, output, ctx)


@register("juju_bitcast")
struct Bitcast:
    """Bitcast_convert_type between dtypes of one width: the same bits read
    as another dtype (MAX's graph API has no bitcast)."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor,
        x: InputTensor[rank=output.rank, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert bit_width_of[output.dtype]() == bit_width_of[x.dtype](), (
            "juju_bitcast: " + String(x.dtype) + " and " + String(output.dtype)
            + " differ in width"
        )

        def func[width: Int](idx: Coord[...]) {var x} -> SIMD[output.dtype, width]:
            return bitcast[output.dtype, width](x.load[width](idx))

        foreach[target=target](func, output, ctx)
