"""The decision, composed in one place: pod + node states + policy -> filter verdicts and scores.

An ``Engine`` is immutable and bound to one policy and catalog; a policy reload builds a new one
and swaps the reference, so a request never sees half a policy. The grouped path the extender
serves, with its equivalence classes and memos, is the served layer's
(``scheduler_extender.served.grouped``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from scheduler_extender.core.catalog import Catalog, default_catalog
from scheduler_extender.core.criteria import ANNOTATIONS
from scheduler_extender.core.devices import NodeState
from scheduler_extender.core.filter import NodeResult, filter_node
from scheduler_extender.core.job import Job, resolve_job
from scheduler_extender.core.pod import Pod
from scheduler_extender.core.policy import Policy, default_policy
from scheduler_extender.core.score import NodeScore, score_nodes, supply_of
from scheduler_extender.core.workload import WorkloadProfile


@dataclass(frozen=True)
class Decision:
    """Filter verdicts for every node, and scores for those that passed."""

    job: Job
    results: list[NodeResult]
    scores: dict[str, NodeScore]

    @property
    def passed(self) -> list[NodeResult]:
        return [r for r in self.results if r.passed]

    def best(self) -> NodeScore | None:
        ranked = sorted(self.scores.values(), key=lambda s: (-s.score, s.cost_per_hour, s.node))
        return ranked[0] if ranked else None

    def top(self) -> list[str]:
        """Every node with the highest score, cheapest first: kube-scheduler adds its own plugins'
        scores (resource fit, balance) to the extender's, so any of them may win a tie."""
        best = self.best()
        if best is None:
            return []
        tied = [s for s in self.scores.values() if s.score == best.score]
        return [s.node for s in sorted(tied, key=lambda s: (s.cost_per_hour, s.node))]


class Engine:
    """The plain decision, bound to one policy and catalog, holding nothing else: immutable.

    ``filter`` runs every criterion on every node and ``score`` scores the ones that passed; the
    speed-ups that decide each class of alike nodes once and remember verdicts between requests
    are ``scheduler_extender.served.grouped.GroupedEngine``, which must give what this gives.
    """

    def __init__(self, policy: Policy | None = None, catalog: Catalog | None = None) -> None:
        self.policy = policy or default_policy()
        self.catalog = catalog or default_catalog()

    def job(self, pod: Pod | Mapping[str, Any], namespace_labels: Mapping[str, str] | None = None) -> Job:
        """The pod (a ``core.pod.Pod`` or a decoded v1.Pod) resolved against this engine's policy;
        ``namespace_labels`` None: unknown."""
        return resolve_job(pod, self.policy, self.catalog, namespace_labels, ANNOTATIONS)

    def vram_need_bytes(self, pod: Pod | Mapping[str, Any], memory_bytes: int | None = None) -> int | None:
        """The pod's VRAM need per GPU in bytes under this engine's policy (its estimate or
        ``gpuplace.io/vram``; ``gpuplace.io/gpu-fraction`` of ``memory_bytes``, the memory of the
        GPU it shares); None when unknown. The cache counts pods sharing a GPU by it."""
        return self.job(pod).vram_need(memory_bytes)

    def filter(self, job: Job, states: Iterable[NodeState], now: dt.datetime | None) -> list[NodeResult]:
        return [filter_node(job, s, self.policy, now) for s in states]

    def score(self, job: Job, states: Sequence[NodeState], results: Sequence[NodeResult],
              workload: WorkloadProfile | None = None, supply: Mapping[str, float] | None = None) -> dict[str, NodeScore]:
        """Scores of the nodes that passed; ``workload``: the learned target workload for the
        ``fragmentation`` component (None: it does not apply); ``supply``: free devices per model
        over the nodes of the request (``score.supply_of``), for ``WorkloadProfile.scarcity``;
        None: counted over ``states``."""
        return self.score_with_scarcity(job, states, results, workload, self.scarcity(job, workload, supply, states))

    def score_with_scarcity(self, job: Job, states: Sequence[NodeState], results: Sequence[NodeResult],
                            workload: WorkloadProfile | None, scarcity: Mapping[str, float] | None) -> dict[str, NodeScore]:
        """``score`` with the ``scarcity`` the caller computed already (``Engine.scarcity``)."""
        passed = [(s, r) for s, r in zip(states, results) if r.passed]
        return {s.node: s for s in score_nodes(job, passed, self.policy, workload, scarcity)}

    def scarcity(self, job: Job, workload: WorkloadProfile | None, supply: Mapping[str, float] | None,
                 states: Sequence[NodeState] = ()) -> dict[str, float] | None:
        """``WorkloadProfile.scarcity`` for the pod's resource over ``supply`` (None: counted over
        ``states``); None where the fragmentation component does not apply."""
        resource = job.req.resource
        if not workload or resource is None or self.policy.scoring.fragmentation <= 0:
            return None
        if supply is None:
            supply = supply_of([(s, 1) for s in states], resource)
        return workload.scarcity(resource, supply) or None

    def decide(self, pod: Pod | Mapping[str, Any], states: Sequence[NodeState], now: dt.datetime | None,
               namespace_labels: Mapping[str, str] | None = None,
               workload: WorkloadProfile | None = None) -> Decision:
        job = self.job(pod, namespace_labels)
        results = self.filter(job, states, now)
        return Decision(job, results, self.score(job, states, results, workload))
