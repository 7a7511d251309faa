"""Memory with and without donation (issue 55). `python -m benchmarks.memory`.

1. One call of `x * 2 + 1` on a 1 GiB float32 argument: the process's peak
   resident memory during the call above what it held before the argument
   was made (Linux's VmHWM, reset with /proc/self/clear_refs). Each case
   runs in a fresh process, compiled ahead of the measurement: the argument
   a numpy or a jax array, donated or not, on MAX (`tiered=False`) or on the
   XLA tier's first call (`tiered=True`), and jax.jit for reference.
2. A training loop: an MLP's SGD step with momentum (params and velocity
   donated or not) for `--steps` steps; resident memory every 100 steps,
   for a step MAX runs as a graph (1024-wide layers) and one run natively
   as a generated kernel (32-wide layers).

Options: --gib (argument size), --steps, --only call|loop, --engines, --json FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

CALL = textwrap.dedent(
    """
    import json, os, sys
    os.environ["JUJU_PROGRAM_KERNELS"] = "0"
    import jax, jax.numpy as jnp, numpy as np, juju

    def status(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field)) / 1024

    engine, kind, donate, n = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
    f = lambda x: x * 2.0 + 1.0
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    options = dict(donate_argnums=0) if donate else {}
    if engine == "jax":
        fn = jax.jit(f, **options)
        fn.lower(spec).compile()
    else:
        fn = juju.jit(f, tiered=engine == "xla-tier", **options)
        if engine == "max":
            fn.lower(spec).compile()
        else:  # the XLA tier's jax.jit, compiled; MAX's compile not started
            jax.jit(f).lower(spec).compile()
    base = status("VmRSS")
    x = jnp.full((n,), 1.5, jnp.float32) if kind == "jax" else np.full(n, 1.5, np.float32)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the peak so far: what we hold now
    out = jax.block_until_ready(fn(x))  # jax.jit returns before it computes
    peak = status("VmHWM")
    value = float(juju.to_numpy(out)[-1]) if engine != "jax" else float(out[-1])
    assert value == 4.0, value
    print(json.dumps({"peak_mib": peak - base, "held_mib": status("VmRSS") - base}))
    os._exit(0)  # a background compile nobody waits for
    """
)

LOOP = textwrap.dedent(
    """
    import json, os, sys
    import jax, jax.numpy as jnp, numpy as np, juju

    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

    width, donate, steps = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
    os.environ["JUJU_PROGRAM_KERNELS"] = "1" if width <= 64 else "0"
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.05)
              for s in ((width, width), (width,), (width, width), (width,))]
    velocity = [jnp.zeros_like(p) for p in params]
    batch = jnp.asarray(rng.standard_normal((32, width)).astype(np.float32))

    def step(params, velocity, batch):  # SGD with momentum
        def loss(p):
            h = jnp.tanh(batch @ p[0] + p[1])
            return jnp.mean((h @ p[2] + p[3] - 1.0) ** 2)
        grads = jax.grad(loss)(params)
        velocity = [0.9 * v + g for v, g in zip(velocity, grads)]
        return [p - 0.01 * v for p, v in zip(params, velocity)], velocity, loss(params)

    fn = juju.jit(step, tiered=False, coerces_to_jnp=True,
                  **(dict(donate_argnums=(0, 1)) if donate else {}))
    params, velocity, _ = fn(params, velocity, batch)  # compile
    trace, start = [], rss()
    for i in range(1, steps + 1):
        params, velocity, loss = fn(params, velocity, batch)
        if i % 100 == 0:
            trace.append(round(rss() - start, 1))
    native = type(next(iter(fn.executables.values())).model).__name__ == "NativeProgram"
    print(json.dumps({"start_mib": start, "trace_mib": trace, "native": native,
                      "loss": float(loss)}))
    os._exit(0)
    """
)


def _run(script: str, *args) -> dict:
    env = dict(os.environ, JUJU_TIERED="0")
    result = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                            capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def calls(gib: float, engines=("max", "xla-tier", "jax")) -> list[dict]:
    n = int(gib * (1 << 30)) // 4
    rows = []
    for engine in engines:
        for kind in ("numpy", "jax"):
            for donate in (False, True):
                row = _run(CALL, engine, kind, int(donate), n)
                row.update(engine=engine, argument=kind, donated=donate)
                print(f"{engine:9s} {kind:6s} donated={donate!s:5s} peak above baseline "
                      f"{row['peak_mib'] / 1024:5.2f} GiB, held after {row['held_mib'] / 1024:5.2f} GiB",
                      flush=True)
                rows.append(row)
    return rows


def loops(steps: int) -> list[dict]:
    rows = []
    for width in (1024, 32):
        for donate in (False, True):
            row = _run(LOOP, width, int(donate), steps)
            row.update(width=width, donated=donate)
            print(f"MLP width {width:4d} ({'native kernel' if row['native'] else 'MAX graph'}) "
                  f"donated={donate!s:5s}: RSS {row['start_mib']:.0f} MiB after the first step, "
                  f"then + per 100 steps {row['trace_mib']}", flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--only", choices=("call", "loop"))
    parser.add_argument("--engines", default="max,xla-tier,jax",
                        help="of the call: max, xla-tier (the first call, tiered), jax")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results = {}
    if args.only in (None, "call"):
        results["calls"] = calls(args.gib, args.engines.split(","))
    if args.only in (None, "loop"):
        results["loops"] = loops(args.steps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
