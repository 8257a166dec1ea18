"""The repository's references to documents resolve inside the repository.

Code, tests, examples and manifests point readers at ``docs/<page>.md#<anchor>``; a renamed heading or a moved
page would leave them pointing nowhere, so every such reference must name an existing page and, when it gives
an anchor, an existing heading of that page (GitHub's slugs). Notes kept outside the repository are never cited:
a reader of the repository cannot open them.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Built from parts so that this file does not itself mention what it looks for.
_OUTSIDE_NOTES = re.compile(r"\b(?:" + "|".join(("DESIGN", "PAPER", "STYLE", "INFRA")) + r")\.md\b")
_OUTSIDE_DIRS = re.compile(re.escape("../" + "shared") + r"\b|" + re.escape("/work/" + "shared"))

LINKED_SUFFIXES = (".py", ".md", ".yaml", ".yml")
# docs/<page>.md, optionally #anchor, not preceded by a path character (so foo/docs/x.md is not taken for it)
_DOCS_REF = re.compile(r"(?<![\w./-])docs/([\w.-]+\.md)(?:#([\w-]+))?")
# docs/<page>.md, "Heading": a section named by its heading text
_DOCS_NAMED = re.compile(r"(?<![\w./-])docs/([\w.-]+\.md),\s*\"([^\"]+)\"")
# a Markdown link target that is a relative path to a .md file, optionally #anchor; or a bare #anchor
_MD_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)\s#]*\.md)?(?:#([^)\s]+))?\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / name for name in out.decode().split("\0") if name]


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary (or missing) file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation removed, spaces → hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) → text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def headings(page: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(anchors, heading texts) of a Markdown page; repeated headings get -1, -2, … as on GitHub."""
    anchors: set[str] = set()
    texts: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in (read_text(page) or "").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        text = match.group(2)
        texts.add(text)
        base = slug(text)
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else f"{base}-{count}")
    return frozenset(anchors), frozenset(texts)


def problem(target: Path, anchor: str | None, where: str) -> str | None:
    if not target.is_file():
        return f"{where}: {target.relative_to(ROOT)} does not exist"
    if anchor is not None and anchor not in headings(target)[0]:
        known = ", ".join(sorted(headings(target)[0]))
        return f"{where}: {target.relative_to(ROOT)} has no heading #{anchor} (it has: {known})"
    return None


def broken_references(path: Path, text: str) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{rel}:{number}"
        for page, anchor in _DOCS_REF.findall(line):
            found.append(problem(ROOT / "docs" / page, anchor or None, where) or "")
        for page, heading in _DOCS_NAMED.findall(line):
            target = ROOT / "docs" / page
            if not target.is_file():
                found.append(f"{where}: docs/{page} does not exist")
            elif heading not in headings(target)[1]:
                found.append(f"{where}: docs/{page} has no heading {heading!r}")
        if path.suffix == ".md":
            for target, anchor in _MD_LINK.findall(line):
                if target.startswith("/"):
                    continue
                page = (path.parent / target).resolve() if target else path
                if not target and not anchor:
                    continue
                if page.is_relative_to(ROOT):
                    found.append(problem(page, anchor or None, where) or "")
    return [f for f in found if f]


def test_no_tracked_file_cites_notes_kept_outside_the_repository() -> None:
    citing: dict[str, list[str]] = {}
    for path in tracked_files():
        text = read_text(path)
        if text is None:
            continue
        lines = [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), start=1)
                 if _OUTSIDE_NOTES.search(line) or _OUTSIDE_DIRS.search(line)]
        if lines:
            citing[path.relative_to(ROOT).as_posix()] = lines
    assert not citing, "point these at a page of docs/ instead:\n" + "\n".join(
        f"{path}:{line}" for path, lines in sorted(citing.items()) for line in lines)


def test_every_docs_reference_names_an_existing_page_and_heading() -> None:
    broken: list[str] = []
    for path in tracked_files():
        if path.suffix not in LINKED_SUFFIXES:
            continue
        text = read_text(path)
        if text is not None:
            broken += broken_references(path, text)
    assert not broken, "\n".join(broken)


def test_the_docs_pages_are_referenced() -> None:
    """Each page is reachable from somewhere else in the repository (a page nobody points at is not read)."""
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    referenced: set[str] = set()
    for path in tracked_files():
        if path.suffix not in LINKED_SUFFIXES or path.parent == ROOT / "docs":
            continue
        text = read_text(path) or ""
        referenced |= {page for page, _ in _DOCS_REF.findall(text)}
    assert pages <= referenced, f"not referenced outside docs/: {sorted(pages - referenced)}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Admission", "admission"),
        ("Experiment 2: SLO-aware fair share", "experiment-2-slo-aware-fair-share"),
        ("Eq. 1: priority", "eq-1-priority"),
        ("Pure core, thin shells", "pure-core-thin-shells"),
        ("Compiled hot paths (optional)", "compiled-hot-paths-optional"),
        ("The `Ticket` type", "the-ticket-type"),
        ("[Limits](semantics.md#limits) per proxy", "limits-per-proxy"),
        ("snake_case names", "snake_case-names"),
    ],
)
def test_slugs_follow_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_reference_is_reported() -> None:
    """The checker itself finds a missing page, a missing anchor and a missing named heading."""
    source = ROOT / "tokenpools" / "example.py"  # never written: only its name locates the lines
    docs = "docs/"  # spelled apart, so that the scan of this very file does not find these broken references
    text = "\n".join([
        f"see {docs}semantics.md#admission",
        f"see {docs}no-such-page.md",
        f"see {docs}semantics.md#no-such-heading",
        f'see ({docs}paper.md, "No such heading")',
        f"see my{docs}ignored.md",
    ])
    found = broken_references(source, text)
    assert len(found) == 3, found
    assert "tokenpools/example.py:2" in found[0] and "does not exist" in found[0]
    assert "tokenpools/example.py:3" in found[1] and "#no-such-heading" in found[1]
    assert "tokenpools/example.py:4" in found[2] and "'No such heading'" in found[2]
