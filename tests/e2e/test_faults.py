"""Faults on the real control plane: the extender's view converges to the API server's truth.

Setup (own control plane, so restarting the API server disturbs no other test): etcd,
kube-apiserver, kube-scheduler; four 8x A100 Nodes, each with a long-running
``gpuplace-agent --probe fake`` (heartbeat 3 s); two ``gpuplace-extender`` replicas in cluster
mode behind a TCP proxy that plays the Service (round-robin over replicas whose ``/readyz``
passes, as a readinessProbe does); the extenders reach the API server through a second proxy
that can cut their connections. Policy: the shipped one with ``inventory.staleAfterSeconds``
lowered to 15 s.

Faults, in order: API server restart while pods are scheduled; the extenders' watch
connections cut; their resourceVersion expired (``410 Gone``); one replica killed mid-burst;
an agent restarted with changed hardware; an inventory let go stale; a Node deleted with pods
on it; pods holding GPUs deleted. After each:

* both replicas' ``GET /debug/allocations`` equals the API server's bound pods, per node and
  resource, within a generous deadline; the time it took is printed (never asserted);
* no node is over-committed, in the API server (sum of requests <= allocatable) or in the
  extender (held units <= healthy units): no GPU counted for two pods;
* a new 8-GPU pod is bound, and only to a node with no other GPU pod and 8 healthy GPUs.

The API server serves pod watches from etcd (``--watch-cache-sizes=pods#0``) and the extenders
renew their watches every 5 s (``--watch-timeout-seconds 5``): compacting etcd then expires the
extenders' pod resourceVersion for real, as it happens in a cluster once the watch cache's
window has moved past a client that was away.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.harness.allocations import api_truth, extender_view, overcommit, view_diff, view_overcount
from tests.harness.controlplane import (
    skip_if_e2e_disabled,
    ControlPlane, ExtenderSpec, SchedulerSpec, create_node, free_port, pod_events, wait_for,
)
from tests.harness.gpucluster import (
    ROOT, SCHEDULER_NAME, ExtenderProcess, create_pods, gpu_pod_manifest, node_allocatable, start_extender,
    wait_placements,
)
from tests.harness.report import report
from tests.harness.tcpproxy import TCPProxy

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

NODES = [f"fault-a100-{i}" for i in range(4)]
GPU = "nvidia.com/gpu"
STALE_AFTER_SECONDS = 15
DEADLINE = 120.0
"""Failure deadline for convergence: generous on purpose (2 shared cores); not a speed check."""
LARGE = {"gpuplace.io/class": "large"}  # the shipped policy keeps A100-80GB for class large


@dataclass
class FaultCluster:
    cp: ControlPlane
    workdir: Path
    api_link: TCPProxy
    service: TCPProxy
    kubeconfig: Path
    policy: Path
    api: k8s.ApiClient
    replicas: list[ExtenderProcess] = field(default_factory=list)
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    inventories: dict[str, Path] = field(default_factory=dict)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def renew_client(self) -> None:
        """A fresh client after an API server restart (the old pool's connections died with it)."""
        self.api.close()
        self.api = self.cp.api_client()

    def start_replica(self, i: int, port: int | None = None) -> ExtenderProcess:
        ext = start_extender(self.kubeconfig, self.cp.logs, port=port, policy=self.policy, wait_ready=DEADLINE,
                             extra_args=["--watch-timeout-seconds", "5"])
        if i < len(self.replicas):
            self.replicas[i] = ext
        else:
            self.replicas.append(ext)
        return ext

    def start_agent(self, node: str) -> None:
        cmd = [sys.executable, "-m", "node_agent.cli", "--probe", "fake", "--fake-inventory",
               str(self.inventories[node]), "--node-name", node, "--kubeconfig", str(self.cp.kubeconfig_path),
               "--interval-seconds", "1", "--heartbeat-seconds", "3", "--metrics-port", "0"]
        with (self.cp.logs / f"agent-{node}.log").open("ab") as log:
            self.agents[node] = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT)

    def kill_agent(self, node: str) -> None:
        proc = self.agents.pop(node)
        proc.kill()
        proc.wait(timeout=10)

    def edit_inventory(self, node: str, gpu: int, healthy: bool) -> None:
        doc = json.loads(self.inventories[node].read_text())
        doc["gpus"][gpu]["healthy"] = healthy
        doc["gpus"][gpu]["healthReasons"] = [] if healthy else ["XID 79 (fell off the bus)"]
        self.inventories[node].write_text(json.dumps(doc, indent=2))


