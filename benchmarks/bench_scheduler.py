"""Scheduler throughput: pods bound per second by the real kube-scheduler, with and without gpuplace.

On the real control plane (etcd, kube-apiserver, kube-scheduler from ``tests/harness``), for each
cluster size: N fake GPU nodes (``benchmarks/cluster.py``; ``status.allocatable`` as a device
plugin would advertise, the inventory in the ``gpuplace.io/inventory`` annotation with a fresh
``observedAt``), then the same M pods twice, with the same nodes:

1. *without* the extender: a kube-scheduler with the default profile, GPU counts only;
2. *with* the extender: ``gpuplace-extender`` in cluster mode (watching Nodes and Pods) and a
   kube-scheduler calling its ``filter`` and ``prioritize`` verbs (``nodeCacheCapable: true``).

The pods are created while no scheduler serves their ``schedulerName``; then the scheduler is
started and a watch records when each pod is bound. Throughput is (bound pods - 1) / (last binding -
first binding), so client-side pod creation and scheduler start-up are not measured; as in
scheduler_perf, the scheduler's client QPS/burst are raised (``--qps``, ``--burst``) so that
client-side throttling does not cap the rate. Between the runs every pod is deleted, so both
runs see empty nodes.

    python -m benchmarks.bench_scheduler                    # 500 and 5000 nodes, 1000 pods
    python -m benchmarks.bench_scheduler --sizes 20 --pods 30   # smoke
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import orjson
from kubernetes import client as k8s
from kubernetes.watch.watch import iter_resp_lines
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cluster import generate_cluster, generate_pods
from benchmarks.common import (
    cpu_seconds, describe_machine, free_port, load_average, machine, peak_rss_mib, python, start_server, stop_server,
    write_results,
)
from benchmarks.refserver import SERVERS
from node_agent.inventory import ANNOTATION
from tests.harness.controlplane import ControlPlane, ExtenderSpec, SchedulerSpec, create_node
from tests.harness.gpucluster import node_allocatable, start_extender

PLAIN = "bench-plain-scheduler"
GPUPLACE = "gpuplace-scheduler"
FLOOR = "bench-floor-scheduler"
ONE_TRIP = "gpuplace-one-trip-scheduler"


def create_nodes(cp: ControlPlane, docs: list[dict[str, Any]], workers: int) -> float:
    """Create the Nodes with their inventory annotation; returns seconds taken."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    api = cp.api_client()

    def one(doc: dict[str, Any]) -> None:
        doc = {**doc, "observedAt": now}
        create_node(api, doc["nodeName"], node_allocatable(doc), labels={"gpuplace.io/fake-node": "true"},
                    annotations={ANNOTATION: json.dumps(doc, separators=(",", ":"))})

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, docs))
    return time.perf_counter() - t0


def create_pods(cp: ControlPlane, pods: list[dict[str, Any]], namespace: str, scheduler: str, workers: int) -> None:
    api = cp.api_client()
    core = k8s.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})

    def one(p: dict[str, Any]) -> None:
        body = {**p, "metadata": {**p["metadata"], "namespace": namespace}, "spec": {**p["spec"], "schedulerName": scheduler}}
        body["metadata"].pop("uid", None)
        core.create_namespaced_pod(namespace, body)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, pods))


