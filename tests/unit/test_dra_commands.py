"""``gpuplace claim``, ``gpuplace explain --resource-slices`` and ``gpuplace simulate --fleet
slices.yaml``: the commands that read a fleet given as ResourceSlices (``examples/dra/``)."""

from __future__ import annotations

import base64
import json

import yaml

from scheduler_extender.core.dra_claims import ALTERNATIVES_ANNOTATION
from scheduler_extender.core.dra_slices import default_drivers, split_objects
from scheduler_extender.core.engine import Engine
from scheduler_extender.cluster.dra import static_fleet
from scheduler_extender.gpuplace_cli import main
from scheduler_extender.service.claim_webhook import ClaimWebhook
from tests.factories import ROOT

EXAMPLES = ROOT / "examples" / "dra"
SLICES = str(EXAMPLES / "resourceslices.yaml")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_claim_prints_the_pods_template_with_gpuplaces_alternatives(capsys):
    code, out, err = run(capsys, "claim", str(EXAMPLES / "llm-13b.yaml"), "--resource-slices", SLICES)
    assert code == 0, err
    template = yaml.safe_load(out)
    assert template["kind"] == "ResourceClaimTemplate" and template["metadata"]["name"] == "llm-13b-gpu"
    (req,) = template["spec"]["spec"]["devices"]["requests"]
    names = [s["name"] for s in req["firstAvailable"]]
    # the cheapest device that holds 13B inference (30.3 GiB) comes first; the 24 GB L4 never
    assert names[0].endswith("3g-40gb") and not any("l4" in n for n in names)
    assert ALTERNATIVES_ANNOTATION in template["spec"]["metadata"]["annotations"]
    assert err.startswith("# request gpu: 1x A100-SXM4-80GB 3g.40gb, then ")


def test_claim_writes_what_the_webhook_writes(capsys):
    _, out, _ = run(capsys, "claim", str(EXAMPLES / "llm-13b.yaml"), "--resource-slices", SLICES)
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "llm-13b.yaml").read_text()) if d]
    pod = next(d for d in docs if d["kind"] == "Pod")
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    objects = split_objects(yaml.safe_load_all(open(SLICES)))
    engine = Engine()
    fleet = static_fleet(objects["ResourceSlice"], [], engine.catalog, default_drivers())
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "1", "operation": "CREATE", "object": {
            "metadata": {"name": "x", "namespace": "default",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"]}]},
            "spec": template["spec"]["spec"]}}}
    resp = json.loads(ClaimWebhook(fleet, lambda: engine, lambda ns, n: pod).respond(json.dumps(review).encode()))
    patch = json.loads(base64.b64decode(resp["response"]["patch"]))
    assert patch[0]["value"] == yaml.safe_load(out)["spec"]["spec"]


def test_claim_exits_1_with_gpuplaces_reason_when_nothing_fits(capsys, tmp_path):
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "big", "annotations": {"gpuplace.io/model-params": "405B"}}, "spec": {"containers": [{"name": "m"}]}}))
    code, out, err = run(capsys, "claim", str(pod), "--resource-slices", SLICES)
    assert code == 1 and out == ""
    assert "gpuplace: pod default/big: no device type in the cluster fits" in err


def test_claim_takes_a_deployments_pod_template_and_a_generic_count(capsys, tmp_path):
    deploy = tmp_path / "d.yaml"
    deploy.write_text(yaml.safe_dump({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve"},
                                      "spec": {"template": {"metadata": {"annotations": {"gpuplace.io/vram": "20Gi"}},
                                                            "spec": {"containers": [{"name": "m"}]}}}}))
    code, out, err = run(capsys, "claim", str(deploy), "--resource-slices", SLICES, "--count", "2")
    assert code == 0, err
    template = yaml.safe_load(out)
    assert template["metadata"]["name"] == "serve-gpu"
    assert {s["count"] for s in template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]} == {2}


