"""dm-haiku: a ResNet block with BatchNorm state, as haiku's docs write it
(`hk.transform_with_state`): 4 images of 8x8 and 8 channels (small), 128
CIFAR-size images of 32x32 and 16 channels (large)."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized


@program("haiku_resnet_block", "dm-haiku", rtol=1e-4, atol=1e-5)
def haiku_resnet_block(size):
    import haiku as hk
    import jax
    import optax

    n, side, channels = sized(size, small=(4, 8, 8), large=(128, 32, 16))

    def forward(x, is_training):
        y = hk.Conv2D(channels, 3, with_bias=False)(x)
        y = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(y, is_training)
        y = jax.nn.relu(y)
        y = hk.Conv2D(channels, 3, with_bias=False)(y)
        y = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(y, is_training)
        shortcut = hk.Conv2D(channels, 1, with_bias=False)(x)
        y = jax.nn.relu(y + shortcut)
        return hk.Linear(10)(hk.Flatten()(hk.avg_pool(y, 8, 8, "VALID")))

    model = hk.transform_with_state(forward)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, side, side, 3)).astype(np.float32)
    labels = rng.integers(0, 10, size=(n,)).astype(np.int32)
    params, state = model.init(jax.random.key(0), x, is_training=True)
    tx = optax.sgd(0.1, momentum=0.9)

    def train_step(params, state, opt_state, x, labels):
        def loss_fn(params, state):
            logits, state = model.apply(params, state, None, x, is_training=True)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), state, opt_state, loss

    return train_step, (params, state, tx.init(params), x, labels)
