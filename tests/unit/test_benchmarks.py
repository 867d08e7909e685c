"""The benchmarks' generated clusters are valid and realistic, and the benchmarks run (smoke: tiny
sizes, no timing asserted — speed is reported by ``make bench``, never asserted)."""

import json
from collections import Counter

from benchmarks import bench_cache, bench_extender, micro_batch, micro_cpu_only, micro_extender, micro_scheduler
from benchmarks.cluster import NODE_MIX, generate_cluster, generate_pods
from node_agent.inventory import parse_inventory
from scheduler_extender.core.engine import Engine


def test_generated_nodes_are_valid_inventories_in_the_announced_mix():
    docs = generate_cluster(400)
    invs = [parse_inventory(d) for d in docs]
    assert all(len(i.gpus) == 8 for i in invs)
    assert len({i.node_name for i in invs}) == 400
    names = Counter(i.gpus[0].name for i in invs)
    assert names["NVIDIA GeForce RTX 4090"] == round(400 * dict(NODE_MIX)["rtx-4090"])
    assert Counter(i.mig_strategy for i in invs) == {"none": 340, "single": 40, "mixed": 20}
    units = [u for i in invs for g in i.gpus for u in ([g] if not g.mig_enabled else g.mig_devices)]
    held = sum(1 for u in units if u.allocated_to) / len(units)
    assert 0.2 < held < 0.4


def test_generated_clusters_and_pods_are_deterministic():
    assert generate_cluster(30) == generate_cluster(30)
    assert generate_pods(40) == generate_pods(40)
    assert len({p["metadata"]["name"] for p in generate_pods(40)}) == 40


def test_the_pod_mix_places_most_pods_somewhere_in_a_generated_cluster():
    from scheduler_extender.core.devices import NodeState, allocation_from_inventory, build_node_view
    from scheduler_extender.core.catalog import default_catalog
    states = []
    for d in generate_cluster(200):
        v = build_node_view(parse_inventory(d), default_catalog())
        states.append(NodeState(v.name, v, allocation_from_inventory(v)))
    engine = Engine()
    placed = sum(any(r.passed for r in engine.filter(engine.job(p), states, None)) for p in generate_pods(60))
    assert placed >= 55


def test_extender_benchmark_runs_both_modes_and_verbs_against_both_servers(tmp_path):
    out = tmp_path / "extender.json"
    bench_extender.main(["--sizes", "20", "--requests", "4", "--concurrency", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    cells = data["sizes"][0]["cells"]
    assert {(c["nodeCacheCapable"], c["verb"]) for c in cells} == {
        (True, "filter"), (True, "prioritize"), (False, "filter"), (False, "prioritize")}
    assert all(c["gpuplace"]["requests"] == 4 and c["floor"]["requests"] == 4 for c in cells)
    assert data["sizes"][0]["extender_peak_rss_mib"] > 0
    assert data["machine"]["cpus"] >= 1 and data["machine"]["load_average_at_start"]


def test_cache_benchmark_runs_and_measures_memory_in_a_fresh_process(tmp_path):
    out = tmp_path / "cache.json"
    bench_cache.main(["--nodes", "30", "--pods", "100", "--memory-sizes", "30", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["events"]["nodes"] == 30 and data["events"]["pod_added_events_per_s"] > 0
    assert data["memory"][0]["nodes"] == 30 and data["memory"][0]["process_rss_mib"] > 0


def test_the_in_process_scheduler_replay_places_pods_and_prints_the_time_per_pod(capsys):
    micro_scheduler.main(["--nodes", "40", "--pods", "30"])
    out = capsys.readouterr().out
    assert "40 nodes, window 40: 30 pods" in out and "ms per pod" in out
    assert micro_scheduler.sample_size(500) == 230 and micro_scheduler.sample_size(5000) == 500


def test_the_in_process_filter_timing_reports_first_requests_of_a_spec_apart(capsys):
    micro_extender.main(["--nodes", "40", "--requests", "30"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("filter")[1].split(":")[0].strip() for line in lines[:3]] == [
        "first of its spec", "repeated spec", "all"]
    first, repeat = (int(line.split("n=")[1].split()[0]) for line in lines[:2])
    assert first + repeat == 30 and 0 < first < 30
    assert lines[3].startswith("  first request of a spec, means: parsing the request ") and "KiB" in lines[3]
    assert len(lines) == 4


def test_the_cpu_only_pod_timing_binds_gpu_pods_first_and_prints_the_median(capsys):
    micro_cpu_only.main(["--nodes", "40", "--gpu-pods", "20", "--requests", "5"])
    out = capsys.readouterr().out
    assert out.startswith("40 nodes, 20 GPU pods bound: CPU-only pod filter (one trip), first ")
    assert "the 4 after it: median " in out and out.rstrip().endswith(" ms")


def test_every_floor_stack_answers_that_every_node_passes_and_scores_0():
    # The three floors bench_scheduler can put under kube-scheduler answer alike; the bare
    # protocol one also when requests arrive split across reads or two in one read.
    import orjson
    from starlette.testclient import TestClient

    from benchmarks.refserver import FloorProtocol, app, asgi_app

    body = orjson.dumps({"Pod": {}, "NodeNames": ["a", "b"]})
    want_filter = {"NodeNames": ["a", "b"], "Nodes": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
    want_scores = [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]
    for application in (app, asgi_app):
        with TestClient(application) as c:
            assert c.post("/filter", content=body).json() == want_filter
            assert c.post("/prioritize", content=body).json() == want_scores
            assert c.post("/nothing", content=body).status_code in (404, 405)

    class Transport:
        def __init__(self):
            self.written = []

        def write(self, data):
            self.written.append(data)

    protocol, transport = FloorProtocol(), Transport()
    protocol.connection_made(transport)
    request = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    protocol.data_received(request[:30])
    protocol.data_received(request[30:] + request.replace(b"/filter", b"/prioritize"))
    assert len(transport.written) == 2
    answers = [w.split(b"\r\n\r\n", 1) for w in transport.written]
    assert [orjson.loads(a[1]) for a in answers] == [want_filter, want_scores]
    assert all(b"content-length: %d" % len(a[1]) in a[0] for a in answers)


def test_the_soak_runs_every_hostile_kind_and_gets_no_server_error():
    from benchmarks import soak_extender

    lines: list[str] = []
    got = soak_extender.run(seconds=4, interval=1, out=lines.append)
    assert got["rows"] and all(r["rss_mib"] for r in got["rows"])
    assert got["answers_by_status"].get(200) and got["answers_by_status"].get(413)
    assert not [s for s in got["answers_by_status"] if s >= 500] and not got["client_errors"]
    assert any(line.startswith("RSS after the first interval") for line in lines)


def test_batch_benchmark_replays_openb_calls_and_checks_the_batch_against_the_plain_loop(capsys):
    micro_batch.main(["--list", "multigpu50", "--pods", "40"])
    out = capsys.readouterr().out
    assert "scoring calls" in out and "candidates:" in out
