"""Regression tests for bad input the fuzz tests (test_fuzz.py) found: each a 5xx or a crash before."""

import json

import pytest
from starlette.testclient import TestClient

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.quantity import QuantityError, parse_quantity
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.server import create_app
from scheduler_extender.cluster.sources import StaticSource
from tests.factories import EXAMPLES, pod

NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))


@pytest.fixture(scope="module")
def client():
    service = ExtenderService(Engine(), StaticSource(EXAMPLES / "cluster", default_catalog()))
    with TestClient(create_app(service), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("pod_fields, field", [
    ({"metadata": 3}, "Pod.metadata"),
    ({"metadata": {"annotations": ["gpuplace.io/vram"]}}, "Pod.metadata.annotations"),
    ({"metadata": {"annotations": {"gpuplace.io/vram": 40}}}, "Pod.metadata.annotations.gpuplace.io/vram"),
    ({"metadata": {"namespace": {"a": 1}}}, "Pod.metadata.namespace"),
    ({"spec": []}, "Pod.spec"),
    ({"spec": {"containers": {"name": "main"}}}, "Pod.spec.containers"),
    ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": [1]}}}]}},
     "Pod.spec.containers.0.resources.limits.nvidia.com/gpu"),
    ({"spec": {"initContainers": [{"resources": 7}]}}, "Pod.spec.initContainers.0.resources"),
])
def test_a_pod_whose_fields_have_the_wrong_type_gets_a_400_naming_the_field(client, pod_fields, field):
    for verb in ("filter", "prioritize"):
        r = client.post(f"/{verb}", content=json.dumps({"Pod": pod_fields, "NodeNames": NODES}))
        assert r.status_code == 400, r.text
        assert r.json()["Error"].startswith(field + ":")


@pytest.mark.parametrize("node, field", [
    ({"metadata": []}, "Nodes.items.0.metadata"),
    ({"metadata": {"name": "n", "annotations": {"gpuplace.io/inventory": {"kind": "x"}}}},
     "Nodes.items.0.metadata.annotations.gpuplace.io/inventory"),
    ({"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": None}}},
     "Nodes.items.0.status.allocatable.nvidia.com/gpu"),
])
def test_a_node_whose_fields_have_the_wrong_type_gets_a_400_naming_the_field(client, node, field):
    r = client.post("/filter", content=json.dumps({"Pod": pod({}), "Nodes": {"items": [node]}}))
    assert r.status_code == 400, r.text
    assert r.json()["Error"].startswith(field + ":")


@pytest.mark.parametrize("p, field", [
    (pod({}, gpus="19e999999"), "resources nvidia.com/gpu"),   # decimal.Overflow before
    (pod({}, gpus="1e30"), "resources nvidia.com/gpu"),        # beyond int64
    (pod({"gpuplace.io/vram": "1e999999999Gi"}), "gpuplace.io/vram"),
    (pod({"gpuplace.io/vram": "9e30"}), "gpuplace.io/vram"),
])
def test_out_of_range_quantities_fail_every_node_with_a_reason_naming_the_field(client, p, field):
    r = client.post("/filter", content=json.dumps({"Pod": p, "NodeNames": NODES}))
    assert r.status_code == 200, r.text
    reasons = r.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES) and all(v.startswith(field + ":") for v in reasons.values())


@pytest.mark.parametrize("params", ["1E310", "1e16", "2000T"])
def test_a_parameter_count_beyond_1000t_is_an_annotation_error_not_an_overflow(client, params):
    r = client.post("/filter", content=json.dumps({"Pod": pod({"gpuplace.io/model-params": params}), "NodeNames": NODES}))
    assert r.status_code == 200, r.text  # '1E310' is infinite as a float: int(inf) raised OverflowError before
    reasons = r.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES) and all(v.startswith("gpuplace.io/model-params:") for v in reasons.values())


