"""The fuzzing tier (tests/fuzz): random jax.numpy/lax programs vs jax.jit.

CI runs a fixed-seed sample, all in one MAX compilation. The long run
(`python3 dev.py fuzz --count 2000`, or this module's `fuzz`-marked test with
JUJU_FUZZ_COUNT) draws many more; known mismatches are data in
tests/fuzz/run.py (`KNOWN`) and xfail with their reason.
"""

from __future__ import annotations

import os

import pytest

from tests.fuzz.run import draw_programs, run, run_batch

SAMPLE = draw_programs(18, seed_value=20261123) + draw_programs(6, seed_value=7, x64=True)


@pytest.fixture(scope="module")
def outcomes():
    return run_batch(SAMPLE)


@pytest.mark.parametrize("index", range(len(SAMPLE)))
def test_sample_program(outcomes, index):
    outcome = outcomes[index]
    if outcome.status == "known":
        pytest.xfail(outcome.detail)
    if outcome.status == "skip":
        pytest.skip(outcome.detail)
    assert outcome.status == "pass", f"\n{outcome.program.source()}\n{outcome.detail}"


@pytest.mark.fuzz
def test_long_run():
    count = int(os.environ.get("JUJU_FUZZ_COUNT", "2000"))
    failures = [o for o in run(count, seed_value=1) if o.status == "fail"]
    assert not failures, "\n\n".join(f"{o.program.source()}\n{o.detail}" for o in failures[:5])
