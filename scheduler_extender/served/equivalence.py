"""Equivalence classes of nodes: nodes the filter and the score cannot tell apart for any pod.

A large GPU cluster is made of few kinds of node (8x H100 over NVSwitch, 8x RTX 4090, an A100
partitioned into 3g.40gb slices, ...) in many copies. ``filter_node`` and ``score_nodes`` read a
node only through its ``NodeState``: the units of the requested resource (per-unit properties,
GPU indices for messages, NVLink peers among those units), the allocation (held UUIDs,
anonymous counts) and the state's other fields. Two states with equal ``state_key`` give the same
verdict, the same reasons and the same score for every job and policy; only the node name and
the identities (UUIDs) of the chosen units differ. The engine decides once per class and copies
the decision to every node of the class (kube-scheduler's "equivalence cache", per request).

Two ways of being equal, per resource:

- *symmetric* resources, whose units are identical except for UUID and GPU index and whose NVLink
  topology is all-to-all (NVSwitch) or absent: every criterion is per unit and reads neither UUID
  nor index, so either every unit is eligible or none is; which of them are held changes only
  how many are free. The key holds the number of held units, not which.
- resources whose units are identical but whose NVLink topology is neither (RTX A6000 bridged in
  pairs): the key holds the held positions up to the topology's automorphisms (relabelings of
  the units that keep every NVLink). Free counts, NVLink groups among free units and the
  properties of the chosen units are the same for two held sets that one relabeling maps onto
  each other; messages name GPU indices only for per-unit criteria, which do not depend on
  what is held.
- any other resource: the key holds every unit's properties and position, the NVLink peers as
  positions, and exactly which positions are held.

A field added to ``NodeState`` is part of every key automatically (except ``HOST_FIELDS``, which
only the score reads), and so is a field added to ``Unit`` (except the identities and the
structure in ``STRUCTURAL_UNIT_FIELDS``, which the key holds otherwise): a criterion reading a new
unit attribute cannot merge units that differ in it. What is left out is named, with why; the
default is in. An unhashable value makes the node its own class: never a wrong merge, only a
missed one.

What is computed once per view and per state is remembered beside them, in ``IdentityMemo`` side
tables of this module (``served.identity``): nothing is written into the frozen objects. A number
is never given to two different keys, so an entry the tables lost (a bound reached) is recomputed
into the same number, or into a new one (a missed merge, never a wrong one) when the interning
table was cleared in between.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Callable, Collection, Hashable

from scheduler_extender.core.criteria import OFTEN_CHANGING_UNIT_FIELDS
from scheduler_extender.core.devices import NodeState, NodeView, Unit
from scheduler_extender.served.identity import IdentityMemo

HOST_FIELDS = ("cpu_milli_free", "memory_bytes_free")
"""Read by no filter criterion, only by the score's fragmentation component: left out of the key so
that nodes differing only in free CPU/memory share filter verdicts; ``GroupedEngine.score_grouped`` (``served.grouped``)
splits classes by them when that component applies."""
_OTHER_STATE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeState)
                            if f.name not in ("name", "view", "allocation", *HOST_FIELDS))


STRUCTURAL_UNIT_FIELDS = {
    "uuid": "an identity: no criterion reads it; the key holds positions instead",
    "gpu_uuid": "an identity (of a MIG device's parent GPU)",
    "gpu_index": "kept beside the properties, per position (messages name GPU indices)",
    "allocated_to": "whether a unit is held is the allocation's part of the key",
    "nvlink_peers": "kept as positions (the topology), not as UUIDs; whether a unit has any is a property",
}
"""``Unit`` fields the per-unit properties leave out, and where the key holds them instead. Every
other field, including one added later, is a property (``unit_key_fields``), except those a
criterion declares as changing often (``core.criteria.OFTEN_CHANGING_UNIT_FIELDS``, a temperature):
keyed, they would split the classes at every inventory; the engine decides a job such a
criterion applies to on each node's own values (``GroupedEngine.filter_grouped``)."""

