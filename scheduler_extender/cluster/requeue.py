"""Pods the extender turned away, sent back to kube-scheduler's queue when its view turns in their favour.

kube-scheduler keeps a pod that an extender rejected in its unschedulable pool and retries it on
the next cluster event it sees itself (any Node, Pod, ... event: the pod's rejector is the
pseudo-plugin ``Extender``, whose queueing hint accepts every event; kubernetes#122019, fixed by
#122022), or at the latest after ``podMaxInUnschedulablePodsDuration`` (5 min upstream, 60 s in
the chart). Two cases leave a pod waiting for that flush although the extender would now place it:

* **The race.** kube-scheduler and the extender watch the same Node or Pod. When kube-scheduler's
  informer delivers a change first, it retries the pod at once and the extender answers from its
  older view; once the extender's view catches up, no event is left to retry on. Seen on the real
  control plane: a Node's allocatable raised to agree with its inventory, with the pod's backoff
  already over (``tests/e2e/test_inventory_trust.py``).
* **Changes kube-scheduler never sees:** a policy reload (file or ConfigMap).

So the extender remembers the pods for which it passed no node (:class:`Requeuer`), re-decides
each one on the nodes that changed since its answer (the cache's change log), or on every node
after a policy reload, and when a node now passes, patches the pod's :data:`REQUEUE_ANNOTATION`.
An update of an unschedulable pod is an event for that pod (``PriorityQueue.Update`` in
kubernetes pkg/scheduler/backend/queue/scheduling_queue.go), which the Extender hint accepts.

Bounded: at most :data:`MAX_PODS` pods are remembered, each for at most :data:`MAX_AGE_SECONDS`
(kube-scheduler retries by then anyway). A pod is requeued at most once per rejection, and after a
requeue not again for a backoff that doubles from 1 s to :data:`MAX_BACKOFF_SECONDS`. A node that
the extender passes but kube-scheduler's own plugins refuse (a taint) requeues a pod once: when
kube-scheduler then leaves it out of the pod's request, changes there no longer count for that
pod (``_History``).

Only :func:`pod_patcher` talks to the API server; the rest is bookkeeping, testable without one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Container, Protocol, Sequence

from scheduler_extender.core.engine import Engine
from scheduler_extender.core.filter import NodeResult
from scheduler_extender.core.job import Job
from scheduler_extender.core.pod import Pod
from scheduler_extender.served.grouped import decision_job


class RequeueService(Protocol):
    """What the requeue reads of the service that answers the verbs (``service.server
    .ExtenderService`` implements it): the state source with its change log, the engine in force,
    and the same resolved pods and filter the verbs use. The cluster side never imports the
    service, not even for type checking."""

    source: Any
    engine: Any

    def job_for(self, engine: Engine, pod: Any) -> Job: ...

    def passing_nodes(self, engine: Engine, job: Job, names: list[str]) -> list[str]: ...


class _Gauge(Protocol):
    def set(self, value: float) -> None: ...


class _Counter(Protocol):
    def labels(self, *values: str) -> Any: ...


class RequeueMetricsLike(Protocol):
    """The metrics the requeue records (``service.metrics.RequeueMetrics`` implements it)."""

    remembered: _Gauge
    requeued: _Counter

log = logging.getLogger(__name__)

REQUEUE_ANNOTATION = "extender.gpuplace.io/requeued-at"
"""Written by the extender on a pending pod it now has a node for (RFC 3339 UTC time). Outside the
``gpuplace.io/`` requests a user writes, so it never changes what the pod asks for."""

MAX_PODS = 10_000
MAX_LISTS = 64
"""Distinct node lists of requests the remembered rejections share (``Rejection.names``)."""
MAX_AGE_SECONDS = 300.0
"""kube-scheduler's upstream ``podMaxInUnschedulablePodsDuration``: a pod waiting longer is retried
by kube-scheduler itself, and rejected again (and remembered again) if it still fits nowhere."""
MAX_BACKOFF_SECONDS = 60.0
CHECK_INTERVAL_SECONDS = 0.5
"""How often remembered pods are re-decided: the delay between the extender's view changing and
the pod's requeue."""
PENDING_GRACE_SECONDS = 10.0
"""A pod the pending-pods watch does not list is taken for gone (bound or deleted) only this long
after its rejection: that watch, too, may deliver a new pod after kube-scheduler has sent it."""

