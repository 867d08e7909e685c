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

from node_agent.inventory import json_schema as inventory_json_schema  # noqa: E402
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
SERVICE_ACCOUNT = obj({"create": {"type": "boolean"}, "name": {"anyOf": [s(maxLength=0), K8S_NAME]},
                       "annotations": LABELS})
EXTRA = {"extraArgs": {"type": "array", "items": s(minLength=1), "description": "arguments appended to the command line"},
         "extraEnv": {"type": "array", "items": {"type": "object", "required": ["name"],
                                                  "properties": {"name": s(minLength=1)}},
                      "description": "Kubernetes EnvVar objects added to the container"}}

LABEL_SELECTOR = obj({"matchLabels": LABELS, "matchExpressions": ANY_LIST})
# A NetworkPolicyPeer; empty ({}) is refused, as the API server refuses it.
NETWORK_POLICY_PEERS = {
    "type": "array",
    "description": "NetworkPolicyPeer objects: podSelector and/or namespaceSelector, or ipBlock",
    "items": {**obj({"podSelector": LABEL_SELECTOR, "namespaceSelector": LABEL_SELECTOR,
                     "ipBlock": obj({"cidr": s(minLength=1), "except": {"type": "array", "items": s(minLength=1)}},
                                    ("cidr",))}),
              "minProperties": 1},
}


def fake_inventory_schema(defs: dict[str, Any]) -> dict[str, Any]:
    """The agent's NodeGPUInventory schema, less what the fake probe stamps itself (nodeName,
    observedAt); its ``$defs`` join ``defs``. Empty is allowed here; templates/validations.yaml
    refuses it, with a message saying what to put there, when the probe is fake."""
    inv = inventory_json_schema()
    inv_defs = inv.pop("$defs", {})
    clash = set(inv_defs) & set(defs)
    assert not clash, f"$defs of the inventory and the policy share names: {clash}"
    defs.update(inv_defs)
    inv["required"] = [k for k in inv.get("required", []) if k not in ("nodeName", "observedAt")]
    inv["description"] = ("With agent.probe=fake: the NodeGPUInventory every agent publishes as its node's "
                          "(nodeName and observedAt are set by the agent)")
    return {"anyOf": [{"type": "object", "maxProperties": 0}, inv]}


def values_schema() -> dict[str, Any]:
    policy = policy_json_schema()
    defs = policy.pop("$defs", {})
    fake_inventory = fake_inventory_schema(defs)
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
                "serviceAccount": SERVICE_ACCOUNT,
                "podDisruptionBudget": obj({
                    "enabled": {"type": "boolean"},
                    "minAvailable": {"anyOf": [integer(0), s(pattern=r"^[0-9]{1,3}%$")],
                                     "description": "a number of extenders, or a percentage such as 50%"},
                }),
                "port": integer(1, maximum=65535),
                "healthPort": integer(1, "plain-HTTP port of /healthz, /readyz, /metrics when TLS is on", maximum=65535),
                "logLevel": {"enum": ["debug", "info", "warning", "error"]},
                "resources": RESOURCES, "podLabels": LABELS, "podAnnotations": LABELS, **PLACEMENT, **EXTRA,
                "debugEndpoints": {"type": "boolean", "description": "serve GET /debug/allocations (--debug-endpoints)"},
                "filterReturnsBest": {"type": "boolean", "description": "one round trip per pod (--filter-returns-best)"},
                "reservationSeconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600,
                                       "description": "how long a pod sent to a node is held there until its binding "
                                                      "shows (--reservation-seconds)"},
                "sessionAffinity": s("the extender Service's sessionAffinity: ClientIP keeps one scheduler on one "
                                     "replica, whose reservations it then meets", enum=["ClientIP", "None"]),
                "networkPolicy": obj({"enabled": {"type": "boolean"}, "extraFrom": NETWORK_POLICY_PEERS,
                                      "healthFrom": NETWORK_POLICY_PEERS}),
                "requeue": obj({"enabled": {"type": "boolean"},
                                "admissionPolicy": obj({"enabled": {"type": "boolean"}})}),
                "preemption": obj({"enabled": {"type": "boolean"}}),
                "defrag": obj({"enabled": {"type": "boolean"},
                               "intervalSeconds": {"type": "number", "minimum": 10, "maximum": 86400}}),
                "dra": obj({
                    "enabled": {"type": "boolean", "description": "Dynamic Resource Allocation (--dra)"},
                    # Rows of scheduler_extender/data/dra-drivers.yaml's form; the extender checks
                    # the rest of each row at start (--dra-drivers), naming the field.
                    "drivers": {"type": "array", "description": "DRA driver mappings added to the built-in ones",
                                "items": {"type": "object",
                                          "required": ["driver", "sources", "productNameAttribute", "memoryCapacity"],
                                          "properties": {"driver": s(minLength=1, maxLength=63),
                                                         "sources": {"type": "array", "minItems": 1,
                                                                     "items": s()}}}},
                    # A DeviceClass's name: a DNS subdomain (it is also quoted into the CEL of the
                    # claim templates' admission policy, which this pattern keeps safe).
                    "deviceClass": s("DeviceClass of the claim templates gpuplace-gpu-<N> the extender creates "
                                     "for pods labelled gpuplace.io/dra=true (--dra-device-class)",
                                     pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                                     maxLength=253),
                    "webhook": obj({
                        "enabled": {"type": "boolean"},
                        "pods": {"type": "boolean",
                                 "description": "also convert pods labelled gpuplace.io/dra=true (POST /mutate/pods)"},
                        "port": integer(1, "HTTPS port of the claim webhook (--claim-webhook-port)", maximum=65535),
                        "failurePolicy": {"enum": ["Fail", "Ignore"]},
                        "timeoutSeconds": integer(1, maximum=30),
                    }),
                }),
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
                "serviceAccount": SERVICE_ACCOUNT,
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
                    "cpuOnlyPods": {"type": "boolean"},
                    "managedResources": {"type": "array", "items": s(pattern=r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$")},
                }),
                "resources": RESOURCES, **PLACEMENT, **EXTRA,
            }),
            "agent": obj({
                "enabled": {"type": "boolean"},
                "serviceAccount": SERVICE_ACCOUNT,
                "runtimeClassName": s(),
                "probe": {"enum": ["nvml", "auto", "amd", "fake"]},  # fake-nvml: test doubles the image lacks
                "fakeInventory": fake_inventory,
                "migStrategy": {"enum": ["", "none", "single", "mixed"]},
                "ignoreXids": {"type": "string", "pattern": r"^(|all|[=+]?[0-9]{1,5}(,[0-9]{1,5})*)$"},
                "xidRecoverySeconds": {"type": "number", "minimum": 0},
                "intervalSeconds": {"type": "number", "exclusiveMinimum": 0},
                "metricsPort": integer(1, maximum=65535),
                "podResourcesDir": s(pattern="^/"),
                "podResources": obj({"enabled": {"type": "boolean"}}),
                "admissionPolicy": obj({"enabled": {"type": "boolean"}}),
                "logLevel": {"enum": ["debug", "info", "warning", "error"]},
                "resources": RESOURCES, **PLACEMENT, **EXTRA,
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