@pytest.fixture(scope="module")
def fc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:
    skip_if_e2e_disabled()
    workdir = tmp_path_factory.mktemp("faults")
    policy = workdir / "policy.yaml"
    doc = yaml.safe_load((ROOT / "scheduler_extender" / "data" / "default-policy.yaml").read_text())
    doc["inventory"]["staleAfterSeconds"] = STALE_AFTER_SECONDS
    policy.write_text(yaml.safe_dump(doc))
    with ControlPlane(workdir / "cp", scheduler_configs=[],
                      apiserver_extra_args=("--watch-cache-sizes=pods#0",)) as cp:
        api_port = int(cp.api_url.rsplit(":", 1)[1])
        api_link = TCPProxy([("127.0.0.1", api_port)]).start()
        kubeconfig = workdir / "kubeconfig-via-link"
        kubeconfig.write_text(cp.kubeconfig_path.read_text().replace(cp.api_url, f"https://127.0.0.1:{api_link.port}"))
        kubeconfig.chmod(0o600)
        replicas: list[ExtenderProcess] = []

        def ready_check(i: int) -> Any:
            return lambda: i < len(replicas) and replicas[i].get("/readyz")[0] == 200

        ports = [free_port(), free_port()]
        service = TCPProxy([("127.0.0.1", p) for p in ports], ready_checks=[ready_check(0), ready_check(1)])
        cluster = FaultCluster(cp, workdir, api_link, service, kubeconfig, policy, cp.api_client(), replicas)
        src = json.loads((ROOT / "examples" / "cluster" / "gpu-a100-80g-0.json").read_text())
        try:
            for node in NODES:
                inv = {**src, "nodeName": node}
                cluster.inventories[node] = workdir / f"{node}.json"
                cluster.inventories[node].write_text(json.dumps(inv, indent=2))
                create_node(cluster.api, node, node_allocatable(inv), labels={"gpuplace.io/fake-node": "true"})
                cluster.start_agent(node)
            for i, port in enumerate(ports):
                cluster.start_replica(i, port)
            service.start()
            cp.add_scheduler(SchedulerSpec(name=SCHEDULER_NAME, extender=ExtenderSpec(
                url_prefix=f"http://127.0.0.1:{service.port}")))
            wait_converged(cluster, "initial inventories")
            sampler = OvercountSampler(cluster).start()
            yield cluster
            sampler.stop()
            report(f"faults: {sampler.samples} samples of the replicas' views taken during all faults, "
                   f"{len(sampler.violations)} with a GPU counted twice")
            assert not sampler.violations, sampler.violations[:5]
        finally:
            cp.stop_scheduler(SCHEDULER_NAME)
            service.stop()
            for r in replicas:
                r.stop()
            for node in list(cluster.agents):
                cluster.kill_agent(node)
            api_link.stop()
            cluster.api.close()


# ---- truth, view, invariants -----------------------------------------------------------------
class OvercountSampler:
    """Samples every live replica's view all through the faults, not only once converged: no
    sample may count more units held on a node than the node has healthy."""

    def __init__(self, fc: FaultCluster) -> None:
        self.fc = fc
        self.samples = 0
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="overcount-sampler", daemon=True)

    def start(self) -> OvercountSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for i, ext in enumerate(list(self.fc.replicas)):
                try:
                    view = extender_view(ext)
                except (OSError, RuntimeError, ValueError):
                    continue  # a killed or restarting replica: nothing to check
                self.samples += 1
                self.violations += [f"replica {i}: {p}" for p in view_overcount(view)]


def wait_converged(fc: FaultCluster, what: str, since: float | None = None,
                   extra: Any = None) -> float:
    """Wait until every replica's view equals the API server's (and ``extra()`` holds); seconds from ``since``."""
    since = time.monotonic() if since is None else since
    last: list[str] = []

    def converged() -> bool:
        nonlocal last
        truth = api_truth(fc.core)
        views = [extender_view(r) for r in fc.replicas]
        last = [f"replica {i}: {p}" for i, v in enumerate(views) for p in view_diff(truth, v)]
        if extra is not None and not last:
            last = list(extra(views))
        if last:
            return False
        over = overcommit(fc.core, truth, views)
        assert not over, f"GPUs counted for two pods: {over}"
        return True

    try:
        wait_for(converged, DEADLINE, interval=0.2, message=f"extender did not converge after {what}",
                 fatal=(AssertionError,))
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {last[:6]}") from exc
    return time.monotonic() - since


