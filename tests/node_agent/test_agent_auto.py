"""``gpuplace-agent --probe auto`` (the default) and the AMD probes on the command line."""

from __future__ import annotations

import pytest

from node_agent import cli
from node_agent.amd import AMDSMIUnavailable
from node_agent.auto import AutoProbe
from node_agent.inventory import parse_inventory
from node_agent.nvml import NVMLUnavailable
from node_agent.probing import DriverUnavailable, ProbeError
from tests.node_agent.agent_fixtures import (
    A100_NVSWITCH, MI300X, amd_fake_from, amd_probe_of, fake_from, fixture_data, probe_of,
)


class Unusable:
    """A probe whose library does not load."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def probe(self):
        self.calls += 1
        raise self.error


NO_NVML = NVMLUnavailable("NVML unavailable: libnvidia-ml.so.1 was not found")
NO_AMDSMI = AMDSMIUnavailable("AMD SMI unavailable: ROCm's libamd_smi.so was not found")


def test_auto_reads_nvidia_gpus_through_nvml_and_never_loads_amd_smi():
    def amd():
        raise AssertionError("AMD SMI must not be tried on an NVIDIA node")

    auto = AutoProbe(nvml=lambda: probe_of(fake_from(fixture_data(A100_NVSWITCH))), amd=amd)
    assert {g.vendor for g in auto.probe().gpus} == {"nvidia"}
    assert auto.chosen == "nvml"


def test_auto_reads_amd_gpus_through_amd_smi_where_nvml_does_not_load():
    nvml = Unusable(NO_NVML)
    auto = AutoProbe(nvml=lambda: nvml, amd=lambda: amd_probe_of(amd_fake_from(fixture_data(MI300X))))
    inv = auto.probe()
    assert ({g.vendor for g in inv.gpus}, len(inv.gpus), auto.chosen) == ({"amd"}, 8, "amd")
    auto.probe()
    assert nvml.calls == 1  # decided once: later probes go to AMD SMI only


def test_auto_reads_amd_gpus_where_nvml_loads_but_sees_none():
    auto = AutoProbe(nvml=lambda: probe_of(fake_from({"driverVersion": "570.86.15", "gpus": []})),
                     amd=lambda: amd_probe_of(amd_fake_from(fixture_data(MI300X))))
    assert auto.probe().gpus[0].name == "AMD Instinct MI300X"


def test_auto_without_either_driver_names_both_and_tries_again_next_probe():
    nvml, amd = Unusable(NO_NVML), Unusable(NO_AMDSMI)
    auto = AutoProbe(nvml=lambda: nvml, amd=lambda: amd)
    with pytest.raises(DriverUnavailable, match="libnvidia-ml.so.1 was not found.*libamd_smi.so was not found"):
        auto.probe()
    with pytest.raises(DriverUnavailable):
        auto.probe()
    assert (nvml.calls, amd.calls, auto.chosen) == (2, 2, None)


def test_auto_where_nvml_sees_no_gpu_and_amd_smi_none_keeps_nvmls_hint():
    auto = AutoProbe(nvml=lambda: probe_of(fake_from({"driverVersion": "570.86.15", "gpus": []})),
                     amd=lambda: Unusable(NO_AMDSMI))
    with pytest.raises(ProbeError, match="runtimeClassName: nvidia.*AMD SMI: AMD SMI unavailable"):
        auto.probe()


# ---- the command line ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch):
    for var in ("NODE_NAME", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main([*args, "--pod-resources-socket", "/nonexistent/kubelet.sock"])
    out, err = capsys.readouterr()
    return code, out, err


def test_auto_is_the_default_probe():
    assert cli.build_parser().parse_args([]).probe == "auto"


def test_once_print_with_the_fake_amdsmi_fixture_runs_the_amd_smi_code(capsys):
    code, out, err = run(["--probe", "fake-amdsmi", "--amdsmi-fixture", str(MI300X), "--node-name", "mi300x-0",
                          "--once", "--print"], capsys)
    assert code == cli.EXIT_OK, err
    inv = parse_inventory(out)
    assert (inv.node_name, len(inv.gpus), inv.gpus[0].memory_mib) == ("mi300x-0", 8, 196592)
    assert all(len(g.nvlinks) == 7 for g in inv.gpus)


def test_fake_amdsmi_without_a_fixture_or_with_a_bad_one_exits_2(tmp_path, capsys):
    code, _, err = run(["--probe", "fake-amdsmi", "--node-name", "n", "--once", "--print"], capsys)
    assert code == cli.EXIT_USAGE and "--amdsmi-fixture FILE" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n- {uuid: x, bdf: nowhere}\n")
    code, _, err = run(["--probe", "fake-amdsmi", "--amdsmi-fixture", str(bad), "--node-name", "n", "--once",
                        "--print"], capsys)
    assert code == cli.EXIT_USAGE and str(bad) in err and "Traceback" not in err


def test_auto_without_a_driver_exits_3_naming_both(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_nvml_probe", lambda args, node_name, **kw: Unusable(NO_NVML))
    monkeypatch.setattr(cli, "_amd_probe", lambda args, node_name, **kw: Unusable(NO_AMDSMI))
    code, out, err = run(["--node-name", "n", "--once", "--print"], capsys)
    assert code == cli.EXIT_NO_DRIVER and out == ""
    assert "NVML unavailable" in err and "AMD SMI unavailable" in err and "--keep-running-without-driver" in err


@pytest.mark.parametrize("probe", ["auto", "amd"])
def test_keep_running_without_driver_reports_zero_gpus(monkeypatch, capsys, probe):
    monkeypatch.setattr(cli, "_nvml_probe", lambda args, node_name, **kw: Unusable(NO_NVML))
    monkeypatch.setattr(cli, "_amd_probe", lambda args, node_name, **kw: Unusable(NO_AMDSMI))
    code, out, err = run(["--probe", probe, "--node-name", "n", "--once", "--print", "--keep-running-without-driver"],
                         capsys)
    assert code == cli.EXIT_OK, err
    assert parse_inventory(out).gpus == []
