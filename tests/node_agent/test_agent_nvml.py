"""The NVML probe, run for real against fake NVML fixtures transcribed from published nvidia-smi outputs."""

from __future__ import annotations

import ctypes
import logging
import re
import threading
from pathlib import Path

import pynvml
import pytest

from node_agent.nvml import NVMLUnavailable, memory_bandwidth_gbps, sysfs_numa_node

from tests.node_agent.agent_fixtures import A100_MIG, A100_NVSWITCH, H100_NVSWITCH, RTX4090, fake_from, fixture_data, probe_of

NVML_SOURCE = Path(__file__).resolve().parents[2] / "node_agent" / "nvml.py"


def test_every_nvml_name_the_probe_uses_exists_in_the_declared_pynvml():
    names = set(re.findall(r'"((?:nvml|NVML_)[A-Za-z0-9_]+)"', NVML_SOURCE.read_text()))
    names |= {f"NVML_DEVICE_ARCH_{a}" for a in ("KEPLER", "AMPERE", "ADA", "HOPPER", "BLACKWELL")}
    assert len(names) > 40, names
    assert sorted(n for n in names if not hasattr(pynvml, n)) == [], "nvml.py calls names pynvml does not have"


@pytest.mark.parametrize(
    "fixture, gpus, name, memory_mib, cc, arch, bandwidth, sms, cores, ecc, power_w, peers, links, driver, cuda",
    [
        (A100_NVSWITCH, 8, "NVIDIA A100-SXM4-80GB", 81920, "8.0", "ampere", 2039.0, 108, 6912, True, 400.0, 7, 12, "525.60.13", "12.0"),
        (H100_NVSWITCH, 8, "NVIDIA H100 80GB HBM3", 81559, "9.0", "hopper", 3352.3, 132, 16896, True, 700.0, 7, 18, "565.57.01", "12.7"),
        (A100_MIG, 1, "NVIDIA A100 80GB PCIe", 81920, "8.0", "ampere", 1935.4, 108, 6912, True, 300.0, 0, 0, "530.30.02", "12.1"),
        (RTX4090, 1, "NVIDIA GeForce RTX 4090", 24564, "8.9", "ada", 1008.1, 128, 16384, False, 450.0, 0, 0, None, None),
    ],
    ids=["8x-A100-SXM4-NV12", "8x-H100-SXM5-NV18", "A100-PCIe-MIG", "RTX-4090"],
)
def test_probe_reports_what_the_published_nvidia_smi_output_shows(
    inventory_of, fixture, gpus, name, memory_mib, cc, arch, bandwidth, sms, cores, ecc, power_w, peers, links, driver, cuda
):
    inv = inventory_of(fixture)
    assert len(inv.gpus) == gpus
    assert inv.driver_version == driver
    assert inv.cuda_driver_version == cuda
    assert [g.index for g in inv.gpus] == list(range(gpus))
    for g in inv.gpus:
        assert (g.name, g.memory_mib, g.compute_capability, g.architecture) == (name, memory_mib, cc, arch)
        assert (g.memory_bandwidth_gbps, g.multiprocessors, g.cuda_cores) == (bandwidth, sms, cores)
        assert (g.ecc_enabled, g.power_limit_w, g.vendor) == (ecc, power_w, "nvidia")
        assert g.healthy and g.health_reasons == []
        assert len(g.nvlinks) == peers
        assert all(p.links == links for p in g.nvlinks)
        assert g.pci_bus_id and re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", g.pci_bus_id)
    assert len({g.uuid for g in inv.gpus}) == gpus


@pytest.mark.parametrize("fixture, temperatures", [
    (A100_NVSWITCH, [28, 30, 28, 32, 30, 31, 30, 32]),  # nvidia-smi -q "GPU Current Temp", GPU by GPU
    (H100_NVSWITCH, [30, 30, 31, 29, 28, 30, 29, 29]),
    (RTX4090, [40]),
    (A100_MIG, [None]),  # its source (nvidia-smi -L) shows none: NOT_SUPPORTED, unknown
], ids=["8x-A100-SXM4", "8x-H100-SXM5", "RTX-4090", "A100-PCIe-MIG"])
def test_gpu_temperature_is_read_through_pynvml_as_the_published_output_shows(fixture, temperatures):
    lib = fake_from(fixture_data(fixture))
    inv = probe_of(lib).probe()
    assert [g.temperature_c for g in inv.gpus] == temperatures
    assert lib.calls.count("nvmlDeviceGetTemperature") == len(temperatures)  # full GPUs only, not MIG devices
    json_gpus = inv.to_dict()["gpus"]
    for g, t in zip(json_gpus, temperatures):
        assert g.get("temperatureC") == t  # left out when unknown, never 0


