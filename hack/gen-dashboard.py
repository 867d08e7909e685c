#!/usr/bin/env python3
"""Write deploy/helm/gpuplace/files/dashboard.json, the chart's Grafana dashboard.

Generated rather than hand-edited so that every panel's PromQL sits in one readable table below;
``tests/unit/test_chart_files.py`` fails while the JSON is out of date, and the end-to-end test runs
every query against a real Prometheus. ``hack/render-dashboard.py`` draws it to a PNG.

    .venv/bin/python hack/gen-dashboard.py

Queries take ``max`` across extender replicas where each replica reports the same cluster-wide
gauge, and ``sum`` where each replica counts its own calls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "helm" / "gpuplace" / "files" / "dashboard.json"
RI = "$__rate_interval"

# (title, type, unit, width, height, [(expr, legend)], description)
ROWS: list[tuple[str, list[tuple[str, str, str, int, int, list[tuple[str, str]], str]]]] = [
    ("Where the GPUs are", [
        ("Pending GPU pods", "stat", "short", 6, 4,
         [("max(gpuplace_cluster_pending_gpu_pods)", "pods")],
         "Pods requesting GPUs that no node is bound to yet. `kubectl describe pod` shows the extender's reason per node."),
        ("Oldest pending GPU pod", "stat", "s", 6, 4,
         [("max(gpuplace_cluster_pending_gpu_pod_oldest_age_seconds)", "age")],
         "How long the longest-waiting GPU pod has waited."),
        ("Unhealthy GPUs", "stat", "short", 6, 4,
         [("count(gpuplace_gpu_healthy == 0) or vector(0)", "GPUs")],
         "GPUs an agent marked unhealthy (they get no work)."),
        ("Pending GPUs by resource", "stat", "short", 6, 4,
         [("max by (resource) (gpuplace_cluster_pending_gpus)", "{{resource}}")],
         "GPU devices requested by pending pods."),
        ("GPUs by model and state", "timeseries-stacked", "short", 12, 8,
         [("max by (model, state) (gpuplace_cluster_gpus)", "{{model}} {{state}}")],
         "Physical GPUs the agents report, by catalog model: free, allocated (held by a bound pod), "
         "unhealthy, or mig (partitioned; see MIG devices)."),
        ("MIG devices by profile and state", "timeseries-stacked", "short", 12, 8,
         [("max by (profile, state) (gpuplace_cluster_mig_devices)", "{{profile}} {{state}}")],
         "MIG devices (GPU instances) of partitioned GPUs."),
    ]),
    ("Where pods went and why pods wait", [
        ("Placements by GPU model", "timeseries-stacked", "ops", 8, 8,
         [(f"sum by (model) (rate(gpuplace_extender_placements_total[{RI}]))", "{{model}}")],
         "Best-scored placement per prioritize call (per filter call with extender.filterReturnsBest), "
         "by catalog model of the GPU the pod would get."),
        ("Placements by size class", "timeseries-stacked", "ops", 8, 8,
         [(f"sum by (size_class) (rate(gpuplace_extender_placements_total[{RI}]))", "{{size_class}}")],
         "Size class the policy assigned to each placed pod."),
        ("Filter decisions by outcome", "timeseries", "ops", 8, 8,
         [(f"sum by (outcome) (rate(gpuplace_extender_filter_decisions_total[{RI}]))", "{{outcome}}")],
         "unschedulable: no node passed; invalid: a pod annotation could not be parsed."),
        ("Node rejections by criterion", "timeseries-stacked", "ops", 12, 8,
         [(f"sum by (criterion) (rate(gpuplace_extender_node_rejections_total[{RI}]))", "{{criterion}}")],
         "Why nodes fail GPU pods: one series per filter criterion."),
        ("Rejected nodes: resolvable by preemption or not", "timeseries", "ops", 12, 8,
         [(f"sum by (resolvable) (rate(gpuplace_extender_failed_nodes_total[{RI}]))", "resolvable={{resolvable}}")],
         "resolvable=true: GPUs busy (preemption may help); false: the node can never run the pod."),
        ("Waiting pods requeued by the extender", "timeseries", "ops", 12, 8,
         [(f"sum by (result) (rate(gpuplace_extender_requeued_pods_total[{RI}]))", "{{result}}")],
         "A node now passes for a pod the extender had refused: it marked the pod so that kube-scheduler "
         "retries it at once. forbidden: RBAC or the admission policy refuses the mark."),
        ("Refused pods remembered for a requeue", "timeseries", "short", 12, 8,
         [("sum(gpuplace_extender_rejected_pods)", "pods")],
         "Pods whose last filter answer passed no node, summed over extender replicas."),
    ]),
    ("Is the estimate right-sized", [
        ("VRAM estimate / granted GPU memory (p50, p90)", "timeseries", "percentunit", 12, 8,
         [(f"histogram_quantile(0.5, sum by (le, size_class) (rate(gpuplace_extender_vram_estimate_ratio_bucket[{RI}])))",
           "p50 {{size_class}}"),
          (f"histogram_quantile(0.9, sum by (le, size_class) (rate(gpuplace_extender_vram_estimate_ratio_bucket[{RI}])))",
           "p90 {{size_class}}")],
         "Share of the granted GPU's (or MIG device's) VRAM the estimate fills; low values mean oversized GPUs."),
        ("Mean VRAM per GPU of placed pods: estimated vs granted", "timeseries", "bytes", 12, 8,
         [(f"sum by (size_class) (rate(gpuplace_extender_placed_vram_estimate_bytes_sum[{RI}])) / "
           f"sum by (size_class) (rate(gpuplace_extender_placed_vram_estimate_bytes_count[{RI}]))",
           "estimated {{size_class}}"),
          (f"sum by (size_class) (rate(gpuplace_extender_granted_gpu_memory_bytes_sum[{RI}])) / "
           f"sum by (size_class) (rate(gpuplace_extender_granted_gpu_memory_bytes_count[{RI}]))",
           "granted {{size_class}}")],
         "Average estimated VRAM per GPU of placed pods against the VRAM of the GPU or MIG device they get."),
    ]),
    ("Extender health", [
        ("Filter / prioritize latency p50, p99", "timeseries", "s", 8, 8,
         [(f"histogram_quantile(0.5, sum by (le, verb) (rate(gpuplace_extender_request_duration_seconds_bucket[{RI}])))",
           "p50 {{verb}}"),
          (f"histogram_quantile(0.99, sum by (le, verb) (rate(gpuplace_extender_request_duration_seconds_bucket[{RI}])))",
           "p99 {{verb}}")],
         "kube-scheduler gives up after the extender's httpTimeout; a filter timeout fails the scheduling cycle."),
        ("Requests by verb and code", "timeseries", "reqps", 8, 8,
         [(f"sum by (verb, code) (rate(gpuplace_extender_requests_total[{RI}]))", "{{verb}} {{code}}")],
         "HTTP status of extender calls; 5xx feeds the GpuplaceExtenderErrors alert."),
        ("Inventory age per node", "timeseries", "s", 8, 8,
         [("max by (node) (gpuplace_extender_inventory_age_seconds)", "{{node}}")],
         "Seconds since each node's agent observed its GPUs; the policy rejects stale inventories."),
        ("Nodes by inventory", "timeseries", "short", 8, 6,
         [("max by (inventory) (gpuplace_cluster_nodes)", "{{inventory}}")],
         "valid, invalid (annotation rejected) or missing inventory."),
        ("Cache synced (replicas)", "stat", "short", 4, 6,
         [("sum(gpuplace_extender_cache_synced)", "synced")],
         "Extender replicas whose Node/Pod caches are synced."),
        ("Policy generation", "stat", "short", 4, 6,
         [("max(gpuplace_extender_policy_generation)", "generation")],
         "Policies applied since start (1 = the one loaded at start)."),
        ("Policy reloads by result", "timeseries", "short", 8, 6,
         [("sum by (result) (gpuplace_extender_policy_reloads_total)", "{{result}}")],
         "rejected: an edit failed validation; its Event on the policy ConfigMap names the field."),
    ]),
]


def panel(pid: int, title: str, kind: str, unit: str, x: int, y: int, w: int, h: int,
          targets: list[tuple[str, str]], description: str) -> dict[str, Any]:
    stacked = kind == "timeseries-stacked"
    ptype = "timeseries" if kind.startswith("timeseries") else kind
    p: dict[str, Any] = {
        "id": pid, "type": ptype, "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [{"refId": chr(ord("A") + i), "expr": e, "legendFormat": lg,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}} for i, (e, lg) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }
    if ptype == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {
            "drawStyle": "line", "lineWidth": 1, "fillOpacity": 30 if stacked else 0,
            "stacking": {"mode": "normal" if stacked else "none", "group": "A"}}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    else:
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value", "graphMode": "none"}
        for t in p["targets"]:
            t["instant"] = True
    return p


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row_title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []})
        pid, y = pid + 1, y + 1
        x, row_h, col_y = 0, 0, y
        for title, kind, unit, w, h, targets, desc in row:
            if x + w > 24:  # wrap to the next line
                x, col_y, row_h = 0, col_y + row_h, 0
            panels.append(panel(pid, title, kind, unit, x, col_y, w, h, targets, desc))
            pid, x, row_h = pid + 1, x + w, max(row_h, h)
        y = col_y + row_h
    return {
        "uid": "gpuplace", "title": "gpuplace: GPU placement", "tags": ["gpuplace", "gpu", "scheduler"],
        "description": "Where the GPUs went, and why GPU pods wait. From gpuplace's extender and agent metrics.",
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)}")
