"""The grouped decision the extender serves: nodes in equivalence classes decided once per class,
verdicts and scores remembered per job, bounded. A speed-up around ``core.engine.Engine``, whose
plain ``filter`` and ``score`` it must equal (``tests/unit/test_equivalence.py`` compares them
node by node).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import itertools
import operator
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

from pydantic import BaseModel

from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.devices import NodeState, NodeView
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.criteria import per_node_fields
from scheduler_extender.served.equivalence import state_keys, unit_properties, view_class, with_own_values
from scheduler_extender.core.filter import NodeResult, filter_node, inventory_rejection
from scheduler_extender.core.job import Job
from scheduler_extender.core.policy import Policy
from scheduler_extender.core.score import (FragmentationDeltas, FreeModels, NodeScore, devices_in_use,
                                           fragmentation_deltas, free_models, score_nodes, scores_without_devices,
                                           supply_of)
from scheduler_extender.core.workload import WorkloadProfile
from scheduler_extender.served.identity import IdentityMemo

@dataclass(frozen=True)
class GroupedResults:
    """Filter verdicts for many nodes, decided once per equivalence class (``served/equivalence.py``).

    Attributes:
        results: one ``NodeResult`` per class, for one node of the class (``results[g].node``; it
            may be a node decided for this job in an earlier request).
        states: the ``NodeState`` that result was decided on, per class.
        group_of: per input node, in input order, the index of its class in ``results``.
        names: the input nodes' names, in input order (callers must not modify).
        answer_key: equal for two calls with the same engine, the same ``NodeGroups`` object and
            the same ``decision_job``, whose results are then equal; None when not known (no
            ``groups`` given, or a node near the staleness limit). Callers may cache what they
            derive from the results under it.
        node_states: every input node's state, in input order.
        groups: the ``NodeGroups`` the classes came from, when the caller passed them (their
            member lists, sizes and first positions are then computed once per node list).
    """

    results: list[NodeResult]
    states: list[NodeState]
    group_of: list[int]
    names: list[str]
    answer_key: Hashable | None = None
    node_states: list[NodeState] = dataclasses.field(default_factory=list)
    groups: NodeGroups | None = None

    @functools.cached_property
    def members(self) -> list[list[str]]:
        """Per class, the names of its nodes in input order (callers must not modify)."""
        if self._from_groups:
            return self.groups.members  # type: ignore[union-attr]  # listed once per node list
        return _members(self.names, self.group_of, len(self.results))

    @functools.cached_property
    def sizes(self) -> list[int]:
        """Per class, how many input nodes it has."""
        if self._from_groups:
            return self.groups.sizes  # type: ignore[union-attr]  # counted once per node list
        return _sizes(self.group_of, len(self.results))

    @functools.cached_property
    def first_index(self) -> list[int]:
        """Per class, the position of its first input node."""
        return self.groups.first_index if self._from_groups else _first_index(self.group_of)  # type: ignore[union-attr]

    @functools.cached_property
    def host_known(self) -> bool:
        """Whether any input node's free CPU or memory is known."""
        return self.groups.host_known if self._from_groups else _host_known(self.node_states)  # type: ignore[union-attr]

    @property
    def _from_groups(self) -> bool:
        return self.groups is not None and self.groups.group_of is self.group_of


def _first_index(group_of: Sequence[int]) -> list[int]:
    # Classes are numbered in order of first appearance: the k-th first position is class k's.
    return sorted(_first_positions(group_of).values())


def _first_positions(keys: Sequence[Hashable]) -> dict[Hashable, int]:
    """Each distinct key of ``keys`` -> the position of its first occurrence (in C: the dict keeps
    the last write, and the keys are walked backwards)."""
    return dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))


def _split(keys: Sequence[Hashable]) -> tuple[list[Hashable], list[int], list[int]]:
    """``keys`` (one per node) split into parts of equal keys: the parts' keys, the position of
    each part's first node, and per node the index of its part; builtins do the per-node work."""
    first = _first_positions(keys)
    index = {key: i for i, key in enumerate(first)}
    return list(first), list(first.values()), list(map(index.__getitem__, keys))


