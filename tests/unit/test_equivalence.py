"""The grouped filter (one ``filter_node`` per equivalence class) decides every node exactly as the
direct filter does: same verdict, reasons, resolvability, chosen-unit properties and score."""

import dataclasses
import datetime as dt
import random

import pytest
import yaml

from benchmarks.cluster import POD_MIX, generate_cluster, pod as bench_pod
from node_agent.inventory import parse_inventory
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.devices import NodeAllocation, NodeState, allocation_from_inventory, build_node_view
from scheduler_extender.core.score import free_models
from scheduler_extender.served.grouped import GroupedEngine, memo_free_models, with_host
from scheduler_extender.served.equivalence import _unit_properties, state_key
from scheduler_extender.core.policy import default_policy, parse_policy
from scheduler_extender.core.workload import DemandShape, WorkloadProfile
from tests.factories import EXAMPLES, example_inventory, gpu, inventory, pod, with_nvlink_clique

CAT = default_catalog()


def state_of(doc, allocation=None):
    view = build_node_view(parse_inventory(doc), CAT)
    return NodeState(view.name, view, allocation if allocation is not None else allocation_from_inventory(view))


def cluster_states():
    """A generated cluster, the example cluster, and nodes that break symmetry on purpose."""
    states = [state_of(d) for d in generate_cluster(300, seed=7, allocated_share=0.4)]
    states += [state_of(example_inventory(p.stem)) for p in sorted((EXAMPLES / "cluster").glob("*.json"))]
    rng = random.Random(3)
    a6000 = dict(name="NVIDIA RTX A6000", memory_mib=49140, eccEnabled=True, computeCapability="8.6")
    for i in range(12):
        gs = [gpu(k, **a6000) for k in range(8)]
        for k, g in enumerate(gs):  # NVLink bridges join pairs
            g["nvlinks"] = [{"peerUuid": gs[k ^ 1]["uuid"], "links": 4}]
        if i % 3 == 0:
            gs[5]["healthy"] = False
            gs[5]["healthReasons"] = ["XID 79"]
        held = {gs[k]["uuid"]: f"t/p{k}" for k in rng.sample(range(8), rng.randrange(6))}
        view = build_node_view(parse_inventory(inventory(f"pairs-{i}", gs)), CAT)
        anonymous = {"nvidia.com/gpu": 1} if i % 4 == 1 else {}
        states.append(NodeState(view.name, view, NodeAllocation(held=held, anonymous=anonymous)))
    mixed = [gpu(k, name="NVIDIA A100-SXM4-80GB", memory_mib=81920) for k in range(4)]
    mixed += [gpu(k, name="NVIDIA H100 80GB HBM3", memory_mib=81559) for k in range(4, 8)]
    states.append(state_of(inventory("mixed-models", with_nvlink_clique(mixed))))
    states.append(NodeState("no-inventory", None))
    states.append(NodeState("bad-inventory", None, inventory_error="gpus.0.memoryMiB: field required"))
    return states


def pods():
    out = [bench_pod(i, a, r, n) for i, (a, r, n, _) in enumerate(POD_MIX)]
    out += [yaml.safe_load(p.read_text()) for p in sorted((EXAMPLES / "pods").glob("*.yaml"))]
    out += [
        pod({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "training", "gpuplace.io/prefer": "nvlink,ecc"},
            gpus=2),
        pod({"gpuplace.io/model-params": "3B", "gpuplace.io/require": "mig"}),
        pod({"gpuplace.io/require": "nvlink"}, gpus=2),
        pod({"gpuplace.io/model-params": "13 billion"}),
        pod({"gpuplace.io/prefer": "full-gpu"}, gpus=3),
        pod(None, gpus=None),
    ]
    for p in out:  # YAML reads GPU counts as ints; the scheduler sends strings
        for c in p["spec"]["containers"]:
            lim = c.get("resources", {}).get("limits", {})
            c["resources"]["limits"] = {k: str(v) for k, v in lim.items()}
    return out


