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
from jax.interpreters import mlir
import jax.extend
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


def in_custom_vjp(x):
    @jax.custom_vjp
    def f(v):
        return jax.pure_callback(host_sin, like(v), v)

    def f_bwd(v, g):
        jax.debug.callback(record("bwd"), g)
        return (jnp.cos(v) * g,)

    f.defvjp(lambda v: (f(v), v), f_bwd)
    return jax.grad(lambda v: f(v).sum())(x), f(x)


def in_custom_linear_solve(x):
    a = jnp.diag(jnp.arange(1.0, 7.0)) + 0.1

    def solve(matvec, b):
        jax.debug.callback(record("solve"), b)
        return jnp.linalg.solve(a, b)

    return lax.custom_linear_solve(lambda v: a @ v, x, solve)


def in_linear_call(x):
    def callee(scale, v):
        jax.debug.callback(record("callee"), v)
        return v * scale

    return jax.custom_derivatives.linear_call(callee, lambda s, t: t * s, 2.0, x)


def in_checkpoint(x):
    @jax.checkpoint
    def f(v):
        jax.debug.callback(record("remat"), v)
        return jnp.sin(v) * 2

    return jax.grad(lambda v: f(v).sum())(x)


def _guarded_loop(threshold):
    """A callback behind a rarely taken branch in each step, in a nested
    jit (as equinox's checks are): the loop runs whole in MAX."""

    def fn(x):
        @jax.jit
        def step(i, carry):
            return lax.cond(carry.sum() > threshold,
                            lambda c: jax.pure_callback(host_sin, like(c), c) + i,
                            lambda c: c * 1.5, carry)

        return lax.fori_loop(0, 8, step, x)

    return fn


cond_in_loop = _guarded_loop(50.0)  # X sums to 1.5: 1.5 * 1.5**8 < 50, never taken
cond_in_loop_taken = _guarded_loop(4.0)  # taken from the 3rd step on: replayed


def host_one(v):
    CALLS.append(("one", np.array(v)))
    return np.ones((), np.float32)


def loop_after_guarded_taken(x):
    """A later loop reads a guarded branch's result: when the branch fires, its
    MAX run must still end (the loop stops on the fired flag), then replays."""
    step = lax.cond(x.sum() > 1.0,
                    lambda v: jax.pure_callback(host_one, jax.ShapeDtypeStruct((), v.dtype),
                                                v.sum()),
                    lambda v: jnp.ones((), v.dtype), x)
    return lax.while_loop(lambda c: c[0] < 10.0, lambda c: (c[0] + step, c[1] * 0.5),
                          (jnp.float32(0), x))


def under_vmap_methods(x):
    def per_row(row, scale):
        outs = [jax.pure_callback(host_sin, like(row), row * scale * k, vmap_method=m)
                for k, m in enumerate(("sequential", "sequential_unrolled", "expand_dims",
                                       "broadcast_all"), 1)]
        return sum(outs)

    return jax.vmap(per_row, in_axes=(0, None))(x.reshape(2, -1), 0.5)


def vmap_of_cond(x):  # a batched predicate: both branches run, as in jax
    def per_row(row):
        return lax.cond(row.sum() > 0,
                        lambda v: jax.pure_callback(host_sin, like(v), v,
                                                    vmap_method="sequential"),
                        lambda v: v * 2, row)

    return jax.vmap(per_row)(x.reshape(3, -1))


# A library primitive whose XLA lowering is its JAX implementation, holding a
# callback that only that implementation shows (as lineax's linear_solve does).
checked_double_p = jax.extend.core.Primitive("test_checked_double")
checked_double_p.def_abstract_eval(lambda x: x)
mlir.register_lowering(checked_double_p, mlir.lower_fun(
    lambda x: jax.pure_callback(host_sin, like(x), x) * 2, multiple_results=False))


def in_library_primitive(x):
    return checked_double_p.bind(x + 1)


# A library's call-like primitive whose XLA lowering emits its body itself
# (not a traced JAX implementation): juju evaluates the one sub-jaxpr that
# takes its operands and gives its results.
library_call_p = jax.extend.core.Primitive("test_library_call")
library_call_p.multiple_results = True
library_call_p.def_abstract_eval(lambda *avals, body: body.out_avals)
_library_call_rule = mlir.lower_fun(
    lambda *args, body: jax.core.eval_jaxpr(body.jaxpr, body.consts, *args),
    multiple_results=True)
