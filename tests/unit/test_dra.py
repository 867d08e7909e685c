"""Dynamic Resource Allocation: ResourceSlices read as inventories, claims written from the job,
and the extender's decision for pods with claims (``core.dra_slices``, ``core.dra_claims``,
``cluster.dra``, ``service.claim_webhook``).

The slices are built as NVIDIA's DRA driver publishes them (github.com/NVIDIA/k8s-dra-driver-gpu,
``cmd/gpu-kubelet-plugin/deviceinfo.go``: device ``gpu-<minor>``, attributes ``type``, ``uuid``,
``productName``, ``cudaComputeCapability`` as a version, capacity ``memory`` in bytes; MIG devices
with ``parentUUID`` and ``profile``); memories as NVML reports them for each model (catalog rows).
"""

from __future__ import annotations

import base64
import itertools
import json

import pytest

from scheduler_extender.cluster.dra import DraFleet, static_fleet
from scheduler_extender.cluster.sources import StaticSource
from scheduler_extender.core.dra_claims import (ALTERNATIVES_ANNOTATION, MAX_ALTERNATIVES, Alternative, ClaimError,
                                                alternatives_of, cel_of, gpu_classes, node_result, plan_claim,
                                                pod_with_gpus, write_claim)
from scheduler_extender.core.dra_slices import (DriverTableError, default_drivers, inventories_from_slices,
                                                parse_driver_table, split_objects)
from scheduler_extender.core.engine import Engine
from scheduler_extender.service.claim_webhook import ClaimWebhook, WebhookError, claim_writer
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.wire import parse_extender_args

DRIVER = "gpu.nvidia.com"
A100 = ("NVIDIA A100-SXM4-80GB", "81920Mi", "8.0.0")
L4 = ("NVIDIA L4", "23034Mi", "8.9.0")
RTX4090 = ("NVIDIA GeForce RTX 4090", "24564Mi", "8.9.0")
H100 = ("NVIDIA H100 80GB HBM3", "81559Mi", "9.0.0")
_uuids = itertools.count()


def gpu(index: int, model: tuple[str, str, str], uuid: str | None = None) -> dict:
    name, memory, cc = model
    return {"name": f"gpu-{index}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": uuid or f"GPU-{next(_uuids)}"},
        "productName": {"string": name}, "brand": {"string": "Nvidia"},
        "cudaComputeCapability": {"version": cc}, "driverVersion": {"version": "550.54.15"}},
        "capacity": {"memory": {"value": memory}}}


def mig(parent_index: int, parent_uuid: str, start: int, profile: str = "3g.40gb", memory: str = "40192Mi") -> dict:
    return {"name": f"gpu-{parent_index}-mig-9-{start}-4", "attributes": {
        "type": {"string": "mig"}, "uuid": {"string": f"MIG-{next(_uuids)}"}, "parentUUID": {"string": parent_uuid},
        "profile": {"string": profile}, "productName": {"string": A100[0]},
        "cudaComputeCapability": {"version": "8.0.0"}}, "capacity": {"memory": {"value": memory}}}


def slice_of(node: str, devices: list[dict], driver: str = DRIVER, generation: int = 1) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{driver}-{generation}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": generation,
                                                                  "resourceSliceCount": 1}, "devices": devices}}


def allocated(claim: str, node: str, device: str, pod: str | None = None, ns: str = "default") -> dict:
    status = {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]}}}
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    return {"metadata": {"name": claim, "namespace": ns}, "spec": {}, "status": status}


def pod(name: str = "llm", annotations: dict | None = None, claims: dict | None = None) -> dict:
    obj = {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                        "annotations": {"gpuplace.io/model-params": "13B", "gpuplace.io/workload": "inference"}
                        if annotations is None else annotations},
           "spec": {"containers": [{"name": "main"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"{name}-gpu"}]}}
    if claims:
        obj["status"] = {"resourceClaimStatuses": [{"name": k, "resourceClaimName": v} for k, v in claims.items()]}
    return obj


GENERIC = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}


@pytest.fixture
def engine() -> Engine:
    return Engine()


def fleet_of(engine: Engine, slices: list[dict], claims: list[dict] = ()) -> DraFleet:
    return static_fleet(slices, list(claims), engine.catalog, default_drivers())


# ---- slices as inventories ---------------------------------------------------------------------


def test_a_gpu_device_becomes_an_inventory_gpu_with_its_product_memory_and_compute_capability(engine):
    inv = inventories_from_slices([slice_of("n1", [gpu(0, A100, "GPU-a"), gpu(3, L4, "GPU-b")])], [], engine.catalog)
    gpus = inv["n1"].inventory.gpus
    assert [(g.index, g.uuid, g.name, g.memory_mib, g.compute_capability) for g in gpus] == [
        (0, "GPU-a", "NVIDIA A100-SXM4-80GB", 81920, "8.0"), (3, "GPU-b", "NVIDIA L4", 23034, "8.9")]
    assert inv["n1"].source == "ResourceSlices of gpu.nvidia.com"
    assert gpus[0].ecc_enabled is None and gpus[0].nvlinks == []  # what slices do not say stays unknown


