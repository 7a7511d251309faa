"""Train a small flax classifier with juju, then export it for serving.

    python examples/export_and_serve/train_and_export.py mlp.juju
    python examples/export_and_serve/serve.py mlp.juju     # needs max and numpy only

The trained parameters are closed over by `predict`, so the artifact stores
them as weights; the batch dimension is symbolic, so one artifact serves any
batch size.
"""

import functools
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import juju


class Classifier(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(64)(x))
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(2)(x)


def rings(n: int, seed: int):
    """Two noisy concentric rings: label 1 for the outer one."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = 1.0 + labels + rng.normal(0, 0.15, n)
    points = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return points.astype(np.float32), labels.astype(np.int32)


def main(path: str) -> None:
    model = Classifier()
    params = model.init(jax.random.key(0), jnp.zeros((1, 2)))
    optimizer = optax.adam(1e-2)

    @functools.partial(juju.jit, coerces_to_jnp=True)  # jax arrays out: `predict` closes over them
    def train_step(params, state, x, y):
        def loss(p):
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    state = optimizer.init(params)
    x, y = rings(512, seed=0)
    for step in range(300):
        params, state, loss = train_step(params, state, x, y)
    print(f"trained: loss {float(loss):.4f}")

    def predict(points):
        return jax.nn.softmax(model.apply(params, points))

    batch = jax.ShapeDtypeStruct(jax.export.symbolic_shape("batch, 2"), jnp.float32)
    exported = juju.export(predict, batch)
    print(f"exported to {exported.save(path)}: {len(exported.weights)} weight arrays, "
          f"inputs {exported.in_avals}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mlp.juju")
