"""Run real programs through juju and jax.jit and compare them, at each size.

    python -m tests.programs.runner [NAME ...] [--size=small|large] [--first-calls] [-v]

A case is a program at one size. Two ways to compile the cases:

- batched (CI's fast subset): every case that lowers is compiled in one
  `juju.compile_all` (one MAX compilation); if MAX rejects the batch, it is
  split in halves until the culprit is alone, so one program's MAX compile
  error fails only that program.
- first calls (`first_calls=True`, `dev.py programs`): each case is called
  once through `juju.jit(fn, tiered=False)` (trace, lower, compile or load
  from juju's cache, run, results to the host), timed, as `jax.jit`'s first
  call is; that call's result is the one compared.

Then each passing case is timed against `jax.jit` (steady state). The
report (tables side by side per size) is `tests/programs/report.py`.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import jax
import juju
import numpy as np

from tests.programs.registry import SIZES, Program, load_all


@dataclass
class Outcome:
    program: Program
    size: str = "small"
    status: str = "pending"  # pass | fail | skip
    stage: str = ""  # where it failed: build, reference, lower, compile, run, compare
    error: BaseException | None = None
    max_abs_error: float | None = None
    expected: Any = None
    got: Any = None
    fn: Any = None
    args: tuple = ()
    lowered: Any = None
    jitted: Any = None  # the juju.jit function that ran it
    backend: str = ""  # which back end ran it (report.backend)
    #: outputs outside the tolerance that a float64 run judged (`_arbitrate`)
    arbitrated: list = field(default_factory=list)
    float64_results: list | None = None  # computed on demand (`_float64_reference`)
    seconds: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """`program[size]`: the case's name in logs and reports."""
        return f"{self.program.name}[{self.size}]"

    def summary(self) -> str:
        if self.status == "pass":
            judged = "".join(f"; {note}" for note in self.arbitrated)
            return f"pass (max abs error {self.max_abs_error:.2e}{judged})"
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
        try:
            np.testing.assert_allclose(g, w, rtol=p.rtol, atol=p.atol, equal_nan=True,
                                       err_msg=f"{outcome.name}: output {i}")
        except AssertionError as error:
            if not _arbitrate(outcome, i, g, w):
                judged = "; ".join(outcome.arbitrated) or "no float64 reference"
                raise AssertionError(f"output {i}: {judged}\n{error}") from None
    outcome.max_abs_error = worst


def _arbitrate(outcome: Outcome, i: int, got, want) -> bool:
    """Whether output `i`, outside the elementwise tolerance, is still as
    accurate as jax.jit's. Two float32 programs summing in different orders
    differ by more than any fixed elementwise tolerance where a result
    cancels (a bias gradient summing to 1e-3 from terms of 10) or is divided
    by its own size (adam's first step turns a gradient of 1e-9 +- 1e-10
    into an update of lr * (0.99 +- 0.01)). Judged, in order:

    - normwise: the largest error within `atol + rtol * max|jax.jit's|`;
    - against the program run in float64 (float32 inputs widened): juju's
      largest error at most twice jax.jit's plus `atol`, where that run is
      a reference at all (jax.jit within 1% of its largest value: a program
      drawing random numbers draws others in float64)."""
    p = outcome.program
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return False
    finite = np.isfinite(want)
    if not np.array_equal(got[~finite], want[~finite]):
        return False
    g, w = got[finite].astype(np.float64), want[finite].astype(np.float64)
    error = float(np.abs(g - w).max(initial=0.0))
    bound = p.atol + p.rtol * float(np.abs(w).max(initial=0.0))
    if error <= bound:
        outcome.arbitrated.append(f"output {i} normwise: error {error:.2e} <= {bound:.2e}")
        return True
    exact = _float64_reference(outcome)
    if exact is None or i >= len(exact) or exact[i].shape != want.shape:
        return False
    r = exact[i][finite].astype(np.float64)
    err_juju, err_jax = float(np.abs(g - r).max(initial=0.0)), float(np.abs(w - r).max(initial=0.0))
    reference = err_jax <= 0.01 * float(np.abs(r).max(initial=0.0)) + p.atol
    judged = reference and err_juju <= 2.0 * err_jax + p.atol
    outcome.arbitrated.append(f"output {i} judged in float64: error juju {err_juju:.2e}, "
                              f"jax.jit {err_jax:.2e}" + ("" if judged else " (fails)"))
    return judged


