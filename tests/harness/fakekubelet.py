"""The node side of a fake GPU node, played by a test: the kubelet, the device plugin and the agent.

Fake nodes (:func:`tests.harness.controlplane.create_node`) have no kubelet, so a bound pod stays
``Pending`` and a pod being deleted gracefully (an eviction: ``POST pods/NAME/eviction``) stays
``Terminating`` with a ``deletionTimestamp`` for ever, holding its GPUs (``cluster.cache``: a pod
being deleted holds them until it is gone). :class:`FakeKubelet` does what a kubelet does for such
pods: marks a bound pod ``Running``, and once a pod is being deleted, stops it and deletes it with
``gracePeriodSeconds=0`` (what the kubelet's status manager does once the containers have exited).

:class:`FakeGpuNode` plays the device plugin and the node agent: the test says which GPU it gave to
which pod (:meth:`FakeGpuNode.assign`), and the node's ``gpuplace.io/inventory`` annotation is
republished with ``allocatedTo`` naming the holders, as ``gpuplace-agent`` reports what the
kubelet's PodResources API says; :meth:`FakeGpuNode.release` drops a pod from it (its containers
stopped).
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness.gpucluster import publish_inventory_direct

__all__ = ["EventRecord", "FakeGpuNode", "FakeKubelet", "pod_event_records"]


class FakeGpuNode:
    """One fake node's inventory with ``allocatedTo`` kept by the test (device plugin + agent)."""

    def __init__(self, api: k8s.ApiClient, inventory: Mapping[str, Any]) -> None:
        self.api = api
        self.name: str = inventory["nodeName"]
        self._doc = copy.deepcopy(dict(inventory))
        self._holders: dict[int, list[str]] = {int(g["index"]): [] for g in self._doc["gpus"]}
        self._lock = threading.Lock()

    def holders(self) -> dict[int, list[str]]:
        """GPU index -> the pods ("ns/name") the agent lists in its ``allocatedTo``."""
        with self._lock:
            return {i: list(keys) for i, keys in self._holders.items()}

    def assign(self, pod_key: str, *gpu_indices: int) -> None:
        """The device plugin gave ``pod_key`` ("ns/name") these GPUs (a replica of each on a shared
        node); the agent publishes it."""
        with self._lock:
            for i in gpu_indices:
                self._holders[i].append(pod_key)
        self.publish()

    def assign_free(self, pod_key: str, count: int) -> tuple[int, ...]:
        """The device plugin gave ``pod_key`` the ``count`` free GPUs of lowest index (none held by
        a pod), as the kubelet's device manager picks them on a node without topology hints; the
        agent publishes it. Returns their indices (a pod holding GPUs already gets no more: its
        own). Raises ``ValueError`` if fewer than ``count`` are free."""
        with self._lock:
            own = tuple(i for i, keys in sorted(self._holders.items()) if pod_key in keys)
            if own:
                return own
            free = [i for i, keys in sorted(self._holders.items()) if not keys]
            if len(free) < count:
                raise ValueError(f"{self.name}: {pod_key} needs {count} GPUs, {len(free)} free: {self._holders}")
            chosen = tuple(free[:count])
            for i in chosen:
                self._holders[i].append(pod_key)
        self.publish()
        return chosen

    def release(self, pod_key: str) -> bool:
        """``pod_key``'s containers stopped: the agent no longer lists it. Returns whether it held any GPU."""
        with self._lock:
            held = any(pod_key in keys for keys in self._holders.values())
            for keys in self._holders.values():
                while pod_key in keys:
                    keys.remove(pod_key)
        if held:
            self.publish()
        return held

    def publish(self) -> None:
        """Patch the inventory annotation as the agent would (fresh ``observedAt``)."""
        with self._lock:
            doc = copy.deepcopy(self._doc)
            for g in doc["gpus"]:
                g["allocatedTo"] = ",".join(self._holders[int(g["index"])])
        publish_inventory_direct(self.api, self.name, doc)


class FakeKubelet:
    """A thread playing the kubelet for the pods of ``namespace`` bound to ``nodes``.

    Every ``interval`` seconds: a bound ``Pending`` pod is started (``on_running(pod)``, if given,
    before its status is written: e.g. the device plugin gives it GPUs) and marked ``Running``
    (Ready); a pod with a
    ``deletionTimestamp`` is "stopped" (``on_terminating(pod)``: e.g. the agent stops listing it),
    then deleted with grace 0, and its name appended to :attr:`terminated`. Use it as a context
    manager; errors of the thread are kept in :attr:`errors` (404 and 409 races are not errors).
    Give it an ApiClient of its own (``ControlPlane.api_client()``).
    """

    def __init__(self, api: k8s.ApiClient, namespace: str, nodes: Iterable[str], *,
                 on_terminating: Callable[[k8s.V1Pod], None] | None = None, interval: float = 0.1,
                 on_running: Callable[[k8s.V1Pod], None] | None = None) -> None:
        self.core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.nodes = frozenset(nodes)
        self.on_terminating = on_terminating
        self.on_running = on_running
        self.interval = interval
        #: Names of the pods this kubelet deleted after they were marked for deletion, in order.
        self.terminated: list[str] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fake-kubelet[{','.join(sorted(self.nodes))}]",
                                        daemon=True)

    def __enter__(self) -> FakeKubelet:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception as exc:  # noqa: BLE001 - kept for the test to report; the loop goes on
                self.errors.append(exc)
            self._stop.wait(self.interval)

    def sync_once(self) -> None:
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            if pod.spec.node_name not in self.nodes:
                continue
            try:
                if pod.metadata.deletion_timestamp is not None:
                    if self.on_terminating is not None:
                        self.on_terminating(pod)
                    self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0,
                                                    body=k8s.V1DeleteOptions(
                                                        grace_period_seconds=0,
                                                        preconditions=k8s.V1Preconditions(uid=pod.metadata.uid)))
                    if pod.metadata.name not in self.terminated:
                        self.terminated.append(pod.metadata.name)
                elif (pod.status.phase or "Pending") == "Pending":
                    if self.on_running is not None:
                        self.on_running(pod)
                    self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, _running_status())
            except ApiException as exc:
                if exc.status not in (404, 409):  # gone meanwhile, or another pod under that name
                    raise


def _running_status() -> dict[str, Any]:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                  for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
    return {"status": {"phase": "Running", "startTime": now, "conditions": conditions}}


EventRecord = tuple[str, str, str]
"""(type, reason, message) of an Event: ``("Warning", "FailedScheduling", "0/1 nodes ...")``."""


def pod_event_records(api: k8s.ApiClient, namespace: str, name: str) -> list[EventRecord]:
    """Type, reason and message of each Event about pod ``namespace/name`` (core/v1 and
    events.k8s.io/v1 Events alike: they are one resource), oldest first."""
    core = k8s.CoreV1Api(api)
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}").items

    def when(ev: k8s.CoreV1Event) -> dt.datetime:
        stamp = ev.last_timestamp or ev.event_time or ev.metadata.creation_timestamp
        return stamp or dt.datetime.min.replace(tzinfo=dt.timezone.utc)

    return [(ev.type or "", ev.reason or "", ev.message or "") for ev in sorted(events, key=when)]
