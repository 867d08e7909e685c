"""The served path remembers nothing inside the frozen objects it decides on: its memos are side
tables keyed by identity (``served.identity.IdentityMemo``), which never answer for another object
that reuses an id, stay within their bound and keep nothing alive."""

import dataclasses
import gc
import threading
import weakref

import pytest

from scheduler_extender.core.devices import NodeState, NodeView, Unit
from scheduler_extender.core.job import Job
from scheduler_extender.core.workload import DemandShape, WorkloadProfile
from scheduler_extender.served.equivalence import state_key, state_keys, unit_properties, view_class, view_signature
from scheduler_extender.served.grouped import GroupedEngine, _job_key, decision_job, group_nodes, named_job, with_host
from scheduler_extender.served.identity import IdentityMemo
from tests.unit.test_equivalence import cluster_states, pods


def _fields(obj) -> set[str]:
    return {f.name for f in dataclasses.fields(obj)}


def _assert_only_fields(obj) -> None:
    if type(obj).__dictoffset__ == 0:  # slots (Unit): nowhere to write anything else
        assert set(type(obj).__slots__) == _fields(obj), type(obj)
        return
    assert set(vars(obj)) == _fields(obj), (type(obj).__name__, set(vars(obj)) - _fields(obj))


def test_a_grouped_filter_and_score_leaves_every_object_of_the_decision_with_its_fields_only():
    engine = GroupedEngine()
    states = cluster_states()
    # Free CPU/memory and a learned workload: the score splits classes and scores parts under
    # other nodes' names and hosts (with_host).
    states = [dataclasses.replace(s, cpu_milli_free=[None, 8000, 64000][i % 3], memory_bytes_free=[None, 2**36][i % 2])
              for i, s in enumerate(states)]
    workload = WorkloadProfile(((DemandShape("nvidia.com/gpu", 1, 4000, 16 * 2**30), 1.0),), version=1)
    jobs: list[Job] = []
    for p in pods():
        job = engine.job(p)
        decision = decision_job(job)
        named = named_job(decision, "other-replica")
        assert decision_job(named) is decision
        assert _job_key(decision_job(named)) == _job_key(decision_job(job)) is _job_key(decision)
        jobs += [job, decision, named]
        for j in (job, named):  # the second pass runs on the memos the first one filled
            keys = state_keys(states, j.req.resource)
            grouped = engine.filter_grouped(j, states, None, groups=group_nodes(states, keys))
            engine.score_grouped(j, grouped, workload)
            # Decided again on a list in another order: representatives named after other nodes.
            grouped = engine.filter_grouped(j, states[::-1], None)
            engine.score_grouped(j, grouped, workload)
    moved = with_host(states[0], "elsewhere", 1, 2)
    assert state_key(moved, "nvidia.com/gpu") == state_key(states[0], "nvidia.com/gpu")
    views = {id(s.view): s.view for s in states if s.view is not None}
    units = [u for v in views.values() for us in v.units_by_resource.values() for u in us]
    for obj in [*states, moved, *views.values(), *units, *jobs, *(j.req for j in jobs)]:
        _assert_only_fields(obj)
    assert units and isinstance(units[0], Unit) and isinstance(states[0], NodeState) and isinstance(moved.view, NodeView)


def test_view_and_state_keys_are_remembered_per_object_and_survive_only_with_it():
    state = cluster_states()[0]
    view = state.view
    assert view_signature(view) is view_signature(view)
    assert unit_properties(view, "nvidia.com/gpu") is unit_properties(view, "nvidia.com/gpu")
    assert view_class(view) == view_class(dataclasses.replace(view, name="copy"))  # names are not part of it
    key = state_key(state, "nvidia.com/gpu")
    copy = dataclasses.replace(state)  # equal fields, another object: computed anew, equal
    assert state_keys([copy, state], "nvidia.com/gpu") == [key, key]
    assert _fields(state) == set(vars(state)) and _fields(view) == set(vars(view))


class Thing:
    """Supports weak references, like the served path's frozen dataclasses."""


def test_a_reused_id_never_gets_the_value_of_the_object_that_had_it_before():
    memo: IdentityMemo[int] = IdentityMemo()
    reused = 0
    for round_ in range(50):
        things = [Thing() for _ in range(200)]
        before = {id(t) for t in things}
        for i, t in enumerate(things):
            assert memo.put(t, round_ * 1000 + i) == round_ * 1000 + i
        assert [memo.get(t) for t in things] == [round_ * 1000 + i for i in range(200)]
        del things, t
        fresh = [Thing() for _ in range(200)]
        reused += len(before & {id(t) for t in fresh})
        assert [memo.get(t) for t in fresh] == [None] * 200
        assert memo.get_many(fresh, "none") == ["none"] * 200
        del fresh
    assert reused > 0  # CPython hands freed addresses out again: the case is exercised
    assert len(memo) == 0  # every entry left with its object


def test_even_an_entry_left_behind_by_a_dead_object_answers_for_no_other(monkeypatch):
    memo: IdentityMemo[str] = IdentityMemo()
    monkeypatch.setattr(memo, "_drop", lambda ref: None)  # entries outlive their objects
    stale: set[int] = set()
    for _ in range(20):
        things = [Thing() for _ in range(100)]
        for t in things:
            memo.put(t, "old")
        stale |= {id(t) for t in things}
        del things, t
        fresh = [Thing() for _ in range(100)]
        assert stale & {id(t) for t in fresh}
        assert [memo.get(t) for t in fresh] == [None] * 100
        assert memo.get_many(fresh) == [None] * 100
        assert not any(memo.copy(t, Thing()) for t in fresh)
        del fresh


def test_the_memo_stays_within_its_bound_and_keeps_nothing_alive():
    memo: IdentityMemo[int] = IdentityMemo(max_entries=10)
    things = [Thing() for _ in range(1000)]
    for i, t in enumerate(things):
        memo.put(t, i)
        assert len(memo) <= 10
    hits = [(i, memo.get(t)) for i, t in enumerate(things) if memo.get(t) is not None]
    assert 1 <= len(hits) <= 10 and all(i == v for i, v in hits)  # the latest ones, each its own
    assert hits[-1] == (999, 999)
    refs = [weakref.ref(t) for t in things]
    del things, t
    gc.collect()
    assert all(r() is None for r in refs)
    assert len(memo) == 0
    with pytest.raises(ValueError):
        IdentityMemo(max_entries=0)


def test_objects_without_weak_references_are_not_remembered():
    memo: IdentityMemo[str] = IdentityMemo()
    unit = cluster_states()[0].view.units("nvidia.com/gpu")[0]  # slots: no weak references
    assert memo.put(unit, "v") == "v" and memo.get(unit) is None and len(memo) == 0


def test_threads_sharing_a_memo_get_either_nothing_or_their_objects_own_value():
    memo: IdentityMemo[int] = IdentityMemo(max_entries=64)
    things = [Thing() for _ in range(256)]
    wrong: list[tuple[int, object]] = []

    def work(seed: int) -> None:
        for n in range(20_000):
            i = (n * 7919 + seed) % len(things)
            got = memo.get(things[i])
            if got is None:
                memo.put(things[i], i)
            elif got != i:
                wrong.append((i, got))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and len(memo) <= 64
