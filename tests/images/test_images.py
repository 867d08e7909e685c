"""The container images that ``hack/build-images.sh`` builds offline, checked as a runtime sees them.

* The gpuplace image's config (user 65532, ENV, CMD, working directory) is the Dockerfile's final
  stage, and both recipes build the wheel from the same files with the same extra: the Dockerfile
  stays the recipe for a Docker daemon without drifting from what CI builds.
* The image holds every module of the source tree and the wheel's console scripts, run by the
  image's own Python (Debian's /usr/bin/python3.11 through the venv at /opt/gpuplace).
* Every command the chart runs works from a read-only root filesystem as user 65532, and needs no
  write at all: run as root over an overlay with bytecode writing allowed, the overlay's upper
  layer stays empty (a control run shows that a missing .pyc would be written there).
* Every shared library of the installed wheels resolves inside the image.
* kube-scheduler's image runs ``kube-scheduler --version``; the pause image's /pause is static.
* Each tarball imports into containerd (``ctr images import``) under its ref.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.artifacts import pyproject
from tests.harness.controlplane import K8S_VERSION, REPO_ROOT, stop_process, wait_for
from tests.harness.images import BUILD_SCRIPT, Images
from tests.images.conftest import Unpacked, note
from tests.images.sandbox import run_in_image

pytestmark = pytest.mark.images

PYPROJECT = pyproject(REPO_ROOT)
VENV = "/opt/gpuplace"
SITE = f"{VENV}/lib/python3.11/site-packages"
NONROOT = "65532:65532"


# --------------------------------------------------------------------------------------
# The Dockerfile, read as Docker reads it (enough of it for these instructions)
# --------------------------------------------------------------------------------------


def dockerfile_stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions of each stage, in order: (INSTRUCTION, arguments), continuations joined."""
    stages: list[list[tuple[str, str]]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        instruction, _, args = logical.partition(" ")
        logical = ""
        if instruction.upper() == "FROM":
            stages.append([])
        if not stages:
            continue  # ARG before the first FROM
        stages[-1].append((instruction.upper(), args.strip()))
    return stages


def final_stage_config(text: str) -> dict[str, Any]:
    """What the final stage sets in the image config (as Docker records it)."""
    config: dict[str, Any] = {"Env": {}}
    for instruction, args in dockerfile_stages(text)[-1]:
        if instruction == "ENV":
            for pair in shlex.split(args):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV {args!r}: only the KEY=VALUE form is supported here"
                config["Env"][key] = value
        elif instruction == "USER":
            config["User"] = args
        elif instruction == "WORKDIR":
            config["WorkingDir"] = args
        elif instruction in ("CMD", "ENTRYPOINT"):
            value = json.loads(args)  # the exec (JSON) form: no shell in between
            config["Cmd" if instruction == "CMD" else "Entrypoint"] = value
    return config


def test_dockerfile_final_stage_is_the_image_config(gpuplace_image: Unpacked) -> None:
    docker = final_stage_config((REPO_ROOT / "Dockerfile").read_text())
    runtime = gpuplace_image.archive.runtime
    # debian:bookworm-slim sets PATH only, and the Dockerfile sets PATH itself.
    assert gpuplace_image.archive.env == docker["Env"]
    assert runtime.get("User") == docker["User"] == NONROOT
    assert runtime.get("WorkingDir") == docker["WorkingDir"]
    assert runtime.get("Cmd") == docker["Cmd"]
    assert (runtime.get("Entrypoint") or []) == (docker.get("Entrypoint") or [])


def test_gpuplace_image_config(images: Images, gpuplace_image: Unpacked) -> None:
    archive = gpuplace_image.archive
    assert images.gpuplace.ref == f"gpuplace.local/gpuplace:{VERSION}"
    assert archive.repo_tags == [images.gpuplace.ref]
    assert archive.runtime["User"] == NONROOT
    env = archive.env
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].split(":")[0] == f"{VENV}/bin"
    assert archive.runtime["Cmd"][0] in PYPROJECT["project"]["scripts"]
    assert archive.config["os"] == "linux" and archive.config["architecture"] == "amd64"
    passwd = (gpuplace_image.rootfs / "etc/passwd").read_text().splitlines()
    assert "nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin" in passwd
    assert "nonroot:x:65532:" in (gpuplace_image.rootfs / "etc/group").read_text().splitlines()
    home = gpuplace_image.rootfs / archive.runtime["WorkingDir"].lstrip("/")
    assert home.is_dir() and home.stat().st_uid == 65532
    # Lean: no apt lists, no pip (in the venv or the system), no compilers, no pip cache.
    rootfs = gpuplace_image.rootfs
    assert not list((rootfs / "var/lib/apt/lists").glob("*_Packages*"))
    assert not list((rootfs / SITE.lstrip("/")).glob("pip")), "pip left in the venv"
    for tool in ("usr/bin/gcc", "usr/bin/cc", "usr/bin/pip3", "usr/bin/apt-get"):
        assert not (rootfs / tool).exists(), tool
    assert not (rootfs / "root/.cache").exists()


