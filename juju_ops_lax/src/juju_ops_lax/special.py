"""Transcendental and special functions MAX has no op for, by decomposition.

Each is a JAX function of primitives that do have rules (`lower_fun`). They
compute in float64 when x64 is enabled (float32 otherwise) and cast back, so
float16/bfloat16/float32 results are correctly rounded in practice and float64
ones are within a few ulps (Cephes / Lanczos / Giles algorithms, as XLA uses).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from juju import RuleSet, lower_fun
from juju import primitives as P
from juju._compat import jax_impls

rules = RuleSet()


def _wide():
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def _widened(fun):
    """Run `fun` on float64 copies of float arguments; cast the result back."""

    def wrapper(*xs, accuracy=None, **params):
        dtype = xs[0].dtype
        wide = [lax.convert_element_type(x, _wide()) for x in jnp.broadcast_arrays(*xs)]
        return lax.convert_element_type(fun(*wide, **params), dtype)

    wrapper.__qualname__ = fun.__qualname__
    return wrapper


def _poly(x, coeffs):
    """Horner: coeffs[0]*x^(n-1) + ... + coeffs[-1]."""
    acc = jnp.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        acc = acc * x + c
    return acc


def _where(c, a, b):
    return lax.select(c, a, b)


def _keep_nan(x, result):
    """result, but x where x is NaN (selected: adding a NaN-or-zero term
    would turn a -0.0 result into +0.0)."""
    return _where(x == x, result, x)


# --- inverse trigonometric (Cephes atan, double precision) ---------------------

_ATAN_P = [-8.750608600031904122785e-1, -1.615753718733365076637e1,
           -7.500855792314704667340e1, -1.228866684490136173410e2,
           -6.485021904942025371773e1]
_ATAN_Q = [1.0, 2.485846490142306297962e1, 1.650270098316988542046e2,
           4.328810604912902668951e2, 4.853903996359136964868e2,
           1.945506571482613964425e2]
_T3P8 = 2.41421356237309504880
_MOREBITS = 6.123233995736765886130e-17


def _atan(x):
    sign = jnp.sign(x)
    a = jnp.abs(x)
    big = a > _T3P8
    mid = (a > 0.66) & ~big
    safe = _where(a == 0, jnp.ones_like(a), a)
    xr = _where(big, -1.0 / safe, _where(mid, (a - 1.0) / (a + 1.0), a))
    y0 = _where(big, jnp.full_like(a, math.pi / 2), _where(mid, jnp.full_like(a, math.pi / 4),
                                                            jnp.zeros_like(a)))
    extra = _where(big, jnp.full_like(a, _MOREBITS), _where(mid, jnp.full_like(a, 0.5 * _MOREBITS),
                                                             jnp.zeros_like(a)))
    z = xr * xr
    r = xr * (z * _poly(z, _ATAN_P) / _poly(z, _ATAN_Q)) + xr
    result = y0 + (r + extra)
    result = _where(jnp.isinf(a), jnp.full_like(a, math.pi / 2), result)
    return _keep_nan(x, sign * result)


def _atan2(y, x):
    ay, ax = jnp.abs(y), jnp.abs(x)
    both_inf = jnp.isinf(ay) & jnp.isinf(ax)
    ratio = _where(ax == 0, jnp.full_like(ay, np.inf), ay / _where(ax == 0, jnp.ones_like(ax), ax))
    t = _where(both_inf, jnp.full_like(ay, math.pi / 4), _atan(ratio))
    t = _where((ay == 0) & (ax == 0), jnp.zeros_like(t), t)
    x_neg = (x < 0) | ((x == 0) & (1.0 / _where(x == 0, x, jnp.ones_like(x)) < 0))
    t = _where(x_neg, math.pi - t, t)
    y_neg = (y < 0) | ((y == 0) & (1.0 / _where(y == 0, y, jnp.ones_like(y)) < 0))
    t = _where(y_neg, -t, t)
    return _where((x == x) & (y == y), t, x + y)  # NaN: NaN


def _asin(x):
    return _atan2(x, jnp.sqrt((1.0 - x) * (1.0 + x)))


def _acos(x):
    return _atan2(jnp.sqrt((1.0 - x) * (1.0 + x)), x)


def _asinh(x):
    a = jnp.abs(x)
    big = a > 1e150
    safe = _where(big, jnp.ones_like(a), a)
    small = jnp.log1p(safe + safe * safe / (1.0 + jnp.sqrt(1.0 + safe * safe)))
    result = _where(big, jnp.log(a) + math.log(2.0), small)
    return _keep_nan(x, jnp.sign(x) * result)


def _acosh(x):
    big = x > 1e150
    safe = _where(big, jnp.full_like(x, 2.0), x)
    t = safe - 1.0
    result = jnp.log1p(t + jnp.sqrt(t * (safe + 1.0)))
    return _where(big, jnp.log(x) + math.log(2.0), result)


def _atanh(x):
    return 0.5 * jnp.log1p(2.0 * x / (1.0 - x))


def _sinh(x):
    a = jnp.abs(x)
    u = jnp.expm1(a)
    big = a > 700.0
    half = jnp.exp(_where(big, a - math.log(2.0), jnp.zeros_like(a)))
    result = _where(big, half, 0.5 * (u + u / (u + 1.0)))
    return _keep_nan(x, jnp.sign(x) * result)


def _cosh(x):
    a = jnp.abs(x)
    big = a > 700.0
    e = jnp.exp(_where(big, jnp.zeros_like(a), a))
    return _where(big, jnp.exp(a - math.log(2.0)), 0.5 * (e + 1.0 / e))


def _cbrt(x):
    a = jnp.abs(x)
    safe = _where(a == 0, jnp.ones_like(a), a)
    y = jnp.exp(jnp.log(safe) / 3.0)
    y = y - (y * y * y - safe) / (3.0 * y * y)  # one Newton step
    y = _where((a == 0) | jnp.isinf(a), a, y)
    return _keep_nan(x, jnp.sign(x) * y)


# --- error functions ---------------------------------------------------------

# erfc for x >= 0.5 by Cephes' rational approximations (double precision).
_ERFC_P = [2.46196981473530512524e-10, 5.64189564831068821977e-1,
           7.46321056442269912687e0, 4.86371970985681366614e1,
           1.96520832956077098242e2, 5.26445194995477358631e2,
           9.34528527171957607540e2, 1.02755188689515710272e3,
           5.57535335369399327526e2]
_ERFC_Q = [1.0, 1.32281951154744992508e1, 8.67072140885989742329e1,
           3.54937778887819891062e2, 9.75708501743205489753e2,
           1.82390916687909736289e3, 2.24633760818710981792e3,
           1.65666309194161350182e3, 5.57535340817727675546e2]
_ERFC_R = [5.64189583547755073984e-1, 1.27536670759978104416e0,
           5.01905042251180477414e0, 6.16021097993053585195e0,
           7.40974269950448939160e0, 2.97886665372100240670e0]
_ERFC_S = [1.0, 2.26052863220117276590e0, 9.39603524938001434673e0,
           1.20489539808096656605e1, 1.70814450747565897222e1,
           9.60896809063285878198e0, 3.36907645100081516050e0]


def _erfc(x):
    a = jnp.abs(x)
    safe = _where(a < 0.5, jnp.ones_like(a), a)
    z = jnp.exp(-safe * safe)
    small_a = safe < 8.0
    tail = z * _where(small_a, _poly(safe, _ERFC_P) / _poly(safe, _ERFC_Q),
                      _poly(safe, _ERFC_R) / _poly(safe, _ERFC_S))
    tail = _where(jnp.isinf(safe), jnp.zeros_like(safe), tail)
    pos = _where(x < 0, 2.0 - tail, tail)
    return _where(a < 0.5, 1.0 - lax.erf(x), pos)


# Giles' single-precision erfinv (as XLA), refined by Newton steps in wide.
_ERFINV_A = [2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
             0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941]
_ERFINV_B = [-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
             0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682]


def _erf_inv(x):
    w = -jnp.log((1.0 - x) * (1.0 + x))
    small = w < 5.0
    ws = _where(small, w - 2.5, jnp.sqrt(_where(small, jnp.full_like(w, 9.0), w)) - 3.0)
    y = x * _where(small, _poly(ws, _ERFINV_A), _poly(ws, _ERFINV_B))
    for _ in range(2):
        err = lax.erf(y) - x
        y = y - err / (2.0 / math.sqrt(math.pi) * jnp.exp(-y * y))
    y = _where(jnp.abs(x) == 1.0, x * np.inf, y)
    return _where(jnp.abs(x) > 1.0, jnp.full_like(x, np.nan), y)


# --- gamma family (Lanczos, g=7, n=9, as XLA) ---------------------------------

_LANCZOS_G = 7.0
_LANCZOS_BASE = 0.99999999999980993227684700473478
_LANCZOS_C = [676.520368121885098567009190444019, -1259.13921672240287047156078755283,
              771.3234287776530788486528258894, -176.61502916214059906584551354,
              12.507343278686904814458936853, -0.13857109526572011689554707,
              9.984369578019570859563e-6, 1.50563273514931155834e-7]
_LOG_ROOT_2PI = 0.91893853320467274178


def _lgamma_positive(x):
    """lgamma for x >= 0.5."""
    z = x - 1.0
    a = jnp.full_like(z, _LANCZOS_BASE)
    for i, c in enumerate(_LANCZOS_C):
        a = a + c / (z + (i + 1.0))
    t = z + (_LANCZOS_G + 0.5)
    log_t = math.log(_LANCZOS_G + 0.5) + jnp.log1p(z / (_LANCZOS_G + 0.5))
    return _LOG_ROOT_2PI + (z + 0.5 - t / log_t) * log_t + jnp.log(a)


def _sin_pi_reduced(x):
    """|sin(pi x)| computed on the reduced argument (exact at integers)."""
    a = jnp.abs(x)
    frac = a - jnp.floor(a)
    reduced = _where(frac > 0.5, 1.0 - frac, frac)
    return jnp.sin(math.pi * reduced)


def _lgamma(x):
    reflect = x < 0.5
    y = _where(reflect, 1.0 - x, x)
    lg = _lgamma_positive(y)
    s = _sin_pi_reduced(x)
    reflected = math.log(math.pi) - jnp.log(s) - lg
    result = _where(reflect, reflected, lg)
    is_pole = reflect & (jnp.floor(x) == x)
    result = _where(is_pole | jnp.isinf(x), jnp.full_like(x, np.inf), result)
    return _keep_nan(x, result)


def _digamma(x):
    reflect = x < 0.5
    y = _where(reflect, 1.0 - x, x)
    z = y - 1.0
    num = jnp.zeros_like(z)
    den = jnp.full_like(z, _LANCZOS_BASE)
    for i, c in enumerate(_LANCZOS_C):
        d = z + (i + 1.0)
        num = num - c / (d * d)
        den = den + c / d
    t = z + (_LANCZOS_G + 0.5)
    log_t = math.log(_LANCZOS_G + 0.5) + jnp.log1p(z / (_LANCZOS_G + 0.5))
    result = log_t + num / den - _LANCZOS_G / t
    # Reflection: digamma(x) = digamma(1 - x) - pi / tan(pi x), tan on a reduced arg.
    frac = x - jnp.floor(x)
    tan_pi = jnp.sin(math.pi * frac) / jnp.cos(math.pi * frac)
    result = _where(reflect, result - math.pi / tan_pi, result)
    is_pole = (x <= 0) & (jnp.floor(x) == x)
    return _where(is_pole, jnp.full_like(x, np.nan), result)


# --- modified Bessel functions, exponentially scaled --------------------------


def _bessel_ie(x, order):
    """exp(-|x|) I_order(|x|) (sign restored for odd order): power series for
    |x| <= 25, the asymptotic expansion beyond."""
    a = jnp.abs(x)
    small = a <= 25.0
    s = _where(small, a, jnp.zeros_like(a))
    q = s * s / 4.0
    term = jnp.ones_like(s) if order == 0 else s / 2.0
    total = term
    for k in range(1, 80):
        term = term * q / (k * (k + order))
        total = total + term
    series = total * jnp.exp(-s)
    big = _where(small, jnp.full_like(a, 30.0), a)
    mu = 4.0 * order * order
    term = jnp.ones_like(big)
    total = term
    for k in range(1, 20):
        term = -term * (mu - (2 * k - 1) ** 2) / (k * 8.0 * big)
        total = total + term
    asym = total / jnp.sqrt(2.0 * math.pi * big)
    result = _where(small, series, asym)
    if order == 1:
        result = jnp.sign(x) * result
    return _keep_nan(x, result)


_DECOMPOSITIONS = {
    P.atan_p: _atan,
    P.atan2_p: _atan2,
    P.asin_p: _asin,
    P.acos_p: _acos,
    P.asinh_p: _asinh,
    P.acosh_p: _acosh,
    P.atanh_p: _atanh,
    P.sinh_p: _sinh,
    P.cosh_p: _cosh,
    P.cbrt_p: _cbrt,
    P.erfc_p: _erfc,
    P.erf_inv_p: _erf_inv,
    P.lgamma_p: _lgamma,
    P.digamma_p: _digamma,
    P.bessel_i0e_p: lambda x: _bessel_ie(x, 0),
    P.bessel_i1e_p: lambda x: _bessel_ie(x, 1),
}

for _prim, _fun in _DECOMPOSITIONS.items():
    rules.register(_prim)(lower_fun(_widened(_fun)))


# Incomplete gamma and beta functions: JAX's own series / continued-fraction
# implementations (while loops), computed in float32 for float16/bfloat16
# exactly as XLA's lowering does.
for _prim, _impl in {
    P.igamma_p: jax_impls.igamma_impl,
    P.igammac_p: jax_impls.igammac_impl,
    P.igamma_grad_a_p: jax_impls.igamma_grad_a_impl,
    P.regularized_incomplete_beta_p: jax_impls.regularized_incomplete_beta_impl,
}.items():
    rules.register(_prim)(lower_fun(jax_impls.up_and_broadcast(_impl)))