_KEY_GETTERS: dict[type, tuple[tuple[str, ...], Callable[[Unit], tuple[Hashable, ...]], int | None]] = {}


def unit_key_fields(cls: type = Unit) -> tuple[str, ...]:
    """The fields of a unit class that are part of its properties: all but ``STRUCTURAL_UNIT_FIELDS``
    and ``OFTEN_CHANGING_UNIT_FIELDS``."""
    return _key_getter(cls)[0]


def _key_getter(cls: type) -> tuple[tuple[str, ...], Callable[[Unit], tuple[Hashable, ...]], int | None]:
    found = _KEY_GETTERS.get(cls)
    if found is None:
        names = tuple(f.name for f in dataclasses.fields(cls)
                      if f.name not in STRUCTURAL_UNIT_FIELDS and f.name not in OFTEN_CHANGING_UNIT_FIELDS)
        get = operator.attrgetter(*names)
        found = _KEY_GETTERS[cls] = (names, get if len(names) > 1 else (lambda u: (get(u),)),  # type: ignore[assignment]
                                     names.index("entry") if "entry" in names else None)
    return found


def _unit_properties(u: Unit) -> tuple[Hashable, ...]:
    """Everything criteria and score components may read from a unit: every field but
    ``STRUCTURAL_UNIT_FIELDS``, plus whether it has NVLink peers. The catalog entry counts by
    identity (one object per model; hashing it would walk its fields)."""
    _, get, entry_at = _key_getter(type(u))
    values = list(get(u))
    if entry_at is not None and values[entry_at] is not None:
        values[entry_at] = id(values[entry_at])
    values.append(bool(u.nvlink_peers))
    return tuple(values)


MAX_AUTOMORPHISM_UNITS = 8
"""Topologies of more units are keyed exactly: their automorphisms are not enumerated."""

_AUTOMORPHISMS: dict[tuple[frozenset[int], ...], tuple[tuple[int, ...], ...]] = {}


def _automorphisms(adjacency: tuple[frozenset[int], ...]) -> tuple[tuple[int, ...], ...]:
    """Every permutation p of the units with j in adjacency[i] <=> p[j] in adjacency[p[i]]."""
    found = _AUTOMORPHISMS.get(adjacency)
    if found is not None:
        return found
    n = len(adjacency)
    out: list[tuple[int, ...]] = []

    def extend(image: list[int]) -> None:
        i = len(image)
        if i == n:
            out.append(tuple(image))
            return
        for cand in range(n):
            if cand in image or len(adjacency[cand]) != len(adjacency[i]):
                continue
            if all((j in adjacency[i]) == (image[j] in adjacency[cand]) for j in range(i)):
                extend(image + [cand])

    extend([])
    _AUTOMORPHISMS[adjacency] = found = tuple(out)
    return found


class _ViewKeys:
    """What this module remembers of one view (``_VIEW_KEYS``)."""

    __slots__ = ("signature", "number", "properties")

    def __init__(self) -> None:
        self.signature: tuple[Hashable, ...] | None = None
        self.number: int | None = None
        self.properties: dict[str, tuple[tuple[Hashable, ...], ...]] = {}


_VIEW_KEYS: IdentityMemo[_ViewKeys] = IdentityMemo()
"""Per ``NodeView`` (views are immutable): its signature, class number and unit properties."""
_STATE_KEYS: IdentityMemo[dict[str | None, int]] = IdentityMemo()
"""Per ``NodeState`` (states are immutable, rebuilt on every change): resource -> ``state_key``.
``grouped.with_host`` shares a state's dict with its copy under another name and host."""
_EMPTY: dict[str | None, int] = {}
MAX_RESOURCES_PER_OBJECT = 64
"""Resources whose keys or unit properties one view or state keeps; beyond, it starts over. A
cluster has a handful of GPU resources; a pod may name any ``nvidia.com/mig-...`` and memory must
not grow with what clients send."""


def _view_keys(view: NodeView) -> _ViewKeys:
    found = _VIEW_KEYS.get(view)
    return found if found is not None else _VIEW_KEYS.put(view, _ViewKeys())


