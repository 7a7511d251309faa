"""The core rows of `python3 dev.py bench` (`workloads`) and the functions
they time, shared by benchmarks/run.py, programs.py and cold_start.py. A row
is (name, function, arguments, flops or None)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

F32 = np.float32


def chain(x):
    return jnp.tanh(x * 1.5 + 0.5) * jnp.exp(-x * x) + jnp.sin(x)


def total(x):
    return jnp.sum(x)


def matmul(a, b):
    return a @ b


def mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def mlp_loss(params, x, y):
    logits = mlp(params, x)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))


def mlp_step(params, x, y):
    grads = jax.grad(mlp_loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def layer_norm(x, gamma, beta):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta


def attention(q, k, v, wo):
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[2], k.shape[2]), bool))
    scores = jnp.where(mask, scores, -1e9)
    out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    b, h, s, d = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, s, h * d) @ wo


def cnn_loss(params, x, y):
    w1, w2, wd = params
    h = jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(h)
    h = jax.lax.conv_general_dilated(h, w2, (2, 2), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(h).reshape(h.shape[0], -1)
    logits = h @ wd
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))


def cnn_step(params, x, y):
    grads = jax.grad(cnn_loss)(params, x, y)
    return [p - 0.01 * g for p, g in zip(params, grads)]


def rnn(w_h, w_x, xs):
    def cell(h, x):
        h = jnp.tanh(h @ w_h + x @ w_x)
        return h, h

    h0 = jnp.zeros((xs.shape[1], w_h.shape[0]), xs.dtype)
    h, hs = jax.lax.scan(cell, h0, xs)
    return h, hs.sum()


def rfft_irfft(x):
    return jnp.fft.irfft(jnp.fft.rfft(x), x.shape[-1])


def scalar_add(x, y):
    return x + y


def workloads(rng):
    r = lambda *s: rng.standard_normal(s).astype(F32)  # noqa: E731
    mlp_params = [(r(256, 512) * 0.05, r(512)), (r(512, 512) * 0.05, r(512)), (r(512, 10) * 0.05, r(10))]
    onehot = np.eye(10, dtype=F32)[rng.integers(0, 10, 128)]
    cnn_params = [r(16, 3, 3, 3) * 0.1, r(32, 16, 3, 3) * 0.1, r(32 * 16 * 16, 10) * 0.01]
    return [
        ("elementwise chain 1e6", chain, (r(1_000_000),), None),
        ("elementwise chain 1.6e7", chain, (r(16_000_000),), None),
        ("sum 1.6e7", total, (r(16_000_000),), None),
        ("matmul 256", matmul, (r(256, 256), r(256, 256)), 2 * 256**3),
        ("matmul 1024", matmul, (r(1024, 1024), r(1024, 1024)), 2 * 1024**3),
        ("matmul 2048", matmul, (r(2048, 2048), r(2048, 2048)), 2 * 2048**3),
        ("MLP forward", mlp, (mlp_params, r(128, 256)), None),
        ("MLP training step", mlp_step, (mlp_params, r(128, 256), onehot), None),
        ("softmax 512x4096", softmax, (r(512, 4096),), None),
        ("layer norm 512x4096", layer_norm, (r(512, 4096), r(4096), r(4096)), None),
        ("attention block", attention, (r(4, 8, 256, 64), r(4, 8, 256, 64), r(4, 8, 256, 64), r(512, 512) * 0.05), None),
        ("CNN training step", cnn_step, (cnn_params, r(128, 3, 32, 32), onehot), None),
        ("scan RNN", rnn, (r(256, 256) * 0.05, r(128, 256) * 0.05, r(64, 32, 128)), None),
        ("rfft+irfft 16x16384", rfft_irfft, (r(16, 16384),), None),
    ]
