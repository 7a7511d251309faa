"""The programs tier's summary: each passing program's steady-state ratio to
jax.jit, measured in the run (tests/programs/runner.py)."""

from tests.programs.runner import RATIO_ROWS


def pytest_terminal_summary(terminalreporter):
    if RATIO_ROWS:
        terminalreporter.section("steady state, juju / jax.jit")
        for row in RATIO_ROWS:
            terminalreporter.write_line(row)
