"""The extender breaks its own ties as kube-scheduler's default resource scores would, by the same
formula ``gpuplace simulate`` places with (so the simulator's model of one round trip holds)."""

from __future__ import annotations

import json

from scheduler_extender.core.engine import Engine
from scheduler_extender.core.kube_scores import default_profile_score
from scheduler_extender.core.policy import default_policy
from scheduler_extender.simulator.baselines import kube_scores
from scheduler_extender.simulator.cluster import Cluster
from scheduler_extender.simulator.model import simulation_catalog
from scheduler_extender.simulator.traces import openb_nodes, openb_pods
from tests.factories import ROOT

SIM = ROOT / "tests" / "fixtures" / "sim"


def test_the_extenders_kube_score_equals_the_simulators_on_openb_nodes_and_pods():
    catalog = simulation_catalog()
    nodes = openb_nodes(SIM / "openb_node_list_gpu_node.csv", catalog)[:60]
    pods, _ = openb_pods(SIM / "openb_pod_list_gpuspec33.csv", catalog, cpu_only=True)
    cluster = Cluster(nodes, catalog, default_policy())
    for k, p in enumerate(pods[:40]):  # fill some nodes unevenly first
        i = k % 7
        if cluster.cpu_free[i] >= (p.cpu_milli or 0) and cluster.mem_free[i] >= (p.memory_mib or 0):
            cluster.cpu_free[i] -= p.cpu_milli or 0
            cluster.mem_free[i] -= p.memory_mib or 0
    for p in pods[40:80]:
        if p.cpu_milli is None or p.memory_mib is None:
            continue
        expected = kube_scores(p, cluster)
        for i in range(len(nodes)):
            got = default_profile_score(p.cpu_milli, p.memory_mib, int(cluster.cpu_free[i]), int(cluster.mem_free[i]),
                                        int(cluster.cpu_cap[i]), int(cluster.mem_cap[i]))
            assert got == expected[i], (p.name, nodes[i].name)


def test_a_pod_without_cpu_or_memory_requests_is_scored_with_kubernetes_defaults():
    # 100 millicores and 200 MB (NonMissingContainerRequests): on a node of 1 core and 1 GB, both 10 %/20 % used.
    assert default_profile_score(None, None, 1000, 10**9, 1000, 10**9) == round(100 * 0.85) + round(100 * 0.95)
    assert default_profile_score(0, 0, 1000, 10**9, 1000, 10**9) == 200
    assert default_profile_score(500, None, None, None, None, None) == 0  # nothing known: no preference


def test_one_round_trip_passes_the_tied_node_kube_scheduler_would_prefer_for_cpu():
    from scheduler_extender.cluster.cache import ClusterCache
    from scheduler_extender.cluster.sources import ClusterSource
    from scheduler_extender.core.catalog import default_catalog
    from scheduler_extender.service.decisions import ExtenderService
    from scheduler_extender.service.wire import parse_extender_args
    from tests.factories import gpu, inventory, pod
    import datetime as dt
    now = dt.datetime.now(dt.timezone.utc).isoformat()

    def node(name, cpu):
        inv = inventory(name, [gpu(i) for i in range(4)], observedAt=now)
        return {"metadata": {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)}},
                "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": cpu, "memory": "256Gi"}}}

    cache = ClusterCache(default_catalog())
    cache.replace_nodes([node("small-cpu", "16"), node("big-cpu", "96")])  # same GPUs, same gpuplace score
    cache.replace_pods([])
    s = ExtenderService(Engine(), ClusterSource(cache, default_catalog()))
    s.filter_returns_best = True
    p = pod({}, gpus=1, name="p")
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
    answer = s.filter(parse_extender_args(json.dumps({"Pod": p, "NodeNames": ["small-cpu", "big-cpu"]}).encode()))
    assert answer["NodeNames"] == ["big-cpu"]  # LeastAllocated: 8 of 96 cores over 8 of 16
    assert "is passed alone" in answer["FailedNodes"]["small-cpu"]
