"""equinox: modules as pytrees, `filter_*` transformations, `error_if`; as
equinox's docs write them."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program


@program("eqx_mlp", "equinox", rtol=1e-5, atol=1e-6, ci=True)
def eqx_mlp():
    import equinox as eqx
    import jax

    model = eqx.nn.MLP(in_size=4, out_size=2, width_size=16, depth=2,
                       activation=jax.nn.softplus, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)

    def forward(params, x):
        return jax.vmap(eqx.combine(params, static))(x)

    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    return forward, (params, x)


@program("eqx_filter_value_and_grad", "equinox", rtol=1e-4, atol=1e-6)
def eqx_filter_value_and_grad():
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    model = eqx.nn.MLP(in_size=3, out_size=1, width_size=8, depth=2, key=jax.random.key(1))
    optim = optax.adam(1e-2)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_value_and_grad
    def compute_loss(model, x, y):
        pred_y = jax.vmap(model)(x)
        return jnp.mean((y - pred_y) ** 2)

    params, static = eqx.partition(model, eqx.is_array)

    def make_step(params, opt_state, x, y):
        model = eqx.combine(params, static)
        loss, grads = compute_loss(model, x, y)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        return eqx.filter(model, eqx.is_array), opt_state, loss

    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    return make_step, (params, opt_state, x, y)


@program("eqx_conv", "equinox", rtol=1e-4, atol=1e-5)
def eqx_conv():
    import equinox as eqx
    import jax

    keys = jax.random.split(jax.random.key(2), 3)

    class CNN(eqx.Module):
        layers: list

        def __init__(self, keys):
            self.layers = [
                eqx.nn.Conv2d(1, 3, kernel_size=3, key=keys[0]),
                eqx.nn.MaxPool2d(kernel_size=2),
                jax.nn.relu,
                jax.numpy.ravel,
                eqx.nn.Linear(3 * 5 * 5, 10, key=keys[1]),
                jax.nn.log_softmax,
            ]

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    model = CNN(keys)
    params, static = eqx.partition(model, eqx.is_array)

    def loss_and_grad(params, x, y):
        def loss(params):
            pred = jax.vmap(eqx.combine(params, static))(x)
            return -jax.numpy.mean(jax.numpy.take_along_axis(pred, y[:, None], axis=1))

        return jax.value_and_grad(loss)(params)

    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 1, 8, 8)).astype(np.float32)  # equinox is channels-first
    y = rng.integers(0, 10, size=(4,)).astype(np.int32)
    return loss_and_grad, (params, x, y)


@program("eqx_gru_scan", "equinox", rtol=1e-4, atol=1e-5)
def eqx_gru_scan():
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    class RNN(eqx.Module):
        hidden_size: int
        cell: eqx.nn.GRUCell
        linear: eqx.nn.Linear

        def __init__(self, in_size, out_size, hidden_size, *, key):
            ckey, lkey = jax.random.split(key)
            self.hidden_size = hidden_size
            self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=ckey)
            self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)

        def __call__(self, input):
            hidden = jnp.zeros((self.hidden_size,))

            def f(carry, inp):
                return self.cell(inp, carry), None

            out, _ = jax.lax.scan(f, hidden, input)
            return jax.nn.sigmoid(self.linear(out))

    model = RNN(in_size=2, out_size=1, hidden_size=8, key=jax.random.key(3))
    params, static = eqx.partition(model, eqx.is_array)

    @eqx.filter_value_and_grad
    def compute_loss(model, x, y):
        pred_y = jax.vmap(model)(x)
        return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))

    def loss_and_grad(params, x, y):
        loss, grads = compute_loss(eqx.combine(params, static), x, y)
        return loss, eqx.filter(grads, eqx.is_array)

    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 10, 2)).astype(np.float32)
    y = rng.integers(0, 2, size=(4, 1)).astype(np.float32)
    return loss_and_grad, (params, x, y)


@program("eqx_error_if", "equinox", rtol=1e-6, atol=1e-6)
def eqx_error_if():
    import equinox as eqx
    import jax.numpy as jnp

    def safe_log(x):
        x = eqx.error_if(x, x <= 0, "log of a non-positive number")
        return jnp.log(x)

    x = np.linspace(0.5, 3.0, 6).astype(np.float32)
    return safe_log, (x,)
