"""Premium GPUs as a last resort (a class's ``lastResortModels``, ``core.score``) and an explicit
``gpuplace.io/gpu-models`` honored over an inferred size class (``core.job``)."""

import copy

import pytest
import yaml

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.devices import NodeAllocation, NodeState, build_node_view
from scheduler_extender.served.grouped import GroupedEngine
from scheduler_extender.core.filter import C_CLASS
from scheduler_extender.core.policy import PolicyError, parse_policy
from scheduler_extender.gpuplace_cli import render_decision
from scheduler_extender.service.explain import explain_decision
from node_agent.inventory import parse_inventory
from tests.factories import ROOT, gpu, inventory, pod

CAT = default_catalog()
DEFAULT = yaml.safe_load((ROOT / "scheduler_extender" / "data" / "default-policy.yaml").read_text())
PREMIUM = ["H100", "H200", "H800", "H20", "A100-80GB", "A800", "B200", "B300", "GB200", "GB300", "MI300X", "MI325X", "MI355X"]
H100 = dict(name="NVIDIA H100 80GB HBM3", memory_mib=81559, eccEnabled=True, computeCapability="9.0")
A100 = dict(name="NVIDIA A100-SXM4-80GB", memory_mib=81920, eccEnabled=True, computeCapability="8.0")
RTX4090 = dict(name="NVIDIA GeForce RTX 4090", memory_mib=24564, eccEnabled=False, computeCapability="8.9")
LORA_7B = {"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"}  # 18.1 GiB: class small


def last_resort_policy():
    doc = copy.deepcopy(DEFAULT)
    for cls in doc["classes"]:
        if cls["name"] in ("small", "medium"):
            cls.pop("deniedModels", None)
            cls["lastResortModels"] = PREMIUM
    return parse_policy(doc)


def node(name, spec, n=4, held=0):
    units = [gpu(i, **spec) for i in range(n)]
    view = build_node_view(parse_inventory(inventory(name, units)), CAT)
    return NodeState(name, view, NodeAllocation(anonymous={"nvidia.com/gpu": held}) if held else NodeAllocation())


def decide(engine, p, states):
    return engine.decide(p, states, None)


def test_a_small_job_scores_premium_gpus_0_while_a_cheaper_gpu_that_fits_is_free():
    engine = GroupedEngine(last_resort_policy())
    d = decide(engine, pod(LORA_7B), [node("h100", H100, 8), node("a100", A100, 8), node("rtx", RTX4090)])
    assert all(r.passed for r in d.results)
    assert d.scores["h100"].score == 0 and d.scores["h100"].last_resort
    assert d.scores["a100"].score == 0 and d.scores["a100"].last_resort
    assert d.scores["rtx"].score >= 1 and not d.scores["rtx"].last_resort
    assert d.best().node == "rtx"


def test_with_every_cheaper_gpu_busy_the_premium_gpus_are_scored_as_usual_and_the_pod_is_placed():
    engine = GroupedEngine(last_resort_policy())
    d = decide(engine, pod(LORA_7B), [node("h100", H100, 8), node("a100", A100, 8), node("rtx", RTX4090, held=4)])
    assert not d.results[2].passed
    assert not any(s.last_resort for s in d.scores.values())
    assert d.best().node == "a100"  # the cheaper of the two premium GPUs
    assert d.scores["a100"].score > 0


def denied_policy():
    """The default with premium GPUs reserved outright for class large (``deniedModels``)."""
    doc = copy.deepcopy(DEFAULT)
    for cls in doc["classes"]:
        if cls["name"] in ("small", "medium"):
            cls["deniedModels"] = cls.pop("lastResortModels")
    return parse_policy(doc)


