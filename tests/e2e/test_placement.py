"""The main job, end to end: kube-scheduler (real) + gpuplace-extender (cluster mode) place the
example pods on the example cluster, whose inventories gpuplace-agent publishes on the Nodes."""

from __future__ import annotations

import os

import pytest
from kubernetes import client as k8s

from tests.harness.controlplane import pod_events, wait_for
from tests.harness.gpucluster import (
    ROOT, add_gpuplace_scheduler, create_gpu_nodes, create_pods, load_pod_manifests, start_extender, wait_placements,
)

pytestmark = pytest.mark.e2e

EXPECTED = {
    "llm-13b-fsdp-train": {"gpu-a100-80g-0"},
    "llm-7b-lora": {"gpu-4090-0", "gpu-4090-1"},
    "llm-13b-inference": {"gpu-a100-mig-0", "gpu-a6000-0"},
    "llm-3b-inference": {"gpu-a100-mig-1"},
    "ecc-required": {"gpu-a100-mig-0", "gpu-a6000-0"},
    "nvlink-4gpu": {"gpu-h100-0"},
    "rocm-inference": {"gpu-amd-0"},
    "impossible-200gi": {None},
}
PUBLISH = os.environ.get("GPUPLACE_E2E_PUBLISH", "agent")


@pytest.fixture(scope="module")
def gpu_cluster(control_plane, tmp_path_factory):
    nodes = create_gpu_nodes(control_plane, ROOT / "examples" / "cluster", publish=PUBLISH)
    extender = start_extender(control_plane.kubeconfig_path, control_plane.logs)
    add_gpuplace_scheduler(control_plane, extender)
    yield nodes, extender
    control_plane.stop_scheduler("gpuplace-scheduler")
    extender.stop()


def test_example_pods_land_where_the_criteria_say_and_the_impossible_one_waits_with_our_reason(api, gpu_cluster):
    names = create_pods(api, load_pod_manifests(ROOT / "examples" / "pods"))
    placed = wait_placements(api, names, timeout=90, settle_pending=8)
    wrong = {n: node for n, node in placed.items() if node not in EXPECTED[n]}
    assert not wrong, f"misplaced: {wrong}; all: {placed}"

    def reason_recorded() -> str | None:
        msgs = [m for m in pod_events(api, "default", "impossible-200gi") if "VRAM" in m]
        return msgs[-1] if msgs else None

    message = wait_for(reason_recorded, 30, interval=0.5, message="no FailedScheduling event with a VRAM reason")
    assert "200 GiB needed (gpuplace.io/vram)" in message
    assert "0/" in message and "nodes are available" in message


def test_extender_is_ready_and_counts_its_decisions(gpu_cluster):
    _, extender = gpu_cluster
    assert extender.get("/readyz")[0] == 200
    status, text = extender.get("/metrics")
    assert status == 200
    assert 'gpuplace_extender_filter_decisions_total{outcome="schedulable"}' in text
    assert "gpuplace_extender_cache_synced 1.0" in text


def test_a_freed_gpu_node_takes_a_waiting_8_gpu_pod(api, gpu_cluster):
    """After the 8-GPU training pod is deleted, a new 8-GPU pod is bound to the freed node only."""
    core = k8s.CoreV1Api(api)
    try:
        core.delete_namespaced_pod("llm-13b-fsdp-train", "default", grace_period_seconds=0)
    except k8s.ApiException as e:
        if e.status != 404:
            raise
    wait_for(lambda: not any(p.metadata.name == "llm-13b-fsdp-train"
                             for p in core.list_namespaced_pod("default").items), 30, message="pod not deleted")
    manifest = next(m for m in load_pod_manifests(ROOT / "examples" / "pods") if m["metadata"]["name"] == "llm-13b-fsdp-train")
    manifest = {**manifest, "metadata": {**manifest["metadata"], "name": "llm-13b-fsdp-train-2"}}
    create_pods(api, [manifest])
    placed = wait_placements(api, ["llm-13b-fsdp-train-2"], timeout=60)
    assert placed["llm-13b-fsdp-train-2"] == "gpu-a100-80g-0"


def test_full_node_list_mode_places_and_rejects_like_node_cache_mode(api, control_plane, gpu_cluster):
    """kube-scheduler with ``nodeCacheCapable: false`` sends whole Nodes and expects Nodes back."""
    from tests.harness.controlplane import ExtenderSpec, SchedulerSpec

    _, extender = gpu_cluster
    control_plane.add_scheduler(SchedulerSpec(
        name="gpuplace-nodelist", extender=ExtenderSpec(url_prefix=extender.url, node_cache_capable=False)))
    try:
        manifests = {m["metadata"]["name"]: m for m in load_pod_manifests(ROOT / "examples" / "pods")}

        def variant(name, new_name):
            m = manifests[name]
            return {**m, "metadata": {**m["metadata"], "name": new_name},
                    "spec": {**m["spec"], "schedulerName": "gpuplace-nodelist"}}

        create_pods(api, [variant("llm-13b-inference", "nodelist-13b"), variant("impossible-200gi", "nodelist-200gi")])
        placed = wait_placements(api, ["nodelist-13b", "nodelist-200gi"], timeout=60, settle_pending=5)
        assert placed["nodelist-13b"] in {"gpu-a100-mig-0", "gpu-a6000-0"}
        assert placed["nodelist-200gi"] is None
        msg = wait_for(lambda: next((m for m in pod_events(api, "default", "nodelist-200gi") if "VRAM" in m), None),
                       30, interval=0.5, message="no VRAM reason recorded in full-NodeList mode")
        assert "200 GiB needed (gpuplace.io/vram)" in msg
    finally:
        control_plane.stop_scheduler("gpuplace-nodelist")
