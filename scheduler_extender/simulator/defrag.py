"""Defragmentation in the replay: ``gpuplace simulate --mode replay --defrag`` (policy ``gpuplace+defrag``).

The extender's planner (``core.defrag.plan_room``: the fewest moves of movable pods that make room
for a pending pod on one node) run over the simulated cluster, its plan carried out at once.

- *Who is planned for*: whole-GPU pods (``gpus`` >= 1, ``gpu_milli`` 1000) waiting in the replay's
  queue. GPU-sharing pods are not (their filter state depends on their share: ``Cluster.class_state``).
- *When*: after each event that leaves a GPU pod waiting (an arrival that fits nowhere; a departure,
  after the queue's usual retry), for the waiting pods in queue order (the longest-waiting first),
  until ``PLANS_PER_EVENT`` planner calls found no plan (a plan that starts a pod does not count:
  there are at most as many as pods). No call while the cluster has fewer GPUs free than the pod
  asks (moves gather free GPUs, they free none), nor again for a pod shape that found no plan until some
  node has more GPUs free than it had then (a pod left, or a plan moved pods).
- *Movable*: every running GPU pod (as if each were recreated by a controller: a Deployment, a
  Job with checkpoints), except on time-sliced nodes (``--sharing device-plugin``), where a pod is
  not planned for either.
- *What the planner sees* (``SimSnapshot``): at most ``TARGETS`` nodes it may make room on (the pod's
  GPU models, enough GPUs, its CPU and memory once the GPU pods there are gone; fewest GPUs to free
  first) and ``DESTINATIONS`` other nodes with a free GPU and the CPU and memory of the smallest
  pod on those targets, for the replacements (fewest free GPUs first: the holes get filled),
  ``MAX_CHECKS`` filter decisions per plan (``core.defrag.MAX_FILTER_CHECKS`` is the extender's).
  A node state is built per node (not per class): the units with any share taken are held, a
  replacement or the pending pod added holds as many units as it asks (``NodeAllocation.anonymous``,
  as the cluster cache holds a reservation), and the verdicts are ``core.filter.filter_node``'s.
  The filter reads no CPU or memory; a plan that would leave nodes short of either is refused, and
  the planner asked again without those nodes, ``REPLANS`` times at most.
- *A move*: the pod is released from its node and its replacement placed on the destination at
  once, on the units gpuplace's filter gives it there (a sharing pod: the best-fitting GPU), with the
  pod's remaining run time (no restart cost is charged: its departure time is unchanged). Then the
  pending pod is placed on the plan's node. ``Snapshot.defrag_moves`` counts the moves,
  ``defrag_started`` the pods started by a plan. A moved pod's GPU-hours are reported on its last
  node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

import numpy as np

from scheduler_extender.core.defrag import DefragPlan, Movable, plan_room
from scheduler_extender.core.devices import NodeAllocation, NodeState, Unit
from scheduler_extender.core.filter import filter_node
from scheduler_extender.core.job import Job
from scheduler_extender.simulator.cluster import Cluster
from scheduler_extender.simulator.model import SimPod

if TYPE_CHECKING:
    from scheduler_extender.simulator.baselines import GpuplacePolicy


class Placement(Protocol):
    """A running pod as the replay holds it (``run.Placement``): moved in place."""

    pod: SimPod
    node: int
    units: tuple[Unit, ...]

DEFRAG_POLICY = "gpuplace+defrag"
"""The policy's name in the report: gpuplace with defragmentation."""

TARGETS = 8
"""Nodes a plan may make room on (those with the fewest GPUs to free)."""

DESTINATIONS = 32
"""Other nodes the planner sees, for the replacements (those with the fewest free GPUs, at least one)."""

MAX_CHECKS = 256
"""Filter decisions per plan (``core.defrag.plan_room``'s ``max_checks``)."""

REPLANS = 2
"""Plans asked again for one pod when a plan would leave nodes short of CPU or memory (without them)."""

PLANS_PER_EVENT = 2
"""Planner calls that find no plan, per event (arrival or departure), at most."""

NAMESPACE = "sim"


