"""Fixtures for the image tests: the images built once per machine (``hack/build-images.sh``,
cached by content), each unpacked once per session.

Skipped only with ``GPUPLACE_SKIP_E2E=1``; otherwise a failing build fails the tests. Needs root
(mmdebstrap, chroot, mount namespaces), as the end-to-end tests do.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.controlplane import skip_if_e2e_disabled
from tests.harness.images import Archive, Image, Images, ensure_images, unpack
from tests.harness.report import report as note

@dataclass(frozen=True)
class Unpacked:
    image: Image
    archive: Archive
    rootfs: Path


@pytest.fixture(scope="session")
def images() -> Images:
    skip_if_e2e_disabled()
    built = ensure_images()
    sizes = ", ".join(f"{i.ref} {i.path.stat().st_size / 2**20:.0f} MiB" for i in built.all())
    note(f"images: ready in {built.seconds:.1f}s (wheel + hack/build-images.sh; built or found cached): {sizes}")
    return built


def _unpacked(image: Image | None, tmp_path_factory: pytest.TempPathFactory,
              name: str) -> Iterator[Unpacked]:
    assert image is not None
    rootfs = tmp_path_factory.mktemp(f"{name}-rootfs")
    try:
        yield Unpacked(image, unpack(image.path, rootfs), rootfs)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)  # hundreds of MB; pytest keeps 3 sessions


@pytest.fixture(scope="session")
def gpuplace_image(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unpacked]:
    yield from _unpacked(images.gpuplace, tmp_path_factory, "gpuplace")


@pytest.fixture(scope="session")
def scheduler_image(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unpacked]:
    yield from _unpacked(images.scheduler, tmp_path_factory, "scheduler")


@pytest.fixture(scope="session")
def pause_image(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unpacked]:
    yield from _unpacked(images.pause, tmp_path_factory, "pause")