class BindingWatch:
    """Records, from a watch on the namespace's pods, when each pod was first seen bound.

    Started before the scheduler, so every binding arrives as a watch event; the times are this
    process's clock when the event arrived (loopback: a millisecond or so after the binding).
    ``on_bound``, when given, is called with each newly bound pod (the decoded object), on the
    watch's thread.
    """

    def __init__(self, cp: ControlPlane, namespace: str,
                 on_bound: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.core = k8s.CoreV1Api(cp.api_client())
        self.namespace = namespace
        self.on_bound = on_bound
        self.bound_at: dict[str, float] = {}
        self.node_of: dict[str, str] = {}  # pod name -> the node it was bound to
        listed = orjson.loads(self.core.list_namespaced_pod(namespace, _preload_content=False).data)
        self._rv = listed["metadata"]["resourceVersion"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
            except Exception:  # noqa: BLE001 - the control plane stopping ends the stream; else re-watch
                if self._stop.is_set():
                    return
                time.sleep(0.2)

    def _watch_once(self) -> None:
        resp = self.core.list_namespaced_pod(self.namespace, watch=True, resource_version=self._rv,
                                             timeout_seconds=30, _preload_content=False)
        for line in iter_resp_lines(resp):
            if self._stop.is_set():
                break
            if not line:
                continue
            obj = orjson.loads(line).get("object") or {}
            meta = obj.get("metadata") or {}
            self._rv = meta.get("resourceVersion", self._rv)
            if (obj.get("spec") or {}).get("nodeName") and meta.get("name") not in self.bound_at:
                self.bound_at[meta["name"]] = time.perf_counter()
                self.node_of[meta["name"]] = obj["spec"]["nodeName"]
                if self.on_bound is not None:
                    self.on_bound(obj)
        resp.release_conn()

    def stop(self) -> None:
        self._stop.set()


def measure_binding(watch: BindingWatch, total: int, settle: float, timeout: float) -> dict[str, Any]:
    """Wait until all pods are bound or none was bound for ``settle`` seconds; the rate between first and last."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        times = list(watch.bound_at.values())
        now = time.perf_counter()
        if len(times) >= total:
            break
        if (times and now - max(times) > settle) or (not times and now - start > settle * 3):
            break
        time.sleep(0.2)
    watch.stop()
    times = sorted(watch.bound_at.values())
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"pods": total, "bound": len(times), "span_s": span,
            "pods_per_s": (len(times) - 1) / span if span > 0 else None,
            "all_bound_after_start_s": (times[-1] - start) if times else None,
            "placements": dict(watch.node_of)}


class CpuMeter:
    """CPU seconds each process spends during one run (``common.cpu_seconds``), per bound pod.

    Where the time goes matters as much as the rate on a 2-core machine: kube-scheduler, the API
    server, etcd and the extender share the cores, so an extender's CPU slows the others down.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def add(self, name: str, pid: int) -> None:
        self.pids[name] = pid
        self.start[name] = cpu_seconds(pid)

    def per_pod_ms(self, bound: int) -> dict[str, float | None]:
        """Milliseconds of CPU per bound pod, by process (None: it ended before the reading)."""
        out: dict[str, float | None] = {}
        for name, pid in self.pids.items():
            now, then = cpu_seconds(pid), self.start.get(name)
            out[name] = (now - then) * 1e3 / bound if now is not None and then is not None and bound else None
        return out


def scrape(url: str) -> str:
    """A Prometheus text exposition from ``url`` (kube-scheduler's self-signed TLS accepted)."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, context=insecure, timeout=10) as resp:
        return resp.read().decode()


def histogram_means(text: str, family: str, label: str) -> dict[str, dict[str, float]]:
    """Count and mean (ms) of a Prometheus histogram in the exposition ``text``, by the value of ``label``."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for sample in fam.samples:
            entry = out.setdefault(sample.labels.get(label, "?"), {"count": 0.0, "sum_s": 0.0})
            if sample.name.endswith("_count"):
                entry["count"] += sample.value
            elif sample.name.endswith("_sum"):
                entry["sum_s"] += sample.value
    for v in out.values():
        v["mean_ms"] = v["sum_s"] * 1e3 / v["count"] if v["count"] else float("nan")
    return out


def scheduler_attempts(metrics: str) -> dict[str, dict[str, float]]:
    """kube-scheduler's own count and mean duration of scheduling attempts by result (scheduled,
    unschedulable, error; ``scheduler_scheduling_attempt_duration_seconds``) in its ``metrics``
    text: unschedulable pods are retried, and every retry costs a filter pass and an Event."""
    return histogram_means(metrics, "scheduler_scheduling_attempt_duration_seconds", "result")


def scheduler_algorithm_ms(metrics: str) -> float:
    """Mean time kube-scheduler spends finding a node for a pod, extender calls included
    (``scheduler_scheduling_algorithm_duration_seconds`` in its ``metrics`` text), ms."""
    means = histogram_means(metrics, "scheduler_scheduling_algorithm_duration_seconds", "")
    return means["?"]["mean_ms"] if "?" in means else float("nan")


def _attempts_text(attempts: dict[str, dict[str, float]]) -> str:
    return "attempts: " + ", ".join(f"{r} {int(v.get('count', 0))} (mean {v['mean_ms']:.2f} ms)"
                                    for r, v in sorted(attempts.items()))


def _cpu_text(cpu: dict[str, float | None]) -> str:
    short = {"kube-apiserver": "apiserver"}
    parts = []
    for name, ms in cpu.items():
        label = "scheduler" if name.startswith("kube-scheduler") else short.get(name, name)
        parts.append(f"{label} {ms:.2f}" if ms is not None else f"{label} n/a")
    return "CPU ms/pod: " + ", ".join(parts)


def delete_pods(cp: ControlPlane, namespace: str) -> None:
    core = k8s.CoreV1Api(cp.api_client())
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not orjson.loads(core.list_namespaced_pod(namespace, _preload_content=False).data)["items"]:
            return
        time.sleep(0.5)
    raise TimeoutError(f"pods in {namespace} not deleted")


def run_scheduler(cp: ControlPlane, namespace: str, pods: int, spec: SchedulerSpec, args: argparse.Namespace,
                  extender_pid: int | None = None) -> dict[str, Any]:
    """Start the scheduler of ``spec`` on the pods already created in ``namespace`` and measure
    until they are bound (``measure_binding``), with the CPU each process spent per bound pod,
    kube-scheduler's attempts and its mean algorithm time. The caller stops the scheduler."""
    watch = BindingWatch(cp, namespace)
    meter = CpuMeter({**cp.pids(), **({"extender": extender_pid} if extender_pid is not None else {})})
    cp.add_scheduler(spec)
    meter.add("kube-scheduler", cp.pids()[f"kube-scheduler[{spec.name}]"])
    out = measure_binding(watch, pods, args.settle, args.timeout)
    out["cpu_ms_per_pod"] = meter.per_pod_ms(out["bound"])
    metrics = scrape(cp.scheduler_metrics_url(spec.name))
    out["attempts"] = scheduler_attempts(metrics)
    out["algorithm_mean_ms"] = scheduler_algorithm_ms(metrics)
    return out


def node_kinds(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Node name -> what the filter and score can tell apart of it at the start: its GPU models and
    MIG strategy (generated nodes of one kind are alike but for what is already allocated)."""
    return {d["nodeName"]: f"{len(d['gpus'])}x {d['gpus'][0]['name'] if d['gpus'] else '-'} {d.get('migStrategy', '')}"
            for d in docs}


def compare_placements(a: dict[str, str], b: dict[str, str], kinds: dict[str, str]) -> dict[str, Any]:
    """Pod by pod: bound in both runs to the same kind of node, to another kind, or in one run only."""
    both = set(a) & set(b)
    same = sum(1 for pod in both if kinds.get(a[pod]) == kinds.get(b[pod]))
    return {"pods_bound_in_both": len(both), "same_node_kind": same, "other_node_kind": len(both) - same,
            "bound_in_one_run_only": len(set(a) ^ set(b))}


def bench_size(nodes: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes, "pods": args.pods, "load_average_start": load_average(),
                           "percentage_of_nodes_to_score": args.percentage_of_nodes_to_score}
    cp = ControlPlane(workdir / f"cp-{nodes}", scheduler_configs=[])
    with cp:
        docs = generate_cluster(nodes)
        kinds = node_kinds(docs)
        out["node_create_s"] = create_nodes(cp, docs, args.workers)
        pods = generate_pods(args.pods)
        spec_kw = {"qps": args.qps, "burst": args.burst, "percentage_of_nodes_to_score": args.percentage_of_nodes_to_score}

        create_pods(cp, pods, "bench-plain", PLAIN, args.workers)
        out["without_extender"] = run_scheduler(cp, "bench-plain", len(pods), SchedulerSpec(name=PLAIN, **spec_kw), args)
        cp.stop_scheduler(PLAIN)
        delete_pods(cp, "bench-plain")

        extender = start_extender(cp.kubeconfig_path, cp.logs, wait_ready=300)
        try:
            create_pods(cp, pods, "bench-gpuplace", GPUPLACE, args.workers)
            profiler = _start_profiler(args.profile, extender.proc.pid, nodes, args.profile_format)
            out["with_extender"] = run_scheduler(
                cp, "bench-gpuplace", len(pods),
                SchedulerSpec(name=GPUPLACE, extender=ExtenderSpec(url_prefix=extender.url), **spec_kw), args,
                extender_pid=extender.proc.pid)
            out["extender_peak_rss_mib"] = peak_rss_mib(extender.proc.pid)
            out["with_extender"]["extender_handler_ms"] = {
                verb: v["mean_ms"] for verb, v in histogram_means(
                    scrape(f"{extender.url}/metrics"), "gpuplace_extender_request_duration_seconds", "verb").items()}
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(timeout=60)
                print(f"  py-spy profile of the extender ({args.profile_format}) in {args.profile}")
            cp.stop_scheduler(GPUPLACE)
        finally:
            extender.stop()
        previous = "bench-gpuplace"
        if args.one_trip:
            # The same pods with --filter-returns-best and no prioritizeVerb: one round trip per pod.
            delete_pods(cp, previous)
            extender = start_extender(cp.kubeconfig_path, cp.logs, wait_ready=300, extra_args=["--filter-returns-best"])
            try:
                create_pods(cp, pods, "bench-one-trip", ONE_TRIP, args.workers)
                out["with_extender_one_trip"] = run_scheduler(
                    cp, "bench-one-trip", len(pods),
                    SchedulerSpec(name=ONE_TRIP, extender=ExtenderSpec(url_prefix=extender.url, prioritize_verb=None),
                                  **spec_kw), args, extender_pid=extender.proc.pid)
                cp.stop_scheduler(ONE_TRIP)
            finally:
                extender.stop()
            out["one_trip_vs_two_verbs_placements"] = compare_placements(
                out["with_extender"]["placements"], out["with_extender_one_trip"]["placements"], kinds)
            previous = "bench-one-trip"
        for server in args.floor:
            # The same pods through a floor server (benchmarks/refserver.py): what any Python
            # extender on that stack costs kube-scheduler before it decides anything.
            delete_pods(cp, previous)
            namespace, name = f"bench-floor-{server}", f"{FLOOR}-{server}"
            port = free_port()
            floor = start_server([python(), "-m", "benchmarks.refserver", "--port", str(port), "--server", server],
                                 port, cp.logs / f"refserver-{server}.log")
            try:
                create_pods(cp, pods, namespace, name, args.workers)
                out[_floor_key(server)] = run_scheduler(
                    cp, namespace, len(pods),
                    SchedulerSpec(name=name, extender=ExtenderSpec(url_prefix=f"http://127.0.0.1:{port}"), **spec_kw),
                    args, extender_pid=floor.pid)
                cp.stop_scheduler(name)
            finally:
                stop_server(floor)
            previous = namespace
    a, b = out["without_extender"]["pods_per_s"], out["with_extender"]["pods_per_s"]
    out["ratio"] = (b / a) if a and b else None
    if "with_extender_one_trip" in out:
        c = out["with_extender_one_trip"]["pods_per_s"]
        out["one_trip_ratio"] = (c / a) if a and c else None
        cmp = out["one_trip_vs_two_verbs_placements"]
        print(f"  {nodes:>6} nodes: one round trip (--filter-returns-best) {_rate(c)} = "
              f"{out['one_trip_ratio'] * 100 if out['one_trip_ratio'] else float('nan'):.0f}% of without; "
              f"placements vs filter+prioritize: {cmp['same_node_kind']} of {cmp['pods_bound_in_both']} pods on the same "
              f"kind of node, {cmp['other_node_kind']} on another, {cmp['bound_in_one_run_only']} bound in one run only",
              flush=True)
    out["load_average_end"] = load_average()
    w, e = out["without_extender"], out["with_extender"]
    floor_text = ""
    for server in args.floor:
        f = out[_floor_key(server)]["pods_per_s"]
        ratio = out[_floor_key(server, "floor_ratio")] = (f / a) if a and f else None
        label = "the floor extender" if server == "starlette" else f"the {server} floor"
        floor_text += f", with {label} {_rate(f)} = {ratio * 100 if ratio else float('nan'):.0f}%"
    print(f"  {nodes:>6} nodes {args.pods} pods: without extender {_rate(a)} ({w['bound']} bound), "
          f"with gpuplace {_rate(b)} ({e['bound']} bound), "
          f"ratio {out['ratio'] * 100 if out['ratio'] else float('nan'):.0f}%{floor_text}  "
          f"(nodes created in {out['node_create_s']:.0f} s; extender peak RSS {out['extender_peak_rss_mib']:.0f} MiB; "
          f"load {out['load_average_start']} -> {out['load_average_end']})", flush=True)
    for label, key in (("without extender", "without_extender"), ("with gpuplace", "with_extender"),
                       ("with one trip", "with_extender_one_trip"),
                       *((f"with the {'' if server == 'starlette' else server + ' '}floor", _floor_key(server))
                         for server in args.floor)):
        if key in out:
            handler = out[key].get("extender_handler_ms")
            handler_text = ("; extender handler mean " + ", ".join(f"{v} {ms:.2f} ms" for v, ms in handler.items())
                            if handler else "")
            print(f"           {label:>16}: {_cpu_text(out[key]['cpu_ms_per_pod'])}; "
                  f"{_attempts_text(out[key]['attempts'])}; algorithm mean {out[key]['algorithm_mean_ms']:.2f} ms"
                  f"{handler_text}", flush=True)
    return out


def _floor_key(server: str, key: str = "with_floor_extender") -> str:
    """Result key of a floor run: the Starlette floor's keeps the plain name (``make bench``'s summary)."""
    return key if server == "starlette" else f"{key}_{server}"


def _floor_servers(value: str) -> list[str]:
    servers = [s for s in value.split(",") if s]
    unknown = [s for s in servers if s not in SERVERS]
    if unknown or not servers:
        raise argparse.ArgumentTypeError(f"--floor: expected a comma list of {', '.join(SERVERS)}; got {value!r}")
    return servers


def _start_profiler(directory: Path | None, pid: int, nodes: int, fmt: str = "flamegraph") -> subprocess.Popen[bytes] | None:
    """``py-spy record`` on the extender while the scheduler runs (``--profile DIR``; bench extra)."""
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("--profile needs py-spy: pip install -e '.[bench]'")
    suffix = "svg" if fmt == "flamegraph" else "txt"
    return subprocess.Popen([py_spy, "record", "--gil", "--pid", str(pid), "--rate", "200", "--format", fmt, "--output",
                             str(directory / f"extender-{nodes}.{suffix}")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _rate(v: float | None) -> str:
    return f"{v:7.1f} pods/s" if v else "    n/a"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="500,5000", help="comma list of node counts (default 500,5000)")
    p.add_argument("--pods", type=int, default=1000, help="GPU pods per run (default 1000)")
    p.add_argument("--qps", type=float, default=5000, help="kube-scheduler client QPS (default 5000)")
    p.add_argument("--burst", type=int, default=5000, help="kube-scheduler client burst (default 5000)")
    p.add_argument("--percentage-of-nodes-to-score", type=int, metavar="PCT",
                   help="kube-scheduler's percentageOfNodesToScore in every run (default: its adaptive sample, "
                        "46%% at 500 nodes; the chart sets 100: kube-scheduler samples before it calls extenders)")
    p.add_argument("--no-one-trip", dest="one_trip", action="store_false",
                   help="skip the run with --filter-returns-best and no prioritizeVerb (one round trip per pod)")
    p.add_argument("--workers", type=int, default=8, help="client threads creating nodes and pods (default 8)")
    p.add_argument("--settle", type=float, default=10, help="stop waiting after this many seconds without a binding")
    p.add_argument("--timeout", type=float, default=300, help="longest wait for one run, seconds")
    p.add_argument("--out", type=Path, help="JSON results file (default benchmarks/results/scheduler.json)")
    p.add_argument("--floor", nargs="?", const=["starlette"], default=[], type=_floor_servers, metavar="SERVERS",
                   help="also run the same pods through the floor server (benchmarks/refserver.py) as the extender: "
                        "the throughput any Python extender on this HTTP stack leaves kube-scheduler. SERVERS: a "
                        "comma list of its stacks, starlette (gpuplace's own, the default), asgi (no framework), "
                        "protocol (no HTTP server library)")
    p.add_argument("--profile", type=Path, metavar="DIR", help="record a py-spy profile of the extender into DIR")
    p.add_argument("--profile-format", choices=("flamegraph", "raw"), default="flamegraph",
                   help="py-spy output: an SVG flame graph or collapsed stacks as text (default flamegraph)")
    args = p.parse_args(argv)
    m = machine()
    print("== scheduler throughput (real kube-scheduler, with and without gpuplace-extender) ==")
    print(describe_machine(m), flush=True)
    results: dict[str, Any] = {"benchmark": "scheduler", "machine": m, "qps": args.qps, "burst": args.burst, "sizes": []}
    with tempfile.TemporaryDirectory(prefix="gpuplace-bench-sched-") as tmp:
        for size in [int(s) for s in args.sizes.split(",") if s]:
            results["sizes"].append(bench_size(size, args, Path(tmp)))
    path = write_results("scheduler", results, args.out)
    print(f"results: {path}")
    return results


if __name__ == "__main__":
    main()
