"""A fake GPU cluster on a real control plane: Nodes from inventory files, the extender, pods.

Shared by the end-to-end tests, ``make demo`` and the benchmarks. Nodes have no kubelet: each is
a Node object whose ``status.allocatable`` holds the GPU resources a device plugin would
advertise for its inventory, and whose ``gpuplace.io/inventory`` annotation is published by
``gpuplace-agent --probe fake`` (the real agent code path), exactly as on a GPU node.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from kubernetes import client as k8s

from node_agent.inventory import ANNOTATION, parse_inventory
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.devices import allocatable_from_view, build_node_view
from tests.harness.controlplane import ControlPlane, ExtenderSpec, SchedulerSpec, create_node, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_NAME = "gpuplace-scheduler"


def node_allocatable(inventory_doc: Mapping[str, Any]) -> dict[str, str]:
    """Extended resources a device plugin would advertise for this inventory (healthy units)."""
    view = build_node_view(parse_inventory(dict(inventory_doc)), default_catalog())
    return {k: str(v) for k, v in allocatable_from_view(view).items()}


def publish_inventory_with_agent(kubeconfig: Path, inventory_file: Path, node: str, *, timeout: float = 60) -> None:
    """Run ``gpuplace-agent --probe fake --once`` for one node (the agent stamps observedAt)."""
    cmd = [sys.executable, "-m", "node_agent.cli", "--probe", "fake", "--fake-inventory", str(inventory_file),
           "--node-name", node, "--once", "--kubeconfig", str(kubeconfig), "--metrics-port", "0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"gpuplace-agent failed for {node} (exit {proc.returncode}): {proc.stderr[-2000:]}")


def publish_inventory_direct(api: k8s.ApiClient, node: str, inventory_doc: Mapping[str, Any]) -> None:
    """Patch the annotation as the agent would, without a process per node (benchmarks)."""
    doc = {**inventory_doc, "nodeName": node,
           "observedAt": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    inv = parse_inventory(doc)
    k8s.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {ANNOTATION: inv.to_json()}}})


def create_gpu_nodes(cp: ControlPlane, inventory_dir: Path, *, publish: str = "agent") -> list[str]:
    """Create one Node per inventory file and publish its inventory.

    ``publish``: ``"agent"`` runs ``gpuplace-agent --probe fake --once`` per node (the real
    agent path), ``"direct"`` patches the annotation from here, ``"none"`` leaves it absent.
    """
    api = cp.api_client()
    names = []
    for path in sorted(inventory_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        name = doc["nodeName"]
        create_node(api, name, node_allocatable(doc), labels={"gpuplace.io/fake-node": "true"})
        if publish == "agent":
            publish_inventory_with_agent(cp.kubeconfig_path, path, name)
        elif publish == "direct":
            publish_inventory_direct(api, name, doc)
        names.append(name)
    return names


@dataclass
class ExtenderProcess:
    """``gpuplace-extender`` in cluster mode, as a child process."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    #: Set for an extender serving HTTPS (``--tls-*`` in ``extra_args``): verifies its certificate.
    ssl_context: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2, context=self.ssl_context) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def ready(self) -> bool:
        """Alive and ``/readyz`` 200: a Service's readiness probe (``tcpproxy.TCPProxy`` ready_checks)."""
        try:
            return self.proc.poll() is None and self.get("/readyz")[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_extender(kubeconfig: Path, log_dir: Path, *, port: int | None = None, policy: Path | None = None,
                   wait_ready: float = 60, extra_args: Iterable[str] = (),
                   ssl_context: ssl.SSLContext | None = None) -> ExtenderProcess:
    """Start the extender against the control plane and wait for ``/readyz`` (caches synced).

    For HTTPS pass the ``--tls-*`` options in ``extra_args`` and an ``ssl_context`` that trusts
    the serving certificate (and holds a client certificate if the extender requires one).
    """
    port = port or free_port()
    log_path = log_dir / f"extender-{port}.log"
    cmd = [sys.executable, "-m", "scheduler_extender.cli", "--kubeconfig", str(kubeconfig),
           "--host", "127.0.0.1", "--port", str(port), "--debug-endpoints", *extra_args]
    if policy is not None:
        cmd += ["--policy", str(policy)]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    ext = ExtenderProcess(proc, port, log_path, ssl_context)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"gpuplace-extender exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
        try:
            return ext.get("/readyz")[0] == 200
        except OSError:
            return False

    wait_for(ready, wait_ready, interval=0.1, message="gpuplace-extender not ready")
    return ext


def add_gpuplace_scheduler(cp: ControlPlane, extender: ExtenderProcess, **extender_kw: Any) -> None:
    cp.add_scheduler(SchedulerSpec(name=SCHEDULER_NAME, extender=ExtenderSpec(url_prefix=extender.url, **extender_kw)))


def load_pod_manifests(pod_dir: Path) -> list[dict[str, Any]]:
    pods = []
    for path in sorted(pod_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Pod":
                pods.append(doc)
    return pods


def _quantities_as_strings(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """YAML reads ``nvidia.com/gpu: 8`` as an int; the API (and the typed client) want strings."""
    m = json.loads(json.dumps(manifest))
    for group in ("containers", "initContainers"):
        for c in (m.get("spec") or {}).get(group) or []:
            for key in ("limits", "requests"):
                res = (c.get("resources") or {}).get(key)
                if res:
                    c["resources"][key] = {k: str(v) for k, v in res.items()}
    return m


def create_pods(api: k8s.ApiClient, manifests: Iterable[Mapping[str, Any]], namespace: str = "default") -> list[str]:
    core = k8s.CoreV1Api(api)
    names = []
    for m in manifests:
        ns = m.get("metadata", {}).get("namespace", namespace)
        core.create_namespaced_pod(ns, _quantities_as_strings(m))
        names.append(m["metadata"]["name"])
    return names


def wait_placements(api: k8s.ApiClient, names: Iterable[str], *, namespace: str = "default", timeout: float = 60,
                    settle_pending: float = 5) -> dict[str, str | None]:
    """Node of each pod once bound; None for pods still Pending after every other pod settled."""
    core = k8s.CoreV1Api(api)
    names = list(names)
    deadline = time.monotonic() + timeout
    placed: dict[str, str | None] = {}
    last_change = time.monotonic()
    while time.monotonic() < deadline:
        for n in names:
            if placed.get(n):
                continue
            node = core.read_namespaced_pod(n, namespace).spec.node_name
            if node:
                placed[n] = node
                last_change = time.monotonic()
        if all(placed.get(n) for n in names):
            break
        if time.monotonic() - last_change > settle_pending and any(placed.get(n) for n in names):
            break
        time.sleep(0.2)
    return {n: placed.get(n) for n in names}


def gpu_pod_manifest(name: str, gpus: int = 1, *, resource: str = "nvidia.com/gpu", namespace: str = "default",
                     scheduler: str = SCHEDULER_NAME, annotations: Mapping[str, str] | None = None,
                     node: str | None = None) -> dict[str, Any]:
    """A pause pod asking for ``gpus`` units of ``resource``, for the scheduler named ``scheduler``;
    ``node`` pins it with a ``kubernetes.io/hostname`` nodeSelector."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {resource: str(gpus)}, "requests": {"cpu": "10m", "memory": "16Mi"}}}],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}, "spec": spec}
