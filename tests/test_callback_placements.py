"""The callback placement generator (tests/callback_gen): host callbacks of
every kind at every nesting juju knows, under every transformation, each
case compared with jax.jit (values, host calls, printed lines, the error a
firing guard raises).

CI runs `ci_slice()`: each nest, kind and transform at least once, all in
one MAX compilation, with the program kernels off (as the rest of the suite)
and a few of them again with the kernels on (as users run them). The full
run is `python3 dev.py callbacks` (docs/callbacks.md gives its count), or
this module's `full`-marked test.
"""

from __future__ import annotations

import pytest

from tests.callback_gen import cases as C
from tests.callback_gen.run import run_cases

SLICE = C.ci_slice()
WITH_KERNELS = C.kernel_slice()


@pytest.fixture(scope="module")
def outcomes():
    return {o.case.name: o for o in run_cases(SLICE, batch=len(SLICE))}


@pytest.fixture(scope="module")
def kernel_outcomes():
    with pytest.MonkeyPatch.context() as patch:  # as users run them (tests/conftest.py: off)
        patch.setenv("JUJU_PROGRAM_KERNELS", "1")
        return {o.case.name: o for o in run_cases(WITH_KERNELS, batch=len(WITH_KERNELS))}


def _assert_passes(outcome):
    assert outcome.status in ("pass", "rejected"), (
        f"{outcome.case.source()}\nfailed at {outcome.stage}: {outcome.detail}")


@pytest.mark.parametrize("name", [c.name for c in SLICE])
def test_slice(outcomes, name):
    _assert_passes(outcomes[name])


@pytest.mark.parametrize("name", [c.name for c in WITH_KERNELS])
def test_slice_with_program_kernels(kernel_outcomes, name):
    _assert_passes(kernel_outcomes[name])


def test_slice_covers_every_nest_kind_and_transform():
    assert {n for c in SLICE for n in c.nesting} == set(C.NESTS)
    assert {c.kind for c in SLICE} == set(C.KINDS)
    assert {c.transform for c in SLICE} == set(C.TRANSFORMS)
    assert max(len(c.nesting) for c in SLICE) == 3


@pytest.mark.full
def test_full_run():
    failed = [o for o in run_cases(C.all_cases()) if o.status == "fail"]
    assert not failed, "\n".join(f"{o.case.name} at {o.stage}: {o.detail[:300]}"
                                 for o in failed[:20])


#: Cases of the full run that fail today (docs/callbacks.md, "Part 1 of 10").
KNOWN_FAILURES = {
    "vmap.jacfwd/while/pure": "a dead while carry's pure callback runs; XLA drops it "
                              "(juju has no DCE of dead while carries)",
    "vmap.jacfwd/jit.while/guard": "the same: a dead while carry's guarded callback runs",
    "vmap.grad/checkpoint.switch.cond/eqx": "MAX fails to compile the graph juju builds "
                                            "(a typed CompileError)",
}


@pytest.mark.full
@pytest.mark.parametrize("name", sorted(KNOWN_FAILURES))
def test_known_failures_of_the_full_run(name):
    (case,) = [c for c in C.all_cases() if c.name == name]
    (outcome,) = run_cases([case], batch=1)
    if outcome.status == "fail":
        pytest.xfail(KNOWN_FAILURES[name])
    _assert_passes(outcome)
