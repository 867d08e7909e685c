"""Read what each NVIDIA GPU of this node really is, through NVML. The only module that imports pynvml.

Everything NVML says goes through one ``NVMLSession``: ``nvmlInit`` happens lazily, once, under a
lock, and ``nvmlShutdown`` at interpreter exit. Every other module asks ``NVMLProbe`` for a
``NodeGPUInventory`` and never sees pynvml (``pyproject.toml``'s import-linter contract).

How a failure is read:

- ``NVML_ERROR_NOT_SUPPORTED`` means "this GPU or driver does not have the feature" and each getter
  says what that means for it (no ECC support -> ECC off; no NVLink -> no peers; no row remapper ->
  nothing pending).
- Any other failure of a call means "unknown": the value is ``None`` (never 0, a scheduler must not
  mistake "not measured" for "none") and the reason is logged once per (function, reason), not once
  per call, so a driver lacking a function does not flood the log every 30 s.
- A GPU whose handle (or UUID, name, memory) cannot be read is still reported, unhealthy, with the
  reason in ``healthReasons``; the agent never crashes on one bad GPU.
- No driver at all (library missing, kernel module not loaded) raises ``NVMLUnavailable`` with a
  sentence a node operator can act on.

Each getter's docstring names the unit and the ``nvidia-smi --query-gpu=`` field that shows the
same number, so a reader can check a value against the tool everyone trusts (the pattern of
XuehaiPan/nvitop ``nvitop/api/libnvml.py``).

Tests run this exact code, and the real pynvml wrappers, over a stand-in for ``libnvidia-ml.so.1``
(``NVMLProbe(library=...)``, ``gpuplace_testing.nvml_standin``) that answers at the C boundary from
scenarios transcribed from published ``nvidia-smi`` outputs (``gpuplace_testing.fake_nvml``).
"""

from __future__ import annotations

import atexit
import ctypes
import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from node_agent.inventory import API_VERSION, GPU, KIND, MigDevice, NodeGPUInventory, NVLinkPeer
from node_agent.probing import (  # noqa: F401  (format_bus_id, ProbeError...: re-exported, node_agent.nvml's names)
    PLACEHOLDER_MEMORY_MIB, DriverUnavailable, LogOnce, MigStrategy, NumaLookup, ProbeError, build_gpu,
    format_bus_id, parse_bus_id, sysfs_numa_node, unavailable_inventory,
)

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by the application, not the GPU: the GPU stays healthy. The same list as NVIDIA
k8s-device-plugin (``internal/rm/health.go`` ``applicationErrorXids``): 13 graphics engine
exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video
processor exception, 109 context switch timeout (NVIDIA "XID Errors" guide). Operators change
the set with ``--ignore-xids`` (``parse_ignored_xids``), as the device plugin's
``DP_DISABLE_HEALTHCHECKS`` does."""


def parse_ignored_xids(text: str | None) -> frozenset[int] | None:
    """The XIDs that do not make a GPU unhealthy, from an operator's setting.

    ``""``/None: ``APPLICATION_XIDS``. ``"all"``: every XID (health from XIDs off; returns None).
    ``"48,79"`` or ``"+48,79"``: ``APPLICATION_XIDS`` plus these. ``"=13,31"``: exactly these.
    Raises ``ValueError`` naming the accepted forms on anything else.
    """
    text = (text or "").strip()
    if not text:
        return APPLICATION_XIDS
    if text.lower() == "all":
        return None
    exact = text.startswith("=")
    body = text.lstrip("=+")
    try:
        numbers = frozenset(int(part) for part in body.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--ignore-xids: {text!r} is not 'all', a comma-separated list of XID numbers "
                         "('48,79' adds to the defaults), or '=13,31' (exactly these)") from None
    if any(n < 0 or n > 0xFFFF for n in numbers):
        raise ValueError(f"--ignore-xids: XID numbers are 0-65535, got {text!r}")
    return numbers if exact else APPLICATION_XIDS | numbers

CORES_PER_SM = {
    (3, 0): 192, (3, 2): 192, (3, 5): 192, (3, 7): 192,
    (5, 0): 128, (5, 2): 128, (5, 3): 128,
    (6, 0): 64, (6, 1): 128, (6, 2): 128,
    (7, 0): 64, (7, 2): 64, (7, 5): 64,
    (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
    (9, 0): 128,
    (10, 0): 128, (10, 1): 128, (10, 3): 128, (11, 0): 128, (12, 0): 128, (12, 1): 128,
}
"""FP32 CUDA cores per streaming multiprocessor by compute capability: the table of NVIDIA's CUDA
samples (``Common/helper_cuda.h`` ``_ConvertSMVer2Cores``). Used to derive the SM count of a full
GPU from ``nvmlDeviceGetNumGpuCores`` when NVML has no direct answer: A100 6912 / 64 = 108,
H100 SXM 16896 / 128 = 132, RTX 4090 16384 / 128 = 128 (CUDA ``deviceQuery`` on those cards)."""


GPU_FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
"""nvml.h ``NVML_GPU_FABRIC_STATE_*``: a GPU's registration with NVIDIA Fabric Manager."""


