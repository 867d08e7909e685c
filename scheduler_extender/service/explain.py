"""``explain``: why a pod goes where it goes, as data (``explain_decision``) for ``POST /explain``
and ``gpuplace explain --json``, and how ``gpuplace explain --kubeconfig`` reads a live cluster.

The answer holds, for every node, pass/fail, whether a failure is resolvable (GPUs busy) or not,
every reason, the units the pod would get, each score component with its policy weight, and the
final score (0-10 = 10 x the weighted mean of the components that apply, rounded; see
``core/score.py``), plus the pod's VRAM estimate with its terms and its size class.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.engine import Decision
from scheduler_extender.core.node import node_name
from scheduler_extender.core.policy import Policy
from scheduler_extender.cluster.sources import ClusterSource

def component_weights(policy: Policy) -> dict[str, float]:
    """Score component -> its weight in the policy (``scoring``), by the component's name (the
    field's name in the policy: ``vramFit``, ``fragmentation``, ...), for every weight the
    policy has, so that no component is reported without its weight."""
    return {k: float(v) for k, v in policy.scoring.by_component().items()}


def explain_decision(decision: Decision, policy: Policy) -> dict[str, Any]:
    """The decision as JSON-ready data (shape in the module docstring; keys camelCase)."""
    job = decision.job
    weights = component_weights(policy)
    best = decision.best()
    nodes = []
    for r in decision.results:
        s = decision.scores.get(r.node)
        entry: dict[str, Any] = {
            "node": r.node,
            "passed": r.passed,
            "verdict": "pass" if r.passed else ("fail" if r.unresolvable else "busy"),
            "reasons": [{"criterion": x.criterion, "message": x.message, "resolvable": x.resolvable}
                        for x in r.rejections],
            "units": [{"index": u.gpu_index, "uuid": u.uuid, "model": u.model, "migProfile": u.mig_profile,
                       "memoryMiB": u.memory_bytes // 2**20} for u in r.chosen],
        }
        if s is not None:
            entry["score"] = s.score
            entry["costPerHour"] = round(s.cost_per_hour, 4)
            entry["components"] = {k: {"value": round(v, 4), "weight": weights.get(k)} for k, v in s.components.items()}
            if s.last_resort:  # scored 0 by the class's lastResortModels rule (core.score)
                entry["lastResort"] = True
        nodes.append(entry)
    vram = None
    if job.vram is not None:
        vram = {"bytesPerGpu": job.vram.bytes_per_gpu, "source": job.vram.source, "summary": job.vram.summary,
                "terms": [{"term": name, "bytes": value} for name, value in job.vram.terms]}
    return {
        "pod": job.req.key,
        "request": job.describe(),
        "sizeClass": {"name": job.size_class.name, "why": job.class_reason},
        "vramPerGpu": vram,
        "annotationErrors": [str(e) for e in job.errors],
        "scoreFormula": "score = round(10 x sum(weight x value) / sum(weight)) over the components that apply",
        "nodes": nodes,
        "bestNode": best.node if best else None,
        "topNodes": decision.top(),
    }


def cluster_states_from_api(api_client: Any, catalog: Catalog,
                            pod_vram: Callable[[Any, int], int | None] | None = None) -> ClusterSource:
    """List Nodes, Pods and Namespaces once through the official client and build states with ``ClusterCache``
    (the cache the extender's watch feeds), so explain sees what the extender sees; ``pod_vram``
    as for ``ClusterCache`` (``Engine.vram_need_bytes``: pods sharing a GPU counted by their need).

    Raises:
        kubernetes.client.ApiException: the API server refused a list.
    """
    import orjson
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    cache = ClusterCache(catalog, pod_vram)
    nodes = orjson.loads(core.list_node(_preload_content=False).data)
    pods = orjson.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)
    namespaces = orjson.loads(core.list_namespace(_preload_content=False).data)
    cache.replace_nodes(nodes.get("items") or [])
    cache.replace_pods(pods.get("items") or [])
    cache.replace_namespaces(namespaces.get("items") or [])  # labels select policy tenants
    return ClusterSource(cache, catalog)


def node_names(objs: Sequence[Mapping[str, Any]]) -> list[str]:
    return [node_name(o) for o in objs]
