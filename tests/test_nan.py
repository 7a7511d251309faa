"""NaN and infinity semantics as XLA's, for every float dtype.

MAX 26.7's kernels assume no NaN (see juju_ops_lax.nan): before the fix
`isnan(nan)` was False, `exp(nan)` inf, `bool(nan)` False, `max(x, 0)` of a
NaN 0. Each case runs on [NaN, 1, inf, -inf, ...] inputs in float32, float16,
bfloat16 and float64, all in one MAX compilation, compared with jax.jit:
NaN positions, values, shapes and dtypes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import juju
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from juju import primitives as P

from tests.util import assert_same, selected

NAN, INF = np.nan, np.inf
X = [NAN, 1.0, INF, -INF, 0.0, -0.0, -1.0, 2.0, NAN, 3.0, -NAN, 0.5]
Y = [1.0, NAN, INF, 2.0, -0.0, 0.0, NAN, -INF, NAN, 1.0, 3.0, 0.5]
# pow's special cases: every base with every exponent
BASES = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0]
EXPONENTS = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.0, 3.0, -3.0, 0.5, -2.5]


def issue_example(x, y):
    return jnp.isnan(x), jnp.exp(x), x.astype(bool), jnp.nan_to_num(x)


def comparisons(x, y):
    # x == x and friends on purpose: MAX folds them as if x were never NaN
    return (x == y, x != y, x > y, x >= y, x < y, x <= y, x == x, x != x,  # noqa: PLR0124
            x >= x, x <= x, x > x, jnp.isfinite(x), jnp.isinf(x),  # noqa: PLR0124
            jnp.isnan(y), jnp.any(jnp.isnan(x)), jnp.all(x == x))  # noqa: PLR0124


def selects(x, y):
    return (jnp.where(x > 0, x, y), jnp.where(jnp.isnan(x), 7.0, x), jnp.maximum(x, y),
            jnp.minimum(x, y), jnp.clip(x, -1.0, 1.0), lax.clamp(x.dtype.type(-1), y,
                                                                  x.dtype.type(1)),
            jnp.fmax(x, y), jnp.nan_to_num(y, nan=5.0), jnp.sign(x))


def math_fns(x, y):
    return (jnp.exp(x), jnp.log(x), jnp.sqrt(x), jnp.tanh(x), jax.nn.sigmoid(x), jnp.expm1(x),
            jnp.exp2(x), jnp.log1p(x), jnp.sin(x), lax.rsqrt(x), x * y, x / y, jnp.fmod(x, y),
            jnp.arctan2(x, y), jax.nn.relu(x), jax.nn.silu(x), jax.nn.gelu(x),
            jax.nn.softmax(x.reshape(3, 4)), jax.nn.log_softmax(x.reshape(3, 4)),
            jax.nn.logsumexp(x.reshape(3, 4), axis=1), jnp.abs(x), -x, jnp.floor(x),
            jnp.round(x))


def nan_made_inside(x, y):
    # NaNs produced by the graph itself (inf - inf, 0 * inf), then tested
    made = x * 0.0 + (y - y)
    return (jnp.isnan(made), made != made, jnp.exp(made),  # noqa: PLR0124
            made.astype(bool), made.max())


def casts(x, y):
    return (x.astype(bool), x.astype(jnp.int32), x.astype(jnp.float32),
            x.astype(jnp.float16), x.astype(jnp.bfloat16), x.astype(jnp.uint8))


def reductions(x, y):
    m = x.reshape(3, 4)
    # max/min over a short last axis of a large array: an elementwise fold in juju
    # (NaN-free: see test_large_reductions_keep_xla_semantics)
    tiled = jnp.tile(jnp.where(jnp.isnan(x), 7.0, x), 400)
    rows8, rows3 = tiled.reshape(-1, 8), tiled.reshape(-1, 3)
    # sums over a short last axis fold too, NaN and inf rows included
    with_nan = jnp.tile(x, 400).reshape(-1, 8)
    return (rows8.max(-1), rows8.min(-1), rows3.max(-1), rows3.min(-1),
            with_nan.sum(-1), rows3.sum(-1), jax.nn.logsumexp(rows8, -1),
            x.sum(), x.max(), x.min(), x.prod(), x.mean(), m.max(0), m.min(1), m.sum(1),
            jnp.argmax(x), jnp.argmin(x), jnp.argmax(m, 0), jnp.argmin(m, 1), jnp.argmax(y),
            lax.cummax(x), lax.cummin(x), jnp.cumsum(x), jnp.cumprod(x),
            # pooling: MAX's max/min dropped the NaN
            lax.reduce_window(m, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID"),
            lax.reduce_window(m, jnp.inf, lax.min, (2, 2), (1, 2), "SAME"))


def infinite_rows(x, y):
    """Rows of only -inf or only +inf: MAX's float max reduction starts from
    the lowest finite value (and min from the largest), so a fully masked
    row's max was -3.4e38, and softmax did not see the row as all -inf."""
    rows = jnp.stack([jnp.full(4, x[3]), x[4:8], jnp.full(4, x[2])])  # -inf, finite, +inf
    long_rows = jnp.tile(rows, (1, 2048))  # a few long rows: reduced in chunks
    many_rows = jnp.tile(rows, (400, 1))  # a short last axis: an elementwise fold
    mask = jnp.arange(12).reshape(3, 4) > 3  # the first row masked out
    logits = jnp.where(mask, x.reshape(3, 4), -jnp.inf)
    return (rows.max(1), rows.min(1), rows.max(0), rows.min(0), rows[0].max(), rows[2].min(),
            long_rows.max(1), long_rows.min(1), long_rows[0].max(), many_rows.max(1),
            many_rows.min(1), jnp.max(x.reshape(3, 4), axis=1, where=mask, initial=-jnp.inf),
            jnp.min(x.reshape(3, 4), axis=1, where=mask, initial=jnp.inf),
            jax.nn.logsumexp(logits, axis=1), jax.nn.softmax(logits, axis=1),
            jax.nn.log_softmax(rows, axis=1), jnp.argmax(rows, 1), jnp.argmin(rows, 1),
            lax.cummax(rows, axis=1), lax.top_k(rows[0], 2)[0],
            lax.reduce_window(rows, -jnp.inf, lax.max, (1, 2), (1, 2), "VALID"),
            jax.ops.segment_max(x[4:8], jnp.array([0, 0, 1, 1]), num_segments=3),
            jax.ops.segment_min(x[4:8], jnp.array([0, 0, 1, 1]), num_segments=3))


