"""Programs in plain jax: a graph network with `segment_sum` and a 100-step
training loop under `lax.fori_loop`. Large: a graph of 4096 nodes and 16384
edges, a regression of 512 samples of 256 features."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized


@program("graph_network_segment_sum", "jax", rtol=1e-4, atol=1e-5, ci=True)
def graph_network_segment_sum(size):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    nodes, edges, features = sized(size, small=(6, 10, 4), large=(4096, 16384, 64))
    senders = jnp.asarray(rng.integers(0, nodes, size=edges), jnp.int32)
    receivers = jnp.asarray(rng.integers(0, nodes, size=edges), jnp.int32)
    scale = sized(size, small=1.0, large=(2 * features) ** -0.5)  # large: tanh not saturated
    params = {"edge": jnp.asarray(scale * rng.normal(size=(2 * features, features)), jnp.float32),
              "node": jnp.asarray(scale * rng.normal(size=(2 * features, features)), jnp.float32)}

    def message_passing(params, x):
        # jraph's GraphNetwork: edge update, segment_sum to receivers, node update
        messages = jax.nn.relu(jnp.concatenate([x[senders], x[receivers]], -1) @ params["edge"])
        incoming = jax.ops.segment_sum(messages, receivers, num_segments=nodes)
        degree = jax.ops.segment_sum(jnp.ones(edges), receivers, num_segments=nodes)
        x = jnp.tanh(jnp.concatenate([x, incoming / jnp.maximum(degree, 1)[:, None]], -1)
                     @ params["node"])
        return jnp.sum(jax.ops.segment_max(x, jnp.arange(nodes) % 2, num_segments=2) ** 2)

    x = jnp.asarray(rng.normal(size=(nodes, features)), jnp.float32)
    return jax.value_and_grad(message_passing), (params, x)


@program("fori_loop_training_100_steps", "jax", rtol=1e-4, atol=1e-5)
def fori_loop_training_100_steps(size):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    n, features = sized(size, small=(32, 4), large=(512, 256))
    x = rng.normal(size=(n, features)).astype(np.float32)
    if size == "small":
        true_w = np.array([[1.0], [-2.0], [0.5], [3.0]])
    else:
        true_w = rng.normal(size=(features, 1)) / np.sqrt(features)
    y = (x @ true_w + 0.7).astype(np.float32)
    params = {"w": np.zeros((features, 1), np.float32), "b": np.zeros((1,), np.float32)}

    def loss(params, x, y):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    def train(params, x, y):
        def body(i, params):
            grads = jax.grad(loss)(params, x, y)
            return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)

        params = jax.lax.fori_loop(0, 100, body, params)
        return params, loss(params, x, y)

    return train, (params, x, y)
