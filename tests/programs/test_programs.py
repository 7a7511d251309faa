"""The real-programs tier: each program of tests/programs/*_programs.py, as its
library's docs write it, run by juju and compared with `jax.jit` (values,
shapes, dtypes, within the program's stated tolerance).

CI runs the programs registered with `ci=True` (a few cheap ones, one MAX
compilation); the rest carry the `programs` marker and run with
`python3 dev.py programs`. Only the selected programs are compiled, all in one
`juju.compile_all` (split on a MAX compile error, see runner.py). Known gaps
are xfails whose reasons are also in docs/programs.md.
"""

from __future__ import annotations

import pytest

from tests.programs.registry import load_all
from tests.programs.runner import RATIO_ROWS, ratio_table, run_programs
from tests.util import selected

PROGRAMS = load_all()


def _param(program):
    marks = [] if program.ci else [pytest.mark.programs]
    if program.xfail:
        marks.append(pytest.mark.xfail(reason=program.xfail, strict=False))
    return pytest.param(program.name, marks=marks, id=program.name)


@pytest.fixture(scope="module")
def outcomes(request):
    names = selected(request, "name")
    with pytest.MonkeyPatch.context() as patch:  # as users run them (tests/conftest.py: off)
        patch.setenv("JUJU_PROGRAM_KERNELS", "1")
        found = run_programs([program for name, program in PROGRAMS.items() if name in names])
    RATIO_ROWS[:] = ratio_table(found.values())  # printed in the summary (conftest.py)
    return found


@pytest.mark.parametrize("name", [_param(p) for p in PROGRAMS.values()])
def test_program(outcomes, name):
    outcome = outcomes[name]
    if outcome.status == "skip":
        pytest.skip(f"{outcome.error} (pip install -r tests/programs/requirements.txt)")
    if outcome.status == "fail":
        raise AssertionError(f"{name} failed at {outcome.stage}") from outcome.error
    assert outcome.status == "pass"


def test_tier_size():
    assert len(PROGRAMS) >= 25
    assert sum(p.ci for p in PROGRAMS.values()) <= 6  # CI's subset stays one cheap compile
