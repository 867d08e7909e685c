"""Filter criteria, one at a time, and their composition (table-driven, scenario names)."""

import datetime as dt

import pytest

from node_agent.inventory import parse_inventory
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.devices import NodeAllocation, NodeState, build_node_view
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.filter import (
    C_CC, C_CLASS, C_COUNT, C_DEVICE_KIND, C_ECC, C_FREE, C_HEALTHY, C_INVENTORY, C_MODEL, C_NVLINK,
    C_RESOURCE, C_VRAM, label_units,
)
from tests.factories import gpu, inventory, pod, with_nvlink_clique

CAT = default_catalog()
ENGINE = Engine()
A100 = dict(name="NVIDIA A100-SXM4-80GB", memory_mib=81920, eccEnabled=True, computeCapability="8.0")
RTX4090 = dict(name="NVIDIA GeForce RTX 4090", memory_mib=24564, eccEnabled=False, computeCapability="8.9")
A6000 = dict(name="NVIDIA RTX A6000", memory_mib=46068, eccEnabled=True, computeCapability="8.6")
T4 = dict(name="Tesla T4", memory_mib=15360, eccEnabled=True, computeCapability="7.5")


def node(gpus, name="node-a", allocation=None, **top):
    inv = parse_inventory(inventory(name, gpus, **top))
    return NodeState(name, build_node_view(inv, CAT), allocation or NodeAllocation())


def gpus(n, spec, **extra):
    return [gpu(i, **{**spec, **extra}) for i in range(n)]


def run(p, state, now=None):
    job = ENGINE.job(p)
    return ENGINE.filter(job, [state], now)[0]


def criteria(result):
    return {r.criterion for r in result.rejections}


# name, pod annotations, gpu count, node gpus, expected failing criteria (empty: passes)
SCENARIOS = [
    ("13B bf16 inference does not fit 24 GB cards", {"gpuplace.io/model-params": "13B", "gpuplace.io/precision": "bf16"}, 1,
     gpus(4, RTX4090), {C_VRAM}),
    ("13B bf16 inference fits a 48 GB Ampere card", {"gpuplace.io/model-params": "13B", "gpuplace.io/precision": "bf16"}, 1,
     gpus(2, A6000), set()),
    ("bf16 needs compute capability 8.0: Turing T4 refused", {"gpuplace.io/precision": "bf16", "gpuplace.io/vram": "8Gi"}, 1,
     gpus(4, T4), {C_CC}),
    ("default precision imposes nothing: T4 accepted", {"gpuplace.io/model-params": "1B"}, 1, gpus(4, T4), set()),
    ("fp8 needs 8.9: A6000 (8.6) refused, 4090 (8.9) accepted", {"gpuplace.io/precision": "fp8"}, 1, gpus(2, A6000), {C_CC}),
    ("fp8 on Ada passes", {"gpuplace.io/precision": "fp8"}, 1, gpus(2, RTX4090), set()),
    ("explicit min compute capability", {"gpuplace.io/min-compute-capability": "9.0"}, 1, gpus(2, RTX4090), {C_CC}),
    ("require ecc refuses ECC-off cards", {"gpuplace.io/require": "ecc"}, 1, gpus(4, RTX4090), {C_ECC}),
    ("require ecc refuses unknown ECC state", {"gpuplace.io/require": "ecc"}, 1, gpus(2, A6000, eccEnabled=None), {C_ECC}),
    ("require nvlink with 4 GPUs refuses a box without NVLink", {"gpuplace.io/require": "nvlink"}, 4, gpus(4, RTX4090), {C_NVLINK}),
    ("require nvlink passes on a clique", {"gpuplace.io/require": "nvlink"}, 4, with_nvlink_clique(gpus(4, A6000)), set()),
    ("model allowlist excludes other models", {"gpuplace.io/gpu-models": "A6000"}, 1, gpus(4, RTX4090), {C_MODEL}),
    ("gpu-models H20 does not match H100", {"gpuplace.io/gpu-models": "H20", "gpuplace.io/vram": "70Gi"}, 1,
     gpus(4, dict(name="NVIDIA H100 80GB HBM3", memory_mib=81559)), {C_MODEL}),
    ("exclude list refuses the model", {"gpuplace.io/exclude-gpu-models": "RTX-4090"}, 1, gpus(4, RTX4090), {C_MODEL}),
    ("a class's allowed MIG profiles", {"gpuplace.io/model-params": "1B", "gpuplace.io/class": "large",
                                        "gpuplace.io/require": "mig"}, 1, gpus(1, A100), {C_DEVICE_KIND}),
    ("premium full GPUs go to jobs that need them", {"gpuplace.io/vram": "70Gi"}, 1, gpus(8, A100), set()),
    ("too few GPUs on the node", {}, 8, gpus(4, RTX4090), {C_COUNT}),
    ("unhealthy GPUs never count", {}, 4, gpus(3, RTX4090) + [gpu(3, **RTX4090, healthy=False, healthReasons=["XID 79"])],
     {C_HEALTHY, C_COUNT}),
    ("require mig refuses full GPUs", {"gpuplace.io/require": "mig"}, 1, gpus(2, A6000), {C_DEVICE_KIND}),
]


