"""The programs tier's report: each program's sizes side by side.

For each program: the steady-state ratio to jax.jit at each size, the first
call of each side (juju MAX only: `tiered=False`), and which back end ran
it; then the geometric mean of the ratios per size, the first calls'
summary, every failure with its error, and the steady-state times.

Which back end ran a program (`backend`), from what juju exposes: the
executable's model (a pack's runner, here a generated kernel called
natively, or a MAX model) and `Lowered.explain()`'s rule choices:

- `native kernel`: the whole program is one generated Mojo kernel, called
  without MAX's runtime (juju_kernels_mojo/native_programs.py).
- `MAX: K kernels + N ops`: a MAX graph; K of its equations are custom ops
  of the juju-kernels-mojo pack (generated kernels of loops or islands, and
  the pack's library kernels: sorts, linear algebra), N are lowered to MAX
  ops by the other packs (an equation can be several MAX ops).
- `staged: ...`: host callbacks split the program into graphs run in turn
  (juju/host.py), each described as above.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tests.programs.registry import SIZES

KERNEL_PACK = "mojo"  # juju-kernels-mojo: the pack whose custom ops are Mojo kernels
SLOW_FIRST_CALL_S = 30.0  # issue 52's bound on a MAX-only first call
REPORT: list[str] = []  # the last pytest run's report, for its summary (conftest.py)


def backend(outcome) -> str:
    """Which back end ran `outcome`'s program (see the module docstring)."""
    from juju.runners import is_max_model

    lowered = outcome.jitted.lowered_for(outcome.args, {})
    parts = []
    for part in lowered.parts:
        executable = part.jit_function.executables.get(part.key)
        if executable is None:
            return "not compiled"
        parts.append("native kernel" if not is_max_model(executable.model)
                     else _graph_summary(part.explain()))
    if len(parts) == 1 and lowered.parts == [lowered]:
        return parts[0]
    return f"staged: {len(parts)} graphs ({'; '.join(sorted(set(parts)))}) + host"


def _graph_summary(choices) -> str:
    parents = set()
    for c in choices:
        steps = c.path.split("/")
        parents.update("/".join(steps[:i]) for i in range(1, len(steps)))
    leaves = [c for c in choices if c.path not in parents and c.how != "host"]
    kernels = sum(c.pack == KERNEL_PACK for c in leaves)
    ops = len(leaves) - kernels
    return f"MAX: {kernels} kernels + {ops} ops" if kernels else f"MAX: {ops} ops"


def _ratio(o) -> float | None:
    s = o.seconds
    return s["juju"] / s["jax"] if "juju" in s else None


def _ratio_cell(o) -> str:
    if o is None:
        return "n/a"
    if o.status == "skip":
        return "skipped"
    if o.status == "fail":
        return f"{'xfail' if o.program.xfail else '**fails**'} ({o.stage})"
    ratio = _ratio(o)
    return "" if ratio is None else f"{ratio:.2f}" + (" (xpass)" if o.program.xfail else "")


def _first_call_cell(o) -> str:
    if o is None or "juju first call" not in o.seconds:
        return ""
    mine, theirs = o.seconds["juju first call"], o.seconds.get("jax first call", float("nan"))
    cell = f"{mine:.1f} / {theirs:.1f}"
    if o.status == "fail" and o.stage in ("lower", "compile"):
        return f"fails after {mine:.0f} / {theirs:.1f}"
    return f"**{cell}**" if mine > SLOW_FIRST_CALL_S else cell


def geomean(values) -> float:
    return float(np.exp(np.mean(np.log(values))))


def _by_program(outcomes) -> dict:
    programs: dict = {}
    for o in outcomes:
        programs.setdefault(o.program.name, {})[o.size] = o
    return programs


