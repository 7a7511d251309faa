"""The callback placement tier: the cases of tests/callback_gen/cases.py through
juju, compared with jax.jit.

    python3 dev.py callbacks                       # every case (the full run)
    python -m tests.callback_gen.run --slice       # CI's slice
    python -m tests.callback_gen.run --match 'grad/jit' --report cb.txt
    python -m tests.callback_gen.run --rerun cb.txt  # the listed ones, after a fix

For each case: jax.jit runs it with the quiet threshold (its values, its
host calls, its printed lines), and, for the kinds with a guard, with the
firing one (the exception type). A case jax rejects while tracing must be
rejected by juju with the same exception type. Otherwise juju lowers it (a
rule that raises is that case's failure); the lowered cases compile together
in batches with `juju.compile_all` (halved down to the culprit on a MAX
error); then each runs and is compared: the same values, shapes and dtypes,
the same host calls with the same operands (in the same order for ordered
io_callbacks, as a multiset for the rest: XLA does not order them), the same
printed lines, and the same exception type when a guard fires.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import fnmatch
import io
import sys
import time
import traceback

import jax
import numpy as np

import juju
from tests.callback_gen import cases as C
from tests.util import assert_same


@dataclasses.dataclass
class Outcome:
    case: C.Case
    status: str = "pending"  # pass | fail | rejected (by jax, and by juju alike)
    stage: str = ""
    detail: str = ""
    expected: tuple | None = None  # (values, calls, printed lines)
    fired: tuple | None = None  # what jax.jit raises when the guard fires (exception_type)
    reference: str = ""  # how the expected results were computed, where not by jax.jit
    lowered: object = None
    fn: object = None

    def fail(self, stage: str, error: BaseException | str) -> None:
        self.status, self.stage = "fail", stage
        self.detail = error if isinstance(error, str) else "".join(
            traceback.format_exception_only(error)).strip()[:2000]


def observe(fn, x, t):
    """(result, host calls, printed lines) of `fn(x, t)`."""
    C.CALLS.clear()
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        result = jax.block_until_ready(fn(x, t))
        jax.effects_barrier()
    return result, list(C.CALLS), text.getvalue().splitlines()


GUARD_ERRORS = ("GuardFired", "_EquinoxRuntimeError")  # what the guards raise on the host


def exception_type(fn, x, t):
    """The type of what `fn(x, t)` raises, with the name of the guard's own
    error where its text shows one (None: nothing raised)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            jax.block_until_ready(fn(x, t))
            jax.effects_barrier()
    except Exception as exc:
        shown = [name for name in GUARD_ERRORS if name in str(exc)]
        return (type(exc), *shown)
    return None


def _prepare(outcome: Outcome) -> None:
    case = outcome.case
    fn = case.function()
    try:
        jax.make_jaxpr(fn)(C.X, C.T_QUIET)
    except Exception as exc:  # jax rejects the case: juju must, alike
        outcome.status, outcome.detail = "rejected", f"{type(exc).__name__}: {exc}"[:300]
        try:
            juju.jit(fn, tiered=False).lower(C.X, C.T_QUIET)
        except type(exc):
            return
        except Exception as mine:
            outcome.fail("reject", f"jax.jit raised {type(exc).__name__}, juju "
                                   f"{type(mine).__name__}: {mine}"[:2000])
            return
        outcome.fail("reject", f"jax.jit raised {type(exc).__name__}, juju lowered it")
        return
    reference = _reference(outcome, fn)
    try:
        outcome.expected = observe(reference, C.X, C.T_QUIET)
    except Exception:  # a case that only fails at run time: juju must too
        outcome.fired = _failure(outcome, C.T_QUIET)
    if case.fires:
        outcome.fired = _failure(outcome, C.T_FIRE)
    try:
        outcome.fn = juju.jit(fn, tiered=False)
        outcome.lowered = outcome.fn.lower(C.X, C.T_QUIET)
    except Exception as exc:
        outcome.fail("lower", exc)


def _reference(outcome: Outcome, fn):
    """jax.jit of `fn`; where jax.jit traces the case but cannot lower it
    (an ordered io_callback in a linear_call: jax's lowering loses its
    effect token, a KeyError), jax's own evaluation without jit."""
    try:
        jax.jit(fn).lower(C.X, C.T_QUIET)
    except Exception as exc:
        outcome.reference = f"eager (jax.jit fails to lower it: {type(exc).__name__})"

        def eager(x, t):
            with jax.disable_jit():
                return fn(x, t)

        return eager
    return jax.jit(fn)


def _failure(outcome: Outcome, t):
    """What jax.jit raises at threshold `t`, from a fresh function (its
    first call takes jax.jit's Python dispatch, JaxRuntimeError); evaluated
    without jit, a callback's error is raised as it is, which jax.jit would
    raise as a JaxRuntimeError naming it."""
    fresh = _reference(outcome, outcome.case.function())
    found = exception_type(fresh, C.X, t)
    if found and outcome.reference and found[0].__name__ in GUARD_ERRORS:
        return (jax.errors.JaxRuntimeError, found[0].__name__)
    return found


