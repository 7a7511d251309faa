"""juju.jit end to end: values against jax.jit, pytrees, statics, inputs,
outputs, and the compile cache. Every graph here is compiled in ONE MAX
compilation (module fixture), since MAX's cost is per compilation."""

from __future__ import annotations

from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from max.driver import Buffer

import juju
from tests.util import assert_same


def readme(x, y):
    v = x + y
    v = v * v
    return jnp.sin(v)


Point = namedtuple("Point", "x y")


def tree_fn(params, batch, *, scale):
    hidden = jnp.tanh(batch["x"] @ params["w"] + params["b"])
    return {"out": hidden * scale, "pair": (hidden.sum(), [batch["x"].shape[0] * 1.0]), "none": None}


def point_fn(p: Point):
    return Point(x=p.y * 2.0, y=p.x - 1.0)


def power(x, n):
    return x**n


def mixed(x, y):
    return x * y + 1


def chain(x, y):
    return jnp.tanh(x) * y + jnp.exp(-x * x)


def half_precision(x, y):
    return x * 2 + y.astype(jnp.bfloat16), (x + 1).astype(jnp.float32)


def choose(mask, x):
    return jnp.where(mask, x, -x)


readme_jit = juju.jit(readme)
choose_jit = juju.jit(choose)
half_jit = juju.jit(half_precision)
half_jnp_jit = juju.jit(half_precision, coerces_to_jnp=True)
XB = jnp.linspace(-3, 3, 5, dtype=jnp.bfloat16)
grad_jit = juju.jit(jax.grad(readme))
vmap_jit = juju.jit(jax.vmap(readme))
tree_jit = juju.jit(tree_fn, static_argnames="scale")
point_jit = juju.jit(point_fn)
power_jit = juju.jit(power, static_argnums=1)
mixed_jit = juju.jit(mixed, coerces_to_jnp=True)
chain_jit = juju.jit(chain)

