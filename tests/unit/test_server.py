"""The extender's HTTP API: wire format against upstream encodings, acceptance scenarios, bad input."""

import json
import subprocess
import sys
import urllib.request

import pytest
from starlette.testclient import TestClient

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.server import create_app
from scheduler_extender.cluster.sources import StaticSource
from tests.factories import EXAMPLES, ROOT, pod, static_extender

WIRE = ROOT / "tests" / "fixtures" / "wire"
NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))


@pytest.fixture(scope="module")
def client():
    service = ExtenderService(Engine(), StaticSource(EXAMPLES / "cluster", default_catalog()))
    with TestClient(create_app(service)) as c:
        yield c


def post(client, verb, p, nodes=NODES):
    r = client.post(f"/{verb}", content=json.dumps({"Pod": p, "NodeNames": nodes}))
    assert r.status_code == 200, r.text
    return r.json()


def scores(client, p):
    return {h["Host"]: h["Score"] for h in post(client, "prioritize", p)}


def best(client, p):
    passing = post(client, "filter", p)["NodeNames"]
    s = scores(client, p)
    top = max(s[n] for n in passing)
    return {n for n in passing if s[n] == top}


# ---- wire format -------------------------------------------------------------------------------

def test_filter_answers_the_upstream_node_cache_request_with_upstream_keys(client):
    body = (WIRE / "filter_args_nodecache.json").read_bytes()
    r = client.post("/filter", content=body)
    assert r.status_code == 200
    got = r.json()
    upstream = json.loads((WIRE / "filter_result.json").read_text())
    assert set(got) == set(upstream)
    assert set(got["NodeNames"]) == {"gpu-a6000-0", "gpu-a100-mig-0"}
    assert got["FailedAndUnresolvableNodes"]["gpu-4090-0"] == upstream["FailedAndUnresolvableNodes"]["gpu-4090-0"]
    assert got["Nodes"] is None and got["Error"] == ""


def test_filter_with_full_node_list_returns_the_passing_node_objects(client):
    body = json.loads((WIRE / "filter_args_nodelist.json").read_text())
    small = pod({"gpuplace.io/model-params": "1B"})
    r = client.post("/filter", content=json.dumps({**body, "Pod": small}))
    got = r.json()
    assert got["NodeNames"] is None
    assert [n["metadata"]["name"] for n in got["Nodes"]["items"]] == ["gpu-4090-0"]
    assert got["Nodes"]["items"][0] == body["Nodes"]["items"][0]  # returned unchanged


def test_node_inventory_is_read_from_node_objects_the_source_does_not_know(client):
    body = json.loads((WIRE / "filter_args_nodelist.json").read_text())
    body["Nodes"]["items"][0]["metadata"]["name"] = "unlisted-node"
    annotation = json.loads(body["Nodes"]["items"][0]["metadata"]["annotations"]["gpuplace.io/inventory"])
    annotation["nodeName"] = "unlisted-node"
    body["Nodes"]["items"][0]["metadata"]["annotations"]["gpuplace.io/inventory"] = json.dumps(annotation)
    got = client.post("/filter", content=json.dumps(body)).json()
    assert "24 GiB VRAM < 30.3 GiB" in got["FailedAndUnresolvableNodes"]["unlisted-node"]


def test_prioritize_answers_a_host_priority_list_like_upstream(client):
    upstream = json.loads((WIRE / "prioritize_result.json").read_text())
    args = json.loads((WIRE / "filter_args_nodecache.json").read_text())
    got = client.post("/prioritize", content=json.dumps(args)).json()
    assert [set(h) for h in got] == [set(upstream[0])] * len(args["NodeNames"])
    assert [h["Host"] for h in got] == args["NodeNames"]
    assert all(0 <= h["Score"] <= 10 for h in got)


def test_keys_match_case_insensitively_as_go_decodes_them(client):
    r = client.post("/filter", content=json.dumps({"pod": pod({}), "nodenames": ["gpu-4090-0"]}))
    assert r.status_code == 200 and r.json()["NodeNames"] == ["gpu-4090-0"]