class _GpuFabricInfoV2(ctypes.Structure):
    """nvml.h ``nvmlGpuFabricInfo_v2_t`` (``nvmlGpuFabricInfoV_t``), declared here rather than taken
    from pynvml: nvidia-ml-py releases up to about 12.560 declared ``clusterUuid`` with the wrong
    size, so reading through their struct gives garbage. ``state`` is an ``unsigned char``."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte), ("healthMask", ctypes.c_uint)]


class _GpuFabricInfoV1(ctypes.Structure):
    """nvml.h ``nvmlGpuFabricInfo_t``, for drivers without ``nvmlDeviceGetGpuFabricInfoV`` (R525-R535)."""

    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]


GPU_FABRIC_INFO_V2 = ctypes.sizeof(_GpuFabricInfoV2) | (2 << 24)
"""nvml.h ``nvmlGpuFabricInfo_v2`` = ``NVML_STRUCT_VERSION(GpuFabricInfo, 2)`` = 0x02000024."""


class NVMLUnavailable(DriverUnavailable):
    """NVML cannot be used on this machine (no driver, no library, no permission); the message says
    what to check."""


def memory_bandwidth_gbps(bus_width_bits: int | None, max_memory_clock_mhz: int | None) -> float | None:
    """Peak memory bandwidth in decimal GB/s from the bus width and the maximum memory clock.

    ``bandwidth = bus_width_bits / 8 * max_memory_clock_mhz * 2 / 1000``

    Source: NVIDIA Developer Blog, Mark Harris, "How to Implement Performance Metrics in CUDA C/C++"
    (theoretical bandwidth = memory clock x bus width in bytes x 2 for double data rate); the CUDA
    samples ``deviceQuery`` and NVIDIA nvbench ("Global Memory Bus Peak: 1008 GB/sec (384-bit DDR
    @10501MHz)" on an RTX 4090) compute it the same way from the same two numbers.

    What clock NVML reports, by memory type (``nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)``, shown by
    ``nvidia-smi -q`` under "Max Clocks / Memory" and by ``--query-gpu=clocks.max.memory``):

    - HBM2e / HBM3: the HBM interface clock, data moves on both edges. A100-SXM4-80GB: 5120 bit,
      1593 MHz -> 2039 GB/s (datasheet 2,039 GB/s); H100 SXM5: 5120 bit, 2619 MHz -> 3352 GB/s
      (datasheet 3.35 TB/s); A100 80GB PCIe: 1512 MHz -> 1935 GB/s (datasheet 1,935 GB/s).
    - GDDR6X (PAM4, two bits per symbol): NVML does *not* report the physical command clock
      (1313 MHz on an RTX 4090, the number GPU-Z shows) nor the write clock, but half the per-pin
      data rate: 10501 MHz on an RTX 4090 whose pins run at 21 Gbit/s. So the same x2 gives the
      right answer: 384 bit, 10501 MHz -> 1008 GB/s (datasheet 1,008 GB/s). The same holds for
      GDDR6 (RTX 2080: 256 bit, 7000 MHz -> 448 GB/s) and GDDR5 (GTX TITAN X: 384 bit, 3505 MHz
      -> 336 GB/s). Published ``nvidia-smi -q`` outputs of those cards are in
      ``tests/fixtures/nvml/``.

    Caveats: this is the theoretical peak, not what a kernel achieves (STREAM-like copies reach
    roughly 80-93 %); a driver that ever reported the physical GDDR6X clock would make this 8x too
    small, which the fixtures above would catch. ``None`` when either input is unknown.
    """
    if not bus_width_bits or not max_memory_clock_mhz:
        return None
    return round(bus_width_bits / 8 * max_memory_clock_mhz * 2 / 1000, 1)


@dataclass
class _Outcome:
    value: Any = None
    code: int | None = None  # NVML error code; None when the call succeeded
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.code is None and not self.reason


_MISSING_FUNCTION = -1  # our code for "pynvml has no such function" (nvidia-ml-py too old)


class NVMLSession:
    """Lazy, thread-safe ``nvmlInit``; the one door every NVML call goes through.

    ``module`` is pynvml (imported on first use when None). ``library`` replaces the
    ``libnvidia-ml.so.1`` pynvml would load: the stand-in of ``gpuplace_testing.nvml_standin``, which
    tests and ``--probe fake-nvml`` run the real pynvml wrappers over.
    """

    def __init__(self, module: Any = None, library: Any = None) -> None:
        self._module = module
        self._library = library
        self._lock = threading.Lock()
        self._initialized = False
        self._exit_hook = False
        self.log_once = LogOnce(log, "NVML")
        self.driver_gone = False
        """Set when a call answered as NVML does after a driver reload or GPU loss; the probe then
        closes the session so the next one starts afresh (``NVMLProbe.probe``)."""

    @property
    def module(self) -> Any:
        if self._module is None:
            try:
                import pynvml  # the only import of pynvml in the code base
            except ImportError as e:
                raise NVMLUnavailable(
                    "the Python package nvidia-ml-py (module pynvml) is not installed"
                ) from e
            self._module = pynvml
        return self._module

    def _install_library(self) -> None:
        """Put the stand-in library where pynvml keeps the CDLL it loaded (before nvmlInit)."""
        if self._library is None:
            return
        nvml = self.module
        if getattr(nvml, "nvmlLib", None) is not self._library:
            nvml.nvmlLib = self._library
            nvml._nvmlGetFunctionPointer_cache.clear()  # symbols of the previous library

    def const(self, name: str, default: int | None = None) -> Any:
        """An NVML constant by name; ``default`` when this pynvml is too old to have it."""
        return getattr(self.module, name, default)

    def ensure_initialized(self) -> None:
        """``nvmlInit`` once per process. Raises ``NVMLUnavailable`` when NVML cannot start."""
        if self._initialized:
            return
        with self._lock:
            if self._initialized:
                return
            nvml = self.module
            self._install_library()
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as e:
                raise NVMLUnavailable(self._explain_init_failure(e)) from e
            self._initialized = True
            self.driver_gone = False
            if not self._exit_hook:
                atexit.register(self.shutdown)
                self._exit_hook = True

    def _explain_init_failure(self, err: Any) -> str:
        code = getattr(err, "value", None)
        hints = {
            self.const("NVML_ERROR_LIBRARY_NOT_FOUND", 12): (
                "the NVIDIA driver library libnvidia-ml.so.1 was not found: is the NVIDIA driver "
                "installed on this node, and does the container run with the NVIDIA runtime "
                "(runtimeClassName: nvidia) or the driver's libraries mounted?"
            ),
            self.const("NVML_ERROR_DRIVER_NOT_LOADED", 9): (
                "the NVIDIA kernel driver is not loaded on this node (lsmod | grep nvidia): "
                "install or load the driver, or run the agent only on GPU nodes"
            ),
            self.const("NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18): (
                "the NVML library and the loaded NVIDIA kernel driver differ in version "
                "(driver upgraded without a reboot?)"
            ),
            self.const("NVML_ERROR_NO_PERMISSION", 4): (
                "no permission to open the NVIDIA devices (/dev/nvidiactl, /dev/nvidia*)"
            ),
        }
        hint = hints.get(code, "NVML could not be initialized")
        return f"NVML unavailable: {hint} (nvmlInit: {err})"

    def shutdown(self) -> None:
        """``nvmlShutdown`` if we initialized; safe to call twice."""
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            try:
                self.module.nvmlShutdown()
            except Exception as e:  # at exit nothing useful can be done about it
                log.debug("nvmlShutdown failed: %s", e)

    def invoke(self, fn: str, *args: Any) -> _Outcome:
        """Call ``fn`` and report the outcome without logging (callers that need the reason)."""
        nvml = self.module
        func = getattr(nvml, fn, None)
        if func is None:
            return _Outcome(code=_MISSING_FUNCTION, reason=f"pynvml has no {fn} (nvidia-ml-py too old)")
        try:
            return _Outcome(value=func(*args))
        except nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code in self._gone_codes():
                self.driver_gone = True
            return _Outcome(code=code, reason=str(e) or type(e).__name__)

    def _gone_codes(self) -> tuple[int, ...]:
        return tuple(self.const(name, default) for name, default in (
            ("NVML_ERROR_UNINITIALIZED", 1), ("NVML_ERROR_DRIVER_NOT_LOADED", 9),
            ("NVML_ERROR_GPU_IS_LOST", 15), ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18)))

    def call(self, fn: str, *args: Any, not_supported: Any = None, quiet: tuple[int, ...] = ()) -> Any:
        """The value of ``fn(*args)``; on NVML_ERROR_NOT_SUPPORTED ``not_supported`` (the caller's
        meaning of "this GPU has no such feature"); on codes in ``quiet`` None silently (an
        expected answer such as an empty MIG slot); on any other failure None, logged once per
        (function, reason)."""
        out = self.invoke(fn, *args)
        if out.ok:
            return out.value
        if out.code == self.const("NVML_ERROR_NOT_SUPPORTED", 3):
            self.log_once(fn, "not supported", logging.DEBUG)
            return not_supported
        if out.code in quiet:
            return None
        self.log_once(fn, out.reason, logging.WARNING)
        return None

    def is_code(self, out: _Outcome, name: str, default: int) -> bool:
        return out.code is not None and out.code == self.const(name, default)


def _text(value: Any) -> str:
    """pynvml returns str for most strings but bytes inside ctypes structs (``busId``, ``name``)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    return str(value)


