"""The agent over the stand-in for libnvidia-ml (gpuplace_testing.nvml_standin): the real pynvml wrappers,
nvml.h's structs and return codes, scenarios transcribed from published outputs (issue 14)."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from node_agent.nvml import APPLICATION_XIDS, ProbeError, match_mig_profile, parse_ignored_xids
from gpuplace_testing.nvml_standin import struct_version
from tests.node_agent.agent_fixtures import (
    A100_MIG, A100_NVSWITCH, H100_NVSWITCH, NVML_FIXTURES, RTX4090, fake_from, fixture_data, probe_of,
)

H100_FM_STOPPED = NVML_FIXTURES / "h100-sxm5-80gb-x8-fabric-manager-stopped.yaml"
A100_MIG_UNPRIVILEGED = NVML_FIXTURES / "a100-80gb-pcie-mig-unprivileged.yaml"


# ---- fabric --------------------------------------------------------------------------------------


def test_hgx_h100_with_fabric_manager_stopped_publishes_no_healthy_gpu_and_says_why(inventory_of):
    inv = inventory_of(H100_FM_STOPPED)
    assert len(inv.gpus) == 8
    for g in inv.gpus:
        assert not g.healthy
        assert any("Fabric Manager" in r and "not started" in r for r in g.health_reasons), g.health_reasons


def test_hgx_h100_with_fabric_manager_running_has_eight_healthy_nv18_gpus(inventory_of):
    inv = inventory_of(H100_NVSWITCH)
    assert [g.healthy for g in inv.gpus] == [True] * 8
    for g in inv.gpus:
        assert len(g.nvlinks) == 7 and {p.links for p in g.nvlinks} == {18}
        assert g.memory_bandwidth_gbps == pytest.approx(3352.3)


@pytest.mark.parametrize("state, words", [("in_progress", "in progress"), ("not_started", "not started")])
def test_a_gpu_still_registering_with_the_fabric_is_unhealthy(inventory_of, state, words):
    data = fixture_data(H100_NVSWITCH)
    data["gpus"][3] = {**data["gpus"][3], "fabric": {"state": state}}
    inv = inventory_of(data)
    assert not inv.gpus[3].healthy and words in inv.gpus[3].health_reasons[0]
    assert all(g.healthy for g in inv.gpus if g.index != 3)


def test_a_completed_registration_that_failed_is_unhealthy(inventory_of):
    data = fixture_data(H100_NVSWITCH)
    data["gpus"][0] = {**data["gpus"][0], "fabric": {"state": "completed", "status": "UNKNOWN"}}
    assert "registration failed" in inventory_of(data).gpus[0].health_reasons[0]


def test_a_pcie_gpu_without_a_fabric_stays_healthy(inventory_of):
    data = fixture_data(RTX4090)
    data["gpus"][0]["fabric"] = {"state": "not_supported"}
    assert inventory_of(data).gpus[0].healthy
    assert inventory_of(RTX4090).gpus[0].healthy  # NOT_SUPPORTED from the call itself


def test_the_fabric_is_read_through_the_v1_call_on_a_driver_without_the_versioned_one(inventory_of):
    data = fixture_data(H100_FM_STOPPED)
    data["absentFunctions"] = ["nvmlDeviceGetGpuFabricInfoV"]
    lib = fake_from(data)
    inv = probe_of(lib).probe()
    assert not any(g.healthy for g in inv.gpus)
    assert "nvmlDeviceGetGpuFabricInfo" in lib.calls


# ---- MIG without privileges ----------------------------------------------------------------------


def test_unprivileged_a100_in_mig_mode_publishes_its_3g_40gb_devices_with_the_drivers_memory_and_stays_healthy(inventory_of):
    gpu = inventory_of(A100_MIG_UNPRIVILEGED).gpus[0]
    assert gpu.healthy, gpu.health_reasons
    assert [(m.profile, m.memory_mib) for m in gpu.mig_devices] == [("3g.40gb", 40448), ("3g.40gb", 40448)]
    assert gpu.memory_mib == 80384  # parent memory refused: the 7g.80gb profile's, not the placeholder


def test_the_plain_and_media_extension_profiles_are_told_apart_by_their_engines():
    data = fixture_data(A100_MIG_UNPRIVILEGED)
    data["gpus"][0]["migDevices"] = [
        {"uuid": "MIG-a", "profileId": 20, "gpuInstanceId": 7},   # 1g.10gb+me
        {"uuid": "MIG-b", "profileId": 19, "gpuInstanceId": 9},   # 1g.10gb
    ]
    gpu = probe_of(fake_from(data)).probe().gpus[0]
    assert [m.profile for m in gpu.mig_devices] == ["1g.10gb+me", "1g.10gb"]


def test_a_mig_device_that_cannot_be_named_is_left_out_and_the_gpu_stays_healthy():
    data = fixture_data(A100_MIG_UNPRIVILEGED)
    data["gpus"][0]["migDevices"][1]["memoryMiB"] = 30000  # far from every 3-slice profile
    gpu = probe_of(fake_from(data)).probe().gpus[0]
    assert gpu.healthy and [m.uuid for m in gpu.mig_devices] == ["MIG-0929581a-2be6-5dec-bf34-0954c6c529a6"]


def test_mig_profile_matching_tolerates_driver_memory_figures_and_refuses_far_ones():
    class P:
        def __init__(self, name, slices, mib, dec=0):
            self.name, self.sliceCount, self.memorySizeMB = name.encode(), slices, mib
            self.decoderCount = self.jpegCount = self.ofaCount = dec

    class A:
        def __init__(self, slices, mib, dec=0):
            self.gpuInstanceSliceCount, self.memorySizeMB = slices, mib
            self.sharedDecoderCount = self.sharedJpegCount = self.sharedOfaCount = dec

    table = [P("MIG 1g.10gb", 1, 9856), P("MIG 1g.10gb+me", 1, 9856, 1), P("MIG 1g.20gb", 1, 19968),
             P("MIG 3g.40gb", 3, 40192), P("MIG 4g.40gb", 4, 40192)]
    assert match_mig_profile(table, A(3, 40448)).name == b"MIG 3g.40gb"
    assert match_mig_profile(table, A(1, 10112)).name == b"MIG 1g.10gb"
    assert match_mig_profile(table, A(1, 10112, 1)).name == b"MIG 1g.10gb+me"
    assert match_mig_profile(table, A(1, 20224)).name == b"MIG 1g.20gb"
    assert match_mig_profile(table, A(3, 30000)) is None
    assert match_mig_profile(table, A(2, 19968)) is None


# ---- old drivers ---------------------------------------------------------------------------------


def test_an_old_driver_without_fabric_info_core_count_or_versioned_calls_yields_a_correct_inventory():
    data = fixture_data(A100_NVSWITCH)
    data["absentFunctions"] = ["nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetNumGpuCores",
                               "nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlDeviceGetMemoryBusWidth",
                               "nvmlDeviceGetNumaNodeId", "nvmlSystemGetCudaDriverVersion_v2"]
    inv = probe_of(fake_from(data)).probe()
    assert len(inv.gpus) == 8 and all(g.healthy for g in inv.gpus)
    g = inv.gpus[0]
    assert (g.cuda_cores, g.multiprocessors, g.memory_bandwidth_gbps) == (None, None, None)  # unknown, not 0
    assert (g.name, g.memory_mib, len(g.nvlinks)) == ("NVIDIA A100-SXM4-80GB", 81920, 7)
    assert inv.cuda_driver_version == "12.0"  # the unversioned call answers


# ---- zero devices, XIDs --------------------------------------------------------------------------


def test_a_container_that_sees_no_gpu_is_a_probe_error_with_a_hint():
    with pytest.raises(ProbeError, match="runtimeClassName: nvidia"):
        probe_of(fake_from({"driverVersion": "570.86.15", "gpus": []})).probe()


def test_xid_109_is_an_application_error_as_in_the_device_plugin():
    data = fixture_data(RTX4090)
    data["gpus"][0]["xids"] = [109]
    assert 109 in APPLICATION_XIDS
    assert probe_of(fake_from(data)).probe().gpus[0].healthy


def test_an_xid_scoped_to_a_mig_device_marks_only_that_device():
    data = fixture_data(A100_MIG)
    data["gpus"][0]["migXids"] = [{"slot": 1, "xid": 94}]
    gpu = probe_of(fake_from(data)).probe().gpus[0]
    assert gpu.healthy
    assert [m.healthy for m in gpu.mig_devices] == [True, False]
    assert "XID 94" in gpu.mig_devices[1].health_reasons[0]


def test_operators_choose_which_xids_are_ignored():
    data = fixture_data(RTX4090)
    data["gpus"][0]["xids"] = [48]
    assert not probe_of(fake_from(data)).probe().gpus[0].healthy
    assert probe_of(fake_from(data), ignored_xids=parse_ignored_xids("48")).probe().gpus[0].healthy
    assert probe_of(fake_from(data), ignored_xids=parse_ignored_xids("all")).probe().gpus[0].healthy
    assert parse_ignored_xids("=13") == frozenset({13})
    assert parse_ignored_xids("") == APPLICATION_XIDS
    with pytest.raises(ValueError, match="comma-separated list of XID numbers"):
        parse_ignored_xids("79,fatal")


# ---- the boundary itself -------------------------------------------------------------------------


def test_a_symbol_the_stand_in_lacks_is_function_not_found_and_recorded():
    lib = fake_from(fixture_data(RTX4090))
    probe = probe_of(lib)
    probe.probe()
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetFanSpeed(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert lib.unimplemented == ["nvmlDeviceGetFanSpeed"]
    lib.unimplemented.clear()  # this test asked for it on purpose


def test_a_struct_declared_with_the_wrong_size_breaks_the_boundary():
    class WrongFabricInfo(ctypes.Structure):  # clusterUuid as the 80-byte UUID buffer old pynvml had
        _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_char * 80), ("status", ctypes.c_int),
                    ("cliqueId", ctypes.c_uint), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint)]

    lib = fake_from(fixture_data(H100_NVSWITCH))
    probe_of(lib).probe()
    info = WrongFabricInfo(version=struct_version(WrongFabricInfo, 2))
    with pytest.raises(pynvml.NVMLError):  # its version word does not name nvml.h's v2 struct
        pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert lib.violations == []  # refused by its version word before anything was written
    with pytest.raises(AssertionError):
        pynvml.nvmlDeviceGetGpuFabricInfo(pynvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert lib.violations and "nvmlGpuFabricInfo_t" in lib.violations[0]
    lib.violations.clear()  # provoked on purpose


def test_calls_before_init_are_uninitialized_as_in_nvml_h():
    pynvml.nvmlLib = fake_from(fixture_data(RTX4090))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_xids_are_forgotten_after_the_recovery_time_without_another():
    data = fixture_data(RTX4090)
    now = [1000.0]
    fake = fake_from(data)
    probe = probe_of(fake, xid_recovery_seconds=600, monotonic=lambda: now[0])
    probe.probe()
    fake.post_xid(data["gpus"][0]["uuid"], 48)
    assert not probe.probe().gpus[0].healthy
    now[0] += 300
    assert not probe.probe().gpus[0].healthy, "still within the recovery time"
    now[0] += 301
    assert probe.probe().gpus[0].healthy


def test_xids_are_forgotten_after_a_driver_reload():
    data = fixture_data(RTX4090)
    fake = fake_from(data)
    probe = probe_of(fake)
    probe.probe()
    fake.post_xid(data["gpus"][0]["uuid"], 79)
    assert not probe.probe().gpus[0].healthy
    fake.fixture.gpus[0].errors["nvmlDeviceGetEnforcedPowerLimit"] = "GPU_IS_LOST"  # answers as after a reload
    probe.probe()
    del fake.fixture.gpus[0].errors["nvmlDeviceGetEnforcedPowerLimit"]
    assert probe.probe().gpus[0].healthy, "a reloaded driver reset the GPU"
