"""`gpuplace explain` (static inventories) and the extender's `POST /explain` on a real server process."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import yaml

from tests.factories import EXAMPLES, ROOT, free_port, static_extender

NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))


def explain(*args):
    return subprocess.run([sys.executable, "-m", "scheduler_extender.gpuplace_cli", "explain", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_explain_shows_every_node_the_vram_terms_and_each_weighted_component_in_one_screen():
    out = explain(str(EXAMPLES / "pods" / "03-llm-13b-inference.yaml"), "--inventory-dir", str(EXAMPLES / "cluster"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) <= 25 and max(len(line) for line in lines) <= 140
    assert "VRAM per GPU: 30.3 GiB (estimate)" in out.stdout
    assert any("weights (13B x 2 B)" in line for line in lines)
    for n in NODES:
        assert sum(1 for line in lines if line.split()[1:2] == [n]) == 1, n
    a6000 = next(line for line in lines if " gpu-a6000-0 " in line)
    assert a6000.startswith("PASS") and "cost=1.00x5" in a6000 and "vramFit=0.67x2" in a6000
    assert next(line for line in lines if " gpu-4090-0 " in line).startswith("FAIL")
    # The MIG slice and the A6000 tie; kube-scheduler's own plugins decide (the e2e tests see the MIG node).
    assert lines[-1] == "best nodes: gpu-a6000-0, gpu-a100-mig-0 (tied at score 7: kube-scheduler's own scores pick one)"


def test_explain_json_gives_components_with_weights_and_the_estimate_terms():
    out = explain(str(EXAMPLES / "pods" / "02-llm-7b-lora.yaml"), "--inventory-dir", str(EXAMPLES / "cluster"), "--json")
    doc = json.loads(out.stdout)
    assert doc["bestNode"] in ("gpu-4090-0", "gpu-4090-1")
    assert sorted(doc["topNodes"]) == ["gpu-4090-0", "gpu-4090-1"]
    assert sum(t["bytes"] for t in doc["vramPerGpu"]["terms"]) == doc["vramPerGpu"]["bytesPerGpu"]
    best = next(n for n in doc["nodes"] if n["node"] == doc["bestNode"])
    assert best["components"]["cost"] == {"value": 1.0, "weight": 5.0}
    assert {n["node"] for n in doc["nodes"]} == set(NODES)


def test_explain_needs_a_cluster_and_says_so():
    out = explain(str(EXAMPLES / "pods" / "02-llm-7b-lora.yaml"))
    assert out.returncode == 2 and "--inventory-dir" in out.stderr and "--kubeconfig" in out.stderr


def test_explain_reports_an_unreachable_kubeconfig_without_a_traceback(tmp_path):
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}], "users": [{"name": "x", "user": {}}]}))
    out = explain(str(EXAMPLES / "pods" / "02-llm-7b-lora.yaml"), "--kubeconfig", str(cfg))
    assert out.returncode == 2 and "cannot read the cluster from --kubeconfig" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_extender_serves_explain_for_a_pod_object_and_refuses_anything_else():
    with static_extender() as url:
        pod = yaml.safe_load((EXAMPLES / "pods" / "03-llm-13b-inference.yaml").read_text())
        req = urllib.request.Request(f"{url}/explain", data=json.dumps(pod).encode(), method="POST")
        doc = json.loads(urllib.request.urlopen(req, timeout=5).read())
        assert doc["bestNode"] == "gpu-a6000-0"
        assert doc["vramPerGpu"]["summary"].startswith("13B inference")
        verdicts = {n["node"]: n["verdict"] for n in doc["nodes"]}
        assert verdicts["gpu-4090-0"] == "fail" and verdicts["gpu-a6000-0"] == "pass"
        assert set(verdicts) == set(NODES)
        bad = urllib.request.Request(f"{url}/explain", data=b'{"Pod": 1}', method="POST")
        try:
            urllib.request.urlopen(bad, timeout=5)
            raise AssertionError("expected HTTP 400")
        except urllib.error.HTTPError as e:
            assert e.code == 400 and "expected a Pod object" in json.loads(e.read())["Error"]
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        assert 'gpuplace_extender_requests_total{code="200",verb="explain"} 1.0' in metrics
        assert 'gpuplace_extender_requests_total{code="400",verb="explain"} 1.0' in metrics


def test_explain_shows_the_gpu_count_kubernetes_sums_with_sidecars_init_containers_and_overhead(tmp_path):
    pod_yaml = tmp_path / "sidecar.yaml"
    pod_yaml.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sidecar", "annotations": {"gpuplace.io/vram": "8Gi"}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                 "initContainers": [
                     {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                     {"name": "warmup", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
                 "overhead": {"nvidia.com/gpu": "1", "cpu": "250m"}}}))
    out = explain(str(pod_yaml), "--inventory-dir", str(EXAMPLES / "cluster"))
    assert out.returncode == 0, out.stderr
    # app 1 + sidecar 1 = 2; the warm-up runs beside the sidecar: 2 + 1 = 3; plus 1 of overhead.
    assert out.stdout.splitlines()[0] == "pod default/sidecar: 4x nvidia.com/gpu; vram 8 GiB"


def test_explain_shows_a_cpu_only_pods_summed_cpu_and_memory(tmp_path):
    pod_yaml = tmp_path / "cpu.yaml"
    pod_yaml.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu"},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                 "initContainers": [{"name": "log", "restartPolicy": "Always",
                                     "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}))
    out = explain(str(pod_yaml), "--inventory-dir", str(EXAMPLES / "cluster"))
    assert out.stdout.splitlines()[0] == "pod default/cpu: no GPU; cpu 1500m, memory 2 GiB", out.stdout + out.stderr


def test_explain_gives_every_score_component_its_weight_fragmentation_included():
    from node_agent.inventory import parse_inventory
    from scheduler_extender.core.catalog import default_catalog
    from scheduler_extender.core.devices import NodeAllocation, NodeState, build_node_view
    from scheduler_extender.core.engine import Engine
    from scheduler_extender.core.policy import default_policy
    from scheduler_extender.core.workload import WorkloadProfile, demand_shape
    from scheduler_extender.service.explain import component_weights, explain_decision
    from tests.factories import gpu, inventory, pod
    engine = Engine()

    def node(name, held):
        gs = [gpu(i) for i in range(2)]
        view = build_node_view(parse_inventory(inventory(name, gs)), default_catalog())
        return NodeState(name, view, NodeAllocation(held={gs[0]["uuid"]: "default/x"} if held else {}))

    # The workload wants two 4090s at once: a one-GPU pod on the empty node would break a pair.
    profile = WorkloadProfile(((demand_shape(engine.job(pod({}, gpus=2))), 1.0),))
    decision = engine.decide(pod({}, gpus=1), [node("half", True), node("empty", False)], None, None, workload=profile)
    doc = explain_decision(decision, default_policy())
    seen = {k: c["weight"] for n in doc["nodes"] for k, c in n.get("components", {}).items()}
    assert seen.get("fragmentation") == 100.0, seen
    assert all(w is not None for w in seen.values()), seen
    assert set(component_weights(default_policy())) == {"cost", "vramFit", "mig", "throughput", "nvlink", "ecc",
                                                        "packing", "fragmentation"}
