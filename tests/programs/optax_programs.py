"""optax: the optimizers and combinators of its documentation, a few steps
each on a regression, as in optax's "Getting started": 16 samples of 8
features to 4 outputs (small), 256 samples of 512 features to 256 (large)."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized


def _regression(size, seed=0):
    import jax.numpy as jnp

    n, d, out = sized(size, small=(16, 8, 4), large=(256, 512, 256))
    scale = sized(size, small=1.0, large=d ** -0.5)  # large: outputs of unit scale
    rng = np.random.default_rng(seed)
    params = {"w": jnp.asarray(scale * rng.normal(size=(d, out)), jnp.float32),
              "b": jnp.zeros((out,), jnp.float32)}
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(n, out)), jnp.float32)
    return params, (x, y)


def _loss(params, batch):
    import jax.numpy as jnp

    x, y = batch
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def _steps(optimizer, steps):
    """`steps` updates in one function: updated params, state and losses."""
    import jax
    import optax

    def train(params, opt_state, batch):
        losses = []
        for _ in range(steps):
            loss, grads = jax.value_and_grad(_loss)(params, batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            losses.append(loss)
        return params, opt_state, losses

    return train


@program("optax_adam", "optax", rtol=1e-5, atol=1e-6, ci=True)
def optax_adam(size):
    import optax

    params, batch = _regression(size)
    optimizer = optax.adam(learning_rate=1e-2)
    return _steps(optimizer, 3), (params, optimizer.init(params), batch)


@program("optax_adamw_schedule", "optax", rtol=1e-5, atol=1e-6)
def optax_adamw_schedule(size):
    import optax

    params, batch = _regression(size, 1)
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=1e-2, warmup_steps=2, decay_steps=10, end_value=1e-4)
    optimizer = optax.adamw(learning_rate=schedule, weight_decay=1e-2)
    return _steps(optimizer, 3), (params, optimizer.init(params), batch)


@program("optax_chain_clip_by_global_norm", "optax", rtol=1e-5, atol=1e-6)
def optax_chain_clip_by_global_norm(size):
    import jax.numpy as jnp
    import optax

    rng = np.random.default_rng(2)
    # small: the shapes of issue 14's report
    n, d, width = sized(size, small=(4, 1000, 64), large=(256, 1024, 512))
    scale = sized(size, small=1.0, large=d ** -0.5)  # large: tanh not saturated
    params = {"a": jnp.asarray(scale * rng.normal(size=(d, width)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=(width,)), jnp.float32)}
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)

    def loss(params, x):
        return jnp.mean(jnp.tanh(x @ params["a"] + params["b"]) ** 2)

    # The gradient's global norm is about 0.99: clipping at 0.5 acts. Not adam
    # after it: its first step, lr * g / (|g| + 1e-8), turns float32 rounding
    # (4e-8 here, in jax.jit and juju alike) of gradients near zero into
    # whole steps, so no two compilers agree on it elementwise.
    optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(1e-2, momentum=0.9))

    def step(params, opt_state, x):
        import jax

        value, grads = jax.value_and_grad(loss)(params, x)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step, (params, optimizer.init(params), x)


# atol 2e-4 (2% of adam's lr 1e-2): adam moves each weight by
# lr * m / (sqrt(v) + eps), which summation order moves where the gradient
# is near 0 (large: 70 of 131,072 weights, up to 1.0e-4 from jax.jit's,
# 7.8e-5 from float64 where jax.jit's are 3.5e-5)
@program("optax_multi_transform", "optax", rtol=1e-5, atol=2e-4)
def optax_multi_transform(size):
    import optax

    params, batch = _regression(size, 3)
    optimizer = optax.multi_transform(
        {"adam": optax.adam(1e-2), "sgd": optax.sgd(1e-1, momentum=0.9)},
        {"w": "adam", "b": "sgd"})
    return _steps(optimizer, 2), (params, optimizer.init(params), batch)


@program("optax_ema", "optax", rtol=1e-5, atol=1e-6)
def optax_ema(size):
    import optax

    params, batch = _regression(size, 4)
    # EMA of the updates after sgd, with bias correction, as optax's docs chain it
    optimizer = optax.chain(optax.sgd(1e-1), optax.ema(decay=0.9, debias=True))
    return _steps(optimizer, 3), (params, optimizer.init(params), batch)
