"""The README stays a front door and the docs site stays whole: `mkdocs build --strict` (run by `make lint`) fails
on a broken link or anchor and on a page left out of the navigation."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 300


def test_the_readme_is_at_most_300_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail to a page under docs/ and link it"
    )


def test_every_link_of_the_readme_into_docs_names_a_page_that_exists():
    """GitHub renders the README outside the site, so mkdocs does not check its links; this does."""
    targets = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert targets, "README.md links no page of docs/"
    missing = sorted({t for t in targets if not (ROOT / t).is_file()})
    assert not missing, f"README.md links pages that do not exist: {missing}"


def test_the_readme_maps_every_page_of_the_site():
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    linked = set(re.findall(r"\]\(docs/([^)#/]+\.md)", README.read_text()))
    assert pages - linked == set(), f"README.md's map of the docs misses {sorted(pages - linked)}"


def test_lint_builds_the_site_strictly_and_without_silencing_its_warnings():
    """`mkdocs build --quiet` silences the warnings that --strict counts: the build then passes whatever is broken."""
    makefile = (ROOT / "Makefile").read_text()
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "mkdocs build --strict" in lint
    assert "--quiet" not in lint and " -q" not in lint


def _build(docs_root: Path) -> subprocess.CompletedProcess:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    return subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(docs_root / "site")],
        cwd=docs_root,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)},
        timeout=300,
    )


@pytest.fixture
def site_copy(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def test_the_site_builds_strictly_and_a_broken_link_or_an_orphan_page_fails_it(site_copy):
    built = _build(site_copy)
    assert built.returncode == 0, built.stderr
    rounds = site_copy / "docs" / "rounds.md"
    original = rounds.read_text()
    rounds.write_text(original + "\n[gone](no-such-page.md) and [lost](pipeline.md#no-such-anchor)\n")
    broken = _build(site_copy)
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stderr and "no-such-anchor" in broken.stderr
    rounds.write_text(original)
    (site_copy / "docs" / "orphan.md").write_text("# Not in the nav\n")
    orphan = _build(site_copy)
    assert orphan.returncode != 0 and "orphan.md" in orphan.stderr
