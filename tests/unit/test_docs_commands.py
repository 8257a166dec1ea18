"""The ``tokenpools`` commands the docs tell a reader to type exist, with each option under its current name.

Every shell block (```sh, ```bash or unmarked) of README.md, docs/*.md and the folders' README.md is scanned for
``tokenpools COMMAND`` in a command position (a line's start, or after ``;``, ``&``, ``|``, ``(``; continuation
lines joined), and each ``--option`` it gives is looked up in that command's parser: it must exist, and be the
option's first name. An option renamed with its former name kept as an alias (``agents --metrics-port``, now
``--http-port`` as the controller's) still runs, so only this test notices a page still teaching the old name.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenpools.cli import build_parser, installed_commands

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*/README.md"))]
_BLOCK = re.compile(r"^```(?:sh|bash|console)?\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_INVOCATION = re.compile(r"(?:^\s*|[;&|(]\s*)tokenpools\s+([a-z][\w-]*)((?:[ \t]+[^\s;&|>]+)*)", re.MULTILINE)


def invocations(markdown: str) -> Iterator[tuple[str, list[str]]]:
    """(command, its words) of each ``tokenpools COMMAND ...`` in the page's shell blocks."""
    for block in _BLOCK.findall(markdown):
        for m in _INVOCATION.finditer(re.sub(r"\\\n\s*", " ", block)):
            yield m[1], m[2].split()


def subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command, installed_commands())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def test_the_scan_finds_the_guides_commands() -> None:
    found = {command for command, _ in invocations((ROOT / "docs" / "guide.md").read_text(encoding="utf-8"))}
    assert {"calibrate", "validate", "proxy", "agents", "hash-key"} <= found, found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_option_a_page_teaches_is_current(page: Path) -> None:
    known = {c.name for c in installed_commands()}
    problems = []
    for command, words in invocations(page.read_text(encoding="utf-8")):
        if command not in known:
            problems.append(f"tokenpools {command}: no such command")
            continue
        options = subparser(command)._option_string_actions
        for word in (w.split("=", 1)[0] for w in words if w.startswith("--")):
            action = options.get(word)
            if action is None:
                problems.append(f"tokenpools {command} {word}: no such option")
            elif action.option_strings[0] != word and action.option_strings[0].startswith("--"):
                problems.append(f"tokenpools {command} {word}: a former name, now {action.option_strings[0]}")
    assert not problems, "\n".join(problems)
