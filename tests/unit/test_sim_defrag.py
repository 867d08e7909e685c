"""Defragmentation in the replay (``gpuplace simulate --mode replay --defrag``, ``simulator.defrag``)."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from scheduler_extender.served.grouped import GroupedEngine
from scheduler_extender.simulator import defrag as sim_defrag
from scheduler_extender.simulator import report
from scheduler_extender.simulator.baselines import GpuplacePolicy
from scheduler_extender.simulator.cluster import MILLI, Cluster
from scheduler_extender.simulator.defrag import DEFRAG_POLICY, Defrag
from scheduler_extender.simulator.model import SimNode, SimPod, make_inventory, simulation_catalog
from scheduler_extender.simulator.run import Placement, RunResult, replay_time_scale, run_replay, simulate

CAT = simulation_catalog()
ENGINE = GroupedEngine(catalog=CAT)


def node(name, model_id, count, cpu=None, mem=None):
    return SimNode(name, make_inventory(name, CAT.entries[model_id], count), cpu, mem, f"{model_id}x{count}")


def own_times(pods, gpus):
    """The load at which the replay keeps the pods' own times."""
    return 1 / replay_time_scale(pods, 1.0, gpus)


def spread_trace():
    """Two 4-GPU nodes filled with eight 1-GPU pods; every other one leaves at 50 s, the rest at
    ~1000 s: a 4-GPU pod arriving at 100 s finds 4 GPUs free, two on each node."""
    pods = [SimPod(f"s{i}", 1, creation_s=i, duration_s=50 if i % 2 == 0 else 1000) for i in range(8)]
    return pods + [SimPod("big", 4, creation_s=100, duration_s=100), SimPod("last", 1, creation_s=2000, duration_s=1)]


