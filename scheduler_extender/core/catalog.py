"""The GPU catalog: facts NVML cannot give (tensor cores, TFLOPS, MIG profiles, price tier).

The data lives in ``scheduler_extender/data/catalog.yaml``, one row per GPU model with the
source of its figures. Driver names (``NVIDIA A100-SXM4-80GB``) and family aliases (``A100``,
``A100-80GB``) map to catalog ids by *exact* token after normalisation (case folded, runs of
spaces/underscores turned into one ``-``), never by substring: ``H20`` does not match ``H200``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

Vendor = Literal["nvidia", "amd"]
Tier = Literal["premium", "datacenter", "workstation", "consumer", "legacy"]
Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4", "int8", "int4"]


class MigProfile(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    profile: str = Field(pattern=r"^\d+g\.\d+gb$", description="e.g. '3g.40gb'")
    memory_mib: int | None = Field(
        alias="memoryMiB", gt=0,
        description="Memory of one instance, MiB (`nvidia-smi mig -lgip`); null where no published output gives it.")
    compute_slices: int = Field(alias="computeSlices", ge=1, le=8)
    max_instances: int = Field(alias="maxInstances", ge=1, le=7)


class CatalogEntry(BaseModel):
    """One GPU model. Figures are per GPU; ``None`` means the datasheet gives none."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    vendor: Vendor
    display_name: str = Field(alias="displayName")
    driver_names: list[str] = Field(alias="driverNames", min_length=1)
    aliases: list[str] = Field(default_factory=list)
    architecture: str
    compute_capability: str | None = Field(default=None, alias="computeCapability", pattern=r"^\d+\.\d+$")
    memory_mib: int = Field(alias="memoryMiB", gt=0, description="Total VRAM as NVML reports it, MiB.")
    memory_bandwidth_gbps: float = Field(alias="memoryBandwidthGBps", gt=0, description="Decimal GB/s.")
    tensor_cores: int | None = Field(default=None, alias="tensorCores", ge=0)
    fp16_tflops_dense: float | None = Field(default=None, alias="fp16TflopsDense", ge=0)
    bf16_tflops_dense: float | None = Field(default=None, alias="bf16TflopsDense", ge=0)
    precisions: list[Precision] = Field(description="Precisions with native hardware support.")
    nvlink_links: int = Field(default=0, alias="nvlinkLinks", ge=0, description="0: no NVLink.")
    nvlink_bandwidth_gbps: float | None = Field(default=None, alias="nvlinkBandwidthGBps", ge=0)
    mig_profiles: list[MigProfile] = Field(default_factory=list, alias="migProfiles")
    ecc: bool = Field(description="ECC on VRAM supported.")
    tdp_w: float = Field(alias="tdpW", gt=0)
    tier: Tier
    cost_per_gpu_hour: float = Field(alias="costPerGpuHour", gt=0, description="Indicative USD per GPU-hour.")
    sources: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _nvidia_has_cc(self) -> "CatalogEntry":
        if self.vendor == "nvidia" and self.compute_capability is None:
            raise ValueError(f"{self.id}: NVIDIA entries need computeCapability")
        return self

    @property
    def compute_capability_tuple(self) -> tuple[int, int] | None:
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    def mig_profile(self, name: str) -> MigProfile | None:
        for p in self.mig_profiles:
            if p.profile == name:
                return p
        return None


def normalize_token(text: str) -> str:
    """Case-fold and turn runs of spaces/underscores into one '-': 'RTX 4090' -> 'rtx-4090'."""
    return re.sub(r"[\s_]+", "-", text.strip()).lower()


class UnknownModelError(ValueError):
    """A model token that is no catalog id or alias."""


class Catalog:
    """Lookup over catalog rows. Build with ``Catalog(entries)`` or ``default_catalog()``."""

    def __init__(self, entries: list[CatalogEntry]) -> None:
        self.entries: dict[str, CatalogEntry] = {}
        self._by_driver_name: dict[str, str] = {}
        self._by_token: dict[str, set[str]] = {}
        for e in entries:
            if e.id in self.entries:
                raise ValueError(f"catalog id {e.id} appears twice")
            self.entries[e.id] = e
            for name in e.driver_names:
                key = normalize_token(name)
                if key in self._by_driver_name and self._by_driver_name[key] != e.id:
                    raise ValueError(f"driver name {name!r} maps to {self._by_driver_name[key]} and {e.id}")
                self._by_driver_name[key] = e.id
            for token in [e.id, *e.aliases]:
                self._by_token.setdefault(normalize_token(token), set()).add(e.id)

    def resolve_driver_name(self, name: str) -> CatalogEntry | None:
        """The catalog row of a GPU by the name its driver reports; ``None`` if not catalogued."""
        model_id = self._by_driver_name.get(normalize_token(name))
        return self.entries[model_id] if model_id else None

    def resolve_token(self, token: str) -> frozenset[str]:
        """Catalog ids that a user's model token (id or family alias) stands for.

        Raises:
            UnknownModelError: the token is neither an id nor an alias (exact match only).
        """
        ids = self._by_token.get(normalize_token(token))
        if not ids:
            raise UnknownModelError(token)
        return frozenset(ids)

    def tokens(self) -> list[str]:
        """Every accepted model token (ids and aliases), sorted, for error messages."""
        return sorted(self._by_token)


def load_catalog_yaml(text: str) -> list[CatalogEntry]:
    raw = yaml.safe_load(text)
    rows = raw["gpus"] if isinstance(raw, dict) else raw
    return [CatalogEntry.model_validate(r) for r in rows]


class CatalogFileError(ValueError):
    """A catalog file that cannot be read or whose rows are invalid; the message names the file."""


def catalog_with_file(path: str, base: Catalog) -> Catalog:
    """``base`` plus the rows of the YAML file at ``path`` (a list of rows, or ``gpus:`` and a list,
    each a ``CatalogEntry`` as in the shipped ``data/catalog.yaml``): GPU models the shipped
    catalog lacks. A row may not reuse an id or driver name of ``base``.

    Raises:
        CatalogFileError: unreadable file, invalid YAML or row, or a clash with ``base``.
    """
    try:
        with open(path, encoding="utf-8") as f:
            rows = load_catalog_yaml(f.read())
        return Catalog([*base.entries.values(), *rows])
    except OSError as e:
        raise CatalogFileError(f"{path}: cannot read: {e.strerror}") from None
    except (yaml.YAMLError, ValueError, TypeError, KeyError) as e:
        raise CatalogFileError(f"{path}: {str(e)[:2000]}") from None


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalog shipped in the package (``data/catalog.yaml``)."""
    text = resources.files("scheduler_extender").joinpath("data/catalog.yaml").read_text()
    return Catalog(load_catalog_yaml(text))
