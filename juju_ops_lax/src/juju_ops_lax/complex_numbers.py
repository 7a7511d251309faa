"""Complex numbers on MAX, which has no complex dtype.

Inside a graph a complex array is its parts, float[..., 2] (real, imaginary;
`juju.dtypes.physical_aval`). Structural primitives apply to each part.
Arithmetic is written in JAX on the real parts (`on_parts`), traced and lowered
through the real rules; where JAX's own lowering is a decomposition (sin, cos,
integer_pow, logistic) it is traced on the complex avals and re-enters these
rules. Formulas follow XLA's complex expansions where they matter for accuracy
(Smith's division, the branch formulas of sqrt, Kahan's inverse functions).
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
from jax import lax
from max.graph import ops

from juju import ALL_DTYPES, RuleSet, lower_fun, on_parts
from juju import primitives as P
from juju._compat import is_complex_dtype, jax_impls
from juju.primitives import split_p, tile_p
from juju.lowering_helpers import C, has_complex
from juju.errors import UnsupportedDtypeError
from juju_ops_lax._util import lower_per_word

# Every rule here is for complex operands (guard has_complex), in their
# in-graph form float[..., 2].
rules = RuleSet(dtypes=ALL_DTYPES)

# Complex rules outrank the real ones for equations that touch complex values.
_PRIORITY = 1


def _register(*prims):
    return rules.register(*prims, priority=_PRIORITY, guard=has_complex)


# --- structural primitives: once per part --------------------------------------

_PER_PART = [
    P.broadcast_in_dim_p, P.concatenate_p, P.copy_p, P.dynamic_slice_p,
    P.dynamic_update_slice_p, P.gather_p, P.pad_p, P.reshape_p, P.rev_p, P.scatter_p,
    P.scatter_add_p, P.select_n_p, P.slice_p, P.squeeze_p, P.transpose_p, split_p, tile_p,
    P.reduce_sum_p, P.cumsum_p, P.reduce_window_sum_p, P.add_p, P.sub_p, P.neg_p,
    P.add_jaxvals_p,
]


@_register(*_PER_PART)
def lower_per_part(ctx, *operands, **params):
    return lower_per_word(ctx, *operands, wide=is_complex_dtype, **params)


# --- arithmetic on the parts ------------------------------------------------------


def _mul(x: C, y: C) -> C:
    return C(x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re)


def _div(x: C, y: C) -> C:
    """Smith's algorithm: scale by the larger part of the divisor (no
    overflow of |y|^2)."""
    big_re = abs(y.re) >= abs(y.im)
    safe_re = jax.numpy.where(y.re == 0, 1, y.re)
    safe_im = jax.numpy.where(y.im == 0, 1, y.im)
    r1 = y.im / safe_re  # |y.re| >= |y.im|
    d1 = y.re + y.im * r1
    r2 = y.re / safe_im
    d2 = y.re * r2 + y.im
    re = jax.numpy.where(big_re, (x.re + x.im * r1) / d1, (x.re * r2 + x.im) / d2)
    im = jax.numpy.where(big_re, (x.im - x.re * r1) / d1, (x.im * r2 - x.re) / d2)
    return C(re, im)


def _abs(x: C):
    return jax.numpy.hypot(x.re, x.im)


def _exp(x: C) -> C:
    e = lax.exp(x.re)
    # exp(inf + 0i) is inf + 0i, not inf + nan i
    im = jax.numpy.where(x.im == 0, x.im, e * lax.sin(x.im))
    return C(e * lax.cos(x.im), im)


def _log(x: C) -> C:
    return C(lax.log(_abs(x)), lax.atan2(x.im, x.re))


def _log1p(x: C) -> C:
    # |1 + x|^2 - 1 = re (2 + re) + im^2: no cancellation for small x
    re = 0.5 * lax.log1p(x.re * (2 + x.re) + x.im * x.im)
    big = _abs(x) > 0.5  # there the plain log is as accurate and cannot overflow
    re = jax.numpy.where(big, lax.log(_abs(C(1 + x.re, x.im))), re)
    return C(re, lax.atan2(x.im, 1 + x.re))


def _expm1(x: C) -> C:
    # e^a cos b - 1 = expm1(a) cos b - 2 sin^2(b / 2)
    s = lax.sin(x.im / 2)
    re = lax.expm1(x.re) * lax.cos(x.im) - 2 * s * s
    return C(re, lax.exp(x.re) * lax.sin(x.im))


def _sqrt(x: C) -> C:
    """sqrt(a + bi) = t + b/(2t) i (a >= 0), |b|/(2t) + copysign(t, b) i (a < 0),
    t = sqrt((|a| + |x|) / 2)."""
    t = lax.sqrt((abs(x.re) + _abs(x)) / 2)
    safe_t = jax.numpy.where(t == 0, 1, t)
    other = x.im / (2 * safe_t)
    re = jax.numpy.where(x.re >= 0, t, abs(other))
    im = jax.numpy.where(x.re >= 0, other, jax.numpy.where(x.im < 0, -t, t))
    zero = t == 0
    return C(jax.numpy.where(zero, 0, re), jax.numpy.where(zero, x.im, im))


def _rsqrt(x: C) -> C:
    return _div(C(jax.numpy.ones_like(x.re), jax.numpy.zeros_like(x.re)), _sqrt(x))


def _sinh_cosh(a):
    return lax.sinh(a), lax.cosh(a)


def _sinh(x: C) -> C:
    sh, ch = _sinh_cosh(x.re)
    return C(sh * lax.cos(x.im), ch * lax.sin(x.im))


def _cosh(x: C) -> C:
    sh, ch = _sinh_cosh(x.re)
    return C(ch * lax.cos(x.im), sh * lax.sin(x.im))


def _tanh(x: C) -> C:
    """(sinh 2a + i sin 2b) / (cosh 2a + cos 2b); sign(a) + 0i where cosh
    overflows."""
    sh, ch = _sinh_cosh(2 * x.re)
    den = ch + lax.cos(2 * x.im)
    big = abs(x.re) > 20
    re = jax.numpy.where(big, jax.numpy.sign(x.re), sh / den)
    im = jax.numpy.where(big, 0 * x.im, lax.sin(2 * x.im) / den)
    return C(re, im)


def _times_i(x: C) -> C:
    return C(-x.im, x.re)


def _times_minus_i(x: C) -> C:
    return C(x.im, -x.re)


def _tan(x: C) -> C:
    return _times_minus_i(_tanh(_times_i(x)))  # tan z = -i tanh(iz)


def _one_plus(x: C, sign=1) -> C:
    return C(1 + sign * x.re, sign * x.im)


def _asin(x: C) -> C:
    """Kahan's formulas ("Branch cuts for complex elementary functions")."""
    s1, s2 = _sqrt(_one_plus(x, -1)), _sqrt(_one_plus(x))
    re = lax.atan2(x.re, s1.re * s2.re - s1.im * s2.im)
    im = lax.asinh(s1.re * s2.im - s1.im * s2.re)
    return C(re, im)


