"""Kubernetes resource quantities and the byte units gpuplace uses.

Binary and decimal units are kept apart on purpose: ``40Gi`` is 40 x 2**30 bytes, ``40G`` is
40 x 10**9 bytes (Kubernetes ``resource.Quantity`` semantics). NVML and the inventory report VRAM
in MiB (2**20 bytes); datasheets and the EleutherAI / Hugging Face memory formulas count decimal
GB. Internally VRAM needs are bytes (int); messages print GiB.
"""

from __future__ import annotations

import re
from typing import Sequence
from decimal import Decimal, InvalidOperation, Overflow

MIB = 2**20
GIB = 2**30
GB = 10**9

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
    "n": Decimal("0.000000001"), "u": Decimal("0.000001"), "m": Decimal("0.001"),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
}
MAX_QUANTITY = Decimal(2**63 - 1)
"""Largest magnitude accepted: Kubernetes reads quantities as int64 (``Quantity.Value()``); beyond
it (``1e999999``) a number is no request anyone meant, and unbounded it would cost time and memory."""

# ASCII digits only, as Kubernetes' grammar (Python's \d also matches "４０"); one way to read every
# string, so matching is linear in its length: `\d+\.?\d*` could split a run of digits between its
# two parts every way, and a failing 8,000-digit value took seconds.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity."""


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity (``40Gi``, ``500M``, ``100m``, ``250u``, ``1.5e3``, ``8``) to a Decimal.

    Raises:
        QuantityError: not of the form <number><suffix>, suffix one of Ki Mi Gi Ti Pi Ei n u m k M G T P E
            (``k8s.io/apimachinery/pkg/api/resource``'s suffixes);
            not a string or number; or larger in magnitude than ``MAX_QUANTITY``.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, (int, float)):
        number, suffix = str(text), ""
    else:
        m = _QUANTITY.match(text.strip())
        if not m:
            raise QuantityError(f"{text!r} is not a quantity")
        number, suffix = m.group(1), m.group(2) or ""
    try:
        value = Decimal(number) * _SUFFIXES[suffix]
    except (InvalidOperation, Overflow) as e:  # e.g. '1e999999999': beyond Decimal's exponent range
        raise QuantityError(f"{text!r} is out of range (at most 2^63-1)") from e
    if not value.is_finite() or abs(value) > MAX_QUANTITY:
        raise QuantityError(f"{text!r} is out of range (at most 2^63-1)")
    return value


def parse_count(text: str | int | float) -> int:
    """A whole, non-negative device count from a quantity (``"2"``, ``2``).

    Raises:
        QuantityError: not a quantity, negative, or fractional (devices are whole).
    """
    value = parse_quantity(text)
    if value < 0 or value != value.to_integral_value():
        raise QuantityError(f"{text!r} is not a whole number of devices")
    return int(value)


def fmt_gib(num_bytes: float) -> str:
    """``32.5e9`` -> ``'30.3 GiB'``; whole values print without decimals (``'24 GiB'``)."""
    value = num_bytes / GIB
    if abs(value - round(value)) < 0.05:
        return f"{round(value)} GiB"
    return f"{value:.1f} GiB"


MAX_GIB_DECIMALS = 10
"""Decimals of GiB that tell any two byte counts apart (a byte is 9.3e-10 GiB)."""


def fmt_gib_below(values: Sequence[float], bound: float) -> tuple[list[str], str]:
    """``values`` (bytes, each below ``bound``) and ``bound`` as ``fmt_gib`` prints them, with
    more decimals where needed so that each printed value reads less than the printed bound:
    24,564 MiB against a need of 24,565 MiB is ``'23.988 GiB'`` < ``'23.989 GiB'``, never
    ``'24 GiB'`` < ``'24 GiB'``. A reason that says "X < Y" is true as printed."""
    shown, bound_shown = [fmt_gib(v) for v in values], fmt_gib(bound)
    if all(_gib_of(s) < _gib_of(bound_shown) for s in shown):
        return shown, bound_shown
    for decimals in range(1, MAX_GIB_DECIMALS + 1):
        shown = [f"{v / GIB:.{decimals}f} GiB" for v in values]
        bound_shown = f"{bound / GIB:.{decimals}f} GiB"
        if all(_gib_of(s) < _gib_of(bound_shown) for s in shown):
            return shown, bound_shown
    return [f"{int(v)} bytes" for v in values], f"{int(bound)} bytes"


def _gib_of(text: str) -> Decimal:
    return Decimal(text.removesuffix(" GiB"))
