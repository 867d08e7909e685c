"""``gpuplace defrag`` (issue 27) on the real control plane: an 8-GPU pod waits while 16 GPUs are
free across four 8-GPU H100 nodes, none with 8; the plan makes room with the fewest moves, and
``--execute`` carries it out through the Eviction API until the pod binds, breaking no
PodDisruptionBudget and losing no pod.

Besides etcd, kube-apiserver and kube-scheduler (with the extender) this runs a
kube-controller-manager with only the ``replicaset`` and ``disruption`` controllers
(:meth:`tests.harness.controlplane.ControlPlane.start_controller_manager`): ReplicaSets recreate
evicted pods, and the disruption controller computes the budgets' status, without which the
Eviction API refuses to evict any pod a budget selects (and ``defrag`` counts such a pod as
protected). The nodes are fake (no kubelet): :class:`tests.harness.fakekubelet.FakeKubelet`
starts bound pods (``Running``, ``Ready``: the disruption controller counts Ready pods as healthy)
and ends evicted ones; before it starts a pod, the node's device plugin
(:class:`tests.harness.fakekubelet.FakeGpuNode`) gives it the first free GPUs and the agent
publishes ``allocatedTo``, for the fleet's pods as for the replacements, wherever kube-scheduler
binds them.

The fleet (every pod a ReplicaSet of 1; GPUs free in brackets)::

    defrag-h100-a  keep-a    1 GPU, movable, but its PodDisruptionBudget (minAvailable 1) allows
                             no disruption                                          [7 free]
    defrag-h100-b  mover-b1  2 GPUs, movable; mover-b2 2 GPUs, movable              [4 free]
    defrag-h100-c  pinned-c  3 GPUs, not opted in (no gpuplace.io/movable label)    [5 free]
    defrag-h100-d  full-d    8 GPUs, movable                                        [0 free]

The fewest moves, by hand: a node gives an 8-GPU pod room only once every pod on it is gone, so
``a`` (protected) and ``c`` (not movable) cannot; ``b`` needs 2 moves (both 2-GPU pods fit on
``a`` or ``c``); ``d`` needs 1 move whose 8-GPU replacement needs a whole node in turn (2 more
moves at least): 3. So the plan is ``b`` after exactly 2 moves, ``mover-b1`` and ``mover-b2``.
Without the budget it would be ``a`` after 1 move, and without the label check ``c`` after 1
move: the plan's node and length show that both are honoured.

The fleet is laid out by cordoning every node but the one being filled (the ReplicaSets carry no
node selector, so their replacements may go anywhere gpuplace's filter sends them).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness.controlplane import (
    ControlPlane, ExtenderSpec, SchedulerSpec, create_node, skip_if_e2e_disabled, wait_for,
)
from tests.harness.fakekubelet import FakeGpuNode, FakeKubelet, pod_event_records
from tests.harness.gpucluster import ROOT, ExtenderProcess, node_allocatable, start_extender

pytestmark = pytest.mark.e2e

NS = "default"
SCHEDULER = "gpuplace-defrag"
GPUPLACE = Path(sys.executable).with_name("gpuplace")  # the installed console script
MOVABLE_LABEL = "gpuplace.io/movable"
NOMINATED_ANNOTATION = "extender.gpuplace.io/nominated-node"
FLEET_LABEL = "gpuplace-e2e/defrag"

A, B, C, D = (f"defrag-h100-{x}" for x in "abcd")
NODES = (A, B, C, D)


@dataclass(frozen=True)
class Workload:
    """One ReplicaSet of the fleet (replicas 1): where its pod is first placed, its GPUs, whether it
    opts in to moves, whether a PodDisruptionBudget protects it."""

    name: str
    node: str
    gpus: int
    movable: bool = True
    budget: bool = False


FLEET = (
    Workload("keep-a", A, 1, budget=True),
    Workload("mover-b1", B, 2),
    Workload("mover-b2", B, 2),
    Workload("pinned-c", C, 3, movable=False),
    Workload("full-d", D, 8),
)
PENDING = "big-8gpu"
#: The plan, worked out by hand (module docstring).
PLAN_NODE, PLAN_MOVED = B, {"mover-b1", "mover-b2"}
EXECUTE_TIMEOUT = 120


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def h100_inventory(node: str) -> dict[str, Any]:
    """Eight H100 80GB on NVSwitch (every GPU an NVLink peer of every other), the defrag example's
    node with nothing allocated."""
    doc = json.loads((ROOT / "examples" / "defrag" / "cluster" / "gpu-h100-a.json").read_text())
    doc = copy.deepcopy(doc)
    for g in doc["gpus"]:
        g["allocatedTo"] = ""
    return {**doc, "nodeName": node, "observedAt": _now()}


@dataclass
class Fleet:
    cp: ControlPlane
    api: k8s.ApiClient
    extender: ExtenderProcess
    gpus: dict[str, FakeGpuNode]
    kubelet: FakeKubelet
    #: Pods the kubelet saw being deleted: name -> (uid, the pod's conditions then).
    evicted: dict[str, tuple[str, list[dict[str, Any]]]] = field(default_factory=dict)
    #: The first pod of each ReplicaSet: workload name -> (pod name, uid).
    original: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)


# ------------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------------


def replica_set(w: Workload) -> dict[str, Any]:
    labels = {"app": w.name, FLEET_LABEL: "true"}
    if w.movable:
        labels[MOVABLE_LABEL] = "true"
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": w.name, "namespace": NS, "labels": {FLEET_LABEL: "true"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": w.name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "schedulerName": SCHEDULER,
                    # An eviction leaves the pod Terminating until the (fake) kubelet ends it.
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {
                        "limits": {"nvidia.com/gpu": str(w.gpus)},
                        "requests": {"cpu": "10m", "memory": "16Mi"}}}],
                },
            },
        },
    }


def pending_pod() -> dict[str, Any]:
    """The 8-GPU pod that waits: owned by nothing (it is not moved, it is given room)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": PENDING, "namespace": NS, "labels": {FLEET_LABEL: "true"}},
        "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {
                     "limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "10m", "memory": "16Mi"}}}]},
    }


