"""Scenario data for the AMD SMI stand-in: a node's AMD GPUs as published ``amd-smi`` outputs show them.

``load_fixture(FILE)`` reads a YAML scenario and returns a ``gpuplace_testing.amdsmi_standin.StandinLibrary``,
the stand-in for ``libamd_smi.so`` that the real ``amdsmi`` package runs over
(``AMDProbe(library=...)``; ``gpuplace-agent --probe fake-amdsmi --amdsmi-fixture FILE`` does the
same from the command line, finding ``load_fixture`` through the entry point group
``gpuplace.agent_probes`` of this package).

Scenarios live in ``tests/fixtures/amdsmi/`` and are transcriptions of published ``amd-smi list``,
``amd-smi static``, ``amd-smi topology`` and ``rocm-smi`` outputs; each cites its source at the
top. Their schema (``Fixture`` below) uses amd-smi's own terms; unknown keys are errors, so a typo
fails loudly with the file and field named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuplace_testing.amdsmi_standin import GPU_BLOCKS, RAS_ERR_STATE, VRAM_TYPE, StandinLibrary
from gpuplace_testing.fake_nvml import FixtureError, HexInt, read_scenario
from node_agent.probing import parse_bus_id

StatusName = Literal[
    "INVAL", "NOT_SUPPORTED", "NOT_YET_IMPLEMENTED", "FAIL_LOAD_MODULE", "FAIL_LOAD_SYMBOL", "DRM_ERROR",
    "API_FAILED", "NO_PERM", "INIT_ERROR", "NOT_FOUND", "NOT_INIT", "DRIVER_NOT_LOADED", "UNKNOWN_ERROR",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Vram(_Model):
    """``amd-smi static`` "VRAM"."""

    type: str = Field(description="amdsmi_vram_type_t name: HBM3, GDDR6...")
    vendor: str = ""
    sizeMiB: int = Field(gt=0, description="SIZE, which amd-smi prints as 'MB' and is MiB (bytes / 2**20).")
    bitWidth: int | None = None
    maxBandwidthGBps: int | None = Field(default=None, description="MAX_BANDWIDTH (GB/s); None: not reported.")

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in VRAM_TYPE:
            raise ValueError(f"one of {', '.join(VRAM_TYPE)}")
        return value


class EccCounts(_Model):
    """``amd-smi metric --ecc``: totals since the driver loaded."""

    correctable: int = Field(default=0, ge=0)
    uncorrectable: int = Field(default=0, ge=0)
    deferred: int = Field(default=0, ge=0)


class BadPage(_Model):
    """One line of ``amd-smi bad-pages``."""

    address: int = Field(ge=0)
    status: Literal["reserved", "pending", "unreservable"]


class GPUFixture(_Model):
    """One GPU (or partition) as ``amd-smi static`` and ``amd-smi list`` describe it."""

    uuid: str
    bdf: str
    marketName: str = Field(description="ASIC MARKET_NAME.")
    vendorId: HexInt = 0x1002
    deviceId: HexInt
    subsystemId: HexInt = 0
    revId: HexInt = 0
    asicSerial: str = Field(default="", description="ASIC_SERIAL in hex digits, without 0x.")
    oamId: int | None = None
    computeUnits: int | None = Field(default=None, description="NUM_COMPUTE_UNITS; None: not reported.")
    targetGraphicsVersion: str = Field(pattern=r"^gfx[0-9a-f]+$")
    vram: Vram
    powerCapW: float | None = Field(default=None, description="LIMIT MAX_POWER / rocm-smi PwrCap; None: NOT_SUPPORTED.")
    numaAffinity: int | None = Field(default=None, description="amdsmi_get_gpu_topo_numa_affinity; None: -1.")
    sysfsNumaNode: int | None = Field(default=None, description="sysfs numa_node of the PCI device.")
    ecc: Literal["enabled", "disabled", "unsupported"] = "unsupported"
    eccBlocks: list[str] = Field(default_factory=list, description="RAS ECC_BLOCK_STATE blocks that are ENABLED.")
    rasStates: dict[str, str] = Field(default_factory=dict, description=(
        "amdsmi_ras_err_state_t of an enabled block other than ENABLED (MULT_UC, POISON...)."))
    eccCounts: EccCounts = Field(default_factory=EccCounts)
    badPages: list[BadPage] | None = Field(default_factory=list, description="None: NOT_SUPPORTED.")
    computePartition: str | None = Field(default=None, description="SPX, DPX, QPX, CPX; None: NOT_SUPPORTED.")
    memoryPartition: str | None = Field(default=None, description="NPS1, NPS4...; None: NOT_SUPPORTED.")
    xgmiPeers: list[str] = Field(default_factory=list, description="BDFs of the GPUs this one reaches over XGMI.")
    xgmiHops: int = Field(default=1, ge=1, description="amd-smi topology NUMBER OF HOPS to those peers.")
    unsupported: list[str] = Field(default_factory=list, description="amdsmi functions that answer NOT_SUPPORTED.")
    errors: dict[str, StatusName] = Field(default_factory=dict, description="amdsmi functions that fail with that status.")

    @field_validator("bdf")
    @classmethod
    def _bus(cls, value: str) -> str:
        if parse_bus_id(value) is None:
            raise ValueError("expected a PCI address like 0000:05:00.0")
        return value

    @field_validator("eccBlocks")
    @classmethod
    def _blocks(cls, value: list[str]) -> list[str]:
        for block in value:
            if block not in GPU_BLOCKS:
                raise ValueError(f"{block}: one of {', '.join(GPU_BLOCKS)}")
        return value

    @field_validator("rasStates")
    @classmethod
    def _states(cls, value: dict[str, str]) -> dict[str, str]:
        for block, state in value.items():
            if block not in GPU_BLOCKS or state not in RAS_ERR_STATE:
                raise ValueError(f"{block}: {state}: blocks are {', '.join(GPU_BLOCKS)}; states {', '.join(RAS_ERR_STATE)}")
        return value


class Fixture(_Model):
    """A node: the library, the driver and its GPUs."""

    libVersion: str = Field(default="26.0.2", pattern=r"^\d+\.\d+\.\d+", description="amdsmi_get_lib_version.")
    driverVersion: str | None = Field(default=None, description="amdgpu driver version (amd-smi static DRIVER).")
    initError: StatusName | None = Field(default=None, description="amdsmi_init fails with this.")
    absentFunctions: list[str] = Field(default_factory=list, description=(
        "C symbols this libamd_smi lacks (an older library): the lookup fails."))
    gpus: list[GPUFixture]

    @field_validator("gpus")
    @classmethod
    def _peers_exist(cls, gpus: list[GPUFixture]) -> list[GPUFixture]:
        buses = {parse_bus_id(g.bdf) for g in gpus}
        for g in gpus:
            for peer in g.xgmiPeers:
                if parse_bus_id(peer) not in buses:
                    raise ValueError(f"{g.bdf}: XGMI peer {peer} is not one of the GPUs")
        return gpus


def load_fixture(path: str | Path) -> StandinLibrary:
    """The AMD SMI stand-in for a YAML fixture file. Raises ``FixtureError`` naming the file and field."""
    return StandinLibrary(read_scenario(path, Fixture, "AMD SMI"), source=str(path))


__all__ = ["Fixture", "FixtureError", "GPUFixture", "load_fixture"]