def test_mig_devices_join_their_parent_gpu_whose_memory_comes_from_the_catalog(engine):
    inv = inventories_from_slices([slice_of("n1", [mig(0, "GPU-p", 0), mig(0, "GPU-p", 4)])], [], engine.catalog)
    (parent,) = inv["n1"].inventory.gpus
    assert parent.uuid == "GPU-p" and parent.mig_enabled and parent.memory_mib == 81920
    assert [(m.profile, m.memory_mib) for m in parent.mig_devices] == [("3g.40gb", 40192), ("3g.40gb", 40192)]


def test_an_allocated_claim_holds_its_device_for_the_pod_it_is_reserved_for_else_its_name(engine):
    sl = slice_of("n1", [gpu(0, A100), gpu(1, A100)])
    inv = inventories_from_slices([sl], [allocated("c0", "n1", "gpu-0", pod="train"),
                                         allocated("c1", "n1", "gpu-1")], engine.catalog)
    assert [g.allocated_to for g in inv["n1"].inventory.gpus] == ["default/train", "default/c1"]


def test_unmapped_drivers_and_devices_without_a_product_name_are_left_out_and_named(engine):
    bare = {"name": "device-00"}
    inv = inventories_from_slices([slice_of("n1", [bare, gpu(1, L4)]), slice_of("n1", [bare], driver="x.example.com")],
                                  [], engine.catalog)
    assert [g.name for g in inv["n1"].inventory.gpus] == ["NVIDIA L4"]
    notes = " | ".join(inv["n1"].notes)
    assert "device-00: no attribute type" in notes and "driver x.example.com is not mapped" in notes


def test_the_test_drivers_bare_devices_are_left_out_for_want_of_a_product_name(engine):
    bare = {"name": "device-00"}
    inv = inventories_from_slices([slice_of("n1", [bare], driver="test-driver.cdi.k8s.io")], [], engine.catalog)
    assert inv["n1"].inventory.gpus == [] and "no attribute type" in inv["n1"].notes[0]


def test_only_the_newest_generation_of_a_pool_counts(engine):
    old = slice_of("n1", [gpu(0, L4)], generation=1)
    new = slice_of("n1", [gpu(0, A100)], generation=2)
    inv = inventories_from_slices([old, new], [], engine.catalog)
    assert [g.name for g in inv["n1"].inventory.gpus] == [A100[0]]


def test_a_malformed_slice_is_a_note_on_its_node_not_an_exception(engine):
    bad = slice_of("n1", [gpu(0, A100)])
    bad["spec"]["devices"] = "many"
    inv = inventories_from_slices([bad, slice_of("n2", [gpu(0, L4)])], [], engine.catalog)
    assert "devices" in inv["n1"].notes[0] and inv["n1"].inventory.gpus == []
    assert [g.name for g in inv["n2"].inventory.gpus] == [L4[0]]


def test_a_driver_table_names_the_field_it_rejects():
    with pytest.raises(DriverTableError, match="memoryCapacity"):
        parse_driver_table("drivers: [{driver: a.example.com, sources: [x], productNameAttribute: p}]", "f.yaml")


def test_kubectl_lists_are_split_by_kind():
    objects = split_objects([{"kind": "List", "items": [{"kind": "ResourceSlice", "a": 1}]},
                             {"kind": "ResourceClaimList", "items": [{"metadata": {}}]}])
    assert sorted(objects) == ["ResourceClaim", "ResourceSlice"]


# ---- claims written from the job ---------------------------------------------------------------


def written_for(engine: Engine, fleet: DraFleet, pod_obj: dict, spec: dict = GENERIC):
    return claim_writer(engine, fleet, pod_with_gpus(pod_obj, 1), None)(spec, "pod default/llm")


def test_a_13b_pod_gets_the_cheapest_fitting_type_first_and_never_a_gpu_too_small(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100), gpu(1, L4)]),
                              slice_of("n2", [gpu(0, H100), gpu(1, RTX4090)]),
                              slice_of("n3", [mig(0, "GPU-m", 0), mig(0, "GPU-m", 4)])])
    w = written_for(engine, fleet, pod())
    alts = w.written["gpu"]
    # 13B bf16 needs 30.3 GiB: the 24 GB cards are refused; the MIG slice is the cheapest fit
    assert [a.describe() for a in alts][0] == "A100-SXM4-80GB 3g.40gb"
    assert not any("L4" in a.describe() or "4090" in a.describe() for a in alts)
    costs = [a.cost_per_hour for a in alts if a.model_id not in engine.job(pod_with_gpus(pod(), 1)).class_last_resort_models]
    assert costs == sorted(costs)
    (req,) = w.spec["devices"]["requests"]
    assert [s["name"] for s in req["firstAvailable"]] == [a.name for a in alts]
    assert all(s["count"] == 1 for s in req["firstAvailable"])


