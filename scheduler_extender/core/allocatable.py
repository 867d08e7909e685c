"""An inventory is checked against the Node's ``status.allocatable`` before it is trusted.

The inventory annotation can be written by anyone allowed to patch the Node; ``status.allocatable``
is written by the kubelet from what the device plugins registered. Where the two disagree the
kubelet is believed, with one asymmetry:

- an inventory may report **fewer** healthy devices of a resource than allocatable: the agent may
  lag behind, see a GPU as unhealthy before the device plugin does, or the plugin may share GPUs
  (NVIDIA time-slicing advertises ``replicas`` x GPUs). The extender then decides on the devices
  the inventory reports, the smaller set; kube-scheduler still caps the count by allocatable.
- an inventory that reports **more** healthy devices of a resource than allocatable (8
  ``nvidia.com/gpu`` where allocatable says 2; ``nvidia.com/mig-3g.40gb`` devices under the
  ``mixed`` strategy that the device plugin does not advertise; ``amd.com/gpu`` on a node without
  the ROCm plugin) describes hardware the node does not offer: the whole inventory is rejected
  for that node with a reason, since a document wrong about counts is not trusted about models,
  VRAM or NVLink either.

Unknown stays unknown: a Node without ``status.allocatable`` (None here) is not checked; a
resource missing from a known allocatable counts as 0.
"""

from __future__ import annotations

from typing import Any, Mapping

from scheduler_extender.core.node import Node, as_node
from scheduler_extender.core.devices import NodeView, allocatable_from_view
from scheduler_extender.core.pod_requests import MIG_PREFIX, is_gpu_resource
from scheduler_extender.core.quantity import QuantityError, parse_count, parse_quantity

SHOWN_VALUE_CHARS = 32
"""Characters of an unusable allocatable value a reason repeats (a Node is any client's text)."""


class GpuAllocatable(dict[str, int]):
    """GPU resource -> device count of a Node's ``status.allocatable``, and in ``unusable`` the
    values that are no whole device count (``"-1"``, ``"1.5"``, as sent, cut to
    ``SHOWN_VALUE_CHARS``), so that a reason can say what the Node really sent."""

    def __init__(self, counts: Mapping[str, int] = {}, unusable: Mapping[str, str] | None = None) -> None:  # noqa: B006
        super().__init__(counts)
        self.unusable: dict[str, str] = dict(unusable or {})

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other) and getattr(other, "unusable", {}) == self.unusable

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # a dict

    def key(self) -> tuple[tuple[str, int], tuple[tuple[str, str], ...]]:
        """A hashable value of both parts, for memo keys."""
        return tuple(sorted(self.items())), tuple(sorted(self.unusable.items()))


def gpu_allocatable(node: Node | Mapping[str, Any] | None) -> GpuAllocatable | None:
    """The GPU resources of a Node's ``status.allocatable`` (a ``core.node.Node``, or a decoded
    ``v1.Node``); None when absent.

    Quantities that do not parse as whole, non-negative counts are left out of the counts
    (unknown, not 0) and kept as sent in ``unusable``: the API server validates quantities, so
    this happens only for hand-made objects.
    """
    allocatable = as_node(node).allocatable
    if allocatable is None:
        return None
    out = GpuAllocatable()
    for name, value in allocatable.items():
        if not isinstance(name, str) or not is_gpu_resource(name):
            continue
        try:
            out[name] = parse_count(value)
        except (QuantityError, TypeError):
            text = value if isinstance(value, str) else repr(value)
            out.unusable[name] = text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS] + "..."
    return out


MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
"""GPU feature discovery's node label: the MIG strategy the NVIDIA device plugin runs with."""


def node_mig_strategy(node: Node | Mapping[str, Any] | None, allocatable: Mapping[str, int] | None = None) -> str | None:
    """How the NVIDIA device plugin exposes MIG devices on this Node, from what the Node shows.

    GPU feature discovery's ``nvidia.com/mig.strategy`` label when it is ``none``, ``single`` or
    ``mixed``; else ``mixed`` when ``status.allocatable`` has a ``nvidia.com/mig-*`` resource (only
    that strategy advertises them); else None (unknown: no MIG resource and no label, which is
    what ``none`` and ``single`` look like alike). ``allocatable``: the node's ``gpu_allocatable``
    when the caller has it already (node events are a hot path).
    """
    node = as_node(node)
    label = node.labels.get(MIG_STRATEGY_LABEL)
    if label in ("none", "single", "mixed"):
        return str(label)
    if allocatable is None:
        allocatable = gpu_allocatable(node)
    if allocatable and any(name.startswith(MIG_PREFIX) for name in allocatable):
        return "mixed"
    return None


def allocatable_contradiction(view: NodeView, allocatable: Mapping[str, int] | None) -> str | None:
    """Why ``view`` claims more than the Node's allocatable offers, or None when it does not.

    Args:
        view: the node's parsed inventory.
        allocatable: GPU resource -> count from ``status.allocatable`` (``gpu_allocatable``);
            None when unknown (no check).

    Returns:
        A reason naming each resource claimed beyond allocatable, e.g. "inventory claims 8 healthy
        nvidia.com/gpu, but the Node's status.allocatable has 2", or None.
    """
    if allocatable is None:
        return None
    claims = []
    unusable = getattr(allocatable, "unusable", {})
    for resource, claimed in sorted(allocatable_from_view(view).items()):
        have = allocatable.get(resource, 0)
        if resource in unusable:
            claims.append(f"{claimed} healthy {resource}, but the Node's status.allocatable has "
                          f"{unusable[resource]!r}, which is no whole device count")
        elif claimed > have:
            claims.append(f"{claimed} healthy {resource}, but the Node's status.allocatable has {have}")
    if not claims:
        return None
    return ("inventory claims " + "; and ".join(claims)
            + " (an inventory may report fewer devices than the device plugin, never more)")


def host_allocatable(node: Node | Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """(CPU millicores, memory bytes) of a Node's ``status.allocatable`` (a ``core.node.Node``, or
    a decoded ``v1.Node``); each None when absent or not a quantity (unknown, never 0)."""
    allocatable = as_node(node).allocatable
    if allocatable is None:
        return None, None
    out: list[int | None] = []
    for name, scale in (("cpu", 1000), ("memory", 1)):
        try:
            out.append(int(parse_quantity(allocatable[name]) * scale) if name in allocatable else None)
        except (QuantityError, TypeError):
            out.append(None)
    return out[0], out[1]
