"""Defragmentation: the fewest moves of movable pods that make room for a pending pod.

Placement keeps free GPUs usable, but as pods come and go the free GPUs still end up spread: an
8-GPU job waits while 8 GPUs sit free across five nodes. A *move* evicts a movable pod (one whose
controller recreates it; the caller decides which pods are movable) and places its replacement on
another node where it fits. A plan makes room for one pending pod on one node (its *target*): it
moves some of the movable pods off the target, each replacement to a node with room for it once
the plan's other moves are done, and where no node has room for one, moves more pods off a node
to make it (a chain: a replacement may need room made for it in turn).

``plan_room`` finds the plan with the fewest moves, by iterative deepening: all plans of one
move, then of two, up to ``MAX_MOVES``; among plans of as many moves, the one that moves the
fewest devices, then the target's name (the same plan on every run). It is exact within
``MAX_FILTER_CHECKS`` filter decisions; past that budget, the best plan found so far, marked
``exact`` False. ``tests/unit/test_defrag.py`` compares the number of moves with a brute-force
search over every set of moves (any movable pods, any destinations) on small clusters.

Pure: node states come from the caller's ``Snapshot`` (``cluster.cache.ClusterCache.state_with``
for the cluster, the simulator's own for ``gpuplace simulate``), with pods taken away and
replacements added; the verdicts are ``core.filter.filter_node``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import itertools
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

from scheduler_extender.core.devices import NodeState
from scheduler_extender.core.filter import NodeResult, filter_node
from scheduler_extender.core.job import Job
from scheduler_extender.core.policy import Policy

MAX_FILTER_CHECKS = 4096
"""Filter decisions one pending pod's search may take (each about 50-200 us)."""

MAX_MOVES = 8
"""The most moves one plan may have (an 8-GPU node emptied of 1-GPU pods)."""


@dataclass(frozen=True)
class Movable:
    """A pod that may be moved: ``uid``, ``key`` ("namespace/name"), the ``node`` it is bound to,
    its resolved ``job`` (what its replacement needs) and the ``devices`` it holds there."""

    uid: str
    key: str
    node: str
    job: Job
    devices: int


@dataclass(frozen=True)
class Move:
    """Evict ``pod``; its replacement fits on ``destination``."""

    pod: Movable
    destination: str


@dataclass(frozen=True)
class DefragPlan:
    """Room for the pending pod ``pending`` ("namespace/name") on ``node`` once ``moves`` are done
    (in that order: most devices first); ``result`` is the filter's verdict for it there then."""

    pending: str
    node: str
    moves: tuple[Move, ...]
    result: NodeResult
    exact: bool = True

    @property
    def order(self) -> tuple[int, int, str]:
        """How plans compare: fewest moves, fewest devices moved, node name."""
        return len(self.moves), sum(m.pod.devices for m in self.moves), self.node


class Snapshot(Protocol):
    """The cluster a plan is made on."""

    def node_names(self) -> Sequence[str]: ...

    def state_with(self, node: str, without: frozenset[str], added: Sequence[tuple[str, Job]]) -> NodeState | None:
        """The node's state with the pods of ``without`` (uids) gone and ``added`` ((uid, job)
        pairs: replacements, pending pods given room) held there; None for an unknown node."""
        ...


@dataclass
class Overlay:
    """Moves already planned (for earlier pending pods): per node, the uids taken away and the
    (uid, job) added. ``plan_room`` reads the snapshot through it; ``apply`` adds a plan."""

    without: dict[str, set[str]] = field(default_factory=dict)
    added: dict[str, list[tuple[str, Job]]] = field(default_factory=dict)

    def state(self, snapshot: Snapshot, node: str, without: frozenset[str] = frozenset(),
              added: Sequence[tuple[str, Job]] = ()) -> NodeState | None:
        return snapshot.state_with(node, frozenset(self.without.get(node, ())) | without,
                                   [*self.added.get(node, ()), *added])

    def apply(self, plan: DefragPlan, pending_uid: str, job: Job) -> None:
        """Count ``plan`` as done, the pending pod placed on its node."""
        for m in plan.moves:
            self.without.setdefault(m.pod.node, set()).add(m.pod.uid)
            self.added.setdefault(m.destination, []).append((m.pod.uid, m.pod.job))
        self.added.setdefault(plan.node, []).append((pending_uid, job))


def plan_room(job: Job, pending: str, snapshot: Snapshot, movable: Sequence[Movable], policy: Policy,
              now: dt.datetime | None = None, overlay: Overlay | None = None,
              max_checks: int = MAX_FILTER_CHECKS, max_moves: int = MAX_MOVES) -> DefragPlan | None:
    """The plan with the fewest moves that makes room for ``job`` (the pending pod ``pending``,
    "namespace/name"), module docstring; None when no plan of at most ``max_moves`` moves does
    (or the pod fits somewhere already: nothing to move).

    Args:
        job: the pending pod, resolved.
        pending: its "namespace/name", for the plan.
        snapshot: the cluster (``Snapshot``).
        movable: the pods that may be moved, anywhere in the cluster.
        policy: the running policy (the filter's).
        now: for the inventories' staleness.
        overlay: moves planned already for other pending pods (``Overlay``), counted as done.
        max_checks: filter decisions the search may take (``MAX_FILTER_CHECKS``).
        max_moves: the most moves a plan may have (``MAX_MOVES``).
    """
    search = _Search(snapshot, policy, now, overlay or Overlay(), movable, max_checks)
    if any(search.fits(job, n, counted=False) for n in search.names):
        return None
    # Targets: the nodes where moving every movable pod away would make room.
    targets = [n for n in search.names if search.movable_on(n)
               and search.fits(job, n, without=frozenset(m.uid for m in search.movable_on(n)), counted=False)]
    for k in range(1, max_moves + 1):  # iterative deepening: the first plan found has the fewest moves
        best: DefragPlan | None = None
        for node in targets:
            for plan in search.plans(job, pending, node, k):
                if best is None or plan.order < best.order:
                    best = plan
            if search.out_of_budget:
                break
        if best is not None or search.out_of_budget:
            return best if best is None or not search.out_of_budget else dataclasses.replace(best, exact=False)
    return None



