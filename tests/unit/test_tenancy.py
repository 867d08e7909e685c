"""Tenancy in the policy: namespaces map to the classes and models they may use; annotations narrow, never widen."""

import pytest
import yaml

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.filter import C_TENANT
from scheduler_extender.core.policy import PolicyError, default_policy, parse_policy, policy_json_schema
from scheduler_extender.core.tenancy import LabelSelector, resolve_tenancy
from scheduler_extender.cluster.sources import NamespaceLabelsError, StaticSource, load_namespace_labels
from tests.factories import EXAMPLES, pod

DEFAULT = yaml.safe_load((EXAMPLES.parent / "scheduler_extender" / "data" / "default-policy.yaml").read_text())

# The acceptance scenario: H100s are kept for team-a.
TENANTS = {
    "tenants": [
        {"name": "team-a", "namespaces": ["team-a"]},
        {"name": "team-b", "namespaces": ["team-b"], "classes": ["small", "medium"],
         "allowedModels": ["A100-80GB", "L40S", "RTX-4090", "A6000"]},
        {"name": "gold", "namespaceSelector": {"matchLabels": {"gpu-tier": "gold"}}},
    ],
    "defaultTenant": {"deniedModels": ["H100"]},
}
MINIMAL = {"classes": [{"name": "any"}], "rules": [{"class": "any"}], "defaultClass": "any"}
NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))


def decide(p, policy=None, labels=None):
    engine = Engine(policy or parse_policy({**DEFAULT, **TENANTS}))
    source = StaticSource(EXAMPLES / "cluster", engine.catalog, labels)
    ns = p["metadata"]["namespace"]
    return engine.decide(p, source.states(NODES, None), None, source.namespace_labels(ns))


def passing(decision):
    return {r.node for r in decision.results if r.passed}


# ---- the policy document -------------------------------------------------------------------------