@pytest.mark.parametrize("script", [{"unsupported": ["nvmlDeviceGetTemperature"]},
                                    {"errors": {"nvmlDeviceGetTemperature": "UNKNOWN"}},
                                    {"errors": {"nvmlDeviceGetTemperature": "NO_PERMISSION"}}])
def test_gpu_temperature_not_supported_or_failing_is_unknown_and_the_gpu_stays_healthy(inventory_of, script):
    data = fixture_data(RTX4090)
    data["gpus"][0].update(script)
    gpu = inventory_of(data).gpus[0]
    assert gpu.temperature_c is None and gpu.healthy
    assert "temperatureC" not in gpu.model_dump(by_alias=True, exclude_none=True)


def test_the_stand_in_answers_nvml_device_get_temperature_as_nvml_h_declares_it():
    lib = fake_from(fixture_data(RTX4090))
    probe_of(lib, hold_nvml=True, watch_xids=False).probe()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 40
    # nvmlTemperatureSensors_t of NVML 570 has NVML_TEMPERATURE_GPU only (GPU_MAX = 1 came with 615).
    for sensor in (1, 2, 0xFFFF):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetTemperature(handle, sensor)
    unknown = fake_from(fixture_data(A100_MIG))
    probe_of(unknown, hold_nvml=True, watch_xids=False).probe()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_TEMPERATURE_GPU)
    # A caller whose out-parameter is not an unsigned int breaks the boundary.
    wide = ctypes.c_ulonglong()
    with pytest.raises(AssertionError, match="nvml.h's c_uint is 4"):
        lib.nvmlDeviceGetTemperature(handle, 0, ctypes.byref(wide))
    lib.violations.clear()  # this test broke it on purpose


def test_a100_in_mig_mode_lists_each_mig_device_with_profile_and_memory(inventory_of):
    gpu = inventory_of(A100_MIG).gpus[0]
    assert gpu.mig_enabled
    assert [(m.uuid, m.profile, m.memory_mib, m.multiprocessors) for m in gpu.mig_devices] == [
        ("MIG-0929581a-2be6-5dec-bf34-0954c6c529a6", "3g.40gb", 40192, 42),
        ("MIG-3adbed3a-d03d-549f-a016-ba1fd7359f23", "3g.40gb", 40192, 42),
    ]


def test_each_a100_on_nvswitches_lists_the_seven_other_gpus_as_peers_with_12_links(inventory_of):
    inv = inventory_of(A100_NVSWITCH)
    uuids = [g.uuid for g in inv.gpus]
    for g in inv.gpus:
        assert [p.peer_uuid for p in g.nvlinks] == [u for u in uuids if u != g.uuid]
        assert {p.links for p in g.nvlinks} == {12}


def test_h100_on_nvswitches_is_nv18_between_every_pair_and_knows_its_numa_node(inventory_of):
    inv = inventory_of(H100_NVSWITCH)
    assert all({p.links for p in g.nvlinks} == {18} and len(g.nvlinks) == 7 for g in inv.gpus)
    assert [g.numa_node for g in inv.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_rtx_4090_has_no_nvlink_no_mig_and_ecc_off(inventory_of):
    gpu = inventory_of(RTX4090).gpus[0]
    assert gpu.nvlinks == [] and not gpu.mig_enabled and gpu.mig_devices == []
    assert gpu.ecc_enabled is False


def test_a100_on_nvswitches_has_unknown_numa_node_because_the_source_did_not_publish_it(inventory_of):
    assert {g.numa_node for g in inventory_of(A100_NVSWITCH).gpus} == {None}


def test_a100_with_one_correctable_remapped_row_and_nothing_pending_stays_healthy(inventory_of):
    gpu = inventory_of(A100_NVSWITCH).gpus[5]
    assert gpu.pci_bus_id == "00000000:8B:00.0" and gpu.healthy


# ---- memory bandwidth ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "card, bus_bits, mem_clock_mhz, datasheet_gbps",
    [
        ("A100-SXM4-80GB HBM2e", 5120, 1593, 2039),
        ("A100 80GB PCIe HBM2e", 5120, 1512, 1935),
        ("H100 SXM5 HBM3", 5120, 2619, 3350),
        ("RTX 4090 GDDR6X", 384, 10501, 1008),
        ("RTX 2080 GDDR6", 256, 7000, 448),
        ("GTX TITAN X GDDR5", 384, 3505, 336.5),
    ],
)
def test_bandwidth_formula_matches_the_datasheet_for_hbm_gddr6x_gddr6_and_gddr5(card, bus_bits, mem_clock_mhz, datasheet_gbps):
    assert memory_bandwidth_gbps(bus_bits, mem_clock_mhz) == pytest.approx(datasheet_gbps, rel=0.005)


