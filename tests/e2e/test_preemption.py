"""GPU-aware preemption (issue 27) on the real control plane: the extender's preemption controller
evicts the fewest lower-priority pods that make room by gpuplace's filter, and only those.

kube-scheduler preempts by counting resources. Every scenario here leaves enough GPUs (or
time-sliced replicas) free *by count* for the high-priority pod, so kube-scheduler's own
``DefaultPreemption`` plugin, which runs after the extender refused every node, finds that the pod
fits by count without any victim (``SelectVictimsOnNode`` reprieves them all) and drops the node as a
candidate (``DryRunPreemption`` keeps only candidates with victims): nothing it could do would help,
and it evicts nothing. What stands in the way is what only gpuplace sees: the free GPUs are not
NVLink peers, or a shared GPU's VRAM is taken. So any eviction seen here is gpuplace's.

Fake nodes have no kubelet; :class:`tests.harness.fakekubelet.FakeKubelet` plays it (bound pods
``Running``; an evicted pod, ``Terminating``, is deleted with grace 0) and
:class:`tests.harness.fakekubelet.FakeGpuNode` plays the device plugin and the agent (which pod holds
which GPU, published as ``allocatedTo``; an evicted pod's GPUs are freed before it is deleted).
The pods keep a 30 s ``terminationGracePeriodSeconds`` so that an eviction leaves them
``Terminating`` as on a real node (with 0 the API server would delete them at once).

What the tests rely on of the controller's contract: the extender flags ``--preemption
--preemption-lease NAMESPACE/NAME`` (it becomes leader on that Lease), the preemptor's annotation
``extender.gpuplace.io/nominated-node``, evictions through the Eviction API, and the Events on the
preemptor: Normal ``Preempting`` naming the node and the victims ("ns/name"), Warning
``PreemptionNotHelpful`` when no eviction can help.

Own control plane: a pending pod with a priority in another module's namespace must not be anybody's
preemptor here, nor a pod of this module another module's.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness.controlplane import (
    ControlPlane, ExtenderSpec, SchedulerSpec, create_node, skip_if_e2e_disabled, wait_for, wait_pod_scheduled,
)
from tests.harness.fakekubelet import FakeGpuNode, FakeKubelet, pod_event_records
from tests.harness.gpucluster import ROOT, ExtenderProcess, create_pods, gpu_pod_manifest, node_allocatable, start_extender

pytestmark = pytest.mark.e2e

NS = "default"
SCHEDULER = "gpuplace-preemption"
LEASE_NS, LEASE_NAME = "default", "gpuplace-preemption"
EXTENDER_ARGS: tuple[str, ...] = ("--preemption", "--preemption-lease", f"{LEASE_NS}/{LEASE_NAME}")
NOMINATED_ANNOTATION = "extender.gpuplace.io/nominated-node"
LOW, HIGH = "gpuplace-e2e-low", "gpuplace-e2e-high"
PRIORITIES = {LOW: 1000, HIGH: 100000}
SCENARIO_LABEL = "gpuplace-e2e/scenario"
#: How long to watch for evictions that must not come, after the last thing that could trigger one
#: (the controller looks about every second).
SETTLE_SECONDS = 8.0
BIND_TIMEOUT = 40.0

#: Labels GPU feature discovery puts on a node whose GPU the device plugin time-slices into 4
#: replicas (as in test_sharing.py); ``nvidia.com/gpu`` is then 4 per GPU.
TIME_SLICED_LABELS = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4",
                      "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090-SHARED"}


@dataclass
class Cluster:
    cp: ControlPlane
    api: k8s.ApiClient
    extender: ExtenderProcess


@dataclass
class FakeNode:
    """A fake GPU node of one scenario: its agent/device plugin, its kubelet, and what the kubelet
    saw of the preemptor when the first eviction arrived."""

    gpus: FakeGpuNode
    kubelet: FakeKubelet
    #: The preemptor's annotations when the first evicted pod reached the kubelet (None: none did).
    preemptor_annotations_at_eviction: dict[str, str] | None = None

    @property
    def name(self) -> str:
        return self.gpus.name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_if_e2e_disabled()
    with ControlPlane(tmp_path_factory.mktemp("preemption-cp"), scheduler_configs=[]) as cp:
        api = cp.api_client()
        scheduling = k8s.SchedulingV1Api(api)
        for name, value in PRIORITIES.items():
            scheduling.create_priority_class(k8s.V1PriorityClass(
                metadata=k8s.V1ObjectMeta(name=name), value=value, global_default=False,
                description=f"gpuplace preemption e2e test ({name})"))
        extender = start_extender(cp.kubeconfig_path, cp.logs, extra_args=EXTENDER_ARGS)
        try:
            cp.add_scheduler(SchedulerSpec(name=SCHEDULER, extender=ExtenderSpec(url_prefix=extender.url)))
            yield Cluster(cp, api, extender)
        finally:
            cp.stop_scheduler(SCHEDULER)
            extender.stop()


# ------------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------------


def wait_leader(api: k8s.ApiClient) -> None:
    """Only the leader acts, and a replica competes for the Lease once kube-scheduler calls it
    (``LeaderGate``'s serving): after the low-priority pods went through the extender, wait until
    it holds the Lease, so that the waits below do not include the election."""
    coordination = k8s.CoordinationV1Api(api)
    wait_for(lambda: coordination.read_namespaced_lease(LEASE_NAME, LEASE_NS).spec.holder_identity,
             30, interval=0.2, message=f"the extender never became leader on Lease {LEASE_NS}/{LEASE_NAME}")


def _now() -> str:
    import datetime as dt
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def nvlink_pairs_inventory(node: str) -> dict[str, Any]:
    """Four RTX A6000s joined by NVLink bridges in pairs, GPUs 0-1 and 2-3 (the example A6000
    node's pair, twice): two free GPUs make an NVLink pair only if they are 0-1 or 2-3."""
    doc = json.loads((ROOT / "examples" / "cluster" / "gpu-a6000-0.json").read_text())
    template = doc["gpus"][0]
    uuids = [f"GPU-7e1a0c55-0000-4000-8000-{node.encode().hex()[:8]:0>8}{i:04x}" for i in range(4)]
    gpus = []
    for i, uuid in enumerate(uuids):
        g = copy.deepcopy(template)
        g.update(index=i, uuid=uuid, pciBusId=f"00000000:{0x18 + 0x20 * i:02X}:00.0", allocatedTo="",
                 nvlinks=[{"peerUuid": uuids[i ^ 1], "links": 4}])
        gpus.append(g)
    return {**doc, "nodeName": node, "observedAt": _now(), "gpus": gpus}


def time_sliced_4090_inventory(node: str) -> dict[str, Any]:
    """One 24 GiB RTX 4090 (test_sharing.py's), which the device plugin time-slices into 4 replicas."""
    return {
        "apiVersion": "gpuplace.io/v1alpha1", "kind": "NodeGPUInventory", "nodeName": node,
        "observedAt": _now(), "driverVersion": "550.54.14",
        "gpus": [{"index": 0, "uuid": f"GPU-5a1c0e2b-7d1f-4a55-9c3e-{node.encode().hex()[:12]:0>12}",
                  "vendor": "nvidia", "name": "NVIDIA GeForce RTX 4090", "memoryMiB": 24564,
                  "computeCapability": "8.9", "eccEnabled": False, "healthy": True}],
    }


def gpu_pod(name: str, node: str, priority_class: str, gpus: int = 1,
            annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod for the gpuplace scheduler, pinned to ``node`` (kube-scheduler sends the extender that
    node only, so each scenario is alone on its node), with a PriorityClass."""
    m = gpu_pod_manifest(name, gpus, scheduler=SCHEDULER, annotations=annotations, node=node)
    m["metadata"]["labels"] = {SCENARIO_LABEL: node}
    m["spec"]["priorityClassName"] = priority_class
    m["spec"]["terminationGracePeriodSeconds"] = 30  # an eviction leaves it Terminating (module docstring)
    return m


def vram_pod(name: str, node: str, priority_class: str, vram: str) -> dict[str, Any]:
    """One replica of the time-sliced GPU, with its VRAM need."""
    return gpu_pod(name, node, priority_class, 1, {"gpuplace.io/vram": vram, "gpuplace.io/workload": "inference"})


@contextlib.contextmanager
def fake_node(cluster: Cluster, inventory: dict[str, Any], labels: Mapping[str, str] | None = None,
              preemptor: str | None = None) -> Iterator[FakeNode]:
    """Create the Node (allocatable as its device plugin would advertise it), publish its inventory,
    play its kubelet; at the end delete the scenario's pods and the Node."""
    api, name = cluster.api, inventory["nodeName"]
    allocatable = node_allocatable(inventory)
    if labels and "nvidia.com/gpu.replicas" in labels:
        allocatable["nvidia.com/gpu"] = str(int(allocatable["nvidia.com/gpu"]) * int(labels["nvidia.com/gpu.replicas"]))
    create_node(api, name, allocatable, labels=labels)
    gpus = FakeGpuNode(api, inventory)
    gpus.publish()
    node: FakeNode

    def on_terminating(pod: k8s.V1Pod) -> None:
        if preemptor is not None and node.preemptor_annotations_at_eviction is None:
            with contextlib.suppress(ApiException):
                meta = k8s.CoreV1Api(api).read_namespaced_pod(preemptor, NS).metadata
                node.preemptor_annotations_at_eviction = dict(meta.annotations or {})
        gpus.release(f"{NS}/{pod.metadata.name}")  # the agent: its containers stopped

    kubelet = FakeKubelet(cluster.cp.api_client(), NS, [name], on_terminating=on_terminating)
    node = FakeNode(gpus, kubelet)
    try:
        with kubelet:
            yield node
        assert not kubelet.errors, f"the fake kubelet failed: {kubelet.errors!r}"
    finally:
        core = k8s.CoreV1Api(api)
        core.delete_collection_namespaced_pod(NS, label_selector=f"{SCENARIO_LABEL}={name}", grace_period_seconds=0)
        core.delete_node(name)


def bind_low_priority_pods(cluster: Cluster, node: FakeNode, manifests: list[dict[str, Any]],
                           gpus_of: Mapping[str, tuple[int, ...]]) -> None:
    """Create the pods, wait until kube-scheduler bound them all to ``node``, give each its GPUs
    (the device plugin; the agent publishes ``allocatedTo``), and wait until the extender sees them
    (so that the next pod is decided on what the agent reported)."""
    names = create_pods(cluster.api, manifests)
    core = k8s.CoreV1Api(cluster.api)
    for n in names:
        assert wait_pod_scheduled(cluster.api, NS, n, timeout=30) == node.name, (n, pod_event_records(cluster.api, NS, n))
    wait_leader(cluster.api)
    for n in names:
        node.gpus.assign(f"{NS}/{n}", *gpus_of[n])
    keys = {f"{NS}/{n}" for n in names}

    def extender_sees_them() -> bool:
        view = json.loads(cluster.extender.get("/debug/allocations")[1])["nodes"].get(node.name) or {}
        if not keys <= set(view.get("pods", {})):
            return False
        if not any(len(ks) > 1 for ks in node.gpus.holders().values()):  # whole GPUs: pinned by allocatedTo
            return keys <= set(view.get("heldUnits", {}).values())
        return True

    wait_for(extender_sees_them, 30, interval=0.2, message=f"the extender never saw {sorted(keys)} on {node.name}")
    wait_for(lambda: all(core.read_namespaced_pod(n, NS).status.phase == "Running" for n in names), 10,
             interval=0.1, message="the fake kubelet did not start the pods")


def wait_refused(cluster: Cluster, pod: str, *fragments: str) -> str:
    """Wait for kube-scheduler's FailedScheduling event for ``pod`` carrying the extender's reason
    (every fragment); return its message."""
    def refusal() -> str | None:
        msgs = [m for _t, r, m in pod_event_records(cluster.api, NS, pod)
                if r == "FailedScheduling" and all(f in m for f in fragments)]
        return msgs[-1] if msgs else None

    return wait_for(refusal, 30, interval=0.3,
                    message=f"{pod}: no FailedScheduling event with {fragments}: {pod_event_records(cluster.api, NS, pod)}")


def still_running(cluster: Cluster, name: str, node: str) -> bool:
    """The pod exists, is not being deleted, and runs on ``node``."""
    try:
        pod = k8s.CoreV1Api(cluster.api).read_namespaced_pod(name, NS)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return pod.metadata.deletion_timestamp is None and pod.spec.node_name == node and pod.status.phase == "Running"


def held_units(cluster: Cluster, node: str) -> dict[str, str]:
    """The extender's ``GET /debug/allocations`` for ``node``: unit UUID -> the pod holding it."""
    view = json.loads(cluster.extender.get("/debug/allocations")[1])["nodes"].get(node) or {}
    return dict(view.get("heldUnits", {}))


def events_with(cluster: Cluster, pod: str, reason: str) -> list[tuple[str, str, str]]:
    return [e for e in pod_event_records(cluster.api, NS, pod) if e[1] == reason]


def diagnosis(cluster: Cluster, node: FakeNode, pod: str) -> str:
    """What to print when an assertion fails: the preemptor's events, what the kubelet deleted, the
    extender's view of the node and the tail of its log."""
    view = json.loads(cluster.extender.get("/debug/allocations")[1])["nodes"].get(node.name)
    log = cluster.extender.log_path.read_text(errors="replace")[-3000:]
    return (f"\nevents of {pod}: {pod_event_records(cluster.api, NS, pod)}\nterminated by the kubelet: "
            f"{node.kubelet.terminated}\nextender's view of {node.name}: {view}\nextender log tail:\n{log}")


# ------------------------------------------------------------------------------------------------
# Scenarios: the part up to the extender's refusal (works without the preemption controller)
# ------------------------------------------------------------------------------------------------

NVL_NODE, NVL_LOW, NVL_HIGH = "pre-nvlink-a6000", ("nvl-low-gpu0", "nvl-low-gpu3"), "nvl-high-pair"
TS_NODE, TS_LOW, TS_HIGH = "pre-shared-4090", ("ts-low-0", "ts-low-1", "ts-low-2"), "ts-high-14gi"
NH_NODE, NH_LOW, NH_KEEP, NH_HIGH = "pre-nohelp-4090", ("nh-low-0", "nh-low-1"), "nh-keep-high", "nh-high-20gi"


def nvlink_scenario(cluster: Cluster, node: FakeNode) -> str:
    """Low-priority 1-GPU pods on GPU 0 and GPU 3: GPUs 1 and 2 are free but not peers, so a
    2-GPU pod requiring NVLink is refused, although 2 of 4 GPUs are free by count."""
    bind_low_priority_pods(cluster, node, [gpu_pod(n, node.name, LOW) for n in NVL_LOW],
                           {NVL_LOW[0]: (0,), NVL_LOW[1]: (3,)})
    create_pods(cluster.api, [gpu_pod(NVL_HIGH, node.name, HIGH, 2, {"gpuplace.io/require": "nvlink"})])
    return wait_refused(cluster, NVL_HIGH, "all joined by NVLink", "gpuplace.io/require: nvlink")


def time_sliced_scenario(cluster: Cluster, node: FakeNode) -> str:
    """Three low-priority 7 GiB pods share the 24 GiB GPU (3 of 4 replicas): 3 GiB left, so a
    14 GiB pod is refused although a replica is free by count. One eviction leaves 10 GiB (too
    little), two leave 17 GiB."""
    bind_low_priority_pods(cluster, node, [vram_pod(n, node.name, LOW, "7Gi") for n in TS_LOW],
                           {n: (0,) for n in TS_LOW})
    create_pods(cluster.api, [vram_pod(TS_HIGH, node.name, HIGH, "14Gi")])
    return wait_refused(cluster, TS_HIGH, "GPU 0: 3 GiB of 24 GiB VRAM left (3 pods share it) < 14 GiB needed")


def no_help_scenario(cluster: Cluster, node: FakeNode) -> str:
    """The 24 GiB time-sliced GPU holds a 7 GiB pod of the *same* high priority as the preemptor
    (not a candidate: victims must have strictly lower priority) and two low-priority 7 GiB pods.
    A 20 GiB pod is refused for a reason eviction can fix in general (VRAM taken), but evicting both
    low-priority pods leaves 17 GiB: no eviction helps. kube-scheduler's own preemption cannot
    evict either: by its count a replica is free (3 of 4 taken), so it needs no victim."""
    bind_low_priority_pods(cluster, node, [vram_pod(NH_KEEP, node.name, HIGH, "7Gi")]
                           + [vram_pod(n, node.name, LOW, "7Gi") for n in NH_LOW],
                           {n: (0,) for n in (NH_KEEP, *NH_LOW)})
    create_pods(cluster.api, [vram_pod(NH_HIGH, node.name, HIGH, "20Gi")])
    return wait_refused(cluster, NH_HIGH, "GPU 0: 3 GiB of 24 GiB VRAM left (3 pods share it) < 20 GiB needed")


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------


def assert_preempted(cluster: Cluster, node: FakeNode, preemptor: str, victims: list[str], survivors: list[str]) -> None:
    """The preemptor is bound to the node; exactly ``victims`` were evicted (and deleted by the
    kubelet), ``survivors`` still run, also after a settle time; the nomination and the Event say so."""
    why = lambda: diagnosis(cluster, node, preemptor)  # noqa: E731
    assert wait_pod_scheduled(cluster.api, NS, preemptor, timeout=BIND_TIMEOUT) == node.name, why()
    time.sleep(3)  # no late, extra eviction once the preemptor is bound
    assert sorted(node.kubelet.terminated) == sorted(victims), why()
    assert all(still_running(cluster, s, node.name) for s in survivors), why()
    assert (node.preemptor_annotations_at_eviction or {}).get(NOMINATED_ANNOTATION) == node.name, (
        f"{NOMINATED_ANNOTATION} not set to {node.name} before the evictions: "
        f"{node.preemptor_annotations_at_eviction}{why()}")
    preempting = events_with(cluster, preemptor, "Preempting")
    assert preempting, why()
    ev_type, _, message = preempting[-1]
    print(f"\n{preemptor}: {preempting[-1]}")
    assert ev_type == "Normal", why()
    assert node.name in message and all(f"{NS}/{v}" in message for v in victims), why()
    assert not any(f"{NS}/{s}" in message for s in survivors), why()
    assert not events_with(cluster, preemptor, "PreemptionNotHelpful"), why()


def test_nvlink_pair_is_freed_by_evicting_exactly_one_low_priority_pod_and_the_preemptor_binds_on_it(cluster):
    with fake_node(cluster, nvlink_pairs_inventory(NVL_NODE), preemptor=NVL_HIGH) as node:
        nvlink_scenario(cluster, node)
        wait_for(lambda: node.kubelet.terminated, BIND_TIMEOUT, interval=0.2,
                 message=f"no pod evicted for {NVL_HIGH}{diagnosis(cluster, node, NVL_HIGH)}")
        # Evicting the pod on GPU 0 frees the pair 0-1; the pod on GPU 3, the pair 2-3: one of them.
        victim = node.kubelet.terminated[0]
        assert victim in NVL_LOW
        survivor = next(n for n in NVL_LOW if n != victim)
        assert_preempted(cluster, node, NVL_HIGH, [victim], [survivor])

        # Now exactly one NVLink pair is wholly free, the victim's: the device plugin gives it to
        # the preemptor, and the extender sees the preemptor hold both of its GPUs.
        free = {i for i, keys in node.gpus.holders().items() if not keys}
        free_pairs = [pair for pair in ((0, 1), (2, 3)) if set(pair) <= free]
        assert free_pairs == [(0, 1) if victim == NVL_LOW[0] else (2, 3)], (victim, free)
        node.gpus.assign(f"{NS}/{NVL_HIGH}", *free_pairs[0])
        wait_for(lambda: list(held_units(cluster, node.name).values()).count(f"{NS}/{NVL_HIGH}") == 2, 10,
                 interval=0.2, message=f"the extender does not see {NVL_HIGH} on GPUs {free_pairs[0]}")


def test_time_sliced_gpu_vram_is_freed_by_evicting_exactly_two_of_three_low_priority_pods(cluster):
    with fake_node(cluster, time_sliced_4090_inventory(TS_NODE), TIME_SLICED_LABELS, preemptor=TS_HIGH) as node:
        time_sliced_scenario(cluster, node)
        wait_for(lambda: len(node.kubelet.terminated) >= 2, BIND_TIMEOUT, interval=0.2,
                 message=f"not two pods evicted for {TS_HIGH}{diagnosis(cluster, node, TS_HIGH)}")
        victims = list(node.kubelet.terminated)
        assert len(victims) == 2 and set(victims) <= set(TS_LOW), diagnosis(cluster, node, TS_HIGH)
        survivor = next(n for n in TS_LOW if n not in victims)
        assert_preempted(cluster, node, TS_HIGH, victims, [survivor])


def test_a_pod_no_eviction_can_help_evicts_nothing_and_gets_a_preemption_not_helpful_warning(cluster):
    with fake_node(cluster, time_sliced_4090_inventory(NH_NODE), TIME_SLICED_LABELS, preemptor=NH_HIGH) as node:
        no_help_scenario(cluster, node)
        refused_at = time.monotonic()
        why = lambda: diagnosis(cluster, node, NH_HIGH)  # noqa: E731
        warning = wait_for(lambda: events_with(cluster, NH_HIGH, "PreemptionNotHelpful"), 20, interval=0.3,
                           message=f"no PreemptionNotHelpful event on {NH_HIGH}{why()}")[-1]
        print(f"\n{NH_HIGH}: {warning}")
        assert warning[0] == "Warning" and warning[2], why()
        time.sleep(max(0.0, SETTLE_SECONDS - (time.monotonic() - refused_at)))
        assert node.kubelet.terminated == [], why()
        assert all(still_running(cluster, n, node.name) for n in (NH_KEEP, *NH_LOW)), why()
        assert not events_with(cluster, NH_HIGH, "Preempting"), why()
        pod = k8s.CoreV1Api(cluster.api).read_namespaced_pod(NH_HIGH, NS)
        assert pod.spec.node_name is None and pod.status.phase == "Pending", why()
        assert NOMINATED_ANNOTATION not in (pod.metadata.annotations or {}), why()
