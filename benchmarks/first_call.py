"""Time to first result: juju tiered vs juju MAX-only vs `jax.jit`, same run.

    python -m benchmarks.first_call [--cold]

For the MLP SGD step (784-512-256-10, batch 128): jax.jit's first call,
juju's tiered first call (XLA serves it while MAX compiles), the time until
MAX serves calls (`wait_compiled`), the cost of lowering the MAX graph once
(what "lower once" saves on a cache miss), and the steady state of each
tier. `--cold` points juju's and MAX's caches at new empty folders first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

if "--cold" in sys.argv:  # before MAX reads its cache location
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="juju-cold-")
    os.environ["JUJU_CACHE_DIR"] = tempfile.mkdtemp(prefix="juju-cold-")

import jax
import jax.numpy as jnp
import numpy as np

import juju
from juju import cache


def mlp_step(params, x, y):
    def loss(params):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(h @ w + b) * y, axis=-1))

    grads = jax.grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


def arguments():
    rng = np.random.default_rng(0)
    sizes = [784, 512, 256, 10]
    params = [(rng.standard_normal((a, b), dtype=np.float32) * 0.05,
               np.zeros(b, np.float32)) for a, b in zip(sizes, sizes[1:])]
    x = rng.standard_normal((128, 784), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)]
    return params, x, y


def steady(fn, n=20):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        jax.tree_util.tree_map(lambda o: o.to_numpy() if hasattr(o, "to_numpy") else
                               np.asarray(o), fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true")
    parser.parse_args()
    args = arguments()

    xla = jax.jit(mlp_step)
    start = time.perf_counter()
    jax.block_until_ready(xla(*args))
    t_jax = time.perf_counter() - start
    print(f"jax.jit first call: {t_jax:.3f} s", flush=True)

    f = juju.jit(mlp_step, tiered=True)
    start = time.perf_counter()
    jax.tree_util.tree_map(lambda o: o.to_numpy(), f(*args))
    returned = time.perf_counter()
    print(f"juju tiered first call: {returned - start:.3f} s "
          f"(ratio {(returned - start) / t_jax:.2f})", flush=True)
    if f.background:
        print(f"juju XLA tier per call: {steady(lambda: f(*args), 10) * 1e3:.2f} ms", flush=True)

    low = juju.jit(mlp_step, tiered=False).lower(*args)
    start = time.perf_counter()
    graph = low.build_graph()
    t_lower = time.perf_counter() - start
    start = time.perf_counter()
    cache.graph_key(graph, f.engine.description, low.kernel_paths)
    print(f"one lowering of the MAX graph: {t_lower:.3f} s (saved on each cache miss); "
          f"its key: {time.perf_counter() - start:.3f} s", flush=True)

    f.wait_compiled()
    print(f"MAX serves calls {time.perf_counter() - returned:.1f} s after the first call "
          f"returned; {f.xla_call_count} call(s) ran on XLA", flush=True)
    print(f"steady state: juju MAX {steady(lambda: f(*args)) * 1e3:.2f} ms, jax.jit "
          f"{steady(lambda: xla(*args)) * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