rng = np.random.default_rng(0)
PARAMS = {"w": rng.normal(size=(4, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
BATCH = {"x": rng.normal(size=(5, 4)).astype(np.float32)}
X3 = rng.normal(size=3).astype(np.float32)
X4 = rng.normal(size=4).astype(np.float32)
M = rng.normal(size=(3, 4)).astype(np.float32)

# (jitted function, args, kwargs) compiled together up front.
CASES = [
    (readme_jit, (5, 10), {}),
    (grad_jit, (5.0, 10.0), {}),
    (vmap_jit, (jnp.arange(4.0), jnp.full(4, 0.5)), {}),
    (tree_jit, (PARAMS, BATCH), {"scale": 2.0}),
    (tree_jit, (PARAMS, BATCH), {"scale": 3.0}),
    (point_jit, (Point(X3, X3),), {}),
    (power_jit, (X3, 2), {}),
    (power_jit, (X3, 3), {}),
    (mixed_jit, (X3, 2.0), {}),
    (mixed_jit, (X4, np.float32(2.0)), {}),
    (mixed_jit, (np.arange(3, dtype=np.int32), 2), {}),
    (chain_jit, (M, M), {}),
    (choose_jit, (np.array([True, False, True]), X3), {}),
    (choose_jit, (False, 1.0), {}),
    (half_jit, (XB, X4[:1].repeat(5)), {}),
    (half_jnp_jit, (XB, X4[:1].repeat(5)), {}),
]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    lowered = [fn.lower(*args, **kwargs) for fn, args, kwargs in CASES]
    juju.compile_all(lowered)
    return lowered


def test_readme_example_matches_jax():
    out = readme_jit(5, 10)
    assert isinstance(out, Buffer)  # MAX buffers by default
    assert_same(out, jax.jit(readme)(5, 10))


def test_grad_and_vmap_variants_match_jax():
    assert_same(grad_jit(5.0, 10.0), jax.jit(jax.grad(readme))(5.0, 10.0))
    xs, ys = jnp.arange(4.0), jnp.full(4, 0.5)
    assert_same(vmap_jit(xs, ys), jax.jit(jax.vmap(readme))(xs, ys))


def test_pytrees_in_and_out_with_static_argname():
    for scale in (2.0, 3.0):
        out = tree_jit(PARAMS, BATCH, scale=scale)
        assert out["none"] is None
        assert_same(out, jax.jit(tree_fn, static_argnames="scale")(PARAMS, BATCH, scale=scale))


def test_namedtuple_in_and_out():
    out = point_jit(Point(X3, X3))
    assert isinstance(out, Point)
    assert_same(out, jax.jit(point_fn)(Point(X3, X3)))


def test_static_argnums_each_value_its_own_graph():
    assert_same(power_jit(X3, 2), X3**2)
    assert_same(power_jit(X3, 3), jax.jit(power, static_argnums=1)(X3, 3))
    assert power_jit.trace_count == 2


def test_coerces_to_jnp_returns_jax_arrays():
    out = mixed_jit(X3, 2.0)
    assert isinstance(out, jax.Array)
    assert_same(out, jax.jit(mixed)(X3, 2.0))
    ints = np.arange(3, dtype=np.int32)
    assert_same(mixed_jit(ints, 2), jax.jit(mixed)(ints, 2))


def test_coerced_outputs_of_every_size_and_dtype():
    # small outputs reach jax in one call of a jitted identity, large ones
    # through DLPack (juju.arguments.to_jax_all)
    def outputs(x):
        return (x[:3] * 2, x > 0, x[:5].astype(jnp.bfloat16), jnp.tile(x, 3000),
                x.astype(jnp.float64) / 3, jnp.arange(4, dtype=jnp.int64), x[0])

    x = rng.normal(size=8)
    with jax.enable_x64(True):
        got = juju.jit(outputs, coerces_to_jnp=True)(x)
        assert all(isinstance(o, jax.Array) for o in got)
        assert_same(got, jax.jit(outputs)(x))


def test_inputs_numpy_jax_scalars_and_buffers_share_one_compile():
    before = (chain_jit.trace_count, chain_jit.compile_count)
    expected = jax.jit(chain)(M, M)
    assert_same(chain_jit(M, M), expected)  # numpy
    assert_same(chain_jit(jnp.asarray(M), jnp.asarray(M)), expected)  # jax (DLPack)
    assert_same(chain_jit(Buffer.from_numpy(M.copy()), M), expected)  # MAX buffer
    assert_same(chain_jit(np.asfortranarray(M), M[:, :]), expected)  # non-contiguous
    read_only = np.asarray(jnp.asarray(M))  # read-only view of a jax array
    assert_same(chain_jit(read_only, M), expected)
    assert (chain_jit.trace_count, chain_jit.compile_count) == before


def test_bool_inputs_numpy_jax_and_python():
    mask = np.array([True, False, True])
    assert_same(choose_jit(mask, X3), jax.jit(choose)(mask, X3))
    assert_same(choose_jit(jnp.asarray(mask), X3), jax.jit(choose)(mask, X3))
    assert_same(choose_jit(False, 1.0), jax.jit(choose)(False, 1.0))
    assert_same(choose_jit(np.bool_(False), 1.0), jax.jit(choose)(False, 1.0))
    assert choose_jit.compile_count == 2


def test_bfloat16_inputs_and_outputs():
    y = X4[:1].repeat(5)
    expected = jax.jit(half_precision)(XB, y)
    assert_same(half_jit(XB, y), expected)  # MAX buffers (juju.to_numpy reads bf16)
    assert_same(half_jit(np.asarray(XB), y), expected)  # numpy ml_dtypes input
    out = half_jnp_jit(XB, y)
    assert out[0].dtype == jnp.bfloat16 and isinstance(out[0], jax.Array)
    assert_same(out, expected)


def test_outputs_feed_back_as_inputs():
    first = chain_jit(M, M)
    again = chain_jit(first, M)
    assert_same(again, jax.jit(chain)(jax.jit(chain)(M, M), M))


def test_jax_arrays_passed_again_reuse_their_buffers():
    """A jax array's MAX buffer is made once and reused while the array
    lives (juju.arguments): feeding coerced results back for several steps,
    and passing the same weights each call, give jax.jit's values; the
    buffers are forgotten with their arrays; a deleted array raises as in
    jax."""
    import gc

    from juju import arguments

    x, y = jnp.asarray(X3), jnp.asarray(X3 * 0.5)
    expected_x, expected_y = x, y
    for _ in range(4):  # results fed back: their buffers are the MAX results
        x = mixed_jit(x, y)
        expected_x = jax.jit(mixed)(expected_x, expected_y)
        assert isinstance(x, jax.Array)
        assert_same(x, expected_x)
        assert_same(mixed_jit(y, y), jax.jit(mixed)(y, y))  # y converted once

    before = len(arguments._buffers)
    for k in range(50):
        mixed_jit(jnp.full(3, float(k)), y)
    gc.collect()
    assert len(arguments._buffers) <= before + 2  # the 50 temporaries are gone

    doomed = jnp.asarray(X3 * 3)
    assert_same(mixed_jit(doomed, y), jax.jit(mixed)(X3 * 3, y))
    doomed.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        mixed_jit(doomed, y)


def test_results_do_not_share_memory_with_reused_inputs():
    """An output MAX returns in an input's memory is copied, also when the
    input's buffer is one juju keeps for a jax array or made as a result."""
    identity = juju.jit(lambda a, b: (a, b.reshape(-1), a * 1.0), coerces_to_jnp=True)
    a = jnp.asarray(M)
    first = identity(a, a)
    second = identity(first[0], first[2])
    for out in (*first, *second):
        np.testing.assert_array_equal(np.asarray(out).reshape(M.shape), M)
    host = juju.to_numpy(juju.jit(lambda a: a)(a))
    host[:] = 0  # a caller writing into a result must not change `a`
    np.testing.assert_array_equal(np.asarray(a), M)
    assert_same(identity(a, a), jax.jit(lambda a, b: (a, b.reshape(-1), a * 1.0))(M, M))


def test_cache_hit_does_not_retrace_and_new_signatures_recompile():
    calls = []

    def f(x):
        calls.append(1)
        return x * 2

    jf = juju.jit(f)
    lowered = [jf.lower(X3), jf.lower(X4), jf.lower(X3.astype(np.int32)), jf.lower(2.0),
               jf.lower(np.float32(2.0))]
    assert len(calls) == 5  # shape, dtype and weak type each make a new signature
    juju.compile_all(lowered)
    assert jf.compile_count == 5
    for args in ([X3], [X4], [X3.astype(np.int32)], [2.0], [np.float32(2.0)]):
        assert_same(jf(*args), jax.jit(lambda x: x * 2)(*args))
        assert_same(jf(*args), jax.jit(lambda x: x * 2)(*args))  # a hit
    assert len(calls) == 5  # calls never re-trace
    assert jf.trace_count == 5 and jf.compile_count == 5


def test_float64_input_is_canonicalised_like_jax():
    x64 = X3.astype(np.float64)
    out = chain_jit(x64.reshape(3, 1) * np.ones((1, 4)), M)
    assert_same(out, jax.jit(chain)(x64.reshape(3, 1) * np.ones((1, 4)), M))


@settings(max_examples=25, deadline=None)
@given(
    x=hnp.arrays(np.float32, (3, 4), elements=st.floats(-20, 20, width=32)),
    y=hnp.arrays(np.float32, (3, 4), elements=st.floats(-1e3, 1e3, width=32)),
)
def test_values_vary_one_compile(x, y):
    assert_same(chain_jit(x, y), jax.jit(chain)(x, y), rtol=1e-5, atol=1e-5)


def test_lower_as_text_and_compile():
    lowered = readme_jit.lower(5, 10)
    text = lowered.as_text()
    assert "mo.graph" in text and "rmo.add" in text and "sin" in text
    compiled = lowered.compile()
    assert_same(compiled(5, 10), jax.jit(readme)(5, 10))


def test_make_max_graph_returns_the_graph():
    graph = juju.make_max_graph(readme)(5, 10)
    text = str(graph)
    assert "rmo.add" in text and "rmo.mul" in text and "mo.cast" in text


def test_decorator_forms():
    @juju.jit
    def a(x):
        return x

    @juju.jit(static_argnums=(1,))
    def b(x, n):
        return x * n

    assert isinstance(a, juju.jit(lambda x: x).__class__)
    assert b.static_argnums == frozenset({1}) and "n" in b.static_argnames


def test_unhashable_static_argument_is_a_clear_error():
    with pytest.raises(TypeError, match="static arguments must be hashable"):
        power_jit.lower(X3, [2])


def test_non_array_argument_is_a_clear_error():
    with pytest.raises(TypeError, match="not an array"):
        chain_jit.lower("text", M)