def _acos(x: C) -> C:
    s1, s2 = _sqrt(_one_plus(x, -1)), _sqrt(_one_plus(x))
    re = 2 * lax.atan2(s1.re, s2.re)
    im = lax.asinh(s2.re * s1.im - s2.im * s1.re)
    return C(re, im)


def _acosh(x: C) -> C:
    s1, s2 = _sqrt(C(x.re - 1, x.im)), _sqrt(_one_plus(x))
    re = lax.asinh(s1.re * s2.re + s1.im * s2.im)
    im = 2 * lax.atan2(s1.im, s2.re)
    return C(re, im)


def _asinh(x: C) -> C:
    return _times_minus_i(_asin(_times_i(x)))  # asinh z = -i asin(iz)


def _atanh(x: C) -> C:
    lo, hi = _log1p(x), _log1p(C(-x.re, -x.im))
    return C((lo.re - hi.re) / 2, (lo.im - hi.im) / 2)


def _atan(x: C) -> C:
    return _times_minus_i(_atanh(_times_i(x)))  # atan z = -i atanh(iz)


def _pow(x: C, y):
    """x^y = |x|^c e^(-d arg x) (cos t + i sin t), t = c arg x + d log|x|;
    0^0 = 1 and 0^y = 0 otherwise, as XLA."""
    y = y if isinstance(y, C) else C(y.astype(x.re.dtype), jax.numpy.zeros_like(x.re))
    r, theta = _abs(x), lax.atan2(x.im, x.re)
    zero = r == 0
    log_r = lax.log(jax.numpy.where(zero, 1, r))
    mag = lax.exp(y.re * log_r - y.im * theta)
    t = y.re * theta + y.im * log_r
    y_zero = (y.re == 0) & (y.im == 0)
    base_zero = jax.numpy.where(y_zero, 1, 0).astype(x.re.dtype)
    re = jax.numpy.where(zero, base_zero, mag * lax.cos(t))
    im = jax.numpy.where(zero, 0, mag * lax.sin(t))
    return C(re, im)


