"""Input adapters: fleets and workloads from published traces, inventory files and our YAML format.

Alibaba ``openb`` (cluster-trace-gpu-v2023; Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23):

- node list ``sn,cpu_milli,memory_mib,gpu,model``: one ``SimNode`` per row with GPUs; ``model``
  maps to a catalog row (``V100M16`` -> V100 16 GB, ``V100M32`` -> V100 32 GB, ``P100``, ``T4``,
  ``A10``; the undisclosed ``G2``/``G3`` to the stand-ins of ``model.STAND_INS``). Nodes without
  GPUs are left out: the simulator places GPU pods only.
- pod list ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...``:
  * ``gpu_spec`` (``V100M16|V100M32``) becomes the allowed models: ``gpuplace.io/gpu-models`` for
    gpuplace, a node-affinity on the GPU model for the baselines;
  * ``gpu_milli`` becomes ``SimPod.gpu_milli``: a GPU-sharing pod (``gpu_milli`` < 1000, always
    ``num_gpu`` = 1 in the trace) takes that share of one GPU, and other sharing pods may share the
    rest of it, as in FGD's simulator (its ``gpu-milli`` annotation, written by the authors'
    ``data/pod_csv_to_yaml.py``: values outside 1-1000 are clamped, none occurs in openb). Every
    policy places them under the same share model (``cluster.Cluster``); the report counts them
    separately (``sharing``);
  * pods with ``num_gpu`` = 0 are CPU-only: kept with ``cpu_only`` (``gpuplace simulate`` keeps
    them, as FGD does: they arrive with no GPU demand and take CPU and memory), else skipped;
  * duration = ``deletion_time`` - (``scheduled_time`` or, for pods never scheduled,
    ``creation_time``), at least 1 s.

Alibaba spot fleet (cluster-trace-v2026-spot-gpu ``node_info_df.csv``:
``gpu_model,gpu_capacity_num,cpu_num,node_name``): one node per row, CPU = ``cpu_num`` cores;
memory is not given (not modelled). 8-GPU nodes of SXM models are NVLink (NVSwitch) systems.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterable

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node_agent.inventory import InventoryError, format_validation_error, parse_inventory
from scheduler_extender.core.catalog import Catalog, UnknownModelError
from scheduler_extender.simulator.model import SimNode, SimPod, make_inventory, models_annotation, resolve_model

OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
SPOT_NODE_COLUMNS = ("gpu_model", "gpu_capacity_num", "cpu_num", "node_name")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the row and the column."""


def _rows(path: str | Path, required: Iterable[str]) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; header is {reader.fieldnames}")
            return list(reader)
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from e


def _int(row: dict[str, str], col: str, path: str | Path, line: int) -> int:
    try:
        return int(float(row[col]))
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{line}: column {col}: {row.get(col)!r} is not a number") from None


def csv_kind(path: str | Path) -> str:
    """``openb-nodes``, ``spot-nodes`` or ``openb-pods`` from a CSV header."""
    with open(path, encoding="utf-8") as f:
        header = f.readline().strip().split(",")
    if all(c in header for c in OPENB_NODE_COLUMNS):
        return "openb-nodes"
    if all(c in header for c in SPOT_NODE_COLUMNS):
        return "spot-nodes"
    if all(c in header for c in OPENB_POD_COLUMNS):
        return "openb-pods"
    raise TraceError(f"{path}: not an openb node list ({','.join(OPENB_NODE_COLUMNS)}), spot node list "
                     f"({','.join(SPOT_NODE_COLUMNS)}) or openb pod list")


def _node(name: str, model: str, count: int, catalog: Catalog, *, cpu: int | None, mem: int | None,
          nvlink: bool) -> SimNode:
    entry = resolve_model(model, catalog)
    template = f"{entry.id}x{count}{'-nvlink' if nvlink else ''}"
    return SimNode(name=name, inventory=make_inventory(name, entry, count, nvlink=nvlink),
                   cpu_milli=cpu, memory_mib=mem, template=template)


def openb_nodes(path: str | Path, catalog: Catalog) -> list[SimNode]:
    """GPU nodes of an openb node list (rows with ``gpu`` = 0 are left out)."""
    nodes: list[SimNode] = []
    for i, row in enumerate(_rows(path, OPENB_NODE_COLUMNS), start=2):
        count = _int(row, "gpu", path, i)
        if count == 0:
            continue
        try:
            nodes.append(_node(row["sn"], row["model"], count, catalog, cpu=_int(row, "cpu_milli", path, i),
                               mem=_int(row, "memory_mib", path, i), nvlink=False))
        except ValueError as e:
            raise TraceError(f"{path}:{i}: column model: {e}") from None
    return nodes


