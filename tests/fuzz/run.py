"""The fuzzing tier: random programs (tests/fuzz/programs.py) through juju,
compared with jax.jit.

    python3 dev.py fuzz --count 2000            # the long run
    python -m tests.fuzz.run --count 200 --seed 7 --batch 100 --report fuzz.txt
    python -m tests.fuzz.run --count 2000 --rerun fuzz.txt  # the listed ones, after a fix
    python -m tests.fuzz.run --count 2000 --first 1300  # the rest of a run stopped at 1300

Programs are drawn with hypothesis (fixed seed, generation only), lowered one
by one (a rule that raises is that program's failure), compiled together in
batches with `juju.compile_all` (a batch that fails to compile is split in
halves down to the program that fails), run, and compared with `jax.jit`:
shapes and dtypes; ints and bools exactly; floats with NaN and +-inf in the
same places and finite values within a tolerance that grows with the
program's length; the sign of zeros for steps that move values without
arithmetic (reshape, slice, where, sort...), where XLA keeps it.

Known mismatches are data (`KNOWN`): a program that matches one of them is
counted as known, with its reason, not as a failure. They are:
- `top_k` of a negative NaN: XLA ranks -NaN below -inf; MAX has no bitcast
  to see a NaN's sign, so juju ranks every NaN as the largest.
- `subtract(v, v)` with an infinite v: MAX folds y - y to 0 (it assumes no
  NaN or inf), XLA gives NaN (docs/testing.md).
- `multiply`/`dot` of a NaN or inf by zeros that juju lowered to a constant
  (the argmin of one element, a literal 0): MAX folds x * 0 to 0, XLA gives
  NaN (the same assumption; docs/testing.md).
- `cumsum`/`cumprod`/`sum`/`prod`/`mean`/`dot` of float16/bfloat16 values
  near the type's maximum: XLA accumulates in float32 in another order, so
  where a partial sum overflows differs (inf in one, finite in the other).
- The same ops in any float type where partial results can overflow or
  underflow: juju's scans and reductions combine in another order than
  XLA's sequential one, so an inf (or a 0) that meets a 0 (or an inf) later
  makes NaN in one order and 0 or inf in the other; `cumprod([-3e38, 3e38,
  -0.0])` ends in NaN under XLA and in 0 under juju. Only when the operands
  hold no NaN and their magnitudes can leave the type's finite range.
- float16/bfloat16 results at the edge of the type's range: a step that
  reads the previous step's rounded result (`exp(log(3.39e38))`) can land
  on the other side of the largest finite value than XLA's (inf in one,
  ~3e38 in the other): MAX may compute through the float32 round trip.
- Denormal (subnormal) float32/float64/bfloat16 operands: MAX's CPU kernels
  run with flush-to-zero and denormals-are-zero set (its `sync_parallelize`
  wraps every task in `FlushDenormals`), so they read a denormal as a zero
  of its sign (`any(9e-41)` is False) and round denormal results to zero.
  Counted as known only where juju's result is jax.jit's on the operands
  with their denormals flushed.
- Half-precision intermediates: XLA's CPU backend computes float16 and
  bfloat16 ops in float32 and, by default (`xla_allow_excess_precision`),
  drops the rounding between them (`f32 + exp(bf16)` adds the unrounded
  exponential). juju rounds every result to its type. Counted as known only
  where juju's result is jax.jit's with that option off.
- Division by a broadcast divisor near the type's largest value: XLA
  computes x / broadcast(y) as x * broadcast(1 / y), and 1 / 3.4e38 is a
  denormal its CPU code flushes to zero, so `x / max(x)` is 0 in a row whose
  max is 3.4e38. juju divides (1.0). Counted as known only where jax.jit's
  result is x * flush(1 / y) and juju's is x / y.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
import traceback

import jax
import juju
import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, Phase, given, seed, settings

from juju.runners import is_max_model
from tests.fuzz.programs import Program, kind, programs

MOVES = {"reshape", "transpose", "slice", "concatenate", "expand_dims", "squeeze", "flip",
         "broadcast_to", "where", "take", "sort", "negative", "abs"}
HALF = {"float16", "bfloat16"}
ACCUMULATING = {"cumsum", "cumprod", "sum", "prod", "mean", "dot"}


def _uses(program: Program, op: str) -> bool:
    return any(step.op == op for step in program.steps)


def _order_matters(step, operands, expected, actual) -> bool:
    """Whether combining `operands` in another order can overflow or
    underflow differently: finite nonzero magnitudes whose products or sums
    leave the type's finite range, and no NaN that reaches a differing
    element (a NaN propagates in every order): for a cumulative op, none in
    that element's prefix; for a reduction, none at all."""
    floats = [np.asarray(o, np.float64) for o in operands if kind(np.asarray(o).dtype) == "f"]
    if not floats:
        return False
    e64, a64 = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    if step.op.startswith("cum") and floats[0].ndim:
        axis = dict(step.params).get("axis", 0)
        nan_before = np.logical_or.accumulate(np.isnan(floats[0]), axis=axis)
        differs = ~((e64 == a64) | (np.isnan(e64) & np.isnan(a64)))
        if (differs & nan_before).any():
            return False
    elif any(np.isnan(f).any() for f in floats):
        return False
    magnitudes = np.abs(np.concatenate([f.ravel() for f in floats]))
    finite = magnitudes[np.isfinite(magnitudes) & (magnitudes > 0)]
    if finite.size == 0:
        return False
    info = ml_dtypes.finfo(np.asarray(expected).dtype)  # numpy's finfo knows no bfloat16
    largest, smallest = finite.max(), finite.min()
    return bool(largest * max(largest, finite.size) >= info.max
                or smallest * smallest < info.smallest_subnormal)


