"""The chart as chart-testing and helm-unittest see it: ``ct lint`` at its defaults (less the two
checks that need the network or a git remote), the helm-unittest suites of the templates' logic
(``deploy/helm/gpuplace/tests/*_test.yaml``), and what ``helm package`` puts in the chart.

The tools are built from the Go module proxy by ``hack/install-chart-tools.sh`` (cached by
version); Helm by ``hack/build-control-plane.sh helm``. No cluster is needed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.harness.chart_tools import ChartToolsError, Ct, ensure_ct, ensure_helm_unittest
from tests.harness.controlplane import BinariesError, ensure_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuplace"
# The venv running the tests (.venv, or .venv-minimums under make test-minimums): its yamllint and yamale.
VENV_BIN = Path(sys.executable).parent

pytestmark = pytest.mark.chart


def _or_skip(build):
    """The tool, or a skip when it cannot be built because Go is missing (a build error fails)."""
    try:
        return build()
    except (ChartToolsError, BinariesError):
        if shutil.which("go") is None:
            pytest.skip("Go is not installed: the chart tools cannot be built")
        raise


@pytest.fixture(scope="module")
def helm() -> Path:
    return _or_skip(ensure_helm)


@pytest.fixture(scope="module")
def ct() -> Ct:
    return _or_skip(ensure_ct)


def _env(tmp: Path, helm: Path, **extra: str) -> dict[str, str]:
    """helm (and yamllint, yamale from the virtualenv) on PATH; Helm's homes private to the test."""
    path = os.pathsep.join([str(helm.parent), str(VENV_BIN), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "HELM_CACHE_HOME": str(tmp / "cache"),
            "HELM_CONFIG_HOME": str(tmp / "config"), "HELM_DATA_HOME": str(tmp / "data"), **extra}


def ct_lint(ct: Ct, helm: Path, chart: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """``ct lint`` of ``chart`` with ct's defaults, except:

    * ``--validate-maintainers=false``: ct checks each maintainer name by an HTTP HEAD of
      https://github.com/NAME (the host of the git remote ``origin``): it needs the network and a remote;
    * ``--check-version-increment=false``: ct compares Chart.yaml's version with the one on
      ``origin/main`` (git merge-base): it needs that remote branch.

    Everything else runs at its default: the yamale schema of Chart.yaml, yamllint of Chart.yaml,
    values.yaml and ci/*-values.yaml with ct's lintconf, ``helm dependency build``, and ``helm
    lint`` once per ci/*-values.yaml. ct's etc/ files are passed by path (ct would look for them in
    ./, ~/.ct and /etc/ct). ``--charts`` names the chart: ct otherwise finds changed charts with git.
    """
    for tool in ("yamllint", "yamale"):
        if not (VENV_BIN / tool).exists() and shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: pip install -e '.[test]'")
    return subprocess.run(
        [str(ct.binary), "lint", "--charts", str(chart), "--chart-yaml-schema", str(ct.chart_schema),
         "--lint-conf", str(ct.lintconf), "--validate-maintainers=false", "--check-version-increment=false"],
        cwd=tmp, env=_env(tmp, helm), capture_output=True, text=True, timeout=300)


def test_ct_lint_passes(ct, helm, tmp_path):
    proc = ct_lint(ct, helm, CHART, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "All charts linted successfully" in out
    assert "Validation success!" in out  # yamale ran on Chart.yaml
    for scenario in sorted((CHART / "ci").glob("*-values.yaml")):  # helm lint ran with each
        assert f'Linting chart with values file "{scenario}"' in out, scenario.name


def test_ct_lint_fails_on_what_its_schema_and_lintconf_forbid(ct, helm, tmp_path):
    """Not a vacuous pass: a maintainer without a name (yamale) and a trailing space (yamllint) fail."""
    for name, edit, reason in (
        ("maintainer-without-name", lambda d: (d / "Chart.yaml").write_text(
            (d / "Chart.yaml").read_text().replace("- name: gpuplace\n  url:", "- url:")),
         "maintainers.0.name: Required field missing"),
        ("trailing-space", lambda d: (d / "values.yaml").write_text(
            (d / "values.yaml").read_text().replace("replicas: 2\n", "replicas: 2 \n", 1)),
         "trailing spaces  (trailing-spaces)"),
    ):
        chart = tmp_path / name / "gpuplace"
        shutil.copytree(CHART, chart)
        edit(chart)
        proc = ct_lint(ct, helm, chart, tmp_path / name)
        assert proc.returncode != 0, f"{name}: ct lint passed"
        assert reason in proc.stdout + proc.stderr, f"{name}: {(proc.stdout + proc.stderr)[-2000:]}"


def test_chart_has_maintainers():
    """The part of ct's maintainer validation that needs no network: a chart that is not deprecated
    names its maintainers."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert not chart.get("deprecated")
    assert chart["maintainers"] and all(m.get("name") for m in chart["maintainers"])


def test_helm_unittest_suites_pass(helm, tmp_path):
    plugins = _or_skip(ensure_helm_unittest)
    # As `helm unittest` (a Helm plugin); the same binary runs alone: plugins/unittest/untt CHART
    proc = subprocess.run([str(helm), "unittest", "--color=false", str(CHART)],
                          env=_env(tmp_path, helm, HELM_PLUGINS=str(plugins)),
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    m = re.search(r"^Tests:\s+(\d+) passed, (\d+) total", out, re.MULTILINE)
    assert m and m.group(1) == m.group(2), out[-3000:]
    suites = sorted((CHART / "tests").glob("*_test.yaml"))
    assert f"Test Suites: {len(suites)} passed, {len(suites)} total" in out
    print(f"\nhelm-unittest: {m.group(1)} tests in {len(suites)} suites passed")


def test_every_template_is_covered_by_a_unittest_suite():
    covered: set[str] = set()
    for suite in (CHART / "tests").glob("*_test.yaml"):
        doc = yaml.safe_load(suite.read_text())
        covered |= {t.removeprefix("templates/") for t in doc.get("templates", [])}
    templates = {str(p.relative_to(CHART / "templates")) for p in (CHART / "templates").rglob("*")
                 if p.is_file() and not p.name.startswith("_") and p.suffix in (".yaml", ".txt")}
    assert templates - covered == set(), "templates without a helm-unittest suite"


def test_the_packaged_chart_leaves_the_unittest_suites_out(helm, tmp_path):
    subprocess.run([str(helm), "package", str(CHART), "--destination", str(tmp_path)],
                   env=_env(tmp_path, helm), check=True, capture_output=True, text=True)
    (package,) = tmp_path.glob("gpuplace-*.tgz")
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
    assert "gpuplace/templates/tests/test-extender.yaml" in names  # the `helm test` hook stays
    assert "gpuplace/values.schema.json" in names
    assert not [n for n in names if n.startswith("gpuplace/tests/")], sorted(names)
