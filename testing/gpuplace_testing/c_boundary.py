"""What the stand-ins for a vendor's C library share (``nvml_standin``, ``amdsmi_standin``): reading
ctypes arguments as C receives them, entry points with ``restype``/``argtypes``, and writing
out-parameters only into buffers of the size the vendor's header gives."""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable


class BoundaryViolation(AssertionError):
    """A caller passed what the vendor's header does not accept there (wrong buffer size, null pointer)."""


def value_of(arg: Any) -> int:
    """A by-value C integer argument: the bindings pass Python ints, IntEnums or ctypes scalars."""
    return int(getattr(arg, "value", arg))


def target_of(arg: Any) -> Any:
    """The ctypes object a pointer argument points at (``byref(x)``, ``pointer(x)`` or an array)."""
    obj = getattr(arg, "_obj", None)  # ctypes.byref() keeps the object it refers to
    if obj is not None:
        return obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    if isinstance(arg, ctypes.Array):
        return arg
    raise BoundaryViolation(f"expected a pointer argument, got {arg!r}")


def address_of(handle: Any) -> int | None:
    """The address an opaque handle (``nvmlDevice_t``, ``amdsmi_processor_handle``...) carries; None for NULL."""
    if isinstance(handle, int):
        return handle or None
    return ctypes.cast(handle, ctypes.c_void_p).value


class Symbol:
    """One C entry point: callable, and accepts ``restype``/``argtypes`` as a ctypes function does."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.__name__ = name
        self._fn = fn
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)


class Boundary:
    """A stand-in for one scenario (``fixture``) and the checks it makes at its boundary. ``calls``:
    every symbol called, in order; ``unimplemented``: symbols the stand-in lacks (tests fail on
    any); ``violations``: calls that broke the header's contract (tests fail on any). Subclasses name the header (``HEADER``) and the status of a
    string buffer too small (``INSUFFICIENT_SIZE``)."""

    HEADER = "the header"
    INSUFFICIENT_SIZE = -1
    SUCCESS = 0

    def __init__(self, fixture: Any, *, source: str = "scenario") -> None:
        self.fixture = fixture
        self.source = source
        self.calls: list[str] = []
        self.unimplemented: list[str] = []
        self.violations: list[str] = []
        self._init_count = 0
        self._lock = threading.Lock()

    @property
    def initialized(self) -> bool:
        return self._init_count > 0

    def _count_init(self, failure: int | None) -> int:
        """The library's init: ``failure`` where the scenario has one, else one more user."""
        if failure is not None:
            return failure
        with self._lock:
            self._init_count += 1
        return self.SUCCESS

    def _violate(self, message: str) -> None:
        self.violations.append(message)
        raise BoundaryViolation(message)

    def _store(self, arg: Any, ctype: Any, value: Any, what: str) -> None:
        """``*arg = value`` as the C type ``ctype``, after checking the caller's buffer fits it."""
        target = target_of(arg)
        if ctypes.sizeof(target) != ctypes.sizeof(ctype):
            self._violate(f"{what}: caller's buffer is {ctypes.sizeof(target)} bytes, {self.HEADER}'s {ctype.__name__} "
                          f"is {ctypes.sizeof(ctype)}")
        src = value if isinstance(value, ctypes._SimpleCData | ctypes.Structure) else ctype(value)
        ctypes.memmove(ctypes.addressof(target), ctypes.addressof(src), ctypes.sizeof(ctype))

    def _store_string(self, buf: Any, length: Any, text: str) -> int:
        """Copy ``text`` and its NUL into a ``char *`` buffer the caller says holds ``length`` bytes."""
        data = text.encode()
        size = value_of(length)
        if len(data) + 1 > size:
            return self.INSUFFICIENT_SIZE
        target = target_of(buf)
        if ctypes.sizeof(target) < size:
            self._violate(f"string buffer of {ctypes.sizeof(target)} bytes passed with length {size}")
        ctypes.memmove(ctypes.addressof(target), data + b"\0", len(data) + 1)
        return self.SUCCESS


__all__ = ["Boundary", "BoundaryViolation", "Symbol", "address_of", "target_of", "value_of"]
