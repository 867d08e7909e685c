"""Extender metrics added for the chart's dashboard: placements when kube-scheduler skips prioritize,
estimated vs granted VRAM, failed nodes by resolvability, policy reloads from a ConfigMap."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s
from prometheus_client import generate_latest

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import default_policy
from scheduler_extender.service.metrics import ExtenderMetrics
from scheduler_extender.cluster.policy_configmap import PolicyConfigMapWatcher, engine_swapper, parse_ref
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.cluster.sources import StaticSource
from scheduler_extender.service.wire import parse_extender_args
from tests.factories import EXAMPLES, pod

NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))


def series(metrics: ExtenderMetrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


@pytest.fixture
def service():
    return ExtenderService(Engine(), StaticSource(EXAMPLES / "cluster", default_catalog()), ExtenderMetrics())


def args(p):
    return parse_extender_args(json.dumps({"Pod": p, "NodeNames": NODES}).encode())


def test_a_pod_only_one_node_can_take_counts_as_placed_at_filter_time(service):
    rocm = pod({"gpuplace.io/model-params": "1.3B", "gpuplace.io/precision": "fp16"}, resource="amd.com/gpu")
    assert service.filter(args(rocm))["NodeNames"] == ["gpu-amd-0"]
    m = series(service.metrics)
    assert m['gpuplace_extender_placements_total{model="radeon-vii",size_class="small"}'] == 1
    radeon_mib = json.loads((EXAMPLES / "cluster" / "gpu-amd-0.json").read_text())["gpus"][0]["memoryMiB"]
    assert m['gpuplace_extender_granted_gpu_memory_bytes_sum{size_class="small"}'] == radeon_mib * 2**20
    assert 0 < m['gpuplace_extender_vram_estimate_ratio_sum{size_class="small"}'] < 1
    # the other eight nodes can never run it: unresolvable
    assert m['gpuplace_extender_failed_nodes_total{resolvable="false"}'] == 8


def test_several_feasible_nodes_count_one_placement_at_prioritize_time(service):
    lora = pod({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"})
    assert len(service.filter(args(lora))["NodeNames"]) > 1
    assert not any(k.startswith("gpuplace_extender_placements_total") for k in series(service.metrics))
    service.prioritize(args(lora))
    m = series(service.metrics)
    assert sum(v for k, v in m.items() if k.startswith("gpuplace_extender_placements_total")) == 1


def test_policy_configmap_reference_must_be_namespace_slash_name():
    assert parse_ref("gpuplace/gpuplace-policy") == ("gpuplace", "gpuplace-policy")
    for bad in ("gpuplace-policy", "/x", "a/", "a/b/c"):
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            parse_ref(bad)


def test_a_broken_configmap_edit_keeps_the_running_policy_and_counts_a_rejection(service, caplog):
    # An API server nobody listens on: the Event cannot be recorded, which must not matter.
    cfg = k8s.Configuration(host="http://127.0.0.1:9")
    cfg.retries = 0
    w = PolicyConfigMapWatcher(k8s.ApiClient(cfg), "gpuplace", "gpuplace-policy", "policy.yaml", service.metrics)
    w._apply = engine_swapper(service)
    before = service.engine
    cm = {"metadata": {"name": "gpuplace-policy", "resourceVersion": "7"},
          "data": {"policy.yaml": "kind: PlacementPolicy\nscoring: {cost: lots}\n"}}
    assert w.handle(cm) is False
    assert service.engine is before
    assert w.handle(cm) is None  # the same broken text is not re-reported
    m = series(service.metrics)
    assert m['gpuplace_extender_policy_reloads_total{result="rejected"}'] == 1
    assert m["gpuplace_extender_policy_generation"] == 1
    assert "scoring.cost" in caplog.text and "keeping the running policy" in caplog.text

    good = default_policy().model_dump(by_alias=True, mode="json")
    good["scoring"]["cost"] = 9
    assert w.handle({**cm, "data": {"policy.yaml": json.dumps(good)}}) is True
    assert service.engine is not before and service.engine.policy.scoring.cost == 9
    assert series(service.metrics)["gpuplace_extender_policy_generation"] == 2


def test_the_policy_configmap_watch_applies_edits_rejects_broken_ones_and_relists_after_410(service):
    # The ConfigMap goes through watch.ResourceWatcher's list-then-watch loop: listed once,
    # then edited (broken, fixed), deleted (the policy stays), and after 410 Gone listed again.
    from tests.unit.test_watch import FakeResponse

    def cm(rv, cost):
        text = json.dumps({**default_policy().model_dump(by_alias=True, mode="json"),
                           "scoring": {**default_policy().model_dump(by_alias=True, mode="json")["scoring"],
                                       "cost": cost}}) if cost is not None else "scoring: {cost: lots}\n"
        return {"metadata": {"name": "gpuplace-policy", "resourceVersion": rv}, "data": {"policy.yaml": text}}

    w = PolicyConfigMapWatcher(k8s.ApiClient(), "gpuplace", "gpuplace-policy", "policy.yaml", service.metrics)
    script = [
        FakeResponse(data=json.dumps({"items": [cm("1", 7)], "metadata": {"resourceVersion": "1"}}).encode()),
        FakeResponse(lines=[{"type": "MODIFIED", "object": cm("2", None)},
                            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "3"}}},
                            {"type": "MODIFIED", "object": cm("4", 8)},
                            {"type": "DELETED", "object": cm("5", 8)},
                            {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}]),
        FakeResponse(data=json.dumps({"items": [cm("9", 9)], "metadata": {"resourceVersion": "9"}}).encode()),
    ]

    class FakeCore:
        def __init__(self):
            self.calls, self.events = [], []

        def list_namespaced_config_map(self, namespace, **kw):
            self.calls.append((namespace, kw))
            if not script:
                w.stop()
                return FakeResponse(lines=[])
            return script.pop(0)

        def create_namespaced_event(self, namespace, body, **kw):
            self.events.append(body.reason)

    w.core = FakeCore()
    w._apply = engine_swapper(service)
    costs = []
    swap = w._apply
    w._apply = lambda policy: (costs.append(policy.scoring.cost), swap(policy))
    w.run()
    assert costs == [7, 8, 9]  # the broken edit in between was not applied
    assert service.engine.policy.scoring.cost == 9
    assert w.core.events == ["PolicyApplied", "PolicyRejected", "PolicyApplied", "PolicyApplied"]
    assert series(service.metrics)['gpuplace_extender_policy_reloads_total{result="rejected"}'] == 1
    calls = w.core.calls
    assert all(ns == "gpuplace" and kw["field_selector"] == "metadata.name=gpuplace-policy" for ns, kw in calls)
    assert [kw.get("watch", False) for _, kw in calls][:3] == [False, True, False]
    assert calls[1][1]["resource_version"] == "1" and calls[3][1]["resource_version"] == "9"
