"""An inventory the Node's allocatable contradicts is rejected in cluster mode, on the real control plane.

A Node whose device plugin (status.allocatable) offers 2 nvidia.com/gpu carries an inventory that
claims 8 H200s: a pod asking for an H200 stays Pending with the reason in its events, and the
extender counts the node in gpuplace_extender_inventory_rejected_nodes. When allocatable agrees
(8), the pending pod is bound there, without anyone touching it.

kube-scheduler and the extender both watch that Node. The test lets the pod's backoff run out
first, so kube-scheduler retries the pod the moment it sees the change, often before the
extender's watch has delivered it; without the extender's requeue (``requeue.py``) the pod then
waited for kube-scheduler's 5-minute flush. The test prints which way each run went (`-s`):
about half of our runs on the 2-core machine took the requeue path.
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client as k8s

from tests.harness.controlplane import ExtenderSpec, SchedulerSpec, create_node, pod_events, wait_for
from tests.harness.gpucluster import ROOT, create_pods, publish_inventory_direct, start_extender, wait_placements

pytestmark = pytest.mark.e2e

SCHEDULER = "gpuplace-trust"
NODE = "liar-h200-0"


def eight_h200s() -> dict:
    doc = json.loads((ROOT / "examples" / "cluster" / "gpu-a100-80g-0.json").read_text())
    for g in doc["gpus"]:
        g.update(name="NVIDIA H200", memoryMiB=143771, allocatedTo="")
    return doc


@pytest.fixture(scope="module")
def trust_cluster(control_plane, api):
    create_node(api, NODE, {"nvidia.com/gpu": "2"})
    publish_inventory_direct(api, NODE, eight_h200s())
    extender = start_extender(control_plane.kubeconfig_path, control_plane.logs)
    control_plane.add_scheduler(SchedulerSpec(name=SCHEDULER, extender=ExtenderSpec(url_prefix=extender.url)))
    yield extender
    control_plane.stop_scheduler(SCHEDULER)
    extender.stop()
    k8s.CoreV1Api(api).delete_namespaced_pod("wants-h200", "default", grace_period_seconds=0)
    k8s.CoreV1Api(api).delete_node(NODE)


def test_an_inventory_claiming_more_gpus_than_allocatable_is_rejected_until_allocatable_agrees(api, trust_cluster):
    extender = trust_cluster
    manifest = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "wants-h200", "annotations": {"gpuplace.io/gpu-models": "H200",
                                                            "gpuplace.io/class": "large"}},
        "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    create_pods(api, [manifest])

    def rejection() -> str | None:
        msgs = [m for m in pod_events(api, "default", "wants-h200") if "status.allocatable" in m]
        return msgs[-1] if msgs else None

    message = wait_for(rejection, 30, interval=0.5, message="no FailedScheduling event with the allocatable reason")
    assert "inventory claims 8 healthy nvidia.com/gpu, but the Node's status.allocatable has 2" in message
    assert "gpuplace_extender_inventory_rejected_nodes 1.0" in extender.get("/metrics")[1]

    # kube-scheduler's backoff for the pod (1 s after its first attempt, 2 s after its second) runs out.
    time.sleep(3)
    # The device plugin now advertises all 8: the inventory is trusted and the pending pod is bound.
    k8s.CoreV1Api(api).patch_node_status(NODE, {"status": {"allocatable": {"nvidia.com/gpu": "8"},
                                                           "capacity": {"nvidia.com/gpu": "8"}}})
    wait_for(lambda: "gpuplace_extender_inventory_rejected_nodes 0.0" in extender.get("/metrics")[1], 30,
             interval=0.2, message="the extender still rejects the inventory after allocatable agreed")
    placed = wait_placements(api, ["wants-h200"], timeout=60)
    assert placed["wants-h200"] == NODE, pod_events(api, "default", "wants-h200")
    requeued = 'gpuplace_extender_requeued_pods_total{result="requeued"} 1.0' in extender.get("/metrics")[1]
    print(f"\nliar node rejected with: {message[:300]}")
    print("allocatable raised: " + ("the extender requeued the pod (kube-scheduler had retried it on the old view)"
                                   if requeued else "kube-scheduler's own retry found the node"))