def test_each_alternative_states_the_need_in_cel_with_every_attribute_guarded(engine):
    alt = Alternative("g0-l4", "gpu.nvidia.com", DRIVER, "gpu", "NVIDIA L4", None, 23034 * 2**20, 10**10 + 1, (8, 9),
                      0.8, "l4")
    cel = cel_of(alt, default_drivers()[DRIVER])
    assert 'device.driver == "gpu.nvidia.com"' in cel
    assert '"productName" in device.attributes["gpu.nvidia.com"] && device.attributes["gpu.nvidia.com"]["productName"] == "NVIDIA L4"' in cel
    # 10^10 + 1 bytes rounded up to whole MiB: 9537 MiB is 10,000,269,312 bytes
    assert 'compareTo(quantity("9537Mi")) >= 0' in cel
    assert 'compareTo(semver("8.9.0")) >= 0' in cel


def test_a_product_name_with_quotes_stays_one_cel_string(engine):
    alt = Alternative("g0", "gpu.nvidia.com", DRIVER, "gpu", 'Odd "GPU" \\ name', None, 1, None, None, 1.0, None)
    cel = cel_of(alt, default_drivers()[DRIVER])
    assert '== "Odd \\"GPU\\" \\\\ name"' in cel


def test_a_pod_no_device_type_fits_is_refused_with_every_types_reason(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, L4)]), slice_of("n2", [gpu(0, RTX4090)])])
    with pytest.raises(ClaimError) as e:
        written_for(engine, fleet, pod(annotations={"gpuplace.io/model-params": "70B"}))
    msg = str(e.value)
    assert msg.startswith("gpuplace: pod default/llm: no device type in the cluster fits")
    assert "L4 (1 on 1 node): 22.5 GiB VRAM < 157.7 GiB needed" in msg and "RTX 4090" in msg


def test_invalid_annotations_refuse_the_claim_naming_the_annotation(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    with pytest.raises(ClaimError, match="gpuplace.io/model-params"):
        written_for(engine, fleet, pod(annotations={"gpuplace.io/model-params": "lots"}))


def test_requests_of_other_classes_all_mode_or_own_lists_are_left_as_written(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    spec = {"devices": {"requests": [
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
        {"name": "all", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
        {"name": "own", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]}]}}
    w = written_for(engine, fleet, pod(), spec)
    assert w.written == {} and w.spec == spec and len(w.notes) == 3


def test_the_pods_own_selectors_and_count_are_kept_in_every_alternative(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100), gpu(1, A100), gpu(2, H100), gpu(3, H100)])])
    own = {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].brand == "Nvidia"'}}
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,
                                                                 "selectors": [own]}}]}}
    w = claim_writer(engine, fleet, pod_with_gpus(pod(), 2), None)(spec, "pod default/llm")
    subs = w.spec["devices"]["requests"][0]["firstAvailable"]
    assert subs and all(s["selectors"][0] == own and s["count"] == 2 for s in subs)


def test_beyond_the_eight_alternatives_the_api_allows_the_dearer_types_are_left_out_and_named(engine):
    memories = [f"{40 + i}Gi" for i in range(MAX_ALTERNATIVES + 3)]
    fleet = fleet_of(engine, [slice_of(f"n{i}", [gpu(0, (A100[0], m, "8.0.0"))]) for i, m in enumerate(memories)]
                     + [slice_of("mig", [mig(0, "GPU-m", 0)])])
    w = written_for(engine, fleet, pod())
    subs = w.spec["devices"]["requests"][0]["firstAvailable"]
    assert len(subs) == MAX_ALTERNATIVES == len(w.written["gpu"])
    assert [s["name"] for s in subs] == [a.name for a in w.written["gpu"]]
    assert subs[0]["deviceClassName"] == "mig.nvidia.com"  # the MIG slice is the cheapest and stays
    assert "4 dearer device types left out: the API allows 8 alternatives" in w.notes[0]


def test_a_request_with_its_own_selectors_or_of_the_mig_class_gets_alternatives_of_its_class_only(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100), mig(1, "GPU-m", 0)])])
    own = {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].brand == "Nvidia"'}}
    with_own = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                     "selectors": [own]}}]}}
    assert {a.device_class for a in written_for(engine, fleet, pod(), with_own).written["gpu"]} == {"gpu.nvidia.com"}
    mig_only = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}
    assert {a.kind for a in written_for(engine, fleet, pod(), mig_only).written["gpu"]} == {"mig"}
    assert {a.device_class for a in written_for(engine, fleet, pod()).written["gpu"]} == {"gpu.nvidia.com",
                                                                                           "mig.nvidia.com"}


@pytest.mark.parametrize("count", [0, 33, 10**9, "2", True])
def test_a_count_outside_what_the_api_allows_is_refused_naming_the_range(engine, count):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}
    with pytest.raises(ClaimError, match="count must be a whole number from 1 to 32"):
        written_for(engine, fleet, pod(), spec)


