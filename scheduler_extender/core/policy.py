"""The platform team's placement policy (docs/operator-policy.md#the-policy).

One YAML document, validated by pydantic; ``gpuplace policy schema`` prints its JSON Schema.
It names catalog overrides (cost, tier), size classes with the models and MIG profiles each may
use, the ordered rules that assign a job to a class, the estimator's tunables, scoring weights,
and what to do with missing or stale inventory. Model tokens are resolved against the catalog
when the policy is loaded, so a typo is an error with its field path, not a silent no-match.

Loading never half-applies: ``load_policy`` returns a new ``Policy`` or raises ``PolicyError``;
callers keep the running policy on error.
"""

from __future__ import annotations

from functools import cached_property, lru_cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator,
                      model_validator)

from node_agent.inventory import NoAliasLoader, format_validation_error
from scheduler_extender.core.components import COMPONENTS, FRAG_DEFAULT, ScoreComponent  # noqa: F401 - FRAG_DEFAULT: re-exported
from scheduler_extender.core.catalog import Catalog, CatalogEntry, Tier, UnknownModelError, default_catalog
from scheduler_extender.core.estimate import EstimatorSettings
from scheduler_extender.core.quantity import GIB, GB
from scheduler_extender.core.tenancy import Entitlement, Tenant


class _Strict(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class CatalogOverride(_Strict):
    """Change a catalog row's price or tier for this cluster."""

    cost_per_gpu_hour: float | None = Field(default=None, alias="costPerGpuHour", gt=0)
    tier: Tier | None = None


class UnknownModelSettings(_Strict):
    """How GPUs whose driver name is not in the catalog are treated."""

    cost_per_gpu_hour: float = Field(default=3.0, alias="costPerGpuHour", gt=0,
                                     description="Assumed price, USD per GPU-hour (high: unknown is not cheap).")
    tier: Tier = "datacenter"


class SizeClass(_Strict):
    """A size class: which GPUs its jobs may use, and what they prefer."""

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    description: str = ""
    allowed_models: list[str] = Field(default_factory=list, alias="allowedModels",
                                      description="Model tokens for full GPUs; empty: any model.")
    denied_models: list[str] = Field(default_factory=list, alias="deniedModels",
                                     description="Model tokens whose full GPUs this class may not use.")
    last_resort_models: list[str] = Field(
        default_factory=list, alias="lastResortModels",
        description="Model tokens whose full GPUs this class uses only as a last resort: a node where the pod "
                    "would get one scores 0 while another node that passes would give it none; when every "
                    "node that passes would, they are scored as usual.")
    mig_allowed: bool = Field(default=True, alias="migAllowed")
    allowed_mig_profiles: list[str] = Field(default_factory=list, alias="allowedMigProfiles",
                                            description="MIG profiles allowed; empty: any.")
    prefer_mig: bool = Field(default=False, alias="preferMig",
                             description="Score MIG devices higher for jobs that fit one.")
    share_gpus: bool = Field(
        default=False, alias="shareGpus",
        description="Jobs of this class may take a replica of a shared GPU (the NVIDIA device plugin's "
                    "time-slicing or MPS), budgeted by VRAM; false: nodes whose GPUs are shared refuse them.")

    @field_validator("allowed_mig_profiles")
    @classmethod
    def _profile_form(cls, profiles: list[str]) -> list[str]:
        import re
        for p in profiles:
            if not re.fullmatch(r"\d+g\.\d+gb", p):
                raise ValueError(f"{p!r} is not a MIG profile like '3g.40gb'")
        return profiles


class ClassRule(_Strict):
    """Assigns a job to ``class`` when every condition given holds (unset: not checked).

    A condition on VRAM or parameters never holds when the job's value is unknown.
    """

    class_name: str = Field(alias="class")
    min_vram_per_gpu_gib: float | None = Field(default=None, alias="minVramPerGpuGiB", ge=0)
    max_vram_per_gpu_gib: float | None = Field(default=None, alias="maxVramPerGpuGiB", ge=0)
    min_params_billions: float | None = Field(default=None, alias="minParamsBillions", ge=0)
    max_params_billions: float | None = Field(default=None, alias="maxParamsBillions", ge=0)
    min_gpus: int | None = Field(default=None, alias="minGpus", ge=1)
    max_gpus: int | None = Field(default=None, alias="maxGpus", ge=1)
    workloads: list[Literal["training", "finetune-lora", "inference"]] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)
    requires: list[Literal["nvlink", "ecc", "full-gpu", "mig"]] = Field(default_factory=list)


