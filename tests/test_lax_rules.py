"""Core lax rules vs jax.jit, on hypothesis-generated shapes and values.

Hypothesis (derandomized, no database) draws the examples; every example of
every primitive then goes into ONE jitted function, so the whole file costs a
single MAX compilation. Each output is checked for shape, dtype and values.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from jax import lax

import juju
from tests.conformance.harnesses import to_input

EXAMPLES = 2  # per primitive
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))

F32, I32 = np.float32, np.int32

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=5)


def floats(lo=-10.0, hi=10.0):
    return st.floats(float(np.float32(lo)), float(np.float32(hi)), width=32, allow_nan=False,
                     allow_infinity=False)


def arrays(dtype, shape, elements=None):
    if elements is None:
        elements = {F32: floats(), I32: st.integers(-50, 50),
                    np.bool_: st.booleans()}[dtype]
    return hnp.arrays(dtype, shape, elements=elements)


# --- the cases: (name, function, args) ------------------------------------------

CASES: list[tuple[str, object, tuple]] = []


def collect(name, strategy, fun):
    """Draw EXAMPLES argument tuples from `strategy` for `fun`."""

    @SETTINGS
    @given(strategy)
    def draw(args):
        CASES.append((f"{name}[{len(CASES)}]", fun, tuple(args)))

    draw()


def same_shape(n, dtype, elements=None):
    return shapes.flatmap(lambda s: st.tuples(*[arrays(dtype, s, elements) for _ in range(n)]))


UNARY_F32 = {
    "neg": lax.neg, "abs": lax.abs, "sign": lax.sign, "exp": lax.exp, "sin": lax.sin,
    "cos": lax.cos, "tanh": lax.tanh, "logistic": lax.logistic, "floor": lax.floor,
    "ceil": lax.ceil, "expm1": lax.expm1,
    "round_even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
    "round_away": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
    "integer_pow3": lambda x: lax.integer_pow(x, 3),
    "integer_pow2": lambda x: lax.integer_pow(x, 2),
}
POSITIVE = {"sqrt": lax.sqrt, "rsqrt": lax.rsqrt, "log": lax.log, "log1p": lax.log1p}
BINARY = {
    "add": lax.add, "sub": lax.sub, "mul": lax.mul, "max": lax.max, "min": lax.min,
    "eq": lax.eq, "ne": lax.ne, "lt": lax.lt, "le": lax.le, "gt": lax.gt, "ge": lax.ge,
}
LOGICAL = {"and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor}

for name, fun in UNARY_F32.items():
    collect(name, same_shape(1, F32), fun)
collect("neg_i32", same_shape(1, I32), lax.neg)
collect("abs_i32", same_shape(1, I32), lax.abs)
collect("sign_i32", same_shape(1, I32), lax.sign)
collect("integer_pow_i32", same_shape(1, I32, st.integers(-9, 9)), lambda x: lax.integer_pow(x, 3))
collect("tan", same_shape(1, F32, floats(-1.2, 1.2)), lax.tan)
for name, fun in POSITIVE.items():
    collect(name, same_shape(1, F32, floats(0.01, 100.0)), fun)
for name, fun in BINARY.items():
    collect(name, same_shape(2, F32), fun)
    collect(name + "_i32", same_shape(2, I32), fun)
collect("div", same_shape(2, F32, floats(0.5, 10.0)), lax.div)
collect("div_i32", same_shape(2, I32, st.integers(1, 50)).map(lambda t: (t[0] - 25, t[1])), lax.div)
collect("pow", same_shape(2, F32, floats(0.1, 4.0)), lax.pow)
for name, fun in LOGICAL.items():
    collect(name, same_shape(2, np.bool_), fun)
collect("not", same_shape(1, np.bool_), lax.bitwise_not)
collect("select_n", shapes.flatmap(lambda s: st.tuples(
    arrays(np.bool_, s), arrays(F32, s), arrays(F32, s))), lax.select_n)
collect("select_n3", shapes.flatmap(lambda s: st.tuples(
    arrays(I32, s, st.integers(0, 2)), arrays(F32, s), arrays(F32, s), arrays(F32, s))),
    lax.select_n)
for target in (I32, np.bool_, np.uint8, np.float16):
    collect(f"convert_f32_to_{np.dtype(target).name}", same_shape(1, F32, floats(-300, 300)),
            lambda x, t=target: lax.convert_element_type(x, t))
collect("convert_i32_to_f32", same_shape(1, I32), lambda x: lax.convert_element_type(x, F32))
collect("convert_bool_to_i32", same_shape(1, np.bool_), lambda x: lax.convert_element_type(x, I32))


def with_shape(dims_strategy, dtype=F32):
    return dims_strategy.flatmap(lambda s: st.tuples(arrays(dtype, tuple(s))))


collect("broadcast_in_dim", with_shape(st.lists(st.integers(1, 4), min_size=1, max_size=2)),
        lambda x: lax.broadcast_in_dim(x, (2,) + x.shape + (3,), tuple(range(1, x.ndim + 1))))
collect("reshape", with_shape(st.lists(st.integers(1, 4), min_size=1, max_size=3)),
        lambda x: lax.reshape(x, (x.size,)))
collect("reshape_dims", with_shape(st.lists(st.integers(1, 4), min_size=2, max_size=2)),
        lambda x: lax.reshape(x, (x.size,), dimensions=(1, 0)))
collect("squeeze", with_shape(st.lists(st.integers(1, 4), min_size=1, max_size=2)
                              .map(lambda s: [1] + s)), lambda x: lax.squeeze(x, (0,)))
collect("expand_dims", with_shape(st.lists(st.integers(1, 4), min_size=1, max_size=2)),
        lambda x: lax.expand_dims(x, (0, x.ndim + 1)))
collect("transpose", with_shape(st.lists(st.integers(1, 4), min_size=3, max_size=3)),
        lambda x: lax.transpose(x, (2, 0, 1)))
collect("concatenate", st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)).flatmap(
    lambda t: st.tuples(arrays(F32, (t[0], 2)), arrays(F32, (t[1], 2)), arrays(F32, (t[2], 2)))),
    lambda *xs: lax.concatenate(xs, 0))
collect("slice", with_shape(st.lists(st.integers(3, 6), min_size=2, max_size=2)),
        lambda x: lax.slice(x, (1, 0), (x.shape[0], x.shape[1] - 1), (2, 1)))
for name, fun in {"reduce_sum": jnp.sum, "reduce_max": jnp.max, "reduce_min": jnp.min,
                  "reduce_prod": jnp.prod}.items():
    collect(name, with_shape(st.lists(st.integers(1, 4), min_size=1, max_size=3)),
            lambda x, f=fun: f(x, axis=0))
    collect(name + "_all_i32", with_shape(st.lists(st.integers(1, 3), min_size=1, max_size=2), I32),
            lambda x, f=fun: f(x))
collect("argmax", with_shape(st.lists(st.integers(1, 5), min_size=2, max_size=2)),
        lambda x: lax.argmax(x, 1, I32))
collect("argmin", with_shape(st.lists(st.integers(1, 5), min_size=2, max_size=2), I32),
        lambda x: lax.argmin(x, 0, I32))
collect("dot_general_matmul", st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
        .flatmap(lambda t: st.tuples(arrays(F32, (t[0], t[1])), arrays(F32, (t[1], t[2])))),
        lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ()))))
collect("dot_general_batch", st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
        .flatmap(lambda t: st.tuples(arrays(F32, (2, t[0], t[1])), arrays(F32, (t[1], 2, t[2])))),
        lambda a, b: lax.dot_general(a, b, (((2,), (0,)), ((0,), (1,)))))
collect("dot_general_i32", st.tuples(st.integers(1, 4), st.integers(1, 4)).flatmap(
    lambda t: st.tuples(arrays(I32, (t[0], t[1])), arrays(I32, (t[0], t[1])))),
    lambda a, b: lax.dot_general(a, b, (((0,), (0,)), ((), ()))))
collect("iota", with_shape(st.lists(st.integers(1, 4), min_size=2, max_size=2)),
        lambda x: x + lax.broadcasted_iota(F32, x.shape, 1))


# pad: edges of either sign and interior padding, in one draw per example
# (the padding config is static, so each example brings its own function).
pad_dims = st.tuples(st.integers(1, 4), st.integers(-3, 3), st.integers(-3, 3), st.integers(0, 2))


@settings(SETTINGS, max_examples=12)
@given(st.lists(pad_dims, min_size=1, max_size=3)
       .filter(lambda dims: all(lo + hi + n + (n - 1) * interior >= 0
                                for n, lo, hi, interior in dims)),
       st.sampled_from([F32, I32, np.bool_]), st.data())
def _draw_pads(dims, dtype, data):
    config = tuple((lo, hi, interior) for _, lo, hi, interior in dims)
    x = data.draw(arrays(dtype, tuple(n for n, *_ in dims)))
    fill = data.draw(arrays(dtype, ()))  # a traced padding value
    CASES.append((f"pad_{np.dtype(dtype).name}[{len(CASES)}]",
                  lambda x, fill, c=config: lax.pad(x, fill, c), (x, fill)))


_draw_pads()

# --- one graph for all of them ---------------------------------------------------


def _all_cases(*flat):
    outs, i = [], 0
    for _, fun, args in CASES:
        outs.append(fun(*flat[i:i + len(args)]))
        i += len(args)
    return outs


@pytest.fixture(scope="module")
def outputs():
    flat = [a for _, _, args in CASES for a in args]
    expected = jax.jit(_all_cases)(*flat)
    got = juju.jit(_all_cases)(*[to_input(a) for a in flat])
    return expected, got


def test_cases_cover_the_foundation_primitives():
    names = {name.split("[")[0].split("_i32")[0] for name, _, _ in CASES}
    assert len(CASES) >= 100 and len(names) >= 50


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_rule_matches_jax(outputs, index):
    expected, got = outputs
    e = np.asarray(expected[index])
    g = got[index].to_numpy()
    assert g.shape == e.shape
    assert g.dtype == e.dtype
    if e.dtype.kind in "biu":
        np.testing.assert_array_equal(g, e)
    else:
        rtol = 1e-3 if e.dtype == np.float16 else 2e-5
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                   atol=1e-5 * max(1.0, float(np.max(np.abs(e), initial=0.0))),
                                   equal_nan=True)