def test_more_requests_than_the_api_allows_are_refused_before_any_is_planned(engine):
    planned = []
    spec = {"devices": {"requests": [{"name": f"r{i}", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
                                     for i in range(33)]}}
    with pytest.raises(ClaimError, match="33 requests; the API allows 32"):
        write_claim(spec, lambda n: planned.append(n), gpu_classes(default_drivers()))  # type: ignore[arg-type, func-returns-value]
    assert planned == []


def test_a_gpu_published_with_its_mig_devices_reads_as_a_mig_enabled_gpu(engine):
    # dynamic MIG publishes the whole GPU and its MIG devices side by side, the GPU first
    inv = inventories_from_slices([slice_of("n1", [gpu(0, A100, "GPU-p"), mig(0, "GPU-p", 0), mig(0, "GPU-p", 4)])],
                                  [], engine.catalog)
    (parent,) = inv["n1"].inventory.gpus
    assert parent.mig_enabled and len(parent.mig_devices) == 2 and parent.memory_mib == 81920


def test_a_driver_table_needs_a_gpu_device_class_and_one_driver_per_class():
    with pytest.raises(DriverTableError, match="deviceClasses needs gpu"):
        parse_driver_table("drivers: [{driver: a.example.com, sources: [x], productNameAttribute: p, "
                           "memoryCapacity: m}]", "f.yaml")
    two = ("drivers: [{driver: a.example.com, sources: [x], productNameAttribute: p, memoryCapacity: m, "
           "deviceClasses: {gpu: same}}, {driver: b.example.com, sources: [x], productNameAttribute: p, "
           "memoryCapacity: m, deviceClasses: {gpu: same}}]")
    with pytest.raises(DriverTableError, match="DeviceClass same is named for drivers a.example.com and b.example.com"):
        parse_driver_table(two, "f.yaml")


def test_an_attribute_of_another_domain_is_looked_up_in_that_domain(engine):
    mapping = default_drivers()[DRIVER].model_copy(update={"product_name_attribute": "example.com/model"})
    alt = Alternative("g0", "gpu.nvidia.com", DRIVER, "gpu", "X", None, 1, None, None, 1.0, None)
    assert '"model" in device.attributes["example.com"] && device.attributes["example.com"]["model"] == "X"' \
        in cel_of(alt, mapping)


def test_a_deeply_nested_alternatives_annotation_is_ignored_not_a_crash():
    assert alternatives_of({"metadata": {"annotations": {ALTERNATIVES_ANNOTATION: "[" * 60000}}}) is None


def test_an_admin_access_allocation_holds_no_device(engine):
    claim = allocated("monitor", "n1", "gpu-0")
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    inv = inventories_from_slices([slice_of("n1", [gpu(0, A100)])], [claim, {"status": "odd"}], engine.catalog)
    assert inv["n1"].inventory.gpus[0].allocated_to == ""


def test_the_alternatives_annotation_reads_back_what_was_written(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100), gpu(1, H100)])])
    w = written_for(engine, fleet, pod())
    claim = {"metadata": {"annotations": {ALTERNATIVES_ANNOTATION: w.annotation()}}}
    assert alternatives_of(claim) == dict(w.written)
    assert alternatives_of({"metadata": {"annotations": {ALTERNATIVES_ANNOTATION: '{"gpu": [{"kind": 1}]}'}}}) is None


# ---- the node a pod with claims gets ------------------------------------------------------------


def test_a_node_gives_the_first_alternative_it_has_free_as_the_allocator_would(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100), gpu(1, A100), gpu(2, H100)])],
                     [allocated("c", "n1", "gpu-0", "x")])
    plan = plan_claim(engine.job(pod_with_gpus(pod(), 1)), fleet.types(), engine.policy, 1)
    assert [a.product_name for a in plan.alternatives] == [A100[0], H100[0]]
    (state,) = fleet.states(["n1"])
    r = node_result(state, [(1, plan.alternatives)])
    assert r.passed and [u.gpu_index for u in r.chosen] == [1]  # gpu-0 is held by claim c
    # two of one type: the A100s would hold them once claim c ends; one H100 never would
    busy = node_result(state, [(2, plan.alternatives)])
    assert not busy.passed and busy.rejections[0].resolvable and "all of them are allocated" in busy.reason


def test_a_node_without_the_alternatives_fails_unresolvably(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)]), slice_of("n2", [gpu(0, L4)])])
    plan = plan_claim(engine.job(pod_with_gpus(pod(), 1)), fleet.types(), engine.policy, 1)
    r = node_result(fleet.states(["n2"])[0], [(1, plan.alternatives)])
    assert not r.passed and r.unresolvable and "the node has none" in r.reason


def extender_over(engine: Engine, fleet: DraFleet, tmp_path) -> ExtenderService:
    service = ExtenderService(engine, StaticSource(tmp_path, engine.catalog))
    service.dra = fleet
    return service