def host_fits(job: Job, state: NodeState) -> bool:
    """Whether the node's free CPU and memory hold the pod's requests, as kube-scheduler's
    NodeResourcesFit checks them (the filter reads devices only); an unknown (None) one is not
    checked. A replacement placed where its CPU or memory does not fit would wait."""
    cpu, mem = state.cpu_milli_free, state.memory_bytes_free
    return ((cpu is None or (job.cpu_milli or 0) <= cpu)
            and (mem is None or (job.memory_bytes or 0) <= mem))


class _Search:
    """One pending pod's search: the snapshot through the overlay, with the moves being tried."""

    def __init__(self, snapshot: Snapshot, policy: Policy, now: dt.datetime | None, overlay: Overlay,
                 movable: Sequence[Movable], max_checks: int) -> None:
        self.snapshot, self.policy, self.now, self.overlay = snapshot, policy, now, overlay
        self.names = list(snapshot.node_names())
        moved = {u for s in overlay.without.values() for u in s}
        self._movable: dict[str, list[Movable]] = {}
        for m in sorted(movable, key=lambda m: (m.devices, m.key)):
            if m.uid not in moved:
                self._movable.setdefault(m.node, []).append(m)
        self.checks_left = max_checks
        # the moves being tried: uids taken away per node, (uid, job) added per node
        self.without: dict[str, set[str]] = {}
        self.added: dict[str, list[tuple[str, Job]]] = {}

    @property
    def out_of_budget(self) -> bool:
        return self.checks_left < 0

    def movable_on(self, node: str) -> list[Movable]:
        return [m for m in self._movable.get(node, ()) if m.uid not in self.without.get(node, ())]

    def fits(self, job: Job, node: str, without: frozenset[str] = frozenset(), counted: bool = True) -> bool:
        """Whether ``job`` passes the filter on ``node`` with the moves being tried (and ``without``
        gone); ``counted``: a decision of the search proper, taken from the budget (the scans of
        every node that start a search are not: a large cluster must not spend it there)."""
        if counted:
            self.checks_left -= 1
            if self.checks_left < 0:
                return False
        st = self.overlay.state(self.snapshot, node, frozenset(self.without.get(node, ())) | without,
                                self.added.get(node, ()))
        return st is not None and host_fits(job, st) and filter_node(job, st, self.policy, self.now).passed

    def plans(self, job: Job, pending: str, node: str, k: int) -> Iterator[DefragPlan]:
        """Plans of exactly ``k`` moves giving ``job`` room on ``node``."""
        for size in range(1, min(k, len(self.movable_on(node))) + 1):
            for chosen in itertools.combinations(self.movable_on(node), size):
                taken = frozenset(m.uid for m in chosen)
                if not self.fits(job, node, taken):
                    continue
                with self._moved(node, chosen, (pending, job)):
                    placed = self._place(sorted(chosen, key=lambda m: (-m.devices, m.key)), k - size)
                    if placed is not None:
                        state = self.overlay.state(self.snapshot, node, frozenset(self.without[node]) - {pending},
                                                   [a for a in self.added.get(node, ()) if a[0] != pending])
                        result = filter_node(job, state, self.policy, self.now)  # type: ignore[arg-type]
                        yield DefragPlan(pending, node, tuple(placed), result)
                if self.out_of_budget:
                    return

    @contextlib.contextmanager
    def _moved(self, node: str, pods: Sequence[Movable], arriving: tuple[str, Job] | None) -> Iterator[None]:
        """``pods`` taken off ``node`` (and ``arriving`` held there) while the block runs."""
        gone = self.without.setdefault(node, set())
        gone.update(m.uid for m in pods)
        if arriving is not None:
            self.added.setdefault(node, []).append(arriving)
        try:
            yield
        finally:
            gone.difference_update(m.uid for m in pods)
            if arriving is not None:
                self.added[node].remove(arriving)

    def _place(self, pods: list[Movable], moves_left: int) -> list[Move] | None:
        """Moves that place ``pods``' replacements (each on a node other than its own), using at
        most ``moves_left`` more moves to make room where none is (depth first); None if none."""
        if not pods:
            return []
        first, rest = pods[0], pods[1:]
        for dest in self.names:
            if dest == first.node:
                continue
            if self.fits(first.job, dest):
                with self._moved(dest, (), (first.uid, first.job)):
                    tail = self._place(rest, moves_left)
                if tail is not None:
                    return [Move(first, dest), *tail]
            if self.out_of_budget:
                return None
        if moves_left == 0:
            return None
        for dest in self.names:  # room made by moving more pods (a chain)
            if dest == first.node:
                continue
            candidates = self.movable_on(dest)
            for size in range(1, min(moves_left, len(candidates)) + 1):
                for chosen in itertools.combinations(candidates, size):
                    if not self.fits(first.job, dest, frozenset(m.uid for m in chosen)):
                        continue
                    with self._moved(dest, chosen, (first.uid, first.job)):
                        tail = self._place([*rest, *sorted(chosen, key=lambda m: (-m.devices, m.key))],
                                           moves_left - size)
                    if tail is not None:
                        return [Move(first, dest), *tail]
                    if self.out_of_budget:
                        return None
        return None
