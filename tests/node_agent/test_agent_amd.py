"""The agent over the stand-in for libamd_smi.so (gpuplace_testing.amdsmi_standin): the real amdsmi package,
amdsmi.h's structs and status codes, a scenario transcribed from published amd-smi outputs (issue 14,
item 4)."""

from __future__ import annotations

import copy
import ctypes
import logging
import sys

import pytest

from gpuplace_testing import amdsmi_standin
from node_agent import amd
from node_agent.amd import AMDSMIUnavailable, load_amdsmi
from node_agent.inventory import parse_inventory
from node_agent.probing import ProbeError
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.devices import NodeAllocation, NodeState, build_node_view
from scheduler_extender.core.engine import Engine
from tests.factories import pod
from tests.node_agent.agent_fixtures import MI300X, amd_fake_from, amd_probe_of, fixture_data

MIB = 1024 * 1024


def probe(data: dict, **kwargs):
    return amd_probe_of(amd_fake_from(data), **kwargs).probe()


def mi300x(**changes) -> dict:
    """The MI300X scenario with ``changes`` applied to GPU 3."""
    data = fixture_data(MI300X)
    data["gpus"][3] = {**data["gpus"][3], **changes}
    return data


# ---- the scenario ---------------------------------------------------------------------------------


def test_an_mi300x_node_publishes_eight_gpus_as_amd_smi_shows_them():
    inv = probe(fixture_data(MI300X))
    assert (inv.node_name, inv.driver_version, inv.cuda_driver_version, len(inv.gpus)) == ("mi300x-node-0", "6.7.0",
                                                                                         None, 8)
    g = inv.gpus[0]
    assert (g.index, g.uuid, g.vendor, g.name) == (0, "afff74a1-0000-1000-8054-e92b0a5d57c8", "amd", "AMD Instinct MI300X")
    assert (g.memory_mib, g.multiprocessors, g.architecture) == (196592, 304, "gfx942")  # amd-smi SIZE: 196592 MB
    assert (g.pci_bus_id, g.pci_device_id) == ("0000:05:00.0", "0x74A11002")
    assert (g.ecc_enabled, g.power_limit_w, g.memory_bandwidth_gbps) == (True, 750.0, 5300.0)
    assert (g.compute_partition, g.memory_partition) == ("SPX", "NPS1")
    assert all(gpu.healthy and not gpu.health_reasons for gpu in inv.gpus)
    assert [gpu.pci_bus_id for gpu in inv.gpus] == ["0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0",
                                                    "0000:85:00.0", "0000:a6:00.0", "0000:c6:00.0", "0000:e5:00.0"]


def test_xgmi_is_a_full_mesh_of_eight_one_link_to_each_other_gpu():
    inv = probe(fixture_data(MI300X))
    uuids = [g.uuid for g in inv.gpus]
    for g in inv.gpus:
        assert [p.peer_uuid for p in g.nvlinks] == [u for u in uuids if u != g.uuid]
        assert {p.links for p in g.nvlinks} == {1}


def test_amd_smi_is_open_only_during_a_probe():
    lib = amd_fake_from(fixture_data(MI300X))
    p = amd_probe_of(lib)
    p.probe()
    assert not lib.initialized
    assert lib.calls[0] == "amdsmi_init" and lib.calls[-1] == "amdsmi_shut_down"
    p.probe()
    assert lib.calls.count("amdsmi_init") == 2


# ---- acceptance: a ROCm pod placed on the node with no hand-written file ---------------------------


def test_an_mi300x_node_from_the_stand_in_places_a_rocm_pod_with_its_vram_and_xgmi():
    """Issue 14, item 4: "An AMD MI300X node (stand-in) publishes its GPUs with XGMI peers; a ROCm
    pod is placed on it with no hand-written file"."""
    published = amd_probe_of(amd_fake_from(fixture_data(MI300X)), node_name="mi300x-0").probe().to_json()
    inventory = parse_inventory(published)  # as the extender reads the Node annotation
    state = NodeState("mi300x-0", build_node_view(inventory, default_catalog()), NodeAllocation())
    engine = Engine()

    def run(annotations: dict[str, str], gpus: int):
        return engine.filter(engine.job(pod(annotations, gpus=gpus, resource="amd.com/gpu")), [state], None)[0]

    fits = run({"gpuplace.io/runtime": "rocm", "gpuplace.io/vram": "190Gi", "gpuplace.io/require": "ecc,nvlink"}, 8)
    assert fits.passed, fits.reason
    assert len(fits.chosen) == 8 and {u.memory_bytes for u in fits.chosen} == {196592 * MIB}
    assert {u.entry.id for u in fits.chosen if u.entry} == {"mi300x"}  # the catalog knows the driver's name
    too_big = run({"gpuplace.io/runtime": "rocm", "gpuplace.io/vram": "192Gi"}, 1)  # 196592 MiB < 192 GiB
    assert not too_big.passed and "VRAM" in too_big.reason
    medium = run({"gpuplace.io/vram": "40Gi"}, 1)  # class medium: an MI300X only as a last resort, and this node is the only one
    assert medium.passed, medium.reason


