"""Tenancy on the real control plane: H100s are kept for team-a; a team-b pod that asks for one by
annotation stays Pending with the rule that denied it in its events, the same pod in team-a is bound.

team-a is selected by a namespace label, so this also exercises the extender's Namespace watch.
"""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes import client as k8s

from tests.harness.controlplane import ExtenderSpec, SchedulerSpec, create_node, pod_events, wait_for
from tests.harness.gpucluster import ROOT, create_pods, node_allocatable, publish_inventory_direct, start_extender, wait_placements

pytestmark = pytest.mark.e2e

SCHEDULER = "gpuplace-tenancy"
NODE = "tenancy-h100-0"
POLICY = {
    "apiVersion": "gpuplace.io/v1alpha1", "kind": "PlacementPolicy",
    "classes": [{"name": "standard"}], "rules": [{"class": "standard"}], "defaultClass": "standard",
    "tenants": [
        {"name": "team-a", "namespaceSelector": {"matchLabels": {"gpuplace.io/team": "a"}}},
        {"name": "team-b", "namespaces": ["team-b"], "allowedModels": ["A100-80GB", "L40S"]},
    ],
    "defaultTenant": {"deniedModels": ["H100"]},
}


def h100_pod(namespace: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "wants-h100", "namespace": namespace,
                     "annotations": {"gpuplace.io/gpu-models": "H100"}},
        "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


@pytest.fixture(scope="module")
def tenancy_cluster(control_plane, api, tmp_path_factory):
    core = k8s.CoreV1Api(api)
    for name, labels in (("team-a", {"gpuplace.io/team": "a"}), ("team-b", {})):
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=labels)))
    doc = json.loads((ROOT / "examples" / "cluster" / "gpu-h100-0.json").read_text())
    create_node(api, NODE, node_allocatable(doc))
    publish_inventory_direct(api, NODE, doc)
    policy = tmp_path_factory.mktemp("tenancy") / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    # Started after the namespaces exist: readiness waits for the first Namespace list.
    extender = start_extender(control_plane.kubeconfig_path, control_plane.logs, policy=policy)
    control_plane.add_scheduler(SchedulerSpec(name=SCHEDULER, extender=ExtenderSpec(url_prefix=extender.url)))
    yield extender
    control_plane.stop_scheduler(SCHEDULER)
    extender.stop()
    for ns in ("team-a", "team-b"):
        core.delete_namespaced_pod("wants-h100", ns, grace_period_seconds=0)
    core.delete_node(NODE)


def test_a_team_b_pod_asking_for_h100_stays_pending_with_the_rule_while_team_a_gets_the_h100(api, tenancy_cluster):
    create_pods(api, [h100_pod("team-a")], namespace="team-a")
    create_pods(api, [h100_pod("team-b")], namespace="team-b")
    team_a = wait_placements(api, ["wants-h100"], namespace="team-a", timeout=60)
    assert team_a["wants-h100"] in {NODE, "gpu-h100-0"}  # the only H100 nodes of the session

    def denial() -> str | None:
        msgs = [m for m in pod_events(api, "team-b", "wants-h100") if "not entitled" in m]
        return msgs[-1] if msgs else None

    message = wait_for(denial, 30, interval=0.5, message="no FailedScheduling event naming the tenancy rule")
    print(f"\nteam-a pod bound to {team_a['wants-h100']}; team-b pod event: {message}")
    assert ("gpuplace.io/gpu-models: H100 not entitled to namespace team-b: "
            "tenancy rule team-b (tenants.1) allows A100-80GB, L40S") in message
    pod = k8s.CoreV1Api(api).read_namespaced_pod("wants-h100", "team-b")
    assert pod.spec.node_name is None and pod.status.phase == "Pending"