def match_mig_profile(profiles: list[Any], attrs: Any) -> Any | None:
    """The GPU instance profile of a MIG device, from what an unprivileged process can read: the
    device's attributes (``nvmlDeviceGetAttributes``: GPU instance slices, memory, shared media
    engines) against the GPU's profile table (``nvmlDeviceGetGpuInstanceProfileInfoV``).

    The slice count must match. Drivers do not report a device's memory equal to the table's to
    the MiB (a 3g.40gb device at 40448 MiB against the table's 40192), so among the profiles with
    those slices the nearest in memory wins, within 12.5 % (1g.10gb and 1g.20gb are 2x apart);
    where media engines tell variants apart (``1g.10gb+me`` owns a decoder, JPEG and OFA engine the
    plain 1g.10gb lacks) a profile with the device's counts is preferred, and the plain profile
    before a ``+`` variant when nothing tells them apart. None when nothing fits."""
    slices = int(attrs.gpuInstanceSliceCount)
    memory = int(attrs.memorySizeMB)
    engines = (int(getattr(attrs, "sharedDecoderCount", 0)), int(getattr(attrs, "sharedJpegCount", 0)),
               int(getattr(attrs, "sharedOfaCount", 0)))
    candidates = [p for p in profiles if int(p.sliceCount) == slices and int(p.memorySizeMB) > 0
                  and abs(int(p.memorySizeMB) - memory) <= int(p.memorySizeMB) / 8]
    if not candidates:
        return None

    def rank(p: Any) -> tuple[int, int, bool]:
        p_engines = (int(getattr(p, "decoderCount", 0)), int(getattr(p, "jpegCount", 0)), int(getattr(p, "ofaCount", 0)))
        return (abs(int(p.memorySizeMB) - memory), p_engines != engines, "+" in _text(p.name))

    return min(candidates, key=rank)


@dataclass
class _Link:
    """One active NVLink of a GPU: what is at the other end."""

    remote: Literal["gpu", "switch", "unknown", "other"]
    remote_bus: tuple[int, int, int, int] | None


@dataclass
class _RawGPU:
    """What was read about one GPU before NVLink peers can be resolved (they need every GPU's bus)."""

    fields: dict[str, Any]
    reasons: list[str] = field(default_factory=list)
    instances: dict[int, int] = field(default_factory=dict)  # GPU instance id -> index in migDevices
    bus: tuple[int, int, int, int] | None = None
    links: list[_Link] = field(default_factory=list)


