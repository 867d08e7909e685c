#!/usr/bin/env python3
"""Write deploy/helm/gpuplace/values.schema.json: the chart's values, strict, plus the policy's schema.

The policy part is the pydantic model's JSON Schema (``gpuplace policy schema``), its ``$defs``
hoisted to the document root so that its ``$ref``s resolve; a wrong policy field then fails at
``helm install`` with the same field path the extender would report. Run after changing the chart's
values or the policy model; ``tests/unit/test_chart_files.py`` fails while the file is out of date.

    .venv/bin/python hack/gen-values-schema.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "deploy" / "helm" / "gpuplace" / "values.schema.json"

from scheduler_extender.core.policy import policy_json_schema  # noqa: E402


def obj(props: dict[str, Any], required: tuple[str, ...] = (), description: str = "") -> dict[str, Any]:
    d: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
    if required:
        d["required"] = list(required)
    if description:
        d["description"] = description
    return d


def s(description: str = "", **kw: Any) -> dict[str, Any]:
    return {"type": "string", **({"description": description} if description else {}), **kw}


def integer(minimum: int, description: str = "", **kw: Any) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, **({"description": description} if description else {}), **kw}


ANY_OBJECT = {"type": "object"}
ANY_LIST = {"type": "array"}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
RESOURCES = obj({"requests": ANY_OBJECT, "limits": ANY_OBJECT, "claims": ANY_LIST})
DURATION = s("a Go duration, e.g. 30s, 1m", pattern=r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$")
K8S_NAME = s(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", maxLength=63)
PLACEMENT = {"nodeSelector": LABELS, "tolerations": ANY_LIST, "affinity": ANY_OBJECT,
             "priorityClassName": s("PriorityClass of the pods; empty for none")}


def values_schema() -> dict[str, Any]:
    policy = policy_json_schema()
    defs = policy.pop("$defs", {})
    policy["description"] = "The placement policy (kind: PlacementPolicy); `gpuplace policy schema` prints it."
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gpuplace chart values",
        **obj({
            "nameOverride": s(), "fullnameOverride": s(),
            "global": ANY_OBJECT,
            "image": obj({"repository": s(minLength=1), "tag": s("default: the chart's appVersion"),
                          "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}}, ("repository",)),
            "imagePullSecrets": {"type": "array", "items": obj({"name": s(minLength=1)}, ("name",))},
            "extender": obj({
                "replicas": integer(1, "extender replicas"),
                "port": integer(1, maximum=65535),
                "healthPort": integer(1, "plain-HTTP port of /healthz, /readyz, /metrics when TLS is on", maximum=65535),
                "logLevel": {"enum": ["debug", "info", "warning", "error"]},
                "resources": RESOURCES, "podLabels": LABELS, "podAnnotations": LABELS, **PLACEMENT,
                "requeue": obj({"enabled": {"type": "boolean"},
                                "admissionPolicy": obj({"enabled": {"type": "boolean"}})}),
                "tls": obj({
                    "enabled": {"type": "boolean"},
                    "secretName": s("existing kubernetes.io/tls Secret with the serving certificate",
                                    pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$", maxLength=253),
                    "caBundle": s("PEM CA for the scheduler's tlsConfig.caData",
                                  pattern=r"^(|-----BEGIN CERTIFICATE-----[\s\S]*-----END CERTIFICATE-----\s*)$"),
                    "insecureSkipVerify": {"type": "boolean"},
                    "clientAuth": obj({
                        "enabled": {"type": "boolean"},
                        "secretName": s("existing kubernetes.io/tls Secret with kube-scheduler's client certificate",
                                        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$", maxLength=253),
                    }),
                    "certManager": obj({
                        "enabled": {"type": "boolean"},
                        "issuerRef": {"anyOf": [
                            obj({}),
                            obj({"name": s(minLength=1), "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                                 "group": s(minLength=1)}, ("name", "kind")),
                        ]},
                        "duration": DURATION, "renewBefore": DURATION,
                    }),
                }),
            }),
            "scheduler": obj({
                "enabled": {"type": "boolean"},
                "name": K8S_NAME,
                "replicas": integer(1),
                "image": obj({"repository": s(minLength=1), "tag": s("default: the cluster's vMAJOR.MINOR.PATCH"),
                              "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}}),
                "leaderElection": obj({"enabled": {"type": "boolean"}}),
                "podMaxInUnschedulablePodsDuration": DURATION,
                "percentageOfNodesToScore": integer(0, "percent of the nodes examined per pod; 0: adaptive",
                                                    maximum=100),
                "logVerbosity": integer(0, maximum=10),
                "extender": obj({
                    "weight": integer(1, "weight of the extender's score"),
                    "httpTimeoutSeconds": {"type": "number", "exclusiveMinimum": 0},
                    "ignorable": {"type": "boolean"},
                    "nodeCacheCapable": {"type": "boolean"},
                    "managedResources": {"type": "array", "items": s(pattern=r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$")},
                }),
                "resources": RESOURCES, **PLACEMENT,
            }),
            "agent": obj({
                "enabled": {"type": "boolean"},
                "runtimeClassName": s(),
                "probe": {"enum": ["nvml", "fake", "fake-nvml"]},
                "migStrategy": {"enum": ["", "none", "single", "mixed"]},
                "intervalSeconds": {"type": "number", "exclusiveMinimum": 0},
                "metricsPort": integer(1, maximum=65535),
                "podResourcesDir": s(pattern="^/"),
                "podResources": obj({"enabled": {"type": "boolean"}}),
                "admissionPolicy": obj({"enabled": {"type": "boolean"}}),
                "logLevel": {"enum": ["debug", "info", "warning", "error"]},
                "resources": RESOURCES, **PLACEMENT,
            }),
            "metrics": obj({
                "serviceMonitor": obj({"enabled": {"type": "boolean"}, "interval": DURATION, "labels": LABELS}),
                "podMonitor": obj({"enabled": {"type": "boolean"}, "interval": DURATION, "labels": LABELS}),
            }),
            "prometheusRule": obj({
                "enabled": {"type": "boolean"}, "labels": LABELS,
                "staleInventorySeconds": {"type": "number", "exclusiveMinimum": 0},
                "filterLatencyTimeoutRatio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            }),
            "dashboard": obj({"enabled": {"type": "boolean"}, "labels": LABELS, "namespace": s()}),
            "policy": policy,
        }),
        "$defs": defs,
    }


def render() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)}")
