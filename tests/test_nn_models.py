"""End to end: a CNN training step and a transformer block, forward and
backward, against jax.jit. All in one MAX compilation."""

import jax
import numpy as np
import pytest

from examples import models
from tests.nn_cases import Case, run_cases
from tests.util import fused_softmax_op

SOFTMAX = fused_softmax_op()
rng = np.random.default_rng(3)
cnn_params = models.cnn_init(rng)
images, labels = models.cnn_batch(rng)
block_params = models.block_init(rng)
tokens = rng.normal(size=(2, 8, 32)).astype(np.float32)

def three_steps(params, images, labels):
    losses = []
    for _ in range(3):
        params, loss = models.cnn_train_step(params, images, labels)
        losses.append(loss)
    return tuple(losses)


CASES = [
    Case("cnn_forward", models.cnn_apply, (cnn_params, images)),
    Case("cnn_train_step", models.cnn_train_step, (cnn_params, images, labels), rtol=1e-3, atol=1e-4),
    Case("cnn_three_steps", three_steps, (cnn_params, images, labels), rtol=1e-3, atol=1e-4),
    Case("block_forward", models.block_apply, (block_params, tokens),
         expect_in_graph=(SOFTMAX, "layer_norm", "gelu")),
    Case("block_backward", models.block_grad, (block_params, tokens), rtol=1e-3, atol=1e-4),
]


@pytest.fixture(scope="module")
def results():
    return run_cases(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_model(results, name):
    results[name].check()


def test_cnn_training_reduces_loss(results):
    """Three SGD steps (one juju graph, the same compilation) lower the loss."""
    results["cnn_three_steps"].check()
    losses = [float(b.to_numpy()) for b in results["cnn_three_steps"].got]
    assert losses[-1] < losses[0]