def probe_8gpu_pod(fc: FaultCluster, after: str) -> str:
    """A new 8-GPU pod lands only on a node whose 8 GPUs are really free; returns that node."""
    name = "probe-8gpu-" + re.sub(r"[^a-z0-9]+", "-", after.lower()).strip("-")
    truth = api_truth(fc.core)
    create_pods(fc.api, [gpu_pod_manifest(name, 8)])
    if all(truth.get(n) for n in NODES):
        # No node is free: the pod must wait with a reason; then free the least used node.
        wait_for(lambda: pod_events(fc.api, "default", name), DEADLINE, interval=0.3, message="no scheduling event")
        assert not all_bound(fc, [name]), f"8-GPU pod bound while every node holds GPU pods: {truth}"
        least = min(NODES, key=lambda n: sum(sum(r.values()) for r in truth[n].values()))
        delete_pods(fc, [key.split("/", 1)[1] for key in truth[least]])
    placed = wait_placements(fc.api, [name], timeout=DEADLINE)[name]
    assert placed is not None, f"8-GPU pod not bound after {after}: {pod_events(fc.api, 'default', name)}"
    others = {k: v for k, v in api_truth(fc.core).get(placed, {}).items() if k != f"default/{name}"}
    assert not others, f"8-GPU pod bound to {placed}, where {others} hold GPUs"
    for view in (extender_view(r) for r in fc.replicas):
        assert view["nodes"][placed]["resources"][GPU]["allocatable"] == 8, view["nodes"][placed]
    fc.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    wait_converged(fc, f"deleting {name}")
    return placed


def burst(fc: FaultCluster, prefix: str, sizes: list[int], **kw: Any) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(len(sizes))]
    create_pods(fc.api, [gpu_pod_manifest(n, s, annotations=LARGE, **kw) for n, s in zip(names, sizes)])
    return names


def delete_pods(fc: FaultCluster, names: list[str]) -> None:
    for n in names:
        try:
            fc.core.delete_namespaced_pod(n, "default", grace_period_seconds=0)
        except k8s.ApiException as e:
            if e.status != 404:
                raise


