"""The artifact users install: the gpuplace wheel built from this tree, and a fresh virtualenv with
that wheel (and its dependencies from PyPI) installed, the way ``pip install .`` leaves a user.

The tests use an editable install (``make install``), which imports the packages straight from the
tree and so hides a wheel that lacks a subpackage or a data file; ``tests/install`` runs the console
scripts of an installed wheel instead. An image build can take the same wheel::

    python -m tests.harness.artifacts wheel [OUT_DIR]     # prints the wheel's path

``build_wheel`` builds in a clean copy of the files a wheel is made from (never in the tree: a stale
``build/lib`` there would go into the wheel) and caches the result by their content; zip times come
from ``SOURCE_DATE_EPOCH`` (default 1980-01-01), so the same sources give the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[2]
DIST = "gpuplace"
# Top-level files setuptools reads (pyproject's readme and license-files).
TOP_FILES = ("pyproject.toml", "README.md", "LICENSE", "setup.py", "setup.cfg", "MANIFEST.in")
# Top-level packages of the repository that are not part of gpuplace (pyproject excludes them).
NOT_SHIPPED = ("tests", "benchmarks", "examples")
ZIP_EPOCH = "315532800"  # 1980-01-01: zip cannot store earlier times
BUILD_TIMEOUT_S = 600
INSTALL_TIMEOUT_S = 900


def cache_dir() -> Path:
    """Where built artifacts are kept between runs: ``$GPUPLACE_CACHE`` or ``~/.cache/gpuplace``
    (as the control plane and image scripts)."""
    return Path(os.environ.get("GPUPLACE_CACHE") or Path.home() / ".cache" / "gpuplace")


def pyproject(root: Path = ROOT) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))


def project_version(root: Path = ROOT) -> str:
    return str(pyproject(root)["project"]["version"])


def package_roots(root: Path = ROOT) -> list[str]:
    """The top-level packages the wheel is made of, from the tree (not from pyproject, whose package
    list is what the wheel tests check): every top-level directory with an ``__init__.py`` but the
    ones that stay in the repository (``NOT_SHIPPED``)."""
    return sorted({n.split("/", 1)[0] for n in tree_files(root)
                   if n.count("/") == 1 and n.endswith("/__init__.py")} - set(NOT_SHIPPED))


def tree_files(root: Path = ROOT) -> list[str]:
    """Every file of the tree a checkout has, as relative POSIX paths: tracked files and untracked
    ones git does not ignore (so local edits count, ``__pycache__`` and build output do not)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout
        names = sorted({n for n in out.decode().split("\0") if n})
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist)
        names = sorted(str(p.relative_to(root).as_posix()) for p in root.rglob("*")
                       if p.is_file() and not any(part.startswith(".") or part in ("__pycache__", "build", "dist")
                                                  or part.endswith(".egg-info") for part in p.relative_to(root).parts))
    return [n for n in names if (root / n).is_file()]  # a tracked file deleted in the work tree is not there


def wheel_sources(root: Path = ROOT) -> list[str]:
    """The files the wheel is built from: the top-level files setuptools reads and everything under
    the package roots."""
    roots = tuple(f"{r}/" for r in package_roots(root))
    return [n for n in tree_files(root) if n in TOP_FILES or n.startswith(roots)]


def sources_digest(files: Iterable[str], root: Path = ROOT) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256((root / name).read_bytes()).digest())
    return h.hexdigest()[:16]


def build_wheel(out_dir: Path, root: Path = ROOT, python: str = sys.executable) -> Path:
    """The gpuplace wheel of the tree at ``root``, as ``OUT_DIR/<digest>/gpuplace-<v>-py3-none-any.whl``
    where ``<digest>`` is over the names and contents of ``wheel_sources``: an unchanged tree is
    built once. Builds with ``pip wheel --no-deps`` (PEP 517, setuptools from PyPI in an isolated
    environment) in a temporary copy."""
    out_dir = Path(out_dir).resolve()
    files = wheel_sources(root)
    dest = out_dir / sources_digest(files, root)
    cached = sorted(dest.glob(f"{DIST}-*.whl")) if dest.is_dir() else []
    if len(cached) == 1:
        return cached[0]
    if dest.exists():  # left half-written by an interrupted run
        shutil.rmtree(dest, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out_dir) as tmp:
        src, dist = Path(tmp) / "src", Path(tmp) / "dist"
        for name in files:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, src / name)
        env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", ZIP_EPOCH)}
        proc = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                               "--quiet", "--wheel-dir", str(dist), str(src)],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"pip wheel failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        built = sorted(dist.glob(f"{DIST}-*.whl"))
        if len(built) != 1:
            raise RuntimeError(f"pip wheel left {[p.name for p in dist.iterdir()]}, expected one {DIST} wheel")
        try:
            dist.rename(dest)
        except OSError:  # built meanwhile by another process: the same sources, the same wheel
            if not dest.is_dir():
                raise
    _prune(out_dir, keep=dest)
    return dest / built[0].name


KEEP_WHEELS = 20


def _prune(out_dir: Path, keep: Path) -> None:
    """Remove all but the ``KEEP_WHEELS`` most recently built wheels (one directory per digest)."""
    dirs = sorted((d for d in out_dir.iterdir() if d.is_dir() and not d.name.startswith(".") and d != keep),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    for old in dirs[KEEP_WHEELS - 1:]:
        shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class Venv:
    """A virtualenv outside the source tree with the wheel installed."""

    path: Path

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def script(self, name: str) -> Path:
        return self.bin / name

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment a user's shell would give the venv's programs: its bin first on PATH and
        nothing that points Python at another tree (PYTHONPATH, PYTHONHOME, user site)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV",
                            "PYTHONSAFEPATH", "__PYVENV_LAUNCHER__")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["VIRTUAL_ENV"] = str(self.path)
        env["PYTHONNOUSERSITE"] = "1"
        env.update(extra or {})
        return env

    def run(self, argv: Sequence[str], cwd: Path, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` (argv[0]: a program of the venv, by name) with ``env()`` in ``cwd``."""
        program = argv[0] if os.sep in argv[0] else str(self.script(argv[0]))
        return subprocess.run([program, *argv[1:]], cwd=cwd, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, **kw)


def installed_venv(venv_dir: Path, wheel: Path, *, extras: Sequence[str] = (), python: str = sys.executable,
                   pip_args: Sequence[str] = ()) -> Venv:
    """A new virtualenv at ``venv_dir`` (which must not lie in the source tree) with ``wheel``
    installed by pip, its dependencies resolved from the package index (pip's cache is used)."""
    venv_dir = Path(venv_dir).resolve()
    if venv_dir.is_relative_to(ROOT):
        raise ValueError(f"{venv_dir} is inside the source tree {ROOT}; a user's venv is not")
    if venv_dir.exists() and any(venv_dir.iterdir()):
        raise FileExistsError(f"{venv_dir} is not empty")
    subprocess.run([python, "-m", "venv", str(venv_dir)], check=True, capture_output=True, timeout=300)
    venv = Venv(venv_dir)
    target = f"{Path(wheel).resolve()}[{','.join(extras)}]" if extras else str(Path(wheel).resolve())
    proc = subprocess.run([str(venv.python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
                           *pip_args, target], cwd=venv_dir, env=venv.env(), capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {target} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return venv


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "wheel" or len(args) > 2:
        print("usage: python -m tests.harness.artifacts wheel [OUT_DIR]   (default: $GPUPLACE_CACHE/wheels)",
              file=sys.stderr)
        return 2
    out = Path(args[1]) if len(args) == 2 else cache_dir() / "wheels"
    print(build_wheel(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