def test_the_extender_sends_a_pod_with_a_written_claim_to_the_node_with_the_cheaper_free_device(engine, tmp_path):
    fleet = fleet_of(engine, [slice_of("h100-node", [gpu(0, H100)]), slice_of("a100-node", [gpu(0, A100)]),
                              slice_of("l4-node", [gpu(0, L4)]), slice_of("no-gpu", [])])
    w = written_for(engine, fleet, pod())
    fleet.apply_claim_event("ADDED", {"metadata": {"name": "llm-gpu-1", "namespace": "default",
                                                   "annotations": {ALTERNATIVES_ANNOTATION: w.annotation()}},
                                      "spec": w.spec})
    service = extender_over(engine, fleet, tmp_path)
    args = parse_extender_args(json.dumps({"Pod": pod(claims={"gpu": "llm-gpu-1"}),
                                           "NodeNames": ["h100-node", "a100-node", "l4-node", "no-gpu"]}).encode())
    result = service.filter(args)
    assert sorted(result["NodeNames"]) == ["a100-node", "h100-node"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"l4-node", "no-gpu"}
    scores = {p["Host"]: p["Score"] for p in service.prioritize(args)}
    assert scores["a100-node"] > scores["h100-node"] and scores["l4-node"] == 0


def test_a_pod_whose_claims_gpuplace_did_not_write_passes_every_node_with_score_0(engine, tmp_path):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)]), slice_of("n2", [gpu(0, H100)])])
    fleet.apply_claim_event("ADDED", {"metadata": {"name": "c", "namespace": "default"}, "spec": GENERIC})
    allocated_claim = allocated("done", "n1", "gpu-0", "llm")
    fleet.apply_claim_event("ADDED", allocated_claim)
    service = extender_over(engine, fleet, tmp_path)
    for claim in ("c", "done", "never-seen"):  # not written, allocated already, unknown
        args = parse_extender_args(json.dumps({"Pod": pod(claims={"gpu": claim}), "NodeNames": ["n1", "n2", "x"]}).encode())
        assert service.filter(args)["NodeNames"] == ["n1", "n2", "x"], claim
        assert {p["Score"] for p in service.prioritize(args)} == {0}, claim


def test_before_the_slices_are_read_a_pod_with_a_written_claim_waits_with_the_reason(engine, tmp_path):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    w = written_for(engine, fleet, pod())
    fleet.apply_claim_event("ADDED", {"metadata": {"name": "c", "namespace": "default",
                                                   "annotations": {ALTERNATIVES_ANNOTATION: w.annotation()}},
                                      "spec": w.spec})
    fleet.slices_synced = False  # a watch failed: the next full list syncs again
    result = extender_over(engine, fleet, tmp_path).filter(parse_extender_args(json.dumps(
        {"Pod": pod(claims={"gpu": "c"}), "NodeNames": ["n1"]}).encode()))
    assert result["NodeNames"] == [] and "has not read the cluster's ResourceSlices" in result["FailedNodes"]["n1"]


def test_a_slice_moving_or_going_and_a_claim_ending_update_only_what_they_touch(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)]), slice_of("n2", [gpu(0, L4)])],
                     [allocated("c", "n1", "gpu-0", "p")])
    assert fleet.state("n1").allocation.held  # type: ignore[union-attr]
    fleet.apply_claim_event("DELETED", allocated("c", "n1", "gpu-0", "p"))
    assert not fleet.state("n1").allocation.held  # type: ignore[union-attr]
    fleet.apply_slice_event("DELETED", slice_of("n2", [gpu(0, L4)]))
    assert fleet.node_names() == ["n1"] and fleet.state("n2") is None
    assert [t.unit.name for t in fleet.types()] == [A100[0]]


# ---- the webhook -------------------------------------------------------------------------------


def review(claim_spec: dict, owner: str | None = "llm") -> bytes:
    meta = {"name": "llm-gpu-x", "namespace": "default"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": f"uid-{owner}", "controller": True}]
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "req-1", "operation": "CREATE", "namespace": "default", "object": {"metadata": meta, "spec": claim_spec}}}).encode()


def webhook(engine: Engine, fleet: DraFleet, pods: dict) -> ClaimWebhook:
    return ClaimWebhook(fleet, lambda: engine, lambda ns, name: pods.get(name))


def answer(hook: ClaimWebhook, body: bytes) -> dict:
    out = json.loads(hook.respond(body))
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["response"]["uid"] == "req-1"
    return out["response"]


def test_the_webhook_patches_the_claim_with_the_alternatives_and_their_annotation(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100), gpu(1, H100)])])
    resp = answer(webhook(engine, fleet, {"llm": pod()}), review(GENERIC))
    assert resp["allowed"] and resp["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(resp["patch"]))
    assert patch[0]["path"] == "/spec" and "firstAvailable" in patch[0]["value"]["devices"]["requests"][0]
    assert patch[1] == {"op": "add", "path": "/metadata/annotations",
                        "value": {ALTERNATIVES_ANNOTATION: written_for(engine, fleet, pod()).annotation()}}


def test_the_webhook_refuses_a_claim_no_device_fits_with_gpuplaces_reason(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, L4)])])
    resp = answer(webhook(engine, fleet, {"llm": pod(annotations={"gpuplace.io/model-params": "70B"})}), review(GENERIC))
    assert not resp["allowed"] and resp["status"]["code"] == 403
    assert "no device type in the cluster fits: L4" in resp["status"]["message"]


