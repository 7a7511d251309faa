"""Small reference models (plain JAX) used by the end-to-end tests, the
benchmark and the examples: a CNN training step and a transformer block."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


# --- CNN ---------------------------------------------------------------------------

def cnn_init(rng: np.random.Generator, channels=(1, 8, 16), classes=10, image=16):
    c0, c1, c2 = channels
    spatial = image // 4
    return {
        "conv1": (rng.normal(size=(3, 3, c0, c1)) / np.sqrt(9 * c0)).astype(np.float32),
        "b1": np.zeros(c1, np.float32),
        "conv2": (rng.normal(size=(3, 3, c1, c2)) / np.sqrt(9 * c1)).astype(np.float32),
        "b2": np.zeros(c2, np.float32),
        "dense": (rng.normal(size=(spatial * spatial * c2, classes))
                  / np.sqrt(spatial * spatial * c2)).astype(np.float32),
        "bd": np.zeros(classes, np.float32),
    }


def _conv(x, w, b):
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + b


def _max_pool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _avg_pool(x):
    return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0


def cnn_apply(params, images):
    x = _max_pool(jax.nn.relu(_conv(images, params["conv1"], params["b1"])))
    # Max pooling: the gradient of average pooling needs lax `pad` (see docs/nn.md).
    x = _max_pool(jax.nn.relu(_conv(x, params["conv2"], params["b2"])))
    x = x.reshape(x.shape[0], -1)
    return x @ params["dense"] + params["bd"]


def cnn_loss(params, images, labels_onehot):
    logits = cnn_apply(params, images)
    return -jnp.mean(jnp.sum(labels_onehot * jax.nn.log_softmax(logits), axis=-1))


def cnn_train_step(params, images, labels_onehot, lr=0.1):
    loss, grads = jax.value_and_grad(cnn_loss)(params, images, labels_onehot)
    new = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
    return new, loss


def cnn_batch(rng: np.random.Generator, batch=8, image=16, classes=10):
    images = rng.normal(size=(batch, image, image, 1)).astype(np.float32)
    labels = rng.integers(0, classes, batch)
    return images, np.eye(classes, dtype=np.float32)[labels]


# --- transformer block ----------------------------------------------------------------

def block_init(rng: np.random.Generator, d=32, heads=4, hidden=64):
    def w(*shape):
        return (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "ln1_g": np.ones(d, np.float32), "ln1_b": np.zeros(d, np.float32),
        "wq": w(d, d), "wk": w(d, d), "wv": w(d, d), "wo": w(d, d),
        "ln2_g": np.ones(d, np.float32), "ln2_b": np.zeros(d, np.float32),
        "w1": w(d, hidden), "b1": np.zeros(hidden, np.float32),
        "w2": w(hidden, d), "b2": np.zeros(d, np.float32),
    }


def layer_norm(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * lax.rsqrt(v + eps) * g + b


def block_apply(params, x, heads=4):
    b, t, d = x.shape
    h = layer_norm(x, params["ln1_g"], params["ln1_b"])
    split = lambda y: y.reshape(b, t, heads, d // heads)  # noqa: E731
    q, k, v = (split(h @ params[n]) for n in ("wq", "wk", "wv"))
    att = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d)
    x = x + att @ params["wo"]
    h = layer_norm(x, params["ln2_g"], params["ln2_b"])
    h = jax.nn.gelu(h @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
    return x + h


def block_loss(params, x):
    return jnp.mean(block_apply(params, x) ** 2)


def block_grad(params, x):
    return jax.value_and_grad(block_loss)(params, x)
