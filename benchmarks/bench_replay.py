"""The openb trace through the real kube-scheduler: gpuplace as the chart installs it, against
``gpuplace simulate``'s cluster sharing mode and kube-scheduler alone, on the same pods.

    python -m benchmarks.bench_replay --pods benchmarks/data/alibaba-openb-v2023/openb_pod_list_default.csv \\
        --fleet benchmarks/data/alibaba-openb-v2023/openb_node_list_gpu_node.csv --rate 20 --seed 0 --json replay.json

What runs (``tests/harness``: etcd, kube-apiserver, kube-scheduler v1.34 built from source):

- **The fleet**: every node of the list as a Node without a kubelet: ``status.allocatable`` CPU,
  memory and ``nvidia.com/gpu`` (x replicas where time-sliced), GPU feature discovery's labels
  (``nvidia.com/gpu.product``; ``nvidia.com/gpu.sharing-strategy`` and ``.replicas`` where
  time-sliced) and the inventory the agent would publish (``gpuplace.io/inventory``). Which
  nodes are time-sliced, and how pods may use them, is ``gpuplace simulate --sharing
  device-plugin``'s model (``scheduler_extender.simulator.device_plugin``): the same function
  chooses them here and there.
- **The pods**: FGD's arrivals of the list for the seed (``simulator.run.fgd_arrivals``, tuned to
  100 % of the fleet's milli-GPUs), in that order. A sharing pod asks one ``nvidia.com/gpu`` with
  ``gpuplace.io/gpu-fraction`` (its ``gpu_milli``) and the policy's sharing class, tolerates the
  time-sliced nodes' taint and selects them; a ``gpu_spec`` is a required node affinity on
  ``nvidia.com/gpu.product``. Arrival shares (``--shares``, default every 10 %) are created one after
  another: at ``--rate`` pods per second, or each share at once (``--rate burst``); after each
  share the cluster settles (every pod bound or marked unschedulable, no binding for
  ``--settle-seconds``) and the figures are read.
- **The scheduler as the chart configures it**: the KubeSchedulerConfiguration that ``helm
  template deploy/helm/gpuplace`` renders (one round trip, ``nodeCacheCapable``, no
  ``managedResources``: CPU-only pods too, ``percentageOfNodesToScore`` from the values), its
  ``urlPrefix`` pointing at two ``gpuplace-extender`` replicas behind a proxy with the Service's
  ``sessionAffinity: ClientIP`` (``tests/harness/tcpproxy.py``), each started with the args the
  chart's Deployment renders (``--filter-returns-best``, ``--reservation-seconds``, ...).
- **The kubelets**: fake nodes have none, so ``DevicePlugin`` plays the device plugin and the
  agent: when a pod is bound it gives it its GPUs (the first free ones by index) or, on a
  time-sliced node, a replica of the GPU with the fewest in use (``device_plugin.plugin_choice``),
  and publishes ``allocatedTo`` on the Node's inventory as the agent does from PodResources
  (within ``--publish-seconds``; every node's ``observedAt`` renewed each minute, the agent's
  heartbeat).
- **Counted from the bound pods**: FGD's milli-GPU allocation ratio (milli-GPUs the bound GPU
  pods asked / (GPUs x 1000)), VRAM over-commits (time-sliced GPUs whose holders' shares exceed
  them), device over-commits (a whole GPU given twice), Pending pods and their reasons.
- **Beside it**: ``gpuplace simulate``'s gpuplace on the same arrivals and fleet in its cluster
  sharing mode (``run_fill``; ``sim_milli_allocation_ratio`` at each share, the same measure), and
  the same replay with kube-scheduler's default profile and no extender (``--baseline``).
- **A replica killed** (``--kill-replica-at SHARE``): the extender replica the scheduler talks to is
  SIGKILLed once that share has arrived; the report gives how long no pod was bound.

Not part of ``make bench`` (a list takes 15-40 minutes on 2 cores); ``--limit-pods`` makes a small one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import orjson
import yaml
from kubernetes import client as k8s

from benchmarks.bench_scheduler import BindingWatch
from benchmarks.common import describe_machine, machine
from node_agent.inventory import ANNOTATION
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import load_policy
from scheduler_extender.core.requirements import NVIDIA_GPU
from scheduler_extender.core.sharing import SHARING_STRATEGY_LABEL
from scheduler_extender.simulator import device_plugin
from scheduler_extender.simulator.baselines import GpuplacePolicy
from scheduler_extender.simulator.cli import parse_share
from scheduler_extender.simulator.cluster import MILLI, Cluster
from scheduler_extender.simulator.model import SimNode, SimPod, simulation_catalog
from scheduler_extender.simulator.run import fgd_arrivals, run_fill
from scheduler_extender.simulator.traces import load_fleet, openb_pods
from tests.harness.controlplane import ControlPlane, SchedulerSpec, create_node, ensure_helm
from tests.harness.gpucluster import start_extender
from tests.harness.tcpproxy import TCPProxy

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "gpuplace"
NAMESPACE = "replay"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPUPLACE = "gpuplace-scheduler"  # the chart's scheduler name
PLAIN = "default-scheduler"
DEFAULT_SHARES = tuple(round(0.1 * k, 1) for k in range(1, 11))
# Extender args of the chart's Deployment that name things of a cluster this replay does not have.
_SKIPPED_ARGS = ("--port", "--policy-configmap", "--tls-", "--health-port", "--log-level")


# ---- the fleet and the pods ----------------------------------------------------------------------


def product(name: str) -> str:
    """GPU feature discovery's ``nvidia.com/gpu.product`` value for a GPU name (spaces to '-')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name.strip())[:63].strip("-_.")