def _exp2(x: C) -> C:
    ln2 = np.log(2).astype(x.re.dtype)
    return _exp(C(x.re * ln2, x.im * ln2))


def _sign(x: C) -> C:
    r = _abs(x)
    safe = jax.numpy.where(r == 0, 1, r)
    return C(x.re / safe, x.im / safe)


def _square(x: C) -> C:
    return _mul(x, x)


def _unary(fn):
    def rule_fn(x, accuracy=None):
        return fn(x)

    rule_fn.__name__ = fn.__name__.lstrip("_")
    return on_parts(rule_fn)


for _prim, _fn in {
    P.exp_p: _exp, P.log_p: _log, P.log1p_p: _log1p, P.expm1_p: _expm1,
    P.sqrt_p: _sqrt, P.rsqrt_p: _rsqrt, P.sinh_p: _sinh, P.cosh_p: _cosh,
    P.tanh_p: _tanh, P.tan_p: _tan, P.asin_p: _asin, P.acos_p: _acos,
    P.atan_p: _atan, P.asinh_p: _asinh, P.acosh_p: _acosh, P.atanh_p: _atanh,
    P.exp2_p: _exp2, P.sign_p: _sign, P.square_p: _square, P.abs_p: _abs,
}.items():
    _register(_prim)(_unary(_fn))


def mul(x, y, out_dtype=None):
    if out_dtype is not None:
        raise NotImplementedError(f"mul: out_dtype={out_dtype} with complex operands")
    return _mul(x, y)


def div(x, y):
    return _div(x, y)


def power(x, y):
    return _pow(x, y)


def eq(x, y):
    return (x.re == y.re) & (x.im == y.im)


def ne(x, y):
    return (x.re != y.re) | (x.im != y.im)


def real(x):
    return x.re


def imag(x):
    return x.im


def make_complex(x, y):
    return C(*jax.numpy.broadcast_arrays(x, y))  # JAX's own lowerings pass scalar zeros


def conj(x, *, input_dtype=None, _input_dtype=None):  # (for JAX's transpose rule)
    if isinstance(x, C):
        return C(x.re, -x.im)
    return C(x, jax.numpy.zeros_like(x))


def _minmax(pick_x_re, pick_x_im):
    def minmax(x, y):
        """Lexicographic on (real, imaginary), as XLA."""
        pick_x = jax.numpy.where(x.re == y.re, pick_x_im(x.im, y.im), pick_x_re(x.re, y.re))
        return C(jax.numpy.where(pick_x, x.re, y.re), jax.numpy.where(pick_x, x.im, y.im))

    return minmax


maximum = _minmax(lax.gt, lax.gt)
minimum = _minmax(lax.lt, lax.lt)

for _prim, _fn in {
    P.mul_p: mul, P.div_p: div, P.pow_p: power, P.eq_p: eq, P.ne_p: ne,
    P.real_p: real, P.imag_p: imag, P.complex_p: make_complex, P.conj_p: conj,
    P.max_p: maximum, P.min_p: minimum,
}.items():
    _register(_prim)(on_parts(_fn))


# JAX's own complex decompositions, traced on the complex avals.
_register(P.sin_p)(lower_fun(lambda x, accuracy=None: jax_impls.sin_complex(x)))
_register(P.cos_p)(lower_fun(lambda x, accuracy=None: jax_impls.cos_complex(x)))
_register(P.logistic_p)(lower_fun(jax_impls.logistic))
_register(P.integer_pow_p)(lower_fun(jax_impls.integer_pow))


