"""The chart's test tools, built by ``hack/install-chart-tools.sh`` and cached by version.

* :func:`ensure_ct`: chart-testing's ``ct`` and its own ``etc/chart_schema.yaml`` and ``etc/lintconf.yaml``;
* :func:`ensure_helm_unittest`: the helm-unittest plugin directory (``untt`` and ``plugin.yaml``);
* :func:`crd_files`: the CRDs of prometheus-operator and cert-manager, from their Go modules.

The versions are the script's defaults (read from it, so they are written down once), overridden
by the same environment variables it reads (``CT_VERSION``, ``HELM_UNITTEST_VERSION``,
``PROMETHEUS_OPERATOR_VERSION``, ``CERT_MANAGER_VERSION``).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "install-chart-tools.sh"

__all__ = ["ChartToolsError", "Ct", "crd_files", "ensure_ct", "ensure_helm_unittest", "version"]


class ChartToolsError(RuntimeError):
    """``hack/install-chart-tools.sh`` failed or did not leave what it promises."""


def version(var: str) -> str:
    """``$var``, else the script's default for it (``VAR="${VAR:-vX.Y.Z}"``)."""
    if os.environ.get(var):
        return os.environ[var]
    m = re.search(rf'^{var}="\$\{{{var}:-([^}}]+)\}}"$', SCRIPT.read_text(), re.MULTILINE)
    if not m:
        raise ChartToolsError(f"{SCRIPT} declares no default for {var}")
    return m.group(1)


def _run(what: str) -> Path:
    proc = subprocess.run(["bash", str(SCRIPT), what], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise ChartToolsError(f"{SCRIPT} {what} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return Path(lines[-1])


@dataclass(frozen=True)
class Ct:
    binary: Path
    chart_schema: Path  # ct's etc/chart_schema.yaml (yamale schema of Chart.yaml)
    lintconf: Path  # ct's etc/lintconf.yaml (yamllint rules)


def ensure_ct() -> Ct:
    """Build (or find cached) ct; see :mod:`tests.harness.chart_tools`."""
    out = _run("ct") / f"ct-{version('CT_VERSION')}"
    ct = Ct(out / "ct", out / "etc" / "chart_schema.yaml", out / "etc" / "lintconf.yaml")
    for f in (ct.binary, ct.chart_schema, ct.lintconf):
        if not f.is_file():
            raise ChartToolsError(f"{SCRIPT} ct succeeded but {f} is missing")
    return ct


def ensure_helm_unittest() -> Path:
    """Build (or find cached) helm-unittest; return the plugins directory (for ``HELM_PLUGINS``),
    which holds ``unittest/untt``, runnable on its own too."""
    plugins = _run("helm-unittest") / f"helm-unittest-{version('HELM_UNITTEST_VERSION')}" / "plugins"
    if not os.access(plugins / "unittest" / "untt", os.X_OK):
        raise ChartToolsError(f"{SCRIPT} helm-unittest succeeded but {plugins}/unittest/untt is missing")
    return plugins


def crd_files() -> dict[str, Path]:
    """The cached CRD files by CRD name (``servicemonitors.monitoring.coreos.com`` ...)."""
    crds = _run("crds").parent / "crds"
    dirs = [crds / f"prometheus-operator-{version('PROMETHEUS_OPERATOR_VERSION')}",
            crds / f"cert-manager-{version('CERT_MANAGER_VERSION')}"]
    files: dict[str, Path] = {}
    for d in dirs:
        for f in sorted(d.glob("*.yaml")):
            # monitoring.coreos.com_servicemonitors.yaml, cert-manager.io_certificates.yaml
            group, _, plural = f.stem.partition("_")
            files[f"{plural}.{group}"] = f
    if not files:
        raise ChartToolsError(f"no CRDs under {crds}")
    return files
