"""Policy validation (field paths, references), class assignment, and reload semantics."""

import pytest
import yaml

from scheduler_extender.cli import PolicyWatcher
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import PolicyError, default_policy, parse_policy, policy_json_schema
from scheduler_extender.service.metrics import ExtenderMetrics
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.cluster.sources import StaticSource
from tests.factories import EXAMPLES

MINIMAL = {"classes": [{"name": "any"}], "rules": [{"class": "any"}], "defaultClass": "any"}


def test_the_shipped_default_policy_is_valid_and_keeps_premium_gpus_as_a_last_resort_for_smaller_jobs():
    p = default_policy()
    assert {c.name for c in p.classes} == {"small", "medium", "large"}
    assert "H100" in p.class_named("medium").last_resort_models
    assert not p.class_named("medium").denied_models  # reserving them outright is the policy's choice
    assert not p.class_named("large").denied_models and not p.class_named("large").last_resort_models


@pytest.mark.parametrize("class_name", ["small", "medium"])
def test_the_default_policy_makes_every_premium_catalog_row_a_last_resort_for_small_and_medium_jobs(class_name):
    cat = default_catalog()
    denied = set().union(*(cat.resolve_token(t) for t in default_policy().class_named(class_name).last_resort_models))
    premium = {e.id for e in cat.entries.values() if e.tier == "premium"}
    assert premium <= denied, sorted(premium - denied)
    assert {"b200-sxm-180gb", "b300-sxm-288gb", "gb200-186gb", "gb300-288gb", "h200-nvl-141gb",
            "mi325x", "mi355x"} <= denied


def test_a_7b_job_is_not_sent_to_a_b200_or_gb200_by_default_when_an_l40_fits():
    from node_agent.inventory import parse_inventory
    from scheduler_extender.core.devices import NodeAllocation, NodeState, build_node_view
    from tests.factories import gpu, inventory, pod

    cat = default_catalog()
    specs = {
        "b200": dict(name="NVIDIA B200", memory_mib=183359, eccEnabled=True, computeCapability="10.0"),
        "gb200": dict(name="NVIDIA GB200", memory_mib=189471, eccEnabled=True, computeCapability="10.0"),
        "l40": dict(name="NVIDIA L40", memory_mib=46068, eccEnabled=True, computeCapability="8.9"),
    }
    states = [NodeState(n, build_node_view(parse_inventory(inventory(n, [gpu(i, **spec) for i in range(4)])), cat),
                        NodeAllocation()) for n, spec in specs.items()]
    d = Engine(default_policy()).decide(pod({"gpuplace.io/model-params": "7B"}), states, None)
    assert d.best().node == "l40"
    assert {n for n, s in d.scores.items() if s is not None and s.last_resort} == {"b200", "gb200"}
    assert all(d.scores[n].score == 0 for n in ("b200", "gb200"))


@pytest.mark.parametrize("change, path", [
    ({"scoring": {"cost": "high"}}, "scoring.cost"),
    ({"inventory": {"staleAfterSeconds": -1}}, "inventory.staleAfterSeconds"),
    ({"rules": [{"class": "nope"}]}, "rules.0.class"),
    ({"defaultClass": "nope"}, "defaultClass"),
    ({"classes": [{"name": "any", "allowedModels": ["A100", "Z9000"]}]}, "classes.0.allowedModels.1"),
    ({"classes": [{"name": "any", "allowedMigProfiles": ["3g40"]}]}, "classes.0.allowedMigProfiles"),
    ({"catalog": {"not-a-gpu": {"costPerGpuHour": 1}}}, "catalog.not-a-gpu"),
    ({"estimator": {"typo": 1}}, "estimator.typo"),
    ({"rules": [{"class": "any", "minGpus": 0}]}, "rules.0.minGpus"),
])
def test_invalid_policy_is_rejected_with_the_field_path(change, path):
    with pytest.raises(PolicyError) as e:
        parse_policy({**MINIMAL, **change}, source="p.yaml")
    assert str(e.value).startswith("p.yaml: ")
    assert path in str(e.value)


