"""Bad input, fuzzed (hypothesis): request bodies, pod annotations and resources, inventories, policies.

Whatever arrives, the extender never answers 5xx for a client's mistake, keeps serving, and says
which field is wrong; the parsers raise only their own errors. Example counts are modest so that
``make test`` stays fast; ``make fuzz`` runs the same properties with many more examples
(``GPUPLACE_FUZZ_EXAMPLES``, default 150) and prints the slowest inputs each verb was answered
for, with their time (``SLOWEST``), so a parser that turns super-linear shows as a number.
"""

from __future__ import annotations

import copy
import heapq
import json
import os
import time
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from node_agent.inventory import InventoryError, parse_inventory
from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.devices import build_node_view
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import PolicyError, parse_policy
from scheduler_extender.core.criteria import ANNOTATIONS

KNOWN_ANNOTATIONS = frozenset(a.key for a in ANNOTATIONS)  # the built-in ones and those criteria declare
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.server import create_app
from scheduler_extender.cluster.sources import ClusterSource, StaticSource
from tests.factories import EXAMPLES, ROOT, example_inventory, pod
from tests.harness.report import report

EXAMPLES_COUNT = int(os.environ.get("GPUPLACE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES_COUNT, deadline=None, derandomize=EXAMPLES_COUNT <= 150,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))
DEFAULT_POLICY = yaml.safe_load((ROOT / "scheduler_extender" / "data" / "default-policy.yaml").read_text())
TENANT_POLICY = {**DEFAULT_POLICY, "tenants": [
    {"name": "team-a", "namespaces": ["team-a"], "classes": ["large"]},
    {"name": "gold", "namespaceSelector": {"matchLabels": {"tier": "gold"},
                                           "matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["1"]}]},
     "allowedModels": ["H100", "A100-80GB"], "deniedModels": ["A100-SXM4-80GB"]}],
    "defaultTenant": {"classes": ["small", "medium"], "deniedModels": ["H100"]}}

# Numbers as JSON and YAML carry them: huge, negative, fractional, and strings that look like numbers.
numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["1e999999999", "-1", "0", "1.5", "1e400", "9" * 400, "1Ei", "0x10", "８", "∞", "NaN", "Infinity"]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=40))
HOSTILE_TEXTS = ["[" * 5000, '{"a":' * 5000, "- " * 5000, "a: &a [*a]", "a: !!python/object/apply:os.system [id]",
                 "\ufeff{}", "\x00", "{" + '"a": 1, ' * 5000 + "}"]
# Long, Unicode and pathological values: what made the quantity pattern backtrack quadratically
# ("1" x 8,000 + "x": 6 s) and the compute-capability parser hit Python's integer-digit limit.
pathological_texts = st.one_of(
    st.builds(lambda unit, n, tail: unit * n + tail,
              st.sampled_from(["1", "9", "0", ".", "1.", "e", "E", "Ei", "1e", "7B", ",", "H100,", "１", "٣", "-", " "]),
              st.integers(min_value=1, max_value=10_000),
              st.sampled_from(["", "x", "Gi", "B", "e5", ".5", "\x00", "💥", "GiB"])),
    st.text(alphabet=st.characters(categories=["Nd", "No", "Nl", "Zs", "Cf"]), min_size=1, max_size=60),
)
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
                           max_leaves=12)


class Slowest:
    """The slowest answered inputs of one fuzz test: (seconds, input shown cut), the top few."""

    KEEP = 5

    def __init__(self) -> None:
        self.by_test: dict[str, list[tuple[float, str]]] = {}

    def timed(self, test: str, shown: Any, call: Any) -> Any:
        start = time.perf_counter()
        try:
            return call()
        finally:
            heap = self.by_test.setdefault(test, [])
            text = repr(shown)
            entry = (time.perf_counter() - start, text[:100] + (f"... ({len(text)} chars)" if len(text) > 100 else ""))
            (heapq.heappush if len(heap) < self.KEEP else heapq.heappushpop)(heap, entry)


SLOWEST = Slowest()


@pytest.fixture(scope="module", autouse=True)
def slowest_inputs_report():
    yield
    if "GPUPLACE_FUZZ_EXAMPLES" not in os.environ:
        return  # only `make fuzz` prints them; `make test` runs too few examples to mean anything
    for test, heap in sorted(SLOWEST.by_test.items()):
        report(f"fuzz {test}: slowest of {EXAMPLES_COUNT} examples:")
        for seconds, shown in sorted(heap, reverse=True):
            report(f"  {seconds * 1000:9.1f} ms  {shown}")


