"""A stand-in for ``libnvidia-ml.so.1`` at its C boundary, fed by a scenario (``fake_nvml.Fixture``).

The real ``pynvml`` wrappers run over it unchanged: ``NVMLSession(library=...)`` puts it where
pynvml keeps the loaded ``CDLL`` (``pynvml.nvmlLib``), and pynvml looks each C symbol up on it,
builds its ctypes out-parameters and checks the return code exactly as with the driver. So
what is tested is the agent *and* pynvml's declarations against nvml.h, not our reading of
pynvml.

What follows nvml.h here, and not pynvml:

- **Symbols.** An attribute per C entry point, with the C name (``nvmlDeviceGetCount_v2``,
  ``nvmlDeviceGetHandleByIndex_v2``, ...). A symbol the scenario's driver lacks
  (``Fixture.absentFunctions``, an old driver) is missing, so pynvml raises
  ``NVML_ERROR_FUNCTION_NOT_FOUND`` as it does over a real old library. A symbol this stand-in
  does not implement is missing too, but is recorded in ``unimplemented``: the tests fail on it,
  so the agent cannot start calling something no scenario describes.
- **Out-parameters and structs.** Values are written through the caller's pointers as bytes,
  laid out by this module's own ctypes copies of the nvml.h structs (``_PciInfo``,
  ``_DeviceAttributes``, ``_GpuFabricInfoV2``...), never by pynvml's field names. A caller
  whose buffer is not the size nvml.h gives (a wrongly declared struct, a too-small string
  buffer) is recorded in ``violations`` and answered as the C library would answer
  (``NVML_ERROR_INSUFFICIENT_SIZE`` for strings; for a struct, the test fails).
  Versioned structs must carry ``NVML_STRUCT_VERSION(name, v)`` = ``sizeof | v << 24`` in their
  ``version`` field, else ``NVML_ERROR_ARGUMENT_VERSION_MISMATCH``.
- **Return codes** are nvml.h's; every call before ``nvmlInitWithFlags`` or after the last
  ``nvmlShutdown`` is ``NVML_ERROR_UNINITIALIZED``; handles are opaque pointers.
- **Behaviour the documentation states**: ``nvmlDeviceGetAttributes_v2`` answers for MIG device
  handles only; a GPU without NVLink answers NOT_SUPPORTED on link 0 and INVALID_ARGUMENT past its
  last link; an empty MIG slot is NOT_FOUND, and with MIG off every slot is NOT_FOUND and
  ``nvmlDeviceGetMaxMigDeviceCount`` 0 (as an H100 answered on driver 580.159.04);
  ``nvmlEventSetWait_v2`` with nothing queued is NVML_ERROR_TIMEOUT; in an unprivileged container
  with MIG on (``Fixture.privileged: false``) ``nvmlDeviceGetGpuInstanceById`` and the parent
  GPU's ``nvmlDeviceGetMemoryInfo`` are NVML_ERROR_NO_PERMISSION (NVIDIA/k8s-device-plugin and
  gpu-monitoring-tools reports; the MIG user guide: "GPU instance management requires
  privileges"); ``nvmlDeviceGetTemperature`` knows one sensor, ``NVML_TEMPERATURE_GPU`` (0), and
  answers NVML_ERROR_INVALID_ARGUMENT for any other ``sensorType`` (NVML 570's
  ``nvmlTemperatureSensors_t``; ``NVML_TEMPERATURE_GPU_MAX`` = 1 came with NVML 615, NVML API
  change log) and NOT_SUPPORTED where the scenario gives no temperature.

Struct layouts are from nvml.h (CUDA 12.8 / NVML 570, as vendored by NVIDIA/go-nvml
``pkg/nvml/nvml.h``); the sizes are checked against the ``NVML_STRUCT_VERSION`` constants
nvml.h defines (``nvmlGpuFabricInfo_v2 = 0x02000024``, ``nvmlGpuInstanceProfileInfo_v2 =
0x02000098``, ``nvmlMemory_v2 = 0x02000028``).
"""

from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuplace_testing.c_boundary import Boundary, BoundaryViolation, Symbol as _Symbol, address_of as _address
from gpuplace_testing.c_boundary import target_of as _target, value_of as _value

# ---- nvml.h return codes ------------------------------------------------------------------------

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

