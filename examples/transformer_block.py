"""A transformer block (layer norm, causal attention, gelu MLP) forward and
backward on MAX through juju; softmax, layer norm and gelu lower to MAX's
fused ops (see docs/nn.md).

    python examples/transformer_block.py
"""

import numpy as np

import juju
import models  # examples/models.py, beside this file

rng = np.random.default_rng(0)
params = models.block_init(rng)
x = rng.normal(size=(2, 8, 32)).astype(np.float32)

forward = juju.jit(models.block_apply)
backward = juju.jit(models.block_grad)
juju.compile_all([forward.lower(params, x), backward.lower(params, x)])
print("output", forward(params, x).to_numpy().shape)
loss, grads = backward(params, x)
print("loss", float(loss.to_numpy()), "grad norms",
      {k: round(float(np.linalg.norm(g.to_numpy())), 4) for k, g in grads.items()})
