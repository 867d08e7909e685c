"""The ``NodeGPUInventory`` contract: what the node agent reports about a node's GPUs.

The contract between the agent and the extender: the value of the Node annotation ``gpuplace.io/inventory``
and the file format of the extender's static mode (``--inventory-dir``). JSON keys are camelCase
as the agent writes them; Python attributes are snake_case. Unknown keys are ignored (forward
compatibility), required keys are enforced. A value the agent could not read stays ``None``
(unknown), never 0: a scheduler must not mistake "not measured" for "none".

Units sit in the names: ``memory_mib`` is MiB (2**20 bytes, as NVML's ``nvmlDeviceGetMemoryInfo``
total and ``nvidia-smi --query-gpu=memory.total`` report it), ``memory_bandwidth_gbps`` is
decimal GB/s (10**9 bytes/s, as datasheets quote it), ``power_limit_w`` is watts, ``temperature_c``
is degrees Celsius.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

API_VERSION = "gpuplace.io/v1alpha1"
KIND = "NodeGPUInventory"
ANNOTATION = "gpuplace.io/inventory"
MAX_ANNOTATION_BYTES = 128 * 1024
"""Largest inventory annotation accepted. Kubernetes caps all annotations of an object at
256 KiB together (``apimachinery`` ``TotalAnnotationSizeLimitB``); an 8-GPU node with 56 MIG
devices serialises to about 20 KiB, so anything above half the cap is not an agent's output."""


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class MigDevice(_Model):
    """One MIG device (GPU instance + compute instance) carved out of a physical GPU."""

    uuid: str = Field(min_length=1)
    profile: str = Field(
        min_length=1, description="MIG profile name as NVML reports it, e.g. '3g.40gb'."
    )
    memory_mib: int = Field(alias="memoryMiB", gt=0, description="Memory of the device, MiB.")
    multiprocessors: int | None = Field(default=None, ge=0)
    allocated_to: str = Field(
        default="",
        alias="allocatedTo",
        description="'namespace/pod' holding this MIG device, '' when free or unknown.",
    )
    healthy: bool = Field(
        default=True,
        description="False when a fault scoped to this MIG device (an XID the driver reports for its "
        "GPU instance) makes it unfit for new work; the parent GPU's health applies on top.",
    )
    health_reasons: list[str] = Field(default_factory=list, alias="healthReasons")


class NVLinkPeer(_Model):
    """A GPU of the same node reachable over NVLink, and how many links join the two."""

    peer_uuid: str = Field(alias="peerUuid", min_length=1)
    links: int = Field(default=1, ge=1)


class GPU(_Model):
    """One physical GPU as the agent saw it."""

    index: int = Field(ge=0)
    uuid: str = Field(min_length=1)
    vendor: Literal["nvidia", "amd"]
    name: str = Field(min_length=1, description="Product name as the driver reports it.")
    memory_mib: int = Field(alias="memoryMiB", gt=0, description="Total VRAM, MiB.")
    pci_bus_id: str | None = Field(default=None, alias="pciBusId")
    pci_device_id: str | None = Field(default=None, alias="pciDeviceId")
    architecture: str | None = None
    compute_capability: str | None = Field(
        default=None, alias="computeCapability", pattern=r"^\d+\.\d+$"
    )
    memory_bandwidth_gbps: float | None = Field(
        default=None, alias="memoryBandwidthGBps", ge=0, description="Peak, decimal GB/s."
    )
    cuda_cores: int | None = Field(default=None, alias="cudaCores", ge=0)
    multiprocessors: int | None = Field(default=None, ge=0)
    ecc_enabled: bool | None = Field(default=None, alias="eccEnabled")
    power_limit_w: float | None = Field(default=None, alias="powerLimitW", ge=0)
    temperature_c: int | None = Field(
        default=None, alias="temperatureC", ge=0,
        description="The GPU's core temperature in degrees Celsius when the inventory was observed "
        "(observedAt): NVML's nvmlDeviceGetTemperature(device, NVML_TEMPERATURE_GPU, &temp) (nvml.h; "
        "NVML_TEMPERATURE_GPU = 0 in nvmlTemperatureSensors_t), what nvidia-smi -q shows as 'GPU Current "
        "Temp' and --query-gpu=temperature.gpu. Absent: unknown (the GPU or driver does not report it, the "
        "read failed, or an AMD GPU, whose temperature the agent does not read); never 0 for unknown. A MIG "
        "device has none of its own: its GPU's applies. A change of temperature alone does not make the "
        "agent patch the Node; it goes out with the next heartbeat or other change (added after the first "
        "version of the schema).")
    numa_node: int | None = Field(default=None, alias="numaNode")
    healthy: bool = True
    health_reasons: list[str] = Field(
        default_factory=list,
        alias="healthReasons",
        description="Why the agent marked the GPU unhealthy (added after the first version of the schema).",
    )
    compute_partition: str | None = Field(
        default=None, alias="computePartition",
        description="AMD Instinct compute partition mode the GPU is in (SPX, DPX, QPX, CPX; amd-smi static "
        "PARTITION); each partition is reported as a GPU of its own. Absent: none or not an AMD GPU.")
    memory_partition: str | None = Field(
        default=None, alias="memoryPartition",
        description="AMD Instinct memory partition (NUMA-per-socket) mode: NPS1, NPS4... Absent: none or not AMD.")
    mig_enabled: bool = Field(default=False, alias="migEnabled")
    mig_devices: list[MigDevice] = Field(default_factory=list, alias="migDevices")
    nvlinks: list[NVLinkPeer] = Field(default_factory=list)
    allocated_to: str = Field(default="", alias="allocatedTo")

    @property
    def compute_capability_tuple(self) -> tuple[int, int] | None:
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