RESULTS = ("requeued", "gone", "forbidden", "error")
"""Outcomes of a requeue patch (the ``result`` label of ``gpuplace_extender_requeued_pods_total``)."""


@dataclass
class Rejection:
    """A pod for which the extender's last filter answer passed no node."""

    uid: str
    namespace: str
    name: str
    pod: Pod  # what resolving it reads: re-resolved after a policy reload
    generation: int  # the source's change-log generation the answer was decided at (or later)
    engine_serial: int  # the policy (``Engine.serial``) it was decided under
    at: float  # monotonic seconds of the answer
    excluded: frozenset[str] = frozenset()  # nodes kube-scheduler left out of the request (``_History``)
    names: tuple[str, ...] | None = None  # the nodes of the request (its own filters passed them), shared


@dataclass
class _History:
    """A pod's requeues, across its rejections.

    ``triggers``: the nodes that passed at the last requeue. If kube-scheduler then leaves one out
    of the pod's next request (its own plugins refuse it: a taint, a nodeSelector, CPU), the node
    is ``excluded``: a change there does not requeue the pod again, until kube-scheduler sends the
    node again. Without this, such a node would requeue the pod at every agent report, forever.
    """

    requeues: int = 0
    not_before: float = 0.0
    triggers: frozenset[str] = frozenset()
    excluded: frozenset[str] = frozenset()


