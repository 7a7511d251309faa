"""Cold start: time to first result with empty caches, juju vs `jax.jit`.

    python3 dev.py bench --cold-start        # all programs
    python -m benchmarks.cold_start [--only NAME[,NAME]]

Each program runs in its own process whose MAX and juju caches are new empty
folders (`XDG_CACHE_HOME`, `JUJU_CACHE_DIR`), so no program profits from
another's compile. In that process, in this order: `jax.jit`'s first call;
juju's first call with the defaults (tiered: XLA answers while MAX compiles);
the time until MAX serves calls (`wait_compiled`, counted from the start of
juju's first call: the MAX-only cold compile plus tracing and lowering); then
the steady state of both, medians. Results go to benchmarks/cold_start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def programs():
    """name -> (function, arguments); built lazily (jax imports in the child)."""
    import jax.numpy as jnp
    import numpy as np

    from benchmarks import first_call, run
    from benchmarks.programs import transformer_block, transformer_block_arguments

    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731

    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)]
    return {
        "MLP SGD step (784-512-256-10, batch 128)": (first_call.mlp_step, first_call.arguments()),
        "transformer block forward (4x128x256, 8 heads)": (
            transformer_block, transformer_block_arguments(rng)),
        "CNN training step (2 convs, batch 128, 32x32)": (
            run.cnn_step,
            ([r(16, 3, 3, 3) * 0.1, r(32, 16, 3, 3) * 0.1, r(32 * 16 * 16, 10) * 0.01],
             r(128, 3, 32, 32), onehot)),
        "elementwise (cos of 23 floats)": (jnp.cos, (r(23),)),
    }


def _fetch(tree):
    import jax
    import juju

    return jax.tree_util.tree_map(juju.to_numpy, tree)


def _median_call(fn, args, n=15) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        _fetch(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str) -> dict:
    """The child: one program, caches empty (set by the parent)."""
    import jax
    import juju

    fn, args = programs()[name]
    # The defaults are what a new user gets (benchmarks.run's import sets 0).
    os.environ.pop("JUJU_TIERED", None)
    xla = jax.jit(fn)
    start = time.perf_counter()
    _fetch(xla(*args))
    jax_first = time.perf_counter() - start

    tiered = juju.jit(fn)  # the defaults: tiered on the CPU engine
    start = time.perf_counter()
    _fetch(tiered(*args))
    juju_first = time.perf_counter() - start
    tiered.wait_compiled()
    serves = time.perf_counter() - start
    time.sleep(1.0)  # let the other runtime's worker threads settle
    juju_steady = _median_call(tiered, args)
    time.sleep(1.0)
    jax_steady = _median_call(xla, args)
    return {"name": name, "jax_first_s": jax_first, "juju_first_s": juju_first,
            "max_serves_s": serves, "xla_calls": tiered.xla_call_count,
            "juju_steady_s": juju_steady, "jax_steady_s": jax_steady}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated substrings of names")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(measure(args.child)), flush=True)
        return 0

    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    names = [n for n in programs() if not wanted or any(w in n for w in wanted)]
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="juju-cold-") as scratch:
            env = dict(os.environ, XDG_CACHE_HOME=f"{scratch}/xdg",
                       JUJU_CACHE_DIR=f"{scratch}/juju", PYTHONUNBUFFERED="1")
            print(f"[cold start] {name} ...", flush=True)
            done = subprocess.run([sys.executable, "-m", "benchmarks.cold_start", "--child", name],
                                  cwd=HERE.parent, env=env, capture_output=True, text=True)
        found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not found:
            print(done.stdout[-2000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
            return done.returncode or 1
        rows.append(json.loads(found[-1][len("RESULT "):]))
        print(format_row(rows[-1]), flush=True)
    (HERE / "cold_start.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {HERE / 'cold_start.json'}")
    return 0


def format_row(row: dict) -> str:
    jf, first, serves = row["jax_first_s"], row["juju_first_s"], row["max_serves_s"]
    steady = row["juju_steady_s"] / row["jax_steady_s"]
    return (f"  first call: jax.jit {jf:.2f} s, juju {first:.2f} s (ratio {first / jf:.2f}); "
            f"MAX serves after {serves:.1f} s ({serves / jf:.0f}x jax's first call; "
            f"{row['xla_calls']} call(s) on XLA); steady juju {row['juju_steady_s'] * 1e3:.3f} ms, "
            f"jax.jit {row['jax_steady_s'] * 1e3:.3f} ms (ratio {steady:.2f})")


if __name__ == "__main__":
    sys.exit(main())
