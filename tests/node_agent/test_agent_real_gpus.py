"""The NVML stand-in and the agent against what real GPUs answered, one reading per GPU:

- an NVIDIA H100 80GB HBM3 (driver 580.159.04, 2026-11-27): ``tests/fixtures/nvml/h100-80gb-hbm3-real-2026-11-27.*``;
- an NVIDIA H200, the SXM module with 141 GB of HBM3e (driver 580.159.04, 2026-11-28):
  ``tests/fixtures/nvml/h200-141gb-hbm3e-real-2026-11-28.*``.

For each, the scenario ``....yaml`` was written from that reading, ``...nvml-calls.json`` holds each
NVML call the agent makes and what the driver answered (``hack/nvml-dump.py``), and ``...agent.json``
what ``gpuplace-agent --probe nvml --once --print`` printed on that machine."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from node_agent.probing import sysfs_numa_node
from scheduler_extender.core.catalog import default_catalog
from tests.node_agent.agent_fixtures import NVML_FIXTURES, fake_from, fixture_data, probe_of

DUMP_TOOL = Path(__file__).resolve().parents[2] / "hack" / "nvml-dump.py"


@dataclass(frozen=True)
class Reading:
    """One real GPU read on one day: its three files and what the test expects of them."""

    stem: str
    node_name: str
    catalog_id: str
    memory_mib: int
    bandwidth_gbps: float
    full_mig_profile: tuple[int, int, int, str]
    """nvmlDeviceGetGpuInstanceProfileInfo(NVML_GPU_INSTANCE_PROFILE_7_SLICE): id, memorySizeMB,
    multiprocessorCount, name, as the driver answered with MIG off."""
    changed_since: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """GPU fields the agent reports differently since the reading, for a fix made after it:
    key -> (what it printed there, None = absent; what it prints now)."""

    @property
    def scenario(self) -> Path:
        return NVML_FIXTURES / f"{self.stem}.yaml"

    @property
    def calls(self) -> Path:
        return NVML_FIXTURES / f"{self.stem}.nvml-calls.json"

    @property
    def agent(self) -> Path:
        return NVML_FIXTURES / f"{self.stem}.agent.json"


READINGS = [
    Reading("h100-80gb-hbm3-real-2026-11-27", "h100-real", "h100-sxm5-80gb", 81559, 3352.3,
            (0, 81152, 132, "MIG 7g.80gb"),
            # numaNode: the machine's sysfs gave -1 (no firmware affinity) on its one NUMA node and the
            # agent of 7c7cd5b then printed none, while nvidia-smi topo -m showed NUMA Affinity 0; the
            # agent reads such a sysfs as node 0 since
            # (test_a_gpu_without_firmware_numa_affinity_on_a_one_node_machine_is_on_that_node).
            changed_since={"numaNode": (None, 0)}),
    # The H200's reading came after that fix: the agent printed numaNode 0 there.
    Reading("h200-141gb-hbm3e-real-2026-11-28", "h200-real", "h200-sxm-141gb", 143771, 4814.3,
            (0, 143360, 132, "MIG 7g.141gb")),
]
IDS = ["h100", "h200"]


def _dump_tool() -> Any:
    """hack/nvml-dump.py as a module: the test reads the stand-in's answers as the tool read the driver's."""
    spec = importlib.util.spec_from_file_location("nvml_dump", DUMP_TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Parts of an answer the stand-in does not reproduce, and why; nothing the agent reads.
UNREPRODUCED_FIELDS = {
    "nvmlDeviceGetMemoryInfo": {"free", "used"},  # memory in use at the time (the driver's reserve counted as used)
    "nvmlDeviceGetPciInfo": {"pciSubSystemId"},  # the board's subsystem id (H100 0x16C110DE, H200 0x18BF10DE): no scenario field
}
KNOWN_DIFFERENCES = {
    # Profile 0x11 (NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX) is newer than driver 580, which does not know
    # the index: INVALID_ARGUMENT, on both GPUs. The stand-in answers every profile its scenario lacks
    # NOT_SUPPORTED; the agent skips both answers alike (NVMLProbe._gpu_instance_profiles).
    ("nvmlDeviceGetGpuInstanceProfileInfo", (0x11, 2)): ("INVALID_ARGUMENT", "NOT_SUPPORTED"),
}


def _const(arg: Any) -> Any:
    return getattr(pynvml, arg) if isinstance(arg, str) and arg.startswith(("NVML_", "nvml")) else arg


def _call(dump: Any, call: dict[str, Any], handles: list[Any], event_set: list[Any]) -> Any:
    """Make the recorded call again, through pynvml, with the arguments the agent passes."""
    fn, args = call["fn"], [_const(a) for a in call["args"]]
    func = getattr(pynvml, fn)
    if fn == "nvmlEventSetCreate":
        event_set.append(func())
        return event_set[-1]
    if fn in ("nvmlEventSetWait", "nvmlEventSetFree"):
        return func(event_set[-1], *args)
    if "gpu" not in call or fn == "nvmlDeviceGetHandleByIndex":
        return func(*args)
    handle = handles[call["gpu"]]
    if fn == "nvmlDeviceRegisterEvents":
        return func(handle, *args, event_set[-1])
    if fn in ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"):
        version = int(args[0].removeprefix("v"))
        struct = dump.FabricV1 if version == 1 else dump.fabric_struct(version)
        info = struct() if version == 1 else struct(version=ctypes.sizeof(struct) | (version << 24))
        func(handle, ctypes.byref(info))
        return info
    return func(handle, *args)


@pytest.mark.parametrize("reading", READINGS, ids=IDS)
def test_the_stand_in_answers_every_nvml_call_the_agent_makes_as_the_real_gpu_did(reading):
    dump = _dump_tool()
    recorded = json.loads(reading.calls.read_text())["calls"]
    lib = fake_from(fixture_data(reading.scenario))
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    event_set: list[Any] = []
    differences = []
    try:
        for call in recorded:
            try:
                answer: Any = {"value": dump.plain(_call(dump, call, handles, event_set))}
            except pynvml.NVMLError as e:
                answer = {"error": dump.ERRORS[e.value]}
            expected = {k: v for k, v in call.items() if k in ("value", "error")}
            if expected == {"value": "<handle>"}:
                assert "value" in answer, call  # an opaque handle: only that there is one
                continue
            ignored = UNREPRODUCED_FIELDS.get(call["fn"], set())
            if ignored and "value" in answer and "value" in expected:
                answer = {"value": {k: v for k, v in answer["value"].items() if k not in ignored}}
                expected = {"value": {k: v for k, v in expected["value"].items() if k not in ignored}}
            known = KNOWN_DIFFERENCES.get((call["fn"], tuple(call["args"])))
            if known is not None:
                assert (expected.get("error"), answer.get("error")) == known, call
                continue
            if answer != expected:
                differences.append(f"{call['fn']}{tuple(call['args'])}: real {expected}, stand-in {answer}")
    finally:
        pynvml.nvmlShutdown()
    assert differences == []
    assert len(recorded) > 100 and lib.calls.count("nvmlDeviceGetNvLinkState") == 36


@pytest.mark.parametrize("reading", READINGS, ids=IDS)
def test_the_agent_over_the_stand_in_reports_what_it_reported_on_the_real_gpu(reading):
    """Field by field. Left out: ``observedAt``, when the probe ran (the stored output has none; it was
    the only field that differed between the two runs on each machine, five seconds apart). The
    temperature is compared: one value in every read of each day (H100 39 C, H200 31 C: the agent
    twice, hack/nvml-dump.py, three probes, nvidia-smi), and each scenario holds its reading."""
    real = json.loads(reading.agent.read_text())
    ours = probe_of(fake_from(fixture_data(reading.scenario)), node_name=reading.node_name).probe().to_dict()
    assert "observedAt" not in real
    ours.pop("observedAt")
    real_gpus, our_gpus = real.pop("gpus"), ours.pop("gpus")
    for key in sorted(set(real) | set(ours)):
        assert ours.get(key) == real.get(key), key
    assert len(our_gpus) == len(real_gpus) == 1
    real_gpu, our_gpu = real_gpus[0], our_gpus[0]
    for key, (then, now) in reading.changed_since.items():
        assert (real_gpu.pop(key, None), our_gpu.pop(key, None)) == (then, now), key
    for key in sorted(set(real_gpu) | set(our_gpu)):
        assert our_gpu.get(key) == real_gpu.get(key), key
    assert real_gpu["healthy"] and real_gpu["nvlinks"] == []
    assert (real_gpu["memoryMiB"], real_gpu["memoryBandwidthGBps"]) == (reading.memory_mib, reading.bandwidth_gbps)


@pytest.mark.parametrize("reading", READINGS, ids=IDS)
def test_the_real_gpu_resolves_to_its_catalog_row_with_the_memory_it_reported(reading):
    """The extender finds a GPU's catalog row by the name the driver reports, exactly: the row must
    hold the MiB NVML reported (the H200's 143771 MiB are its datasheet's 141 GB, not 141 GiB), and
    a MIG instance never more memory than the real driver gives it."""
    gpu = json.loads(reading.agent.read_text())["gpus"][0]
    entry = default_catalog().resolve_driver_name(gpu["name"])
    assert entry is not None and entry.id == reading.catalog_id
    assert (entry.memory_mib, entry.compute_capability, entry.architecture) == (
        gpu["memoryMiB"], gpu["computeCapability"], gpu["architecture"])
    real_profiles = {p["name"].removeprefix("MIG "): p for p in fixture_data(reading.scenario)["migProfiles"]
                     if "+" not in p["name"]}
    assert {p.profile for p in entry.mig_profiles} == set(real_profiles)
    for p in entry.mig_profiles:
        real = real_profiles[p.profile]
        assert (p.compute_slices, p.max_instances) == (real["sliceCount"], real["instanceCount"]), p.profile
        assert p.memory_mib is not None and p.memory_mib <= real["memoryMiB"], p.profile


@pytest.mark.parametrize("online, numa", [("0\n", 0), ("0-1\n", None), ("0,2\n", None), (None, None)],
                         ids=["one-node", "two-nodes", "two-nodes-sparse", "unreadable"])
def test_a_gpu_without_firmware_numa_affinity_on_a_one_node_machine_is_on_that_node(tmp_path, online, numa):
    dev = tmp_path / "bus/pci/devices/0000:00:06.0"  # both real GPUs' address, numa_node as their sysfs gave it
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("-1\n")
    if online is not None:
        (tmp_path / "devices/system/node").mkdir(parents=True)
        (tmp_path / "devices/system/node/online").write_text(online)
    assert sysfs_numa_node("00000000:00:06.0", tmp_path) == numa
    data = fixture_data(READINGS[0].scenario)
    gpu = probe_of(fake_from(data), numa_lookup=lambda bus: sysfs_numa_node(bus, tmp_path)).probe().gpus[0]
    assert gpu.numa_node == numa  # NVML has none here (nvmlDeviceGetNumaNodeId NOT_SUPPORTED)


@pytest.mark.parametrize("reading", READINGS, ids=IDS)
def test_with_mig_off_the_stand_in_answers_mig_queries_as_the_real_gpu_did(reading):
    """NVIDIA documents the MIG device count as "zero if MIG is not supported or enabled"; both GPUs
    with MIG off answered 0, NOT_FOUND for a MIG device handle, and their profile table all the same."""
    pynvml.nvmlLib = fake_from(fixture_data(reading.scenario))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetMigMode(h) == [0, 0]
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
        assert (info.id, info.memorySizeMB, info.multiprocessorCount, info.name) == reading.full_mig_profile
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.parametrize("reading", READINGS, ids=IDS)
def test_the_dump_tool_reads_a_stand_in_as_it_read_the_driver(reading):
    out = subprocess.run([sys.executable, str(DUMP_TOOL), "--standin", str(reading.scenario), "--probe", "1"],
                         capture_output=True, text=True, check=True, timeout=60)
    dump = json.loads(out.stdout)
    calls = {c["fn"]: c for c in dump["gpus"][0]["calls"]}
    uuid = fixture_data(reading.scenario)["gpus"][0]["uuid"]
    assert calls["nvmlDeviceGetUUID"]["value"] == uuid
    assert calls["nvmlDeviceGetNvLinkState"]["error"] == "NOT_SUPPORTED"
    assert dump["probes"][0]["gpus"][0]["memoryMiB"] == reading.memory_mib
