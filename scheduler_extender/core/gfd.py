"""A node's GPUs from NVIDIA GPU feature discovery's labels, for nodes without gpuplace-agent.

GPU feature discovery (GFD, part of the NVIDIA device plugin and the GPU Operator) labels each
GPU node with the product, memory and count of its GPUs (NVIDIA/k8s-device-plugin
``docs/gpu-feature-discovery``, "Generated Labels"): ``nvidia.com/gpu.product`` (the driver's
name with spaces as ``-``: ``NVIDIA-A100-SXM4-80GB``), ``nvidia.com/gpu.memory`` (MiB, per GPU),
``nvidia.com/gpu.count``, ``nvidia.com/gpu.compute.major`` / ``.minor``. From these a node gets
an inventory the extender can decide on, marked as such (``NodeView.provenance``): what the
labels do not say — ECC, NVLink, health, UUIDs, which GPU a pod holds — stays unknown or
empty, and every reason for such a node says it came from labels. Whether such nodes are used
at all is the policy's ``inventory.onMissing`` (``gfd-labels``; default ``reject``).

Not derived: nodes whose labels describe MIG devices (``nvidia.com/mig.strategy`` single or
mixed with ``nvidia.com/mig-<profile>.count`` labels, or a product ending in ``-MIG-<profile>``):
which GPU each MIG device sits on is not in the labels, so those need the agent.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Mapping

from node_agent.inventory import API_VERSION, KIND, NodeGPUInventory
from scheduler_extender.core.node import Node, as_node

PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
CC_MAJOR = "nvidia.com/gpu.compute.major"
CC_MINOR = "nvidia.com/gpu.compute.minor"
LABEL_KEYS = (PRODUCT, MEMORY, COUNT, CC_MAJOR, CC_MINOR, "nvidia.com/mig.strategy")

PROVENANCE = "inventory from GPU feature discovery labels: ECC, NVLink and health unknown"
"""What every reason for a node decided on labels ends with."""

MAX_GPUS = 64  # a label is text anyone with `patch nodes` writes: bound what it can make us build
_DIGITS = re.compile(r"^[0-9]{1,7}$", re.ASCII)
_PRODUCT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", re.ASCII)


def gfd_labels(node: Node | Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """The GFD labels this module reads, as a hashable key (empty when the Node has none)."""
    labels = as_node(node).labels
    if not labels:
        return ()
    found = tuple((k, str(labels[k])) for k in LABEL_KEYS if k in labels)
    mig = any(isinstance(k, str) and k.startswith("nvidia.com/mig-") and k.endswith(".count") for k in labels)
    return found + ((("nvidia.com/mig-*.count", "present"),) if mig else ())


def inventory_from_labels(node_name: str, labels: tuple[tuple[str, str], ...],
                          now: dt.datetime | None = None) -> NodeGPUInventory | None:
    """An inventory from GFD labels (``gfd_labels``), or None when they do not describe whole
    NVIDIA GPUs: product, count (1 to ``MAX_GPUS``) and memory in MiB are required; MIG nodes
    are not derived (module docstring). Never raises."""
    found = dict(labels)
    product, count, memory = found.get(PRODUCT, ""), found.get(COUNT, ""), found.get(MEMORY, "")
    if not (_PRODUCT.match(product) and _DIGITS.match(count) and _DIGITS.match(memory)):
        return None
    if "-MIG-" in product or ("nvidia.com/mig-*.count" in found and found.get("nvidia.com/mig.strategy") in ("single", "mixed")):
        return None
    n, mib = int(count), int(memory)
    if not 1 <= n <= MAX_GPUS or mib <= 0:
        return None
    # GFD writes the driver's name with spaces as '-'; the catalog matches names by tokens, so
    # "NVIDIA-A100-SXM4-80GB" and "NVIDIA A100-SXM4-80GB" are the same model.
    # A shared GPU's product label ends in "-SHARED" (k8s-device-plugin internal/lm/resource.go,
    # getProductName): the model is the same.
    product = product.removesuffix("-SHARED")
    name = "NVIDIA " + product.removeprefix("NVIDIA-") if product.startswith("NVIDIA-") else product
    major, minor = found.get(CC_MAJOR, ""), found.get(CC_MINOR, "")
    cc = f"{int(major)}.{int(minor)}" if _DIGITS.match(major) and _DIGITS.match(minor) else None
    gpus = [{"index": i, "uuid": f"GPU-gfd-{node_name}-{i}", "vendor": "nvidia", "name": name, "memoryMiB": mib,
             **({"computeCapability": cc} if cc else {})} for i in range(n)]
    try:
        return NodeGPUInventory.model_validate({
            "apiVersion": API_VERSION, "kind": KIND, "nodeName": node_name,
            "observedAt": now or dt.datetime.now(dt.timezone.utc),
            "migStrategy": "none", "gpus": gpus})
    except ValueError:
        return None
