"""Scenario data for the NVML stand-in: a node's GPUs as published ``nvidia-smi`` outputs show them.

``load_fixture(FILE)`` reads a YAML scenario and returns a ``gpuplace_testing.nvml_standin.StandinLibrary``,
the stand-in for ``libnvidia-ml.so.1`` that the real ``pynvml`` wrappers run over
(``NVMLProbe(library=...)``; ``gpuplace-agent --probe fake-nvml --nvml-fixture FILE`` does the
same from the command line, finding ``load_fixture`` through the entry point group
``gpuplace.agent_probes`` of this package).

Scenarios live in ``tests/fixtures/nvml/`` and are transcriptions of published ``nvidia-smi -q``,
``nvidia-smi topo -m``, ``nvidia-smi mig -lgip`` and CUDA ``deviceQuery`` outputs; each cites its
source at the top. Their schema (``Fixture`` below) uses NVML's own terms; unknown keys are
errors, so a typo fails loudly with the file and field named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from node_agent.probing import parse_bus_id
from gpuplace_testing.nvml_standin import StandinLibrary

NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12  # nvml.h
M = TypeVar("M", bound=BaseModel)

ErrorName = Literal[
    "UNINITIALIZED", "INVALID_ARGUMENT", "NOT_SUPPORTED", "NO_PERMISSION", "NOT_FOUND",
    "DRIVER_NOT_LOADED", "TIMEOUT", "LIBRARY_NOT_FOUND", "FUNCTION_NOT_FOUND", "GPU_IS_LOST",
    "LIB_RM_VERSION_MISMATCH", "UNKNOWN",
]


# ---- fixture schema ---------------------------------------------------------------------------



HexInt = Annotated[int, BeforeValidator(lambda v: int(v, 16) if isinstance(v, str) else v)]
"""An integer a scenario may write in hex, as the tools print IDs (``"0x20B510DE"``)."""

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
    copyEngines: int = Field(default=0, ge=0, description="lgip 'CE' column.")
    decoders: int = Field(default=0, ge=0, description="lgip 'DEC' column (NVDEC).")
    jpegs: int = Field(default=0, ge=0, description="lgip 'JPEG' column.")
    ofas: int = Field(default=0, ge=0, description="lgip 'OFA' column.")


class MigDeviceFixture(_Model):
    """One line of ``nvidia-smi -L`` under a GPU: a MIG device."""

    uuid: str
    profileId: int
    gpuInstanceId: int = Field(ge=0)
    computeSlices: int | None = Field(default=None, description="Compute instance slices when smaller than the GPU instance.")
    memoryMiB: int | None = Field(default=None, gt=0, description=(
        "The device's memory as this driver reports it (nvidia-smi's MIG table), when it differs "
        "from the profile table's memorySizeMB."))


class MigXid(_Model):
    """An XID the driver scopes to one MIG device (nvmlEventData_t gpuInstanceId/computeInstanceId)."""

    slot: int = Field(ge=0, description="Index into migDevices.")
    xid: int
    computeInstanceId: int = 0


class Fabric(_Model):
    """``nvidia-smi -q`` "Fabric": the GPU's registration with NVIDIA Fabric Manager (NVSwitch
    systems; nvmlDeviceGetGpuFabricInfoV)."""

    state: Literal["not_supported", "not_started", "in_progress", "completed"]
    status: ErrorName | None = Field(default=None, description="None: NVML_SUCCESS.")
    clusterUuid: str = "00000000-0000-0000-0000-000000000000"
    cliqueId: int = 0
    healthMask: int = 0


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
    pciDeviceId: HexInt
    architecture: Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell", "rubin"]
    computeCapability: str = Field(pattern=r"^\d+\.\d+$")
    memoryTotalMiB: int = Field(gt=0)
    cudaCores: int | None = None
    memoryBusWidthBits: int | None = None
    maxMemoryClockMHz: int | None = None
    ecc: Literal["enabled", "disabled", "unsupported"] = "unsupported"
    enforcedPowerLimitW: float | None = None
    gpuCurrentTempC: int | None = Field(default=None, ge=0, description=(
        "nvidia-smi -q 'Temperature / GPU Current Temp' in degrees C (nvmlDeviceGetTemperature, "
        "NVML_TEMPERATURE_GPU). None: the published output has none; NVML answers NOT_SUPPORTED."))
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
    migXids: list[MigXid] = Field(default_factory=list, description="MIG-scoped XID events, likewise.")
    fabric: Fabric | None = Field(default=None, description="None: the GPU has no fabric (NOT_SUPPORTED).")
    handleError: ErrorName | None = None
    unsupported: list[str] = Field(default_factory=list, description="NVML functions that answer NOT_SUPPORTED.")
    errors: dict[str, ErrorName] = Field(default_factory=dict, description="NVML functions that fail with that error.")

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
    privileged: bool = Field(default=True, description=(
        "False: an unprivileged container, where with MIG on nvmlDeviceGetGpuInstanceById and the "
        "parent GPU's memory query answer NO_PERMISSION."))
    absentFunctions: list[str] = Field(default_factory=list, description=(
        "C symbols this driver's libnvidia-ml lacks (an old driver): FUNCTION_NOT_FOUND."))
    migProfiles: list[MigProfile] = Field(default_factory=list)
    gpus: list[GPUFixture]


def read_scenario(path: str | Path, model: type[M], what: str) -> M:
    """A YAML scenario file validated as ``model``. Raises ``FixtureError`` naming the file and field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise FixtureError(f"{path}: cannot read {what} fixture ({e.strerror or e})") from e
    except yaml.YAMLError as e:
        raise FixtureError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from e
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise FixtureError(f"{path}: field {where}: {first['msg']}{more}") from e


def load_fixture(path: str | Path) -> StandinLibrary:
    """The NVML stand-in for a YAML fixture file. Raises ``FixtureError`` naming the file and field."""
    return StandinLibrary(read_scenario(path, Fixture, "NVML"), source=str(path))


__all__ = ["Fixture", "FixtureError", "GPUFixture", "load_fixture", "read_scenario"]
