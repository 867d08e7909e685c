"""Measurements e2e tests print after the run, whatever pytest's capture mode.

Fault and load tests measure (time to converge, RSS per burst) but never assert on speed; they
call :func:`report`, and ``tests/e2e/conftest.py`` prints every line in a "gpuplace measurements"
section of the terminal summary, so ``make test`` shows them without ``-s``.
"""

from __future__ import annotations

import sys

LINES: list[str] = []


def report(line: str) -> None:
    """Keep ``line`` for the summary and echo it to stderr (seen with ``-s`` or on failure)."""
    LINES.append(line)
    print(line, file=sys.stderr, flush=True)
