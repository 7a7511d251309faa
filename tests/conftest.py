"""Test-suite configuration: the tests measure MAX, so nothing is tiered.

A tiered function answers its first calls from `jax.jit` (juju/tiers.py);
a test comparing juju with `jax.jit` would then compare XLA with XLA and
prove nothing. `JUJU_TIERED=0` (inherited by the subprocesses tests start)
makes every `juju.jit` wait for MAX; tests/test_tiered.py asks for tiers
explicitly with `juju.jit(f, tiered=True)`.
"""

import os

os.environ["JUJU_TIERED"] = "0"
# Small programs would become one generated Mojo kernel each
# (juju_kernels_mojo/program_kernels.py) and no longer test the lowering
# rules; tests/test_program_kernels.py and the programs tier turn them on.
os.environ.setdefault("JUJU_PROGRAM_KERNELS", "0")

from collections import defaultdict

_seconds_per_module: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    _seconds_per_module[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    """Seconds per test module (compiles included): where CI's time goes on a cold cache."""
    slowest = sorted(_seconds_per_module.items(), key=lambda item: -item[1])[:15]
    if slowest and slowest[0][1] >= 30:
        terminalreporter.write_sep("-", "seconds per test module (slowest 15)")
        for module, seconds in slowest:
            terminalreporter.write_line(f"{seconds:8.1f}  {module}")
