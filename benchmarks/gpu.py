"""juju vs jax.jit on one GPU (issue 54): `python3 dev.py bench --set gpu`.

Both sides run on the same device with their inputs already there (jax
arrays put on the device, MAX buffers on the GPU); each figure is the median
of interleaved rounds, each sample a loop of calls closed by one device
synchronisation (`jax.block_until_ready`, `Accelerator.synchronize`), so
the two pipelines are timed alike. Results are compared with jax.jit's at the
GPU's tolerance (relative to each output's largest magnitude: TF32 products
on both sides, bfloat16 rounding). Memory-bound rows (softmax, an elementwise
chain) report GB/s against the chip's bandwidth, products TFLOP/s.

    python3 dev.py bench --set gpu                         # on the GPU machine
    python3 dev.py bench --set gpu --device cpu --small    # a dry run here
    python -m benchmarks.gpu --compile-only --with-tests   # the compile phase

The compile phase (`--compile-only`) lowers every row (and, with
`--with-tests`, every case of tests/test_gpu.py) and compiles them at once,
one graph per worker process (`JUJU_COMPILE_WORKERS`), into juju's
persistent cache, largest first; it also fills jax's persistent compilation
cache. The timing run then only loads. `--forms` adds bf16 products in the
`JUJU_GPU_MATMUL=tensor_cores` mode (docs/gpu.md), outside the geomean. With
`JUJU_GPU_VENDOR_BLAS=1` every product is MAX's vendor-BLAS one; the results
say so (`vendor_blas`).
`python3 dev.py gpu` runs both phases on the GPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

os.environ["JUJU_TIERED"] = "0"  # time MAX itself, never the XLA tier

import jax
import jax.numpy as jnp
import numpy as np

import juju
from juju import compile_pool
from juju.compile_worker import gpu_vendor_blas

from benchmarks.workloads import chain, matmul, mlp_step, rnn, softmax
from examples import models

HERE = Path(__file__).resolve().parent
F32, BF16 = np.float32, jnp.bfloat16

#: Memory bandwidth (GB/s, the vendors' datasheets) by a name in jax's
#: `device_kind`; KINDS.md measured ~4300 GB/s device-to-device on an H200.
BANDWIDTH_GBS = {"H200": 4800, "H100": 3350, "A100": 2039, "L40S": 864, "A10G": 600}


@dataclass
class Row:
    """One workload: `fn(*args)` timed under both; `flops` or `bytes` (moved,
    read plus written) turn times into TFLOP/s or GB/s; `form` is the
    `JUJU_GPU_MATMUL` it is lowered under (None: the default), rows with a
    form stay out of the geomean."""

    name: str
    fn: object
    args: tuple
    flops: float | None = None
    bytes: float | None = None
    tolerance: float = 1e-2
    form: str | None = None
    results: dict = field(default_factory=dict)


# --- the rows --------------------------------------------------------------------


def matmul_wt(a, b):
    return a @ b.T


def _block_forward(params, x, heads):
    return models.block_apply(params, x, heads=heads)


def _block_grad(params, x, heads):
    return jax.value_and_grad(
        lambda p: jnp.mean(models.block_apply(p, x, heads=heads) ** 2))(params)


def _cnn_grad(params, images, labels):
    return models.cnn_train_step(params, images, labels)


def _named(fn, name, **bound):
    partial = functools.partial(fn, **bound)
    partial.__name__ = partial.__qualname__ = name  # for juju's messages
    return partial


def rows(small: bool = False, forms: bool = False) -> list[Row]:
    """The issue's rows at their sizes, or tiny ones for a dry run (`small`)."""
    rng = np.random.default_rng(54)

    def r(*shape, dtype=F32, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    n = 256 if small else 4096
    out = []
    for dtype, label, tol in ((F32, "f32", 1e-2), (BF16, "bf16", 2e-2)):
        for m in (n, 16):
            shape = f"{m}x{n} @ {n}x{n}" + (" (decode)" if m == 16 else "")
            a, b = r(m, n, dtype=dtype), r(n, n, dtype=dtype)
            out.append(Row(f"matmul {label} {shape}", matmul, (a, b), flops=2.0 * m * n * n,
                           tolerance=tol))
            if forms and dtype is BF16:  # bf16 on MAX's tensor cores: w given as (N, K)
                out.append(Row(f"matmul bf16 {m}x{n} @ ({n}x{n}).T [tensor_cores]", matmul_wt,
                               (a, b), flops=2.0 * m * n * n, tolerance=tol,
                               form="tensor_cores"))

    batch, widths = (32, (64, 128, 128, 64)) if small else (512, (1024, 4096, 4096, 1024))
    # Biases start at 0.1, not 0: a zero bias's update is 0.01 x its gradient, a batch sum of
    # cancelling TF32 terms, which no two GPU libraries agree on to 1% of its largest value
    # (the H200 run of 2026-11-30: 8e-7 against 1.5e-5).
    params = [(r(a, b, scale=a ** -0.5), np.full(b, 0.1, F32)) for a, b in zip(widths, widths[1:])]
    onehot = np.eye(widths[-1], dtype=F32)[rng.integers(0, widths[-1], batch)]
    out.append(Row(f"MLP train step ({batch}, {'-'.join(map(str, widths))})", mlp_step,
                   (params, r(batch, widths[0]), onehot),
                   flops=6.0 * batch * sum(a * b for a, b in zip(widths, widths[1:]))))

    b, t, d, heads = (2, 32, 64, 4) if small else (8, 512, 768, 12)
    block = models.block_init(rng, d=d, heads=heads, hidden=4 * d)
    tokens = r(b, t, d)
    shape = f"{b}x{t}x{d}, {heads} heads, causal"
    out.append(Row(f"transformer block forward ({shape})",
                   _named(_block_forward, "transformer_block_forward", heads=heads),
                   (block, tokens)))
    out.append(Row(f"transformer block grad ({shape})",
                   _named(_block_grad, "transformer_block_grad", heads=heads), (block, tokens)))

    batch, image = (4, 16) if small else (64, 64)
    cnn = models.cnn_init(rng, channels=(3, 32, 64), image=image)
    images, labels = r(batch, image, image, 3), np.eye(10, dtype=F32)[rng.integers(0, 10, batch)]
    out.append(Row(f"CNN forward (NHWC {batch}x{image}x{image}x3)", models.cnn_apply,
                   (cnn, images)))
    out.append(Row(f"CNN grad + SGD step (NHWC {batch}x{image}x{image}x3)", _cnn_grad,
                   (cnn, images, labels)))

    rows_, cols = (256, 1024) if small else (16384, 4096)
    size = rows_ * cols * 4
    out.append(Row(f"softmax {rows_}x{cols} f32 ({size / 2**20:.0f} MiB)", softmax,
                   (r(rows_, cols),), bytes=2.0 * size))
    count = 2**16 if small else 2**26
    out.append(Row(f"elementwise chain 2^{int(math.log2(count))} f32 ({count * 4 / 2**20:.0f} MiB)",
                   chain, (r(count),), bytes=2.0 * count * 4))

    steps, batch, hidden, inputs = (16, 8, 32, 16) if small else (128, 64, 512, 256)
    out.append(Row(f"scan RNN ({steps} steps, batch {batch}, hidden {hidden})", rnn,
                   (r(hidden, hidden, scale=hidden ** -0.5), r(inputs, hidden, scale=inputs ** -0.5),
                    r(steps, batch, inputs))))

    try:
        from benchmarks.programs import flax_cnn_train_step

        step, args = flax_cnn_train_step()
        args = jax.tree_util.tree_map(np.asarray, args)
        out.append(Row("flax CNN train step (adam, 64x28x28)", step, args, tolerance=2e-2))
    except ImportError as exc:  # flax/optax missing: the row says so
        out.append(Row("flax CNN train step (adam, 64x28x28)", None, (str(exc),)))
    return out


# --- devices ----------------------------------------------------------------------


@dataclass
class Device:
    """Where both sides run: the juju engine, the jax device, how to wait."""

    kind: str

    def __post_init__(self):
        self.engine = juju.gpu_engine() if self.kind == "gpu" else juju.cpu_engine()
        self.jax_device = jax.devices(self.kind)[0]

    @property
    def name(self) -> str:
        return getattr(self.jax_device, "device_kind", self.kind)

    def bandwidth_gbs(self) -> float | None:
        return next((v for k, v in BANDWIDTH_GBS.items() if k in self.name), None)

    def juju_inputs(self, args):
        """The arguments as MAX buffers on the engine's device."""
        from juju.buffers import host_buffer

        device = self.engine.device

        def put(leaf):
            array = np.ascontiguousarray(np.asarray(leaf))
            if array.ndim == 0:
                return array
            buffer = host_buffer(array)
            return buffer if self.kind == "cpu" else buffer.to(device)

        return jax.tree_util.tree_map(put, args)

    def jax_inputs(self, args):
        return jax.device_put(args, self.jax_device)

    def sync_juju(self, _out):
        if self.kind != "cpu":
            self.engine.device.synchronize()

    @staticmethod
    def sync_jax(out):
        jax.block_until_ready(out)


@contextlib.contextmanager
def matmul_form(form: str | None):
    """Lower under `JUJU_GPU_MATMUL=form` (None: as set; juju_ops_lax/dot.py)."""
    if form is None:
        yield
        return
    saved = os.environ.get("JUJU_GPU_MATMUL")
    os.environ["JUJU_GPU_MATMUL"] = form
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("JUJU_GPU_MATMUL", None)
        else:
            os.environ["JUJU_GPU_MATMUL"] = saved


def lower_rows(chosen: list[Row], device: Device) -> list:
    """(row, juju function, Lowered) of each row that lowers; a row that does
    not gets `results["skipped"]`."""
    lowered = []
    for row in chosen:
        if row.fn is None:
            row.results["skipped"] = row.args[0]
            continue
        jf = juju.jit(row.fn, engine=device.engine)
        try:
            with matmul_form(row.form):
                lowered.append((row, jf, jf.lower(*row.args)))
        except juju.JujuError as exc:
            row.results["skipped"] = str(exc).splitlines()[0]
    return lowered


def compile_timed(named_lowered: list[tuple[str, object]]) -> dict[str, float]:
    """Compile each `Lowered` as its own job, as many at once as juju has
    compile workers, into the persistent cache: the bench's rows first (its
    table is what a short GPU lease must bring back), then the tests' graphs,
    then the other matmul forms; largest graph first within each.
    Returns seconds per name (a cache hit: the load)."""
    workers = compile_pool.workers()

    def priority(item):
        name, low = item
        return (name.startswith("test_gpu "), "[" in name, -len(low.as_text()))

    order = sorted(named_lowered, key=priority)
    seconds = {}

    def one(item):
        name, low = item
        start = time.perf_counter()
        try:
            juju.compile_all([low])
        except juju.JujuError as exc:
            print(f"compile failed: {name}: {str(exc).splitlines()[0]}", flush=True)
            return name, float("nan")
        return name, time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for name, took in pool.map(one, order):
            seconds[name] = took
            print(f"  compiled {name}: {took:.1f} s", flush=True)
    return seconds


def enable_jax_cache() -> None:
    """jax's persistent compilation cache (`JAX_COMPILATION_CACHE_DIR`), so
    the timing run does not wait for XLA either."""
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if folder:
        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


# --- timing ------------------------------------------------------------------------


def _per_call(fn, sync, loops: int) -> float:
    start = time.perf_counter()
    out = None
    for _ in range(loops):
        out = fn()
    sync(out)
    return (time.perf_counter() - start) / loops


def _loops(fn, sync, sample_s: float) -> int:
    for _ in range(2):
        sync(fn())
    once = _per_call(fn, sync, 3)
    return max(1, min(1000, int(sample_s / max(once, 1e-7))))


def time_pair(first, second, repeats: int, settle_s: float, sample_s: float):
    """Median seconds per call of each (fn, sync) pair, in interleaved rounds."""
    loops = [_loops(fn, sync, sample_s) for fn, sync in (first, second)]
    samples = ([], [])
    for _ in range(repeats):
        for (fn, sync), n, out in zip((first, second), loops, samples):
            time.sleep(settle_s)
            out.append(_per_call(fn, sync, n))
    return statistics.median(samples[0]), statistics.median(samples[1])


def _leaves(tree):
    from juju.buffers import to_numpy

    return [to_numpy(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


def compare(got, want, tolerance: float) -> str | None:
    """None when `got` (juju) matches `want` (jax.jit): same structure,
    shapes and dtypes, NaNs at the same places and every other element
    within `tolerance` of the output's largest magnitude; else what differs."""
    if jax.tree_util.tree_structure(got) != jax.tree_util.tree_structure(want):
        return "different pytrees"
    for i, (g, w) in enumerate(zip(_leaves(got), _leaves(want))):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
        g, w = g.astype(np.float64), w.astype(np.float64)
        if not np.array_equal(np.isnan(g), np.isnan(w)):
            return f"output {i}: NaNs differ"
        finite = ~np.isnan(w)
        scale = float(np.max(np.abs(w[finite]), initial=0.0)) or 1.0
        error = float(np.max(np.abs(g[finite] - w[finite]), initial=0.0))
        if not error <= tolerance * scale:
            return f"output {i}: max error {error:.3g} > {tolerance} x {scale:.3g}"
    return None


def measure(row: Row, jf, device: Device, repeats: int) -> dict:
    jax_args, juju_args = device.jax_inputs(row.args), device.juju_inputs(row.args)
    xla = jax.jit(row.fn)  # runs where its (committed) arguments are
    want = xla(*jax_args)
    jax.block_until_ready(want)
    got = jf(*juju_args)
    device.sync_juju(got)
    mismatch = compare(got, want, row.tolerance)
    on_gpu = device.kind != "cpu"
    t_jax, t_juju = time_pair(
        (lambda: xla(*jax_args), device.sync_jax),
        (lambda: jf(*juju_args), device.sync_juju),
        repeats, settle_s=0.05 if on_gpu else 0.2, sample_s=0.02 if on_gpu else 0.05)
    result = {"jax_s": t_jax, "juju_s": t_juju, "ratio": t_juju / t_jax,
              "matches": mismatch is None}
    if mismatch:
        result["mismatch"] = mismatch
    if row.flops:
        result["jax_tflops"], result["juju_tflops"] = row.flops / t_jax / 1e12, row.flops / t_juju / 1e12
    if row.bytes:
        result["jax_gbs"], result["juju_gbs"] = row.bytes / t_jax / 1e9, row.bytes / t_juju / 1e9
    return result


def format_row(row: Row) -> str:
    r = row.results
    if "skipped" in r:
        return f"{row.name:<58} skipped: {r['skipped'][:80]}"
    rate = ""
    if "juju_tflops" in r:
        rate = f"  {r['juju_tflops']:7.1f} / {r['jax_tflops']:7.1f} TFLOP/s"
    elif "juju_gbs" in r:
        rate = f"  {r['juju_gbs']:7.0f} / {r['jax_gbs']:7.0f} GB/s"
    flag = "" if r["matches"] else f"  MISMATCH ({r['mismatch']})"
    return (f"{row.name:<58} jax {r['jax_s'] * 1e3:8.3f} ms  juju {r['juju_s'] * 1e3:8.3f} ms"
            f"  ratio {r['ratio']:6.2f}{rate}{flag}")


def geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def _versions() -> dict:
    from importlib import metadata

    found = {}
    for name in ("max", "jax", "jaxlib"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


# --- main ---------------------------------------------------------------------------


def test_gpu_lowered(keyword: str = ""):
    """tests/test_gpu.py's cases, lowered as its fixture lowers them; with a
    pytest -k expression of plain words joined by `or`, those it selects."""
    from tests import test_gpu

    words = [w.strip() for w in keyword.split(" or ") if w.strip()]
    return [(name, low) for name, low in test_gpu.lowered_cases()
            if not words or any(w in name for w in words)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (a dry run)")
    parser.add_argument("--forms", action="store_true", help="matmuls in the other forms too")
    parser.add_argument("--only", default="", help="rows whose name contains one of these (a,b)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--with-tests", action="store_true",
                        help="with --compile-only: tests/test_gpu.py's graphs too")
    parser.add_argument("--tests-k", default="",
                        help="with --with-tests: the cases a pytest -k expression selects")
    parser.add_argument("--json", type=Path, default=HERE / "gpu-results.json")
    args = parser.parse_args(argv)
    enable_jax_cache()
    device = Device(args.device)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    chosen = [row for row in rows(args.small, args.forms)
              if not wanted or any(w in row.name for w in wanted)]
    print(f"juju vs jax.jit on {device.name} ({args.device}); jax {jax.__version__}, "
          f"max {_versions()['max']}, {len(chosen)} rows", flush=True)
    start = time.perf_counter()
    lowered = lower_rows(chosen, device)
    if args.compile_only:
        named = [(row.name, low) for row, _, low in lowered]
        if args.with_tests:
            named += [(f"test_gpu {name}", low) for name, low in test_gpu_lowered(args.tests_k)]
        print(f"lowered {len(named)} graphs in {time.perf_counter() - start:.1f} s; compiling "
              f"with {compile_pool.workers()} workers", flush=True)
        start = time.perf_counter()
        seconds = compile_timed(named)
        total = time.perf_counter() - start
        print(f"compiled {len(named)} graphs in {total:.1f} s", flush=True)
        _warm_jax(lowered, device)
        args.json.with_suffix(".compile.json").write_text(json.dumps(
            {"total_s": total, "per_graph_s": seconds, "workers": compile_pool.workers()},
            indent=2))
        return 0 if all(v == v for v in seconds.values()) else 1
    seconds = compile_timed([(row.name, low) for row, _, low in lowered])
    for row, jf, _ in lowered:
        row.results.update(measure(row, jf, device, args.repeats))
        row.results["first_call_s"] = seconds.get(row.name)
        print(format_row(row), flush=True)
    return report(chosen, device, args.json)


def _warm_jax(lowered, device: Device) -> None:
    """Compile each row under jax.jit too (its persistent cache keeps it)."""
    for row, _, _ in lowered:
        start = time.perf_counter()
        jax.jit(row.fn).lower(*device.jax_inputs(row.args)).compile()
        print(f"  jax.jit compiled {row.name}: {time.perf_counter() - start:.1f} s", flush=True)


def report(chosen: list[Row], device: Device, path: Path) -> int:
    measured = [row for row in chosen if "ratio" in row.results]
    core = [row for row in measured if row.form is None]
    mean = geomean(row.results["ratio"] for row in core)
    bandwidth = device.bandwidth_gbs()
    print(f"\ngeomean juju/jax over {len(core)} rows: {mean:.2f} (goal <= 1.0, none above 1.5)")
    if bandwidth:
        for row in core:
            if "juju_gbs" in row.results:
                row.results["juju_of_peak"] = row.results["juju_gbs"] / bandwidth
                row.results["jax_of_peak"] = row.results["jax_gbs"] / bandwidth
    data = {
        "chip": device.name, "device": device.kind, "bandwidth_gbs": bandwidth,
        "date": datetime.date.today().isoformat(), "versions": _versions(),
        "vendor_blas": gpu_vendor_blas(), "geomean": mean, "rows": [{"name": row.name, "form": row.form, **row.results}
                                  for row in chosen],
    }
    path.write_text(json.dumps(data, indent=2))
    print(f"wrote {path}")
    failed = [row.name for row in measured if not row.results["matches"]]
    if failed:
        print(f"MISMATCH in {len(failed)} rows: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