class Requeuer:
    """Remembers rejected pods (``observe``, from ``/filter``) and finds the ones to requeue (``due``).

    ``service``: the ``ExtenderService`` whose source has a change log (``generation``,
    ``latest_changes_since`` and ``node_names``, as ``ClusterSource``). ``patch(namespace, name,
    uid)`` returns one of :data:`RESULTS`. ``pending(uid)``: whether the pod still waits for a node
    (None: not known yet); a pod that does not wait is not requeued, and forgotten after
    :data:`PENDING_GRACE_SECONDS`.
    """

    def __init__(self, service: RequeueService, patch: Callable[[str, str, str], str],
                 pending: Callable[[str], bool | None] | None = None, metrics: RequeueMetricsLike | None = None, *,
                 clock: Callable[[], float] = time.monotonic, max_pods: int = MAX_PODS,
                 max_age_seconds: float = MAX_AGE_SECONDS) -> None:
        self._service, self._patch, self._pending, self._metrics = service, patch, pending, metrics
        self._clock, self._max_pods, self._max_age = clock, max_pods, max_age_seconds
        self._lock = threading.Lock()  # observe/due run on the event loop, requeue in a worker thread
        self._pods: OrderedDict[str, Rejection] = OrderedDict()
        self._history: OrderedDict[str, _History] = OrderedDict()
        self._lists: dict[tuple[str, ...], tuple[str, ...]] = {}  # node lists the rejections share

    def generation(self) -> int:
        """The source's change-log generation now; read before deciding, so a change that lands
        during the decision counts as after it."""
        return int(self._service.source.generation)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self._pods)

    def _interned(self, names: Sequence[str]) -> tuple[str, ...]:
        """``names`` as a tuple shared with the rejections of the same list (kube-scheduler sends one
        list for a burst's pods): remembered pods keep one copy of it, not one each."""
        key = tuple(names)
        got = self._lists.get(key)
        if got is None:
            if len(self._lists) >= MAX_LISTS:
                self._lists.clear()
            got = self._lists[key] = key
        return got

    def rejected(self) -> list[Rejection]:
        """The pods remembered now (their last answer passed no node), oldest answer first."""
        with self._lock:
            return list(self._pods.values())

    def observe(self, job: Job, pod: Pod, names: Sequence[str], results: list[NodeResult], passing: int,
                generation: int, engine_serial: int) -> None:
        """Note one filter answer for ``names``, decided at ``generation`` under the policy of
        ``engine_serial`` (both read before deciding): remember the pod if no node passed for
        reasons a change of the extender's view could lift; forget it otherwise (a node passed, it
        asks for no GPU, or its annotations are invalid: only an edit of the pod fixes those, and
        that is an event)."""
        uid = pod.uid
        if not uid:
            return
        forget = bool(passing or job.errors or not results or all(r.untouched for r in results))
        with self._lock:
            if forget:
                self._pods.pop(uid, None)
            else:
                h = self._history.get(uid)
                excluded: frozenset[str] = frozenset()
                if h is not None and (h.triggers or h.excluded):
                    suspects = h.triggers | h.excluded
                    sent: Container[str] = set(names) if len(suspects) > 8 else names
                    excluded = h.excluded = frozenset(n for n in suspects if n not in sent)
                    h.triggers = frozenset()
                self._pods[uid] = Rejection(uid, pod.namespace, pod.name, pod, generation, engine_serial, self._clock(),
                                            excluded, self._interned(names))
                self._pods.move_to_end(uid)
                while len(self._pods) > self._max_pods:
                    self._pods.popitem(last=False)
        if self._metrics is not None:
            self._metrics.remembered.set(len(self._pods))

    def due(self) -> list[Rejection]:
        """The remembered pods a node (not excluded) now passes for, each removed from memory; the
        others are marked as decided at the current view. Pods of one spec (a controller's
        replicas) are decided together: once, on every node that changed since the oldest of their
        answers; each pod then counts only the nodes that changed after its own answer. A pod whose
        check raises is logged and kept (checked again at the next change). Reads only the
        service's view."""
        service = self._service
        now = self._clock()
        expire = getattr(service.source, "expire_reservations", None)
        if expire is not None:
            expire()  # an expired reservation is a change like any other: pods it kept out are re-decided
        generation = self.generation()
        engine = service.engine
        groups: dict[tuple[int, bool], tuple[Job, list[Rejection]]] = {}  # (id(decision job), everything)
        with self._lock:
            rejections = list(self._pods.values())
        for r in rejections:
            age = now - r.at
            waiting = self._pending(r.uid) if self._pending is not None else None
            if age > self._max_age or (waiting is False and age > PENDING_GRACE_SECONDS):
                self._forget(r.uid, history_too=True)
                continue
            if waiting is False or (r.generation == generation and r.engine_serial == engine.serial):
                continue
            with self._lock:
                h = self._history.get(r.uid)
            if h is not None and now < h.not_before:
                continue  # keep its generation: the changes add up until the backoff is over
            try:
                job = decision_job(service.job_for(engine, r.pod))
            except Exception:  # noqa: BLE001 - one pod's check must not stop the others'
                log.exception("requeue check of pod %s/%s failed", r.namespace, r.name)
                r.generation, r.engine_serial = generation, engine.serial  # not again before the next change
                continue
            # a reload, or a failed patch (generation -1): every node counts as changed for the pod
            everything = r.engine_serial != engine.serial or r.generation < 0
            groups.setdefault((id(job), everything), (job, []))[1].append(r)
        all_names: list[str] | None = None
        out: list[Rejection] = []
        for (_, everything), (job, group) in groups.items():
            # changed node -> generation of its latest change; None: every node counts as changed
            latest = None if everything else service.source.latest_changes_since(  # type: ignore[attr-defined]
                min(r.generation for r in group))
            if latest is None:
                if all_names is None:
                    all_names = sorted(service.source.node_names())
                names = all_names
            else:
                names = sorted(latest)
            since = [r.generation for r in group]
            for r in group:
                r.generation, r.engine_serial = generation, engine.serial  # a check that raises is not repeated
            try:
                passing = service.passing_nodes(engine, job, names) if names else []
            except Exception:  # noqa: BLE001 - one spec's check must not stop the others'
                log.exception("requeue check of pod %s/%s (and %d more of its spec) failed",
                              group[0].namespace, group[0].name, len(group) - 1)
                continue
            for r, decided_at in zip(group, since):
                # the nodes that pass and changed after this pod's answer (all after a reload)
                triggers = frozenset(n for n in passing if n not in r.excluded
                                     and (latest is None or latest[n] > decided_at))
                if triggers:
                    self._requeued(r, triggers, now)
                    out.append(r)
        if self._metrics is not None:
            self._metrics.remembered.set(len(self._pods))
        return out

    def _requeued(self, r: Rejection, triggers: frozenset[str], now: float) -> None:
        """Forget ``r`` (it is being requeued) and start its backoff."""
        with self._lock:
            self._pods.pop(r.uid, None)
            h = self._history.setdefault(r.uid, _History())
            self._history.move_to_end(r.uid)
            h.not_before = now + min(MAX_BACKOFF_SECONDS, 2.0 ** h.requeues)
            h.requeues += 1
            h.triggers = triggers
            while len(self._history) > self._max_pods:
                self._history.popitem(last=False)

    def _forget(self, uid: str, history_too: bool = False) -> None:
        with self._lock:
            self._pods.pop(uid, None)
            if history_too:
                self._history.pop(uid, None)

    def requeue(self, r: Rejection) -> str:
        """Patch one pod (blocking: run it in a thread); counts and logs the result. After an
        ``error`` (API server unreachable, say) the pod is remembered again, to be retried after
        its backoff, unless a newer answer replaced it meanwhile."""
        try:
            result = self._patch(r.namespace, r.name, r.uid)
        except Exception as e:  # noqa: BLE001 - one failed patch must not stop the loop
            log.warning("requeue of pod %s/%s failed: %s: %s", r.namespace, r.name, type(e).__name__, e)
            result = "error"
        if result == "requeued":
            log.info("pod %s/%s requeued: a node it was refused now passes", r.namespace, r.name)
        elif result == "forbidden":
            log.warning("pod %s/%s not requeued: the API server refused the patch of %s (the extender needs "
                        "patch on pods; see --requeue-rejected-pods)", r.namespace, r.name, REQUEUE_ANNOTATION)
        elif result == "error":
            with self._lock:
                if r.uid not in self._pods:
                    r.generation = -1  # decide again on every node
                    self._pods[r.uid] = r
        if self._metrics is not None:
            self._metrics.requeued.labels(result).inc()
        return result

    async def run(self, interval_seconds: float = CHECK_INTERVAL_SECONDS) -> None:
        """Forever: every ``interval_seconds``, requeue the pods that are due. Runs on the server's
        event loop, as the filter calls do, so a check never interleaves with a decision."""
        while True:
            await asyncio.sleep(interval_seconds)
            try:
                due = self.due()
            except Exception:  # noqa: BLE001 - keep checking; the filter path is unaffected
                log.exception("requeue check failed")
                continue
            for r in due:
                await asyncio.to_thread(self.requeue, r)


