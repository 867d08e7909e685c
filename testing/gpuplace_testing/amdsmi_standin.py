"""A stand-in for ROCm's ``libamd_smi.so`` at its C boundary, fed by a scenario (``fake_amdsmi.Fixture``).

The real ``amdsmi`` Python package runs over it unchanged: ``amdsmi_wrapper.py`` binds every C
entry point at import (``_libraries['libamd_smi.so'].amdsmi_init`` and some 400 more) with the
``restype``/``argtypes`` of its amdsmi.h, and ``amdsmi_interface.py`` builds the out-parameters,
calls, and turns each ``amdsmi_status_t`` into a value or an ``AmdSmiLibraryException``.
``node_agent.amd.load_amdsmi(library=...)`` loads a private copy of the package with this object
where the wrapper keeps the ``CDLL`` it loaded. So what is tested is the agent *and* the
package's declarations against amdsmi.h, not our reading of the package.

What follows amdsmi.h here, and not the package:

- **Symbols.** An attribute per C entry point, with the C name. The wrapper looks every one up at
  import, so a lookup proves nothing: a symbol this stand-in does not implement answers
  ``AMDSMI_STATUS_NOT_YET_IMPLEMENTED`` when *called*, and the call is recorded in
  ``unimplemented`` (tests fail on any), so the agent cannot start calling something no scenario
  describes. A symbol the scenario's library lacks (``Fixture.absentFunctions``, an older
  libamd_smi) fails the lookup, as ``dlsym`` does.
- **Out-parameters and structs.** Values are written through the caller's pointers as bytes laid
  out by this module's own ctypes copies of the amdsmi.h structs (``_AsicInfo``, ``_VramInfo``,
  ``_TopologyNearest``...), never through the wrapper's classes. A caller whose buffer is not the
  size amdsmi.h gives is recorded in ``violations`` (tests fail on any).
- **Return codes** are amdsmi.h's ``amdsmi_status_t``; every call before ``amdsmi_init`` or after
  the last ``amdsmi_shut_down`` is ``AMDSMI_STATUS_NOT_INIT`` (``AMDSMI_CHECK_INIT``); handles are
  opaque pointers. Counting calls follow amdsmi.h: a NULL array asks for the count.
- **Behaviour the library shows**: one socket per GPU (amdsmi groups the partitions of a GPU
  under its socket); ``amdsmi_get_gpu_vram_info``'s ``vram_size`` is ``amdsmi_get_gpu_memory_total``
  in MiB (``src/amd_smi/amd_smi.cc``: ``total / (1024 * 1024)``, shown by ``amd-smi static`` as
  "SIZE: ... MB"); ``amdsmi_get_link_topology_nearest`` lists the GPUs reachable over the asked
  link type, ``amdsmi_topo_get_link_type`` gives hops and type per pair; a GPU without RAS
  (``ecc: unsupported``) answers NOT_SUPPORTED to the ECC calls; unset power cap, NUMA
  affinity, partitions are NOT_SUPPORTED, as on GPUs without them.

Layouts and values are those of amdsmi.h of AMD SMI for ROCm 7.0 (``ROCm/amdsmi``
``include/amd_smi/amdsmi.h``, the header ``amdsmi`` 7.0.x's wrapper was generated from): there
``amdsmi_link_type_t`` has PCIE = 1 and XGMI = 2 (ROCm 6.x numbered them otherwise) and
``amdsmi_version_t`` has no ``year``. Sizes are checked in the tests against the structs of the
installed wrapper.
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpuplace_testing.c_boundary import Boundary, BoundaryViolation, Symbol as _Symbol, address_of as _address
from gpuplace_testing.c_boundary import target_of as _target, value_of as _value

# ---- amdsmi.h amdsmi_status_t --------------------------------------------------------------------

SUCCESS = 0
STATUS_INVAL = 1
STATUS_NOT_SUPPORTED = 2
STATUS_NOT_YET_IMPLEMENTED = 3
STATUS_FAIL_LOAD_MODULE = 4
STATUS_FAIL_LOAD_SYMBOL = 5
STATUS_DRM_ERROR = 6
STATUS_API_FAILED = 7
STATUS_NO_PERM = 10
STATUS_INIT_ERROR = 18
STATUS_NOT_FOUND = 31
STATUS_NOT_INIT = 32
STATUS_DRIVER_NOT_LOADED = 34
STATUS_INSUFFICIENT_SIZE = 41
STATUS_UNKNOWN_ERROR = 0xFFFFFFFF

STATUS_CODES = {
    "INVAL": STATUS_INVAL, "NOT_SUPPORTED": STATUS_NOT_SUPPORTED, "NOT_YET_IMPLEMENTED": STATUS_NOT_YET_IMPLEMENTED,
    "FAIL_LOAD_MODULE": STATUS_FAIL_LOAD_MODULE, "FAIL_LOAD_SYMBOL": STATUS_FAIL_LOAD_SYMBOL,
    "DRM_ERROR": STATUS_DRM_ERROR, "API_FAILED": STATUS_API_FAILED, "NO_PERM": STATUS_NO_PERM,
    "INIT_ERROR": STATUS_INIT_ERROR, "NOT_FOUND": STATUS_NOT_FOUND, "NOT_INIT": STATUS_NOT_INIT,
    "DRIVER_NOT_LOADED": STATUS_DRIVER_NOT_LOADED, "UNKNOWN_ERROR": STATUS_UNKNOWN_ERROR,
}

# ---- amdsmi.h enums ------------------------------------------------------------------------------

LINK_TYPE = {"INTERNAL": 0, "PCIE": 1, "XGMI": 2, "NOT_APPLICABLE": 3, "UNKNOWN": 4}  # amdsmi_link_type_t
MEM_TYPE_VRAM, MEM_TYPE_VIS_VRAM, MEM_TYPE_GTT = 0, 1, 2  # amdsmi_memory_type_t
GPU_BLOCKS = {  # amdsmi_gpu_block_t: one bit per block
    "UMC": 1 << 0, "SDMA": 1 << 1, "GFX": 1 << 2, "MMHUB": 1 << 3, "ATHUB": 1 << 4, "PCIE_BIF": 1 << 5,
    "HDP": 1 << 6, "XGMI_WAFL": 1 << 7, "DF": 1 << 8, "SMN": 1 << 9, "SEM": 1 << 10, "MP0": 1 << 11,
    "MP1": 1 << 12, "FUSE": 1 << 13, "MCA": 1 << 14, "VCN": 1 << 15, "JPEG": 1 << 16, "IH": 1 << 17,
    "MPIO": 1 << 18,
}
RAS_ERR_STATE = {  # amdsmi_ras_err_state_t
    "NONE": 0, "DISABLED": 1, "PARITY": 2, "SING_C": 3, "MULT_UC": 4, "POISON": 5, "ENABLED": 6,
}
MEM_PAGE_STATUS = {"reserved": 0, "pending": 1, "unreservable": 2}  # amdsmi_memory_page_status_t
VRAM_TYPE = {  # amdsmi_vram_type_t
    "UNKNOWN": 0, "HBM": 1, "HBM2": 2, "HBM2E": 3, "HBM3": 4, "HBM3E": 5, "DDR2": 10, "DDR3": 11,
    "DDR4": 12, "GDDR1": 17, "GDDR2": 18, "GDDR3": 19, "GDDR4": 20, "GDDR5": 21, "GDDR6": 22, "GDDR7": 23,
}
UINT32_MAX = 0xFFFFFFFF
UINT64_MAX = 0xFFFFFFFFFFFFFFFF

# ---- amdsmi.h structs (own copies: the point is to catch a caller whose layout differs) ---------

STRING_LENGTH = 256  # AMDSMI_MAX_STRING_LENGTH
MAX_DEVICES = 32  # AMDSMI_MAX_DEVICES
GPU_UUID_SIZE = 38  # AMDSMI_GPU_UUID_SIZE


class _AsicInfo(ctypes.Structure):  # amdsmi_asic_info_t
    _fields_ = [("market_name", ctypes.c_char * STRING_LENGTH), ("vendor_id", ctypes.c_uint32),
                ("vendor_name", ctypes.c_char * STRING_LENGTH), ("subvendor_id", ctypes.c_uint32),
                ("device_id", ctypes.c_uint64), ("rev_id", ctypes.c_uint32),
                ("asic_serial", ctypes.c_char * STRING_LENGTH), ("oam_id", ctypes.c_uint32),
                ("num_of_compute_units", ctypes.c_uint32), ("target_graphics_version", ctypes.c_uint64),
                ("subsystem_id", ctypes.c_uint32), ("reserved", ctypes.c_uint32 * 21)]


class _VramInfo(ctypes.Structure):  # amdsmi_vram_info_t
    _fields_ = [("vram_type", ctypes.c_uint32), ("vram_vendor", ctypes.c_char * STRING_LENGTH),
                ("vram_size", ctypes.c_uint64), ("vram_bit_width", ctypes.c_uint32),
                ("vram_max_bandwidth", ctypes.c_uint64), ("reserved", ctypes.c_uint64 * 37)]


class _DriverInfo(ctypes.Structure):  # amdsmi_driver_info_t
    _fields_ = [("driver_version", ctypes.c_char * STRING_LENGTH), ("driver_date", ctypes.c_char * STRING_LENGTH),
                ("driver_name", ctypes.c_char * STRING_LENGTH)]


class _PowerCapInfo(ctypes.Structure):  # amdsmi_power_cap_info_t
    _fields_ = [(n, ctypes.c_uint64) for n in ("power_cap", "default_power_cap", "dpm_cap", "min_power_cap",
                                                "max_power_cap")] + [("reserved", ctypes.c_uint64 * 3)]


class _ErrorCount(ctypes.Structure):  # amdsmi_error_count_t
    _fields_ = [(n, ctypes.c_uint64) for n in ("correctable_count", "uncorrectable_count", "deferred_count")] + [
        ("reserved", ctypes.c_uint64 * 5)]


class _TopologyNearest(ctypes.Structure):  # amdsmi_topology_nearest_t
    _fields_ = [("count", ctypes.c_uint32), ("processor_list", ctypes.c_void_p * MAX_DEVICES),
                ("reserved", ctypes.c_uint64 * 15)]


class _RetiredPageRecord(ctypes.Structure):  # amdsmi_retired_page_record_t
    _fields_ = [("page_address", ctypes.c_uint64), ("page_size", ctypes.c_uint64), ("status", ctypes.c_uint32)]


class _Version(ctypes.Structure):  # amdsmi_version_t (no "year" since ROCm 7.0)
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("release", ctypes.c_uint32),
                ("build", ctypes.c_char_p)]


def bdf_as_uint(bus_id: str) -> int:
    """amdsmi.h ``amdsmi_bdf_t.as_uint`` of ``0000:05:00.0``: function in bits 0-2, device 3-7,
    bus 8-15, domain 16-63."""
    from node_agent.probing import parse_bus_id

    domain, bus, dev, fn = parse_bus_id(bus_id) or (0, 0, 0, 0)
    return fn | dev << 3 | bus << 8 | domain << 16


def gfx_version_number(target: str) -> int:
    """``target_graphics_version`` of ``gfx942``: the wrapper prints ``"gfx" + hex(value)``, so the
    library stores the target's digits as hexadecimal digits (0x942)."""
    return int(target.removeprefix("gfx"), 16)


