"""Preemption for GPUs, as a controller: room for a pending pod that only evictions can make.

kube-scheduler's preemption counts resources, so it never helps a pod that gpuplace refuses for
want of the right free GPUs (``core.preemption`` explains why). With ``--preemption``, the replica
that holds the Lease (``--preemption-lease``; ``LeaderGate``) checks, every
``CHECK_INTERVAL_SECONDS``, the pods the extender refused on every node (``requeue.Requeuer``
remembers them), highest priority first. For each, on every node where the filter failed only for
reasons evictions can fix (``core.preemption.resolvable_only``), it chooses victims
(``core.preemption.choose_victims``) among the pods bound there that hold devices, are of lower
priority, are not being deleted already, and whose eviction no PodDisruptionBudget forbids now
(``disruptionsAllowed`` 0 for a budget selecting them); then the node with the fewest victims
(``best_preemption``). It then:

1. annotates the pod with ``extender.gpuplace.io/nominated-node`` (``NOMINATED_ANNOTATION``):
   every replica's pending-pods watch reads it and holds the pod on that node
   (``ClusterCache.nominate``), so the room being made goes to no other pod;
2. evicts the victims through the Eviction API, which refuses what a budget forbids (a plain
   delete is never used);
3. records a Normal Event ``Preempting`` on the pod naming the node and the victims.

Where no eviction can help, nothing is evicted and a Warning Event ``PreemptionNotHelpful`` says
why, once per pod and reason. A nomination whose pod is not bound within ``NOMINATION_SECONDS``
(an eviction refused, a victim that does not go) is withdrawn and the pod is checked again.

The decisions are ``core.preemption``'s, on the cache's view; only ``KubePreemptionApi`` talks to
the API server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from scheduler_extender.cluster.pending import NOMINATED_ANNOTATION
from scheduler_extender.cluster.requeue import patch_failure
from scheduler_extender.core.pod import Pod
from scheduler_extender.core.preemption import (NO_LOWER, Candidate, NodePreemption, NoPreemption, best_preemption,
                                                choose_victims, resolvable_only)

log = logging.getLogger(__name__)


CHECK_INTERVAL_SECONDS = 1.0
NOMINATION_SECONDS = 120.0
"""How long a nomination waits for its pod to be bound: victims get their termination grace
period (30 s by default) to go, and kube-scheduler retries the pod after they have."""

RECHECK_SECONDS = 10.0
"""A pod no eviction could help is checked again after this (the cluster may have changed)."""

REQUEUE_SECONDS = 3.0
"""A nominated pod whose node has room is sent back to kube-scheduler's queue at most this often."""

ANY_NODE = "*"
"""The node of a ``NoPreemption`` that stands for every node (none fails for a resolvable reason)."""

MAX_PODS_PER_CHECK = 16
"""Pods one pass searches victims for (highest priority first; the rest at the next pass)."""

MAX_NODES_SEARCHED = 64
"""Nodes one pod's victim search examines per check (each a bounded search, ``MAX_FILTER_CHECKS``)."""

EVENT_MESSAGE_LIMIT = 1024

RESULTS = ("evicted", "gone", "refused", "forbidden", "error")
"""Outcomes of an eviction (``refused``: 429, a PodDisruptionBudget forbids it now)."""


class PreemptionApi(Protocol):
    """What the controller asks of the API server (``KubePreemptionApi``; a fake in tests)."""

    def budgets(self) -> list[Mapping[str, Any]]: ...  # policy/v1 PodDisruptionBudgets, as dicts

    def nominate(self, namespace: str, name: str, uid: str, node: str | None) -> str: ...

    def evict(self, namespace: str, name: str, uid: str) -> str: ...

    def event(self, namespace: str, name: str, uid: str, etype: str, reason: str, message: str) -> None: ...


class PreemptionService(Protocol):
    """What the controller reads of the extender (``service.decisions.ExtenderService``)."""

    engine: Any
    source: Any

    def job_for(self, engine: Any, pod: Any) -> Any: ...


