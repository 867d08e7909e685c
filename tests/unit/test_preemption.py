"""GPU-aware preemption: the victims (core.preemption) and the controller's pass (cluster.preemption)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import random

import pytest

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.cluster.preemption import Preemptor, protecting_budget, selects
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.filter import filter_node
from scheduler_extender.core.pod import as_pod
from scheduler_extender.core.preemption import (Candidate, NodePreemption, NoPreemption, best_preemption,
                                                choose_victims, resolvable_only)
from tests.factories import gpu, inventory, pod

CAT = default_catalog()
ENGINE = Engine()
A100 = dict(name="NVIDIA A100-SXM4-80GB", memory_mib=81920)
RTX_4090 = dict(name="NVIDIA GeForce RTX 4090", memory_mib=24564)


def pairs_topology(n: int, **model) -> list[dict]:
    """n GPUs, NVLink pairs (0,1), (2,3), ...: no NVLink between pairs."""
    gpus = [gpu(i, **model) for i in range(n)]
    for g in gpus:
        peer = g["index"] ^ 1
        if peer < n:
            g["nvlinks"] = [{"peerUuid": gpus[peer]["uuid"], "links": 12}]
    return gpus


def node_obj(name, gpus, labels=None, gpu_count=None):
    # observed now: the controller's pass decides on the live view, where old inventories are stale
    inv = inventory(name, gpus, observedAt=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return {"metadata": {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)},
                         "labels": dict(labels or {})},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpu_count or len(gpus)), "cpu": "64",
                                       "memory": "512Gi"}}}


def bound(p, node, priority, labels=None):
    p = json.loads(json.dumps(p))
    p["spec"]["nodeName"] = node
    p["spec"]["priority"] = priority
    p["metadata"]["labels"] = dict(labels or {})
    p["status"] = {"phase": "Running"}
    return p


def pod_vram(p, memory_bytes):
    return ENGINE.vram_need_bytes(p, memory_bytes)


def cluster(nodes, pods=()):
    c = ClusterCache(CAT, pod_vram)
    c.replace_nodes(list(nodes))
    c.replace_pods(list(pods))
    return c


def candidates(c, node, below):
    return [Candidate(b.uid, b.key, b.priority) for b in c.bound_pods(node) if b.priority < below]


def victims_for(c, node, p, priority, **kw):
    job = ENGINE.job(as_pod(p))
    return choose_victims(job, priority, node, candidates(c, node, priority),
                          lambda uids: c.state_without(node, uids), ENGINE.policy, None, **kw)


def nvlink_node(holders: dict[int, str]):
    """A 4-GPU A100 node (NVLink pairs 0-1 and 2-3) whose GPUs ``holders`` lists are held by those pods."""
    gpus = pairs_topology(4, **A100)
    for i, name in holders.items():
        gpus[i]["allocatedTo"] = f"default/{name}"
    return node_obj("nv", gpus)


# ---- the victims -------------------------------------------------------------------------------

def test_a_2_gpu_nvlink_pod_evicts_exactly_the_one_pod_on_a_peer_of_a_free_gpu():
    c = cluster([nvlink_node({0: "low-a", 3: "low-b"})],
                [bound(pod(name="low-a"), "nv", 10), bound(pod(name="low-b"), "nv", 5)])
    high = pod({"gpuplace.io/require": "nvlink"}, gpus=2, name="high")
    before = filter_node(ENGINE.job(as_pod(high)), c.state("nv"), ENGINE.policy)
    assert not before.passed and resolvable_only(before)  # 2 GPUs free by count, but not peers
    got = victims_for(c, "nv", high, 100)
    assert isinstance(got, NodePreemption) and got.exact
    # either eviction frees a pair; the lower priority goes
    assert [v.key for v in got.victims] == ["default/low-b"]
    assert sorted(u.gpu_index for u in got.result.chosen) == [2, 3]


def shared_gpu_with_three_7gib_pods(replicas: int) -> ClusterCache:
    """Node "ts": one 24 GiB GPU time-sliced into ``replicas``, held by low-0..low-2 (priorities 0-2), 7 GiB each."""
    gpus = [gpu(0, allocatedTo="default/low-0,default/low-1,default/low-2", **RTX_4090)]
    node = node_obj("ts", gpus, {"nvidia.com/gpu.sharing-strategy": "time-slicing",
                                 "nvidia.com/gpu.replicas": str(replicas)}, gpu_count=replicas)
    return cluster([node], [bound(inference_pod(f"low-{i}", "7Gi"), "ts", i) for i in range(3)])


def inference_pod(name: str, vram: str) -> dict:
    return pod({"gpuplace.io/vram": vram, "gpuplace.io/workload": "inference"}, name=name)


def test_a_14gib_pod_on_a_time_sliced_24gib_gpu_with_three_7gib_pods_evicts_two_of_them():
    c = shared_gpu_with_three_7gib_pods(replicas=4)
    high = inference_pod("high", "14Gi")
    got = victims_for(c, "ts", high, 1000)
    assert isinstance(got, NodePreemption)
    assert [v.key for v in got.victims] == ["default/low-0", "default/low-1"]  # two, the lowest priorities


def test_pods_of_the_same_or_higher_priority_are_never_victims():
    c = cluster([nvlink_node({0: "peer", 3: "other"})],
                [bound(pod(name="peer"), "nv", 100), bound(pod(name="other"), "nv", 200)])
    got = victims_for(c, "nv", pod({"gpuplace.io/require": "nvlink"}, gpus=2, name="high"), 100)
    assert isinstance(got, NoPreemption)
    assert "no pod of lower priority than 100" in got.reason


def test_a_node_where_evicting_every_candidate_is_not_enough_evicts_nothing_and_says_why():
    c = cluster([nvlink_node({0: "mine", 1: "boss"})],
                [bound(pod(name="mine"), "nv", 1), bound(pod(name="boss"), "nv", 500)])
    got = victims_for(c, "nv", pod(gpus=4, name="high"), 100)
    assert isinstance(got, NoPreemption)
    assert got.reason.startswith("evicting every lower-priority pod here (1) would not make room: 3 of 4 eligible")


def test_a_pod_the_filter_refuses_for_good_is_no_case_for_preemption():
    c = cluster([nvlink_node({0: "low"})], [bound(pod(name="low"), "nv", 1)])
    job = ENGINE.job(as_pod(pod({"gpuplace.io/gpu-models": "H100"}, gpus=1, name="high")))
    result = filter_node(job, c.state("nv"), ENGINE.policy)
    assert not result.passed and not resolvable_only(result)


def _brute_force(c, node, p, priority):
    job = ENGINE.job(as_pod(p))
    lower = candidates(c, node, priority)
    best = None
    for k in range(1, len(lower) + 1):
        for s in itertools.combinations(lower, k):
            if filter_node(job, c.state_without(node, frozenset(v.uid for v in s)), ENGINE.policy).passed:
                key = (k, max(v.priority for v in s), sum(v.priority for v in s))
                best = key if best is None or key < best else best
        if best is not None:
            return best
    return None


@pytest.mark.parametrize("seed", range(12))
def test_the_victims_are_the_fewest_and_lowest_priority_a_brute_force_search_finds(seed):
    rng = random.Random(seed)
    gpus = pairs_topology(8, **A100)
    pods, n = [], 0
    free = list(range(8))
    rng.shuffle(free)
    while len(free) > rng.randint(0, 2):
        take = [free.pop() for _ in range(min(len(free), rng.choice((1, 1, 2))))]
        name = f"p{n}"
        for i in take:
            gpus[i]["allocatedTo"] = f"default/{name}"
        pods.append(bound(pod(gpus=len(take), name=name), "n8", rng.choice((1, 2, 5, 50, 500))))
        n += 1
    c = cluster([node_obj("n8", gpus)], pods)
    want = rng.choice((2, 3, 4))
    high = pod({"gpuplace.io/require": "nvlink"} if want == 2 else {}, gpus=want, name="high")
    got = victims_for(c, "n8", high, 100)
    if filter_node(ENGINE.job(as_pod(high)), c.state("n8"), ENGINE.policy).passed:
        assert isinstance(got, NoPreemption) and "without evicting anything" in got.reason
        return
    expected = _brute_force(c, "n8", high, 100)
    if expected is None:
        assert isinstance(got, NoPreemption)
        return
    assert isinstance(got, NodePreemption) and got.victims
    prios = [v.priority for v in got.victims]
    assert (len(prios), max(prios), sum(prios)) == expected


def test_past_its_budget_the_search_keeps_kube_schedulers_minimal_set():
    gpus = pairs_topology(8, **A100)
    pods = []
    for i in range(8):
        gpus[i]["allocatedTo"] = f"default/p{i}"
        pods.append(bound(pod(name=f"p{i}"), "n8", i))
    c = cluster([node_obj("n8", gpus)], pods)
    high = pod(gpus=3, name="high")
    got = victims_for(c, "n8", high, 100, max_checks=10)
    assert isinstance(got, NodePreemption) and not got.exact
    assert [v.key for v in got.victims] == ["default/p0", "default/p1", "default/p2"]
    job = ENGINE.job(as_pod(high))
    for v in got.victims:  # minimal: keeping any one back leaves no room
        rest = frozenset(x.uid for x in got.victims if x is not v)
        assert not filter_node(job, c.state_without("n8", rest), ENGINE.policy).passed


def test_the_node_with_the_fewest_then_lowest_priority_victims_is_chosen():
    r = filter_node(ENGINE.job(as_pod(pod())), cluster([nvlink_node({})]).state("nv"), ENGINE.policy)
    a = NodePreemption("a", (Candidate("1", "x/1", 5), Candidate("2", "x/2", 1)), r)
    b = NodePreemption("b", (Candidate("3", "x/3", 50),), r)
    c = NodePreemption("c", (Candidate("4", "x/4", 7),), r)
    assert best_preemption([a, b, NoPreemption("d", "no"), c]).node == "c"
    assert best_preemption([NoPreemption("d", "no")]) is None


# ---- the cache's side ----------------------------------------------------------------------------

def test_a_nominated_pod_holds_its_node_for_others_but_not_against_itself():
    c = cluster([nvlink_node({})])
    p = as_pod(pod(gpus=4, name="high"))
    c.nominate(p.uid, "nv", p, ENGINE.job(p))
    other = ENGINE.job(as_pod(pod(gpus=1, name="other")))
    assert not filter_node(other, c.state("nv"), ENGINE.policy).passed
    assert filter_node(ENGINE.job(p), c.state_without("nv", frozenset({p.uid})), ENGINE.policy).passed
    c.pod_gone(p.uid)  # bound or deleted: the hold ends
    assert c.nomination(p.uid) is None
    assert filter_node(other, c.state("nv"), ENGINE.policy).passed


def test_a_pod_being_deleted_is_listed_as_terminating():
    p = bound(pod(name="low"), "nv", 1)
    p["metadata"]["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    c = cluster([nvlink_node({0: "low"})], [p])
    assert [(b.key, b.terminating) for b in c.bound_pods("nv")] == [("default/low", True)]


# ---- PodDisruptionBudgets ----------------------------------------------------------------------

@pytest.mark.parametrize("selector, labels, expected", [
    ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "1"}, True),
    ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]}]}, {"tier": "y"}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]}, {"tier": "x"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {}, True),
    ({}, {"any": "thing"}, True),   # policy/v1: an empty selector selects every pod of the namespace
    (None, {"any": "thing"}, False),
])
def test_label_selectors_select_as_kubernetes_does(selector, labels, expected):
    assert selects(selector, labels) is expected


def test_a_budget_that_allows_no_disruption_protects_the_pods_it_selects():
    budgets = [{"metadata": {"name": "keep", "namespace": "ml"}, "spec": {"selector": {"matchLabels": {"app": "a"}}},
                "status": {"disruptionsAllowed": 0}},
               {"metadata": {"name": "loose", "namespace": "ml"}, "spec": {"selector": {"matchLabels": {"app": "b"}}},
                "status": {"disruptionsAllowed": 1}}]
    assert protecting_budget("ml", {"app": "a"}, budgets) == "keep"
    assert protecting_budget("ml", {"app": "b"}, budgets) is None
    assert protecting_budget("other", {"app": "a"}, budgets) is None


# ---- the controller's pass -----------------------------------------------------------------------

class FakeApi:
    def __init__(self, budgets=()):
        self._budgets = list(budgets)
        self.calls: list[tuple] = []

    def budgets(self):
        return self._budgets

    def nominate(self, namespace, name, uid, node):
        self.calls.append(("nominate", f"{namespace}/{name}", node))
        return "nominated"

    def evict(self, namespace, name, uid):
        self.calls.append(("evict", f"{namespace}/{name}"))
        return "evicted"

    def event(self, namespace, name, uid, etype, reason, message):
        self.calls.append(("event", f"{namespace}/{name}", reason, message))


class FakeService:
    def __init__(self, c):
        from scheduler_extender.cluster.sources import ClusterSource
        from scheduler_extender.served.grouped import GroupedEngine
        self.engine = GroupedEngine()
        self.source = ClusterSource(c, CAT)

    def job_for(self, engine, p):
        return engine.job(p)


class Rejected:
    def __init__(self, p):
        self.pod = as_pod(p)
        self.uid, self.namespace, self.name = self.pod.uid, self.pod.namespace, self.pod.name


def _high(priority=100, **annotations):
    p = pod(annotations or {"gpuplace.io/require": "nvlink"}, gpus=2, name="high")
    p["spec"]["priority"] = priority
    return p


def test_a_pass_nominates_the_node_evicts_the_victims_and_says_so_once():
    c = cluster([nvlink_node({0: "low-a", 3: "low-b"})],
                [bound(pod(name="low-a"), "nv", 10), bound(pod(name="low-b"), "nv", 5)])
    api = FakeApi()
    high = Rejected(_high())
    clock = [0.0]
    p = Preemptor(FakeService(c), lambda: [high], api, clock=lambda: clock[0])
    started = p.check()
    assert [(s.node, [v.key for v in s.victims]) for s in started] == [("nv", ["default/low-b"])]
    assert api.calls[0] == ("nominate", "default/high", "nv")
    assert api.calls[1][2] == "Preempting" and "default/low-b on nv" in api.calls[1][3]
    assert api.calls[2] == ("evict", "default/low-b")
    clock[0] += 5
    assert p.check() == [] and len(api.calls) == 3  # nominated: waits for the victims to go


def test_a_victim_a_budget_protects_is_passed_over_for_another():
    c = cluster([nvlink_node({0: "low-a", 3: "low-b"})],
                [bound(pod(name="low-a"), "nv", 10), bound(pod(name="low-b"), "nv", 5, {"app": "b"})])
    api = FakeApi([{"metadata": {"name": "keep-b", "namespace": "default"},
                    "spec": {"selector": {"matchLabels": {"app": "b"}}}, "status": {"disruptionsAllowed": 0}}])
    started = Preemptor(FakeService(c), lambda: [Rejected(_high())], api).check()
    assert [v.key for v in started[0].victims] == ["default/low-a"]


def test_a_pass_that_no_eviction_helps_evicts_nothing_and_warns_once_per_reason():
    c = cluster([nvlink_node({0: "boss", 3: "low"})],
                [bound(pod(name="boss"), "nv", 500), bound(pod(name="low"), "nv", 1)])
    api = FakeApi()
    clock = [0.0]
    high4 = pod(gpus=4, name="high4")
    high4["spec"]["priority"] = 100
    p = Preemptor(FakeService(c), lambda: [Rejected(high4)], api, clock=lambda: clock[0])
    assert p.check() == []
    assert [x[:3] for x in api.calls] == [("event", "default/high4", "PreemptionNotHelpful")]
    assert "nv: evicting every lower-priority pod here (1) would not make room" in api.calls[0][3]
    clock[0] += 60
    assert p.check() == [] and len(api.calls) == 1  # checked again, the same reason is not repeated


def test_the_filter_passes_a_nominated_pod_on_its_node_while_others_are_kept_off():
    import orjson

    from scheduler_extender.cluster.sources import ClusterSource
    from scheduler_extender.service.decisions import ExtenderService
    from scheduler_extender.service.wire import parse_extender_args
    c = cluster([nvlink_node({}), node_obj("spare", [gpu(0, **A100), gpu(1, **A100)])])
    service = ExtenderService(Engine(), ClusterSource(c, CAT))
    high = pod(gpus=4, name="high")
    service.observe_nomination(high["metadata"]["uid"], "nv", high)

    def passing(p):
        body = orjson.dumps({"Pod": p, "NodeNames": ["nv", "spare"]})
        return service.filter(parse_extender_args(body))["NodeNames"]
    assert passing(pod(gpus=1, name="other")) == ["spare"]  # nv's GPUs are held for high
    service.observe_nomination(high["metadata"]["uid"], None, high)
    assert passing(pod(gpus=1, name="another")) == ["nv", "spare"]
    service.observe_nomination(high["metadata"]["uid"], "nv", high)
    assert passing(high) == ["nv"]  # its own hold does not count against it


# ---- the preempt verb (kube-scheduler's ProcessPreemption) ---------------------------------------

def _preempt(c, p, proposals, meta=True):
    import orjson

    from scheduler_extender.cluster.sources import ClusterSource
    from scheduler_extender.service.decisions import ExtenderService
    from scheduler_extender.service.wire import parse_preemption_args
    service = ExtenderService(Engine(), ClusterSource(c, CAT))
    if meta:
        body = {"Pod": p, "NodeNameToMetaVictims": {n: {"Pods": [{"UID": f"uid-default-{v}"} for v in vs],
                                                        "NumPDBViolations": 0} for n, vs in proposals.items()}}
    else:
        body = {"Pod": p, "NodeNameToVictims": {n: {"Pods": [pod(name=v) for v in vs]} for n, vs in proposals.items()}}
    out = orjson.loads(service.preempt_response(parse_preemption_args(orjson.dumps(body))))
    return {n: sorted(x["UID"].removeprefix("uid-default-") for x in v["Pods"])
            for n, v in out["NodeNameToMetaVictims"].items()}


@pytest.mark.parametrize("meta", [True, False])
def test_the_preempt_verb_drops_a_node_where_kube_schedulers_count_frees_the_wrong_gpus(meta):
    c = cluster([nvlink_node({0: "a", 1: "b", 2: "c", 3: "d"})],
                [bound(pod(name="a"), "nv", 1), bound(pod(name="b"), "nv", 40), bound(pod(name="c"), "nv", 2),
                 bound(pod(name="d"), "nv", 30)])
    # kube-scheduler's count: the two lowest priorities, on GPUs 0 and 2, not NVLink peers: no pod
    # is deleted for nothing (gpuplace's controller makes that room itself, through evictions)
    assert _preempt(c, _high(), {"nv": ["a", "c"]}, meta) == {}


def test_the_preempt_verb_keeps_a_proposal_that_makes_room_as_it_is():
    c = cluster([nvlink_node({0: "a", 1: "b", 2: "c", 3: "d"})],
                [bound(pod(name=x), "nv", 1) for x in "abcd"])
    assert _preempt(c, _high(), {"nv": ["a", "b"]}) == {"nv": ["a", "b"]}


def test_the_preempt_verb_drops_a_proposal_that_leaves_a_shared_gpu_short_of_vram():
    c = shared_gpu_with_three_7gib_pods(replicas=3)
    high = inference_pod("high", "14Gi")
    high["spec"]["priority"] = 1000
    # every replica in use: kube-scheduler frees one replica, which leaves 10 GiB, not 14
    assert _preempt(c, high, {"ts": ["low-2"]}) == {}
    assert _preempt(c, high, {"ts": ["low-1", "low-2"]}) == {"ts": ["low-1", "low-2"]}


def test_the_preempt_verb_does_not_count_the_pods_own_hold_against_it():
    c = cluster([nvlink_node({0: "a", 1: "b", 2: "c", 3: "d"})], [bound(pod(name=x), "nv", 1) for x in "abcd"])
    high = _high()
    p = as_pod(high)
    c.nominate(p.uid, "nv", p, ENGINE.job(p))
    assert _preempt(c, high, {"nv": ["a", "b"]}) == {"nv": ["a", "b"]}


def test_a_pod_whose_priority_class_says_never_preempt_evicts_nothing():
    c = cluster([nvlink_node({0: "low-a", 3: "low-b"})],
                [bound(pod(name="low-a"), "nv", 10), bound(pod(name="low-b"), "nv", 5)])
    high = _high()
    high["spec"]["preemptionPolicy"] = "Never"
    api = FakeApi()
    assert Preemptor(FakeService(c), lambda: [Rejected(high)], api).check() == [] and api.calls == []


def test_without_lower_priority_pods_anywhere_a_refused_pod_gets_no_preemption_event():
    # a cluster without PriorityClasses: every pod at 0, none of them a victim for another
    c = cluster([nvlink_node({0: "a", 3: "b"})], [bound(pod(name="a"), "nv", 0), bound(pod(name="b"), "nv", 0)])
    api = FakeApi()
    assert Preemptor(FakeService(c), lambda: [Rejected(_high(priority=0))], api).check() == []
    assert api.calls == []


def test_a_nomination_ends_by_itself_after_its_hold_whoever_wrote_the_annotation():
    from scheduler_extender.cluster.cache import NOMINATION_HOLD_SECONDS
    c = cluster([nvlink_node({})])
    p = as_pod(pod(gpus=4, name="high"))
    c.nominate(p.uid, "nv", p, ENGINE.job(p), now=1000.0)
    other = ENGINE.job(as_pod(pod(gpus=1, name="other")))
    c.expire_reservations(now=1000.0 + NOMINATION_HOLD_SECONDS - 1)
    assert c.nomination(p.uid) == "nv" and not filter_node(other, c.state("nv"), ENGINE.policy).passed
    c.expire_reservations(now=1000.0 + NOMINATION_HOLD_SECONDS)
    assert c.nomination(p.uid) is None and filter_node(other, c.state("nv"), ENGINE.policy).passed


def test_a_refused_eviction_stops_the_rest_and_withdraws_the_hold():
    c = cluster([nvlink_node({0: "a", 1: "b", 2: "c", 3: "d"})], [bound(pod(name=x), "nv", 1) for x in "abcd"])

    class Refusing(FakeApi):
        def evict(self, namespace, name, uid):
            self.calls.append(("evict", f"{namespace}/{name}"))
            return "refused"
    api = Refusing()
    assert Preemptor(FakeService(c), lambda: [Rejected(_high())], api).check() == []
    assert [x for x in api.calls if x[0] in ("evict", "nominate")] == [
        ("nominate", "default/high", "nv"), ("evict", "default/a"), ("nominate", "default/high", None)]


def test_only_the_nodes_kube_scheduler_sent_with_the_pod_are_searched():
    c = cluster([nvlink_node({0: "a", 3: "b"}), node_obj("other", pairs_topology(4, **A100))],
                [bound(pod(name="a"), "nv", 1), bound(pod(name="b"), "nv", 1)])
    c.replace_nodes([nvlink_node({0: "a", 3: "b"}), node_obj("other", [
        {**g, "allocatedTo": "default/x"} for g in pairs_topology(4, **A100)])])
    c.apply_pod_event("ADDED", bound(pod(gpus=4, name="x"), "other", 5))
    high = Rejected(_high())
    high.names = ("other",)  # its nodeSelector, say, leaves only "other": nv is not for it
    api = FakeApi()
    assert Preemptor(FakeService(c), lambda: [high], api).check()[0].node == "other"
    high.names = ("nv", "other")
    api = FakeApi()
    assert Preemptor(FakeService(c), lambda: [high], api).check()[0].node == "nv"  # a victim of lower priority


def test_a_replica_that_does_not_serve_kube_scheduler_neither_takes_nor_renews_the_lease():
    from kubernetes.leaderelection import electionconfig

    from scheduler_extender.cluster.preemption import _ServingElection

    class Lock:
        name, namespace, identity = "lease", "ns", "me"

        def get(self, name, namespace):
            raise AssertionError("a replica that does not serve must not touch the Lease")
    config = electionconfig.Config(Lock(), 15, 10, 2, lambda: None, lambda: None)
    assert _ServingElection(config, lambda: False).try_acquire_or_renew() is False


def test_a_refused_pod_that_fits_somewhere_now_evicts_nothing():
    # the view changed since the pod was refused: a node with a free NVLink pair came
    c = cluster([nvlink_node({0: "low-a", 3: "low-b"}), node_obj("spare", pairs_topology(2, **A100))],
                [bound(pod(name="low-a"), "nv", 1), bound(pod(name="low-b"), "nv", 1)])
    api = FakeApi()
    assert Preemptor(FakeService(c), lambda: [Rejected(_high())], api).check() == [] and api.calls == []