def _overflow_edge(expected, actual) -> bool:
    """Whether every element where one side is +-inf and the other is not is
    finite within a factor 2 of the type's largest value on the other side."""
    e64, a64 = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    one_inf = np.isinf(e64) != np.isinf(a64)
    if not one_inf.any():
        return False
    other = np.where(np.isinf(e64), a64, e64)[one_inf]
    return bool(np.all(np.abs(other) >= float(ml_dtypes.finfo(expected.dtype).max) / 2))


FLUSHED_TYPES = {"float32", "float64", "bfloat16"}  # float16 works in float32: no denormals


def _flush_denormals(value):
    """`value` with its denormals replaced by zeros of their sign, as MAX's
    CPU kernels read them (the same object when it holds none)."""
    array = np.asarray(value)
    if str(array.dtype) not in FLUSHED_TYPES:
        return value
    wide = array.astype(np.float64)
    denormal = (wide != 0) & (np.abs(wide) < ml_dtypes.finfo(array.dtype).tiny)
    if not denormal.any():
        return value
    return np.where(denormal, np.copysign(0.0, wide), wide).astype(array.dtype)


def _matches_with_denormals_flushed(program, step, actual, operands) -> bool:
    flushed = [_flush_denormals(o) for o in operands]
    if all(f is o for f, o in zip(flushed, operands)):
        return False
    values = [None] * (max(step.args) + 1)
    for i, f in zip(step.args, flushed):
        values[i] = f
    with jax.enable_x64(program.x64):
        again = jax.jit(step.apply)(values)
    return compare(actual, again, step.op, len(program.steps)) is None


def _matches_without_excess_precision(program, step, actual) -> bool:
    """Whether `actual` is jax.jit's value of `step` when XLA rounds every
    half-precision result: by default (`xla_allow_excess_precision`) XLA's
    CPU backend computes float16/bfloat16 ops in float32 and drops the
    rounding between them, e.g. in `f32 + exp(bf16)`."""
    if not any(str(np.asarray(v).dtype) in HALF for v in program.inputs):
        return False
    index = next(k for k, s in enumerate(program.steps) if s is step)
    with jax.enable_x64(program.x64):
        strict = jax.jit(program).lower(*program.inputs).compile(
            compiler_options={"xla_allow_excess_precision": False})
        expected = strict(*program.inputs)[index]
    return compare(actual, expected, step.op, len(program.steps)) is None