def _float64_reference(outcome: Outcome):
    """The case's results computed by jax.jit with x64 and its float32
    inputs widened (None where that run fails or is not a float program)."""
    if outcome.float64_results is None:
        def widen(x):
            narrow = isinstance(x, (np.ndarray, jax.Array)) and x.dtype in NARROW_FLOATS
            return np.asarray(x, np.float64) if narrow else x
        try:
            with jax.enable_x64(True):
                args = jax.tree_util.tree_map(widen, outcome.args)
                outcome.float64_results = host_leaves(jax.jit(outcome.fn)(*args))
        except Exception:  # a program that runs only in float32
            outcome.float64_results = []
    return outcome.float64_results or None


NARROW_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def _fail(outcome: Outcome, stage: str, error: BaseException) -> None:
    outcome.status, outcome.stage, outcome.error = "fail", stage, error


def _prepare(outcome: Outcome) -> None:
    """Build the case and run `jax.jit` on it: the expected result, and
    jax.jit's first call (trace, compile, run, results to the host) timed."""
    try:
        outcome.fn, outcome.args = outcome.program.build(outcome.size)
    except ImportError as exc:
        outcome.status, outcome.stage, outcome.error = "skip", "build", exc
        return
    except Exception as exc:
        _fail(outcome, "build", exc)
        return
    start = time.perf_counter()
    try:
        outcome.expected = jax.jit(outcome.fn)(*outcome.args)
        host_leaves(outcome.expected)
    except Exception as exc:
        _fail(outcome, "reference", exc)
        return
    outcome.seconds["jax first call"] = time.perf_counter() - start


def _lower(outcome: Outcome) -> None:
    start = time.perf_counter()
    try:
        outcome.jitted = juju.jit(outcome.fn)
        lowered = outcome.jitted.lower(*outcome.args)  # every rule runs here, before compiling
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
            log(f"compile failed: {batch[0].name}: {_first_line(exc)}")
            return
    middle = len(batch) // 2
    _compile(batch[:middle], log)
    _compile(batch[middle:], log)


def _first_call(outcome: Outcome) -> None:
    """juju's first call, MAX only (`tiered=False`): trace, lower, compile
    (or load from juju's cache), run, results to the host; timed."""
    outcome.jitted = juju.jit(outcome.fn, tiered=False)
    start = time.perf_counter()
    try:
        outcome.got = outcome.jitted(*outcome.args)
        host_leaves(outcome.got)
    except Exception as exc:
        outcome.seconds["juju first call"] = time.perf_counter() - start
        _fail(outcome, _failed_stage(outcome), exc)
        return
    outcome.seconds["juju first call"] = time.perf_counter() - start


def _failed_stage(outcome: Outcome) -> str:
    """Where a first call failed: "run" once compiled, else "lower" where
    lowering fails again (tracing included), else "compile"."""
    if outcome.jitted.executables:
        return "run"
    try:
        outcome.jitted.lower(*outcome.args)
    except Exception:
        return "lower"
    return "compile"


