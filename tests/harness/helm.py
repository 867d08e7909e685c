"""Helm against the test control plane, and kubeconfigs that authenticate as a chart's ServiceAccounts.

Shared by the chart's end-to-end tests (``tests/e2e/test_helm.py``, ``test_chart_security.py``):

* :class:`Helm` runs the cached Helm binary (:func:`~tests.harness.controlplane.ensure_helm`) with a
  private home and the control plane's kubeconfig;
* :func:`sa_kubeconfig` writes a kubeconfig holding a TokenRequest token of a ServiceAccount, so a
  component runs with exactly the RBAC the chart gives it; ``bound_pod`` binds the token to a Pod
  object, as the kubelet does for a Pod's projected token: the API server then puts the Pod's node
  in the user's extra ``authentication.kubernetes.io/node-name`` (Kubernetes >= 1.30), which the
  chart's admission policy reads.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml
from kubernetes import client as k8s

from tests.harness.controlplane import ControlPlane, ensure_helm

__all__ = ["Helm", "helm_control_plane", "sa_kubeconfig", "sa_token"]


class Helm:
    """``helm ARGS --kubeconfig KUBECONFIG`` with Helm's cache/config/data under ``home``."""

    def __init__(self, binary: Path, kubeconfig: Path, home: Path) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig
        self.env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
                    "HELM_DATA_HOME": str(home / "data")}

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run Helm; with ``check``, a non-zero exit raises AssertionError carrying Helm's stderr."""
        proc = subprocess.run([str(self.binary), *args, "--kubeconfig", str(self.kubeconfig)],
                              capture_output=True, text=True, env=self.env, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc


def sa_token(api: k8s.ApiClient, namespace: str, sa: str, bound_pod: k8s.V1Pod | None = None) -> str:
    """A 2-hour token of ServiceAccount ``namespace/sa`` (TokenRequest API), bound to ``bound_pod`` if given."""
    spec = k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)
    if bound_pod is not None:
        spec.bound_object_ref = k8s.V1BoundObjectReference(
            kind="Pod", api_version="v1", name=bound_pod.metadata.name, uid=bound_pod.metadata.uid)
    token = k8s.CoreV1Api(api).create_namespaced_service_account_token(sa, namespace, k8s.AuthenticationV1TokenRequest(spec=spec))
    return str(token.status.token)


def sa_kubeconfig(cp: ControlPlane, api: k8s.ApiClient, namespace: str, sa: str, path: Path,
                  bound_pod: k8s.V1Pod | None = None) -> Path:
    """A kubeconfig (mode 0600) that authenticates as ServiceAccount ``namespace/sa``; see :func:`sa_token`."""
    admin = yaml.safe_load(cp.kubeconfig_path.read_text())
    admin["users"] = [{"name": sa, "user": {"token": sa_token(api, namespace, sa, bound_pod)}}]
    admin["contexts"] = [{"name": sa, "context": {"cluster": admin["clusters"][0]["name"], "user": sa}}]
    admin["current-context"] = sa
    path.write_text(yaml.safe_dump(admin))
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def helm_control_plane(work: Path, namespace: str) -> Iterator[tuple[ControlPlane, k8s.ApiClient, Helm]]:
    """A control plane without schedulers, namespace ``namespace`` created, and Helm pointed at it."""
    with ControlPlane(work / "cp", scheduler_configs=[]) as cp:
        api = cp.api_client()
        k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        yield cp, api, Helm(ensure_helm(), cp.kubeconfig_path, work / "helm-home")
