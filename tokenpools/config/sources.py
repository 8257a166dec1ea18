"""Where the settings come from, in order: defaults → file → environment → ``--set``, merged and checked.

One idea: how a ``Settings`` (``tokenpools.config.settings``, the schema) is assembled from its sources, and every
bad value named by where it came from. ``load_settings`` is called by each process's composition root; nothing is
read at import time.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_settings import EnvSettingsSource, SettingsError

from tokenpools.config.problems import translate
from tokenpools.config.settings import ENV_DELIMITER, ENV_PREFIX, Settings, groups
from tokenpools.errors import ConfigError, ConfigProblem, override_problem


def _deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _env_name(loc: Sequence[int | str]) -> str:
    return ENV_PREFIX + ENV_DELIMITER.join(str(p).upper() for p in loc)


def check_settings_values(values: Mapping[str, Any]) -> list[tuple[tuple[int | str, ...], str]]:
    """Validate a partial settings mapping (a TokenPoolsSettings spec) without reading the environment."""
    issues: list[tuple[tuple[int | str, ...], str]] = []
    known = groups()
    for name, value in values.items():
        group = known.get(name)
        if group is None:
            issues.append(((name,), f"unknown settings group (known: {', '.join(known)})"))
            continue
        try:
            group.model_validate(value)
        except ValidationError as exc:
            issues.extend(translate(exc, group, by_alias=False, prefix=(name,)))
    return issues


def unknown_env_groups(environ: Mapping[str, str]) -> list[str]:
    """What is wrong with each ``TOKENPOOLS_GROUP__FIELD`` variable whose GROUP is no settings group.

    Pydantic reads only the variables of known groups, so a misspelt group would be ignored in silence while a
    misspelt field is caught. A variable without the delimiter (``TOKENPOOLS_CACHE``) is not a setting: left alone.
    """
    known = list(groups())
    problems = []
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX) or ENV_DELIMITER not in name[len(ENV_PREFIX):]:
            continue
        group = name[len(ENV_PREFIX):].split(ENV_DELIMITER, 1)[0].lower()
        if group in known:
            continue
        hint = difflib.get_close_matches(group, known, n=1)
        problems.append(f"{name}: unknown settings group {group!r}" + (f"; did you mean {hint[0]}?" if hint else "")
                        + f" (known: {', '.join(known)})")
    return problems


def load_settings(file_values: Mapping[str, Any] | None = None, overrides: Sequence[str] = (),
                  source: str = "settings") -> Settings:
    """Defaults, then ``file_values`` (a TokenPoolsSettings spec), then ``TOKENPOOLS_*`` env, then ``overrides``.

    Raises ConfigError naming every bad value and, for env values, the variable that held it.
    """
    unknown = unknown_env_groups(os.environ)
    if unknown:
        raise ConfigError(ConfigProblem("environment", message) for message in unknown)
    try:
        env_values = EnvSettingsSource(Settings)()
    except SettingsError as exc:  # e.g. TOKENPOOLS_POLICY='{not json'
        raise ConfigError([ConfigProblem("environment", f"{exc} (a group variable takes JSON; or set one field "
                                         f"with {ENV_PREFIX}GROUP{ENV_DELIMITER}FIELD)")]) from None
    try:
        settings = Settings(**_deep_merge(file_values or {}, env_values))
    except ValidationError as exc:
        problems = []
        for loc, message in translate(exc, Settings, by_alias=False):
            env = _env_name(loc)
            from_env = env.lower() in {k.lower() for k in os.environ}
            problems.append(ConfigProblem("environment" if from_env else source, message + (f" (from {env})" if from_env else ""),
                                          path=".".join(str(p) for p in loc)))
        raise ConfigError(problems) from None
    return apply_overrides(settings, overrides) if overrides else settings


def parse_override(item: str) -> tuple[list[str], str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE such as policy.alpha_debt=2.0, got {item!r}")
    return [p.strip() for p in key.strip().split(".")], value.strip()


def _resolve(path: list[str]) -> str | None:
    """None when ``path`` names a settings field, else what is wrong with it."""
    model: type[BaseModel] = Settings
    for depth, part in enumerate(path):
        field = model.model_fields.get(part)
        if field is None:
            what = f"unknown settings group {part!r}" if depth == 0 else f"unknown setting {part!r} in {'.'.join(path[:depth])}"
            hint = difflib.get_close_matches(part, list(model.model_fields), n=1)
            return (what + (f"; did you mean {hint[0]}?" if hint else "")
                    + f" (known: {', '.join(model.model_fields)})")
        annotation = field.annotation
        is_group = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        last = depth == len(path) - 1
        if is_group and last:
            return f"is a group; set one of its fields, e.g. {'.'.join(path)}.{next(iter(annotation.model_fields))}"
        if not is_group and not last:
            return f"{'.'.join(path[: depth + 1])} is a setting, not a group"
        if is_group:
            model = annotation
    return None


def apply_overrides(settings: Settings, overrides: Sequence[str]) -> Settings:
    """A new Settings with ``group.field=value`` items applied (values parsed and checked by the field's type).

    ``null`` sets an optional field to none; a later item for the same key wins. Raises ConfigError listing
    every bad item, in the order given.
    """
    problems: list[tuple[int, ConfigProblem]] = []
    changes: dict[str, Any] = {}
    item_of: dict[str, int] = {}
    for i, item in enumerate(overrides):
        try:
            path, value = parse_override(item)
        except ValueError as exc:
            problems.append((i, override_problem("", str(exc))))
            continue
        error = _resolve(path)
        if error is not None:
            problems.append((i, override_problem(".".join(path), error)))
            continue
        node = changes
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = None if value.lower() in ("null", "none", "~") else value
        item_of[".".join(path)] = i
    try:
        updated = Settings.model_validate(_deep_merge(settings.model_dump(), changes))
    except ValidationError as exc:
        for loc, message in translate(exc, Settings, by_alias=False):
            path = ".".join(str(p) for p in loc)
            problems.append((item_of.get(path, len(overrides)), override_problem(path, message)))
    if problems:
        raise ConfigError(p for _, p in sorted(problems, key=lambda x: x[0]))
    return updated