def node_state(cluster: Cluster, i: int, without: frozenset[str] = frozenset(),
               added: Sequence[tuple[str, Job]] = ()) -> NodeState:
    """Node ``i``'s state for a whole-GPU pod: every unit with a share taken by a pod not in
    ``without`` is held (``NodeAllocation.held``, the pods' names), and each of ``added`` holds as
    many units as it asks without naming them (``NodeAllocation.anonymous``)."""
    held: dict[str, str] = {}
    for u, holders in zip(cluster.units[i], cluster.on_unit[i]):
        names = [p for p in holders if p not in without]
        if names:
            held[u.uuid] = ",".join(names)
    anonymous: dict[str, int] = {}
    for _, job in added:
        req = job.req
        if req.wants_gpu and req.resource:
            anonymous[req.resource] = anonymous.get(req.resource, 0) + req.gpu_count
    return NodeState(name=cluster.nodes[i].name, view=cluster.views[i],
                     allocation=NodeAllocation(held=held, anonymous=anonymous))


class SimSnapshot:
    """``core.defrag.Snapshot`` over the simulated cluster, limited to the nodes ``names`` (indices)."""

    def __init__(self, cluster: Cluster, names: Sequence[int]) -> None:
        self.cluster = cluster
        self.index = {cluster.nodes[i].name: i for i in names}
        self._names = [cluster.nodes[i].name for i in names]

    def node_names(self) -> Sequence[str]:
        return self._names

    def state_with(self, node: str, without: frozenset[str], added: Sequence[tuple[str, Job]]) -> NodeState | None:
        i = self.index.get(node)
        return None if i is None else node_state(self.cluster, i, without, added)


