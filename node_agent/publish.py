"""Publish the inventory on the agent's Node: the ``gpuplace.io/inventory`` annotation and labels.

What goes on the Node (one strategic-merge patch, so other annotations and labels are untouched):

- annotation ``gpuplace.io/inventory``: the inventory as compact JSON (``NodeGPUInventory.to_json``);
- labels for people and nodeSelectors, derived from the inventory (``node_labels``).

When: when anything other than ``observedAt`` and the GPUs' readings of the moment (their
temperature, ``READINGS``) changed since the last successful patch, and at
least every ``heartbeat_seconds`` (default 60) so the extender, which treats an inventory older
than its staleness limit (300 s by default) as stale, sees the agent alive. Only the latest
inventory is ever sent: a probe that arrives while the API server is away replaces the pending one,
so nothing newer is lost and nothing older is replayed.

Failures: retried with capped, jittered exponential backoff (``Backoff``), never blocking the probe
loop (``step`` returns at once; ``publish_until`` is the blocking form for ``--once``). The agent
needs only ``get`` and ``patch`` on ``nodes`` (it uses ``patch``).
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from node_agent.inventory import ANNOTATION, NodeGPUInventory
from node_agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

LABEL_GPU_MODEL = "gpuplace.io/gpu-model"
LABEL_GPU_COUNT = "gpuplace.io/gpu-count"
LABEL_GPU_MEMORY_GIB = "gpuplace.io/gpu-memory-gib"
LABEL_MIG = "gpuplace.io/mig"
LABEL_NVLINK = "gpuplace.io/nvlink"
LABEL_ECC = "gpuplace.io/ecc"

PATCH_CONTENT_TYPE = "application/strategic-merge-patch+json"
MAX_LOGGED_ERROR = 300  # API error bodies can be kilobytes of JSON; the first line or so is enough
NON_RETRYABLE = frozenset({400, 413, 415, 422})  # the request itself is wrong: retrying repeats it


class CoreV1Like(Protocol):
    """The one call of ``kubernetes.client.CoreV1Api`` the publisher uses (tests pass a fake)."""

    def patch_node(self, name: str, body: Any, **kwargs: Any) -> Any: ...


class PublishError(RuntimeError):
    """Publishing did not succeed before the deadline, or cannot succeed; the message says why."""


_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize_label_value(text: str) -> str:
    """A Kubernetes label value: at most 63 characters of ``[A-Za-z0-9._-]``, starting and ending
    alphanumeric (apimachinery ``IsValidLabelValue``). ``NVIDIA A100-SXM4-80GB`` ->
    ``NVIDIA-A100-SXM4-80GB``."""
    value = _LABEL_VALUE_BAD.sub("-", text.strip())
    value = value[:63]
    return value.strip("-._")


def node_labels(inventory: NodeGPUInventory) -> dict[str, str | None]:
    """The labels the agent owns; ``None`` removes a label (merge-patch semantics).

    - ``gpu-model``: the driver name of the most common GPU, label-safe (no catalog involved);
      removed when the node has no GPU.
    - ``gpu-count``: physical GPUs, healthy or not (health is in the annotation).
    - ``gpu-memory-gib``: VRAM per GPU of that model, GiB rounded to the nearest whole number
      (H100 SXM 81559 MiB -> 80, RTX 4090 24564 MiB -> 24).
    - ``mig``: ``true`` when any GPU is in MIG mode.
    - ``nvlink``: ``true`` when any GPU has an NVLink peer on this node.
    - ``ecc``: ``true`` only when every GPU has ECC on (a job that needs ECC must get it on
      whichever GPU it lands); unknown counts as not on.
    """
    gpus = inventory.gpus
    labels: dict[str, str | None] = {LABEL_GPU_COUNT: str(len(gpus))}
    if gpus:
        names = Counter(g.name for g in gpus)
        top = max(names.values())
        model = next(g for g in gpus if names[g.name] == top)  # ties: the lowest index wins
        labels[LABEL_GPU_MODEL] = sanitize_label_value(model.name) or None
        labels[LABEL_GPU_MEMORY_GIB] = str(int(model.memory_mib / 1024 + 0.5))
    else:
        labels[LABEL_GPU_MODEL] = None
        labels[LABEL_GPU_MEMORY_GIB] = None
    labels[LABEL_MIG] = _bool(any(g.mig_enabled for g in gpus))
    labels[LABEL_NVLINK] = _bool(any(g.nvlinks for g in gpus))
    labels[LABEL_ECC] = _bool(bool(gpus) and all(g.ecc_enabled is True for g in gpus))
    return labels


def _bool(value: bool) -> str:
    return "true" if value else "false"


def patch_body(inventory: NodeGPUInventory) -> dict[str, Any]:
    """The patch: the annotation and the labels, nothing else of the Node."""
    return {"metadata": {"annotations": {ANNOTATION: inventory.to_json()}, "labels": node_labels(inventory)}}


READINGS = ("temperatureC",)
"""GPU fields that are readings of the moment, like ``observedAt``: they drift at every probe, so
a change of them alone is not published at once (that would patch every Node at every probe) but
with the next heartbeat or other change, which carries the latest ones."""


def content_key(inventory: NodeGPUInventory) -> str:
    """What must differ for a change to be published: everything but ``observedAt`` and each GPU's
    ``READINGS``."""
    data = inventory.to_dict()
    data.pop("observedAt", None)
    for gpu in data.get("gpus", []):
        for key in READINGS:
            gpu.pop(key, None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``attempt`` (0-based): ``min(max_s, initial_s * multiplier**attempt)``,
    of which the last ``jitter`` fraction is random ("equal jitter", AWS Architecture Blog,
    "Exponential Backoff and Jitter"), so agents of many nodes do not hit a recovering API server
    in lockstep. Defaults: about 1 s, 2 s, 4 s ... capped at 30 s, so a Node is current again
    within half a minute of the API server's return, well inside the extender's 300 s staleness
    limit."""

    initial_s: float = 1.0
    max_s: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def delay(self, attempt: int, rand: float) -> float:
        base = min(self.max_s, self.initial_s * self.multiplier ** max(0, attempt))
        return base * (1 - self.jitter) + base * self.jitter * rand