@dataclass
class _Attempt:
    at: float
    node: str | None = None  # nominated node, if any
    reason: str = ""  # the last PreemptionNotHelpful message recorded
    requeued_at: float = -1e9  # when the pod was last sent back to kube-scheduler's queue


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions`` with In, NotIn,
    Exists, DoesNotExist) selects ``labels``. An empty selector selects every pod (a
    PodDisruptionBudget's, policy/v1); None selects none."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or ():
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or ()
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # unknown operator: the budget may select it; never evict on a guess
    return True


def protecting_budget(namespace: str, labels: Mapping[str, str], budgets: Sequence[Mapping[str, Any]]) -> str | None:
    """The name of a PodDisruptionBudget in ``namespace`` that selects a pod of ``labels`` and allows
    no disruption now (``status.disruptionsAllowed`` below 1, or not computed yet); None if none."""
    for b in budgets:
        meta, spec, status = b.get("metadata") or {}, b.get("spec") or {}, b.get("status") or {}
        if meta.get("namespace") != namespace or not selects(spec.get("selector"), labels):
            continue
        if int(status.get("disruptionsAllowed") or 0) < 1:
            return str(meta.get("name"))
    return None


def plan_preemption(engine: Any, cache: Any, pod: Pod, job: Any, budgets: Sequence[Mapping[str, Any]],
                    names: Sequence[str] | None = None, now: dt.datetime | None = None
                    ) -> tuple[NodePreemption | None, list[NoPreemption]]:
    """The node and victims for ``pod`` (resolved as ``job``) on ``cache``'s view, or None with each
    searched node's reason (module docstring). ``names``: the nodes kube-scheduler sent with the
    pod (those its own filters pass: node selectors, affinity, taints, CPU and memory); None: every
    node. The pod's own hold (a nomination) does not count against it. Where it fits on a node
    already, nothing: one ``NoPreemption`` for ``ANY_NODE`` saying where. The preemption
    controller decides with it, and ``gpuplace explain`` says what it would do."""
    names = sorted(n for n in (set(names) if names is not None else cache.node_names()) if cache.has_node(n))
    own = frozenset({pod.uid}) if pod.uid else frozenset()
    held = cache.nomination(pod.uid)  # its own hold, where it has one, does not count against it
    grouped = engine.filter_grouped(job, [cache.state_without(n, own) if n == held else cache.state(n)
                                          for n in names], now)
    fits = next((n for n, g in zip(names, grouped.group_of) if grouped.results[g].passed), None)
    if fits is not None:  # the view changed since the pod was refused: nothing to evict
        return None, [NoPreemption(ANY_NODE, f"fits on {fits} now: nothing to evict")]
    failing = [n for n, g in zip(names, grouped.group_of) if resolvable_only(grouped.results[g])]
    if not failing:
        reasons = {grouped.results[g].reason for g in grouped.group_of if not grouped.results[g].passed}
        return None, [NoPreemption(ANY_NODE, "no node refuses it for a reason evictions can fix: "
                                        + "; ".join(sorted(reasons))[:300])]
    choices: list[NodePreemption | NoPreemption] = []
    for node in failing[:MAX_NODES_SEARCHED]:
        bound = cache.bound_pods(node)
        if any(b.terminating and b.priority < pod.priority for b in bound):
            choices.append(NoPreemption(node, "lower-priority pods are being deleted here already"))
            continue
        candidates = [Candidate(b.uid, b.key, b.priority) for b in bound
                      if not b.terminating and b.priority < pod.priority
                      and protecting_budget(b.key.split("/", 1)[0], b.labels, budgets) is None]

        def without(uids: frozenset[str], node: str = node) -> Any:
            return cache.state_without(node, uids | own)
        choices.append(choose_victims(job, pod.priority, node, candidates, without, engine.policy, now))
    return best_preemption(choices), [c for c in choices if isinstance(c, NoPreemption)]


class Preemptor:
    """The controller's decisions and actions (module docstring); ``check`` runs one pass."""

    def __init__(self, service: PreemptionService, rejected: Callable[[], Sequence[Any]], api: PreemptionApi,
                 metrics: Any = None, clock: Callable[[], float] = time.monotonic,
                 requeue: Callable[[str, str, str], str] | None = None) -> None:
        """``rejected()``: the pods the extender refused on every node (``Requeuer.rejected``: objects
        with ``uid``, ``namespace``, ``name`` and ``pod``). ``requeue(namespace, name, uid)``:
        sends a nominated pod back to kube-scheduler's queue once its node has room
        (``requeue.pod_patcher``): the requeue loop cannot, since the pod's nomination counts
        against it there for every other pod."""
        self._service, self._rejected, self._api, self._metrics, self._clock = service, rejected, api, metrics, clock
        self._requeue = requeue
        self._attempts: dict[str, _Attempt] = {}

    def _room_made(self, r: Any, node: str) -> bool:
        """Whether the filter passes ``r``'s pod on ``node`` now, its own nomination left out."""
        service = self._service
        state = service.source.state_without(node, frozenset({r.uid}))
        if state is None:
            return False
        job = service.job_for(service.engine, r.pod)
        return bool(service.engine.filter_grouped(job, [state], service.source.now()).results[0].passed)

    def plan(self, pod: Pod, job: Any, budgets: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None
             ) -> tuple[NodePreemption | None, list[NoPreemption]]:
        """``plan_preemption`` on the extender's current view."""
        service = self._service
        return plan_preemption(service.engine, service.source.cache, pod, job, budgets, names, service.source.now())

    def check(self) -> list[NodePreemption]:
        """One pass (module docstring): the preemptions started, in order. Blocking (API calls):
        run it off the event loop."""
        now = self._clock()
        pods = sorted(self._rejected(), key=lambda r: -r.pod.priority)
        live = {r.uid for r in pods}
        cache = self._service.source.cache
        for uid in list(self._attempts):  # bound, deleted or no longer refused: forgotten
            if uid not in live and cache.nomination(uid) is None:
                self._attempts.pop(uid)
        started: list[NodePreemption] = []
        budgets: list[Mapping[str, Any]] | None = None
        searched = 0
        for r in pods:
            if r.pod.spec.preemption_policy == "Never":
                continue  # its PriorityClass says it waits rather than have others evicted
            a = self._attempts.get(r.uid)
            if a is not None and a.node is not None:
                if now - a.at < NOMINATION_SECONDS:
                    # Victims still going, or gone: kube-scheduler retries the pod on their deletion
                    # events, and this sends it back if the extender's view caught up later.
                    if self._requeue is not None and now - a.requeued_at >= REQUEUE_SECONDS and self._room_made(r, a.node):
                        a.requeued_at = now
                        self._requeue(r.namespace, r.name, r.uid)
                    continue
                log.info("pod %s/%s not bound on %s within %gs: nomination withdrawn", r.namespace, r.name, a.node,
                         NOMINATION_SECONDS)
                self._api.nominate(r.namespace, r.name, r.uid, None)
                a.node = None
            elif a is not None and now - a.at < RECHECK_SECONDS:
                continue
            if searched >= MAX_PODS_PER_CHECK:
                break  # the rest at the next pass: the leader also answers kube-scheduler
            searched += 1
            try:
                if budgets is None:
                    budgets = self._api.budgets()
            except Exception as e:  # noqa: BLE001 - unknown budgets: nothing is evicted on a guess
                log.warning("preemption pass skipped: cannot list PodDisruptionBudgets: %s", e)
                return started
            try:
                job = self._service.job_for(self._service.engine, r.pod)
                best, refusals = self.plan(r.pod, job, budgets, getattr(r, "names", None))
            except Exception:  # noqa: BLE001 - one pod's search must not stop the others'
                log.exception("preemption check of pod %s/%s failed", r.namespace, r.name)
                continue
            a = self._attempts.setdefault(r.uid, _Attempt(now))
            a.at = now
            if best is None:
                self._count("not_helpful")
                if all(c.reason.startswith(NO_LOWER) or c.node == ANY_NODE for c in refusals):
                    # Nothing of lower priority, or only refusals no eviction fixes (the filter's own
                    # reasons say those): preemption was never a way, and an Event would be noise.
                    continue
                message = "no eviction makes room: " + "; ".join(f"{c.node}: {c.reason}" for c in refusals[:8])
                if len(refusals) > 8:
                    message += f"; ... {len(refusals) - 8} more nodes"
                if message != a.reason:
                    a.reason = message
                    log.info("pod %s/%s: %s", r.namespace, r.name, message)
                    self._api.event(r.namespace, r.name, r.uid, "Warning", "PreemptionNotHelpful", message)
                continue
            try:
                if self._start(r, best, a):
                    started.append(best)
            except Exception:  # noqa: BLE001 - an API hiccup for one pod must not stop the others'
                log.exception("preemption for pod %s/%s failed", r.namespace, r.name)
        return started

    def _start(self, r: Any, best: NodePreemption, a: _Attempt) -> bool:
        """Hold the pod on ``best.node`` and evict the victims, stopping at the first eviction
        refused (a budget that allows no more now): the room can no longer be made, the hold is
        withdrawn and the pod searched again at its next check."""
        if self._api.nominate(r.namespace, r.name, r.uid, best.node) != "nominated":
            return False  # gone, or the patch was refused: nothing evicted
        a.node = best.node
        victims = ", ".join(v.key for v in best.victims)
        message = f"evicting {victims} on {best.node} to make room for this pod"
        log.info("pod %s/%s: %s", r.namespace, r.name, message)
        self._api.event(r.namespace, r.name, r.uid, "Normal", "Preempting", message)
        for v in best.victims:
            ns, name = v.key.split("/", 1)
            result = self._api.evict(ns, name, v.uid)
            if self._metrics is not None:
                self._metrics.evictions.labels(result).inc()
            if result not in ("evicted", "gone"):
                log.warning("eviction of %s for %s/%s: %s; the other victims are left, the hold withdrawn", v.key,
                            r.namespace, r.name, result)
                self._api.nominate(r.namespace, r.name, r.uid, None)
                a.node = None
                return False
        self._count("started")
        return True

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.preemptions.labels(outcome).inc()

    async def run(self, leading: Callable[[], bool], interval_seconds: float = CHECK_INTERVAL_SECONDS) -> None:
        """Forever: every ``interval_seconds``, while ``leading()``, one ``check`` on a worker thread."""
        while True:
            await asyncio.sleep(interval_seconds)
            if not leading():
                continue
            try:
                await asyncio.to_thread(self.check)
            except Exception:  # noqa: BLE001 - keep checking; the filter path is unaffected
                log.exception("preemption check failed")


class LeaderGate:
    """Leader election on a coordination.k8s.io Lease (``kubernetes.leaderelection``): ``leading()``
    is True while this replica holds it. Lease 15 s, renewed every 2 s (kube-scheduler's defaults,
    ``LeaderElectionConfiguration``: 15 s, 10 s, 2 s).

    ``serving()``: whether this replica answers kube-scheduler now (it had a ``/filter`` call
    lately). A replica competes for the Lease, and renews it, only while it serves: the pods to
    preempt for are the ones its own filter refused, and with the chart's ``sessionAffinity:
    ClientIP`` kube-scheduler talks to one replica; a leader that stops serving lets the Lease
    lapse and the serving one takes it."""

    def __init__(self, namespace: str, name: str, identity: str | None = None,
                 serving: Callable[[], bool] | None = None) -> None:
        self.namespace, self.name = namespace, name
        self.identity = identity or f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self._leading = threading.Event()
        self._serving = serving or (lambda: True)

    def leading(self) -> bool:
        return self._leading.is_set()

    def _loop(self) -> None:
        from kubernetes.leaderelection import electionconfig
        from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock
        while True:
            try:
                config = electionconfig.Config(LeaseLock(self.name, self.namespace, self.identity), lease_duration=15,
                                               renew_deadline=10, retry_period=2, onstarted_leading=self._leading.set,
                                               onstopped_leading=self._leading.clear)
                _ServingElection(config, self._serving).run()
            except Exception:  # noqa: BLE001 - an API hiccup: not leading, try again
                log.exception("leader election on lease %s/%s failed", self.namespace, self.name)
            self._leading.clear()
            time.sleep(2)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="preemption-leader", daemon=True).start()


