"""The placement policy read from one ConfigMap through the API (``--policy-configmap NS/NAME``).

Why the API and not a mounted volume: the kubelet refreshes ConfigMap volumes only every minute or
so (and never where no kubelet runs, as in the end-to-end tests); a watch sees an edit at once.
The watch is limited to the one object (field selector ``metadata.name``), so RBAC can grant
``get``/``list``/``watch`` with ``resourceNames: [NAME]`` and nothing else.

A valid change swaps the service's ``Engine`` whole (requests in flight keep the policy they
started with). An invalid one is rejected: the running policy stays, and the rejection shows up
three ways: an ERROR log line, ``gpuplace_extender_policy_reloads_total{result="rejected"}``, and
a Warning Event ``PolicyRejected`` on the ConfigMap whose message names the field path.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import socket
import threading
import uuid
from typing import Any, Callable, Mapping, Protocol

import orjson
from kubernetes import client
from kubernetes.client.rest import ApiException

from scheduler_extender.cluster.watch import ResourceWatcher
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import Policy, PolicyError, parse_policy



class _PolicyReloads(Protocol):
    def record(self, result: str) -> None: ...


class PolicyMetrics(Protocol):
    """The metrics the watcher records (``service.metrics.ExtenderMetrics`` implements it): the
    service passes them in; the cluster side never imports the service, not even for type checking."""

    policy: _PolicyReloads

log = logging.getLogger("gpuplace.extender.policy")

DEFAULT_KEY = "policy.yaml"
EVENT_MESSAGE_LIMIT = 1024  # the API server rejects longer Event messages


def parse_ref(ref: str) -> tuple[str, str]:
    """``"NAMESPACE/NAME"`` -> (namespace, name).

    Raises:
        ValueError: not of that form.
    """
    ns, sep, name = ref.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ValueError(f"--policy-configmap {ref!r}: expected NAMESPACE/NAME, e.g. gpuplace/gpuplace-policy")
    return ns, name


class PolicyConfigMapError(RuntimeError):
    """The ConfigMap cannot be read, lacks the key, or holds an invalid policy (at start)."""


class PolicyConfigMapWatcher:
    """Keeps ``apply`` fed with the ConfigMap's policy; rejects invalid edits.

    Args:
        api: a kubernetes ``ApiClient``.
        namespace, name, key: the ConfigMap and its data key holding the policy YAML.
        metrics: the extender's metrics (reload counters, generation).
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str, key: str,
                 metrics: PolicyMetrics, catalog: Any = None) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.name, self.key = namespace, name, key
        self.metrics, self._catalog = metrics, catalog
        self._apply: Callable[[Policy], None] = lambda policy: None
        self.policy: Policy | None = None  # the last valid policy read
        self._last_text: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def source(self) -> str:
        return f"configmap {self.namespace}/{self.name} key {self.key}"

    # ---- reading ---------------------------------------------------------------------------
    def _text_of(self, cm: Mapping[str, Any]) -> str | None:
        return ((cm.get("data") or {}).get(self.key)) if cm else None

    def _list(self) -> tuple[Mapping[str, Any] | None, str]:
        resp = self.core.list_namespaced_config_map(
            self.namespace, field_selector=f"metadata.name={self.name}", _preload_content=False,
            _request_timeout=(5, 30))
        body = orjson.loads(resp.data)
        items = body.get("items") or []
        return (items[0] if items else None), (body.get("metadata") or {}).get("resourceVersion", "")

    def load_initial(self) -> Policy:
        """Read and validate the policy once, at start.

        Raises:
            PolicyConfigMapError: API error, ConfigMap or key missing, invalid policy.
        """
        try:
            cm, _ = self._list()
        except ApiException as e:
            raise PolicyConfigMapError(f"{self.source}: cannot read: HTTP {e.status} {e.reason}") from e
        except Exception as e:  # noqa: BLE001 - connection errors of any kind
            raise PolicyConfigMapError(f"{self.source}: cannot read: {type(e).__name__}: {e}") from e
        if cm is None:
            raise PolicyConfigMapError(f"{self.source}: ConfigMap not found")
        text = self._text_of(cm)
        if text is None:
            raise PolicyConfigMapError(f"{self.source}: the ConfigMap has no key {self.key!r}")
        try:
            policy = parse_policy(text, source=self.source, catalog=self._catalog)
        except PolicyError as e:
            self._event(cm, "Warning", "PolicyRejected", str(e))
            raise PolicyConfigMapError(str(e)) from e
        self._last_text = text
        self.policy = policy
        return policy

    # ---- applying --------------------------------------------------------------------------
    def handle(self, cm: Mapping[str, Any] | None) -> bool | None:
        """Apply the ConfigMap's policy if it changed. True: applied, False: rejected, None: unchanged."""
        text = self._text_of(cm) if cm else None
        if text is None:
            if cm is not None and self._last_text is not None:
                log.error("%s: key missing; keeping the running policy", self.source)
            return None
        if text == self._last_text:
            return None
        self._last_text = text
        try:
            policy = parse_policy(text, source=self.source, catalog=self._catalog)
        except PolicyError as e:
            log.error("policy change rejected, keeping the running policy: %s", e)
            self.metrics.policy.record("rejected")
            self._event(cm, "Warning", "PolicyRejected", f"{e}; the running policy stays in force")
            return False
        self._apply(policy)
        self.policy = policy
        self.metrics.policy.record("applied")
        log.info("policy reloaded from %s (resourceVersion %s)", self.source,
                 (cm.get("metadata") or {}).get("resourceVersion") if cm else "?")
        self._event(cm, "Normal", "PolicyApplied", f"gpuplace-extender applied the policy from {self.source}")
        return True

    def _event(self, cm: Mapping[str, Any] | None, etype: str, reason: str, message: str) -> None:
        """Record an Event on the ConfigMap; failures are logged, never raised (the reload stands)."""
        meta = (cm or {}).get("metadata") or {}
        now = dt.datetime.now(dt.timezone.utc)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{self.name}.{uuid.uuid4().hex[:12]}", namespace=self.namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="ConfigMap", name=self.name, namespace=self.namespace,
                uid=meta.get("uid"), resource_version=meta.get("resourceVersion")),
            reason=reason, message=message[:EVENT_MESSAGE_LIMIT], type=etype,
            source=client.V1EventSource(component="gpuplace-extender"),
            first_timestamp=now, last_timestamp=now, count=1,
            reporting_component="gpuplace-extender", reporting_instance=_instance())
        try:
            self.core.create_namespaced_event(self.namespace, body, _request_timeout=(5, 10))
        except Exception as e:  # noqa: BLE001 - an Event is a courtesy; the log line already has it
            log.warning("cannot record Event %s on %s: %s", reason, self.source, e)

    # ---- the loop ----------------------------------------------------------------------------
    def _apply_event(self, etype: str, cm: dict[str, Any]) -> None:
        if etype in ("ADDED", "MODIFIED"):
            self.handle(cm)
        elif etype == "DELETED":
            log.error("%s was deleted; keeping the running policy", self.source)
            self._last_text = None

    def run(self) -> None:
        """List and watch the ConfigMap until ``stop`` (``watch.ResourceWatcher``'s loop: relists
        on 410 Gone and on errors, with backoff); each version goes to ``handle``."""
        ResourceWatcher("configmaps", functools.partial(self.core.list_namespaced_config_map, self.namespace),
                        None, self._stop, field_selector=f"metadata.name={self.name}",
                        replace=lambda items: self.handle(items[0] if items else None),
                        apply=self._apply_event).run()

    def start(self, apply: Callable[[Policy], None]) -> None:
        """Watch in a daemon thread; ``apply`` gets each new valid policy."""
        self._apply = apply
        self._thread = threading.Thread(target=self.run, name="policy-configmap-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def _instance() -> str:
    return socket.gethostname()


def engine_swapper(service: Any) -> Callable[[Policy], None]:
    """``apply`` for :class:`PolicyConfigMapWatcher`: a new ``Engine`` with the same catalog."""
    def apply(policy: Policy) -> None:
        service.engine = Engine(policy, service.engine.catalog)
    return apply
