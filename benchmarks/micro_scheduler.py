"""In-process replay of what kube-scheduler asks the extender in ``bench_scheduler`` (no HTTP).

Cluster mode's cache (``ClusterCache``) over N generated nodes; per pod: ``filter`` on the next
window of nodes (kube-scheduler's ``percentageOfNodesToScore`` sample, which starts where the
previous search stopped), ``prioritize`` on the nodes that passed when more than one did (as
kube-scheduler asks it), then the pod is bound to the best node (a Pod watch event);
``--one-trip``: ``filter`` alone, passing the best node, as the chart installs the extender
(``--filter-returns-best``). As in the extender's cluster mode, a requeue check
(``requeue.Requeuer.due``; patches not sent) runs every 0.5 s of replay time on the same thread,
unless ``--no-requeue``. Prints the mean time per pod and where it goes, to compare changes to the
request path without a control plane's noise.

    python -m benchmarks.micro_scheduler --nodes 500 --pods 1000
    python -m benchmarks.micro_scheduler --nodes 5000 --pods 300 --percentage-of-nodes-to-score 100 --one-trip
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import time

import orjson

from benchmarks.cluster import generate_cluster, generate_pods
from node_agent.inventory import ANNOTATION
from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.cluster.requeue import CHECK_INTERVAL_SECONDS, Requeuer
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.cluster.sources import ClusterSource
from scheduler_extender.service.wire import parse_extender_args
from tests.harness.gpucluster import node_allocatable


def sample_size(nodes: int, percentage: int = 0) -> int:
    """How many nodes kube-scheduler examines per pod (pkg/scheduler/schedule_one.go,
    numFeasibleNodesToFind): ``percentage`` of them (0: adaptive, max(5, 50 - nodes/125)), at
    least 100 nodes."""
    if nodes < 100:
        return nodes
    pct = percentage or max(5, 50 - nodes // 125)
    return max(100, nodes * pct // 100)


def cluster_service(nodes: int) -> tuple[ClusterCache, ExtenderService, list[str]]:
    """Cluster mode's cache over ``nodes`` generated GPU nodes (64 CPUs and 512 GiB allocatable
    each, inventories observed now, no pods), the extender's service over it, and the node names
    sorted."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cache = ClusterCache(default_catalog())
    docs = generate_cluster(nodes)
    cache.replace_nodes([{"metadata": {"name": d["nodeName"], "resourceVersion": "1",
                                       "annotations": {ANNOTATION: json.dumps({**d, "observedAt": now})}},
                          "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **node_allocatable(d)}}}
                         for d in docs])
    cache.replace_pods([])
    cache.replace_namespaces([{"metadata": {"name": "bench"}}])
    service = ExtenderService(Engine(), ClusterSource(cache, default_catalog()))
    return cache, service, sorted(d["nodeName"] for d in docs)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--percentage-of-nodes-to-score", type=int, default=0, metavar="PCT",
                   help="kube-scheduler's percentageOfNodesToScore (default 0: adaptive; the chart sets 100)")
    p.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=True,
                   help="remember refused pods and check them every 0.5 s, as the extender does by default "
                        "(--requeue-rejected-pods; the patches are counted, not sent)")
    p.add_argument("--one-trip", action="store_true",
                   help="as the chart installs the extender (--filter-returns-best): /filter scores and passes "
                        "the best node only, no prioritize call")
    p.add_argument("--profile", action="store_true", help="print a pyinstrument call tree (bench extra)")
    args = p.parse_args(argv)
    cache, service, names = cluster_service(args.nodes)
    service.filter_returns_best = args.one_trip
    requeued: list[str] = []
    if args.requeue:
        service.requeue = Requeuer(service, lambda ns, name, uid: requeued.append(uid) or "requeued")
    window = sample_size(len(names), args.percentage_of_nodes_to_score)
    pods = generate_pods(args.pods)
    for i, pod in enumerate(pods):
        pod["metadata"].update(uid=f"uid-{i}", resourceVersion=str(i + 1))

    gc_time = [0.0, 0, 0]  # seconds, collections, full (generation 2) collections
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_start[0]
            gc_time[1] += 1
            gc_time[2] += info["generation"] == 2

    gc.callbacks.append(on_gc)

    def run() -> tuple[float, int]:
        start, bound = 0, 0
        t = checked = time.perf_counter()
        for pod in pods:
            if service.requeue is not None and time.perf_counter() - checked >= CHECK_INTERVAL_SECONDS:
                for r in service.requeue.due():
                    service.requeue.requeue(r)
                checked = time.perf_counter()
            sample = [names[(start + k) % len(names)] for k in range(window)]
            start = (start + window) % len(names)
            body = orjson.dumps({"Pod": pod, "NodeNames": sample})
            result = orjson.loads(service.filter_response(parse_extender_args(body)))
            feasible = result["NodeNames"] or []
            if not feasible:
                continue
            if len(feasible) == 1:  # kube-scheduler skips prioritize when one node passes
                best = feasible[0]
            else:
                scores = orjson.loads(service.prioritize_response(parse_extender_args(
                    orjson.dumps({"Pod": pod, "NodeNames": feasible}))))
                best = max(scores, key=lambda s: s["Score"])["Host"]
            cache.apply_pod_event("ADDED", {**pod, "spec": {**pod["spec"], "nodeName": best}})
            bound += 1
        return time.perf_counter() - t, bound

    if args.profile:
        from pyinstrument import Profiler  # bench extra
        profiler = Profiler(interval=0.0005)
        with profiler:
            seconds, bound = run()
        print(profiler.output_text(unicode=True, color=False, show_all=False))
    else:
        seconds, bound = run()
    verbs = "filter (best node only)" if args.one_trip else "filter + prioritize"
    print(f"{args.nodes} nodes, window {window}: {len(pods)} pods ({bound} bound) in {seconds:.2f} s = "
          f"{seconds / len(pods) * 1e3:.3f} ms per pod ({verbs} + bind event); garbage collector "
          f"{gc_time[0] * 1e3:.0f} ms in {gc_time[1]} passes, {gc_time[2]} full; requeue "
          + (f"on: {len(service.requeue)} refused pods remembered, {len(requeued)} requeued"
             if service.requeue is not None else "off"))


if __name__ == "__main__":
    main()
