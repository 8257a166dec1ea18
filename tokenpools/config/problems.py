"""A configuration's problems: pydantic's validation errors rephrased for people who write YAML (``path: must be >
0, got -5``), and ``Problems``, the problems found so far, each located in its document."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError

from tokenpools.config.yamlio import RawDocument
from tokenpools.errors import ConfigProblem

Loc = tuple[int | str, ...]


def format_path(loc: Sequence[int | str]) -> str:
    """('spec', 'apiKeys', 1, 'sha256') -> 'spec.apiKeys[1].sha256'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def describe(value: Any) -> str:
    """A value as it would look in YAML, short: -5, 'gold', true, null, a list, a mapping."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, SecretStr):
        return "a secret"
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "...'"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _bare(value: Any) -> str:
    """For range errors: env and --set values arrive as strings; '-5' reads better as -5."""
    return value if isinstance(value, str) else describe(value)


_RANGE = {
    "greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"), "less_than_equal": ("<=", "le"),
}
_KIND_WORD = {
    "int": "a whole number", "float": "a number", "string": "a string", "bool": "true or false",
    "list": "a list", "dict": "a mapping", "model": "a mapping", "model_attributes": "a mapping",
    "datetime": "an RFC 3339 timestamp with a UTC offset (e.g. 2026-12-31T23:59:59Z)",
}


def message_for(error: Any, fields_here: Sequence[str] = ()) -> str:
    """The message for one pydantic error dict (without its path)."""
    kind: str = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        name = str(error["loc"][-1]) if error["loc"] else ""
        hint = difflib.get_close_matches(name, list(fields_here), n=1)
        known = f" (known: {', '.join(fields_here)})" if fields_here else ""
        return "unknown field" + (f"; did you mean {hint[0]}?" if hint else "") + known
    if kind in _RANGE:
        op, key = _RANGE[kind]
        return f"must be {op} {describe(ctx[key])}, got {_bare(value)}"
    if kind in ("enum", "literal_error"):
        return f"must be one of {ctx.get('expected', '?')}, got {describe(value)}"
    if kind in ("int_from_float", "int_parsing", "int_type"):
        return f"must be a whole number, got {describe(value)}"
    if kind == "finite_number":
        return f"must be a finite number, got {describe(value)}"
    if kind in ("float_parsing", "float_type"):
        return f"must be a number, got {describe(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false, got {describe(value)}"
    if kind == "string_type":
        hint = " (quote it)" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        return f"must be a string, got {describe(value)}{hint}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind in ("timezone_aware", "datetime_parsing", "datetime_type", "datetime_from_date_parsing"):
        return f"must be {_KIND_WORD['datetime']}, got {describe(value)}"
    if kind.endswith("_type") and kind[: -len("_type")] in _KIND_WORD:
        return f"must be {_KIND_WORD[kind[: -len('_type')]]}, got {describe(value)}"
    if kind in ("value_error", "assertion_error"):
        msg = error["msg"]
        for prefix in ("Value error, ", "Assertion failed, "):
            msg = msg.removeprefix(prefix)
        return msg
    msg = error["msg"]
    return f"{msg[:1].lower()}{msg[1:]}, got {describe(value)}"


def _unwrap(annotation: Any) -> Any:
    """The model class reachable through Optional/list/dict/Annotated, if any."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _unwrap(arg)
            if isinstance(found, type) and issubclass(found, BaseModel):
                return found
        return None
    if origin in (list, tuple, dict):
        args = typing.get_args(annotation)
        return _unwrap(args[-1]) if args else None
    return annotation


def field_names(model: type[BaseModel], by_alias: bool = True) -> list[str]:
    return [(f.alias or n) if by_alias else n for n, f in model.model_fields.items()]


def model_at(model: type[BaseModel] | None, loc: Loc, by_alias: bool = True) -> type[BaseModel] | None:
    """Follow a location through nested models; None when it leaves them."""
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        by_name = {((f.alias or n) if by_alias else n): f for n, f in model.model_fields.items()}
        field = by_name.get(part)
        if field is None:
            return None
        found = _unwrap(field.annotation)
        model = found if isinstance(found, type) and issubclass(found, BaseModel) else None
    return model


def translate(exc: ValidationError, model: type[BaseModel] | None, by_alias: bool = True,
              prefix: Loc = ()) -> list[tuple[Loc, str]]:
    """Every error of ``exc`` as (location, message); ``prefix`` is prepended to locations."""
    out: list[tuple[Loc, str]] = []
    for error in exc.errors(include_url=False):
        loc: Loc = tuple(error["loc"])
        fields_here: list[str] = []
        if error["type"] == "extra_forbidden":
            parent = model_at(model, loc[:-1], by_alias)
            if parent is not None:
                fields_here = list(getattr(parent, "ADVERTISED_FIELDS", ())) or field_names(parent, by_alias)
        out.append((prefix + loc, message_for(error, fields_here)))
    return out


def label(data: Any) -> tuple[str, str]:
    """A document's (kind, name) as written; "" for what is missing or not a string."""
    if not isinstance(data, dict):
        return "", ""
    kind = data.get("kind")
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return (kind if isinstance(kind, str) else ""), (name if isinstance(name, str) else "")


class Problems:
    """The problems found so far, each located in its document; ``sorted()`` is the order ``ConfigError`` lists."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[ConfigProblem] = []

    def add(self, raw: RawDocument | None, loc: Sequence[int | str], message: str, line: int | None = None) -> None:
        if raw is None:
            self.items.append(ConfigProblem(self.source, message, line=line))
            return
        kind, name = label(raw.data)
        self.items.append(ConfigProblem(
            self.source, message, path=format_path(loc), document=raw.index, kind=kind, name=name,
            line=line if line is not None else raw.line_of(loc),
        ))

    def sorted(self) -> list[ConfigProblem]:
        return sorted(self.items, key=lambda p: (p.document or 0, p.line or 0))
