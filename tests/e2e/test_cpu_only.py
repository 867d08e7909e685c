"""CPU-only pods on the real control plane, configured as the chart's scheduler is
(``scheduler.extender.cpuOnlyPods``: no managedResources, so kube-scheduler calls the extender for
every pod of its profile): after two 30-core GPU pods fill the GPUs of one node, a CPU-only pod
goes to that node, whose CPU serves no free GPU, not to the emptier node whose free GPUs need its
CPU, where kube-scheduler's own LeastAllocated would put it."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s

from tests.harness.controlplane import ExtenderSpec, SchedulerSpec, create_node, wait_for
from tests.harness.gpucluster import create_pods, publish_inventory_direct, start_extender, wait_placements

pytestmark = pytest.mark.e2e

SCHEDULER = "gpuplace-cpu-only"
LABEL = {"gpuplace-e2e/pool": "cpu-only"}
BUSY, FREE = "cpuonly-busy-0", "cpuonly-free-0"


def inventory(node: str) -> dict:
    return {
        "apiVersion": "gpuplace.io/v1alpha1", "kind": "NodeGPUInventory", "nodeName": node,
        "observedAt": "2026-11-26T12:00:00Z", "driverVersion": "550.54.14",
        "gpus": [{"index": i, "uuid": f"GPU-{node}-{i}", "vendor": "nvidia", "name": "NVIDIA GeForce RTX 4090",
                  "memoryMiB": 24564, "computeCapability": "8.9", "eccEnabled": False, "healthy": True}
                 for i in range(2)],
    }


def pod(name: str, cpu: str, gpus: int, node: str | None = None) -> dict:
    resources: dict = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    selector = {"kubernetes.io/hostname": node} if node else dict(LABEL)
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0, "nodeSelector": selector,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}]},
    }


@pytest.fixture(scope="module")
def cpu_only_pool(control_plane, api):
    for node, cpu in ((BUSY, "96"), (FREE, "64")):
        create_node(api, node, {"nvidia.com/gpu": "2", "cpu": cpu, "memory": "256Gi"}, labels=LABEL)
        publish_inventory_direct(api, node, inventory(node))
    extender = start_extender(control_plane.kubeconfig_path, control_plane.logs)
    control_plane.add_scheduler(SchedulerSpec(name=SCHEDULER, extender=ExtenderSpec(
        url_prefix=extender.url, managed_resources=())))
    yield extender
    control_plane.stop_scheduler(SCHEDULER)
    extender.stop()
    core = k8s.CoreV1Api(api)
    for name in ("gpu-0", "gpu-1", "cpu-only"):
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    for node in (BUSY, FREE):
        core.delete_node(node)


def test_a_cpu_only_pod_goes_where_its_cpu_serves_no_free_gpu(api, cpu_only_pool):
    create_pods(api, [pod(f"gpu-{i}", "30", 1, node=BUSY) for i in range(2)])
    assert wait_placements(api, ["gpu-0", "gpu-1"], timeout=60) == {"gpu-0": BUSY, "gpu-1": BUSY}
    wait_for(lambda: len(json.loads(cpu_only_pool.get("/debug/allocations")[1] or "{}").get("nodes", {}).get(BUSY, {})
                         .get("pods", {})) == 2 or None, 30, interval=0.5,
             message="the extender did not see the two bound GPU pods")
    # Left: BUSY 36 cores and no free GPU; FREE 64 cores for its two free GPUs. 8 cores taken
    # from FREE would leave 56: less than two 30-core GPU pods need.
    create_pods(api, [pod("cpu-only", "8", 0)])
    assert wait_placements(api, ["cpu-only"], timeout=60) == {"cpu-only": BUSY}
