"""The `juju.jit` API as jax's: a `juju.jit` of a `juju.jit` function honours
the outer options (issue 19), arguments are validated as `jax.jit` validates
them, and a `Compiled` object checks the types it is called with (issue 15).

Every graph here is compiled in ONE MAX compilation (module fixture).
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import juju
import numpy as np
import pytest
from jax import lax
from max.driver import Buffer

from tests.util import assert_same

rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- juju.jit of a juju.jit function (issue 19) --------------------------------


def readme(x, y):
    return jnp.sin((x + y) ** 2)


def power(x, n):
    return x**n


def ramp(x, n):
    return x * jnp.arange(n, dtype=x.dtype)  # needs n static


def scaled(x, *, k):
    return jnp.tanh(x) * k


readme_jit = juju.jit(readme)
coerced_outer = juju.jit(readme_jit, coerces_to_jnp=True)
coerced_inner = juju.jit(juju.jit(readme, coerces_to_jnp=True))  # outer: MAX buffers
power_outer_static = juju.jit(juju.jit(power), static_argnums=1)
ramp_both_static = juju.jit(juju.jit(ramp, static_argnums=1), static_argnums=1)
scaled_names = juju.jit(juju.jit(scaled, static_argnames="k"), static_argnames="k",
                        coerces_to_jnp=True)
polymorphic_outer = juju.jit(readme_jit, polymorphic_shapes=("b", "b"))
over_jax_jit = juju.jit(jax.jit(readme), coerces_to_jnp=True)


class Scaler:
    """A method jitted twice, `self` static at both levels (hashable)."""

    def __init__(self, k):
        self.k = k

    def __hash__(self):
        return hash(self.k)

    def __eq__(self, other):
        return isinstance(other, Scaler) and other.k == self.k

    @juju.jit(static_argnums=0, coerces_to_jnp=True)
    @juju.jit(static_argnums=0)
    def apply(self, x):
        return jnp.tanh(x) * self.k

    @juju.jit(static_argnums=0)
    @juju.jit(static_argnums=0, coerces_to_jnp=True)
    def apply_buffers(self, x):  # the outer options rule: MAX buffers out
        return jnp.tanh(x) * self.k


# The README's decorator examples, stacked.
def loss_fn(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w"] + params["b"]) - y) ** 2)


@juju.jit(coerces_to_jnp=True)
@juju.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


per_example = juju.jit(juju.jit(jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))),
                       coerces_to_jnp=True)


@juju.jit(coerces_to_jnp=True)
@juju.jit
def rnn(w, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros(w.shape[0]), xs)


@juju.jit(coerces_to_jnp=True)
@juju.jit
def newton_sqrt(a):
    return lax.while_loop(lambda x: jnp.max(jnp.abs(x * x - a)) > 1e-6,
                          lambda x: 0.5 * (x + a / x), jnp.ones_like(a))


@juju.jit(coerces_to_jnp=True)
@juju.jit
def act(i, x):
    return lax.switch(i, [jnp.tanh, jax.nn.relu, jax.nn.gelu], x)


# --- no result shares memory with an argument (issue 15) -----------------------

ALIASING = {  # outputs MAX hands back in the input's memory
    "identity": lambda x: x,
    "times_one": lambda x: x * 1.0,
    "plus_zero": lambda x: x + 0,
    "reshape": lambda x: x.reshape(2, 2),
    "slice": lambda x: x[1:],
    "tree": lambda x: {"a": x, "b": (x.reshape(4, 1), x * 2)},
}
aliasing_jit = {name: juju.jit(fn) for name, fn in ALIASING.items()}
identity_jnp = juju.jit(lambda x: x, coerces_to_jnp=True)
identity_symbolic = juju.jit(lambda x: x * 1.0, polymorphic_shapes=("n",))
BIG = jnp.arange(1 << 15, dtype=jnp.float32)  # over 64 KiB: passed by DLPack, zero-copy
ARANGE4 = np.arange(4, dtype=np.float32)

X3, Y3, X5 = f32(3), f32(3), f32(5)
PARAMS = {"w": f32(4, 2), "b": f32(2)}
XB, YB = f32(6, 4), f32(6, 2)
W, XS = f32(3, 3) * 0.5, f32(4, 3)
POSITIVE = np.abs(f32(4)) + 0.5

# (jitted function, args, kwargs) compiled together up front.
CASES = [
    (coerced_outer, (X3, 1.0), {}),
    (coerced_inner, (X3, 1.0), {}),
    (power_outer_static, (X3, 3), {}),
    (ramp_both_static, (X3, 3), {}),
    (scaled_names, (X3,), {"k": 2.0}),
    (over_jax_jit, (X3, Y3), {}),
    (Scaler.apply, (Scaler(2.0), X3), {}),
    (Scaler.apply_buffers, (Scaler(2.0), X3), {}),
    (train_step, (PARAMS, XB, YB), {}),
    (per_example, (PARAMS, XB, YB), {}),
    (rnn, (W, XS), {}),
    (newton_sqrt, (POSITIVE,), {}),
    (act, (1, X3), {}),
    (readme_jit, (X3, 1.0), {}),  # the Compiled object below
    *[(fn, (ARANGE4,), {}) for fn in aliasing_jit.values()],
    (identity_jnp, (ARANGE4,), {}),
]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    lowered = [fn.lower(*args, **kwargs) for fn, args, kwargs in CASES]
    # polymorphic_shapes: one symbolic graph for every b
    lowered.append(polymorphic_outer.lower(
        *jax.export.symbolic_args_specs((X3, Y3), ("b", "b"))))
    lowered.append(aliasing_jit["identity"].lower(BIG))
    # sort_sum's graphs: its threads' first calls then load them from the cache
    lowered += [juju.jit(sort_sum).lower(x) for x in THREAD_INPUTS]
    lowered.append(identity_symbolic.lower(*jax.export.symbolic_args_specs((ARANGE4,), ("n",))))
    return dict(zip([id(fn) for fn, _, _ in CASES], juju.compile_all(lowered)))


def test_outer_coerces_to_jnp_over_an_inner_juju_jit():
    a = juju.jit(readme, coerces_to_jnp=True)
    out = coerced_outer(X3, 1.0)
    assert isinstance(out, jax.Array)
    assert_same(out, jax.jit(jax.jit(readme))(X3, 1.0))
    assert a.coerces_to_jnp and coerced_outer.executables is not readme_jit.executables
    inner_only = coerced_inner(X3, 1.0)  # the outer's default wins, as jax's outer options
    assert isinstance(inner_only, Buffer)
    assert_same(inner_only, jax.jit(readme)(X3, 1.0))


def test_outer_statics_over_an_inner_juju_jit():
    assert power_outer_static.static_argnums == frozenset({1})
    assert_same(power_outer_static(X3, 3), jax.jit(jax.jit(power), static_argnums=1)(X3, 3))
    assert_same(ramp_both_static(X3, 3),
                jax.jit(jax.jit(ramp, static_argnums=1), static_argnums=1)(X3, 3))
    out = scaled_names(X3, k=2.0)
    assert isinstance(out, jax.Array)
    assert_same(out, jax.jit(jax.jit(scaled, static_argnames="k"), static_argnames="k")(X3, k=2.0))


def test_inner_statics_alone_fail_as_in_jax():
    # jax.jit(jax.jit(ramp, static_argnums=1)) passes a tracer as the static n
    with pytest.raises(ValueError):
        jax.jit(jax.jit(ramp, static_argnums=1))(X3, 3)
    with pytest.raises(TypeError, match="static arguments must be hashable"):
        juju.jit(juju.jit(ramp, static_argnums=1)).lower(X3, 3)


def test_outer_polymorphic_shapes_over_an_inner_juju_jit():
    for n in (3, 5):
        x, y = f32(n), f32(n)
        assert_same(polymorphic_outer(x, y), jax.jit(readme)(x, y))
    assert polymorphic_outer.compile_count == 1


def test_outer_engine_over_an_inner_juju_jit():
    class Probe(juju.Engine):
        """The CPU, but loading a model with it raises: proves which engine
        compiles and loads (a worker compiles for it, then it loads)."""

        @property
        def description(self):
            return "probe"  # never a persistent-cache hit

        def load_mef(self, path):
            raise LookupError(f"probe loaded {path}")

    probe = Probe()
    outer = juju.jit(readme_jit, engine=probe)
    assert outer.engine is probe and readme_jit.engine == juju.cpu_engine()
    with pytest.raises(LookupError, match="probe loaded"):
        outer(X3, 2.0)
    # the inner function's engine is not used: its call is inlined in the outer graph
    inner_probe = juju.jit(readme, engine=probe)
    assert juju.jit(inner_probe).engine == juju.cpu_engine()


def test_juju_jit_over_jax_jit():
    out = over_jax_jit(X3, Y3)
    assert isinstance(out, jax.Array)
    assert_same(out, jax.jit(readme)(X3, Y3))


def test_stacked_methods_through_get():
    s = Scaler(2.0)

    def expected(x):
        return jnp.tanh(x) * 2.0

    out = s.apply(X3)
    assert isinstance(out, jax.Array)
    assert_same(out, jax.jit(expected)(X3))
    out = s.apply_buffers(X3)
    assert isinstance(out, Buffer)
    assert_same(out, jax.jit(expected)(X3))
    assert Scaler.apply.trace_count == 1  # the compiled signature was hit


def test_readme_decorator_examples_stacked():
    jax_step = jax.jit(jax.jit(train_step.__wrapped__.__wrapped__))
    new_params, loss = train_step(PARAMS, XB, YB)
    assert isinstance(loss, jax.Array)
    assert_same((new_params, loss), jax_step(PARAMS, XB, YB), rtol=1e-5, atol=1e-6)
    assert_same(per_example(PARAMS, XB, YB),
                jax.jit(jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0)))(PARAMS, XB, YB),
                rtol=1e-5, atol=1e-6)
    assert_same(rnn(W, XS), jax.jit(rnn.__wrapped__.__wrapped__)(W, XS))
    assert_same(newton_sqrt(POSITIVE), jax.jit(newton_sqrt.__wrapped__.__wrapped__)(POSITIVE))
    assert_same(act(1, X3), jax.jit(act.__wrapped__.__wrapped__)(1, X3))
    assert train_step.__name__ == "train_step" and train_step.__doc__ is None


def test_user_attributes_are_kept_through_stacking():
    def f(x):
        return x

    f.tag = "mine"
    stacked = juju.jit(juju.jit(f), coerces_to_jnp=True)
    assert stacked.tag == "mine" and stacked.__name__ == "f"
    assert stacked.coerces_to_jnp and stacked.trace_count == 0


# --- validation as jax.jit's (issue 15) -------------------------------------------


@pytest.mark.parametrize("options", [
    {"static_argnums": 3}, {"static_argnums": -2}, {"static_argnames": "y"},
    {"static_argnums": (0, 1)},
])
def test_static_arguments_the_function_lacks_raise_as_jax(options):
    def one(x):
        return x

    with pytest.raises(ValueError) as expected:
        jax.jit(one, **options)
    with pytest.raises(ValueError) as got:
        juju.jit(one, **options)
    assert str(got.value) == str(expected.value)


def test_static_arguments_that_jax_accepts_are_accepted():
    def varargs(x, *rest, **named):
        return x

    def positional_only(x, /, y):
        return x

    juju.jit(varargs, static_argnums=5, static_argnames="anything")
    juju.jit(positional_only, static_argnums=0, static_argnames="y")
    with pytest.raises(ValueError, match="positional-only"):
        jax.jit(positional_only, static_argnames="x")
    with pytest.raises(ValueError, match="positional-only"):
        juju.jit(positional_only, static_argnames="x")


def test_engine_must_be_an_engine():
    with pytest.raises(TypeError, match=r"engine must be a juju.Engine.*gpu_engine\(\)"):
        juju.jit(readme, engine=juju.gpu_engine)
    with pytest.raises(TypeError, match="engine must be a juju.Engine.*got str 'gpu'"):
        juju.jit(readme, engine="gpu")
    with pytest.raises(TypeError, match="engine must be a juju.Engine"):
        juju.make_max_graph(readme, engine=juju.cpu_engine)


def test_compiled_checks_the_argument_types(compiled):
    fn = compiled[id(readme_jit)]
    assert_same(fn(X3, 1.0), jax.jit(readme)(X3, 1.0))
    assert_same(fn(X3, np.float32(1.0)), jax.jit(readme)(X3, 1.0))  # weak types aside
    count = readme_jit.compile_count
    with pytest.raises(TypeError, match=r"Argument 'x' compiled with float32\[3\] and called "
                                        r"with float32\[5\]"):
        fn(X5, 1.0)
    with pytest.raises(TypeError, match=r"Argument 'y' compiled with float32\[\] and called "
                                        r"with int32\[\]"):
        fn(X3, 1)
    with pytest.raises(TypeError, match="pytree structure"):
        fn((X3,), 1.0)
    with pytest.raises(TypeError, match="pytree structure"):
        fn(X3)
    assert readme_jit.compile_count == count  # never a silent recompile
    jax_compiled = jax.jit(readme).lower(X3, 1.0).compile()
    with pytest.raises(TypeError):
        jax_compiled(X5, 1.0)


def test_compiled_takes_the_non_static_arguments_as_jax(compiled):
    fn = compiled[id(power_outer_static)]
    assert_same(fn(X3), jax.jit(power, static_argnums=1)(X3, 3))
    with pytest.raises(TypeError, match="non-static arguments only"):
        fn(X3, 3)
    scaled_fn = compiled[id(scaled_names)]
    assert_same(scaled_fn(X3), jnp.tanh(X3) * 2.0)


# --- outputs never alias inputs (issue 15) ------------------------------------------


@pytest.mark.parametrize("name", list(ALIASING))
def test_writing_into_the_argument_leaves_the_result_alone(name):
    a = np.arange(4, dtype=np.float32)
    expected = jax.jit(ALIASING[name])(a)
    out = aliasing_jit[name](a)
    a[:] = 99  # the caller reuses its array
    assert_same(out, expected)
    out = aliasing_jit[name](a)
    for leaf in jax.tree.leaves(out):
        juju.to_numpy(leaf)[...] = -1  # writing into a result leaves the argument alone
    assert (a == 99).all()


def test_coerced_results_do_not_alias_numpy_arguments():
    a = np.arange(4, dtype=np.float32)
    out = identity_jnp(a)
    a[0] = 99
    assert isinstance(out, jax.Array)
    assert_same(out, np.arange(4, dtype=np.float32))


def test_results_do_not_alias_a_jax_array_argument():
    before = np.array(BIG)
    out = aliasing_jit["identity"](BIG)
    juju.to_numpy(out)[:] = -1
    np.testing.assert_array_equal(np.asarray(BIG), before)


def test_results_of_a_symbolic_graph_do_not_alias():
    for n in (4, 6):
        a = np.arange(n, dtype=np.float32)
        out = identity_symbolic(a)
        a[:] = 99
        assert_same(out, np.arange(n, dtype=np.float32))
    assert identity_symbolic.compile_count == 1


# --- concurrent first calls (issue 15) ----------------------------------------------


def sort_sum(x):
    return jnp.sort(x * 3 - 1) + x.sum()


THREAD_INPUTS = [f32(5), f32(7), f32(3, 4)]


def run_in_threads(work, n):
    """Run work(i) in n threads started at once; re-raise the first failure."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def target(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_concurrent_first_calls_trace_and_compile_once_per_signature():
    h = juju.jit(sort_sum)  # fresh: every thread's first call is a miss

    def work(i):
        order = THREAD_INPUTS[i % 3:] + THREAD_INPUTS[:i % 3]
        return [(x, h(x)) for x in order]

    for per_thread in run_in_threads(work, 8):
        for x, out in per_thread:
            assert_same(out, jax.jit(sort_sum)(x))
    assert (h.trace_count, h.compile_count) == (3, 3)


