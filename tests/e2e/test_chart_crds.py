"""The chart's optional custom resources created for real, against their projects' own CRDs.

The ServiceMonitor, PodMonitor and PrometheusRule (prometheus-operator) and the cert-manager
Issuers and Certificates are only rendered elsewhere; here the CRDs are applied to the real API
server, taken from the projects' Go modules by ``hack/install-chart-tools.sh crds``
(github.com/prometheus-operator/prometheus-operator ``example/prometheus-operator-crd-full/``,
github.com/cert-manager/cert-manager ``deploy/crds/``, versions in that script), and the chart is
installed with ``helm install`` with monitoring and cert-manager switched on. The CRDs' structural
schemas validate each object, and prune any field they do not know: every field the chart renders
must come back from the server. No cert-manager or prometheus-operator controller runs, so the
Certificates are never issued: what is tested is that the API accepts what the chart writes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.harness.chart_tools import crd_files
from tests.harness.controlplane import ControlPlane, K8S_VERSION, skip_if_e2e_disabled
from tests.harness.gpucluster import ROOT
from tests.harness.helm import Helm, helm_control_plane

pytestmark = pytest.mark.e2e

CHART = ROOT / "deploy" / "helm" / "gpuplace"
NS = "gpuplace-crds"
RELEASE = "gpuplace"
CRDS = ("servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com", "certificates.cert-manager.io", "issuers.cert-manager.io",
        "clusterissuers.cert-manager.io", "certificaterequests.cert-manager.io")
VALUES = {
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                "podMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True},
    "extender": {"tls": {"enabled": True, "certManager": {"enabled": True}, "clientAuth": {"enabled": True}}},
}
# (group, version, plural, name) of every custom object the chart creates with VALUES
EXPECTED = {
    ("monitoring.coreos.com", "v1", "servicemonitors", "gpuplace-extender"),
    ("monitoring.coreos.com", "v1", "podmonitors", "gpuplace-agent"),
    ("monitoring.coreos.com", "v1", "prometheusrules", "gpuplace"),
    ("cert-manager.io", "v1", "issuers", "gpuplace-extender-selfsigned"),
    ("cert-manager.io", "v1", "issuers", "gpuplace-extender-ca"),
    ("cert-manager.io", "v1", "certificates", "gpuplace-extender-ca"),
    ("cert-manager.io", "v1", "certificates", "gpuplace-extender-tls"),
    ("cert-manager.io", "v1", "certificates", "gpuplace-scheduler-client-tls"),
}
PLURALS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules",
           "Issuer": "issuers", "Certificate": "certificates"}


def _kubectl(cp: ControlPlane, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(cp.binaries.kubectl), "--kubeconfig", str(cp.kubeconfig_path), *args],
                          input=stdin, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
    return proc


def _missing(rendered: Any, served: Any, path: str = "") -> list[str]:
    """Paths of ``rendered`` that ``served`` lacks or holds differently (server defaults may add more)."""
    if isinstance(rendered, dict):
        if not isinstance(served, dict):
            return [path or "."]
        return [p for k, v in rendered.items()
                for p in (_missing(v, served[k], f"{path}.{k}") if k in served else [f"{path}.{k}"])]
    if isinstance(rendered, list):
        if not isinstance(served, list) or len(served) != len(rendered):
            return [path]
        return [p for i, (a, b) in enumerate(zip(rendered, served)) for p in _missing(a, b, f"{path}[{i}]")]
    return [] if rendered == served else [path]


@pytest.fixture(scope="module")
def crd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, k8s.ApiClient, Helm]]:
    """A control plane with the prometheus-operator and cert-manager CRDs applied and Established."""
    skip_if_e2e_disabled()
    files = crd_files()
    work = tmp_path_factory.mktemp("chart-crds")
    with helm_control_plane(work, NS) as (cp, api, helm):
        for crd in CRDS:
            # server-side: the full CRDs are too large for client-side apply's last-applied annotation
            _kubectl(cp, "apply", "--server-side", "-f", str(files[crd]))
        _kubectl(cp, "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{c}" for c in CRDS))
        yield cp, api, helm


@pytest.fixture(scope="module")
def installed(crd_cluster, tmp_path_factory) -> list[dict[str, Any]]:
    """``helm install`` with monitoring and cert-manager on; returns the release's rendered manifest."""
    _, _, helm = crd_cluster
    values = tmp_path_factory.mktemp("values") / "crds-values.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    helm("install", RELEASE, str(CHART), "--namespace", NS, "-f", str(values))
    manifest = helm("get", "manifest", RELEASE, "--namespace", NS).stdout
    return [d for d in yaml.safe_load_all(manifest) if d]


