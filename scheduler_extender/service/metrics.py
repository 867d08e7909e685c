"""Prometheus metrics of the extender (prometheus-client; naming per the Prometheus guide).

All series live in one ``CollectorRegistry`` per server (tests build their own). Labels are
bounded: verb, HTTP code, outcome, criterion, GPU model, size class; never pod names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler_extender.core.criteria import CRITERION_NAMES

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
        for criterion in CRITERION_NAMES:  # every series from the start, at 0: a rate() over it never starts missing
            self.rejections.labels(criterion)
        self.placements = Counter(
            "gpuplace_extender_placements_total",
            "Placements by GPU model and size class: the best-scored node at prioritize time, or the only "
            "node that passed the filter (kube-scheduler then skips prioritize).",
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
        self.quality = PlacementQualityMetrics(r)
        self.policy = PolicyReloadMetrics(self.policy_reloads, r)
        self.requeue = RequeueMetrics(r)
        self.preemption = PreemptionMetrics(r)
        self.claims_written = Counter(
            "gpuplace_extender_claims_written_total",
            "ResourceClaims and opted-in pods the claim webhook answered (--claim-webhook-port), by outcome "
            "(written: a claim's GPU requests rewritten as firstAvailable in gpuplace's order; converted: a pod "
            "labelled gpuplace.io/dra made to name a claim template; left: not gpuplace's to write; refused: "
            "no device type fits the pod, or it cannot be decided now; error).", ["outcome"], registry=registry)
        self.tls_reloads = Counter(
            "gpuplace_extender_tls_certificate_reloads_total",
            "Renewed serving certificates (--tls-cert-file, --tls-key-file) by result: applied, or rejected "
            "(the pair does not load; the previous one is still served).", ["result"], registry=r)


# ---- additions for the Helm chart's dashboard and alerts (issue 4) ------------------------------

VRAM_RATIO_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
"""Estimated VRAM per GPU / VRAM of the GPU (or MIG device) the pod would get; 1.0 = exactly full."""

GPU_MEMORY_BUCKETS = tuple(float(g * 2**30) for g in (4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 141, 192, 256, 288))
"""Bytes; the VRAM sizes of common GPUs and MIG devices (10 GB MIG slice ... 192 GB MI300X, 256 GB
MI325X, 288 GB B300/GB300/MI355X)."""


class PlacementQualityMetrics:
    """Estimated versus granted VRAM and failed nodes by resolvability, on an extender registry.

    Separate from :class:`ExtenderMetrics` so that adding them changes none of its series.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.granted_memory = Histogram(
            "gpuplace_extender_granted_gpu_memory_bytes",
            "VRAM of the GPU or MIG device a placed pod gets (as counted by gpuplace_extender_placements_total), "
            "by size class.",
            ["size_class"], buckets=GPU_MEMORY_BUCKETS, registry=registry)
        self.vram_fit = Histogram(
            "gpuplace_extender_vram_estimate_ratio",
            "Estimated VRAM per GPU divided by the VRAM of the granted GPU or MIG device, by size class.",
            ["size_class"], buckets=VRAM_RATIO_BUCKETS, registry=registry)
        self.placed_estimate = Histogram(
            "gpuplace_extender_placed_vram_estimate_bytes",
            "Estimated VRAM per GPU of placed pods (compare with gpuplace_extender_granted_gpu_memory_bytes), "
            "by size class.", ["size_class"], buckets=GPU_MEMORY_BUCKETS, registry=registry)
        self.failed_nodes = Counter(
            "gpuplace_extender_failed_nodes_total",
            "Nodes the filter rejected, by whether preemption could help (resolvable true/false).",
            ["resolvable"], registry=registry)


class PolicyReloadMetrics:
    """Policy reloads: results, the generation in force and when each result last happened."""

    def __init__(self, reloads: Counter, registry: CollectorRegistry) -> None:
        self.reloads = reloads
        self.generation = Gauge(
            "gpuplace_extender_policy_generation",
            "Number of policies applied since start (1 = the policy loaded at start).", registry=registry)
        self.last_reload = Gauge(
            "gpuplace_extender_policy_last_reload_timestamp_seconds",
            "Unix time of the last policy reload attempt by result (applied, rejected).",
            ["result"], registry=registry)
        self.generation.set(1)

    def record(self, result: str) -> None:
        """Count a reload attempt; ``result`` is ``applied`` or ``rejected``."""
        self.reloads.labels(result).inc()
        self.last_reload.labels(result).set_to_current_time()
        if result == "applied":
            self.generation.inc()


class RequeueMetrics:
    """Pods the extender passed no node for, and their requeues once a node passes (``requeue.py``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.remembered = Gauge(
            "gpuplace_extender_rejected_pods",
            "Pods whose last filter answer passed no node, remembered for a requeue when a node passes.",
            registry=registry)
        self.requeued = Counter(
            "gpuplace_extender_requeued_pods_total",
            "Patches that send a rejected pod back to kube-scheduler's queue, by result (requeued; gone: "
            "the pod was deleted or recreated; forbidden: RBAC or the admission policy refused; error).",
            ["result"], registry=registry)


class PreemptionMetrics:
    """The preemption controller's work (``cluster.preemption``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.preemptions = Counter(
            "gpuplace_extender_preemptions_total",
            "Victim searches for pending pods, by outcome (started: a node nominated and its victims' evictions "
            "asked for; not_helpful: no eviction makes room).", ["outcome"], registry=registry)
        self.evictions = Counter(
            "gpuplace_extender_evictions_total",
            "Evictions asked for through the Eviction API, by result (evicted; gone; refused: a "
            "PodDisruptionBudget forbids it now; forbidden: RBAC or the admission policy; error), by the "
            "preemption controller and by defragmentation (--defrag-interval-seconds).",
            ["result"], registry=registry)
        self.defrag_moves_planned = Counter(
            "gpuplace_extender_defrag_moves_planned_total",
            "Moves in the defragmentation plans made (--defrag-interval-seconds; each pass plans anew).",
            registry=registry)
        self.defrag_plans = Counter(
            "gpuplace_extender_defrag_plans_total",
            "Defragmentation plans carried out, by outcome (bound: the waiting pod was bound; not_bound).",
            ["outcome"], registry=registry)
