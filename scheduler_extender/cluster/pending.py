"""GPU pods that wait for a node: unbound pods that request GPUs, kept for the pending-pods gauges.

Fed by its own list/watch (``ResourceWatcher`` with field selector :data:`PENDING_FIELD_SELECTOR`)
so that the placement cache stays limited to bound pods. A pod leaves the selector when it is bound
or finishes, and then arrives as DELETED. Pure state, thread-safe; no I/O. ``on_new`` (cluster
mode: ``ExtenderService.observe_pod``, the learned workload) is called, outside the lock, with
each pod the first time its uid is seen.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import Any, Callable, Container, Iterable, Mapping

from scheduler_extender.cluster.cache import CacheStats
from scheduler_extender.core.pod import PodShapeError, as_pod
from scheduler_extender.core.requirements import pod_gpu_requests

PENDING_FIELD_SELECTOR = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"

NOMINATED_ANNOTATION = "extender.gpuplace.io/nominated-node"
"""Written by the preempting replica (``cluster.preemption``, which names it too)."""


@dataclass(frozen=True)
class PendingPod:
    requests: Mapping[str, int]
    created: dt.datetime | None


def _created(meta: Mapping[str, Any]) -> dt.datetime | None:
    stamp = meta.get("creationTimestamp")
    if not stamp:
        return None
    try:
        return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None  # unknown stays unknown


class PendingGpuPods:
    """Unbound pods requesting GPUs, by uid. Quacks like the pod half of ``ClusterCache`` for
    ``ResourceWatcher`` (``replace_pods``, ``apply_pod_event``, ``pods_synced``, ``stats``)."""

    def __init__(self, on_new: Callable[[Mapping[str, Any]], None] | None = None,
                 on_deleted: Callable[[str], None] | None = None,
                 on_nominated: Callable[[str, str | None, Mapping[str, Any]], None] | None = None) -> None:
        """``on_new``: called with each waiting GPU pod seen for the first time. ``on_deleted``:
        called with the uid of each pod that leaves this watch (a DELETED event: the pod was
        deleted, or bound), for its reservation. ``on_nominated``: called with (uid, node or None,
        pod) when a waiting pod's ``extender.gpuplace.io/nominated-node`` annotation appears,
        changes or goes (``cluster.preemption``)."""
        self._on_new = on_new
        self._on_deleted = on_deleted
        self._on_nominated = on_nominated
        self._nominated: dict[str, str] = {}  # uid -> the annotation's value last seen
        self._lock = threading.Lock()
        self._pods: dict[str, PendingPod] = {}
        self.pods_synced = False
        self.nodes_synced = True  # not ours; ResourceWatcher only touches pods_synced for pods
        self.stats = CacheStats()

    def _set(self, obj: Mapping[str, Any], before: Container[str] | None = None) -> bool:
        """Track ``obj``; True when it is a waiting GPU pod not tracked before (not among
        ``before``'s keys when given, else not in the tracker)."""
        try:
            pod = as_pod(obj)
        except PodShapeError:
            return False  # not from an API server: nothing to track
        requests, _ = pod_gpu_requests(pod)
        if pod.spec.node_name or not requests:
            self._pods.pop(pod.key, None)
            return False
        new = pod.key not in (self._pods if before is None else before)
        self._pods[pod.key] = PendingPod(requests, _created(obj.get("metadata") or {}))
        return new

    def apply_pod_event(self, event_type: str, obj: Mapping[str, Any]) -> None:
        if event_type == "DELETED":
            self._deleted(obj)
            return
        with self._lock:
            self.stats.pod_events += 1
            new = self._set(obj)
        if new and self._on_new is not None:
            self._on_new(obj)
        self._check_nomination(obj)

    def _check_nomination(self, obj: Mapping[str, Any]) -> None:
        """Tell ``on_nominated`` about a change of the pod's nomination annotation."""
        if self._on_nominated is None:
            return
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        annotations = meta.get("annotations") or {}
        if not isinstance(uid, str) or not isinstance(annotations, Mapping):
            return
        node = annotations.get(NOMINATED_ANNOTATION)
        node = node if isinstance(node, str) and node and not (obj.get("spec") or {}).get("nodeName") else None
        with self._lock:
            if self._nominated.get(uid) == node:
                return
            if node is None:
                self._nominated.pop(uid, None)
            else:
                self._nominated[uid] = node
        self._on_nominated(uid, node, obj)

    def _deleted(self, obj: Mapping[str, Any]) -> None:
        try:
            pod = as_pod(obj)
        except PodShapeError:
            return  # never tracked
        with self._lock:
            self.stats.pod_events += 1
            self._pods.pop(pod.key, None)
            if pod.uid:
                self._nominated.pop(pod.uid, None)
        # A pod leaves this watch when it is bound too, and the API server's watch cache then sends
        # the object as it was before (no node): the callback cannot tell, and must not assume.
        if pod.uid and self._on_deleted is not None:
            self._on_deleted(pod.uid)

    def replace_pods(self, objs: Iterable[Mapping[str, Any]]) -> None:
        objs = list(objs)
        with self._lock:
            before = set(self._pods)
            self._pods.clear()
            fresh = [obj for obj in objs if self._set(obj, before)]
            self.pods_synced = True
            left = before - set(self._pods)  # deleted or bound while the watch was down
        if self._on_new is not None:
            for obj in fresh:
                self._on_new(obj)
        with self._lock:
            for key in left:
                self._nominated.pop(key, None)
        for obj in objs:
            self._check_nomination(obj)
        if self._on_deleted is not None:
            for key in left:
                self._on_deleted(key)

    def waits(self, uid: str) -> bool | None:
        """Whether the pod with ``uid`` is unbound and requests GPUs; None until the first list."""
        with self._lock:
            return uid in self._pods if self.pods_synced else None

    def snapshot(self) -> list[PendingPod]:
        with self._lock:
            return list(self._pods.values())