@pytest.mark.parametrize("p, field", [
    # Python's \d took these; Kubernetes' quantity grammar is ASCII digits only.
    (pod({"gpuplace.io/vram": "\uff14\uff10Gi"}), "gpuplace.io/vram"),                     # fullwidth 40Gi
    (pod({"gpuplace.io/model-params": "\uff17B"}), "gpuplace.io/model-params"),            # fullwidth 7B
    (pod({"gpuplace.io/min-compute-capability": "\u0668.\u0660"}), "gpuplace.io/min-compute-capability"),  # Arabic-Indic 8.0
    (pod({}, gpus="\u0662"), "resources nvidia.com/gpu"),                                    # Arabic-Indic 2
    (pod({"gpuplace.io/vram": "1m"}), "gpuplace.io/vram"),                                    # a thousandth of a byte
    # 5,000 digits: past Python's 4,300-digit int() limit, a 500 before.
    (pod({"gpuplace.io/min-compute-capability": "8." + "0" * 5000}), "gpuplace.io/min-compute-capability"),
])
def test_non_ascii_digits_oversized_numbers_and_sub_byte_vram_fail_every_node_naming_the_field(client, p, field):
    r = client.post("/filter", content=json.dumps({"Pod": p, "NodeNames": NODES}))
    assert r.status_code == 200, r.text
    reasons = r.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES) and all(v.startswith(field + ":") for v in reasons.values())


@pytest.mark.parametrize("text", ["1" * 20_000 + "x", "1" * 20_000 + ".5" + "1" * 20_000 + "x", "." + "1" * 20_000 + "e"])
def test_a_long_string_of_digits_that_is_no_quantity_is_refused(text):
    # One way to read each string: before, a digit run could be split between `\d+` and `\d*` in
    # every way, and such a value took seconds (8,000 digits: 6 s) while every request waited.
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_a_misspelt_gpuplace_key_fails_every_node_naming_the_key_and_the_nearest_known_one(client):
    r = client.post("/filter", content=json.dumps({"Pod": pod({"gpuplace.io/vrma": "40Gi"}), "NodeNames": NODES}))
    assert r.status_code == 200, r.text
    reasons = r.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES)
    assert all(v == "gpuplace.io/vrma: not a gpuplace.io pod annotation; did you mean gpuplace.io/vram?"
               for v in reasons.values()), reasons


def test_keys_outside_the_gpuplace_prefix_are_left_alone(client):
    # The extender's own requeue mark and other tools' keys are not ours to judge.
    p = pod({"extender.gpuplace.io/requeued-at": "2026-11-25T08:00:00Z", "example.com/vrma": "x",
             "gpuplace.io/vram": "20Gi"})
    r = client.post("/filter", content=json.dumps({"Pod": p, "NodeNames": NODES}))
    assert r.status_code == 200, r.text
    assert r.json()["NodeNames"], r.json()


def test_thousands_of_unknown_gpuplace_keys_cost_a_few_look_ups_and_a_bounded_reason(client):
    p = pod({f"gpuplace.io/k{i}": "1" for i in range(5000)})
    r = client.post("/filter", content=json.dumps({"Pod": p, "NodeNames": NODES}))
    assert r.status_code == 200, r.text
    reasons = r.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES)
    assert all("4997 more unknown gpuplace.io/ keys" in v and len(v) < 2000 for v in reasons.values()), reasons


@pytest.mark.parametrize("text", ["[" * 5000, '{"a":' * 5000, "- " * 5000])
def test_deeply_nested_inventories_and_policies_are_rejected_not_a_recursion_error(text):
    # A RecursionError escaped the parsers before: in the watch thread it failed every relist.
    from node_agent.inventory import InventoryError, parse_inventory
    from scheduler_extender.core.policy import PolicyError, parse_policy

    with pytest.raises(InventoryError, match="nested too deeply"):
        parse_inventory(text, source="gpuplace.io/inventory")
    with pytest.raises(PolicyError):
        parse_policy(text, source="p.yaml")


def test_a_deeply_nested_inventory_annotation_does_not_stop_the_cache_from_syncing():
    from scheduler_extender.cluster.cache import ClusterCache

    c = ClusterCache(default_catalog())
    c.replace_nodes([{"metadata": {"name": "n1", "annotations": {"gpuplace.io/inventory": "[" * 5000}}}])
    assert c.nodes_synced and "nested too deeply" in c.state("n1").inventory_error