@pytest.mark.parametrize("case", ["no owner", "leave", "no gpuplace annotation"])
def test_the_webhook_leaves_claims_that_are_not_gpuplaces_to_write(engine, case):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    pods = {"llm": pod(annotations={"gpuplace.io/claims": "leave", "gpuplace.io/model-params": "7B"} if case == "leave"
                       else {} if case == "no gpuplace annotation" else None)}
    resp = answer(webhook(engine, fleet, pods), review(GENERIC, owner=None if case == "no owner" else "llm"))
    assert resp["allowed"] and "patch" not in resp


def test_the_webhook_refuses_rather_than_guess_before_the_slices_are_read_or_without_the_pod(engine):
    unsynced = DraFleet(engine.catalog, default_drivers())
    resp = answer(webhook(engine, unsynced, {"llm": pod()}), review(GENERIC))
    assert not resp["allowed"] and "has not read the cluster's ResourceSlices" in resp["status"]["message"]
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    resp = answer(webhook(engine, fleet, {}), review(GENERIC))
    assert not resp["allowed"] and "was not found" in resp["status"]["message"]


def test_the_webhook_names_the_annotation_and_its_values_when_claims_is_misspelt(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    resp = answer(webhook(engine, fleet, {"llm": pod(annotations={"gpuplace.io/claims": "skip"})}), review(GENERIC))
    assert not resp["allowed"] and "gpuplace.io/claims: 'skip' is not one of write, leave" in resp["status"]["message"]


def test_the_webhook_rejects_a_body_that_is_not_an_admission_review(engine):
    hook = webhook(engine, fleet_of(engine, []), {})
    with pytest.raises(WebhookError, match="not JSON"):
        hook.respond(b"{")
    with pytest.raises(WebhookError, match="request"):
        hook.respond(b'{"kind": "AdmissionReview"}')


def test_a_failure_inside_the_webhook_refuses_the_claim_with_the_cause(engine):
    def broken(ns, name):
        raise RuntimeError("API server unreachable")
    resp = json.loads(ClaimWebhook(fleet_of(engine, [slice_of("n1", [gpu(0, A100)])]), lambda: engine, broken)
                      .respond(review(GENERIC)))["response"]
    assert not resp["allowed"] and "API server unreachable" in resp["status"]["message"]


def test_pod_with_gpus_keeps_the_pod_and_asks_its_gpus_in_the_first_container():
    p = pod_with_gpus({"metadata": {"name": "a"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "1"}}}, {"name": "d"}]}}, 3)
    assert p.container_requests()[0] == [{"cpu": "1", "nvidia.com/gpu": "3"}, {}]


def test_gpu_classes_cover_nvidias_gpu_and_mig_classes():
    assert {"gpu.nvidia.com", "mig.nvidia.com", "test-driver.cdi.k8s.io"} <= set(gpu_classes(default_drivers()))


def test_write_claim_refuses_requests_that_are_not_a_list():
    with pytest.raises(ClaimError, match="must be a list"):
        write_claim({"devices": {"requests": {"a": 1}}}, lambda n: None, {}, "pod x")  # type: ignore[arg-type]


def test_a_type_with_too_few_devices_on_any_one_node_is_no_alternative_for_a_larger_request(engine):
    # four A100s, but never two on one node: a request of two cannot be met by them
    fleet = fleet_of(engine, [slice_of(f"n{i}", [gpu(0, A100), gpu(1, H100), gpu(2, H100)]) for i in range(4)])
    plan = plan_claim(engine.job(pod_with_gpus(pod(), 2)), fleet.types(), engine.policy, 2)
    assert [a.product_name for a in plan.alternatives] == [H100[0]]
    assert any("at most 1 on one node, 2 needed" in why for _, why in plan.refused)


@pytest.mark.parametrize("example", ["gpu-a100-mig-0.json", "gpu-a100-mig-1.json", "gpu-h100-0.json", "gpu-4090-0.json",
                                     "gpu-rtx8000-0.json", "gpu-amd-0.json"])
def test_the_test_doubles_slice_reads_back_as_the_inventory_it_was_made_from(engine, example):
    from tests.factories import ROOT
    from tests.harness.dra_driver import slice_of as double_slice
    source = json.loads((ROOT / "examples" / "cluster" / example).read_text())
    read = inventories_from_slices([double_slice(source, "n1")], [], engine.catalog)["n1"].inventory
    want = [(g["uuid"], g["name"], g["memoryMiB"], g.get("computeCapability"),
             sorted((m["profile"], m["memoryMiB"]) for m in g.get("migDevices", [])) if g.get("migEnabled") else [])
            for g in source["gpus"] if g.get("healthy", True) and g.get("vendor", "nvidia") == "nvidia"]
    got = [(g.uuid, g.name, g.memory_mib, g.compute_capability, sorted((m.profile, m.memory_mib) for m in g.mig_devices))
           for g in read.gpus]
    assert sorted(got) == sorted(want)


