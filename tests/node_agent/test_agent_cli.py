"""``gpuplace-agent`` end to end in-process: print, publish through a real client, clear errors."""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from node_agent import cli
from node_agent.inventory import ANNOTATION, parse_inventory
from tests.node_agent.agent_fixtures import A100_MIG, A100_NVSWITCH, MI300X, fake_from, fixture_data, probe_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "cluster").glob("*.json"))


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch, tmp_path):
    for var in ("NODE_NAME", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def own_inventory_file(tmp_path) -> Path:
    path = tmp_path / "gpu-a100-mig-0.json"
    path.write_text(probe_of(fake_from(fixture_data(A100_MIG)), node_name="gpu-a100-mig-0").probe().to_json())
    return path


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main([*args, "--pod-resources-socket", "/nonexistent/kubelet.sock"])
    out, err = capsys.readouterr()
    return code, out, err


def inventory_files() -> list[Any]:
    if EXAMPLES:
        return [pytest.param(p, id=p.stem) for p in EXAMPLES]
    return [pytest.param(None, id="own-fixture")]


@pytest.mark.parametrize("path", inventory_files())
def test_once_print_replays_an_inventory_file_without_a_cluster(path, own_inventory_file, capsys):
    path = path or own_inventory_file
    code, out, err = run(["--probe", "fake", "--fake-inventory", str(path), "--once", "--print"], capsys)
    assert code == cli.EXIT_OK, err
    printed = parse_inventory(out)
    original = json.loads(Path(path).read_text())
    assert printed.node_name == original["nodeName"]
    assert len(printed.gpus) == len(original["gpus"])
    assert "\n  " in out, "pretty-printed"


def test_once_print_with_the_fake_nvml_fixture_runs_the_nvml_code(capsys):
    code, out, err = run(["--probe", "fake-nvml", "--nvml-fixture", str(A100_NVSWITCH), "--node-name", "gpu-a100-0",
                          "--mig-strategy", "mixed", "--once", "--print"], capsys)
    assert code == cli.EXIT_OK, err
    inv = parse_inventory(out)
    assert (inv.node_name, inv.mig_strategy, len(inv.gpus)) == ("gpu-a100-0", "mixed", 8)
    assert all(len(g.nvlinks) == 7 for g in inv.gpus)
    # nvidia-smi -q "GPU Current Temp" of the published output, through pynvml and the stand-in
    assert [g["temperatureC"] for g in json.loads(out)["gpus"]] == [28, 30, 28, 32, 30, 31, 30, 32]


def test_once_print_leaves_an_unknown_temperature_out(capsys):
    code, out, err = run(["--probe", "fake-nvml", "--nvml-fixture", str(A100_MIG), "--node-name", "n", "--once",
                          "--print"], capsys)
    assert code == cli.EXIT_OK, err
    assert "temperatureC" not in out


def test_node_name_defaults_to_the_node_name_environment_variable(monkeypatch, capsys):
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    code, out, _ = run(["--probe", "fake-nvml", "--nvml-fixture", str(A100_MIG), "--once", "--print"], capsys)
    assert code == 0 and parse_inventory(out).node_name == "from-downward-api"


def test_a_bad_fixture_file_exits_2_naming_the_file_and_the_field_without_a_traceback(tmp_path, capsys):
    data = fixture_data(A100_MIG)
    data["gpus"][0]["memoryTotalMiB"] = "lots"
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(data))
    code, out, err = run(["--probe", "fake-nvml", "--nvml-fixture", str(bad), "--once", "--print"], capsys)
    assert code == cli.EXIT_USAGE
    assert f"{bad}: field gpus.0.memoryTotalMiB" in err
    assert "Traceback" not in err and out == ""


