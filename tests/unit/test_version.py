"""``--version`` on the three console scripts: ``<prog> <version>`` from the installed metadata."""

from __future__ import annotations

from importlib import metadata

import pytest

from node_agent import cli as agent_cli
from node_agent import version
from scheduler_extender import cli as extender_cli
from scheduler_extender import gpuplace_cli
from tests.harness.artifacts import project_version

MAINS = [
    pytest.param("gpuplace-extender", extender_cli.main, id="gpuplace-extender"),
    pytest.param("gpuplace-agent", agent_cli.main, id="gpuplace-agent"),
    pytest.param("gpuplace", gpuplace_cli.main, id="gpuplace"),
]


@pytest.mark.parametrize("prog, main", MAINS)
def test_version_prints_prog_and_the_installed_version_and_exits_0(prog, main, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out, err = capsys.readouterr()
    assert out == f"{prog} {metadata.version('gpuplace')}\n"
    assert err == ""


def test_the_installed_version_is_pyprojects():
    # The test environment is `pip install -e .` of this tree (make install reinstalls when
    # pyproject.toml changes), so its metadata carries pyproject's version.
    assert version.package_version() == project_version()


@pytest.mark.parametrize("prog, main", MAINS)
def test_version_wins_over_other_arguments_and_required_subcommands(prog, main, capsys):
    # `gpuplace` requires a subcommand and the extender rejects some combinations after parsing;
    # --version answers before either.
    with pytest.raises(SystemExit) as exit_info:
        main({"gpuplace-extender": ["--version", "--policy-configmap", "ns/name", "--policy", "x.yaml"],
              "gpuplace-agent": ["--version", "--probe", "fake"],
              "gpuplace": ["--version", "policy"]}[prog])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"{prog} ")


@pytest.mark.parametrize("prog, main", MAINS)
def test_help_lists_version(prog, main, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--version" in capsys.readouterr().out


def test_not_installed_says_so_instead_of_failing(monkeypatch, capsys):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version.metadata, "version", missing)
    assert version.package_version() == version.NOT_INSTALLED
    with pytest.raises(SystemExit) as exit_info:
        gpuplace_cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("gpuplace unknown (the gpuplace distribution is not installed")
    assert "pip install" in out