@pytest.mark.parametrize("body, mentions", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (b"{}", "Pod: required"),
    (json.dumps({"Pod": {}}).encode(), "Nodes or NodeNames"),
    (json.dumps({"Pod": {}, "NodeNames": "gpu-4090-0"}).encode(), "NodeNames"),
    (json.dumps({"Pod": [], "NodeNames": []}).encode(), "Pod"),
])
def test_malformed_body_gets_400_with_a_json_error_and_the_server_keeps_serving(client, body, mentions):
    r = client.post("/filter", content=body)
    assert r.status_code == 400
    assert mentions in r.json()["Error"]
    assert client.get("/healthz").status_code == 200
    assert post(client, "filter", pod({}))["NodeNames"]


def rejections(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families
    family = next(f for f in text_string_to_metric_families(text) if f.name == "gpuplace_extender_node_rejections")
    return {s.labels["criterion"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_every_criterion_has_its_rejection_series_from_the_start():
    from scheduler_extender.core.criteria import CRITERION_NAMES as CRITERIA
    service = ExtenderService(Engine(), StaticSource(EXAMPLES / "cluster", default_catalog()))
    with TestClient(create_app(service)) as fresh:
        before = rejections(fresh.get("/metrics").text)
        assert set(before) == set(CRITERIA) and not any(before.values())
        post(fresh, "filter", pod({"gpuplace.io/vram": "200Gi"}))
        after = rejections(fresh.get("/metrics").text)
    assert after["vram"] > 0 and sum(after.values()) >= len(NODES)  # no example GPU has 200 GiB: every node fails


def test_health_readiness_and_metrics(client):
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").status_code == 200
    post(client, "filter", pod({"gpuplace.io/vram": "200Gi"}))
    text = client.get("/metrics").text
    assert 'gpuplace_extender_requests_total{code="200",verb="filter"}' in text
    assert rejections(text)["vram"] > 0
    assert "gpuplace_extender_request_duration_seconds_bucket" in text


def test_filter_is_post_only(client):
    assert client.get("/filter").status_code == 405


# ---- acceptance scenarios on examples/cluster (issue 2) -----------------------------------------

LLM_13B = {"gpuplace.io/model-params": "13B", "gpuplace.io/workload": "inference", "gpuplace.io/precision": "bf16"}


def test_13b_bf16_inference_is_refused_by_24gb_cards_for_vram_and_by_turing_for_bf16(client):
    got = post(client, "filter", pod(LLM_13B))
    failed = got["FailedAndUnresolvableNodes"]
    for n in ("gpu-4090-0", "gpu-4090-1"):
        assert "24 GiB VRAM < 30.3 GiB needed (13B inference, bf16)" in failed[n]
    assert "compute capability 7.5 < 8.0 needed for bf16" in failed["gpu-rtx8000-0"]


def test_13b_bf16_inference_scores_best_on_a_mig_slice_or_48gb_ampere_never_a_full_premium_gpu(client):
    top = best(client, pod(LLM_13B))
    assert top and top <= {"gpu-a100-mig-0", "gpu-a6000-0"}
    s = scores(client, pod(LLM_13B))
    assert s["gpu-a100-80g-0"] == 0 and s["gpu-h100-0"] == 0  # premium full GPUs: a last resort while others pass


def test_7b_lora_scores_best_on_an_rtx_4090(client):
    p = pod({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora", "gpuplace.io/precision": "bf16"})
    assert best(client, p) <= {"gpu-4090-0", "gpu-4090-1"}


def test_a_small_cuda_job_is_refused_by_the_amd_node(client):
    got = post(client, "filter", pod({"gpuplace.io/model-params": "1B"}))
    assert "a CUDA job needs NVIDIA GPUs" in got["FailedAndUnresolvableNodes"]["gpu-amd-0"]


def test_a_4_gpu_nvlink_job_is_refused_by_the_4090_nodes_with_an_nvlink_reason(client):
    got = post(client, "filter", pod({"gpuplace.io/require": "nvlink", "gpuplace.io/vram": "16Gi"}, gpus=4))
    for n in ("gpu-4090-0", "gpu-4090-1"):
        assert "NVLink" in got["FailedAndUnresolvableNodes"][n]
    assert "gpu-h100-0" in got["NodeNames"]


def test_gpu_models_h20_matches_no_h100_or_h200_node(client):
    got = post(client, "filter", pod({"gpuplace.io/gpu-models": "H20", "gpuplace.io/vram": "60Gi"}))
    assert got["NodeNames"] == []
    assert "not in gpuplace.io/gpu-models (H20)" in got["FailedAndUnresolvableNodes"]["gpu-h100-0"]


def test_a_malformed_annotation_fails_every_node_with_the_fix(client):
    got = post(client, "filter", pod({"gpuplace.io/model-params": "thirteen billion"}))
    assert got["NodeNames"] == []
    assert len(got["FailedAndUnresolvableNodes"]) == len(NODES)
    assert all(r.startswith("gpuplace.io/model-params:") and "7B" in r for r in got["FailedAndUnresolvableNodes"].values())


# ---- the real console script ---------------------------------------------------------------------

def test_gpuplace_extender_serves_hand_written_extender_args_in_static_mode():
    with static_extender() as url:
        body = json.dumps({"Pod": pod(LLM_13B), "NodeNames": ["gpu-4090-0", "gpu-a6000-0"]}).encode()
        req = urllib.request.Request(f"{url}/filter", data=body, method="POST")
        got = json.loads(urllib.request.urlopen(req, timeout=5).read())
        assert got["NodeNames"] == ["gpu-a6000-0"]
        assert "VRAM" in got["FailedAndUnresolvableNodes"]["gpu-4090-0"]


def test_an_invalid_policy_stops_start_up_with_the_field_path(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("classes:\n- name: small\n  deniedModels: [H100X]\nrules:\n- {class: small}\ndefaultClass: small\n")
    proc = subprocess.run([sys.executable, "-m", "scheduler_extender.cli", "--inventory-dir", str(EXAMPLES / "cluster"),
                           "--policy", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "classes.0.deniedModels.0" in proc.stderr and "H100X" in proc.stderr


def test_debug_allocations_shows_static_allocated_to_per_node(tmp_path):
    from tests.factories import example_inventory

    inv = example_inventory("gpu-4090-0")
    inv["gpus"][1]["allocatedTo"] = "ml/train"
    (tmp_path / "gpu-4090-0.json").write_text(json.dumps(inv))
    service = ExtenderService(Engine(), StaticSource(tmp_path, default_catalog()))
    with TestClient(create_app(service)) as c:
        assert c.get("/debug/allocations").status_code == 404  # off unless asked for
    with TestClient(create_app(service, debug_endpoints=True)) as c:
        r = c.get("/debug/allocations")
        assert r.status_code == 200
        node = r.json()["nodes"]["gpu-4090-0"]
        assert node["resources"]["nvidia.com/gpu"] == {"allocatable": 4, "held": 1, "free": 3}
        assert node["pods"] == {"ml/train": {"nvidia.com/gpu": 1}}
        assert node["heldUnits"] == {inv["gpus"][1]["uuid"]: "ml/train"}
        assert c.post("/debug/allocations").status_code == 405


@pytest.mark.parametrize("argv, mentions", [
    (["--tls-key-file", "k.pem"], "--tls-cert-file and --tls-key-file go together"),
    (["--tls-cert-file", "/nonexistent/c.pem", "--tls-key-file", "/nonexistent/k.pem"],
     "--tls-cert-file /nonexistent/c.pem: not a readable file"),
    (["--watch-timeout-seconds", "0"], "--watch-timeout-seconds 0: must be at least 1"),
    (["--decision-threads", "0"], "--decision-threads 0: must be at least 1"),
    (["--max-body-bytes", "0"], "--max-body-bytes 0: must be at least 1"),
    (["--max-inflight-body-bytes", "1000"], "--max-inflight-body-bytes 1000: must be at least --max-body-bytes"),
])
def test_bad_tls_and_watch_options_exit_2_naming_the_option(argv, mentions, capsys):
    from scheduler_extender.cli import main

    assert main(["--inventory-dir", str(EXAMPLES / "cluster"), *argv]) == 2
    assert mentions in capsys.readouterr().err


BROKEN_KUBECONFIGS = [
    "apiVersion: v1\nkind: Config\nusers:\n- name: a\n  user:\n    token: SECRET-TOKEN-42\n   bad: [\n",
    "apiVersion: v1\nkind: Config\nusers:\n- name: a\n  user:\n    token: SECRET-TOKEN-42\nclusters: 5\n",
    "apiVersion: v1\nkind: Config\ncurrent-context: x\nusers:\n- name: a\n  user: {token: SECRET-TOKEN-42}\n",
]


@pytest.mark.parametrize("text", BROKEN_KUBECONFIGS)
def test_a_broken_kubeconfig_exits_2_without_echoing_its_token(text, tmp_path, capsys):
    from scheduler_extender.cli import main

    path = tmp_path / "kubeconfig"
    path.write_text(text)
    assert main(["--kubeconfig", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no cluster configuration" in err and "SECRET-TOKEN-42" not in err


def _request(chunks: list[bytes], headers: list[tuple[bytes, bytes]] = (), disconnect_after: int | None = None):
    """A Request whose body arrives in ``chunks``; ``sent`` counts the chunks the server asked for."""
    from starlette.requests import Request

    sent = []

    async def receive():
        if disconnect_after is not None and len(sent) == disconnect_after:
            return {"type": "http.disconnect"}
        i = len(sent)
        sent.append(i)
        return {"type": "http.request", "body": chunks[i], "more_body": i + 1 < len(chunks)}

    scope = {"type": "http", "method": "POST", "path": "/filter", "headers": list(headers), "query_string": b""}
    return Request(scope, receive), sent


def test_a_body_over_the_limit_is_refused_while_it_streams_in_not_after_it_is_buffered():
    import asyncio

    from scheduler_extender.service.server import BodyTooLarge, read_body

    request, sent = _request([b"x" * 100] * 1000)
    with pytest.raises(BodyTooLarge, match="more than 250 bytes"):
        asyncio.run(read_body(request, 250))
    assert len(sent) == 3  # stopped at the chunk that crossed the limit, 997 never read


def test_a_declared_content_length_over_the_limit_is_refused_before_any_chunk_is_read():
    import asyncio

    from scheduler_extender.service.server import BodyTooLarge, read_body

    for declared in (b"251", b"9" * 5000):
        request, sent = _request([b"x"], headers=[(b"content-length", declared)])
        with pytest.raises(BodyTooLarge, match="exceeds 250"):
            asyncio.run(read_body(request, 250))
        assert sent == []


def test_a_body_within_the_limit_is_read_whole():
    import asyncio

    from scheduler_extender.service.server import read_body

    request, _ = _request([b"ab", b"cd", b"e"])
    assert asyncio.run(read_body(request, 5)) == b"abcde"


def test_an_aborted_upload_is_answered_499_and_counted_not_logged_as_a_crash(client, caplog):
    import asyncio

    answered = []
    request, _ = _request([b"{", b"}"], disconnect_after=1)

    async def send(message):
        answered.append(message)

    asyncio.run(client.app(request.scope, request.receive, send))
    assert answered[0]["status"] == 499
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    metrics = client.get("/metrics").text
    assert 'gpuplace_extender_requests_total{code="499",verb="filter"} 1.0' in metrics


def test_client_sent_names_reach_the_log_cut_and_escaped_so_no_request_forges_a_line(client, caplog):
    p = pod({"gpuplace.io/vram": "200Gi"})
    p["metadata"]["name"] = "evil\n2026-11-25 INFO forged line" + "x" * 10_000
    forged_node = "node\r\nERROR forged too" * 500
    with caplog.at_level("INFO", logger="scheduler_extender.service.decisions"):
        r = client.post("/filter", content=json.dumps({"Pod": p, "NodeNames": [forged_node, *NODES]}))
    assert r.status_code == 200, r.text
    lines = [rec.getMessage() for rec in caplog.records if "fits no node" in rec.getMessage()]
    assert lines, [rec.getMessage() for rec in caplog.records]
    for line in lines:
        assert "\n" not in line and "\r" not in line
        assert "evil\\n2026-11-25 INFO forged line" in line and "characters)" in line
        assert len(line) < 10_000


def test_read_body_gives_the_budget_back_when_a_body_is_refused_or_abandoned():
    import asyncio

    from scheduler_extender.service.server import BodyBudget, BodyTooLarge, ServerBusy, read_body
    from starlette.requests import ClientDisconnect

    budget = BodyBudget(1000)
    request, _ = _request([b"x" * 100] * 5)
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_body(request, 250, budget))
    request, _ = _request([b"{", b"}"], disconnect_after=1)
    with pytest.raises(ClientDisconnect):
        asyncio.run(read_body(request, 250, budget))
    assert budget.used == 0
    budget.take(950)
    request, _ = _request([b"x" * 40, b"x" * 40])
    with pytest.raises(ServerBusy, match="busy"):
        asyncio.run(read_body(request, 250, budget))
    assert budget.used == 950
    budget.give(950)
    request, _ = _request([b"ab", b"cd"])
    assert asyncio.run(read_body(request, 250, budget)) == b"abcd" and budget.used == 4


def test_a_catalog_file_adds_gpu_models_the_extender_then_knows_and_a_bad_one_stops_start_up(tmp_path):
    from benchmarks.bench_replay import stand_in_rows
    from tests.factories import gpu, inventory
    inv_dir = tmp_path / "inv"
    inv_dir.mkdir()
    (inv_dir / "g2.json").write_text(json.dumps(inventory("g2", [gpu(0, name="G2 (stand-in)", memory_mib=24576)])))
    rows = tmp_path / "rows.yaml"
    rows.write_text(stand_in_rows())
    p = pod({"gpuplace.io/gpu-models": "G2"}, name="wants-g2")

    def filter_once(*args):
        with static_extender(*args, inventory_dir=inv_dir) as url:
            req = urllib.request.Request(f"{url}/filter", data=json.dumps({"Pod": p, "NodeNames": ["g2"]}).encode(),
                                         headers={"Content-Type": "application/json"})
            return json.loads(urllib.request.urlopen(req, timeout=10).read())

    assert filter_once("--catalog-file", str(rows))["NodeNames"] == ["g2"]
    assert "unknown GPU model 'G2'" in filter_once()["FailedAndUnresolvableNodes"]["g2"]  # without the rows
    rows.write_text("- {id: x}\n")
    proc = subprocess.run([sys.executable, "-m", "scheduler_extender.cli", "--inventory-dir", str(inv_dir),
                           "--catalog-file", str(rows)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and f"--catalog-file {rows}" in proc.stderr


@pytest.mark.parametrize("body, mentions", [
    (b"{not json", "not JSON"),
    (b"{}", "Pod: required"),
    (json.dumps({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"uid": 3}]}}}).encode(), "NodeNameToMetaVictims"),
    (json.dumps({"Pod": {}, "NodeNameToMetaVictims": []}).encode(), "NodeNameToMetaVictims"),
])
def test_a_malformed_preempt_body_gets_400_naming_the_field(client, body, mentions):
    r = client.post("/preempt", content=body)
    assert r.status_code == 400
    assert mentions in r.json()["Error"]


def test_the_preempt_verb_in_static_mode_keeps_kube_schedulers_proposals(client):
    # static mode knows no pods or priorities: it changes nothing it cannot see
    body = {"Pod": pod({}), "NodeNameToMetaVictims": {"gpu-4090-0": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1}}}
    assert client.post("/preempt", content=json.dumps(body)).json() == {"NodeNameToMetaVictims": {"gpu-4090-0": {"Pods": [{"UID": "u1"}],
                                                                               "NumPDBViolations": 1}}}
