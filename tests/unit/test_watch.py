"""The list-then-watch loop: relist on 410 Gone and on a broken stream, resume from bookmarks."""

import json
import threading

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.cluster.watch import ResourceWatcher


class FakeResponse:
    def __init__(self, data=b"", lines=(), fail_after=None):
        self.data = data
        self._lines = list(lines)
        self._fail_after = fail_after

    def stream(self, amt=None, decode_content=False):
        for i, line in enumerate(self._lines):
            if self._fail_after is not None and i == self._fail_after:
                raise ConnectionResetError("peer reset")
            yield (json.dumps(line) + "\n").encode()

    def release_conn(self):
        pass


def node(name, rv):
    return {"metadata": {"name": name, "resourceVersion": rv, "annotations": {}}}


class FakeAPI:
    """Scripted list/watch answers; records how it was called."""

    def __init__(self, script, stop):
        self.script = list(script)
        self.calls = []
        self.stop = stop

    def __call__(self, **kw):
        self.calls.append(kw)
        if not self.script:
            self.stop.set()
            return FakeResponse(lines=[])
        return self.script.pop(0)


def listing(rv, *names):
    return FakeResponse(data=json.dumps({"items": [node(n, rv) for n in names], "metadata": {"resourceVersion": rv}}).encode())


def run(script):
    stop = threading.Event()
    api = FakeAPI(script, stop)
    cache = ClusterCache(default_catalog())
    cache.replace_pods([])
    w = ResourceWatcher("nodes", api, cache, stop)
    w.run()
    return api, cache


def test_a_410_gone_relists_and_watches_from_the_new_resource_version():
    api, cache = run([
        listing("10", "a"),
        FakeResponse(lines=[{"type": "ADDED", "object": node("b", "11")},
                            {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}]),
        listing("20", "a", "c"),
    ])
    watches = [c for c in api.calls if c.get("watch")]
    assert watches[0]["resource_version"] == "10"
    assert api.calls[2].get("watch") is None  # the relist
    assert watches[1]["resource_version"] == "20"
    assert cache.node_names() == ["a", "c"]  # b vanished with the relist
    assert cache.stats.relists == 2


def test_bookmarks_advance_the_resource_version_without_touching_the_cache():
    api, cache = run([
        listing("10", "a"),
        FakeResponse(lines=[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}]),
    ])
    watches = [c for c in api.calls if c.get("watch")]
    assert [w["resource_version"] for w in watches[:2]] == ["10", "15"]
    assert watches[0]["allow_watch_bookmarks"] is True
    assert cache.node_names() == ["a"]


def test_a_broken_stream_marks_the_cache_unsynced_and_relists():
    api, cache = run([
        listing("10", "a"),
        FakeResponse(lines=[{"type": "ADDED", "object": node("b", "11")}, {}], fail_after=1),
        listing("30", "a", "b", "d"),
    ])
    assert cache.node_names() == ["a", "b", "d"]
    assert cache.nodes_synced  # synced again after the successful relist


def test_namespaces_are_listed_then_watched_for_their_labels():
    stop = threading.Event()
    ns = {"metadata": {"name": "team-a", "resourceVersion": "5", "labels": {"gpu-team": "a"}}}
    api = FakeAPI([
        FakeResponse(data=json.dumps({"items": [ns], "metadata": {"resourceVersion": "5"}}).encode()),
        FakeResponse(lines=[
            {"type": "ADDED", "object": {"metadata": {"name": "team-b", "resourceVersion": "6", "labels": {"x": "y"}}}},
            {"type": "DELETED", "object": {"metadata": {"name": "team-a", "resourceVersion": "7"}}},
        ]),
    ], stop)
    cache = ClusterCache(default_catalog())
    cache.namespaces_synced = False
    ResourceWatcher("namespaces", api, cache, stop).run()
    assert cache.namespaces_synced is True
    assert cache.namespace_labels("team-b") == {"x": "y"} and cache.namespace_labels("team-a") is None
    assert api.calls[1]["resource_version"] == "5"


def test_forbidden_namespaces_do_not_block_readiness_and_leave_labels_unknown():
    from kubernetes.client.rest import ApiException

    stop = threading.Event()

    def forbidden(**kw):
        stop.set()
        raise ApiException(status=403, reason="Forbidden")

    cache = ClusterCache(default_catalog())
    cache.replace_nodes([])
    cache.replace_pods([])
    cache.namespaces_synced = False
    assert not cache.synced
    ResourceWatcher("namespaces", forbidden, cache, stop).run()
    assert cache.synced and cache.namespace_labels("team-a") is None


def test_the_watch_timeout_is_asked_of_the_server_and_bounds_the_client_read():
    stop = threading.Event()
    api = FakeAPI([listing("10", "a"), FakeResponse(lines=[])], stop)
    cache = ClusterCache(default_catalog())
    ResourceWatcher("nodes", api, cache, stop, watch_timeout_seconds=5).run()
    watch = next(c for c in api.calls if c.get("watch"))
    assert watch["timeout_seconds"] == 5
    assert watch["_request_timeout"] == (5, 35)
