"""Tenancy: which GPU classes and models the pods of a namespace may use (policy ``tenants``).

A tenant names namespaces (``namespaces``) and/or selects them by label (``namespaceSelector``,
the ``metav1.LabelSelector`` of Kubernetes); the first tenant that matches a pod's namespace
grants its entitlement, a namespace no tenant matches gets ``defaultTenant``. An entitlement
limits the size classes (``classes``) and the GPU models (``allowedModels``, ``deniedModels``;
catalog ids or families, for full GPUs and for the MIG devices carved out of them). Pod
annotations can only narrow within it: ``gpuplace.io/gpu-models`` and ``gpuplace.io/class`` are
checked against the entitlement, never used to step outside it.

Labels of a namespace can be unknown (static mode without ``--namespace-labels``, or a namespace
the extender has not seen yet). Unknown never widens: when the first tenant that could match
needs labels to decide, the pod is denied with a reason instead of falling through to a later
tenant or the default, which may grant more.

Resolution (``resolve_tenancy``) is pure: its result, a ``TenantGrant``, is carried by the
``Job``, so the filter criterion reads nothing but the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler_extender.core.catalog import Catalog

LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class _Strict(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class LabelSelectorRequirement(_Strict):
    """One ``matchExpressions`` entry, as in ``metav1.LabelSelectorRequirement``."""

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> "LabelSelectorRequirement":
        # Same rule as apimachinery's ValidateLabelSelectorRequirement.
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"values: must be non-empty when operator is {self.operator}")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"values: must be empty when operator is {self.operator}")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values  # NotIn


class LabelSelector(_Strict):
    """``metav1.LabelSelector``: every ``matchLabels`` pair and every expression must hold.

    An empty selector (``{}``) matches every namespace whose labels are known.
    """

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, alias="matchExpressions")

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (all(labels.get(k) == v for k, v in self.match_labels.items())
                and all(e.matches(labels) for e in self.match_expressions))


class Entitlement(_Strict):
    """What a tenant's pods may use. Empty lists mean no limit."""

    classes: list[str] = Field(default_factory=list,
                               description="Size classes the pods may be assigned or pin; empty: every class.")
    allowed_models: list[str] = Field(default_factory=list, alias="allowedModels",
                                      description="Model tokens (catalog ids or families) the pods may use, "
                                                  "full GPUs and MIG devices alike; empty: any model.")
    denied_models: list[str] = Field(default_factory=list, alias="deniedModels",
                                     description="Model tokens the pods may not use, full GPUs and MIG devices.")


class Tenant(Entitlement):
    """A group of namespaces and its entitlement. Matches a namespace listed in ``namespaces``
    or whose labels match ``namespaceSelector`` (either suffices)."""

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    namespaces: list[str] = Field(default_factory=list)
    namespace_selector: LabelSelector | None = Field(default=None, alias="namespaceSelector")

    @model_validator(mode="after")
    def _selects_something(self) -> "Tenant":
        if not self.namespaces and self.namespace_selector is None:
            raise ValueError("a tenant needs namespaces or namespaceSelector (or both)")
        return self


@dataclass(frozen=True)
class TenantGrant:
    """The entitlement resolved for one namespace: hashable, no policy objects inside.

    Attributes:
        rule: which policy entry granted it, for reasons: ``"tenancy rule team-b (tenants.1)"``
            or ``"tenancy defaultTenant"``.
        namespace: the pod's namespace.
        classes: class names the namespace may use; None: every class.
        allowed_models: catalog ids; None: any model.
        denied_models: catalog ids never usable.
        allowed_text, denied_text: the policy's tokens as written, for messages.
        undecided: why the entitlement could not be decided (unknown namespace labels); every
            GPU request is denied with it.
    """

    rule: str
    namespace: str
    classes: frozenset[str] | None = None
    allowed_models: frozenset[str] | None = None
    denied_models: frozenset[str] = frozenset()
    allowed_text: str = ""
    denied_text: str = ""
    classes_text: str = ""
    undecided: str | None = None

    @property
    def unrestricted(self) -> bool:
        return (self.classes is None and self.allowed_models is None and not self.denied_models
                and self.undecided is None)

    def models_text(self) -> str:
        """'allows A100-80GB, L40S', 'denies H100', or both; for reasons."""
        parts = []
        if self.allowed_models is not None:
            parts.append(f"allows {self.allowed_text}")
        if self.denied_models:
            parts.append(f"denies {self.denied_text}")
        return "; ".join(parts) or "allows every model"

    def model_denial(self, model_id: str | None) -> str | None:
        """Why a GPU of catalog id ``model_id`` (None: not in the catalog) is not entitled, or None."""
        if self.allowed_models is not None and model_id not in self.allowed_models:
            return self.models_text()
        if model_id is not None and model_id in self.denied_models:
            return self.models_text()
        return None

    def permits_class(self, name: str) -> bool:
        return self.classes is None or name in self.classes


UNRESTRICTED = TenantGrant(rule="tenancy defaultTenant", namespace="")


def _ids(tokens: list[str], catalog: Catalog) -> frozenset[str]:
    # Tokens were checked against the catalog when the policy was loaded.
    return frozenset().union(*(catalog.resolve_token(t) for t in tokens))


def grant_of(entitlement: Entitlement, rule: str, namespace: str, catalog: Catalog) -> TenantGrant:
    return TenantGrant(
        rule=rule,
        namespace=namespace,
        classes=frozenset(entitlement.classes) if entitlement.classes else None,
        allowed_models=_ids(entitlement.allowed_models, catalog) if entitlement.allowed_models else None,
        denied_models=_ids(entitlement.denied_models, catalog),
        allowed_text=", ".join(entitlement.allowed_models),
        denied_text=", ".join(entitlement.denied_models),
        classes_text=", ".join(entitlement.classes),
    )


def resolve_tenancy(tenants: list[Tenant], default: Entitlement, namespace: str,
                    labels: Mapping[str, str] | None, catalog: Catalog) -> TenantGrant:
    """The grant of the first tenant matching ``namespace``, else of ``default``.

    Args:
        tenants: the policy's tenants, in order.
        default: the policy's ``defaultTenant``.
        namespace: the pod's namespace.
        labels: the namespace's labels; None when unknown.
        catalog: resolves model tokens to catalog ids.

    Returns:
        A ``TenantGrant``; ``undecided`` is set when a tenant that selects by label is reached
        while the labels are unknown (never guessed: the pod is denied with that reason).
    """
    for i, t in enumerate(tenants):
        rule = f"tenancy rule {t.name} (tenants.{i})"
        if namespace in t.namespaces:
            return grant_of(t, rule, namespace, catalog)
        if t.namespace_selector is None:
            continue
        if labels is None:
            return TenantGrant(
                rule=rule, namespace=namespace,
                undecided=f"labels of namespace {namespace} are unknown and {rule} selects namespaces by label; "
                          f"entitlement not decided (the extender has not seen the namespace yet, "
                          f"or static mode runs without --namespace-labels)")
        if t.namespace_selector.matches(labels):
            return grant_of(t, rule, namespace, catalog)
    return grant_of(default, "tenancy defaultTenant", namespace, catalog)
