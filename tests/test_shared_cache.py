"""Processes sharing one cache (issue 55): every cache juju writes (Mojo
kernel libraries and their generated sources, MAX's compiled MEFs and their
index files) is safe under processes building the same entries at once and
under a process killed mid-build; a daemon thread's build at exit aborts
nothing.

CI runs one round of tests/shared_cache/run.py (processes at once on a fresh
cache, one killed mid-build, one exiting while it compiles); `python3 dev.py
shared-cache --rounds 20` runs the long one, whose pytest-xdist rounds run
this module's `processes`-marked cases with `-n 4 --dist load`.
"""

from __future__ import annotations

import argparse
import random

import pytest

from tests.shared_cache import run
from tests.shared_cache.programs import PROGRAMS, check


@pytest.fixture
def program_kernels_on(monkeypatch):
    monkeypatch.setenv("JUJU_PROGRAM_KERNELS", "1")  # as users have it (conftest turns it off)
    monkeypatch.delenv("JUJU_NATIVE_PROGRAMS", raising=False)


@pytest.mark.processes
@pytest.mark.parametrize("copy", [1, 2])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program(name, copy, program_kernels_on):
    """Each program twice: under `--dist load`, workers build it at once."""
    report = check([name])
    assert report["results"] == {name: "ok"}, report
    assert not report["warnings"], report


def test_a_round_with_a_process_killed_mid_build():
    """Three processes on an empty cache, a fourth killed when its Mojo
    compiler runs, a fifth exiting while MAX compiles; then a new process
    finds every entry whole."""
    args = argparse.Namespace(processes=3, kill_every=1, xdist_every=0, timeout=1200.0)
    problems, kind = run.one_round(1, args, run.users_max_cache(), _MojoFirst())
    assert not problems, f"{kind}:\n" + "\n".join(problems)
    assert "killed (mojo" in kind or "ended first" in kind, kind


class _MojoFirst(random.Random):
    """Chooses the kill when a Mojo compiler runs."""

    def choice(self, seq):
        return "mojo"