@pytest.mark.parametrize("bus_bits, clock", [(None, 1593), (5120, None), (0, 1593), (None, None)])
def test_bandwidth_is_unknown_when_either_input_is(bus_bits, clock):
    assert memory_bandwidth_gbps(bus_bits, clock) is None


# ---- failures ----------------------------------------------------------------------------------


def test_a_failing_call_reports_unknown_and_logs_once_per_function_and_reason(caplog):
    data = fixture_data(A100_NVSWITCH)
    for gpu in data["gpus"]:
        gpu["errors"] = {"nvmlDeviceGetEnforcedPowerLimit": "UNKNOWN", "nvmlDeviceGetPowerManagementLimit": "UNKNOWN",
                         "nvmlDeviceGetMemoryBusWidth": "GPU_IS_LOST"}
    probe = probe_of(fake_from(data))
    with caplog.at_level(logging.WARNING, logger="node_agent.nvml"):
        first = probe.probe()
        second = probe.probe()
    for inv in (first, second):
        assert all(g.power_limit_w is None for g in inv.gpus), "unknown must stay None, never 0"
        assert all(g.memory_bandwidth_gbps is None for g in inv.gpus)
        assert all(g.healthy for g in inv.gpus)
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "nvmlDeviceGetEnforcedPowerLimit" in m]) == 1
    assert len([m for m in lines if "nvmlDeviceGetPowerManagementLimit" in m]) == 1
    assert len([m for m in lines if "nvmlDeviceGetMemoryBusWidth" in m and "GPU is lost" in m]) == 1


def test_not_supported_means_what_the_feature_means(inventory_of):
    data = fixture_data(A100_NVSWITCH)
    gpu = data["gpus"][0]
    gpu["ecc"] = "unsupported"  # no ECC on the board: ECC off, not unknown
    gpu["unsupported"] = ["nvmlDeviceGetNumGpuCores", "nvmlDeviceGetRemappedRows"]  # unknown / nothing pending
    got = inventory_of(data).gpus[0]
    assert got.ecc_enabled is False
    assert got.cuda_cores is None and got.multiprocessors is None
    assert got.healthy


def test_a_gpu_whose_handle_fails_is_reported_unhealthy_with_the_reason_and_the_others_still_probe(inventory_of):
    data = fixture_data(A100_NVSWITCH)
    data["gpus"][3]["handleError"] = "GPU_IS_LOST"
    inv = inventory_of(data)
    assert len(inv.gpus) == 8
    lost = inv.gpus[3]
    assert not lost.healthy
    assert any("GPU is lost" in r for r in lost.health_reasons)
    others = [g for g in inv.gpus if g.index != 3]
    assert all(g.healthy and len(g.nvlinks) == 6 for g in others)


def test_a_gpu_whose_uuid_and_memory_cannot_be_read_is_unhealthy_not_dropped(inventory_of):
    data = fixture_data(RTX4090)
    data["gpus"][0]["errors"] = {"nvmlDeviceGetUUID": "UNKNOWN", "nvmlDeviceGetMemoryInfo": "UNKNOWN"}
    gpu = inventory_of(data).gpus[0]
    assert not gpu.healthy
    assert "UUID could not be read" in gpu.health_reasons
    assert "memory size could not be read" in gpu.health_reasons


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"remappedRows": {"pending": True}}, "row remapping pending"),
        ({"remappedRows": {"failure": True}}, "row remapping failed"),
        ({"retiredPagesPending": True}, "retired ECC pages pending"),
        ({"volatileUncorrectedEcc": 2}, "2 uncorrectable (double-bit) ECC errors"),
    ],
)
def test_memory_errors_make_the_gpu_unhealthy_with_a_reason(inventory_of, change, reason):
    data = fixture_data(A100_NVSWITCH)
    data["gpus"][2].update(change)
    inv = inventory_of(data)
    assert not inv.gpus[2].healthy
    assert any(reason in r for r in inv.gpus[2].health_reasons), inv.gpus[2].health_reasons
    assert all(g.healthy for g in inv.gpus if g.index != 2)


