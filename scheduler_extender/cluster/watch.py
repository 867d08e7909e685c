"""List-then-watch of Nodes, Pods and Namespaces into the ``ClusterCache`` (cluster mode's only I/O).

The loop follows the client-go reflector, as kopf does (``_cogs/clients/watching.py``): list (in
pages), hand the whole list to the cache, then watch from the list's ``resourceVersion`` with
bookmarks on. ``410 Gone`` (the resource version was compacted away) or any broken stream means
relist; errors back off exponentially (capped) and mark the cache unsynced, so ``/readyz`` is
false until a relist succeeds. Objects are decoded as plain JSON (no model classes): the cache
needs a few fields, and deserializing thousands of Node models per relist is slow.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Callable, Iterator

import orjson
from kubernetes import client
from kubernetes.client.rest import ApiException

from scheduler_extender.cluster.cache import ClusterCache

log = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = 240
"""Server-side end of each watch request. Shorter than typical idle timeouts of proxies and load
balancers (300-350 s) so a silently dropped connection is replaced before anyone notices; with
bookmarks on, a re-watch resumes without a relist."""

PAGE_SIZE = 500
MAX_BACKOFF_SECONDS = 30.0
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""Only pods bound to a node and not finished can hold GPUs; a pod leaving this selector arrives
as DELETED."""


class WatchGone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


def _truncate(text: Any, limit: int = 300) -> str:
    s = str(text)
    return s if len(s) <= limit else s[:limit] + f"... ({len(s) - limit} more chars)"


def _iter_lines(resp: Any) -> Iterator[bytes]:
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


