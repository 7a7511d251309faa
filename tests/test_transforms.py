"""JAX transformations lowered by juju: `juju.jit(jax.grad(f))` and friends.

grad, value_and_grad, jvp, vjp, vmap (of cond/while/scan too), jacfwd, jacrev,
hessian, checkpoint, custom_jvp/custom_vjp (jax.nn included), stop_gradient,
and realistic programs (an MLP training step, per-example gradients, an
optimizer loop, an RNN loss). Every case is compared with jax.jit, and all are
compiled in ONE MAX compilation (module fixture)."""

from __future__ import annotations

from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from tests.util import assert_same

rng = np.random.default_rng(1)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- programs ----------------------------------------------------------------


def mlp(params, x):
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def mse(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def train_step(params, x, y, lr=0.1):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


def train_loop(params, x, y):
    # several optimizer steps inside one graph (a scan over steps)
    def step(p, _):
        p, loss = train_step(p, x, y)
        return p, loss

    return lax.scan(step, params, None, length=5)


def per_example_grads(params, xs, ys):
    def one(x, y):
        return mse(params, x[None], y[None])

    return jax.vmap(jax.grad(lambda p, x, y: mse(p, x[None], y[None])), in_axes=(None, 0, 0))(
        params, xs, ys
    )


def logistic_loss(w, x, labels):
    logits = x @ w
    return -jnp.mean(jax.nn.log_softmax(logits) * labels)


def rnn_loss(params, xs):
    def cell(h, x):
        h = jnp.tanh(h @ params["wh"] + x @ params["wx"])
        return h, jnp.sum(h**2)

    h, ys = lax.scan(cell, jnp.zeros(params["wh"].shape[0]), xs)
    return jnp.sum(ys) + jnp.sum(h)


def while_fn(x):
    # x-dependent trip count, differentiable carry (forward-mode only for while)
    return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.1), (0, x))[1]


def cond_fn(x):
    return lax.cond(jnp.sum(x) > 0, lambda v: jnp.sin(v) * v, lambda v: jnp.cos(v), x)


def scan_fn(xs):
    return lax.scan(lambda c, x: (c * x + 1.0, c), jnp.float32(1.0), xs)[0]


def fori_fn(x):
    return lax.fori_loop(0, 4, lambda i, c: jnp.tanh(c) * 2.0, x)


@jax.custom_vjp
def clip_gradient(x):
    return x


def _clip_fwd(x):
    return x, None


def _clip_bwd(_, g):
    return (jnp.clip(g, -0.5, 0.5),)


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


@jax.custom_jvp
def log1pexp(x):
    return jnp.log(1.0 + jnp.exp(x))


@log1pexp.defjvp
def _log1pexp_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return log1pexp(x), t * jax.nn.sigmoid(x)


def custom_fns(x):
    return jnp.sum(clip_gradient(x * 3.0)) + jnp.sum(log1pexp(x)) + jnp.sum(jax.nn.relu(x))


def nn_fns(x):
    return jnp.sum(jax.nn.softplus(x) + jax.nn.silu(x) + jax.nn.logsumexp(x))


def stop_grad(x):
    return jnp.sum(x * lax.stop_gradient(x) + jnp.sin(x))


def remat_fn(x):
    f = jax.checkpoint(lambda v: jnp.sin(jnp.sin(v)) * v)
    return jnp.sum(f(x) ** 2)


def newton_grad(a):
    # Newton's method for x**3 = a, derivative from jax.grad, in a while_loop
    def g(x):
        return x**3 - a

    def body(c):
        x, i = c
        return x - g(x) / jax.grad(g)(x), i + 1

    return lax.while_loop(lambda c: (jnp.abs(g(c[0])) > 1e-5) & (c[1] < 50), body, (a, 0))


Point = namedtuple("Point", "x y")


def point_loss(p):
    return jnp.sum(p.x * p.y) + jnp.sum(jnp.tanh(p.x))


# --- cases -------------------------------------------------------------------

mlp_params = [
    {"w": f32(4, 8) * 0.5, "b": f32(8) * 0.1},
    {"w": f32(8, 8) * 0.5, "b": f32(8) * 0.1},
    {"w": f32(8, 2) * 0.5, "b": f32(2) * 0.1},
]
X, Y = f32(16, 4), f32(16, 2)
rnn_params = {"wh": f32(6, 6) * 0.4, "wx": f32(3, 6) * 0.4}
v3 = f32(3)
v5 = f32(5)
vb = f32(4, 5)

