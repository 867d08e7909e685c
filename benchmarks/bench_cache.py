"""Cluster cache: the cost of watch events, and memory per node.

Feeds ``ClusterCache`` (cluster mode's state, ``scheduler_extender/cluster/cache.py``) the way the watch
loop does (decoded JSON objects, one event at a time) and measures events per second:

- initial list of N Nodes (each annotation parsed and indexed) and of P Pods;
- Node MODIFIED with an unchanged inventory (kubelet heartbeats: the common case), and with a new
  inventory (``observedAt`` bumped by the agent: a re-parse);
- Pod ADDED (bound) and DELETED, each followed by the read a request would make of that node's
  state (the state is rebuilt lazily on the next read);

and the resident memory the cache adds, per node and in total, for N nodes x 8 GPUs (each size
in a fresh process, so the numbers do not mix). Inputs are kept as JSON bytes and decoded per
event, like the watch does, so they are not counted as cache memory.

    python -m benchmarks.bench_cache                       # 5000 nodes / 20000 pods; memory at 5000 and 15000
    python -m benchmarks.bench_cache --nodes 200 --pods 800 --memory-sizes 200   # smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.cluster import generate_cluster
from benchmarks.common import ROOT, describe_machine, load_average, machine, rss_mib, write_results
from node_agent.inventory import ANNOTATION
from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog


def node_object(doc: dict[str, Any], rv: int = 1) -> dict[str, Any]:
    name = doc["nodeName"]
    return {"metadata": {"name": name, "resourceVersion": str(rv), "labels": {"kubernetes.io/hostname": name},
                         "annotations": {ANNOTATION: json.dumps(doc, separators=(",", ":"))}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


def pod_objects(docs: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """Bound GPU pods: first those the inventories name in ``allocatedTo``, then anonymous ones."""
    pods: list[dict[str, Any]] = []
    for doc in docs:
        for g in doc["gpus"]:
            for holder in [g.get("allocatedTo", "")] + [m.get("allocatedTo", "") for m in g.get("migDevices", [])]:
                if holder and len(pods) < count:
                    ns, name = holder.split("/", 1)
                    pods.append(_pod(ns, name, doc["nodeName"]))
    i = 0
    while len(pods) < count:
        doc = docs[i % len(docs)]
        pods.append(_pod("anon", f"p-{i}", doc["nodeName"]))
        i += 1
    return pods


def _pod(ns: str, name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "uid": f"{ns}-{name}"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def bench_events(nodes: int, pods: int) -> dict[str, Any]:
    docs = generate_cluster(nodes)
    node_bytes = [orjson.dumps(node_object(d)) for d in docs]
    bumped = [orjson.dumps(node_object({**d, "observedAt": "2026-11-21T08:05:00Z"}, 2)) for d in docs]
    pod_bytes = [orjson.dumps(p) for p in pod_objects(docs, pods)]
    names = [d["nodeName"] for d in docs]
    del docs
    cache = ClusterCache(default_catalog())
    out: dict[str, Any] = {"nodes": nodes, "pods": pods, "load_average": load_average()}

    t = time.perf_counter()
    cache.replace_nodes(orjson.loads(b) for b in node_bytes)
    out["list_nodes_per_s"] = _rate(nodes, time.perf_counter() - t)
    t = time.perf_counter()
    cache.replace_pods(orjson.loads(b) for b in pod_bytes)
    out["list_pods_per_s"] = _rate(pods, time.perf_counter() - t)
    t = time.perf_counter()
    for n in names:
        cache.state(n)
    out["state_builds_per_s"] = _rate(nodes, time.perf_counter() - t)

    def node_events(objs: list[bytes]) -> float:
        t = time.perf_counter()
        for b in objs:
            cache.apply_node_event("MODIFIED", orjson.loads(b))
        return _rate(len(objs), time.perf_counter() - t)

    def pod_events(kind: str, objs: list[bytes]) -> float:
        t = time.perf_counter()
        for b in objs:
            obj = orjson.loads(b)
            cache.apply_pod_event(kind, obj)
            cache.state(obj["spec"]["nodeName"])  # the read a request makes next
        return _rate(len(objs), time.perf_counter() - t)

    out["node_heartbeat_events_per_s"] = node_events(node_bytes)
    out["node_inventory_change_events_per_s"] = node_events(bumped)
    sample = pod_bytes[: min(len(pod_bytes), 5000)]
    out["pod_deleted_events_per_s"] = pod_events("DELETED", sample)
    out["pod_added_events_per_s"] = pod_events("ADDED", sample)
    return out


def measure_memory(nodes: int) -> dict[str, Any]:
    """Run in a fresh process: RSS the cache adds for ``nodes`` nodes (and their states)."""
    docs = generate_cluster(nodes)
    node_bytes = [orjson.dumps(node_object(d)) for d in docs]
    names = [d["nodeName"] for d in docs]
    del docs
    gc.collect()
    cache = ClusterCache(default_catalog())
    cache.replace_pods([])
    import os
    before = rss_mib(os.getpid()) or 0.0
    cache.replace_nodes(orjson.loads(b) for b in node_bytes)
    for n in names:
        cache.state(n)
    gc.collect()
    after = rss_mib(os.getpid()) or 0.0
    inputs_mib = sum(len(b) for b in node_bytes) / 2**20
    return {"nodes": nodes, "gpus": nodes * 8, "process_rss_mib": after, "cache_rss_mib": after - before,
            "kib_per_node": (after - before) * 1024 / nodes, "input_json_mib": inputs_mib}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000, help="nodes for the event benchmark (default 5000)")
    p.add_argument("--pods", type=int, default=20000, help="bound GPU pods for the event benchmark (default 20000)")
    p.add_argument("--memory-sizes", default="5000,15000", help="comma list of node counts for the memory measurement")
    p.add_argument("--out", type=Path, help="JSON results file (default benchmarks/results/cache.json)")
    p.add_argument("--memory-only", type=int, help=argparse.SUPPRESS)  # child process mode
    args = p.parse_args(argv)
    if args.memory_only:
        print(json.dumps(measure_memory(args.memory_only)))
        return {}
    m = machine()
    print("== cluster cache: watch events and memory ==")
    print(describe_machine(m), flush=True)
    ev = bench_events(args.nodes, args.pods)
    print(f"  {ev['nodes']} nodes / {ev['pods']} pods: initial list {ev['list_nodes_per_s']:.0f} nodes/s, "
          f"{ev['list_pods_per_s']:.0f} pods/s; state builds {ev['state_builds_per_s']:.0f}/s", flush=True)
    print(f"  events/s: node heartbeat {ev['node_heartbeat_events_per_s']:.0f}, node inventory change "
          f"{ev['node_inventory_change_events_per_s']:.0f}, pod added+read {ev['pod_added_events_per_s']:.0f}, "
          f"pod deleted+read {ev['pod_deleted_events_per_s']:.0f}  (load {ev['load_average']})", flush=True)
    memory = []
    for size in [int(s) for s in args.memory_sizes.split(",") if s]:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_cache", "--memory-only", str(size)],
                              cwd=ROOT, capture_output=True, text=True, check=True)
        mem = json.loads(proc.stdout.strip().splitlines()[-1])
        memory.append(mem)
        print(f"  memory: {size} nodes x 8 GPUs: cache {mem['cache_rss_mib']:.0f} MiB "
              f"({mem['kib_per_node']:.1f} KiB/node), process RSS {mem['process_rss_mib']:.0f} MiB "
              f"(inventory JSON {mem['input_json_mib']:.0f} MiB)", flush=True)
    results = {"benchmark": "cache", "machine": m, "events": ev, "memory": memory}
    path = write_results("cache", results, args.out)
    print(f"results: {path}")
    return results


if __name__ == "__main__":
    main()
