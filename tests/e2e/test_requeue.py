"""A waiting pod is retried once a policy reload lets a node pass, on the real kube-scheduler.

A policy reload is a change kube-scheduler never sees: without the extender's requeue
(``requeue.py``), a pod it rejected under the old policy waits for kube-scheduler's periodic flush
(``podMaxInUnschedulablePodsDuration``, 5 minutes here, as upstream). With it, the extender marks
the pod (``extender.gpuplace.io/requeued-at``) and kube-scheduler binds it within seconds. The same
scenario with ``--no-requeue-rejected-pods`` shows that the mark, not some other event, is what
moved the pod.

Own control plane: no event from other modules' pods may retry the pod here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from scheduler_extender.cluster.requeue import REQUEUE_ANNOTATION
from tests.harness.controlplane import (
    ControlPlane, ExtenderSpec, SchedulerSpec, create_node, pod_events, skip_if_e2e_disabled, wait_for,
)
from tests.harness.gpucluster import (
    ROOT, create_pods, gpu_pod_manifest, node_allocatable, publish_inventory_direct, start_extender, wait_placements,
)

pytestmark = pytest.mark.e2e

NODE = "rq-4090-0"
DEFAULT_POLICY = (ROOT / "scheduler_extender" / "data" / "default-policy.yaml").read_text()
DENY_4090 = DEFAULT_POLICY + "\ndefaultTenant:\n  deniedModels: [RTX-4090]\n"


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    skip_if_e2e_disabled()
    with ControlPlane(tmp_path_factory.mktemp("requeue-cp"), scheduler_configs=[]) as plane:
        inventory = json.loads((ROOT / "examples" / "cluster" / "gpu-4090-0.json").read_text())
        api = plane.api_client()
        create_node(api, NODE, node_allocatable(inventory))
        publish_inventory_direct(api, NODE, inventory)
        yield plane


def _denied_pod_waits(cp: ControlPlane, tmp_path: Path, scheduler: str, pod: str, *extra_args: str):
    """An extender whose policy denies RTX 4090s, its scheduler, and a pod refused for that rule;
    returns the extender and the policy file."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(DENY_4090)
    extender = start_extender(cp.kubeconfig_path, cp.logs, policy=policy,
                              extra_args=["--policy-poll-seconds", "0.2", *extra_args])
    cp.add_scheduler(SchedulerSpec(name=scheduler, extender=ExtenderSpec(url_prefix=extender.url)))
    create_pods(cp.api_client(), [gpu_pod_manifest(pod, 1, scheduler=scheduler)])
    wait_for(lambda: any("defaultTenant denies RTX-4090" in m for m in pod_events(cp.api_client(), "default", pod)),
             30, interval=0.5, message=f"{pod}: no FailedScheduling event naming the denying rule")
    return extender, policy


def _annotations(cp: ControlPlane, pod: str) -> dict[str, str]:
    return k8s.CoreV1Api(cp.api_client()).read_namespaced_pod(pod, "default").metadata.annotations or {}


def test_a_pod_refused_by_the_old_policy_is_bound_soon_after_a_reload_admits_it(cp, tmp_path):
    extender, policy = _denied_pod_waits(cp, tmp_path, "gpuplace-requeue", "was-denied")
    try:
        assert REQUEUE_ANNOTATION not in _annotations(cp, "was-denied")
        policy.write_text(DEFAULT_POLICY)
        reloaded = time.monotonic()
        placed = wait_placements(cp.api_client(), ["was-denied"], timeout=30)
        took = time.monotonic() - reloaded
        assert placed == {"was-denied": NODE}, pod_events(cp.api_client(), "default", "was-denied")
        assert REQUEUE_ANNOTATION in _annotations(cp, "was-denied")
        assert 'gpuplace_extender_requeued_pods_total{result="requeued"} 1.0' in extender.get("/metrics")[1]
        print(f"\nrequeue: pod bound {took:.1f}s after the policy file changed (kube-scheduler's own flush: 5 min)")
    finally:
        cp.stop_scheduler("gpuplace-requeue")
        extender.stop()
        k8s.CoreV1Api(cp.api_client()).delete_namespaced_pod("was-denied", "default", grace_period_seconds=0)


def test_without_requeue_the_same_pod_keeps_waiting_after_the_reload(cp, tmp_path):
    extender, policy = _denied_pod_waits(cp, tmp_path, "gpuplace-no-requeue", "still-denied",
                                         "--no-requeue-rejected-pods")
    try:
        policy.write_text(DEFAULT_POLICY)
        wait_for(lambda: 'gpuplace_extender_policy_reloads_total{result="applied"} 1.0' in extender.get("/metrics")[1],
                 10, interval=0.2, message="the extender did not reload the policy")
        time.sleep(8)  # far longer than the requeue above needs
        pod = k8s.CoreV1Api(cp.api_client()).read_namespaced_pod("still-denied", "default")
        assert pod.spec.node_name is None and REQUEUE_ANNOTATION not in (pod.metadata.annotations or {})
    finally:
        cp.stop_scheduler("gpuplace-no-requeue")
        extender.stop()
        k8s.CoreV1Api(cp.api_client()).delete_namespaced_pod("still-denied", "default", grace_period_seconds=0)
