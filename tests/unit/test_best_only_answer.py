"""One round trip (``--filter-returns-best``, the chart's default): ``/filter``'s answer, built per
class of alike nodes, is what the plain ``Engine.filter`` and ``Engine.score`` on every node's own
state give, node by node: one node passes, of those with the best ``best_rank``; every other node
that passes the filter fails with its own score (said "alike" when it ties the best); every node
that fails the filter fails with its own reason. The node that passes is, of the tied ones, the
one kube-scheduler's default resource scores prefer."""

from __future__ import annotations

import datetime as dt
import json

from benchmarks.cluster import generate_cluster, generate_pods
from node_agent.inventory import ANNOTATION
from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.cluster.sources import ClusterSource
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.kube_scores import default_profile_score
from scheduler_extender.core.pod import as_pod
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.wire import parse_extender_args
from tests.harness.gpucluster import node_allocatable

CAT = default_catalog()


def _service(nodes: int) -> tuple[ExtenderService, ClusterCache, list[str]]:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    docs = [{**d, "observedAt": now} for d in generate_cluster(nodes, seed=5, allocated_share=0.3)]
    cache = ClusterCache(CAT)
    # CPU and memory differ between nodes, so that the score's parts split the filter's classes.
    cache.replace_nodes([{"metadata": {"name": d["nodeName"], "resourceVersion": "1",
                                       "annotations": {ANNOTATION: json.dumps(d)}},
                          "status": {"allocatable": {"cpu": str(32 + 16 * (i % 3)), "memory": f"{256 + 128 * (i % 2)}Gi",
                                                     **node_allocatable(d)}}}
                         for i, d in enumerate(docs)])
    cache.replace_pods([])
    cache.replace_namespaces([{"metadata": {"name": "bench"}}])
    service = ExtenderService(Engine(), ClusterSource(cache, CAT))
    service.filter_returns_best = True
    return service, cache, sorted(d["nodeName"] for d in docs)


def test_the_one_trip_answer_is_the_plain_engines_verdict_and_score_on_every_node():
    service, cache, names = _service(150)
    pods = generate_pods(70)
    for i, p in enumerate(pods):
        p["metadata"].update(uid=f"uid-{i}", resourceVersion=str(i + 1))
        p["spec"]["containers"][0]["resources"].setdefault("requests", {}).update(cpu=str(1 + i % 4), memory="8Gi")
    # A learned workload (the fragmentation component applies), then held still during the check.
    for p in pods[:30]:
        service.decider.learn(service.job_for(service.engine, as_pod(p)))
    service.learn_from_requests = False
    workload = service.workload_profile()
    engine = service.engine
    compared = ties = lower = 0
    for i, p in enumerate(pods[30:]):
        request = names[i % 11:] + names[:i % 11]  # kube-scheduler starts each search at another node
        states = service.source.states(request, None)
        job = service.job_for(engine, as_pod(p))
        plain = engine.filter(job, states, service.source.now())
        scores = engine.score(job, states, plain, workload)
        answer = service.filter(parse_extender_args(json.dumps({"Pod": p, "NodeNames": request}).encode()))

        ranks = {r.node: scores[r.node].best_rank for r in plain if r.passed and r.node in scores}
        top = max(ranks.values(), default=None)
        passing, failed, unresolvable = answer["NodeNames"] or [], answer["FailedNodes"], answer["FailedAndUnresolvableNodes"]
        assert sorted(passing + list(failed) + list(unresolvable)) == sorted(request)
        if len(ranks) > 1:
            # Of the tied nodes, the one kube-scheduler's default resource scores prefer, the
            # first in the request's order among equals.
            tied = [k for k, st in enumerate(states) if ranks.get(st.name) == top]
            want = max(tied, key=lambda k: (default_profile_score(
                job.req.cpu_milli, job.req.memory_bytes, states[k].cpu_milli_free, states[k].memory_bytes_free,
                states[k].cpu_milli_allocatable, states[k].memory_bytes_allocatable), -k))
            assert passing == [states[want].name]
        for r in plain:
            if r.node in passing:
                assert r.passed
            elif r.passed:
                sc = scores[r.node]
                assert f"gpuplace scores it {sc.score} of 10 ({sc.tie_value:.3f})" in failed[r.node], r.node
                assert ("alike" in failed[r.node]) == (ranks[r.node] == top), r.node
                ties += ranks[r.node] == top
                lower += ranks[r.node] != top
            else:
                assert (unresolvable if r.unresolvable else failed)[r.node] == r.reason, r.node
            compared += 1
        if passing:  # bound where the answer sends it: the next pod sees that node changed
            cache.apply_pod_event("ADDED", {**p, "spec": {**p["spec"], "nodeName": passing[0]}})
    assert compared == 40 * len(names) and ties > 0 and lower > 0
