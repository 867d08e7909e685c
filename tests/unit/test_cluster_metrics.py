"""Scrape-time cluster gauges: GPUs by model and state, MIG devices, inventory age, pending GPU pods."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from node_agent.inventory import ANNOTATION
from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.cluster.cluster_metrics import ClusterStateCollector
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.cluster.pending import PendingGpuPods
from scheduler_extender.cluster.sources import ClusterSource

ROOT = Path(__file__).resolve().parents[2]


def node(name: str, observed: dt.datetime) -> dict:
    doc = json.loads((ROOT / "examples" / "cluster" / f"{name}.json").read_text())
    doc["observedAt"] = observed.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"name": name, "annotations": {ANNOTATION: json.dumps(doc)}}}


def pod(name: str, gpus: int, node_name: str | None = None, resource: str = "nvidia.com/gpu") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": name, "creationTimestamp": "2026-11-21T08:00:00Z"},
            "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {resource: str(gpus)}}}]},
            "status": {"phase": "Pending" if node_name is None else "Running"}}


def scrape(cache: ClusterCache, pending: PendingGpuPods | None = None) -> dict[str, float]:
    reg = CollectorRegistry()
    reg.register(ClusterStateCollector(ClusterSource(cache, default_catalog()), pending))
    out = {}
    for line in generate_latest(reg).decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_gpus_are_counted_by_model_and_state_and_a_gone_node_takes_its_series_along():
    now = dt.datetime.now(dt.timezone.utc)
    cache = ClusterCache(default_catalog())
    cache.replace_nodes([node("gpu-4090-0", now - dt.timedelta(seconds=42)), node("gpu-a100-mig-0", now)])
    cache.replace_pods([pod("a", 3, "gpu-4090-0")])
    m = scrape(cache)
    assert m['gpuplace_cluster_gpus{model="rtx-4090",state="allocated"}'] == 3
    assert m['gpuplace_cluster_gpus{model="rtx-4090",state="free"}'] == 1
    assert m['gpuplace_cluster_gpus{model="a100-sxm4-80gb",state="mig"}'] == 2
    assert m['gpuplace_cluster_mig_devices{model="a100-sxm4-80gb",profile="3g.40gb",state="free"}'] == 4
    assert 42 <= m['gpuplace_extender_inventory_age_seconds{node="gpu-4090-0"}'] < 60
    cache.apply_node_event("DELETED", {"metadata": {"name": "gpu-4090-0"}})
    m = scrape(cache)
    assert not [k for k in m if "gpu-4090-0" in k or "rtx-4090" in k]


def test_nodes_without_or_with_a_broken_inventory_are_counted_apart():
    cache = ClusterCache(default_catalog())
    cache.replace_nodes([{"metadata": {"name": "plain"}},
                         {"metadata": {"name": "broken", "annotations": {ANNOTATION: "{not json"}}}])
    m = scrape(cache)
    assert (m['gpuplace_cluster_nodes{inventory="missing"}'], m['gpuplace_cluster_nodes{inventory="invalid"}'],
            m['gpuplace_cluster_nodes{inventory="valid"}']) == (1, 1, 0)


def test_pending_gpu_pods_are_counted_until_bound_and_cpu_pods_never():
    pending = PendingGpuPods()
    pending.replace_pods([pod("wait-1", 2), pod("wait-2", 1, resource="amd.com/gpu"),
                          {"metadata": {"name": "cpu", "uid": "cpu"}, "spec": {"containers": [{}]}}])
    m = scrape(ClusterCache(default_catalog()), pending)
    assert m["gpuplace_cluster_pending_gpu_pods"] == 2
    assert m['gpuplace_cluster_pending_gpus{resource="nvidia.com/gpu"}'] == 2
    assert m["gpuplace_cluster_pending_gpu_pod_oldest_age_seconds"] > 0
    pending.apply_pod_event("DELETED", pod("wait-1", 2))  # bound: it left the field selector
    pending.apply_pod_event("MODIFIED", pod("wait-2", 1, "gpu-amd-0", "amd.com/gpu"))
    m = scrape(ClusterCache(default_catalog()), pending)
    assert m["gpuplace_cluster_pending_gpu_pods"] == 0
    assert "gpuplace_cluster_pending_gpu_pod_oldest_age_seconds" not in m