@dataclass
class Fleet:
    nodes: list[SimNode]
    share: float
    replicas: int
    products_of: dict[str, set[str]] = field(default_factory=dict)  # catalog id -> product labels

    @property
    def gpus(self) -> int:
        return sum(len(n.inventory.gpus) for n in self.nodes)

    def node_object(self, n: SimNode) -> tuple[dict[str, str], dict[str, str], list[dict[str, str]], dict[str, Any]]:
        """(allocatable, labels, taints, inventory document) of a fleet node."""
        gpus = len(n.inventory.gpus)
        alloc = {"cpu": f"{n.cpu_milli}m" if n.cpu_milli else "96", "memory": f"{n.memory_mib}Mi" if n.memory_mib else "1Ti",
                 "pods": "1000", NVIDIA_GPU: str(gpus * (n.sharing.replicas if n.sharing else 1))}
        labels = {PRODUCT_LABEL: product(n.inventory.gpus[0].name), "bench.gpuplace.io/replay": "true",
                  **device_plugin.node_labels(n.sharing)}
        taints = [dict(device_plugin.TAINT)] if n.sharing else []
        doc = n.inventory.model_dump(by_alias=True, exclude_none=True, mode="json")
        return alloc, labels, taints, doc


def load(pods_csv: str, fleet_csv: str, seed: int, share: str, replicas: int, limit: int | None
         ) -> tuple[Fleet, list[SimPod], Engine]:
    catalog = simulation_catalog()
    policy = load_policy(None)
    engine = Engine(policy, catalog)
    nodes = load_fleet(fleet_csv, catalog)
    trace, _ = openb_pods(pods_csv, catalog, cpu_only=True)
    nodes, trace, frac = device_plugin.cluster_model(nodes, trace, policy, parse_share(share), replicas)
    capacity_milli = Cluster(nodes, catalog, policy).capacity_milli
    arrivals = fgd_arrivals(trace, seed, 1.0, capacity_milli)
    if limit:
        arrivals = arrivals[:limit]
    fleet = Fleet(nodes, frac, replicas)
    for n in nodes:
        entry = catalog.resolve_driver_name(n.inventory.gpus[0].name)
        if entry is not None:
            fleet.products_of.setdefault(entry.id, set()).add(product(n.inventory.gpus[0].name))
    return fleet, arrivals, engine


