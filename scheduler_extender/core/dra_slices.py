"""ResourceSlices as an inventory: the GPUs a Dynamic Resource Allocation driver publishes, read
into the ``NodeGPUInventory`` the node agent publishes, so that the same filter and score decide.

Kubernetes' DRA (``resource.k8s.io/v1``, GA in 1.34) has each driver publish its devices in
ResourceSlices, one pool per node; a device has attributes (string, int, bool, version) and
capacities (quantities). Which attribute is the product name, the compute capability or the MIG
profile is the driver's choice: ``DriverMapping`` says it per driver, from
``data/dra-drivers.yaml`` (NVIDIA's driver ``gpu.nvidia.com`` and Kubernetes' test driver, with
sources) and the operator's ``--dra-drivers`` file.

Mapping, per node (``inventories_from_slices``):

* a device of the mapping's GPU type is a ``GPU``: ``name`` the product name, ``memoryMiB`` the
  memory capacity, ``computeCapability`` from the version attribute (``8.0.0`` -> ``8.0``), its
  index from the device name (``gpu-3`` -> 3, NVIDIA's ``CanonicalName``) else its place in the pool;
* a device of the MIG type is a ``MigDevice`` of the GPU whose uuid its parent attribute names; a
  MIG-enabled GPU is not published as a device of its own by NVIDIA's driver, so it is made from
  its MIG devices (memory from the catalog row of its product name, else their sum);
* a device allocated by a ResourceClaim (``status.allocation.devices.results``) is held
  (``allocatedTo``) by the pod the claim is reserved for (``status.reservedFor``), else by the
  claim's owning pod, else by ``namespace/claim-name``;
* what the slices do not say stays unknown (``None``): ECC, NVLink, bandwidth, temperature.

Devices that cannot be read (a driver without a mapping, no product name, no memory) are left
out and named in ``SliceInventory.notes``; a slice that is not one node's (``allNodes``, a node
selector: network-attached devices) likewise. Of a pool, only the slices of its newest
generation count, as the allocator reads them.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, model_validator

from node_agent.inventory import API_VERSION, GPU, KIND, NodeGPUInventory, format_validation_error
from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.quantity import MIB, QuantityError, parse_quantity

RESOURCE_API = "resource.k8s.io/v1"
DeviceKind = Literal["gpu", "mig"]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class DriverMapping(_Shape):
    """Which attributes and capacity of one DRA driver's devices gpuplace reads (one row of
    ``data/dra-drivers.yaml``). A name without a domain is in the driver's own domain."""

    driver: StrictStr = Field(min_length=1, max_length=63)
    vendor: Literal["nvidia", "amd"] = "nvidia"
    sources: list[StrictStr] = Field(min_length=1)
    type_attribute: StrictStr | None = Field(default=None, alias="typeAttribute")
    gpu_type: StrictStr | None = Field(default=None, alias="gpuType")
    mig_type: StrictStr | None = Field(default=None, alias="migType")
    product_name_attribute: StrictStr = Field(alias="productNameAttribute")
    uuid_attribute: StrictStr | None = Field(default=None, alias="uuidAttribute")
    parent_uuid_attribute: StrictStr | None = Field(default=None, alias="parentUuidAttribute")
    mig_profile_attribute: StrictStr | None = Field(default=None, alias="migProfileAttribute")
    compute_capability_attribute: StrictStr | None = Field(default=None, alias="computeCapabilityAttribute")
    architecture_attribute: StrictStr | None = Field(default=None, alias="architectureAttribute")
    pci_bus_id_attribute: StrictStr | None = Field(default=None, alias="pciBusIdAttribute")
    driver_version_attribute: StrictStr | None = Field(default=None, alias="driverVersionAttribute")
    memory_capacity: StrictStr = Field(alias="memoryCapacity")
    device_classes: dict[Literal["gpu", "mig"], StrictStr] = Field(default_factory=dict, alias="deviceClasses")
    """The DeviceClass that selects this driver's devices of each kind (what a claim names)."""

    @model_validator(mode="after")
    def _consistent(self) -> "DriverMapping":
        if self.type_attribute is not None and not self.gpu_type:
            raise ValueError(f"driver {self.driver}: typeAttribute needs gpuType (the value of a whole GPU)")
        if "gpu" not in self.device_classes:
            raise ValueError(f"driver {self.driver}: deviceClasses needs gpu: the DeviceClass a claim names for "
                             "its GPUs")
        if "mig" in self.device_classes and not self.mig_type:
            raise ValueError(f"driver {self.driver}: deviceClasses.mig needs migType")
        return self

    def qualified(self, name: str) -> str:
        """``name`` as a fully qualified attribute or capacity name (``gpu.nvidia.com/productName``)."""
        return name if "/" in name else f"{self.driver}/{name}"