def _xla_reciprocal_flushed(program, step, expected, actual, operands) -> bool:
    """Whether `step` divides by a broadcast divisor whose reciprocal is a
    denormal: XLA computes x / broadcast(y) as x * broadcast(1 / y) and
    flushes that denormal to zero (3.4e38 / 3.4e38 is 0 under jax.jit), where
    juju divides: `actual` is x / y and `expected` is x * flush(1 / y)."""
    if step.op != "true_divide" or kind(expected.dtype) != "f":
        return False
    x, y = (np.asarray(o).astype(expected.dtype) for o in operands)
    if y.size >= expected.size:
        return False
    with np.errstate(all="ignore"):
        reciprocal_times = x * _flush_denormals(np.asarray(1 / y, expected.dtype))
        quotient = x / y
    n = len(program.steps)
    return (compare(expected, reciprocal_times, step.op, n) is None
            and compare(actual, quotient, step.op, n) is None)


# (reason, predicate(program, step, expected, actual, operands) -> bool) for the
# first mismatching step; operands are jax.jit's values of the step's arguments.
KNOWN = [
    ("top_k ranks every NaN as +NaN (MAX has no bitcast to see a NaN's sign)",
     lambda p, step, e, a, ops: step.op == "top_k"),
    ("half-precision accumulation overflows in another place than XLA's float32 one",
     lambda p, step, e, a, ops: step.op in ACCUMULATING and str(e.dtype) in HALF
     and np.isinf(np.asarray(e, np.float64)).any() != np.isinf(np.asarray(a, np.float64)).any()),
    ("accumulation in another order than XLA's overflows or underflows elsewhere "
     "(inf * 0, inf - inf)",
     lambda p, step, e, a, ops: step.op in ACCUMULATING and kind(e.dtype) == "f"
     and _order_matters(step, ops, e, a)),
    ("a half-precision result at the edge of its range overflows on one side only",
     lambda p, step, e, a, ops: str(e.dtype) in HALF and _overflow_edge(e, a)),
    ("MAX's CPU kernels flush denormals to zero (FTZ/DAZ); XLA keeps them",
     lambda p, step, e, a, ops: _matches_with_denormals_flushed(p, step, a, ops)),
    ("XLA skips the rounding of half-precision intermediates (xla_allow_excess_precision); "
     "juju rounds each, as jax.jit does with that option off",
     lambda p, step, e, a, ops: _matches_without_excess_precision(p, step, a)),
    ("XLA divides by a broadcast divisor as x * (1 / y) and flushes a denormal 1 / y "
     "to zero; juju divides",
     _xla_reciprocal_flushed),
]


@dataclasses.dataclass
class Outcome:
    status: str  # pass | fail | known | skip
    program: Program
    detail: str = ""
    backend: str = ""  # what ran it: "native" (a program kernel) or "graph" (MAX)


def draw_programs(count: int, seed_value: int, x64: bool = False) -> list[Program]:
    """`count` programs from hypothesis, reproducibly for a seed."""
    collected: list[Program] = []

    @seed(seed_value)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(programs(x64=x64))
    def collect(program):
        collected.append(program)

    with jax.enable_x64(x64):
        collect()
    return collected[:count]


def _tolerance(dtype, n_steps: int) -> float:
    base = {"float16": 4e-3, "bfloat16": 2e-2, "float64": 1e-12}.get(str(dtype), 2e-6)
    return base * 4 * n_steps