def unit_properties(view: NodeView, resource: str) -> tuple[tuple[Hashable, ...], ...]:
    """Per unit of ``view.units(resource)``, in order, everything criteria and score components
    read from it except its UUID and GPU index: units with equal properties get equal verdicts
    from every per-unit criterion. Computed once per view (views are immutable)."""
    cache = _view_keys(view).properties
    props = cache.get(resource)
    if props is None:
        props = tuple(_unit_properties(u) for u in view.units(resource))
        if len(cache) >= MAX_RESOURCES_PER_OBJECT:
            cache.clear()
        cache[resource] = props
    return props


def _resource_signature(resource: str, units: tuple[Unit, ...]) -> tuple[Hashable, ...]:
    props = [_unit_properties(u) for u in units]
    uuids = [u.uuid for u in units]
    all_to_all = all(set(uuids) - {u.uuid} <= u.nvlink_peers for u in units)
    no_links = not any(u.nvlink_peers for u in units)
    indices = tuple(u.gpu_index for u in units)
    identical = all(p == props[0] for p in props)
    if identical and (all_to_all or no_links):
        return ("symmetric", resource, props[0] if props else None, indices)
    position = {uuid: i for i, uuid in enumerate(uuids)}
    # Links either way count: find_nvlink_group accepts a peer listed by either unit.
    adjacency = tuple(frozenset(j for j, v in enumerate(units) if j != i and (v.uuid in u.nvlink_peers or u.uuid in v.nvlink_peers))
                      for i, u in enumerate(units))
    if identical and len(units) <= MAX_AUTOMORPHISM_UNITS:
        return ("topology", resource, props[0], indices,
                tuple(frozenset(position[q] for q in u.nvlink_peers if q in position) for u in units), adjacency)
    return ("exact", resource, tuple(
        (p, u.gpu_index, frozenset(position[q] for q in u.nvlink_peers if q in position))
        for p, u in zip(props, units)))


def view_signature(view: NodeView) -> tuple[Hashable, ...]:
    """The view's structure without names and UUIDs; computed once per view (views are immutable)."""
    memo = _view_keys(view)
    sig = memo.signature
    if sig is None:
        sig = memo.signature = (view.description, view.sharing,
                                tuple(_resource_signature(r, us) for r, us in view.units_by_resource.items()))
    return sig


def view_class(view: NodeView) -> int:
    """A number equal for views with the same ``view_signature`` (the same devices, models,
    topology and GPU indices, whatever their names and UUIDs); computed once per view."""
    memo = _view_keys(view)
    number = memo.number
    if number is None:
        try:
            number = _intern(("view", view_signature(view)))
        except TypeError:  # an unhashable field: a class of its own
            number = next(_next_class)
        memo.number = number
    return number


def _held_signature(view: NodeView, resource: str, held: Collection[str]) -> Hashable:
    """Which units of ``resource`` are held, as far as the filter and score can tell (module docstring)."""
    units = view.units_by_resource[resource]
    sig = view_signature(view)[2][list(view.units_by_resource).index(resource)]
    kind = sig[0]
    if kind == "symmetric":
        return sum(1 for u in units if u.uuid in held)
    positions = tuple(i for i, u in enumerate(units) if u.uuid in held)
    if kind == "topology":
        return _canonical_positions(sig[-1], positions)
    return positions


_CANONICAL: dict[tuple[tuple[frozenset[int], ...], tuple[int, ...]], tuple[int, ...]] = {}


def _canonical_positions(adjacency: tuple[frozenset[int], ...], positions: tuple[int, ...]) -> tuple[int, ...]:
    """The least image of ``positions`` under the topology's automorphisms (same for every held
    set the topology cannot tell apart); remembered, since a binding changes one node at a time
    and 8 bridged GPUs have 384 automorphisms."""
    key = (adjacency, positions)
    found = _CANONICAL.get(key)
    if found is None:
        if len(_CANONICAL) >= _MAX_INTERNED:
            _CANONICAL.clear()
        found = _CANONICAL[key] = min(tuple(sorted(p[i] for i in positions)) for p in _automorphisms(adjacency))
    return found