def pod_body(p: SimPod, fleet: Fleet, scheduler: str) -> dict[str, Any]:
    """The v1.Pod of an arrival (module docstring)."""
    m = p.manifest(NAMESPACE)
    m["metadata"].pop("uid", None)
    m["metadata"]["name"] = re.sub(r"[^a-z0-9.-]", "-", p.name.lower()).strip("-.")[:253]  # a DNS-1123 name
    container = m["spec"]["containers"][0]
    container["image"] = "registry.k8s.io/pause:3.10"
    if not p.gpus:
        container["resources"]["requests"].pop(NVIDIA_GPU, None)
        container["resources"]["limits"].pop(NVIDIA_GPU, None)
    spec = m["spec"]
    spec["schedulerName"] = scheduler
    spec["terminationGracePeriodSeconds"] = 0
    if p.sharing or not p.gpus:
        spec["tolerations"] = [{**device_plugin.TAINT, "operator": "Equal"}]
    if p.sharing and any(n.sharing for n in fleet.nodes):
        spec["nodeSelector"] = {SHARING_STRATEGY_LABEL: "time-slicing"}
    if p.allowed_models is not None:
        values = sorted({v for mid in p.allowed_models for v in fleet.products_of.get(mid, ())})
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": values or ["none"]}]}]}}}
    return m


def share_bounds(arrivals: Sequence[SimPod], capacity_milli: int, shares: Sequence[float]) -> list[int]:
    """Per share, the number of arrivals up to the first whose arrived milli-GPUs reach it (as
    ``run_fill`` takes its snapshots); the list's length where it ends first."""
    out, arrived, k = [], 0, 0
    targets = list(shares)
    for n, p in enumerate(arrivals, 1):
        arrived += p.total_milli
        while k < len(targets) and arrived >= targets[k] * capacity_milli:
            out.append(n)
            k += 1
    out += [len(arrivals)] * (len(targets) - k)
    return out


# ---- the device plugin and the agent -------------------------------------------------------------


