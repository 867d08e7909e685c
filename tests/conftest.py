"""Hooks for every test suite."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what fault and load tests measured (``tests.harness.report``)."""
    from tests.harness.report import LINES

    if LINES:
        terminalreporter.section("gpuplace measurements")
        for line in LINES:
            terminalreporter.write_line(line)
