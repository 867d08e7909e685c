"""The cluster cache: inventories and GPU-holding pods per node, from watch events."""

import json

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from tests.factories import example_inventory, pod


def node_obj(name, inv=None):
    ann = {"gpuplace.io/inventory": json.dumps(inv)} if inv is not None else {}
    return {"metadata": {"name": name, "annotations": ann}}


def bound(p, node, phase="Pending"):
    p = json.loads(json.dumps(p))
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": phase}
    return p


def cache_with_4090():
    c = ClusterCache(default_catalog())
    c.replace_nodes([node_obj("gpu-4090-0", example_inventory("gpu-4090-0"))])
    c.replace_pods([])
    return c


def test_cache_is_synced_only_after_both_lists():
    c = ClusterCache(default_catalog())
    assert not c.synced
    c.replace_nodes([])
    assert not c.synced
    c.replace_pods([])
    assert c.synced


def test_bound_gpu_pods_count_as_anonymous_allocations_until_they_finish():
    c = cache_with_4090()
    c.apply_pod_event("ADDED", bound(pod({}, gpus=2, name="a"), "gpu-4090-0"))
    assert c.state("gpu-4090-0").allocation.anonymous == {"nvidia.com/gpu": 2}
    c.apply_pod_event("MODIFIED", bound(pod({}, gpus=2, name="a"), "gpu-4090-0", phase="Succeeded"))
    assert c.state("gpu-4090-0").allocation.held_count() == 0


def test_deleted_pods_release_their_gpus():
    c = cache_with_4090()
    p = bound(pod({}, gpus=3, name="a"), "gpu-4090-0")
    c.apply_pod_event("ADDED", p)
    c.apply_pod_event("DELETED", p)
    assert c.state("gpu-4090-0").allocation.held_count() == 0


def test_allocated_to_pins_devices_of_live_pods_and_is_ignored_for_gone_pods():
    inv = example_inventory("gpu-4090-0")
    inv["gpus"][0]["allocatedTo"] = "default/a"
    inv["gpus"][1]["allocatedTo"] = "default/deleted-long-ago"
    c = ClusterCache(default_catalog())
    c.replace_nodes([node_obj("gpu-4090-0", inv)])
    c.replace_pods([bound(pod({}, gpus=1, name="a"), "gpu-4090-0")])
    alloc = c.state("gpu-4090-0").allocation
    assert alloc.held == {inv["gpus"][0]["uuid"]: "default/a"}
    assert alloc.anonymous == {}


def test_a_relist_drops_nodes_and_pods_that_are_gone():
    c = cache_with_4090()
    c.apply_pod_event("ADDED", bound(pod({}, gpus=1, name="a"), "gpu-4090-0"))
    c.replace_pods([])
    assert c.state("gpu-4090-0").allocation.held_count() == 0
    c.replace_nodes([])
    assert c.state("gpu-4090-0") is None


def test_an_invalid_inventory_annotation_is_kept_as_a_reason_not_trusted():
    c = ClusterCache(default_catalog())
    c.replace_nodes([{"metadata": {"name": "n1", "annotations": {"gpuplace.io/inventory": "{\"kind\": 1"}}}])
    st = c.state("n1")
    assert st.view is None and "neither JSON nor YAML" in st.inventory_error


def test_an_inventory_naming_another_node_is_rejected():
    c = ClusterCache(default_catalog())
    c.replace_nodes([node_obj("n1", example_inventory("gpu-4090-0"))])
    assert "is not this node" in c.state("n1").inventory_error


def test_unchanged_inventory_keeps_the_parsed_view():
    c = cache_with_4090()
    view = c.state("gpu-4090-0").view
    c.apply_node_event("MODIFIED", node_obj("gpu-4090-0", example_inventory("gpu-4090-0")))
    assert c.state("gpu-4090-0").view is view


def test_pods_without_gpus_are_not_tracked():
    c = cache_with_4090()
    c.apply_pod_event("ADDED", bound(pod({}, gpus=None, name="web"), "gpu-4090-0"))
    assert c.pods_on("gpu-4090-0") == []


def test_snapshot_reports_free_and_held_units_per_resource_and_the_pods_holding_them():
    c = cache_with_4090()
    c.apply_pod_event("ADDED", bound(pod({}, gpus=3, name="a"), "gpu-4090-0"))
    snap = c.snapshot()
    assert snap["synced"] is True
    node = snap["nodes"]["gpu-4090-0"]
    assert node["inventory"] == "ok"
    assert node["resources"]["nvidia.com/gpu"] == {"allocatable": 4, "held": 3, "free": 1}
    assert node["pods"] == {"default/a": {"nvidia.com/gpu": 3}}


def test_snapshot_keeps_pods_bound_to_a_deleted_node_visible():
    c = cache_with_4090()
    p = bound(pod({}, gpus=2, name="a"), "gpu-4090-0")
    c.apply_pod_event("ADDED", p)
    c.apply_node_event("DELETED", node_obj("gpu-4090-0"))
    node = c.snapshot()["nodes"]["gpu-4090-0"]
    assert node["inventory"] == "node unknown"
    assert node["resources"]["nvidia.com/gpu"] == {"allocatable": None, "held": 2, "free": None}
    c.apply_pod_event("DELETED", p)
    assert "gpu-4090-0" not in c.snapshot()["nodes"]


def test_snapshot_counts_an_over_commit_instead_of_hiding_it():
    c = cache_with_4090()
    c.apply_pod_event("ADDED", bound(pod({}, gpus=3, name="a"), "gpu-4090-0"))
    c.apply_pod_event("ADDED", bound(pod({}, gpus=3, name="b"), "gpu-4090-0"))
    assert c.snapshot()["nodes"]["gpu-4090-0"]["resources"]["nvidia.com/gpu"] == {
        "allocatable": 4, "held": 6, "free": 0}


def test_a_pod_without_gpus_binding_or_leaving_is_a_logged_change_so_readers_see_the_nodes_free_cpu():
    """The free CPU and memory the score reads (fragmentation's host stranding, the best-only tie
    break) move when any pod binds or leaves; a reader that keeps states between requests
    (``ExtenderService``'s node index, ``changes_since``) must see it at its next request."""
    from scheduler_extender.cluster.sources import ClusterSource
    from scheduler_extender.core.engine import Engine
    from scheduler_extender.service.decisions import ExtenderService
    from scheduler_extender.service.wire import ExtenderArgs

    c = ClusterCache(default_catalog())
    node = node_obj("gpu-4090-0", example_inventory("gpu-4090-0"))
    node["status"] = {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}}
    c.replace_nodes([node])
    c.replace_pods([])
    c.replace_namespaces([])
    service = ExtenderService(Engine(), ClusterSource(c, default_catalog()))

    def free_cpu():
        args = ExtenderArgs.model_validate({"Pod": pod(gpus=1), "NodeNames": ["gpu-4090-0"]})
        states, _ = service._named_states(args.node_names(), "nvidia.com/gpu")
        return states[0].cpu_milli_free

    assert free_cpu() == 8000
    generation = c.generation
    web = pod(gpus=None, name="web")
    web["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    c.apply_pod_event("ADDED", bound(web, "gpu-4090-0", "Running"))
    assert c.changes_since(generation)[1] == {"gpu-4090-0"}
    assert free_cpu() == 6000
    c.apply_pod_event("DELETED", bound(web, "gpu-4090-0", "Running"))
    assert free_cpu() == 8000
