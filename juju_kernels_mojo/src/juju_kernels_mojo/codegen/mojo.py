"""The Mojo text of generated loop kernels: dtypes and literals, flat arrays
and their index expressions, each elementwise equation as an expression,
and the helpers every kernel starts with (NaN-propagating max/min, XLA's
float-to-int conversion). The `codegen` package writes loops and equations with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from juju import primitives as P

VECTOR_BYTES = 32  # SIMD width of generated dot products (AVX2)

SUPPORTED_DTYPES = {
    np.dtype(np.float32): "float32", np.dtype(np.float64): "float64",
    np.dtype(np.int32): "int32", np.dtype(np.int64): "int64",
    np.dtype(np.uint32): "uint32", np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "int8", np.dtype(np.int16): "int16", np.dtype(np.uint8): "uint8",
    np.dtype(np.uint16): "uint16", np.dtype(np.uint64): "uint64",
}


class Unsupported(Exception):
    """The program holds something this generator does not write. The
    generator sets `primitive` (the innermost equation refused, by name) and
    `source` (its user source line) as the error passes through it."""

    primitive: str | None = None
    source: str | None = None


def mojo_dtype(dtype) -> str:
    try:
        return "DType." + SUPPORTED_DTYPES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise Unsupported(f"dtype {dtype}") from None


def scalar_type(dtype) -> str:
    return f"Scalar[{mojo_dtype(dtype)}]"


def literal(value, dtype) -> str:
    """A Mojo scalar literal of `dtype`, special floats included."""
    dtype = np.dtype(dtype)
    t = mojo_dtype(dtype)
    value = np.asarray(value, dtype).item()
    if dtype == np.bool_:
        return f"Scalar[{t}]({bool(value)})"
    if dtype.kind == "f":
        if math.isnan(value):
            return f"nan[{t}]()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}inf[{t}]()"
        if value == 0 and math.copysign(1, value) < 0:
            return f"Scalar[{t}](-0.0)"
        return f"Scalar[{t}]({float(value)!r})"
    return f"Scalar[{t}]({int(value)})"


def add_offsets(a: str, b: str) -> str:
    return b if a in ("", "0") else a if b in ("", "0") else f"{a} + {b}"


@dataclass(frozen=True)
class Array:
    """A flat array in the kernel: `ptr[offset + i]`, row-major `shape`."""

    ptr: str
    shape: tuple
    dtype: np.dtype
    offset: str = ""

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def at(self, index: str) -> str:
        return f"{self.ptr}[unsafe_offset={add_offsets(self.offset, index) or '0'}]"

    def load(self, index: str, width: int) -> str:
        """The SIMD vector of `width` elements starting at `index`."""
        return f"{self.ptr}.unsafe_offset({add_offsets(self.offset, index)}).unsafe_load[width={width}]()"

    def store(self, index: str, value: str) -> str:
        """The statement writing the SIMD vector `value` from `index` on."""
        return f"{self.ptr}.unsafe_offset({add_offsets(self.offset, index)}).unsafe_store({value})"

    def address(self) -> str:
        """The pointer to the first element, as a mutable pointer of any
        origin (what a helper taking pointers wants)."""
        start = f".unsafe_offset({self.offset})" if self.offset else ""
        return f"{self.ptr}{start}.unsafe_origin_cast[MutAnyOrigin]()"

    def span(self, start: str, n: int) -> Array:
        """The `n` elements from `start` (an expression), as a flat array."""
        return Array(self.ptr, (n,), self.dtype, add_offsets(self.offset, start))

    def row(self, index: str) -> Array:
        """Row `index` (an expression) of the leading axis."""
        row = math.prod(self.shape[1:])
        return Array(self.ptr, self.shape[1:], self.dtype, add_offsets(self.offset, f"({index}) * {row}"))


@dataclass(frozen=True)
class Const:
    """A literal: every element the same value."""

    value: object
    shape: tuple
    dtype: np.dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def at(self, index: str) -> str:
        return literal(self.value, self.dtype)


def strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def broadcast_strides(shape) -> list[int]:
    """Row-major strides with 0 on size-1 axes: lax broadcasts those of an
    equal-rank operand."""
    return [0 if d == 1 else s for d, s in zip(shape, strides(shape))]


def index_expr(indices, stride_list) -> str:
    terms = [i if s == 1 else f"{i} * {s}" for i, s in zip(indices, stride_list)
             if s != 0 and i != "0"]
    return " + ".join(terms) or "0"


# --- reductions ------------------------------------------------------------------

#: How each reduction combines two values, and its identity: a number, or
#: "low"/"high" for the dtype's lowest/highest value (-inf/inf for floats).
REDUCTIONS = {
    **dict.fromkeys((P.reduce_sum_p, P.reduce_window_sum_p, P.cumsum_p), ("{a} + {b}", 0)),
    **dict.fromkeys((P.reduce_prod_p, P.cumprod_p), ("{a} * {b}", 1)),
    **dict.fromkeys((P.reduce_max_p, P.reduce_window_max_p, P.cummax_p),
                    ("max_nan({a}, {b})", "low")),
    **dict.fromkeys((P.reduce_min_p, P.reduce_window_min_p, P.cummin_p),
                    ("min_nan({a}, {b})", "high")),
    P.reduce_and_p: ("{a} & {b}", True), P.reduce_or_p: ("{a} | {b}", False),
}


def reduction_identity(init, dtype):
    """The identity value of `REDUCTIONS`' `init` in `dtype`."""
    dtype = np.dtype(dtype)
    if not isinstance(init, str):
        return init
    if dtype.kind == "f":
        return -np.inf if init == "low" else np.inf
    if dtype == np.bool_:
        return init == "high"
    info = np.iinfo(dtype)
    return info.min if init == "low" else info.max