def test_the_default_policy_gives_small_jobs_a_premium_gpu_only_when_no_cheaper_one_is_free():
    busy = decide(GroupedEngine(), pod(LORA_7B), [node("h100", H100, 8), node("rtx", RTX4090, held=4)])
    assert busy.results[0].passed and busy.best().node == "h100"
    free = decide(GroupedEngine(), pod(LORA_7B), [node("h100", H100, 8), node("rtx", RTX4090)])
    assert free.best().node == "rtx" and free.scores["h100"].score == 0 and free.scores["h100"].last_resort


def test_a_policy_that_denies_premium_gpus_to_small_jobs_still_can():
    d = decide(GroupedEngine(denied_policy()), pod(LORA_7B), [node("h100", H100, 8), node("rtx", RTX4090, held=4)])
    assert not d.results[0].passed and C_CLASS in {x.criterion for x in d.results[0].rejections}


def test_explain_says_which_nodes_the_last_resort_rule_scored_0():
    engine = GroupedEngine(last_resort_policy())
    d = decide(engine, pod(LORA_7B), [node("h100", H100, 8), node("rtx", RTX4090)])
    text = render_decision(d, engine.policy)
    assert "-> 0: last resort" in text.split("PASS h100")[1].splitlines()[0]
    assert "a model class small keeps for when no other node passes (lastResortModels)" in text
    doc = explain_decision(d, engine.policy)
    by_node = {n["node"]: n for n in doc["nodes"]}
    assert by_node["h100"]["lastResort"] is True and "lastResort" not in by_node["rtx"]


def test_the_grouped_path_gives_the_plain_paths_scores_under_the_last_resort_rule():
    engine = GroupedEngine(last_resort_policy())
    states = [node("h100-0", H100, 8), node("h100-1", H100, 8), node("rtx-0", RTX4090), node("rtx-1", RTX4090, held=2),
              node("rtx-2", RTX4090, held=4)]
    job = engine.job(pod(LORA_7B))
    plain = engine.score(job, states, engine.filter(job, states, None))
    grouped = engine.filter_grouped(job, states, None)
    scored = engine.score_grouped(job, grouped)
    got = {n: scored.scores[g].score for n, g in zip(grouped.names, scored.score_of) if scored.scores[g] is not None}
    assert got == {n: s.score for n, s in plain.items()}
    assert got["h100-0"] == got["h100-1"] == 0


def test_an_unknown_last_resort_model_is_refused_naming_the_field():
    doc = copy.deepcopy(DEFAULT)
    doc["classes"][1]["lastResortModels"] = ["H100X"]
    with pytest.raises(PolicyError, match=r"classes\.1\.lastResortModels\.0: 'H100X'"):
        parse_policy(doc)


def test_an_explicit_gpu_models_list_is_honored_over_an_inferred_size_class():
    p = pod({**LORA_7B, "gpuplace.io/gpu-models": "A100-80GB"})
    d = decide(GroupedEngine(), p, [node("a100", A100, 8), node("rtx", RTX4090)])
    assert d.job.size_class.name == "small" and d.job.class_reason != "gpuplace.io/class"
    assert d.results[0].passed, d.results[0].reason
    assert not d.results[1].passed  # the pod's own list still rules the 4090 out


def test_a_pinned_class_keeps_its_denied_models_even_with_an_explicit_gpu_models_list():
    p = pod({**LORA_7B, "gpuplace.io/gpu-models": "A100-80GB", "gpuplace.io/class": "small"})
    d = decide(GroupedEngine(denied_policy()), p, [node("a100", A100, 8)])
    assert not d.results[0].passed and C_CLASS in {x.criterion for x in d.results[0].rejections}


def test_an_explicit_gpu_models_list_stays_within_the_namespaces_entitlement():
    doc = copy.deepcopy(DEFAULT)
    doc["defaultTenant"] = {"deniedModels": ["A100-80GB"]}
    p = pod({**LORA_7B, "gpuplace.io/gpu-models": "A100-80GB"})
    d = decide(GroupedEngine(parse_policy(doc)), p, [node("a100", A100, 8)])
    assert not d.results[0].passed and "not entitled" in d.results[0].reason