ERROR_CODES = {
    "UNINITIALIZED": ERROR_UNINITIALIZED, "INVALID_ARGUMENT": ERROR_INVALID_ARGUMENT,
    "NOT_SUPPORTED": ERROR_NOT_SUPPORTED, "NO_PERMISSION": ERROR_NO_PERMISSION,
    "NOT_FOUND": ERROR_NOT_FOUND, "DRIVER_NOT_LOADED": ERROR_DRIVER_NOT_LOADED,
    "TIMEOUT": ERROR_TIMEOUT, "LIBRARY_NOT_FOUND": ERROR_LIBRARY_NOT_FOUND,
    "FUNCTION_NOT_FOUND": ERROR_FUNCTION_NOT_FOUND, "GPU_IS_LOST": ERROR_GPU_IS_LOST,
    "LIB_RM_VERSION_MISMATCH": ERROR_LIB_RM_VERSION_MISMATCH, "UNKNOWN": ERROR_UNKNOWN,
}
_ERROR_STRINGS = {
    ERROR_UNINITIALIZED: b"Uninitialized", ERROR_INVALID_ARGUMENT: b"Invalid Argument",
    ERROR_NOT_SUPPORTED: b"Not Supported", ERROR_NO_PERMISSION: b"Insufficient Permissions",
    ERROR_NOT_FOUND: b"Not Found", ERROR_INSUFFICIENT_SIZE: b"Insufficient Size",
    ERROR_DRIVER_NOT_LOADED: b"Driver Not Loaded", ERROR_TIMEOUT: b"Timeout",
    ERROR_LIBRARY_NOT_FOUND: b"NVML Shared Library Not Found",
    ERROR_FUNCTION_NOT_FOUND: b"Function Not Found", ERROR_GPU_IS_LOST: b"GPU is lost",
    ERROR_LIB_RM_VERSION_MISMATCH: b"RM has detected an NVML/RM version mismatch.",
    ERROR_ARGUMENT_VERSION_MISMATCH: b"Argument version mismatch", ERROR_UNKNOWN: b"Unknown Error",
}

FEATURE_DISABLED, FEATURE_ENABLED = 0, 1
CLOCK_MEM = 2
MEMORY_ERROR_TYPE_UNCORRECTED = 1
VOLATILE_ECC = 0
NVLINK_DEVICE_TYPE_GPU, NVLINK_DEVICE_TYPE_SWITCH, NVLINK_DEVICE_TYPE_UNKNOWN = 0x00, 0x02, 0xFF
TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU; NVML 570's only sensor (NVML_TEMPERATURE_COUNT = 1)
EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
GPU_FABRIC_STATE = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
ARCHITECTURES = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8,
                 "hopper": 9, "blackwell": 10, "rubin": 13}
NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t gpuInstanceId/computeInstanceId of an event not scoped to MIG

# ---- nvml.h structs (own copies: the point is to catch a caller whose layout differs) -----------

DEVICE_NAME_V2_BUFFER_SIZE = 96
GPU_FABRIC_UUID_LEN = 16


class _PciInfo(ctypes.Structure):  # nvmlPciInfo_t (v3)
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _MemoryV2(ctypes.Structure):  # nvmlMemory_v2_t
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _DeviceAttributes(ctypes.Structure):  # nvmlDeviceAttributes_t
    _fields_ = [(n, ctypes.c_uint) for n in (
        "multiprocessorCount", "sharedCopyEngineCount", "sharedDecoderCount", "sharedEncoderCount",
        "sharedJpegCount", "sharedOfaCount", "gpuInstanceSliceCount", "computeInstanceSliceCount")
    ] + [("memorySizeMB", ctypes.c_ulonglong)]


_PROFILE_COUNTS = ("id", "isP2pSupported", "sliceCount", "instanceCount", "multiprocessorCount",
                   "copyEngineCount", "decoderCount", "encoderCount", "jpegCount", "ofaCount")


class _GpuInstanceProfileInfo(ctypes.Structure):  # nvmlGpuInstanceProfileInfo_t (v1)
    _fields_ = [(n, ctypes.c_uint) for n in _PROFILE_COUNTS] + [("memorySizeMB", ctypes.c_ulonglong)]


class _GpuInstanceProfileInfoV2(ctypes.Structure):  # nvmlGpuInstanceProfileInfo_v2_t
    _fields_ = ([("version", ctypes.c_uint)] + [(n, ctypes.c_uint) for n in _PROFILE_COUNTS]
                + [("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * DEVICE_NAME_V2_BUFFER_SIZE)])


class _GpuInstancePlacement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class _GpuInstanceInfo(ctypes.Structure):  # nvmlGpuInstanceInfo_t
    _fields_ = [("device", ctypes.c_void_p), ("id", ctypes.c_uint), ("profileId", ctypes.c_uint),
                ("placement", _GpuInstancePlacement)]


class _EventData(ctypes.Structure):  # nvmlEventData_t
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _GpuFabricInfo(ctypes.Structure):  # nvmlGpuFabricInfo_t (v1, nvmlDeviceGetGpuFabricInfo)
    _fields_ = [("clusterUuid", ctypes.c_ubyte * GPU_FABRIC_UUID_LEN), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte)]


class _GpuFabricInfoV2(ctypes.Structure):  # nvmlGpuFabricInfo_v2_t (nvmlGpuFabricInfoV_t)
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * GPU_FABRIC_UUID_LEN),
                ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte),
                ("healthMask", ctypes.c_uint)]


class _GpuFabricInfoV3(ctypes.Structure):  # nvmlGpuFabricInfo_v3_t
    _fields_ = _GpuFabricInfoV2._fields_ + [("healthSummary", ctypes.c_ubyte)]