def _host_known(states: Sequence[NodeState]) -> bool:
    # Stops at the first known node: in cluster mode the first one, in static mode none.
    return any(s.cpu_milli_free is not None or s.memory_bytes_free is not None for s in states)


def _sizes(group_of: Sequence[int], classes: int) -> list[int]:
    counts = Counter(group_of)  # counted in C
    return [counts[g] for g in range(classes)]


def _members(names: Sequence[str], group_of: Sequence[int], classes: int) -> list[list[str]]:
    # A stable sort of the positions by class, then one slice per class: builtins do the per-node work.
    in_class_order = list(map(names.__getitem__, sorted(range(len(names)), key=group_of.__getitem__)))
    members: list[list[str]] = []
    start = 0
    for size in _sizes(group_of, classes):
        members.append(in_class_order[start:start + size])
        start += size
    return members


@dataclass(frozen=True)
class ScoredGroups:
    """Scores of grouped nodes: ``scores[i]`` (None: failed the filter) with the ``results[i]`` it
    was computed from, and per input node the index ``score_of[node]`` of its score."""

    scores: list[NodeScore | None]
    results: list[NodeResult]
    score_of: list[int]


@dataclass(frozen=True)
class NodeGroups:
    """A node list split into equivalence classes for one resource, independent of any pod.

    Built by ``group_nodes`` once per version of a node list; a caller that sees the same list
    again (kube-scheduler sends it pod after pod) passes it back to ``Engine.filter_grouped``,
    which then does no per-node work. Nothing here may be modified after it is built.

    Attributes:
        class_keys: the classes' ``state_key`` numbers, in order of first appearance.
        representatives: per class, the state of its first node.
        group_of: per node, in input order, the index of its class.
        names: the nodes' names, in input order.
        oldest_observed_ts: the oldest inventory ``observedAt`` among the nodes, POSIX seconds
            (None: none has an inventory): when it is recent enough, no node can be stale.
    """

    class_keys: list[int]
    representatives: list[NodeState]
    group_of: list[int]
    names: list[str]
    oldest_observed_ts: float | None
    serial: int = dataclasses.field(default_factory=lambda: next(_SERIALS))
    states: list[NodeState] = dataclasses.field(default_factory=list, repr=False)  # per node, input order

    @functools.cached_property
    def members(self) -> list[list[str]]:
        """Per class, the names of its nodes in input order."""
        return _members(self.names, self.group_of, len(self.class_keys))

    @functools.cached_property
    def sizes(self) -> list[int]:
        """Per class, how many nodes it has."""
        return _sizes(self.group_of, len(self.class_keys))

    @functools.cached_property
    def first_index(self) -> list[int]:
        """Per class, the position of its first node."""
        return _first_index(self.group_of)

    @functools.cached_property
    def host_known(self) -> bool:
        """Whether any node's free CPU or memory is known."""
        return _host_known(self.states)


_SERIALS = itertools.count()
"""Serial numbers of ``NodeGroups`` and ``Engine`` objects: unlike ``id()``, never reused."""


def oldest_observed(states: Iterable[NodeState]) -> float | None:
    """The oldest inventory ``observedAt`` among ``states`` (POSIX seconds; None: no inventory)."""
    # Floats, not the inventories' aware datetimes: comparing those calls their tzinfo each time.
    return min([s.view.observed_ts for s in states if s.view is not None], default=None)


_NOT_GIVEN: Any = object()


def group_nodes(states: Sequence[NodeState], keys: Sequence[int], names: Sequence[str] | None = None,
                oldest_observed_ts: float | None = _NOT_GIVEN) -> NodeGroups:
    """``NodeGroups`` of ``states`` whose ``state_keys`` are ``keys`` (same length and order).

    ``names`` (the states' names) and ``oldest_observed_ts`` (``oldest_observed(states)``) may be
    given when the caller has them already; every per-node step is a builtin over the lists, so
    grouping a few hundred nodes costs microseconds.
    """
    first = dict(zip(reversed(keys), reversed(states)))  # first node of each class
    index = {k: g for g, k in enumerate(dict.fromkeys(keys))}
    group_of = list(map(index.__getitem__, keys))
    if names is None:
        names = [s.name for s in states]
    if oldest_observed_ts is _NOT_GIVEN:
        oldest_observed_ts = oldest_observed(states)
    return NodeGroups(list(index), [first[k] for k in index], group_of, list(names), oldest_observed_ts,
                      states=states if isinstance(states, list) else list(states))


