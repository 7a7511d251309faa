"""Conformance runner: JAX's primitive harnesses through juju vs jax.jit.

    python -m tests.conformance.run --sample 2          # fixed sample, 2 per group
    python -m tests.conformance.run --full               # all ~7400 harnesses
    python -m tests.conformance.run --groups sort,pad    # some groups, all harnesses

Harnesses run in worker subprocesses, in batches compiled in one MAX
compilation each. A worker that crashes or hangs is killed and its unfinished
harnesses are retried in halves, down to one harness, which is then recorded
as an error. Each harness ends as pass / wrong / error / unsupported (or skip
when jax.jit itself cannot run it). Results go to a JSON file and, with
`--write-docs` (default for --full), to docs/coverage.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path

os.environ["JUJU_TIERED"] = "0"  # measure MAX, never the XLA tier (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tests" / "conformance" / "results.json"
KNOWN_GAPS = ROOT / "tests" / "conformance" / "known_gaps.json"
COVERAGE = ROOT / "docs" / "coverage.md"


def _timeout(n: int) -> float:
    # Generous: a batch killed on time is retried in halves, each compiled
    # anew, so a deadline that a slow or busy machine misses multiplies the
    # work (issue 15). A cold 136-harness sample takes minutes on 2 cores.
    return 900 + 15 * n


class _Job:
    def __init__(self, names: list[str], tmp: Path, index: int):
        self.names = names
        self.ids_file = tmp / f"batch{index}.json"
        self.out_file = tmp / f"batch{index}.jsonl"
        self.ids_file.write_text(json.dumps(names))
        self.out_file.write_text("")
        self.log = open(tmp / f"batch{index}.log", "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.conformance.run", "--worker",
             str(self.ids_file), str(self.out_file)],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.start = time.monotonic()
        self.deadline = self.start + _timeout(len(names))

    def kill(self):
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def records(self) -> list[dict]:
        out = []
        for line in self.out_file.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut short by a crash
        return out


def run_harnesses(names: list[str], *, batch_size: int = 150, jobs: int = 1,
                  verbose: bool = True) -> dict[str, dict]:
    """Run harnesses isolated in subprocesses; returns name -> {status, reason}."""
    results: dict[str, dict] = {}
    queue = deque(names[i:i + batch_size] for i in range(0, len(names), batch_size))
    running: list[_Job] = []
    counter = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="juju-conformance-") as tmpdir:
        tmp = Path(tmpdir)
        while queue or running:
            while queue and len(running) < jobs:
                running.append(_Job(queue.popleft(), tmp, counter))
                counter += 1
            time.sleep(0.2)
            for job in list(running):
                timed_out = time.monotonic() > job.deadline
                if job.proc.poll() is None and not timed_out:
                    continue
                if timed_out:
                    job.kill()
                running.remove(job)
                job.log.close()
                _collect(job, results, queue, timed_out)
                if verbose:
                    done = sum(1 for n in names if n in results)
                    tally = Counter(r["status"] for r in results.values())
                    print(f"[conformance] {done}/{len(names)} done "
                          f"({time.monotonic() - started:.0f} s) "
                          + " ".join(f"{k}={v}" for k, v in sorted(tally.items())),
                          flush=True)
    return results


def _collect(job: _Job, results: dict, queue: deque, timed_out: bool):
    records = job.records()
    last_phase = None
    for r in records:
        if "id" in r:
            results[r["id"]] = {"status": r["status"], "reason": r["reason"]}
        elif "phase" in r:
            last_phase = r
        elif "fatal" in r:
            print(f"[conformance] worker failed:\n{r['fatal']}", file=sys.stderr)
    rest = [n for n in job.names if n not in results]
    if not rest:
        return
    how = "timed out" if timed_out else f"crashed (exit {job.proc.returncode})"
    tail = (job.ids_file.parent / job.log.name.split("/")[-1]).read_text()[-1500:]
    print(f"[conformance] worker {how}; log tail:\n{tail}", file=sys.stderr, flush=True)
    suspects = [n for n in (last_phase or {}).get("ids", []) if n not in results]
    if not suspects:  # died before its first phase: retry all, in halves
        suspects = rest
    others = [n for n in rest if n not in suspects]
    if len(suspects) == 1:
        phase = last_phase["phase"] if last_phase else "start-up"
        results[suspects[0]] = {"status": "error", "reason": f"worker {how} in {phase}"}
    else:
        half = len(suspects) // 2
        queue.append(suspects[:half])
        queue.append(suspects[half:])
    if others:
        queue.append(others)


# --- reporting ---------------------------------------------------------------

# Why a group does not (fully) pass, for docs/coverage.md: known gaps as data.
GROUP_NOTES = {
    "svd": "one-sided Jacobi (juju_ops_lax/jacobi.py). Singular vectors are unique "
           "only up to sign (phase), so this group is compared by the singular values "
           "(normwise, the dtype's rtol times the largest) and by the vectors' "
           "reconstruction and orthonormality (tests/conformance/harnesses.py: "
           "compare_decomposition), not entry by entry with LAPACK's.",
    "eig": "no rule: non-symmetric eigenproblems (LAPACK geev: Hessenberg reduction "
           "and shifted QR with complex eigenvalues) are not built yet.",
    "eigh": "two-sided Jacobi (juju_ops_lax/jacobi.py). Eigenvectors are unique only "
            "up to sign (phase), so this group is compared by the eigenvalues "
            "(normwise) and by A v = w v and V^H V = I (compare_decomposition), not "
            "entry by entry with LAPACK's.",
    "qr": "Householder QR with LAPACK's conventions: geqrf/orgqr, and for complex "
          "matrices zgeqrf/zungqr's (real beta, complex tau). On the 2x200x100 "
          "harnesses 25 of 20000 float32 (2 complex64) entries of R differ from "
          "LAPACK's blocked QR by more than rtol 2e-5 (rounding of a different "
          "summation order; 2.5e-6 absolute; measured with the unblocked kernels, "
          "before the blocked QR of 2026-11-25 night, not rerun since).",
    "cholesky": "an unblocked Cholesky (juju-kernels-mojo's kernel for real matrices "
                "on the CPU, juju_ops_lax/linalg.py's loop otherwise): on the 200x200 "
                "harnesses about 110 of 40000 float32 entries differ from LAPACK's "
                "blocked potrf by more than rtol 2e-5 (summation order over 200 "
                "terms; 2.5e-6 absolute; counted with the loop).",
    "sort": "is_stable=False with equal keys: XLA's CPU sort orders ties as its "
            "std::sort leaves them; juju always sorts stably (ties keep their "
            "input order), which JAX's is_stable=False allows. The keys agree; "
            "the other operands differ where keys tie.",
    "reduce": "float16 add with an init value: XLA adds in the half type in its "
              "own order; juju sums in float32 and rounds once (1 of 6 elements "
              "differs by one half-precision ulp).",
    "approx_top_k": "values match; XLA's CPU approx_top_k orders ties unstably, juju "
                    "stably (lower index first).",
    "cumsum": "float16/bfloat16: XLA's CPU cumsum (a reduce_window) rounds to the half "
              "type after every add, left to right; juju sums in float32 in a log-step "
              "tree and rounds once, so a few elements differ by more than the half "
              "tolerance (juju's are closer to the exact sums).",
    "top_k": "a NaN with the sign bit set sorts below -inf in XLA's total order; MAX "
             "has no bitcast to read a NaN's sign, so juju orders every NaN as +NaN "
             "(JAX's own NaNs are +NaN).",
    "bitcast_convert_type": "bfloat16 <-> float16: MAX's compiler fails on the fused "
                            "bit decomposition of one 16-bit float into the other "
                            "(constraint in gather_scatter.mojo); every other pair, "
                            "and each of these through uint16, compiles.",
    "fft": "a DFT by matrix products (float64 sums when x64 is on): juju's results are "
           "closer to a float64 numpy FFT than XLA's float32 FFT (max error 1.2e-5 vs "
           "4.1e-5 on the 14x15x16x17 harness); where XLA's rounding alone exceeds the "
           "elementwise tolerance on a small output, the harness reads as wrong.",
    "conv_general_dilated": "float32: MAX's convolution sums in another order than "
                            "XLA's; 1 of 216 (NHWC) and 2 of 432 (grouped) outputs "
                            "that cancel to ~0.1 differ by 4e-5 relative. "
                            "Complex convolutions are four real ones (juju_ops_nn): "
                            "complex64 differs from XLA's complex arithmetic by more "
                            "than the float32 tolerance on 1 of 216 outputs "
                            "(cancellation between the parts); complex64 with "
                            "preferred complex128: XLA's CPU result is neither the "
                            "complex64 nor the complex128 convolution (1.5e-6 from the "
                            "exact one), juju's is the complex128 one. A filter "
                            "larger than the (dilated) input (the rhs_oob harnesses) "
                            "gives an empty result, built by juju: MAX's ConvOp "
                            "rejects such a filter.",
    "pow": "float16/bfloat16 pow was computed in the half type (XLA: float32, then "
           "rounded); fixed after this run, verified on those harnesses.",
}


def _normalize(reason: str) -> str:
    """Reasons grouped in the table: drop the per-harness numbers."""
    import re

    reason = re.sub(r"e\.g\. got .*", "", reason)
    reason = re.sub(r"\d+/\d+ elements", "some elements", reason)
    reason = re.sub(r"equation: .*", "", reason)
    return reason.strip(" ,;")[:160]


def load_known_gaps() -> dict[str, str]:
    if KNOWN_GAPS.exists():
        return json.loads(KNOWN_GAPS.read_text())
    return {}


def _run_lines(meta: dict) -> list[str]:
    parts = meta.get("parts")
    if not parts:
        return [f"- Run: `{meta.get('command', '?')}` on {meta.get('date', '?')}, "
                f"{meta.get('seconds', 0):.0f} s wall, batch size {meta.get('batch_size')}, "
                f"jobs {meta.get('jobs')}."]
    lines = [f"- Run in {len(parts)} parts (later results replace earlier ones; some "
             f"parts overlapped in time), {sum(p['seconds'] for p in parts):.0f} s in all:"]
    lines += [f"    - `{p['command']}` ({p['date']}, {p['seconds']:.0f} s)" for p in parts]
    return lines


def write_coverage(results: dict, meta: dict, path: Path = COVERAGE):
    from tests.conformance.harnesses import all_harnesses, dtype_name

    harnesses = all_harnesses()
    all_groups = {h.group_name for h in harnesses.values()}
    groups: dict[str, Counter] = {}
    reasons: dict[str, Counter] = {}
    complex_total = complex_pass = 0
    for name, r in results.items():
        h = harnesses[name]
        g = h.group_name
        groups.setdefault(g, Counter())[r["status"]] += 1
        if r["status"] != "pass":
            reasons.setdefault(g, Counter())[f"{r['status']}: {_normalize(r['reason'])}"] += 1
        if dtype_name(h).startswith("complex"):
            complex_total += 1
            complex_pass += r["status"] == "pass"
    total = Counter(r["status"] for r in results.values())
    counted = sum(v for k, v in total.items() if k != "skip")
    passing_groups = [g for g, c in groups.items() if set(c) <= {"pass", "skip"}]
    noncomplex = [n for n in results if not dtype_name(harnesses[n]).startswith("complex")
                  and results[n]["status"] != "skip"]
    noncomplex_pass = sum(results[n]["status"] == "pass" for n in noncomplex)
    lines = [
        "# juju conformance: JAX's primitive harnesses",
        "",
        "Generated by `python -m tests.conformance.run` (`python3 dev.py conformance`)",
        "from `jax/_src/internal_test_util/test_harnesses.py` (jax "
        f"{meta.get('jax', '?')}, x64 enabled, harnesses JAX runs on CPU). Each harness",
        "runs through `juju.jit` and is compared with `jax.jit`: exact for integers",
        "and bools, rtol/atol 1e-9/1e-12 (f64), 2e-5/2e-6 (f32), 4e-3/1e-3 (f16),",
        "3e-2/1e-2 (bf16); NaNs must match; shapes and dtypes must match.",
        "",
        *_run_lines(meta),
        f"- Harnesses run: {len(results)} of the suite's {len(harnesses)}"
        + (f" ({len(harnesses) - len(results)} not run)" if len(results) < len(harnesses)
           else "") + "; "
        + ", ".join(f"{k} {total.get(k, 0)}" for k in ("pass", "wrong", "error",
                                                       "unsupported", "skip")),
        f"- Pass rate: {total.get('pass', 0)}/{counted} = "
        f"{100 * total.get('pass', 0) / max(counted, 1):.1f}% of all run harnesses"
        + (f" (at least {total.get('pass', 0)}/{len(harnesses)} = "
           f"{100 * total.get('pass', 0) / len(harnesses):.1f}% of the suite, counting those "
           "not run as failures)" if len(results) < len(harnesses) else "") + "; "
        f"{noncomplex_pass}/{len(noncomplex)} = "
        f"{100 * noncomplex_pass / max(len(noncomplex), 1):.1f}% of the real-dtype ones; "
        f"{complex_pass}/{complex_total} complex-dtype harnesses pass (MAX has no complex "
        "dtype: juju carries (real, imaginary) pairs).",
        f"- Groups where every harness run passes: {len(passing_groups)}/{len(groups)}"
        + (f" ({len(all_groups - set(groups))} of the suite's {len(all_groups)} groups not "
           "run)" if all_groups - set(groups) else "") + ".",
        "",
        "Status: **pass**; **wrong** (runs, wrong values/shape/dtype); **error** (a",
        "rule or MAX fails, or the worker crashed); **unsupported** (no rule:",
        "`MissingRuleError`, `UnsupportedDtypeError`, or a rule's documented",
        "`NotImplementedError` for a parameter value); **skip** (jax.jit itself fails).",
        "",
        "| group | pass | wrong | error | unsupported | skip | reasons (count) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for g in sorted(groups):
        c = groups[g]
        why = "; ".join(f"{r} ({n})" for r, n in reasons.get(g, Counter()).most_common(4))
        why = why.replace("|", "\\|")
        lines.append(f"| {g} | {c['pass']} | {c['wrong']} | {c['error']} | "
                     f"{c['unsupported']} | {c['skip']} | {why} |")
    noted = [g for g in sorted(groups) if g in GROUP_NOTES
             and not set(groups[g]) <= {"pass", "skip"}]
    complex_only = [g for g in sorted(groups) if g not in GROUP_NOTES
                    and not set(groups[g]) <= {"pass", "skip"}
                    and all(dtype_name(harnesses[n]).startswith("complex")
                            for n, r in results.items() if harnesses[n].group_name == g
                            and r["status"] not in ("pass", "skip"))]
    lines += ["", "## Why groups fail", ""]
    lines += [f"- **{g}**: {GROUP_NOTES[g]}" for g in noted]
    if complex_only:
        lines.append("- **" + ", ".join(complex_only) + "**: only their complex-dtype "
                     "harnesses fail (reasons in the table).")
    lines.append("- Integer and/or/xor/not, shifts, population_count and clz are lowered "
                 "by Mojo kernels of juju_kernels_mojo (Priority.KERNEL); without that "
                 "pack they are MissingRuleError.")
    gaps = load_known_gaps()
    lines += [
        "",
        "## Known gaps in the CI sample",
        "",
        "`tests/test_conformance_sample.py` runs a fixed sample (1 harness per group,",
        "chosen by name hash, real dtypes first; not the groups a module of their own",
        "covers, test_lax_rules.py's included) and xfails these, from",
        "`tests/conformance/known_gaps.json` (`python -m tests.conformance.run --sample 1",
        "--update-known-gaps` rewrites it from a run):",
        "",
        "| harness | reason |",
        "|---|---|",
    ]
    for name in sorted(gaps):
        lines.append(f"| {name} | {gaps[name].replace('|', chr(92) + '|')} |")
    from tests.conformance import registered  # every primitive, not only the harnessed ones

    lines += ["", *registered.section()]
    path.write_text("\n".join(lines) + "\n")


def _merged(previous: dict, results: dict, meta: dict) -> tuple[dict, dict]:
    """A run in parts: newer results replace older ones harness by harness;
    the run counts as full once every harness has a result."""
    from tests.conformance.harnesses import listing

    merged = {**previous["results"], **results}
    parts = previous["meta"].get("parts") or [previous["meta"]]
    parts = [*parts, {k: meta[k] for k in ("command", "date", "seconds")}]
    meta = {**meta, "parts": parts, "seconds": sum(p["seconds"] for p in parts),
            "command": "; ".join(p["command"] for p in parts),
            "full": {n for _, n in listing()} <= set(merged)}
    return merged, meta


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        from tests.conformance.harnesses import worker_main

        return worker_main(argv[1], argv[2])
    p = argparse.ArgumentParser(prog="python -m tests.conformance.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", help="comma-separated group names (default: all)")
    p.add_argument("--exclude-groups", help="comma-separated group names to leave out")
    p.add_argument("--sample", type=int, help="N harnesses per group, fixed choice")
    p.add_argument("--full", action="store_true", help="every harness (the default "
                   "when neither --sample nor --groups is given)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes at once")
    p.add_argument("--batch-size", type=int, default=150,
                   help="harnesses per worker / per MAX compilation")
    p.add_argument("--results", default=str(RESULTS), help="results JSON to write")
    p.add_argument("--write-docs", action="store_true",
                   help="regenerate docs/coverage.md (default with --full)")
    p.add_argument("--report-only", action="store_true",
                   help="only regenerate docs/coverage.md from --results")
    p.add_argument("--update-known-gaps", action="store_true",
                   help="record the sample's failures in tests/conformance/known_gaps.json")
    p.add_argument("--match", help="only harnesses whose name contains this")
    p.add_argument("--exclude", help="skip harnesses whose name contains this")
    p.add_argument("--names", help="a JSON file listing the harnesses to run")
    p.add_argument("--merge", action="store_true",
                   help="add to the results already in --results (a full run in parts)")
    p.add_argument("--list", action="store_true",
                   help="print the selected harness names as JSON and exit")
    args = p.parse_args(argv)

    from tests.conformance.harnesses import listing, sample

    if args.report_only:
        data = json.loads(Path(args.results).read_text())
        write_coverage(data["results"], data["meta"])
        print(f"[conformance] wrote {COVERAGE}")
        return 0
    groups = set(args.groups.split(",")) if args.groups else None
    if args.sample and not args.full:
        names = sample(args.sample, groups)
    else:
        names = [n for g, n in listing() if groups is None or g in groups]
    if args.exclude_groups:
        excluded = set(args.exclude_groups.split(","))
        left_out = {n for g, n in listing() if g in excluded}
        names = [n for n in names if n not in left_out]
    if args.match:
        names = [n for n in names if args.match in n]
    if args.exclude:
        names = [n for n in names if args.exclude not in n]
    if args.names:
        wanted = set(json.loads(Path(args.names).read_text()))
        names = [n for n in names if n in wanted]
    full = not (args.sample or args.groups or args.match or args.exclude or args.names
                or args.exclude_groups)
    if args.list:
        print(json.dumps(names))
        return 0
    print(f"[conformance] {len(names)} harnesses, batch size {args.batch_size}, "
          f"jobs {args.jobs}", flush=True)
    start = time.monotonic()
    results = run_harnesses(names, batch_size=args.batch_size, jobs=args.jobs)
    seconds = time.monotonic() - start
    import jax

    meta = {
        "command": "python -m tests.conformance.run " + " ".join(argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": seconds, "batch_size": args.batch_size, "jobs": args.jobs,
        "jax": jax.__version__, "full": full,
    }
    if args.merge and Path(args.results).exists():
        results, meta = _merged(json.loads(Path(args.results).read_text()), results, meta)
        full = meta["full"]
    Path(args.results).write_text(json.dumps({"meta": meta, "results": results},
                                             indent=0, sort_keys=True))
    if args.update_known_gaps:
        gaps = {n: f"{r['status']}: {r['reason']}" for n, r in sorted(results.items())
                if r["status"] not in ("pass", "skip")}
        KNOWN_GAPS.write_text(json.dumps(gaps, indent=1, sort_keys=True) + "\n")
    if full or args.write_docs:
        write_coverage(results, meta)
        print(f"[conformance] wrote {COVERAGE}")
    tally = Counter(r["status"] for r in results.values())
    print(f"[conformance] {len(results)} harnesses in {seconds:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    for name in names:
        r = results.get(name)
        if r and r["status"] not in ("pass", "skip") and len(names) <= 400:
            print(f"  {r['status']:11s} {name}: {r['reason'][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
