"""A stand-in for the ``pynvml`` module, driven by a YAML fixture that describes a node's GPUs.

``node_agent.nvml.NVMLProbe(nvml_module=FakeNVML(...))`` runs the real probe code against it, so
tests exercise every NVML call the agent makes; ``gpuplace-agent --probe fake-nvml --nvml-fixture
FILE`` does the same from the command line. It offers exactly the functions and constants
``node_agent/nvml.py`` uses, with pynvml's names, argument order, return shapes (ctypes structs
become objects with the same attribute names, byte strings stay bytes) and error codes
(``NVMLError`` with ``.value``), and answers as the real library does where the NVML
documentation says so: ``nvmlDeviceGetAttributes`` supports MIG device handles only, a GPU
without NVLink answers NOT_SUPPORTED on link 0, an empty MIG slot answers NOT_FOUND.

Fixtures live in ``tests/fixtures/nvml/`` and are transcriptions of published ``nvidia-smi -q``,
``nvidia-smi topo -m``, ``nvidia-smi mig -lgip`` and CUDA ``deviceQuery`` outputs; each cites its
source at the top. Their schema (``Fixture`` below) uses NVML's own terms; unknown keys are
errors, so a typo fails loudly with the file and field named.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from node_agent.nvml import format_bus_id, parse_bus_id

# ---- NVML constants (values as in nvml.h / pynvml) -------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
nvmlEventTypeXidCriticalError = 0x0000000000000008

NVML_DEVICE_ARCH_KEPLER = 2
NVML_DEVICE_ARCH_MAXWELL = 3
NVML_DEVICE_ARCH_PASCAL = 4
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_ADA = 8
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10
NVML_DEVICE_ARCH_RUBIN = 13

_ARCHITECTURES = {
    "kepler": NVML_DEVICE_ARCH_KEPLER, "maxwell": NVML_DEVICE_ARCH_MAXWELL,
    "pascal": NVML_DEVICE_ARCH_PASCAL, "volta": NVML_DEVICE_ARCH_VOLTA,
    "turing": NVML_DEVICE_ARCH_TURING, "ampere": NVML_DEVICE_ARCH_AMPERE,
    "ada": NVML_DEVICE_ARCH_ADA, "hopper": NVML_DEVICE_ARCH_HOPPER,
    "blackwell": NVML_DEVICE_ARCH_BLACKWELL, "rubin": NVML_DEVICE_ARCH_RUBIN,
}

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}
_ERROR_NAMES = {
    "UNINITIALIZED": NVML_ERROR_UNINITIALIZED,
    "INVALID_ARGUMENT": NVML_ERROR_INVALID_ARGUMENT,
    "NOT_SUPPORTED": NVML_ERROR_NOT_SUPPORTED,
    "NO_PERMISSION": NVML_ERROR_NO_PERMISSION,
    "NOT_FOUND": NVML_ERROR_NOT_FOUND,
    "DRIVER_NOT_LOADED": NVML_ERROR_DRIVER_NOT_LOADED,
    "TIMEOUT": NVML_ERROR_TIMEOUT,
    "LIBRARY_NOT_FOUND": NVML_ERROR_LIBRARY_NOT_FOUND,
    "FUNCTION_NOT_FOUND": NVML_ERROR_FUNCTION_NOT_FOUND,
    "GPU_IS_LOST": NVML_ERROR_GPU_IS_LOST,
    "LIB_RM_VERSION_MISMATCH": NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    "UNKNOWN": NVML_ERROR_UNKNOWN,
}
ErrorName = Literal[
    "UNINITIALIZED", "INVALID_ARGUMENT", "NOT_SUPPORTED", "NO_PERMISSION", "NOT_FOUND",
    "DRIVER_NOT_LOADED", "TIMEOUT", "LIBRARY_NOT_FOUND", "FUNCTION_NOT_FOUND", "GPU_IS_LOST",
    "LIB_RM_VERSION_MISMATCH", "UNKNOWN",
]


class NVMLError(Exception):
    """pynvml's error: ``value`` is the NVML return code, ``str()`` its description."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(_ERROR_STRINGS.get(value, f"NVML error {value}"))

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML error {self.value}")


# ---- fixture schema ---------------------------------------------------------------------------


