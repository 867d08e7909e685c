"""Scrape-time gauges of the cluster's GPUs, inventories and waiting GPU pods.

A custom ``Collector`` (client_python's pattern for state owned elsewhere) reads the extender's
node states and the pending-pod tracker at each scrape, so a node or GPU that disappears takes its
series with it instead of leaving a stale value. Labels are bounded: GPU model (catalog id),
MIG profile, state, node name (inventory age only), resource name; never pod names.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter as Tally
from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler_extender.core.requirements import NVIDIA_GPU
from scheduler_extender.core.devices import NodeState, Unit
from scheduler_extender.cluster.pending import PendingGpuPods
from scheduler_extender.cluster.reservations import OUTCOMES
from scheduler_extender.cluster.sources import StateSource


def _model(unit: Unit) -> str:
    return unit.entry.id if unit.entry is not None else unit.name


def unit_states(state: NodeState) -> dict[str, str]:
    """unit UUID -> ``free`` | ``allocated`` | ``unhealthy`` for every schedulable unit of a node.

    Units held by name are allocated; each resource's anonymous count (pods whose devices the
    agent has not named) marks that many of the remaining healthy units allocated, in index order.
    A shared GPU (``core.sharing``) is allocated while a pod holds one of its replicas; pods the
    agent has not placed yet count as anonymous.
    """
    out: dict[str, str] = {}
    if state.view is None:
        return out
    held = state.allocation.held
    if state.view.sharing is not None:  # a shared GPU is allocated while a pod holds one of its replicas
        shared = state.allocation.shared
        held = {**held, **{uuid: "" for uuid, pods in shared.items() if pods}}
    for resource, units in state.view.units_by_resource.items():
        anonymous = state.allocation.anonymous.get(resource, 0)
        if state.view.sharing is not None and resource == NVIDIA_GPU:
            anonymous = min(len(units), len(state.allocation.shared_unplaced))  # on some GPU each, at most all
        for u in units:
            if not u.healthy:
                out[u.uuid] = "unhealthy"
            elif u.uuid in held:
                out[u.uuid] = "allocated"
            elif anonymous > 0:
                out[u.uuid] = "allocated"
                anonymous -= 1
            else:
                out[u.uuid] = "free"
    return out


class ClusterStateCollector(Collector):
    """GPU, MIG device, inventory and pending-pod gauges computed from ``source`` at scrape time."""

    def __init__(self, source: StateSource, pending: PendingGpuPods | None = None) -> None:
        self._source = source
        self._pending = pending

    def describe(self) -> Iterator[Metric]:
        yield from self._families()  # declared up front: registration must not scrape
        yield from self._reservation_families()

    def collect(self) -> Iterator[Metric]:
        yield from self._collect_states()
        counts = getattr(getattr(self._source, "cache", None), "reservation_counts", None)
        if counts is not None:
            held, made, ended = counts()
            held_fam, made_fam, ended_fam = fams = self._reservation_families()
            held_fam.add_metric([], held)
            made_fam.add_metric([], made)
            for outcome in OUTCOMES:
                ended_fam.add_metric([outcome], ended.get(outcome, 0))
            yield from fams

    @staticmethod
    def _reservation_families() -> tuple[GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily("gpuplace_extender_reservations",
                              "Pods this extender sent to a node and holds there (GPUs, a shared GPU's VRAM, CPU, "
                              "memory) until the watch shows them bound."),
            CounterMetricFamily("gpuplace_extender_reservations_made",
                                "Reservations made: a /filter answer sent a pod to nodes."),
            CounterMetricFamily("gpuplace_extender_reservations_ended",
                                "Reservations ended, by outcome: confirmed (bound where reserved), bound_elsewhere, "
                                "released (pod deleted or ended), replaced (kube-scheduler asked about the pod "
                                "again), expired (no binding within --reservation-seconds).",
                                labels=["outcome"]),
        )

    def _collect_states(self) -> Iterator[Metric]:
        gpus, migs, nodes, age, pending_pods, pending_gpus, oldest = fams = self._families()
        now = self._source.now()
        gpu_tally: Tally[tuple[str, str]] = Tally()
        mig_tally: Tally[tuple[str, str, str]] = Tally()
        node_tally: Tally[str] = Tally()
        for st in self._source.states(self._source.node_names(), None):
            if st.view is None:
                node_tally["invalid" if st.inventory_error else "missing"] += 1
                continue
            node_tally["valid"] += 1
            if now is not None:
                age.add_metric([st.name], max(0.0, (now - st.view.observed_at).total_seconds()))
            states = unit_states(st)
            models: dict[str, str] = {}
            for u in st.view.all_units:
                models.setdefault(u.gpu_uuid, _model(u))
                if u.kind == "mig":
                    mig_tally[(_model(u), u.mig_profile or "", states.get(u.uuid, "free"))] += 1
                else:
                    gpu_tally[(_model(u), states.get(u.uuid, "free"))] += 1
            for uuid, name in st.view.mig_gpus:
                gpu_tally[(models.get(uuid, name), "mig")] += 1
        for (model, state), n in sorted(gpu_tally.items()):
            gpus.add_metric([model, state], n)
        for (model, profile, state), n in sorted(mig_tally.items()):
            migs.add_metric([model, profile, state], n)
        for inv in ("valid", "invalid", "missing"):
            nodes.add_metric([inv], node_tally[inv])
        if self._pending is not None:
            waiting = self._pending.snapshot()
            pending_pods.add_metric([], len(waiting))
            per_resource: Tally[str] = Tally()
            for p in waiting:
                per_resource.update(p.requests)
            for resource, n in sorted(per_resource.items()):
                pending_gpus.add_metric([resource], n)
            created = [p.created for p in waiting if p.created is not None]
            if created:
                oldest.add_metric([], (dt.datetime.now(dt.timezone.utc) - min(created)).total_seconds())
        yield from fams

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily("gpuplace_cluster_gpus",
                              "Physical GPUs by model and state: free, allocated, unhealthy, or mig "
                              "(partitioned; its devices are in gpuplace_cluster_mig_devices).",
                              labels=["model", "state"]),
            GaugeMetricFamily("gpuplace_cluster_mig_devices", "MIG devices by GPU model, profile and state.",
                              labels=["model", "profile", "state"]),
            GaugeMetricFamily("gpuplace_cluster_nodes",
                              "Nodes the extender knows, by inventory: valid, invalid (rejected annotation), missing.",
                              labels=["inventory"]),
            GaugeMetricFamily("gpuplace_extender_inventory_age_seconds",
                              "Seconds since the node's agent observed its GPUs (inventory observedAt).",
                              labels=["node"]),
            GaugeMetricFamily("gpuplace_cluster_pending_gpu_pods", "Pods requesting GPUs that no node is bound to yet."),
            GaugeMetricFamily("gpuplace_cluster_pending_gpus", "GPU devices requested by pending pods, by resource.",
                              labels=["resource"]),
            GaugeMetricFamily("gpuplace_cluster_pending_gpu_pod_oldest_age_seconds",
                              "Age of the oldest pending GPU pod; absent when none waits."),
        ]