class DriverTable(_Shape):
    drivers: list[DriverMapping]


class DriverTableError(ValueError):
    """A ``--dra-drivers`` file that is not a driver table; the message names the field."""


def parse_driver_table(text: str, source: str) -> dict[str, DriverMapping]:
    """Driver name -> mapping, from YAML text of ``data/dra-drivers.yaml``'s form.

    Raises:
        DriverTableError: not YAML, not of that form (the field named), or a driver listed twice.
    """
    try:
        doc = yaml.safe_load(text)
        table = DriverTable.model_validate(doc)
    except yaml.YAMLError as e:
        raise DriverTableError(f"{source}: not YAML: {e}") from None
    except ValidationError as e:
        raise DriverTableError(f"{source}: {format_validation_error(e)}") from None
    out: dict[str, DriverMapping] = {}
    for m in table.drivers:
        if m.driver in out:
            raise DriverTableError(f"{source}: driver {m.driver} is listed twice")
        out[m.driver] = m
    _unique_classes(out, source)
    return out


def _unique_classes(drivers: Mapping[str, DriverMapping], source: str) -> None:
    """Raises DriverTableError when one DeviceClass is named for two drivers (a claim names a class:
    it must say whose devices it asks for)."""
    seen: dict[str, str] = {}
    for m in drivers.values():
        for cls in m.device_classes.values():
            if seen.setdefault(cls, m.driver) != m.driver:
                raise DriverTableError(f"{source}: DeviceClass {cls} is named for drivers {seen[cls]} and {m.driver}")


@lru_cache(maxsize=1)
def default_drivers() -> Mapping[str, DriverMapping]:
    """The built-in table (``data/dra-drivers.yaml``)."""
    text = resources.files("scheduler_extender").joinpath("data/dra-drivers.yaml").read_text()
    return parse_driver_table(text, "data/dra-drivers.yaml")


def drivers_with_file(path: str | None) -> dict[str, DriverMapping]:
    """The shipped mappings with those of the file at ``path`` added (a driver in both: the file's).

    Raises:
        DriverTableError: the file cannot be read or is not a driver table (the field named).
    """
    drivers = dict(default_drivers())
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DriverTableError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
        drivers.update(parse_driver_table(text, path))
        _unique_classes(drivers, f"{path} with the shipped drivers")
    return drivers


# ---- the parts of ResourceSlice and ResourceClaim read here ------------------------------------


class Attribute(_Shape):
    """``DeviceAttribute``: exactly one of the four is set."""

    int_value: StrictInt | None = Field(default=None, alias="int")
    bool_value: StrictBool | None = Field(default=None, alias="bool")
    string: StrictStr | None = None
    version: StrictStr | None = None


class Capacity(_Shape):
    value: StrictStr | StrictInt


class Device(_Shape):
    name: StrictStr
    attributes: dict[str, Attribute] = Field(default_factory=dict)
    capacity: dict[str, Capacity] = Field(default_factory=dict)


class _BasicDevice(_Shape):
    """v1beta1's ``Device`` wrapped its fields in ``basic``."""

    name: StrictStr
    basic: Device | None = None


class Pool(_Shape):
    name: StrictStr
    generation: StrictInt = 0
    resource_slice_count: StrictInt = Field(default=1, alias="resourceSliceCount")


class SliceSpec(_Shape):
    driver: StrictStr
    pool: Pool
    node_name: StrictStr | None = Field(default=None, alias="nodeName")
    all_nodes: StrictBool | None = Field(default=None, alias="allNodes")
    devices: list[dict[str, Any]] = Field(default_factory=list)


class _Meta(_Shape):
    name: StrictStr | None = None
    namespace: StrictStr | None = None
    uid: StrictStr | None = None
    annotations: dict[str, StrictStr] | None = None
    owner_references: list[dict[str, Any]] | None = Field(default=None, alias="ownerReferences")


class ResourceSlice(_Shape):
    metadata: _Meta = _Meta()
    spec: SliceSpec


def _device(obj: Mapping[str, Any]) -> Device:
    if isinstance(obj, Mapping) and isinstance(obj.get("basic"), Mapping):
        return Device.model_validate({"name": obj.get("name"), **obj["basic"]})
    return Device.model_validate(obj)