# --- elementwise expressions ------------------------------------------------------
# Each takes the operands' dtypes and expressions and returns an expression;
# float math passes NaN through explicitly (keep_nan): Mojo's exp and friends
# do not all return NaN for NaN.

def _float_fn(name):
    return lambda dt, x: f"keep_nan({x}, {name}({x}))"


def _exp(dt, x):
    return f"{'exp_f64' if dt == np.float64 else 'exp'}({x})"


#: Equations whose float64 form calls libm's exp (`exp_f64` in PRELUDE).
LIBM_EXP_F64 = {P.exp_p, P.exp2_p, P.logistic_p}


def _sign(dt, x):
    if dt.kind == "f":  # sign(-0.0) is -0.0, sign(NaN) NaN
        return f"keep_nan({x}, copysign({literal(1, dt)}, {x}) if {x} != 0 else {x})"
    t = mojo_dtype(dt)
    return f"Scalar[DType.bool]({x} > 0).cast[{t}]() - Scalar[DType.bool]({x} < 0).cast[{t}]()"


def unary_expression(prim):
    return {
        P.neg_p: lambda dt, x: f"-{x}",
        P.abs_p: lambda dt, x: f"abs({x})",
        P.exp_p: lambda dt, x: f"keep_nan({x}, {_exp(dt, x)})",
        P.log_p: _float_fn("log"), P.tanh_p: _float_fn("tanh"),
        P.sin_p: _float_fn("sin"), P.cos_p: _float_fn("cos"), P.sqrt_p: _float_fn("sqrt"),
        P.log1p_p: _float_fn("log1p"), P.expm1_p: _float_fn("expm1"),
        # Mojo's exp2 is a coarse approximation (2^inf = 8.5e37): 2^x = e^(x ln 2).
        P.exp2_p: lambda dt, x: f"keep_nan({x}, {_exp(dt, f'{x} * {literal(math.log(2), dt)}')})",
        P.erf_p: _float_fn("erf"),
        P.floor_p: _float_fn("floor"), P.ceil_p: _float_fn("ceil"),
        P.rsqrt_p: lambda dt, x: f"keep_nan({x}, 1 / sqrt({x}))",
        P.logistic_p: lambda dt, x: f"keep_nan({x}, 1 / (1 + {_exp(dt, '-' + x)}))",
        P.sign_p: _sign,
        P.is_finite_p: lambda dt, x: f"not (isnan({x}) or isinf({x}))",
        P.not_p: lambda dt, x: f"~{x}",
        P.square_p: lambda dt, x: f"{x} * {x}",
        P.population_count_p: lambda dt, x: f"pop_count({x})",
        P.clz_p: lambda dt, x: f"count_leading_zeros({x})",
    }.get(prim)


