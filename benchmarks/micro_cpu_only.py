"""In-process timing of ``/filter`` for pods without devices in cluster mode (no HTTP).

With the chart's ``scheduler.extender.cpuOnlyPods`` (its default), kube-scheduler sends the
extender every pod of its scheduler, CPU-only ones too; once the extender has learned a workload,
such a pod is scored on each node's free devices, CPU and memory (``score._score_without_devices``).
This binds ``--gpu-pods`` GPU pods first (one trip: the best node), so that nodes differ and a
workload is learned, then times ``--requests`` filters of CPU-only pods over every node.

    python -m benchmarks.micro_cpu_only --nodes 5000
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson

from benchmarks.cluster import generate_pods
from benchmarks.micro_scheduler import cluster_service
from scheduler_extender.service.wire import parse_extender_args


def cpu_only_pod(i: int) -> dict:
    """A pod requesting 3 CPUs and 12 GiB, no device (a web server's replica)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"web-{i}", "namespace": "bench", "uid": f"cpu-{i}", "annotations": {}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "3", "memory": "12Gi"}}}]}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--gpu-pods", type=int, default=300, help="GPU pods bound first (default 300)")
    p.add_argument("--requests", type=int, default=20, help="CPU-only pods timed (default 20)")
    args = p.parse_args(argv)
    cache, service, names = cluster_service(args.nodes)
    service.filter_returns_best = True
    for i, pod in enumerate(generate_pods(args.gpu_pods)):
        pod["metadata"].update(uid=f"uid-{i}", resourceVersion=str(i + 1))
        answer = orjson.loads(service.filter_response(parse_extender_args(orjson.dumps({"Pod": pod, "NodeNames": names}))))
        if answer["NodeNames"]:
            cache.apply_pod_event("ADDED", {**pod, "spec": {**pod["spec"], "nodeName": answer["NodeNames"][0]}})
    times = []
    for i in range(args.requests):
        body = orjson.dumps({"Pod": cpu_only_pod(i), "NodeNames": names})
        t = time.perf_counter()
        service.filter_response(parse_extender_args(body))
        times.append(time.perf_counter() - t)
    print(f"{args.nodes} nodes, {args.gpu_pods} GPU pods bound: CPU-only pod filter (one trip), first "
          f"{times[0] * 1e3:.1f} ms, the {len(times) - 1} after it: median {statistics.median(times[1:]) * 1e3:.1f} ms, "
          f"max {max(times[1:]) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
