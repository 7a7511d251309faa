"""Serve an exported classifier with MAX alone: no jax, no flax.

    python examples/export_and_serve/serve.py mlp.juju

juju-core installed with `pip install --no-deps juju-core` next to `max` is
enough: `juju.serving` imports numpy and MAX only.
"""

import sys

import numpy as np

from juju import serving


def rings(n: int, seed: int):  # the training script's data, written again: no imports from it
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = 1.0 + labels + rng.normal(0, 0.15, n)
    points = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return points.astype(np.float32), labels


def main(path: str) -> None:
    predict = serving.load(path)
    for batch in (1, 100, 1000):  # one artifact, any batch size (a symbolic dimension)
        points, labels = rings(batch, seed=batch)
        probabilities = predict(points)
        accuracy = (probabilities.argmax(axis=1) == labels).mean()
        print(f"batch {batch:5d}: probabilities {probabilities.shape} {probabilities.dtype}, "
              f"accuracy {accuracy:.3f}")
    print("jax imported:", "jax" in sys.modules)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mlp.juju")