def struct_version(struct: type[ctypes.Structure], version: int) -> int:
    """nvml.h ``NVML_STRUCT_VERSION(name, ver)``: ``sizeof(struct) | ver << 24``."""
    return ctypes.sizeof(struct) | (version << 24)


# ---- the boundary -------------------------------------------------------------------------------


@dataclass
class _Event:
    device: int
    xid: int
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE


@dataclass
class _EventSet:
    queue: deque[_Event] = field(default_factory=deque)
    registered: set[int] = field(default_factory=set)


class StandinLibrary(Boundary):
    """``libnvidia-ml.so.1`` for one scenario. Attribute access is symbol lookup (``dlsym``).

    ``calls``: every symbol called, in order. ``unimplemented``: symbols looked up that neither
    this stand-in nor the scenario's driver has (tests fail on any). ``violations``: calls that
    broke nvml.h's contract (tests fail on any).
    """

    HEADER = "nvml.h"
    INSUFFICIENT_SIZE = ERROR_INSUFFICIENT_SIZE

    def __init__(self, fixture: Any, *, source: str = "scenario") -> None:
        super().__init__(fixture, source=source)
        self._gpu_addr = [0x10_0000 + 0x1000 * i for i in range(len(fixture.gpus))]
        self._mig_addr: dict[int, tuple[int, int]] = {}  # address -> (gpu index, slot)
        self._gi_addr: dict[int, tuple[int, int]] = {}  # address -> (gpu index, slot)
        self._sets: dict[int, _EventSet] = {}
        self._by_uuid = {g.uuid: i for i, g in enumerate(fixture.gpus)}
        self._by_bus = {g.pciBusId.upper(): i for i, g in enumerate(fixture.gpus)}
        self._profiles = {p.id: p for p in fixture.migProfiles}
        for i, gpu in enumerate(fixture.gpus):
            for slot in range(len(gpu.migDevices)):
                self._mig_addr[0x20_0000 + 0x1000 * i + 0x10 * slot] = (i, slot)
                self._gi_addr[0x30_0000 + 0x1000 * i + 0x10 * slot] = (i, slot)

    # -- dlsym --

    def __getattr__(self, name: str) -> _Symbol:
        if name.startswith("_"):
            raise AttributeError(name)
        impl = getattr(type(self), "c_" + name, None)
        if name in self.fixture.absentFunctions:
            raise AttributeError(name)  # this driver is too old to have it
        if impl is None:
            self.unimplemented.append(name)
            raise AttributeError(name)

        def entry(*args: Any) -> Any:
            self.calls.append(name)
            if name not in ("nvmlInitWithFlags", "nvmlErrorString") and not self._init_count:
                return ERROR_UNINITIALIZED
            return impl(self, *args)

        return _Symbol(name, entry)

    # -- helpers for tests and the CLI --

    def numa_affinity(self, bus_id: str) -> int | None:
        """What sysfs ``numa_node`` says for this PCI address (``NVMLProbe(numa_lookup=...)``)."""
        from node_agent.probing import format_bus_id, parse_bus_id

        parsed = parse_bus_id(bus_id)
        i = self._by_bus.get(format_bus_id(*parsed)) if parsed else None
        return self.fixture.gpus[i].numaAffinity if i is not None else None

    def post_xid(self, uuid: str, xid: int, gpu_instance_id: int = NO_INSTANCE, compute_instance_id: int = NO_INSTANCE) -> None:
        """Queue an XID event on every event set the GPU is registered with, as the driver does."""
        addr = self._gpu_addr[self._by_uuid[uuid]]
        for event_set in self._sets.values():
            if addr in event_set.registered:
                event_set.queue.append(_Event(addr, xid, gpu_instance_id, compute_instance_id))

    def _versioned(self, arg: Any, struct: type[ctypes.Structure], version: int, what: str) -> int:
        target = _target(arg)
        if ctypes.sizeof(target) < 4:
            self._violate(f"{what}: buffer too small for a version field")
        given = ctypes.c_uint.from_address(ctypes.addressof(target)).value
        if given != struct_version(struct, version):
            return ERROR_ARGUMENT_VERSION_MISMATCH
        if ctypes.sizeof(target) != ctypes.sizeof(struct):
            self._violate(f"{what}: caller's struct is {ctypes.sizeof(target)} bytes, nvml.h's is {ctypes.sizeof(struct)}")
        return SUCCESS

    def _gpu(self, handle: Any, name: str | None = None) -> tuple[int | None, int]:
        """(GPU index, return code) of a full-GPU handle; MIG handles are INVALID_ARGUMENT here.
        With ``name``, the scenario's scripted answer for that symbol on that GPU comes first."""
        i, slot, rc = self._device(handle, name)
        if not rc and slot is not None:
            return None, ERROR_INVALID_ARGUMENT
        return i, rc

    def _device(self, handle: Any, name: str | None = None) -> tuple[int | None, int | None, int]:
        """(GPU index, MIG slot or None, return code) of a GPU or MIG device handle; ``name`` as in ``_gpu``."""
        addr = _address(handle)
        if addr in self._gpu_addr:
            i, slot = self._gpu_addr.index(addr), None
        elif addr in self._mig_addr:
            i, slot = self._mig_addr[addr]
        else:
            return None, None, ERROR_INVALID_ARGUMENT
        scripted = self._scripted(name, i) if name else None
        return (None, None, scripted) if scripted is not None else (i, slot, SUCCESS)

    def _scripted(self, name: str, i: int | None) -> int | None:
        """The scenario's answer for this symbol on this GPU, if it scripts one."""
        if i is None:
            return None
        gpu = self.fixture.gpus[i]
        base = name.removesuffix("_v2").removesuffix("_v3").removesuffix("V")
        for key in (name, base):
            if key in gpu.errors:
                return ERROR_CODES[gpu.errors[key]]
            if key in gpu.unsupported:
                return ERROR_NOT_SUPPORTED
        return None

    def _mig_profile(self, i: int, slot: int) -> Any:
        return self._profiles.get(self.fixture.gpus[i].migDevices[slot].profileId)

    # ---- entry points (nvml.h signatures; the method name is "c_" + the symbol) ------------------

    def c_nvmlInitWithFlags(self, flags: Any) -> int:
        return self._count_init(ERROR_CODES[self.fixture.initError] if self.fixture.initError else None)

    def c_nvmlShutdown(self) -> int:
        with self._lock:
            self._init_count -= 1
            if self._init_count == 0:
                self._sets.clear()  # nvml.h: the last shutdown frees what the library allocated
        return SUCCESS

    def c_nvmlErrorString(self, code: Any) -> bytes:
        return _ERROR_STRINGS.get(_value(code), b"Unknown Error")

    def c_nvmlSystemGetDriverVersion(self, buf: Any, length: Any) -> int:
        if self.fixture.driverVersion is None:
            return ERROR_UNKNOWN
        return self._store_string(buf, length, self.fixture.driverVersion)

    def c_nvmlSystemGetCudaDriverVersion_v2(self, out: Any) -> int:
        if self.fixture.cudaDriverVersion is None:
            return ERROR_UNKNOWN
        self._store(out, ctypes.c_int, self.fixture.cudaDriverVersion, "cudaDriverVersion")
        return SUCCESS

    c_nvmlSystemGetCudaDriverVersion = c_nvmlSystemGetCudaDriverVersion_v2

    def c_nvmlDeviceGetCount_v2(self, out: Any) -> int:
        self._store(out, ctypes.c_uint, len(self.fixture.gpus), "deviceCount")
        return SUCCESS

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        i = _value(index)
        if not 0 <= i < len(self.fixture.gpus):
            return ERROR_INVALID_ARGUMENT
        if self.fixture.gpus[i].handleError:
            return ERROR_CODES[self.fixture.gpus[i].handleError]
        self._store(out, ctypes.c_void_p, self._gpu_addr[i], "nvmlDevice_t")
        return SUCCESS

    def c_nvmlDeviceGetUUID(self, handle: Any, buf: Any, length: Any) -> int:
        i, slot, rc = self._device(handle, "nvmlDeviceGetUUID")
        if rc or i is None:
            return rc
        gpu = self.fixture.gpus[i]
        return self._store_string(buf, length, gpu.uuid if slot is None else gpu.migDevices[slot].uuid)

    def c_nvmlDeviceGetName(self, handle: Any, buf: Any, length: Any) -> int:
        i, slot, rc = self._device(handle, "nvmlDeviceGetName")
        if rc or i is None:
            return rc
        gpu = self.fixture.gpus[i]
        name = gpu.name if slot is None else f"{gpu.name} MIG {self._mig_profile(i, slot).name.removeprefix('MIG ')}"
        return self._store_string(buf, length, name)

    def _pci(self, bus_id: str, device_id: int) -> _PciInfo:
        from node_agent.probing import format_bus_id, parse_bus_id

        domain, bus, dev, fn = parse_bus_id(bus_id) or (0, 0, 0, 0)
        return _PciInfo(busIdLegacy=f"{domain:04X}:{bus:02X}:{dev:02X}.{fn:X}".encode(),
                        domain=domain, bus=bus, device=dev, pciDeviceId=device_id, pciSubSystemId=0,
                        busId=format_bus_id(domain, bus, dev, fn).encode())

    def c_nvmlDeviceGetPciInfo_v3(self, handle: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "nvmlDeviceGetPciInfo")
        if rc or i is None:
            return rc
        gpu = self.fixture.gpus[i]
        self._store(out, _PciInfo, self._pci(gpu.pciBusId, gpu.pciDeviceId), "nvmlPciInfo_t")
        return SUCCESS

    def _uint_getter(name: str, read: Callable[[Any], int | None], ctype: Any = ctypes.c_uint) -> Callable[..., int]:  # type: ignore[misc]
        """An entry point ``nvmlReturn_t name(nvmlDevice_t, T *out)`` answering ``read(gpu)``;
        None from ``read`` is NOT_SUPPORTED."""

        def entry(self: "StandinLibrary", handle: Any, out: Any) -> int:
            i, rc = self._gpu(handle, name)
            if rc or i is None:
                return rc
            value = read(self.fixture.gpus[i])
            if value is None:
                return ERROR_NOT_SUPPORTED
            self._store(out, ctype, value, name)
            return SUCCESS

        return entry

    c_nvmlDeviceGetArchitecture = _uint_getter("nvmlDeviceGetArchitecture", lambda g: ARCHITECTURES[g.architecture])
    c_nvmlDeviceGetNumGpuCores = _uint_getter("nvmlDeviceGetNumGpuCores", lambda g: g.cudaCores)
    c_nvmlDeviceGetMemoryBusWidth = _uint_getter("nvmlDeviceGetMemoryBusWidth", lambda g: g.memoryBusWidthBits)
    c_nvmlDeviceGetEnforcedPowerLimit = _uint_getter(
        "nvmlDeviceGetEnforcedPowerLimit",
        lambda g: None if g.enforcedPowerLimitW is None else int(round(g.enforcedPowerLimitW * 1000)))
    c_nvmlDeviceGetPowerManagementLimit = _uint_getter(
        "nvmlDeviceGetPowerManagementLimit",
        lambda g: None if g.enforcedPowerLimitW is None else int(round(g.enforcedPowerLimitW * 1000)))
    c_nvmlDeviceGetNumaNodeId = _uint_getter("nvmlDeviceGetNumaNodeId", lambda g: g.gpuNumaId)
    c_nvmlDeviceGetRetiredPagesPendingStatus = _uint_getter(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        lambda g: None if g.retiredPagesPending is None else int(g.retiredPagesPending))
    # NVIDIA documents the count as "zero if MIG is not supported or enabled"; an H100 with MIG off
    # answered 0 (h100-80gb-hbm3-real-2026-11-27.yaml). A GPU without MIG: NOT_SUPPORTED, as
    # before (no hardware reading of one).
    c_nvmlDeviceGetMaxMigDeviceCount = _uint_getter(
        "nvmlDeviceGetMaxMigDeviceCount",
        lambda g: None if g.migMode == "unsupported" else g.maxMigDevices if g.migMode == "enabled" else 0)
    del _uint_getter

    def c_nvmlDeviceGetTemperature(self, handle: Any, sensor_type: Any, temp: Any) -> int:
        """``nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t
        sensorType, unsigned int *temp)``: degrees C of the scenario's ``gpuCurrentTempC``."""
        i, rc = self._gpu(handle, "nvmlDeviceGetTemperature")
        if rc or i is None:
            return rc
        if _value(sensor_type) != TEMPERATURE_GPU:
            return ERROR_INVALID_ARGUMENT  # nvml.h: "sensorType is invalid"
        value = self.fixture.gpus[i].gpuCurrentTempC
        if value is None:
            return ERROR_NOT_SUPPORTED
        self._store(temp, ctypes.c_uint, value, "temp")
        return SUCCESS

    def c_nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        i, rc = self._gpu(handle)
        if rc or i is None:
            return rc
        a, b = self.fixture.gpus[i].computeCapability.split(".")
        self._store(major, ctypes.c_int, int(a), "major")
        self._store(minor, ctypes.c_int, int(b), "minor")
        return SUCCESS

    def _memory_mib(self, handle: Any, name: str) -> tuple[int | None, int]:
        i, slot, rc = self._device(handle, name)
        if rc or i is None:
            return None, rc
        gpu = self.fixture.gpus[i]
        if slot is not None:
            dev = gpu.migDevices[slot]
            return (dev.memoryMiB or self._mig_profile(i, slot).memoryMiB), SUCCESS
        if gpu.migMode == "enabled" and not self.fixture.privileged:
            return None, ERROR_NO_PERMISSION
        return gpu.memoryTotalMiB, SUCCESS

    def c_nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> int:
        mib, rc = self._memory_mib(handle, "nvmlDeviceGetMemoryInfo")
        if rc or mib is None:
            return rc
        total = mib * 1024 * 1024
        self._store(out, _Memory, _Memory(total=total, free=total, used=0), "nvmlMemory_t")
        return SUCCESS

    def c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, out: Any) -> int:
        rc = self._versioned(out, _MemoryV2, 2, "nvmlMemory_v2_t")
        if rc:
            return rc
        mib, rc = self._memory_mib(handle, "nvmlDeviceGetMemoryInfo")
        if rc or mib is None:
            return rc
        total = mib * 1024 * 1024
        self._store(out, _MemoryV2, _MemoryV2(version=struct_version(_MemoryV2, 2), total=total, reserved=0,
                                              free=total, used=0), "nvmlMemory_v2_t")
        return SUCCESS

    def c_nvmlDeviceGetAttributes_v2(self, handle: Any, out: Any) -> int:
        i, slot, rc = self._device(handle, "nvmlDeviceGetAttributes")
        if rc or i is None:
            return rc
        if slot is None:
            return ERROR_NOT_SUPPORTED  # nvml.h: "currently only supports MIG device handles"
        dev = self.fixture.gpus[i].migDevices[slot]
        p = self._mig_profile(i, slot)
        ci = dev.computeSlices or p.sliceCount
        sms = p.multiprocessors * ci // p.sliceCount
        attrs = _DeviceAttributes(multiprocessorCount=sms, sharedCopyEngineCount=p.copyEngines,
                                  sharedDecoderCount=p.decoders, sharedEncoderCount=0, sharedJpegCount=p.jpegs,
                                  sharedOfaCount=p.ofas, gpuInstanceSliceCount=p.sliceCount,
                                  computeInstanceSliceCount=ci, memorySizeMB=dev.memoryMiB or p.memoryMiB)
        self._store(out, _DeviceAttributes, attrs, "nvmlDeviceAttributes_t")
        return SUCCESS

    def c_nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: Any, out: Any) -> int:
        i, rc = self._gpu(handle)
        if rc or i is None:
            return rc
        gpu = self.fixture.gpus[i]
        if _value(clock_type) != CLOCK_MEM or gpu.maxMemoryClockMHz is None:
            return ERROR_NOT_SUPPORTED
        self._store(out, ctypes.c_uint, gpu.maxMemoryClockMHz, "clockMHz")
        return SUCCESS

    def _mode_pair(self, handle: Any, name: str, mode: str) -> tuple[int | None, int]:
        i, rc = self._gpu(handle, name)
        if rc or i is None:
            return None, rc
        value = getattr(self.fixture.gpus[i], mode)
        if value == "unsupported":
            return None, ERROR_NOT_SUPPORTED
        return (FEATURE_ENABLED if value == "enabled" else FEATURE_DISABLED), SUCCESS

    def _modes(self, handle: Any, current: Any, pending: Any, name: str, mode: str) -> int:
        """``nvmlReturn_t name(nvmlDevice_t, unsigned int *current, unsigned int *pending)``; the
        scenario has no pending change, so both are the current mode."""
        value, rc = self._mode_pair(handle, name, mode)
        if rc or value is None:
            return rc
        self._store(current, ctypes.c_uint, value, "current")
        self._store(pending, ctypes.c_uint, value, "pending")
        return SUCCESS

    def c_nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> int:
        return self._modes(handle, current, pending, "nvmlDeviceGetEccMode", "ecc")

    def c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        return self._modes(handle, current, pending, "nvmlDeviceGetMigMode", "migMode")

    def c_nvmlDeviceGetRemappedRows(self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any) -> int:
        i, rc = self._gpu(handle)
        if rc or i is None:
            return rc
        rows = self.fixture.gpus[i].remappedRows
        if rows is None or self._scripted("nvmlDeviceGetRemappedRows", i) == ERROR_NOT_SUPPORTED:
            return ERROR_NOT_SUPPORTED
        for arg, value, what in ((corr, rows.correctable, "corrRows"), (unc, rows.uncorrectable, "uncRows"),
                                 (pending, int(rows.pending), "isPending"), (failure, int(rows.failure), "failureOccurred")):
            self._store(arg, ctypes.c_uint, value, what)
        return SUCCESS

    def c_nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: Any, counter_type: Any, out: Any) -> int:
        i, rc = self._gpu(handle)
        if rc or i is None:
            return rc
        gpu = self.fixture.gpus[i]
        if gpu.ecc != "enabled" or gpu.volatileUncorrectedEcc is None:
            return ERROR_NOT_SUPPORTED
        wanted = (_value(error_type), _value(counter_type)) == (MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC)
        self._store(out, ctypes.c_ulonglong, gpu.volatileUncorrectedEcc if wanted else 0, "eccCounts")
        return SUCCESS

    # -- MIG --

    def _profile_info(self, handle: Any, profile: Any) -> tuple[Any, int]:
        i, rc = self._gpu(handle)
        if rc or i is None:
            return None, rc
        if self.fixture.gpus[i].migMode == "unsupported":
            return None, ERROR_NOT_SUPPORTED
        for p in self.fixture.migProfiles:
            if p.index == _value(profile):
                return p, SUCCESS
        return None, ERROR_NOT_SUPPORTED

    def c_nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, profile: Any, out: Any) -> int:
        rc = self._versioned(out, _GpuInstanceProfileInfoV2, 2, "nvmlGpuInstanceProfileInfo_v2_t")
        if rc:
            return rc
        p, rc = self._profile_info(handle, profile)
        if rc or p is None:
            return rc
        # version 0 in what is written back, as driver 580.159.04 wrote it (the caller's version
        # is checked above; h100-80gb-hbm3-real-2026-11-27.nvml-calls.json)
        info = _GpuInstanceProfileInfoV2(
            version=0, id=p.id, isP2pSupported=0, sliceCount=p.sliceCount,
            instanceCount=p.instanceCount, multiprocessorCount=p.multiprocessors, copyEngineCount=p.copyEngines,
            decoderCount=p.decoders, encoderCount=0, jpegCount=p.jpegs, ofaCount=p.ofas, memorySizeMB=p.memoryMiB,
            name=p.name.encode())
        self._store(out, _GpuInstanceProfileInfoV2, info, "nvmlGpuInstanceProfileInfo_v2_t")
        return SUCCESS

    def c_nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: Any, out: Any) -> int:
        p, rc = self._profile_info(handle, profile)
        if rc or p is None:
            return rc
        info = _GpuInstanceProfileInfo(
            id=p.id, isP2pSupported=0, sliceCount=p.sliceCount, instanceCount=p.instanceCount,
            multiprocessorCount=p.multiprocessors, copyEngineCount=p.copyEngines, decoderCount=p.decoders,
            encoderCount=0, jpegCount=p.jpegs, ofaCount=p.ofas, memorySizeMB=p.memoryMiB)
        self._store(out, _GpuInstanceProfileInfo, info, "nvmlGpuInstanceProfileInfo_t")
        return SUCCESS

    def c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> int:
        i, rc = self._gpu(handle)
        if rc or i is None:
            return rc
        gpu = self.fixture.gpus[i]
        slot = _value(index)
        if gpu.migMode == "disabled":
            return ERROR_NOT_FOUND  # an H100 with MIG off answered NOT_FOUND (h100-80gb-hbm3-real-2026-11-27.yaml)
        if gpu.migMode != "enabled" or slot >= gpu.maxMigDevices:
            return ERROR_INVALID_ARGUMENT
        if slot >= len(gpu.migDevices):
            return ERROR_NOT_FOUND
        if self._mig_profile(i, slot) is None:
            return ERROR_UNKNOWN
        self._store(out, ctypes.c_void_p, 0x20_0000 + 0x1000 * i + 0x10 * slot, "nvmlDevice_t")
        return SUCCESS

    def c_nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> int:
        i, slot, rc = self._device(handle)
        if rc or i is None:
            return rc
        if slot is None:
            return ERROR_INVALID_ARGUMENT  # nvml.h: a MIG device handle
        self._store(out, ctypes.c_uint, self.fixture.gpus[i].migDevices[slot].gpuInstanceId, "id")
        return SUCCESS

    def c_nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "nvmlDeviceGetGpuInstanceById")
        if rc or i is None:
            return rc
        if not self.fixture.privileged:
            return ERROR_NO_PERMISSION
        for slot, mig in enumerate(self.fixture.gpus[i].migDevices):
            if mig.gpuInstanceId == _value(gi_id):
                self._store(out, ctypes.c_void_p, 0x30_0000 + 0x1000 * i + 0x10 * slot, "nvmlGpuInstance_t")
                return SUCCESS
        return ERROR_NOT_FOUND

    def c_nvmlGpuInstanceGetInfo(self, gi: Any, out: Any) -> int:
        found = self._gi_addr.get(_address(gi) or 0)
        if found is None:
            return ERROR_INVALID_ARGUMENT
        i, slot = found
        mig = self.fixture.gpus[i].migDevices[slot]
        info = _GpuInstanceInfo(device=self._gpu_addr[i], id=mig.gpuInstanceId, profileId=mig.profileId,
                                placement=_GpuInstancePlacement(0, 0))
        self._store(out, _GpuInstanceInfo, info, "nvmlGpuInstanceInfo_t")
        return SUCCESS

    # -- fabric --

    def _fabric(self, handle: Any) -> tuple[Any, int]:
        i, rc = self._gpu(handle, "nvmlDeviceGetGpuFabricInfo")
        if rc or i is None:
            return None, rc
        fabric = self.fixture.gpus[i].fabric
        if fabric is None:
            return None, ERROR_NOT_SUPPORTED
        return fabric, SUCCESS

    def c_nvmlDeviceGetGpuFabricInfoV(self, handle: Any, out: Any) -> int:
        target = _target(out)
        version = ctypes.c_uint.from_address(ctypes.addressof(target)).value
        struct = {struct_version(_GpuFabricInfoV2, 2): _GpuFabricInfoV2,
                  struct_version(_GpuFabricInfoV3, 3): _GpuFabricInfoV3}.get(version)
        if struct is None:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        rc = self._versioned(out, struct, version >> 24, struct.__name__)
        if rc:
            return rc
        fabric, rc = self._fabric(handle)
        if rc or fabric is None:
            return rc
        info = struct(version=version, status=ERROR_CODES.get(fabric.status, SUCCESS) if fabric.status else SUCCESS,
                      cliqueId=fabric.cliqueId, state=GPU_FABRIC_STATE[fabric.state], healthMask=fabric.healthMask)
        ctypes.memmove(info.clusterUuid, bytes.fromhex(fabric.clusterUuid.replace("-", "")), GPU_FABRIC_UUID_LEN)
        self._store(out, struct, info, struct.__name__)
        return SUCCESS

    def c_nvmlDeviceGetGpuFabricInfo(self, handle: Any, out: Any) -> int:
        fabric, rc = self._fabric(handle)
        if rc or fabric is None:
            return rc
        info = _GpuFabricInfo(status=ERROR_CODES.get(fabric.status, SUCCESS) if fabric.status else SUCCESS,
                              cliqueId=fabric.cliqueId, state=GPU_FABRIC_STATE[fabric.state])
        ctypes.memmove(info.clusterUuid, bytes.fromhex(fabric.clusterUuid.replace("-", "")), GPU_FABRIC_UUID_LEN)
        self._store(out, _GpuFabricInfo, info, "nvmlGpuFabricInfo_t")
        return SUCCESS

    # -- NVLink --

    def _links(self, i: int) -> list[tuple[int, str | None]]:
        """(remote type, remote bus id) of each active link of GPU ``i``, in link order."""
        from node_agent.probing import format_bus_id

        links: list[tuple[int, str | None]] = []
        for group in self.fixture.gpus[i].nvlinks or []:
            for _ in range(group.links):
                if group.to == "switch":
                    # NVML gives the switch's PCI address; no published output shows it.
                    links.append((NVLINK_DEVICE_TYPE_SWITCH, format_bus_id(0xFFFF, 0, len(links) % 32, 0)))
                elif group.to == "unknown":
                    links.append((NVLINK_DEVICE_TYPE_UNKNOWN, None))
                else:
                    links.append((NVLINK_DEVICE_TYPE_GPU, self.fixture.gpus[self._by_uuid[group.to]].pciBusId))
        return links

    def _link(self, handle: Any, link: Any) -> tuple[tuple[int, str | None] | None, int]:
        i, rc = self._gpu(handle)
        if rc or i is None:
            return None, rc
        gpu = self.fixture.gpus[i]
        if gpu.nvlinks is None:
            return None, ERROR_NOT_SUPPORTED
        links = self._links(i)
        n = _value(link)
        if n < len(links):
            return links[n], SUCCESS
        if n < len(links) + gpu.inactiveLinks:
            return None, SUCCESS
        return None, ERROR_INVALID_ARGUMENT

    def c_nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, out: Any) -> int:
        remote, rc = self._link(handle, link)
        if rc:
            return rc
        self._store(out, ctypes.c_uint, FEATURE_ENABLED if remote else FEATURE_DISABLED, "isActive")
        return SUCCESS

    def c_nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: Any, out: Any) -> int:
        remote, rc = self._link(handle, link)
        if rc:
            return rc
        if remote is None:
            return ERROR_INVALID_ARGUMENT
        self._store(out, ctypes.c_uint, remote[0], "nvmlIntNvLinkDeviceType_t")
        return SUCCESS

    def c_nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: Any, out: Any) -> int:
        remote, rc = self._link(handle, link)
        if rc:
            return rc
        if remote is None or remote[1] is None:
            return ERROR_UNKNOWN
        self._store(out, _PciInfo, self._pci(remote[1], 0), "nvmlPciInfo_t")
        return SUCCESS

    # -- events --

    def c_nvmlEventSetCreate(self, out: Any) -> int:
        addr = 0x40_0000 + 0x10 * len(self._sets)
        self._sets[addr] = _EventSet()
        self._store(out, ctypes.c_void_p, addr, "nvmlEventSet_t")
        return SUCCESS

    def c_nvmlEventSetFree(self, event_set: Any) -> int:
        return SUCCESS if self._sets.pop(_address(event_set) or 0, None) is not None else ERROR_INVALID_ARGUMENT

    def c_nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        i, rc = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if rc or i is None:
            return rc
        es = self._sets.get(_address(event_set) or 0)
        if es is None:
            return ERROR_INVALID_ARGUMENT
        addr = self._gpu_addr[i]
        if _value(types) & EVENT_TYPE_XID_CRITICAL_ERROR and addr not in es.registered:
            es.registered.add(addr)
            gpu = self.fixture.gpus[i]
            es.queue.extend(_Event(addr, xid) for xid in gpu.xids)
            for x in gpu.migXids:
                mig = gpu.migDevices[x.slot]
                es.queue.append(_Event(addr, x.xid, mig.gpuInstanceId, x.computeInstanceId))
        return SUCCESS

    def c_nvmlEventSetWait_v2(self, event_set: Any, out: Any, timeout_ms: Any) -> int:
        es = self._sets.get(_address(event_set) or 0)
        if es is None:
            return ERROR_INVALID_ARGUMENT
        if not es.queue:
            return ERROR_TIMEOUT
        e = es.queue.popleft()
        self._store(out, _EventData, _EventData(device=e.device, eventType=EVENT_TYPE_XID_CRITICAL_ERROR,
                                                eventData=e.xid, gpuInstanceId=e.gpu_instance_id,
                                                computeInstanceId=e.compute_instance_id), "nvmlEventData_t")
        return SUCCESS


__all__ = ["BoundaryViolation", "StandinLibrary", "struct_version"]
