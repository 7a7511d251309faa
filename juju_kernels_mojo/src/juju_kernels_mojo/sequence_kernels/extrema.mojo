# max and min as XLA's: NaN propagates, and -0.0 is below +0.0 (Mojo's
# max/min return either zero).
from std.math import isnan
from std.utils.numerics import nan


@always_inline
def maximum[dtype: DType](a: Scalar[dtype], b: Scalar[dtype]) -> Scalar[dtype]:
    comptime if dtype.is_floating_point():
        if isnan(a) or isnan(b):
            return nan[dtype]()
        if a == 0 and b == 0:
            return a + b  # +0.0 unless both are -0.0
    return max(a, b)


@always_inline
def minimum[dtype: DType](a: Scalar[dtype], b: Scalar[dtype]) -> Scalar[dtype]:
    comptime if dtype.is_floating_point():
        if isnan(a) or isnan(b):
            return nan[dtype]()
        if a == 0 and b == 0:
            return -((-a) + (-b))  # -0.0 if either is
    return min(a, b)