def _total_order(op: str):
    """A comparison in XLA's total order (searchsorted's): floats by their
    bits with the magnitude bits of negatives flipped, so -NaN < -inf < ...
    < -0.0 < 0.0 < ... < inf < NaN; other dtypes as they are."""
    def expression(dt, a, b):
        if dt.kind != "f":
            return f"{a} {op} {b}"
        bits = {4: ("int32", 31, "0x7FFFFFFF"), 8: ("int64", 63, "0x7FFFFFFFFFFFFFFF")}
        if dt.itemsize not in bits:
            raise Unsupported(f"a total-order comparison of {dt}")
        word, sign, magnitude = bits[dt.itemsize]

        def key(x):
            raw = f"bitcast[DType.{word}, 1]({x})"
            return f"({raw} ^ (({raw} >> {sign}) & {magnitude}))"

        return f"{key(a)} {op} {key(b)}"

    return expression


def binary_expression(prim):
    return {
        P.add_p: lambda dt, a, b: f"{a} + {b}",
        P.sub_p: lambda dt, a, b: f"{a} - {b}",
        P.mul_p: lambda dt, a, b: f"{a} * {b}",
        P.div_p: lambda dt, a, b: f"{a} / {b}" if dt.kind == "f" else f"int_div({a}, {b})",
        P.rem_p: lambda dt, a, b: f"{'float' if dt.kind == 'f' else 'int'}_rem({a}, {b})",
        P.pow_p: lambda dt, a, b: f"float_pow({a}, {b})",  # b converted to a's dtype
        P.add_jaxvals_p: lambda dt, a, b: f"{a} + {b}",
        P.max_p: lambda dt, a, b: f"max_nan({a}, {b})",
        P.min_p: lambda dt, a, b: f"min_nan({a}, {b})",
        P.and_p: lambda dt, a, b: f"{a} & {b}",
        P.or_p: lambda dt, a, b: f"{a} | {b}",
        P.xor_p: lambda dt, a, b: f"{a} ^ {b}",
        P.eq_p: lambda dt, a, b: f"{a} == {b}",
        P.ne_p: lambda dt, a, b: f"{a} != {b}",
        P.lt_p: lambda dt, a, b: f"{a} < {b}",
        P.le_p: lambda dt, a, b: f"{a} <= {b}",
        P.gt_p: lambda dt, a, b: f"{a} > {b}",
        P.ge_p: lambda dt, a, b: f"{a} >= {b}",
        P.eq_to_p: _total_order("=="),
        P.lt_to_p: _total_order("<"),
        P.le_to_p: _total_order("<="),
        P.atan2_p: lambda dt, a, b: f"atan2({a}, {b})",
        P.nextafter_p: lambda dt, a, b: f"next_after({a}, {b})",
        P.shift_left_p: lambda dt, a, b: f"shift_left({a}, {b})",
        P.shift_right_logical_p: lambda dt, a, b: f"shift_right_logical({a}, {b})",
        P.shift_right_arithmetic_p: lambda dt, a, b: f"shift_right_arithmetic({a}, {b})",
    }.get(prim)


FLOAT_ONLY = {P.exp_p, P.log_p, P.tanh_p, P.sin_p, P.cos_p, P.sqrt_p, P.log1p_p, P.expm1_p,
              P.exp2_p, P.erf_p, P.floor_p, P.ceil_p, P.rsqrt_p, P.logistic_p, P.is_finite_p,
              P.atan2_p, P.pow_p, P.round_p, P.nextafter_p}
SHIFTS = {P.shift_left_p, P.shift_right_logical_p, P.shift_right_arithmetic_p}
BIT_COUNTS = {P.population_count_p, P.clz_p}
INTEGER_ONLY = {P.not_p, P.and_p, P.or_p, P.xor_p, *SHIFTS, *BIT_COUNTS}
NOT_BOOL = {P.div_p, P.rem_p}

