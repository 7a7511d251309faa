"""Host callbacks (juju/host.py) vs jax.jit: `jax.pure_callback`,
`io_callback`, `jax.debug.print` and `jax.debug.callback`, at the top level,
inside while/fori/scan/cond/switch bodies, nested jit, custom_jvp and under
vmap and grad. Each case records what its callbacks saw, in order; juju must
return the same values and make the same calls in the same order as jax.jit.
All cases' MAX segments compile in one compilation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback

import juju
from tests.util import assert_same

CALLS: list = []  # (tag, value) of every callback, in the order they ran


def record(tag):
    def callback(*values):
        CALLS.append((tag, *[np.array(v) for v in values]))

    return callback


def host_sin(x):
    CALLS.append(("sin", np.array(x)))
    return np.sin(x).astype(x.dtype)


def like(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def top_level(x):
    jax.debug.print("x = {x}, sum = {s}", x=x, s=x.sum())
    y = jax.pure_callback(host_sin, like(x), x * 2)
    z = io_callback(lambda a: (CALLS.append(("io", np.array(a))), a * 2)[1], like(x), y + 1,
                    ordered=True)
    jax.debug.callback(record("dbg"), z)
    return z * 3, x  # an argument returned as is must not share its memory


def in_fori_loop(x):
    def body(i, carry):
        jax.debug.callback(record("step"), i, carry)
        return carry * 0.5 + jax.pure_callback(host_sin, like(carry), carry)

    return lax.fori_loop(0, 4, body, x)


def in_while_loop(x):
    def cond(c):
        return c[0] < 3

    def body(c):
        i, v = c
        io_callback(record("while"), None, i, v, ordered=True)
        return i + 1, jnp.tanh(v) + 1.0

    return lax.while_loop(cond, body, (0, x))


def in_scan(x):
    def step(carry, row):
        jax.debug.print("row {r}", r=row)
        out = jax.pure_callback(host_sin, like(row), row + carry)
        return carry + out.sum(), out * 2

    return lax.scan(step, jnp.float32(0), x.reshape(2, -1), reverse=True)


def in_cond(x):
    def loud(v):
        jax.debug.callback(record("loud"), v)
        return jax.pure_callback(host_sin, like(v), v)

    first = lax.cond(x.sum() > 0, loud, lambda v: v * 2, x)
    second = lax.switch(2, [lambda v: v, loud, lambda v: -v], x)  # index clamped to 2
    return first, second


def in_nested_jit(x):
    @jax.jit
    def inner(v):
        jax.debug.print("inner {v}", v=v)
        return jnp.exp(v)

    return inner(x) + 1


def in_custom_jvp(x):
    @jax.custom_jvp
    def f(v):
        return jax.pure_callback(host_sin, like(v), v)

    f.defjvp(lambda p, t: (f(p[0]), jnp.cos(p[0]) * t[0]))
    return jax.grad(lambda v: f(v).sum())(x), f(x)


def under_vmap(x):
    def per_row(row):
        jax.debug.print("row {r}", r=row)
        seq = jax.pure_callback(host_sin, like(row), row, vmap_method="sequential")
        dims = jax.pure_callback(host_sin, like(row), row * 3, vmap_method="expand_dims")
        return seq + dims

    return jax.vmap(per_row)(x.reshape(2, -1))


def under_grad(x):
    def loss(v):
        jax.debug.print("loss input {v}", v=v)
        return jnp.sum(jnp.sin(v) ** 2)

    return jax.grad(loss)(x)


CASES = {f.__name__: f for f in (top_level, in_fori_loop, in_while_loop, in_scan, in_cond,
                                  in_nested_jit, in_custom_jvp, under_vmap, under_grad)}
X = np.linspace(-1.0, 1.5, 6, dtype=np.float32)


def boom(v):
    raise ValueError("bad value from the host")


def raises_on_host(x):
    return jax.pure_callback(boom, like(x), x) + 1


def wrong_dtype(x):
    return jax.pure_callback(lambda v: np.asarray(v, np.int32), like(x), x) * 2


def _calls_and_output(run, capsys):
    CALLS.clear()
    capsys.readouterr()
    out = run()
    jax.effects_barrier()
    return out, list(CALLS), capsys.readouterr().out


@pytest.fixture(scope="module")
def compiled():
    every = {**CASES, "raises_on_host": raises_on_host, "wrong_dtype": wrong_dtype}
    functions = {name: juju.jit(f, tiered=False) for name, f in every.items()}
    juju.compile_all([fn.lower(X) for fn in functions.values()])
    return functions


@pytest.mark.parametrize("name", list(CASES))
def test_callbacks_match_jax(compiled, name, capsys):
    want, want_calls, want_text = _calls_and_output(lambda: jax.jit(CASES[name])(X), capsys)
    got, got_calls, got_text = _calls_and_output(lambda: compiled[name](X), capsys)
    jax.tree.map(assert_same, got, want)
    assert sorted(got_text.splitlines()) == sorted(want_text.splitlines())
    # Ordered callbacks (io_callback(ordered=True)) in the same order;
    # unordered ones (pure, debug) may run in any order in XLA too: the same
    # calls, in any order.
    ordered = ("io", "while")
    _assert_same_calls([c for c in got_calls if c[0] in ordered],
                       [c for c in want_calls if c[0] in ordered])
    _assert_same_calls(sorted(got_calls, key=_call_key), sorted(want_calls, key=_call_key))


def _call_key(call):
    return call[0], [(v.shape, np.round(v.astype(np.float64), 3).tobytes()) for v in call[1:]]


def _assert_same_calls(got, want):
    assert [c[0] for c in got] == [c[0] for c in want]
    for g, w in zip(got, want):
        _assert_same_values(g[1:], w[1:])


def _assert_same_values(got, want):
    for gv, wv in zip(got, want, strict=True):
        np.testing.assert_allclose(gv, wv, rtol=1e-6, atol=1e-6)
        assert gv.dtype == wv.dtype and gv.shape == wv.shape


def test_an_argument_returned_is_a_copy(compiled):
    x = X.copy()
    _, same = compiled["top_level"](x)
    x[0] = 99.0
    assert juju.to_numpy(same)[0] == X[0]


def test_a_callback_that_raises_reaches_the_caller(compiled):
    with pytest.raises(ValueError, match="bad value from the host"):
        compiled["raises_on_host"](X)


def test_a_result_of_the_wrong_dtype_is_a_runtime_error_as_in_jax(compiled):
    with pytest.raises(RuntimeError, match="Incorrect output dtype for return value #0"):
        jax.jit(wrong_dtype)(X)
    with pytest.raises(RuntimeError, match="Incorrect output dtype for return value #0"):
        compiled["wrong_dtype"](X)


def test_staged_programs_lower_to_one_graph_per_segment(compiled):
    lowered = compiled["top_level"].lower(X)
    # [x.sum(), x*2] before the print and pure_callback, [y+1] before the
    # io_callback, [z*3] after the debug callback
    assert len(lowered.graph) == 3
    assert "segment" in lowered.as_text()
