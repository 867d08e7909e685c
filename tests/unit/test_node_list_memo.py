"""What the extender remembers between requests (the last NodeNames list, each pod's class verdicts)
never outlives a change: after a binding, a deletion, an inventory change, a relist or a policy
swap the answer is the one a freshly started extender gives."""

import datetime as dt
import json

import pytest

from scheduler_extender.core.pod import as_pod
from scheduler_extender.cluster.cache import CHANGE_LOG_SIZE, ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.served.grouped import GroupedEngine
from scheduler_extender.served.grouped import frozen_value
from scheduler_extender.core.policy import default_policy, parse_policy
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.cluster.sources import ClusterSource
from scheduler_extender.service.wire import parse_extender_args
from tests.factories import EXAMPLES, example_inventory, pod

CAT = default_catalog()
NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))


def node_obj(name, inv):
    inv = {**inv, "observedAt": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}  # fresh: cluster mode checks age
    return {"metadata": {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)}}}


def bound(name, node, gpus, phase="Running", ns="default"):
    p = pod(name=name, namespace=ns, gpus=gpus)
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": phase}
    return p


def cluster():
    cache = ClusterCache(CAT)
    cache.replace_nodes([node_obj(n, example_inventory(n)) for n in NODES])
    cache.replace_pods([])
    return cache


def ask(service, verb, p, names=NODES):
    return getattr(service, verb)(parse_extender_args(json.dumps({"Pod": p, "NodeNames": names}).encode()))


def fresh_answer(cache, verb, p, engine=None, names=NODES):
    return ask(ExtenderService(engine or GroupedEngine(), ClusterSource(cache, CAT)), verb, p, names)


EIGHT_GPU = {"gpuplace.io/model-params": "13B", "gpuplace.io/workload": "training", "gpuplace.io/sharding": "fsdp"}


def test_a_binding_between_two_requests_is_seen_by_the_second():
    cache = cluster()
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    p = pod(EIGHT_GPU, gpus=8, name="train")
    assert ask(service, "filter", p)["NodeNames"] == ["gpu-a100-80g-0"]
    cache.apply_pod_event("DELETED", p)  # frees its reservation (test_reservations)
    cache.apply_pod_event("ADDED", bound("other", "gpu-a100-80g-0", 1))
    second = ask(service, "filter", pod(EIGHT_GPU, gpus=8, name="train-2"))
    assert second["NodeNames"] == []
    assert "7 of 8 eligible GPUs free" in second["FailedNodes"]["gpu-a100-80g-0"]
    assert second == fresh_answer(cache, "filter", pod(EIGHT_GPU, gpus=8, name="train-2"))


def test_the_same_pod_asked_again_after_a_binding_gets_the_new_answer():
    cache = cluster()
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    p = pod(EIGHT_GPU, gpus=8, name="train")
    first = ask(service, "filter", p)
    cache.apply_pod_event("ADDED", bound("other", "gpu-a100-80g-0", 2))
    again = ask(service, "filter", p)
    assert first["NodeNames"] == ["gpu-a100-80g-0"] and again["NodeNames"] == []
    cache.apply_pod_event("DELETED", bound("other", "gpu-a100-80g-0", 2))
    assert ask(service, "filter", p) == first
    assert ask(service, "prioritize", p) == fresh_answer(cache, "prioritize", p)


def test_an_inventory_change_and_a_relist_are_seen():
    cache = cluster()
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    p = pod({"gpuplace.io/require": "nvlink"}, gpus=4, name="nv")
    assert "gpu-h100-0" in ask(service, "filter", p)["NodeNames"]
    inv = example_inventory("gpu-h100-0")
    for g in inv["gpus"]:
        g["nvlinks"] = []
    cache.apply_node_event("MODIFIED", node_obj("gpu-h100-0", inv))
    assert "gpu-h100-0" not in ask(service, "filter", p)["NodeNames"]
    cache.replace_pods([bound(f"h{i}", "gpu-a100-80g-0", 1) for i in range(3)])  # a relist: every state anew
    q = pod(EIGHT_GPU, gpus=8, name="train")
    assert ask(service, "filter", q) == fresh_answer(cache, "filter", q)