def assert_same_decisions(engine, states, now=None, workload=None):
    for p in pods():
        job = engine.job(p)
        direct = engine.filter(job, states, now)
        grouped = engine.filter_grouped(job, states, now)
        assert len(grouped.group_of) == len(states)
        for i, d in enumerate(direct):
            g = grouped.results[grouped.group_of[i]]
            where = f"pod {p['metadata']['name']} on {d.node} (class of {g.node})"
            assert (g.passed, g.reason, g.unresolvable, g.untouched) == (d.passed, d.reason, d.unresolvable, d.untouched), where
            assert sorted(map(_unit_properties, g.chosen)) == sorted(map(_unit_properties, d.chosen)), where
        direct_scores = Engine(engine.policy, engine.catalog).score(job, states, direct, workload)  # no served memo
        scored = engine.score_grouped(job, grouped, workload)
        for i, s in enumerate(states):
            d = direct_scores.get(s.name)
            g = scored.scores[scored.score_of[i]]
            assert (d is None) == (g is None), s.name
            if d is not None:
                assert (g.score, dict(g.components), g.cost_per_hour) == (d.score, dict(d.components), d.cost_per_hour), (
                    f"pod {p['metadata']['name']} on {s.name}")


def test_grouped_filter_and_score_equal_the_direct_ones_on_every_node():
    assert_same_decisions(GroupedEngine(), cluster_states())


def test_a_generated_cluster_collapses_into_few_classes():
    states = [state_of(d) for d in generate_cluster(1000)]
    job = GroupedEngine().job(pod({"gpuplace.io/model-params": "7B"}))
    grouped = GroupedEngine().filter_grouped(job, states, None)
    assert len(grouped.results) < len(states) / 5


def test_after_a_node_state_changes_its_new_state_is_decided_anew():
    engine = GroupedEngine()
    states = cluster_states()
    h100 = next(i for i, s in enumerate(states) if s.view and s.view.description == "8x NVIDIA H100 80GB HBM3")
    states[h100] = dataclasses.replace(states[h100], allocation=NodeAllocation())
    p = pod({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "training", "gpuplace.io/sharding": "zero3",
             "gpuplace.io/precision": "bf16", "gpuplace.io/require": "nvlink"}, gpus=4)
    job = engine.job(p)
    before = engine.filter_grouped(job, states, None)
    assert before.results[before.group_of[h100]].passed
    old = states[h100]
    held = {u.uuid: "ns/other" for u in old.view.units("nvidia.com/gpu")[:6]}
    states[h100] = dataclasses.replace(old, allocation=NodeAllocation(held=held))
    after = engine.filter_grouped(job, states, None)
    result = after.results[after.group_of[h100]]
    assert not result.passed and "2 of 8 eligible GPUs free" in result.reason
    assert state_key(states[h100], "nvidia.com/gpu") != state_key(old, "nvidia.com/gpu")
    assert_same_decisions(engine, states)