MEMO_JOBS = 32
"""Jobs whose class verdicts an engine remembers (least recently used first out). kube-scheduler
asks prioritize right after filter; more entries only lengthen the collector's full passes (256
made them 70 ms at 5,000 nodes)."""

MEMO_CLASSES = 20_000
"""Node classes whose verdict one job's memo keeps; beyond, it starts over. A cluster has a few
hundred classes; full Node objects in requests (``nodeCacheCapable: false``) can bring new ones
with every request, and memory must not grow with what clients send."""


_CPU_FREE = operator.attrgetter("cpu_milli_free")
_MEMORY_FREE = operator.attrgetter("memory_bytes_free")

MEMO_HOST_PAIRS = 100_000
"""Pairs of host classes an engine numbers (``GroupedEngine._host_pairs_of``): a cluster's nodes
have a few hundred distinct free CPU/memory amounts per learned workload."""

MEMO_PAIR_TABLES = 256
"""(resource, pod requests) whose host-pair numbers an engine keeps per free CPU/memory, for the
latest learned workload only (``GroupedEngine._host_pairs_of``); beyond, they start over."""

MEMO_SCORES = 256
"""Sets of competing node kinds whose scores an engine remembers (``score_grouped``)."""


def with_host(state: NodeState, name: str, cpu_milli_free: int | None, memory_bytes_free: int | None) -> NodeState:
    """``state`` under another node's name and free CPU/memory (``score_grouped`` scores a node on
    its class's representative this way, one such state per scored part of every request). Built
    as ``_replaced`` builds a job, without ``dataclasses.replace``'s cost; the keys this layer
    remembers for a state (``served.equivalence``) depend on neither field, and are recomputed
    for the new state if ever asked (the score asks none)."""
    return _replaced(state, name=name, cpu_milli_free=cpu_milli_free, memory_bytes_free=memory_bytes_free)


_FREE_MODELS: IdentityMemo[dict[str, FreeModels]] = IdentityMemo()
"""Per ``NodeState``: its ``score.free_models`` per resource. A state is immutable and the
cluster cache keeps it until its node changes, so the free devices of the nodes a request names
are read once per state, not once per request (``supply_of``) and candidate."""

MAX_RESOURCES_FREE = 16
"""Resources whose free devices one state's memo keeps (a node has a few; beyond, it starts over)."""


_DEVICES_IN_USE: IdentityMemo[float] = IdentityMemo()
"""Per ``NodeState``: its ``score.devices_in_use``."""


def memo_devices_in_use(state: NodeState) -> float:
    """``score.devices_in_use(state)``, remembered per state (``_DEVICES_IN_USE``)."""
    value = _DEVICES_IN_USE.get(state)
    if value is None:
        value = _DEVICES_IN_USE.put(state, devices_in_use(state, memo_free_models))
    return value


def memo_free_models(state: NodeState, resource: str) -> FreeModels:
    """``score.free_models(state, resource)``, remembered per state (``_FREE_MODELS``)."""
    frees = _FREE_MODELS.get(state)
    if frees is None:
        frees = _FREE_MODELS.put(state, {})
    free = frees.get(resource)
    if free is None:
        if len(frees) >= MAX_RESOURCES_FREE:
            frees.clear()
        free = frees[resource] = free_models(state, resource)
    return free


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


def decision_job(job: Job) -> Job:
    """``job`` as the filter and the score see it: without the pod's name, which neither reads.

    Pods with the same spec in the same namespace (a Deployment's replicas, a training job's
    workers, a burst from one controller) then share remembered verdicts, as kube-scheduler's
    former equivalence cache shared them between pods of one controller. Verdicts are computed on
    this value itself, so they cannot depend on the name even by mistake.
    """
    if not job.req.name:
        return job
    cached = _DECISIONS.get(job)
    if cached is None:
        cached = _DECISIONS.put(job, dataclasses.replace(job, req=dataclasses.replace(job.req, name="")))
    return cached


