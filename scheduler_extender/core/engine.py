"""The decision, composed in one place: pod + node states + policy -> filter verdicts and scores.

An ``Engine`` is immutable and bound to one policy and catalog; a policy reload builds a new one
and swaps the reference, so a request never sees half a policy.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

from pydantic import BaseModel

from scheduler_extender.core.catalog import Catalog, default_catalog
from scheduler_extender.core.devices import NodeState
from scheduler_extender.core.equivalence import state_keys
from scheduler_extender.core.filter import NodeResult, filter_node, inventory_rejection
from scheduler_extender.core.job import Job, resolve_job
from scheduler_extender.core.policy import Policy, default_policy
from scheduler_extender.core.score import NodeScore, score_nodes


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


@dataclass(frozen=True)
class GroupedResults:
    """Filter verdicts for many nodes, decided once per equivalence class (``core/equivalence.py``).

    Attributes:
        results: one ``NodeResult`` per class, for one node of the class (``results[g].node``; it
            may be a node decided for this job in an earlier request).
        states: the ``NodeState`` that result was decided on, per class.
        group_of: per input node, in input order, the index of its class in ``results``.
    """

    results: list[NodeResult]
    states: list[NodeState]
    group_of: list[int]


MEMO_JOBS = 32
"""Jobs whose class verdicts an engine remembers (least recently used first out). kube-scheduler
asks prioritize right after filter; more entries only lengthen the collector's full passes (256
made them 70 ms at 5,000 nodes)."""


def frozen_value(value: Any) -> Hashable:
    """A hashable value equal exactly when ``value`` is: dataclasses and pydantic models field by
    field (with their type), lists and tuples as tuples, dicts and sets as frozensets."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple(frozen_value(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, BaseModel):
        return (type(value), frozen_value(dict(value.__dict__)))
    if isinstance(value, (list, tuple)):
        return tuple(frozen_value(v) for v in value)
    if isinstance(value, dict):
        return frozenset((k, frozen_value(v)) for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return frozenset(frozen_value(v) for v in value)
    return value


class Engine:
    def __init__(self, policy: Policy | None = None, catalog: Catalog | None = None) -> None:
        self.policy = policy or default_policy()
        self.catalog = catalog or default_catalog()
        self._memo: OrderedDict[Hashable, dict[int, tuple[NodeState, NodeResult]]] = OrderedDict()

    def job(self, pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None = None) -> Job:
        """The pod resolved against this engine's policy; ``namespace_labels`` None: unknown."""
        return resolve_job(pod, self.policy, self.catalog, namespace_labels)

    def filter(self, job: Job, states: Iterable[NodeState], now: dt.datetime | None) -> list[NodeResult]:
        return [filter_node(job, s, self.policy, now) for s in states]

    def filter_grouped(self, job: Job, states: Iterable[NodeState], now: dt.datetime | None,
                       keys: Sequence[int] | None = None) -> GroupedResults:
        """``filter`` for many nodes at once: ``filter_node`` runs once per equivalence class.

        Every node gets its class's verdict and reasons, which are what ``filter_node`` would give
        it (``tests/unit/test_equivalence.py`` checks this node by node). A node whose inventory is
        stale is decided on its own: its reason names its own age. ``keys``: the states'
        ``state_keys`` for ``job.req.resource`` when the caller has them already.
        """
        policy = self.policy
        states = list(states)
        resource = job.req.resource
        keys = state_keys(states, resource) if keys is None else list(keys)
        if now is not None and policy.inventory.on_stale == "reject":
            # One datetime comparison per node; the exact check (and its message) only near the limit.
            suspect = now - dt.timedelta(seconds=policy.inventory.stale_after_seconds - 1)
            for i, s in enumerate(states):
                if (s.view is not None and s.view.inventory.observed_at < suspect
                        and inventory_rejection(s, policy, now) is not None):
                    keys[i] = -1 - i  # a class of its own (class numbers are >= 0)
        # dict builtins instead of a Python loop per node: first node of each class, class index per node.
        first = dict(zip(reversed(keys), reversed(states)))
        index = {k: g for g, k in enumerate(dict.fromkeys(keys))}
        memo = self._job_memo(job)
        reps: list[NodeState] = []
        results: list[NodeResult] = []
        for k in index:
            hit = memo.get(k)
            if hit is None:
                hit = (first[k], filter_node(job, first[k], policy, now))
                if k >= 0:  # a stale node's verdict depends on now
                    memo[k] = hit
            reps.append(hit[0])
            results.append(hit[1])
        return GroupedResults(results, reps, [index[k] for k in keys])

    def _job_memo(self, job: Job) -> dict[int, tuple[NodeState, NodeResult]]:
        """Class verdicts already decided for this job (kube-scheduler asks filter, then prioritize,
        and retries pending pods): keyed by the complete Job value, held by this engine only, so
        a policy swap (a new engine) starts empty, and a changed node state is a new class."""
        try:
            key = frozen_value(job)
            hash(key)
        except TypeError:
            return {}
        memo = self._memo.get(key)
        if memo is None:
            memo = self._memo[key] = {}
            if len(self._memo) > MEMO_JOBS:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return memo

    def score_grouped(self, job: Job, grouped: GroupedResults) -> list[NodeScore | None]:
        """Scores per class of ``grouped`` (None for classes that failed the filter).

        A node's score depends on its own state and result and on the cheapest / fastest
        placement among all candidates; a minimum over the classes equals the minimum over the
        nodes, so each class's score is every one of its nodes' score.
        """
        scores = self.score(job, grouped.states, grouped.results)
        return [scores.get(r.node) if r.passed else None for r in grouped.results]

    def score(self, job: Job, states: Sequence[NodeState], results: Sequence[NodeResult]) -> dict[str, NodeScore]:
        passed = [(s, r) for s, r in zip(states, results) if r.passed]
        return {s.node: s for s in score_nodes(job, passed, self.policy)}

    def decide(self, pod: Mapping[str, Any], states: Sequence[NodeState], now: dt.datetime | None,
               namespace_labels: Mapping[str, str] | None = None) -> Decision:
        job = self.job(pod, namespace_labels)
        results = self.filter(job, states, now)
        return Decision(job, results, self.score(job, states, results))