def test_a_critical_xid_makes_the_gpu_unhealthy_and_an_application_xid_does_not():
    data = fixture_data(H100_NVSWITCH)
    data["gpus"][0]["xids"] = [13, 31]  # application errors: the GPU is fine
    fake = fake_from(data)
    probe = probe_of(fake)
    assert all(g.healthy for g in probe.probe().gpus)
    fake.post_xid(data["gpus"][6]["uuid"], 79)  # GPU has fallen off the bus
    inv = probe.probe()
    assert not inv.gpus[6].healthy and "critical XID 79" in inv.gpus[6].health_reasons[0]
    assert all(g.healthy for g in inv.gpus if g.index != 6)
    assert not probe.probe().gpus[6].healthy, "a critical XID stays until the agent restarts"


def test_xid_events_are_not_watched_where_the_driver_refuses_registration():
    data = fixture_data(RTX4090)
    data["gpus"][0]["unsupported"] = ["nvmlDeviceRegisterEvents"]
    data["gpus"][0]["xids"] = [79]
    assert probe_of(fake_from(data)).probe().gpus[0].healthy


@pytest.mark.parametrize(
    "error, words",
    [
        ("LIBRARY_NOT_FOUND", "libnvidia-ml.so.1 was not found"),
        ("DRIVER_NOT_LOADED", "kernel driver is not loaded"),
        ("LIB_RM_VERSION_MISMATCH", "differ in version"),
        ("NO_PERMISSION", "no permission"),
    ],
)
def test_no_usable_driver_raises_nvml_unavailable_with_a_clear_message(error, words):
    fake = fake_from({"initError": error, "gpus": []})
    with pytest.raises(NVMLUnavailable, match=words):
        probe_of(fake).probe()


