"""The project's exceptions, classified by what a retry would do (docs/conventions.md#errors).

- ``TokenPoolsError``: the root; catch it to catch everything the project raises on purpose.
- ``RetryableError(delay_s=…)``: the same call may succeed later (broker unreachable, API server throttling);
  ``delay_s`` is the earliest sensible retry, in seconds.
- ``PermanentError``: retrying cannot help (bad input, a rejected write); fix the cause.
- ``ConfigError``: a permanent error carrying *every* problem found in a configuration, not just the first.
- ``override_problem(key, message)``: the problem of one bad ``--set KEY=VALUE`` item, named as every command names it.

This module imports nothing beyond the standard library so that the CLI can catch these errors without
paying for pydantic at start-up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class TokenPoolsError(Exception):
    """Root of every exception the project raises deliberately."""


class RetryableError(TokenPoolsError):
    """The operation may succeed if retried after ``delay_s`` seconds (>= 0)."""

    def __init__(self, message: str, delay_s: float = 1.0) -> None:
        if delay_s < 0:
            raise ValueError(f"`delay_s` must be >= 0, got {delay_s}")
        super().__init__(message)
        self.delay_s = delay_s


class PermanentError(TokenPoolsError):
    """Retrying the same operation cannot succeed."""


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong with a configuration, located as precisely as known.

    ``document`` is 1-based (the first ``---`` document is document 1), ``line`` is the 1-based line in
    ``source`` of the offending value when the input was YAML text, ``path`` is the dotted field path inside
    the document in the spelling of the file (``spec.qos.sloTargetMs``, ``spec.apiKeys[1].sha256``).
    """

    source: str
    message: str
    path: str = ""
    document: int | None = None
    kind: str = ""
    name: str = ""
    line: int | None = None

    def __str__(self) -> str:
        parts = [self.source if self.line is None else f"{self.source}:{self.line}"]
        if self.document is not None:
            label = " ".join(p for p in (self.kind, self.name) if p)
            parts.append(f"document {self.document}" + (f" ({label})" if label else ""))
        if self.path:
            parts.append(self.path)
        parts.append(self.message)
        return ": ".join(parts)


class ConfigError(PermanentError):
    """A configuration failed validation; ``problems`` lists all of it, in the order found."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        if not self.problems:
            raise ValueError("a ConfigError needs at least one problem")
        super().__init__("\n".join(str(p) for p in self.problems))


OVERRIDE_OPTION = "--set"


def override_problem(key: str, message: str) -> ConfigProblem:
    """A bad ``--set`` item as every command answers it, ``--set: KEY: message`` (KEY as the item spells it; "" when
    it has none). The one place the option is named, whichever module reads the item: ``apply_overrides`` (Settings
    keys), ``replay.experiments`` (``replay.*``, ``load.*``); ``replay.sweep.check_points`` says ``--sweep`` instead
    for a swept key."""
    return ConfigProblem(OVERRIDE_OPTION, message, path=key)