PRELUDE = '''\
from extensibility import register, InputTensor, OutputTensor
from std.ffi import external_call
from max.gpu.host import DeviceContext
from std.math import (atan2, ceil, copysign, cos, erf, exp, expm1, floor, isinf, isnan, log,
                      log1p, sin, sqrt, tanh, trunc)
from std.bit import count_leading_zeros, pop_count
from std.memory import bitcast
from std.sys import bit_width_of
from std.utils.numerics import FlushDenormals, inf, max_finite, min_finite, nan


@always_inline
def keep_nan[dt: DType](x: Scalar[dt], y: Scalar[dt]) -> Scalar[dt]:
    comptime if dt.is_floating_point():
        return x if isnan(x) else y
    else:
        return y


@always_inline
def keep_nan_v[dt: DType, w: Int](x: SIMD[dt, w], y: SIMD[dt, w]) -> SIMD[dt, w]:
    # Mojo 1.2 does not infer w from the arguments: callers name both.
    return isnan(x).select(x, y)


@always_inline
def exp_f64(x: Float64) -> Float64:
    # Mojo's float64 exp is off by up to 4e-11 relative (exp(88)); libm's
    # is within an ulp, as XLA's.
    return external_call["exp", Float64](x)


@always_inline
def max_nan[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    comptime if dt.is_floating_point():
        if isnan(a):
            return a
        if a == 0 and b == 0:  # XLA orders -0.0 below +0.0
            return a + b
    return a if a > b else b


@always_inline
def min_nan[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    comptime if dt.is_floating_point():
        if isnan(a):
            return a
        if a == 0 and b == 0:  # -0.0 if either is
            return -((-a) + (-b))
    return a if a < b else b


@always_inline
def int_div[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    # XLA's: rounds toward zero; x / 0 is -1 (all bits set), INT_MIN / -1
    # wraps to INT_MIN (LLVM's sdiv would trap on both).
    if b == 0:
        return ~Scalar[dt](0)
    comptime if dt.is_signed():
        if b == -1:
            return -a
        var q = a // b  # floor: one more where a remainder has the other sign
        if q * b != a and ((a < 0) != (b < 0)):
            return q + 1
        return q
    else:
        return a // b


@always_inline
def int_rem[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    # XLA's: the dividend's sign; x % 0 is x, INT_MIN % -1 is 0.
    if b == 0:
        return a
    comptime if dt.is_signed():
        if b == -1:
            return 0
    return a - int_div(a, b) * b


@always_inline
def libm_binary[f64: StaticString, f32: StaticString, dt: DType](
    a: Scalar[dt], b: Scalar[dt]
) -> Scalar[dt]:
    # libm's function `f64` on float64, its float32 form `f32` otherwise.
    comptime if dt == DType.float64:
        return external_call[f64, Float64](a.cast[DType.float64](),
                                           b.cast[DType.float64]()).cast[dt]()
    else:
        return external_call[f32, Float32](a.cast[DType.float32](),
                                           b.cast[DType.float32]()).cast[dt]()


@always_inline
def float_rem[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    # C's fmod (XLA's frem): exact, the dividend's sign.
    return libm_binary["fmod", "fmodf", dt](a, b)


@always_inline
def float_pow[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    # C's pow, as XLA's CPU backend calls it (Mojo's ** takes other paths).
    return libm_binary["pow", "powf", dt](a, b)


@always_inline
def float_to_int[src: DType, dst: DType](x: Scalar[src]) -> Scalar[dst]:
    # XLA's conversion: NaN -> 0, out-of-range values saturate.
    if isnan(x):
        return 0
    if x <= min_finite[dst]().cast[src]():
        return min_finite[dst]()
    if x >= max_finite[dst]().cast[src]():
        return max_finite[dst]()
    return x.cast[dst]()


@always_inline
def next_after[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    # C's nextafter (XLA's: denormal steps kept, NaN in gives NaN).
    return libm_binary["nextafter", "nextafterf", dt](a, b)


# lax.round: halves away from zero, or to even; the sign of zero kept.
@always_inline
def round_away[dt: DType](x: Scalar[dt]) -> Scalar[dt]:
    if isnan(x) or isinf(x):
        return x
    var t = trunc(x)
    if abs(x - t) >= 0.5:  # x - t is exact
        t += copysign(Scalar[dt](1), x)
    return copysign(t, x)


@always_inline
def round_even[dt: DType](x: Scalar[dt]) -> Scalar[dt]:
    if isnan(x) or isinf(x):
        return x
    var f = floor(x)
    var d = x - f
    var r = f
    if d > 0.5 or (d == 0.5 and f * 0.5 != floor(f * 0.5)):
        r = f + 1
    return copysign(r, x)


# XLA's shifts: an amount outside [0, bit width) gives 0 (left, logical) or
# the sign fill (arithmetic, which reads an unsigned top bit as the sign).
@always_inline
def shift_left[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    comptime top = Scalar[dt](bit_width_of[dt]() - 1)
    if b < 0 or b > top:
        return 0
    return a << b


@always_inline
def shift_right_logical[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    comptime top = Scalar[dt](bit_width_of[dt]() - 1)
    if b < 0 or b > top:
        return 0
    comptime if dt.is_signed():
        # `>>` is arithmetic on signed types: clear the top b bits.
        return (a >> b) & ~((Scalar[dt](-1) << (top - b)) << 1)
    else:
        return a >> b


@always_inline
def shift_right_arithmetic[dt: DType](a: Scalar[dt], b: Scalar[dt]) -> Scalar[dt]:
    comptime top = Scalar[dt](bit_width_of[dt]() - 1)
    comptime if dt.is_signed():
        if b < 0 or b > top:
            return a >> top
        return a >> b
    else:
        var fill = Scalar[dt](0) - (a >> top)
        if b > top:
            return fill
        return (a >> b) | ((fill << (top - b)) << 1)
'''