class NVMLProbe:
    """Reads every GPU through NVML and returns a ``NodeGPUInventory``.

    Args:
        nvml_module: the pynvml module; None imports it.
        library: a stand-in for ``libnvidia-ml.so.1`` (``gpuplace_testing.nvml_standin``); None loads the driver's.
        node_name: the Node this agent runs on.
        mig_strategy: how the NVIDIA device plugin exposes MIG devices, recorded as is; None leaves
            it out (the extender reads it from the Node).
        numa_lookup: CPU NUMA node of a PCI bus id when NVML has none; default reads sysfs.
        watch_xids: register for NVML XID events and mark GPUs with a critical XID unhealthy.
        hold_nvml: keep NVML open between probes; default: only while XIDs are watched (events
            reach only an open event set). See ``probe`` for when it is closed anyway.
        ignored_xids: XIDs that leave a GPU healthy (``parse_ignored_xids``); None ignores all.
        xid_recovery_seconds: a GPU (or MIG device) whose last critical XID is this old is healthy
            again as far as XIDs go; 0 keeps it until a driver reload or an agent restart.
    """

    def __init__(
        self,
        nvml_module: Any = None,
        *,
        library: Any = None,
        node_name: str,
        mig_strategy: MigStrategy | None = None,
        numa_lookup: NumaLookup | None = None,
        watch_xids: bool = True,
        ignored_xids: frozenset[int] | None = APPLICATION_XIDS,
        hold_nvml: bool | None = None,
        xid_recovery_seconds: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    ) -> None:
        self.nvml = NVMLSession(nvml_module, library)
        self.node_name = node_name
        self.mig_strategy = mig_strategy
        self._numa_lookup = numa_lookup or sysfs_numa_node
        self._clock = clock
        # ignored_xids None: the operator turned XID health off (--ignore-xids all).
        self._xids = (_XidWatcher(self.nvml, ignored_xids, xid_recovery_seconds, monotonic)
                      if watch_xids and ignored_xids is not None else None)
        self._reloaded = False  # a call answered as after a driver reload: XIDs seen before are void
        self._hold = (self._xids is not None) if hold_nvml is None else hold_nvml
        self._probe_lock = threading.Lock()  # one probe at a time: the XID event set is shared

    # ---- node-level getters -------------------------------------------------------------

    def driver_version(self) -> str | None:
        """Display driver version, e.g. ``"580.95.05"``. nvidia-smi: ``--query-gpu=driver_version``."""
        value = self.nvml.call("nvmlSystemGetDriverVersion")
        return None if value is None else _text(value)

    def cuda_driver_version(self) -> str | None:
        """Highest CUDA version the installed driver supports, ``"12.8"`` (NVML gives 12080).
        nvidia-smi: the "CUDA Version" of its header (no ``--query-gpu`` field)."""
        value = self.nvml.call("nvmlSystemGetCudaDriverVersion_v2")
        if value is None:
            value = self.nvml.call("nvmlSystemGetCudaDriverVersion")
        if not value:
            return None
        return f"{int(value) // 1000}.{(int(value) % 1000) // 10}"

    # ---- per-GPU getters ------------------------------------------------------------------

    def uuid(self, h: Any) -> str | None:
        """GPU UUID, ``GPU-...``. nvidia-smi: ``--query-gpu=uuid``."""
        value = self.nvml.call("nvmlDeviceGetUUID", h)
        return None if value is None else _text(value)

    def name(self, h: Any) -> str | None:
        """Product name as the driver reports it. nvidia-smi: ``--query-gpu=name``."""
        value = self.nvml.call("nvmlDeviceGetName", h)
        return None if value is None else _text(value)

    def pci(self, h: Any) -> tuple[str | None, str | None, tuple[int, int, int, int] | None]:
        """(bus id ``00000000:07:00.0``, device id ``0x20B210DE``, parsed bus). nvidia-smi:
        ``--query-gpu=pci.bus_id,pci.device_id``."""
        info = self.nvml.call("nvmlDeviceGetPciInfo", h)
        if info is None:
            return None, None, None
        bus = parse_bus_id(_text(info.busId))
        if bus is None:
            bus = (int(info.domain), int(info.bus), int(info.device), 0)
        return format_bus_id(*bus), f"0x{int(info.pciDeviceId):08X}", bus

    def architecture(self, h: Any) -> str | None:
        """Architecture name (``ampere``, ``hopper``...). nvidia-smi -q: "Product Architecture"
        (no ``--query-gpu`` field)."""
        value = self.nvml.call("nvmlDeviceGetArchitecture", h)
        if value is None:
            return None
        names = {
            self.nvml.const(f"NVML_DEVICE_ARCH_{key}", number): key.lower()
            for key, number in (
                ("KEPLER", 2), ("MAXWELL", 3), ("PASCAL", 4), ("VOLTA", 5), ("TURING", 6),
                ("AMPERE", 7), ("ADA", 8), ("HOPPER", 9), ("BLACKWELL", 10), ("RUBIN", 13),
            )
        }
        return names.get(int(value))

    def compute_capability(self, h: Any) -> tuple[int, int] | None:
        """CUDA compute capability (major, minor). nvidia-smi: ``--query-gpu=compute_cap``."""
        value = self.nvml.call("nvmlDeviceGetCudaComputeCapability", h)
        if value is None:
            return None
        major, minor = value
        return int(major), int(minor)

    def memory_total_mib(self, h: Any, quiet: tuple[int, ...] = ()) -> int | None:
        """Total framebuffer memory in MiB (NVML gives bytes). nvidia-smi: ``--query-gpu=memory.total``."""
        info = self.nvml.call("nvmlDeviceGetMemoryInfo", h, quiet=quiet)
        if info is None or not info.total:
            return None
        return int(info.total) // (1024 * 1024)

    def fabric_reasons(self, h: Any) -> list[str]:
        """Why the GPU's NVLink fabric is not ready, from its registration with NVIDIA Fabric
        Manager (``nvmlDeviceGetGpuFabricInfoV``, else ``nvmlDeviceGetGpuFabricInfo``; nvidia-smi
        -q: "Fabric / State, Status"). On NVSwitch systems (HGX H100/H200/B200) NVML reads normally
        while registration is not ``completed``, but every CUDA program fails with error 802
        ("system not yet initialized"), so such a GPU must not get work. A GPU without a fabric
        (PCIe, NOT_SUPPORTED) and a driver without either function (before R525) give no reason."""
        quiet = (self.nvml.const("NVML_ERROR_FUNCTION_NOT_FOUND", 13),)
        info: Any = _GpuFabricInfoV2(version=GPU_FABRIC_INFO_V2)
        out = self.nvml.invoke("nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(info))
        if out.code in quiet:
            info = _GpuFabricInfoV1()
            out = self.nvml.invoke("nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info))
        if out.code in quiet or self.nvml.is_code(out, "NVML_ERROR_NOT_SUPPORTED", 3):
            return []
        if not out.ok:
            self.nvml.log_once("nvmlDeviceGetGpuFabricInfoV", out.reason)
            return []
        state = int(info.state)
        if state == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            return []
        if state != 3:
            return [f"NVLink fabric {GPU_FABRIC_STATES.get(state, f'state {state}')}: NVIDIA Fabric Manager has not "
                    "registered this GPU (CUDA fails with error 802 until it does); start nvidia-fabricmanager "
                    "on the node (systemctl status nvidia-fabricmanager)"]
        if int(info.status) != 0:
            return [f"NVLink fabric registration failed (NVML status {int(info.status)}): see the "
                    "nvidia-fabricmanager log on the node"]
        return []

    def cuda_cores(self, h: Any) -> int | None:
        """Number of CUDA (FP32) cores; driver R520+ (``nvmlDeviceGetNumGpuCores``). No nvidia-smi
        field; CUDA ``deviceQuery`` prints it. Not supported -> unknown."""
        value = self.nvml.call("nvmlDeviceGetNumGpuCores", h)
        return int(value) if value else None

    def multiprocessors(self, h: Any, cc: tuple[int, int] | None, cores: int | None) -> int | None:
        """Streaming multiprocessors. ``nvmlDeviceGetAttributes`` answers for MIG devices (and, on
        some drivers, full GPUs); otherwise cores / cores-per-SM of the compute capability
        (``CORES_PER_SM``). No nvidia-smi field; CUDA ``deviceQuery`` prints "(108) Multiprocessors"."""
        attrs = self.nvml.call("nvmlDeviceGetAttributes", h)
        direct = getattr(attrs, "multiprocessorCount", None) if attrs is not None else None
        if direct:
            return int(direct)
        per_sm = CORES_PER_SM.get(cc) if cc else None
        if cores and per_sm:
            return cores // per_sm
        return None

    def memory_bus_width_bits(self, h: Any) -> int | None:
        """Memory bus width in bits (``nvmlDeviceGetMemoryBusWidth``). No nvidia-smi field; CUDA
        ``deviceQuery``: "Memory Bus Width: 5120-bit"."""
        value = self.nvml.call("nvmlDeviceGetMemoryBusWidth", h)
        return int(value) if value else None

    def max_memory_clock_mhz(self, h: Any) -> int | None:
        """Maximum memory clock in MHz, in NVML's convention (see ``memory_bandwidth_gbps``).
        nvidia-smi: ``--query-gpu=clocks.max.memory``."""
        value = self.nvml.call("nvmlDeviceGetMaxClockInfo", h, self.nvml.const("NVML_CLOCK_MEM", 2))
        return int(value) if value else None

    def ecc_enabled(self, h: Any) -> bool | None:
        """Current ECC mode. nvidia-smi: ``--query-gpu=ecc.mode.current``. A GPU without ECC
        support (nvidia-smi "N/A", NOT_SUPPORTED) has ECC off: False, not unknown."""
        value = self.nvml.call("nvmlDeviceGetEccMode", h, not_supported=(0, 0))
        if value is None:
            return None
        return bool(int(value[0]) == self.nvml.const("NVML_FEATURE_ENABLED", 1))

    def power_limit_w(self, h: Any) -> float | None:
        """Enforced power limit in W (NVML gives mW): the limit the GPU obeys, the lower of the
        admin's and the board's. nvidia-smi: ``--query-gpu=enforced.power.limit``; falls back to
        ``power.limit`` (``nvmlDeviceGetPowerManagementLimit``)."""
        value = self.nvml.call("nvmlDeviceGetEnforcedPowerLimit", h)
        if not value:
            value = self.nvml.call("nvmlDeviceGetPowerManagementLimit", h)
        return round(int(value) / 1000, 1) if value else None

    def temperature_c(self, h: Any) -> int | None:
        """GPU core temperature in degrees C, now: nvml.h ``nvmlDeviceGetTemperature(device,
        NVML_TEMPERATURE_GPU, &temp)`` (sensor 0, the only one before NVML 615 added
        ``NVML_TEMPERATURE_GPU_MAX``). nvidia-smi: ``--query-gpu=temperature.gpu``, -q "GPU Current
        Temp". Not supported (some vGPU guests) or any failure -> unknown. Full GPUs only: a MIG
        device shares its GPU's die and sensor."""
        value = self.nvml.call("nvmlDeviceGetTemperature", h, self.nvml.const("NVML_TEMPERATURE_GPU", 0))
        return None if value is None else int(value)

    def numa_node(self, h: Any, bus_id: str | None) -> int | None:
        """NUMA node of the GPU: ``nvmlDeviceGetNumaNodeId`` where the driver has it, else the
        PCI device's node from sysfs, else None. nvidia-smi topo -m: "GPU NUMA ID", then "NUMA
        Affinity". On x86 servers NVML answers NOT_SUPPORTED (topo -m shows "GPU NUMA ID N/A") and
        sysfs gives the CPU socket's node; on coherent systems (Grace Hopper) NVML gives the node
        of the GPU's own memory, which is what it reports first."""
        value = self.nvml.call("nvmlDeviceGetNumaNodeId", h)
        if value is not None and int(value) >= 0:
            return int(value)
        return self._numa_lookup(bus_id) if bus_id else None

    def health_reasons(self, h: Any) -> list[str]:
        """Reasons this GPU should not get new work; empty when healthy. Sources (nvidia-smi):
        ``--query-gpu=retired_pages.pending`` (pre-Ampere page retirement waiting for a reset),
        ``--query-remapped-rows=remapped_rows.pending,remapped_rows.failure`` (Ampere+ row
        remapping waiting for a reset, or out of spare rows), and
        ``ecc.errors.uncorrected.volatile.total`` (double-bit errors since the driver loaded).
        NOT_SUPPORTED on any of them means the GPU has no such mechanism: nothing to report."""
        reasons: list[str] = []
        enabled = self.nvml.const("NVML_FEATURE_ENABLED", 1)
        pending = self.nvml.call("nvmlDeviceGetRetiredPagesPendingStatus", h, not_supported=0)
        if pending is not None and int(pending) == enabled:
            reasons.append("retired ECC pages pending: reset the GPU to retire them")
        rows = self.nvml.call("nvmlDeviceGetRemappedRows", h, not_supported=(0, 0, 0, 0))
        if rows is not None:
            _corr, _unc, is_pending, failure = rows
            if failure:
                reasons.append("row remapping failed: GPU is out of spare memory rows (replace it)")
            elif is_pending:
                reasons.append("row remapping pending: reset the GPU to apply it")
        dbe = self.nvml.call(
            "nvmlDeviceGetTotalEccErrors",
            h,
            self.nvml.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            self.nvml.const("NVML_VOLATILE_ECC", 0),
            not_supported=0,
        )
        if dbe:
            reasons.append(f"{int(dbe)} uncorrectable (double-bit) ECC errors since the driver loaded")
        return reasons

    def mig_enabled(self, h: Any) -> bool:
        """Current MIG mode. nvidia-smi: ``--query-gpu=mig.mode.current``. NOT_SUPPORTED (a GPU
        without MIG) and unknown both mean no MIG devices to report: False."""
        value = self.nvml.call("nvmlDeviceGetMigMode", h, not_supported=(0, 0))
        return bool(value) and int(value[0]) == self.nvml.const("NVML_DEVICE_MIG_ENABLE", 1)

    def _gpu_instance_profiles(self, h: Any) -> list[Any]:
        """Every GPU instance profile this GPU offers (``nvidia-smi mig -lgip``): NVML profile
        info structs with ``id`` (the lgip "ID"), ``sliceCount``, ``memorySizeMB`` (MiB),
        ``multiprocessorCount`` and ``name`` (``"MIG 3g.40gb"``)."""
        count = self.nvml.const("NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)
        quiet = (self.nvml.const("NVML_ERROR_INVALID_ARGUMENT", 2),)
        infos = []
        missing = (self.nvml.const("NVML_ERROR_FUNCTION_NOT_FOUND", 13), _MISSING_FUNCTION)
        for index in range(count):
            out = self.nvml.invoke("nvmlDeviceGetGpuInstanceProfileInfo", h, index)
            if out.code in missing:
                # A driver before the versioned call (R470): profiles unknown, so MIG devices
                # are named only through the privileged path; logged once.
                self.nvml.log_once("nvmlDeviceGetGpuInstanceProfileInfoV", out.reason)
                break
            if not out.ok:
                if out.code not in quiet and not self.nvml.is_code(out, "NVML_ERROR_NOT_SUPPORTED", 3):
                    self.nvml.log_once("nvmlDeviceGetGpuInstanceProfileInfo", out.reason)
                continue  # a profile index this GPU does not have
            info = out.value
            instances = getattr(info, "instanceCount", 1) if info is not None else 0
            if instances:  # 0: the profile exists but this GPU cannot host it
                infos.append(info)
        return infos

    def mig_devices(self, h: Any, parent_reasons: list[str], instances: dict[int, int] | None = None,
                    profiles: list[Any] | None = None) -> list[MigDevice]:
        """Every MIG device of a GPU in MIG mode. nvidia-smi: ``-L`` lists them with UUID and
        profile; ``nvidia-smi`` shows memory and SMs. The profile comes from the GPU instance's
        profile id (needs ``nvmlDeviceGetGpuInstanceById``, a privileged call on some drivers),
        else from matching the device's slice count and memory against the profiles. ``profiles``:
        the GPU's ``_gpu_instance_profiles`` when already read."""
        if profiles is None:
            profiles = self._gpu_instance_profiles(h)
        by_id = {int(p.id): p for p in profiles}
        slots = self.nvml.call("nvmlDeviceGetMaxMigDeviceCount", h) or 0
        not_found = (self.nvml.const("NVML_ERROR_NOT_FOUND", 6), self.nvml.const("NVML_ERROR_INVALID_ARGUMENT", 2))
        devices: list[MigDevice] = []
        for slot in range(int(slots)):
            mh = self.nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", h, slot, quiet=not_found)
            if mh is None:
                continue  # an empty slot
            uuid = self.uuid(mh)
            attrs = self.nvml.call("nvmlDeviceGetAttributes", mh)
            gi_id = self.nvml.call("nvmlDeviceGetGpuInstanceId", mh)
            profile = self._mig_profile(h, gi_id, attrs, by_id, profiles)
            memory = int(attrs.memorySizeMB) if attrs is not None and attrs.memorySizeMB else None
            if memory is None:
                memory = self.memory_total_mib(mh)
            sms = int(attrs.multiprocessorCount) if attrs is not None and attrs.multiprocessorCount else None
            if uuid is None or profile is None or not memory:
                # Left out, and said why; the parent and its other MIG devices are fine.
                log.warning("MIG device in slot %d of a GPU could not be read completely (uuid=%s, profile=%s, "
                            "memoryMiB=%s): not published", slot, uuid, profile, memory)
                continue
            if instances is not None and gi_id is not None:
                instances[int(gi_id)] = len(devices)
            devices.append(MigDevice(uuid=uuid, profile=profile, memoryMiB=memory, multiprocessors=sms))
        return devices

    def parent_memory_mib(self, h: Any, profiles: list[Any] | None = None) -> int | None:
        """Memory of a GPU in MIG mode. Unprivileged, NVML refuses the parent's memory query
        (NO_PERMISSION: with MIG on, usage is per GPU instance); then the largest GPU instance
        profile's memory (``7g.80gb``: 80384 MiB on an A100 80GB of 81920), a slight undercount
        that no decision reads (pods get MIG devices, not the parent, while MIG is on)."""
        value = self.memory_total_mib(h, quiet=(self.nvml.const("NVML_ERROR_NO_PERMISSION", 4),))
        if value:
            return value
        if profiles is None:
            profiles = self._gpu_instance_profiles(h)
        return max((int(p.memorySizeMB) for p in profiles), default=None) or None

    def _mig_profile(self, h: Any, gi_id: int | None, attrs: Any, by_id: dict[int, Any], profiles: list[Any]) -> str | None:
        gi_profile = None
        if gi_id is not None:
            # Privileged; unprivileged containers get NO_PERMISSION, an expected answer here.
            gi = self.nvml.call("nvmlDeviceGetGpuInstanceById", h, gi_id,
                                quiet=(self.nvml.const("NVML_ERROR_NO_PERMISSION", 4),))
            info = self.nvml.call("nvmlGpuInstanceGetInfo", gi) if gi is not None else None
            if info is not None:
                gi_profile = by_id.get(int(info.profileId))
        if gi_profile is None and attrs is not None:
            gi_profile = match_mig_profile(profiles, attrs)
        if gi_profile is None:
            return None
        name = _text(gi_profile.name).removeprefix("MIG ").strip()
        if not name:
            return None
        if attrs is not None and 0 < int(attrs.computeInstanceSliceCount) < int(attrs.gpuInstanceSliceCount):
            # A compute instance smaller than its GPU instance: nvidia-smi names it "1c.3g.40gb".
            name = f"{int(attrs.computeInstanceSliceCount)}c.{name}"
        return name

    def nvlinks(self, h: Any) -> list[_Link]:
        """Every active NVLink and what is at its other end. nvidia-smi: ``nvlink --status`` (active
        links) and ``nvlink -R`` (remote device); ``topo -m`` summarizes them as ``NV#``.
        NOT_SUPPORTED on link 0 means the GPU has no NVLink (GeForce RTX 4090)."""
        nvml = self.nvml
        max_links = nvml.const("NVML_NVLINK_MAX_LINKS", 18)
        active = nvml.const("NVML_FEATURE_ENABLED", 1)
        gpu_type = nvml.const("NVML_NVLINK_DEVICE_TYPE_GPU", 0)
        switch_type = nvml.const("NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        unknown_type = nvml.const("NVML_NVLINK_DEVICE_TYPE_UNKNOWN", 0xFF)
        not_supported = nvml.const("NVML_ERROR_NOT_SUPPORTED", 3)
        invalid = nvml.const("NVML_ERROR_INVALID_ARGUMENT", 2)
        links: list[_Link] = []
        for link in range(max_links):
            state = nvml.invoke("nvmlDeviceGetNvLinkState", h, link)
            if state.code in (not_supported, invalid):
                if link == 0 or state.code == invalid:
                    break  # no NVLink at all, or past this GPU's last link
                continue
            if not state.ok:
                nvml.log_once("nvmlDeviceGetNvLinkState", state.reason)
                continue
            if int(state.value) != active:
                continue
            remote_type = nvml.call("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            pci = nvml.call("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            bus = parse_bus_id(_text(pci.busId)) if pci is not None else None
            if remote_type == switch_type:
                kind: Literal["gpu", "switch", "unknown", "other"] = "switch"
            elif remote_type == gpu_type:
                kind = "gpu"
            elif remote_type is None or remote_type == unknown_type:
                kind = "unknown"
            else:
                kind = "other"  # e.g. an IBM NPU (POWER9): not a GPU peer
            links.append(_Link(remote=kind, remote_bus=bus))
        return links

    # ---- assembly ---------------------------------------------------------------------------

    def probe(self) -> NodeGPUInventory:
        """Read every GPU now. Raises ``NVMLUnavailable`` (no driver) or ``ProbeError``.

        NVML is opened for the probe and closed after it (``nvmlShutdown``), so the agent holds no
        GPU between probes: ``nvidia-smi -r`` and in-place driver upgrades are not refused because
        of it, and a reloaded driver is simply opened by the next probe. While XIDs are watched the
        session stays open between probes (an event set only collects events while open, as in
        the NVIDIA device plugin), except that it is closed after a probe that found a GPU whose
        reason asks for a reset (the advice must be actionable) or a call that answered as after
        a driver reload or GPU loss; XIDs already seen are kept across sessions.
        """
        with self._probe_lock:
            inventory: NodeGPUInventory | None = None
            try:
                inventory = self._probe()
                return inventory
            finally:
                if self._must_release(inventory):
                    self._release()

    def _must_release(self, inventory: NodeGPUInventory | None) -> bool:
        if not self._hold or self.nvml.driver_gone or inventory is None:
            return True
        return any("reset" in reason for g in inventory.gpus for reason in g.health_reasons)

    def _release(self) -> None:
        if self.nvml.driver_gone:
            self._reloaded = True
        self.nvml.shutdown()
        if self._xids is not None:
            self._xids.session_closed()

    def _probe(self) -> NodeGPUInventory:
        self.nvml.ensure_initialized()
        observed_at = self._clock()
        count = self.nvml.call("nvmlDeviceGetCount")
        if count is None:
            raise ProbeError("NVML could not count the GPUs (nvmlDeviceGetCount failed; see log)")
        if int(count) == 0:
            # The driver answered, so this is a GPU node; a container that sees none of its GPUs
            # must not publish "a healthy node with no GPUs".
            raise ProbeError(
                "NVML is loaded but this container sees no GPU: run the agent with the NVIDIA runtime "
                "(runtimeClassName: nvidia, or the default runtime set to nvidia), NVIDIA_VISIBLE_DEVICES=all, "
                "and, where the container toolkit ignores that variable for unprivileged pods "
                "(accept-nvidia-visible-devices-envvar-when-unprivileged = false), the device mounts "
                "(nvidia.com/gpu is not requested by the agent on purpose)")
        raws: list[_RawGPU] = []
        handles: dict[str, Any] = {}
        for index in range(int(count)):
            raw, handle = self._read_gpu(index)
            raws.append(raw)
            if handle is not None and raw.fields.get("uuid"):
                handles[raw.fields["uuid"]] = handle
        if self._xids is not None:
            if self._reloaded:
                self._xids.forget_all()
                self._reloaded = False
            self._xids.expire()
            self._xids.watch(handles)
            for raw in raws:
                uuid = raw.fields.get("uuid", "")
                for xid in sorted(self._xids.critical.get(uuid, ())):
                    raw.reasons.append(f"critical XID {xid} reported since the agent started (reset or drain the GPU)")
                _mark_mig_xids(raw, {gi: xids for (u, gi), xids in self._xids.mig_critical.items() if u == uuid})
        _resolve_nvlinks(raws)
        gpus = [_build_gpu(raw) for raw in raws]
        return NodeGPUInventory.model_validate({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "nodeName": self.node_name,
            "observedAt": observed_at,
            "driverVersion": self.driver_version(),
            "cudaDriverVersion": self.cuda_driver_version(),
            "migStrategy": self.mig_strategy,
            "gpus": gpus,
        })

    def _read_gpu(self, index: int) -> tuple[_RawGPU, Any]:
        base: dict[str, Any] = {"index": index, "vendor": "nvidia"}
        out = self.nvml.invoke("nvmlDeviceGetHandleByIndex", index)
        if not out.ok:
            self.nvml.log_once("nvmlDeviceGetHandleByIndex", out.reason)
            return _RawGPU(base, [f"NVML cannot open GPU {index}: {out.reason}"]), None
        h = out.value
        raw = _RawGPU(base)
        try:
            self._fill(raw, h)
        except Exception as e:  # one broken GPU must not take the node's inventory down
            log.exception("reading GPU %d failed", index)
            raw.reasons.append(f"agent error while reading GPU {index}: {e}")
        return raw, h

    def _fill(self, raw: _RawGPU, h: Any) -> None:
        f = raw.fields
        f["uuid"] = self.uuid(h)
        f["name"] = self.name(h)
        f["pciBusId"], f["pciDeviceId"], raw.bus = self.pci(h)
        f["architecture"] = self.architecture(h)
        cc = self.compute_capability(h)
        f["computeCapability"] = f"{cc[0]}.{cc[1]}" if cc else None
        f["migEnabled"] = self.mig_enabled(h)
        profiles = self._gpu_instance_profiles(h) if f["migEnabled"] else []  # read once for both below
        f["memoryMiB"] = self.parent_memory_mib(h, profiles) if f["migEnabled"] else self.memory_total_mib(h)
        cores = self.cuda_cores(h)
        f["cudaCores"] = cores
        f["multiprocessors"] = self.multiprocessors(h, cc, cores)
        f["memoryBandwidthGBps"] = memory_bandwidth_gbps(self.memory_bus_width_bits(h), self.max_memory_clock_mhz(h))
        f["eccEnabled"] = self.ecc_enabled(h)
        f["powerLimitW"] = self.power_limit_w(h)
        f["temperatureC"] = self.temperature_c(h)
        f["numaNode"] = self.numa_node(h, f["pciBusId"])
        raw.reasons.extend(self.health_reasons(h))
        raw.reasons.extend(self.fabric_reasons(h))
        f["migDevices"] = self.mig_devices(h, raw.reasons, raw.instances, profiles) if f["migEnabled"] else []
        raw.links = self.nvlinks(h)


def _mark_mig_xids(raw: _RawGPU, by_instance: dict[int, set[int]]) -> None:
    """MIG devices whose GPU instance reported a critical XID become unhealthy; the GPU does not,
    unless the instance is not among its MIG devices any more (then the GPU carries the reason)."""
    migs: list[MigDevice] = raw.fields.get("migDevices") or []
    for gi, xids in sorted(by_instance.items()):
        where = raw.instances.get(gi)
        text = ", ".join(str(x) for x in sorted(xids))
        if where is None or where >= len(migs):
            raw.reasons.append(f"critical XID {text} on GPU instance {gi}, which is gone (reset or drain the GPU)")
            continue
        migs[where] = migs[where].model_copy(update={
            "healthy": False,
            "health_reasons": [f"critical XID {text} reported on this MIG device since the agent started "
                               "(destroy and recreate its GPU instance, or reset the GPU)"]})


def _resolve_nvlinks(raws: list[_RawGPU]) -> None:
    """Turn each GPU's active links into ``nvlinks`` peers with link counts.

    Direct links: the remote PCI bus id is matched against this node's GPUs (``nvidia-smi topo -m``
    ``NV4`` between two GPUs = 4 links). NVSwitch systems (HGX/DGX A100 and H100): every link ends
    at a switch, the switches connect every GPU to every other, so each GPU that also reaches the
    switches is a peer with ``min(own switch links, peer's switch links)`` links, the narrower side
    limiting the pair (topo -m shows ``NV12`` on A100, ``NV18`` on H100). A link whose remote NVML
    cannot identify (type unknown, bus not one of our GPUs, as in VMs where the switches are
    hidden) counts as a switch link, as NCCL assumes (NVIDIA/nccl#1182).
    """
    by_bus = {raw.bus: raw.fields.get("uuid") for raw in raws if raw.bus and raw.fields.get("uuid")}
    switch_links: dict[str, int] = {}
    direct: dict[str, dict[str, int]] = {}
    for raw in raws:
        uuid = raw.fields.get("uuid")
        if not uuid:
            continue
        for link in raw.links:
            peer = by_bus.get(link.remote_bus) if link.remote_bus else None
            if peer is not None and peer != uuid and link.remote in ("gpu", "unknown"):
                direct.setdefault(uuid, defaultdict(int))[peer] += 1
            elif link.remote in ("switch", "unknown"):
                switch_links[uuid] = switch_links.get(uuid, 0) + 1
    order = {r.fields.get("uuid"): r.fields["index"] for r in raws}
    for raw in raws:
        uuid = raw.fields.get("uuid")
        if not uuid:
            raw.fields["nvlinks"] = []
            continue
        peers: dict[str, int] = dict(direct.get(uuid, {}))
        if uuid in switch_links:
            for other, n in switch_links.items():
                if other != uuid:
                    peers[other] = peers.get(other, 0) + min(switch_links[uuid], n)
        raw.fields["nvlinks"] = [
            NVLinkPeer(peerUuid=peer, links=n) for peer, n in sorted(peers.items(), key=lambda kv: order.get(kv[0], 0))
        ]


def _build_gpu(raw: _RawGPU) -> GPU:
    return build_gpu(raw.fields, raw.reasons)


NO_GPU_INSTANCE = 0xFFFFFFFF
"""nvmlEventData_t ``gpuInstanceId`` of an event not scoped to a MIG device (nvml.h)."""


class _XidWatcher:
    """Critical XID events (``nvmlEventTypeXidCriticalError``) since the agent started.

    The GPUs are registered once on an NVML event set; every probe drains it with a zero timeout
    (``nvmlEventSetWait(set, 0)`` returns NVML_ERROR_TIMEOUT when nothing is queued), so a probe
    never blocks on events. XIDs are kept across NVML sessions until the driver is reloaded (which
    resets the GPUs: ``forget_all``), the agent restarts, or, with ``recovery_seconds``, that long
    passes without another critical XID on the GPU or MIG device (``expire``): a critical XID (48
    double-bit ECC, 79 fallen off the bus...) needs a reset or a drain.
    Application XIDs (``APPLICATION_XIDS``) are ignored. Where the driver refuses the
    registration (NOT_SUPPORTED, e.g. some vGPU guests) XIDs are simply not watched, logged once.
    """

    MAX_EVENTS_PER_PROBE = 1024  # bound the drain loop even if a GPU floods events

    def __init__(self, nvml: NVMLSession, ignored: frozenset[int] = APPLICATION_XIDS,
                 recovery_seconds: float = 0.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._ignored = ignored
        self._recovery_seconds = recovery_seconds
        self._monotonic = monotonic
        self._last_seen: dict[Any, float] = {}  # GPU UUID or (UUID, GPU instance) -> last critical XID
        self._set: Any = None
        self._registered: set[str] = set()
        self._failed = False
        self.critical: dict[str, set[int]] = {}
        self.mig_critical: dict[tuple[str, int], set[int]] = {}
        """XIDs the driver scoped to one GPU instance: (GPU UUID, GPU instance id) -> XIDs."""

    def session_closed(self) -> None:
        """NVML was shut down: the event set and registrations are gone; the XIDs seen stay."""
        self._set = None
        self._registered.clear()

    def forget_all(self) -> None:
        """The driver was reloaded, which resets every GPU: the XIDs seen before no longer apply."""
        self.critical.clear()
        self.mig_critical.clear()
        self._last_seen.clear()

    def expire(self) -> None:
        """Forget the XIDs of a GPU or MIG device that reported none for ``recovery_seconds``
        (0: never; the operator's ``--xid-recovery-seconds``)."""
        if self._recovery_seconds <= 0:
            return
        cutoff = self._monotonic() - self._recovery_seconds
        for key in [k for k, t in self._last_seen.items() if t < cutoff]:
            del self._last_seen[key]
            (self.mig_critical if isinstance(key, tuple) else self.critical).pop(key, None)

    def watch(self, handles: dict[str, Any]) -> None:
        nvml = self._nvml
        if self._failed:
            return
        if self._set is None:
            self._set = nvml.call("nvmlEventSetCreate")
            if self._set is None:
                self._failed = True
                return
        event = nvml.const("nvmlEventTypeXidCriticalError", 0x8)
        for uuid, h in handles.items():
            if uuid in self._registered:
                continue
            nvml.call("nvmlDeviceRegisterEvents", h, event, self._set)
            self._registered.add(uuid)  # tried once; a refusal was logged once by call()
        timeout = nvml.const("NVML_ERROR_TIMEOUT", 10)
        for _ in range(self.MAX_EVENTS_PER_PROBE):
            out = nvml.invoke("nvmlEventSetWait", self._set, 0)
            if out.code == timeout:
                return
            if not out.ok:
                nvml.log_once("nvmlEventSetWait", out.reason)
                return
            data = out.value
            if int(data.eventType) != event or int(data.eventData) in self._ignored:
                continue
            uuid = nvml.call("nvmlDeviceGetUUID", data.device)
            if uuid is not None:
                xid = int(data.eventData)
                gi = int(getattr(data, "gpuInstanceId", NO_GPU_INSTANCE))
                if gi != NO_GPU_INSTANCE:  # scoped to one MIG device: the rest of the GPU is fine
                    log.warning("GPU %s, GPU instance %d reported critical XID %d", _text(uuid), gi, xid)
                    self.mig_critical.setdefault((_text(uuid), gi), set()).add(xid)
                    self._last_seen[(_text(uuid), gi)] = self._monotonic()
                else:
                    log.warning("GPU %s reported critical XID %d", _text(uuid), xid)
                    self.critical.setdefault(_text(uuid), set()).add(xid)
                    self._last_seen[_text(uuid)] = self._monotonic()


__all__ = [
    "APPLICATION_XIDS",
    "CORES_PER_SM",
    "NVMLProbe",
    "NVMLSession",
    "NVMLUnavailable",
    "DriverUnavailable",
    "PLACEHOLDER_MEMORY_MIB",
    "match_mig_profile",
    "parse_ignored_xids",
    "ProbeError",
    "format_bus_id",
    "memory_bandwidth_gbps",
    "parse_bus_id",
    "sysfs_numa_node",
    "unavailable_inventory",
]
