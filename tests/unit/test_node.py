"""The typed Node (core.node): every reader of a v1.Node goes through as_node, which never raises."""

import pytest

from scheduler_extender.core.allocatable import gpu_allocatable, host_allocatable, node_mig_strategy
from scheduler_extender.core.gfd import gfd_labels
from scheduler_extender.core.node import Node, as_node, node_name
from scheduler_extender.core.sharing import sharing_labels

NODE = {"metadata": {"name": "gpu-0", "resourceVersion": "7",
                     "labels": {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.replicas": "4",
                                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                     "annotations": {"gpuplace.io/inventory": "{}"}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}}}


def test_a_node_from_the_api_server_reads_its_name_labels_annotations_and_allocatable():
    node = as_node(NODE)
    assert node == Node("gpu-0", NODE["metadata"]["labels"], NODE["metadata"]["annotations"],
                        NODE["status"]["allocatable"], "7")
    assert as_node(node) is node and node_name(NODE) == "gpu-0"
    assert gpu_allocatable(node) == {"nvidia.com/gpu": 2} and host_allocatable(node) == (8000, 32 * 2**30)
    assert node_mig_strategy(node) == "single" and sharing_labels(node) == (None, "4")
    assert gfd_labels(node) == gfd_labels(NODE) != ()


@pytest.mark.parametrize("obj", [
    None, [], "node", {"metadata": []}, {"metadata": {"name": 5, "labels": ["a"], "annotations": "x"}},
    {"metadata": {"name": "n"}, "status": []}, {"metadata": {"name": "n"}, "status": {"allocatable": "8"}},
])
def test_a_node_of_the_wrong_shape_reads_as_absent_fields_never_an_exception(obj):
    node = as_node(obj)
    assert node.labels == {} and node.annotations == {} and node.allocatable is None
    assert node.name in ("", "n")
    assert gpu_allocatable(obj) is None and host_allocatable(obj) == (None, None)
    assert node_mig_strategy(obj) is None and sharing_labels(obj) == (None, None) and gfd_labels(obj) == ()