@pytest.fixture(scope="module")
def client():
    service = ExtenderService(Engine(), StaticSource(EXAMPLES / "cluster", default_catalog()))
    with TestClient(create_app(service), raise_server_exceptions=False) as c:
        yield c


def still_serving(client: TestClient) -> None:
    r = client.post("/filter", content=json.dumps({"Pod": pod({"gpuplace.io/vram": "8Gi"}), "NodeNames": NODES}))
    assert r.status_code == 200 and r.json()["NodeNames"]


def assert_client_error_or_ok(r: Any) -> None:
    assert r.status_code in (200, 400), (r.status_code, r.text[:500])
    if r.status_code == 400:
        assert r.json()["Error"]


# ---- request bodies --------------------------------------------------------------------------------

@FUZZ
@given(body=st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())))
def test_any_body_gets_a_400_or_an_answer_never_a_5xx(client, body):
    for verb in ("filter", "prioritize", "preempt"):
        assert_client_error_or_ok(SLOWEST.timed(f"body /{verb}", body, lambda: client.post(f"/{verb}", content=body)))
    still_serving(client)


pod_shaped = st.fixed_dictionaries({}, optional={
    "metadata": st.one_of(json_values, st.fixed_dictionaries({}, optional={
        "name": json_values, "namespace": json_values, "uid": json_values,
        "annotations": st.one_of(json_values, st.dictionaries(st.sampled_from(sorted(KNOWN_ANNOTATIONS)), json_values)),
    })),
    "spec": st.one_of(json_values, st.fixed_dictionaries({}, optional={
        "containers": st.one_of(json_values, st.lists(st.fixed_dictionaries({}, optional={
            "resources": st.one_of(json_values, st.fixed_dictionaries({}, optional={
                "limits": st.one_of(json_values, st.dictionaries(
                    st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-x"]),
                    json_values)),
                "requests": json_values,
            })),
        }), max_size=3)),
        "initContainers": json_values,
    })),
})
node_shaped = st.fixed_dictionaries({}, optional={
    "metadata": st.one_of(json_values, st.fixed_dictionaries({"name": st.sampled_from(NODES + ["x"])}, optional={
        "annotations": st.one_of(json_values, st.fixed_dictionaries({"gpuplace.io/inventory": json_values}))})),
    "status": st.one_of(json_values, st.fixed_dictionaries({"allocatable": json_values})),
})


@FUZZ
@given(p=pod_shaped, names=st.one_of(st.lists(st.sampled_from(NODES + ["not-a-node", ""]), max_size=4), json_values),
       nodes=st.one_of(st.none(), st.lists(node_shaped, max_size=3), json_values))
def test_any_pod_and_node_list_shape_gets_a_400_or_an_answer(client, p, names, nodes):
    body: dict[str, Any] = {"Pod": p, "NodeNames": names}
    if nodes is not None:
        body = {"Pod": p, "Nodes": {"items": nodes} if isinstance(nodes, list) else nodes}
    for verb in ("filter", "prioritize"):
        assert_client_error_or_ok(client.post(f"/{verb}", content=json.dumps(body)))
    still_serving(client)


# ---- every pod annotation and the GPU request ------------------------------------------------------

annotation_values = st.one_of(st.text(max_size=30), pathological_texts, st.sampled_from([
    "7B", "1e999999999", "1e-9", "-7B", "40Gi", "1e999999999Ei", "0", "-1Gi", "8.0", "99999999999999999999.0",
    "H100,", ",", " , ", "h100,H20", "nvlink,nvlink", "full-gpu,mig", "ｎｖｌｉｎｋ", "large", "\x00", "💥",
    "４０Gi", "７B", "1m", "1" * 8000 + "x", "9" * 5000, "8." + "9" * 5000, "1" * 5000 + ".0"]))


