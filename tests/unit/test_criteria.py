"""Criteria declared once (``core.criteria``): the "maximum GPU temperature" criterion, added as the
design page says (docs/design.md, "Adding a criterion"), and what the declarations derive."""

from __future__ import annotations

import dataclasses

import pytest

from node_agent.inventory import parse_inventory
from scheduler_extender.core import criteria
from scheduler_extender.core.annotations import BUILTIN_ANNOTATIONS
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.components import COMPONENTS
from scheduler_extender.core.criteria import A_MAX_TEMPERATURE, C_TEMPERATURE
from scheduler_extender.core.devices import NodeState, allocation_from_inventory, build_node_view
from scheduler_extender.core.policy import default_policy
from scheduler_extender.served.equivalence import state_keys
from scheduler_extender.served.grouped import GroupedEngine, group_nodes
from scheduler_extender.service.explain import explain_decision
from tests.factories import gpu, inventory, pod

CAT = default_catalog()
A100 = dict(name="NVIDIA A100-SXM4-80GB", memory_mib=81920)


def state_of(doc):
    view = build_node_view(parse_inventory(doc), CAT)
    return NodeState(view.name, view, allocation_from_inventory(view))


def node(name, temperatures, **extra):
    """A node of A100s whose GPUs the agent observed at ``temperatures`` (None: unknown)."""
    gpus = [gpu(k, temperatureC=t, **A100, **extra) if t is not None else gpu(k, **A100, **extra)
            for k, t in enumerate(temperatures)]
    return state_of(inventory(name, gpus))


def mig_node(name, temperature):
    mig = [{"uuid": f"MIG-{name}-{i}", "profile": "3g.40gb", "memoryMiB": 40192} for i in range(2)]
    extra = {"temperatureC": temperature} if temperature is not None else {}
    return state_of(inventory(name, [gpu(0, migEnabled=True, migDevices=mig, **A100, **extra)], migStrategy="mixed"))


def test_the_temperature_in_the_inventory_reaches_each_unit_a_mig_device_its_parent_gpus():
    s = node("n", [61, None])
    assert [u.temperature_c for u in s.view.units("nvidia.com/gpu")] == [61, None]
    m = mig_node("m", 77)
    assert [u.temperature_c for u in m.view.units("nvidia.com/mig-3g.40gb")] == [77, 77]


def test_the_annotation_is_parsed_and_refused_with_its_accepted_form():
    engine = GroupedEngine()
    job = engine.job(pod({A_MAX_TEMPERATURE: " 80 "}))
    assert job.errors == () and job.req.value(A_MAX_TEMPERATURE) == 80
    for bad in ("hot", "80.5", "0", "151", "-3", "８０"):
        errors = engine.job(pod({A_MAX_TEMPERATURE: bad})).errors
        assert [e.field for e in errors] == [A_MAX_TEMPERATURE], bad
        assert "is not whole degrees Celsius from 1 to 150, e.g. 80" in str(errors[0]), bad


def test_unknown_key_detection_knows_the_declared_annotation_and_suggests_it_for_a_typo():
    engine = GroupedEngine()
    assert A_MAX_TEMPERATURE in {a.key for a in criteria.ANNOTATIONS}
    assert A_MAX_TEMPERATURE not in {a.key for a in BUILTIN_ANNOTATIONS}
    assert engine.job(pod({A_MAX_TEMPERATURE: "80"})).errors == ()
    (error,) = engine.job(pod({"gpuplace.io/max-gpu-temperatur-c": "80"})).errors
    assert str(error).endswith(f"did you mean {A_MAX_TEMPERATURE}?")