def test_the_market_name_older_amd_smi_gives_an_mi300x_is_the_catalogs_mi300x():
    data = fixture_data(MI300X)
    for g in data["gpus"]:
        g["marketName"] = "MI300X-O"  # ROCm 6.2's fallback for device 0x74a1 (AMD's amd-smi blog)
    view = build_node_view(parse_inventory(probe(data).to_json()), default_catalog())
    assert {u.entry.id for u in view.units("amd.com/gpu") if u.entry} == {"mi300x"}


def test_an_unhealthy_mi300x_gpu_is_not_placed_on():
    data = mi300x(eccCounts={"uncorrectable": 3})
    inventory = parse_inventory(probe(data).to_json())
    state = NodeState("mi300x-0", build_node_view(inventory, default_catalog()), NodeAllocation())
    engine = Engine()
    result = engine.filter(engine.job(pod({"gpuplace.io/runtime": "rocm"}, gpus=8, resource="amd.com/gpu")),
                           [state], None)[0]
    assert not result.passed and "uncorrectable ECC" in result.reason


# ---- unknowns, old libraries ----------------------------------------------------------------------


def test_what_amd_smi_does_not_report_stays_unknown_never_zero():
    data = mi300x(computeUnits=None, powerCapW=None, computePartition=None, memoryPartition=None,
                  vram={"type": "HBM3", "sizeMiB": 196592})  # no bit width, no max bandwidth
    data["gpus"][3].pop("oamId", None)
    g = probe(data).gpus[3]
    assert (g.multiprocessors, g.power_limit_w, g.memory_bandwidth_gbps) == (None, None, None)
    assert (g.compute_partition, g.memory_partition, g.numa_node, g.cuda_cores) == (None, None, None, None)
    assert g.healthy and g.memory_mib == 196592
    printed = parse_inventory(probe(data).to_json()).to_dict()["gpus"][3]
    for key in ("multiprocessors", "powerLimitW", "memoryBandwidthGBps", "computePartition", "numaNode"):
        assert key not in printed  # left out of the annotation, not 0


def test_a_failing_call_is_unknown_and_logged_once(caplog):
    data = mi300x(errors={"amdsmi_get_gpu_ecc_enabled": "DRM_ERROR", "amdsmi_get_power_cap_info": "API_FAILED"})
    p = amd_probe_of(amd_fake_from(data))
    with caplog.at_level(logging.WARNING, logger="node_agent.amd"):
        g = p.probe().gpus[3]
        p.probe()
    assert (g.ecc_enabled, g.power_limit_w) == (None, None)
    assert g.healthy
    warned = [r.getMessage() for r in caplog.records if "amdsmi_get_gpu_ecc_enabled" in r.getMessage()]
    assert len(warned) == 1 and "DRM_ERROR" in warned[0]


def test_an_older_library_without_some_functions_yields_a_correct_inventory(caplog):
    data = fixture_data(MI300X)
    data["absentFunctions"] = ["amdsmi_get_link_topology_nearest", "amdsmi_get_gpu_memory_total",
                               "amdsmi_get_gpu_compute_partition", "amdsmi_get_gpu_memory_partition",
                               "amdsmi_get_power_cap_info", "amdsmi_get_cpu_socket_power"]
    lib = amd_fake_from(data)
    with caplog.at_level(logging.WARNING, logger="node_agent.amd"):
        inv = amd_probe_of(lib).probe()
    g = inv.gpus[0]
    assert all(gpu.healthy for gpu in inv.gpus)
    assert (g.memory_mib, g.multiprocessors) == (196592, 304)  # from amdsmi_get_gpu_vram_info
    assert (g.power_limit_w, g.compute_partition, g.memory_partition) == (None, None, None)  # unknown, not 0
    assert all(len(gpu.nvlinks) == 7 for gpu in inv.gpus)  # every pair asked amdsmi_topo_get_link_type
    assert not set(data["absentFunctions"]) & set(lib.calls)  # answered FAIL_LOAD_SYMBOL without reaching it
    assert any("lacks 6 functions" in r.getMessage() for r in caplog.records)


