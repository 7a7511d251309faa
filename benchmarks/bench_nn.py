"""Benchmark: juju (MAX) vs jax.jit on a CNN training step and a transformer
block (forward, and forward+backward), measured in the same run.

    python -m benchmarks.bench_nn [--repeats 50]     # from the repository root

Prints per-call medians (ms) and juju/jax ratios (< 1: juju is faster). The
first juju call of each function compiles (seconds, cached on disk); it is
excluded, like jax's first call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["JUJU_TIERED"] = "0"  # time MAX itself, never the XLA tier

import jax
import juju
import numpy as np

from examples import models


def median_ms(fn, repeats):
    time.sleep(1.0)  # let the other runtime's spinning worker threads park (see run.py)
    fn()  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    cnn_params = models.cnn_init(rng, image=28)
    images, labels = models.cnn_batch(rng, batch=args.batch, image=28)
    block_params = models.block_init(rng, d=128, heads=4, hidden=512)
    tokens = rng.normal(size=(args.batch // 4 or 1, 64, 128)).astype(np.float32)

    cases = [
        ("cnn train step", models.cnn_train_step, (cnn_params, images, labels)),
        ("transformer block fwd", models.block_apply, (block_params, tokens)),
        ("transformer block fwd+bwd", models.block_grad, (block_params, tokens)),
    ]
    jitted = [(name, juju.jit(f), jax.jit(f), a) for name, f, a in cases]
    start = time.perf_counter()
    juju.compile_all([jf.lower(*a) for _, jf, _, a in jitted])
    print(f"juju compile (all {len(cases)} graphs, one compile_all): "
          f"{time.perf_counter() - start:.1f} s")

    print(f"{'case':28s} {'juju ms':>10s} {'jax ms':>10s} {'juju/jax':>9s}")
    for name, jf, xf, a in jitted:
        jax_args = jax.device_put(a)
        t_juju = median_ms(lambda: jf(*a), args.repeats)
        t_jax = median_ms(lambda: jax.block_until_ready(xf(*jax_args)), args.repeats)
        print(f"{name:28s} {t_juju:10.3f} {t_jax:10.3f} {t_juju / t_jax:9.2f}")


if __name__ == "__main__":
    main()
