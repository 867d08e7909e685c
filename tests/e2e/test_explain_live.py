"""`gpuplace explain --kubeconfig` against the real API server: Nodes with published inventories
and a pod bound to one of them, read through the official client into the extender's cache."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kubernetes import client as k8s

from tests.harness.controlplane import create_node
from tests.harness.gpucluster import ROOT, node_allocatable, publish_inventory_direct

pytestmark = pytest.mark.e2e

POD = ROOT / "examples" / "pods" / "03-llm-13b-inference.yaml"


NODES = (("gpu-4090-0", "explain-4090"), ("gpu-a6000-0", "explain-a6000"), ("gpu-a6000-0", "explain-a6000-busy"))


@pytest.fixture
def explain_nodes(api):
    """Three cordoned nodes (other tests' pods never land there) and two pods holding the GPUs
    of one of them; all deleted afterwards, since the control plane is shared by the session."""
    core = k8s.CoreV1Api(api)
    try:
        for src, name in NODES:
            doc = json.loads((ROOT / "examples" / "cluster" / f"{src}.json").read_text())
            create_node(api, name, node_allocatable(doc), labels={"gpuplace.io/fake-node": "true"})
            core.patch_node(name, {"spec": {"unschedulable": True}})
            publish_inventory_direct(api, name, doc)
        # No kubelet: the pods stay Pending, bound to the node, as the extender's cache counts them.
        for i in range(2):
            core.create_namespaced_pod("default", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"explain-holder-{i}"},
                "spec": {"nodeName": "explain-a6000-busy", "containers": [{
                    "name": "main", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        yield
    finally:
        for i in range(2):
            try:
                core.delete_namespaced_pod(f"explain-holder-{i}", "default", grace_period_seconds=0)
            except k8s.ApiException:
                pass
        for _, name in NODES:
            try:
                core.delete_node(name)
            except k8s.ApiException:
                pass


def test_explain_reads_a_live_cluster_and_sees_the_gpus_pods_hold(control_plane, explain_nodes):
    out = subprocess.run([sys.executable, "-m", "scheduler_extender.gpuplace_cli", "explain", str(POD),
                          "--kubeconfig", str(control_plane.kubeconfig_path), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    nodes = {n["node"]: n for n in json.loads(out.stdout)["nodes"]}
    assert nodes["explain-a6000"]["verdict"] == "pass" and nodes["explain-a6000"]["components"]["cost"]["weight"] == 5
    assert nodes["explain-4090"]["verdict"] == "fail"
    assert any("VRAM" in r["message"] for r in nodes["explain-4090"]["reasons"])
    busy = nodes["explain-a6000-busy"]
    assert busy["verdict"] == "busy" and busy["reasons"][0]["criterion"] == "free-gpus"

    text = subprocess.run([sys.executable, "-m", "scheduler_extender.gpuplace_cli", "explain", str(POD),
                           "--kubeconfig", str(control_plane.kubeconfig_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert any(line.startswith("BUSY explain-a6000-busy") for line in text.splitlines())
