"""Read what each AMD GPU of this node really is, through AMD SMI. The only module that imports amdsmi.

AMD SMI is ROCm's management library (``libamd_smi.so``, what ``amd-smi`` shows); its Python
package ``amdsmi`` (``pip install 'gpuplace[amd]'``, or the copy ROCm installs under
``/opt/rocm/share/amd_smi``) wraps it with ctypes. Every call goes through one ``AMDSMISession``:
``amdsmi_init`` at the start of a probe and ``amdsmi_shut_down`` at its end, so the agent holds no
GPU between probes. Every other module asks ``AMDProbe`` for a ``NodeGPUInventory`` and never sees
amdsmi (``pyproject.toml``'s import-linter contract).

How the package is loaded (``load_amdsmi``): its ``amdsmi_wrapper.py`` opens ``libamd_smi.so``
and binds every one of the library's C functions when it is imported, so an import fails as a
whole when the library lacks a single one of them (an older ROCm than the package), and it prints
to stdout when the library is missing. The agent therefore executes the package's own files
under a private module name, giving the wrapper a ``ctypes`` whose ``CDLL`` hands back the library
it opened, wrapped so that a symbol the library lacks becomes a function answering
``AMDSMI_STATUS_FAIL_LOAD_SYMBOL``: what depends on it is reported unknown, as NVML's
FUNCTION_NOT_FOUND is; and the package's prints are captured. Tests hand a stand-in for the
library to the same loader (``gpuplace_testing.amdsmi_standin``), so they run the real package.
The package must be of the node's ROCm release: amdsmi.h renumbers enums between releases (ROCm
7.0 made ``AMDSMI_LINK_TYPE_XGMI`` 2, ROCm 6.4 had 1), which a mismatched pair gets wrong silently;
the library's version is logged at the first probe.

How a failure is read (as in ``node_agent.nvml``):

- ``AMDSMI_STATUS_NOT_SUPPORTED`` means "this GPU does not have the feature" and each getter says
  what that means for it (no RAS -> ECC off; no partitions -> none reported).
- Any other failure means "unknown": the value is ``None`` (never 0), logged once per (function,
  reason).
- A GPU whose UUID, name or memory cannot be read is still reported, unhealthy, with the reason.
- No package, no library, no driver: ``AMDSMIUnavailable`` with a sentence a node operator can act on.

Each getter's docstring names the unit and the ``amd-smi`` field that shows the same number.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import datetime as dt
import importlib.util
import io
import itertools
import logging
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from node_agent.inventory import API_VERSION, KIND, NodeGPUInventory, NVLinkPeer
from node_agent.probing import (
    DriverUnavailable, LogOnce, MigStrategy, NumaLookup, ProbeError, build_gpu, parse_bus_id, sysfs_numa_node,
)

log = logging.getLogger(__name__)

PACKAGE = "amdsmi"
STATUS_NOT_SUPPORTED = 2  # amdsmi.h amdsmi_status_t
STATUS_FAIL_LOAD_SYMBOL = 5
STATUS_NO_PERM = 10
STATUS_DRIVER_NOT_LOADED = 34
NOT_AVAILABLE = "N/A"  # what the package returns for a field the library marks unsupported (UINT_MAX)


class AMDSMIUnavailable(DriverUnavailable):
    """AMD SMI cannot be used on this machine (no package, no library, no driver, no permission);
    the message says what to check."""


# ---- loading the package -------------------------------------------------------------------------


class _AbsentSymbol:
    """A C function the library lacks, as the wrapper binds it: accepts ``restype``/``argtypes``
    and answers ``AMDSMI_STATUS_FAIL_LOAD_SYMBOL`` ("Fail to load symbol", amdsmi.h)."""

    def __init__(self, name: str) -> None:
        self.__name__ = name
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> int:
        return STATUS_FAIL_LOAD_SYMBOL


class _TolerantLibrary:
    """The library the wrapper binds: its symbols, and ``_AbsentSymbol`` for those it lacks."""

    def __init__(self, library: Any) -> None:
        self._library = library
        self.absent: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(self._library, name)
        except AttributeError:
            self.absent.append(name)
            stub = _AbsentSymbol(name)
            setattr(self, name, stub)
            return stub


class _CtypesForWrapper(types.ModuleType):
    """``ctypes`` as ``amdsmi_wrapper.py`` sees it: the real module, but ``CDLL`` opens through the agent."""

    def __init__(self, open_library: Callable[..., Any]) -> None:
        super().__init__("ctypes")
        self.CDLL = open_library

    def __getattr__(self, name: str) -> Any:
        return getattr(ctypes, name)


_LOADS = itertools.count()
_REAL_LOCK = threading.Lock()
_REAL: types.ModuleType | None = None


def _execute_package(open_library: Callable[[str], Any]) -> tuple[types.ModuleType, _TolerantLibrary | None, str]:
    """The amdsmi package's files executed under a private name, the wrapper's ``CDLL`` being
    ``open_library``; with what the wrapper printed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AMDSMIUnavailable(
            "AMD SMI unavailable: the Python package amdsmi is not installed (pip install 'gpuplace[amd]', or the "
            "one of the node's ROCm: pip install /opt/rocm/share/amd_smi)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    name = f"_gpuplace_amdsmi_{next(_LOADS)}"
    opened: list[_TolerantLibrary] = []

    def cdll(location: Any, *args: Any, **kwargs: Any) -> _TolerantLibrary:
        library = _TolerantLibrary(open_library(str(location)))
        opened.append(library)
        return library

    view = _CtypesForWrapper(cdll)
    real_import = builtins.__import__

    def wrapper_import(module: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if module == "ctypes" and level == 0:
            return view
        return real_import(module, globals, locals, fromlist, level)

    package_spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                          submodule_search_locations=[str(folder)])
    wrapper_spec = importlib.util.spec_from_file_location(f"{name}.amdsmi_wrapper", folder / "amdsmi_wrapper.py")
    assert package_spec and package_spec.loader and wrapper_spec and wrapper_spec.loader
    package = importlib.util.module_from_spec(package_spec)
    wrapper = importlib.util.module_from_spec(wrapper_spec)
    wrapper.__dict__["__builtins__"] = {**vars(builtins), "__import__": wrapper_import}
    printed = io.StringIO()
    sys.modules[package.__name__] = package
    sys.modules[wrapper.__name__] = wrapper
    package.amdsmi_wrapper = wrapper  # type: ignore[attr-defined]  # as the import system would set it
    try:
        with contextlib.redirect_stdout(printed):
            wrapper_spec.loader.exec_module(wrapper)
            package_spec.loader.exec_module(package)
    except KeyError as e:  # _libraries['libamd_smi.so']: no location could be opened
        where = " ".join(printed.getvalue().split()) or str(e)
        raise AMDSMIUnavailable(
            "AMD SMI unavailable: ROCm's libamd_smi.so was not found ($ROCM_PATH/lib, the linker's path, "
            "/opt/rocm/lib): install amd-smi-lib on the node and make /opt/rocm visible to the agent's "
            f"container, or set ROCM_PATH ({where})") from e
    except Exception as e:  # a package that does not load at all: report it, do not crash the agent
        raise AMDSMIUnavailable(f"AMD SMI unavailable: the amdsmi package from {folder} failed to load ({e!r})") from e
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]
    return package, (opened[0] if opened else None), printed.getvalue()


