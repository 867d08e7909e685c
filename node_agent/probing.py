"""What the vendor probes share: their errors, PCI addresses, NUMA from sysfs, and how the contract's
GPU is assembled from what could be read (``node_agent.nvml`` for NVIDIA, ``node_agent.amd`` for AMD).

Neither pynvml nor amdsmi is imported here; a probe module imports this one, never the other way.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Literal

from node_agent.inventory import API_VERSION, GPU, KIND, NodeGPUInventory

MigStrategy = Literal["none", "single", "mixed"]
NumaLookup = Callable[[str], "int | None"]

PLACEHOLDER_MEMORY_MIB = 1
"""``memoryMiB`` of a GPU whose memory could not be read. The contract requires a value > 0; such a
GPU is always ``healthy: false`` with the reason, so no reader places work on it."""


class DriverUnavailable(RuntimeError):
    """A vendor's management library cannot be used on this machine (no driver, no library, no
    permission); the message says what to check. ``NVMLUnavailable`` and ``AMDSMIUnavailable``."""


class ProbeError(RuntimeError):
    """The probe as a whole failed (e.g. the GPU count could not be read); the last inventory stays."""


class LogOnce:
    """Logs a failed library call once per (function, reason), so a library lacking a function does
    not flood the log at every probe."""

    def __init__(self, logger: logging.Logger, library: str) -> None:
        self._logger = logger
        self._library = library
        self._lock = threading.Lock()
        self._logged: set[tuple[str, str]] = set()

    def __call__(self, fn: str, reason: str, level: int = logging.WARNING) -> None:
        with self._lock:
            if (fn, reason) in self._logged:
                return
            self._logged.add((fn, reason))
        self._logger.log(level, "%s %s failed: %s (value reported as unknown; logged once)", self._library, fn, reason)


def format_bus_id(domain: int, bus: int, device: int, function: int = 0) -> str:
    """The PCI address the way nvidia-smi prints it: ``00000000:07:00.0``."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def parse_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """``(domain, bus, device, function)`` of ``00000000:07:00.0`` or ``0000:07:00.0``; None if
    not a PCI address. NVML uses 8 domain digits, sysfs, lspci and amd-smi 4: compare parsed, never
    as text."""
    try:
        domain, bus, devfn = text.strip().split(":")
        dev, fn = devfn.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None


def sysfs_numa_node(bus_id: str, sysfs_root: str | Path = "/sys") -> int | None:
    """NUMA node of the CPU socket the GPU's PCI device hangs off, from
    ``/sys/bus/pci/devices/<addr>/numa_node``; what ``nvidia-smi topo -m`` shows as "NUMA
    Affinity". ``-1`` (firmware gave no affinity) is the machine's only NUMA node where it has
    one (``/sys/devices/system/node/online`` names a single node), as topo -m shows it: an H100
    passed through to a one-node Firecracker VM has ``numa_node`` -1 and "NUMA Affinity 0"
    (``tests/fixtures/nvml/h100-80gb-hbm3-real-2026-11-27.yaml``). With more nodes, -1 tells
    nothing: ``None``; any read failure is ``None``."""
    parsed = parse_bus_id(bus_id)
    if parsed is None:
        return None
    domain, bus, dev, fn = parsed
    path = Path(sysfs_root) / "bus/pci/devices" / f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}" / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else _only_numa_node(sysfs_root)


def _only_numa_node(sysfs_root: str | Path) -> int | None:
    """The machine's NUMA node when it has exactly one online (``online`` reads ``0``), else None
    (``0-1``, ``0,2``: several; unreadable: unknown)."""
    try:
        online = (Path(sysfs_root) / "devices/system/node/online").read_text().strip()
    except OSError:
        return None
    return int(online) if online.isdigit() else None


VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD"}


def build_gpu(fields: dict[str, Any], reasons: list[str]) -> GPU:
    """The contract's GPU from what a probe read (``fields`` by JSON key, None = unknown); required
    fields that could not be read become placeholders and the GPU is unhealthy with the reason, so
    the node's GPU count stays right."""
    f = {k: v for k, v in fields.items() if v is not None}
    reasons = list(reasons)
    index = f["index"]
    if not f.get("uuid"):
        f["uuid"] = f"GPU-unreadable-index-{index}"
        reasons.append("UUID could not be read")
    if not f.get("name"):
        f["name"] = f"unknown {VENDOR_NAMES.get(f.get('vendor', ''), '')} GPU".replace("  ", " ")
        reasons.append("name could not be read")
    if not f.get("memoryMiB"):
        f["memoryMiB"] = PLACEHOLDER_MEMORY_MIB
        reasons.append("memory size could not be read")
    # Keep reasons unique and in order: a problem seen twice is still one problem.
    reasons = list(dict.fromkeys(reasons))
    f["healthReasons"] = reasons
    f["healthy"] = not reasons
    return GPU.model_validate(f)


def unavailable_inventory(node_name: str, mig_strategy: MigStrategy | None, now: dt.datetime | None = None) -> NodeGPUInventory:
    """The inventory of a node whose driver is unusable, for ``--keep-running-without-driver``:
    zero GPUs, so the extender sees the node and places no GPU work on it."""
    return NodeGPUInventory.model_validate({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "nodeName": node_name,
        "observedAt": now or dt.datetime.now(dt.timezone.utc),
        "migStrategy": mig_strategy,
        "gpus": [],
    })


__all__ = [
    "DriverUnavailable",
    "LogOnce",
    "MigStrategy",
    "NumaLookup",
    "PLACEHOLDER_MEMORY_MIB",
    "ProbeError",
    "build_gpu",
    "format_bus_id",
    "parse_bus_id",
    "sysfs_numa_node",
    "unavailable_inventory",
]
