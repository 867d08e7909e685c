"""Prometheus metrics of the extender (prometheus-client; naming per the Prometheus guide).

All series live in one ``CollectorRegistry`` per server (tests build their own). Labels are
bounded: verb, HTTP code, outcome, criterion, GPU model, size class; never pod names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds; up to kube-scheduler's default extender httpTimeout (5 s)."""


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.request_duration = Histogram(
            "gpuplace_extender_request_duration_seconds", "Time to answer a kube-scheduler extender call.",
            ["verb"], buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter(
            "gpuplace_extender_requests_total", "Extender calls by verb and HTTP status code.",
            ["verb", "code"], registry=r)
        self.decisions = Counter(
            "gpuplace_extender_filter_decisions_total",
            "Filter calls by outcome: schedulable (some node passed), unschedulable, invalid (bad pod annotations), not_gpu.",
            ["outcome"], registry=r)
        self.rejections = Counter(
            "gpuplace_extender_node_rejections_total", "Nodes rejected by the filter, by criterion.",
            ["criterion"], registry=r)
        self.placements = Counter(
            "gpuplace_extender_placements_total",
            "Best-scored placements at prioritize time, by GPU model and size class.",
            ["model", "size_class"], registry=r)
        self.vram_estimate = Histogram(
            "gpuplace_extender_vram_estimate_bytes", "VRAM needed per GPU by filtered pods.",
            buckets=tuple(float(g * 2**30) for g in (4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 141, 192)),
            registry=r)
        self.cache_synced = Gauge(
            "gpuplace_extender_cache_synced", "1 when the node and pod caches are synced with the API server.",
            registry=r)
        self.inventory_errors = Gauge(
            "gpuplace_extender_inventory_rejected_nodes", "Nodes whose inventory is rejected: invalid, naming another node, or claiming more GPUs than the Node's allocatable.",
            registry=r)
        self.relists = Counter(
            "gpuplace_extender_watch_relists_total", "Full relists of a watched resource.", ["resource"], registry=r)
        self.policy_reloads = Counter(
            "gpuplace_extender_policy_reloads_total", "Policy reload attempts by result (applied, rejected).",
            ["result"], registry=r)
