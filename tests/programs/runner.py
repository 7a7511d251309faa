"""Run real programs through juju and jax.jit and compare them.

    python -m tests.programs.runner [NAME ...]   # prints each program's status

All programs that lower are compiled together (`juju.compile_all`, one MAX
compilation); if MAX rejects the batch, it is split in halves until the
culprit is alone, so one program's MAX compile error fails only that program.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import jax
import juju
import numpy as np

from tests.programs.registry import Program, load_all


@dataclass
class Outcome:
    program: Program
    status: str = "pending"  # pass | fail | skip
    stage: str = ""  # where it failed: build, reference, lower, compile, run, compare
    error: BaseException | None = None
    max_abs_error: float | None = None
    expected: Any = None
    got: Any = None
    fn: Any = None
    args: tuple = ()
    lowered: Any = None
    seconds: dict = field(default_factory=dict)

    def summary(self) -> str:
        if self.status == "pass":
            return f"pass (max abs error {self.max_abs_error:.2e})"
        message = _first_line(self.error)
        return f"{self.status} at {self.stage}: {message}"


def _first_line(error) -> str:
    if error is None:
        return ""
    text = f"{type(error).__name__}: {error}"
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[:3])[:400]


def host_leaves(tree):
    """The leaves of a result as numpy arrays (PRNG keys as their key data)."""
    out = []
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype,
                                                                 jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out.append(juju.to_numpy(leaf))
    return out


def compare(outcome: Outcome) -> None:
    """Same tree, shapes, dtypes; values within the program's tolerance."""
    p = outcome.program
    got_tree = jax.tree_util.tree_structure(outcome.got)
    want_tree = jax.tree_util.tree_structure(outcome.expected)
    assert got_tree == want_tree, f"pytree {got_tree} != {want_tree}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(host_leaves(outcome.got), host_leaves(outcome.expected))):
        assert g.shape == w.shape, f"output {i}: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype} != {w.dtype}"
        if g.size:
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            both_nan = np.isnan(g64) & np.isnan(w64)
            diff = np.where(both_nan, 0.0, np.abs(g64 - w64))
            worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max()))
        outcome.max_abs_error = worst
        np.testing.assert_allclose(g, w, rtol=p.rtol, atol=p.atol, equal_nan=True,
                                   err_msg=f"{p.name}: output {i}")
    outcome.max_abs_error = worst


def _fail(outcome: Outcome, stage: str, error: BaseException) -> None:
    outcome.status, outcome.stage, outcome.error = "fail", stage, error


def _prepare(outcome: Outcome) -> None:
    p = outcome.program
    try:
        outcome.fn, outcome.args = p.build()
    except ImportError as exc:
        outcome.status, outcome.stage, outcome.error = "skip", "build", exc
        return
    except Exception as exc:
        _fail(outcome, "build", exc)
        return
    try:
        outcome.expected = jax.block_until_ready(jax.jit(outcome.fn)(*outcome.args))
    except Exception as exc:
        _fail(outcome, "reference", exc)
        return
    start = time.perf_counter()
    try:
        lowered = juju.jit(outcome.fn).lower(*outcome.args)
        lowered.build_graph()  # every rule runs here, before any compilation
        outcome.lowered = lowered
    except Exception as exc:
        _fail(outcome, "lower", exc)
    outcome.seconds["lower"] = time.perf_counter() - start


def _compile(batch: list[Outcome], log) -> None:
    """Compile `batch` together; on a MAX error, halve until the culprit is alone."""
    start = time.perf_counter()
    try:
        juju.compile_all([o.lowered for o in batch])
        log(f"compiled {len(batch)} program(s) in {time.perf_counter() - start:.0f} s")
        return
    except Exception as exc:
        if len(batch) == 1:
            _fail(batch[0], "compile", exc)
            log(f"compile failed: {batch[0].program.name}: {_first_line(exc)}")
            return
    middle = len(batch) // 2
    _compile(batch[:middle], log)
    _compile(batch[middle:], log)


def _run(outcome: Outcome) -> None:
    try:
        outcome.got = outcome.lowered.jit_function(*outcome.args)
    except Exception as exc:
        _fail(outcome, "run", exc)
        return
    try:
        compare(outcome)
    except AssertionError as exc:
        _fail(outcome, "compare", exc)
        return
    outcome.status = "pass"
    _time(outcome)


def _time(outcome: Outcome, rounds: int = 25, budget_s: float = 4.0) -> None:
    """Steady-state medians of juju and jax.jit, interleaved rounds (results
    brought to the host in both: the same work)."""
    mine, reference = outcome.lowered.jit_function, jax.jit(outcome.fn)
    reference(*outcome.args)  # compiled by _prepare; warm both
    times: dict = {"juju": [], "jax": []}
    spent = 0.0
    for i in range(rounds):
        for name, fn in (("juju", mine), ("jax", reference)):
            start = time.perf_counter()
            host_leaves(fn(*outcome.args))
            times[name].append(time.perf_counter() - start)
            spent += times[name][-1]
        if i >= 4 and spent > budget_s:
            break
    for name, samples in times.items():
        outcome.seconds[name] = float(np.median(samples))


RATIO_ROWS: list[str] = []  # the last run's ratio_table, for pytest's summary


def ratio_table(outcomes) -> list[str]:
    """Markdown rows: each passing program's steady-state time and ratio to
    jax.jit, and their geometric mean."""
    rows = ["| program | juju | jax.jit | juju / jax.jit |", "|---|---:|---:|---:|"]
    ratios = []
    for o in outcomes:
        if "juju" not in o.seconds:
            continue
        ratio = o.seconds["juju"] / o.seconds["jax"]
        ratios.append(ratio)
        rows.append(f"| `{o.program.name}` | {o.seconds['juju'] * 1e3:.3f} ms | "
                    f"{o.seconds['jax'] * 1e3:.3f} ms | {ratio:.2f} |")
    if ratios:
        geomean = float(np.exp(np.mean(np.log(ratios))))
        rows.append(f"| geomean of {len(ratios)} | | | **{geomean:.2f}** |")
    return rows


def run_programs(programs: list[Program], log=lambda message: None) -> dict[str, Outcome]:
    outcomes = {p.name: Outcome(p) for p in programs}
    for o in outcomes.values():
        _prepare(o)
        log(f"{o.program.name}: {o.status if o.status != 'pending' else 'lowered'}"
            + (f" ({_first_line(o.error)})" if o.error else ""))
    lowered = [o for o in outcomes.values() if o.lowered is not None]
    # Known gaps compile in a batch of their own: a MAX compile error among
    # them must not cost the passing programs a split and recompilation.
    for batch in ([o for o in lowered if not o.program.xfail],
                  [o for o in lowered if o.program.xfail]):
        if batch:
            _compile(batch, log)
    for o in lowered:
        if o.status == "pending":
            _run(o)
    return outcomes


def main(argv: list[str]) -> int:
    programs = load_all()
    chosen = [programs[n] for n in argv] if argv else list(programs.values())
    outcomes = run_programs(chosen, log=lambda m: print(f"[programs] {m}", flush=True))
    print()
    for o in outcomes.values():
        print(f"{o.program.name:32} {o.program.library:10} {o.summary()}")
        if o.status == "fail" and "-v" in sys.argv:
            traceback.print_exception(o.error)
    print("\n".join(["", *ratio_table(outcomes.values())]))
    return 0


if __name__ == "__main__":
    sys.exit(main([a for a in sys.argv[1:] if not a.startswith("-")]))
