"""Pods whose GPU count is more than their app containers' limits, on the real control plane in the
chart's one-round-trip mode (``--filter-returns-best``, no prioritize verb): a GPU sidecar
(``restartPolicy: Always`` init container), a regular init container asking more than the app, and
a RuntimeClass overhead. kube-scheduler counts each by ``PodRequests``; if the extender counted the
app containers alone, it would pass only its best node for one GPU: the cheap node whose one GPU is
time-sliced into replicas, which kube-scheduler's own count (four replicas) does not rule out, so
the pod would get two replicas of one GPU (before ``core.pod_requests`` these tests failed so)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.harness.controlplane import ExtenderSpec, SchedulerSpec, create_node
from tests.harness.gpucluster import create_pods, publish_inventory_direct, start_extender, wait_placements

pytestmark = pytest.mark.e2e

SCHEDULER = "gpuplace-pod-requests"
LABEL = {"gpuplace-e2e/pool": "pod-requests"}
ONE, TWO = "podreq-one-gpu-0", "podreq-two-gpu-0"
RUNTIME_CLASS = "gpuplace-e2e-gpu-overhead"


RTX_4090 = {"name": "NVIDIA GeForce RTX 4090", "memoryMiB": 24564, "computeCapability": "8.9", "eccEnabled": False}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "computeCapability": "8.0", "eccEnabled": True}


def inventory(node: str, model: dict, healthy: tuple[bool, ...]) -> dict:
    return {
        "apiVersion": "gpuplace.io/v1alpha1", "kind": "NodeGPUInventory", "nodeName": node,
        "observedAt": "2026-11-27T12:00:00Z", "driverVersion": "550.54.14",
        "gpus": [{"index": i, "uuid": f"GPU-{node}-{i}", "vendor": "nvidia", **model, "healthy": ok,
                  **({} if ok else {"healthReasons": ["XID 79: GPU has fallen off the bus"]})}
                 for i, ok in enumerate(healthy)],
    }


def gpu_pod(name: str, *, init: list[dict] = (), runtime_class: str | None = None) -> dict:
    spec: dict = {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0, "nodeSelector": dict(LABEL),
                  "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                  "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                  "initContainers": list(init)}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"gpuplace.io/vram": "8Gi"}}, "spec": spec}


def init_container(gpus: int, *, sidecar: bool) -> dict:
    c = {"name": "sidecar" if sidecar else "init", "image": "registry.k8s.io/pause:3.10",
         "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


@pytest.fixture(scope="module")
def one_round_trip(control_plane, api):
    # ONE's 4090 is time-sliced into 4 replicas (GPU feature discovery's labels): kube-scheduler
    # passes it for two replicas, and only gpuplace knows two replicas of one GPU are no two GPUs.
    # The cheap 4090 is gpuplace's one best node for a one-GPU pod, so one round trip passes it
    # alone: a pod that needs two GPUs must be seen to need them, or it lands on one shared GPU.
    create_node(api, ONE, {"nvidia.com/gpu": "4"}, labels={**LABEL, "nvidia.com/gpu.sharing-strategy": "time-slicing",
                                                        "nvidia.com/gpu.replicas": "4"})
    create_node(api, TWO, {"nvidia.com/gpu": "2"}, labels=LABEL)
    publish_inventory_direct(api, ONE, inventory(ONE, RTX_4090, (True,)))
    publish_inventory_direct(api, TWO, inventory(TWO, A100, (True, True)))
    # The RuntimeClass admission plugin copies podFixed into each pod's spec.overhead.
    k8s.NodeV1Api(api).create_runtime_class({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_CLASS},
        "handler": "runc", "overhead": {"podFixed": {"nvidia.com/gpu": "1"}}})
    extender = start_extender(control_plane.kubeconfig_path, control_plane.logs, extra_args=["--filter-returns-best"])
    control_plane.add_scheduler(SchedulerSpec(name=SCHEDULER, extender=ExtenderSpec(
        url_prefix=extender.url, prioritize_verb=None)))
    yield extender
    control_plane.stop_scheduler(SCHEDULER)
    extender.stop()
    k8s.NodeV1Api(api).delete_runtime_class(RUNTIME_CLASS)
    for node in (ONE, TWO):
        k8s.CoreV1Api(api).delete_node(node)


def _placed_alone(api, manifest) -> str | None:
    name = manifest["metadata"]["name"]
    create_pods(api, [manifest])
    try:
        return wait_placements(api, [name], timeout=60)[name]
    finally:
        k8s.CoreV1Api(api).delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_a_plain_one_gpu_pod_goes_to_the_cheap_one_gpu_node(api, one_round_trip):
    # The control: without the extra GPU, a replica of the shared 4090 is the best fit.
    assert _placed_alone(api, gpu_pod("podreq-plain")) == ONE


@pytest.mark.parametrize("name, init", [
    ("podreq-sidecar", [init_container(1, sidecar=True)]),      # 1 + 1
    ("podreq-init", [init_container(2, sidecar=False)]),        # max(1, 2)
])
def test_a_pod_needing_two_gpus_through_its_init_containers_is_placed_where_two_fit(api, one_round_trip, name, init):
    assert _placed_alone(api, gpu_pod(name, init=init)) == TWO


def test_a_pod_whose_runtime_class_adds_a_gpu_is_placed_where_two_fit(api, one_round_trip):
    manifest = gpu_pod("podreq-overhead", runtime_class=RUNTIME_CLASS)
    assert _placed_alone(api, manifest) == TWO
