"""The fuzzing tier (tests/fuzz): random jax.numpy/lax programs vs jax.jit.

CI runs a fixed-seed sample of 100 programs, every other one through each
back end: as MAX graphs (program kernels off: all in one MAX compilation) and
as native program kernels (on: every kernel the generator writes built in one
Mojo build, the others in one MAX compilation). One back end per program
halves CI's compiles (minutes on a cold cache). The long run (`python3
dev.py fuzz --count 2000 --program-kernels on|off`, or this module's
`fuzz`-marked test with JUJU_FUZZ_COUNT) draws many more; known mismatches are data in
tests/fuzz/run.py (`KNOWN`) and xfail with their reason.
"""

from __future__ import annotations

import logging
import os

import pytest

from tests.fuzz.run import draw_programs, run, run_batch

SAMPLE = draw_programs(75, seed_value=20261123) + draw_programs(25, seed_value=7, x64=True)
BACKENDS = {"graph": "0", "native": "1"}  # JUJU_PROGRAM_KERNELS


def _backend(index: int) -> str:
    return "graph" if index % 2 == 0 else "native"


@pytest.fixture(scope="module")
def outcomes():
    results, warnings = {}, []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("juju").addHandler(handler)
    try:
        for backend, kernels in BACKENDS.items():
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("JUJU_PROGRAM_KERNELS", kernels)
                indices = [i for i in range(len(SAMPLE)) if _backend(i) == backend]
                results.update(zip(indices, run_batch([SAMPLE[i] for i in indices])))
    finally:
        logging.getLogger("juju").removeHandler(handler)
    return results, warnings


def test_both_back_ends_ran_and_no_kernel_fell_back(outcomes):
    results, warnings = outcomes
    assert not [w for w in warnings if "failed to build" in w], warnings
    ran = {b: sum(o.backend == b for i, o in results.items() if _backend(i) == b)
           for b in BACKENDS}
    assert ran["graph"] >= 45 and ran["native"] >= 25, ran  # skips aside


@pytest.mark.parametrize("index", range(len(SAMPLE)), ids=lambda i: f"{i}-{_backend(i)}")
def test_sample_program(outcomes, index):
    outcome = outcomes[0][index]
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