class FixtureError(ValueError):
    """A fixture file that cannot be used; the message names the file and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MigProfile(_Model):
    """One line of ``nvidia-smi mig -lgip``: a GPU instance profile."""

    index: int = Field(ge=0, lt=NVML_GPU_INSTANCE_PROFILE_COUNT, description="NVML_GPU_INSTANCE_PROFILE_* the driver enumerates it by.")
    id: int = Field(ge=0, description="Profile ID, the lgip 'ID' column (9 for 3g.40gb on A100).")
    name: str = Field(description="As lgip prints it, e.g. 'MIG 3g.40gb'.")
    sliceCount: int = Field(ge=1)
    instanceCount: int = Field(ge=0, default=1)
    memoryMiB: int = Field(gt=0, description="NVML memorySizeMB (MiB).")
    multiprocessors: int = Field(ge=0)


class MigDeviceFixture(_Model):
    """One line of ``nvidia-smi -L`` under a GPU: a MIG device."""

    uuid: str
    profileId: int
    gpuInstanceId: int = Field(ge=0)
    computeSlices: int | None = Field(default=None, description="Compute instance slices when smaller than the GPU instance.")


class NVLinkGroup(_Model):
    """``links`` active NVLinks from this GPU to ``to``: a GPU UUID of the same node, ``switch``
    (an NVSwitch), or ``unknown`` (NVML cannot identify the remote, as in VMs)."""

    to: str
    links: int = Field(ge=1)


class RemappedRows(_Model):
    """``nvidia-smi -q`` "Remapped Rows"."""

    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failure: bool = False


class GPUFixture(_Model):
    """One GPU as ``nvidia-smi -q`` (and ``deviceQuery``) describes it, in NVML's terms."""

    uuid: str
    name: str
    pciBusId: str
    pciDeviceId: int
    architecture: Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell", "rubin"]
    computeCapability: str = Field(pattern=r"^\d+\.\d+$")
    memoryTotalMiB: int = Field(gt=0)
    cudaCores: int | None = None
    memoryBusWidthBits: int | None = None
    maxMemoryClockMHz: int | None = None
    ecc: Literal["enabled", "disabled", "unsupported"] = "unsupported"
    enforcedPowerLimitW: float | None = None
    gpuNumaId: int | None = Field(default=None, description="nvmlDeviceGetNumaNodeId; None = NOT_SUPPORTED (x86).")
    numaAffinity: int | None = Field(default=None, description="sysfs numa_node of the PCI device (topo -m 'NUMA Affinity').")
    retiredPagesPending: bool | None = None
    remappedRows: RemappedRows | None = None
    volatileUncorrectedEcc: int | None = None
    migMode: Literal["enabled", "disabled", "unsupported"] = "unsupported"
    maxMigDevices: int = 7
    migDevices: list[MigDeviceFixture] = Field(default_factory=list)
    nvlinks: list[NVLinkGroup] | None = Field(default=None, description="None: the GPU has no NVLink.")
    inactiveLinks: int = Field(default=0, ge=0)
    xids: list[int] = Field(default_factory=list, description="XID events delivered after the agent registers.")
    handleError: ErrorName | None = None
    unsupported: list[str] = Field(default_factory=list, description="NVML functions that answer NOT_SUPPORTED.")
    errors: dict[str, ErrorName] = Field(default_factory=dict, description="NVML functions that fail with that error.")

    @field_validator("pciDeviceId", mode="before")
    @classmethod
    def _hex(cls, value: Any) -> Any:
        return int(value, 16) if isinstance(value, str) else value

    @field_validator("pciBusId")
    @classmethod
    def _bus(cls, value: str) -> str:
        if parse_bus_id(value) is None:
            raise ValueError("expected a PCI address like 00000000:07:00.0")
        return value


class Fixture(_Model):
    """A node: the driver and its GPUs."""

    driverVersion: str | None = None
    cudaDriverVersion: int | None = Field(default=None, description="As nvmlSystemGetCudaDriverVersion_v2 returns it: 12080 for 12.8.")
    initError: ErrorName | None = Field(default=None, description="nvmlInit fails with this (no driver).")
    migProfiles: list[MigProfile] = Field(default_factory=list)
    gpus: list[GPUFixture]


