"""The extender's decisions, without HTTP: ``ExtenderService`` answers the verbs as bytes from a
request's ``ExtenderArgs``, and holds what the decisions share between requests: the node index
and node-list memo over the source's change log (the snapshot the requests read), the job memo,
remembered answers, the learned workload, reservations and requeue. ``service.server`` serves it
over HTTP; ``gpuplace explain`` and the tests call it directly. No HTTP framework is imported here
(import-linter contract)."""

from __future__ import annotations

import gc
import itertools
import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import orjson

from scheduler_extender.core.devices import NodeState
from scheduler_extender.core.dra_claims import Alternative, alternatives_of, decide_with_claims, written_requests
from scheduler_extender.core.engine import Decision, Engine
from scheduler_extender.served.grouped import GroupedEngine, GroupedResults, NodeGroups, group_nodes
from scheduler_extender.served.equivalence import state_key
from scheduler_extender.core.filter import NodeResult
from scheduler_extender.core.job import Job
from scheduler_extender.core.node import node_name
from scheduler_extender.core.kube_scores import default_profile_score
from scheduler_extender.core.score import NodeScore, scores_without_devices
from scheduler_extender.core.pod import Pod, as_pod
from scheduler_extender.core.workload import WorkloadProfile, WorkloadTracker
from scheduler_extender.service.explain import explain_decision
from scheduler_extender.service.logtext import for_log
from scheduler_extender.served.decider import Decider
from scheduler_extender.served.memo import BoundedMemo
from scheduler_extender.served.selection import best_ranked
from scheduler_extender.service.metrics import ExtenderMetrics
from scheduler_extender.cluster.dra import DraFleet
from scheduler_extender.cluster.pending import NOMINATED_ANNOTATION
from scheduler_extender.cluster.requeue import REQUEUE_ANNOTATION, Requeuer
from scheduler_extender.cluster.sources import StateSource
from scheduler_extender.service.wire import ExtenderArgs, ExtenderPreemptionArgs, dumps

log = logging.getLogger(__name__)

_IGNORED_ANNOTATIONS = frozenset({REQUEUE_ANNOTATION, NOMINATED_ANNOTATION})
"""Left out of a pod's job key: the extender's own requeue mark changes nothing the pod asks for."""

SERVING_SECONDS = 90.0
"""A replica serves kube-scheduler while it had a ``/filter`` call within this (``serving``):
kube-scheduler retries waiting pods at least every 60 s in the chart."""

MAX_ANSWERS = 64
"""Response bodies remembered per (verb, engine, node list version, pod spec); a few bursts' worth."""

MAX_ANSWER_BYTES = 64 * 2**20
"""... and their total size (the answer for 15,000 nodes with a reason each is a few MiB)."""

MAX_ROTATIONS = 16
"""Rotations of the remembered node list whose states and classes are kept (kube-scheduler
starts each search where the last one stopped, so a sampled list comes rotated; each rotation
kept costs a list as long as the node list)."""

GC_FREEZE_NODES = 1000
"""Reading this many nodes' states in one request (the first request, a relist) freezes the
collector's generations afterwards (``gc.freeze``): full passes over long-lived states are what
made the slowest requests slow."""

STALE_MARGIN_SECONDS = 60.0
"""While every node the extender has read reported this long before the staleness limit, no list
can hold a stale node and the per-list oldest ``observedAt`` is not computed."""

MAX_QUOTED_NAMES = 200_000
"""Node names kept JSON-encoded for filter bodies (``_quoted``); more than any cluster has nodes."""

MAX_QUOTED_BYTES = 32 * 2**20
"""... and their total length (names a client sends are not bounded by any cluster)."""

MAX_QUOTED_GROUPS = 16
"""Node lists whose per-class encoded names are kept (the current list and its rotations)."""

MAX_QUOTED_GROUP_BYTES = 64 * 2**20

@dataclass
class _NodeIndex:
    """Per node name: its state, its inventory's ``observedAt`` (POSIX seconds; +inf: none) and its
    equivalence key per resource, current as of the source's change log ``generation``. A request
    for any window of nodes reads them with builtins (kube-scheduler sends a different sample of
    the nodes for each pod); a watch event drops only the changed node's entries."""

    generation: int
    states: dict[str, NodeState] = field(default_factory=dict)
    observed: dict[str, float] = field(default_factory=dict)
    keys: dict[str | None, dict[str, int]] = field(default_factory=dict)
    oldest_bound: float = math.inf  # no newer than any indexed node's observedAt (dropped ones included)

    def drop(self, names: set[str]) -> None:
        for name in names:
            self.states.pop(name, None)
            self.observed.pop(name, None)
            for keys in self.keys.values():
                keys.pop(name, None)


@dataclass
class _NodeListMemo:
    """The last ``NodeNames`` list and its classes (kube-scheduler sends the same list, or the
    same list rotated, pod after pod when it samples every node); forgotten when one of its nodes
    changes."""

    names: list[str]
    index: dict[str, int]
    groups: dict[tuple[str | None, int], NodeGroups] = field(default_factory=dict)  # (resource, rotation)
    states: dict[int, list[NodeState]] = field(default_factory=dict)  # rotation -> states in list order

    def keep(self, shift: int, states: list[NodeState]) -> None:
        """Remember ``states`` for rotation ``shift``; at most ``MAX_ROTATIONS`` rotations."""
        if shift not in self.states and len(self.states) >= MAX_ROTATIONS:
            self.states.clear()
            self.groups.clear()
        self.states[shift] = states


