"""The container images, built offline by ``hack/build-images.sh`` and cached by content.

:func:`ensure_images` runs the script the way :func:`tests.harness.controlplane.ensure_binaries`
runs ``hack/build-control-plane.sh``: its progress (stderr) is echoed, a failure raises
:class:`ImagesError` with the tail of its output, and what it prints on stdout ("REF PATH" per
image) comes back as an :class:`Images`. The first build takes a minute or two (Debian's base
root filesystem, the wheels of gpuplace's dependencies); later calls with the same inputs find
the tarballs in ``$GPUPLACE_CACHE/images`` and take seconds.

The tarballs are docker-archive files: ``ctr -n k8s.io images import FILE`` or
``docker load -i FILE``. Each one's ``manifest.json`` names its layers (plain tar files, in order)
and its OCI image config, which :func:`read_archive` and :func:`unpack` read.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.harness.artifacts import build_wheel, cache_dir
from tests.harness.controlplane import REPO_ROOT, run_build_script

__all__ = [
    "BUILD_SCRIPT",
    "Image",
    "Images",
    "ImagesError",
    "ensure_images",
    "read_archive",
    "unpack",
]

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-images.sh"

#: The images the script builds, by the name it takes on its command line.
NAMES: tuple[str, ...] = ("gpuplace", "scheduler", "pause")


class ImagesError(RuntimeError):
    """``hack/build-images.sh`` failed or did not print the images asked for."""


@dataclass(frozen=True)
class Image:
    """One image: its reference (``repository:tag``) and its docker-archive tarball."""

    ref: str
    path: Path

    @property
    def repository(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


@dataclass(frozen=True)
class Images:
    """What :func:`ensure_images` built or found; an image not asked for is ``None``."""

    gpuplace: Image | None = None
    scheduler: Image | None = None
    pause: Image | None = None
    #: Seconds the wheel and the script took (building, or finding everything cached).
    seconds: float = 0.0

    def all(self) -> tuple[Image, ...]:
        return tuple(i for i in (self.gpuplace, self.scheduler, self.pause) if i is not None)

    def tarballs(self) -> list[Path]:
        """The tarballs to import, e.g. into a node's containerd."""
        return [i.path for i in self.all()]


def _wheel_from_artifacts() -> Path:
    """The test suite's own wheel (``tests.harness.artifacts.build_wheel``, cached by the content of
    its sources under ``$GPUPLACE_CACHE/wheels``): the images install the wheel the install tests test."""
    return build_wheel(cache_dir() / "wheels")


def ensure_images(
    names: Iterable[str] = NAMES, *, wheel: Path | None = None, echo: bool = True
) -> Images:
    """Build (or find cached) the images ``names`` (default: all three) and return them.

    ``wheel``: the gpuplace wheel to install in the image. Default: ``$GPUPLACE_WHEEL`` if set,
    else the wheel of ``tests.harness.artifacts.build_wheel`` if that exists, else the script
    builds one from the source tree. Needs root (see the script's header).
    """
    names = list(names)
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown images {unknown}; known: {NAMES}")
    t0 = time.monotonic()
    if wheel is None and not os.environ.get("GPUPLACE_WHEEL") and "gpuplace" in names:
        wheel = _wheel_from_artifacts()
    args = [*names, *(("--wheel", str(wheel)) if wheel is not None else ())]
    # The script takes the cache's locks itself (its own, and the build lock around kube-scheduler).
    lines = run_build_script(BUILD_SCRIPT, *args, echo=echo, lock=False, error=ImagesError)
    seconds = time.monotonic() - t0
    built: dict[str, Image] = {}
    for line in lines:
        ref, path = line.split(maxsplit=1)
        image = Image(ref, Path(path))
        name = _name_of(ref)
        if name is None or not image.path.is_file():
            raise ImagesError(f"{BUILD_SCRIPT} printed {line!r}: not an image tarball it builds")
        built[name] = image
    missing = [n for n in names if n not in built]
    if missing:
        raise ImagesError(f"{BUILD_SCRIPT} printed no image for {missing}; stdout:\n" + "\n".join(lines))
    return Images(**built, seconds=seconds)


def _name_of(ref: str) -> str | None:
    repo = ref.rsplit(":", 1)[0]
    if repo.endswith("/gpuplace"):
        return "gpuplace"
    if repo.endswith("/kube-scheduler"):
        return "scheduler"
    if repo.endswith("/pause"):
        return "pause"
    return None


# --------------------------------------------------------------------------------------
# Reading a docker-archive
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Archive:
    """A docker-archive's one image: its tags, OCI config and layer member names, in order."""

    repo_tags: list[str]
    config: dict[str, Any]
    layers: list[str]

    @property
    def runtime(self) -> dict[str, Any]:
        """The config's ``config`` object: User, Env, Entrypoint, Cmd, WorkingDir."""
        return dict(self.config.get("config") or {})

    @property
    def env(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.runtime.get("Env") or [])


def read_archive(path: Path) -> Archive:
    with tarfile.open(path) as tar:
        manifest = json.load(_member(tar, "manifest.json"))
        if len(manifest) != 1:
            raise ValueError(f"{path}: {len(manifest)} images in manifest.json, expected one")
        entry = manifest[0]
        config = json.load(_member(tar, entry["Config"]))
    return Archive(repo_tags=list(entry.get("RepoTags") or []), config=config,
                   layers=list(entry["Layers"]))


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    f = tar.extractfile(name)
    if f is None:
        raise ValueError(f"{tar.name}: {name} is not a file")
    return f


def unpack(path: Path, rootfs: Path) -> Archive:
    """Extract the image's layers, in order, into ``rootfs`` (owners and modes kept: run as root).

    The layers this repository builds hold no whiteouts (each adds files only), which this
    checks rather than implements.
    """
    archive = read_archive(path)
    rootfs.mkdir(parents=True, exist_ok=True)
    rootfs.chmod(0o755)  # as a runtime's snapshot; a layer's "./" entry sets it otherwise
    with tarfile.open(path) as outer:
        for layer in archive.layers:
            with tarfile.open(fileobj=_member(outer, layer)) as tar:
                whiteouts = [m.name for m in tar if Path(m.name).name.startswith(".wh.")]
            if whiteouts:
                raise ValueError(f"{path}: layer {layer} has whiteouts {whiteouts[:3]}")
            # GNU tar: numeric owners, modes, device-less; the same as a container runtime.
            with subprocess.Popen(
                ["tar", "-x", "-p", "--numeric-owner", "-C", str(rootfs), "-f", "-"],
                stdin=subprocess.PIPE,
            ) as tar_proc:
                assert tar_proc.stdin is not None
                src = _member(outer, layer)
                while chunk := src.read(1 << 20):
                    tar_proc.stdin.write(chunk)
                tar_proc.stdin.close()
            if tar_proc.returncode != 0:
                raise ValueError(f"{path}: extracting layer {layer} failed")
    return archive
