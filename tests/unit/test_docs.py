"""The documentation: ``docs/`` builds with MkDocs in strict mode (a broken link or anchor fails it),
the reference pages are what ``hack/gen-reference.py`` writes from the code today, the README stays
short and its links resolve, and nothing cites a file outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 250
# Markdown files outside docs/ (MkDocs does not see them): their relative links are checked here.
READMES = ("README.md", "benchmarks/README.md", "examples/README.md", "deploy/helm/gpuplace/README.md")


def mkdocs_build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project``. Not verbose: MkDocs 1.6 skips the anchor check at
    debug level."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, capture_output=True, text=True, timeout=120)


def test_the_docs_build_in_strict_mode(tmp_path: Path) -> None:
    run = mkdocs_build(ROOT, tmp_path / "site")
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}{run.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


@pytest.mark.parametrize("link, complaint", [
    ("[gone](no-such-page.md)", "no-such-page.md"),
    ("[gone](design.md#no-such-section)", "no-such-section"),
    ("[outside](../README.md)", "../README.md"),
])
def test_a_broken_link_fails_the_build(tmp_path: Path, link: str, complaint: str) -> None:
    """The check is real: the same docs with one bad link appended do not build."""
    project = tmp_path / "project"
    shutil.copytree(DOCS, project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    with (project / "docs" / "index.md").open("a", encoding="utf-8") as f:
        f.write(f"\n{link}\n")
    run = mkdocs_build(project, tmp_path / "site")
    assert run.returncode != 0, f"a build with {link} passed:\n{run.stdout}{run.stderr}"
    assert complaint in run.stdout + run.stderr


def test_the_reference_pages_are_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "reference"
    run = subprocess.run([sys.executable, str(ROOT / "hack" / "gen-reference.py"), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    generated = {p.name: p.read_text(encoding="utf-8") for p in out.glob("*.md")}
    committed = {p.name: p.read_text(encoding="utf-8") for p in (DOCS / "reference").glob("*.md")}
    assert sorted(committed) == sorted(generated)
    stale = [name for name in generated if committed[name] != generated[name]]
    assert not stale, f"docs/reference/ out of date ({', '.join(stale)}): run .venv/bin/python hack/gen-reference.py"


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


def test_the_readme_names_the_test_command() -> None:
    """``.ci/run`` runs ``make test`` as "the README's test command"."""
    assert "make test" in (ROOT / "README.md").read_text(encoding="utf-8")


# ---- relative links of the Markdown files MkDocs does not build ----------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces
    to ``-`` (each one; nothing collapsed)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = github_anchor(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    links = [a or b for a, b in _LINK.findall(text)]
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link, re.I)]


@pytest.mark.parametrize("readme", READMES)
def test_every_relative_link_of_a_readme_resolves(readme: str) -> None:
    """A link from a README to a file of the repository points at one that exists, and a link to a
    heading of a Markdown file at a heading it has (as GitHub names it)."""
    source = ROOT / readme
    broken = []
    for link in relative_links(source):
        target, _, anchor = link.partition("#")
        path = (source.parent / target).resolve() if target else source
        if not path.exists() or ROOT not in (path, *path.parents):
            broken.append(f"{link}: no such file in the repository")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: {path.relative_to(ROOT)} has no heading #{anchor}")
    assert not broken, f"{readme}:\n  " + "\n  ".join(broken)


# ---- nothing outside the repository ---------------------------------------------------------------

def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_nothing_cites_a_file_outside_the_repository() -> None:
    """The project's docs are its own: no README, page, code or chart cites the design notes or
    the shared folder that lived beside the repository."""
    outside = re.compile(re.escape("DESIGN" + ".md") + "|" + re.escape(".." + "/shared"))
    hits = []
    for path in tracked_files():
        if not path.is_file():
            continue  # deleted in the work tree, or a submodule
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
        for n, line in enumerate(text.splitlines(), 1):
            if outside.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "cites a file outside the repository:\n  " + "\n  ".join(hits)