def pods_of(fleet: Fleet, w: Workload) -> list[k8s.V1Pod]:
    return fleet.core.list_namespaced_pod(NS, label_selector=f"app={w.name}").items


def gpus_requested(pod: k8s.V1Pod) -> int:
    return sum(int((c.resources.limits or {}).get("nvidia.com/gpu", 0)) for c in pod.spec.containers)


def cordon_all_but(api: k8s.ApiClient, node: str | None) -> None:
    core = k8s.CoreV1Api(api)
    for n in NODES:
        core.patch_node(n, {"spec": {"unschedulable": n != node and node is not None}})


def run_defrag(fleet: Fleet, *args: str, timeout: float) -> tuple[int, str, str]:
    proc = subprocess.run([str(GPUPLACE), "defrag", "--kubeconfig", str(fleet.cp.kubeconfig_path), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return proc.returncode, proc.stdout, proc.stderr


def diagnosis(fleet: Fleet) -> str:
    """What to print when an assertion fails: the pods, the fake agents' view, the pending pod's
    events, the extender's view and log tail."""
    pods = [(p.metadata.name, p.spec.node_name, p.status.phase, bool(p.metadata.deletion_timestamp))
            for p in fleet.core.list_namespaced_pod(NS).items]
    holders = {n: g.holders() for n, g in fleet.gpus.items()}
    try:
        view = json.loads(fleet.extender.get("/debug/allocations")[1])["nodes"]
    except Exception as exc:  # noqa: BLE001 - diagnosis only
        view = repr(exc)
    log = fleet.extender.log_path.read_text(errors="replace")[-3000:]
    return (f"\npods: {pods}\nGPUs held (fake agents): {holders}\nevicted: {fleet.evicted}\n"
            f"events of {PENDING}: {pod_event_records(fleet.api, NS, PENDING)}\n"
            f"kubelet errors: {fleet.kubelet.errors}\nextender's view: {view}\nextender log tail:\n{log}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Own control plane (a pending GPU pod here must be nobody else's business) with the
    controllers, four fake H100 nodes, the extender and its kube-scheduler, and the fleet laid out."""
    skip_if_e2e_disabled()
    t0 = time.monotonic()
    with ControlPlane(tmp_path_factory.mktemp("defrag-cp"), scheduler_configs=[]) as cp:
        cp.start_controller_manager(("replicaset", "disruption"))
        api = cp.api_client()
        gpus: dict[str, FakeGpuNode] = {}
        for name in NODES:
            inv = h100_inventory(name)
            create_node(api, name, node_allocatable(inv), labels={"gpuplace.io/fake-node": "true"})
            gpus[name] = FakeGpuNode(api, inv)
            gpus[name].publish()
        extender = start_extender(cp.kubeconfig_path, cp.logs)
        evicted: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        lock = threading.Lock()

        def on_running(pod: k8s.V1Pod) -> None:  # the device plugin, then the agent
            gpus[pod.spec.node_name].assign_free(f"{NS}/{pod.metadata.name}", gpus_requested(pod))

        def on_terminating(pod: k8s.V1Pod) -> None:  # containers stopped: the agent drops the pod
            with lock:
                evicted.setdefault(pod.metadata.name, (pod.metadata.uid, [
                    {"type": c.type, "status": c.status, "reason": c.reason} for c in pod.status.conditions or ()]))
            gpus[pod.spec.node_name].release(f"{NS}/{pod.metadata.name}")

        kubelet = FakeKubelet(cp.api_client(), NS, NODES, on_running=on_running, on_terminating=on_terminating)
        try:
            cp.add_scheduler(SchedulerSpec(name=SCHEDULER, extender=ExtenderSpec(url_prefix=extender.url)))
            with kubelet:
                f = Fleet(cp, api, extender, gpus, kubelet, evicted)
                lay_out(f)
                print(f"\nfleet up in {time.monotonic() - t0:.1f}s", file=sys.stderr)
                yield f
            assert not kubelet.errors, f"the fake kubelet failed: {kubelet.errors!r}"
        finally:
            cp.stop_scheduler(SCHEDULER)
            extender.stop()


def lay_out(fleet: Fleet) -> None:
    """Each node in turn the only schedulable one: its ReplicaSets created, their pods bound there
    and Running with their GPUs; then every node schedulable, the budget computed, and the 8-GPU
    pod created and refused."""
    apps, policy = k8s.AppsV1Api(fleet.api), k8s.PolicyV1Api(fleet.api)
    for node in NODES:
        cordon_all_but(fleet.api, node)
        here = [w for w in FLEET if w.node == node]
        for w in here:
            apps.create_namespaced_replica_set(NS, replica_set(w))

        def started() -> bool:
            for w in here:
                pods = pods_of(fleet, w)
                if len(pods) != 1 or pods[0].status.phase != "Running":
                    return False
            return True

        wait_for(started, 40, interval=0.2, message=f"the pods of {[w.name for w in here]} did not start on {node}"
                 + diagnosis(fleet))
        for w in here:
            pod = pods_of(fleet, w)[0]
            assert pod.spec.node_name == node, (w, pod.spec.node_name)
            fleet.original[w.name] = (pod.metadata.name, pod.metadata.uid)
    cordon_all_but(fleet.api, None)

    for w in FLEET:
        if w.budget:
            policy.create_namespaced_pod_disruption_budget(NS, {
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": f"{w.name}-pdb", "namespace": NS},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": w.name}}}})

    def budgets_computed() -> bool:
        for w in FLEET:
            if w.budget:
                b = policy.read_namespaced_pod_disruption_budget(f"{w.name}-pdb", NS)
                st = b.status
                if not st or st.observed_generation != b.metadata.generation or st.current_healthy != 1:
                    return False
        return True

    wait_for(budgets_computed, 30, interval=0.2, message="the disruption controller did not compute the budget")

    # The fake agents published every pod: the extender sees them on their GPUs.
    keys = {f"{NS}/{name}" for name, _ in fleet.original.values()}

    def extender_sees_them() -> bool:
        nodes = json.loads(fleet.extender.get("/debug/allocations")[1])["nodes"]
        held = {k for n in NODES for k in (nodes.get(n) or {}).get("heldUnits", {}).values()}
        return keys <= held

    wait_for(extender_sees_them, 30, interval=0.2, message="the extender does not see the fleet" + diagnosis(fleet))

    k8s.CoreV1Api(fleet.api).create_namespaced_pod(NS, pending_pod())
    wait_for(lambda: any(r == "FailedScheduling" for _t, r, _m in pod_event_records(fleet.api, NS, PENDING)), 30,
             interval=0.3, message=f"{PENDING} was not refused" + diagnosis(fleet))
    free = {n: sum(1 for ks in g.holders().values() if not ks) for n, g in fleet.gpus.items()}
    assert free == {A: 7, B: 4, C: 5, D: 0}, free  # 16 free, no node with 8


# ------------------------------------------------------------------------------------------------
# Tests (in order: the dry run first, then the execution)
# ------------------------------------------------------------------------------------------------


def test_dry_run_plans_the_fewest_moves_on_the_node_without_protected_or_unlabelled_pods(fleet):
    rc, out, err = run_defrag(fleet, "--json", timeout=60)
    print(f"\ngpuplace defrag --json:\n{out}{err}")
    assert rc == 0, (rc, out, err)
    doc = json.loads(out)
    assert doc["unplanned"] == [], doc
    assert len(doc["plans"]) == 1, doc
    plan = doc["plans"][0]
    assert plan["pod"] == f"{NS}/{PENDING}" and plan["exact"] is True, plan
    assert plan["node"] == PLAN_NODE, plan
    moved = {fleet.original[w][0]: w for w in PLAN_MOVED}
    assert len(plan["moves"]) == len(PLAN_MOVED) == 2, plan  # the minimum (module docstring)
    assert {m["pod"] for m in plan["moves"]} == {f"{NS}/{p}" for p in moved}, plan
    for m in plan["moves"]:
        assert m["from"] == PLAN_NODE and m["to"] in (A, C) and m["devices"] == 2, m
    # The protected pod and the pod that did not opt in are in no move.
    for w in ("keep-a", "pinned-c"):
        assert all(m["pod"] != f"{NS}/{fleet.original[w][0]}" for m in plan["moves"]), (w, plan)

    # A dry run changes nothing: no eviction, no hold on the node.
    time.sleep(1)
    assert fleet.evicted == {}, fleet.evicted
    pod = fleet.core.read_namespaced_pod(PENDING, NS)
    assert pod.spec.node_name is None and NOMINATED_ANNOTATION not in (pod.metadata.annotations or {}), pod.metadata


def test_execute_binds_the_8_gpu_pod_with_exactly_the_planned_evictions_no_budget_broken_no_pod_lost(fleet):
    why = lambda: diagnosis(fleet)  # noqa: E731
    keep_name, keep_uid = fleet.original["keep-a"]
    keep_seen_down: list[str] = []
    stop = threading.Event()

    def watch_budget() -> None:
        """The protected pod is never being deleted, never gone, never replaced, during the run."""
        core = k8s.CoreV1Api(fleet.cp.api_client())
        while not stop.is_set():
            try:
                p = core.read_namespaced_pod(keep_name, NS)
                if p.metadata.uid != keep_uid or p.metadata.deletion_timestamp is not None:
                    keep_seen_down.append(f"{p.metadata.uid} deletionTimestamp={p.metadata.deletion_timestamp}")
            except ApiException as exc:
                keep_seen_down.append(f"HTTP {exc.status}")
            stop.wait(0.2)

    watcher = threading.Thread(target=watch_budget, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        rc, out, err = run_defrag(fleet, "--execute", "--json", "--timeout-seconds", str(EXECUTE_TIMEOUT),
                                  timeout=EXECUTE_TIMEOUT + 30)
    finally:
        stop.set()
        watcher.join(timeout=5)
    took = time.monotonic() - t0
    print(f"\ngpuplace defrag --execute --json ({took:.1f}s):\n{out}{err}")
    assert rc == 0, f"exit {rc}: {out}{err}{why()}"
    doc = json.loads(out)
    assert doc["bound"] == 1, doc
    assert [p["node"] for p in doc["plans"]] == [PLAN_NODE] and len(doc["plans"][0]["moves"]) == 2, doc

    # The 8-GPU pod is bound to the plan's node and got all 8 of its GPUs (the device plugin's).
    pod = fleet.core.read_namespaced_pod(PENDING, NS)
    assert pod.spec.node_name == PLAN_NODE, why()
    wait_for(lambda: fleet.core.read_namespaced_pod(PENDING, NS).status.phase == "Running", 10, interval=0.1,
             message=f"{PENDING} not started" + why())
    assert fleet.gpus[PLAN_NODE].holders() == {i: [f"{NS}/{PENDING}"] for i in range(8)}, why()

    # Exactly the planned pods were evicted, through the Eviction API, one eviction per move.
    moved = {fleet.original[w][0]: fleet.original[w][1] for w in PLAN_MOVED}
    assert {n: uid for n, (uid, _) in fleet.evicted.items()} == moved, why()
    for name, (_, conditions) in fleet.evicted.items():
        assert {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"} in conditions, (
            name, conditions)
    evictions = [line for line in doc["executed"] if " evict " in line]
    assert len(evictions) == len(doc["plans"][0]["moves"]) == len(fleet.evicted) == 2, doc["executed"]
    assert all(line.endswith(": evicted") for line in evictions), evictions

    # No budget broken: the protected pod never went down, and its budget still holds.
    assert keep_seen_down == [], keep_seen_down
    keep = fleet.core.read_namespaced_pod(keep_name, NS)
    assert keep.metadata.uid == keep_uid and keep.metadata.deletion_timestamp is None, why()
    assert keep.spec.node_name == A and keep.status.phase == "Running", why()
    pdb = k8s.PolicyV1Api(fleet.api).read_namespaced_pod_disruption_budget("keep-a-pdb", NS)
    assert pdb.status.current_healthy == 1 and pdb.status.disruptions_allowed == 0, pdb.status

    # No pod lost: every ReplicaSet has its one pod Running and Ready, holding its GPUs; the pods
    # not moved are the same pods; the replacements are off the plan's node.
    apps = k8s.AppsV1Api(fleet.api)

    def all_ready() -> bool:
        return all((apps.read_namespaced_replica_set(w.name, NS).status.ready_replicas or 0) == 1 for w in FLEET)

    wait_for(all_ready, 30, interval=0.2, message="a ReplicaSet lacks its pod" + why())
    for w in FLEET:
        pods = [p for p in pods_of(fleet, w) if p.metadata.deletion_timestamp is None]
        assert len(pods) == 1, (w, [p.metadata.name for p in pods], why())
        p = pods[0]
        assert p.spec.node_name and p.status.phase == "Running", (w, p.spec.node_name, p.status.phase)
        held = [i for i, ks in fleet.gpus[p.spec.node_name].holders().items() if f"{NS}/{p.metadata.name}" in ks]
        assert len(held) == w.gpus, (w, p.spec.node_name, held, why())
        if w.name in PLAN_MOVED:
            assert p.metadata.uid != fleet.original[w.name][1] and p.spec.node_name != PLAN_NODE, (w, why())
        else:
            assert (p.metadata.name, p.metadata.uid) == fleet.original[w.name], (w, why())
            assert p.spec.node_name == w.node, (w, why())
    print(f"after: {[(p.metadata.name, p.spec.node_name) for p in fleet.core.list_namespaced_pod(NS).items]}")
