"""Preemption for GPUs: which pods to evict from a node so that a pending pod passes the filter there.

kube-scheduler's own preemption counts resources: where GPUs (or a time-sliced GPU's replicas) are
free by its count, its dry run needs no victim and drops the node before an extender is asked, so
a pod refused for a reason only eviction can fix (the free GPUs are not NVLink peers, a shared
GPU's VRAM is taken) stays Pending; where it does find victims, it picks them by count
(``pkg/scheduler/framework/preemption/preemption.go``, ``SelectVictimsOnNode`` in v1.34). Here the
judge is gpuplace's own filter (``core.filter.filter_node``): a set of victims makes room when the
filter passes the pod on the node's state without them.

Rules, per node (``choose_victims``):

- only pods of strictly lower priority than the preemptor's are candidates (kube-scheduler's rule;
  ``spec.priority``, 0 when a pod has none), and only those the caller lists (pods holding devices
  there whose eviction no PodDisruptionBudget forbids now: the Eviction API would refuse those);
- the fewest victims; among as many, the lowest highest priority, then the lowest sum of
  priorities, then the names (so that the choice is the same on every replica);
- found exactly by trying sets of victims in that order, within ``MAX_FILTER_CHECKS`` filter
  decisions per node; past that budget, kube-scheduler's own method (evict every candidate, then
  keep back each one, highest priority first, while the pod still passes: minimal, not minimum),
  which the result says (``exact`` False).

Across nodes (``best_preemption``): the fewest victims, then the same order, then the node name.

Pure: the node's state without some pods comes from the caller (``state_without``), which the
cluster layer builds from its cache (``cluster.cache.ClusterCache.state_without``).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from scheduler_extender.core.devices import NodeState
from scheduler_extender.core.filter import NodeResult, filter_node
from scheduler_extender.core.job import Job
from scheduler_extender.core.policy import Policy

MAX_FILTER_CHECKS = 512
"""Filter decisions one node's exact search may take (each about 50-200 us): sets of victims are
tried fewest first until this many were tried; beyond, the greedy method. A node holds a few
GPU pods in practice (8 whole-GPU pods, or replicas x GPUs on a time-sliced node: 32 at 4
replicas), and the sizes that need searching are small."""


NO_LOWER = "no pod of lower priority"
"""How a ``NoPreemption`` reason for a node without candidates starts."""


@dataclass(frozen=True)
class Candidate:
    """A pod that may be evicted: ``uid``, ``key`` ("namespace/name"), ``priority`` (``spec.priority``)."""

    uid: str
    key: str
    priority: int


@dataclass(frozen=True)
class NodePreemption:
    """Room on ``node`` for the pod: evict ``victims``; the filter then passes it there (``result``).
    ``exact``: the set is a minimum one in the module's order (False: minimal, by the greedy method)."""

    node: str
    victims: tuple[Candidate, ...]
    result: NodeResult
    exact: bool = True

    @property
    def order(self) -> tuple[int, int, int, str]:
        """How nodes compare: fewest victims, lowest highest priority, lowest sum, node name."""
        prios = [v.priority for v in self.victims]
        return len(prios), max(prios, default=0), sum(prios), self.node


@dataclass(frozen=True)
class NoPreemption:
    """No eviction makes room for the pod on ``node``; ``reason`` says why, for a person."""

    node: str
    reason: str


def _set_order(victims: Sequence[Candidate]) -> tuple[int, int, tuple[str, ...]]:
    prios = [v.priority for v in victims]
    return max(prios), sum(prios), tuple(sorted(v.key for v in victims))


def choose_victims(job: Job, priority: int, node: str, candidates: Iterable[Candidate],
                   state_without: Callable[[frozenset[str]], NodeState], policy: Policy,
                   now: dt.datetime | None = None, max_checks: int = MAX_FILTER_CHECKS
                   ) -> NodePreemption | NoPreemption:
    """The victims to evict from ``node`` so that ``job`` (a pod of priority ``priority``) passes
    the filter there (module docstring for the order).

    Args:
        job: the pending pod, resolved.
        priority: its ``spec.priority``.
        node: the node's name (for the answer).
        candidates: the pods on the node that could be evicted (the caller leaves out those a
            PodDisruptionBudget protects); those of priority ``priority`` or higher are ignored.
        state_without: the node's state with the pods of the given uids gone (their devices,
            shares, CPU and memory free); ``frozenset()``: the state now.
        policy: the running policy (the filter's).
        now: for the inventory's staleness (the filter's ``now``).
        max_checks: filter decisions the exact search may take (``MAX_FILTER_CHECKS``).

    Returns:
        ``NodePreemption`` with at least one victim, or ``NoPreemption`` with the reason: the pod
        passes already, no lower-priority candidate, or evicting every one would not make room
        (the filter's reason then).
    """
    lower = sorted((c for c in candidates if c.priority < priority), key=lambda c: (c.priority, c.key))
    if filter_node(job, state_without(frozenset()), policy, now).passed:
        return NoPreemption(node, "the pod fits here without evicting anything")
    if not lower:
        return NoPreemption(node, f"{NO_LOWER} than {priority} holds devices here that may be evicted")
    everyone = filter_node(job, state_without(frozenset(c.uid for c in lower)), policy, now)
    if not everyone.passed:
        return NoPreemption(node, f"evicting every lower-priority pod here ({len(lower)}) would not make room: "
                                  f"{everyone.reason}")
    checks = 2
    for size in range(1, len(lower)):
        if checks + math.comb(len(lower), size) > max_checks:
            break
        for victims in sorted(itertools.combinations(lower, size), key=_set_order):
            checks += 1
            result = filter_node(job, state_without(frozenset(v.uid for v in victims)), policy, now)
            if result.passed:
                return NodePreemption(node, tuple(victims), result)
    else:  # every smaller set tried: all of them are the fewest
        return NodePreemption(node, tuple(lower), everyone)
    return _reprieve(job, node, lower, state_without, policy, now)


def _reprieve(job: Job, node: str, lower: list[Candidate], state_without: Callable[[frozenset[str]], NodeState],
              policy: Policy, now: dt.datetime | None) -> NodePreemption:
    """kube-scheduler's method (``SelectVictimsOnNode``): every candidate evicted, then each kept
    back, highest priority first, if the pod still passes without it."""
    victims = {c.uid: c for c in lower}
    result = filter_node(job, state_without(frozenset(victims)), policy, now)
    for c in sorted(lower, key=lambda c: (-c.priority, c.key)):
        rest = frozenset(victims) - {c.uid}
        trial = filter_node(job, state_without(rest), policy, now)
        if trial.passed:
            del victims[c.uid]
            result = trial
    return NodePreemption(node, tuple(sorted(victims.values(), key=lambda c: (c.priority, c.key))), result, exact=False)


def best_preemption(choices: Iterable[NodePreemption | NoPreemption]) -> NodePreemption | None:
    """The node to make room on (``NodePreemption.order``); None when no node can have room."""
    return min((c for c in choices if isinstance(c, NodePreemption)), key=lambda c: c.order, default=None)


def resolvable_only(result: NodeResult) -> bool:
    """Whether ``result`` fails only for reasons evictions may fix (the filter's resolvable
    rejections: devices busy, no free NVLink group, a shared GPU's VRAM taken): the nodes worth
    a victim search."""
    return not result.passed and not result.untouched and bool(result.rejections) and not result.unresolvable
