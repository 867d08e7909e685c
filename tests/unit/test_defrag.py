"""Defragmentation plans (core.defrag): the fewest moves of movable pods that make room for a pending pod."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.defrag import Movable, Overlay, plan_room
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.filter import filter_node
from scheduler_extender.core.pod import as_pod
from tests.factories import gpu, inventory, pod

CAT = default_catalog()
ENGINE = Engine()
A100 = dict(name="NVIDIA A100-SXM4-80GB", memory_mib=81920)


def node_obj(name: str, n: int, holders: dict[int, str]) -> dict:
    gpus = [gpu(i, **A100) for i in range(n)]
    for g in gpus:
        g["uuid"] = f"GPU-{name}-{g['index']}"
    for i, holder in holders.items():
        gpus[i]["allocatedTo"] = f"default/{holder}"
    inv = inventory(name, gpus)
    return {"metadata": {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)}},
            "status": {"allocatable": {"nvidia.com/gpu": str(n), "cpu": "64", "memory": "512Gi"}}}


def bound(name: str, node: str, gpus: int) -> dict:
    p = pod(gpus=gpus, name=name)
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running"}
    return p


def fleet(layout: dict[str, tuple[int, list[tuple[str, list[int]]]]]) -> tuple[ClusterCache, list[Movable]]:
    """``layout``: node -> (GPUs, [(pod, [GPU indices it holds])]); every pod movable."""
    nodes, pods, movable = [], [], []
    for node, (n, holders) in layout.items():
        held = {i: name for name, idx in holders for i in idx}
        nodes.append(node_obj(node, n, held))
        for name, idx in holders:
            p = bound(name, node, len(idx))
            pods.append(p)
            movable.append(Movable(p["metadata"]["uid"], f"default/{name}", node, ENGINE.job(as_pod(pod(gpus=len(idx), name=name))),
                                   len(idx)))
    c = ClusterCache(CAT)
    c.replace_nodes(nodes)
    c.replace_pods(pods)
    return c, movable


def test_an_8_gpu_pod_waiting_while_its_gpus_are_spread_gets_room_with_the_fewest_moves():
    # 8 GPUs free across four 8-GPU nodes: emptying c moves two pods, emptying d one (to c)
    c, movable = fleet({
        "a": (8, [("a1", [0, 1, 2]), ("a2", [3, 4, 5])]),
        "b": (8, [("b1", [0, 1, 2, 3]), ("b2", [4, 5])]),
        "c": (8, [("c1", [0]), ("c2", [1])]),
        "d": (8, [("d1", [0, 1, 2, 3, 4, 5])]),
    })
    job = ENGINE.job(as_pod(pod(gpus=8, name="big")))
    plan = plan_room(job, "default/big", c, movable, ENGINE.policy)
    assert plan is not None and plan.exact and plan.node == "d"
    assert [(m.pod.key, m.destination) for m in plan.moves] == [("default/d1", "c")]
    assert len(plan.result.chosen) == 8
    # without d1 movable, c is emptied: its two pods go where 1 GPU is free
    plan = plan_room(job, "default/big", c, [m for m in movable if m.key != "default/d1"], ENGINE.policy)
    assert plan is not None and plan.node == "c"
    assert sorted(m.pod.key for m in plan.moves) == ["default/c1", "default/c2"]
    assert all(m.destination not in ("c",) for m in plan.moves)


def test_no_plan_when_the_pod_fits_already_or_when_no_move_can_make_room():
    c, movable = fleet({"a": (4, [("a1", [0])]), "b": (4, [])})
    assert plan_room(ENGINE.job(as_pod(pod(gpus=4, name="big"))), "default/big", c, movable, ENGINE.policy) is None
    c, movable = fleet({"a": (4, [("a1", [0, 1, 2])]), "b": (4, [("b1", [0, 1, 2])])})
    # emptying either node needs room for 3 GPUs elsewhere, and there is 1
    assert plan_room(ENGINE.job(as_pod(pod(gpus=4, name="big"))), "default/big", c, movable, ENGINE.policy) is None


def test_a_second_pending_pod_is_planned_on_what_the_first_plan_leaves():
    c, movable = fleet({"a": (4, [("a1", [0])]), "b": (4, [("b1", [0])]), "c": (4, [("c1", [0, 1])])})
    overlay = Overlay()
    job = ENGINE.job(as_pod(pod(gpus=4, name="big1")))
    first = plan_room(job, "default/big1", c, movable, ENGINE.policy, overlay=overlay)
    assert first is not None and len(first.moves) == 1
    overlay.apply(first, "uid-big1", job)
    second = plan_room(ENGINE.job(as_pod(pod(gpus=4, name="big2"))), "default/big2", c, movable, ENGINE.policy,
                       overlay=overlay)
    assert second is not None and second.node not in (first.node,)
    moved = {m.pod.key for m in first.moves} | {m.pod.key for m in second.moves}
    assert len(moved) == len(first.moves) + len(second.moves)  # no pod moved twice


def _fits(c, overlay_without, overlay_added, node, job):
    st = c.state_with(node, frozenset(overlay_without.get(node, ())), overlay_added.get(node, []))
    return filter_node(job, st, ENGINE.policy).passed


BRUTE_FORCE_MOVES = 4


def _brute_force(c, movable, job, names):
    """The fewest moves (up to ``BRUTE_FORCE_MOVES``), any movable pods to any other nodes, after
    which the pod fits on some node; None: none that few."""
    for k in range(1, min(len(movable), BRUTE_FORCE_MOVES) + 1):
        for chosen in itertools.combinations(movable, k):
            for dests in itertools.product(names, repeat=k):
                if any(d == m.node for m, d in zip(chosen, dests)):
                    continue
                without: dict[str, set[str]] = {}
                for m in chosen:
                    without.setdefault(m.node, set()).add(m.uid)
                added: dict[str, list] = {}
                ok = True
                for m, d in zip(chosen, dests):
                    if not _fits(c, without, added, d, m.job):
                        ok = False
                        break
                    added.setdefault(d, []).append((m.uid, m.job))
                if ok and any(_fits(c, without, added, n, job) for n in names):
                    return k
    return None


def _spread_case(seed: int):
    """A random fleet of three 4-GPU nodes and a pod of 3 or 4 GPUs that fits no node while at
    least as many GPUs are free in all (the case defragmentation is for): the ``seed``-th such
    fleet of a fixed random sequence."""
    rng = random.Random(0)
    found = -1
    while True:
        layout = {}
        count = 0
        for node in "abc":
            free = list(range(4))
            rng.shuffle(free)
            holders = []
            for _ in range(rng.randint(1, 3)):
                take = [free.pop() for _ in range(min(len(free), rng.choice((1, 1, 1, 2))))]
                if take:
                    holders.append((f"p{count}", sorted(take)))
                    count += 1
            layout[node] = (4, holders)
        want = rng.choice((3, 4, 4))
        free_total = sum(4 - sum(len(i) for _, i in holders) for _, holders in layout.values())
        if free_total < want or any(4 - sum(len(i) for _, i in h) >= want for _, h in layout.values()):
            continue
        found += 1
        if found == seed:
            c, movable = fleet(layout)
            return c, movable, ENGINE.job(as_pod(pod(gpus=want, name="big")))


@pytest.mark.parametrize("seed", range(40))
def test_the_plan_has_as_few_moves_as_a_brute_force_search_over_every_set_of_moves(seed):
    c, movable, job = _spread_case(seed)
    names = list(c.node_names())
    assert not any(filter_node(job, c.state(n), ENGINE.policy).passed for n in names)
    expected = _brute_force(c, movable, job, names)
    plan = plan_room(job, "default/big", c, movable, ENGINE.policy)
    if expected is None:
        assert plan is None or len(plan.moves) > BRUTE_FORCE_MOVES
        return
    assert plan is not None and plan.exact
    assert len(plan.moves) == expected
    # the plan is carried out as it says: each replacement fits where it goes, then the pod fits
    without: dict[str, set[str]] = {}
    for m in plan.moves:
        without.setdefault(m.pod.node, set()).add(m.pod.uid)
    added: dict[str, list] = {}
    for m in plan.moves:
        assert _fits(c, without, added, m.destination, m.pod.job)
        added.setdefault(m.destination, []).append((m.pod.uid, m.pod.job))
    assert _fits(c, without, added, plan.node, job)


def test_a_replacement_that_fits_nowhere_gets_room_made_for_it_by_one_more_move():
    # c's 2-GPU pod fits on no node (a and b have 1 GPU free each); moving one 1-GPU pod from a to b
    # frees 2 GPUs on a for it: two moves empty c
    c, movable = fleet({"a": (4, [("a1", [0]), ("a2", [1]), ("a3", [2])]),
                        "b": (4, [("b1", [0]), ("b2", [1]), ("b3", [2])]),
                        "c": (4, [("c1", [0, 1])])})
    job = ENGINE.job(as_pod(pod(gpus=4, name="big")))
    plan = plan_room(job, "default/big", c, movable, ENGINE.policy)
    assert plan is not None and plan.exact and plan.node == "c" and len(plan.moves) == 2
    first, second = plan.moves
    assert (first.pod.key, second.pod.node) == ("default/c1", first.destination)
    assert second.destination not in (first.destination, "c")


def test_a_replacement_goes_only_where_its_cpu_and_memory_fit_too():
    # b has the GPU free for a1 but not the CPU (kube-scheduler's NodeResourcesFit would refuse it)
    layout = {"a": (4, [("a1", [0])]), "b": (4, [("b1", [0, 1, 2])]), "c": (4, [("c1", [0, 1, 2])])}
    c, movable = fleet(layout)
    job = ENGINE.job(as_pod(pod(gpus=4, name="big")))
    assert plan_room(job, "default/big", c, movable, ENGINE.policy).moves[0].destination in ("b", "c")
    nodes = [node_obj(n, 4, {i: name for name, idx in h for i in idx}) for n, (_, h) in layout.items()]
    for node in nodes:
        node["status"]["allocatable"]["cpu"] = "64" if node["metadata"]["name"] != "b" else "150m"
    c.replace_nodes(nodes)  # every pod asks 100m CPU: b has 150m, b1 takes 100m, 50m is left
    plan = plan_room(job, "default/big", c, movable, ENGINE.policy)
    assert plan is not None and [m.destination for m in plan.moves] == ["c"]