#: Elementwise equations also written over SIMD vectors (float operands of
#: one shape, or splatted scalars): arithmetic and math functions.
#: Comparisons, selects, casts and min/max stay scalar loops.
VECTOR_ELEMENTWISE = {
    P.add_p, P.sub_p, P.mul_p, P.div_p, P.neg_p, P.abs_p, P.square_p, P.add_jaxvals_p,
    P.exp_p, P.log_p, P.tanh_p, P.sin_p, P.cos_p, P.sqrt_p, P.log1p_p, P.expm1_p, P.exp2_p,
    P.erf_p, P.floor_p, P.ceil_p, P.rsqrt_p, P.logistic_p,
}

ELEMENTWISE = {
    P.neg_p, P.abs_p, P.exp_p, P.log_p, P.tanh_p, P.sin_p, P.cos_p, P.sqrt_p, P.log1p_p,
    P.expm1_p, P.exp2_p, P.erf_p, P.floor_p, P.ceil_p, P.rsqrt_p, P.logistic_p, P.sign_p,
    P.is_finite_p, P.not_p, P.square_p, P.add_p, P.sub_p, P.mul_p, P.div_p, P.max_p, P.min_p,
    P.and_p, P.or_p, P.xor_p, P.eq_p, P.ne_p, P.lt_p, P.le_p, P.gt_p, P.ge_p, P.atan2_p,
    P.eq_to_p, P.lt_to_p, P.le_to_p, P.integer_pow_p, P.select_n_p, P.clamp_p, P.convert_element_type_p, P.add_jaxvals_p,
    P.rem_p, P.pow_p, P.round_p, P.nextafter_p, *SHIFTS, *BIT_COUNTS, P.bitcast_convert_type_p,
}