class NodeGPUInventory(_Model):
    """Everything the scheduler needs to know about one node's GPUs."""

    api_version: Literal["gpuplace.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["NodeGPUInventory"]
    node_name: str = Field(alias="nodeName", min_length=1)
    observed_at: dt.datetime = Field(alias="observedAt", description="RFC 3339, when the probe ran.")
    driver_version: str | None = Field(default=None, alias="driverVersion")
    cuda_driver_version: str | None = Field(default=None, alias="cudaDriverVersion")
    mig_strategy: Literal["none", "single", "mixed"] | None = Field(
        default=None, alias="migStrategy",
        description="How the NVIDIA device plugin exposes MIG devices (none, single, mixed). Absent: not "
        "stated by the agent; the extender reads it from the Node (GPU feature discovery's "
        "nvidia.com/mig.strategy label, else the MIG resources in status.allocatable).")
    gpus: list[GPU]

    @field_validator("observed_at")
    @classmethod
    def _needs_timezone(cls, value: dt.datetime) -> dt.datetime:
        if value.tzinfo is None:
            raise ValueError("observedAt needs a timezone, e.g. '2026-11-21T08:00:00Z'")
        return value

    @field_validator("gpus")
    @classmethod
    def _unique_uuids(cls, gpus: list[GPU]) -> list[GPU]:
        seen: set[str] = set()
        for gpu in gpus:
            for uuid in [gpu.uuid, *(m.uuid for m in gpu.mig_devices)]:
                if uuid in seen:
                    raise ValueError(f"UUID {uuid} appears twice")
                seen.add(uuid)
        return gpus

    def to_json(self) -> str:
        """Compact JSON, as stored in the Node annotation."""
        return self.model_dump_json(by_alias=True, exclude_none=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class InventoryError(ValueError):
    """An inventory document that is not a valid NodeGPUInventory; the message names the field."""


def format_validation_error(err: ValidationError, max_errors: int | None = 5) -> str:
    """'field.path: message; ...' for each error of a pydantic ValidationError.

    Cross-field errors (raised by model validators) have no location and carry their own path in
    the message; pydantic's "Value error, " prefix is dropped. At most ``max_errors`` are listed.
    """
    errors = err.errors()
    parts = []
    for e in errors[:max_errors]:
        path = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{path}: {msg}" if path else msg)
    if max_errors is not None and len(errors) > max_errors:
        parts.append(f"... and {len(errors) - max_errors} more")
    return "; ".join(parts)


class NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases (``*name``): an alias repeats a subtree without repeating its bytes, so
    a 12 KB document of nested aliases stands for millions of GPUs that validation would walk one
    by one (measured: 42 s). Inventories are generated, never in need of anchors; the policy loader
    refuses them too (a 245 KB policy of aliases expanded to 27 million entries). The first alias
    raises ``yaml.composer.ComposerError`` at its mark, before any of it is expanded."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not accepted", mark)
        return super().compose_node(parent, index)


def decode_inventory_text(text: str | bytes, *, source: str = "inventory") -> dict[str, Any]:
    """Decode JSON (or YAML) text into a mapping, without validating it.

    Raises:
        InventoryError: larger than ``MAX_ANNOTATION_BYTES``, neither JSON nor YAML, nested
            deeper than the parsers' recursion limit, or not a mapping.
    """
    size = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else len(text)  # bytes, not characters
    if size > MAX_ANNOTATION_BYTES:
        raise InventoryError(f"{source}: {size} bytes is larger than the {MAX_ANNOTATION_BYTES} accepted")
    try:
        try:
            decoded = json.loads(text)
        except ValueError:
            try:
                decoded = yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader
            except yaml.YAMLError as e:
                raise InventoryError(f"{source}: neither JSON nor YAML ({' '.join(str(e).split())})") from e
    except RecursionError as e:  # '[[[[...': both parsers recurse per level
        raise InventoryError(f"{source}: nested too deeply to be a NodeGPUInventory") from e
    if not isinstance(decoded, dict):
        raise InventoryError(f"{source}: expected a mapping with apiVersion: {API_VERSION}")
    return decoded


def parse_inventory(data: str | bytes | dict[str, Any], *, source: str = "inventory") -> NodeGPUInventory:
    """Parse and validate a NodeGPUInventory from JSON/YAML text or an already decoded dict.

    Raises:
        InventoryError: the text is not JSON/YAML, is larger than ``MAX_ANNOTATION_BYTES``, or
            does not match the contract; the message starts with ``source`` and names the field.
    """
    decoded = decode_inventory_text(data, source=source) if isinstance(data, (str, bytes)) else data
    if not isinstance(decoded, dict):
        raise InventoryError(f"{source}: expected a mapping with apiVersion: {API_VERSION}")
    try:
        return NodeGPUInventory.model_validate(decoded)
    except ValidationError as e:
        raise InventoryError(f"{source}: {format_validation_error(e)}") from e


def json_schema() -> dict[str, Any]:
    """JSON Schema of the NodeGPUInventory document (keys by alias, as in the annotation)."""
    return NodeGPUInventory.model_json_schema(by_alias=True)