_INTERNED: dict[Hashable, int] = {}
_MAX_INTERNED = 200_000
_next_class = itertools.count()


def _intern(key: Hashable) -> int:
    # A small int hashes in no time; the nested key tuple would be rehashed at every lookup.
    number = _INTERNED.get(key)
    if number is None:
        if len(_INTERNED) >= _MAX_INTERNED:
            _INTERNED.clear()  # numbers keep counting up: a cleared key gets a new number, never an old one
        number = _INTERNED[key] = next(_next_class)
    return number


def state_key(state: NodeState, resource: str | None) -> int:
    """A number equal for states the filter and score treat alike for pods asking for ``resource``.

    A node without units of ``resource`` fails on that whatever it holds, so its key leaves the
    allocation out. Computed once per ``NodeState`` and resource (states are immutable and
    rebuilt on every change).
    """
    keys = _STATE_KEYS.get(state)
    if keys is None:
        keys = _STATE_KEYS.put(state, {})
    else:
        number = keys.get(resource)
        if number is not None:
            return number
    others = tuple(getattr(state, f) for f in _OTHER_STATE_FIELDS)
    view = state.view
    key: Hashable
    if view is None:
        key = ("no-view", others)
    elif resource is None or resource not in view.units_by_resource:
        key = (view_signature(view), "absent", others)
    else:
        alloc = state.allocation
        # A shared GPU's pods, by position: what the shared-GPU criterion reads (core.sharing).
        shared = (tuple(alloc.shared.get(u.uuid, ()) for u in view.units_by_resource[resource]), alloc.shared_unplaced
                  ) if view.sharing is not None else None
        # Shares left on partly used units, by position: what the score's fragmentation reads.
        partly = tuple(alloc.partly_free_milli.get(u.uuid) for u in view.units_by_resource[resource]
                       ) if alloc.partly_free_milli else None
        key = (view_signature(view), resource, _held_signature(view, resource, alloc.held.keys()),
               alloc.held_count(), alloc.anonymous.get(resource, 0), shared, partly, others)
    try:
        number = _intern(key)
    except TypeError:  # an unhashable field: this state is a class of its own
        number = next(_next_class)
    if len(keys) >= MAX_RESOURCES_PER_OBJECT:
        keys.clear()
    keys[resource] = number
    return number


def copy_state_keys(state: NodeState, to: NodeState) -> None:
    """Let ``to`` share the ``state_key`` numbers remembered for ``state``: for a copy of ``state``
    that differs only in fields no key reads (its name and ``HOST_FIELDS``; ``grouped.with_host``)."""
    _STATE_KEYS.copy(state, to)


def with_own_values(states: list[NodeState], keys: list[int], resource: str | None, fields: tuple[str, ...]) -> list[int]:
    """``keys`` (the states' ``state_keys``) split by the states' own values of the often-changing
    unit ``fields`` (``core.criteria.per_node_fields``), for one job a criterion over them applies
    to: states with equal keys and equal values of those fields (per unit of ``resource``, in
    order) keep equal keys. A negative key (a node decided on its own) stays as it is."""
    out = []
    for state, key in zip(states, keys):
        view = state.view
        units = view.units(resource) if view is not None and resource is not None else ()
        values = tuple(getattr(u, f) for u in units for f in fields)
        try:
            out.append(key if key < 0 else _intern(("own-values", key, values)))
        except TypeError:  # an unhashable value: a class of its own
            out.append(next(_next_class))
    return out


def state_keys(states: list[NodeState], resource: str | None) -> list[int]:
    """``state_key`` of every state; the keys computed before are read without a function call
    each (one lookup by identity per state, then builtins)."""
    cached = list(map(dict.get, _STATE_KEYS.get_many(states, _EMPTY), itertools.repeat(resource)))
    if None in cached:
        cached = [k if k is not None else state_key(s, resource) for s, k in zip(states, cached)]
    return cached  # type: ignore[return-value]
