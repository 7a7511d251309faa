"""The programs tier's summary: each program's sizes side by side, measured
in the run (tests/programs/report.py)."""

from tests.programs.report import REPORT


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.section("programs: juju / jax.jit by size, first calls, back ends")
        for row in REPORT:
            terminalreporter.write_line(row)