def test_with_filter_returns_best_only_the_best_scored_nodes_pass_a_pod_with_a_claim(engine, tmp_path):
    fleet = fleet_of(engine, [slice_of("h100-node", [gpu(0, H100)]), slice_of("a100-node", [gpu(0, A100)]),
                              slice_of("a100-node-2", [gpu(0, A100)])])
    w = written_for(engine, fleet, pod())
    fleet.apply_claim_event("ADDED", {"metadata": {"name": "c", "namespace": "default",
                                                   "annotations": {ALTERNATIVES_ANNOTATION: w.annotation()}},
                                      "spec": w.spec})
    service = extender_over(engine, fleet, tmp_path)
    service.filter_returns_best = True
    result = service.filter(parse_extender_args(json.dumps(
        {"Pod": pod(claims={"gpu": "c"}), "NodeNames": ["h100-node", "a100-node", "a100-node-2"]}).encode()))
    assert sorted(result["NodeNames"]) == ["a100-node", "a100-node-2"]  # tied at the best: both pass
    assert "returns its best-scored nodes only" in result["FailedNodes"]["h100-node"]


def test_a_claim_the_watch_has_not_shown_yet_is_read_from_the_api_server(engine):
    asked = []
    claim = {"metadata": {"name": "c", "namespace": "ns"}, "spec": {}}
    fleet = DraFleet(engine.catalog, default_drivers(), lambda ns, name: asked.append((ns, name)) or claim)
    fleet.replace_claims([])
    assert fleet.claim("ns", "c") is claim and asked == [("ns", "c")]
    fleet.apply_claim_event("ADDED", claim)
    assert fleet.claim("ns", "c") == claim and len(asked) == 1  # the watch has it now


def test_an_api_error_reading_a_claim_leaves_it_unknown(engine):
    def broken(ns, name):
        raise ConnectionError("refused")
    assert DraFleet(engine.catalog, default_drivers(), broken).claim("ns", "c") is None


def test_explain_decides_a_pod_with_a_written_claim_on_the_slices(engine, tmp_path):
    from scheduler_extender.core.pod import as_pod
    from scheduler_extender.service.decisions import explain_pod
    fleet = fleet_of(engine, [slice_of("h100-node", [gpu(0, H100)]), slice_of("l4-node", [gpu(0, L4)])])
    w = written_for(engine, fleet, pod())
    fleet.apply_claim_event("ADDED", {"metadata": {"name": "c", "namespace": "default",
                                                   "annotations": {ALTERNATIVES_ANNOTATION: w.annotation()}},
                                      "spec": w.spec})
    out = explain_pod(extender_over(engine, fleet, tmp_path), as_pod(pod(claims={"gpu": "c"})))
    assert out["inventory"] == "ResourceSlices"
    verdicts = {n["node"]: n["verdict"] for n in out["nodes"]}
    assert verdicts == {"h100-node": "pass", "l4-node": "fail"}


def test_the_webhook_refuses_a_claim_whose_owner_uid_is_not_the_pods(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    body = json.loads(review(GENERIC))
    body["request"]["object"]["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    resp = answer(webhook(engine, fleet, {"llm": pod()}), json.dumps(body).encode())
    assert not resp["allowed"] and "uid someone-else, but that pod is uid uid-llm" in resp["status"]["message"]


def test_a_claim_event_keeps_the_fleets_device_types_a_slice_event_renews_them(engine):
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    types = fleet.types()
    fleet.apply_claim_event("ADDED", allocated("c", "n1", "gpu-0", "p"))
    assert fleet.types() is types  # claims hold devices; they add or remove none
    fleet.apply_slice_event("ADDED", slice_of("n2", [gpu(0, H100)]))
    assert [t.unit.name for t in fleet.types()] == [A100[0], H100[0]]


# ---- pods that opt in with the label gpuplace.io/dra -------------------------------------------


def labelled_pod(containers: list[dict], annotations: dict | None = None) -> dict:
    return {"metadata": {"name": "srv", "namespace": "team", "uid": "uid-srv", "labels": {"gpuplace.io/dra": "true"},
                         "annotations": annotations or {"gpuplace.io/model-params": "13B"}},
            "spec": {"containers": containers}}


def pod_review(obj: dict, dry_run: bool = False) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "req-1", "operation": "CREATE", "namespace": "team", "dryRun": dry_run, "object": obj}}).encode()


def apply_patch(obj: dict, patch: list[dict]) -> dict:
    """RFC 6902 add/remove, as kube-apiserver applies the webhook's patch (enough for these paths)."""
    obj = json.loads(json.dumps(obj))
    for op in patch:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = obj
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if op["op"] == "remove":
            del target[last]
        elif last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return obj


def test_a_labelled_pod_asks_its_gpus_through_the_shared_template_which_is_created_once(engine):
    made = []
    hook = ClaimWebhook(fleet_of(engine, [slice_of("n1", [gpu(0, A100)])]), lambda: engine, lambda ns, n: None,
                        ensure_template=lambda ns, count: made.append((ns, count)))
    obj = labelled_pod([{"name": "side"}, {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4"},
                                                                       "requests": {"nvidia.com/gpu": "2"}}}])
    resp = json.loads(hook.respond_pod(pod_review(obj)))["response"]
    assert resp["allowed"] and made == [("team", 2)]
    converted = apply_patch(obj, json.loads(base64.b64decode(resp["patch"])))
    main = converted["spec"]["containers"][1]["resources"]
    assert main == {"limits": {"cpu": "4"}, "requests": {}, "claims": [{"name": "gpuplace-gpu"}]}
    assert converted["spec"]["resourceClaims"] == [{"name": "gpuplace-gpu", "resourceClaimTemplateName": "gpuplace-gpu-2"}]
    json.loads(hook.respond_pod(pod_review(obj, dry_run=True)))
    assert made == [("team", 2)]  # a dry run creates nothing


