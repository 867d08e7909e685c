"""What the extender has promised and the cluster does not show yet: reservations.

kube-scheduler decides one pod at a time but binds asynchronously: it *assumes* the pod on the
chosen node in its own cache and goes on to the next pod while the binding is in flight
(``pkg/scheduler/internal/cache``, ``AssumePod``; ``schedule_one.go``, ``bindingCycle``). The
extender's view comes from its watch, which shows the pod only once it is bound, so without help
the next pod's filter is decided on a cluster that no longer exists: on a time-sliced GPU,
kube-scheduler counts replicas, never memory, and a burst of sharing pods over-committed a GPU's
VRAM (four 7 GiB pods on a 24 GiB card).

A reservation is the extender's assume cache. When a ``/filter`` answer sends a pod to a node, the
pod is held on that node in the extender's books, as if bound: its GPUs, MIG devices, a shared
GPU's replica and VRAM need (on a shared node a reserved pod is *unplaced*: it counts on every GPU,
since the device plugin picks the replica), its CPU and memory. Every later filter and score sees
it. It ends when:

- the watch shows the pod bound: on that node (``confirmed``; the bound pod now counts instead) or
  elsewhere (``bound_elsewhere``);
- the pod ends, or is deleted (``released``: at once when the bound pods' watch shows it ended;
  ``LEFT_PENDING_GRACE_SECONDS`` after the unbound pods' watch stops showing it, since that watch
  does not say whether it was deleted or bound);
- kube-scheduler asks about the same pod again, which it does only after that attempt failed
  (``replaced``: the new answer's nodes hold it now);
- ``ttl_seconds`` pass without any of these (``expired``): kube-scheduler gave up on that
  attempt for a reason of its own and has not retried yet.

A reservation is keyed by the pod's uid (a request without one reserves nothing). This module
keeps the bookkeeping only; ``cache.ClusterCache`` counts the reserved pods in node states.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Generic, TypeVar

DEFAULT_TTL_SECONDS = 30.0
"""How long a reservation waits for its binding (``--reservation-seconds``). A binding takes
milliseconds to seconds under load; a pod kube-scheduler failed for another reason is retried
(and its reservation replaced) or deleted well before this in practice."""

MAX_RESERVATIONS = 20_000
"""Reservations held at once; beyond it the one closest to expiry ends early (``expired``). A
burst of pods in flight is far below it; it bounds what requests with made-up uids can hold."""

LEFT_PENDING_GRACE_SECONDS = 5.0
"""How long a reservation outlives its pod's leaving the unbound pods, for the binding to show in
the bound pods' watch (``left_pending``); a deleted pod's reservation ends then."""

OUTCOMES = ("confirmed", "bound_elsewhere", "released", "replaced", "expired")

E = TypeVar("E")


@dataclass(frozen=True)
class Reservation(Generic[E]):
    """Pod ``uid`` held on ``nodes`` (each with the same ``entry``: what the pod takes) until
    ``expires_at`` (monotonic seconds)."""

    uid: str
    nodes: tuple[str, ...]
    entry: E
    expires_at: float
    gone: bool = False  # the pod left the unbound pods (``left_pending``)


class Reservations(Generic[E]):
    """Reservations by pod uid and by node; not thread-safe (the cache's lock guards it).

    Each method returns the names of the nodes whose reserved pods changed, for the caller to
    invalidate. ``outcomes`` counts how reservations ended (``OUTCOMES``).
    """

    def __init__(self, ttl_seconds: float = DEFAULT_TTL_SECONDS, max_entries: int = MAX_RESERVATIONS) -> None:
        if ttl_seconds <= 0 or max_entries < 1:
            raise ValueError(f"reservations need ttl > 0 seconds and room for one (ttl {ttl_seconds}, max {max_entries})")
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._by_uid: dict[str, Reservation[E]] = {}
        self._by_node: dict[str, dict[str, E]] = {}
        self._expiry: list[tuple[float, int, str]] = []  # (expires_at, sequence, uid): a heap
        self._seq = 0
        self.made = 0
        self.outcomes: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._by_uid)

    def reserve(self, uid: str, nodes: tuple[str, ...], entry: E, now: float) -> set[str]:
        """Hold pod ``uid`` on ``nodes`` (replacing a reservation it had: kube-scheduler retries a
        pod only after its last attempt ended)."""
        changed = self._end(uid, "replaced")
        if not nodes:
            return changed
        while len(self._by_uid) >= self.max_entries:
            changed |= self._end(self._soonest(), "expired")
        r = Reservation(uid, tuple(dict.fromkeys(nodes)), entry, now + self.ttl_seconds)
        self._by_uid[uid] = r
        for n in r.nodes:
            self._by_node.setdefault(n, {})[uid] = entry
        self._seq += 1
        heapq.heappush(self._expiry, (r.expires_at, self._seq, uid))
        self.made += 1
        return changed | set(r.nodes)

    def bound(self, uid: str, node: str) -> set[str]:
        """The watch shows pod ``uid`` bound to ``node``."""
        r = self._by_uid.get(uid)
        if r is None:
            return set()
        return self._end(uid, "confirmed" if node in r.nodes else "bound_elsewhere")

    def released(self, uid: str) -> set[str]:
        """Pod ``uid`` was deleted or ended."""
        return self._end(uid, "released")

    def left_pending(self, uid: str, now: float) -> None:
        """Pod ``uid`` left the unbound pods: deleted, or bound. A field-selector watch tells the
        two apart no better than that (the API server's watch cache sends the object as it was
        *before* it stopped matching: no node name in either case), so the reservation ends
        ``LEFT_PENDING_GRACE_SECONDS`` later (``released``) unless the binding shows first."""
        r = self._by_uid.get(uid)
        if r is None or r.expires_at <= now + LEFT_PENDING_GRACE_SECONDS:
            return
        r = self._by_uid[uid] = Reservation(r.uid, r.nodes, r.entry, now + LEFT_PENDING_GRACE_SECONDS, gone=True)
        self._seq += 1
        heapq.heappush(self._expiry, (r.expires_at, self._seq, uid))

    def retried(self, uid: str) -> set[str]:
        """kube-scheduler asks about pod ``uid`` again: its last attempt ended, and the pod's own
        reservation must not stand in its way (``replaced``)."""
        return self._end(uid, "replaced")

    def expire(self, now: float) -> set[str]:
        """End the reservations whose time is up."""
        changed: set[str] = set()
        heap = self._expiry
        while heap and heap[0][0] <= now:
            expires_at, _, uid = heapq.heappop(heap)
            r = self._by_uid.get(uid)
            if r is not None and r.expires_at == expires_at:
                changed |= self._end(uid, "released" if r.gone else "expired")
        return changed

    def _soonest(self) -> str:
        """The uid of the live reservation that expires first (stale heap entries dropped)."""
        while True:
            expires_at, _, uid = self._expiry[0]
            r = self._by_uid.get(uid)
            if r is not None and r.expires_at == expires_at:
                return uid
            heapq.heappop(self._expiry)

    def on_node(self, node: str) -> dict[str, E]:
        """uid -> entry of the pods reserved on ``node`` (a copy)."""
        return dict(self._by_node.get(node, {}))

    def _end(self, uid: str, outcome: str) -> set[str]:
        r = self._by_uid.pop(uid, None)
        if r is None:
            return set()
        for n in r.nodes:
            on = self._by_node.get(n)
            if on is not None:
                on.pop(uid, None)
                if not on:
                    del self._by_node[n]
        self.outcomes[outcome] += 1
        return set(r.nodes)