CASES = {
    "mlp_train_step": (train_step, (mlp_params, X, Y)),
    "mlp_train_loop": (train_loop, (mlp_params, X, Y)),
    "value_and_grad": (jax.value_and_grad(mse), (mlp_params, X, Y)),
    "per_example_grads": (per_example_grads, (mlp_params, X[:6], Y[:6])),
    "logistic_grad": (jax.grad(logistic_loss),
                      (f32(4, 3), X, np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)])),
    "jvp": (lambda x, t: jax.jvp(lambda v: jnp.sin(v) * v.sum(), (x,), (t,)), (v5, f32(5))),
    "vjp": (lambda x, ct: jax.vjp(lambda v: jnp.tanh(v) ** 2, x)[1](ct), (v5, f32(5))),
    "jacfwd": (jax.jacfwd(lambda x: jnp.sin(x) * x[::-1]), (v3,)),
    "jacrev": (jax.jacrev(lambda x: jnp.outer(x, x).sum(0)), (v3,)),
    "hessian": (jax.hessian(lambda x: jnp.sum(jnp.exp(x) * x) ** 2), (v3,)),
    "vmap_matmul": (jax.vmap(lambda a, b: a @ b, in_axes=(0, None)), (f32(4, 2, 3), f32(3, 5))),
    "vmap_cond": (jax.vmap(cond_fn), (vb,)),
    "vmap_while": (jax.vmap(lambda x: lax.while_loop(lambda c: c < 10.0, lambda c: c * 2 + 0.5, x)),
                   (np.abs(f32(6)) + 0.1,)),
    "vmap_scan": (jax.vmap(scan_fn), (vb,)),
    "grad_cond": (jax.grad(lambda x: jnp.sum(cond_fn(x))), (np.abs(v5),)),
    "grad_cond_false": (jax.grad(lambda x: jnp.sum(cond_fn(x))), (-np.abs(v5),)),
    "grad_scan": (jax.grad(lambda xs: scan_fn(xs)), (f32(6),)),
    "grad_rnn": (jax.grad(rnn_loss), (rnn_params, f32(7, 3))),
    "grad_fori": (jax.grad(lambda x: jnp.sum(fori_fn(x))), (v5,)),
    "jvp_while": (lambda x, t: jax.jvp(while_fn, (x,), (t,)), (v3, f32(3))),
    "custom_jvp_vjp": (jax.grad(custom_fns), (v5,)),
    "jax_nn": (jax.grad(nn_fns), (v5,)),
    "stop_gradient": (jax.grad(stop_grad), (v5,)),
    "checkpoint": (jax.grad(remat_fn), (v5,)),
    "newton_grad_in_while": (newton_grad, (np.float32(5.0),)),
    "namedtuple_grad": (jax.grad(point_loss), (Point(v3, f32(3)),)),
    "hessian_of_mlp": (jax.hessian(lambda x: jnp.sum(mlp(mlp_params, x[None]))), (f32(4),)),
}

# Primitives supplied by other modules of the lax pack; a case that needs one
# that is not there yet is an expected failure naming it.
OTHER_LAX = {"pad", "gather", "scatter-add", "scatter_add", "dynamic_slice",
             "dynamic_update_slice", "cumsum", "cumprod", "cummax", "cumlogsumexp",
             "select_and_scatter_add", "reduce_precision", "argmax", "split"}


@pytest.fixture(scope="module")
def compiled():
    lowered, errors = {}, {}
    for name, (fn, args) in CASES.items():
        try:
            lowered[name] = juju.jit(fn).lower(*args)
        except juju.MissingRuleError as exc:
            errors[name] = exc
    return dict(zip(lowered, juju.compile_all(list(lowered.values())))), errors


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(compiled, name):
    results, errors = compiled
    if name in errors:
        missing = {m.primitive for m in errors[name].missing}
        if missing <= OTHER_LAX:
            pytest.xfail(f"needs {', '.join(sorted(missing))} rule")
        raise errors[name]
    fn, args = CASES[name]
    assert_same(results[name](*args), jax.jit(fn)(*args), rtol=1e-4, atol=1e-5)
