"""equinox: modules as pytrees, `filter_*` transformations, `error_if`; as
equinox's docs write them. Large: MLPs of width 256 on batches of 256, a
convnet on 128 MNIST-size images, a GRU of 256 units over 256 steps."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized


@program("eqx_mlp", "equinox", rtol=1e-5, atol=1e-6, ci=True)
def eqx_mlp(size):
    import equinox as eqx
    import jax

    n, features, width = sized(size, small=(8, 4, 16), large=(256, 64, 256))
    model = eqx.nn.MLP(in_size=features, out_size=2, width_size=width, depth=2,
                       activation=jax.nn.softplus, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)

    def forward(params, x):
        return jax.vmap(eqx.combine(params, static))(x)

    x = np.random.default_rng(0).normal(size=(n, features)).astype(np.float32)
    return forward, (params, x)


@program("eqx_filter_value_and_grad", "equinox", rtol=1e-4, atol=1e-6)
def eqx_filter_value_and_grad(size):
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    n, features, width = sized(size, small=(16, 3, 8), large=(256, 32, 256))
    model = eqx.nn.MLP(in_size=features, out_size=1, width_size=width, depth=2,
                       key=jax.random.key(1))
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
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.normal(size=(n, 1)).astype(np.float32)
    return make_step, (params, opt_state, x, y)


@program("eqx_conv", "equinox", rtol=1e-4, atol=1e-5)
def eqx_conv(size):
    import equinox as eqx
    import jax

    n, side, channels = sized(size, small=(4, 8, 3), large=(128, 28, 16))
    pooled = side - 3  # a 3x3 convolution, then a 2x2 max pool of stride 1

    keys = jax.random.split(jax.random.key(2), 3)

    class CNN(eqx.Module):
        layers: list

        def __init__(self, keys):
            self.layers = [
                eqx.nn.Conv2d(1, channels, kernel_size=3, key=keys[0]),
                eqx.nn.MaxPool2d(kernel_size=2),
                jax.nn.relu,
                jax.numpy.ravel,
                eqx.nn.Linear(channels * pooled * pooled, 10, key=keys[1]),
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
    x = rng.normal(size=(n, 1, side, side)).astype(np.float32)  # equinox is channels-first
    y = rng.integers(0, 10, size=(n,)).astype(np.int32)
    return loss_and_grad, (params, x, y)


@program("eqx_gru_scan", "equinox", rtol=1e-4, atol=1e-5)
def eqx_gru_scan(size):
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    n, steps, features, hidden = sized(size, small=(4, 10, 2, 8), large=(8, 256, 16, 256))

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

    model = RNN(in_size=features, out_size=1, hidden_size=hidden, key=jax.random.key(3))
    params, static = eqx.partition(model, eqx.is_array)

    @eqx.filter_value_and_grad
    def compute_loss(model, x, y):
        pred_y = jax.vmap(model)(x)
        return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))

    def loss_and_grad(params, x, y):
        loss, grads = compute_loss(eqx.combine(params, static), x, y)
        return loss, eqx.filter(grads, eqx.is_array)

    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, steps, features)).astype(np.float32)
    y = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
    return loss_and_grad, (params, x, y)


@program("eqx_error_if", "equinox", rtol=1e-6, atol=1e-6)
def eqx_error_if(size):
    import equinox as eqx
    import jax.numpy as jnp

    def safe_log(x):
        x = eqx.error_if(x, x <= 0, "log of a non-positive number")
        return jnp.log(x)

    x = np.linspace(0.5, 3.0, sized(size, small=6, large=16384)).astype(np.float32)
    return safe_log, (x,)
