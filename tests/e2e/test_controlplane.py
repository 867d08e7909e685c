"""The harness's control plane schedules extended resources like a real cluster does.

No extender is involved: this checks the plumbing every other e2e test relies on (nodes
without kubelets, status set through the subresource, kube-scheduler binding pods, and
FailedScheduling events being readable).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from tests.harness.controlplane import (
    create_node,
    pod_events,
    wait_for,
    wait_pod_scheduled,
)

pytestmark = pytest.mark.e2e

NS = "default"


def gpu_pod(name: str, gpus: int) -> k8s.V1Pod:
    """A pod asking for ``gpus`` whole NVIDIA GPUs (limits only, as device plugins expect)."""
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="main",
                    image="registry.k8s.io/pause:3.10",
                    resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}),
                )
            ],
        ),
    )


@pytest.fixture
def gpu_node(api: k8s.ApiClient) -> Iterator[str]:
    """A fresh node with 2 allocatable NVIDIA GPUs; deleted (with its pods) afterwards."""
    name = f"gpu-node-{uuid.uuid4().hex[:6]}"
    node = create_node(api, name, {"nvidia.com/gpu": "2"})
    assert node.status.allocatable["nvidia.com/gpu"] == "2"
    yield name
    core = k8s.CoreV1Api(api)
    for pod in core.list_namespaced_pod(NS).items:
        core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)
    core.delete_node(name)


def test_pod_within_capacity_is_bound(api: k8s.ApiClient, gpu_node: str) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod(NS, gpu_pod("one-gpu", 1))
    assert wait_pod_scheduled(api, NS, "one-gpu", timeout=30) == gpu_node


def test_pod_over_capacity_stays_pending(api: k8s.ApiClient, gpu_node: str) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod(NS, gpu_pod("three-gpus", 3))
    messages = wait_for(
        lambda: [m for m in pod_events(api, NS, "three-gpus") if "Insufficient nvidia.com/gpu" in m],
        timeout=30,
        message="no FailedScheduling event mentioning Insufficient nvidia.com/gpu",
    )
    assert messages
    assert core.read_namespaced_pod("three-gpus", NS).spec.node_name is None
