"""Control flow, JAX transformations and jax.jit interop with juju.

    python examples/control_flow.py            # examples
    python examples/control_flow.py --bench    # + cost of the XLA -> MAX callback

All graphs are compiled together in one MAX compilation (juju.compile_all).
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import juju
from juju import call

rng = np.random.default_rng(0)


# --- programs ----------------------------------------------------------------


def loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


@juju.jit
def train_step(params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


# per-example gradients: vmap of grad
per_example = juju.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))


@juju.jit
def rnn(w, xs):
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum()

    return lax.scan(cell, jnp.zeros(w.shape[0]), xs)


@juju.jit
def newton_sqrt(a):
    def body(c):
        x, i = c
        return 0.5 * (x + a / x), i + 1

    return lax.while_loop(lambda c: (jnp.max(jnp.abs(c[0] ** 2 - a)) > 1e-6) & (c[1] < 50),
                          body, (jnp.ones_like(a), 0))


@juju.jit
def activation(i, x):
    return lax.switch(i, [jnp.tanh, jax.nn.relu, jax.nn.gelu], x)


features = juju.jit(lambda x: jnp.sin(x) * jnp.cos(x) + x**2)


@jax.jit
def xla_program(x):
    return jnp.exp(features(x)).sum()  # the juju.jit function runs on MAX


def main():
    params = {"w1": rng.standard_normal((3, 8), np.float32) * 0.5,
              "b1": np.zeros(8, np.float32),
              "w2": rng.standard_normal((8, 2), np.float32) * 0.5}
    x, y = rng.standard_normal((16, 3), np.float32), rng.standard_normal((16, 2), np.float32)
    w, xs = rng.standard_normal((4, 4), np.float32) * 0.5, rng.standard_normal((10, 4), np.float32)
    a = np.array([2.0, 9.0, 0.25], np.float32)
    v = rng.standard_normal(5).astype(np.float32)

    juju.compile_all(
        [train_step.lower(params, x, y), per_example.lower(params, x, y), rnn.lower(w, xs),
         newton_sqrt.lower(a), activation.lower(np.int32(0), v)]
        + call.lower_calls(jax.grad(lambda v: features(v).sum()), v)
        + call.lower_calls(xla_program, v)
    )

    for _ in range(3):
        params, value = train_step(params, x, y)
        print("loss", value.to_numpy())
    print("per-example grads", per_example(params, x, y)["w1"].to_numpy().shape)
    h, ys = rnn(w, xs)
    print("rnn", h.to_numpy().round(3), ys.to_numpy().shape)
    root, steps = newton_sqrt(a)
    print("sqrt", root.to_numpy(), "in", steps.to_numpy(), "steps")
    print("switch", activation(np.int32(2), v).to_numpy().round(3))
    print("jax.grad(juju.jit(f))", jax.grad(lambda v: features(v).sum())(v))
    print("jax.jit calling juju.jit", xla_program(v))


def bench():
    """Time jax.jit code calling a juju.jit function (host callback into MAX)."""

    def timeit(f, *args, n=300):
        """Median per-call time in us (the median resists a busy machine)."""
        for _ in range(5):
            jax.block_until_ready(f(*args))
        times = []
        for _ in range(n):
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            times.append(time.perf_counter() - start)
        return float(np.median(times)) * 1e6

    body = lambda x: jnp.tanh(x) * 2.0 + 1.0  # noqa: E731
    on_max = juju.jit(body)
    via_callback = jax.jit(lambda x: on_max(x))
    xla_only = jax.jit(body)
    noop = jax.jit(lambda x: jax.pure_callback(
        np.asarray, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
    sizes = (16, 100_000, 1_000_000)
    inputs = [jnp.asarray(rng.standard_normal(n).astype(np.float32)) for n in sizes]
    lowered = []
    for x in inputs:
        lowered += call.lower_calls(via_callback, x) + [on_max.lower(x)]
    juju.compile_all(lowered)
    for n, x in zip(sizes, inputs):
        np.testing.assert_allclose(via_callback(x), xla_only(x), rtol=1e-5, atol=1e-6)
        row = {
            "jax.jit (XLA)": timeit(xla_only, x),
            "jax.jit + no-op pure_callback": timeit(noop, x),
            "jax.jit -> juju.jit (MAX via callback)": timeit(via_callback, x),
            "juju.jit called directly": timeit(on_max, x),
        }
        print(f"n={n:>9,}: " + "; ".join(f"{k} {v:,.0f} us" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
    if "--bench" in sys.argv:
        bench()
