"""A least-recently-used map bounded in entries and in bytes, for the extender's request memos.

Whatever clients send, a memo holds at most ``max_entries`` entries whose stated sizes sum to at
most ``max_bytes``: an entry larger than ``max_bytes`` on its own is not kept at all, and adding
one evicts the least recently used until both bounds hold. Sizes are the caller's estimate of
what the entry keeps alive (the key's digest and the value's strings), in bytes; the memo does
not measure objects itself (``sys.getsizeof`` sees one object, not what it refers to).

Thread-safe: the extender decides requests on worker threads (``server.create_app``).
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

V = TypeVar("V")

ENTRY_OVERHEAD_BYTES = 256
"""Added to every entry's stated size: the OrderedDict slot, the key tuple and the value object."""


def content_digest(data: bytes) -> bytes:
    """A 32-byte BLAKE2b digest of ``data``: memo keys of bounded size for content of any size
    (an inventory annotation), as Kubernetes' own caches key by hash, not by text."""
    return hashlib.blake2b(data, digest_size=32).digest()


class BoundedMemo(Generic[V]):
    """LRU map ``key -> value`` bounded by ``max_entries`` and by ``max_bytes`` of stated sizes.

    Raises:
        ValueError: a bound below 1.
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"BoundedMemo bounds must be >= 1 (max_entries={max_entries}, max_bytes={max_bytes})")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The value under ``key`` (now the most recently used), or None."""
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: V, size_bytes: int) -> bool:
        """Remember ``value`` under ``key``, evicting the least recently used entries as needed.
        False (nothing kept, nothing evicted) when the entry alone exceeds ``max_bytes``."""
        size = max(0, size_bytes) + ENTRY_OVERHEAD_BYTES
        if size > self.max_bytes:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, evicted) = self._items.popitem(last=False)
                self._bytes -= evicted
        return True

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        """The stated sizes of the entries held (with ``ENTRY_OVERHEAD_BYTES`` each)."""
        return self._bytes


def retained_bytes(root: object, shared: tuple[type, ...] = ()) -> int:
    """What ``root`` keeps alive, in bytes: ``sys.getsizeof`` of every object reachable from it
    (containers, ``__dict__`` and ``__slots__``, pydantic models), each once; objects of the
    ``shared`` types (the catalog's rows, which every view points to) and classes are not walked.

    A memo charges an entry this instead of a multiple of its text: a parsed inventory holds
    between 2.5x and 25x its compact JSON text depending on its shape (measured with
    tracemalloc; ``pytest -s tests/unit/test_memo_charge.py`` prints it per shape), so no single factor is right. The walk is linear in the
    objects built, as the parsing that built them was.
    """
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        o = stack.pop()
        if o is None or isinstance(o, (bool, type)) or isinstance(o, shared) or id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, (str, bytes, int, float)):
            continue
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        else:
            d = getattr(o, "__dict__", None)
            if d is not None:
                stack.append(d)
            for cls in type(o).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if slot != "__dict__" and slot != "__weakref__":
                        stack.append(getattr(o, slot, None))
    return total
