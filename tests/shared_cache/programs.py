"""Programs that processes sharing one cache run at once (tests/shared_cache).

Each exercises a cache juju writes: a generated kernel run natively (a
shared library built by Mojo, its sources), a loop kernel inside a MAX graph
(a `.mojoc` package, then a MAX compile into a MEF with its index files),
and the bad-input cases of issue 55 (a negative-stride view,
a Fortran-order array, a reshape returned in a tuple, Python scalars), which
aborted processes that shared a cache.

`python -m tests.shared_cache.programs NAME,NAME,... [--exit-at-once]` runs
them in one process and prints one JSON line: per program whether juju's
result equals jax.jit's, then the MAX compiles and Mojo builds this process
did and every warning juju logged. `--exit-at-once` calls each program once
in the default (tiered) mode and exits while MAX compiles in the background,
as a short script does.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

rng = np.random.default_rng(55)
W = rng.standard_normal((192, 192)).astype(np.float32)
XS = rng.standard_normal((16, 8)).astype(np.float32)


def native_step(x, y):
    """Small and elementwise: one generated kernel, run without MAX."""
    return jnp.tanh(x * y) + jnp.sin(x) * 0.5


def loop_in_graph(w, xs):
    """A product too large for a kernel (a MAX op) and a scan whose body is
    a generated loop kernel (a custom op in the graph)."""
    h = jnp.tanh(w @ w)

    def body(c, x):
        c = jnp.cos(c) * 0.9 + x
        return c, c * 2.0

    c, ys = lax.scan(body, xs[0], xs)
    return h.sum(axis=0)[:8] + c, ys


def tuple_reshape(x):
    return (x.reshape(3, 4) * 2.0,)


def scale(x):
    return x * 3.0 - 1.0


def scalars(a, b):
    return a * b + 1


PROGRAMS = {
    "native": (native_step, lambda: (XS[0], XS[1])),
    "loop_in_graph": (loop_in_graph, lambda: (W, XS)),
    "negative_stride": (scale, lambda: (np.arange(12, dtype=np.float32)[::-1],)),
    "fortran_order": (scale, lambda: (np.asfortranarray(XS[:6, :4].copy()),)),
    "tuple_reshape": (tuple_reshape, lambda: (np.arange(12, dtype=np.float32),)),
    "scalars": (scalars, lambda: (2.0, 3)),
}


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.warnings: list[str] = []
        self.builds = 0

    def emit(self, record):
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            self.warnings.append(message)
        elif message.startswith("juju: built kernel library"):
            self.builds += 1


def check(names: list[str], exit_at_once: bool = False) -> dict:
    """Run `names` (keys of PROGRAMS) in this process; per program "ok" or
    what differs from jax.jit, the MAX compiles and Mojo builds done, and the
    warnings juju logged meanwhile."""
    import juju
    from juju import compile_pool
    from tests.util import assert_same

    records = _Records()
    logger = logging.getLogger("juju")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    compiles = []
    compile_jobs = compile_pool.compile_jobs

    def counted(jobs, session_of):
        compiles.extend(job.what for job in jobs)
        return compile_jobs(jobs, session_of)

    compile_pool.compile_jobs = counted
    results = {}
    try:
        for name in names:
            fn, make_args = PROGRAMS[name]
            arguments = make_args()
            out = juju.jit(fn, tiered=None if exit_at_once else False)(*arguments)
            try:
                assert_same(out, jax.jit(fn)(*arguments))
                results[name] = "ok"
            except AssertionError as exc:
                results[name] = f"wrong: {exc}"
    finally:
        compile_pool.compile_jobs = compile_jobs
        logger.removeHandler(records)
        logger.setLevel(level)
    return {"results": results, "compiles": len(compiles), "builds": records.builds,
            "warnings": records.warnings}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("names", help="comma-separated names of PROGRAMS")
    parser.add_argument("--exit-at-once", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(check(args.names.split(","), args.exit_at_once)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