def test_helm_install_creates_every_monitoring_and_cert_manager_object(crd_cluster, installed):
    _, api, _ = crd_cluster
    custom = k8s.CustomObjectsApi(api)
    found = set()
    for group, ver, plural, _ in EXPECTED:
        for item in custom.list_namespaced_custom_object(group, ver, NS, plural)["items"]:
            found.add((group, ver, plural, item["metadata"]["name"]))
    assert found == EXPECTED


def test_every_rendered_field_survives_the_crds_schemas(crd_cluster, installed):
    """A structural schema prunes fields it does not know; a pruned field would be a setting that
    silently does nothing (a misspelt issuerRef, a scrape port in the wrong place)."""
    _, api, _ = crd_cluster
    custom = k8s.CustomObjectsApi(api)
    checked = 0
    for doc in installed:
        if doc["kind"] not in PLURALS:
            continue
        group, ver = doc["apiVersion"].split("/")
        served = custom.get_namespaced_custom_object(group, ver, NS, PLURALS[doc["kind"]], doc["metadata"]["name"])
        assert not _missing(doc["spec"], served["spec"]), (doc["kind"], doc["metadata"]["name"],
                                                          _missing(doc["spec"], served["spec"]))
        assert doc["metadata"]["labels"].items() <= served["metadata"]["labels"].items()
        checked += 1
    assert checked == len(EXPECTED)


def test_the_crds_schemas_do_validate(crd_cluster, installed):
    """Not a vacuous pass: the same objects with a value their schema forbids are refused."""
    cp, _, _ = crd_cluster
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in installed}
    cert = by_name[("Certificate", "gpuplace-extender-tls")]
    bad_cert = {**cert, "spec": {**cert["spec"], "privateKey": {**cert["spec"]["privateKey"], "algorithm": "DSA"}}}
    sm = by_name[("ServiceMonitor", "gpuplace-extender")]
    bad_sm = {**sm, "spec": {**sm["spec"], "endpoints": [{**sm["spec"]["endpoints"][0], "scheme": "gopher"}]}}
    for bad, reason in ((bad_cert, "spec.privateKey.algorithm"), (bad_sm, "spec.endpoints[0].scheme")):
        proc = _kubectl(cp, "apply", "--dry-run=server", "--namespace", NS, "-f", "-",
                        stdin=yaml.safe_dump(bad), check=False)
        assert proc.returncode != 0 and reason in proc.stderr, proc.stdout + proc.stderr


def test_a_cluster_issuer_reference_is_accepted(crd_cluster):
    cp, _, helm = crd_cluster
    rendered = helm("template", "corp", str(CHART), "--namespace", NS, "--kube-version", K8S_VERSION.lstrip("v"),
                    "--api-versions", "cert-manager.io/v1/Certificate", "--show-only", "templates/extender-tls.yaml",
                    "--set", "extender.tls.enabled=true", "--set", "extender.tls.certManager.enabled=true",
                    "--set", "extender.tls.certManager.issuerRef.name=corp-ca",
                    "--set", "extender.tls.certManager.issuerRef.kind=ClusterIssuer",
                    "--set", "extender.tls.certManager.issuerRef.group=cert-manager.io").stdout
    proc = _kubectl(cp, "apply", "--dry-run=server", "--namespace", NS, "-f", "-", stdin=rendered, check=False)
    assert proc.returncode == 0, proc.stderr
    # the serving certificate, and kube-scheduler's client one (clientAuth is on by default)
    assert proc.stdout.strip().splitlines() == [
        "certificate.cert-manager.io/corp-gpuplace-extender-tls created (server dry run)",
        "certificate.cert-manager.io/corp-gpuplace-scheduler-client-tls created (server dry run)"]


def test_uninstall_removes_them(crd_cluster, installed):
    _, api, helm = crd_cluster
    helm("uninstall", RELEASE, "--namespace", NS)
    custom = k8s.CustomObjectsApi(api)
    left = [(plural, i["metadata"]["name"]) for group, ver, plural, _ in EXPECTED
            for i in custom.list_namespaced_custom_object(group, ver, NS, plural)["items"]]
    assert not left