# --- conversions and constants --------------------------------------------------


def _part_dtype(dtype):
    return np.finfo(dtype).dtype


def convert_element_type(x, *, new_dtype, weak_type, sharding):
    if is_complex_dtype(new_dtype):
        part = _part_dtype(new_dtype)
        if isinstance(x, C):
            return C(x.re.astype(part), x.im.astype(part))
        re = lax.convert_element_type(x, part)
        return C(re, jax.numpy.zeros_like(re))
    if np.dtype(new_dtype) == np.bool_:  # as XLA: x != 0
        return (x.re != 0) | (x.im != 0)
    return lax.convert_element_type(x.re, new_dtype)  # the real part, as numpy


_register(P.convert_element_type_p)(on_parts(convert_element_type))


@_register(P.bitcast_convert_type_p)
def lower_bitcast_convert_type(ctx, x, *, new_dtype):
    # JAX allows a complex bitcast only to its own dtype: the identity.
    if np.dtype(new_dtype) != np.dtype(ctx.avals_in[0].dtype):
        raise NotImplementedError(f"bitcast of {ctx.avals_in[0].dtype} to {new_dtype}")
    return x


@_register(P.iota_p)
def lower_iota(ctx, *, dtype, shape, dimension, sharding):
    part = _part_dtype(dtype)
    closed = jax.make_jaxpr(lambda: lax.iota(part, shape[dimension]))()
    (line,) = ctx.lower(closed)
    re = ops.broadcast_to(
        ops.reshape(line, [shape[dimension] if d == dimension else 1 for d in range(len(shape))]),
        list(shape),
    )
    return ops.stack([re, ops.broadcast_to(ctx.constant(0, part), list(shape))], axis=-1)


def dot_general(lhs, rhs, *, dimension_numbers, precision, preferred_element_type,
                out_sharding):
    part = _part_dtype(preferred_element_type) if preferred_element_type is not None else None

    def dot(a, b):
        return lax.dot_general(a, b, dimension_numbers, precision=precision,
                               preferred_element_type=part)

    # A real operand takes the complex one's precision, as JAX types the result.
    if not isinstance(lhs, C):
        lhs = lhs.astype(rhs.re.dtype)
        return C(dot(lhs, rhs.re), dot(lhs, rhs.im))
    if not isinstance(rhs, C):
        rhs = rhs.astype(lhs.re.dtype)
        return C(dot(lhs.re, rhs), dot(lhs.im, rhs))
    return C(dot(lhs.re, rhs.re) - dot(lhs.im, rhs.im), dot(lhs.re, rhs.im) + dot(lhs.im, rhs.re))


_register(P.dot_general_p)(on_parts(dot_general))


# --- reductions, scans, sorting ----------------------------------------------------


def _reduce_tree(x: C, axes, combine):
    """Reduce `axes` by pairwise halving (complex combine on the parts)."""
    from juju_ops_lax.reduce_generic import _reduce_axis

    xs = [x.re, x.im]
    for axis in sorted(axes):
        xs = _reduce_axis(xs, lambda a, b, c, d: list(combine(C(a, b), C(c, d))), axis)
    keep = [d for d in range(x.re.ndim) if d not in axes]
    shape = [x.re.shape[d] for d in keep]
    return C(*[lax.reshape(v, shape) for v in xs])


def _reduction(combine, identity):
    def reduce(x, *, axes, out_sharding=None):
        if any(x.re.shape[a] == 0 for a in axes):
            shape = [s for d, s in enumerate(x.re.shape) if d not in axes]
            return C(jax.numpy.full(shape, identity.real, x.re.dtype),
                     jax.numpy.full(shape, identity.imag, x.re.dtype))
        return _reduce_tree(x, axes, combine)

    reduce.__name__ = f"reduce_{combine.__name__}"
    return reduce


_register(P.reduce_prod_p)(on_parts(_reduction(_mul, 1)))
_register(P.reduce_max_p)(on_parts(_reduction(maximum, -np.inf)))
_register(P.reduce_min_p)(on_parts(_reduction(minimum, np.inf)))