@dataclass
class Defrag:
    """One replay's defragmentation (module docstring): the plans, their moves and the memo of
    shapes no plan was found for."""

    policy: GpuplacePolicy
    cluster: Cluster
    moves: int = 0
    started: int = 0
    calls: int = 0
    refused: int = 0  # plans that would leave a node short of CPU or memory (asked again without it)
    mismatched: int = 0  # plans the cluster could not carry out (none expected)
    _failed: dict[tuple, np.ndarray] = field(default_factory=dict)  # shape -> free GPUs per node then

    @staticmethod
    def plans_for(pod: SimPod) -> bool:
        """Whether a plan is sought for ``pod``: a whole-GPU pod."""
        return pod.gpus >= 1 and not pod.sharing

    def worth_trying(self, pod: SimPod) -> bool:
        """A whole-GPU pod, with at least as many GPUs free in the cluster as it asks (moves do not
        free GPUs, they gather them), whose shape found no plan last when no node had more GPUs
        free than now (a pod left, or a plan moved pods, since)."""
        c = self.cluster
        if not self.plans_for(pod) or int(c.gpu_free[~c.shared].sum()) < pod.gpus:
            return False
        then = self._failed.get(pod.shape)
        return then is None or bool((c.gpu_free > then).any())

    def make_room(self, pod: SimPod, running: Mapping[str, Placement]) -> tuple[int, tuple[Unit, ...]] | None:
        """Plan room for ``pod`` and carry the plan out (the moves done in ``cluster`` and in the
        ``running`` placements, which are updated in place); the node and units for ``pod``, or
        None (nothing changed) when no plan is found or the plan is refused."""
        self.calls += 1
        c = self.cluster
        names = self._nodes(pod, running)
        if names is None:
            self._failed[pod.shape] = c.gpu_free.copy()
            return None
        job = self.policy.job(pod)
        for _ in range(1 + REPLANS):
            snap = SimSnapshot(c, names)
            on_nodes = sorted({name for i in names for holders in c.on_unit[i] for name in holders})
            movable = [Movable(p.pod.name, f"{NAMESPACE}/{p.pod.name}", c.nodes[p.node].name,
                               self.policy.job(p.pod), p.pod.gpus)
                       for p in (running[name] for name in on_nodes)]
            plan = plan_room(job, f"{NAMESPACE}/{pod.name}", snap, movable, self.policy.engine.policy,
                             max_checks=MAX_CHECKS)
            if plan is None:
                break
            short = self._short(plan, pod, snap, running)
            if short:  # the planner reads no CPU or memory: ask again without the nodes short of them
                self.refused += 1
                names = [i for i in names if i not in short]
                continue
            choice = self._carry_out(plan, pod, job, snap, running)
            if choice is None:
                break
            self.moves += len(plan.moves)
            self.started += 1
            return choice
        self._failed[pod.shape] = c.gpu_free.copy()
        return None

    def _nodes(self, pod: SimPod, running: Mapping[str, Placement]) -> list[int] | None:
        """The nodes the planner sees (module docstring): targets, then destinations; None
        without a target. Targets: the pod's GPU models, enough GPUs, and its CPU and memory free
        once the GPU pods there are gone; destinations: a GPU free, and the CPU and memory of the
        smallest GPU pod on the targets. Nodes where the pod's GPUs are free (its CPU or memory is
        not) are left out: there the planner would find that the pod fits already."""
        c = self.cluster
        usable = ~c.shared & c.model_mask(pod.allowed_models)
        gpu_fit = usable & (c.gpu_free >= pod.gpus)
        candidates = np.flatnonzero(usable & ~gpu_fit & (c.gpu_total >= pod.gpus))
        targets: list[tuple[int, int, int]] = []  # (GPUs to free, pods there, node)
        for i in candidates.tolist():
            on = [running[name].pod for name in {n for holders in c.on_unit[i] for n in holders}]
            if (c.cpu_free[i] + sum(p.cpu_milli or 0 for p in on) >= (pod.cpu_milli or 0)
                    and c.mem_free[i] + sum(p.memory_mib or 0 for p in on) >= (pod.memory_mib or 0)):
                targets.append((pod.gpus - int(c.gpu_free[i]), len(on), i))
        if not targets:
            return None
        chosen = [i for _, _, i in sorted(targets)[:TARGETS]]
        on_targets = [running[n].pod for i in chosen for holders in c.on_unit[i] for n in holders]
        cpu = min((p.cpu_milli or 0 for p in on_targets), default=0)
        mem = min((p.memory_mib or 0 for p in on_targets), default=0)
        dests = np.flatnonzero(~c.shared & ~gpu_fit & (c.gpu_free >= 1) & (c.cpu_free >= cpu) & (c.mem_free >= mem))
        dests = dests[~np.isin(dests, chosen)]
        order = np.lexsort((dests, c.gpu_free[dests]))
        return chosen + [int(i) for i in dests[order[:DESTINATIONS]]]

    def _short(self, plan: DefragPlan, pod: SimPod, snap: SimSnapshot, running: Mapping[str, Placement]) -> set[int]:
        """The nodes ``plan`` would leave short of CPU or memory (the pod on the plan's node)."""
        c = self.cluster
        cpu: dict[int, float] = {snap.index[plan.node]: -(pod.cpu_milli or 0)}
        mem: dict[int, float] = {snap.index[plan.node]: -(pod.memory_mib or 0)}
        for m in plan.moves:
            p, dest = running[m.pod.uid], snap.index[m.destination]
            for i, sign in ((p.node, 1), (dest, -1)):
                cpu[i] = cpu.get(i, 0) + sign * (p.pod.cpu_milli or 0)
                mem[i] = mem.get(i, 0) + sign * (p.pod.memory_mib or 0)
        return {i for i, v in cpu.items() if c.cpu_free[i] + v < 0} | {i for i, v in mem.items() if c.mem_free[i] + v < 0}

    def _carry_out(self, plan: DefragPlan, pod: SimPod, job: Job, snap: SimSnapshot,
                   running: Mapping[str, Placement]) -> tuple[int, tuple[Unit, ...]] | None:
        """Do ``plan``'s moves (all pods released, then each replacement placed) and find the
        pending pod's units on the plan's node; None, with everything as before, if (a mismatch
        between plan and cluster) a replacement or the pod finds no room."""
        c = self.cluster
        target = snap.index[plan.node]
        moved = [(running[m.pod.uid], snap.index[m.destination]) for m in plan.moves]
        before = [(p, p.node, p.units) for p, _ in moved]
        for p, _ in moved:
            c.release(p.node, p.pod, p.units)
        placed: list[Placement] = []
        for p, dest in moved:
            units = self._units(p.pod, dest)
            if units is None:
                break
            c.place(dest, p.pod, units)
            p.node, p.units = dest, units
            placed.append(p)
        else:
            units = self._units(pod, target, job)
            if units is not None:
                return target, units
        for p in placed:  # undo
            c.release(p.node, p.pod, p.units)
        for p, node, units in before:
            c.place(node, p.pod, units)
            p.node, p.units = node, units
        self.mismatched += 1
        return None

    def _units(self, pod: SimPod, i: int, job: Job | None = None) -> tuple[Unit, ...] | None:
        """The units ``pod`` gets on node ``i`` now: a sharing pod the best-fitting GPU with its
        share free, a whole-GPU pod those gpuplace's filter chooses; None when it does not fit."""
        c = self.cluster
        if pod.sharing:
            return (c.best_fit_unit(i, pod.gpu_milli),) if c.fits_gpus_at(i, pod) else None
        r = filter_node(job or self.policy.job(pod), node_state(c, i), self.policy.engine.policy, None)
        return tuple(r.chosen) if r.passed and r.chosen else None
