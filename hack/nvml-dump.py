#!/usr/bin/env python3
"""Record, as JSON, what the real NVML answers to every call the agent's NVML probe makes.

Run on a machine with NVIDIA GPUs (read-only: nothing here changes a setting of the GPU):

    python3 hack/nvml-dump.py > raw.json

For each GPU it calls, through pynvml, each NVML function ``node_agent/nvml.py`` calls (the same
arguments) plus a few neighbours that ``nvidia-smi -q`` shows beside them, and records the return
value or the NVML error's name. It is what an NVML scenario (``tests/fixtures/nvml/*.yaml``) is
written from when it is read off real hardware, not transcribed from published outputs: a value
the stand-in must give, or the error it must answer with. With ``--probe N`` it also runs the
agent's ``NVMLProbe`` N times and records its inventories, to show which fields change reading to
reading; with ``--standin SCENARIO`` it reads the NVML stand-in of a scenario instead of the
driver (gpuplace-testing), a dry run. Serial numbers are not read. It was run so on an H100
80GB HBM3 on 2026-11-27 (``tests/fixtures/nvml/h100-80gb-hbm3-real-2026-11-27.*``) and on an H200
SXM 141 GB on 2026-11-28 (``tests/fixtures/nvml/h200-141gb-hbm3e-real-2026-11-28.*``); each
``.nvml-calls.json`` there is its output reduced to the calls the agent makes.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from typing import Any, Callable

import pynvml as nvml


def _error_names() -> dict[int, str]:
    return {getattr(nvml, n): n.removeprefix("NVML_ERROR_") for n in dir(nvml)
            if n.startswith("NVML_ERROR_") and isinstance(getattr(nvml, n), int)}


ERRORS = _error_names()


def plain(value: Any) -> Any:
    """A JSON-able copy of what pynvml returned (ctypes structs and arrays included)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    if isinstance(value, ctypes.Structure):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        items = [plain(v) for v in value]
        return bytes(items).hex() if items and all(isinstance(v, int) for v in items) and value._type_ is ctypes.c_ubyte else items
    if isinstance(value, ctypes._Pointer):
        return "<handle>"  # nvmlDevice_t, nvmlEventSet_t: opaque
    if isinstance(value, ctypes._SimpleCData):
        return plain(value.value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def record(out: list[dict[str, Any]], fn: str, *args: Any, show: tuple[Any, ...] | None = None,
           call: Callable[..., Any] | None = None, keep: bool = False) -> Any:
    """Call ``fn(*args)`` and append ``{fn, args, value | error}``; returns the raw value (or None)."""
    entry: dict[str, Any] = {"fn": fn, "args": plain(list(show if show is not None else args))}
    func = call or getattr(nvml, fn, None)
    raw = None
    if func is None:
        entry["error"] = "PYNVML_HAS_NO_SUCH_FUNCTION"
    else:
        try:
            raw = func(*args)
            entry["value"] = plain(raw)
        except nvml.NVMLError as e:
            entry["error"] = ERRORS.get(e.value, f"code {e.value}")
        except Exception as e:  # a pynvml bug or a struct mismatch: record it, go on
            entry["error"] = f"{type(e).__name__}: {e}"
    out.append(entry)
    return raw if (keep or "value" in entry) else None


def fabric_struct(version: int) -> type[ctypes.Structure]:
    base = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
            ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte), ("healthMask", ctypes.c_uint)]
    if version == 3:
        base.append(("healthSummary", ctypes.c_ubyte))
    return type(f"FabricV{version}", (ctypes.Structure,), {"_fields_": base})


class FabricV1(ctypes.Structure):
    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]


def fabric(out: list[dict[str, Any]], h: Any) -> None:
    for version in (2, 3):
        struct = fabric_struct(version)
        info = struct(version=ctypes.sizeof(struct) | (version << 24))

        def call(handle: Any, info: Any = info) -> Any:
            nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            return info

        record(out, "nvmlDeviceGetGpuFabricInfoV", h, show=(f"v{version}",), call=call)
    v1 = FabricV1()

    def call_v1(handle: Any) -> Any:
        nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(v1))
        return v1

    record(out, "nvmlDeviceGetGpuFabricInfo", h, show=("v1",), call=call_v1)


