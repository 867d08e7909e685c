"""The fake probe replays an inventory file and stamps nodeName, observedAt and migStrategy."""

from __future__ import annotations

import json

import pytest
import yaml

from node_agent.fake import FakeProbe
from node_agent.inventory import InventoryError
from tests.node_agent.agent_fixtures import A100_MIG, FIXED_NOW, fake_from, fixture_data, probe_of


@pytest.fixture
def inventory_file(tmp_path):
    inv = probe_of(fake_from(fixture_data(A100_MIG)), node_name="from-file", mig_strategy="mixed").probe()
    data = inv.to_dict()
    data["observedAt"] = "2020-01-01T00:00:00Z"
    path = tmp_path / "node.json"
    path.write_text(json.dumps(data))
    return path


def test_stamps_the_given_node_name_and_observed_at_now(inventory_file):
    inv = FakeProbe(inventory_file, node_name="gpu-a100-mig-0", clock=lambda: FIXED_NOW).probe()
    assert inv.node_name == "gpu-a100-mig-0"
    assert inv.observed_at == FIXED_NOW
    assert inv.mig_strategy == "mixed"  # the file's, when not given
    assert [m.profile for m in inv.gpus[0].mig_devices] == ["3g.40gb", "3g.40gb"]


def test_keeps_the_files_node_name_when_none_is_given_and_overrides_the_mig_strategy(inventory_file):
    inv = FakeProbe(inventory_file, mig_strategy="single").probe()
    assert (inv.node_name, inv.mig_strategy) == ("from-file", "single")


def test_reads_yaml_and_files_without_observed_at(tmp_path, inventory_file):
    data = json.loads(inventory_file.read_text())
    del data["observedAt"]
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    assert FakeProbe(path, clock=lambda: FIXED_NOW).probe().observed_at == FIXED_NOW


def test_rereads_the_file_on_every_probe(inventory_file):
    probe = FakeProbe(inventory_file)
    assert len(probe.probe().gpus) == 1
    data = json.loads(inventory_file.read_text())
    data["gpus"] = []
    inventory_file.write_text(json.dumps(data))
    assert probe.probe().gpus == []


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["gpus"][0].update(memoryMiB=0), "gpus.0.memoryMiB"),
        (lambda d: d.pop("nodeName"), "nodeName: missing"),
        (lambda d: d.update(apiVersion="v1"), "apiVersion"),
    ],
    ids=["bad-field", "no-node-name", "wrong-api-version"],
)
def test_an_invalid_file_is_an_error_naming_the_file_and_the_field(inventory_file, change, message):
    data = json.loads(inventory_file.read_text())
    change(data)
    inventory_file.write_text(json.dumps(data))
    with pytest.raises(InventoryError) as err:
        FakeProbe(inventory_file).probe()
    assert str(inventory_file) in str(err.value) and message in str(err.value)


def test_a_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(InventoryError, match="nope.json: cannot read"):
        FakeProbe(tmp_path / "nope.json").probe()