def test_a_labelled_pod_without_a_gpu_request_gets_one_gpu_in_its_first_container(engine):
    hook = ClaimWebhook(fleet_of(engine, []), lambda: engine, lambda ns, n: None, ensure_template=lambda ns, c: None)
    obj = labelled_pod([{"name": "main"}])
    resp = json.loads(hook.respond_pod(pod_review(obj)))["response"]
    converted = apply_patch(obj, json.loads(base64.b64decode(resp["patch"])))
    assert converted["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuplace-gpu"}]}
    assert converted["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "gpuplace-gpu-1"


@pytest.mark.parametrize("containers, reason", [
    ([{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}},
      {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}}], "2 containers request nvidia.com/gpu"),
    ([{"name": "a", "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}], "nvidia.com/mig-3g.40gb with label"),
    ([{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "64"}}}], "a whole number from 1 to 32"),
    ([{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}], "a whole number from 1 to 32"),
    ([], "spec.containers must be a non-empty list"),
])
def test_a_labelled_pod_that_cannot_be_converted_is_refused_with_the_reason(engine, containers, reason):
    made = []
    hook = ClaimWebhook(fleet_of(engine, []), lambda: engine, lambda ns, n: None,
                        ensure_template=lambda ns, c: made.append(c))
    resp = json.loads(hook.respond_pod(pod_review(labelled_pod(containers))))["response"]
    assert not resp["allowed"] and reason in resp["status"]["message"] and made == []


def test_a_labelled_pod_with_claims_of_its_own_is_left_as_written(engine):
    hook = ClaimWebhook(fleet_of(engine, []), lambda: engine, lambda ns, n: None, ensure_template=lambda ns, c: None)
    obj = labelled_pod([{"name": "main"}])
    obj["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimTemplateName": "mine"}]
    resp = json.loads(hook.respond_pod(pod_review(obj)))["response"]
    assert resp["allowed"] and "patch" not in resp


def test_when_the_template_cannot_be_created_the_pod_is_refused_with_the_cause(engine):
    def forbidden(ns, count):
        raise PermissionError("resourceclaimtemplates is forbidden")
    hook = ClaimWebhook(fleet_of(engine, []), lambda: engine, lambda ns, n: None, ensure_template=forbidden)
    resp = json.loads(hook.respond_pod(pod_review(labelled_pod([{"name": "main"}]))))["response"]
    assert not resp["allowed"] and "resourceclaimtemplates is forbidden" in resp["status"]["message"]


def test_the_webhook_app_answers_both_paths_and_400_for_what_is_not_an_admission_review(engine):
    from starlette.testclient import TestClient

    from scheduler_extender.service.server import create_webhook_app
    fleet = fleet_of(engine, [slice_of("n1", [gpu(0, A100)])])
    hook = ClaimWebhook(fleet, lambda: engine, lambda ns, n: pod() if n == "llm" else None,
                        ensure_template=lambda ns, c: None)
    with TestClient(create_webhook_app(hook)) as client:
        assert client.post("/mutate/resourceclaims", content=review(GENERIC)).json()["response"]["allowed"]
        assert client.post("/mutate/pods", content=pod_review(labelled_pod([{"name": "m"}]))).json()["response"]["patch"]
        bad = client.post("/mutate/pods", content=b"[1, 2")
        assert bad.status_code == 400 and "not JSON" in bad.json()["Error"]
        assert client.get("/healthz").text == "ok"


def test_the_filter_reads_a_claim_the_watch_has_not_shown_within_the_time_kube_scheduler_waits():
    import yaml
    from kubernetes.client.rest import ApiException

    from scheduler_extender import cli
    from tests.factories import ROOT
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpuplace" / "values.yaml").read_text())
    waits = values["scheduler"]["extender"]["httpTimeoutSeconds"]
    calls = []

    def read_namespaced(name, namespace, **kwargs):
        calls.append((namespace, name, kwargs))
        raise ApiException(status=404)

    read = cli._object_reader(read_namespaced, cli.CLAIM_READ_TIMEOUT_SECONDS)
    assert read("team-a", "pod-gpu") is None  # not found: no such claim
    (namespace, name, kwargs), = calls
    connect, answer = kwargs["_request_timeout"]
    assert (namespace, name) == ("team-a", "pod-gpu") and connect + answer < waits
    fleet = DraFleet(Engine().catalog, default_drivers(), fetch_claim=read)  # the watch has shown nothing: read once
    assert fleet.claim("team-a", "pod-gpu") is None and len(calls) == 2