# ---- the boundary -------------------------------------------------------------------------------


def _is_null(arg: Any) -> bool:
    """A NULL pointer argument (``POINTER(T)()``, ``None``)."""
    if arg is None:
        return True
    if isinstance(arg, ctypes._Pointer):
        return not arg
    return False


class StandinLibrary(Boundary):
    """``libamd_smi.so`` for one scenario. Attribute access is symbol lookup (``dlsym``).

    ``calls``: every symbol called, in order. ``unimplemented``: symbols called that this stand-in
    does not implement (tests fail on any). ``violations``: calls that broke amdsmi.h's contract
    (tests fail on any).
    """

    HEADER = "amdsmi.h"
    INSUFFICIENT_SIZE = STATUS_INSUFFICIENT_SIZE
    SOCKET_BASE = 0x50_0000
    GPU_BASE = 0x60_0000

    def __init__(self, fixture: Any, *, source: str = "scenario") -> None:
        super().__init__(fixture, source=source)
        self._gpu_addr = [self.GPU_BASE + 0x1000 * i for i in range(len(fixture.gpus))]
        self._socket_addr = [self.SOCKET_BASE + 0x1000 * i for i in range(len(fixture.gpus))]
        self._by_bus = {bdf_as_uint(g.bdf): i for i, g in enumerate(fixture.gpus)}
        self._build = ctypes.create_string_buffer(fixture.libVersion.encode())  # kept alive: build points at it

    # -- dlsym --

    def __getattr__(self, name: str) -> _Symbol:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self.fixture.absentFunctions:
            raise AttributeError(f"{self.source}: undefined symbol: {name}")  # an older libamd_smi
        impl = getattr(type(self), "c_" + name, None)

        def entry(*args: Any) -> Any:
            self.calls.append(name)
            if impl is None:
                self.unimplemented.append(name)
                return STATUS_NOT_YET_IMPLEMENTED
            if name not in ("amdsmi_init", "amdsmi_get_lib_version") and not self._init_count:
                return STATUS_NOT_INIT
            return impl(self, *args)

        return _Symbol(name, entry)

    # -- helpers for tests and the CLI --

    def numa_affinity(self, bus_id: str) -> int | None:
        """What sysfs ``numa_node`` says for this PCI address (``AMDProbe(numa_lookup=...)``)."""
        i = self._by_bus.get(bdf_as_uint(bus_id))
        return self.fixture.gpus[i].sysfsNumaNode if i is not None else None

    def _store_handles(self, count: Any, out: Any, addresses: list[int], what: str) -> int:
        """amdsmi.h's counting convention: ``*count`` in is the array's size (ignored for NULL);
        out, the number of handles (all of them for NULL, those written otherwise)."""
        n = len(addresses)
        if not _is_null(out):
            size = _value(_target(count))
            array = _target(out)
            if ctypes.sizeof(array) < size * ctypes.sizeof(ctypes.c_void_p):
                self._violate(f"{what}: array of {ctypes.sizeof(array)} bytes passed with count {size}")
            n = min(n, size)
            for k in range(n):
                ctypes.c_void_p.from_address(ctypes.addressof(array) + k * ctypes.sizeof(ctypes.c_void_p)).value = \
                    addresses[k]
        self._store(count, ctypes.c_uint32, n, f"{what} count")
        return SUCCESS

    def _gpu(self, handle: Any, name: str | None = None) -> tuple[int | None, int]:
        """(GPU index, return code) of a processor handle; with ``name``, the scenario's scripted
        answer for that symbol on that GPU comes first."""
        addr = _address(handle)
        if addr not in self._gpu_addr:
            return None, STATUS_INVAL
        i = self._gpu_addr.index(addr)
        if name is not None:
            gpu = self.fixture.gpus[i]
            if name in gpu.errors:
                return None, STATUS_CODES[gpu.errors[name]]
            if name in gpu.unsupported:
                return None, STATUS_NOT_SUPPORTED
        return i, SUCCESS

    # ---- entry points (amdsmi.h signatures; the method name is "c_" + the symbol) -----------------

    def c_amdsmi_init(self, flags: Any) -> int:
        return self._count_init(STATUS_CODES[self.fixture.initError] if self.fixture.initError else None)

    def c_amdsmi_shut_down(self) -> int:
        with self._lock:
            self._init_count -= 1
        return SUCCESS

    def c_amdsmi_get_lib_version(self, out: Any) -> int:
        major, minor, release = (int(p) for p in self.fixture.libVersion.split(".")[:3])
        version = _Version(major=major, minor=minor, release=release)
        ctypes.cast(ctypes.addressof(version) + _Version.build.offset, ctypes.POINTER(ctypes.c_void_p))[0] = \
            ctypes.addressof(self._build)
        self._store(out, _Version, version, "amdsmi_version_t")
        return SUCCESS

    def c_amdsmi_get_socket_handles(self, count: Any, out: Any) -> int:
        return self._store_handles(count, out, self._socket_addr, "amdsmi_get_socket_handles")

    def c_amdsmi_get_processor_handles(self, socket: Any, count: Any, out: Any) -> int:
        addr = _address(socket)
        if addr not in self._socket_addr:
            return STATUS_INVAL
        i = self._socket_addr.index(addr)
        return self._store_handles(count, out, [self._gpu_addr[i]], "amdsmi_get_processor_handles")

    def c_amdsmi_get_gpu_device_uuid(self, handle: Any, length: Any, buf: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_device_uuid")
        if rc or i is None:
            return rc
        rc = self._store_string(buf, _value(_target(length)), self.fixture.gpus[i].uuid)
        if not rc:
            self._store(length, ctypes.c_uint32, len(self.fixture.gpus[i].uuid) + 1, "uuid_length")
        return rc

    def c_amdsmi_get_gpu_device_bdf(self, handle: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_device_bdf")
        if rc or i is None:
            return rc
        self._store(out, ctypes.c_uint64, bdf_as_uint(self.fixture.gpus[i].bdf), "amdsmi_bdf_t")
        return SUCCESS

    def c_amdsmi_get_gpu_asic_info(self, handle: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_asic_info")
        if rc or i is None:
            return rc
        g = self.fixture.gpus[i]
        info = _AsicInfo(market_name=g.marketName.encode(), vendor_id=g.vendorId,
                         vendor_name=b"Advanced Micro Devices Inc. [AMD/ATI]", subvendor_id=g.vendorId,
                         device_id=g.deviceId, rev_id=g.revId, asic_serial=g.asicSerial.encode(),
                         oam_id=UINT32_MAX if g.oamId is None else g.oamId,
                         num_of_compute_units=UINT32_MAX if g.computeUnits is None else g.computeUnits,
                         target_graphics_version=gfx_version_number(g.targetGraphicsVersion),
                         subsystem_id=g.subsystemId)
        self._store(out, _AsicInfo, info, "amdsmi_asic_info_t")
        return SUCCESS

    def c_amdsmi_get_gpu_vram_info(self, handle: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_vram_info")
        if rc or i is None:
            return rc
        v = self.fixture.gpus[i].vram
        info = _VramInfo(vram_type=VRAM_TYPE[v.type], vram_vendor=v.vendor.encode(), vram_size=v.sizeMiB,
                         vram_bit_width=UINT32_MAX if v.bitWidth is None else v.bitWidth,
                         vram_max_bandwidth=UINT64_MAX if v.maxBandwidthGBps is None else v.maxBandwidthGBps)
        self._store(out, _VramInfo, info, "amdsmi_vram_info_t")
        return SUCCESS

    def c_amdsmi_get_gpu_memory_total(self, handle: Any, mem_type: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_memory_total")
        if rc or i is None:
            return rc
        if _value(mem_type) not in (MEM_TYPE_VRAM, MEM_TYPE_VIS_VRAM):
            return STATUS_NOT_SUPPORTED
        self._store(out, ctypes.c_uint64, self.fixture.gpus[i].vram.sizeMiB * 1024 * 1024, "total")
        return SUCCESS

    def c_amdsmi_get_gpu_driver_info(self, handle: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_driver_info")
        if rc or i is None:
            return rc
        if self.fixture.driverVersion is None:
            return STATUS_NOT_SUPPORTED
        info = _DriverInfo(driver_version=self.fixture.driverVersion.encode(), driver_date=b"",
                           driver_name=b"amdgpu")
        self._store(out, _DriverInfo, info, "amdsmi_driver_info_t")
        return SUCCESS

    def c_amdsmi_get_power_cap_info(self, handle: Any, sensor: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_power_cap_info")
        if rc or i is None:
            return rc
        watts = self.fixture.gpus[i].powerCapW
        if watts is None or _value(sensor) != 0:
            return STATUS_NOT_SUPPORTED
        micro = int(round(watts * 1_000_000))  # amdsmi.h: uW on bare metal Linux
        info = _PowerCapInfo(power_cap=micro, default_power_cap=micro, dpm_cap=0, min_power_cap=0, max_power_cap=micro)
        self._store(out, _PowerCapInfo, info, "amdsmi_power_cap_info_t")
        return SUCCESS

    def c_amdsmi_get_gpu_topo_numa_affinity(self, handle: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_topo_numa_affinity")
        if rc or i is None:
            return rc
        node = self.fixture.gpus[i].numaAffinity
        self._store(out, ctypes.c_int32, -1 if node is None else node, "numa_node")
        return SUCCESS

    def _ecc_mask(self, i: int) -> int | None:
        g = self.fixture.gpus[i]
        if g.ecc == "unsupported":
            return None
        return sum(GPU_BLOCKS[b] for b in g.eccBlocks) if g.ecc == "enabled" else 0

    def c_amdsmi_get_gpu_ecc_enabled(self, handle: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_ecc_enabled")
        if rc or i is None:
            return rc
        mask = self._ecc_mask(i)
        if mask is None:
            return STATUS_NOT_SUPPORTED
        self._store(out, ctypes.c_uint64, mask, "enabled_blocks")
        return SUCCESS

    def c_amdsmi_get_gpu_ecc_status(self, handle: Any, block: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_ecc_status")
        if rc or i is None:
            return rc
        mask = self._ecc_mask(i)
        if mask is None:
            return STATUS_NOT_SUPPORTED
        bit = _value(block)
        names = [n for n, b in GPU_BLOCKS.items() if b == bit]
        if not names:
            return STATUS_INVAL
        if not mask & bit:
            state = "DISABLED"
        else:
            state = self.fixture.gpus[i].rasStates.get(names[0], "ENABLED")
        self._store(out, ctypes.c_uint32, RAS_ERR_STATE[state], "amdsmi_ras_err_state_t")
        return SUCCESS

    def c_amdsmi_get_gpu_total_ecc_count(self, handle: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_total_ecc_count")
        if rc or i is None:
            return rc
        if self._ecc_mask(i) is None:
            return STATUS_NOT_SUPPORTED
        c = self.fixture.gpus[i].eccCounts
        self._store(out, _ErrorCount, _ErrorCount(correctable_count=c.correctable, uncorrectable_count=c.uncorrectable,
                                                  deferred_count=c.deferred), "amdsmi_error_count_t")
        return SUCCESS

    def c_amdsmi_get_gpu_bad_page_info(self, handle: Any, count: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_gpu_bad_page_info")
        if rc or i is None:
            return rc
        pages = self.fixture.gpus[i].badPages
        if pages is None:
            return STATUS_NOT_SUPPORTED
        n = len(pages)
        if not _is_null(out):
            array = _target(out)
            size = _value(_target(count))
            if ctypes.sizeof(array) < size * ctypes.sizeof(_RetiredPageRecord):
                self._violate(f"amdsmi_get_gpu_bad_page_info: array of {ctypes.sizeof(array)} bytes passed with "
                              f"count {size}")
            n = min(n, size)
            for k in range(n):
                record = _RetiredPageRecord(page_address=pages[k].address, page_size=4096,
                                            status=MEM_PAGE_STATUS[pages[k].status])
                ctypes.memmove(ctypes.addressof(array) + k * ctypes.sizeof(record), ctypes.addressof(record),
                               ctypes.sizeof(record))
        self._store(count, ctypes.c_uint32, n, "num_pages")
        return SUCCESS

    def _partition(self, handle: Any, buf: Any, length: Any, name: str, attr: str) -> int:
        i, rc = self._gpu(handle, name)
        if rc or i is None:
            return rc
        value = getattr(self.fixture.gpus[i], attr)
        if value is None:
            return STATUS_NOT_SUPPORTED
        return self._store_string(buf, length, value)

    def c_amdsmi_get_gpu_compute_partition(self, handle: Any, buf: Any, length: Any) -> int:
        return self._partition(handle, buf, length, "amdsmi_get_gpu_compute_partition", "computePartition")

    def c_amdsmi_get_gpu_memory_partition(self, handle: Any, buf: Any, length: Any) -> int:
        return self._partition(handle, buf, length, "amdsmi_get_gpu_memory_partition", "memoryPartition")

    # -- topology --

    def _xgmi_peers(self, i: int) -> list[int]:
        return [self._by_bus[bdf_as_uint(b)] for b in self.fixture.gpus[i].xgmiPeers]

    def c_amdsmi_get_link_topology_nearest(self, handle: Any, link_type: Any, out: Any) -> int:
        i, rc = self._gpu(handle, "amdsmi_get_link_topology_nearest")
        if rc or i is None:
            return rc
        kind = _value(link_type)
        if kind not in LINK_TYPE.values():
            return STATUS_INVAL
        xgmi = self._xgmi_peers(i)
        if kind == LINK_TYPE["XGMI"]:
            peers = xgmi
        elif kind == LINK_TYPE["PCIE"]:
            peers = [j for j in range(len(self.fixture.gpus)) if j != i and j not in xgmi]
        else:
            peers = []
        info = _TopologyNearest(count=len(peers))
        for k, j in enumerate(peers[:MAX_DEVICES]):
            info.processor_list[k] = self._gpu_addr[j]
        self._store(out, _TopologyNearest, info, "amdsmi_topology_nearest_t")
        return SUCCESS

    def c_amdsmi_topo_get_link_type(self, src: Any, dst: Any, hops: Any, out: Any) -> int:
        i, rc = self._gpu(src, "amdsmi_topo_get_link_type")
        if rc or i is None:
            return rc
        j, rc = self._gpu(dst)
        if rc or j is None or j == i:
            return STATUS_INVAL
        if j in self._xgmi_peers(i):
            n, kind = self.fixture.gpus[i].xgmiHops, LINK_TYPE["XGMI"]
        else:
            n, kind = 2, LINK_TYPE["PCIE"]  # through the CPU's root complex
        self._store(hops, ctypes.c_uint64, n, "hops")
        self._store(out, ctypes.c_uint32, kind, "amdsmi_link_type_t")
        return SUCCESS


__all__ = ["BoundaryViolation", "StandinLibrary", "bdf_as_uint", "gfx_version_number"]
