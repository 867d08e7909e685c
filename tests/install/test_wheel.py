"""The wheel users install works: built from this tree, installed with its dependencies from PyPI in a
fresh virtualenv outside the tree, its three console scripts run from a directory outside the tree
with no PYTHONPATH, so that nothing can be imported from the source tree (as the editable install of
``make install`` does, which once hid a wheel without ``scheduler_extender.core``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from tests.harness.artifacts import (
    ROOT, Venv, build_wheel, cache_dir, installed_venv, package_roots, project_version, pyproject, tree_files,
)
from tests.harness.controlplane import free_port

pytestmark = pytest.mark.install

EXAMPLES = ROOT / "examples"
POD = EXAMPLES / "pods" / "03-llm-13b-inference.yaml"
CLUSTER = EXAMPLES / "cluster"
INVENTORY = CLUSTER / "gpu-a100-mig-0.json"
FILTER_BODY = ROOT / "tests" / "fixtures" / "wire" / "filter_args_nodecache.json"
SCRIPTS = ("gpuplace-extender", "gpuplace-agent", "gpuplace")
TESTING = ROOT / "testing"  # the gpuplace-testing distribution: the test doubles, apart from the product
TEST_DOUBLES = ("nvml_standin", "amdsmi_standin", "fake_nvml", "fake_amdsmi", "c_boundary")
NVML_SCENARIO = ROOT / "tests" / "fixtures" / "nvml" / "rtx4090-no-nvlink.yaml"


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The wheel of this tree, cached by content under $GPUPLACE_CACHE/wheels: the same file the
    image tests install (tests/harness/images.py)."""
    return build_wheel(cache_dir() / "wheels")


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return installed_venv(tmp_path_factory.mktemp("venv"), wheel)


@pytest.fixture(scope="session")
def testing_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gpuplace-testing wheel, built with ``pip wheel --no-deps`` from a clean copy of testing/
    (the files git knows there: no egg-info or build output of an editable install)."""
    tmp = tmp_path_factory.mktemp("testing-wheel")
    src, dist = tmp / "src", tmp / "dist"
    for name in tree_files():
        if name.startswith("testing/"):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "315532800")}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "--quiet",
                           "--wheel-dir", str(dist), str(src / "testing")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip wheel testing/ failed:\n{proc.stdout}\n{proc.stderr}"
    built = sorted(dist.glob("gpuplace_testing-*.whl"))
    assert len(built) == 1, [p.name for p in dist.iterdir()]
    return built[0]


@pytest.fixture(scope="session")
def venv_with_testing(wheel: Path, testing_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A user's venv with ``gpuplace[testing]``, the testing wheel found in a folder beside it
    (``pip install --find-links DIR 'gpuplace[testing]'``); everything else from PyPI."""
    return installed_venv(tmp_path_factory.mktemp("venv-testing"), wheel, extras=["testing"],
                          pip_args=["--find-links", str(testing_wheel.parent)])


