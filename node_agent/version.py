"""The installed gpuplace version and the ``--version`` flag of the three console scripts.

``gpuplace-extender``, ``gpuplace-agent`` and ``gpuplace`` all print ``<prog> <version>``, the
version from the installed distribution's metadata (``pyproject.toml``'s ``version`` as ``pip
install`` recorded it). It lives here, in the agent's package, because that is the layer the other
two already import (``node_agent.inventory``); it imports nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Any, Sequence

DISTRIBUTION = "gpuplace"
NOT_INSTALLED = "unknown (the gpuplace distribution is not installed: `pip install .` or `pip install -e .`)"


def package_version() -> str:
    """The version of the installed ``gpuplace`` distribution, or ``NOT_INSTALLED`` (a sentence
    saying so) when the modules are imported from a source tree that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def version_line(prog: str) -> str:
    """``"<prog> <version>"``, what ``--version`` prints."""
    return f"{prog} {package_version()}"


class _VersionAction(argparse.Action):
    """Like argparse's ``version`` action, but reads the metadata only when ``--version`` is given
    (not on every start) and prints to stdout."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help or "print the program's name and gpuplace's version, then exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_line(parser.prog), file=sys.stdout, flush=True)
        parser.exit(0)


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--version`` to ``parser`` (top level: it wins over required subcommands)."""
    parser.add_argument("--version", action=_VersionAction)