@dataclass(frozen=True)
class DeviceRef:
    """Where a device is published: what a claim's allocation result names."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class SliceInventory:
    """One node's GPUs read from its ResourceSlices.

    ``inventory`` is the agent's contract (``node_agent.inventory``); ``devices`` maps each GPU's
    and MIG device's uuid to its published name; ``notes`` says what was left out and why;
    ``drivers`` names the drivers read.
    """

    node: str
    inventory: NodeGPUInventory
    devices: Mapping[str, DeviceRef]
    drivers: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        """For messages: ``ResourceSlices of gpu.nvidia.com``."""
        return "ResourceSlices of " + ", ".join(self.drivers)


@dataclass
class _Read:
    """One node's devices while reading."""

    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)  # uuid -> GPU fields (aliases)
    migs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (parent uuid, MigDevice fields)
    devices: dict[str, DeviceRef] = field(default_factory=dict)
    drivers: set[str] = field(default_factory=set)
    driver_version: str | None = None
    notes: list[str] = field(default_factory=list)


_INDEX = re.compile(r"^gpu-([0-9]{1,4})$")
_VERSION = re.compile(r"^([0-9]{1,3})\.([0-9]{1,3})(?:\.[0-9]{1,9})?(?:[-+].*)?$")


def _attr(device: Device, mapping: DriverMapping, name: str | None) -> Attribute | None:
    if name is None:
        return None
    return device.attributes.get(name) or device.attributes.get(mapping.qualified(name))


def _text(device: Device, mapping: DriverMapping, name: str | None) -> str | None:
    a = _attr(device, mapping, name)
    if a is None:
        return None
    return a.string if a.string is not None else a.version


def _compute_capability(device: Device, mapping: DriverMapping) -> str | None:
    text = _text(device, mapping, mapping.compute_capability_attribute)
    m = _VERSION.match(text) if text else None
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def _memory_mib(device: Device, mapping: DriverMapping) -> int | None:
    cap = device.capacity.get(mapping.memory_capacity) or device.capacity.get(mapping.qualified(mapping.memory_capacity))
    if cap is None:
        return None
    try:
        value = parse_quantity(cap.value)
    except QuantityError:
        return None
    mib = int(value / Decimal(MIB))
    return mib if mib > 0 else None


def parse_slice(obj: Mapping[str, Any]) -> ResourceSlice:
    """A decoded ResourceSlice (v1, or v1beta1 with ``basic`` devices) as read here.

    Raises:
        ValueError: a field read here has the wrong type (the message names it).
    """
    try:
        return ResourceSlice.model_validate(obj)
    except ValidationError as e:
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj, Mapping) else None
        raise ValueError(f"ResourceSlice {name or '?'}: {format_validation_error(e)}") from None