def _sources_in(stage: list[tuple[str, str]]) -> set[str]:
    """Sources of a stage's COPY instructions (without --from)."""
    sources: set[str] = set()
    for instruction, args in stage:
        if instruction == "COPY" and "--from" not in args:
            *srcs, _dest = shlex.split(args)
            sources.update(srcs)
    return sources


def test_both_recipes_build_the_wheel_from_the_same_files() -> None:
    """The Dockerfile's build stage copies what the script builds the wheel from, which is what
    pyproject.toml needs: its packages' roots, its readme and its license files."""
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    copied = _sources_in(dockerfile_stages(dockerfile)[0])
    script = BUILD_SCRIPT.read_text()
    m = re.search(r"^WHEEL_SOURCES=\(([^)]*)\)", script, re.M)
    assert m, "WHEEL_SOURCES not found in hack/build-images.sh"
    assert copied == set(m.group(1).split())
    project = PYPROJECT["project"]
    needed = {project["readme"], "pyproject.toml", *project.get("license-files", [])}
    find = PYPROJECT["tool"]["setuptools"].get("packages", {})
    roots = (
        {p.rstrip("*").split(".")[0] for p in find["find"]["include"]}
        if isinstance(find, dict) else {p.split(".")[0] for p in find}
    )
    assert needed | roots <= copied, f"missing from the Dockerfile's COPY: {(needed | roots) - copied}"
    # The same extra in both.
    extra = re.search(r'^EXTRAS="([^"]*)"', script, re.M)
    assert extra and f"[{extra.group(1)}]" in dockerfile


def test_console_scripts_are_the_wheels_entry_points(gpuplace_image: Unpacked) -> None:
    site = gpuplace_image.rootfs / SITE.lstrip("/")
    (dist_info,) = site.glob("gpuplace-*.dist-info")
    entry_points = dist_info / "entry_points.txt"
    scripts: dict[str, str] = {}
    section = None
    for line in entry_points.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section == "console_scripts":
            name, _, target = line.partition("=")
            scripts[name.strip()] = target.strip()
    assert scripts == PYPROJECT["project"]["scripts"]
    # Every gpuplace script is in the venv's bin, first on PATH, run by the venv's python.
    bindir = gpuplace_image.rootfs / VENV.lstrip("/") / "bin"
    record = (dist_info / "RECORD").read_text()
    for name in scripts:
        path = bindir / name
        assert path.is_file() and path.stat().st_mode & 0o111, name
        assert path.read_text().splitlines()[0] == f"#!{VENV}/bin/python", name
        assert f"../../../bin/{name}," in record, f"{name} not installed by the wheel"


