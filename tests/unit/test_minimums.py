"""constraints/minimums.txt pins every direct dependency to the floor pyproject.toml declares, so that
``make test-minimums`` tests exactly the oldest versions a user's ``pip install`` may pick."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
CONSTRAINTS = ROOT / "constraints" / "minimums.txt"


def direct_requirements() -> list[Requirement]:
    """The runtime dependencies and the ``test`` extra (every other extra's packages are in it)."""
    return [Requirement(r) for r in [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["test"]]]


def floor(req: Requirement) -> Version:
    lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
    assert len(lows) == 1, f"{req}: declare one floor (>=)"
    return lows[0]


def pins() -> dict[str, Version]:
    out: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", f"{line}: pin with == only"
        name = canonicalize_name(req.name)
        assert name not in out, f"{name} pinned twice"
        out[name] = Version(spec[0].version)
    return out


def test_every_direct_dependency_is_pinned_to_its_declared_floor():
    want = {canonicalize_name(r.name): floor(r) for r in direct_requirements()}
    assert pins() == want


def test_the_other_extras_declare_the_same_floors_as_the_test_extra():
    test_extra = {canonicalize_name(r.name): floor(r) for r in direct_requirements()}
    for extra, reqs in PROJECT["optional-dependencies"].items():
        if extra in ("test", "bench", "testing"):  # bench: profilers, never imported; testing: gpuplace-testing, ours
            continue
        for r in map(Requirement, reqs):
            assert test_extra.get(canonicalize_name(r.name)) == floor(r), f"[{extra}] {r}: not tested at its floor"