class DevicePlugin:
    """Plays each fake node's device plugin and agent (module docstring), and counts over-commits."""

    def __init__(self, api: k8s.ApiClient, fleet: Fleet, seed: int, publish_seconds: float, heartbeat_seconds: float = 60):
        self.core = k8s.CoreV1Api(api)
        self.rng = random.Random(seed)
        self.nodes = {n.name: n for n in fleet.nodes}
        self.docs = {n.name: fleet.node_object(n)[3] for n in fleet.nodes}
        # node -> per GPU (index order) the holders: pod key -> milli
        self.holders: dict[str, list[dict[str, int]]] = {n.name: [{} for _ in n.inventory.gpus] for n in fleet.nodes}
        self.milli: dict[str, int] = {}  # pod key -> milli-GPUs it asked (gpus x gpu_milli)
        self.device_overcommits = 0
        self.bound: dict[str, str] = {}
        self.bound_at: list[float] = []
        self._dirty: set[str] = set()
        self._published = {n.name: time.monotonic() - random.Random(n.name).random() * heartbeat_seconds
                           for n in fleet.nodes}
        self._lock = threading.Lock()
        self.publish_seconds, self.heartbeat_seconds = publish_seconds, heartbeat_seconds
        self._stop = threading.Event()
        self._publisher = threading.Thread(target=self._publish_loop, daemon=True)

    def start(self) -> DevicePlugin:
        self._publisher.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def on_bound(self, pod: dict[str, Any]) -> None:
        """A pod bound to a node (once per pod: ``BindingWatch``): give it its GPUs or replica."""
        meta, spec = pod["metadata"], pod["spec"]
        key = f"{meta['namespace']}/{meta['name']}"
        node = spec["nodeName"]
        with self._lock:
            self.bound[key] = node
            self.bound_at.append(time.monotonic())
            gpus = sum(int((c.get("resources") or {}).get("limits", {}).get(NVIDIA_GPU, 0)) for c in spec["containers"])
            fraction = (meta.get("annotations") or {}).get("gpuplace.io/gpu-fraction")
            milli = round(float(fraction) * MILLI) if fraction else MILLI
            self.milli[key] = gpus * milli
            if not gpus or node not in self.holders:
                return
            units = self.holders[node]
            sharing = self.nodes[node].sharing
            if sharing is not None:
                j = device_plugin.plugin_choice([len(u) for u in units], sharing.replicas, self.rng)
                if j is None:  # kube-scheduler counted a replica that is not there
                    self.device_overcommits += 1
                    j = 0
                units[j][key] = milli
            else:
                free = [j for j, u in enumerate(units) if not u]
                if len(free) < gpus:
                    self.device_overcommits += gpus - len(free)
                    free += [j for j, u in enumerate(units) if u][:gpus - len(free)]
                for j in free[:gpus]:
                    units[j][key] = MILLI
            self._dirty.add(node)

    def _publish_loop(self) -> None:
        while not self._stop.wait(self.publish_seconds):
            now = time.monotonic()
            with self._lock:
                due = set(self._dirty) | {n for n, t in self._published.items() if now - t > self.heartbeat_seconds}
                self._dirty.clear()
                patches = {n: self._document(n) for n in due}
            for n, doc in patches.items():
                try:
                    self.core.patch_node(n, {"metadata": {"annotations": {ANNOTATION: doc}}})
                    self._published[n] = now
                except Exception as e:  # noqa: BLE001 - a failed publish is retried next round
                    print(f"publish {n}: {e}", file=sys.stderr)
                    with self._lock:
                        self._dirty.add(n)

    def _document(self, node: str) -> str:
        doc = dict(self.docs[node])
        doc["observedAt"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc["gpus"] = [{**g, "allocatedTo": ",".join(h)} if h else g for g, h in zip(doc["gpus"], self.holders[node])]
        return json.dumps(doc, separators=(",", ":"))

    def figures(self, gpus: int) -> dict[str, Any]:
        with self._lock:
            used = sum(self.milli[k] for k in self.bound)
            over = [u for units in self.holders.values() for u in units if sum(u.values()) > MILLI]
            return {"milli_allocation_ratio": used / (gpus * MILLI), "bound": len(self.bound),
                    "vram_overcommitted_gpus": len(over), "vram_overcommitted_pods": sum(len(u) for u in over),
                    # what the allocation ratio counts of pods on over-committed GPUs (each may run out of memory)
                    "vram_overcommitted_milli_ratio": sum(m for u in over for m in u.values()) / (gpus * MILLI),
                    "device_overcommits": self.device_overcommits}


# ---- one replay -----------------------------------------------------------------------------------


def chart_rendered() -> tuple[dict[str, Any], list[str]]:
    """(the chart's KubeSchedulerConfiguration, the extender args of its Deployment), rendered by
    ``helm template`` with TLS off (the replicas here serve plain HTTP on loopback)."""
    out = subprocess.run([str(ensure_helm()), "template", "gp", str(CHART), "--set", "extender.tls.enabled=false"],
                         capture_output=True, text=True, check=True).stdout
    config, args = None, []
    for doc in yaml.safe_load_all(out):
        if not doc:
            continue
        if doc.get("kind") == "ConfigMap" and "config.yaml" in (doc.get("data") or {}) and "scheduler" in doc["metadata"]["name"]:
            config = yaml.safe_load(doc["data"]["config.yaml"])
        if doc.get("kind") == "Deployment" and doc["metadata"]["name"].endswith("extender"):
            c = doc["spec"]["template"]["spec"]["containers"][0]
            args = [a for a in c.get("args", []) if not a.startswith(_SKIPPED_ARGS)]
    if config is None:
        raise RuntimeError("helm template rendered no scheduler configuration")
    config["leaderElection"] = {"leaderElect": False}
    return config, args


def stand_in_rows() -> str:
    """The simulation catalog's stand-ins for models the traces do not disclose (``model.STAND_INS``)
    as ``--catalog-file`` YAML, so the extender knows the GPUs of the fleet as the simulator does."""
    shipped = default_catalog().entries
    rows = [e.model_dump(by_alias=True, exclude_none=True, mode="json")
            for mid, e in simulation_catalog().entries.items() if mid not in shipped]
    return yaml.safe_dump(rows, sort_keys=False)


def replay_once(work: Path, fleet: Fleet, arrivals: list[SimPod], bounds: list[int], shares: Sequence[float], *,
                with_extender: bool, rate: float | None, seed: int, settle_seconds: float, publish_seconds: float,
                kill_at: float | None, workers: int = 8) -> dict[str, Any]:
    """One replay (module docstring); per share the figures after it settled."""
    scheduler = GPUPLACE if with_extender else PLAIN
    cp = ControlPlane(work, scheduler_configs=[])
    cp.start()
    replicas: list[Any] = []
    service = None
    try:
        api = cp.api_client()
        core = k8s.CoreV1Api(api)
        t0 = time.perf_counter()

        def make(n: SimNode) -> None:
            alloc, labels, taints, doc = fleet.node_object(n)
            doc = {**doc, "observedAt": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
            create_node(api, n.name, alloc, labels=labels, annotations={ANNOTATION: json.dumps(doc, separators=(",", ":"))})
            if taints:
                core.patch_node(n.name, {"spec": {"taints": taints}})

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(make, fleet.nodes))
        print(f"  {len(fleet.nodes)} nodes created in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        config, args = chart_rendered()
        if with_extender:
            print(f"  extender args from the chart: {' '.join(args)}", file=sys.stderr)
            catalog_file = work / "stand-ins.yaml"
            catalog_file.write_text(stand_in_rows(), encoding="utf-8")
            args = [*args, "--catalog-file", str(catalog_file)]
            for _ in range(2):
                replicas.append(start_extender(cp.kubeconfig_path, cp.logs, extra_args=args, wait_ready=300))
            service = TCPProxy([("127.0.0.1", r.port) for r in replicas], session_affinity=True,
                               ready_checks=[r.ready for r in replicas]).start()
            config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{service.port}"
            cp.add_scheduler(SchedulerSpec(name=scheduler, config=config))
        else:
            config.pop("extenders", None)
            config["profiles"][0]["schedulerName"] = scheduler
            cp.add_scheduler(SchedulerSpec(name=scheduler, config=config))
        plugin = DevicePlugin(api, fleet, seed, publish_seconds).start()
        watch = BindingWatch(cp, NAMESPACE, on_bound=plugin.on_bound)
        bodies = [pod_body(p, fleet, scheduler) for p in arrivals]
        rows: list[dict[str, Any]] = []
        killed: dict[str, Any] | None = None
        created = 0
        started = time.perf_counter()
        for share, bound in zip(shares, bounds):
            batch = bodies[created:bound]
            if kill_at is not None and killed is None and share > kill_at and with_extender and batch:
                # Killed halfway through this share's arrivals: pods keep coming while the replica is gone.
                box: list[dict[str, Any]] = []
                timer = threading.Timer(len(batch) / 2 / rate if rate else 0.5,
                                        lambda: box.append(_kill_sticky(replicas, service, plugin)))
                timer.start()
                _create(core, batch, rate, workers)
                timer.join()  # the kill, and the wait for the next binding, ran in the timer's thread
                killed = box[0]
            else:
                _create(core, batch, rate, workers)
            created = bound
            settled_in = _settle(core, plugin, settle_seconds)
            figures = plugin.figures(fleet.gpus)
            pending = _pending(core)
            rows.append({"share": share, "pods_arrived": created, "settle_s": round(settled_in, 1), **figures,
                         "pending": sum(pending.values()), "pending_reasons": dict(pending.most_common(6))})
            print(f"  {scheduler} share {share:.0%}: {created} pods, bound {figures['bound']}, milli-alloc "
                  f"{figures['milli_allocation_ratio']:.2%}, VRAM over-commits {figures['vram_overcommitted_gpus']}, "
                  f"pending {rows[-1]['pending']} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        if killed is not None:
            killed["after_kill"] = _rate_after(plugin, killed)
        watch.stop()
        plugin.stop()
        return {"shares": rows, "seconds": round(time.perf_counter() - started, 1), "replica_killed": killed}
    finally:
        if service is not None:
            service.stop()
        for r in replicas:
            r.stop()
        cp.stop()


def _create(core: k8s.CoreV1Api, bodies: list[dict[str, Any]], rate: float | None, workers: int) -> None:
    """Create ``bodies`` in order: at ``rate`` pods/s (each at its due time), or all at once (None)."""
    if rate is None:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda b: core.create_namespaced_pod(NAMESPACE, b), bodies))
        return
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        futures = []
        for k, b in enumerate(bodies):
            delay = start + k / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(core.create_namespaced_pod, NAMESPACE, b))
        for f in futures:
            f.result()


