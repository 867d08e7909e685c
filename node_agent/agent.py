"""The agent's loop: probe every ``interval_seconds``, add allocations, expose, publish.

Probing and publishing are decoupled: a failed probe keeps the last inventory (counted in
``gpuplace_agent_probe_errors_total``), a failed publish waits out its backoff while probes go on,
and the next attempt sends the newest inventory.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, Protocol

from node_agent.inventory import NodeGPUInventory
from node_agent.metrics import AgentMetrics, InventorySnapshot
from node_agent.podresources import PodResourcesClient, apply_allocations
from node_agent.publish import NodePublisher

log = logging.getLogger(__name__)


class Probe(Protocol):
    """Something that reads a node's GPUs: ``NVMLProbe``, ``FakeProbe``."""

    def probe(self) -> NodeGPUInventory: ...


class Agent:
    def __init__(
        self,
        probe: Probe,
        *,
        snapshot: InventorySnapshot,
        metrics: AgentMetrics,
        publisher: NodePublisher | None = None,
        pod_resources: PodResourcesClient | None = None,
        interval_seconds: float = 30.0,
        on_inventory: Callable[[NodeGPUInventory], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.snapshot = snapshot
        self.metrics = metrics
        self.publisher = publisher
        self.pod_resources = pod_resources
        self.interval_seconds = interval_seconds
        self.on_inventory = on_inventory
        self._clock = clock

    def probe_once(self) -> NodeGPUInventory | None:
        """One probe: read, add allocations, store for /metrics, hand to the publisher. Errors are
        logged and counted; the previous inventory stays."""
        started = self._clock()
        try:
            inventory = self.probe.probe()
            if self.pod_resources is not None:
                allocations = self.pod_resources.allocations()
                if allocations is not None:
                    inventory = apply_allocations(inventory, allocations)
        except Exception as e:
            self.metrics.probe_errors.inc()
            log.error("probe failed, keeping the last inventory: %s", e, exc_info=log.isEnabledFor(logging.DEBUG))
            return None
        finally:
            self.metrics.probe_duration.observe(max(0.0, self._clock() - started))
        self.snapshot.set(inventory)
        if self.publisher is not None:
            self.publisher.offer(inventory)
        if self.on_inventory is not None:
            self.on_inventory(inventory)
        return inventory

    def run(self, stop: threading.Event) -> None:
        """Probe and publish until ``stop`` is set."""
        next_probe = self._clock()
        while not stop.is_set():
            now = self._clock()
            if now >= next_probe:
                self.probe_once()
                # Keep the cadence; after a long stall, start counting from now rather than bursting.
                next_probe = max(next_probe + self.interval_seconds, self._clock())
            if self.publisher is not None:
                self.publisher.step()
            wait = next_probe - self._clock()
            if self.publisher is not None:
                until = self.publisher.seconds_until_due()
                if until is not None:
                    wait = min(wait, until)
            stop.wait(timeout=max(0.05, wait if math.isfinite(wait) else self.interval_seconds))