def _serving_election() -> type:
    from kubernetes.leaderelection import leaderelection

    class ServingElection(leaderelection.LeaderElection):
        """``LeaderElection`` that neither takes nor renews the Lease while ``serving()`` is False."""

        def __init__(self, config: Any, serving: Callable[[], bool]) -> None:
            super().__init__(config)
            self._serving = serving

        def try_acquire_or_renew(self) -> bool:
            return bool(self._serving()) and super().try_acquire_or_renew()
    return ServingElection


def _ServingElection(config: Any, serving: Callable[[], bool]) -> Any:  # noqa: N802 - a class, built lazily
    return _serving_election()(config, serving)


class KubePreemptionApi:
    """``PreemptionApi`` through the official client."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client
        self._client = client
        self._core = client.CoreV1Api(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._api_client = api_client

    def budgets(self) -> list[Mapping[str, Any]]:
        try:
            items = self._policy.list_pod_disruption_budget_for_all_namespaces(_request_timeout=10).items
        except Exception as e:  # noqa: BLE001 - unknown budgets: no pod is evicted on a guess
            log.warning("cannot list PodDisruptionBudgets: %s", e)
            raise
        return [self._api_client.sanitize_for_serialization(b) for b in items]

    def nominate(self, namespace: str, name: str, uid: str, node: str | None) -> str:
        """Set (or with None remove) the pod's nomination. A node is set after a removal, so that
        the same value set again is a change every replica sees (its hold restarts)."""
        from kubernetes.client.rest import ApiException
        try:
            for value in ((None, node) if node is not None else (None,)):
                body = {"metadata": {"uid": uid, "annotations": {NOMINATED_ANNOTATION: value}}}
                self._core.patch_namespaced_pod(name, namespace, body, _content_type="application/merge-patch+json",
                                                _request_timeout=10)
        except ApiException as e:
            log.warning("nomination patch of pod %s/%s: HTTP %s: %s", namespace, name, e.status, str(e.body)[:300])
            return patch_failure(e.status)
        return "nominated"

    def evict(self, namespace: str, name: str, uid: str) -> str:
        from kubernetes.client.rest import ApiException
        c = self._client
        body = c.V1Eviction(metadata=c.V1ObjectMeta(name=name, namespace=namespace),
                            delete_options=c.V1DeleteOptions(preconditions=c.V1Preconditions(uid=uid)))
        try:
            self._core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=10)
        except ApiException as e:
            if e.status in (404, 409):
                return "gone"
            if e.status == 429:
                return "refused"
            if e.status == 403:
                return "forbidden"
            log.warning("eviction of pod %s/%s: HTTP %s: %s", namespace, name, e.status, str(e.body)[:300])
            return "error"
        return "evicted"

    def event(self, namespace: str, name: str, uid: str, etype: str, reason: str, message: str) -> None:
        c = self._client
        now = dt.datetime.now(dt.timezone.utc)
        body = c.CoreV1Event(
            metadata=c.V1ObjectMeta(name=f"{name}.{uuid.uuid4().hex[:12]}", namespace=namespace),
            involved_object=c.V1ObjectReference(api_version="v1", kind="Pod", name=name, namespace=namespace, uid=uid),
            reason=reason, message=message[:EVENT_MESSAGE_LIMIT], type=etype,
            source=c.V1EventSource(component="gpuplace-extender"),
            first_timestamp=now, last_timestamp=now, count=1, reporting_component="gpuplace-extender",
            reporting_instance=socket.gethostname())
        try:
            self._core.create_namespaced_event(namespace, body, _request_timeout=(5, 10))
        except Exception as e:  # noqa: BLE001 - an Event is a courtesy; the log line already has it
            log.warning("cannot record Event %s on pod %s/%s: %s", reason, namespace, name, e)


def parse_lease(value: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` of ``--preemption-lease``.

    Raises:
        ValueError: not two non-empty parts.
    """
    ns, sep, name = value.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ValueError(f"--preemption-lease {value!r}: expected NAMESPACE/NAME, e.g. gpuplace/gpuplace-preemption")
    return ns, name