def test_yaml_syntax_errors_are_policy_errors():
    with pytest.raises(PolicyError, match="not valid YAML"):
        parse_policy("classes: [", source="p.yaml")


def test_rules_assign_the_first_matching_class_and_unknown_vram_matches_no_vram_rule():
    p = default_policy()
    kw = dict(params=None, workload=None, namespace="default", requires=frozenset())
    assert p.assign_class(vram_bytes=70 * 2**30, gpu_count=1, **kw)[0].name == "large"
    assert p.assign_class(vram_bytes=10 * 2**30, gpu_count=1, **kw)[0].name == "small"
    assert p.assign_class(vram_bytes=30 * 2**30, gpu_count=1, **kw)[0].name == "medium"
    assert p.assign_class(vram_bytes=None, gpu_count=1, **kw)[0].name == "medium"
    assert p.assign_class(vram_bytes=None, gpu_count=8, **kw)[0].name == "large"
    assert p.assign_class(vram_bytes=10 * 2**30, gpu_count=4, **{**kw, "requires": frozenset({"nvlink"})})[0].name == "large"


def test_catalog_overrides_change_prices():
    p = parse_policy({**MINIMAL, "catalog": {"rtx-4090": {"costPerGpuHour": 0.1}}})
    assert p.cost_per_gpu_hour(default_catalog().entries["rtx-4090"]) == 0.1


def test_policy_schema_is_published_with_aliases():
    schema = policy_json_schema()
    assert "defaultClass" in schema["properties"] and "classes" in schema["required"]


def test_a_bad_policy_update_is_rejected_and_the_old_one_keeps_running(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(MINIMAL))
    service = ExtenderService(Engine(parse_policy(MINIMAL)), StaticSource(EXAMPLES / "cluster", default_catalog()))
    metrics = ExtenderMetrics()
    watcher = PolicyWatcher(str(path), service, metrics, interval=60)
    running = service.engine
    path.write_text("classes: [{name: any}]\nrules: [{class: missing}]\ndefaultClass: any\n")
    assert watcher.check_once() is False
    assert service.engine is running
    assert metrics.policy_reloads.labels("rejected")._value.get() == 1
    path.write_text(yaml.safe_dump({**MINIMAL, "scoring": {"cost": 9}}))
    assert watcher.check_once() is True
    assert service.engine is not running and service.engine.policy.scoring.cost == 9
    assert watcher.check_once() is None  # unchanged content: nothing to do


def test_a_policy_with_yaml_aliases_is_refused_at_the_first_alias_naming_its_line():
    # 3,000 classes aliasing one 3,000-entry list: 9 million entries once expanded (the report's
    # 245 KB policy took 17.7 s and 261 MB to check; refused here before anything is expanded).
    models = ", ".join(f"m{i}" for i in range(3000))
    lines = ["apiVersion: gpuplace.io/v1alpha1", "kind: PlacementPolicy", f"shared: &models [{models}]", "classes:"]
    lines += [f"  - name: c{i}\n    deniedModels: *models" for i in range(3000)]
    with pytest.raises(PolicyError) as e:
        parse_policy("\n".join(lines), source="policy.yaml")
    assert str(e.value) == ("policy.yaml: line 6, column 19: YAML aliases (*name) are not accepted in a policy; "
                            "write the values out where they are used")


def test_an_anchor_without_alias_is_plain_yaml():
    text = yaml.safe_dump(default_policy().model_dump(by_alias=True, mode="json"))
    assert parse_policy(text.replace("classes:", "classes: &c", 1)).classes == default_policy().classes


def test_a_policy_with_thousands_of_errors_is_refused_in_a_bounded_message():
    lines = ["apiVersion: gpuplace.io/v1alpha1", "kind: PlacementPolicy", "classes:"]
    lines += [f"  - name: c{i}\n    bogus{i}: 1" for i in range(3000)]
    with pytest.raises(PolicyError) as e:
        parse_policy("\n".join(lines), source="policy.yaml")
    message = str(e.value)
    assert len(message) <= 4096 + 100
    assert "classes.0.bogus0: Extra inputs are not permitted" in message
    assert message.count("Extra inputs are not permitted") == 20 and message.endswith(" more")