def _rotation(memo: _NodeListMemo, names: list[str]) -> int | None:
    """``i`` when ``names`` is the remembered list rotated left by ``i``, else None."""
    if len(names) != len(memo.names):
        return None
    if not names:
        return 0
    i = memo.index.get(names[0])
    if i is None:
        return None
    if i == 0:
        return 0 if memo.names == names else None
    return i if memo.names[i:] + memo.names[:i] == names else None


class ExtenderService:
    """The verbs, without HTTP. ``engine`` is swapped whole on a policy reload."""

    def __init__(self, engine: Engine, source: StateSource, metrics: ExtenderMetrics | None = None) -> None:
        # The engine, the job memo and the learned workload: what the simulator decides with too.
        self.decider = Decider(engine)
        self.source = source
        self.metrics = metrics or ExtenderMetrics()
        self._node_index: _NodeIndex | None = None
        self._last_filter_at = -float("inf")  # monotonic seconds of the last /filter call (``serving``)
        self._node_list: _NodeListMemo | None = None
        self._node_list_lock = threading.Lock()
        self._answers: BoundedMemo[bytes] = BoundedMemo(MAX_ANSWERS, MAX_ANSWER_BYTES)
        self._answers_lock = threading.Lock()
        self._quoted: dict[str, bytes] = {}  # node name -> the name as a JSON string
        self._quoted_bytes = 0
        # NodeGroups.serial -> per class, its nodes' names as JSON strings (``_encoded_members``)
        self._quoted_members: BoundedMemo[list[list[bytes]]] = BoundedMemo(MAX_QUOTED_GROUPS, MAX_QUOTED_GROUP_BYTES)
        # The target workload for the fragmentation score (the decider's): learned from the pods
        # /filter sees (static mode), or from the API server's waiting GPU pods (cluster mode,
        # ``observe_pod``), where a request, which anyone reaching the port can send, must not move it.
        self.learn_from_requests = True
        # Pods /filter passed no node for, requeued when a change lets one pass (cluster mode).
        self.requeue: Requeuer | None = None
        # --filter-returns-best: /filter also scores and passes only the best-scored node, so
        # kube-scheduler needs no prioritize call (one round trip per pod).
        self.filter_returns_best = False
        # Reservations (cluster.reservations), where the source keeps them: cluster mode.
        self._reserve_in = getattr(source, "reserve", None)
        self._filter_lock = threading.Lock()
        # --dra: the cluster's ResourceSlices and ResourceClaims; pods whose claims gpuplace wrote
        # are decided on them (``_dra_requests``), others as before.
        self.dra: DraFleet | None = None

    @property
    def engine(self) -> GroupedEngine:
        """The engine requests are decided with (the decider's); swapped whole on a policy reload."""
        return self.decider.engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self.decider.engine = engine

    @property
    def workload(self) -> WorkloadTracker:
        """The learned workload's tracker (the decider's)."""
        return self.decider.workload

    @workload.setter
    def workload(self, tracker: WorkloadTracker) -> None:
        self.decider.workload = tracker

    def _learn(self, job: Any, pod: Pod) -> None:
        self.decider.learn(job, pod.uid)

    def observe_pod(self, obj: Any) -> None:
        """Count ``obj`` (a v1.Pod from the API server: the pending-pods watch) in the learned
        workload, once per uid; for cluster mode, where requests do not count
        (``learn_from_requests`` False). Never raises: a pod the policy cannot resolve counts as
        nothing (``demand_shape`` None)."""
        try:
            pod = as_pod(obj)
            self._learn(self._job(self.engine, pod), pod)
        except Exception:  # noqa: BLE001 - the watch thread must go on whatever one pod holds
            log.exception("learning the workload from a pod failed")

    def observe_nomination(self, uid: str, node: str | None, obj: Any) -> None:
        """Hold pending pod ``uid`` (``obj``, a v1.Pod) on ``node`` (its
        ``extender.gpuplace.io/nominated-node``; None: none), for the room preemption makes for it
        (``ClusterCache.nominate``). Never raises (the watch thread calls it)."""
        nominate = getattr(self.source, "nominate", None)
        if nominate is None:
            return
        try:
            if node is None:
                nominate(uid, None)
                return
            pod = as_pod(obj)
            nominate(uid, node, pod, self._job(self.engine, pod))
        except Exception:  # noqa: BLE001 - the watch thread must go on whatever one pod holds
            log.exception("holding a nominated pod failed")

    def workload_profile(self) -> WorkloadProfile:
        """The learned target workload's current snapshot (immutable; empty until enough pods were seen)."""
        return self.decider.workload_profile()

    def _decide_grouped(self, args: ExtenderArgs) -> tuple[Job, list[str], GroupedResults]:
        """Job and filter verdicts for a request; ``filter_node`` runs once per equivalence class of nodes."""
        engine = self.engine  # one policy for the whole request
        names = args.node_names()
        job = self._job(engine, args.Pod)
        if args.Nodes is None:
            states, groups = self._named_states(names, job.req.resource)
        else:
            states, groups = self.source.states(names, args.Nodes.items), None
        nomination = getattr(self.source, "nomination", None)
        node = nomination(args.Pod.uid) if nomination is not None and args.Pod.uid else None
        if node is not None and node in names:
            # Preemption holds the pod on that node (cluster.preemption): not against itself.
            states = list(states)
            own = self.source.state_without(node, frozenset({args.Pod.uid}))
            states = [own if n == node and own is not None else st for n, st in zip(names, states)]
            groups = None
        return job, names, engine.filter_grouped(job, states, self.source.now(), groups=groups)

    def _named_states(self, names: list[str], resource: str | None) -> tuple[list[NodeState], NodeGroups | None]:
        """States (and their classes) of ``NodeNames``. Sources with a change log
        (``sources.ChangeLog``) are read only for nodes changed since the last request
        (``_NodeIndex``); the classes of the same list as last time (or that list rotated:
        kube-scheduler starts each search at the next node) are reused until one of its nodes
        changes."""
        source = self.source
        changes_since = getattr(source, "changes_since", None)
        if changes_since is None:
            return source.states(names, None), None
        with self._node_list_lock:
            idx = self._node_index
            changes = changes_since(idx.generation) if idx is not None else None
            if changes is None:
                idx = self._node_index = _NodeIndex(source.generation)  # type: ignore[attr-defined]  # before the states
                self._node_list = None
            else:
                idx.generation, changed = changes
                if changed:
                    idx.drop(changed)
                    if self._node_list is not None and not changed.isdisjoint(self._node_list.index):
                        self._node_list = None
            memo = self._node_list
            shift = _rotation(memo, names) if memo is not None else None
            if memo is None or shift is None:
                index = dict(zip(names, range(len(names))))
                if len(index) != len(names):  # a name twice: not worth remembering
                    states, keys, oldest = self._index_lookup(idx, names, resource)
                    return states, None
                memo = self._node_list = _NodeListMemo(list(names), index)
                shift = 0
            groups = memo.groups.get((resource, shift))
            states = memo.states.get(shift)
            if groups is not None and states is not None:
                return states, groups
            states, keys, oldest = self._index_lookup(idx, names, resource)
            memo.keep(shift, states)
            groups = memo.groups[(resource, shift)] = group_nodes(states, keys, names, oldest)
            return states, groups

    def _index_lookup(self, idx: _NodeIndex, names: list[str], resource: str | None
                      ) -> tuple[list[NodeState], list[int], float | None]:
        """States, class keys for ``resource`` and the oldest ``observedAt`` of ``names``; only
        nodes the index lacks are read from the source (builtins over the lists otherwise).
        Names the source does not know are looked up anew each time and never kept: they are
        whatever a client sends, not the cluster's nodes."""
        known = idx.states
        if not all(map(known.__contains__, names)):
            missing = list(itertools.filterfalse(known.__contains__, names))
            knows = getattr(self.source, "knows", None)
            strangers: dict[str, NodeState] = {}
            for name, st in zip(missing, self.source.states(missing, None)):
                if knows is not None and not knows(name):
                    strangers[name] = st
                    continue
                known[name] = st
                idx.observed[name] = ts = st.view.observed_ts if st.view is not None else math.inf
                idx.oldest_bound = min(idx.oldest_bound, ts)
            if len(missing) - len(strangers) >= GC_FREEZE_NODES:
                # States and keys built for many nodes at once live until those nodes change: out
                # of the collector's way, as cache.bulk_load does for the cache's own objects.
                gc.freeze()
            if strangers:
                return self._lookup_with_strangers(idx, names, resource, strangers)
        states = list(map(known.__getitem__, names))
        keymap = idx.keys.get(resource)
        if keymap is None:
            keymap = idx.keys[resource] = {}
        keys: list[int | None] = list(map(keymap.get, names))
        if None in keys:
            for name, k in zip(names, keys):
                if k is None:
                    keymap[name] = state_key(known[name], resource)
            keys = list(map(keymap.__getitem__, names))
        oldest = idx.oldest_bound
        stale_after = self.engine.policy.inventory.stale_after_seconds
        if oldest < time.time() - stale_after + STALE_MARGIN_SECONDS:
            # Some node seen lately is getting old (an agent that stopped): this list's own oldest,
            # so that only a list holding such a node pays the exact per-node check.
            oldest = min(map(idx.observed.__getitem__, names), default=math.inf)
        return states, keys, (None if oldest == math.inf else oldest)  # type: ignore[return-value]

    def _lookup_with_strangers(self, idx: _NodeIndex, names: list[str], resource: str | None,
                               strangers: dict[str, NodeState]) -> tuple[list[NodeState], list[int], float | None]:
        """``_index_lookup`` for a list holding names the source does not know (``strangers``:
        their states for this request only); per node, without the index's shortcuts."""
        known = idx.states
        keymap = idx.keys.setdefault(resource, {})
        states: list[NodeState] = []
        keys: list[int] = []
        oldest = math.inf
        for name in names:
            st = strangers.get(name)
            if st is None:
                st = known[name]
                key = keymap.get(name)
                if key is None:
                    key = keymap[name] = state_key(st, resource)
                oldest = min(oldest, idx.observed[name])
            else:
                key = state_key(st, resource)
            states.append(st)
            keys.append(key)
        return states, keys, (None if oldest == math.inf else oldest)

    def job_for(self, engine: GroupedEngine, pod: Any) -> Job:
        """The resolved ``pod`` under ``engine`` (remembered as for a filter call)."""
        return self._job(engine, pod)

    def passing_nodes(self, engine: Engine, job: Job, names: list[str]) -> list[str]:
        """Those of ``names`` the filter would pass ``job`` on in the source's current view (no
        metrics, no remembered answers: for ``requeue``'s re-decisions)."""
        grouped = engine.filter_grouped(job, self.source.states(names, None), self.source.now())
        results = grouped.results
        return [n for n, g in zip(names, grouped.group_of) if results[g].passed and not results[g].untouched]

    def _job(self, engine: GroupedEngine, pod: Pod) -> Job:
        """``engine.job`` for ``pod`` through the decider's job memo (``Decider.job``), with its
        namespace's labels from the source; the extender's own requeue mark changes nothing the
        pod asks for, so it is left out of the key: the pod shares the job of its siblings."""
        return self.decider.job(pod, self.namespace_labels_of(pod), engine, _IGNORED_ANNOTATIONS)

    def namespace_labels_of(self, pod: Pod) -> Any:
        """Labels of the pod's namespace from the source (for policy tenants); None: unknown."""
        return self.namespace_labels_of_name(pod.namespace)

    def namespace_labels_of_name(self, namespace: str) -> Any:
        """Labels of ``namespace`` from the source (for policy tenants); None: unknown."""
        lookup = getattr(self.source, "namespace_labels", None)
        return None if lookup is None else lookup(namespace)

    def _answer(self, verb: Hashable, grouped: GroupedResults, build: Callable[[], bytes]) -> bytes:
        """The JSON body ``build()`` gives, remembered under the results' ``answer_key``: the same
        pod spec against the same, unchanged node list gets the same body (kube-scheduler sends
        the whole list for every pod of a burst, and again for every retry of a pending pod)."""
        if grouped.answer_key is None:
            return build()
        key = (verb, grouped.answer_key)
        body = self._answers.get(key)
        if body is None:
            # copied to its own size before it is kept (orjson's result holds at least 4 KiB)
            body = bytes(memoryview(build()))
            self._answers.put(key, body, len(body))
        return body

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """The ``ExtenderFilterResult`` for ``args`` (``filter_response``, decoded)."""
        return orjson.loads(self.filter_response(args))

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        """The ``HostPriorityList`` for ``args`` (``prioritize_response``, decoded)."""
        return orjson.loads(self.prioritize_response(args))

    def filter_response(self, args: ExtenderArgs) -> bytes:
        """``POST /filter``: the ``ExtenderFilterResult`` as JSON bytes. Where the source keeps
        reservations (cluster mode), the nodes the answer sends the pod to hold it before the
        answer leaves (``_reserve``), and filters are decided one at a time, so that the next
        pod's decision sees that reservation."""
        requests = self._dra_requests(args.Pod)
        if requests is not None:
            return self._dra_filter_response(args, requests)
        if self.dra is not None and args.Pod.spec.resource_claims:
            return self._dra_neutral_filter(args)
        if self._reserve_in is None:
            return self._filter_response(args)
        with self._filter_lock:
            self._expire_reservations(args.Pod.uid)
            return self._filter_response(args)

    def serving(self, within_seconds: float = SERVING_SECONDS) -> bool:
        """Whether kube-scheduler called ``/filter`` here within the last ``within_seconds``."""
        return time.monotonic() - self._last_filter_at < within_seconds

    def _filter_response(self, args: ExtenderArgs) -> bytes:
        self._last_filter_at = time.monotonic()
        requeue = self.requeue
        # read before deciding: a change or a reload landing meanwhile counts as after the answer
        generation, serial = (requeue.generation(), self.engine.serial) if requeue is not None else (0, 0)
        job, names, grouped = self._decide_grouped(args)
        results, sizes = grouped.results, grouped.sizes
        passing = sum(n for r, n in zip(results, sizes) if r.passed)
        if self.learn_from_requests:
            self._learn(job, args.Pod)
        m = self.metrics
        if results and all(r.untouched for r in results):
            m.decisions.labels("not_gpu").inc()
        elif job.errors:
            m.decisions.labels("invalid").inc()
        else:
            m.decisions.labels("schedulable" if passing else "unschedulable").inc()
            if job.vram is not None:
                m.vram_estimate.observe(job.vram.bytes_per_gpu)
        rejected: Counter[str] = Counter()
        failed_nodes = {"true": 0, "false": 0}  # resolvable or not
        for r, n in zip(results, sizes):
            for rej in r.rejections:
                rejected[rej.criterion] += n
            if not r.passed and not r.untouched:
                failed_nodes["false" if r.unresolvable else "true"] += n
        for resolvable, count in failed_nodes.items():
            if count:
                m.quality.failed_nodes.labels(resolvable).inc(count)
        for criterion, count in rejected.items():
            m.rejections.labels(criterion).inc(count)
        best_only = self.filter_returns_best and passing > 1 and not job.errors
        if passing == 1 and not job.errors:
            # kube-scheduler skips prioritize when one node is feasible: this is the placement
            only = next(r for r in results if r.passed)
            if not only.untouched:
                self._count_placement(job, only)
                g = next(g for g, r in enumerate(results) if r.passed)
                self._reserve(args.Pod, [n for n, k in zip(names, grouped.group_of) if k == g], job)
        # Two verbs and several nodes: the reservation is made by /prioritize, after scoring, so
        # that neither verb counts the pod against itself (``_reserve_shared``).
        if requeue is not None:
            requeue.observe(job, args.Pod, names, results, passing, generation, serial)
        if not passing and results and not job.errors:
            log.info("pod %s fits no node: %s", for_log(job.req.key),
                     "; ".join(f"{for_log(n)}: {for_log(results[g].reason, 1000)}"
                               for n, g in zip(names[:5], grouped.group_of))
                     + (" ..." if len(names) > 5 else ""))
        if best_only and not all(r.untouched for r in results if r.passed):
            return self._best_only_response(job, args, names, grouped)
        if best_only and self._scores_without_devices(job):
            return self._best_only_without_devices(job, args, names, grouped)
        if grouped.answer_key is not None:  # the classes of a remembered NodeNames list (``_named_states``)
            return self._answer("filter", grouped, lambda: self._filter_names_body(grouped))
        return self._answer("filter", grouped, lambda: dumps(self._filter_body(args, grouped)))

    def _best_only_response(self, job: Job, args: ExtenderArgs, names: list[str], grouped: GroupedResults) -> bytes:
        """``/filter`` with ``--filter-returns-best``: one node passes, of those with the best score
        the one kube-scheduler's default resource scores prefer (``_tie_break``); the others that
        pass are listed as failed, resolvable, with their score and the best, so ``kubectl
        describe pod`` still says why each was left out. The score is the one ``/prioritize``
        gives (``Engine.score_grouped``). One node, not every tied one, so that the pod's
        reservation (``cluster.reservations``) is where kube-scheduler binds it: reserving on
        every tied node until the binding shows would hold GPUs a burst's next pods need, and
        holding none would let them over-commit a shared GPU."""
        workload = self.workload_profile()
        scored = self.decider.score(job, grouped, workload=workload)
        # The score's other components break ties of the 0-10 integer (11 levels kube-scheduler
        # accepts): NodeScore.best_rank; kube-scheduler's own scores choose among what is left.
        # Ranked per scored part (a class of alike nodes), not per node: at 5,000 nodes the
        # per-node ranks and reasons below were half of the request (benchmarks/README.md, issue 26).
        score_of = scored.score_of
        top, best_parts = best_ranked((k, sc.best_rank if sc is not None else None) for k, sc in enumerate(scored.scores))
        in_top = set(best_parts)
        tied = [i for i, k in enumerate(score_of) if k in in_top]
        best = top[0] if top is not None else None
        first_best = _tie_break(job, grouped, tied)
        if first_best is not None:
            self._count_placement(job, scored.results[score_of[first_best]])
            # One node, so that the reservation holds exactly where the pod will be bound.
            self._reserve(args.Pod, [names[first_best]], job)
        chosen = names[first_best] if first_best is not None else None

        def build() -> bytes:
            passing: list[str] = []
            failed: dict[str, str] = {}
            unresolvable: dict[str, str] = {}
            # Per scored part (its nodes are of one class: ``scored.results[k]`` is that class's
            # result): (passes the filter, passes the answer but for ``chosen``, the reason
            # otherwise, unresolvable), the same for every node of the part.
            verdicts = [_best_only_verdict(r, sc, top, best, chosen) for r, sc in zip(scored.results, scored.scores)]
            for name, (passed, passes, reason, unresolvable_reason) in zip(names, map(verdicts.__getitem__, score_of)):
                if passes or (passed and name == chosen):
                    passing.append(name)
                else:
                    (unresolvable if unresolvable_reason else failed)[name] = reason
            return dumps(self._result_body(args, passing, failed, unresolvable))

        return self._answer(("filter-best", workload.version), grouped, build)

    def _reserve(self, pod: Pod, nodes: list[str], job: Job) -> None:
        """Hold ``pod`` on ``nodes`` until the watch shows it bound (``cluster.reservations``), taking
        what ``job`` decided it takes; nothing where the source keeps no reservations (static mode:
        the files are the truth)."""
        if self._reserve_in is not None and nodes:
            self._reserve_in(pod, nodes, job)

    def _expire_reservations(self, retried_uid: str | None = None) -> None:
        expire = getattr(self.source, "expire_reservations", None)
        if expire is not None:
            expire(retried_uid)

    def _scores_without_devices(self, job: Job) -> bool:
        """Whether a pod that asks for no device is scored (``score._score_without_devices``): it
        requests CPU or memory, and the learned workload and the ``fragmentation`` weight are there.
        Such a pod reaches the extender when the chart sends it every pod of its scheduler
        (``scheduler.extender.cpuOnlyPods``)."""
        return scores_without_devices(job, self.engine.policy, self.workload_profile())

    def _node_scores_without_devices(self, job: Job, grouped: GroupedResults) -> list[NodeScore | None]:
        """Per node (input order), the score of a pod without devices, computed on each node's own
        state (``GroupedEngine.score_grouped``); None for a node that failed."""
        scored = self.decider.score(job, grouped)  # node by node for such a pod
        return [scored.scores[i] for i in scored.score_of]

    def _best_only_without_devices(self, job: Job, args: ExtenderArgs, names: list[str],
                                   grouped: GroupedResults) -> bytes:
        """``_best_only_response`` for a pod without devices: the nodes of the best
        ``NodeScore.best_rank`` pass, the other passing nodes fail, resolvable, with both scores."""
        per_node = self._node_scores_without_devices(job, grouped)
        top, passing = best_ranked((name, sc.best_rank if sc is not None else None) for name, sc in zip(names, per_node))
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        best = set(passing)
        reasons: dict[int, str] = {}  # per score object: the nodes of a scored part share theirs
        for name, g, sc in zip(names, grouped.group_of, per_node):
            r = grouped.results[g]
            if name in best:
                continue
            if sc is not None:
                reason = reasons.get(id(sc))
                if reason is None:
                    reason = reasons[id(sc)] = _scored_lower(
                        sc, "another node", top, ": this pod's CPU and memory would leave this node's free GPUs less "
                        "usable (the extender's filter returns its best-scored node only)")
                failed[name] = reason
            elif not r.passed:
                (unresolvable if r.unresolvable else failed)[name] = r.reason
        return dumps(self._result_body(args, passing, failed, unresolvable))

    def _filter_names_body(self, grouped: GroupedResults) -> bytes:
        """``_filter_body`` for ``NodeNames`` of a remembered node list (results with an
        ``answer_key``: their classes are that list's ``NodeGroups``), as JSON bytes, joined per
        class from the names encoded once per list: the first request of a pod spec at 5,000 nodes
        answers with a reason for each of thousands of nodes, and building that dict and encoding
        it was a third of its time. A remembered list has no name twice (``_named_states``), so
        the objects have no key twice."""
        passing: list[bytes] = []
        failed: list[bytes] = []
        unresolvable: list[bytes] = []
        for r, names in zip(grouped.results, self._encoded_members(grouped.groups)):  # type: ignore[arg-type]
            if not names:
                continue
            if r.passed:
                passing.append(b",".join(names))
            else:
                reason = b":" + orjson.dumps(r.reason)
                (unresolvable if r.unresolvable else failed).append((reason + b",").join(names) + reason)
        return b"".join((b'{"FailedNodes":{', b",".join(failed), b'},"FailedAndUnresolvableNodes":{',
                         b",".join(unresolvable), b'},"Error":"","NodeNames":[', b",".join(passing),
                         b'],"Nodes":null}'))

    def _encoded_members(self, groups: NodeGroups) -> list[list[bytes]]:
        """Per class of ``groups``, its nodes' names as JSON strings; built once per node list."""
        encoded = self._quoted_members.get(groups.serial)
        if encoded is not None:
            return encoded
        with self._answers_lock:
            quoted = self._quoted
            if len(quoted) > MAX_QUOTED_NAMES or self._quoted_bytes > MAX_QUOTED_BYTES:
                quoted.clear()
                self._quoted_bytes = 0
            encoded = []
            size = 0
            for names in groups.members:
                if not all(map(quoted.__contains__, names)):
                    for n in names:
                        if n not in quoted:
                            # copied: orjson's result keeps its 4 KiB output buffer (measured with
                            # orjson 3.11: 4,097 bytes held for a 20-byte name)
                            quoted[n] = q = bytes(memoryview(orjson.dumps(n)))
                            self._quoted_bytes += len(q)
                encoded.append(list(map(quoted.__getitem__, names)))
                size += 8 * len(names)  # the list's references; the names are charged to _quoted
        self._quoted_members.put(groups.serial, encoded, size)
        return encoded

    @staticmethod
    def _filter_body(args: ExtenderArgs, grouped: GroupedResults) -> dict[str, Any]:
        # Per class, over its member list (built once per node list): builtins do the per-node work.
        passing: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for r, nodes in zip(grouped.results, grouped.members):
            if r.passed:
                passing.extend(nodes)
            else:
                (unresolvable if r.unresolvable else failed).update(dict.fromkeys(nodes, r.reason))
        return ExtenderService._result_body(args, passing, failed, unresolvable)

    @staticmethod
    def _result_body(args: ExtenderArgs, passing: list[str], failed: dict[str, str],
                     unresolvable: dict[str, str]) -> dict[str, Any]:
        """The ``ExtenderFilterResult``: passing nodes as names or as Node objects, as sent."""
        body: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        if args.NodeNames is not None:
            body["NodeNames"] = passing
            body["Nodes"] = None
        else:
            keep = set(passing)
            items = [n for n in (args.Nodes.items if args.Nodes else []) if node_name(n) in keep]
            body["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "items": items}
            body["NodeNames"] = None
        return body

    def _count_placement(self, job: Any, result: NodeResult) -> None:
        """Count where the pod goes: by the chosen unit's catalog model and the pod's size class."""
        unit = result.chosen[0] if result.chosen else None
        model = unit.entry.id if unit is not None and unit.entry else "unknown"
        self.metrics.placements.labels(model, job.size_class.name).inc()
        if unit is not None:
            self._observe_fit(job, unit.memory_bytes)

    def _observe_fit(self, job: Any, granted_bytes: int) -> None:
        """Estimated versus granted VRAM of the best placement (dashboard: "VRAM estimate vs GPU size")."""
        q = self.metrics.quality
        q.granted_memory.labels(job.size_class.name).observe(granted_bytes)
        if job.vram is not None and granted_bytes > 0:
            q.placed_estimate.labels(job.size_class.name).observe(job.vram.bytes_per_gpu)
            q.vram_fit.labels(job.size_class.name).observe(job.vram.bytes_per_gpu / granted_bytes)

    def prioritize_response(self, args: ExtenderArgs) -> bytes:
        """``POST /prioritize``: the ``HostPriorityList`` as JSON bytes. kube-scheduler calls it
        after ``/filter`` for a pod that passed several nodes; where the source keeps
        reservations, the pod is then held on the passed nodes whose GPUs are shared
        (``_reserve_shared``), decided one at a time with the filters."""
        requests = self._dra_requests(args.Pod)
        if requests is not None:
            return self._dra_prioritize_response(args, requests)
        if self.dra is not None and args.Pod.spec.resource_claims:
            return dumps([{"Host": n, "Score": 0} for n in args.node_names()])
        if self._reserve_in is None:
            return self._prioritize_response(args)[0]
        with self._filter_lock:
            self._expire_reservations()
            body, job, grouped = self._prioritize_response(args)
            self._reserve_shared(args, job, grouped)
            return body

    def preempt_response(self, args: ExtenderPreemptionArgs) -> bytes:
        """``POST /preempt`` (kube-scheduler's ``ProcessPreemption``): per node, the victims
        kube-scheduler's dry run proposed, kept where gpuplace's filter passes the pod without
        them (its own hold, a nomination, left out too); a node where they do not make room is
        left out, so that no pod is deleted for nothing. No victim is added: kube-scheduler
        deletes the verb's victims directly, past PodDisruptionBudgets this extender does not
        read, and a victim its own view lacks fails the whole preemption; gpuplace's controller
        (``cluster.preemption``) makes such room itself, through the Eviction API. Answers
        ``ExtenderPreemptionResult`` (``NodeNameToMetaVictims``, the form kube-scheduler reads
        back whatever it sent). A source that knows no pods (static mode) keeps every proposal."""
        proposed = args.victim_uids()
        pdb = {n: v.NumPDBViolations for n, v in (args.NodeNameToMetaVictims or args.NodeNameToVictims or {}).items()}
        state_without = getattr(self.source, "state_without", None)
        kept: dict[str, list[str]] = {}
        if state_without is None:
            kept = proposed
        else:
            engine = self.engine
            job = self._job(engine, args.Pod)
            now = self.source.now()
            own = frozenset({args.Pod.uid}) if args.Pod.uid else frozenset()
            for node, uids in proposed.items():
                state = state_without(node, frozenset(uids) | own)
                if state is not None and engine.filter_grouped(job, [state], now).results[0].passed:
                    kept[node] = list(uids)
        return dumps({"NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb.get(n, 0)} for n, uids in kept.items()}})

    def _reserve_shared(self, args: ExtenderArgs, job: Job, grouped: GroupedResults) -> None:
        """Two verbs: kube-scheduler's own scores choose among the nodes ``/prioritize`` scores, so
        the pod is held on every one of them that passes and whose GPUs are shared, the one kind
        where kube-scheduler's count (replicas) cannot keep a GPU's VRAM from over-commit; its
        binding frees the others."""
        if job.errors:
            return
        shared = {g for g, (r, st) in enumerate(zip(grouped.results, grouped.states))
                  if r.passed and not r.untouched and st.view is not None and st.view.sharing is not None}
        if shared:
            self._reserve(args.Pod, [n for n, g in zip(grouped.names, grouped.group_of) if g in shared], job)

    def _prioritize_response(self, args: ExtenderArgs) -> tuple[bytes, Job, GroupedResults]:
        """The ``HostPriorityList`` body, with the job and verdicts it was decided from."""
        job, names, grouped = self._decide_grouped(args)
        if self._scores_without_devices(job):
            per_node = self._node_scores_without_devices(job, grouped)
            body = dumps([{"Host": n, "Score": sc.score if sc is not None else 0} for n, sc in zip(names, per_node)])
            return body, job, grouped
        workload = self.workload_profile()
        scored = self.decider.score(job, grouped, workload=workload)
        scores = scored.scores
        best = max((s for s in scores if s is not None), key=lambda s: (s.score, -s.cost_per_hour), default=None)
        if best is not None and best.score > 0:
            self._count_placement(job, scored.results[scores.index(best)])
        by_class = [s.score if s is not None else 0 for s in scores]
        # The learned workload moves the fragmentation component: its version is part of the key.
        body = self._answer(("prioritize", workload.version), grouped,
                            lambda: dumps([{"Host": n, "Score": by_class[g]} for n, g in zip(names, scored.score_of)]))
        return body, job, grouped


    # ---- pods whose GPUs come from ResourceClaims (Dynamic Resource Allocation) ------------------

    def _dra_requests(self, pod: Pod) -> list[tuple[int, tuple[Alternative, ...]]] | None:
        """The GPU requests of the pod's claims that gpuplace wrote (``core.dra_claims``), each
        (count, alternatives); None when the pod has none (it is decided as any other pod)."""
        if self.dra is None or not pod.spec.resource_claims:
            return None
        out: list[tuple[int, tuple[Alternative, ...]]] = []
        for name in pod.claim_names():
            claim = self.dra.claim(pod.namespace, name)
            if claim is not None and (claim.get("status") or {}).get("allocation"):
                continue  # allocated already (a retry, a shared claim): its devices and node are decided
            written = alternatives_of(claim) if claim is not None else None
            if written:
                out.extend(written_requests(claim.get("spec") or {}, written))  # type: ignore[union-attr]  # found
        return out or None

    def _dra_decide(self, args: ExtenderArgs, requests: list[tuple[int, tuple[Alternative, ...]]]
                    ) -> tuple[list[str], Decision]:
        """The plain path for a pod with claims: each node's state from its ResourceSlices, the
        devices DRA's allocator would give there, scored (``core.dra_claims.decide_with_claims``)."""
        assert self.dra is not None
        names = args.node_names()
        return names, decide_with_claims(self.engine, args.Pod, self.dra.states(names), requests,
                                         self.namespace_labels_of(args.Pod), self.workload_profile())

    def _dra_neutral_filter(self, args: ExtenderArgs) -> bytes:
        """A pod with claims gpuplace did not write (``gpuplace.io/claims: leave``, no ``gpuplace.io/``
        annotation, a claim by name, an allocated one): every node kube-scheduler's DRA plugin
        passed passes, and ``/prioritize`` scores 0; DRA's allocator decides. Never decided as a
        pod without devices, whose score would keep it off nodes with free GPUs."""
        self._last_filter_at = time.monotonic()
        self.metrics.decisions.labels("not_gpu").inc()
        return dumps(self._result_body(args, args.node_names(), {}, {}))

    def _dra_filter_response(self, args: ExtenderArgs, requests: list[tuple[int, tuple[Alternative, ...]]]) -> bytes:
        self._last_filter_at = time.monotonic()
        assert self.dra is not None
        if not self.dra.synced:
            why = ("gpuplace has not read the cluster's ResourceSlices and ResourceClaims yet (its watch is starting "
                   "or failing: see the extender's log)")
            self.metrics.decisions.labels("unschedulable").inc()
            return dumps(self._result_body(args, [], dict.fromkeys(args.node_names(), why), {}))
        names, decision = self._dra_decide(args, requests)
        results = decision.results
        passing = [n for n, r in zip(names, results) if r.passed]
        self.metrics.decisions.labels("schedulable" if passing else "unschedulable").inc()
        for r in results:
            for rej in r.rejections:
                self.metrics.rejections.labels(rej.criterion).inc()
        failed = {n: r.reason for n, r in zip(names, results) if not r.passed and not r.unresolvable}
        unresolvable = {n: r.reason for n, r in zip(names, results) if not r.passed and r.unresolvable}
        scores = decision.scores
        if self.filter_returns_best and len(passing) > 1 and all(n in scores for n in passing):
            # One round trip: only the best-scored nodes pass, every one tied at the best (the
            # allocator's assumed claims keep a burst's pods off one device, so no reservation
            # needs a single node here); kube-scheduler's own scores choose among them.
            top = max(scores[n].best_rank for n in passing)
            best = next(n for n in passing if scores[n].best_rank == top)
            for n in passing:
                sc = scores[n]
                if sc.best_rank != top:
                    failed[n] = _scored_lower(sc, f"node {best}", top,
                                              " (the extender's filter returns its best-scored nodes only)")
            passing = [n for n in passing if scores[n].best_rank == top]
        return dumps(self._result_body(args, passing, failed, unresolvable))

    def _dra_prioritize_response(self, args: ExtenderArgs, requests: list[tuple[int, tuple[Alternative, ...]]]) -> bytes:
        """Scores of the nodes by the devices the allocator would give there (``_dra_decide``)."""
        names, decision = self._dra_decide(args, requests)
        scores = decision.scores
        return dumps([{"Host": n, "Score": scores[n].score if n in scores else 0} for n in names])


def _scored_lower(sc: NodeScore, than: str, top: tuple[int, float], why: str) -> str:
    """The reason a node that passes is left out of a one-trip answer: its score ``sc`` against
    the best, ``top`` (``NodeScore.best_rank``) of ``than`` (another node, or the one named)."""
    return f"passes, but gpuplace scores it {sc.score} of 10 ({sc.tie_value:.3f}) and {than} {top[0]} ({top[1]:.3f}){why}"


def _best_only_verdict(r: NodeResult, sc: NodeScore | None, top: tuple[int, float] | None, best: int | None,
                       chosen: str | None) -> tuple[bool, bool, str, bool]:
    """What ``_best_only_response`` answers for a node of filter result ``r`` and score ``sc``:
    (``r`` passed, the node passes the answer whatever its name, the reason it fails otherwise,
    that reason is unresolvable). A node that passed with a score passes only as ``chosen``."""
    if r.passed and sc is None:
        return True, True, "", False
    if r.passed and sc.best_rank == top:  # type: ignore[union-attr]  # passed: scored
        return True, False, (f"passes, and gpuplace scores it {sc.score} of 10 ({sc.tie_value:.3f}) and another "  # type: ignore[union-attr]
                             f"node {best} ({top[1]:.3f}) alike; {chosen} is passed alone, so that the extender "  # type: ignore[index]
                             "can hold the pod's GPUs there until kube-scheduler binds it"), False
    if r.passed:
        return True, False, _scored_lower(sc, "another node", top,  # type: ignore[arg-type]  # passed: scored
                                          " (the extender's filter returns its best-scored node only)"), False
    return False, False, r.reason, r.unresolvable


def _tie_break(job: Job, grouped: GroupedResults, tied: list[int]) -> int | None:
    """Of the input positions ``tied`` (nodes with gpuplace's best score), the one kube-scheduler's
    default profile would score highest for the pod's CPU and memory (``core.kube_scores``), the
    first in the request's order among equals (kube-scheduler rotates the order pod by pod)."""
    if len(tied) < 2:
        return tied[0] if tied else None
    states = grouped.node_states
    if not states:
        return tied[0]
    req = job.req
    # By the node's free and allocatable CPU and memory, all the score reads of it: the tied nodes
    # of a large cluster are mostly untouched ones, alike in those four numbers.
    by_host: dict[tuple[int | None, ...], int] = {}

    def kube_score(i: int) -> int:
        st = states[i]
        host = (st.cpu_milli_free, st.memory_bytes_free, st.cpu_milli_allocatable, st.memory_bytes_allocatable)
        score = by_host.get(host)
        if score is None:
            score = by_host[host] = default_profile_score(req.cpu_milli, req.memory_bytes, *host)
        return score

    return max(tied, key=lambda i: (kube_score(i), -i))


def explain_pod(service: ExtenderService, pod: Pod) -> dict[str, Any]:
    """``POST /explain``: the decision for ``pod`` over every node the source knows; for a pod
    whose claims gpuplace wrote, over the nodes with ResourceSlices, as ``/filter`` decides it."""
    engine = service.engine
    requests = service._dra_requests(pod)
    if requests is not None and service.dra is not None:
        names = service.dra.node_names()
        decision = decide_with_claims(engine, pod, service.dra.states(names), requests,
                                      service.namespace_labels_of(pod), service.workload_profile())
        return {**explain_decision(decision, engine.policy), "inventory": "ResourceSlices"}
    names = service.source.node_names()
    decision = engine.decide(pod, service.source.states(names, None), service.source.now(),
                             service.namespace_labels_of(pod), workload=service.workload_profile())
    return explain_decision(decision, engine.policy)
