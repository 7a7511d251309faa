"""juju.jit composing with JAX both ways.

- `juju.jit` inside `juju.jit`: inlined into one graph.
- JAX transformations over a `juju.jit` function (`jax.grad(juju.jit(f))`,
  vmap, jvp, hessian): JAX sees through it and the results run on MAX.
- A `juju.jit` function called from `jax.jit` code runs on MAX through a host
  callback, also under `jax.grad` of the surrounding function.
- Pytrees of every kind, in and out.

The MAX graphs all cases need are found by tracing (`juju.call.lower_calls`)
and compiled in ONE MAX compilation (module fixture).
"""

from __future__ import annotations

from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from juju import call
from tests.util import assert_same

rng = np.random.default_rng(2)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- functions ---------------------------------------------------------------


def mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    out = h @ params["w2"] + params["b2"]
    return jnp.mean((out - y) ** 2)


loss_jit = juju.jit(mlp_loss)


@juju.jit
def features(x):
    return jnp.sin(x) * jnp.cos(x[::-1]) + x**2


@juju.jit
def inner(x, y):
    return jnp.tanh(x) * y


@juju.jit
def outer(x, y):
    # juju.jit inside juju.jit: one graph
    return inner(x, y) + inner(y, x).sum()


@juju.jit
def scan_inside(xs):
    return lax.scan(lambda c, x: (c * 0.9 + x, c), jnp.zeros(xs.shape[1:]), xs)


Pair = namedtuple("Pair", "a b")


@jax.tree_util.register_pytree_node_class
class Box:
    """A registered custom pytree node with static aux data."""

    def __init__(self, value, scale):
        self.value, self.scale = value, scale

    def tree_flatten(self):
        return (self.value,), self.scale

    @classmethod
    def tree_unflatten(cls, scale, children):
        return cls(children[0], scale)


def tree_fn(tree):
    d, lst, pair, box, none = tree["d"], tree["l"], tree["p"], tree["box"], tree["none"]
    assert none is None
    total = d["u"].sum() * lst[0] + jnp.sum(lst[1] * pair.a) + pair.b
    return {
        "total": total,
        "items": [d["u"] * 2.0, (pair.b, None)],
        "pair": Pair(box.value * box.scale, jnp.sin(total)),
        "box": Box(box.value + 1.0, box.scale),
    }


tree_jit = juju.jit(tree_fn)


def tree_loss(tree_fn_, tree):
    out = tree_fn_(tree)
    return out["total"] + jnp.sum(out["items"][0]) + jnp.sum(out["pair"].a) + out["box"].value.sum()


def make_tree():
    return {
        "d": {"u": f32(3)},
        "l": [np.float32(1.5), f32(2)],
        "p": Pair(f32(2), np.float32(0.3)),
        "box": Box(f32(4), 2.0),
        "none": None,
    }


params0 = {"w1": f32(3, 5) * 0.5, "b1": f32(5) * 0.1, "w2": f32(5, 2) * 0.5, "b2": f32(2) * 0.1}
X, Y = f32(8, 3), f32(8, 2)


def sgd(loss, params, steps=4, lr=0.2):
    """A small optimizer loop over several steps (eager, step by step)."""
    losses = []
    grad_fn = jax.value_and_grad(loss)
    for _ in range(steps):
        value, grads = grad_fn(params, X, Y)
        params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
        losses.append(value)
    return params, losses


@jax.jit
def xla_calls_max(x, y):
    # jax.jit (XLA) code calling a juju.jit function: runs on MAX via a callback
    return jnp.exp(features(x * 2.0)) + inner(x, y).sum()


def xla_loss(params, x, y):
    return loss_jit(params, x, y) * 2.0 + jnp.sum(params["b2"] ** 2)


# --- cases: (fn through juju, reference, args) ---------------------------------