mlir.register_lowering(library_call_p, lambda ctx, *args, body: _library_call_rule(
    ctx, *args, body=body))


def in_call_like_primitive(x):
    def inner(v):
        jax.debug.callback(record("library_call"), v)
        return [jax.pure_callback(host_sin, like(v), v) * 2]

    body = jax.make_jaxpr(inner)(x)
    return library_call_p.bind(x + 1, body=body)[0]


CASES = {f.__name__: f for f in (top_level, in_fori_loop, in_while_loop, in_scan, in_cond,
                                  in_nested_jit, in_custom_jvp, under_vmap, under_grad,
                                  in_custom_vjp, in_custom_linear_solve, in_linear_call,
                                  in_checkpoint, under_vmap_methods, vmap_of_cond,
                                  in_library_primitive, in_call_like_primitive)}
CASES["cond_in_loop"] = cond_in_loop
CASES["cond_in_loop_taken"] = cond_in_loop_taken
CASES["loop_after_guarded_taken"] = loop_after_guarded_taken
X = np.linspace(-1.0, 1.5, 6, dtype=np.float32)


def boom(v):
    raise ValueError("bad value from the host")


def raises_on_host(x):
    return jax.pure_callback(boom, like(x), x) + 1


def check_small(v):
    if v.sum() > 10:
        raise ValueError("sum above 10")
    return v


def guard_raises_when_large(x):  # fires above 0 (replayed), raises above 10
    return lax.cond(x.sum() > 0, lambda v: jax.pure_callback(check_small, like(v), v),
                    lambda v: v, x) * 2


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
    every = {**CASES, "raises_on_host": raises_on_host, "wrong_dtype": wrong_dtype,
             "guard_raises_when_large": guard_raises_when_large}
    try:
        import equinox  # noqa: F401
        every["eqx_checked"] = eqx_checked
    except ImportError:
        pass
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


def test_a_callback_that_raises_is_a_runtime_error_as_in_jax(compiled):
    # jax.jit's first call (its Python dispatch) raises JaxRuntimeError;
    # juju always does, with the callback's own error as the cause.
    with pytest.raises(jax.errors.JaxRuntimeError, match="bad value from the host"):
        jax.jit(raises_on_host)(X)
    with pytest.raises(jax.errors.JaxRuntimeError, match="bad value from the host") as got:
        compiled["raises_on_host"](X)
    assert isinstance(got.value.__cause__, ValueError)


def test_a_replayed_guard_raises_one_error_type(compiled):
    # After a replay that passed, jax.jit's C++ dispatch raises the callback's
    # failure as ValueError; juju raises JaxRuntimeError every time.
    fn = compiled["guard_raises_when_large"]
    assert_same(fn(X), jax.jit(guard_raises_when_large)(X))  # fired, replayed, no error
    for _ in range(2):
        with pytest.raises(jax.errors.JaxRuntimeError, match="sum above 10"):
            fn(X * 10)


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


def test_guarded_callbacks_in_a_loop_run_whole_in_max(compiled):
    # The loop and its cond are one MAX graph with the fired flag: no step
    # runs on the host while the branch is not taken.
    lowered = compiled["cond_in_loop"].lower(X)
    assert [type(step).__name__ for step in lowered.plan.steps] == ["Segment"]
    assert lowered.plan.steps[0].speculative


def eqx_checked(x):
    import equinox as eqx

    x = eqx.error_if(x, x.sum() > 100.0, "sum too large")
    return lax.fori_loop(0, 4, lambda i, c: eqx.error_if(
        c * 1.5, ~jnp.isfinite(c).all(), "not finite"), x)


def test_equinox_checks_raise_as_under_jax_jit(compiled):
    pytest.importorskip("equinox")
    fn = compiled["eqx_checked"]
    assert_same(fn(X), jax.jit(eqx_checked)(X))
    bad = X * 100
    with pytest.raises(Exception) as want:
        jax.jit(eqx_checked)(bad)
    with pytest.raises(Exception) as got:  # jax's runtime error (the replay is jax.jit)
        fn(bad)
    assert "sum too large" in str(want.value) and "sum too large" in str(got.value)