class InventorySettings(_Strict):
    stale_after_seconds: float = Field(default=300, alias="staleAfterSeconds", gt=0,
                                       description="An inventory older than this is stale (agent heartbeat is 60 s).")
    on_missing: Literal["reject", "gfd-labels"] = Field(
        default="reject", alias="onMissing",
        description="Nodes without a gpuplace.io/inventory: reject fails GPU pods there; gfd-labels decides on "
        "NVIDIA GPU feature discovery's labels where the Node has them (product, memory, count; ECC, "
        "NVLink and health unknown, said in every reason), to try gpuplace before rolling out the agent.")
    on_stale: Literal["reject", "trust"] = Field(default="reject", alias="onStale")


class SharingSettings(_Strict):
    replica_choice: Literal["fewest-in-use", "any"] = Field(
        default="fewest-in-use", alias="replicaChoice",
        description="Which GPU of a time-sliced node the NVIDIA device plugin gives a one-replica pod: "
        "fewest-in-use, its default allocation policy (distributed: a GPU with the fewest replicas in use, "
        "internal/rm/allocate.go), so only those GPUs must hold the pod's VRAM need; any: every GPU with a "
        "free replica must (safe whatever the plugin's allocation policy, e.g. packed; refuses more pods).")


class EstimatorSection(_Strict):
    inference_overhead_ratio: float = Field(default=1.2, alias="inferenceOverheadRatio", ge=1)
    activation_reserve_ratio: float = Field(default=0.2, alias="activationReserveRatio", ge=0)
    lora_trainable_ratio: float = Field(default=0.01, alias="loraTrainableRatio", gt=0, le=1)
    cuda_context_gb: float = Field(default=1.3, alias="cudaContextGB", ge=0, description="Decimal GB per GPU.")


class Defaults(_Strict):
    workload: Literal["training", "finetune-lora", "inference"] = "inference"
    precision: Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4", "int8", "int4"] = "bf16"


def _weight_field(c: ScoreComponent) -> Any:
    alias = c.name if c.name != c.field_name else None
    return (float, Field(default=c.default_weight, ge=0, alias=alias, description=c.description or None))


class _Weights(_Strict):
    def by_component(self) -> dict[str, float]:
        """Weight per score component, by the component's name (the field's name in the policy:
        ``vramFit``, ``fragmentation``, ...): what the score weighs and explain reports."""
        return {(f.alias or name): getattr(self, name) for name, f in type(self).model_fields.items()}


ScoringWeights = create_model(
    "ScoringWeights", __base__=_Weights, __doc__="Relative weight of each score component; the score is their "
                                                 "weighted mean, x10.",
    __module__=__name__, **{c.field_name: _weight_field(c) for c in COMPONENTS})
"""One weight per score component declared in ``core.components`` (``vram_fit`` for ``vramFit``),
>= 0, defaulting to the declaration's."""