def gpu(index: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    h = record(out, "nvmlDeviceGetHandleByIndex", index)
    if h is None:
        return {"index": index, "calls": out}
    for fn in ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo", "nvmlDeviceGetArchitecture",
               "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMigMode", "nvmlDeviceGetMemoryInfo",
               "nvmlDeviceGetNumGpuCores", "nvmlDeviceGetAttributes", "nvmlDeviceGetMemoryBusWidth",
               "nvmlDeviceGetEccMode", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit",
               "nvmlDeviceGetPowerManagementDefaultLimit", "nvmlDeviceGetPowerManagementLimitConstraints",
               "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
               "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetVbiosVersion",
               "nvmlDeviceGetBoardId", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetCurrPcieLinkGeneration",
               "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"):
        record(out, fn, h)
    record(out, "nvmlDeviceGetMemoryInfo", h, nvml.nvmlMemory_v2, show=("nvmlMemory_v2",))
    for clock in ("NVML_CLOCK_MEM", "NVML_CLOCK_GRAPHICS", "NVML_CLOCK_SM"):
        record(out, "nvmlDeviceGetMaxClockInfo", h, getattr(nvml, clock), show=(clock,))
    record(out, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM, show=("NVML_CLOCK_MEM",))
    for sensor in (0, 1):  # NVML_TEMPERATURE_GPU; 1 = NVML_TEMPERATURE_GPU_MAX from NVML 615 on
        record(out, "nvmlDeviceGetTemperature", h, sensor, show=(sensor,))
    for err_type, counter in (("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
                              ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
                              ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC")):
        record(out, "nvmlDeviceGetTotalEccErrors", h, getattr(nvml, err_type), getattr(nvml, counter),
               show=(err_type, counter))
    fabric(out, h)
    for profile in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        record(out, "nvmlDeviceGetGpuInstanceProfileInfo", h, profile, 2, show=(profile, "V (v2)"))
    record(out, "nvmlDeviceGetGpuInstanceProfileInfo", h, 0, 1, show=(0, "v1"))
    for slot in (0, 1):
        record(out, "nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        state = record(out, "nvmlDeviceGetNvLinkState", h, link)
        if link < 18 or state is not None:
            record(out, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            record(out, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
    return {"index": index, "calls": out}


def events(count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    es = record(out, "nvmlEventSetCreate")
    if es is None:
        return out
    for index in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        record(out, "nvmlDeviceRegisterEvents", h, nvml.nvmlEventTypeXidCriticalError, es,
               show=(index, "nvmlEventTypeXidCriticalError"))
    record(out, "nvmlEventSetWait", es, 0, show=("set", 0))
    record(out, "nvmlEventSetFree", es, show=("set",))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--probe", type=int, default=0, metavar="N", help="also run node_agent's NVMLProbe N times")
    p.add_argument("--standin", metavar="SCENARIO", help="dry run over the NVML stand-in of a scenario (gpuplace-testing)")
    args = p.parse_args()
    library = None
    if args.standin:
        from gpuplace_testing.fake_nvml import load_fixture

        library = nvml.nvmlLib = load_fixture(args.standin)
        nvml._nvmlGetFunctionPointer_cache.clear()
    from importlib.metadata import PackageNotFoundError, version

    try:
        pynvml_version: str | None = version("nvidia-ml-py")
    except PackageNotFoundError:
        pynvml_version = None
    dump: dict[str, Any] = {"nvidia-ml-py": pynvml_version, "python": sys.version.split()[0]}
    nvml.nvmlInit()
    try:
        system: list[dict[str, Any]] = []
        for fn in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion_v2",
                   "nvmlSystemGetCudaDriverVersion"):
            record(system, fn)
        count = record(system, "nvmlDeviceGetCount") or 0
        dump["system"] = system
        dump["gpus"] = [gpu(i) for i in range(int(count))]
        dump["events"] = events(int(count))
    finally:
        nvml.nvmlShutdown()
    if args.probe:
        from node_agent.nvml import NVMLProbe

        dump["probes"] = []
        for _ in range(args.probe):
            inv = NVMLProbe(node_name="h100-real", watch_xids=False, library=library).probe()
            dump["probes"].append(inv.to_dict())
            time.sleep(1)
    json.dump(dump, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
