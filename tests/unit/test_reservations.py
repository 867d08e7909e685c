"""Reservations: a pod the extender sent to a node is held there in its books until the watch
shows it bound, it goes away, kube-scheduler asks about it again, or time runs out; every later
decision sees it (``cluster.reservations``, ``ClusterCache.reserve``)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from prometheus_client import CollectorRegistry

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.cluster.cluster_metrics import ClusterStateCollector
from scheduler_extender.cluster.pending import PendingGpuPods
from scheduler_extender.cluster.reservations import Reservations
from scheduler_extender.cluster.sources import ClusterSource
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.pod import as_pod
from scheduler_extender.core.quantity import GIB
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.wire import parse_extender_args
from tests.factories import gpu, inventory, pod

CAT = default_catalog()
ENGINE = Engine()
RTX_4090 = dict(name="NVIDIA GeForce RTX 4090", memory_mib=24564)
A100 = dict(name="NVIDIA A100-SXM4-80GB", memory_mib=81920)


# ---- the bookkeeping -----------------------------------------------------------------------------

def test_a_reservation_ends_confirmed_when_the_pod_is_bound_where_it_was_reserved():
    r = Reservations[str](ttl_seconds=30)
    assert r.reserve("u1", ("n1",), "entry", now=0) == {"n1"}
    assert r.on_node("n1") == {"u1": "entry"}
    assert r.bound("u1", "n1") == {"n1"} and r.on_node("n1") == {}
    assert r.outcomes == {"confirmed": 1}


def test_a_pod_bound_elsewhere_frees_every_node_it_was_held_on():
    r = Reservations[str](ttl_seconds=30)
    r.reserve("u1", ("n1", "n2"), "e", now=0)
    assert r.bound("u1", "n3") == {"n1", "n2"}
    assert r.outcomes == {"bound_elsewhere": 1} and len(r) == 0


def test_deletion_retry_and_expiry_end_a_reservation_and_say_how():
    r = Reservations[str](ttl_seconds=10)
    r.reserve("deleted", ("n1",), "e", now=0)
    r.reserve("retried", ("n1",), "e", now=0)
    r.reserve("late", ("n2",), "e", now=5)
    assert r.released("deleted") == {"n1"}
    assert r.retried("retried") == {"n1"}
    assert r.expire(now=14.9) == set() and len(r) == 1
    assert r.expire(now=15) == {"n2"} and len(r) == 0
    assert r.outcomes == {"released": 1, "replaced": 1, "expired": 1}


def test_reserving_the_same_pod_again_replaces_its_nodes_and_restarts_its_clock():
    r = Reservations[str](ttl_seconds=10)
    r.reserve("u1", ("n1",), "e", now=0)
    assert r.reserve("u1", ("n2",), "e", now=8) == {"n1", "n2"}
    assert r.expire(now=12) == set() and r.on_node("n2") == {"u1": "e"} and r.on_node("n1") == {}
    assert r.expire(now=18) == {"n2"}


def test_held_reservations_are_bounded_the_soonest_to_expire_ending_first():
    r = Reservations[str](ttl_seconds=10, max_entries=2)
    r.reserve("a", ("n1",), "e", now=0)
    r.reserve("b", ("n1",), "e", now=1)
    r.reserve("c", ("n2",), "e", now=2)
    assert set(r.on_node("n1")) == {"b"} and set(r.on_node("n2")) == {"c"}
    assert r.outcomes == {"expired": 1}


# ---- in the cluster cache ------------------------------------------------------------------------

def node_obj(name, gpus, *, replicas=None, cpu="64"):
    now = dt.datetime.now(dt.timezone.utc).isoformat()  # fresh: cluster mode checks staleness
    inv = inventory(name, gpus, observedAt=now)
    meta = {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)}, "labels": {}}
    count = len(gpus) * (replicas or 1)
    if replicas:
        meta["labels"] = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": str(replicas)}
    return {"metadata": meta, "status": {"allocatable": {"nvidia.com/gpu": str(count), "cpu": cpu, "memory": "512Gi"}}}


def pod_vram(p, memory_bytes):
    return ENGINE.vram_need_bytes(p, memory_bytes)


def cluster(*nodes, ttl=30.0):
    c = ClusterCache(CAT, pod_vram, reservation_seconds=ttl)
    c.replace_nodes(list(nodes))
    c.replace_pods([])
    return c


def inference(name, vram="7Gi"):
    return pod({"gpuplace.io/vram": vram, "gpuplace.io/workload": "inference"}, name=name)


def bound(p, node):
    p = json.loads(json.dumps(p))
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running"}
    return p


def hold(c, p, nodes, now=None):
    """Reserve pod ``p`` on ``nodes`` as the extender's answer does: with the job it decided."""
    return c.reserve(as_pod(p), nodes, ENGINE.job(p), now=now)


def verdict(c, p, node="ts"):
    return ENGINE.filter(ENGINE.job(p), [c.state(node)], None)[0]