class Policy(_Strict):
    """The whole policy document."""

    api_version: Literal["gpuplace.io/v1alpha1"] = Field(default="gpuplace.io/v1alpha1", alias="apiVersion")
    kind: Literal["PlacementPolicy"] = "PlacementPolicy"
    defaults: Defaults = Defaults()
    estimator: EstimatorSection = EstimatorSection()
    inventory: InventorySettings = InventorySettings()
    sharing: SharingSettings = SharingSettings()
    catalog: dict[str, CatalogOverride] = Field(default_factory=dict,
                                                description="Overrides keyed by catalog id.")
    unknown_model: UnknownModelSettings = Field(default=UnknownModelSettings(), alias="unknownModel")
    classes: list[SizeClass] = Field(min_length=1)
    rules: list[ClassRule] = Field(min_length=1, description="First rule that matches wins.")
    default_class: str = Field(alias="defaultClass", description="Class of a job no rule matches.")
    scoring: ScoringWeights = ScoringWeights()  # type: ignore[valid-type]  # built from core.components
    tenants: list[Tenant] = Field(
        default_factory=list,
        description="Namespaces and the classes and models their pods may use; first tenant that matches wins.")
    default_tenant: Entitlement = Field(
        default=Entitlement(), alias="defaultTenant",
        description="Entitlement of namespaces no tenant matches; default: everything.")

    @model_validator(mode="after")
    def _references(self, info: ValidationInfo) -> "Policy":
        catalog: Catalog = (info.context or {}).get("catalog") or default_catalog()
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: duplicate class name in {names}")
        for i, rule in enumerate(self.rules):
            if rule.class_name not in names:
                raise ValueError(f"rules.{i}.class: {rule.class_name!r} is not one of the classes {names}")
        if self.default_class not in names:
            raise ValueError(f"defaultClass: {self.default_class!r} is not one of the classes {names}")
        for model_id in self.catalog:
            if model_id not in catalog.entries:
                raise ValueError(f"catalog.{model_id}: not a catalog id (see `gpuplace catalog`)")
        for ci, cls in enumerate(self.classes):
            for field_name, alias in (("allowed_models", "allowedModels"), ("denied_models", "deniedModels"),
                                      ("last_resort_models", "lastResortModels")):
                for ti, token in enumerate(getattr(cls, field_name)):
                    try:
                        catalog.resolve_token(token)
                    except UnknownModelError:
                        raise ValueError(f"classes.{ci}.{alias}.{ti}: {token!r} is no catalog id or alias") from None
        _check_tenants(self, names, catalog)
        return self

    # ---- derived views, computed once per policy object -------------------------------------

    @cached_property
    def estimator_settings(self) -> EstimatorSettings:
        e = self.estimator
        return EstimatorSettings(
            inference_overhead_ratio=e.inference_overhead_ratio,
            activation_reserve_ratio=e.activation_reserve_ratio,
            lora_trainable_ratio=e.lora_trainable_ratio,
            cuda_context_bytes=int(e.cuda_context_gb * GB),
        )

    def class_named(self, name: str) -> SizeClass | None:
        for c in self.classes:
            if c.name == name:
                return c
        return None

    def cost_per_gpu_hour(self, entry: CatalogEntry | None) -> float:
        if entry is None:
            return self.unknown_model.cost_per_gpu_hour
        override = self.catalog.get(entry.id)
        if override and override.cost_per_gpu_hour is not None:
            return override.cost_per_gpu_hour
        return entry.cost_per_gpu_hour

    def tier(self, entry: CatalogEntry | None) -> str:
        if entry is None:
            return self.unknown_model.tier
        override = self.catalog.get(entry.id)
        if override and override.tier is not None:
            return override.tier
        return entry.tier

    def assign_class(
        self,
        *,
        vram_bytes: int | None,
        params: float | None,
        gpu_count: int,
        workload: str | None,
        namespace: str,
        requires: frozenset[str],
    ) -> tuple[SizeClass, str]:
        """The job's class and why (``"rule 2"`` or ``"defaultClass"``)."""
        for i, r in enumerate(self.rules):
            if _rule_matches(r, vram_bytes, params, gpu_count, workload, namespace, requires):
                return self.class_named(r.class_name), f"rule {i}"  # type: ignore[return-value]
        return self.class_named(self.default_class), "defaultClass"  # type: ignore[return-value]


def _rule_matches(r: ClassRule, vram_bytes: int | None, params: float | None, gpu_count: int,
                  workload: str | None, namespace: str, requires: frozenset[str]) -> bool:
    vram_gib = None if vram_bytes is None else vram_bytes / GIB
    params_b = None if params is None else params / 1e9
    checks = [
        (r.min_vram_per_gpu_gib, lambda v: vram_gib is not None and vram_gib >= v),
        (r.max_vram_per_gpu_gib, lambda v: vram_gib is not None and vram_gib <= v),
        (r.min_params_billions, lambda v: params_b is not None and params_b >= v),
        (r.max_params_billions, lambda v: params_b is not None and params_b <= v),
        (r.min_gpus, lambda v: gpu_count >= v),
        (r.max_gpus, lambda v: gpu_count <= v),
    ]
    for threshold, ok in checks:
        if threshold is not None and not ok(threshold):
            return False
    if r.workloads and workload not in r.workloads:
        return False
    if r.namespaces and namespace not in r.namespaces:
        return False
    if r.requires and not set(r.requires) <= requires:
        return False
    return True