def report(outcomes) -> list[str]:
    """Markdown lines: the side-by-side table and its summaries."""
    outcomes = list(outcomes)
    programs = _by_program(outcomes)
    sizes = [s for s in SIZES if any(o.size == s for o in outcomes)]
    header = (["program", "library"] + [f"{s}: juju / jax.jit" for s in sizes]
              + [f"first call {s} (s): juju / jax.jit" for s in sizes]
              + [f"back end {s}" for s in sizes])
    rows = ["| " + " | ".join(header) + " |",
            "|---|---|" + "---:|" * (2 * len(sizes)) + "---|" * len(sizes)]
    for name, by_size in programs.items():
        any_case = next(iter(by_size.values()))
        cells = [f"`{name}`", any_case.program.library]
        cells += [_ratio_cell(by_size.get(s)) if s in any_case.program.sizes else "n/a"
                  for s in sizes]
        cells += [_first_call_cell(by_size.get(s)) for s in sizes]
        cells += [(by_size[s].backend if s in by_size else "") for s in sizes]
        rows.append("| " + " | ".join(cells) + " |")
    ratios = {s: [_ratio(o) for o in outcomes if o.size == s and _ratio(o) is not None]
              for s in sizes}
    rows.append("| geomean | | " + " | ".join(
        f"**{geomean(ratios[s]):.2f}** of {len(ratios[s])}" if ratios[s] else ""
        for s in sizes) + " |" + " |" * (2 * len(sizes)))
    return rows + _summaries(outcomes, sizes, ratios) + _times(programs, sizes)


def _summaries(outcomes, sizes, ratios) -> list[str]:
    lines = [""]
    for s in sizes:
        cases = [o for o in outcomes if o.size == s]
        passed = sum(o.status == "pass" for o in cases)
        over = sum(r > 1.5 for r in ratios[s])
        firsts = [(o.seconds["juju first call"], o) for o in cases
                  if "juju first call" in o.seconds]
        text = (f"- {s}: {passed} of {len(cases)} passed; {over} ratios above 1.5"
                + (f"; geomean {geomean(ratios[s]):.2f}" if ratios[s] else ""))
        if firsts:
            slowest, which = max(firsts, key=lambda item: item[0])
            versus = [o.seconds["juju first call"] / o.seconds["jax first call"]
                      for _, o in firsts if o.seconds.get("jax first call")]
            text += (f"; first calls: {sum(t > SLOW_FIRST_CALL_S for t, _ in firsts)} over "
                     f"{SLOW_FIRST_CALL_S:.0f} s, median {np.median([t for t, _ in firsts]):.1f} s "
                     f"({np.median(versus):.1f}x jax.jit's), slowest {slowest:.0f} s "
                     f"(`{which.name}`)")
        lines.append(text)
    failures = [o for o in outcomes if o.status == "fail"]
    if failures:
        lines += ["", "Failures:", ""]
        lines += [f"- `{o.name}`{' (xfail)' if o.program.xfail else ''} at {o.stage}: "
                  f"{_one_line(o.error)}" for o in failures]
    return lines


def _one_line(error) -> str:
    text = " | ".join(line.strip() for line in f"{type(error).__name__}: {error}".splitlines()
                      if line.strip())
    return text[:300].replace("|", "/")


def _times(programs, sizes) -> list[str]:
    lines = ["", "Steady-state medians (ms), juju / jax.jit:", "",
             "| program | " + " | ".join(sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for name, by_size in programs.items():
        cells = []
        for s in sizes:
            o = by_size.get(s)
            cells.append(f"{o.seconds['juju'] * 1e3:.3f} / {o.seconds['jax'] * 1e3:.3f}"
                         if o is not None and "juju" in o.seconds else "")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return lines


def write(lines: list[str]) -> Path:
    """Write the report to `$JUJU_PROGRAMS_REPORT` (default:
    build/programs-report.md in the repository) and return its path."""
    root = Path(__file__).resolve().parents[2]
    path = Path(os.environ.get("JUJU_PROGRAMS_REPORT", root / "build" / "programs-report.md"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