def test_a_hot_gpu_or_an_unknown_temperature_fails_the_limit_and_explain_names_the_criterion():
    engine = GroupedEngine()
    job = engine.job(pod({A_MAX_TEMPERATURE: "80"}, gpus=2))
    states = [node("cool", [40, 45]), node("one-hot", [40, 91]), node("two-hot", [85, 91]), node("unknown", [None, 50])]
    decision = engine.decide(pod({A_MAX_TEMPERATURE: "80"}, gpus=2), states, None)
    out = explain_decision(decision, engine.policy)
    by_node = {n["node"]: n for n in out["nodes"]}
    assert by_node["cool"]["passed"]
    assert by_node["one-hot"]["reasons"][0] == {
        "criterion": C_TEMPERATURE, "message": f"GPU 1: 91 °C > 80 °C ({A_MAX_TEMPERATURE})", "resolvable": False}
    assert [r["message"] for r in by_node["two-hot"]["reasons"]] == [
        f"GPU 0: 85 °C > 80 °C ({A_MAX_TEMPERATURE})", f"GPU 1: 91 °C > 80 °C ({A_MAX_TEMPERATURE})"]
    assert by_node["unknown"]["reasons"][0]["message"] == f"GPU 0: GPU temperature unknown ({A_MAX_TEMPERATURE}: 80)"
    assert engine.filter(job, states, None)[0].passed


def fleet():
    """Nodes alike but for their GPUs' temperatures (which change at every probe), plus MIG nodes."""
    temps = [[40] * 4, [40, 41, 39, 40], [85] * 4, [40, 40, 40, 95], [None] * 4, [79, 80, 81, 40], [40] * 4]
    return ([node(f"n{i}", t) for i, t in enumerate(temps)]
            + [mig_node("m-cool", 50), mig_node("m-hot", 90), mig_node("m-unknown", None)])


@pytest.mark.parametrize("annotations, gpus, resource", [
    ({A_MAX_TEMPERATURE: "80"}, 1, "nvidia.com/gpu"),
    ({A_MAX_TEMPERATURE: "80"}, 3, "nvidia.com/gpu"),
    ({A_MAX_TEMPERATURE: "40", "gpuplace.io/model-params": "7B"}, 2, "nvidia.com/gpu"),
    ({A_MAX_TEMPERATURE: "60"}, 1, "nvidia.com/mig-3g.40gb"),
    ({}, 2, "nvidia.com/gpu"),
])
def test_the_grouped_path_equals_the_plain_path_node_by_node_whatever_the_temperatures(annotations, gpus, resource):
    engine = GroupedEngine()
    states = fleet()
    for _ in range(2):  # the second time from the engine's memos
        job = engine.job(pod(annotations, gpus=gpus, resource=resource))
        grouped = engine.filter_grouped(job, states, None)
        got = [grouped.results[g] for g in grouped.group_of]
        plain = engine.filter(job, states, None)
        assert [(s.name, r.passed, r.reason) for s, r in zip(states, got)] == [
            (s.name, r.passed, r.reason) for s, r in zip(states, plain)]
        # The memos must not carry one node's temperature verdict to another: a second job kind too.
        engine.filter_grouped(engine.job(pod({}, gpus=gpus, resource=resource)), states, None)


def test_a_changing_temperature_never_splits_the_equivalence_classes():
    states = fleet()
    without = [dataclasses.replace(s, view=dataclasses.replace(s.view, units_by_resource={
        r: tuple(dataclasses.replace(u, temperature_c=None) for u in us) for r, us in s.view.units_by_resource.items()}))
        for s in states]
    for resource in ("nvidia.com/gpu", "nvidia.com/mig-3g.40gb"):
        keys = state_keys(states, resource)
        assert keys == state_keys(without, resource)
        assert len(set(keys)) == len(group_nodes(states, keys).class_keys) == 2  # A100 nodes, MIG nodes


def test_every_criterion_and_component_is_declared_once_and_the_tables_are_derived_from_the_declarations():
    names = [c.name for c in criteria.CRITERIA]
    assert len(names) == len(set(names)) and C_TEMPERATURE in names
    assert [n for n, _ in criteria.UNIT_CRITERIA] == [c.name for c in criteria.CRITERIA if c.check is not None]
    keys = [a.key for a in criteria.ANNOTATIONS]
    assert len(keys) == len(set(keys))
    assert list(default_policy().scoring.by_component()) == [c.name for c in COMPONENTS]
    assert default_policy().scoring.by_component() == {c.name: c.default_weight for c in COMPONENTS}