@pytest.mark.parametrize("tenancy, path", [
    ({"tenants": [{"name": "t", "namespaces": ["a"], "classes": ["huge"]}]}, "tenants.0.classes.0"),
    ({"tenants": [{"name": "t", "namespaces": ["a"], "allowedModels": ["H100", "Z9000"]}]}, "tenants.0.allowedModels.1"),
    ({"tenants": [{"name": "t", "namespaces": ["a"], "deniedModels": ["nope"]}]}, "tenants.0.deniedModels.0"),
    ({"tenants": [{"name": "t"}]}, "tenants.0"),
    ({"tenants": [{"name": "t", "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}]},
     "tenants.0.namespaceSelector.matchExpressions.0"),
    ({"tenants": [{"name": "t", "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "Maybe"}]}}]},
     "tenants.0.namespaceSelector.matchExpressions.0.operator"),
    ({"tenants": [{"name": "t", "namespaces": ["a"], "typo": 1}]}, "tenants.0.typo"),
    ({"tenants": [{"name": "t", "namespaces": ["a"]}, {"name": "t", "namespaces": ["b"]}]}, "tenants: duplicate"),
    ({"defaultTenant": {"classes": ["huge"]}}, "defaultTenant.classes.0"),
])
def test_invalid_tenancy_is_rejected_with_the_field_path(tenancy, path):
    with pytest.raises(PolicyError) as e:
        parse_policy({**MINIMAL, **tenancy}, source="p.yaml")
    assert path in str(e.value)


def test_policies_without_tenants_stay_valid_and_entitle_everyone_to_everything():
    job = Engine(default_policy()).job(pod({"gpuplace.io/gpu-models": "H100"}, namespace="anyone"))
    assert job.tenancy.unrestricted and job.tenant_denial is None


def test_tenants_are_in_the_published_json_schema():
    schema = policy_json_schema()
    assert {"tenants", "defaultTenant"} <= set(schema["properties"])
    assert "namespaceSelector" in schema["$defs"]["Tenant"]["properties"]


# ---- resolution ----------------------------------------------------------------------------------

def test_the_first_matching_tenant_wins_and_unmatched_namespaces_get_the_default():
    p = parse_policy({**DEFAULT, **TENANTS})
    cat = default_catalog()
    assert resolve_tenancy(p.tenants, p.default_tenant, "team-a", {}, cat).rule == "tenancy rule team-a (tenants.0)"
    assert resolve_tenancy(p.tenants, p.default_tenant, "team-b", None, cat).rule == "tenancy rule team-b (tenants.1)"
    assert resolve_tenancy(p.tenants, p.default_tenant, "x", {"gpu-tier": "gold"}, cat).rule == "tenancy rule gold (tenants.2)"
    other = resolve_tenancy(p.tenants, p.default_tenant, "x", {"gpu-tier": "silver"}, cat)
    assert other.rule == "tenancy defaultTenant" and "h100-sxm5-80gb" in other.denied_models
    hash(other)  # a grant is part of the Job's value: hashable, so the Job can be a memo key


def test_unknown_labels_never_fall_through_to_a_wider_default():
    p = parse_policy({**DEFAULT, **TENANTS})
    grant = resolve_tenancy(p.tenants, p.default_tenant, "x", None, default_catalog())
    assert grant.undecided and "labels of namespace x are unknown" in grant.undecided
    assert "tenancy rule gold (tenants.2)" in grant.undecided


@pytest.mark.parametrize("selector, labels, matches", [
    ({}, {}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
])
def test_namespace_selectors_follow_kubernetes_label_selector_semantics(selector, labels, matches):
    assert LabelSelector.model_validate(selector).matches(labels) is matches


# ---- decisions -----------------------------------------------------------------------------------

def test_a_team_b_pod_asking_for_h100_fails_every_node_with_the_rule_that_denied_it():
    d = decide(pod({"gpuplace.io/gpu-models": "H100"}, namespace="team-b"))
    assert not passing(d)
    for r in d.results:
        assert [x.criterion for x in r.rejections] == [C_TENANT] and r.unresolvable
        assert r.reason == ("gpuplace.io/gpu-models: H100 not entitled to namespace team-b: "
                            "tenancy rule team-b (tenants.1) allows A100-80GB, L40S, RTX-4090, A6000")


def test_a_team_a_pod_pinning_class_large_and_h100_gets_the_h100_node():
    d = decide(pod({"gpuplace.io/gpu-models": "H100", "gpuplace.io/class": "large"}, namespace="team-a"))
    assert passing(d) == {"gpu-h100-0"}


def test_a_pinned_class_outside_the_entitlement_no_longer_widens():
    d = decide(pod({"gpuplace.io/class": "large", "gpuplace.io/gpu-models": "A100-80GB"}, namespace="team-b", gpus=8))
    assert not passing(d)
    assert all(r.reason.startswith("gpuplace.io/class: large not entitled to namespace team-b: "
                                   "tenancy rule team-b (tenants.1) allows classes small, medium") for r in d.results)


def test_a_pinned_large_class_cannot_reach_h100s_the_default_tenant_denies():
    d = decide(pod({"gpuplace.io/class": "large"}, namespace="default"), labels={"default": {}})
    assert "gpu-h100-0" not in passing(d) and passing(d)
    h100 = next(r for r in d.results if r.node == "gpu-h100-0")
    assert h100.rejections[0].criterion == C_TENANT
    assert "H100 80GB HBM3 not entitled to namespace default: tenancy defaultTenant denies H100" in h100.reason


def test_a_class_assigned_by_the_rules_must_be_entitled_too():
    d = decide(pod({"gpuplace.io/vram": "70Gi"}, namespace="team-b"))  # rule 0: class large
    assert not passing(d)
    assert d.results[0].reason.startswith("class large (assigned by policy rule 0) not entitled to namespace team-b")


def test_a_models_annotation_narrows_within_the_entitlement_gpu_by_gpu():
    d = decide(pod({"gpuplace.io/gpu-models": "H100,A6000"}, namespace="team-b"))
    assert passing(d) == {"gpu-a6000-0"}
    h100 = next(r for r in d.results if r.node == "gpu-h100-0")
    assert C_TENANT in {x.criterion for x in h100.rejections}
    assert "GPU 0-3: H100 80GB HBM3 not entitled to namespace team-b: tenancy rule team-b (tenants.1)" in h100.reason


def test_mig_devices_are_entitled_by_their_parent_gpu_model():
    policy = parse_policy({**DEFAULT, "tenants": [{"name": "t", "namespaces": ["t"], "deniedModels": ["A100-80GB"]}]})
    d = decide(pod({"gpuplace.io/vram": "8Gi"}, namespace="t"), policy)
    assert not passing(d) & {"gpu-a100-mig-0", "gpu-a100-mig-1"}
    mig = next(r for r in d.results if r.node == "gpu-a100-mig-1")
    assert "MIG 1g.10gb" in mig.reason and "not entitled to namespace t" in mig.reason


def test_selector_tenants_decide_with_known_labels_and_deny_with_unknown_ones():
    p = pod({"gpuplace.io/gpu-models": "H100", "gpuplace.io/class": "large"}, namespace="research")
    assert passing(decide(p, labels={"research": {"gpu-tier": "gold"}})) == {"gpu-h100-0"}
    unknown = decide(p, labels=None)
    assert not passing(unknown)
    assert all("labels of namespace research are unknown" in r.reason for r in unknown.results)


def test_pods_without_gpus_are_not_touched_by_tenancy():
    d = decide(pod({}, gpus=None, namespace="x"))
    assert all(r.passed and r.untouched for r in d.results)


# ---- namespace labels for static mode -----------------------------------------------------------

def test_namespace_labels_load_from_a_mapping_or_kubectl_output(tmp_path):
    f = tmp_path / "ns.yaml"
    f.write_text("team-a: {gpu-tier: gold}\nteam-b: {}\n")
    assert load_namespace_labels(f) == {"team-a": {"gpu-tier": "gold"}, "team-b": {}}
    f.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"gpu-tier": "gold"}}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}}]}))
    assert load_namespace_labels(f) == {"team-a": {"gpu-tier": "gold"}, "team-b": {}}


