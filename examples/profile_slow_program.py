"""Why is this program slower on MAX than with jax.jit? `juju.profile` says.

    python examples/profile_slow_program.py              # by source line
    python examples/profile_slow_program.py --equation   # + one graph per equation

k-means: 20 iterations of "assign each point to its nearest centroid, move
each centroid to the mean of its points", in a `fori_loop`. The loop's body
holds an argmin and two scatter-adds (`segment_sum`): a loop MAX runs trip
by trip. docs/profile.md walks through the tables this prints. The first
run compiles the program and its per-line graphs (minutes on 2 cores);
juju's cache makes later runs take seconds.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import juju

CLUSTERS = 8


def kmeans(points, centroids):
    def step(_, centroids):
        distances = jnp.sum((points[:, None, :] - centroids[None]) ** 2, axis=-1)
        nearest = jnp.argmin(distances, axis=1)
        sums = jax.ops.segment_sum(points, nearest, num_segments=CLUSTERS)
        counts = jax.ops.segment_sum(jnp.ones(len(points)), nearest, num_segments=CLUSTERS)
        return sums / jnp.maximum(counts, 1.0)[:, None]

    return lax.fori_loop(0, 20, step, centroids)


def main() -> None:
    rng = np.random.default_rng(0)
    points = rng.normal(size=(2000, 2)).astype(np.float32)
    centroids = points[:CLUSTERS].copy()

    # depth=1: the loop is one entry, and its body's lines are timed too.
    print(juju.profile(kmeans, points, centroids, depth=1, compare_jax=True))
    if "--equation" in sys.argv:
        print()
        print(juju.profile(kmeans, points, centroids, depth=1, group="equation", top=20))


if __name__ == "__main__":
    main()