def relists(ext: ExtenderProcess, resource: str) -> float:
    _, text = ext.get("/metrics")
    m = re.search(rf'gpuplace_extender_watch_relists_total{{resource="{resource}"}} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else 0.0


def assert_relisted(fc: FaultCluster, before: list[float], after_what: str) -> list[float]:
    after = [relists(r, "pods") for r in fc.replicas]
    assert all(a > b for a, b in zip(after, before)), f"no pod relist after {after_what}: {before} -> {after}"
    return after


def probe_then_clean_up(fc: FaultCluster, after: str, names: list[str]) -> None:
    probe_8gpu_pod(fc, after)
    delete_pods(fc, names)
    wait_converged(fc, "cleanup")


def gone_count(ext: ExtenderProcess) -> int:
    return ext.log_path.read_text(errors="replace").count("pods watch expired (410 Gone")


def all_bound(fc: FaultCluster, names: list[str]) -> bool:
    pods = {p.metadata.name: p.spec.node_name for p in fc.core.list_namespaced_pod("default").items}
    return all(pods.get(n) for n in names)


# ---- the faults ------------------------------------------------------------------------------
def test_apiserver_restart_while_pods_are_scheduled(fc: FaultCluster) -> None:
    names = burst(fc, "api", [1, 2, 1, 2, 1, 1])
    t_stop = time.monotonic()
    outage = fc.cp.restart_apiserver(down_seconds=5)
    back = time.monotonic()
    fc.renew_client()
    wait_for(lambda: all_bound(fc, names), DEADLINE, interval=0.3, message="burst not bound after the restart")
    bound_s = time.monotonic() - back
    converge_s = wait_converged(fc, "API server restart", since=back)
    log = fc.service.readiness_log
    for i in range(2):
        unready = [t for t, j, ok in log if j == i and not ok and t >= t_stop]
        assert unready, f"replica {i}: /readyz never went false while the API server was down ({log})"
        ready_again = wait_for(lambda: min((t for t, j, ok in log if j == i and ok and t > unready[0]), default=None),
                               DEADLINE, message=f"replica {i} never ready again in the Service")
        report(f"fault apiserver-restart: replica {i} /readyz false {unready[0] - t_stop:.1f}s after the stop, "
               f"true again {ready_again - back:+.1f}s after the API server was back")
    report(f"fault apiserver-restart: API server down {outage:.1f}s; burst of {len(names)} pods bound "
           f"{bound_s:.1f}s and extender view converged {converge_s:.1f}s after it was back")
    probe_then_clean_up(fc, "apiserver restart", names)


def test_cut_watch_connections_relist_and_converge(fc: FaultCluster) -> None:
    before = [relists(r, "pods") for r in fc.replicas]
    names = burst(fc, "cut", [2, 2])
    cut = fc.api_link.drop_connections()
    t0 = time.monotonic()
    delete_pods(fc, names[:1])
    names += burst(fc, "cut-late", [1, 1])
    converge_s = wait_converged(fc, "cut watch connections", since=t0)
    after = assert_relisted(fc, before, "the cut")
    report(f"fault watch-cut: {cut} connections cut; extender view converged {converge_s:.1f}s later "
           f"(pod relists per replica {before} -> {after})")
    probe_then_clean_up(fc, "watch cut", names)


def test_expired_resource_version_answers_410_and_the_extender_relists(fc: FaultCluster) -> None:
    names = burst(fc, "gone", [1, 1])
    wait_for(lambda: all_bound(fc, names), DEADLINE, message="pods not bound")
    wait_converged(fc, "binding")
    before = [relists(r, "pods") for r in fc.replicas]
    for i in range(3):  # move etcd's revision past the extenders' last pod event
        fc.core.create_namespaced_config_map("default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"bump-{i}")))
    gone_before = [gone_count(r) for r in fc.replicas]
    revision = fc.cp.compact_etcd()
    t0 = time.monotonic()

    def gone_logged() -> bool:
        return all(gone_count(r) > n for r, n in zip(fc.replicas, gone_before))

    wait_for(gone_logged, DEADLINE, interval=0.3, message="no 410 Gone in the extender logs after etcd compaction")
    gone_s = time.monotonic() - t0
    delete_pods(fc, names[:1])
    converge_s = wait_converged(fc, "410 Gone", since=t0)
    assert_relisted(fc, before, "410 Gone")
    report(f"fault 410-gone: etcd compacted at revision {revision}; both replicas got 410 Gone within {gone_s:.1f}s, "
           f"relisted, and converged {converge_s:.1f}s after the compaction")
    probe_then_clean_up(fc, "410 gone", names)


def test_one_of_two_replicas_killed_mid_burst(fc: FaultCluster) -> None:
    names = [f"rep-{i}" for i in range(16)]
    creator = threading.Thread(target=lambda: [(burst(fc, n, [1]), time.sleep(0.1)) for n in names])  # trickle
    creator.start()
    wait_for(lambda: sum(1 for n in names if all_bound(fc, [f"{n}-0"])) >= 3, DEADLINE, interval=0.05,
             message="burst did not start")
    victim = fc.replicas[0]
    victim.proc.send_signal(signal.SIGKILL)  # while kube-scheduler is calling it for the rest
    victim.proc.wait(timeout=10)
    t0 = time.monotonic()
    creator.join()
    names = [f"{n}-0" for n in names]
    wait_for(lambda: all_bound(fc, names), DEADLINE, interval=0.3, message="burst not bound with one replica")
    bound_s = time.monotonic() - t0
    failed = sum(1 for n in names for m in pod_events(fc.api, "default", n) if "extender" in m.lower())
    fc.start_replica(0, port=victim.port)
    wait_for(lambda: fc.service.backends[0].ready, DEADLINE, message="restarted replica never ready in the Service")
    back_s = time.monotonic() - t0
    converge_s = wait_converged(fc, "replica restart", since=t0)
    report(f"fault replica-killed: replica 0 killed mid-burst; all {len(names)} pods bound {bound_s:.1f}s later "
           f"({failed} scheduling attempts failed on the extender call and were retried by kube-scheduler); "
           f"replica 0 restarted, ready {back_s:.1f}s and views converged {converge_s:.1f}s after the kill")
    probe_then_clean_up(fc, "replica killed", names)


def test_agent_restart_publishes_changed_hardware(fc: FaultCluster) -> None:
    node = NODES[0]
    fc.kill_agent(node)
    fc.edit_inventory(node, 7, healthy=False)
    fc.start_agent(node)
    t0 = time.monotonic()

    def healthy_units(n: int) -> Any:
        return lambda views: [f"{node}: {v['nodes'][node]['resources'][GPU]}" for v in views
                              if v["nodes"][node]["resources"][GPU]["allocatable"] != n]

    converge_s = wait_converged(fc, "agent restart", since=t0, extra=healthy_units(7))
    report(f"fault agent-restart: restarted agent's report (GPU 7 unhealthy) seen by both replicas {converge_s:.1f}s "
           "after the restart")
    assert probe_8gpu_pod(fc, "agent restart") != node  # 7 healthy GPUs: never given an 8-GPU pod
    fc.edit_inventory(node, 7, healthy=True)
    wait_converged(fc, "GPU 7 healthy again", extra=healthy_units(8))


def test_stale_inventory_rejects_the_node_until_the_agent_is_back(fc: FaultCluster) -> None:
    node = NODES[1]
    fc.kill_agent(node)
    t0 = time.monotonic()

    def inventory_age() -> float:
        ann = fc.core.read_node(node).metadata.annotations["gpuplace.io/inventory"]
        observed = dt.datetime.fromisoformat(json.loads(ann)["observedAt"].replace("Z", "+00:00"))
        return (dt.datetime.now(dt.timezone.utc) - observed).total_seconds()

    wait_for(lambda: inventory_age() > STALE_AFTER_SECONDS + 1, DEADLINE, interval=0.5, message="never stale")
    name = "stale-pinned"
    create_pods(fc.api, [gpu_pod_manifest(name, 1, annotations=LARGE, node=node)])
    msg = wait_for(lambda: next((m for m in pod_events(fc.api, "default", name) if "stale" in m), None),
                   DEADLINE, interval=0.5, message="no 'stale' reason while the agent is down")
    assert "staleAfterSeconds" in msg and not all_bound(fc, [name])
    refused_s = time.monotonic() - t0
    fc.start_agent(node)
    t1 = time.monotonic()
    wait_for(lambda: all_bound(fc, [name]), DEADLINE, interval=0.3, message="pod not bound after the agent came back")
    report(f"fault stale-inventory: agent of {node} stopped; a pod pinned there was refused ('{msg[:60]}...') "
           f"{refused_s:.1f}s later (limit {STALE_AFTER_SECONDS}s), and bound {time.monotonic() - t1:.1f}s after "
           "the agent restarted")
    delete_pods(fc, [name])
    wait_converged(fc, "stale cleanup")
    probe_8gpu_pod(fc, "stale inventory")


def pin_and_bind(fc: FaultCluster, names: list[str], gpus: int, node: str) -> None:
    create_pods(fc.api, [gpu_pod_manifest(n, gpus, annotations=LARGE, node=node) for n in names])
    wait_for(lambda: all_bound(fc, names), DEADLINE, message=f"pods pinned to {node} not bound")
    wait_converged(fc, "binding")


def inventory_state_is(node: str, expected: str) -> Any:
    """A ``wait_converged`` extra check: every replica reports ``node``'s inventory as ``expected``."""
    def check(views: list[dict[str, Any]]) -> list[str]:
        states = [v["nodes"].get(node, {}).get("inventory") for v in views]
        return [f"{node}: {s}, expected {expected}" for s in states if s != expected]
    return check


def test_node_deleted_with_pods_on_it(fc: FaultCluster) -> None:
    node = NODES[2]
    names = [f"doomed-{i}" for i in range(2)]
    pin_and_bind(fc, names, 2, node)
    fc.core.delete_node(node)
    t0 = time.monotonic()
    gone_s = wait_converged(fc, "node deletion", since=t0, extra=inventory_state_is(node, "node unknown"))
    # No pod GC controller runs here: delete the orphans as it would, then the node re-registers.
    delete_pods(fc, names)
    create_node(fc.api, node, node_allocatable(json.loads(fc.inventories[node].read_text())),
                labels={"gpuplace.io/fake-node": "true"})
    t1 = time.monotonic()
    back_s = wait_converged(fc, "node re-registration", since=t1, extra=inventory_state_is(node, "ok"))
    report(f"fault node-deleted: both replicas dropped {node}'s inventory {gone_s:.1f}s after the deletion, kept its "
           f"2 pods visible until they were deleted, and saw the re-registered node's inventory {back_s:.1f}s later")
    probe_8gpu_pod(fc, "node deleted")


def test_deleted_pods_release_their_gpus(fc: FaultCluster) -> None:
    node = NODES[3]
    names = [f"holder-{i}" for i in range(4)]
    pin_and_bind(fc, names, 2, node)
    # The other nodes are busy: only the node freed below can take the 8-GPU pod.
    fillers = [f"filler-{i}" for i in range(3)]
    create_pods(fc.api, [gpu_pod_manifest(n, 1, annotations=LARGE, node=NODES[i]) for i, n in enumerate(fillers)])
    wait_for(lambda: all_bound(fc, fillers), DEADLINE, message="fillers not bound")
    delete_pods(fc, names)
    t0 = time.monotonic()
    converge_s = wait_converged(fc, "pod deletion", since=t0)
    landed = probe_8gpu_pod(fc, "pods deleted")
    report(f"fault pods-deleted: 4 pods holding all 8 GPUs of {node} deleted; both replicas freed them "
           f"{converge_s:.1f}s later; the 8-GPU pod then landed on {landed}")
    assert landed == node
    delete_pods(fc, fillers)
    wait_converged(fc, "cleanup")