def test_a_held_nvml_session_is_initialized_once_even_when_probes_run_in_parallel():
    fake = fake_from(fixture_data(A100_MIG))
    probe = probe_of(fake, hold_nvml=True)
    threads = [threading.Thread(target=probe.probe) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls.count("nvmlInitWithFlags") == 1
    probe.nvml.shutdown()
    assert not fake.initialized
    probe.nvml.shutdown()  # twice is harmless


# ---- MIG details -------------------------------------------------------------------------------


def test_mig_profile_is_found_from_slices_and_memory_when_gpu_instances_need_privileges(inventory_of):
    data = fixture_data(A100_MIG)
    data["gpus"][0]["errors"] = {"nvmlDeviceGetGpuInstanceById": "NO_PERMISSION"}
    assert [m.profile for m in inventory_of(data).gpus[0].mig_devices] == ["3g.40gb", "3g.40gb"]


def test_a_compute_instance_smaller_than_its_gpu_instance_is_named_like_nvidia_smi(inventory_of):
    data = fixture_data(A100_MIG)
    data["gpus"][0]["migDevices"][0]["computeSlices"] = 1
    mig = inventory_of(data).gpus[0].mig_devices[0]
    assert (mig.profile, mig.multiprocessors, mig.memory_mib) == ("1c.3g.40gb", 14, 40192)


def test_seven_1g_10gb_devices_are_all_listed(inventory_of):
    data = fixture_data(A100_MIG)
    data["gpus"][0]["migDevices"] = [
        {"uuid": f"MIG-0000000{i}-aaaa-bbbb-cccc-dddddddddddd", "profileId": 19, "gpuInstanceId": 7 + i} for i in range(7)
    ]
    migs = inventory_of(data).gpus[0].mig_devices
    assert [m.profile for m in migs] == ["1g.10gb"] * 7
    assert {m.memory_mib for m in migs} == {9856}


# ---- NVLink details ------------------------------------------------------------------------------


def test_direct_nvlinks_are_counted_per_peer_by_matching_remote_bus_ids(inventory_of):
    data = fixture_data(H100_NVSWITCH)
    gpus = data["gpus"][:4]
    u = [g["uuid"] for g in gpus]
    # Two NVLink-bridged pairs (as 4 PCIe cards with bridges): 0<->1 and 2<->3, 4 links each.
    for i, peer in ((0, 1), (1, 0), (2, 3), (3, 2)):
        gpus[i]["nvlinks"] = [{"to": u[peer], "links": 4}]
        gpus[i]["inactiveLinks"] = 2
    data["gpus"] = gpus
    inv = inventory_of(data)
    assert [[(p.peer_uuid, p.links) for p in g.nvlinks] for g in inv.gpus] == [
        [(u[1], 4)], [(u[0], 4)], [(u[3], 4)], [(u[2], 4)],
    ]


def test_links_whose_remote_nvml_cannot_identify_count_as_nvswitch_links(inventory_of):
    data = fixture_data(H100_NVSWITCH)
    for gpu in data["gpus"]:
        gpu["nvlinks"] = [{"to": "unknown", "links": 18}]  # switches hidden, as in a VM
    inv = inventory_of(data)
    assert all(len(g.nvlinks) == 7 and {p.links for p in g.nvlinks} == {18} for g in inv.gpus)


def test_switch_peers_get_the_narrower_sides_link_count(inventory_of):
    data = fixture_data(A100_NVSWITCH)
    data["gpus"][0]["nvlinks"] = [{"to": "switch", "links": 10}]
    data["gpus"][0]["inactiveLinks"] = 2  # two links down
    inv = inventory_of(data)
    assert {p.links for p in inv.gpus[0].nvlinks} == {10}
    assert [p.links for p in inv.gpus[1].nvlinks][0] == 10
    assert [p.links for p in inv.gpus[1].nvlinks][1:] == [12] * 6


# ---- NUMA ------------------------------------------------------------------------------------------


def test_numa_node_comes_from_sysfs_by_pci_bus_id(tmp_path):
    dev = tmp_path / "bus/pci/devices/0000:9a:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    none = tmp_path / "bus/pci/devices/0000:18:00.0"
    none.mkdir(parents=True)
    (none / "numa_node").write_text("-1\n")
    assert sysfs_numa_node("00000000:9A:00.0", tmp_path) == 1
    assert sysfs_numa_node("00000000:18:00.0", tmp_path) is None  # firmware gave no affinity
    assert sysfs_numa_node("00000000:DB:00.0", tmp_path) is None
    assert sysfs_numa_node("not-a-bus-id", tmp_path) is None


def test_nvml_numa_node_wins_over_sysfs_where_the_driver_has_it(inventory_of):
    data = fixture_data(H100_NVSWITCH)
    data["gpus"][0]["gpuNumaId"] = 4  # a coherent system where the GPU's memory is its own NUMA node
    assert inventory_of(data).gpus[0].numa_node == 4


def test_probe_stamps_node_name_mig_strategy_and_observed_at(inventory_of):
    inv = inventory_of(A100_MIG, node_name="gpu-a100-mig-0", mig_strategy="mixed")
    assert (inv.node_name, inv.mig_strategy, inv.observed_at.isoformat()) == (
        "gpu-a100-mig-0", "mixed", "2026-11-21T08:00:00+00:00")


# ---- the NVML session's lifetime ---------------------------------------------------------------


def test_without_xid_watching_nvml_is_open_only_during_a_probe():
    fake = fake_from(fixture_data(A100_MIG))
    probe = probe_of(fake, watch_xids=False)
    for _ in range(3):
        probe.probe()
        assert not fake.initialized, "the agent must not hold the GPUs between probes"
    assert fake.calls.count("nvmlInitWithFlags") == 3 and fake.calls.count("nvmlShutdown") == 3


def test_while_watching_xids_nvml_stays_open_and_xids_seen_survive_a_new_session():
    data = fixture_data(RTX4090)
    fake = fake_from(data)
    probe = probe_of(fake)
    probe.probe()
    assert fake.initialized
    fake.post_xid(data["gpus"][0]["uuid"], 79)
    inv = probe.probe()
    assert "critical XID 79" in inv.gpus[0].health_reasons[0]
    assert not fake.initialized, "a GPU whose reason asks for a reset is not held by the agent"
    inv = probe.probe()  # a new session: registers again, remembers XID 79
    assert fake.calls.count("nvmlInitWithFlags") == 2 and fake.calls.count("nvmlDeviceRegisterEvents") == 2
    assert not inv.gpus[0].healthy


def test_after_an_answer_like_a_driver_reload_the_next_probe_opens_nvml_again():
    data = fixture_data(RTX4090)
    data["gpus"][0]["errors"] = {"nvmlDeviceGetPowerManagementLimit": "GPU_IS_LOST", "nvmlDeviceGetEnforcedPowerLimit": "GPU_IS_LOST"}
    fake = fake_from(data)
    probe = probe_of(fake)
    probe.probe()
    assert not fake.initialized
    probe.probe()
    assert fake.calls.count("nvmlInitWithFlags") == 2