class Recording(Defrag):
    """Defrag that keeps the plans the planner returned and the placements after each."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.plans = []

    def make_room(self, pod, running):
        real = sim_defrag.plan_room
        found = []

        def record(*a, **kw):
            plan = real(*a, **kw)
            found.append(plan)
            return plan
        sim_defrag.plan_room = record
        try:
            choice = super().make_room(pod, running)
        finally:
            sim_defrag.plan_room = real
        if choice is not None:
            self.plans.extend(found)
        check_bookkeeping(self.cluster, running)
        return choice


def check_bookkeeping(c: Cluster, running) -> None:
    """No GPU held twice or over its share, every running pod on the units the cluster says it holds."""
    assert c.overcommit() == (0, 0, 0)
    for i in range(len(c.nodes)):
        for j, holders in enumerate(c.on_unit[i]):
            assert c.milli_free[i, j] == MILLI - sum(holders.values()) >= 0
        assert c.gpu_free[i] == int((c.milli_free[i, :len(c.units[i])] == MILLI).sum())
        assert c.cpu_free[i] >= 0 and c.mem_free[i] >= 0
    for p in running.values():
        for u in p.units:
            j = next(k for k, v in enumerate(c.units[p.node]) if v.uuid == u.uuid)
            assert p.pod.name in c.on_unit[p.node][j]
    assert c.allocated_milli == sum(p.pod.total_milli for p in running.values())


@pytest.fixture
def recording(monkeypatch):
    made: list[Recording] = []

    def make(*a, **kw):
        d = Recording(*a, **kw)
        made.append(d)
        return d
    monkeypatch.setattr("scheduler_extender.simulator.run.Defrag", make)
    return made


def test_a_whole_node_pod_waiting_while_its_gpus_are_spread_starts_at_once_with_defrag_and_later_without(recording):
    nodes = [node("a", "a10", 4), node("b", "a10", 4)]
    pods = spread_trace()
    load = own_times(pods, 8)
    without = run_replay(nodes, pods, GpuplacePolicy(ENGINE), ENGINE, load, 0)
    with_ = run_replay(nodes, pods, GpuplacePolicy(ENGINE, name=DEFRAG_POLICY, defrag=True), ENGINE, load, 0)
    # without: "big" waits until the long-running pods of one node leave (~1000 s)
    assert without.queue_delay_hours_max * 3600 > 800
    assert without.defrag_moves is None and without.defrag_started is None
    # with: two pods move off one node the moment it waits, and it starts there
    assert with_.queue_delay_hours_max == 0 and with_.queue_delay_hours_mean < without.queue_delay_hours_mean
    [d] = recording
    [plan] = d.plans
    assert with_.defrag_moves == len(plan.moves) == 2 and with_.defrag_started == 1
    assert {m.destination for m in plan.moves} != {plan.node}
    assert with_.overcommitted_gpus == with_.overcommitted_pods == 0
    assert (with_.placed, with_.unplaced) == (without.placed, without.unplaced) == (10, 0)


def test_moves_are_carried_out_without_holding_a_gpu_twice_on_a_busy_mixed_replay(recording):
    rng = random.Random(3)
    nodes = [node(f"g{i}", "a10", 8, cpu=64000, mem=512_000) for i in range(4)] + \
            [node(f"t{i}", "t4", 4, cpu=32000, mem=256_000) for i in range(3)]
    pods = []
    for k in range(220):
        gpus, milli = rng.choice([(1, 1000), (1, 1000), (2, 1000), (1, 500), (1, 300), (4, 1000), (8, 1000), (0, 1000)])
        pods.append(SimPod(f"p{k}", gpus, gpu_milli=milli, creation_s=k * 30.0, duration_s=rng.uniform(200, 4000),
                           cpu_milli=rng.choice([1000, 4000, 8000]), memory_mib=rng.choice([1000, 16000])))
    load = own_times(pods, 44) * 0.3  # busy, with free GPUs left to move pods to
    s = run_replay(nodes, pods, GpuplacePolicy(ENGINE, defrag=True), ENGINE, load, 0)
    [d] = recording
    assert d.plans and s.defrag_moves == sum(len(p.moves) for p in d.plans) > 0
    assert s.defrag_started == len(d.plans) and d.mismatched == 0
    assert (s.overcommitted_gpus, s.overcommitted_pods, s.overcommitted_milli) == (0, 0, 0)
    assert s.placed + s.unplaced == sum(1 for p in pods if p.gpus)


def place_each(c, pods):
    """Pod k on node k, on the units the device plugin would give it: the running pods by name."""
    running = {}
    for i, p in enumerate(pods):
        units = c.units_for(i, p)
        c.place(i, p, units)
        running[p.name] = Placement(p, i, units, 0.0)
    return running


def test_a_plan_that_would_leave_a_node_short_of_cpu_is_refused_and_nothing_moves():
    nodes = [node("a", "a10", 2, cpu=8000), node("b", "a10", 2, cpu=8000)]
    c = Cluster(nodes, CAT, ENGINE.policy)
    pol = GpuplacePolicy(ENGINE, defrag=True)
    # a holds x (1 GPU, 1 CPU), b holds y (1 GPU, all 8 CPUs): moving x to b leaves b short of CPU,
    # moving y to a leaves a short of CPU
    x, y = SimPod("x", 1, cpu_milli=1000), SimPod("y", 1, cpu_milli=8000)
    running = place_each(c, (x, y))
    d = Defrag(pol, c)
    free_before = c.milli_free.copy()
    assert d.make_room(SimPod("big", 2, cpu_milli=1000), running) is None
    assert d.refused >= 1 and d.moves == 0 and np.array_equal(c.milli_free, free_before)
    assert (running["x"].node, running["y"].node) == (0, 1)
    check_bookkeeping(c, running)
    # without the CPU limit the same cluster gets room by one move
    c2 = Cluster([node("a", "a10", 2), node("b", "a10", 2)], CAT, ENGINE.policy)
    running2 = place_each(c2, (x, y))
    d2 = Defrag(pol, c2)
    choice = d2.make_room(SimPod("big", 2), running2)
    assert choice is not None and d2.moves == 1 and len(choice[1]) == 2
    check_bookkeeping(c2, running2)


def test_a_gpu_sharing_pod_is_not_planned_for_but_sharing_pods_may_be_moved():
    assert not Defrag.plans_for(SimPod("half", 1, gpu_milli=500))
    assert not Defrag.plans_for(SimPod("cpu", 0))
    assert Defrag.plans_for(SimPod("one", 1))
    c = Cluster([node("a", "a10", 2), node("b", "a10", 1)], CAT, ENGINE.policy)
    running = {}
    # a: a 500-milli pod on one GPU, the other free; b: its one GPU free. A 2-GPU pod fits nowhere.
    half = SimPod("half", 1, gpu_milli=500)
    units = c.units_for(0, half)
    c.place(0, half, units)
    running["half"] = Placement(half, 0, units, 0.0)
    d = Defrag(GpuplacePolicy(ENGINE, defrag=True), c)
    choice = d.make_room(SimPod("big", 2), running)
    assert choice is not None and choice[0] == 0 and d.moves == 1
    assert running["half"].node == 1 and c.on_unit[1][0] == {"half": 500}
    check_bookkeeping(c, running)
    c.place(choice[0], SimPod("big", 2), choice[1])  # raises if a GPU were held already
    assert c.gpu_free.tolist() == [0, 0]


def test_the_report_shows_moves_only_for_the_policy_with_defrag_and_a_run_without_is_unchanged():
    nodes = [node("a", "a10", 4), node("b", "a10", 4)]
    pods = spread_trace()
    load = own_times(pods, 8)
    policies = [GpuplacePolicy(ENGINE), GpuplacePolicy(ENGINE, name=DEFRAG_POLICY, defrag=True)]
    r = simulate(nodes, policies, ENGINE, mode="replay", loads=[load], seeds=[0], pods_for_seed=lambda s, l: pods)
    r.meta = {"mode": "replay"}
    doc = report.to_json(r)
    key = report.load_key(load)
    assert "defrag_moves" not in doc["policies"]["gpuplace"][key]
    assert "defrag_moves" not in doc["per_seed"]["gpuplace"][key][0]
    assert doc["policies"][DEFRAG_POLICY][key]["defrag_moves"] == 2
    assert doc["per_seed"][DEFRAG_POLICY][key][0]["defrag_started"] == 1
    table = report.render_table(r)
    assert "moves" in table.splitlines()[0]
    without = RunResult({"gpuplace": r.snapshots["gpuplace"]}, {"gpuplace": 0.0}, [0], {"mode": "replay"})
    assert "moves" not in report.render_table(without).splitlines()[0]


def test_simulate_defrag_runs_in_replay_mode_only():
    base = [sys.executable, "-m", "scheduler_extender.gpuplace_cli", "simulate", "--trace", "llm", "--defrag",
            "--repeats", "1", "--baselines", "none"]
    r = subprocess.run(base, capture_output=True, text=True)
    assert r.returncode == 2 and "--defrag applies with --mode replay only" in r.stderr
    r = subprocess.run([*base, "--mode", "replay", "--llm-pods", "60", "--load", "1.5", "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "gpuplace+defrag" in r.stdout and "moves" in r.stdout