def _read_slice(sl: ResourceSlice, mapping: DriverMapping, read: _Read, catalog: Catalog) -> None:
    spec = sl.spec
    read.drivers.add(spec.driver)
    for position, raw in enumerate(spec.devices):
        try:
            device = _device(raw)
        except ValidationError as e:
            read.notes.append(f"{spec.driver}/{spec.pool.name} device #{position}: {format_validation_error(e, 2)}")
            continue
        ref = DeviceRef(spec.driver, spec.pool.name, device.name)
        kind_text = _text(device, mapping, mapping.type_attribute)
        if mapping.type_attribute is not None and kind_text not in (mapping.gpu_type, mapping.mig_type):
            what = f"attribute {mapping.type_attribute} {kind_text!r}" if kind_text is not None else \
                f"no attribute {mapping.type_attribute}"
            read.notes.append(f"{ref}: {what}, not {mapping.gpu_type!r} or {mapping.mig_type!r}: not read as a GPU")
            continue
        kind: DeviceKind = "mig" if kind_text is not None and kind_text == mapping.mig_type else "gpu"
        product = _text(device, mapping, mapping.product_name_attribute)
        memory = _memory_mib(device, mapping)
        if not product or memory is None:
            missing = " and ".join(w for w, v in ((f"attribute {mapping.product_name_attribute}", product),
                                                   (f"capacity {mapping.memory_capacity}", memory)) if not v)
            read.notes.append(f"{ref}: no {missing}: left out")
            continue
        uuid = _text(device, mapping, mapping.uuid_attribute) or str(ref)
        version = _text(device, mapping, mapping.driver_version_attribute)
        if version and read.driver_version is None:
            read.driver_version = version
        cc = _compute_capability(device, mapping)
        arch = _text(device, mapping, mapping.architecture_attribute)
        if kind == "mig":
            parent = _text(device, mapping, mapping.parent_uuid_attribute)
            profile = _text(device, mapping, mapping.mig_profile_attribute)
            if not parent or not profile:
                read.notes.append(f"{ref}: a MIG device without {mapping.parent_uuid_attribute} or "
                                  f"{mapping.mig_profile_attribute}: left out")
                continue
            read.migs.append((parent, {"uuid": uuid, "profile": profile, "memoryMiB": memory}))
            if parent in read.gpus:
                # The whole GPU is published too (dynamic MIG's partitionable devices): read as MIG.
                read.gpus[parent]["migEnabled"] = True
            else:
                entry = catalog.resolve_driver_name(product)
                read.gpus[parent] = {"uuid": parent, "vendor": mapping.vendor, "name": product,
                                     "memoryMiB": entry.memory_mib if entry else 0, "architecture": arch,
                                     "computeCapability": cc, "migEnabled": True, "migDevices": [],
                                     "_order": (len(read.gpus), None)}
            read.devices[uuid] = ref
            continue
        m = _INDEX.match(device.name)
        gpu = read.gpus.setdefault(uuid, {"migEnabled": False, "_order": (len(read.gpus), None)})
        gpu.update({"uuid": uuid, "vendor": mapping.vendor, "name": product, "memoryMiB": memory,
                    "architecture": arch, "computeCapability": cc,
                    "pciBusId": _text(device, mapping, mapping.pci_bus_id_attribute),
                    "_order": (gpu["_order"][0], int(m.group(1)) if m else None)})
        read.devices[uuid] = ref


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def claim_holders(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], str]:
    """(driver, pool, device) -> 'namespace/pod' for every device a claim has allocated (module
    docstring: the pod it is reserved for, else its owning pod, else ``namespace/claim-name``)."""
    out: dict[tuple[str, str, str], str] = {}
    for claim in claims:
        if not isinstance(claim, Mapping):
            continue
        meta, status = _mapping(claim.get("metadata")), _mapping(claim.get("status"))
        results = _mapping(_mapping(status.get("allocation")).get("devices")).get("results")
        if not isinstance(results, list) or not results:
            continue
        ns = meta.get("namespace") or "default"
        holder = next((f"{ns}/{r.get('name')}" for r in status.get("reservedFor") or []
                       if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("name")), None)
        holder = holder or next((f"{ns}/{o.get('name')}" for o in meta.get("ownerReferences") or []
                                 if isinstance(o, Mapping) and o.get("kind") == "Pod" and o.get("name")), None)
        holder = holder or f"{ns}/{meta.get('name') or '?'}"
        for r in results:
            # An adminAccess result (a monitoring claim) does not take the device from others.
            if isinstance(r, Mapping) and not r.get("adminAccess"):
                out[(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))] = holder
    return out