@FUZZ
@given(annotations=st.dictionaries(st.sampled_from(sorted(KNOWN_ANNOTATIONS)), annotation_values, min_size=1),
       gpus=st.one_of(st.integers(min_value=-3, max_value=10**12), annotation_values),
       resource=st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-bogus"]))
def test_every_annotation_and_request_is_answered_with_a_reason_that_names_the_field(client, annotations, gpus, resource):
    p = pod(annotations, gpus=gpus, resource=resource)
    body = json.dumps({"Pod": p, "NodeNames": NODES})
    r = SLOWEST.timed("annotations /filter", annotations, lambda: client.post("/filter", content=body))
    assert r.status_code == 200, r.text[:500]
    got = r.json()
    job = Engine().job(p)
    if job.errors:
        assert not got["NodeNames"]
        for reason in {**got["FailedNodes"], **got["FailedAndUnresolvableNodes"]}.values():
            assert all(str(e) in reason for e in job.errors)
            assert all(e.field.startswith(("gpuplace.io/", "resources")) for e in job.errors)
    assert SLOWEST.timed("annotations /prioritize", annotations,
                         lambda: client.post("/prioritize", content=body)).status_code == 200


# ---- the inventory annotation ----------------------------------------------------------------------

def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _mutate(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    doc = copy.deepcopy(doc)
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def mutated(draw: Any, doc: Any) -> Any:
    """``doc`` with one to three values replaced by arbitrary JSON or removed."""
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(doc)))
        doc = _mutate(doc, path, draw(json_values), draw(st.booleans()) and bool(path))
    return doc


INVENTORY = example_inventory("gpu-a100-mig-0")


@FUZZ
@given(doc=st.one_of(mutated(INVENTORY), json_values), as_text=st.booleans())
def test_any_inventory_is_parsed_or_rejected_with_an_inventory_error_and_never_crashes_the_filter(doc, as_text):
    data = json.dumps(doc) if as_text else doc
    try:
        inv = parse_inventory(data, source="gpuplace.io/inventory")
    except InventoryError as e:
        assert str(e).startswith("gpuplace.io/inventory: ")
        return
    view = build_node_view(inv, default_catalog())
    cache = ClusterCache(default_catalog())
    cache.replace_nodes([{"metadata": {"name": inv.node_name, "annotations": {"gpuplace.io/inventory": inv.to_json()}},
                          "status": {"allocatable": {k: str(len(v)) for k, v in view.units_by_resource.items()}}}])
    cache.replace_pods([])
    engine = Engine()
    for p in (pod({"gpuplace.io/vram": "8Gi"}), pod({}, gpus=2), pod({"gpuplace.io/require": "nvlink"}, gpus=2)):
        states = ClusterSource(cache, default_catalog()).states([inv.node_name], None)
        engine.decide(p, states, None)


@FUZZ
@given(text=st.one_of(st.text(max_size=300), st.binary(max_size=300), st.sampled_from(HOSTILE_TEXTS)))
def test_any_inventory_text_is_parsed_or_rejected_with_an_inventory_error(text):
    try:
        parse_inventory(text, source="inv")
    except InventoryError as e:
        assert str(e).startswith("inv: ")


# ---- the policy file -------------------------------------------------------------------------------

@FUZZ
@given(doc=st.one_of(mutated(DEFAULT_POLICY), mutated(TENANT_POLICY), json_values),
       labels=st.one_of(st.none(), st.dictionaries(st.sampled_from(["tier", "x", "y"]), st.text(max_size=5))))
def test_any_policy_is_valid_or_rejected_with_a_policy_error_naming_the_source(doc, labels):
    try:
        policy = parse_policy(doc if isinstance(doc, dict) else yaml.safe_dump(doc), source="p.yaml")
    except PolicyError as e:
        assert str(e).startswith("p.yaml: ")
        return
    # A policy that validates must be usable for every kind of pod.
    engine = Engine(policy)
    states = StaticSource(EXAMPLES / "cluster", default_catalog()).states(NODES, None)
    for p in (pod({"gpuplace.io/model-params": "13B"}), pod({}, gpus=8), pod({"gpuplace.io/vram": "70Gi"}, namespace="x"),
              pod({"gpuplace.io/gpu-models": "H100", "gpuplace.io/class": "large"}, namespace="team-a")):
        engine.decide(p, states, None, labels)


@FUZZ
@given(text=st.one_of(st.text(max_size=400), st.sampled_from(HOSTILE_TEXTS)))
def test_any_policy_text_is_valid_or_rejected_with_a_policy_error(text):
    try:
        parse_policy(text, source="p.yaml")
    except PolicyError as e:
        assert str(e).startswith("p.yaml: ")
