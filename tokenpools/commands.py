"""Command rows: named functions imported only when chosen, built in or added by other installed distributions.

A :class:`Command` names, as "module:function" strings, the function that runs it (``run(args) -> int``) and,
optionally, the one that adds its arguments (``add_arguments(parser) -> None``); nothing is imported until the row
is chosen. The ``tokenpools`` subcommands are such rows (``tokenpools.cli.COMMANDS``), and so are the modes of
``tokenpools experiment --mode`` (``tokenpools.replay.cli``).

Another distribution adds rows through entry points whose object is a Command: group ``tokenpools.commands`` for
subcommands, ``tokenpools.experiment_modes`` for experiment modes (tokenpools-dev, in ``tools/``, adds ``up``,
``down``, ``load`` and ``--mode live``). Loading one imports only the small module that holds the rows, never the
command's code. :func:`discover` reads the installed distributions' metadata when it is called, never at import
time; an entry point that does not load, is not a Command, names another row, or takes a name already in use is
skipped with a problem line, so the product's own commands keep working beside a broken extension.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

COMMANDS_GROUP = "tokenpools.commands"
EXPERIMENT_MODES_GROUP = "tokenpools.experiment_modes"


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    run: str  # "module:function"; function(args) -> int
    help: str
    arguments: str | None = None  # "module:function"; function(parser) -> None
    settings: bool = True  # whether it reads settings, so takes --set (a command that reads none refuses it)
    origin: str | None = None  # the distribution whose entry point added it (``discover``); None: the product's own

    def available(self) -> bool:
        """Whether the module of ``run`` exists and defines the function (its source is read, not imported)."""
        module, _, function = self.run.partition(":")
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            return False
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return spec is not None
        try:
            source = Path(spec.origin).read_text(encoding="utf-8")
        except OSError:
            return False
        name = re.escape(function)
        defined = (rf"^(async\s+)?def\s+{name}\s*\(", rf"^{name}\s*[:=]", rf"^from\s.*\bimport\b.*\b{name}\b")
        return any(re.search(p, source, re.MULTILINE) for p in defined)


def resolve(target: str) -> Callable[..., Any] | None:
    """The function a "module:function" string names, or None when its module exists but does not (yet) define it."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return None
    return getattr(module, attr, None)


class Skipped(StrEnum):
    """Why an entry point's row was not used."""

    NOT_LOADED = "does not load"
    NOT_A_COMMAND = "is not a tokenpools.commands.Command"
    OTHER_NAME = "holds a row of another name"
    NAME_TAKEN = "takes a name already in use"


@dataclass(frozen=True, slots=True)
class Discovered:
    commands: tuple[Command, ...]  # in the order the entry points are installed (sys.path, then file order)
    problems: tuple[str, ...]  # one line per entry point skipped, naming it and why


def judge(name: str, loaded: object, taken: Collection[str]) -> Skipped | None:
    """Whether the object an entry point called ``name`` loaded may join rows whose names are ``taken`` (None: yes)."""
    if isinstance(loaded, BaseException):
        return Skipped.NOT_LOADED
    if not isinstance(loaded, Command):
        return Skipped.NOT_A_COMMAND
    if loaded.name != name:
        return Skipped.OTHER_NAME
    if name in taken:
        return Skipped.NAME_TAKEN
    return None


def discover(group: str, taken: Collection[str],
             entry_points: Iterable[importlib.metadata.EntryPoint] | None = None) -> Discovered:
    """The rows the installed distributions add to ``group`` (or those of ``entry_points``, when given)."""
    found = importlib.metadata.entry_points(group=group) if entry_points is None else entry_points
    names = set(taken)
    commands: list[Command] = []
    problems: list[str] = []
    for entry in found:  # the first of two with one name wins, as the first module on sys.path does
        try:
            loaded: object = entry.load()
        except Exception as exc:  # noqa: BLE001 -- any failure of a foreign module is reported, not fatal
            loaded = exc
        skipped = judge(entry.name, loaded, names)
        if skipped is None:
            assert isinstance(loaded, Command)
            loaded = replace(loaded, origin=entry.dist.name if entry.dist is not None else entry.value)
            commands.append(loaded)
            names.add(loaded.name)
            continue
        detail = f" ({type(loaded).__name__}: {loaded})" if isinstance(loaded, BaseException) else ""
        problems.append(f"ignored entry point {entry.name} = {entry.value} in {group}: {skipped}{detail}")
    return Discovered(tuple(commands), tuple(problems))
