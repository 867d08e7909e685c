"""Memos keyed by object identity, kept beside the objects instead of inside them.

The served path remembers values computed from immutable objects (a ``NodeView``'s signature, a
``NodeState``'s equivalence keys, a ``Job``'s decision job and key). Those objects are frozen
dataclasses: nothing is written into them. An ``IdentityMemo`` maps ``id(obj)`` to a weak
reference to ``obj`` and the value; a lookup is a hit only when the reference still gives ``obj``
itself, so an id reused by a later object never returns the value of an earlier one.

Memory cannot grow with requests:

- an entry is removed when its object is freed (the weak reference's callback), so a table holds
  entries for live objects only, which their owners (the cluster cache, the bounded request memos,
  a request in flight) bound already; the memo keeps no object alive (values never refer to the
  object they are keyed by);
- whatever happens, a table holds at most ``max_entries`` entries: a put beyond that clears it
  first (as ``served.equivalence``'s interning table does), and what was cleared is recomputed on
  next use.

Thread-safe enough for the extender's worker threads: every step is one dict operation, atomic
under the GIL. Two threads computing the same entry at once both compute it and one put wins; an
entry lost to a ``clear`` is only a recomputation. A value is never returned for another object.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Generic, Sequence, TypeVar

V = TypeVar("V")

IDENTITY_MEMO_ENTRIES = 200_000
"""Default bound of an ``IdentityMemo``, in entries: far above the live objects of the served
path (one ``NodeView`` and one ``NodeState`` per node of a cluster of thousands, plus those of the
requests in flight and the request memos), so it clears only if something keeps far more alive.
An entry is a dict slot, a 2-tuple and a weak reference (~250 bytes) plus its value."""


class IdentityMemo(Generic[V]):
    """``obj -> value`` by identity, for objects that support weak references.

    ``get`` and ``get_many`` cost one dict lookup by ``id`` and one weak-reference call per object.
    An object that cannot be weakly referenced is never remembered (``put`` returns the value
    without keeping it: recomputed on every use, never wrong).

    Raises:
        ValueError: ``max_entries`` below 1.
    """

    def __init__(self, max_entries: int = IDENTITY_MEMO_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"IdentityMemo bound must be >= 1 (max_entries={max_entries})")
        self.max_entries = max_entries
        items: dict[int, tuple[weakref.KeyedRef, Any]] = {}
        self._items = items

        def drop(ref: weakref.KeyedRef) -> None:
            # Runs while the object is being freed, before its id can be reused; the entry may
            # already be another ref's (a put for a new object after a clear), which stays.
            entry = items.get(ref.key)
            if entry is not None and entry[0] is ref:
                items.pop(ref.key, None)

        self._drop: Callable[[weakref.KeyedRef], None] = drop

    def get(self, obj: object) -> V | None:
        """The value remembered for ``obj`` itself, or None."""
        entry = self._items.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]  # type: ignore[no-any-return]
        return None

    def get_many(self, objs: Sequence[object], default: Any = None) -> list[Any]:
        """``get`` of each of ``objs``, in order; ``default`` where nothing is remembered."""
        return [e[1] if e is not None and e[0]() is o else default
                for o, e in zip(objs, map(self._items.get, map(id, objs)))]

    def put(self, obj: object, value: V) -> V:
        """Remember ``value`` for ``obj`` (replacing what was remembered for it) and return it.
        ``value`` must not refer to ``obj``: it would keep ``obj`` alive until the table clears."""
        key = id(obj)
        try:
            ref = weakref.KeyedRef(obj, self._drop, key)
        except TypeError:  # no weak references to it: not remembered
            return value
        items = self._items
        if len(items) >= self.max_entries and key not in items:
            items.clear()
        items[key] = (ref, value)
        return value

    def copy(self, source: object, target: object) -> bool:
        """Remember for ``target`` the value remembered for ``source`` (the same value object);
        False when nothing is remembered for ``source``."""
        entry = self._items.get(id(source))
        if entry is None or entry[0]() is not source:
            return False
        self.put(target, entry[1])
        return True

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