def named_job(decision: Job, name: str) -> Job:
    """The job of a pod named ``name`` whose ``decision_job`` is ``decision`` (a pod resolved
    like one seen before: same namespace, annotations and spec). Its ``decision_job`` is
    ``decision`` itself, so the verdicts remembered for it are shared."""
    if not name:
        return decision
    job = _replaced(decision, req=_replaced(decision.req, name=name))
    _DECISIONS.put(job, decision)
    return job


def _replaced(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace(obj, **changes)`` for the frozen dataclasses here (no
    ``__post_init__``, no init-only fields, no slots): the new object's own declared fields are
    written into its fresh ``__dict__`` without running ``__init__`` (``changes`` must name fields
    only), and nothing else: no memo of ``obj`` (the side tables are keyed by identity, not
    copied). A pod of a known spec is named this way on every request, where
    ``dataclasses.replace`` took ~15 us a call."""
    fields = _FIELDS.get(type(obj))
    if fields is None:
        fields = _FIELDS[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    new = object.__new__(type(obj))
    values = obj.__dict__
    new.__dict__.update({n: values[n] for n in fields})
    new.__dict__.update(changes)
    return new


_FIELDS: dict[type, tuple[str, ...]] = {}


_DECISIONS: IdentityMemo[Job] = IdentityMemo()
"""Per named ``Job``: its ``decision_job`` (``named_job`` puts it; the server's pod memo keeps the
decisions alive, a named job lives for its request)."""
_JOB_KEYS: IdentityMemo[Hashable] = IdentityMemo()
"""Per ``Job``: its ``_job_key`` when hashable (a copy of the job's fields, never the job itself)."""


def _job_key(job: Job) -> Hashable | None:
    """The complete value of ``job`` as a hashable key; None if some field cannot be hashed.

    The size class is a pydantic model with list fields (unhashable); within one engine it is
    one of the policy's classes, whose names are unique, so its name stands for it. Any other
    unhashable field falls back to ``frozen_value``.
    """
    cached = _JOB_KEYS.get(job)
    if cached is not None:
        return cached
    try:
        key: Hashable = (dataclasses.replace(job, size_class=None), job.size_class.name)
        hash(key)
        return _JOB_KEYS.put(job, key)
    except TypeError:
        pass
    try:
        key = frozen_value(job)
        hash(key)
    except TypeError:
        return None
    return key



class UnitVerdicts(dict):
    """One job's ``filter_node`` memo (``core.filter.UnitVerdicts``): verdicts kept per node
    structure (``equivalence.view_class``) and resource, and per-unit criteria per unit
    properties (``equivalence.unit_properties``)."""

    def structure_key(self, view: NodeView, resource: str) -> Hashable:
        return (view_class(view), resource)

    def unit_keys(self, view: NodeView, resource: str) -> Sequence[Hashable]:
        return unit_properties(view, resource)


class GroupedEngine(Engine):
    """``Engine`` plus the grouped path and its memos (per job: class verdicts and scores). One per
    policy, swapped whole on a reload like ``Engine``; ``serial`` tells engines apart in answer keys.

    ``fragmentation_deltas``: how the score computes the candidates' fragmentation increases,
    ``score.fragmentation_deltas`` or a function equal to it float for float (``gpuplace
    simulate``'s gpuplace policy sets its numpy batch, ``simulator.batch_fragmentation``)."""

    def __init__(self, policy: Policy | None = None, catalog: Catalog | None = None) -> None:
        super().__init__(policy, catalog)
        self.fragmentation_deltas: FragmentationDeltas = fragmentation_deltas
        self._memo: OrderedDict[Hashable, tuple[dict[int, tuple[NodeState, NodeResult]], UnitVerdicts]] = OrderedDict()
        self._scores: OrderedDict[Hashable, dict[Hashable, NodeScore]] = OrderedDict()
        self._host_pairs: dict[Hashable, int] = {}
        self._pair_tables: dict[Hashable, dict[tuple[int | None, int | None], int]] = {}
        self._pairs_workload: WorkloadProfile | None = None
        self.serial = next(_SERIALS)

    def _host_pairs_of(self, workload: WorkloadProfile, resource: str, cpu_need: int, memory_need: int,
                       host: Iterable[tuple[int | None, int | None]]) -> dict[tuple[int | None, int | None], int]:
        """For a pod requesting ``cpu_need`` / ``memory_need``, free (CPU, memory) -> the number of
        its pair of ``WorkloadProfile.host_class`` before and after the pod's requests, for the
        pairs of ``host`` and those seen before. The numbers are this engine's, the same in every
        request (``score_grouped`` keys its parts and its remembered scores by them); past
        ``MEMO_HOST_PAIRS`` of them, the numbers, the tables and the scores keyed by them start over."""
        if self._pairs_workload is not workload:  # a new snapshot: the tables of the last one go
            self._pair_tables.clear()
            self._pairs_workload = workload
        key = (resource, cpu_need, memory_need)
        table = self._pair_tables.get(key)
        if table is None:
            if len(self._pair_tables) >= MEMO_PAIR_TABLES:
                self._pair_tables.clear()
            table = self._pair_tables[key] = {}
        missing = set(host).difference(table)
        if missing:
            numbers = self._host_pairs
            if len(numbers) + len(missing) > MEMO_HOST_PAIRS:
                numbers.clear()
                self._pair_tables.clear()
                self._scores.clear()
                table = self._pair_tables[key] = {}
                missing = set(host)
            for cpu, mem in missing:
                pair = (workload.host_class(resource, cpu, mem), workload.host_class(
                    resource, None if cpu is None else cpu - cpu_need, None if mem is None else mem - memory_need))
                number = numbers.get(pair)
                if number is None:
                    number = numbers[pair] = len(numbers)
                table[(cpu, mem)] = number
        return table

    def score_with_scarcity(self, job: Job, states: Sequence[NodeState], results: Sequence[NodeResult],
                            workload: WorkloadProfile | None, scarcity: Mapping[str, float] | None) -> dict[str, NodeScore]:
        """``Engine.score_with_scarcity`` with each state's free devices remembered (``memo_free_models``)."""
        passed = [(s, r) for s, r in zip(states, results) if r.passed]
        return {s.node: s for s in score_nodes(job, passed, self.policy, workload, scarcity, memo_free_models,
                                               self.fragmentation_deltas)}

    def _score_without_devices(self, job: Job, grouped: GroupedResults, workload: WorkloadProfile) -> ScoredGroups:
        """``score_grouped`` for a pod without devices (``score.scores_without_devices``), which is
        scored on each node's own free devices, CPU and memory (``score._score_without_devices``):
        its filter classes leave those out. Nodes are split by exactly what that score reads of
        them (per device resource of the workload, the free devices by model; the free CPU and
        memory; the share of devices in use), and each part is scored once, on its first node. At
        5,000 nodes, node by node, such a pod took about 110 ms a request."""
        node_states = grouped.node_states
        resources = workload.resources
        keys = [(g, tuple([memo_free_models(s, r)[1] for r in resources]), s.cpu_milli_free, s.memory_bytes_free,
                 memo_devices_in_use(s)) for g, s in zip(grouped.group_of, node_states)]
        parts, first_of, score_of = _split(keys)
        states = [node_states[i] for i in first_of]
        results = [NodeResult(s.name, r.passed, r.rejections, r.chosen, r.untouched)
                   for s, r in zip(states, (grouped.results[key[0]] for key in parts))]  # type: ignore[index]
        by_name = self.score(job, states, results, workload)
        return ScoredGroups([by_name.get(r.node) if r.passed else None for r in results], results, score_of)

    def filter_grouped(self, job: Job, states: Iterable[NodeState], now: dt.datetime | None,
                       keys: Sequence[int] | None = None, groups: NodeGroups | None = None) -> GroupedResults:
        """``filter`` for many nodes at once: ``filter_node`` runs once per equivalence class.

        Every node gets its class's verdict and reasons, which are what ``filter_node`` would give
        it (``tests/unit/test_equivalence.py`` checks this node by node). A node whose inventory is
        stale is decided on its own: its reason names its own age. For a job a criterion over
        often-changing fields applies to (``core.criteria.per_node_fields``), the classes are
        split by the nodes' own values of those fields, for this job only. ``keys``: the states'
        ``state_keys`` for ``job.req.resource`` when the caller has them already; ``groups``: the
        states' ``group_nodes`` for that resource, when the caller has that already.
        """
        policy = self.policy
        job = decision_job(job)
        states = list(states)
        given = groups
        if groups is None:
            groups = group_nodes(states, state_keys(states, job.req.resource) if keys is None else list(keys))
        suspect = now.timestamp() - (policy.inventory.stale_after_seconds - 1) if now is not None else None
        if (suspect is not None and policy.inventory.on_stale == "reject" and groups.oldest_observed_ts is not None
                and groups.oldest_observed_ts < suspect):
            # Some node is near the limit: the exact check (and its message) for the nodes there;
            # a stale node is a class of its own (its reason names its own age; class numbers are >= 0).
            class_keys = groups.class_keys
            own = [class_keys[g] if (s.view is None or s.view.observed_ts >= suspect
                                     or inventory_rejection(s, policy, now) is None) else -1 - i
                   for i, (s, g) in enumerate(zip(states, groups.group_of))]
            groups = group_nodes(states, own)
        own_fields = per_node_fields(job)
        if own_fields:  # a criterion over often-changing fields (a temperature): each node's own values decide
            groups = group_nodes(states, with_own_values(
                states, [groups.class_keys[g] for g in groups.group_of], job.req.resource, own_fields))
        job_key = _job_key(job)
        memo, unit_verdicts = self._job_memo(job_key)
        reps: list[NodeState] = []
        results: list[NodeResult] = []
        for k, rep in zip(groups.class_keys, groups.representatives):
            hit = memo.get(k)
            if hit is None:
                hit = (rep, filter_node(job, rep, policy, now, unit_verdicts))
                if k >= 0:  # a stale node's verdict depends on now
                    if len(memo) >= MEMO_CLASSES:
                        memo.clear()
                    memo[k] = hit
            reps.append(hit[0])
            results.append(hit[1])
        answer_key = (self.serial, groups.serial, job_key) if groups is given and job_key is not None else None
        return GroupedResults(results, reps, groups.group_of, groups.names, answer_key, states, groups)

    def _job_memo(self, key: Hashable | None) -> tuple[dict[int, tuple[NodeState, NodeResult]], UnitVerdicts]:
        """Class verdicts already decided for the job of ``_job_key`` ``key`` (kube-scheduler asks
        filter, then prioritize, and retries pending pods; a controller's pods share a
        ``decision_job``), and the job's ``filter_node`` memo of per-structure verdicts; held by
        this engine only, so a policy swap (a new engine) starts empty, and a changed node state
        is a new class. ``key`` None: nothing remembered."""
        if key is None:
            return {}, UnitVerdicts()
        memo = self._memo.get(key)
        if memo is None:
            memo = self._memo[key] = ({}, UnitVerdicts())
            if len(self._memo) > MEMO_JOBS:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return memo

    def score_grouped(self, job: Job, grouped: GroupedResults, workload: WorkloadProfile | None = None,
                      supply: Mapping[str, float] | None = None) -> ScoredGroups:
        """Scores of the nodes of ``grouped``, computed once per scoring class.

        A node's score depends on its own state and result and on the cheapest / fastest
        placement among all candidates; a minimum over the classes equals the minimum over the
        nodes, so a class's score is every one of its nodes' score. Filter classes leave the
        nodes' free CPU/memory out (the filter does not read them); when the ``fragmentation``
        component can apply (a learned ``workload`` and a weight), passing classes are split by
        what that component reads of them: the ``WorkloadProfile.host_class`` of the free CPU and
        memory before and after the pod's requests.

        Each part is scored on its class's representative (same devices, same held positions,
        same chosen-unit properties) under the name and free CPU/memory of the part's first node:
        the representative may be a node decided in an earlier request, whose name may belong to
        another class in this one, and scores are matched to nodes by name.
        """
        resource = job.req.resource
        node_states = grouped.node_states
        if scores_without_devices(job, self.policy, workload):
            return self._score_without_devices(job, grouped, workload)  # type: ignore[arg-type]  # checked
        passed = [r.passed for r in grouped.results]
        # A part: (class index, host class), or the class alone when nothing reads free CPU/memory.
        parts: list[tuple[int, ...]]  # (class index,) or (class index, host pair number)
        if (workload and self.policy.scoring.fragmentation and resource is not None and any(passed)
                and grouped.host_known):
            host = list(zip(map(_CPU_FREE, node_states), map(_MEMORY_FREE, node_states)))
            pair_of = self._host_pairs_of(workload, resource, job.cpu_milli or 0, job.memory_bytes or 0, host)
            width = len(self._host_pairs) or 1  # above every pair number of the table
            # Failed classes are split too (they are not scored): no per-node test of the verdict.
            codes, first_of, score_of = _split([g * width + h for g, h in zip(grouped.group_of, map(pair_of.__getitem__, host))])
            parts = [divmod(code, width) for code in codes]  # type: ignore[call-overload]  # ints
        else:  # the filter classes themselves: nothing per node
            parts = [(g,) for g in range(len(passed))]
            first_of = grouped.first_index
            score_of = grouped.group_of
        if supply is None and resource is not None and workload:  # over every node of the request
            supply = supply_of(list(zip(grouped.states, grouped.sizes)), resource, memo_free_models)
        scarcity = self.scarcity(job, workload, supply)
        memo_key = None
        if grouped._from_groups:
            # The scores of the parts are a function of the job, the workload and which kinds of
            # passing node (class key, host class) compete: remembered across pods and node lists.
            class_keys = grouped.groups.class_keys  # type: ignore[union-attr]  # _from_groups: given
            job_key = _job_key(decision_job(job))
            global_parts = [(class_keys[k[0]], *k[1:]) for k in parts]  # (class key[, host pair number])
            if job_key is not None:
                memo_key = (job_key, workload or None, tuple(sorted(scarcity.items())) if scarcity else None, frozenset(
                    gp for gp, k in zip(global_parts, parts) if passed[k[0]]))
                hit = self._scores.get(memo_key)
                if hit is not None:
                    self._scores.move_to_end(memo_key)
                    return ScoredGroups([hit.get(gp) for gp in global_parts],
                                        [grouped.results[k[0]] for k in parts], score_of)
        results: list[NodeResult] = []
        candidates: list[tuple[NodeState, NodeResult]] = []
        # Per candidate state (by identity: every one is alive in ``candidates`` until the score
        # returns), the free devices of the class state it stands for, read once per state.
        frees: dict[int, FreeModels] = {}
        for key, i in zip(parts, first_of):
            g = key[0]
            rep, r = grouped.states[g], grouped.results[g]
            if passed[g]:
                s = node_states[i]
                if s.name != r.node:
                    part = with_host(rep, s.name, s.cpu_milli_free, s.memory_bytes_free)
                    r = NodeResult(s.name, True, r.rejections, r.chosen, r.untouched)
                else:
                    part = s
                if resource is not None:
                    frees[id(part)] = memo_free_models(rep, resource)
                candidates.append((part, r))
            results.append(r)

        def free_of(state: NodeState, of: str) -> FreeModels:
            free = frees.get(id(state)) if of == resource else None
            return free if free is not None else free_models(state, of)

        by_name = {sc.node: sc for sc in score_nodes(job, candidates, self.policy, workload, scarcity, free_of,
                                                     self.fragmentation_deltas)}
        scores = [by_name.get(r.node) if r.passed else None for r in results]
        if memo_key is not None:
            self._scores[memo_key] = {gp: sc for gp, sc in zip(global_parts, scores) if sc is not None}
            if len(self._scores) > MEMO_SCORES:
                self._scores.popitem(last=False)
        return ScoredGroups(scores, results, score_of)


def as_grouped(engine: Engine) -> GroupedEngine:
    """``engine`` itself when it is a ``GroupedEngine``, else one for its policy and catalog."""
    return engine if isinstance(engine, GroupedEngine) else GroupedEngine(engine.policy, engine.catalog)