def test_a_library_without_the_topology_calls_reports_no_xgmi_peers():
    data = fixture_data(MI300X)
    data["absentFunctions"] = ["amdsmi_get_link_topology_nearest", "amdsmi_topo_get_link_type"]
    inv = probe(data)
    assert all(g.healthy and g.nvlinks == [] for g in inv.gpus)


def test_a_peer_more_than_one_hop_away_is_not_a_direct_link():
    data = fixture_data(MI300X)
    for g in data["gpus"]:
        g["xgmiHops"] = 2
    assert all(g.nvlinks == [] for g in probe(data).gpus)


def test_a_gpu_without_xgmi_has_no_peers():
    data = fixture_data(MI300X)
    for g in data["gpus"]:
        g["xgmiPeers"] = []
    assert all(g.nvlinks == [] for g in probe(data).gpus)


# ---- ECC and health -------------------------------------------------------------------------------


@pytest.mark.parametrize("ecc, blocks, want", [
    ("enabled", ["UMC", "GFX"], True),
    ("enabled", ["GFX", "SDMA"], False),  # HBM's ECC is the memory controller's (UMC)
    ("disabled", [], False),
    ("unsupported", [], False),  # no RAS at all (NOT_SUPPORTED): ECC off, not unknown
])
def test_ecc_is_hbm_ecc_the_umc_block(ecc, blocks, want):
    g = probe(mi300x(ecc=ecc, eccBlocks=blocks)).gpus[3]
    assert g.ecc_enabled is want and g.healthy


@pytest.mark.parametrize("changes, words", [
    ({"eccCounts": {"correctable": 12, "uncorrectable": 2}}, "2 uncorrectable ECC errors since the driver loaded"),
    ({"rasStates": {"UMC": "MULT_UC"}}, "UMC block reports multiple uncorrectable errors"),
    ({"eccBlocks": ["UMC", "GFX"], "rasStates": {"GFX": "POISON"}}, "GFX block reports poisoned memory"),
    ({"badPages": [{"address": 0x5C70000, "status": "pending"}]}, "1 bad memory pages pending retirement: reset"),
    ({"badPages": [{"address": 0x5C70000, "status": "unreservable"}]}, "could not be retired"),
])
def test_a_gpu_with_uncorrectable_errors_is_unhealthy_with_the_reason(changes, words):
    inv = probe(mi300x(**changes))
    assert not inv.gpus[3].healthy
    assert any(words in r for r in inv.gpus[3].health_reasons), inv.gpus[3].health_reasons
    assert all(g.healthy for g in inv.gpus if g.index != 3)


@pytest.mark.parametrize("changes", [
    {"eccCounts": {"correctable": 40, "deferred": 1}},  # corrected and deferred errors alone
    {"badPages": [{"address": 0x5C70000, "status": "reserved"}]},  # already retired
    {"badPages": None},  # NOT_SUPPORTED
    {"ecc": "unsupported", "rasStates": {}},
])
def test_corrected_errors_and_retired_pages_leave_a_gpu_healthy(changes):
    assert probe(mi300x(**changes)).gpus[3].healthy


def test_a_gpu_whose_uuid_cannot_be_read_is_reported_unhealthy_and_the_node_keeps_its_count():
    inv = probe(mi300x(errors={"amdsmi_get_gpu_device_uuid": "API_FAILED"}))
    g = inv.gpus[3]
    assert (len(inv.gpus), g.uuid, g.healthy) == (8, "GPU-unreadable-index-3", False)
    assert "UUID could not be read" in g.health_reasons
    assert all(p.peer_uuid != "GPU-unreadable-index-3" for other in inv.gpus for p in other.nvlinks)


def test_a_gpu_whose_name_and_memory_cannot_be_read_gets_placeholders_and_reasons():
    g = probe(mi300x(errors={"amdsmi_get_gpu_asic_info": "API_FAILED", "amdsmi_get_gpu_memory_total": "API_FAILED",
                             "amdsmi_get_gpu_vram_info": "API_FAILED"})).gpus[3]
    assert (g.name, g.memory_mib, g.healthy) == ("unknown AMD GPU", 1, False)
    assert {"name could not be read", "memory size could not be read"} <= set(g.health_reasons)


# ---- no driver, no GPU ----------------------------------------------------------------------------


def test_amdgpu_not_loaded_is_amd_smi_unavailable_with_a_hint():
    data = fixture_data(MI300X)
    data["initError"] = "DRIVER_NOT_LOADED"
    with pytest.raises(AMDSMIUnavailable, match="amdgpu kernel driver is not loaded"):
        probe(data)


def test_a_container_that_sees_no_amd_gpu_is_a_probe_error_with_a_hint():
    with pytest.raises(ProbeError, match="/dev/kfd and /dev/dri"):
        probe({"driverVersion": "6.7.0", "gpus": []})