def _check_tenants(policy: "Policy", class_names: list[str], catalog: Catalog) -> None:
    """Tenant names unique; their classes and model tokens exist (field paths in messages)."""
    tenant_names = [t.name for t in policy.tenants]
    if len(set(tenant_names)) != len(tenant_names):
        raise ValueError(f"tenants: duplicate tenant name in {tenant_names}")
    entries = [(f"tenants.{i}", t) for i, t in enumerate(policy.tenants)]
    entries.append(("defaultTenant", policy.default_tenant))
    for path, ent in entries:
        for ci, name in enumerate(ent.classes):
            if name not in class_names:
                raise ValueError(f"{path}.classes.{ci}: {name!r} is not one of the classes {class_names}")
        for alias, tokens in (("allowedModels", ent.allowed_models), ("deniedModels", ent.denied_models)):
            for ti, token in enumerate(tokens):
                try:
                    catalog.resolve_token(token)
                except UnknownModelError:
                    raise ValueError(f"{path}.{alias}.{ti}: {token!r} is no catalog id or alias") from None


class PolicyError(ValueError):
    """A policy document that fails validation; the message names each field path."""


def parse_policy(data: str | dict[str, Any], *, source: str = "policy", catalog: Catalog | None = None) -> Policy:
    """Validate a policy from YAML text or a decoded mapping.

    Raises:
        PolicyError: YAML syntax, a wrong type or value, an unknown field, or a reference to a
            class, model or catalog id that does not exist; the message starts with ``source``.
    """
    if isinstance(data, str):
        data = _decode_yaml(data, source)
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: expected a mapping with kind: PlacementPolicy")
    try:
        return Policy.model_validate(data, context={"catalog": catalog or default_catalog()})
    except ValidationError as e:
        raise PolicyError(_bounded(f"{source}: {format_validation_error(e, max_errors=MAX_ERRORS_SHOWN)}")) from e


MAX_ERRORS_SHOWN = 20
"""Validation errors a ``PolicyError`` names (the rest are counted): its message is logged on one
line, recorded as an Event and printed by ``gpuplace policy check``."""

MAX_MESSAGE_CHARS = 4096
"""Longest ``PolicyError`` message; a policy of thousands of bad entries once logged 26,000 characters."""


def _bounded(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else (
        f"{message[:MAX_MESSAGE_CHARS]}... ({len(message)} characters; fix the first errors and check again)")


def _decode_yaml(text: str, source: str) -> Any:
    """YAML text to data, refusing aliases (``*name``) before anything is expanded: an alias
    repeats a subtree without repeating its bytes, so 245 KB of aliased lists stood for 27
    million entries (17.7 s and 261 MB to check). Raises ``PolicyError`` naming the line."""
    try:
        return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader without aliases
    except yaml.composer.ComposerError as e:
        if e.problem and "aliases" in e.problem and e.problem_mark is not None:
            mark = e.problem_mark
            raise PolicyError(f"{source}: line {mark.line + 1}, column {mark.column + 1}: YAML aliases (*name) are "
                              "not accepted in a policy; write the values out where they are used") from None
        raise PolicyError(_bounded(f"{source}: not valid YAML: {e}")) from e
    except yaml.YAMLError as e:
        raise PolicyError(_bounded(f"{source}: not valid YAML: {e}")) from e
    except RecursionError as e:  # '[[[[...': the YAML composer recurses per level
        raise PolicyError(f"{source}: nested too deeply to be a policy") from e


def load_policy(path: str | None) -> Policy:
    """The policy file at ``path``, or the shipped default policy when ``path`` is None.

    Raises:
        PolicyError: as ``parse_policy``; also when the file cannot be read.
    """
    if path is None:
        return default_policy()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PolicyError(f"{path}: cannot read: {e.strerror}") from e
    return parse_policy(text, source=path)


@lru_cache(maxsize=1)
def default_policy() -> Policy:
    """The policy shipped in the package (``data/default-policy.yaml``)."""
    text = resources.files("scheduler_extender").joinpath("data/default-policy.yaml").read_text()
    return parse_policy(text, source="default-policy.yaml")


def policy_json_schema() -> dict[str, Any]:
    return Policy.model_json_schema(by_alias=True)