def test_image_holds_every_module_of_the_source_tree(gpuplace_image: Unpacked) -> None:
    site = gpuplace_image.rootfs / SITE.lstrip("/")
    for root in ("scheduler_extender", "node_agent"):
        for src in (REPO_ROOT / root).rglob("*"):
            if "__pycache__" in src.parts or src.is_dir() or src.suffix == ".pyc":
                continue
            rel = src.relative_to(REPO_ROOT)
            assert (site / rel).is_file(), f"{rel} is not in the image"
            if src.suffix == ".py":
                # Precompiled, checked against the source's hash (flags 0b11), not its mtime.
                pyc = site / rel.parent / "__pycache__" / f"{src.stem}.cpython-311.pyc"
                assert pyc.is_file(), f"{rel} has no bytecode in the image"
                (flags,) = struct.unpack("<I", pyc.read_bytes()[4:8])
                assert flags == 0b11, f"{pyc.name}: flags {flags:#b}, expected checked-hash"


# --------------------------------------------------------------------------------------
# Running the image: read-only root filesystem, user 65532
# --------------------------------------------------------------------------------------

POD = REPO_ROOT / "examples" / "pods" / "03-llm-13b-inference.yaml"
CLUSTER = REPO_ROOT / "examples" / "cluster"
IMPORTS = "import scheduler_extender.core, node_agent.podresources, scheduler_extender.simulator, grpc"

VERSION = PYPROJECT["project"]["version"]

# (command, what its output must contain)
COMMANDS: dict[str, tuple[list[str], str]] = {
    "extender": (["gpuplace-extender", "--version"], f"gpuplace-extender {VERSION}\n"),
    "agent": (["gpuplace-agent", "--version"], f"gpuplace-agent {VERSION}\n"),
    "cli": (["gpuplace", "--version"], f"gpuplace {VERSION}\n"),
    "explain": (["gpuplace", "explain", "/tmp/pod.yaml", "--inventory-dir", "/tmp/cluster"],
                "best nodes:"),
    "imports": (["python3", "-c", f"{IMPORTS}; import os, sys; "
                 "print(os.getuid(), os.getgid(), sys.executable, os.path.realpath(sys.executable))"],
                f"65532 65532 {VENV}/bin/python3 /usr/bin/python3.11"),
}


def _run(image: Unpacked, argv: list[str], *, mode: str = "ro", user: str | None = None,
         env: dict[str, str] | None = None):
    runtime = image.archive.runtime
    return run_in_image(
        image.rootfs, argv,
        env=image.archive.env if env is None else env,
        user=user or runtime["User"],
        workdir=runtime.get("WorkingDir") or "/",
        mode=mode,
        stage={"pod.yaml": POD, "cluster": CLUSTER},
    )


@pytest.mark.parametrize("name", list(COMMANDS))
def test_runs_read_only_as_nonroot(gpuplace_image: Unpacked, name: str) -> None:
    argv, expected = COMMANDS[name]
    t0 = time.monotonic()
    result = _run(gpuplace_image, argv).check(" ".join(argv))
    assert expected in result.stdout, result.stdout[-2000:]
    note(f"images: `{' '.join(argv)[:60]}` read-only as 65532: {time.monotonic() - t0:.2f}s")


def test_root_filesystem_is_read_only_in_these_runs(gpuplace_image: Unpacked) -> None:
    result = _run(gpuplace_image, ["/bin/sh", "-c", "touch /opt/x"], user="0:0")
    assert result.returncode != 0 and "Read-only file system" in result.stderr, result