class NodePublisher:
    """Keeps the Node's annotation and labels equal to the latest inventory."""

    def __init__(
        self,
        api: CoreV1Like,
        node_name: str,
        *,
        heartbeat_seconds: float = 60.0,
        backoff: Backoff = Backoff(),
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        request_timeout: tuple[float, float] = (5.0, 15.0),
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.heartbeat_seconds = heartbeat_seconds
        self.backoff = backoff
        self.metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._rng = rng
        self._request_timeout = request_timeout
        self._pending: NodeGPUInventory | None = None
        self._published_key: str | None = None
        self._published_at: float | None = None
        self._failures = 0
        self._retry_at = 0.0
        self.last_error: str = ""
        self.last_error_retryable = True

    def offer(self, inventory: NodeGPUInventory) -> None:
        """The newest inventory; it replaces any not yet published."""
        self._pending = inventory

    def changed(self) -> bool:
        return self._pending is not None and content_key(self._pending) != self._published_key

    def heartbeat_due(self) -> bool:
        if self._pending is None:
            return False
        return self._published_at is None or self._clock() - self._published_at >= self.heartbeat_seconds

    def due(self) -> bool:
        """Something to publish (a change, or the heartbeat), and not waiting out a backoff."""
        return (self.changed() or self.heartbeat_due()) and self._clock() >= self._retry_at

    def seconds_until_due(self) -> float | None:
        """How long the caller may sleep before ``step`` has work; None if nothing is pending."""
        if self._pending is None:
            return None
        now = self._clock()
        if self.changed() or self._published_at is None:
            return max(0.0, self._retry_at - now)
        heartbeat_at = self._published_at + self.heartbeat_seconds
        return max(0.0, max(heartbeat_at, self._retry_at) - now)

    def step(self) -> bool:
        """Publish the pending inventory if it is due; True when a patch succeeded now."""
        if not self.due():
            return False
        return self._attempt()

    def _attempt(self) -> bool:
        inventory = self._pending
        assert inventory is not None
        try:
            self.api.patch_node(
                self.node_name,
                patch_body(inventory),
                _content_type=PATCH_CONTENT_TYPE,
                _request_timeout=self._request_timeout,
            )
        except Exception as e:  # API server away, RBAC, network: all retried with backoff
            self._on_failure(e)
            return False
        reason = "changed" if self.changed() else "heartbeat"
        self._published_key = content_key(inventory)
        self._published_at = self._clock()
        if self._failures:
            log.info("published the inventory of node %s again after %d failed attempts", self.node_name, self._failures)
        else:
            log.debug("published the inventory of node %s (%s)", self.node_name, reason)
        self._failures = 0
        self._retry_at = 0.0
        self.last_error = ""
        if self.metrics is not None:
            self.metrics.last_publish.set(self._wall_clock())
        return True

    def _on_failure(self, err: Exception) -> None:
        status = getattr(err, "status", None)
        self.last_error_retryable = status not in NON_RETRYABLE
        self.last_error = _describe(err)
        delay = self.backoff.delay(self._failures, self._rng())
        self._failures += 1
        self._retry_at = self._clock() + delay
        if self.metrics is not None:
            self.metrics.publish_errors.inc()
        log.warning(
            "patching node %s failed (attempt %d): %s; next try in %.1f s",
            self.node_name, self._failures, self.last_error, delay,
        )

    def publish_until(self, timeout_seconds: float) -> None:
        """Publish the pending inventory now, retrying with backoff until ``timeout_seconds`` pass.
        Raises ``PublishError`` when it did not succeed, or at once when the API server rejected
        the request itself (4xx other than 401/403/404/409/429)."""
        if self._pending is None:
            raise PublishError("nothing to publish")
        deadline = self._clock() + timeout_seconds
        self._retry_at = 0.0
        while True:
            if self._attempt():
                return
            if not self.last_error_retryable:
                raise PublishError(f"the API server rejected the patch of node {self.node_name}: {self.last_error}")
            wait = self._retry_at - self._clock()
            if self._clock() + max(0.0, wait) > deadline:
                raise PublishError(
                    f"could not patch node {self.node_name} within {timeout_seconds:g} s "
                    f"({self._failures} attempts); last error: {self.last_error}"
                )
            self._sleep(max(0.0, wait))


def _describe(err: Exception) -> str:
    """One line about an API failure, cut short: status and reason, then the server's message."""
    status = getattr(err, "status", None)
    if status is not None:
        message = ""
        body = getattr(err, "body", None)
        if body:
            try:
                message = json.loads(body).get("message", "")
            except (ValueError, AttributeError):
                message = str(body)
        text = f"HTTP {status} {getattr(err, 'reason', '') or ''}".strip()
        if status == 404:
            text += " (no such Node: check --node-name / NODE_NAME)"
        elif status in (401, 403):
            text += " (the agent's ServiceAccount needs get/patch on nodes)"
        if message:
            text += f": {message}"
    else:
        text = f"{type(err).__name__}: {err}"
    text = " ".join(text.split())
    return text if len(text) <= MAX_LOGGED_ERROR else text[: MAX_LOGGED_ERROR - 3] + "..."
