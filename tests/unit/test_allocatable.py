"""An inventory is not trusted blindly: the Node's status.allocatable may not be contradicted."""

import datetime as dt
import json

import pytest
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from node_agent.inventory import parse_inventory
from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.allocatable import allocatable_contradiction, gpu_allocatable
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.devices import build_node_view
from scheduler_extender.core.engine import Engine
from scheduler_extender.service.metrics import ExtenderMetrics
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.server import create_app
from scheduler_extender.cluster.sources import ClusterSource
from tests.factories import example_inventory, gpu, inventory, pod


def view(doc):
    return build_node_view(parse_inventory(doc), default_catalog())


def node(name, inv, allocatable=None, labels=None):
    obj = {"metadata": {"name": name, "labels": labels or {},
                        "annotations": {"gpuplace.io/inventory": json.dumps(inv)}}}
    if allocatable is not None:
        obj["status"] = {"allocatable": {"cpu": "64", "pods": "110", **allocatable}}
    return obj


MIXED_MIG = inventory("n1", [gpu(0, "NVIDIA A100-SXM4-80GB", 81920, migEnabled=True, migDevices=[
    {"uuid": "MIG-a", "profile": "3g.40gb", "memoryMiB": 40192},
    {"uuid": "MIG-b", "profile": "3g.40gb", "memoryMiB": 40192}])], migStrategy="mixed")


@pytest.mark.parametrize("doc, allocatable, contradicted", [
    (inventory("n1", [gpu(i) for i in range(8)]), {"nvidia.com/gpu": 2}, "8 healthy nvidia.com/gpu, but the Node's status.allocatable has 2"),
    (inventory("n1", [gpu(i) for i in range(8)]), {}, "8 healthy nvidia.com/gpu, but the Node's status.allocatable has 0"),
    (inventory("n1", [gpu(i) for i in range(2)]), {"nvidia.com/gpu": 2}, None),
    # fewer than allocatable: agent lagging, or GPUs shared by time-slicing (replicas x GPUs)
    (inventory("n1", [gpu(i) for i in range(2)]), {"nvidia.com/gpu": 8}, None),
    # an unhealthy GPU is not advertised by a device plugin that noticed it either
    (inventory("n1", [gpu(0), gpu(1, healthy=False)]), {"nvidia.com/gpu": 1}, None),
    (MIXED_MIG, {"nvidia.com/mig-3g.40gb": 2}, None),
    (MIXED_MIG, {"nvidia.com/gpu": 1}, "2 healthy nvidia.com/mig-3g.40gb, but the Node's status.allocatable has 0"),
    (inventory("n1", [gpu(0, "AMD Radeon VII", 16368, vendor="amd")]), {"nvidia.com/gpu": 1},
     "1 healthy amd.com/gpu, but the Node's status.allocatable has 0"),
    (inventory("n1", [gpu(i) for i in range(8)]), None, None),  # allocatable unknown: not checked
])
def test_an_inventory_may_claim_fewer_devices_than_allocatable_never_more(doc, allocatable, contradicted):
    why = allocatable_contradiction(view(doc), allocatable)
    if contradicted is None:
        assert why is None
    else:
        assert why is not None and contradicted in why


def test_gpu_allocatable_reads_only_gpu_resources_and_keeps_unknown_unknown():
    assert gpu_allocatable({"status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "4", "amd.com/gpu": 2,
                                                       "nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu.shared": "9"}}}) \
        == {"nvidia.com/gpu": 4, "amd.com/gpu": 2, "nvidia.com/mig-1g.10gb": 7}
    assert gpu_allocatable({"metadata": {"name": "n"}}) is None
    unusable = gpu_allocatable({"status": {"allocatable": {"nvidia.com/gpu": "lots"}}})
    assert dict(unusable) == {} and unusable.unusable == {"nvidia.com/gpu": "lots"}


@pytest.mark.parametrize("sent", ["-1", "1.5", "lots"])
def test_a_contradiction_names_the_allocatable_value_the_node_really_sent(sent):
    allocatable = gpu_allocatable({"status": {"allocatable": {"nvidia.com/gpu": sent}}})
    why = allocatable_contradiction(view(inventory("n1", [gpu(0)])), allocatable)
    assert why is not None
    assert f"1 healthy nvidia.com/gpu, but the Node's status.allocatable has {sent!r}, which is no whole device count" in why
    assert "has 0" not in why