def compare(actual, expected, op: str, n_steps: int) -> str | None:
    """Why `actual` (juju) differs from `expected` (jax.jit), or None."""
    a, e = np.asarray(juju.to_numpy(actual)), np.asarray(expected)
    if a.shape != e.shape or a.dtype != e.dtype:
        return f"shape/dtype {a.shape} {a.dtype} != {e.shape} {e.dtype}"
    if kind(e.dtype) != "f":
        return None if np.array_equal(a, e) else "values differ"
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        if not np.array_equal(test(a64), test(e64)):
            return f"{name} positions differ"
    finite = np.isfinite(e64)
    tol = _tolerance(e.dtype, n_steps)
    scale = max(1.0, float(np.abs(e64[finite]).max())) if finite.any() else 1.0
    if not np.allclose(a64[finite], e64[finite], rtol=tol, atol=tol * scale):
        return "values differ"
    if op in MOVES:
        zeros = e64 == 0
        if not np.array_equal(np.signbit(a64[zeros]), np.signbit(e64[zeros])):
            return "sign of zero differs"
    return None


def _lower(program: Program, index: int):
    def fn(*args):
        return program(*args)

    fn.__name__ = fn.__qualname__ = f"fuzz_{index}"
    jitted = juju.jit(fn)
    with jax.enable_x64(program.x64):
        return jitted, jitted.lower(*program.inputs)


def _compile(lowered: list) -> list[str | None]:
    """compile_all in one batch; on failure, halves, down to single programs.
    Returns each program's compile error (None when it compiled)."""
    try:
        juju.compile_all(lowered)
        return [None] * len(lowered)
    except Exception as exc:  # noqa: BLE001 - the program's failure, reported
        if len(lowered) == 1:
            return [f"compile: {type(exc).__name__}: {str(exc)[:300]}"]
    half = len(lowered) // 2
    return _compile(lowered[:half]) + _compile(lowered[half:])


def _explain(program: Program, step_index: int, error: str, actual, expected,
             values: list) -> Outcome:
    """A mismatch, as known (with its reason) or as a failure. `values`:
    jax.jit's values of the program's inputs and steps."""
    step = program.steps[step_index]
    operands = [values[i] for i in step.args]
    for reason, known in KNOWN:
        try:
            if known(program, step, np.asarray(expected), np.asarray(juju.to_numpy(actual)),
                     operands):
                return Outcome("known", program, reason)
        except Exception:  # noqa: BLE001, S110 - a predicate that cannot judge: not known
            pass
    a = np.asarray(juju.to_numpy(actual))
    detail = (f"step {step_index} ({step.op}, {np.asarray(expected).dtype}): {error}\n"
              f"  juju: {a.tolist()}\n  jax:  {np.asarray(expected).tolist()}")
    return Outcome("fail", program, detail)


def run_batch(batch: list[Program]) -> list[Outcome]:
    """Lower, compile (one compile_all), run and compare `batch`."""
    outcomes: dict[int, Outcome] = {}
    jitted, lowered, expected = {}, {}, {}
    for i, program in enumerate(batch):
        try:
            with jax.enable_x64(program.x64):
                expected[i] = jax.jit(program)(*program.inputs)
        except Exception as exc:  # noqa: BLE001 - jax rejects it: nothing to compare
            outcomes[i] = Outcome("skip", program, f"jax.jit: {exc}")
            continue
        try:
            jitted[i], lowered[i] = _lower(program, i)
        except Exception as exc:  # noqa: BLE001 - the program's failure, reported
            cause = exc.__cause__ or exc
            outcomes[i] = Outcome("fail", program, f"lowering: {type(cause).__name__}: {cause}")
    order = sorted(lowered)
    for i, error in zip(order, _compile([lowered[i] for i in order])):
        if error:
            outcomes[i] = Outcome("fail", program=batch[i], detail=error)
    for i in order:
        if i in outcomes:
            continue
        program = batch[i]
        try:
            with jax.enable_x64(program.x64):
                actual = jitted[i](*program.inputs)
        except Exception as exc:  # noqa: BLE001 - the program's failure, reported
            outcomes[i] = Outcome("fail", program, f"run: {type(exc).__name__}: {exc}")
            continue
        outcomes[i] = Outcome("pass", program)
        for k, (a, e) in enumerate(zip(actual, expected[i])):
            error = compare(a, e, program.steps[k].op, len(program.steps))
            if error:
                outcomes[i] = _explain(program, k, error, a, e,
                                       [*program.inputs, *expected[i]])
                break
        outcomes[i].backend = _backend(jitted[i])
    return [outcomes[i] for i in range(len(batch))]