def test_claim_names_a_missing_slices_file(capsys):
    code, _, err = run(capsys, "claim", str(EXAMPLES / "llm-13b.yaml"), "--resource-slices", "/nonexistent.yaml")
    assert code == 2 and "/nonexistent.yaml" in err


def test_explain_with_resource_slices_shows_the_alternatives_and_the_device_each_node_gives(capsys):
    code, out, err = run(capsys, "explain", str(EXAMPLES / "llm-13b.yaml"), "--resource-slices", SLICES)
    assert code == 0, err
    assert out.startswith("claim: request gpu: 1x A100-SXM4-80GB 3g.40gb")
    assert "inventory: ResourceSlices of gpu.nvidia.com" in out
    assert "FAIL l4-node" in out and "PASS a100-node" in out
    code, out, _ = run(capsys, "explain", str(EXAMPLES / "llm-13b.yaml"), "--resource-slices", SLICES, "--json")
    doc = json.loads(out)
    assert doc["claim"]["alternatives"]["gpu"][0]["migProfile"] == "3g.40gb"


def test_simulate_accepts_a_fleet_of_resource_slices(capsys):
    code, out, err = run(capsys, "simulate", "--trace", "llm", "--fleet", SLICES, "--mode", "replay",
                         "--llm-pods", "40", "--repeats", "1", "--baselines", "spread", "--load", "0.5")
    assert code == 0, err
    assert "fleet: 3 nodes, 5 GPUs" in out + err  # the A100 split in MIG devices counts once
    assert "\ngpuplace " in out and "\nspread " in out


def test_explain_of_a_pod_from_the_cluster_reads_the_alternatives_its_claim_holds(capsys, tmp_path):
    from scheduler_extender.core.dra_claims import Alternative
    only_h100 = Alternative("g0-h100", "gpu.nvidia.com", "gpu.nvidia.com", "gpu", "NVIDIA H100 80GB HBM3", None,
                            81559 * 2**20, None, None, 4.0, "h100-sxm5-80gb")
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "llm-13b-gpu-x", "namespace": "default",
                          "annotations": {ALTERNATIVES_ANNOTATION: json.dumps({"gpu": [only_h100.to_json()]})}},
             "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                 {"name": "g0-h100", "deviceClassName": "gpu.nvidia.com", "count": 1}]}]}}}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((EXAMPLES / "resourceslices.yaml").read_text() + "---\n" + yaml.safe_dump(claim))
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "llm-13b.yaml").read_text()) if d]
    pod = next(d for d in docs if d["kind"] == "Pod")
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "llm-13b-gpu-x"}]}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    code, out, err = run(capsys, "explain", str(path), "--resource-slices", str(fleet))
    assert code == 0, err
    assert out.startswith("claim: as written in the pod's claims")
    assert "PASS h100-node" in out and "FAIL a100-node" in out  # the claim's own alternatives, not a new plan


def test_claim_honours_leave_and_refuses_a_count_beyond_the_api(capsys, tmp_path):
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "llm-13b.yaml").read_text()) if d]
    next(d for d in docs if d["kind"] == "Pod")["metadata"]["annotations"]["gpuplace.io/claims"] = "leave"
    path = tmp_path / "leave.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, out, err = run(capsys, "claim", str(path), "--resource-slices", SLICES)
    assert code == 0 and "exactly" in out and "firstAvailable" not in out and "leave" in err
    code, _, err = run(capsys, "claim", str(EXAMPLES / "llm-13b.yaml"), "--resource-slices", SLICES, "--count", "33")
    assert code == 2 and "--count 33: must be from 1 to 32" in err


def test_the_extenders_dra_flags_are_refused_when_they_cannot_work(capsys):
    from scheduler_extender.cli import main as extender
    for argv, message in ((["--claim-webhook-port", "9443"], "needs --dra"),
                          (["--dra", "--claim-webhook-port", "9443"], "needs --tls-cert-file"),
                          (["--dra-drivers", "x.yaml"], "needs --dra"),
                          (["--dra", "--inventory-dir", "."], "for cluster mode")):
        assert extender(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