def test_lower_and_compile_all_from_threads(monkeypatch):
    # No persistent cache: each thread's miss builds a MAX Module and compiles,
    # which failed outside the main thread ("No MLIR context active").
    monkeypatch.setenv("JUJU_DISABLE_CACHE", "1")

    def cos2(x):
        return jnp.cos(x) * 2

    fn = juju.jit(cos2)
    x, y = THREAD_INPUTS[0], THREAD_INPUTS[1]

    def work(i):
        if i % 2:
            juju.compile_all([fn.lower(x), fn.lower(y)])
        return fn(x), fn(y)

    for out_x, out_y in run_in_threads(work, 4):
        assert_same(out_x, jax.jit(cos2)(x))
        assert_same(out_y, jax.jit(cos2)(y))
    assert fn.trace_count == 2 and fn.compile_count == 2


# --- the AOT objects as jax's (issue 18) ----------------------------------------------


def test_lowered_and_compiled_describe_their_arguments_as_jax(compiled):
    def tree_fn(d, n):
        return {"o": d["a"] * n, "s": d["a"].sum()}

    args = ({"a": X3},)
    ours = compiled[id(power_outer_static)].lowered
    theirs = jax.jit(jax.jit(power), static_argnums=1).lower(X3, 3)
    assert ours.in_tree == theirs.in_tree
    assert ours.out_info == theirs.out_info
    assert jax.tree.map(lambda i: (i.shape, i.dtype, i.donated), ours.args_info) == \
        jax.tree.map(lambda i: (i.shape, i.dtype, i.donated), theirs.args_info)
    assert ours.cost_analysis() is None  # MAX reports no cost estimate
    assert "mo.graph" in ours.as_text()
    fn = compiled[id(power_outer_static)]
    assert (fn.in_tree, fn.out_tree, fn.out_info) == (ours.in_tree, ours.out_tree, ours.out_info)
    # eval_shape: a trace, no lowering
    tree_jit = juju.jit(tree_fn, static_argnums=1)
    assert tree_jit.eval_shape(*args, 2.0) == jax.jit(tree_fn, static_argnums=1).eval_shape(
        *args, 2.0)
    structs = (jax.ShapeDtypeStruct((3,), jnp.float32),)
    assert readme_jit.eval_shape(*structs, 1.0) == jax.jit(readme).eval_shape(*structs, 1.0)
    assert tree_jit.compile_count == 0
