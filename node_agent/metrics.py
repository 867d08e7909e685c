"""Prometheus metrics of the node agent.

Inventory gauges come from a custom ``Collector`` that reads the latest inventory snapshot at scrape
time, so series of a GPU that vanished (unplugged, fallen off the bus, MIG reconfigured) disappear
with it instead of lingering at their last value. The agent's own behaviour (probe duration and
errors, publish errors, last successful publish) uses plain client metrics. Names follow the
Prometheus naming guide: one ``gpuplace_`` prefix, base units, ``_total`` on counters only; labels
are bounded (node, GPU UUID, model, MIG profile), never pod names.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from node_agent.inventory import NodeGPUInventory

MIB = 1024 * 1024


class InventorySnapshot:
    """The latest inventory, shared between the probe loop (writer) and scrapes (readers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inventory: NodeGPUInventory | None = None

    def set(self, inventory: NodeGPUInventory) -> None:
        with self._lock:
            self._inventory = inventory

    def get(self) -> NodeGPUInventory | None:
        with self._lock:
            return self._inventory


class InventoryCollector(Collector):
    """Per-GPU gauges built from the snapshot at each scrape."""

    def __init__(self, snapshot: InventorySnapshot) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        # Declared up front so registration does not call collect() on an empty snapshot.
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        info, memory, mig, nvlink, healthy, ecc = families
        inventory = self._snapshot.get()
        if inventory is not None:
            node = inventory.node_name
            for gpu in inventory.gpus:
                mig_mode = "enabled" if gpu.mig_enabled else "disabled"
                info.add_metric([node, gpu.uuid, gpu.name, mig_mode], 1)
                memory.add_metric([node, gpu.uuid], gpu.memory_mib * MIB)
                for profile, count in sorted(Tally(m.profile for m in gpu.mig_devices).items()):
                    mig.add_metric([node, gpu.uuid, profile], count)
                nvlink.add_metric([node, gpu.uuid], sum(p.links for p in gpu.nvlinks))
                healthy.add_metric([node, gpu.uuid], 1 if gpu.healthy else 0)
                if gpu.ecc_enabled is not None:  # unknown stays absent, not 0
                    ecc.add_metric([node, gpu.uuid], 1 if gpu.ecc_enabled else 0)
        yield from families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        gpu = ["node", "gpu_uuid"]
        return [
            GaugeMetricFamily("gpuplace_gpu_info", "A GPU the agent saw (value 1); model and MIG mode as labels.",
                              labels=["node", "gpu_uuid", "model", "mig_mode"]),
            GaugeMetricFamily("gpuplace_gpu_memory_bytes", "Total VRAM of the GPU.", labels=gpu),
            GaugeMetricFamily("gpuplace_gpu_mig_devices", "MIG devices of the GPU by profile.",
                              labels=["node", "gpu_uuid", "profile"]),
            GaugeMetricFamily("gpuplace_gpu_nvlink_links", "Active NVLinks to other GPUs of the node (per peer, summed).",
                              labels=gpu),
            GaugeMetricFamily("gpuplace_gpu_healthy", "1 when the GPU may get work, 0 when the agent marked it unhealthy.",
                              labels=gpu),
            GaugeMetricFamily("gpuplace_gpu_ecc_enabled", "1 when ECC is on, 0 when off; absent when unknown.",
                              labels=gpu),
        ]


class AgentMetrics:
    """The agent's own metrics, registered on ``registry`` (tests pass their own)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.probe_duration = Histogram(
            "gpuplace_agent_probe_duration_seconds",
            "Time to read every GPU of the node (NVML or fake), allocations included.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self.probe_errors = Counter(
            "gpuplace_agent_probe_errors_total", "Probes that failed; the last inventory was kept.", registry=registry
        )
        self.publish_errors = Counter(
            "gpuplace_agent_publish_errors_total", "Node patches that failed (each attempt).", registry=registry
        )
        self.last_publish = Gauge(
            "gpuplace_agent_last_publish_timestamp_seconds",
            "Unix time of the last successful patch of the Node.",
            registry=registry,
        )


def build_registry(snapshot: InventorySnapshot, registry: CollectorRegistry | None = None) -> tuple[CollectorRegistry, AgentMetrics]:
    """A registry with the inventory collector and the agent metrics on it."""
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(InventoryCollector(snapshot))
    return registry, AgentMetrics(registry)
