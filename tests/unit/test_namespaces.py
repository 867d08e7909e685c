"""Namespace labels in cluster mode: the watch-fed cache, and a direct read for a namespace not yet delivered."""

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.cluster.sources import ClusterSource


def test_namespaces_are_cached_with_their_labels_and_unknown_ones_stay_unknown():
    c = ClusterCache(default_catalog())
    assert c.namespace_labels("team-a") is None
    c.namespaces_synced = False  # what ClusterWatch sets when it watches namespaces
    c.replace_nodes([])
    c.replace_pods([])
    assert not c.synced
    c.replace_namespaces([{"metadata": {"name": "team-a", "labels": {"gpu-team": "a"}}}])
    assert c.synced and c.namespace_labels("team-a") == {"gpu-team": "a"}
    c.apply_namespace_event("ADDED", {"metadata": {"name": "team-b"}})
    assert c.namespace_labels("team-b") == {}
    c.apply_namespace_event("MODIFIED", {"metadata": {"name": "team-a", "labels": {"gpu-team": "b"}}})
    assert c.namespace_labels("team-a") == {"gpu-team": "b"}
    c.apply_namespace_event("DELETED", {"metadata": {"name": "team-a"}})
    assert c.namespace_labels("team-a") is None


def test_a_namespace_the_watch_has_not_delivered_yet_is_read_directly_once():
    reads = []

    def read(name):
        reads.append(name)
        return {"metadata": {"name": name, "labels": {"gpu-team": "a"}}} if name == "new" else None

    c = ClusterCache(default_catalog())
    c.replace_namespaces([])
    source = ClusterSource(c, default_catalog(), read)
    assert source.namespace_labels("new") == {"gpu-team": "a"}
    assert source.namespace_labels("new") == {"gpu-team": "a"} and reads == ["new"]  # cached now
    assert source.namespace_labels("gone") is None and source.namespace_labels("gone") is None
    assert reads == ["new", "gone"]  # a failed read is not repeated on every filter call


def test_names_no_namespace_can_have_are_never_read_and_direct_reads_are_rate_limited(monkeypatch):
    from scheduler_extender.cluster import sources

    reads = []
    c = ClusterCache(default_catalog())
    c.replace_namespaces([])
    source = ClusterSource(c, default_catalog(), lambda name: reads.append(name))
    for bad in ("Team-A", "a" * 64, "-a", "a_b", "ns\n", "", "ｔｅａｍ"):
        assert source.namespace_labels(bad) is None
    assert reads == []
    clock = [1000.0]
    monkeypatch.setattr(sources.time, "monotonic", lambda: clock[0])
    source = ClusterSource(c, default_catalog(), lambda name: reads.append(name))
    for i in range(1000):  # a burst of requests naming ever new namespaces
        assert source.namespace_labels(f"forged-{i}") is None
    assert len(reads) == sources.NAMESPACE_READ_BURST
    clock[0] += 2.0
    for i in range(1000, 2000):
        source.namespace_labels(f"forged-{i}")
    assert len(reads) == sources.NAMESPACE_READ_BURST + 2 * sources.NAMESPACE_READS_PER_SECOND