def _cumulative(combine):
    def cumulative(x, *, axis, reverse):
        re, im = lax.associative_scan(lambda a, b: tuple(combine(C(*a), C(*b))),
                                      (x.re, x.im), reverse=reverse, axis=axis)
        return C(re, im)

    cumulative.__name__ = f"cumulative_{combine.__name__}"
    return cumulative


_register(P.cumprod_p)(on_parts(_cumulative(_mul)))
_register(P.cummax_p)(on_parts(_cumulative(maximum)))
_register(P.cummin_p)(on_parts(_cumulative(minimum)))


def sort(*operands, dimension, is_stable, num_keys):
    """Complex keys sort by (real, imaginary): each becomes two keys."""
    flat, keys = [], 0
    for i, x in enumerate(operands):
        parts = [x.re, x.im] if isinstance(x, C) else [x]
        flat += parts
        if i < num_keys:
            keys += len(parts)
    out = iter(lax.sort(flat, dimension=dimension, is_stable=is_stable, num_keys=keys))
    return [C(next(out), next(out)) if isinstance(x, C) else next(out) for x in operands]


_register(P.sort_p)(on_parts(sort))


# --- windowed reductions ------------------------------------------------------------


def _reduce_window(operands, inits, combine, *, window_dimensions, window_strides, padding,
                   base_dilation, window_dilation):
    """XLA's reduce_window in lax terms: every window offset is a strided
    slice folded into the init values; positions that padding or base
    dilation added are skipped (XLA CPU does not fold them in)."""
    config = [(lo, hi, b - 1) for (lo, hi), b in zip(padding, base_dilation)]
    xs = [lax.pad(x, init, config) for x, init in zip(operands, inits)]
    real = lax.pad(jax.numpy.ones(operands[0].shape, bool), False, config)
    shape = xs[0].shape
    out_shape = [
        0 if n < (w - 1) * d + 1 else (n - (w - 1) * d - 1) // s + 1
        for n, w, d, s in zip(shape, window_dimensions, window_dilation, window_strides)
    ]
    acc = [lax.broadcast(init, out_shape) for init in inits]
    if 0 in out_shape:
        return acc
    for offset in itertools.product(*(range(w) for w in window_dimensions)):
        start = [o * d for o, d in zip(offset, window_dilation)]
        limit = [b + (n - 1) * s + 1 for b, n, s in zip(start, out_shape, window_strides)]
        keep = lax.slice(real, start, limit, window_strides)
        views = [lax.slice(x, start, limit, window_strides) for x in xs]
        acc = [jax.numpy.where(keep, new, old)
               for new, old in zip(combine(*acc, *views), acc)]
    return acc


def _reduce_window_generic(*operands_and_inits, jaxpr, consts, **window):
    k = len(operands_and_inits) // 2
    body = jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(jaxpr, list(consts)))
    return _reduce_window(operands_and_inits[:k], operands_and_inits[k:], body, **window)


def _reduce_window_of(combine, identity):
    def reduce_window(x, **window):
        init = lax.full((), identity, x.dtype)
        (out,) = _reduce_window([x], [init], lambda a, b: [combine(a, b)], **window)
        return out

    return reduce_window


_register(P.reduce_window_p)(lower_fun(_reduce_window_generic, multiple_results=True))
_register(P.reduce_window_max_p)(lower_fun(_reduce_window_of(lax.max, -np.inf)))
_register(P.reduce_window_min_p)(lower_fun(_reduce_window_of(lax.min, np.inf)))


# --- what stays unsupported --------------------------------------------------------


@_register(P.argmax_p, P.argmin_p, P.cumlogsumexp_p, P.reduce_precision_p,
           P.scatter_mul_p, P.scatter_min_p, P.scatter_max_p, P.top_k_p)
def lower_unsupported(ctx, *operands, **params):
    def dtypes(avals):
        return ", ".join(str(a.dtype) for a in avals)

    raise UnsupportedDtypeError(
        f"{ctx.primitive.name} has no rule for complex numbers (operands "
        f"{dtypes(ctx.avals_in)}; results {dtypes(ctx.avals_out)}); run it with jax.jit"
    )