def test_the_cache_rejects_an_inventory_that_allocatable_contradicts_and_recovers_when_it_agrees():
    c = ClusterCache(default_catalog())
    inv = example_inventory("gpu-4090-0")  # 4 RTX 4090s
    c.replace_nodes([node("gpu-4090-0", inv, {"nvidia.com/gpu": "2"})])
    st = c.state("gpu-4090-0")
    assert st.view is None and "claims 4 healthy nvidia.com/gpu" in st.inventory_error
    assert c.inventory_error_count() == 1
    c.apply_node_event("MODIFIED", node("gpu-4090-0", inv, {"nvidia.com/gpu": "4"}))
    assert c.state("gpu-4090-0").view is not None and c.inventory_error_count() == 0
    c.apply_node_event("MODIFIED", node("gpu-4090-0", inv, {"nvidia.com/gpu": "3"}))
    assert c.state("gpu-4090-0").view is None


def test_a_rejected_inventory_fails_gpu_pods_with_the_reason_and_is_counted_in_metrics():
    c = ClusterCache(default_catalog())
    c.replace_nodes([node("gpu-4090-0", example_inventory("gpu-4090-0"), {"nvidia.com/gpu": "2"})])
    c.replace_pods([])
    metrics = ExtenderMetrics(CollectorRegistry())
    service = ExtenderService(Engine(), ClusterSource(c, default_catalog()), metrics)
    with TestClient(create_app(service)) as client:
        r = client.post("/filter", content=json.dumps({"Pod": pod({}), "NodeNames": ["gpu-4090-0"]}))
        assert r.status_code == 200
        reason = r.json()["FailedAndUnresolvableNodes"]["gpu-4090-0"]
        assert reason.startswith("GPU inventory rejected: gpuplace.io/inventory: inventory claims 4 healthy")
        assert "gpuplace_extender_inventory_rejected_nodes 1.0" in client.get("/metrics").text


def test_full_node_list_requests_check_the_inventory_against_the_nodes_own_allocatable():
    c = ClusterCache(default_catalog())
    c.replace_nodes([])
    c.replace_pods([])
    service = ExtenderService(Engine(), ClusterSource(c, default_catalog()))
    now = dt.datetime.now(dt.timezone.utc).isoformat()  # fresh: cluster mode checks staleness
    liar = node("gpu-4090-0", {**example_inventory("gpu-4090-0"), "observedAt": now}, {"nvidia.com/gpu": "1"})
    honest = node("gpu-4090-1", {**example_inventory("gpu-4090-1"), "observedAt": now}, {"nvidia.com/gpu": "4"})
    with TestClient(create_app(service)) as client:
        r = client.post("/filter", content=json.dumps({"Pod": pod({}), "Nodes": {"items": [liar, honest]}}))
        got = r.json()
    assert [n["metadata"]["name"] for n in got["Nodes"]["items"]] == ["gpu-4090-1"]
    assert "claims 4 healthy nvidia.com/gpu" in got["FailedAndUnresolvableNodes"]["gpu-4090-0"]


def test_free_devices_have_one_definition_for_the_score_and_the_debug_view():
    from scheduler_extender.core.devices import NodeAllocation, build_node_view, free_units, resource_usage
    from node_agent.inventory import parse_inventory
    from tests.factories import gpu, inventory
    from scheduler_extender.core.catalog import default_catalog

    gs = [gpu(i) for i in range(4)]
    gs[3]["healthy"] = False
    view = build_node_view(parse_inventory(inventory("n", gs)), default_catalog())
    held = {gs[3]["uuid"]: "t/broken", gs[0]["uuid"]: "t/a"}  # a pod still holds the unhealthy GPU
    alloc = NodeAllocation(held=held, anonymous={"nvidia.com/gpu": 1})
    free = free_units(view, alloc, "nvidia.com/gpu")
    assert [u.gpu_index for u in free] == [1]  # 1 and 2 healthy and unnamed, one of them anonymous
    assert resource_usage(view, alloc)["nvidia.com/gpu"]["free"] == len(free)
