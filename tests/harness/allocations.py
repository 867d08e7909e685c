"""The API server's truth about GPU allocations, the extender's view of it, and their invariants.

Fault and load tests compare the two: ``api_truth`` (bound, unfinished pods and what they request,
per node) against the extender's ``GET /debug/allocations``; ``overcommit`` lists every node
where more GPUs are granted (API server) or counted (extender) than the node has.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s

from scheduler_extender.core.requirements import pod_gpu_requests
from tests.harness.gpucluster import ExtenderProcess

Truth = dict[str, dict[str, dict[str, int]]]
"""node -> {"namespace/pod": {resource: units}}."""


def api_truth(core: k8s.CoreV1Api) -> Truth:
    """Bound, unfinished GPU pods per node, as the API server has them."""
    resp = core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=", _preload_content=False)
    truth: Truth = {}
    for p in json.loads(resp.data)["items"]:
        if p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        requests, _ = pod_gpu_requests(p)
        if requests:
            key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            truth.setdefault(p["spec"]["nodeName"], {})[key] = dict(requests)
    return truth


def extender_view(ext: ExtenderProcess) -> dict[str, Any]:
    """The extender's ``GET /debug/allocations``; RuntimeError if it does not answer 200."""
    status, body = ext.get("/debug/allocations")
    if status != 200:
        raise RuntimeError(f"GET /debug/allocations: HTTP {status}: {body[:300]}")
    return dict(json.loads(body))


def view_diff(truth: Truth, view: dict[str, Any]) -> list[str]:
    """Where the extender's view differs from the API server's (empty when converged)."""
    nodes = view["nodes"]
    problems = [] if view["synced"] else ["not synced"]
    for node in sorted(set(truth) | {n for n, v in nodes.items() if v["pods"]}):
        want, have = truth.get(node, {}), (nodes.get(node) or {}).get("pods", {})
        if want != have:
            problems.append(f"{node}: API server {sorted(want)} vs extender {sorted(have)}")
    return problems


def overcommit(core: k8s.CoreV1Api, truth: Truth, views: list[dict[str, Any]]) -> list[str]:
    """Nodes with more units granted than allocatable (API server) or held than healthy (extender).

    Pods bound to a Node that no longer exists are skipped: they hold nothing real until the pod
    garbage collector deletes them.
    """
    allocatable = {n.metadata.name: n.status.allocatable or {} for n in core.list_node().items}
    problems = []
    for node, pods in truth.items():
        if node not in allocatable:
            continue
        for resource in sorted({r for req in pods.values() for r in req}):
            granted = sum(req.get(resource, 0) for req in pods.values())
            limit = int(allocatable[node].get(resource, 0))
            if granted > limit:
                problems.append(f"API server: {node}: {granted} {resource} granted > {limit} allocatable ({pods})")
    for i, view in enumerate(views):
        problems += [f"extender {i}: {p}" for p in view_overcount(view)]
    return problems


def view_overcount(view: dict[str, Any]) -> list[str]:
    """Nodes where the extender's view holds more units of a resource than the node has healthy."""
    return [f"{node}: {resource} {u}, pods {v['pods']}" for node, v in view["nodes"].items()
            for resource, u in v["resources"].items() if u["allocatable"] is not None and u["held"] > u["allocatable"]]
