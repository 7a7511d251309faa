# Cumulative reductions (cumsum, cumprod, cummax, cummin, cumlogsumexp)
# along the middle axis of [pre, n, post] tensors, CPU only: one pass in
# order (or in reverse), the `post` columns of a step side by side, the
# `pre` blocks in parallel. float32 and narrower sums accumulate in float64
# (XLA's log-depth scan rounds differently anyway; this keeps the error at
# one rounding per element). max/min propagate NaN and order -0.0
# below +0.0, as XLA's.
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import parallelize
from std.math import exp, isinf, isnan, log1p
from std.utils.numerics import inf, nan

from .extrema import maximum, minimum

comptime ADD = 0
comptime MUL = 1
comptime MAX = 2
comptime MIN = 3
comptime LOGADDEXP = 4


@always_inline
def _combine[kind: Int, dtype: DType](a: Scalar[dtype], b: Scalar[dtype]) -> Scalar[dtype]:
    comptime if kind == ADD:
        return a + b
    elif kind == MUL:
        return a * b
    elif kind == MAX:
        return maximum(a, b)
    elif kind == MIN:
        return minimum(a, b)
    else:
        comptime assert dtype.is_floating_point(), "juju_cumulative: logaddexp of integers"
        if isnan(a) or isnan(b):
            return nan[dtype]()
        var hi = max(a, b)
        var lo = min(a, b)
        if isinf(hi) and hi == lo:  # inf + inf, -inf + -inf
            return hi
        return hi + log1p(exp(lo - hi))


@always_inline
def _identity[kind: Int, dtype: DType]() -> Scalar[dtype]:
    comptime if kind == ADD:
        return 0
    elif kind == MUL:
        return 1
    elif kind == MAX or kind == LOGADDEXP:
        comptime if dtype.is_floating_point():
            return -inf[dtype]()
        else:
            return Scalar[dtype].MIN
    else:
        comptime if dtype.is_floating_point():
            return inf[dtype]()
        else:
            return Scalar[dtype].MAX


# A wide (float64) running sum of float32 or narrower values behaves as
# XLA's float32 arithmetic with denormals flushed (the processor's modes in
# XLA's CPU code): an input below float32's smallest normal reads as a zero
# of its sign, so 0 + -denormal is +0.0 (widening does not flush it: the
# cast to float64 keeps a float32 denormal, bfloat16 widens in software),
# and a partial sum below it becomes a zero of its sign.
@always_inline
def _flush_below_float32[acc: DType](x: Scalar[acc]) -> Scalar[acc]:
    if abs(x) < Scalar[acc](1.1754943508222875e-38):  # float32's smallest normal
        return x * 0
    return x


@register("juju_cumulative")
struct Cumulative[kind: Int, reverse: Bool]:
    """Output [pre, n, post]: the running reduction of x along axis 1."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=3, ...],
        x: InputTensor[dtype=output.dtype, rank=3, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_cumulative: CPU only"
        comptime dtype = output.dtype
        comptime wide = Self.kind == ADD and dtype.is_floating_point() and dtype != DType.float64
        comptime acc = DType.float64 if wide else dtype
        var pre = Int(x.dim_size(0))
        var n = Int(x.dim_size(1))
        var post = Int(x.dim_size(2))

        def block(p: Int) {imm}:
            var src = x.unsafe_ptr().unsafe_offset(p * n * post)
            var dst = output.unsafe_ptr().unsafe_offset(p * n * post)
            var total = List[Scalar[acc]](length=post, fill=_identity[Self.kind, acc]())
            for step in range(n):
                var i = n - 1 - step if Self.reverse else step
                var row = i * post
                for c in range(post):
                    var v = src[unsafe_offset=row + c].cast[acc]()
                    comptime if wide:
                        v = _flush_below_float32(v)
                    var t = _combine[Self.kind, acc](total[c], v)
                    comptime if wide:
                        t = _flush_below_float32(t)
                    total[c] = t
                    dst[unsafe_offset=row + c] = t.cast[dtype]()

        if pre == 1:
            block(0)
        else:
            parallelize(block, pre)