def test_reserved_pods_count_on_a_time_sliced_gpu_before_the_watch_shows_them():
    c = cluster(node_obj("ts", [gpu(0, **RTX_4090)], replicas=4))
    for i in range(3):
        p = inference(f"p{i}")
        assert verdict(c, p).passed
        assert hold(c, p, ["ts"])
    fourth = verdict(c, inference("p3"))
    assert not fourth.passed and not fourth.unresolvable
    assert fourth.reason.startswith("GPU 0: 3 GiB of 24 GiB VRAM left (3 pods share it) < 7 GiB needed")


def test_a_binding_replaces_the_reservation_without_counting_the_pod_twice():
    c = cluster(node_obj("ts", [gpu(0, **RTX_4090)], replicas=4))
    p = inference("p0")
    hold(c, p, ["ts"])
    before = c.state("ts").allocation.shared_unplaced
    c.apply_pod_event("ADDED", bound(p, "ts"))
    assert before == c.state("ts").allocation.shared_unplaced == (7 * GIB,)
    assert c.reservation_counts() == (0, 1, {"confirmed": 1})


def test_whole_gpus_reserved_are_taken_from_the_free_count_and_cpu():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]))
    p = pod({}, gpus=3, name="three")
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "12"
    hold(c, p, ["n8"])
    st = c.state("n8")
    assert st.allocation.anonymous == {"nvidia.com/gpu": 3} and st.cpu_milli_free == 64000 - 12000
    snap = c.snapshot()["nodes"]["n8"]
    assert snap["reserved"] == {"default/three": {"nvidia.com/gpu": 3}}
    assert snap["resources"]["nvidia.com/gpu"] == {"allocatable": 8, "held": 3, "free": 5}


def test_a_pod_deleted_before_binding_frees_its_reservation_shortly_after_the_pending_watch_loses_it():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]))
    p = pod({}, gpus=8, name="big")
    hold(c, p, ["n8"], now=100.0)
    pending = PendingGpuPods(on_deleted=lambda uid: c.pod_gone(uid, now=101.0))
    pending.replace_pods([p])
    # Deleted or bound: the watch cache sends the object as it was (no node) either way.
    pending.apply_pod_event("DELETED", p)
    c.expire_reservations(now=105.9)
    assert c.state("n8").allocation.anonymous == {"nvidia.com/gpu": 8}  # the binding may still show
    c.expire_reservations(now=106.0)
    assert c.state("n8").allocation.anonymous == {}
    assert c.reservation_counts()[2] == {"released": 1}


def test_a_binding_that_shows_after_the_pod_left_the_pending_watch_confirms_its_reservation():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]))
    p = pod({}, gpus=8, name="big")
    hold(c, p, ["n8"], now=100.0)
    c.pod_gone(p["metadata"]["uid"], now=100.5)
    c.apply_pod_event("ADDED", bound(p, "n8"))
    assert c.state("n8").allocation.anonymous == {"nvidia.com/gpu": 8}
    assert c.reservation_counts()[2] == {"confirmed": 1}


def test_an_expired_reservation_frees_the_node():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]), ttl=5)
    hold(c, pod({}, gpus=8, name="big"), ["n8"], now=100.0)
    c.expire_reservations(now=104.0)
    assert c.state("n8").allocation.anonymous == {"nvidia.com/gpu": 8}
    c.expire_reservations(now=105.0)
    assert c.state("n8").allocation.anonymous == {}


def test_a_restarted_replica_knows_no_reservation_but_every_binding_its_list_shows():
    node = node_obj("n8", [gpu(i, **A100) for i in range(8)])
    first = cluster(node)
    a, b = pod({}, gpus=4, name="a"), pod({}, gpus=4, name="b")
    hold(first, a, ["n8"])
    hold(first, b, ["n8"])
    restarted = cluster(node)  # a new process: its books start from the API server's list
    restarted.replace_pods([bound(a, "n8")])  # a was bound meanwhile; b's binding is still in flight
    assert restarted.state("n8").allocation.anonymous == {"nvidia.com/gpu": 4}
    assert restarted.reservation_counts()[0] == 0


# ---- through the service: a burst decided before any binding shows -----------------------------

def service(c, best_only):
    s = ExtenderService(ENGINE, ClusterSource(c, CAT))
    s.filter_returns_best = best_only
    return s


def ask(s, p, names):
    return s.filter(parse_extender_args(json.dumps({"Pod": p, "NodeNames": names}).encode()))


@pytest.mark.parametrize("best_only", [True, False], ids=["one round trip", "filter + prioritize"])
def test_a_burst_of_sharing_pods_never_over_commits_a_gpus_vram(best_only):
    nodes = [node_obj(f"ts{i}", [gpu(0, **RTX_4090)], replicas=4) for i in range(6)]
    c = cluster(*nodes)
    s = service(c, best_only)
    names = [f"ts{i}" for i in range(6)]
    placed: dict[str, list[str]] = {n: [] for n in names}
    for i in range(30):  # kube-scheduler decides them one by one; no binding shows until the end
        p = inference(f"burst-{i}")
        answer = ask(s, p, names[i % 6:] + names[:i % 6])  # it rotates the list's start
        passed = answer["NodeNames"]
        if len(passed) > 1:  # two verbs: kube-scheduler then asks for scores and takes the best
            scores = s.prioritize(parse_extender_args(json.dumps({"Pod": p, "NodeNames": passed}).encode()))
            passed = [max(scores, key=lambda h: h["Score"])["Host"]]
        if passed:
            placed[passed[0]].append(p["metadata"]["name"])  # kube-scheduler binds one of them
        else:
            assert all("VRAM left" in why for why in answer["FailedNodes"].values()), answer
    assert all(len(pods) <= 3 for pods in placed.values()), placed  # 3 x 7 GiB fit 24 GiB, 4 do not
    if best_only:
        assert sum(len(p) for p in placed.values()) == 18  # every GPU filled to what fits


