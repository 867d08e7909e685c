"""The typed pod: validated once where it enters, read by the decision, keyed by content."""

from __future__ import annotations

import orjson
import pytest

from scheduler_extender.core.engine import Engine
from scheduler_extender.core.pod import Pod, PodShapeError, as_pod
from scheduler_extender.service.wire import WireError, parse_extender_args
from tests.factories import pod


def test_the_wire_layer_hands_the_decision_a_typed_pod():
    args = parse_extender_args(orjson.dumps({"Pod": pod({"gpuplace.io/vram": "20Gi"}, gpus=2), "NodeNames": ["a"]}))
    assert isinstance(args.Pod, Pod)
    assert (args.Pod.name, args.Pod.namespace, args.Pod.annotations) == ("job", "default", {"gpuplace.io/vram": "20Gi"})
    assert args.Pod.container_requests() == ([{"nvidia.com/gpu": "2", "cpu": "100m"}], [])


def test_a_pod_field_of_the_wrong_type_is_refused_naming_it_on_the_wire_and_in_the_core():
    bad = pod()
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = {"n": 1}
    with pytest.raises(WireError, match=r"^Pod\.spec\.containers\.0\.resources\.limits\.nvidia\.com/gpu: a quantity"):
        parse_extender_args(orjson.dumps({"Pod": bad, "NodeNames": ["a"]}))
    with pytest.raises(PodShapeError) as e:
        as_pod(bad)
    assert e.value.field == "spec.containers.0.resources.limits.nvidia.com/gpu"
    job = Engine().job(bad)  # a decoded pod from elsewhere: the job's one error, never a crash
    assert [str(err) for err in job.errors] == [str(e.value)]


def test_requests_win_over_limits_and_init_containers_are_kept_apart():
    p = pod(gpus=1)
    p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "2"
    p["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]
    assert as_pod(p).container_requests() == ([{"nvidia.com/gpu": "2", "cpu": "100m"}], [{"nvidia.com/gpu": "3"}])


def test_the_content_key_leaves_out_name_uid_and_ignored_annotations_but_nothing_the_decision_reads():
    base, _ = as_pod(pod({"gpuplace.io/model-params": "7B"}, name="a")).content_key()
    renamed = pod({"gpuplace.io/model-params": "7B"}, name="b")
    renamed["metadata"]["uid"] = "forged"
    assert as_pod(renamed).content_key()[0] == base
    marked = pod({"gpuplace.io/model-params": "7B", "mark": "x"}, name="c")
    assert as_pod(marked).content_key(frozenset({"mark"}))[0] == base
    assert as_pod(marked).content_key()[0] != base
    moved_to_init = pod({"gpuplace.io/model-params": "7B"}, gpus=None)
    moved_to_init["spec"]["initContainers"] = [{"resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m"}}}]
    moved_to_init["spec"]["containers"][0]["resources"]["limits"] = {}
    assert as_pod(moved_to_init).content_key()[0] != base  # same resources, another container kind
    assert as_pod(pod({"gpuplace.io/model-params": "7B"}, namespace="team-b")).content_key()[0] != base


def test_the_content_keys_size_grows_with_what_it_holds():
    small = as_pod(pod({"gpuplace.io/model-params": "7B"})).content_key()[1]
    big = as_pod(pod({"gpuplace.io/model-params": "7B", "note": "x" * 10_000})).content_key()[1]
    assert big - small >= 10_000 + len("note")