def test_a_bad_inventory_file_exits_2_naming_the_file_and_the_field(own_inventory_file, capsys):
    data = json.loads(own_inventory_file.read_text())
    data["gpus"][0]["vendor"] = "intel"
    own_inventory_file.write_text(json.dumps(data))
    code, _, err = run(["--probe", "fake", "--fake-inventory", str(own_inventory_file), "--once", "--print"], capsys)
    assert code == cli.EXIT_USAGE and "gpus.0.vendor" in err and str(own_inventory_file) in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--probe", "fake", "--once", "--print"], "--probe fake needs --fake-inventory FILE"),
        (["--probe", "fake-nvml", "--once", "--print"], "--probe fake-nvml needs --nvml-fixture FILE"),
    ],
)
def test_missing_files_are_usage_errors(args, message, capsys):
    code, _, err = run(args, capsys)
    assert code == cli.EXIT_USAGE and message in err


def test_the_test_probes_come_from_gpuplace_testing_through_its_entry_points():
    from importlib.metadata import entry_points

    import gpuplace_testing.fake_amdsmi
    import gpuplace_testing.fake_nvml

    found = {e.name: e for e in entry_points(group=cli.TEST_PROBES_GROUP)}
    assert found["fake-nvml"].load() is gpuplace_testing.fake_nvml.load_fixture
    assert found["fake-amdsmi"].load() is gpuplace_testing.fake_amdsmi.load_fixture
    assert found["fake-nvml"].dist.name == "gpuplace-testing"


def _no_test_probes(monkeypatch, *entries):
    """importlib.metadata as it is where gpuplace-testing is not installed (or holds ``entries``)."""
    import importlib.metadata

    real = importlib.metadata.entry_points

    def entry_points(**params):
        if params.get("group") == cli.TEST_PROBES_GROUP:
            return importlib.metadata.EntryPoints(
                e for e in entries if e.name == params.get("name", e.name))
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


@pytest.mark.parametrize("probe, flag, scenario", [("fake-nvml", "--nvml-fixture", A100_MIG),
                                                   ("fake-amdsmi", "--amdsmi-fixture", MI300X)])
def test_a_test_probe_without_gpuplace_testing_exits_2_naming_the_package(monkeypatch, capsys, probe, flag, scenario):
    _no_test_probes(monkeypatch)
    code, out, err = run(["--probe", probe, flag, str(scenario), "--node-name", "n", "--once", "--print"], capsys)
    assert code == cli.EXIT_USAGE and out == ""
    assert err == f"gpuplace-agent: error: --probe {probe} needs the gpuplace-testing package: pip install 'gpuplace[testing]'\n"


def test_a_broken_gpuplace_testing_exits_2_without_a_traceback(monkeypatch, capsys):
    import importlib.metadata

    _no_test_probes(monkeypatch, importlib.metadata.EntryPoint(
        name="fake-nvml", value="gpuplace_testing.no_such_module:load_fixture", group=cli.TEST_PROBES_GROUP))
    code, out, err = run(["--probe", "fake-nvml", "--nvml-fixture", str(A100_MIG), "--node-name", "n", "--once",
                          "--print"], capsys)
    assert code == cli.EXIT_USAGE and out == "" and "Traceback" not in err
    assert "gpuplace_testing.no_such_module:load_fixture cannot be loaded" in err and "gpuplace[testing]" in err


def _driver_answers(monkeypatch, init_error):
    """The node's libnvidia-ml, as pynvml finds it, answers nvmlInit with ``init_error``."""
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlLib", fake_from({"initError": init_error, "gpus": []}))
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})


def test_no_driver_exits_3_with_a_clear_message(monkeypatch, capsys):
    _driver_answers(monkeypatch, "DRIVER_NOT_LOADED")
    code, out, err = run(["--once", "--print", "--node-name", "n"], capsys)
    assert code == cli.EXIT_NO_DRIVER
    assert "NVIDIA kernel driver is not loaded" in err and "--keep-running-without-driver" in err
    assert "Traceback" not in err and out == ""


