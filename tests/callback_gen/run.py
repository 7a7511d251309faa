"""The callback placement tier: the cases of tests/callback_gen/cases.py through
juju, compared with jax.jit.

    python3 dev.py callbacks                       # every case (the full run)
    python -m tests.callback_gen.run --slice       # CI's slice
    python -m tests.callback_gen.run --match 'grad/jit' --report cb.txt
    python -m tests.callback_gen.run --rerun cb.txt  # the listed ones, after a fix

A case jax rejects while tracing must be rejected by juju with the same
exception type. The others run side by side, `--batch` of them in one
program `(x, ts) -> [case_k(x, ts[k]) for k]` (MAX's compile cost is mostly
per graph, so a batch costs a few graphs instead of a few per case): jax.jit
runs it with every guard quiet (the values, the host calls and the printed
lines of each case, each tagged with its case), then once per case with a
guard, with that guard's threshold set to fire (the exception). juju lowers
the same program (a batch that fails to lower or to run is halved down to
the culprit), the lowered batches compile together with `juju.compile_all`,
and each case is compared: the same values, shapes and dtypes; the same host
calls with the same operands (in the same order for ordered io_callbacks,
the whole batch's, as a multiset for the rest: XLA does not order them); the
same printed lines; and, when its guard fires, the same exception type
(`JaxRuntimeError`: jax.jit's C++ fast path raises its text as ValueError,
see docs/callbacks.md) naming the guard's own error.

jax.jit cannot lower a few cases that it traces (an ordered io_callback in
a linear_call: its lowering loses the effect token, a KeyError); those are
compared with jax's evaluation without jit, in batches of their own.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import fnmatch
import io
import logging
import sys
import time
import traceback

import jax
import numpy as np

import juju
from tests.callback_gen import cases as C
from tests.util import assert_same

GUARD_ERRORS = ("GuardFired", "_EquinoxRuntimeError")  # what the guards raise on the host


@dataclasses.dataclass
class Outcome:
    case: C.Case
    # pass | fail | rejected (by jax.jit and juju alike) | unreferenced (jax
    # fails on it with an error of its own, with jit and without)
    status: str = "pending"
    stage: str = ""
    detail: str = ""
    eager: bool = False  # compared with jax without jit (jax.jit cannot lower it)

    def fail(self, stage: str, error: BaseException | str) -> None:
        self.status, self.stage = "fail", stage
        self.detail = error if isinstance(error, str) else "".join(
            traceback.format_exception_only(error)).strip()[:2000]


# --- one batch: the cases side by side in one program --------------------------------


@dataclasses.dataclass
class Batch:
    outcomes: list
    eager: bool = False
    fn: object = None  # juju's
    lowered: object = None
    expected: tuple | None = None  # jax's observe() of the quiet run
    fired: dict = dataclasses.field(default_factory=dict)  # case index -> failure()

    @property
    def cases(self):
        return [o.case for o in self.outcomes]

    def function(self):
        """`(x, ts) -> [case_k(x, ts[k])]`, built afresh (a fresh jax.jit cache)."""
        fns = [c.function(tag=str(k)) for k, c in enumerate(self.cases)]
        return lambda x, ts: [f(x, ts[k]) for k, f in enumerate(fns)]

    def reference(self):
        fn = self.function()
        if not self.eager:
            return jax.jit(fn)

        def eager(x, ts):
            with jax.disable_jit():
                return fn(x, ts)

        return eager

    def thresholds(self, firing: int | None = None):
        ts = np.full(len(self.outcomes), C.T_QUIET, np.float32)
        if firing is not None:
            ts[firing] = C.T_FIRE
        return ts


def observe(fn, *args):
    """(result, host calls, printed lines) of `fn(*args)`."""
    C.CALLS.clear()
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        result = jax.block_until_ready(fn(*args))
        jax.effects_barrier()
    return result, list(C.CALLS), text.getvalue().splitlines()


def failure(fn, *args):
    """What `fn(*args)` raises: its type (jax.jit's fast-path ValueError for
    a failing callback as the JaxRuntimeError it raises otherwise; a guard's
    own error, raised as it is without jit, as the JaxRuntimeError jax.jit
    raises for it) and the guard errors its text names; None if nothing."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            jax.block_until_ready(fn(*args))
            jax.effects_barrier()
    except Exception as exc:
        kind = type(exc)
        text = f"{kind.__name__}: {exc}"
        if "CpuCallback error" in str(exc) or kind.__name__ in GUARD_ERRORS:
            kind = jax.errors.JaxRuntimeError
        return kind, *[name for name in GUARD_ERRORS if name in text]
    return None


