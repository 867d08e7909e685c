"""``gpuplace-agent --probe auto``: the vendor whose driver is on this node.

NVIDIA first: NVML if ``libnvidia-ml.so.1`` loads and sees GPUs; else AMD SMI if the ``amdsmi``
package and ``libamd_smi.so`` load and see GPUs. Until one does, each probe tries both again (a
driver installed later is found without a restart); once one has, the agent stays with it and
its failures are its own. Neither usable: ``DriverUnavailable`` naming both reasons (exit 3, or zero
GPUs with ``--keep-running-without-driver``), except where NVML loaded but saw no GPU and AMD SMI
saw none either: that is NVML's ``ProbeError`` with its hint (a container not given the GPUs), as
with ``--probe nvml``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from node_agent.inventory import NodeGPUInventory
from node_agent.probing import DriverUnavailable, ProbeError

log = logging.getLogger(__name__)

ProbeFactory = Callable[[], Any]


class AutoProbe:
    """Probes with the first vendor that answers. ``nvml`` and ``amd`` build the two probes
    (``NVMLProbe``, ``AMDProbe``) on first use."""

    def __init__(self, nvml: ProbeFactory, amd: ProbeFactory) -> None:
        self._factories = {"nvml": nvml, "amd": amd}
        self._probes: dict[str, Any] = {}
        self.chosen: str | None = None

    def _probe_with(self, vendor: str) -> NodeGPUInventory:
        if vendor not in self._probes:
            self._probes[vendor] = self._factories[vendor]()
        result: NodeGPUInventory = self._probes[vendor].probe()
        return result

    def probe(self) -> NodeGPUInventory:
        if self.chosen is not None:
            return self._probe_with(self.chosen)
        why: dict[str, str] = {}
        nvml_saw_none: ProbeError | None = None
        for vendor in ("nvml", "amd"):
            try:
                inventory = self._probe_with(vendor)
            except DriverUnavailable as e:
                why[vendor] = str(e)
                continue
            except ProbeError as e:  # the library loaded; no GPU, or none could be counted
                why[vendor] = str(e)
                if vendor == "nvml":
                    nvml_saw_none = e
                continue
            self.chosen = vendor
            log.info("--probe auto: reading the GPUs through %s", "NVML (NVIDIA)" if vendor == "nvml" else
                     "AMD SMI (AMD)")
            return inventory
        if nvml_saw_none is not None:
            raise ProbeError(f"{nvml_saw_none} (AMD SMI: {why['amd']})")
        raise DriverUnavailable(f"no usable GPU driver on this node: {why['nvml']}; {why['amd']}")


__all__ = ["AutoProbe"]