def _backend(jitted) -> str:
    (executable,) = jitted.executables.values()
    return "graph" if is_max_model(executable.model) else "native"


def run(count: int, seed_value: int = 0, batch: int = 100, x64_share: float = 0.25,
        verbose: bool = True, report=None, rerun=None, first: int = 0) -> list[Outcome]:
    """Draw `count` programs and run them in batches, from the `first`-th
    (a long run resumed). `rerun`: the text of an earlier report; only the
    programs it lists run (after a fix)."""
    n64 = round(count * x64_share)
    all_programs = draw_programs(count - n64, seed_value) + (
        draw_programs(n64, seed_value + 1, x64=True) if n64 else [])
    all_programs = all_programs[first:]
    if rerun is not None:
        all_programs = [p for p in all_programs if p.source() + "\n" in rerun]
    outcomes: list[Outcome] = []
    fallbacks = _Fallbacks()
    logging.getLogger("juju").addHandler(fallbacks)
    for start in range(0, len(all_programs), batch):
        t0 = time.time()
        part = run_batch(all_programs[start:start + batch])
        outcomes += part
        if verbose:
            counts = {s: sum(o.status == s for o in outcomes) for s in
                      ("pass", "fail", "known", "skip")}
            counts.update({f"ran {b}": sum(o.backend == b for o in outcomes)
                           for b in ("native", "graph")})
            counts["kernel build failures"] = len(fallbacks.messages)
            print(f"[fuzz] {first + len(outcomes)}/{first + len(all_programs)} programs "
                  f"({time.time() - t0:.0f} s for this batch): {counts}", flush=True)
            for o in part:
                if o.status == "fail":
                    print(f"--- FAIL\n{o.program.source()}\n{o.detail}", flush=True)
        if report:
            with open(report, "a") as f:
                for o in part:
                    if o.status in ("fail", "known"):
                        f.write(f"--- {o.status.upper()}\n{o.program.source()}\n{o.detail}\n")
    return outcomes


class _Fallbacks(logging.Handler):
    """juju's warnings that a generated kernel failed to build (a generator
    bug: the program then runs as MAX ops, so its result may still pass)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if "failed to build" in message:
            self.messages.append(message)
            print(f"--- KERNEL BUILD FAILURE\n{message[:2000]}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=100, help="programs per MAX compilation")
    parser.add_argument("--x64-share", type=float, default=0.25)
    parser.add_argument("--program-kernels", choices=("on", "off"),
                        help="JUJU_PROGRAM_KERNELS for the run (default: the environment's, "
                             "on unless set): on, a program the generator writes runs as one "
                             "native kernel; off, every program is a MAX graph")
    parser.add_argument("--first", type=int, default=0,
                        help="skip the programs before this one of the draw (resume a run "
                             "that printed '[fuzz] K/...' at its last batch with --first K)")
    parser.add_argument("--report", help="append failing and known programs to this file")
    parser.add_argument("--rerun", metavar="REPORT",
                        help="run only the programs an earlier --report listed (same "
                             "--count and --seed)")
    args = parser.parse_args(argv)
    if args.program_kernels:
        os.environ["JUJU_PROGRAM_KERNELS"] = "1" if args.program_kernels == "on" else "0"
    rerun = open(args.rerun).read() if args.rerun else None
    try:
        outcomes = run(args.count, args.seed, args.batch, args.x64_share, report=args.report,
                       rerun=rerun, first=args.first)
    except Exception:  # noqa: BLE001 - reported, and the exit status says so
        traceback.print_exc()
        return 2
    failed = sum(o.status == "fail" for o in outcomes)
    kernels = os.environ.get("JUJU_PROGRAM_KERNELS", "1") != "0"
    print(f"[fuzz] done: {len(outcomes)} programs (program kernels "
          f"{'on' if kernels else 'off'}), {failed} unexplained mismatches")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