def _trace(outcome: Outcome) -> bool:
    """Whether the case runs side by side with others: jax traces and
    lowers it (or, where jax.jit cannot lower it, evaluates it without jit).
    A case jax rejects with a TypeError or ValueError, juju must reject
    alike; one where jax fails with an error of its own (a KeyError in its
    lowering, also without jit) has no reference."""
    fn = outcome.case.function()
    try:
        jax.make_jaxpr(fn)(C.X, C.T_QUIET)
    except Exception as exc:
        _reject_alike(outcome, fn, exc)
        return False
    try:
        jax.jit(fn).lower(C.X, C.T_QUIET)
        return True
    except Exception as exc:
        error = exc
    try:
        with contextlib.redirect_stdout(io.StringIO()), jax.disable_jit():
            jax.block_until_ready(fn(C.X, C.T_QUIET))
    except Exception as exc:
        if isinstance(error, (TypeError, ValueError)) and type(exc) is type(error):
            _reject_alike(outcome, fn, error)
        else:
            outcome.status = "unreferenced"
            outcome.detail = f"jax.jit: {type(error).__name__}: {error}"[:300]
        return False
    outcome.eager = True
    return True


def _reject_alike(outcome: Outcome, fn, exc: BaseException) -> None:
    """Pass if juju's lowering raises what jax raised (`exc`'s type)."""
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


def _prepare(batch: Batch) -> list[Batch]:
    """The reference results and juju's lowering of `batch`; the batches to
    compile (`batch` itself, or its halves where juju failed to lower it)."""
    reference = batch.reference()
    ts = batch.thresholds()
    try:
        batch.expected = observe(reference, C.X, ts)
    except Exception as exc:  # a case that fails with its guards quiet
        if len(batch.outcomes) > 1:
            return _split(batch, "reference", exc, _prepare)
        batch.fired[None] = failure(reference, C.X, ts)  # juju must fail alike
    for k, case in enumerate(batch.cases):
        if case.fires:
            batch.fired[k] = failure(reference, C.X, batch.thresholds(k))
    try:
        batch.fn = juju.jit(batch.function(), tiered=False)
        batch.lowered = batch.fn.lower(C.X, ts)
    except Exception as exc:
        return _split(batch, "lower", exc, _prepare)
    return [batch]


def _split(batch: Batch, stage: str, exc: BaseException, again) -> list:
    """`again` on each half of `batch`; a batch of one case fails."""
    if len(batch.outcomes) == 1:
        batch.outcomes[0].fail(stage, exc)
        return []
    middle = len(batch.outcomes) // 2
    halves = [Batch(batch.outcomes[:middle], batch.eager), Batch(batch.outcomes[middle:],
                                                                 batch.eager)]
    return [b for half in halves for b in again(half)]


def _compile(batches: list[Batch]) -> list[Batch]:
    """Compile `batches` together; on a MAX error, halve down to the culprit."""
    try:
        juju.compile_all([b.lowered for b in batches])
        return batches
    except Exception as exc:
        if len(batches) > 1:
            middle = len(batches) // 2
            return _compile(batches[:middle]) + _compile(batches[middle:])
        return _split(batches[0], "compile", exc,
                      lambda half: [b for p in _prepare(half) for b in _compile([p])])


def _check(batch: Batch) -> None:
    if batch.expected is None:  # one case, failing with its guards quiet
        _check_failure(batch, None)
        return
    try:
        got = observe(batch.fn, C.X, batch.thresholds())
    except Exception as exc:  # the culprit is found by halving
        for half in _split(batch, "run", exc, lambda h: [
                b for p in _prepare(h) for b in _compile([p])]):
            _check(half)
        return
    _compare(batch, got)
    for k in batch.fired:
        if batch.outcomes[k].status == "pending":
            _check_failure(batch, k)
    for outcome in batch.outcomes:
        if outcome.status == "pending":
            outcome.status = "pass"


def _check_failure(batch: Batch, k: int | None) -> None:
    """juju raises what jax raised with case `k`'s guard firing (None: the
    one case, its guards quiet)."""
    want = batch.fired[k]
    mine = failure(batch.fn, C.X, batch.thresholds(k))
    if mine != want:
        name = lambda f: "nothing" if f is None else " ".join(  # noqa: E731
            getattr(p, "__name__", p) for p in f)
        batch.outcomes[k or 0].fail("fire", f"jax.jit raised {name(want)}, juju {name(mine)}")
    elif k is None:
        batch.outcomes[0].status = "pass"


def _compare(batch: Batch, got) -> None:
    (want, want_calls, want_text), (mine, my_calls, my_text) = batch.expected, got
    ordered = lambda calls: [c for c in calls if c[1] == "io_ordered"]  # noqa: E731
    try:
        _same_calls(ordered(my_calls), ordered(want_calls))
        order = None
    except AssertionError as exc:
        order = f"the batch's ordered io_callbacks differ: {exc}"
    for k, outcome in enumerate(batch.outcomes):
        tag = str(k)
        mine_k = [c for c in my_calls if c[0] == tag]
        want_k = [c for c in want_calls if c[0] == tag]
        lines = lambda text: sorted(t for t in text if t.startswith(f"site {tag} "))  # noqa
        try:
            jax.tree.map(assert_same, mine[k], want[k])
            assert lines(my_text) == lines(want_text), (
                f"printed {lines(my_text)} != {lines(want_text)}")
            _same_calls(sorted(mine_k, key=_call_key), sorted(want_k, key=_call_key))
            if outcome.case.ordered:
                assert order is None, order
        except AssertionError as exc:
            outcome.fail("compare", exc)