def test_a_burst_of_whole_gpu_pods_in_one_round_trip_takes_each_gpu_once():
    c = cluster(*(node_obj(f"n{i}", [gpu(k, **A100) for k in range(4)]) for i in range(3)))
    s = service(c, True)
    names = ["n0", "n1", "n2"]
    taken: dict[str, int] = {n: 0 for n in names}
    for i in range(16):
        passed = ask(s, pod({}, gpus=1, name=f"one-{i}"), names)["NodeNames"]
        assert len(passed) <= 1
        if passed:
            taken[passed[0]] += 1
    assert taken == {"n0": 4, "n1": 4, "n2": 4}
    assert all(v["resources"]["nvidia.com/gpu"]["free"] == 0 for v in c.snapshot()["nodes"].values())


def test_the_same_pod_asked_again_does_not_count_against_itself():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]))
    s = service(c, True)
    p = pod({}, gpus=8, name="big")
    assert ask(s, p, ["n8"])["NodeNames"] == ["n8"]
    assert ask(s, p, ["n8"])["NodeNames"] == ["n8"]  # kube-scheduler's retry after a failed bind
    assert ask(s, pod({}, gpus=1, name="other"), ["n8"])["NodeNames"] == []


def test_reservation_metrics_count_what_is_held_and_how_each_ended():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]))
    registry = CollectorRegistry()
    registry.register(ClusterStateCollector(ClusterSource(c, CAT)))
    p = pod({}, gpus=2, name="two")
    hold(c, p, ["n8"])
    assert registry.get_sample_value("gpuplace_extender_reservations") == 1
    c.apply_pod_event("ADDED", bound(p, "n8"))
    assert registry.get_sample_value("gpuplace_extender_reservations") == 0
    assert registry.get_sample_value("gpuplace_extender_reservations_made_total") == 1
    assert registry.get_sample_value("gpuplace_extender_reservations_ended_total", {"outcome": "confirmed"}) == 1
    assert registry.get_sample_value("gpuplace_extender_reservations_ended_total", {"outcome": "expired"}) == 0


def test_prioritize_does_not_count_the_pod_against_itself_in_filter_and_prioritize_mode():
    # ts0 holds two 7 GiB pods: a third fits it exactly and packing prefers it.
    nodes = [node_obj(f"ts{i}", [gpu(0, **RTX_4090)], replicas=4) for i in range(2)]
    c = cluster(*nodes)
    c.replace_pods([bound(inference(f"held-{i}"), "ts0") for i in range(2)])
    s = service(c, False)
    p = inference("third")
    assert ask(s, p, ["ts0", "ts1"])["NodeNames"] == ["ts0", "ts1"]
    scores = {h["Host"]: h["Score"] for h in s.prioritize(parse_extender_args(json.dumps(
        {"Pod": p, "NodeNames": ["ts0", "ts1"]}).encode()))}
    assert scores["ts0"] > scores["ts1"] > 0
    assert set(c.snapshot()["nodes"]["ts0"]["reserved"]) == {"default/third"}  # held once scored


def test_only_the_clusters_nodes_hold_reservations():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]))
    p = pod({}, gpus=1, name="p")
    assert not hold(c, p, ["made-up-0", "made-up-1"])
    assert hold(c, p, ["n8", "made-up-0"]) and c.reservation_counts()[0] == 1
    assert "made-up-0" not in c.snapshot()["nodes"]


def test_a_reserved_pod_under_a_bound_pods_name_is_counted_apart():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]))
    old = pod({}, gpus=4, name="web-0")
    c.replace_pods([bound(old, "n8")])
    new = pod({}, gpus=4, name="web-0")
    new["metadata"]["uid"] = "uid-of-the-new-web-0"
    hold(c, new, ["n8"])
    assert c.state("n8").allocation.anonymous == {"nvidia.com/gpu": 8}


def test_pods_gone_while_the_pending_watch_was_down_release_their_reservations_after_a_relist():
    c = cluster(node_obj("n8", [gpu(i, **A100) for i in range(8)]))
    p = pod({}, gpus=8, name="big")
    hold(c, p, ["n8"], now=100.0)
    pending = PendingGpuPods(on_deleted=lambda uid: c.pod_gone(uid, now=100.0))
    pending.replace_pods([p])
    pending.replace_pods([])  # relisted after a broken watch: the pod is gone
    c.expire_reservations(now=105.0)
    assert c.state("n8").allocation.anonymous == {}