@pytest.mark.parametrize("name, annotations, count, node_gpus, expected", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_criterion(name, annotations, count, node_gpus, expected):
    result = run(pod(annotations, gpus=count), node(node_gpus))
    assert criteria(result) == expected, result.reason
    assert result.passed == (not expected)


def test_vram_reason_names_the_gpus_the_sizes_and_the_job():
    r = run(pod({"gpuplace.io/model-params": "13B", "gpuplace.io/workload": "inference", "gpuplace.io/precision": "bf16"}),
            node(gpus(4, RTX4090)))
    assert r.reason == "GPU 0-3: 24 GiB VRAM < 30.3 GiB needed (13B inference, bf16)"
    assert r.unresolvable


def test_all_failing_reasons_are_reported_together():
    r = run(pod({"gpuplace.io/require": "ecc,nvlink", "gpuplace.io/vram": "30Gi"}, gpus=4), node(gpus(4, RTX4090)))
    assert {C_VRAM, C_ECC, C_NVLINK} <= criteria(r)


def test_busy_gpus_are_a_resolvable_failure():
    state = node(gpus(4, RTX4090))
    held = {u.uuid: "default/other" for u in state.view.units("nvidia.com/gpu")[:3]}
    r = run(pod({}, gpus=2), NodeState("node-a", state.view, NodeAllocation(held=held)))
    assert criteria(r) == {C_FREE} and not r.unresolvable
    assert "1 of 4 eligible GPUs free (3 in use), 2 requested" in r.reason


def test_pods_without_known_devices_still_use_up_gpus():
    state = node(gpus(4, RTX4090))
    r = run(pod({}, gpus=2), NodeState("node-a", state.view, NodeAllocation(anonymous={"nvidia.com/gpu": 3})))
    assert criteria(r) == {C_FREE}


def test_nvlink_group_must_be_among_the_free_gpus():
    clique_pairs = gpus(4, A100)
    # two NVLink pairs: (0,1) and (2,3)
    for a, b in ((0, 1), (2, 3)):
        clique_pairs[a]["nvlinks"] = [{"peerUuid": clique_pairs[b]["uuid"], "links": 4}]
        clique_pairs[b]["nvlinks"] = [{"peerUuid": clique_pairs[a]["uuid"], "links": 4}]
    state = node(clique_pairs)
    held = {state.view.units("nvidia.com/gpu")[0].uuid: "default/x", state.view.units("nvidia.com/gpu")[2].uuid: "default/y"}
    p = pod({"gpuplace.io/require": "nvlink", "gpuplace.io/vram": "70Gi"}, gpus=2)
    assert run(p, state).passed
    r = run(p, NodeState("node-a", state.view, NodeAllocation(held=held)))
    assert criteria(r) == {C_NVLINK} and not r.unresolvable


def test_nvlink_pairs_cannot_serve_a_four_gpu_job():
    pairs = gpus(4, A6000)
    for a, b in ((0, 1), (2, 3)):
        pairs[a]["nvlinks"] = [{"peerUuid": pairs[b]["uuid"], "links": 4}]
        pairs[b]["nvlinks"] = [{"peerUuid": pairs[a]["uuid"], "links": 4}]
    r = run(pod({"gpuplace.io/require": "nvlink"}, gpus=4), node(pairs))
    assert criteria(r) == {C_NVLINK} and "no 4 GPUs all joined by NVLink" in r.reason


def test_mig_single_strategy_offers_mig_devices_as_nvidia_gpu():
    g = gpu(0, **A100, migEnabled=True, migDevices=[
        {"uuid": f"MIG-{i}", "profile": "3g.40gb", "memoryMiB": 40192} for i in range(2)])
    state = node([g], migStrategy="single")
    r = run(pod({"gpuplace.io/model-params": "13B", "gpuplace.io/precision": "bf16"}), state)
    assert r.passed and r.chosen[0].kind == "mig" and r.chosen[0].mig_profile == "3g.40gb"


def test_mig_mixed_strategy_offers_profiles_as_their_own_resources():
    g = gpu(0, **A100, migEnabled=True, migDevices=[
        {"uuid": "MIG-a", "profile": "3g.40gb", "memoryMiB": 40192}, {"uuid": "MIG-b", "profile": "1g.10gb", "memoryMiB": 9728}])
    state = node([g], migStrategy="mixed")
    assert run(pod({}, resource="nvidia.com/mig-1g.10gb"), state).passed
    r = run(pod({}), state)
    assert criteria(r) == {C_RESOURCE} and "offers nvidia.com/mig-1g.10gb, nvidia.com/mig-3g.40gb" in r.reason


def test_a_cuda_job_is_refused_by_an_amd_node():
    amd = [{"index": 0, "uuid": "GPU-amd0", "vendor": "amd", "name": "AMD Radeon VII", "memoryMiB": 16368}]
    r = run(pod({"gpuplace.io/model-params": "1B"}), node(amd))
    assert criteria(r) == {C_RESOURCE} and "a CUDA job needs NVIDIA GPUs" in r.reason


def test_a_rocm_job_runs_on_amd_and_bf16_is_checked_against_the_catalog():
    amd = [{"index": 0, "uuid": "GPU-amd0", "vendor": "amd", "name": "AMD Radeon VII", "memoryMiB": 16368}]
    assert run(pod({"gpuplace.io/precision": "fp16"}, resource="amd.com/gpu"), node(amd)).passed
    r = run(pod({"gpuplace.io/precision": "bf16"}, resource="amd.com/gpu"), node(amd))
    assert criteria(r) == {C_CC} and "no native bf16" in r.reason


H100 = dict(name="NVIDIA H100 80GB HBM3", memory_mib=81559, eccEnabled=True, computeCapability="9.0")
MI300X = {"index": 0, "uuid": "GPU-amd0", "vendor": "amd", "name": "AMD Instinct MI300X", "memoryMiB": 196608}


@pytest.mark.parametrize("precision", ["fp4", "fp6"])
def test_fp4_or_fp6_on_a_hopper_gpu_is_refused_by_the_compute_capability_criterion(precision):
    r = run(pod({"gpuplace.io/precision": precision, "gpuplace.io/class": "large"}), node(gpus(2, H100)))
    assert criteria(r) == {C_CC}
    assert f"compute capability 9.0 < 10.0 needed for {precision}" in r.reason


def test_fp4_on_an_amd_gpu_without_native_fp4_is_refused_as_bf16_is_on_a_radeon():
    r = run(pod({"gpuplace.io/precision": "fp4", "gpuplace.io/class": "large"}, resource="amd.com/gpu"), node([MI300X]))
    assert criteria(r) == {C_CC} and "MI300X has no native fp4" in r.reason


B200 = dict(name="NVIDIA B200", memory_mib=183359, eccEnabled=True, computeCapability="10.0")
B300 = dict(name="NVIDIA B300 SXM6 AC", memory_mib=275040, eccEnabled=True, computeCapability="10.3")
GB200 = dict(name="NVIDIA GB200", memory_mib=189471, eccEnabled=True, computeCapability="10.0")
RTX5090 = dict(name="NVIDIA GeForce RTX 5090", memory_mib=32607, eccEnabled=False, computeCapability="12.0")
H200_NVL = dict(name="NVIDIA H200 NVL", memory_mib=143771, eccEnabled=True, computeCapability="9.0")


@pytest.mark.parametrize("spec", [B200, B300, GB200, RTX5090], ids=["B200", "B300", "GB200", "RTX 5090"])
def test_fp4_on_a_blackwell_gpu_passes(spec):
    assert run(pod({"gpuplace.io/precision": "fp4", "gpuplace.io/class": "large"}), node(gpus(2, spec))).passed


def test_fp4_on_the_mi355x_passes_its_catalog_precisions():
    mi355x = {**MI300X, "name": "AMD Instinct MI355X", "memoryMiB": 294912}
    assert run(pod({"gpuplace.io/precision": "fp4", "gpuplace.io/class": "large"}, resource="amd.com/gpu"),
               node([mi355x])).passed


@pytest.mark.parametrize("spec, passes", [(B200, True), (B300, False), (GB200, False)], ids=["B200", "B300", "GB200"])
def test_gpu_models_b200_matches_b200_nodes_and_not_b300_or_gb200(spec, passes):
    r = run(pod({"gpuplace.io/gpu-models": "B200", "gpuplace.io/class": "large"}), node(gpus(2, spec)))
    assert r.passed is passes
    if not passes:
        assert criteria(r) == {C_MODEL} and "not in gpuplace.io/gpu-models (B200)" in r.reason


@pytest.mark.parametrize("models, passes", [("H20", False), ("H200", True), ("H200-NVL", True), ("H200-SXM", False)])
def test_gpu_models_h20_never_matches_an_h200_nvl_node(models, passes):
    r = run(pod({"gpuplace.io/gpu-models": models, "gpuplace.io/class": "large"}), node(gpus(2, H200_NVL)))
    assert r.passed is passes, r.reason


def test_missing_and_stale_inventories_fail_gpu_pods_with_a_reason():
    missing = run(pod({}), NodeState("bare", None))
    assert criteria(missing) == {C_INVENTORY} and "gpuplace-agent" in missing.reason
    state = node(gpus(1, RTX4090))
    observed = state.view.observed_at
    assert run(pod({}), state, now=observed + dt.timedelta(seconds=299)).passed
    stale = run(pod({}), state, now=observed + dt.timedelta(seconds=301))
    assert criteria(stale) == {C_INVENTORY} and "stale" in stale.reason


def test_invalid_inventory_reason_is_shown():
    r = run(pod({}), NodeState("n", None, inventory_error="gpuplace.io/inventory: gpus.0.memoryMiB: Field required"))
    assert "memoryMiB" in r.reason


def test_non_gpu_pods_pass_every_node_untouched_even_without_inventory():
    r = run(pod({}, gpus=None), NodeState("bare", None))
    assert r.passed and r.untouched


def test_malformed_annotation_fails_every_node_with_the_annotation_named():
    r = run(pod({"gpuplace.io/vram": "lots"}), node(gpus(4, A100)))
    assert not r.passed and r.unresolvable and r.reason.startswith("gpuplace.io/vram:")


@pytest.mark.parametrize("indices, label", [([0, 1, 2, 3], "GPU 0-3"), ([0, 1], "GPU 0,1"), ([0, 2, 3, 4, 7], "GPU 0,2-4,7")])
def test_unit_labels_compress_ranges(indices, label):
    state = node(gpus(8, RTX4090))
    units = [u for u in state.view.units("nvidia.com/gpu") if u.gpu_index in indices]
    assert label_units(units) == label


@pytest.mark.parametrize("vram, memory_mib, have, need", [
    ("24565Mi", 24564, "23.988 GiB", "23.989 GiB"),        # one MiB short: was "24 GiB VRAM < 24 GiB needed"
    ("24564Mi", 24563, "23.987 GiB", "23.988 GiB"),
    (str(24564 * 2**20 + 1), 24564, "23.9882812 GiB", "23.9882813 GiB"),  # one byte short
    ("30Gi", 24564, "24 GiB", "30 GiB"),                    # far apart: printed as before
])
def test_a_vram_reason_prints_enough_digits_that_have_reads_less_than_need(vram, memory_mib, have, need):
    from decimal import Decimal
    result = run(pod({"gpuplace.io/vram": vram}), node([gpu(0, **{**RTX4090, "memory_mib": memory_mib})]))
    assert f"{have} VRAM < {need} needed (gpuplace.io/vram)" in result.reason
    assert Decimal(have.split()[0]) < Decimal(need.split()[0])
