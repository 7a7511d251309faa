"""float32 sine and cosine on the CPU, vectorized, with glibc's bits.

MAX's `sin` and `cos` call libm's scalar `sinf`/`cosf` once per element (as
XLA does): ~3.5 ns an element, and every value live across the calls is
spilled, so the ops fused around them slow down too. Here they are graph ops
that MAX fuses into one SIMD loop: glibc's algorithm for |x| < 120 (Arm's
optimized-routines `sinf.c`/`cosf.c`, MIT: reduction by one multiply-subtract
in double, polynomials in double, one rounding to float), which gives
glibc's bits. Larger |x|, infinities and NaN still take libm, on an
argument that is 0 elsewhere (the cheap path of `sinf`).
"""

from __future__ import annotations

from max.dtype import DType
from max.graph import ops

from juju_ops_lax import mixed

#: 2/pi scaled by 2^24, pi/2 (double), and the two polynomials on
#: [-pi/4, pi/4] (cosine c0..c4, sine s1..s3) of optimized-routines.
_HPI_INV = float.fromhex("0x1.45F306DC9C883p+23")
_HPI = float.fromhex("0x1.921FB54442D18p0")
_COS = tuple(float.fromhex(h) for h in (
    "0x1p0", "-0x1.ffffffd0c621cp-2", "0x1.55553e1068f19p-5", "-0x1.6c087e89a359dp-10",
    "0x1.99343027bf8c3p-16"))
_SIN = tuple(float.fromhex(h) for h in (
    "-0x1.555545995a603p-3", "0x1.1107605230bc4p-7", "-0x1.994eb3774cf24p-13"))
#: Where glibc leaves the fast reduction, and where sinf returns x itself.
_FAST_BELOW = 120.0
_SIN_IS_X_BELOW = 2.0**-12


def sin(x):
    return _sin_cos(x, ops.sin, quarter_turns=0)


def cos(x):
    return _sin_cos(x, ops.cos, quarter_turns=1)


def _sin_cos(x, libm_op, quarter_turns):
    """sin(x + quarter_turns * pi/2) for float32 x on the CPU; `libm_op` elsewhere."""
    if x.dtype != DType.float32 or not x.device.is_cpu():
        return libm_op(x)

    def f32(value):
        return ops.constant(value, DType.float32, device=x.device)

    def f64(value):
        return ops.constant(value, DType.float64, device=x.device)

    def mod4(v):
        return ops.sub(v, ops.mul(ops.floor(ops.mul(v, f64(0.25))), f64(4.0)))

    magnitude = ops.abs(x)
    slow = ops.logical_or(mixed.greater_equal(magnitude, f32(_FAST_BELOW)), ops.is_nan(x))
    # A multiply, not a select: MAX would hoist libm_op through where(slow, x, 0).
    libm = libm_op(ops.mul(x, ops.cast(slow, DType.float32)))

    d = ops.cast(x, DType.float64)
    # glibc's rounding of x * 2/pi to the quadrant n, then r = x - n * pi/2.
    scaled = ops.trunc(ops.mul(d, f64(_HPI_INV)))
    n = ops.floor(ops.mul(ops.add(scaled, f64(2.0**23)), f64(2.0**-24)))
    r = ops.sub(d, ops.mul(n, f64(_HPI)))
    quadrant = mod4(ops.add(n, f64(quarter_turns)))

    r2 = ops.mul(r, r)
    r3 = ops.mul(r, r2)
    sine = ops.add(ops.add(r, ops.mul(r3, f64(_SIN[0]))),
                   ops.mul(ops.mul(r3, r2), ops.add(f64(_SIN[1]), ops.mul(r2, f64(_SIN[2])))))
    r4 = ops.mul(r2, r2)
    cosine = ops.add(
        ops.add(ops.add(f64(_COS[0]), ops.mul(r2, f64(_COS[1]))), ops.mul(r4, f64(_COS[2]))),
        ops.mul(ops.mul(r4, r2), ops.add(f64(_COS[3]), ops.mul(r2, f64(_COS[4])))))
    # Quadrants 1 and 3 take the cosine, 2 and 3 the negation (both polynomials
    # are symmetric, so negating the result gives glibc's bits).
    odd = ops.logical_or(mixed.equal(quadrant, f64(1.0)), mixed.equal(quadrant, f64(3.0)))
    value = mixed.where(odd, cosine, sine)
    value = ops.cast(mixed.where(mixed.greater_equal(quadrant, f64(2.0)), ops.negate(value), value),
                     DType.float32)
    if quarter_turns == 0:  # sinf(x) = x for tiny x: keeps -0.0 and subnormals
        value = mixed.where(mixed.greater(f32(_SIN_IS_X_BELOW), magnitude), x, value)
    return mixed.where(slow, libm, value)