class ResourceWatcher:
    """Keeps one resource kind (nodes, pods or namespaces) of the cache in sync with the API
    server: list, then watch from the list's resourceVersion; relist on 410 Gone, a broken
    stream or an API error (with backoff).

    ``replace`` and ``apply``, when given, receive the listed objects and each watch event
    instead of the cache (``cache`` may then be None): the same loop for one object outside the
    cache, such as the policy ConfigMap (``policy_configmap``); ``unsynced`` is then called when a
    list or watch fails (the next full list syncs again).
    """

    def __init__(self, kind: str, list_fn: Callable[..., Any], cache: ClusterCache | None,
                 stop: threading.Event, field_selector: str | None = None,
                 on_relist: Callable[[str], None] | None = None,
                 watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS, *,
                 replace: Callable[[list[dict[str, Any]]], None] | None = None,
                 apply: Callable[[str, dict[str, Any]], None] | None = None,
                 unsynced: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._list = list_fn
        self._cache = cache
        self._stop = stop
        self._field_selector = field_selector
        self._on_relist = on_relist or (lambda kind: None)
        self._resp: Any = None
        self._watch_timeout = watch_timeout_seconds
        self._replace = replace or self._replace_in_cache
        self._apply = apply or self._apply_to_cache
        self._unsynced = unsynced

    def _kwargs(self) -> dict[str, Any]:
        return {"field_selector": self._field_selector} if self._field_selector else {}

    def list_all(self) -> str:
        """List every object (paged), replace the cache's view; returns the resourceVersion."""
        items: list[dict[str, Any]] = []
        token = None
        while True:
            resp = self._list(limit=PAGE_SIZE, _continue=token, _preload_content=False,
                              _request_timeout=(5, 60), **self._kwargs())
            body = orjson.loads(resp.data)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                rv = meta.get("resourceVersion", "")
                break
        self._replace(items)
        self._on_relist(self.kind)
        log.info("listed %d %s at resourceVersion %s", len(items), self.kind, rv)
        return rv

    def _replace_in_cache(self, items: list[dict[str, Any]]) -> None:
        assert self._cache is not None
        if self.kind == "nodes":
            self._cache.replace_nodes(items)
        elif self.kind == "namespaces":
            self._cache.replace_namespaces(items)
        else:
            self._cache.replace_pods(items)
        self._cache.stats.relists += 1

    def _apply_to_cache(self, etype: str, obj: dict[str, Any]) -> None:
        assert self._cache is not None
        if self.kind == "nodes":
            self._cache.apply_node_event(etype, obj)
        elif self.kind == "namespaces":
            self._cache.apply_namespace_event(etype, obj)
        else:
            self._cache.apply_pod_event(etype, obj)

    def watch_from(self, rv: str) -> str:
        """Stream events from ``rv`` until the server ends the watch; returns the last rv.

        Raises:
            WatchGone: the server answered 410 (rv compacted).
        """
        resp = self._list(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                          timeout_seconds=self._watch_timeout, _preload_content=False,
                          _request_timeout=(5, self._watch_timeout + 30), **self._kwargs())
        self._resp = resp
        try:
            for line in _iter_lines(resp):
                if self._stop.is_set():
                    break
                event = orjson.loads(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchGone(_truncate(obj.get("message")))
                    raise ApiException(status=obj.get("code"), reason=_truncate(obj.get("message")))
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if etype != "BOOKMARK":
                    self._apply(etype, obj)
                if new_rv:
                    rv = new_rv
        finally:
            resp.release_conn()
            self._resp = None
        return rv

    def _mark_unsynced(self) -> None:
        if self._unsynced is not None:
            self._unsynced()
        if self._cache is None:
            return
        if self.kind == "nodes":
            self._cache.nodes_synced = False
        elif self.kind == "namespaces":
            self._cache.namespaces_synced = False
        else:
            self._cache.pods_synced = False

    def run(self) -> None:
        backoff = 0.5
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self.list_all()
                    backoff = 0.5
                rv = self.watch_from(rv)
            except WatchGone as e:
                log.info("%s watch expired (410 Gone: %s); relisting", self.kind, e)
                rv = None
            except ApiException as e:
                if e.status == 410:
                    log.info("%s watch expired (410 Gone); relisting", self.kind)
                    rv = None
                    continue
                if e.status == 403 and self.kind == "namespaces" and self._cache is not None:
                    # Labels only serve tenants that select namespaces by label, which then deny
                    # (labels unknown); a missing RBAC rule must not take the whole extender down.
                    self._cache.namespaces_synced = None
                    log.error("cannot list/watch namespaces (HTTP 403): grant the extender's ServiceAccount "
                              "get, list and watch on namespaces; until then tenants with a namespaceSelector "
                              "deny pods (labels unknown); retrying in %.1f s", backoff)
                else:
                    self._mark_unsynced()
                    log.warning("%s watch failed: HTTP %s %s; retrying in %.1f s", self.kind, e.status,
                                _truncate(e.reason), backoff)
                rv = None
                self._stop.wait(backoff)
                backoff = min(MAX_BACKOFF_SECONDS, backoff * 2) * random.uniform(0.8, 1.2)
            except Exception as e:  # connection refused/reset, timeouts, bad JSON: relist later
                self._mark_unsynced()
                log.warning("%s watch failed: %s: %s; retrying in %.1f s", self.kind, type(e).__name__,
                            _truncate(e), backoff)
                rv = None
                self._stop.wait(backoff)
                backoff = min(MAX_BACKOFF_SECONDS, backoff * 2) * random.uniform(0.8, 1.2)

    def interrupt(self) -> None:
        """Close the current watch stream (tests use this to simulate a dropped connection)."""
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # noqa: BLE001 - closing a dead socket may fail; the loop relists
                pass


def namespace_reader(api_client: client.ApiClient, timeout_seconds: float = 1.0) -> Callable[[str], dict[str, Any] | None]:
    """``name -> decoded Namespace`` by a direct GET (None when absent or on any error; logged).

    For ``ClusterSource``: the watch may not have delivered a namespace created a moment ago.
    The short timeout bounds what a filter call can wait for it (kube-scheduler's default
    extender ``httpTimeout`` is 5 s).
    """
    core = client.CoreV1Api(api_client)

    def read(name: str) -> dict[str, Any] | None:
        try:
            resp = core.read_namespace(name, _preload_content=False, _request_timeout=timeout_seconds)
            return orjson.loads(resp.data)
        except ApiException as e:
            if e.status != 404:
                log.warning("reading namespace %s failed: HTTP %s %s", name, e.status, _truncate(e.reason))
        except Exception as e:  # noqa: BLE001 - timeouts, resets: the labels stay unknown
            log.warning("reading namespace %s failed: %s: %s", name, type(e).__name__, _truncate(e))
        return None

    return read


class ClusterWatch:
    """Runs the node, pod and namespace watchers in daemon threads.

    Namespaces are watched for their labels (policy tenants may select namespaces by label);
    the extender's ServiceAccount needs ``get``, ``list`` and ``watch`` on ``namespaces``, and
    ``/readyz`` waits for their first list too, unless listing them is forbidden (then labels stay
    unknown: tenants that select by label deny, and an error is logged).
    """

    def __init__(self, api_client: client.ApiClient, cache: ClusterCache,
                 on_relist: Callable[[str], None] | None = None,
                 watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS) -> None:
        core = client.CoreV1Api(api_client)
        self.stop_event = threading.Event()
        self.watchers = [
            ResourceWatcher("nodes", core.list_node, cache, self.stop_event, on_relist=on_relist,
                            watch_timeout_seconds=watch_timeout_seconds),
            ResourceWatcher("pods", core.list_pod_for_all_namespaces, cache, self.stop_event,
                            field_selector=POD_FIELD_SELECTOR, on_relist=on_relist,
                            watch_timeout_seconds=watch_timeout_seconds),
            ResourceWatcher("namespaces", core.list_namespace, cache, self.stop_event, on_relist=on_relist,
                            watch_timeout_seconds=watch_timeout_seconds),
        ]
        cache.namespaces_synced = False
        self.threads = [threading.Thread(target=w.run, name=f"watch-{w.kind}", daemon=True) for w in self.watchers]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for w in self.watchers:
            w.interrupt()

    def wait_synced(self, cache: ClusterCache, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cache.synced:
                return True
            time.sleep(0.05)
        return cache.synced