def test_after_a_policy_swap_the_new_engine_decides_by_the_new_policy():
    states = cluster_states()
    p = pod({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"})
    old = GroupedEngine()
    raw = default_policy().model_dump(by_alias=True, mode="json")
    for cls in raw["classes"]:
        cls["deniedModels"] = [*cls.get("deniedModels", []), "rtx-4090"]
    new = GroupedEngine(parse_policy(raw))
    def passing(engine):
        g = engine.filter_grouped(engine.job(p), states, None)
        return {s.name for s, k in zip(states, g.group_of) if g.results[k].passed}
    assert any("4090" in n.view.description for n in states if n.name in passing(old) and n.view)
    assert not any("4090" in n.view.description for n in states if n.name in passing(new) and n.view)
    assert_same_decisions(new, states)


def test_stale_inventories_are_decided_per_node_with_their_own_age():
    docs = generate_cluster(40)
    for i, d in enumerate(docs):
        d["observedAt"] = f"2026-11-21T08:{i:02d}:00Z"
    states = [state_of(d) for d in docs]
    now = dt.datetime(2026, 11, 21, 8, 30, tzinfo=dt.timezone.utc)
    engine = GroupedEngine()
    assert_same_decisions(engine, states, now)
    g = engine.filter_grouped(engine.job(pod({"gpuplace.io/vram": "1Gi"})), states, now)
    stale = [g.results[k].reason for k in g.group_of if "stale" in (g.results[k].reason or "")]
    assert len(set(stale)) == len(stale) > 1


@pytest.mark.parametrize("field", ["healthy", "ecc"])
def test_nodes_that_differ_in_one_unit_property_are_not_merged(field):
    base = [gpu(k, name="NVIDIA L4", memory_mib=23034, eccEnabled=True, computeCapability="8.9") for k in range(8)]
    other = [dict(g) for g in base]
    other[3] = {**other[3], **({"healthy": False} if field == "healthy" else {"eccEnabled": False})}
    a, b = state_of(inventory("a", base)), state_of(inventory("b", other))
    assert state_key(a, "nvidia.com/gpu") != state_key(b, "nvidia.com/gpu")


def test_a_stale_node_asked_again_later_reports_its_new_age():
    docs = generate_cluster(10)
    for d in docs:
        d["observedAt"] = "2026-11-21T08:00:00Z"
    states = [state_of(d) for d in docs]
    engine = GroupedEngine()
    job = engine.job(pod({"gpuplace.io/vram": "1Gi"}))
    now = dt.datetime(2026, 11, 21, 9, 0, tzinfo=dt.timezone.utc)
    for later in (now, now + dt.timedelta(seconds=60)):
        grouped = engine.filter_grouped(job, states, later)
        direct = engine.filter(job, states, later)
        assert [grouped.results[g].reason for g in grouped.group_of] == [d.reason for d in direct]
    assert "observed 3660 s ago" in direct[0].reason


def test_free_cpu_and_memory_split_classes_only_for_the_score_and_only_when_fragmentation_applies():
    # Nodes alike but for their free CPU/memory share filter verdicts; with a learned workload the
    # fragmentation component reads CPU/memory, and the score must still equal the direct one.
    rng = random.Random(11)
    base = cluster_states()
    # 8000 and 12000 fall between the same requests (4000, 16000), which the host-stranding term
    # still tells apart (it divides free CPU by the mean request per GPU).
    states = [dataclasses.replace(s, cpu_milli_free=rng.choice([None, 2000, 8000, 12000, 64000]),
                                  memory_bytes_free=rng.choice([None, 8 * 2**30, 512 * 2**30])) for s in base]
    grouped = GroupedEngine().filter_grouped(GroupedEngine().job(pods()[0]), states, None)
    assert len(grouped.results) == len(GroupedEngine().filter_grouped(GroupedEngine().job(pods()[0]), base, None).results)
    workload = WorkloadProfile(((DemandShape("nvidia.com/gpu", 1, 4000, 16 * 2**30), 1.0),
                                (DemandShape("nvidia.com/gpu", 2, 16000, 64 * 2**30), 1.0)), version=1)
    assert_same_decisions(GroupedEngine(), states, workload=workload)


def test_a_state_under_another_nodes_name_and_host_keeps_every_other_field():
    state = dataclasses.replace(cluster_states()[0], inventory_error=None, cpu_milli_free=1000, memory_bytes_free=2)
    moved = with_host(state, "elsewhere", 3000, 4)
    assert (moved.name, moved.cpu_milli_free, moved.memory_bytes_free) == ("elsewhere", 3000, 4)
    for f in dataclasses.fields(state):
        if f.name not in ("name", "cpu_milli_free", "memory_bytes_free"):
            assert getattr(moved, f.name) is getattr(state, f.name), f.name


def _with_units(view, resource, change):
    """``view`` with ``change(i, unit)`` applied to each unit of ``resource`` (a fresh view, fresh caches)."""
    units = tuple(change(i, u) for i, u in enumerate(view.units(resource)))
    return dataclasses.replace(view, units_by_resource={**view.units_by_resource, resource: units})


def _h100_state():
    doc = inventory("h100", with_nvlink_clique([gpu(k, name="NVIDIA H100 80GB HBM3", memory_mib=81559) for k in range(8)]))
    return state_of(doc)


def test_every_unit_field_but_the_structural_and_often_changing_ones_is_part_of_the_class_key():
    from scheduler_extender.core.criteria import OFTEN_CHANGING_UNIT_FIELDS
    from scheduler_extender.served.equivalence import STRUCTURAL_UNIT_FIELDS, unit_key_fields

    base = _h100_state()
    resource = "nvidia.com/gpu"
    one = base.view.units(resource)[0]
    assert OFTEN_CHANGING_UNIT_FIELDS == {"temperature_c"}
    assert set(unit_key_fields()) == ({f.name for f in dataclasses.fields(one)} - set(STRUCTURAL_UNIT_FIELDS)
                                      - OFTEN_CHANGING_UNIT_FIELDS)
    changed = {"kind": "mig", "vendor": "amd", "name": "NVIDIA H100 NVL", "entry": None, "mig_profile": "7g.80gb",
               "memory_bytes": one.memory_bytes - 1, "healthy": False, "health_reason": "XID 79",
               "ecc_enabled": not one.ecc_enabled, "compute_capability": (9, 1), "cost_fraction": 0.5,
               "memory_bandwidth_gbps": 1.0, "bf16_tflops": 1.0, "power_limit_w": 350.0}
    assert set(changed) == set(unit_key_fields()), "a new Unit field: add a value that differs here"
    same = NodeState("twin", _with_units(base.view, resource, lambda i, u: u), base.allocation)
    assert state_key(same, resource) == state_key(base, resource)
    for field, value in changed.items():
        view = _with_units(base.view, resource, lambda i, u: dataclasses.replace(u, **{field: value}) if i == 3 else u)
        other = NodeState("other", view, base.allocation)
        assert state_key(other, resource) != state_key(base, resource), field


def test_a_criterion_on_a_new_unit_field_splits_otherwise_identical_gpus_into_classes():
    @dataclasses.dataclass(frozen=True)
    class NumaUnit(type(_h100_state().view.units("nvidia.com/gpu")[0])):
        numa_node: int | None = None

    base = _h100_state()
    resource = "nvidia.com/gpu"

    def placed(numa):
        view = _with_units(base.view, resource, lambda i, u: NumaUnit(
            **{f.name: getattr(u, f.name) for f in dataclasses.fields(u)}, numa_node=numa[i]))
        return NodeState("p", view, base.allocation)

    full, capped, full_again = placed([0] * 4 + [1] * 4), placed([0] * 3 + [1] * 5), placed([0] * 4 + [1] * 4)
    assert state_key(full, resource) != state_key(capped, resource)


def test_a_new_criterion_on_the_power_limit_is_decided_right_per_node_with_no_change_to_the_equivalence_layer(monkeypatch):
    """Issue 16's acceptance: a newcomer's criterion (a maximum power limit) is one function and
    one row of UNIT_CRITERIA; nodes whose GPUs differ only in that field are not merged."""
    from scheduler_extender.core import criteria

    def check_max_power(unit, job):
        if unit.power_limit_w is not None and unit.power_limit_w > 400:
            return f"power limit {unit.power_limit_w:g} W > 400 W"
        return None

    monkeypatch.setattr(criteria, "UNIT_CRITERIA", (*criteria.UNIT_CRITERIA, ("max-power", check_max_power)))
    h100 = dict(name="NVIDIA H100 80GB HBM3", memory_mib=81559)

    def node(name, limits):
        return state_of(inventory(name, with_nvlink_clique([gpu(k, powerLimitW=w, **h100) for k, w in enumerate(limits)])))

    states = [node("capped", [350.0] * 8), node("full", [700.0] * 8), node("five-capped", [350.0] * 5 + [700.0] * 3),
              node("capped-too", [350.0] * 8), node("unknown", [None] * 8)]
    engine = GroupedEngine()
    job = engine.job(pod({"gpuplace.io/model-params": "7B"}, gpus=4))
    grouped = engine.filter_grouped(job, states, None)
    verdicts = {s.name: grouped.results[g] for s, g in zip(states, grouped.group_of)}
    assert {n: r.passed for n, r in verdicts.items()} == {
        "capped": True, "full": False, "five-capped": False, "capped-too": True, "unknown": True}
    assert verdicts["full"].reason == "GPU 0-7: power limit 700 W > 400 W"
    assert verdicts["five-capped"].reason == "GPU 5-7: power limit 700 W > 400 W"
    assert grouped.group_of[0] == grouped.group_of[3] and len(set(grouped.group_of)) == 4
    direct = engine.filter(job, states, None)
    assert [(d.passed, d.reason) for d in direct] == [(verdicts[s.name].passed, verdicts[s.name].reason) for s in states]


def test_free_devices_are_remembered_per_state_and_equal_the_plain_reading():
    states = cluster_states()
    for s in states:
        for resource in ("nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "amd.com/gpu"):
            first = memo_free_models(s, resource)
            assert first == free_models(s, resource), (s.name, resource)
            assert memo_free_models(s, resource) is first  # read once per state
    # A state with one GPU more held is another object: its own reading, not the first state's.
    s = next(s for s in states if free_models(s, "nvidia.com/gpu")[0])
    uuid = next(iter(free_models(s, "nvidia.com/gpu")[0]))
    held = dataclasses.replace(s, allocation=NodeAllocation(held={**s.allocation.held, uuid: "ns/other"}))
    assert memo_free_models(held, "nvidia.com/gpu") == free_models(held, "nvidia.com/gpu") != memo_free_models(s, "nvidia.com/gpu")


def test_a_pod_without_devices_is_scored_once_per_kind_of_node_as_on_each_node_alone():
    # Three nodes of each state, under their own names, with free CPU/memory from a few values:
    # nodes alike in what the score reads of them share a score; every node's equals the plain one.
    rng = random.Random(5)
    states = [dataclasses.replace(s, name=f"{s.name}-{k}", cpu_milli_free=rng.choice([None, 2000, 64000]),
                                  memory_bytes_free=rng.choice([8 * 2**30, 512 * 2**30]))
              for k in range(3) for s in cluster_states()]
    workload = WorkloadProfile(((DemandShape("nvidia.com/gpu", 1, 4000, 16 * 2**30), 1.0),
                                (DemandShape("nvidia.com/gpu", 2, 16000, 64 * 2**30), 1.0)), version=1)
    engine = GroupedEngine()
    cpu_only = pod(None, gpus=None)
    cpu_only["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "3", "memory": "12Gi"}
    job = engine.job(cpu_only)
    scored = engine.score_grouped(job, engine.filter_grouped(job, states, None), workload)
    assert len(scored.scores) < len(states)
    plain = Engine(engine.policy, engine.catalog)
    direct = plain.score(job, states, plain.filter(job, states, None), workload)
    assert len({(sc.score, sc.best_rank) for sc in direct.values()}) > 2  # the nodes are told apart
    for i, s in enumerate(states):
        got, want = scored.scores[scored.score_of[i]], direct.get(s.name)
        assert (got is None) == (want is None), s.name
        if want is not None:
            assert (got.score, dict(got.components), got.best_rank) == (want.score, dict(want.components), want.best_rank), s.name