def requeue_patch(now: dt.datetime, uid: str) -> dict[str, Any]:
    """The patch body: the annotation, and the pod's uid as a precondition (a pod recreated under
    the same name is not touched: the API server refuses a changed uid)."""
    stamp = now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"metadata": {"uid": uid, "annotations": {REQUEUE_ANNOTATION: stamp}}}


def patch_failure(status: int | None) -> str:
    """What a failed patch of a pod with a uid precondition means, by its HTTP status: ``gone``
    for a pod deleted or recreated (404, 409 conflict with the uid, 422), ``forbidden`` for 403
    (RBAC, or the chart's admission policy), else ``error``. The requeue patch and the preemption
    controller's nomination patch read it alike."""
    if status in (404, 409, 422):
        return "gone"
    return "forbidden" if status == 403 else "error"


def pod_patcher(api_client: Any) -> Callable[[str, str, str], str]:
    """``patch(namespace, name, uid)`` through the Kubernetes API (a JSON merge patch of
    :func:`requeue_patch`); returns one of :data:`RESULTS`: ``requeued``, or ``patch_failure``'s
    reading of the API's answer."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api_client)

    def patch(namespace: str, name: str, uid: str) -> str:
        body = requeue_patch(dt.datetime.now(dt.timezone.utc), uid)
        try:
            core.patch_namespaced_pod(name, namespace, body, _content_type="application/merge-patch+json",
                                      _request_timeout=10)
        except ApiException as e:
            outcome = patch_failure(e.status)
            if outcome == "error":
                log.warning("requeue patch of pod %s/%s: HTTP %s: %s", namespace, name, e.status, str(e.body)[:300])
            return outcome
        return "requeued"

    return patch