def _call_key(call):
    return call[1], [(v.shape, np.round(v.astype(np.float64), 4).tobytes()) for v in call[2:]]


def _same_calls(got, want):
    names = lambda calls: dict(collections.Counter(c[1] for c in calls))  # noqa: E731
    assert [c[:2] for c in got] == [c[:2] for c in want], (
        f"host calls {names(got)} != jax.jit's {names(want)}")
    for g, w in zip(got, want):
        for gv, wv in zip(g[2:], w[2:], strict=True):
            assert gv.shape == wv.shape and gv.dtype == wv.dtype, (
                f"{g[1]} operand {gv.dtype}{gv.shape} != {wv.dtype}{wv.shape}")
            np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6, err_msg=g[1])


def run_cases(cases: list[C.Case], batch: int = 50, compile_together: int = 4,
              log=lambda m: None) -> list[Outcome]:
    """Every case's outcome: `batch` cases a program, `compile_together`
    programs a MAX compilation."""
    outcomes = [Outcome(c) for c in cases]
    traced = [o for o in outcomes if _trace(o)]
    groups = [[o for o in traced if not o.eager], [o for o in traced if o.eager]]
    batches = [Batch(g[i:i + batch], eager=g is groups[1])
               for g in groups for i in range(0, len(g), batch)]
    start, done = time.perf_counter(), 0
    for first in range(0, len(batches), compile_together):
        prepared = [p for b in batches[first:first + compile_together] for p in _prepare(b)]
        for b in _compile(prepared):
            _check(b)
            b.fn = b.lowered = None  # free the graphs and models
        done += sum(len(b.outcomes) for b in batches[first:first + compile_together])
        counts = collections.Counter(o.status for o in outcomes)
        log(f"{done}/{len(traced)} traced cases run in {time.perf_counter() - start:.0f} s: "
            f"{dict(counts)}")
    return outcomes


def select(args) -> list[C.Case]:
    cases = C.ci_slice() if args.slice else C.all_cases()
    if args.match:
        cases = [c for c in cases if fnmatch.fnmatch(c.name, f"*{args.match}*")]
    if args.rerun:
        with open(args.rerun) as f:
            wanted = {line.split()[0] for line in f if line.strip() and not line.startswith("#")}
        cases = [c for c in cases if c.name in wanted]
    if args.part:
        k, n = (int(x) for x in args.part.split("/"))
        if not 1 <= k <= n:
            raise SystemExit(f"--part {args.part}: K/N with 1 <= K <= N, e.g. 1/4")
        cases = cases[k - 1::n]  # every n-th: each part holds every kind and nest
    return cases


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.callback_gen.run")
    parser.add_argument("--slice", action="store_true", help="only CI's slice")
    parser.add_argument("--match", help="only cases whose name holds this glob")
    parser.add_argument("--rerun", help="only the cases a --report file lists")
    parser.add_argument("--part", metavar="K/N",
                        help="the K-th of N interleaved parts of the cases (a full run "
                             "made as N runs, each with its own --report)")
    parser.add_argument("--batch", type=int, default=50, help="cases a program")
    parser.add_argument("--report", help="write failing cases here, one a line")
    parser.add_argument("--list", action="store_true", help="print the cases and stop")
    args = parser.parse_args(argv)
    cases = select(args)
    if args.list:
        print("\n".join(c.name for c in cases))
        print(f"{len(cases)} cases")
        return 0
    # jax logs every failing callback's traceback (the firing guards): the
    # comparison checks those errors, the log would only bury the summary.
    logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    print(f"[callbacks] {len(cases)} cases", flush=True)
    outcomes = run_cases(cases, args.batch, log=lambda m: print(f"[callbacks] {m}", flush=True))
    failed = [o for o in outcomes if o.status == "fail"]
    first_line = lambda o: o.detail.splitlines()[0] if o.detail else ""  # noqa: E731
    for o in failed:
        print(f"FAIL {o.case.name} at {o.stage}: {first_line(o)}")
    counts = collections.Counter(o.status for o in outcomes)
    print(f"[callbacks] {len(outcomes)} cases: {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['rejected']} rejected by jax.jit and juju alike, "
          f"{counts['unreferenced']} without a reference (jax fails on them); "
          f"{sum(o.eager for o in outcomes)} compared with jax without jit "
          "(jax.jit cannot lower them)", flush=True)
    if args.report:
        with open(args.report, "w") as f:
            f.writelines(f"{o.case.name} {o.stage}: {first_line(o)}\n" for o in failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