def spot_nodes(path: str | Path, catalog: Catalog) -> list[SimNode]:
    """The Alibaba spot fleet: one node per row of ``node_info_df.csv``."""
    nodes: list[SimNode] = []
    for i, row in enumerate(_rows(path, SPOT_NODE_COLUMNS), start=2):
        count = _int(row, "gpu_capacity_num", path, i)
        if count == 0:
            continue
        model = row["gpu_model"]
        nvlink = count == 8 and ("SXM" in model.upper() or model.startswith("H800"))
        try:
            nodes.append(_node(f"spot-node-{row['node_name']}", model, count, catalog,
                               cpu=_int(row, "cpu_num", path, i) * 1000, mem=None, nvlink=nvlink))
        except ValueError as e:
            raise TraceError(f"{path}:{i}: column gpu_model: {e}") from None
    return nodes


def inventory_dir_nodes(directory: str | Path) -> list[SimNode]:
    """One node per NodeGPUInventory file (``.json``/``.yaml``); CPU and memory are not modelled.

    Raises:
        TraceError: not a directory, or a file fails validation (the simulator never skips one).
    """
    d = Path(directory)
    if not d.is_dir():
        raise TraceError(f"{d}: not a directory of NodeGPUInventory files")
    nodes = []
    for path in sorted(p for p in d.iterdir() if p.suffix in (".json", ".yaml", ".yml")):
        try:
            inv = parse_inventory(path.read_text(encoding="utf-8"), source=str(path))
        except (InventoryError, OSError) as e:
            raise TraceError(str(e)) from e
        nodes.append(SimNode(name=inv.node_name, inventory=inv, template=f"file:{inv.node_name}"))
    if not nodes:
        raise TraceError(f"{d}: no .json/.yaml inventory files")
    return nodes


def resource_slice_nodes(path: str | Path, catalog: Catalog) -> list[SimNode]:
    """One node per node named by the ResourceSlices of a YAML/JSON file (``kubectl get
    resourceslices -o yaml``; ResourceClaims in it mark their devices held), read as the extender
    reads them (``core.dra_slices``); CPU and memory are not modelled.

    Raises:
        TraceError: the file is not YAML, or holds no ResourceSlice of a mapped driver.
    """
    from node_agent.inventory import NoAliasLoader
    from scheduler_extender.core.dra_slices import inventories_from_slices, split_objects
    try:
        docs = list(yaml.load_all(Path(path).read_text(encoding="utf-8"), Loader=NoAliasLoader))
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:  # ValueError: an int of 5,000 digits
        raise TraceError(f"{path}: {e}") from None
    objects = split_objects(docs)
    inventories = inventories_from_slices(objects.get("ResourceSlice", []), objects.get("ResourceClaim", []), catalog)
    nodes = [SimNode(name=n, inventory=si.inventory, template=f"slices:{n}")
             for n, si in sorted(inventories.items()) if si.inventory.gpus]
    if not nodes:
        notes = "; ".join(n for si in inventories.values() for n in si.notes[:3])
        raise TraceError(f"{path}: no GPU in its ResourceSlices" + (f" ({notes})" if notes else ""))
    return nodes


def load_fleet(spec: str, catalog: Catalog) -> list[SimNode]:
    """A fleet from a CSV node list (openb or spot), a directory of inventories, a YAML/JSON file of
    ResourceSlices (``resource_slice_nodes``), or ``mixed``."""
    from scheduler_extender.simulator.workload import mixed_fleet
    if spec == "mixed":
        return mixed_fleet(catalog)
    p = Path(spec)
    if p.is_dir():
        return inventory_dir_nodes(p)
    if not p.exists():
        raise TraceError(f"--fleet {spec}: no such file or directory (use a node list CSV, a directory of "
                         "NodeGPUInventory files, or 'mixed')")
    if p.suffix in (".yaml", ".yml", ".json"):
        return resource_slice_nodes(p, catalog)
    kind = csv_kind(p)
    if kind == "openb-nodes":
        return openb_nodes(p, catalog)
    if kind == "spot-nodes":
        return spot_nodes(p, catalog)
    raise TraceError(f"--fleet {spec}: this is a pod list, not a node list")


def _spec_models(spec: str, catalog: Catalog) -> frozenset[str] | None:
    tokens = [t for t in spec.split("|") if t.strip()]
    if not tokens:
        return None
    return frozenset(resolve_model(t.strip(), catalog).id for t in tokens)


