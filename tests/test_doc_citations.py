"""Every document the code, openapi.yaml and the docs cite is in the repository, and so is its section.

A citation names a Markdown file by its path from the repository root
(``docs/api.md``, ``README.md``) or from the citing file's folder (in
docs/, ``tier1-on-s3.md``), optionally followed by a section title in
double quotes (``docs/api.md "Errors"``), which must be one of that file's
headings. The docs and openapi.yaml also name source files
(``engine/naming.py``); those must exist too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("app", "engine", "clients", "bench", "tests", "deploy")
PROSE = ("README.md", "openapi.yaml", "docs")
# A Markdown file name, with the section that may follow it (across a line break and a comment mark).
_CITATION = re.compile(r'(?<![\w./-])([\w./-]+\.md)\b(?:[\s#*]*"([^"\n]+)")?')
# A path of this repository, as the prose names source files.
_REPO_PATH = re.compile(r"(?<![\w./-])((?:app|engine|clients|bench|tests|deploy|docs)/[\w./-]*\w)")
_HEADING = re.compile(r"^#+\s+(.+?)\s*$", re.MULTILINE)
_URL = re.compile(r"\w+://\S+")


def _files(*places: str, suffixes: tuple[str, ...]) -> list[Path]:
    found: list[Path] = []
    for place in places:
        path = ROOT / place
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in suffixes)
    return [p for p in found if "__pycache__" not in p.parts and "node_modules" not in p.parts]


def citations(text: str) -> list[tuple[str, str | None]]:
    """The (file, section or None) pairs ``text`` cites (URLs aside: they point elsewhere)."""
    return [(m.group(1), m.group(2)) for m in _CITATION.finditer(_URL.sub("", text))]


def headings(markdown: str) -> set[str]:
    """The titles of a Markdown file's headings (fenced code aside)."""
    outside_code = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return set(_HEADING.findall(outside_code))


def _citing_files() -> list[Path]:
    code = _files(*SOURCE_FOLDERS, suffixes=(".py", ".toml", ".yaml", ".conf", ".service", ".md"))
    prose = _files(*PROSE, suffixes=(".md",))
    roots = [ROOT / name for name in ("Makefile", "pyproject.toml", "Procfile")]
    return [p for p in code + prose + roots if p.resolve() != Path(__file__).resolve()]


@pytest.mark.parametrize("path", _citing_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_document_and_section_exists(path: Path) -> None:
    missing = []
    for cited, section in citations(path.read_text(encoding="utf-8")):
        # From the repository root, or (as Markdown links go) from the citing file's folder.
        found = [base / cited for base in (ROOT, path.parent) if (base / cited).is_file()]
        target = found[0] if found else ROOT / cited
        if not target.is_file():
            missing.append(f"{cited}: no such file in the repository")
        elif section is not None and section not in headings(target.read_text(encoding="utf-8")):
            missing.append(f'{cited} "{section}": no such section')
    assert not missing, f"{path.relative_to(ROOT)} cites what is not there: {missing}"


@pytest.mark.parametrize("path", _files(*PROSE, suffixes=(".md",)), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_source_file_the_prose_names_exists(path: Path) -> None:
    text = _URL.sub("", path.read_text(encoding="utf-8"))
    named = {m.group(1) for m in _REPO_PATH.finditer(text)}
    # A module may be named without its ".py" (``app/auth``).
    missing = sorted(n for n in named if not ((ROOT / n).exists() or (ROOT / f"{n}.py").exists()))
    assert not missing, f"{path.relative_to(ROOT)} names files the repository does not have: {missing}"


def test_the_contract_in_prose_is_cited_and_covers_every_surface() -> None:
    sections = headings((ROOT / "docs/api.md").read_text(encoding="utf-8"))
    assert {"Names", "Errors", "Segments", "Appends", "Reads", "Durable Streams"} <= sections
    assert ("docs/api.md", None) in citations((ROOT / "openapi.yaml").read_text(encoding="utf-8"))


def test_a_citation_of_a_missing_document_or_section_is_found() -> None:
    text = 'see API.md "Errors" and docs/api.md\n    # "Segments", then docs/api.md "Nowhere"'
    assert citations(text) == [("API.md", "Errors"), ("docs/api.md", "Segments"), ("docs/api.md", "Nowhere")]
    sections = headings((ROOT / "docs/api.md").read_text(encoding="utf-8"))
    assert "Segments" in sections
    assert "Nowhere" not in sections
    assert not (ROOT / "API.md").exists()