def test_an_inventory_with_yaml_aliases_is_rejected_before_validation_walks_the_copies():
    # 12 KB standing for 2000 GPUs x 2000 MIG devices: validation took 42 s before.
    import time

    from node_agent.inventory import InventoryError, parse_inventory

    mig = "{uuid: MIG-x, profile: 1g.10gb, memoryMiB: 9856}"
    doc = ("apiVersion: gpuplace.io/v1alpha1\nkind: NodeGPUInventory\nnodeName: n\nobservedAt: '2026-11-21T08:00:00Z'\n"
           f"m: &m {mig}\ng: &g {{index: 0, uuid: GPU-1, vendor: nvidia, name: x, memoryMiB: 1, migEnabled: true, "
           f"migDevices: [{','.join(['*m'] * 2000)}]}}\ngpus: [{','.join(['*g'] * 2000)}]\n")
    start = time.perf_counter()
    with pytest.raises(InventoryError, match="YAML aliases"):
        parse_inventory(doc, source="gpuplace.io/inventory")
    print(f"rejected in {time.perf_counter() - start:.3f} s")


def test_the_inventory_size_limit_counts_bytes_not_characters():
    from node_agent.inventory import MAX_ANNOTATION_BYTES, InventoryError, parse_inventory

    text = json.dumps({"kind": "NodeGPUInventory", "pad": "💥" * (MAX_ANNOTATION_BYTES // 3)}, ensure_ascii=False)
    assert len(text) < MAX_ANNOTATION_BYTES < len(text.encode())  # 4 bytes per character
    with pytest.raises(InventoryError, match="larger than the 131072 accepted"):
        parse_inventory(text, source="gpuplace.io/inventory")


@pytest.mark.parametrize("annotation", ["gpuplace.io/model-params", "gpuplace.io/vram", "gpuplace.io/workload",
                                        "gpuplace.io/require", "gpuplace.io/min-compute-capability", "gpuplace.io/class",
                                        "gpuplace.io/gpu-models", "gpuplace.io/exclude-gpu-models"])
def test_a_huge_annotation_value_is_not_echoed_whole_into_every_nodes_reason(client, annotation):
    # Each node's reason repeated the whole value: a 100 KB annotation made a 900 KB answer for 9 nodes.
    p = pod({annotation: "x" * 100_000})
    r = client.post("/filter", content=json.dumps({"Pod": p, "NodeNames": NODES}))
    assert r.status_code == 200
    reasons = r.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES)
    assert all(v.startswith(annotation + ":") and "characters)" in v and len(v) < 1000 for v in reasons.values())


def test_a_huge_list_of_valid_models_is_cut_in_reasons(client):
    p = pod({"gpuplace.io/gpu-models": ",".join(["RTX-4090"] * 10_000)})
    reasons = post_reasons(client, p)
    assert all(len(v) < 1000 for v in reasons.values()) and "characters)" in reasons["gpu-h100-0"]


def post_reasons(client, p):
    r = client.post("/filter", content=json.dumps({"Pod": p, "NodeNames": NODES}))
    assert r.status_code == 200
    body = r.json()
    return {**body["FailedNodes"], **body["FailedAndUnresolvableNodes"]}


def test_an_annotation_value_over_the_length_cap_is_refused_unread_naming_the_annotation(client):
    from scheduler_extender.core.requirements import MAX_VALUE_CHARS

    # A valid value, just too long: refused by its length, not parsed (it would pass if it were).
    models = ",".join(["RTX-4090"] * (MAX_VALUE_CHARS // 9 + 1))
    reasons = post_reasons(client, pod({"gpuplace.io/gpu-models": models}))
    assert set(reasons) == set(NODES)
    assert all(v.startswith("gpuplace.io/gpu-models:") and f"longer than {MAX_VALUE_CHARS} characters" in v
               for v in reasons.values()), reasons
    # At the cap it is parsed as usual: the 4090 nodes pass.
    at_cap = ",".join(["RTX-4090"] * (MAX_VALUE_CHARS // 9))
    r = client.post("/filter", content=json.dumps({"Pod": pod({"gpuplace.io/gpu-models": at_cap}), "NodeNames": NODES}))
    assert {"gpu-4090-0", "gpu-4090-1"} <= set(r.json()["NodeNames"]), r.json()