def _compile(batch: list[Outcome], log) -> None:
    """Compile `batch` together; on a MAX error, halve until the culprit is alone."""
    try:
        juju.compile_all([o.lowered for o in batch])
        return
    except Exception as exc:
        if len(batch) == 1:
            batch[0].fail("compile", exc)
            log(f"compile failed: {batch[0].case.name}")
            return
    middle = len(batch) // 2
    _compile(batch[:middle], log)
    _compile(batch[middle:], log)


def _check(outcome: Outcome) -> None:
    case = outcome.case
    if outcome.expected is None:
        _check_raises(outcome, C.T_QUIET)
        return
    want, want_calls, want_text = outcome.expected
    try:
        got, got_calls, got_text = observe(outcome.fn, C.X, C.T_QUIET)
    except Exception as exc:
        outcome.fail("run", exc)
        return
    try:
        jax.tree.map(assert_same, got, want)
        assert sorted(got_text) == sorted(want_text), f"printed {got_text} != {want_text}"
        if case.ordered:
            _same_calls(got_calls, want_calls)
        _same_calls(sorted(got_calls, key=_call_key), sorted(want_calls, key=_call_key))
    except AssertionError as exc:
        outcome.fail("compare", exc)
        return
    if case.fires:
        _check_raises(outcome, C.T_FIRE)
        return
    outcome.status = "pass"


def _check_raises(outcome: Outcome, t) -> None:
    """Pass if juju raises what jax.jit raised (`outcome.fired`) at threshold `t`."""
    got = exception_type(outcome.fn, C.X, t)
    if got == outcome.fired:
        outcome.status = "pass"
        return
    name = lambda k: "nothing" if k is None else " ".join(  # noqa: E731
        getattr(p, "__name__", p) for p in k)
    outcome.fail("fire", f"jax.jit raised {name(outcome.fired)}, juju {name(got)}")


def _call_key(call):
    return call[0], [(v.shape, np.round(v.astype(np.float64), 4).tobytes()) for v in call[1:]]


def _same_calls(got, want):
    tags = lambda calls: collections.Counter(c[0] for c in calls)  # noqa: E731
    assert [c[0] for c in got] == [c[0] for c in want], (
        f"host calls {dict(tags(got))} != jax.jit's {dict(tags(want))}")
    for g, w in zip(got, want):
        for gv, wv in zip(g[1:], w[1:], strict=True):
            assert gv.shape == wv.shape and gv.dtype == wv.dtype, (
                f"{g[0]} operand {gv.dtype}{gv.shape} != {wv.dtype}{wv.shape}")
            np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6, err_msg=g[0])


def run_cases(cases: list[C.Case], batch: int = 200, log=lambda m: None) -> list[Outcome]:
    """Every case's outcome; lowered and compiled `batch` cases at a time."""
    outcomes = [Outcome(c) for c in cases]
    start = time.perf_counter()
    for first in range(0, len(outcomes), batch):
        chunk = outcomes[first:first + batch]
        for o in chunk:
            _prepare(o)
        lowered = [o for o in chunk if o.lowered is not None]
        if lowered:
            _compile(lowered, log)
        for o in lowered:
            if o.status == "pending":
                _check(o)
            o.lowered = o.fn = None  # free the graphs and models
        counts = collections.Counter(o.status for o in outcomes[:first + len(chunk)])
        log(f"{first + len(chunk)}/{len(outcomes)} cases in "
            f"{time.perf_counter() - start:.0f} s: {dict(counts)}")
    return outcomes


def select(args) -> list[C.Case]:
    if args.slice:
        cases = C.ci_slice()
    else:
        cases = C.all_cases()
    if args.match:
        cases = [c for c in cases if fnmatch.fnmatch(c.name, f"*{args.match}*")]
    if args.rerun:
        with open(args.rerun) as f:
            wanted = {line.split()[0] for line in f if line.strip() and not line.startswith("#")}
        cases = [c for c in cases if c.name in wanted]
    return cases


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.callback_gen.run")
    parser.add_argument("--slice", action="store_true", help="only CI's slice")
    parser.add_argument("--match", help="only cases whose name holds this glob")
    parser.add_argument("--rerun", help="only the cases a --report file lists")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--report", help="write failing cases here, one a line")
    parser.add_argument("--list", action="store_true", help="print the cases and stop")
    args = parser.parse_args(argv)
    cases = select(args)
    if args.list:
        print("\n".join(c.name for c in cases))
        print(f"{len(cases)} cases")
        return 0
    print(f"[callbacks] {len(cases)} cases", flush=True)
    outcomes = run_cases(cases, args.batch, log=lambda m: print(f"[callbacks] {m}", flush=True))
    failed = [o for o in outcomes if o.status == "fail"]
    for o in failed:
        print(f"FAIL {o.case.name} at {o.stage}: {o.detail.splitlines()[0] if o.detail else ''}")
    counts = collections.Counter(o.status for o in outcomes)
    eager = sum(bool(o.reference) for o in outcomes)
    print(f"[callbacks] {len(outcomes)} cases: {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['rejected']} rejected by jax.jit and juju alike; {eager} compared with "
          "jax without jit (jax.jit cannot lower them)")
    if args.report:
        with open(args.report, "w") as f:
            for o in failed:
                f.write(f"{o.case.name} {o.stage}: {o.detail.splitlines()[0] if o.detail else ''}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