def test_without_the_amdsmi_package_the_reason_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(amd.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(AMDSMIUnavailable, match=r"pip install 'gpuplace\[amd\]'"):
        amd._bind(lambda location: None)


def test_without_libamd_smi_the_reason_says_what_to_install_and_nothing_is_printed(capsys):
    def no_library(location: str):
        raise OSError(f"{location}: cannot open shared object file: No such file or directory")

    with pytest.raises(AMDSMIUnavailable, match="libamd_smi.so was not found.*install amd-smi-lib"):
        amd._bind(no_library)
    assert capsys.readouterr().out == ""  # the package's prints do not reach --print's JSON


# ---- the boundary itself ---------------------------------------------------------------------------


def test_the_stand_ins_structs_have_the_sizes_of_the_packages():
    smi = load_amdsmi(amd_fake_from(fixture_data(MI300X)))
    w = smi.amdsmi_wrapper
    pairs = {
        amdsmi_standin._AsicInfo: w.amdsmi_asic_info_t, amdsmi_standin._VramInfo: w.amdsmi_vram_info_t,
        amdsmi_standin._DriverInfo: w.amdsmi_driver_info_t, amdsmi_standin._PowerCapInfo: w.amdsmi_power_cap_info_t,
        amdsmi_standin._ErrorCount: w.amdsmi_error_count_t, amdsmi_standin._TopologyNearest: w.amdsmi_topology_nearest_t,
        amdsmi_standin._RetiredPageRecord: w.amdsmi_retired_page_record_t, amdsmi_standin._Version: w.amdsmi_version_t,
    }
    for ours, theirs in pairs.items():
        assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), ours.__name__
    assert ctypes.sizeof(w.amdsmi_bdf_t) == 8
    assert (w.AMDSMI_LINK_TYPE_XGMI, w.AMDSMI_LINK_TYPE_PCIE) == (amdsmi_standin.LINK_TYPE["XGMI"],
                                                                 amdsmi_standin.LINK_TYPE["PCIE"])


def test_calls_before_init_are_not_init_as_in_amdsmi_h():
    smi = load_amdsmi(amd_fake_from(fixture_data(MI300X)))
    with pytest.raises(smi.AmdSmiLibraryException) as e:
        smi.amdsmi_get_processor_handles()
    assert e.value.get_error_code() == amdsmi_standin.STATUS_NOT_INIT


def test_a_symbol_the_stand_in_lacks_is_recorded_when_called():
    lib = amd_fake_from(fixture_data(MI300X))
    smi = load_amdsmi(lib)
    smi.amdsmi_init()
    with pytest.raises(smi.AmdSmiLibraryException):
        smi.amdsmi_get_temp_metric(smi.amdsmi_get_processor_handles()[0], smi.AmdSmiTemperatureType.HOTSPOT,
                                   smi.AmdSmiTemperatureMetric.CURRENT)
    assert lib.unimplemented == ["amdsmi_get_temp_metric"]
    lib.unimplemented.clear()  # asked for on purpose


def test_a_struct_declared_with_the_wrong_size_breaks_the_boundary():
    class ShortAsicInfo(ctypes.Structure):  # market_name as the 64-byte buffer of a wrong declaration
        _fields_ = [("market_name", ctypes.c_char * 64), ("vendor_id", ctypes.c_uint32)]

    lib = amd_fake_from(fixture_data(MI300X))
    smi = load_amdsmi(lib)
    smi.amdsmi_init()
    h = smi.amdsmi_get_processor_handles()[0]
    with pytest.raises(AssertionError):
        smi.amdsmi_wrapper.amdsmi_get_gpu_asic_info(h, ctypes.byref(ShortAsicInfo()))
    assert lib.violations and "amdsmi_asic_info_t" in lib.violations[0]
    lib.violations.clear()  # provoked on purpose


def test_each_stand_in_gets_its_own_copy_of_the_package():
    first, second = amd_fake_from(fixture_data(MI300X)), amd_fake_from(mi300x(computeUnits=228))
    assert amd_probe_of(first).probe().gpus[3].multiprocessors == 304
    assert amd_probe_of(second).probe().gpus[3].multiprocessors == 228
    assert not [m for m in sys.modules if m.startswith("_gpuplace_amdsmi_")]  # loaded, then unlisted


def test_the_fixture_schema_names_a_bad_field():
    from gpuplace_testing.fake_amdsmi import Fixture

    data = copy.deepcopy(fixture_data(MI300X))
    data["gpus"][0]["xgmiPeers"] = ["0000:ff:00.0"]
    with pytest.raises(ValueError, match="XGMI peer 0000:ff:00.0 is not one of the GPUs"):
        Fixture.model_validate(data)