def load_fixture(path: str | Path) -> "FakeNVML":
    """A ``FakeNVML`` from a YAML fixture file. Raises ``FixtureError`` naming the file and field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise FixtureError(f"{path}: cannot read NVML fixture ({e.strerror or e})") from e
    except yaml.YAMLError as e:
        raise FixtureError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from e
    try:
        fixture = Fixture.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise FixtureError(f"{path}: field {where}: {first['msg']}{more}") from e
    return FakeNVML(fixture, source=str(path))


# ---- handles ------------------------------------------------------------------------------------


class _Device:
    """A GPU handle (``nvmlDevice_t``)."""

    def __init__(self, index: int, gpu: GPUFixture) -> None:
        self.index = index
        self.gpu = gpu

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index} {self.gpu.uuid}>"


class _MigDevice:
    """A MIG device handle: a device handle that belongs to a parent GPU."""

    def __init__(self, parent: _Device, mig: MigDeviceFixture, profile: MigProfile) -> None:
        self.parent = parent
        self.mig = mig
        self.profile = profile
        self.gpu = parent.gpu  # errors/unsupported configured on the parent apply to its MIG devices


class _GpuInstance:
    def __init__(self, parent: _Device, gi_id: int, profile_id: int) -> None:
        self.parent = parent
        self.id = gi_id
        self.profile_id = profile_id


class _EventSet:
    def __init__(self) -> None:
        self.queue: deque[SimpleNamespace] = deque()
        self.registered: set[int] = set()


class FakeNVML:
    """The fake module: attribute names are pynvml's. Build it with ``load_fixture``."""

    NVMLError = NVMLError

    def __init__(self, fixture: Fixture, *, source: str = "fixture") -> None:
        self.fixture = fixture
        self.source = source
        self.initialized = 0
        self.calls: list[str] = []  # every function called, in order (tests assert on it)
        self._devices = [_Device(i, g) for i, g in enumerate(fixture.gpus)]
        self._by_bus = {parse_bus_id(g.pciBusId): d for d, g in zip(self._devices, fixture.gpus)}
        self._by_uuid = {g.uuid: d for d, g in zip(self._devices, fixture.gpus)}
        self._profiles_by_id = {p.id: p for p in fixture.migProfiles}
        self._event_sets: list[_EventSet] = []
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, value)

    # -- helpers --

    def _enter(self, fn: str, device: Any = None) -> None:
        self.calls.append(fn)
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        gpu: GPUFixture | None = getattr(device, "gpu", None)
        if gpu is not None:
            if fn in gpu.errors:
                raise NVMLError(_ERROR_NAMES[gpu.errors[fn]])
            if fn in gpu.unsupported:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def numa_affinity(self, bus_id: str) -> int | None:
        """What sysfs ``numa_node`` would say for this PCI address (``NVMLProbe(numa_lookup=...)``)."""
        device = self._by_bus.get(parse_bus_id(bus_id))
        return device.gpu.numaAffinity if device else None

    def post_xid(self, uuid: str, xid: int) -> None:
        """Deliver an XID event for a GPU now, as the driver would after a fault."""
        device = self._by_uuid[uuid]
        for event_set in self._event_sets:
            if device.index in event_set.registered:
                event_set.queue.append(self._xid_event(device, xid))

    @staticmethod
    def _xid_event(device: _Device, xid: int) -> SimpleNamespace:
        return SimpleNamespace(device=device, eventType=nvmlEventTypeXidCriticalError, eventData=xid,
                               gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)

    # -- init --

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.fixture.initError:
            raise NVMLError(_ERROR_NAMES[self.fixture.initError])
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    # -- system --

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        if self.fixture.driverVersion is None:
            raise NVMLError(NVML_ERROR_UNKNOWN)
        return self.fixture.driverVersion

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        if self.fixture.cudaDriverVersion is None:
            raise NVMLError(NVML_ERROR_UNKNOWN)
        return self.fixture.cudaDriverVersion

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        if self.fixture.cudaDriverVersion is None:
            raise NVMLError(NVML_ERROR_UNKNOWN)
        return self.fixture.cudaDriverVersion

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Device:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        device = self._devices[index]
        if device.gpu.handleError:
            raise NVMLError(_ERROR_NAMES[device.gpu.handleError])
        return device

    # -- identity --

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return h.mig.uuid if isinstance(h, _MigDevice) else h.gpu.uuid

    def nvmlDeviceGetName(self, h: _Device) -> str:
        self._enter("nvmlDeviceGetName", h)
        return h.gpu.name

    def nvmlDeviceGetPciInfo(self, h: _Device) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo", h)
        return self._pci_info(h.gpu.pciBusId, h.gpu.pciDeviceId)

    @staticmethod
    def _pci_info(bus_id: str, device_id: int) -> SimpleNamespace:
        domain, bus, dev, fn = parse_bus_id(bus_id) or (0, 0, 0, 0)
        return SimpleNamespace(
            busIdLegacy=f"{domain:04X}:{bus:02X}:{dev:02X}.{fn:X}".encode(),
            busId=format_bus_id(domain, bus, dev, fn).encode(),
            domain=domain, bus=bus, device=dev, pciDeviceId=device_id, pciSubSystemId=0,
        )

    def nvmlDeviceGetArchitecture(self, h: _Device) -> int:
        self._enter("nvmlDeviceGetArchitecture", h)
        return _ARCHITECTURES[h.gpu.architecture]

    def nvmlDeviceGetCudaComputeCapability(self, h: _Device) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", h)
        major, minor = h.gpu.computeCapability.split(".")
        return int(major), int(minor)

    # -- size and speed --

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: Any = None) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        mib = h.profile.memoryMiB if isinstance(h, _MigDevice) else h.gpu.memoryTotalMiB
        total = mib * 1024 * 1024
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetNumGpuCores(self, h: _Device) -> int:
        self._enter("nvmlDeviceGetNumGpuCores", h)
        if h.gpu.cudaCores is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.gpu.cudaCores

    def nvmlDeviceGetAttributes(self, h: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetAttributes", h)
        if not isinstance(h, _MigDevice):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # nvml.h: "currently only supports MIG device handles"
        p = h.profile
        sms = p.multiprocessors
        ci = h.mig.computeSlices or p.sliceCount
        if ci < p.sliceCount:
            sms = p.multiprocessors * ci // p.sliceCount
        return SimpleNamespace(
            multiprocessorCount=sms, sharedCopyEngineCount=0, sharedDecoderCount=0,
            sharedEncoderCount=0, sharedJpegCount=0, sharedOfaCount=0,
            gpuInstanceSliceCount=p.sliceCount, computeInstanceSliceCount=ci, memorySizeMB=p.memoryMiB,
        )

    def nvmlDeviceGetMemoryBusWidth(self, h: _Device) -> int:
        self._enter("nvmlDeviceGetMemoryBusWidth", h)
        if h.gpu.memoryBusWidthBits is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.gpu.memoryBusWidthBits

    def nvmlDeviceGetMaxClockInfo(self, h: _Device, clock_type: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", h)
        if clock_type != NVML_CLOCK_MEM or h.gpu.maxMemoryClockMHz is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.gpu.maxMemoryClockMHz

    # -- modes and limits --

    def nvmlDeviceGetEccMode(self, h: _Device) -> list[int]:
        self._enter("nvmlDeviceGetEccMode", h)
        if h.gpu.ecc == "unsupported":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_FEATURE_ENABLED if h.gpu.ecc == "enabled" else NVML_FEATURE_DISABLED
        return [mode, mode]

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Device) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        if h.gpu.enforcedPowerLimitW is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(round(h.gpu.enforcedPowerLimitW * 1000))

    def nvmlDeviceGetPowerManagementLimit(self, h: _Device) -> int:
        self._enter("nvmlDeviceGetPowerManagementLimit", h)
        if h.gpu.enforcedPowerLimitW is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(round(h.gpu.enforcedPowerLimitW * 1000))

    def nvmlDeviceGetNumaNodeId(self, h: _Device) -> int:
        self._enter("nvmlDeviceGetNumaNodeId", h)
        if h.gpu.gpuNumaId is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.gpu.gpuNumaId

    # -- health --

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: _Device) -> int:
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus", h)
        if h.gpu.retiredPagesPending is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if h.gpu.retiredPagesPending else NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, h: _Device) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", h)
        rows = h.gpu.remappedRows
        if rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return rows.correctable, rows.uncorrectable, int(rows.pending), int(rows.failure)

    def nvmlDeviceGetTotalEccErrors(self, h: _Device, error_type: int, counter_type: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        if h.gpu.ecc != "enabled" or h.gpu.volatileUncorrectedEcc is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if (error_type, counter_type) != (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC):
            return 0
        return h.gpu.volatileUncorrectedEcc

    # -- MIG --

    def nvmlDeviceGetMigMode(self, h: _Device) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", h)
        if h.gpu.migMode == "unsupported":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if h.gpu.migMode == "enabled" else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: _Device, profile: int, version: int = 2) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", h)
        if h.gpu.migMode == "unsupported":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        for p in self.fixture.migProfiles:
            if p.index == profile:
                return SimpleNamespace(
                    version=version, id=p.id, isP2pSupported=0, sliceCount=p.sliceCount,
                    instanceCount=p.instanceCount, multiprocessorCount=p.multiprocessors,
                    copyEngineCount=0, decoderCount=0, encoderCount=0, jpegCount=0, ofaCount=0,
                    memorySizeMB=p.memoryMiB, name=p.name.encode(),
                )
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Device) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        if h.gpu.migMode == "unsupported":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.gpu.maxMigDevices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Device, index: int) -> _MigDevice:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index >= h.gpu.maxMigDevices:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(h.gpu.migDevices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        mig = h.gpu.migDevices[index]
        profile = self._profiles_by_id.get(mig.profileId)
        if profile is None:
            raise NVMLError(NVML_ERROR_UNKNOWN)
        return _MigDevice(h, mig, profile)

    def nvmlDeviceGetGpuInstanceId(self, h: _MigDevice) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", h)
        if not isinstance(h, _MigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return h.mig.gpuInstanceId

    def nvmlDeviceGetGpuInstanceById(self, h: _Device, gi_id: int) -> _GpuInstance:
        self._enter("nvmlDeviceGetGpuInstanceById", h)
        for mig in h.gpu.migDevices:
            if mig.gpuInstanceId == gi_id:
                return _GpuInstance(h, gi_id, mig.profileId)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gi: _GpuInstance) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetInfo")
        return SimpleNamespace(device=gi.parent, id=gi.id, profileId=gi.profile_id, placement=None)

    # -- NVLink --

    def _links(self, h: _Device) -> list[tuple[int, str | None]]:
        """(remote type, remote bus id) of each active link, in link order."""
        links: list[tuple[int, str | None]] = []
        for group in h.gpu.nvlinks or []:
            for k in range(group.links):
                if group.to == "switch":
                    # Synthetic: NVML gives the switch's PCI address, no published output shows it.
                    links.append((NVML_NVLINK_DEVICE_TYPE_SWITCH, format_bus_id(0xFFFF, 0, len(links) % 32, 0)))
                elif group.to == "unknown":
                    links.append((NVML_NVLINK_DEVICE_TYPE_UNKNOWN, None))
                else:
                    peer = self._by_uuid.get(group.to)
                    if peer is None:
                        raise FixtureError(f"{self.source}: nvlinks of {h.gpu.uuid} name unknown GPU {group.to}")
                    links.append((NVML_NVLINK_DEVICE_TYPE_GPU, peer.gpu.pciBusId))
        return links

    def _link(self, h: _Device, link: int) -> tuple[int, str | None] | None:
        if h.gpu.nvlinks is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        links = self._links(h)
        if link < len(links):
            return links[link]
        if link < len(links) + h.gpu.inactiveLinks:
            return None
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetNvLinkState(self, h: _Device, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", h)
        return NVML_FEATURE_ENABLED if self._link(h, link) is not None else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: _Device, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", h)
        remote = self._link(h, link)
        if remote is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return remote[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: _Device, link: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo", h)
        remote = self._link(h, link)
        if remote is None or remote[1] is None:
            raise NVMLError(NVML_ERROR_UNKNOWN)
        return self._pci_info(remote[1], 0)

    # -- events --

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        event_set = _EventSet()
        self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, h: _Device, event_types: int, event_set: _EventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents", h)
        if event_types & nvmlEventTypeXidCriticalError and h.index not in event_set.registered:
            event_set.registered.add(h.index)
            event_set.queue.extend(self._xid_event(h, xid) for xid in h.gpu.xids)

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait")
        if not event_set.queue:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return event_set.queue.popleft()


__all__ = ["FakeNVML", "Fixture", "FixtureError", "GPUFixture", "NVMLError", "load_fixture"]