def test_a_bad_namespace_labels_file_names_the_field(tmp_path):
    f = tmp_path / "ns.yaml"
    f.write_text("team-a: [gold]\n")
    with pytest.raises(NamespaceLabelsError, match="team-a"):
        load_namespace_labels(f)


def test_the_commented_tenancy_example_of_the_default_policy_is_valid():
    text = (EXAMPLES.parent / "scheduler_extender" / "data" / "default-policy.yaml").read_text()
    example = text.split("# tenants:\n", 1)[1].split("tenants: []", 1)[0]
    uncommented = yaml.safe_load("tenants:\n" + "\n".join(line[2:] for line in example.splitlines()))
    p = parse_policy({**DEFAULT, **uncommented})
    assert [t.name for t in p.tenants] == ["team-a", "premium", "team-b"]


# ---- command lines -------------------------------------------------------------------------------

def test_gpuplace_explain_reads_namespace_labels_and_shows_the_tenancy_rule(tmp_path, capsys):
    from scheduler_extender.gpuplace_cli import main

    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({**DEFAULT, **TENANTS}))
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod({"gpuplace.io/gpu-models": "H100", "gpuplace.io/class": "large"},
                                           namespace="research")))
    labels = tmp_path / "ns.yaml"
    labels.write_text("research: {gpu-tier: gold}\n")
    args = ["explain", str(manifest), "--inventory-dir", str(EXAMPLES / "cluster"), "--policy", str(policy)]
    assert main(args + ["--namespace-labels", str(labels)]) == 0
    out = capsys.readouterr().out
    assert "tenancy: tenancy rule gold (tenants.2)" in out and "best node: gpu-h100-0" in out
    assert main(args) == 0  # without labels: unknown, so denied, never guessed
    out = capsys.readouterr().out
    assert "labels of namespace research are unknown" in out and "best node: none" in out


def test_the_extender_takes_namespace_labels_only_in_static_mode(capsys):
    from scheduler_extender.cli import main

    assert main(["--namespace-labels", "ns.yaml", "--kubeconfig", "k"]) == 2
    assert "--namespace-labels is for static mode" in capsys.readouterr().err
