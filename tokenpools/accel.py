"""The optional compiled accelerator: which hot modules run compiled by mypyc.

``scripts/build-accel.sh`` compiles ``MODULES`` with mypyc into extension modules placed next to their sources
(``*.cpython-*.so``, gitignored), plus one shared library, ``tokenpools/_accel__mypyc*.so``, and records the
SHA-256 of every compiled source in ``tokenpools/_accel.json``. Python imports an extension module in preference to
the ``.py`` beside it, so once built the compiled code is used everywhere (the proxy's admission decisions too);
with nothing built (a fresh clone, a machine without a C compiler) the pure-Python modules are used and give the
same results, byte for byte: the compiled modules are the same source, and an accelerator, never a requirement.

An extension built from an older source would silently run the old code, so ``stale()`` names the compiled modules
whose source changed since the build (the unit suite fails on any; rebuild with ``scripts/build-accel.sh``, which
does nothing when everything is up to date). Nothing happens at import time: every function looks when called.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec, PathFinder
from pathlib import Path
from types import ModuleType

__all__ = [
    "MANIFEST_NAME", "MODULES", "compiled", "describe", "manifest_path", "source_path", "stale", "use_pure_python",
]

MODULES: tuple[str, ...] = (
    "tokenpools.replay.backend.state",
    "tokenpools.replay.backend.batching",
    "tokenpools.replay.backend.simulator",
    "tokenpools.core.rounding",
    "tokenpools.core.reservation",
    "tokenpools.core.retry_estimates",
    "tokenpools.core.accumulator",
    "tokenpools.core.admission",
    "tokenpools.core.waiting",
    "tokenpools.replay.policy",
    "tokenpools.replay.replayer",
)
"""The modules the build compiles, in one mypyc group (calls between them are native): the backend simulator, the
admission controller (the proxy's per-request decision and a fifth of a replay) with its output estimate (asked on
every check, taught on every completion), its retry estimates (on every refusal; every release teaches them) and
its queue (drained after every release and at the pending wake while anything waits: about one drain every two
requests of a replay with the queue on), the usage windows' accumulator (two events a request; the agents' fold
too), the replayer's loop and policy glue that call them, and ``round`` in
native arithmetic for the times they convert. Compiled, a replay runs about 2x as fast as in pure Python
(benchmarks/replay_speed.py --compare); compiling the loop and glue without the admission controller measured no
faster, their time went to calls into it. What is not compiled is called through the interpreter: a Python
function, a NamedTuple's ``__new__``, a property, a field of a plain dataclass, a module name that is not
``Final``. (``core.windows`` itself is left out: its frozen dataclasses mix ints and floats, which mypyc would
convert, and the agents restore them from their state; ``core.accumulator`` keeps its sums as Python numbers.)"""

MANIFEST_NAME = "_accel.json"
"""The build's record, in the ``tokenpools`` package directory: ``{"modules": {name: sha256 of its source}}``."""


def _origin(name: str) -> Path | None:
    """The file ``import name`` loads (or loaded, if it is imported already)."""
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin else None


def _is_extension(path: Path) -> bool:
    return any(path.name.endswith(suffix) for suffix in EXTENSION_SUFFIXES)


def compiled() -> list[str]:
    """The names in ``MODULES`` that are (or would be, on import) the compiled extension modules."""
    return [name for name in MODULES if (origin := _origin(name)) is not None and _is_extension(origin)]


def source_path(name: str) -> Path:
    """The ``.py`` source of a module in ``MODULES`` (beside its extension module, if one was built).

    Found in the parent package's directory, not from the module's ``__file__``: a module that mypyc's shared
    library initialises for another one gets a wrong ``__file__`` (the package path twice).
    """
    parent, _, short = name.rpartition(".")
    spec = importlib.util.find_spec(parent)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {parent!r} cannot be found")
    for directory in spec.submodule_search_locations:
        path = Path(directory) / f"{short}.py"
        if path.exists():
            return path
    raise ValueError(f"module {name!r} has no source in {list(spec.submodule_search_locations)}")


def manifest_path() -> Path:
    import tokenpools  # (the package directory; no work at import time)

    return Path(tokenpools.__file__).parent / MANIFEST_NAME


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale() -> list[str]:
    """Compiled modules whose source differs from the one they were built from (all of them without a record)."""
    names = compiled()
    if not names:
        return []
    try:
        recorded = json.loads(manifest_path().read_text())["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        return names
    return [name for name in names if recorded.get(name) != _sha256(source_path(name))]


def describe() -> str:
    """One line for benchmarks and reports: which build is in use."""
    names = compiled()
    if not names:
        return "accelerator: none (pure Python; scripts/build-accel.sh compiles the simulator with mypyc)"
    short = ", ".join(name.rpartition(".")[2] for name in names)
    line = f"accelerator: mypyc, {len(names)} of {len(MODULES)} modules compiled ({short})"
    old = stale()
    if old:
        line += f"; STALE, source changed since the build: {', '.join(old)} (rerun scripts/build-accel.sh)"
    return line


class _SourceFirst:
    """A meta-path finder that loads the ``.py`` source of the modules in ``MODULES`` even when compiled."""

    @staticmethod
    def find_spec(fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in MODULES:
            return None
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin or not _is_extension(Path(spec.origin)):
            return spec
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def use_pure_python() -> None:
    """From now on, this process imports the pure-Python ``MODULES`` even where compiled ones exist (to compare
    the two builds). Call it before any of them is imported; raises RuntimeError if one already was."""
    loaded = [name for name in MODULES if name in sys.modules]
    if loaded:
        raise RuntimeError(f"use_pure_python() must come before these are imported: {', '.join(loaded)}")
    if not any(isinstance(finder, _SourceFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