def _states(core: k8s.CoreV1Api) -> tuple[int, int, int]:
    """(pods, bound, marked unschedulable)."""
    items = orjson.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)["items"]
    bound = sum(1 for p in items if p["spec"].get("nodeName"))
    unsched = sum(1 for p in items if not p["spec"].get("nodeName") and any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" for c in (p.get("status") or {}).get("conditions") or []))
    return len(items), bound, unsched


def _settle(core: k8s.CoreV1Api, plugin: DevicePlugin, quiet: float, timeout: float = 900) -> float:
    """Wait until every pod is bound or marked unschedulable and no pod was bound for ``quiet``
    seconds; the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        total, bound, unsched = _states(core)
        last = plugin.bound_at[-1] if plugin.bound_at else start
        if bound + unsched >= total and time.monotonic() - last >= quiet:
            break
        time.sleep(2.0)
    return time.monotonic() - start


def _pending(core: k8s.CoreV1Api) -> Counter[str]:
    """Pending pods by the first clause of their PodScheduled message."""
    items = orjson.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)["items"]
    out: Counter[str] = Counter()
    for p in items:
        if p["spec"].get("nodeName"):
            continue
        msg = next((c.get("message") or "" for c in (p.get("status") or {}).get("conditions") or []
                    if c.get("type") == "PodScheduled"), "") or "not yet tried"
        out[_reason(msg)] += 1
    return out


def _reason(message: str) -> str:
    """A scheduler message with its numbers as N, so that alike messages count together."""
    return re.sub(r"\d+(\.\d+)?", "N", message)[:300]


def _kill_sticky(replicas: list[Any], service: TCPProxy | None, plugin: DevicePlugin) -> dict[str, Any]:
    sticky = next((r for r in replicas if service is not None and service._sticky is not None
                   and r.port == service._sticky.port), replicas[0])
    before = len(plugin.bound_at)
    at = time.monotonic()
    sticky.proc.kill()
    sticky.proc.wait()
    deadline = at + 120
    while len(plugin.bound_at) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    stalled = (plugin.bound_at[before] - at) if len(plugin.bound_at) > before else None
    print(f"  replica on port {sticky.port} killed after {before} bindings; next binding after "
          f"{stalled if stalled is None else round(stalled, 2)} s", file=sys.stderr)
    return {"bound_before": before, "killed_at": at, "next_binding_after_s": stalled}


def _rate_after(plugin: DevicePlugin, killed: dict[str, Any]) -> dict[str, float | None]:
    """Bindings per second in the 30 s before and after the kill."""
    at = killed.pop("killed_at")
    times = plugin.bound_at
    before = sum(1 for t in times if at - 30 <= t < at) / 30
    after = sum(1 for t in times if at <= t < at + 30) / 30
    return {"pods_per_s_30s_before": round(before, 2), "pods_per_s_30s_after": round(after, 2)}


def simulate_same(fleet: Fleet, arrivals: list[SimPod], engine: Engine, shares: Sequence[float], seed: int
                  ) -> dict[str, Any]:
    """``gpuplace simulate``'s gpuplace in the cluster sharing mode on the same arrivals and fleet."""
    t0 = time.perf_counter()
    snaps = run_fill(fleet.nodes, arrivals, GpuplacePolicy(engine), engine, shares, seed)
    capacity_milli = fleet.gpus * MILLI
    return {"seconds": round(time.perf_counter() - t0, 1), "shares": [
        {"share": s, "sim_milli_allocation_ratio": snaps[s].allocated_gpu_milli / capacity_milli,
         "sim_fgd_curve_milli_allocation_ratio": snaps[s].gpu_milli_allocation_ratio,
         "sim_vram_overcommitted_gpus": snaps[s].overcommitted_gpus,
         "sim_vram_overcommitted_pods": snaps[s].overcommitted_pods,
         "sim_vram_overcommitted_milli_ratio": snaps[s].overcommitted_milli / capacity_milli,
         "sim_pending": snaps[s].unplaced + snaps[s].cpu_only_unplaced} for s in shares]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_replay", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", required=True, help="openb pod list CSV")
    ap.add_argument("--fleet", required=True, help="openb node list CSV")
    ap.add_argument("--rate", default="20", metavar="PODS_PER_S|burst",
                    help="pods created per second within a share, or 'burst': each share at once (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="FGD's arrival order and tuning seed (default 0)")
    ap.add_argument("--json", metavar="OUT", help="write the report as JSON")
    ap.add_argument("--shares", default=",".join(map(str, DEFAULT_SHARES)), metavar="LIST",
                    help="arrival shares of the fleet's milli-GPUs where figures are read (default 0.1,...,1.0)")
    ap.add_argument("--replicas", type=int, default=device_plugin.DEFAULT_REPLICAS,
                    help="time-slicing replicas per GPU (default 4)")
    ap.add_argument("--time-sliced-share", default="auto", help="as gpuplace simulate's (default auto)")
    ap.add_argument("--kill-replica-at", type=float, default=None, metavar="SHARE",
                    help="SIGKILL the extender replica serving the scheduler during the share after this one")
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                    help="also replay with kube-scheduler's default profile and no extender (default on)")
    ap.add_argument("--gpuplace", action=argparse.BooleanOptionalAction, default=True,
                    help="replay with gpuplace (default on; --no-gpuplace: kube-scheduler alone, with --baseline)")
    ap.add_argument("--sim", action=argparse.BooleanOptionalAction, default=True,
                    help="also run gpuplace simulate's cluster sharing mode on the same pods (default on)")
    ap.add_argument("--settle-seconds", type=float, default=8, help="no binding for this long: settled (default 8)")
    ap.add_argument("--publish-seconds", type=float, default=0.5,
                    help="the emulated agent publishes allocations within this (default 0.5)")
    ap.add_argument("--limit-pods", type=int, default=None, help="replay only the first N arrivals (a small run)")
    args = ap.parse_args(argv)
    if not (args.gpuplace or args.baseline):
        ap.error("--no-gpuplace with --no-baseline replays nothing")
    rate = None if args.rate == "burst" else float(args.rate)
    shares = sorted(float(s) for s in args.shares.split(",") if s.strip())
    fleet, arrivals, engine = load(args.pods, args.fleet, args.seed, args.time_sliced_share, args.replicas, args.limit_pods)
    bounds = share_bounds(arrivals, fleet.gpus * MILLI, shares)
    print(f"replay: {len(fleet.nodes)} nodes ({sum(1 for n in fleet.nodes if n.sharing)} time-sliced x{args.replicas}), "
          f"{fleet.gpus} GPUs; {len(arrivals)} pods, seed {args.seed}, rate {args.rate}; {describe_machine(machine())}",
          file=sys.stderr)
    report: dict[str, Any] = {"date": dt.date.today().isoformat(), "pods_csv": args.pods, "fleet_csv": args.fleet,
                              "seed": args.seed, "rate": args.rate, "nodes": len(fleet.nodes), "gpus": fleet.gpus,
                              "time_sliced_nodes": sum(1 for n in fleet.nodes if n.sharing),
                              "time_sliced_share": fleet.share, "replicas": args.replicas, "pods": len(arrivals),
                              "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="gpuplace-replay-") as tmp:
        if args.sim:
            report["simulator"] = simulate_same(fleet, arrivals, engine, shares, args.seed)
            print(f"  simulator: {report['simulator']['seconds']} s", file=sys.stderr)
        kw = dict(rate=rate, seed=args.seed, settle_seconds=args.settle_seconds, publish_seconds=args.publish_seconds)
        if args.gpuplace:
            report["gpuplace"] = replay_once(Path(tmp) / "gpuplace", fleet, arrivals, bounds, shares,
                                             with_extender=True, kill_at=args.kill_replica_at, **kw)
        if args.baseline:
            report["kube_scheduler"] = replay_once(Path(tmp) / "plain", fleet, arrivals, bounds, shares,
                                                   with_extender=False, kill_at=None, **kw)
    report["by_share"] = merged(report, shares)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


def merged(report: dict[str, Any], shares: Sequence[float]) -> list[dict[str, Any]]:
    """Per share, the keys the issue names: gpuplace through the scheduler (``milli_allocation_ratio``),
    the simulator (``sim_milli_allocation_ratio``), kube-scheduler alone, over-commits, Pending."""
    out = []
    for k, s in enumerate(shares):
        row: dict[str, Any] = {"share": s}
        if "gpuplace" in report:
            g = report["gpuplace"]["shares"][k]
            row.update({key: g[key] for key in ("pods_arrived", "milli_allocation_ratio", "vram_overcommitted_gpus",
                                                "device_overcommits", "pending")})
        if "simulator" in report:
            row.update({key: v for key, v in report["simulator"]["shares"][k].items() if key != "share"})
        if "kube_scheduler" in report:
            b = report["kube_scheduler"]["shares"][k]
            row.update({"kube_scheduler_milli_allocation_ratio": b["milli_allocation_ratio"],
                        "kube_scheduler_vram_overcommitted_gpus": b["vram_overcommitted_gpus"],
                        "kube_scheduler_vram_overcommitted_pods": b["vram_overcommitted_pods"],
                        "kube_scheduler_vram_overcommitted_milli_ratio": b["vram_overcommitted_milli_ratio"],
                        "kube_scheduler_pending": b["pending"]})
        out.append(row)
    return out


def table(report: dict[str, Any]) -> str:
    cols = ["share", "gpuplace milli", "sim milli", "kube-sched milli", "VRAM over (g/k)", "device over", "pending (g/sim/k)"]
    rows = []
    for r in report["by_share"]:
        pct = lambda v: "-" if v is None else f"{v:.2%}"  # noqa: E731
        rows.append([f"{r['share']:.0%}", pct(r.get("milli_allocation_ratio")), pct(r.get("sim_milli_allocation_ratio")),
                     pct(r.get("kube_scheduler_milli_allocation_ratio")),
                     f"{r.get('vram_overcommitted_gpus', '-')}/{r.get('kube_scheduler_vram_overcommitted_gpus', '-')}",
                     str(r.get("device_overcommits", "-")),
                     f"{r.get('pending', '-')}/{r.get('sim_pending', '-')}/{r.get('kube_scheduler_pending', '-')}"])
    widths = [max(len(c), *(len(x[i]) for x in rows)) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, rows)])


if __name__ == "__main__":
    sys.exit(main())
