"""The chart's generated files are current, and its default policy is the shipped one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

from scheduler_extender.core.policy import default_policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuplace"


def _load(script: str):
    spec = importlib.util.spec_from_file_location(script.replace("-", "_"), ROOT / "hack" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_values_schema_is_generated_from_the_current_values_and_policy_model():
    assert (CHART / "values.schema.json").read_text() == _load("gen-values-schema").render(), \
        "run hack/gen-values-schema.py"


def test_dashboard_json_is_generated_from_the_current_panel_table():
    assert (CHART / "files" / "dashboard.json").read_text() == _load("gen-dashboard").render(), \
        "run hack/gen-dashboard.py"


def test_the_charts_default_policy_is_the_shipped_default_policy():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert parse_policy(values["policy"]) == default_policy()


def test_every_values_key_is_declared_in_the_schema():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v, s, path):
        if isinstance(v, dict) and s.get("additionalProperties") is False:
            for k, sub in v.items():
                assert k in s["properties"], f"{path}.{k} is not in values.schema.json"
                if path != "" or k != "policy":
                    walk(sub, s["properties"][k], f"{path}.{k}")

    walk(values, schema, "")