def inventories_from_slices(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
                            catalog: Catalog, drivers: Mapping[str, DriverMapping] | None = None,
                            observed_at: dt.datetime | None = None,
                            holders: Mapping[tuple[str, str, str], str] | None = None) -> dict[str, SliceInventory]:
    """Node name -> its GPUs from the ResourceSlices of mapped drivers (module docstring).

    Args:
        slices: decoded ResourceSlices (v1; v1beta1's ``basic`` devices are read too).
        claims: decoded ResourceClaims; the allocated ones mark devices held.
        catalog: for a MIG-enabled GPU's memory (its product name's row).
        drivers: driver name -> mapping; None: ``default_drivers()``.
        observed_at: the inventories' ``observedAt`` (default: now, UTC): slices are current
            while the driver runs, so they never go stale as an agent's annotation does.
        holders: ``claim_holders`` of the claims, when the caller keeps it (``claims`` unread).

    Never raises for bad content: a slice that cannot be read is a note on its node (or left
    out when it names no node).
    """
    drivers = default_drivers() if drivers is None else drivers
    observed_at = observed_at or dt.datetime.now(dt.timezone.utc)
    parsed: list[ResourceSlice] = []
    notes_by_node: dict[str, list[str]] = {}
    for obj in slices:
        try:
            sl = parse_slice(obj)
        except ValueError as e:
            node = (obj.get("spec") or {}).get("nodeName") if isinstance(obj, Mapping) else None
            if isinstance(node, str) and node:
                notes_by_node.setdefault(node, []).append(str(e))
            continue
        parsed.append(sl)
    newest: dict[tuple[str, str], int] = {}
    for sl in parsed:
        key = (sl.spec.driver, sl.spec.pool.name)
        newest[key] = max(newest.get(key, sl.spec.pool.generation), sl.spec.pool.generation)
    reads: dict[str, _Read] = {}
    for sl in sorted(parsed, key=lambda s: (s.spec.driver, s.spec.pool.name, s.metadata.name or "")):
        spec = sl.spec
        if spec.pool.generation < newest[(spec.driver, spec.pool.name)]:
            continue  # an older generation the driver is replacing
        if not spec.node_name:
            continue  # not one node's devices (allNodes, nodeSelector): nothing here places them
        mapping = drivers.get(spec.driver)
        read = reads.setdefault(spec.node_name, _Read())
        if mapping is None:
            read.notes.append(f"driver {spec.driver} is not mapped (its {len(spec.devices)} devices are not read; "
                              "add it with --dra-drivers)")
            continue
        try:
            _read_slice(sl, mapping, read, catalog)
        except (ValueError, TypeError, KeyError, AttributeError) as e:  # what a slice's content can raise
            read.notes.append(f"ResourceSlice {sl.metadata.name or '?'}: not read: {type(e).__name__}: {e}")
    for node in notes_by_node:
        reads.setdefault(node, _Read())  # a node whose slices could not be read: its notes say why
    held = claim_holders(claims) if holders is None else holders
    out: dict[str, SliceInventory] = {}
    for node, read in sorted(reads.items()):
        for parent, mig in read.migs:
            read.gpus[parent].setdefault("migDevices", []).append(mig)
        gpus = sorted(read.gpus.values(), key=lambda g: g["_order"][0])
        named = {g["uuid"]: g["_order"][1] for g in gpus if g["_order"][1] is not None}
        used = set(named.values())
        free_index = (i for i in range(len(gpus) + len(used) + 1) if i not in used)
        gpu_objs: list[GPU] = []
        for g in gpus:
            del g["_order"]
            ref = read.devices.get(g["uuid"])
            index = named[g["uuid"]] if g["uuid"] in named else next(free_index)
            if g.get("migEnabled") and not g["memoryMiB"]:
                g["memoryMiB"] = sum(d["memoryMiB"] for d in g["migDevices"])
            g["allocatedTo"] = held.get(_key(ref), "") if ref is not None else ""
            for d in g.get("migDevices", ()):
                d["allocatedTo"] = held.get(_key(read.devices.get(d["uuid"])), "")
            try:
                gpu_objs.append(GPU.model_validate({k: v for k, v in g.items() if v is not None} | {"index": index}))
            except ValidationError as e:
                read.notes.append(f"{ref or g.get('uuid')}: {format_validation_error(e, 2)}: left out")
        try:
            inv = NodeGPUInventory.model_validate({
                "apiVersion": API_VERSION, "kind": KIND, "nodeName": node, "observedAt": observed_at,
                "driverVersion": read.driver_version, "migStrategy": "mixed",
                "gpus": [g.model_dump(by_alias=True, exclude_none=True) for g in gpu_objs]})
        except ValidationError as e:  # two devices with one uuid
            read.notes.append(f"not read: {format_validation_error(e, 2)}")
            inv = NodeGPUInventory.model_validate({"apiVersion": API_VERSION, "kind": KIND, "nodeName": node,
                                                   "observedAt": observed_at, "gpus": []})
        out[node] = SliceInventory(node, inv, dict(read.devices), tuple(sorted(read.drivers)),
                                   tuple(notes_by_node.pop(node, []) + read.notes))
    return out


def _key(ref: DeviceRef | None) -> tuple[str, str, str]:
    return ("", "", "") if ref is None else (ref.driver, ref.pool, ref.device)


def split_objects(docs: Iterable[Any]) -> dict[str, list[dict[str, Any]]]:
    """Decoded YAML/JSON documents by ``kind`` (a ``kind: List`` and ``...List`` kinds flattened,
    as ``kubectl get resourceslices,resourceclaims -o yaml`` prints them); non-mappings are left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    stack = list(docs)[::-1]
    while stack:
        doc = stack.pop()
        if not isinstance(doc, dict):
            continue
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            item_kind = kind[:-4] or None
            for item in reversed(doc["items"]):
                if isinstance(item, dict) and item_kind and "kind" not in item:
                    item = {**item, "kind": item_kind}
                stack.append(item)
            continue
        out.setdefault(str(kind), []).append(doc)
    return out