def load_amdsmi(library: Any = None) -> types.ModuleType:
    """The amdsmi package bound to ``library`` (a stand-in, ``gpuplace_testing.amdsmi_standin``), or to
    the node's ``libamd_smi.so`` when None (loaded once per process). Raises ``AMDSMIUnavailable``."""
    global _REAL
    if library is None:
        with _REAL_LOCK:
            if _REAL is None:
                _REAL = _bind(ctypes.CDLL)
            return _REAL
    return _bind(lambda location: library)


def _bind(open_library: Callable[[str], Any]) -> types.ModuleType:
    package, opened, printed = _execute_package(open_library)
    if printed.strip():
        log.debug("the amdsmi package printed while loading: %s", " ".join(printed.split()))
    if opened is not None and opened.absent:
        log.warning("libamd_smi.so lacks %d functions the amdsmi package declares (an older ROCm than the "
                    "package?): %s; what depends on them is reported unknown", len(opened.absent),
                    ", ".join(sorted(opened.absent)))
    return package


# ---- calls ---------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    value: Any = None
    code: int | None = None  # amdsmi_status_t; None when the call succeeded or failed in Python
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.code is None and not self.reason


class AMDSMISession:
    """The one door every AMD SMI call goes through: ``amdsmi_init`` by ``open``, ``amdsmi_shut_down``
    by ``close``. ``library`` replaces the node's ``libamd_smi.so`` (a stand-in, for tests and
    ``--probe fake-amdsmi``)."""

    def __init__(self, library: Any = None) -> None:
        self._library = library
        self._module: types.ModuleType | None = None
        self._lock = threading.Lock()
        self.log_once = LogOnce(log, "AMD SMI")
        self._open = False
        self._version_logged = False

    @property
    def module(self) -> types.ModuleType:
        if self._module is None:
            self._module = load_amdsmi(self._library)
        return self._module

    def open(self) -> None:
        """``amdsmi_init`` for the AMD GPUs. Raises ``AMDSMIUnavailable`` when it cannot start."""
        smi = self.module
        with self._lock:
            if self._open:
                return
            out = self.invoke("amdsmi_init", smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            if not out.ok:
                raise AMDSMIUnavailable(self._explain_init_failure(out))
            self._open = True
        if not self._version_logged:
            self._version_logged = True
            version = self.call("amdsmi_get_lib_version")
            if version is not None:
                log.info("AMD SMI library %s.%s.%s", version.get("major"), version.get("minor"), version.get("release"))

    @staticmethod
    def _explain_init_failure(out: _Outcome) -> str:
        hints = {
            STATUS_DRIVER_NOT_LOADED: ("the amdgpu kernel driver is not loaded on this node (lsmod | grep amdgpu): "
                                       "install or load it, or run the agent only on GPU nodes"),
            STATUS_NO_PERM: "no permission to open the AMD GPU devices (/dev/kfd, /dev/dri/renderD*)",
            STATUS_FAIL_LOAD_SYMBOL: "libamd_smi.so has no amdsmi_init: it is not AMD SMI's library",
        }
        hint = hints.get(out.code or -1, "AMD SMI could not be initialized")
        return f"AMD SMI unavailable: {hint} (amdsmi_init: {out.reason})"

    def close(self) -> None:
        """``amdsmi_shut_down`` if open; safe to call twice."""
        with self._lock:
            if not self._open:
                return
            self._open = False
        out = self.invoke("amdsmi_shut_down")
        if not out.ok:
            log.debug("amdsmi_shut_down failed: %s", out.reason)

    def invoke(self, fn: str, *args: Any) -> _Outcome:
        """Call the package's ``fn`` and report the outcome without logging."""
        smi = self.module
        func = getattr(smi, fn, None) or getattr(smi.amdsmi_interface, fn, None)
        if func is None:
            return _Outcome(code=STATUS_FAIL_LOAD_SYMBOL, reason=f"the amdsmi package has no {fn}")
        try:
            return _Outcome(value=func(*args))
        except smi.AmdSmiLibraryException as e:
            return _Outcome(code=int(e.get_error_code()), reason=str(e.get_error_info(detailed=False)))
        except Exception as e:  # the package's own checks (AmdSmiParameterException, a value it cannot convert)
            return _Outcome(reason=f"{type(e).__name__}: {' '.join(str(e).split())}")

    def call(self, fn: str, *args: Any, not_supported: Any = None) -> Any:
        """The value of ``fn(*args)``; on AMDSMI_STATUS_NOT_SUPPORTED ``not_supported`` (the caller's
        meaning of "this GPU has no such feature"); on any other failure None, logged once per
        (function, reason)."""
        out = self.invoke(fn, *args)
        if out.ok:
            return out.value
        if out.code == STATUS_NOT_SUPPORTED:
            self.log_once(fn, "not supported", logging.DEBUG)
            return not_supported
        self.log_once(fn, out.reason)
        return None


def _number(value: Any) -> int | None:
    """An integer field of the package's dicts; its "N/A" (the library's UINT_MAX) and junk are None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _hex_id(value: Any) -> int | None:
    """``"0x74a1"`` (the package formats vendor and device ids so) as a number; None for "N/A"."""
    try:
        return int(str(value), 16)
    except ValueError:
        return None


def _text(value: Any) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text if text and text != NOT_AVAILABLE else None


@dataclass
class _RawGPU:
    """What was read about one GPU before XGMI peers can be resolved (they need every GPU's handle)."""

    fields: dict[str, Any]
    handle: Any = None
    reasons: list[str] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)


class AMDProbe:
    """Reads every AMD GPU through AMD SMI and returns a ``NodeGPUInventory``.

    Args:
        library: a stand-in for ``libamd_smi.so`` (``gpuplace_testing.amdsmi_standin``); None loads the node's.
        node_name: the Node this agent runs on.
        mig_strategy: recorded as is (an NVIDIA device plugin setting; None leaves it out).
        numa_lookup: CPU NUMA node of a PCI address when AMD SMI has none; default reads sysfs.
    """

    def __init__(
        self,
        *,
        library: Any = None,
        node_name: str,
        mig_strategy: MigStrategy | None = None,
        numa_lookup: NumaLookup | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    ) -> None:
        self.smi = AMDSMISession(library)
        self.node_name = node_name
        self.mig_strategy = mig_strategy
        self._numa_lookup = numa_lookup or sysfs_numa_node
        self._clock = clock
        self._probe_lock = threading.Lock()

    def probe(self) -> NodeGPUInventory:
        """Read every GPU now. Raises ``AMDSMIUnavailable`` (no package, library or driver) or
        ``ProbeError``. AMD SMI is opened for the probe and shut down after it."""
        with self._probe_lock:
            self.smi.open()
            try:
                return self._probe()
            finally:
                self.smi.close()

    def _probe(self) -> NodeGPUInventory:
        observed_at = self._clock()
        handles = self.smi.call("amdsmi_get_processor_handles")
        if handles is None:
            raise ProbeError("AMD SMI could not list the GPUs (amdsmi_get_processor_handles failed; see log)")
        if not handles:
            raise ProbeError(
                "AMD SMI is loaded but this container sees no AMD GPU: give the agent /dev/kfd and /dev/dri "
                "(the AMD device plugin mounts them only into pods that request amd.com/gpu, which the agent "
                "does not), e.g. as hostPath volumes with a privileged or device-cgroup-allowed container")
        raws = [self._read_gpu(index, h) for index, h in enumerate(handles)]
        self._resolve_xgmi(raws)
        return NodeGPUInventory.model_validate({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "nodeName": self.node_name,
            "observedAt": observed_at,
            "driverVersion": self.driver_version(handles),
            "migStrategy": self.mig_strategy,
            "gpus": [build_gpu(raw.fields, raw.reasons) for raw in raws],
        })

    # ---- node-level getters -------------------------------------------------------------------

    def driver_version(self, handles: list[Any]) -> str | None:
        """amdgpu driver version, e.g. ``"6.8.5"``. amd-smi static: "DRIVER / VERSION"; rocm-smi:
        "Driver version"."""
        for h in handles:
            info = self.smi.call("amdsmi_get_gpu_driver_info", h)
            if info is not None:
                return _text(info.get("driver_version"))
        return None

    # ---- per-GPU getters ----------------------------------------------------------------------

    def _read_gpu(self, index: int, h: Any) -> _RawGPU:
        raw = _RawGPU({"index": index, "vendor": "amd"}, handle=h)
        try:
            self._fill(raw, h)
        except Exception as e:  # one broken GPU must not take the node's inventory down
            log.exception("reading AMD GPU %d failed", index)
            raw.reasons.append(f"agent error while reading GPU {index}: {e}")
        return raw

    def _fill(self, raw: _RawGPU, h: Any) -> None:
        f = raw.fields
        f["uuid"] = self.uuid(h)
        asic = self.smi.call("amdsmi_get_gpu_asic_info", h) or {}
        f["name"] = _text(asic.get("market_name"))
        f["architecture"] = self.architecture(asic)
        f["multiprocessors"] = _number(asic.get("num_compute_units"))
        f["pciDeviceId"] = self.pci_device_id(asic)
        f["pciBusId"] = self.bus_id(h)
        vram = self.smi.call("amdsmi_get_gpu_vram_info", h) or {}
        f["memoryMiB"] = self.memory_total_mib(h, vram)
        bandwidth = _number(vram.get("vram_max_bandwidth"))
        f["memoryBandwidthGBps"] = float(bandwidth) if bandwidth else None
        blocks = self.ecc_blocks(h)
        f["eccEnabled"] = None if blocks is None else bool(blocks & int(self.smi.module.AmdSmiGpuBlock.UMC))
        f["powerLimitW"] = self.power_limit_w(h)
        f["numaNode"] = self.numa_node(h, f["pciBusId"])
        f["computePartition"] = self.partition(h, "amdsmi_get_gpu_compute_partition")
        f["memoryPartition"] = self.partition(h, "amdsmi_get_gpu_memory_partition")
        raw.reasons.extend(self.health_reasons(h, blocks or 0))

    def uuid(self, h: Any) -> str | None:
        """AMD SMI's GPU UUID, ``afff74a1-0000-1000-8054-e92b0a5d57c8``. amd-smi list: "UUID"."""
        return _text(self.smi.call("amdsmi_get_gpu_device_uuid", h))

    def bus_id(self, h: Any) -> str | None:
        """PCI address, ``0000:05:00.0`` (amd-smi's and lspci's 4-digit domain). amd-smi list: "BDF"."""
        text = _text(self.smi.call("amdsmi_get_gpu_device_bdf", h))
        return text if text and parse_bus_id(text) else None

    @staticmethod
    def architecture(asic: dict[str, Any]) -> str | None:
        """The LLVM target ROCm compiles for, ``gfx942`` (MI300X), ``gfx90a`` (MI250X). amd-smi static:
        "ASIC / TARGET_GRAPHICS_VERSION"; rocminfo: "Name: gfx942"."""
        target = _text(asic.get("target_graphics_version"))
        if target is None or target.lower().startswith("gfxffff"):  # UINT64_MAX: not supported
            return None
        return target

    @staticmethod
    def pci_device_id(asic: dict[str, Any]) -> str | None:
        """Device and vendor id as NVML combines them (``0x74A11002``: device 0x74a1, vendor 0x1002).
        amd-smi static: "ASIC / DEVICE_ID", "VENDOR_ID"."""
        device, vendor = _hex_id(asic.get("device_id")), _hex_id(asic.get("vendor_id"))
        if device is None or vendor is None:
            return None
        return f"0x{device:04X}{vendor:04X}"

    def memory_total_mib(self, h: Any, vram: dict[str, Any]) -> int | None:
        """Total VRAM in MiB (the library gives bytes): ``amdsmi_get_gpu_memory_total(VRAM)``, else the
        VRAM info's size, which the library computes from the same number. amd-smi static: "VRAM /
        SIZE" (printed as MB, is MiB); rocm-smi --showmeminfo vram: "VRAM Total Memory (B)"."""
        total = self.smi.call("amdsmi_get_gpu_memory_total", h, self.smi.module.AmdSmiMemoryType.VRAM)
        if _number(total):
            return int(total) // (1024 * 1024)
        size = _number(vram.get("vram_size"))
        return size or None

    def ecc_blocks(self, h: Any) -> int | None:
        """Bitmask of the GPU blocks whose ECC is on (``amdsmi_gpu_block_t``); UMC is the memory
        controller, HBM's ECC. amd-smi static: "RAS / ECC_BLOCK_STATE". A GPU without RAS (consumer
        Radeon, NOT_SUPPORTED) has ECC off: 0, not unknown."""
        value = self.smi.call("amdsmi_get_gpu_ecc_enabled", h, not_supported=0)
        return None if value is None else int(value)

    def power_limit_w(self, h: Any) -> float | None:
        """Power cap in W (the library gives uW on bare-metal Linux). amd-smi static: "LIMIT /
        MAX_POWER" (the cap in force); rocm-smi: "PwrCap"."""
        info = self.smi.call("amdsmi_get_power_cap_info", h)
        cap = _number(info.get("power_cap")) if info else None
        return round(cap / 1_000_000, 1) if cap else None

    def numa_node(self, h: Any, bus_id: str | None) -> int | None:
        """NUMA node of the GPU: ``amdsmi_get_gpu_topo_numa_affinity`` (the kernel's numa_node of the
        device; -1 when the firmware gives none), else sysfs. amd-smi static: "NUMA / AFFINITY"."""
        value = _number(self.smi.call("amdsmi_get_gpu_topo_numa_affinity", h))
        if value is not None and value >= 0:
            return value
        return self._numa_lookup(bus_id) if bus_id else None

    def partition(self, h: Any, fn: str) -> str | None:
        """The GPU's compute partition (``SPX``, ``DPX``, ``QPX``, ``CPX``) or memory partition
        (``NPS1``, ``NPS4``) mode; None where the GPU has none (NOT_SUPPORTED: MI200 and older,
        Radeon). amd-smi static: "PARTITION"; rocm-smi: "Partitions (Mem, Compute)". In a mode other
        than SPX each partition is a GPU of its own here, with its own memory and compute units, as
        AMD SMI and the AMD device plugin enumerate them."""
        return _text(self.smi.call(fn, h))

    def health_reasons(self, h: Any, ecc_blocks: int) -> list[str]:
        """Reasons this GPU should not get new work; empty when healthy. Sources (amd-smi):
        ``metric --ecc`` (uncorrectable ECC errors since the driver loaded), ``metric --ecc-blocks``
        (a block whose RAS state is multiple uncorrectable errors or poison) and ``bad-pages``
        (pages waiting for a reset to be retired, pages that could not be retired). NOT_SUPPORTED
        on any of them means the GPU has no such mechanism: nothing to report. Deferred errors
        alone do not make a GPU unhealthy."""
        smi = self.smi.module
        reasons: list[str] = []
        counts = self.smi.call("amdsmi_get_gpu_total_ecc_count", h)
        uncorrectable = _number(counts.get("uncorrectable_count")) if counts else None
        if uncorrectable:
            reasons.append(f"{uncorrectable} uncorrectable ECC errors since the driver loaded (amd-smi metric --ecc)")
        states = {int(smi.AmdSmiRasErrState.MULT_UC): "multiple uncorrectable errors",
                  int(smi.AmdSmiRasErrState.POISON): "poisoned memory isolated by the firmware"}
        for block in smi.AmdSmiGpuBlock:
            bit = int(block)
            if bit == 0 or bit & (bit - 1) or not ecc_blocks & bit or block.name == "RESERVED":
                continue
            state = self.smi.call("amdsmi_get_gpu_ecc_status", h, block)
            if state is not None and int(state) in states:
                reasons.append(f"RAS: the {block.name} block reports {states[int(state)]} (amd-smi metric --ecc-blocks)")
        pages = self.smi.call("amdsmi_get_gpu_bad_page_info", h, not_supported=[]) or []
        statuses = [int(p.get("status", -1)) for p in pages]
        pending = statuses.count(int(smi.AmdSmiMemoryPageStatus.PENDING))
        unreservable = statuses.count(int(smi.AmdSmiMemoryPageStatus.UNRESERVABLE))
        if pending:
            reasons.append(f"{pending} bad memory pages pending retirement: reset the GPU to retire them "
                           "(amd-smi bad-pages --pending)")
        if unreservable:
            reasons.append(f"{unreservable} bad memory pages could not be retired (amd-smi bad-pages --un-res)")
        return reasons

    # ---- XGMI ----------------------------------------------------------------------------------

    def _resolve_xgmi(self, raws: list[_RawGPU]) -> None:
        """Each GPU's direct XGMI (Infinity Fabric) peers as ``nvlinks``, one link each.

        ``amdsmi_get_link_topology_nearest(XGMI)`` lists the GPUs reachable over XGMI and
        ``amdsmi_topo_get_link_type`` the hops to each: a peer one hop away has a direct link
        (``amd-smi topology``: LINK TYPE XGMI, NUMBER OF HOPS 1; an 8-GPU MI300X platform is a full
        mesh, each GPU with one link to each of the 7 others). Where the first is missing (an older
        library) or fails, every pair is asked the second. AMD SMI gives no count of links per pair,
        so each direct peer is one link."""
        smi = self.smi.module
        xgmi = int(smi.AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI)
        by_address = {_address(raw.handle): i for i, raw in enumerate(raws)}
        for i, raw in enumerate(raws):
            nearest = self.smi.call("amdsmi_get_link_topology_nearest", raw.handle, smi.AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI,
                                    not_supported={"processor_list": []})
            if nearest is not None:
                candidates = [by_address[a] for a in nearest.get("processor_list", []) if a in by_address]
            else:
                candidates = list(range(len(raws)))
            for j in candidates:
                if j == i:
                    continue
                link = self.smi.call("amdsmi_topo_get_link_type", raw.handle, raws[j].handle)
                if link is None:
                    if nearest is not None:  # listed as XGMI-reachable; hops unknown: count it
                        raw.peers.append(j)
                    continue
                if int(link.get("type", -1)) == xgmi and int(link.get("hops", 0)) == 1:
                    raw.peers.append(j)
        for raw in raws:
            uuids = [raws[j].fields.get("uuid") for j in sorted(set(raw.peers))]
            raw.fields["nvlinks"] = [NVLinkPeer(peerUuid=u, links=1) for u in uuids if u]


def _address(handle: Any) -> int | None:
    """The address an ``amdsmi_processor_handle`` (a ``c_void_p``) carries; ints pass through."""
    if handle is None or isinstance(handle, int):
        return handle
    return getattr(handle, "value", None)


__all__ = ["AMDProbe", "AMDSMISession", "AMDSMIUnavailable", "load_amdsmi"]