def _run(outcome: Outcome) -> None:
    if outcome.got is None:
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
    brought to the host in both: the same work): at least 5 rounds (3 where
    a round takes over 2 s), up to 25 or ~`budget_s`."""
    mine, reference = outcome.jitted, jax.jit(outcome.fn)
    reference(*outcome.args)  # compiled by _prepare; warm both
    times: dict = {"juju": [], "jax": []}
    spent = 0.0
    for i in range(rounds):
        for name, fn in (("juju", mine), ("jax", reference)):
            start = time.perf_counter()
            host_leaves(fn(*outcome.args))
            times[name].append(time.perf_counter() - start)
            spent += times[name][-1]
        enough = 3 if spent > 2.0 * (i + 1) else 5
        if i + 1 >= enough and spent > budget_s:
            break
    for name, samples in times.items():
        outcome.seconds[name] = float(np.median(samples))


def warm_up() -> None:
    """Start what a process starts once, so that no program's first call
    pays for it: jax's backend, the packs' kernel libraries (built once per
    install), MAX's compile worker and a native program's build."""
    from juju import plugins

    for pack in plugins.packs():
        for name in pack.libraries:
            plugins.kernel_library_path(name)
    x = np.arange(4, dtype=np.float32)
    jax.jit(lambda x: x * 2.0)(x).block_until_ready()
    kernels = os.environ.get("JUJU_PROGRAM_KERNELS")
    try:
        for setting in ("0", "1"):  # a MAX graph, then a native program
            os.environ["JUJU_PROGRAM_KERNELS"] = setting
            juju.to_numpy(juju.jit(lambda x: x * 3.0 + 1.0, tiered=False)(x))
    finally:
        if kernels is None:
            os.environ.pop("JUJU_PROGRAM_KERNELS", None)
        else:
            os.environ["JUJU_PROGRAM_KERNELS"] = kernels


def run_programs(cases: list[tuple[Program, str]], log=lambda message: None,
                 first_calls: bool = False, done=lambda outcomes: None) -> dict[str, Outcome]:
    """Run `(program, size)` cases; outcomes by case name (`program[size]`).
    With `first_calls`, the large cases run first (the slow ones, and the
    measurement a cut-short run most needs), and `done(outcomes)` is called
    after each case (a long run leaves its report as it goes)."""
    from tests.programs.report import backend

    outcomes = {o.name: o for o in (Outcome(p, size) for p, size in cases)}
    if first_calls:
        warm_up()
        for o in sorted(outcomes.values(), key=lambda o: -SIZES.index(o.size)):
            _prepare(o)
            if o.status == "pending":
                _first_call(o)
            if o.status == "pending":
                _run(o)
            if o.jitted is not None and o.jitted.executables:
                o.backend = backend(o)
            elif o.stage == "compile":  # a native kernel that fails to build falls back to MAX
                o.backend = "MAX graph, not compiled"
            log(_progress(o))
            done(outcomes)
        return outcomes
    for o in outcomes.values():
        _prepare(o)
        if o.status == "pending":
            _lower(o)
        log(f"{o.name}: {o.status if o.status != 'pending' else 'lowered'}"
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
        if o.jitted.executables:
            o.backend = backend(o)
    return outcomes


def _progress(o: Outcome) -> str:
    s = o.seconds
    first = (f"; first call {s['juju first call']:.1f} s (jax.jit {s['jax first call']:.1f} s)"
             if "juju first call" in s else "")
    ratio = f", {s['juju'] / s['jax']:.2f}x jax.jit" if "juju" in s else ""
    where = f" [{o.backend}]" if o.backend else ""
    return f"{o.name}: {o.summary()}{ratio}{first}{where}"


def main(argv: list[str]) -> int:
    from tests.programs.report import report, write

    programs = load_all()
    names = [a for a in argv if not a.startswith("-")]
    sizes = [a.split("=", 1)[1] for a in argv if a.startswith("--size=")] or list(SIZES)
    chosen = [programs[n] for n in names] if names else list(programs.values())
    cases = [(p, size) for p in chosen for size in p.sizes if size in sizes]
    outcomes = run_programs(cases, log=lambda m: print(f"[programs] {m}", flush=True),
                            first_calls="--first-calls" in argv,
                            done=lambda found: write(report(found.values())))
    print()
    for o in outcomes.values():
        print(f"{o.name:40} {o.program.library:10} {o.summary()}")
        if o.status == "fail" and "-v" in argv:
            traceback.print_exception(o.error)
    print("\n".join(["", *report(outcomes.values())]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