def one_element_scans(x, y):
    """A scan over an axis of one element is the operand itself under XLA,
    -0.0 kept (0 + -0.0 would be +0.0); cumlogsumexp is logaddexp(-inf, x),
    +0.0 for -0.0. Also tanh of the smallest normal numbers: x itself (MAX's
    float32 tanh flushed them to 0)."""
    column = x.reshape(12, 1)
    tiny = jnp.finfo(x.dtype).tiny * jnp.stack([x[1], x[6], x[7], x[9]])  # normal, +-
    return (jnp.cumsum(column, 1), jnp.cumprod(column, 1), lax.cummax(column, 1),
            lax.cummin(column, 1), lax.cumsum(column, 1, reverse=True),
            lax.cumlogsumexp(column, 1), jnp.cumsum(x.reshape(1, 12), 0), jnp.tanh(tiny),
            jnp.tanh(tiny).astype(bool))


def sorting(x, y):
    return (jnp.sort(x), jnp.argsort(x), jnp.sort(y), jnp.argsort(y), jnp.argsort(-x),
            jnp.sort(x.reshape(3, 4), axis=0), lax.top_k(y, 4))


def powers(b, e):
    return (b[:, None] ** e[None, :], b ** 2, b ** -1, jnp.power(b, 0.5))


def remainders(x, y):
    """A zero remainder has the dividend's sign (fmod(-1, 1) is -0.0); MAX's
    mod by a constant 1.0 was 0 for every x, by 0.1 mostly 0, and lost the
    remainder of large quotients."""
    # (not fmod(x, x): MAX folds an op of a value with itself, see y - y below)
    return (jnp.fmod(x * 2, x), jnp.fmod(x, 1.0), jnp.fmod(x, -1.0), lax.rem(x, y),
            jnp.fmod(-x, 1.0), jnp.fmod(x, jnp.flip(x)), jnp.remainder(x, 0.1),
            jnp.fmod(x * 1000, 3.0), jnp.remainder(x, 2.0))


