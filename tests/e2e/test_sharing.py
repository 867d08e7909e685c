"""GPU sharing on the real control plane: a node whose one 24 GiB RTX 4090 the device plugin
time-slices into 4 replicas (as GPU feature discovery labels it and the plugin advertises it)
takes three 7 GiB inference pods; a fourth, which would overrun the VRAM, stays Pending with the
VRAM reason in its events although kube-scheduler still sees a free nvidia.com/gpu replica."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s

from tests.harness.controlplane import ExtenderSpec, SchedulerSpec, create_node, pod_events, wait_for
from tests.harness.gpucluster import create_pods, publish_inventory_direct, start_extender, wait_placements

pytestmark = pytest.mark.e2e

SCHEDULER = "gpuplace-sharing"
NODE = "sharing-4090-0"
INVENTORY = {
    "apiVersion": "gpuplace.io/v1alpha1", "kind": "NodeGPUInventory", "nodeName": NODE,
    "observedAt": "2026-11-26T12:00:00Z", "driverVersion": "550.54.14",
    "gpus": [{"index": 0, "uuid": "GPU-5a1c0e2b-7d1f-4a55-9c3e-0c5ad2b7e401", "vendor": "nvidia",
              "name": "NVIDIA GeForce RTX 4090", "memoryMiB": 24564, "computeCapability": "8.9",
              "eccEnabled": False, "healthy": True}],
}


def inference_pod(name: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpuplace.io/vram": "7Gi", "gpuplace.io/workload": "inference"}},
        "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                 "nodeSelector": {"kubernetes.io/hostname": NODE},
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


@pytest.fixture(scope="module")
def shared_node(control_plane, api):
    labels = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4",
              "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090-SHARED"}
    create_node(api, NODE, {"nvidia.com/gpu": "4"}, labels=labels)
    INVENTORY["observedAt"] = _now()
    publish_inventory_direct(api, NODE, INVENTORY)
    extender = start_extender(control_plane.kubeconfig_path, control_plane.logs)
    control_plane.add_scheduler(SchedulerSpec(name=SCHEDULER, extender=ExtenderSpec(url_prefix=extender.url)))
    yield extender
    control_plane.stop_scheduler(SCHEDULER)
    extender.stop()
    core = k8s.CoreV1Api(api)
    for i in range(4):
        core.delete_namespaced_pod(f"shared-{i}", "default", grace_period_seconds=0)
    core.delete_node(NODE)


def _now() -> str:
    import datetime as dt
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_three_7gib_pods_share_one_time_sliced_24gib_gpu_and_a_fourth_waits_with_a_vram_reason(api, shared_node):
    create_pods(api, [inference_pod(f"shared-{i}") for i in range(3)])
    placed = wait_placements(api, [f"shared-{i}" for i in range(3)], timeout=60)
    assert placed == {f"shared-{i}": NODE for i in range(3)}
    # The extender has seen the three bindings before the fourth pod asks.
    wait_for(lambda: len(json.loads(shared_node.get("/debug/allocations")[1] or "{}").get("nodes", {}).get(NODE, {})
                         .get("pods", {})) == 3 or None, 30, interval=0.5,
             message="the extender did not see the three bound pods")
    create_pods(api, [inference_pod("shared-3")])

    def refusal() -> str | None:
        msgs = [m for m in pod_events(api, "default", "shared-3") if "VRAM left" in m]
        return msgs[-1] if msgs else None

    message = wait_for(refusal, 30, interval=0.5, message="no FailedScheduling event with the VRAM reason")
    print(f"\nfourth pod's event: {message}")
    assert "GPU 0: 3 GiB of 24 GiB VRAM left (3 pods share it) < 7 GiB needed (gpuplace.io/vram)" in message
    pod = k8s.CoreV1Api(api).read_namespaced_pod("shared-3", "default")
    assert pod.spec.node_name is None and pod.status.phase == "Pending"