@pytest.fixture(scope="session")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty working directory outside the source tree."""
    cwd = tmp_path_factory.mktemp("cwd")
    assert not cwd.resolve().is_relative_to(ROOT)
    return cwd


def run(venv: Venv, cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = venv.run(list(argv), cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


# ---- what the wheel holds ------------------------------------------------------------------------

def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def test_the_wheel_holds_every_package_and_data_file_of_the_tree(wheel):
    names = wheel_names(wheel)
    roots = package_roots()
    assert roots == ["node_agent", "scheduler_extender"]  # no generic top-level name: the simulator is scheduler_extender.simulator
    files = [PurePosixPath(n) for n in tree_files() if n.startswith(tuple(f"{r}/" for r in roots))]
    packages = {f.parent for f in files if f.name == "__init__.py"}
    assert {str(p) for p in packages} >= set(roots)
    # Every module of every package (a directory with __init__.py), and every other file under the
    # roots: data files (YAML, JSON), py.typed, wherever they lie.
    expected = {str(f) for f in files if (f.suffix == ".py" and f.parent in packages) or f.suffix != ".py"}
    assert expected - names == set(), "missing from the wheel"
    assert {str(p / "__init__.py") for p in packages} <= names
    assert {"scheduler_extender/core/__init__.py", "scheduler_extender/data/catalog.yaml",
            "scheduler_extender/data/default-policy.yaml", "node_agent/py.typed"} <= expected  # the ones once missed


def test_the_wheel_holds_nothing_but_the_packages_and_its_metadata(wheel):
    version = project_version()
    dist_info = f"gpuplace-{version}.dist-info"
    tops = {n.split("/", 1)[0] for n in wheel_names(wheel)}
    assert tops == {*package_roots(), dist_info}
    assert not [n for n in wheel_names(wheel) if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_carries_the_license_and_the_console_scripts(wheel):
    version = project_version()
    dist_info = f"gpuplace-{version}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        assert z.read(f"{dist_info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        metadata = z.read(f"{dist_info}/METADATA").decode()
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert f"Version: {version}" in metadata
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()
    scripts = pyproject()["project"]["scripts"]
    assert set(scripts) == set(SCRIPTS)
    for name, target in scripts.items():
        assert f"{name} = {target}" in entry_points


def test_the_wheel_holds_none_of_the_test_doubles(wheel):
    names = wheel_names(wheel)
    doubles = sorted(n for n in names if n.startswith("gpuplace_testing/")
                     or PurePosixPath(n).stem in TEST_DOUBLES)
    assert doubles == [], "test doubles in the product wheel (they belong to gpuplace-testing, testing/)"
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(f"gpuplace-{project_version()}.dist-info/METADATA").decode()
    assert "Provides-Extra: testing" in metadata
    assert re.search(rf"^Requires-Dist: gpuplace-testing=={re.escape(project_version())}; extra == \"testing\"$",
                     metadata, re.M), metadata


def test_the_testing_wheel_holds_the_test_doubles_and_their_entry_points(testing_wheel):
    version = project_version()
    assert testing_wheel.name == f"gpuplace_testing-{version}-py3-none-any.whl"
    names = wheel_names(testing_wheel)
    dist_info = f"gpuplace_testing-{version}.dist-info"
    assert {n.split("/", 1)[0] for n in names} == {"gpuplace_testing", dist_info}
    assert {f"gpuplace_testing/{m}.py" for m in TEST_DOUBLES} <= names
    with zipfile.ZipFile(testing_wheel) as z:
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
        metadata = z.read(f"{dist_info}/METADATA").decode()
    assert "[gpuplace.agent_probes]" in entry_points
    assert "fake-nvml = gpuplace_testing.fake_nvml:load_fixture" in entry_points
    assert "fake-amdsmi = gpuplace_testing.fake_amdsmi:load_fixture" in entry_points
    assert f"Requires-Dist: gpuplace=={version}" in metadata


# ---- the installed console scripts -----------------------------------------------------------------

def test_nothing_is_imported_from_the_source_tree(venv, outside):
    out = run(venv, outside, "python", "-c",
              "import json, scheduler_extender.core, scheduler_extender.gpuplace_cli, node_agent.cli, scheduler_extender.simulator.cli; "
              "print(json.dumps([m.__file__ for m in (scheduler_extender.core, node_agent.cli, scheduler_extender.simulator.cli)]))").stdout
    for path in json.loads(out):
        assert Path(path).resolve().is_relative_to(venv.path.resolve()), path
        assert not Path(path).resolve().is_relative_to(ROOT), path


@pytest.mark.parametrize("script", SCRIPTS)
def test_version_is_pyprojects(venv, outside, script):
    proc = run(venv, outside, script, "--version")
    assert proc.stdout == f"{script} {project_version()}\n"


def test_gpuplace_explain_places_the_13b_inference_pod(venv, outside):
    out = run(venv, outside, "gpuplace", "explain", str(POD), "--inventory-dir", str(CLUSTER)).stdout
    assert "VRAM per GPU: 30.3 GiB (estimate)" in out
    assert re.search(r"^best nodes?: .*\bgpu-(a6000-0|a100-mig-0)\b", out, re.M), out
    assert re.search(r"^FAIL gpu-4090-0 .*VRAM < 30\.3 GiB needed", out, re.M), out


def test_gpuplace_catalog_and_simulate_help(venv, outside):
    catalog = run(venv, outside, "gpuplace", "catalog").stdout
    assert catalog.startswith("id ") and re.search(r"^a100-sxm4-80gb\s+nvidia\s", catalog, re.M), catalog
    assert "--trace" in run(venv, outside, "gpuplace", "simulate", "--help").stdout


def test_gpuplace_agent_replays_an_inventory(venv, outside):
    proc = run(venv, outside, "gpuplace-agent", "--probe", "fake", "--fake-inventory", str(INVENTORY),
               "--once", "--print", "--no-publish")
    inventory = json.loads(proc.stdout)
    expected = json.loads(INVENTORY.read_text())
    assert inventory["kind"] == "NodeGPUInventory" and inventory["nodeName"] == expected["nodeName"]
    assert [g["uuid"] for g in inventory["gpus"]] == [g["uuid"] for g in expected["gpus"]]


FAKE_NVML = ("gpuplace-agent", "--probe", "fake-nvml", "--nvml-fixture", str(NVML_SCENARIO), "--node-name", "n",
             "--once", "--print", "--no-publish", "--pod-resources-socket", "/nonexistent/kubelet.sock")


def test_gpuplace_agent_fake_nvml_without_gpuplace_testing_says_how_to_get_it(venv, outside):
    proc = venv.run(list(FAKE_NVML), cwd=outside)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.strip() == ("gpuplace-agent: error: --probe fake-nvml needs the gpuplace-testing package: "
                                   "pip install 'gpuplace[testing]'"), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert venv.run(["python", "-c", "import gpuplace_testing"], cwd=outside).returncode != 0


def test_gpuplace_agent_fake_nvml_runs_with_gpuplace_testing_installed_beside_it(venv_with_testing, outside):
    proc = run(venv_with_testing, outside, *FAKE_NVML)
    inventory = json.loads(proc.stdout)
    assert inventory["nodeName"] == "n"
    assert [g["name"] for g in inventory["gpus"]] == ["NVIDIA GeForce RTX 4090"]
    assert [g["temperatureC"] for g in inventory["gpus"]] == [40]  # its nvidia-smi -q "GPU Current Temp"
    where = run(venv_with_testing, outside, "python", "-c",
                "import gpuplace_testing, node_agent; print(gpuplace_testing.__file__); print(node_agent.__file__)").stdout
    for path in where.split():
        assert Path(path).resolve().is_relative_to(venv_with_testing.path.resolve()), path


@pytest.fixture
def extender(venv: Venv, outside: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    proc = subprocess.Popen([str(venv.script("gpuplace-extender")), "--inventory-dir", str(CLUSTER),
                             "--host", "127.0.0.1", "--port", str(port)], cwd=outside, env=venv.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read()


def test_gpuplace_extender_serves_in_static_mode_and_stops_on_sigterm(extender):
    url, proc = extender
    deadline = time.monotonic() + 30
    while True:
        try:
            status, _ = get(f"{url}/healthz")
            break
        except OSError:
            assert proc.poll() is None, f"gpuplace-extender exited {proc.returncode}:\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "no /healthz answer in 30 s"
            time.sleep(0.1)
    assert status == 200
    assert get(f"{url}/readyz")[0] == 200  # static mode is ready once the inventory is read
    req = urllib.request.Request(f"{url}/filter", data=FILTER_BODY.read_bytes(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        got = json.loads(r.read())
    assert got["Error"] == ""
    assert set(got["NodeNames"]) == {"gpu-a6000-0", "gpu-a100-mig-0"}
    assert "VRAM" in got["FailedAndUnresolvableNodes"]["gpu-4090-0"]
    proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then raises the signal it caught again (so the exit status
    # says SIGTERM); with older uvicorn the process returns 0.
    assert proc.wait(timeout=15) in (0, -signal.SIGTERM), proc.stdout.read()
