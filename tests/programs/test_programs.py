"""The real-programs tier: each program of tests/programs/*_programs.py, as its
library's docs write it, run by juju and compared with `jax.jit` (values,
shapes, dtypes, within the program's stated tolerance), at each of its sizes
(`registry.SIZES`: test ids `name-small`, `name-large`).

CI runs the small size of the programs registered with `ci=True` (a few
cheap ones, one MAX compilation); every other case carries the `programs`
marker and runs with `python3 dev.py programs`. Only the selected cases are
compiled: all in one `juju.compile_all` (split on a MAX compile error, see
runner.py), or, with `JUJU_PROGRAMS_FIRST_CALLS=1` (`dev.py programs` sets
it), each by its own timed first call. Known gaps are xfails whose reasons
are also in docs/programs.md. The report (report.py) is printed in pytest's
summary and written to build/programs-report.md.
"""

from __future__ import annotations

import os

import pytest

from tests.programs.registry import load_all
from tests.programs.report import REPORT, report, write
from tests.programs.runner import run_programs
from tests.util import selected

PROGRAMS = load_all()


def _param(program, size):
    marks = [] if program.ci and size == "small" else [pytest.mark.programs]
    if program.xfail:
        marks.append(pytest.mark.xfail(reason=program.xfail, strict=False))
    return pytest.param(program.name, size, marks=marks, id=f"{program.name}-{size}")


def _log(message: str) -> None:
    print(f"[programs] {message}", flush=True)  # shown with -s: a long run's progress


@pytest.fixture(scope="module")
def outcomes(request):
    chosen = selected(request, "name", "size")
    cases = [(p, size) for p in PROGRAMS.values() for size in p.sizes if (p.name, size) in chosen]
    first_calls = os.environ.get("JUJU_PROGRAMS_FIRST_CALLS", "0") not in ("", "0")
    with pytest.MonkeyPatch.context() as patch:  # as users run them (tests/conftest.py: off)
        patch.setenv("JUJU_PROGRAM_KERNELS", "1")
        found = run_programs(cases, log=_log, first_calls=first_calls,
                             done=lambda found: write(report(found.values())))
    REPORT[:] = report(found.values())
    REPORT.append(f"\n(written to {write(REPORT)})")
    return found


@pytest.mark.parametrize("name,size", [_param(p, s) for p in PROGRAMS.values() for s in p.sizes])
def test_program(outcomes, name, size):
    outcome = outcomes[f"{name}[{size}]"]
    if outcome.status == "skip":
        pytest.skip(f"{outcome.error} (pip install -r tests/programs/requirements.txt "
                    "-r tests/programs/requirements-more.txt)")
    if outcome.status == "fail":
        raise AssertionError(f"{name} ({size}) failed at {outcome.stage}") from outcome.error
    assert outcome.status == "pass"


def test_tier_size():
    assert len(PROGRAMS) >= 25
    assert sum(p.ci for p in PROGRAMS.values()) <= 6  # CI's subset stays one cheap compile
    assert sum(p.no_large is not None for p in PROGRAMS.values()) <= len(PROGRAMS) // 10
