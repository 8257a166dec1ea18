"""PoolState ⇄ JSON bytes, the value the Faust table stores (its changelog is what a restarted worker restores).

The table key carries the state version (``v1/<pool>``) and so does the value (``"v": 1``): a worker that finds
a value of another version, or one computed with another window width, starts that pool afresh instead of
misreading it (``load`` returns None and says why). Floats survive the round trip exactly (orjson writes the
shortest representation that reads back to the same double), so a restored state ticks exactly like the original.

The value also records the Kafka partition the pool's events arrive on: the timer, which runs outside any
stream event, writes the table's changelog to that partition so recovery finds it with the pool's events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import orjson

from tokenpools.core.tick import Signals
from tokenpools.core.windows import Bucket, WindowState
from tokenpools.streams.capacity import MetricsPoint
from tokenpools.streams.pool_state import PoolState

STATE_VERSION = 1
_KEY_PREFIX = f"v{STATE_VERSION}/"


def table_key(pool: str) -> bytes:
    return (_KEY_PREFIX + pool).encode()


def pool_of_key(key: bytes | str) -> str | None:
    """The pool a table key is for, or None for a key of another state version."""
    text = key.decode() if isinstance(key, bytes) else key
    return text[len(_KEY_PREFIX):] if text.startswith(_KEY_PREFIX) else None


@dataclass(frozen=True, slots=True)
class Stored:
    state: PoolState
    partition: int


_BUCKET_FIELDS = tuple(f.name for f in fields(Bucket))
_WINDOW_FIELDS = tuple(f.name for f in fields(WindowState) if f.name not in ("width_ms", "buckets"))


def _window(w: WindowState) -> dict[str, Any]:
    """Fields by name, buckets as value lists in ``bucket_fields`` order (recorded once per state)."""
    out: dict[str, Any] = {name: getattr(w, name) for name in _WINDOW_FIELDS}
    out["buckets"] = [[i, [getattr(b, n) for n in _BUCKET_FIELDS]] for i, b in sorted(w.buckets.items())]
    return out


def _window_from(data: dict[str, Any], width_ms: int, bucket_fields: list[str]) -> WindowState:
    known = {n: data[n] for n in _WINDOW_FIELDS if n in data}
    buckets = {int(i): Bucket(**{n: v for n, v in zip(bucket_fields, values) if n in _BUCKET_FIELDS})
               for i, values in data["buckets"]}
    return WindowState(width_ms=width_ms, buckets=buckets, **known)


def _by_key(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """``dict(sorted(mapping.items()))``, or ``mapping`` itself when its keys are in order already (the agents
    build the per-proxy maps from proxies in id order: checking the keys is cheaper than sorting the items)."""
    keys = list(mapping)
    return mapping if type(mapping) is dict and keys == sorted(keys) else dict(sorted(mapping.items()))


def _maps_by_key(maps: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """``{k: _by_key(m) for k, m in sorted(maps.items())}``; a map with the very keys of the one before it, which
    were in order, is in order (a shares-mode state's grant maps all have every live proxy, in id order)."""
    out: dict[str, Mapping[str, Any]] = {}
    ordered: list[str] | None = None
    for name, mapping in sorted(maps.items()):
        keys = list(mapping)
        if type(mapping) is dict and keys == ordered:
            out[name] = mapping
            continue
        out[name] = _by_key(mapping)
        ordered = keys if out[name] is mapping else None
    return out


def to_dict(state: PoolState) -> dict[str, Any]:
    return {
        "pool": state.pool,
        "width_ms": state.width_ms,
        "closed_through": state.closed_through,
        "bucket_fields": list(_BUCKET_FIELDS),
        "windows": {name: _window(w) for name, w in sorted(state.windows.items())},
        "attempts": [[i, {e: dict(sorted(p.items())) for e, p in sorted(a.items())}]
                     for i, a in sorted(state.attempts.items())],
        "signals": {name: [s.burst, s.debt] for name, s in sorted(state.signals.items())},
        "mean_slo_ms": state.mean_slo_ms,
        "last_version": state.last_version,
        "metrics": [[p.t_ms, p.replicas_ready, p.waiting] for p in state.metrics],
        "offsets": dict(sorted(state.offsets.items())),
        "in_flight": {e: dict(sorted(p.items())) for e, p in sorted(state.in_flight.items())},
        "in_flight_deltas": [[i, {e: dict(sorted(p.items())) for e, p in sorted(d.items())}]
                             for i, d in sorted(state.in_flight_deltas.items())],
        "granted": _maps_by_key(state.granted),
        "pool_granted": _by_key(state.pool_granted),
    }


def from_dict(data: dict[str, Any]) -> PoolState:
    width_ms = int(data["width_ms"])
    windows = {name: _window_from(w, width_ms, data["bucket_fields"]) for name, w in data["windows"].items()}
    return PoolState(
        pool=data["pool"],
        width_ms=width_ms,
        closed_through=data["closed_through"],
        windows=windows,
        attempts={int(i): {e: dict(p) for e, p in a.items()} for i, a in data["attempts"]},
        signals={name: Signals(float(b), float(d)) for name, (b, d) in data["signals"].items()},
        mean_slo_ms=data["mean_slo_ms"],
        last_version=data["last_version"],
        metrics=tuple(MetricsPoint(int(t), r, w) for t, r, w in data["metrics"]),
        offsets=dict(data["offsets"]),
        in_flight={e: {p: int(n) for p, n in c.items()} for e, c in data.get("in_flight", {}).items()},
        in_flight_deltas={int(i): {e: {p: int(n) for p, n in c.items()} for e, c in d.items()}
                          for i, d in data.get("in_flight_deltas", [])},
        granted={e: {p: int(n) for p, n in c.items()} for e, c in data.get("granted", {}).items()},
        pool_granted={p: int(n) for p, n in data.get("pool_granted", {}).items()},
    )


def dump(state: PoolState, partition: int) -> bytes:
    return orjson.dumps({"v": STATE_VERSION, "partition": partition, "state": to_dict(state)})


def load(value: bytes, width_ms: int) -> tuple[Stored | None, str]:
    """The stored state, or (None, why it cannot be used)."""
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(data, dict) or data.get("v") != STATE_VERSION:
        return None, f"state version {data.get('v') if isinstance(data, dict) else None!r}, expected {STATE_VERSION}"
    try:
        state = from_dict(data["state"])
        partition = int(data["partition"])
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"malformed state: {exc!r}"
    if state.width_ms != width_ms:
        return None, f"window width {state.width_ms} ms, now {width_ms} ms"
    return Stored(state, partition), ""