def openb_pods(path: str | Path, catalog: Catalog, *, cpu_only: bool = False) -> tuple[list[SimPod], int]:
    """Pods of an openb pod list in trace order, and how many CPU-only pods were skipped.

    ``cpu_only``: keep the CPU-only pods (``gpus`` = 0, ``gpu_milli`` = 0, no model constraint),
    as FGD's simulator does: they arrive with no GPU demand and take CPU and memory on the GPU
    nodes (its node list has only those), so they weigh on where GPU pods fit.
    """
    pods: list[SimPod] = []
    skipped = 0
    for i, row in enumerate(_rows(path, OPENB_POD_COLUMNS), start=2):
        num_gpu = _int(row, "num_gpu", path, i)
        if num_gpu == 0 and not cpu_only:
            skipped += 1
            continue
        milli = min(1000, max(0, _int(row, "gpu_milli", path, i))) if num_gpu else 0
        try:
            allowed = _spec_models(row.get("gpu_spec") or "", catalog) if num_gpu else None
        except ValueError as e:
            raise TraceError(f"{path}:{i}: column gpu_spec: {e}") from None
        created = float(row.get("creation_time") or 0)
        started = float(row.get("scheduled_time") or created)
        deleted = float(row.get("deletion_time") or started + 1)
        pods.append(SimPod(
            name=row["name"], gpus=num_gpu, annotations=models_annotation(allowed), allowed_models=allowed,
            cpu_milli=_int(row, "cpu_milli", path, i), memory_mib=_int(row, "memory_mib", path, i),
            creation_s=created, duration_s=max(1.0, deleted - started), gpu_milli=milli,
        ))
    return pods, skipped


# ---- the project's YAML workload format ---------------------------------------------------------

class WorkloadPod(BaseModel):
    """One entry of a YAML workload: ``count`` identical pods."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    name: str = Field(min_length=1)
    count: int = Field(default=1, ge=1, le=100_000)
    gpus: int = Field(default=1, ge=1, le=64, description="nvidia.com/gpu per pod")
    annotations: dict[str, str] = Field(default_factory=dict, description="gpuplace.io/* annotations")
    node_selector_models: list[str] | None = Field(
        default=None, alias="nodeSelectorModels",
        description="GPU models a hand-written nodeSelector allows (used by the baselines and, as "
                    "gpuplace.io/gpu-models when that annotation is absent, by gpuplace)")
    cpu_milli: int | None = Field(default=None, alias="cpuMilli", ge=0)
    memory_mib: int | None = Field(default=None, alias="memoryMiB", ge=0)
    arrival_seconds: float = Field(default=0, alias="arrivalSeconds", ge=0)
    interval_seconds: float = Field(default=0, alias="intervalSeconds", ge=0, description="between replicas")
    duration_seconds: float = Field(default=3600, alias="durationSeconds", gt=0)


class Workload(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: str = Field(default="gpuplace.io/v1alpha1", alias="apiVersion")
    kind: str = Field(default="Workload", pattern="^Workload$")
    pods: list[WorkloadPod] = Field(min_length=1)


def yaml_pods(path: str | Path, catalog: Catalog) -> list[SimPod]:
    """Pods of a ``kind: Workload`` YAML file (see ``examples/workload.yaml``), by arrival time.

    Raises:
        TraceError: unreadable file or a field that fails validation (named by its path).
    """
    from scheduler_extender.core.requirements import A_MODELS, A_PARAMS, A_WORKLOAD, parse_params
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        wl = Workload.model_validate(raw)
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise TraceError(f"{path}: not valid YAML: {e}") from e
    except ValidationError as e:
        raise TraceError(f"{path}: {format_validation_error(e)}") from e
    pods: list[SimPod] = []
    for pi, p in enumerate(wl.pods):
        allowed = None
        if p.node_selector_models:
            try:
                allowed = frozenset().union(*(catalog.resolve_token(t) for t in p.node_selector_models))
            except UnknownModelError as e:
                raise TraceError(f"{path}: pods.{pi}.nodeSelectorModels: {e} is no catalog id or alias") from None
        ann = dict(p.annotations)
        if allowed and A_MODELS not in ann:
            ann.update(models_annotation(allowed))
        try:
            params = parse_params(ann[A_PARAMS]) if A_PARAMS in ann else None
        except ValueError:
            params = None  # the engine reports the annotation error on every node
        for r in range(p.count):
            pods.append(SimPod(
                name=f"{p.name}-{r}" if p.count > 1 else p.name, gpus=p.gpus, annotations=ann,
                allowed_models=allowed, cpu_milli=p.cpu_milli, memory_mib=p.memory_mib,
                creation_s=p.arrival_seconds + r * p.interval_seconds, duration_s=p.duration_seconds,
                params=params, workload=ann.get(A_WORKLOAD),
            ))
    pods.sort(key=lambda x: x.creation_s)
    return pods