def test_keep_running_without_driver_reports_zero_gpus(monkeypatch, capsys):
    _driver_answers(monkeypatch, "LIBRARY_NOT_FOUND")
    code, out, _ = run(["--once", "--print", "--node-name", "n", "--keep-running-without-driver"], capsys)
    assert code == cli.EXIT_OK and parse_inventory(out).gpus == []


def test_publishing_without_kubeconfig_outside_a_cluster_says_what_to_do(own_inventory_file, capsys):
    code, _, err = run(["--probe", "fake", "--fake-inventory", str(own_inventory_file), "--once"], capsys)
    assert code == cli.EXIT_USAGE and "no --kubeconfig given" in err


# ---- publishing through the real kubernetes client, against a minimal API server -----------------


class _FakeAPIServer:
    """Answers PATCH /api/v1/nodes/<name> like kube-apiserver would, and records what it got."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append({"path": self.path, "content_type": self.headers["Content-Type"],
                                       "body": json.loads(body)})
                name = self.path.rsplit("/", 1)[-1]
                reply = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "agent", "user": {"token": "t"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "agent"}}],
    }))
    return path


def test_once_with_kubeconfig_patches_the_node_and_exits_0(own_inventory_file, tmp_path, capsys):
    server = _FakeAPIServer()
    try:
        code, _, err = run(["--probe", "fake", "--fake-inventory", str(own_inventory_file), "--once",
                            "--kubeconfig", str(kubeconfig(tmp_path, server.port))], capsys)
    finally:
        server.close()
    assert code == cli.EXIT_OK, err
    [request] = server.requests
    assert request["path"] == "/api/v1/nodes/gpu-a100-mig-0"
    assert request["content_type"] == "application/strategic-merge-patch+json"
    meta = request["body"]["metadata"]
    assert parse_inventory(meta["annotations"][ANNOTATION]).node_name == "gpu-a100-mig-0"
    assert meta["labels"]["gpuplace.io/mig"] == "true"


def test_once_exits_1_with_the_reason_when_the_api_server_stays_away(own_inventory_file, tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run(["--probe", "fake", "--fake-inventory", str(own_inventory_file), "--once",
                        "--kubeconfig", str(kubeconfig(tmp_path, port)), "--publish-timeout-seconds", "0.2"], capsys)
    assert code == cli.EXIT_PUBLISH_FAILED
    assert "could not patch node gpu-a100-mig-0 within 0.2 s" in err and "Traceback" not in err


def test_help_explains_the_options_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    for words in ("--probe {auto,nvml,amd,fake,fake-nvml,fake-amdsmi}", "--heartbeat-seconds",
                  "--keep-running-without-driver", "exit codes:", "no usable GPU driver"):
        assert words in out


@pytest.mark.parametrize("text", [
    "apiVersion: v1\nkind: Config\nusers:\n- name: a\n  user:\n    token: SECRET-TOKEN-42\n   bad: [\n",
    "apiVersion: v1\nkind: Config\ncurrent-context: x\nusers:\n- name: a\n  user: {token: SECRET-TOKEN-42}\n",
])
def test_a_broken_kubeconfig_is_a_usage_error_that_does_not_echo_its_token(text, own_inventory_file, tmp_path, capsys):
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    code = cli.main(["--probe", "fake", "--fake-inventory", str(own_inventory_file), "--node-name", "n", "--once",
                     "--kubeconfig", str(path), "--metrics-port", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot use kubeconfig {path}" in err and "SECRET-TOKEN-42" not in err


def test_a_malformed_ignore_xids_is_a_usage_error_naming_the_accepted_forms(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--probe", "fake-nvml", "--nvml-fixture", str(A100_MIG), "--once", "--print", "--ignore-xids", "79,fatal"])
    err = capsys.readouterr().err
    assert exit_.value.code == cli.EXIT_USAGE and "--ignore-xids" in err and "'=13,31'" in err