def test_a_policy_swap_is_seen_by_the_next_request_of_the_same_pod():
    cache = cluster()
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    p = pod({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"}, name="lora")
    assert {"gpu-4090-0", "gpu-4090-1"} <= set(ask(service, "filter", p)["NodeNames"])
    raw = default_policy().model_dump(by_alias=True, mode="json")
    for cls in raw["classes"]:
        cls["deniedModels"] = [*cls.get("deniedModels", []), "rtx-4090"]
    service.engine = new = GroupedEngine(parse_policy(raw))
    after = ask(service, "filter", p)
    assert not {"gpu-4090-0", "gpu-4090-1"} & set(after["NodeNames"])
    assert after == fresh_answer(cache, "filter", p, new)


def test_a_different_node_list_and_a_list_with_a_name_twice_are_answered_in_full():
    cache = cluster()
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    p = pod({"gpuplace.io/vram": "20Gi"}, name="small")
    ask(service, "filter", p)
    subset = NODES[:3]
    assert ask(service, "prioritize", p, subset) == fresh_answer(cache, "prioritize", p, names=subset)
    twice = NODES + NODES[:1]
    got = ask(service, "prioritize", p, twice)
    assert [h["Host"] for h in got] == twice
    assert got == fresh_answer(cache, "prioritize", p, names=twice)


def test_the_change_log_names_changed_nodes_and_gives_up_when_it_cannot():
    cache = cluster()
    start = cache.generation
    assert cache.changes_since(start) == (start, set())
    cache.apply_pod_event("ADDED", bound("a", "gpu-4090-0", 1))
    cache.apply_pod_event("ADDED", bound("b", "gpu-h100-0", 1))
    generation, changed = cache.changes_since(start)
    assert changed == {"gpu-4090-0", "gpu-h100-0"} and generation == cache.generation
    cache.replace_pods([])
    assert cache.changes_since(generation) is None
    after_relist = cache.generation
    for i in range(CHANGE_LOG_SIZE + 1):
        cache.apply_pod_event("ADDED" if i % 2 == 0 else "DELETED", bound("c", "gpu-4090-1", 1))
    assert cache.changes_since(after_relist) is None


@pytest.mark.parametrize("field,value", [("namespace", "other"), ("name", "other")])
def test_jobs_differing_in_any_field_have_different_memo_keys(field, value):
    engine = GroupedEngine()
    a = engine.job(pod({"gpuplace.io/model-params": "7B"}))
    b = engine.job(pod({"gpuplace.io/model-params": "7B"}, **{field: value}))
    assert frozen_value(a) != frozen_value(b)
    assert frozen_value(a) == frozen_value(engine.job(pod({"gpuplace.io/model-params": "7B"})))


def test_a_rotated_node_list_is_answered_in_its_own_order_and_sees_changes():
    cache = cluster()
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    p = pod({"gpuplace.io/vram": "20Gi"}, name="small")
    ask(service, "prioritize", p)
    rotated = NODES[3:] + NODES[:3]
    got = ask(service, "prioritize", p, rotated)
    assert [h["Host"] for h in got] == rotated
    assert got == fresh_answer(cache, "prioritize", p, names=rotated)
    cache.apply_pod_event("ADDED", bound("x", "gpu-a6000-0", 2))
    q = pod(EIGHT_GPU, gpus=8, name="train")
    cache.apply_pod_event("ADDED", bound("y", "gpu-a100-80g-0", 1))
    assert ask(service, "filter", q, rotated) == fresh_answer(cache, "filter", q, names=rotated)
    assert ask(service, "filter", p, rotated)["NodeNames"] == fresh_answer(cache, "filter", p, names=rotated)["NodeNames"]
    shuffled = [NODES[3]] + NODES[:3] + NODES[4:]  # same length and names, not a rotation
    assert ask(service, "prioritize", p, shuffled) == fresh_answer(cache, "prioritize", p, names=shuffled)


def test_pods_that_differ_only_by_name_share_verdicts_and_answers():
    cache = cluster()
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    spec = {"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"}
    first = ask(service, "filter", pod(spec, name="lora-0"))
    assert len(service.engine._memo) == 1
    again = ask(service, "filter", pod(spec, name="lora-1"))
    assert again == first == fresh_answer(cache, "filter", pod(spec, name="lora-1"))
    assert len(service.engine._memo) == 1  # one decision job for both names
    assert ask(service, "prioritize", pod(spec, name="lora-2")) == fresh_answer(cache, "prioritize", pod(spec, name="lora-2"))


def test_pods_of_other_namespaces_are_decided_for_their_own_tenant():
    policy = parse_policy({**default_policy().model_dump(by_alias=True, exclude_none=True), "tenants": [
        {"name": "team-a", "namespaces": ["team-a"]},
        {"name": "team-b", "namespaces": ["team-b"], "deniedModels": ["RTX-4090"]},
    ]})
    cache = cluster()
    service = ExtenderService(GroupedEngine(policy), ClusterSource(cache, CAT))
    spec = {"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"}
    a = ask(service, "filter", pod(spec, name="lora", namespace="team-a"))
    b = ask(service, "filter", pod(spec, name="lora", namespace="team-b"))
    assert {"gpu-4090-0", "gpu-4090-1"} <= set(a["NodeNames"])
    assert not {"gpu-4090-0", "gpu-4090-1"} & set(b["NodeNames"])
    assert b == fresh_answer(cache, "filter", pod(spec, name="lora", namespace="team-b"), GroupedEngine(policy))


def test_changing_windows_of_nodes_with_bindings_between_them_get_the_answers_of_a_fresh_extender():
    # kube-scheduler sends each pod a different sample of the nodes; the extender reads the nodes
    # it saw before from its per-node index, which a binding must update for that node only.
    import random

    from benchmarks.cluster import POD_MIX, generate_cluster, pod as bench_pod

    rng = random.Random(5)
    cache = ClusterCache(CAT)
    docs = generate_cluster(60, seed=3)
    cache.replace_nodes([node_obj(d["nodeName"], d) for d in docs])
    cache.replace_pods([])
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    names = [d["nodeName"] for d in docs]
    for i in range(40):
        annotations, resource, gpus, _ = POD_MIX[i % len(POD_MIX)]
        p = bench_pod(i, annotations, resource, gpus, namespace="default")
        start, size = rng.randrange(len(names)), rng.randrange(1, len(names))
        window = [names[(start + k) % len(names)] for k in range(size)]
        got = ask(service, "filter", p, window)
        assert got == fresh_answer(cache, "filter", p, names=window), f"pod {i}"
        if got["NodeNames"]:
            fresh = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
            fresh.workload = service.workload  # the same learned workload: the same fragmentation scores
            scores = ask(service, "prioritize", p, got["NodeNames"])
            assert scores == ask(fresh, "prioritize", p, got["NodeNames"]), f"pod {i}"
            best = max(scores, key=lambda s: s["Score"])["Host"]
            cache.apply_pod_event("ADDED", {**p, "spec": {**p["spec"], "nodeName": best}, "status": {"phase": "Running"}})


def test_a_pod_resolved_like_an_earlier_one_keeps_its_own_name_and_a_changed_spec_is_resolved_anew():
    cache = cluster()
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    spec = {"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"}
    first = service._job(service.engine, as_pod(pod(spec, name="lora-0")))
    second = service._job(service.engine, as_pod(pod(spec, name="lora-1")))
    assert (first.req.name, second.req.name) == ("lora-0", "lora-1")
    assert second == service.engine.job(pod(spec, name="lora-1"))
    other = service._job(service.engine, as_pod(pod({**spec, "gpuplace.io/model-params": "13B"}, name="lora-2")))
    assert other == service.engine.job(pod({**spec, "gpuplace.io/model-params": "13B"}, name="lora-2"))
    elsewhere = service._job(service.engine, as_pod(pod(spec, name="lora-3", namespace="team-b")))
    assert elsewhere.req.namespace == "team-b"


def test_a_node_whose_agent_stopped_is_rejected_as_stale_in_every_window_that_holds_it():
    cache = cluster()
    old = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=400)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cache.apply_node_event("MODIFIED", {"metadata": {"name": "gpu-4090-0", "annotations": {
        "gpuplace.io/inventory": json.dumps({**example_inventory("gpu-4090-0"), "observedAt": old})}}})
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    p = pod({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"}, name="lora")
    others = [n for n in NODES if n != "gpu-4090-0"]
    assert "gpu-4090-1" in ask(service, "filter", p, others)["NodeNames"]  # a window without it
    got = ask(service, "filter", p)
    assert "gpu-4090-0" not in got["NodeNames"] and "gpu-4090-1" in got["NodeNames"]
    assert "stale" in (got["FailedNodes"].get("gpu-4090-0") or got["FailedAndUnresolvableNodes"]["gpu-4090-0"])


def test_the_filter_body_joined_per_class_is_the_json_of_the_one_built_as_a_dict():
    # The NodeNames answer is joined from names encoded once per node list; it must decode to
    # what the dict-built body gives, names that JSON must escape and an empty list included.
    from benchmarks.cluster import POD_MIX, generate_cluster, pod as bench_pod

    cache = ClusterCache(CAT)
    docs = generate_cluster(40, seed=11)
    names = [d["nodeName"] for d in docs]
    names[:3] = ['gpu-"quoted"', "gpu-back\\slash", "gpu-ünïcode"]
    cache.replace_nodes([node_obj(n, d) for n, d in zip(names, docs)])
    cache.replace_pods([bound(f"held-{i}", n, 7) for i, n in enumerate(names[3:20])])  # some GPUs in use
    service = ExtenderService(GroupedEngine(), ClusterSource(cache, CAT))
    kinds = set()
    for i, (annotations, resource, gpus, _) in enumerate(POD_MIX):
        for window in (names, names[5:] + names[:5], []):
            args = parse_extender_args(json.dumps({"Pod": bench_pod(i, annotations, resource, gpus, namespace="default"),
                                                   "NodeNames": window}).encode())
            _, _, grouped = service._decide_grouped(args)
            assert grouped.answer_key is not None  # a remembered list: the joined body answers
            joined = json.loads(service._filter_names_body(grouped))
            assert joined == service._filter_body(args, grouped)
            assert json.loads(service.filter_response(args)) == joined
            kinds |= {k for k in ("NodeNames", "FailedNodes", "FailedAndUnresolvableNodes") if joined[k]}
    assert kinds == {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes"}  # every part was exercised