CASES = {
    "grad": (jax.grad(loss_jit), jax.grad(mlp_loss), (params0, X, Y)),
    "value_and_grad": (jax.value_and_grad(loss_jit, argnums=(0, 1)),
                       jax.value_and_grad(mlp_loss, argnums=(0, 1)), (params0, X, Y)),
    "vmap": (jax.vmap(features), jax.vmap(features.fun), (f32(4, 5),)),
    "vmap_in_axes": (jax.vmap(inner, in_axes=(1, None)), jax.vmap(inner.fun, in_axes=(1, None)),
                     (f32(3, 4), np.float32(2.0))),
    "jvp": (lambda x, t: jax.jvp(features, (x,), (t,)),
            lambda x, t: jax.jvp(features.fun, (x,), (t,)), (f32(5), f32(5))),
    "vjp": (lambda x, ct: jax.vjp(features, x)[1](ct),
            lambda x, ct: jax.vjp(features.fun, x)[1](ct), (f32(5), f32(5))),
    "hessian": (jax.hessian(lambda x: features(x).sum()),
                jax.hessian(lambda x: features.fun(x).sum()), (f32(3),)),
    "jacrev": (jax.jacrev(features), jax.jacrev(features.fun), (f32(3),)),
    "per_example_grads": (jax.vmap(jax.grad(loss_jit), in_axes=(None, 0, 0)),
                          jax.vmap(jax.grad(mlp_loss), in_axes=(None, 0, 0)),
                          (params0, X[:, None], Y[:, None])),
    "grad_of_scan": (jax.grad(lambda xs: scan_inside(xs)[0].sum()),
                     jax.grad(lambda xs: scan_inside.fun(xs)[0].sum()), (f32(5, 2),)),
    "pytrees": (tree_jit, tree_fn, (make_tree(),)),
    "grad_pytrees": (jax.grad(lambda t: tree_loss(tree_jit, t)),
                     jax.grad(lambda t: tree_loss(tree_fn, t)), (make_tree(),)),
    "jax_jit_calls_juju": (xla_calls_max, xla_calls_max.__wrapped__, (f32(5), f32(5))),
    "grad_of_jax_jit": (jax.jit(jax.grad(xla_loss)),
                        jax.grad(lambda p, x, y: mlp_loss(p, x, y) * 2.0 + jnp.sum(p["b2"] ** 2)),
                        (params0, X, Y)),
    "vmap_in_jax_jit": (jax.jit(jax.vmap(features)), jax.vmap(features.fun), (f32(3, 4),)),
    # closed-over tracers become operands of juju_call, so JAX differentiates them
    "closure_over_tracer": (
        jax.jit(jax.grad(
            lambda w, x: juju.jit(lambda v: jnp.sum(jnp.sin(v) * w))(x * 1.0 + w * 0.0))),
        jax.grad(lambda w, x: jnp.sum(jnp.sin(x) * w)), (np.float32(3.0), f32(4))),
}
EAGER = {"pytrees"}  # plain juju.jit calls: no juju_call involved


@pytest.fixture(scope="module")
def compiled():
    lowered = [outer.lower(f32(4), f32(4)), tree_jit.lower(make_tree())]
    for fn, _, args in CASES.values():
        lowered += call.lower_calls(fn, *args)
    lowered += call.lower_calls(lambda p: sgd(loss_jit, p), params0)
    juju.compile_all(list({id(low): low for low in lowered}.values()))  # distinct graphs


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(compiled, name):
    fn, reference, args = CASES[name]
    before = (call.Stats.eager, call.Stats.callbacks)
    actual = fn(*args)
    if name not in EAGER:
        assert (call.Stats.eager, call.Stats.callbacks) != before, "nothing ran on MAX"
    assert_same(actual, jax.jit(reference)(*args), rtol=1e-4, atol=1e-5)


def test_jit_inside_jit_is_inlined(compiled):
    x, y = f32(4), f32(4)
    jaxpr = jax.make_jaxpr(outer.fun)(x, y)
    assert [e.primitive.name for e in jaxpr.eqns].count("juju_call") == 2
    compiles_before = inner.compile_count
    expected = jnp.tanh(x) * y + (jnp.tanh(y) * x).sum()
    assert_same(outer(x, y), expected)  # inner ran inside outer's graph
    assert inner.compile_count == compiles_before == 0
    assert "mo.tanh" in outer.lower(x, y).as_text()


def test_optimizer_loop(compiled):
    params, losses = sgd(loss_jit, params0)
    ref_params, ref_losses = sgd(jax.jit(mlp_loss), params0)
    assert_same(params, ref_params, rtol=1e-4, atol=1e-5)
    assert_same(losses, ref_losses, rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]


def test_eager_grad_reuses_executables(compiled):
    jax.grad(loss_jit)(params0, X, Y)
    count = len(call._runners_by_text)
    for _ in range(3):
        jax.grad(loss_jit)(params0, X, Y)
    assert len(call._runners_by_text) == count


@jax.jit
def _doubled_range():
    return jnp.arange(4.0, dtype=jnp.float32) * 2.0


def test_jax_jit_without_arguments_inside():
    """A jax.jit function called with no arguments is a jit equation with no
    operands: a pack's guard that read its first operand made the lowering
    raise IndexError (found by the fuzzing tier, seed 37)."""
    def fn(x):
        return x + _doubled_range()

    x = f32(4)
    assert any(e.primitive.name in ("jit", "pjit") and not e.invars
               for e in jax.make_jaxpr(fn)(x).jaxpr.eqns)
    assert_same(juju.jit(fn)(x), jax.jit(fn)(x))