#: What kernels that run work on the cores (`Emitter.split`, the BLAS) add
#: to PRELUDE: written only into those, since the imports cost every build
#: a few seconds.
THREADS_PRELUDE = '''
from std.ffi import OwnedDLHandle, RTLD
from std.os import getenv
from std.sys import num_physical_cores
from max.algorithm import sync_parallelize


def kernel_cores() -> Int:
    """The threads a generated kernel's large loops and products use: the
    physical cores, or JUJU_KERNEL_THREADS."""
    var asked = getenv("JUJU_KERNEL_THREADS")
    if asked:
        try:
            return max(1, atol(asked))
        except:
            pass
    return num_physical_cores()


def blas_gemm[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    ta: Bool, tb: Bool, batch: Int, m: Int, n: Int, k: Int, parallel: Bool,
    a: UnsafePointer[Scalar[dt], MutAnyOrigin], b: UnsafePointer[Scalar[dt], MutAnyOrigin],
    c: UnsafePointer[Scalar[dt], MutAnyOrigin],
) raises:
    """c[i] = op(a[i]) op(b[i]) for i < batch through the BLAS's row-major
    ?gemm; a large product in blocks (matrices, else row or column blocks),
    one per core where `parallel` (the library is a single-threaded copy)."""
    # RTLD.LOCAL: opened globally (Mojo's default), its internal symbols would
    # bind the LP64 OpenBLAS that jaxlib's LAPACK uses to this ILP64 one.
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    var gemm = lib.get_function[NoneType](symbol)
    var lda = m if ta else k
    var ldb = k if tb else n
    var trans_a = Int32(112) if ta else Int32(111)
    var trans_b = Int32(112) if tb else Int32(111)
    var one = Scalar[dt](1)
    var zero = Scalar[dt](0)

    def block(i: Int, r0: Int, r1: Int, c0: Int, c1: Int) {var}:
        var a0 = a.unsafe_offset(i * m * k + (r0 if ta else r0 * k))
        var b0 = b.unsafe_offset(i * k * n + (c0 * k if tb else c0))
        var c00 = c.unsafe_offset(i * m * n + r0 * n + c0)
        comptime if ilp64:
            gemm(Int32(101), trans_a, trans_b, r1 - r0, c1 - c0, k, one, a0, lda, b0, ldb,
                 zero, c00, n)
        else:
            gemm(Int32(101), trans_a, trans_b, Int32(r1 - r0), Int32(c1 - c0), Int32(k), one,
                 a0, Int32(lda), b0, Int32(ldb), zero, c00, Int32(n))

    var tasks = kernel_cores()
    if not parallel or tasks < 2:
        for i in range(batch):
            block(i, 0, m, 0, n)
        return

    def task(t: Int) {var}:
        with FlushDenormals():
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


def blas_gemv[dt: DType, library: StaticString, symbol: StaticString, ilp64: Bool](
    trans: Bool, batch: Int, rows: Int, cols: Int, parallel: Bool,
    a: UnsafePointer[Scalar[dt], MutAnyOrigin], x: UnsafePointer[Scalar[dt], MutAnyOrigin],
    y: UnsafePointer[Scalar[dt], MutAnyOrigin],
) raises:
    """y[i] = op(a[i]) x[i] for i < batch, a[i] a row-major rows x cols
    matrix (op: transposed where `trans`) through the BLAS's ?gemv: a
    matrix-vector product as ?gemm packs the whole matrix first. Where
    `parallel`, one block of y per core."""
    var lib = OwnedDLHandle(library, RTLD.NOW | RTLD.LOCAL)
    var gemv = lib.get_function[NoneType](symbol)
    var outs = cols if trans else rows
    var ins = rows if trans else cols
    var op = Int32(112) if trans else Int32(111)
    var one = Scalar[dt](1)
    var zero = Scalar[dt](0)

    def block(i: Int, o0: Int, o1: Int) {var}:
        var a0 = a.unsafe_offset(i * rows * cols + (o0 if trans else o0 * cols))
        var m = rows if trans else o1 - o0
        var n = o1 - o0 if trans else cols
        comptime if ilp64:
            gemv(Int32(101), op, m, n, one, a0, cols, x.unsafe_offset(i * ins), 1, zero,
                 y.unsafe_offset(i * outs + o0), 1)
        else:
            gemv(Int32(101), op, Int32(m), Int32(n), one, a0, Int32(cols),
                 x.unsafe_offset(i * ins), Int32(1), zero, y.unsafe_offset(i * outs + o0),
                 Int32(1))

    var tasks = kernel_cores()
    if not parallel or tasks < 2:
        for i in range(batch):
            block(i, 0, outs)
        return

    def task(t: Int) {var}:
        with FlushDenormals():
            if batch >= tasks:
                for i in range(t * batch // tasks, (t + 1) * batch // tasks):
                    block(i, 0, outs)
            else:
                var width = ((outs + tasks - 1) // tasks + 15) // 16 * 16
                var o0 = min(t * width, outs)
                for i in range(batch):
                    if o0 < outs:
                        block(i, o0, min(o0 + width, outs))

    sync_parallelize(task, tasks)
'''
