"""Train a small CNN (conv, max pool, dense, softmax cross-entropy) with SGD
on MAX through juju. The whole training step, gradient included, is one MAX
graph compiled once.

    python examples/cnn_train.py
"""

import jax
import numpy as np

import juju
import models  # examples/models.py, beside this file

rng = np.random.default_rng(0)
params = models.cnn_init(rng)
step = juju.jit(models.cnn_train_step)
for i in range(5):
    images, labels = models.cnn_batch(rng)
    params, loss = step(params, images, labels)
    params = jax.tree_util.tree_map(lambda b: b.to_numpy(), params)
    print(f"step {i}: loss {float(loss.to_numpy()):.4f}")