def test_needs_no_write_at_start_up(gpuplace_image: Unpacked) -> None:
    """As root over a writable overlay, with bytecode writing allowed, every command leaves the
    image as it was: no stale or missing .pyc (the image's or Debian's standard library's)."""
    env = {k: v for k, v in gpuplace_image.archive.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    script = " && ".join(shlex.join(argv) + " >/dev/null" for argv, _ in COMMANDS.values())
    result = _run(gpuplace_image, ["/bin/sh", "-c", script], mode="overlay", user="0:0", env=env)
    result.check("the commands, as root on an overlay")
    assert result.written == [], f"the image was written to: {result.written[:20]}"

    # Control: the same check sees a .pyc that Python had to write.
    pyc = f"{SITE}/scheduler_extender/__pycache__/cli.cpython-311.pyc"
    control = _run(gpuplace_image, ["/bin/sh", "-c", f"rm {pyc} && gpuplace-extender --version >/dev/null"],
                   mode="overlay", user="0:0", env=env).check("control")
    assert f"f {pyc.lstrip('/')}" in control.written, control.written


def test_shared_libraries_resolve(gpuplace_image: Unpacked) -> None:
    """manylinux wheels rely on the system for some libraries (libstdc++ for grpcio)."""
    script = (f"find {VENV} -name '*.so*' -type f | while read -r f; do "
              "ldd \"$f\" | sed \"s|^|$f: |\"; done")
    result = _run(gpuplace_image, ["/bin/sh", "-c", script]).check("ldd")
    assert "cygrpc" in result.stdout
    missing = [ln for ln in result.stdout.splitlines() if "not found" in ln]
    assert not missing, "\n".join(missing)


# --------------------------------------------------------------------------------------
# kube-scheduler and pause
# --------------------------------------------------------------------------------------


def is_static_elf(path: Path) -> bool:
    """An ELF executable with no program interpreter (PT_INTERP): no libc needed."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def test_kube_scheduler_image(images: Images, scheduler_image: Unpacked) -> None:
    assert images.scheduler.ref == f"gpuplace.local/kube-scheduler:{K8S_VERSION}"
    archive = scheduler_image.archive
    assert archive.repo_tags == [images.scheduler.ref]
    assert archive.runtime["User"] == NONROOT
    assert "/usr/local/bin" in archive.env["PATH"].split(":")
    binary = scheduler_image.rootfs / "usr/local/bin/kube-scheduler"
    assert is_static_elf(binary)
    assert "nonroot:x:65532:65532:" in (scheduler_image.rootfs / "etc/passwd").read_text()
    # The chart runs `command: [kube-scheduler]`: found on the image's PATH.
    result = _run(scheduler_image, ["kube-scheduler", "--version"]).check("kube-scheduler --version")
    assert result.stdout.strip() == f"Kubernetes {K8S_VERSION}"


def test_pause_image(images: Images, pause_image: Unpacked) -> None:
    assert images.pause is not None
    archive = pause_image.archive
    assert archive.repo_tags == [images.pause.ref]
    assert images.pause.ref.startswith("registry.k8s.io/pause:")
    assert archive.runtime["User"] == "65535:65535"
    assert archive.runtime["Entrypoint"] == ["/pause"]
    binary = pause_image.rootfs / "pause"
    assert binary.stat().st_mode & 0o111 and is_static_elf(binary)
    assert [p.name for p in pause_image.rootfs.iterdir()] == ["pause"]
    result = _run(pause_image, ["/pause", "-v"]).check("/pause -v")
    assert result.stdout.startswith(f"pause.c v{images.pause.tag}-"), result.stdout


# --------------------------------------------------------------------------------------
# Importing into containerd
# --------------------------------------------------------------------------------------


def test_tarballs_import_into_containerd(images: Images, tmp_path: Path) -> None:
    """``ctr -n k8s.io images import`` takes every tarball and lists it under its ref; a private
    containerd (own root, state and socket, CRI off) in its own mount namespace."""
    for tool in ("containerd", "ctr"):
        assert shutil.which(tool), f"{tool} is not installed (Debian: apt-get install containerd)"
    sock = tmp_path / "containerd.sock"
    config = tmp_path / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{tmp_path / "root"}"\nstate = "{tmp_path / "state"}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{sock}"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{tmp_path / "opt"}"\n'
    )
    log = (tmp_path / "containerd.log").open("w")
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "containerd", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
    try:
        wait_for(lambda: subprocess.run([*ctr, "version"], capture_output=True).returncode == 0,
                 timeout=30, message="private containerd did not answer")
        for image in images.all():
            t0 = time.monotonic()
            out = subprocess.run([*ctr, "images", "import", str(image.path)],
                                 capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, f"ctr images import {image.path}: {out.stderr}"
            note(f"images: ctr images import {image.ref}: {time.monotonic() - t0:.1f}s")
        listed = subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True,
                                check=True).stdout.split()
        assert {i.ref for i in images.all()} <= set(listed), listed
    finally:
        stop_process(proc, grace=20)
        log.close()
        shutil.rmtree(tmp_path / "root", ignore_errors=True)
