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

Then the compile workers (juju/compile_pool.py), each in a process of its own
with empty caches: `compile_all` of the four programs with one worker and
with one per core (the parallel figure), and the cost a worker adds to one
graph, measured where MAX's own disk cache holds the graph (so that the
compile itself is short): compiled in the caller (`JUJU_COMPILE_IN_PROCESS`),
in a new worker, in a worker already running, and a second process loading
it from juju's cache.
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

    from benchmarks import first_call, workloads
    from benchmarks.programs import transformer_block, transformer_block_arguments

    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731

    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)]
    return {
        "MLP SGD step (784-512-256-10, batch 128)": (first_call.mlp_step, first_call.arguments()),
        "transformer block forward (4x128x256, 8 heads)": (
            transformer_block, transformer_block_arguments(rng)),
        "CNN training step (2 convs, batch 128, 32x32)": (
            workloads.cnn_step,
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
    # The defaults are what a new user gets (dev.py bench sets 0, and this child inherits it).
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


def measure_compile_all(workers: int) -> dict:
    """The child: the four programs in one `compile_all`, caches empty."""
    import juju

    os.environ["JUJU_COMPILE_WORKERS"] = str(workers)
    lowered = [juju.jit(fn).lower(*args) for fn, args in programs().values()]
    start = time.perf_counter()
    juju.compile_all(lowered)
    return {"workers": workers, "compile_all_s": time.perf_counter() - start}


def measure_overhead() -> dict:
    """The child: one graph compiled again and again with MAX's disk cache
    warm and juju's off, in the caller and in workers; then loaded by a
    second process from juju's cache."""
    import juju
    from benchmarks.first_call import arguments, mlp_step

    args = arguments()

    def compile_once() -> float:
        start = time.perf_counter()
        juju.jit(mlp_step).lower(*args).compile()  # a new function: no jit cache hit
        return time.perf_counter() - start

    os.environ["JUJU_DISABLE_CACHE"] = "1"
    os.environ["JUJU_COMPILE_IN_PROCESS"] = "1"
    compile_once()  # warms MAX's disk cache
    in_process = statistics.median(compile_once() for _ in range(3))
    del os.environ["JUJU_COMPILE_IN_PROCESS"]
    from juju import compile_pool

    compile_pool.shutdown()
    new_worker = compile_once()
    reused_worker = statistics.median(compile_once() for _ in range(3))
    del os.environ["JUJU_DISABLE_CACHE"]
    compile_once()  # into juju's cache
    code = ("import time; t = time.perf_counter(); import juju\n"
            "from benchmarks.first_call import arguments, mlp_step\n"
            "juju.jit(mlp_step).lower(*arguments()).compile()\n"
            "print(time.perf_counter() - t)")
    loads = [float(subprocess.run([sys.executable, "-c", code], cwd=HERE.parent, check=True,
                                  capture_output=True, text=True).stdout.split()[-1])
             for _ in range(3)]
    return {"in_process_s": in_process, "new_worker_s": new_worker,
            "reused_worker_s": reused_worker, "cached_new_process_s": statistics.median(loads)}


def _child(args: list[str]) -> dict:
    """Run `benchmarks.cold_start ARGS` in a process with empty caches."""
    with tempfile.TemporaryDirectory(prefix="juju-cold-") as scratch:
        env = dict(os.environ, XDG_CACHE_HOME=f"{scratch}/xdg",
                   JUJU_CACHE_DIR=f"{scratch}/juju", PYTHONUNBUFFERED="1")
        done = subprocess.run([sys.executable, "-m", "benchmarks.cold_start", *args],
                              cwd=HERE.parent, env=env, capture_output=True, text=True)
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not found:
        print(done.stdout[-2000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        raise SystemExit(done.returncode or 1)
    return json.loads(found[-1][len("RESULT "):])


def workers_rows() -> dict:
    from juju import compile_pool

    cores = compile_pool.workers()
    print("[cold start] compile workers ...", flush=True)
    serial = _child(["--compile-all", "1"])
    parallel = _child(["--compile-all", str(cores)])
    overhead = _child(["--overhead"])
    rows = {"compile_all_4": [serial, parallel], "worker_overhead": overhead}
    print(f"  compile_all of the {len(programs())} programs, cold: 1 worker "
          f"{serial['compile_all_s']:.1f} s, {cores} workers {parallel['compile_all_s']:.1f} s "
          f"({serial['compile_all_s'] / parallel['compile_all_s']:.2f}x)")
    print("  one graph (MLP step) with MAX's disk cache warm: in the caller "
          f"{overhead['in_process_s']:.2f} s, new worker {overhead['new_worker_s']:.2f} s, "
          f"running worker {overhead['reused_worker_s']:.2f} s; a new process loading it from "
          f"juju's cache {overhead['cached_new_process_s']:.2f} s (imports included)", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated substrings of names")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--compile-all", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--overhead", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-workers", action="store_true",
                        help="leave out the compile workers' rows")
    args = parser.parse_args(argv)
    if args.child or args.compile_all or args.overhead:
        result = (measure(args.child) if args.child else measure_compile_all(args.compile_all)
                  if args.compile_all else measure_overhead())
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    names = [n for n in programs() if not wanted or any(w in n for w in wanted)]
    rows = []
    for name in names:
        print(f"[cold start] {name} ...", flush=True)
        rows.append(_child(["--child", name]))
        print(format_row(rows[-1]), flush=True)
    report = {"programs": rows}
    if not args.no_workers and not wanted:
        report.update(workers_rows())
    (HERE / "cold_start.json").write_text(json.dumps(report, indent=2))
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
