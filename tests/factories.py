"""Builders for pods and inventories used across the unit tests."""

from __future__ import annotations

import contextlib
import copy
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from tests.harness.controlplane import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def pod(annotations: dict[str, str] | None = None, *, gpus: int | str | None = 1, resource: str = "nvidia.com/gpu",
        name: str = "job", namespace: str = "default") -> dict[str, Any]:
    """A v1.Pod as kube-scheduler sends it (decoded JSON), GPUs in limits."""
    limits = {resource: str(gpus)} if gpus is not None else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                     "annotations": dict(annotations or {})},
        "spec": {"schedulerName": "gpuplace-scheduler",
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"limits": limits, "requests": {"cpu": "100m"}}}]},
    }


def example_inventory(node: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / "cluster" / f"{node}.json").read_text())


def inventory(node: str = "node-a", gpus: list[dict[str, Any]] | None = None, **top: Any) -> dict[str, Any]:
    doc = {"apiVersion": "gpuplace.io/v1alpha1", "kind": "NodeGPUInventory", "nodeName": node,
           "observedAt": "2026-11-21T08:00:00Z", "gpus": gpus or []}
    doc.update(top)
    return doc


def gpu(index: int, name: str = "NVIDIA GeForce RTX 4090", memory_mib: int = 24564, **extra: Any) -> dict[str, Any]:
    g = {"index": index, "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000", "vendor": "nvidia",
         "name": name, "memoryMiB": memory_mib}
    g.update(extra)
    return g


def with_nvlink_clique(gpus: list[dict[str, Any]], links: int = 12) -> list[dict[str, Any]]:
    out = copy.deepcopy(gpus)
    for g in out:
        g["nvlinks"] = [{"peerUuid": o["uuid"], "links": links} for o in out if o["uuid"] != g["uuid"]]
    return out


@contextlib.contextmanager
def static_extender(*extra_args: str, inventory_dir: Path = EXAMPLES / "cluster") -> Iterator[str]:
    """The real ``gpuplace-extender`` console script in static mode on a free loopback port; yields
    its base URL once ``/readyz`` answers, stops it with SIGTERM afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "scheduler_extender.cli", "--inventory-dir", str(inventory_dir),
                             "--host", "127.0.0.1", "--port", str(port), *extra_args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