def stops_at_nan(x, y):
    """A training-like loop that stops when its state becomes NaN."""
    def cond(state):
        step, v = state
        return jnp.logical_and(step < 50, ~jnp.any(jnp.isnan(v)))

    def body(state):
        step, v = state
        return step + 1, v * jnp.where(step == 0, y[0], y[1])  # 2 -> 2*inf -> inf*0 = nan

    v0 = jnp.stack([x[7], x[7]])
    return lax.while_loop(cond, body, (0, v0))


def constant_numerators(x, y):
    """MAX folds 0 / y to +0 when the 0 is a constant (an empty sum is one)."""
    empty = x[:0]
    return (jnp.mean(empty), jnp.zeros_like(y) / y, 0.0 / y, -0.0 / y, jnp.sum(empty) / y,
            1.0 / y)


def zeros_and_folds(x, y):
    """XLA orders -0.0 below +0.0 in max and min (MAX returned either zero),
    and MAX's simplifier folded x * 0 to 0 and 0 - x to -x, as if no x were
    infinite, NaN or +0.0. Also functions of -0.0 that are -0.0."""
    z = jnp.stack([x[4], x[5], x[4], x[5], x[1]])  # +0 -0 +0 -0 1 (runtime values)
    w = jnp.stack([x[4], x[4], x[5], x[5], x[5]])  # +0 +0 -0 -0 -0
    zw = jnp.concatenate([z, x])
    wy = jnp.concatenate([w, y])

    def loop_body(i, carry):  # max and min in a loop kernel's generated code
        hi, lo = carry
        return jnp.maximum(hi, wy), jnp.minimum(lo, wy)

    pair = jnp.stack([zw, wy])
    # max/min reductions and pooling: +0.0 (max) or -0.0 (min) wherever the
    # zeros meet (MAX kept whichever came first)
    # (XLA's vectorized reductions of large arrays keep the later zero: see
    # test_large_reductions_keep_xla_semantics)
    zeros = jnp.stack([z[:4], w[:4], -w[:4], jnp.stack([x[5], x[5], x[6], x[5]])])  # the last: -0 -0 -1 -0
    reduced = [zeros.max(1), zeros.min(1), zeros.max(0), zeros.min(0)]
    pooled = [lax.reduce_window(zeros, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID"),
              lax.reduce_window(zeros, jnp.inf, lax.min, (1, 2), (1, 2), "VALID")]
    return (jnp.maximum(zw, wy), jnp.minimum(zw, wy), jnp.maximum(wy, zw), jnp.minimum(wy, zw),
            jax.nn.relu(zw), jnp.maximum(zw, 0.0), jnp.maximum(zw, -0.0), jnp.minimum(zw, 0.0),
            jnp.minimum(zw, -0.0), jnp.maximum(zw, 1.0), jnp.minimum(2.0, zw),
            jnp.clip(wy, 0.0, 1.0), jnp.clip(zw, -1.0, -0.0), jax.nn.relu6(wy),
            lax.cummax(pair, 0), lax.cummin(pair, 0), lax.cummax(pair, 0, reverse=True),
            jax.ops.segment_max(zw, jnp.arange(17) // 2, num_segments=9),
            jax.ops.segment_min(zw, jnp.arange(17) // 2, num_segments=9),
            zeros.max(), zeros.min(), *reduced, *pooled,
            lax.fori_loop(0, 3, loop_body, (zw, zw)),
            zw * 0.0, 0.0 * zw, zw * -0.0, zw * jnp.zeros_like(zw), jnp.exp(zw) * 0.0,
            zw - zw, 0.0 - zw, jnp.sum(zw * 0.0),
            jnp.arctan(z), jnp.arcsin(z), jnp.arcsinh(z), jnp.sinh(z), jnp.cbrt(z),
            jnp.arctan2(z, w), jnp.arctan2(z, 1.0),
            jnp.maximum(jnp.full(3, 2.0, x.dtype), jnp.full(3, -1.0, x.dtype)),  # constants only
            jnp.minimum(jnp.full(3, -0.0, x.dtype), jnp.zeros(3, x.dtype)))


def total_order(x, y):
    """XLA's total-order comparisons (eq_to, lt_to, le_to: -0.0 < +0.0, NaN
    above +inf), which searchsorted, digitize, histogram and interp bind.
    Every NaN here is +NaN (juju cannot see a NaN's sign, docs/testing.md)."""
    xs = jnp.sort(x)
    edges = jnp.array([-1.0, -0.0, 0.0, 1.0, jnp.inf], x.dtype)
    xp = jnp.array([-1.0, 0.0, 1.0, 2.0], x.dtype)
    return (P.eq_to_p.bind(x, y), P.lt_to_p.bind(x, y), P.le_to_p.bind(x, y),
            P.lt_to_p.bind(y, x), P.le_to_p.bind(y, y),
            jnp.searchsorted(xs, y), jnp.searchsorted(xs, y, side="right"),
            jnp.searchsorted(edges, y, method="compare_all"),
            jnp.searchsorted(edges, y, side="right", method="sort"),
            jnp.digitize(y, edges), jnp.histogram(y, bins=3, range=(-1.0, 2.0))[0],
            jnp.interp(y, xp, xp * xp),
            jnp.searchsorted(jnp.arange(0, 20, 2), jnp.arange(-1, 22, 3)))


def chained_gathers(x, y):
    """A binary search: each step gathers at indices computed from the last
    step's gather. MAX fused such element gathers with 2-D indices into the
    next gather's indices and failed to compile (jnp.searchsorted of 2-D
    queries); juju copies their result unfused, signs of zeros and NaNs kept."""
    queries = y.reshape(3, 4)
    grid = jnp.arange(12).reshape(3, 4)
    xp = jnp.array([-1.0, 0.0, 1.0, 2.0], x.dtype)
    return (jnp.searchsorted(jnp.sort(x), queries),
            jnp.searchsorted(jnp.sort(x), queries, side="right"),
            jnp.interp(queries, xp, jnp.array([3.0, -1.0, 0.5, 2.0], x.dtype)),
            jnp.digitize(queries, jnp.array([-1.0, 0.0, 1.0], x.dtype)),
            x[(grid * 5) % 12], (x > 0)[grid.T], x[grid] * 2.0)


def unit_dims(x, y):
    """Selects and comparisons on shapes with size-1 dimensions, which juju
    computes without those dimensions (juju_ops_lax.mixed), broadcasting
    included; after a keepdims reduction too, as logsumexp's gradient has."""
    a, b = x.reshape(12, 1), y.reshape(12, 1)
    c, d = x.reshape(1, 3, 1, 4), y.reshape(1, 3, 1, 4)
    e, row = x.reshape(3, 1, 4), y[:4].reshape(1, 1, 4)
    finite = jnp.where(jnp.isfinite(x), x, 1.0).reshape(3, 4)
    s = jnp.sum(finite, axis=1, keepdims=True) / -y[:3].reshape(3, 1)
    return (a > b, a >= b, a == b, a != b, a <= b, a == a, jnp.where(a >= 0, a, b),  # noqa: PLR0124
            jnp.where(c != d, c, -d), jnp.where(jnp.isnan(c), 7.0, d), jnp.maximum(c, d),
            jnp.minimum(a, b), jnp.sign(a), jnp.abs(c), e > row, jnp.where(e < row, e, row),
            jnp.where(s >= 0, s, -s) + jnp.where(s >= 0, -s, s), jnp.where(a > 0, a, y))


CASES = {
    "issue_example": issue_example, "comparisons": comparisons, "selects": selects,
    "math": math_fns, "nan_made_inside": nan_made_inside, "casts": casts,
    "reductions": reductions, "infinite_rows": infinite_rows,
    "one_element_scans": one_element_scans, "sorting": sorting, "powers": powers, "remainders": remainders,
    "constant_numerators": constant_numerators, "zeros_and_folds": zeros_and_folds,
    "total_order": total_order, "chained_gathers": chained_gathers, "unit_dims": unit_dims,
}
# cases whose zeros' signs are checked too
SIGNED_ZEROS = {"remainders", "constant_numerators", "one_element_scans", "zeros_and_folds",
                "total_order", "chained_gathers", "unit_dims"}
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float64": np.float64}


def _args(name, dtype):
    if name == "powers":  # with the largest finite values: MAX's pow(3e38, 3e38) was 1
        big = float(ml_dtypes.finfo(dtype).max)
        return np.array(BASES + [big, -big], dtype), np.array(EXPONENTS + [big, -big], dtype)
    if name in ("total_order", "chained_gathers"):
        # +NaN only: XLA orders -NaN first, juju sees every NaN as +NaN
        return np.array(np.where(np.isnan(X), NAN, X), dtype), np.array(Y, dtype)
    return np.array(X, dtype), np.array(Y, dtype)


def _loop_args(dtype):
    return np.array(X, dtype), np.array([INF, 0.0], dtype)


def _x64(dtype):
    return jax.enable_x64(np.dtype(dtype) == np.float64)


PARAMS = [(case, d) for d in DTYPES for case in CASES] + [("stops_at_nan", d) for d in DTYPES]
JITTED = {p: juju.jit(CASES.get(p[0], stops_at_nan)) for p in PARAMS}


def _case_args(case, dtype_name):
    dtype = DTYPES[dtype_name]
    return _loop_args(dtype) if case == "stops_at_nan" else _args(case, dtype)


# float16 and bfloat16 compute through float32 (casts MAX does not fold): the
# full tier checks them. CI runs every case in float32, and in float64 the
# cases whose float64 kernels differ in accuracy (exp, pow): a cold MAX
# compile of all 18 cases in float64 costs CI about 15 minutes.
FULL_DTYPES = ("float16", "bfloat16")
CI_FLOAT64_CASES = ("issue_example", "math", "powers")


@pytest.fixture(scope="module", autouse=True)
def compiled(request):
    runs = selected(request, "case", "dtype_name")
    lowered = []
    for case, dtype_name in PARAMS:
        if (case, dtype_name) not in runs and (case, dtype_name) != ("stops_at_nan", "float32"):
            continue
        with _x64(DTYPES[dtype_name]):
            lowered.append(JITTED[case, dtype_name].lower(*_case_args(case, dtype_name)))
    juju.compile_all(lowered)


def _assert_same_nans(actual, expected):
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        a, e = np.asarray(juju.to_numpy(a)), np.asarray(e)
        if e.dtype.kind in "fV":
            a64, e64 = a.astype(np.float64), e.astype(np.float64)
            np.testing.assert_array_equal(np.isnan(a64), np.isnan(e64), "NaN positions")
            np.testing.assert_array_equal(np.isposinf(a64), np.isposinf(e64), "+inf positions")
            np.testing.assert_array_equal(np.isneginf(a64), np.isneginf(e64), "-inf positions")


F64_TOLERANCE = dict(rtol=1e-11, atol=1e-12)
# MAX's float64 pow near the ends of the exponent range: sqrt(1.8e308) is off
# by 1.4e-10 relative (exp of a large argument; docs/testing.md)
F64_POW_TOLERANCE = dict(rtol=1e-9, atol=1e-12)


def _param(case, dtype_name):
    marks = []
    if dtype_name in FULL_DTYPES or (dtype_name == "float64" and case not in CI_FLOAT64_CASES):
        marks.append(pytest.mark.full)
    return pytest.param(case, dtype_name, marks=marks, id=f"{case}-{dtype_name}")


@pytest.mark.parametrize("case,dtype_name", [_param(c, d) for c, d in PARAMS])
def test_matches_jax(case, dtype_name):
    fn = CASES.get(case, stops_at_nan)
    args = _case_args(case, dtype_name)
    with _x64(DTYPES[dtype_name]):
        expected = jax.jit(fn)(*args)
        actual = JITTED[case, dtype_name](*args)
    _assert_same_nans(actual, expected)
    # MAX's float64 exp is accurate to ~1e-12 relative (XLA's to an ulp):
    # looser than tests/util's float64 default, which checks values only
    tolerance = F64_TOLERANCE if dtype_name == "float64" else {}
    if case == "powers" and dtype_name == "float64":
        tolerance = F64_POW_TOLERANCE
    assert_same(actual, expected, **tolerance)
    if case in SIGNED_ZEROS:
        for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
            a64 = np.asarray(juju.to_numpy(a)).astype(np.float64)
            e64 = np.asarray(e).astype(np.float64)
            zeros = e64 == 0
            np.testing.assert_array_equal(np.signbit(a64[zeros]), np.signbit(e64[zeros]),
                                          "signs of zeros")


def test_the_loop_saw_the_nan():
    """The loop above stops after two steps because it sees the NaN."""
    args = _loop_args(np.float32)
    steps, v = JITTED["stops_at_nan", "float32"](*args)
    assert int(juju.to_numpy(steps)) == 2 and np.isnan(juju.to_numpy(v)).all()


def test_large_reductions_keep_xla_semantics():
    """max/min reductions of large arrays give NaN for a row with a NaN
    (juju's elementwise fold over a short last axis) and +0.0 for a max,
    -0.0 for a min where both zeros meet (MAX's reduction kernel over long
    rows and over axis 0), as jnp.max documents and jax.jit does for small
    arrays. XLA's CPU reductions of large arrays do neither (a [600, 8] row
    [nan, 1, inf, ...] gives inf; a [2400, 4] row [+0, -0, +0, -0] gives
    -0.0 for max: the later zero): the reference here is numpy for NaN and
    jax.jit of the small array for zeros. The fold's zero sign is MAX's pick
    (docs/testing.md), so it is not checked."""
    rows = np.tile(np.array(X, np.float32), 400).reshape(-1, 8)
    zeros = np.array([[0.0, -0.0, 0.0, -0.0], [0.0, 0.0, -0.0, -0.0], [-0.0, -0.0, 0.0, 0.0],
                      [-0.0, -0.0, -1.0, -0.0]], np.float32)

    def reductions(b, z):
        tall, long = jnp.tile(z, (600, 1)), jnp.tile(z, (1, 1024))
        return b.max(-1), b.min(-1), long.max(1), long.min(1), tall.max(0), tall.min(0)

    got = juju.jit(reductions)(rows, zeros)
    small = jax.jit(lambda z: (z.max(1), z.min(1), z.max(0), z.min(0)))(zeros)
    expected = (rows.max(-1), rows.min(-1), *small)
    assert_same(got, expected)
    for a, e in zip(got[2:], expected[2:]):
        np.testing.assert_array_equal(np.signbit(juju.to_numpy(a)), np.signbit(e))


def test_exp_near_overflow():
    """MAX's exp clamps float32 input at 88.376 (exp(inf) came back 2.406e38)
    and overflows float64 before 709.78; juju's rule shifts large inputs.
    Contiguous and strided reads (MAX took two code paths), exp2 and expm1."""
    x32 = np.tile(np.array([88.0, 88.3, 88.376, 88.4, 88.5, 88.7, 88.72, 88.8, 89.0,
                            np.inf, -np.inf, np.nan, -87.0, 1.0], np.float32), 48)
    x64 = np.tile(np.array([708.0, 709.0, 709.5, 709.78, 709.8, 710.0, np.inf, -745.0],
                           np.float64), 48)

    def fn(a, b):
        strided = a.reshape(-1, 14)[:, ::-1].reshape(-1)
        return (jnp.exp(a), jnp.exp(strided), jnp.exp2(a * 1.4427), jnp.expm1(a),
                jnp.exp(b), jnp.exp2(b * 1.4427))

    with jax.enable_x64(True):
        got = juju.jit(fn)(x32, x64)
        expected = jax.jit(fn)(x32, x64)
    assert_same(got[:4], expected[:4])
    # MAX's float64 exp is off by up to ~3e-10 relative near 700 (its error
    # grows with x: 3e-13 at 1, 4e-11 at 100; XLA's is within an ulp)
    assert_same(got[4:], expected[4:], rtol=1e-9)


def test_float64_constants_near_0_and_1_keep_their_values():
    """MAX 26.7 reads a float64 constant that rounds to 0 or 1 in float32
    as that 0 or 1 (x * 1e-300 was 0, x * (1 + 1e-10) was x): juju hides
    such constants behind a select on a runtime value (juju.context)."""
    def fn(x, n):
        def body(i, v):  # inside a MAX loop: the flag comes from outside
            return v * (1 + 1e-10) + 1e-300

        return (x * 1e-300, x + 1e-50, x * (1 + 1e-10), x / (1 + 1e-10),
                jnp.maximum(x, jnp.finfo(jnp.float64).tiny), jnp.full(3, 1e-300) * x[:3],
                x * jnp.array([1e-300, -0.0, 2e-300, 1e-310]), lax.fori_loop(0, n, body, x),
                lax.cond(n > 2, lambda v: v * 1e-300, lambda v: v - 1e-50, x))

    x = np.array([1.0, 3.0, 1e-60, 0.0])
    with jax.enable_x64(True):
        actual, expected = juju.jit(fn)(x, 3), jax.jit(fn)(x, 3)
    assert_same(actual, expected, rtol=0, atol=0)
    for a, e in zip(actual, expected):  # exact, signs of zeros included
        np.testing.assert_array_equal(np.signbit(juju.to_numpy(a)), np.signbit(e))
