"""``explain``: why a pod goes where it goes, as data (``explain_decision``) for ``POST /explain``
and ``gpuplace explain --json`` (``gpuplace explain --kubeconfig`` reads a live cluster with
``cluster.defrag.ClusterReader``, and adds what preemption and defragmentation would free).

The answer holds, for every node, pass/fail, whether a failure is resolvable (GPUs busy) or not,
every reason, the units the pod would get, each score component with its policy weight, and the
final score (0-10 = 10 x the weighted mean of the components that apply, rounded; see
``core/score.py``), plus the pod's VRAM estimate with its terms and its size class.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from scheduler_extender.core.engine import Decision
from scheduler_extender.core.node import node_name
from scheduler_extender.core.policy import Policy


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


def node_names(objs: Sequence[Mapping[str, Any]]) -> list[str]:
    return [node_name(o) for o in objs]
