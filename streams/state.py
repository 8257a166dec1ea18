"""PoolState ⇄ the Faust table's keys: a pool's state as a header and parts, so a write carries what changed.

The table (its changelog is what a restarted worker restores) holds, per pool, state version 2:

- the **header** ``v2/<pool>``: the window index last ticked, the source offsets, the backend-metrics samples, ℓ̄*,
  the last version, the Kafka partition of the pool's events, and the number of its write *group*;
- **parts** ``v2/<pool>␟<kind>␟<name>…␟<slot>`` (␟ is the byte 0x1f), each stamped with the group that wrote it:
  ``w/<entitlement>`` its usage window (``core.windows``); ``c/<entitlement>/<proxy>`` its *cell*: that proxy's
  attempts and in-flight deltas per open window and its in-flight level; ``g/<entitlement>`` the last update's grants
  to every proxy (shares mode); ``t`` the signals (b_e, d_e) of every entitlement and the pool's grants.

Why this cut: a batch changes the offsets, the windows of the entitlements its events are for and the cells of
the (entitlement, proxy) pairs they came through, nothing else. Per-proxy maps are what make the state big
(E·P entries); keyed by cell, a batch writes one small value per pair it touched instead of an entitlement's whole
map. What only a tick changes (signals, grants) lives in parts of its own that batches never rewrite. A tick
closes windows for every entitlement, so it writes what changed: most windows and cells, ``t``, the grants.

Crashes: a worker stops anywhere in its sequence of writes; the changelog (one partition per pool, written in
order) keeps a prefix of it. Every write is part of a **group** (one batch of a pool, or one tick of a pool):
its parts first, its header last. A part is never overwritten in place: each has two slots and a group writes the
slot that does not hold the part's newest value, stamped with the group's number. Restoring takes the header's
group n and, per part, the newest value stamped ≤ n; values of a later, unfinished group are ignored (and deleted
at the pool's next write, before its header), so the restored state is exactly the one after group n, whatever the
cut. Events after the header's offsets are read again and folded as if the crash had not happened (the fold
skips what the offsets hold): no event lost, none counted twice, ticks included (a tick half-written is
undone whole, and is redone by the next tick with the same windows). A part that leaves the state (an entitlement
gone, a cell emptied) is listed in its group's header as gone and then deleted (value None: a tombstone). Faust's
memory store takes the tombstone on restore as a delete.

Values are JSON (orjson); floats survive the round trip exactly, and the restored maps are in key order, as the
agents build them. A table of another state version (``v1/<pool>``: one value holding the whole state) is ignored
at start-up with a log line: the pool starts afresh and the old key is deleted at its next write.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from tokenpools.core.tick import Signals
from tokenpools.core.windows import Bucket, WindowState
from tokenpools.streams.capacity import MetricsPoint
from tokenpools.streams.pool_state import Outcome, PoolState, Position
from tokenpools.topics.records import Record, RequestCompleted, RequestDecided

STATE_VERSION = 2
_PREFIX = f"v{STATE_VERSION}/".encode()
_SEP = b"\x1f"
_VERSIONED = re.compile(rb"v(\d+)/")

Part = tuple[str, ...]  # ("w", entitlement) | ("c", entitlement, proxy) | ("g", entitlement) | ("t",)
SIGNALS: Part = ("t",)

_BUCKET_FIELDS = tuple(f.name for f in fields(Bucket))
_WINDOW_FIELDS = tuple(f.name for f in fields(WindowState) if f.name not in ("width_ms", "buckets"))


# ---- keys ------------------------------------------------------------------------------------------------------

def table_key(pool: str) -> bytes:
    """The pool's header key."""
    return _PREFIX + pool.encode()


def part_key(pool: str, part: Part, slot: int) -> bytes:
    return _SEP.join((table_key(pool), *(name.encode() for name in part), b"%d" % slot))


def pool_of_key(key: bytes | str) -> str | None:
    """The pool a header key is for; None for a part's key or a key of another state version."""
    raw = key.encode() if isinstance(key, str) else key
    return raw[len(_PREFIX):].decode() if raw.startswith(_PREFIX) and _SEP not in raw else None


def owner_of_key(key: bytes) -> tuple[str, int] | None:
    """(pool, state version) of any table key (header or part, this version or another); None: not a state key."""
    found = _VERSIONED.match(key)
    if found is None:
        return None
    rest = key[found.end():]
    return rest.split(_SEP, 1)[0].decode(), int(found.group(1))


def _parse_part_key(key: bytes) -> tuple[Part, int]:
    names = key.split(_SEP)[1:]
    return tuple(n.decode() for n in names[:-1]), int(names[-1])


# ---- the parts of a state ---------------------------------------------------------------------------------------

def _window(w: WindowState) -> list[Any]:
    return [[getattr(w, n) for n in _WINDOW_FIELDS],
            [[i, [getattr(b, n) for n in _BUCKET_FIELDS]] for i, b in sorted(w.buckets.items())]]


def _window_from(data: list[Any], width_ms: int, window_fields: list[str], bucket_fields: list[str]) -> WindowState:
    known = {n: v for n, v in zip(window_fields, data[0]) if n in _WINDOW_FIELDS}
    buckets = {int(i): Bucket(**{n: v for n, v in zip(bucket_fields, values) if n in _BUCKET_FIELDS})
               for i, values in data[1]}
    return WindowState(width_ms=width_ms, buckets=buckets, **known)


def _cell(state: PoolState, entitlement: str, proxy: str) -> list[Any] | None:
    attempts = [[i, n] for i, a in sorted(state.attempts.items())
                if (n := a.get(entitlement, {}).get(proxy)) is not None]
    deltas = [[i, n] for i, d in sorted(state.in_flight_deltas.items())
              if (n := d.get(entitlement, {}).get(proxy)) is not None]
    level = state.in_flight.get(entitlement, {}).get(proxy)
    return [attempts, deltas, level] if attempts or deltas or level is not None else None


def _all_cells(state: PoolState) -> dict[Part, list[Any]]:
    cells: dict[Part, list[Any]] = {}
    for slot, rows in ((0, state.attempts), (1, state.in_flight_deltas)):
        for i, per_window in sorted(rows.items()):
            for entitlement, per_proxy in per_window.items():
                for proxy, n in per_proxy.items():
                    cell = cells.get(("c", entitlement, proxy))
                    if cell is None:
                        cell = cells[("c", entitlement, proxy)] = [[], [], None]
                    cell[slot].append([i, n])
    for entitlement, per_proxy in state.in_flight.items():
        for proxy, n in per_proxy.items():
            cells.setdefault(("c", entitlement, proxy), [[], [], None])[2] = n
    return cells


def _signals(state: PoolState) -> list[Any] | None:
    if not state.signals and not state.pool_granted:
        return None
    return [[[e, s.burst, s.debt] for e, s in sorted(state.signals.items())], dict(sorted(state.pool_granted.items()))]


def payload(state: PoolState, part: Part) -> Any:
    """The value of one part of ``state`` (without its stamp); None when the state has nothing there."""
    kind = part[0]
    if kind == "w":
        window = state.windows.get(part[1])
        return None if window is None else _window(window)
    if kind == "c":
        return _cell(state, part[1], part[2])
    if kind == "g":
        grants = state.granted.get(part[1])
        return None if grants is None else dict(sorted(grants.items()))
    if kind == "t":
        return _signals(state)
    raise ValueError(f"unknown part {part!r}")


def payloads(state: PoolState) -> dict[Part, Any]:
    """Every part ``state`` has, with its value."""
    out: dict[Part, Any] = {("w", e): _window(w) for e, w in state.windows.items()}
    out.update(_all_cells(state))
    out.update({("g", e): dict(sorted(g.items())) for e, g in state.granted.items()})
    if (signals := _signals(state)) is not None:
        out[SIGNALS] = signals
    return out


def touched(items: Iterable[tuple[Record, Position | None]], outcomes: Iterable[Outcome]) -> set[Part]:
    """The parts a batch's fold (and ``track_in_flight``) may have changed: the windows and cells of its usage
    events that counted (applied, or late: a late one moves the in-flight level)."""
    parts: set[Part] = set()
    for (record, _), outcome in zip(items, outcomes, strict=True):
        if outcome is Outcome.DUPLICATE or outcome is Outcome.IGNORED:
            continue
        if type(record) is RequestDecided or type(record) is RequestCompleted:
            if record.entitlement is None:
                continue
            parts.add(("w", record.entitlement))
            parts.add(("c", record.entitlement, record.proxy_id))
    return parts


# ---- the header ---------------------------------------------------------------------------------------------------

def _header(state: PoolState, partition: int, group: int, gone: list[Part]) -> bytes:
    return orjson.dumps({
        "v": STATE_VERSION, "group": group, "partition": partition, "pool": state.pool, "width_ms": state.width_ms,
        "closed_through": state.closed_through, "mean_slo_ms": state.mean_slo_ms, "last_version": state.last_version,
        "metrics": [[p.t_ms, p.replicas_ready, p.waiting] for p in state.metrics],
        "offsets": dict(sorted(state.offsets.items())), "window_fields": list(_WINDOW_FIELDS),
        "bucket_fields": list(_BUCKET_FIELDS), "gone": [list(p) for p in gone]})


# ---- what the processor keeps: the state and where its parts are ---------------------------------------------------

@dataclass(frozen=True, slots=True)
class Stored:
    """A pool's state as stored: ``group`` is its last write group (0: none), ``slots`` part → (the slot of its
    newest value, whether the other slot holds an older one), ``stale`` the table keys to delete before the next
    header (values of an unfinished group, or of a state not usable)."""

    state: PoolState
    partition: int | None
    group: int = 0
    slots: Mapping[Part, tuple[int, bool]] = field(default_factory=dict)
    stale: tuple[bytes, ...] = ()


def group_writes(before: Stored, state: PoolState, partition: int,
                 parts: Iterable[Part] | None = None) -> tuple[list[tuple[bytes, bytes | None]], Stored]:
    """The writes that take the table from ``before`` to ``state``, in order, and what is stored then.

    ``parts``: the parts that may have changed (a batch's ``touched``); None: any (a tick). Each changed part goes
    to its free slot, stamped with the new group; then the header; then the tombstones of the parts gone. Stale
    keys are deleted first (before the header that would otherwise adopt them)."""
    group = before.group + 1
    pool = state.pool
    if parts is None:
        old, new = payloads(before.state), payloads(state)
        changed = {p: v for p, v in new.items() if old.get(p) != v}
        changed.update({p: None for p in old if p not in new})
    else:
        changed = {}
        for part in parts:
            value = payload(state, part)
            if value != payload(before.state, part):
                changed[part] = value
    slots = dict(before.slots)
    writes: list[tuple[bytes, bytes | None]] = []
    puts: list[tuple[bytes, bytes | None]] = []
    gone: list[Part] = []
    for part, value in sorted(changed.items()):
        held = slots.get(part)
        if value is None:
            if held is not None:
                gone.append(part)
            continue
        slot = 0 if held is None else 1 - held[0]
        puts.append((part_key(pool, part, slot), orjson.dumps([group, value])))
        slots[part] = (slot, held is not None)  # it had a value in the other slot
    written = {key for key, _ in puts}
    writes += [(key, None) for key in before.stale if key not in written]
    writes += puts
    writes.append((table_key(pool), _header(state, partition, group, gone)))
    for part in gone:
        slot, both = slots.pop(part)
        writes.append((part_key(pool, part, slot), None))
        if both:
            writes.append((part_key(pool, part, 1 - slot), None))
    return writes, Stored(state, partition, group, slots)


# ---- restore -------------------------------------------------------------------------------------------------------

def restore(pool: str, entries: Iterable[tuple[bytes, bytes]], width_ms: int) -> tuple[Stored, str]:
    """The pool's state from its table entries (header and parts, any order), and why a stored state was not
    usable ("" when it was, or when there was none): then the state is new and every entry is stale."""
    header: bytes | None = None
    parts: list[tuple[bytes, Part, int, int, Any]] = []
    stale: list[bytes] = []
    newest = 0
    why = ""
    for key, value in entries:
        owner = owner_of_key(key)
        if owner is None or owner[0] != pool:
            continue
        if owner[1] != STATE_VERSION:
            stale.append(key)
            why = f"state version {owner[1]}, expected {STATE_VERSION}"
            continue
        if key == table_key(pool):
            header = value
            continue
        try:
            part, slot = _parse_part_key(key)
            group, data = orjson.loads(value)
        except (ValueError, TypeError) as exc:
            stale.append(key)
            why = why or f"malformed part {key!r}: {exc!r}"
            continue
        newest = max(newest, int(group))
        parts.append((key, part, slot, int(group), data))
    fresh = Stored(PoolState(pool=pool, width_ms=width_ms), None)
    if header is None:
        return _afresh(fresh, stale + [key for key, *_ in parts], newest), why
    try:
        data = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        return _afresh(fresh, stale + [key for key, *_ in parts], newest), f"not JSON: {exc}"
    if not isinstance(data, dict) or data.get("v") != STATE_VERSION:
        found = data.get("v") if isinstance(data, dict) else None
        return (_afresh(fresh, stale + [key for key, *_ in parts], newest),
                f"state version {found!r}, expected {STATE_VERSION}")
    try:
        stored, late = _assemble(pool, data, parts)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        return _afresh(fresh, stale + [key for key, *_ in parts], newest), f"malformed state: {exc!r}"
    if stored.state.width_ms != width_ms:
        return (_afresh(fresh, stale + [key for key, *_ in parts], max(newest, stored.group)),
                f"window width {stored.state.width_ms} ms, now {width_ms} ms")
    return Stored(stored.state, stored.partition, stored.group, stored.slots, tuple(stale + late)), why


def _afresh(fresh: Stored, stale: list[bytes], newest: int) -> Stored:
    """A new state whose first group is numbered above every stale value's (so none of them is ever adopted)."""
    return Stored(fresh.state, None, newest, {}, tuple(stale))


def _assemble(pool: str, header: dict[str, Any], parts: list[tuple[bytes, Part, int, int, Any]]
              ) -> tuple[Stored, list[bytes]]:
    group = int(header["group"])
    gone = {tuple(p) for p in header["gone"]}
    chosen: dict[Part, tuple[int, int, Any]] = {}  # part → (group, slot, value)
    present: dict[Part, int] = {}
    stale: list[bytes] = []
    for key, part, slot, stamp, value in parts:
        if stamp > group or part in gone:
            stale.append(key)
            continue
        present[part] = present.get(part, 0) + 1
        if part not in chosen or stamp > chosen[part][0]:
            chosen[part] = (stamp, slot, value)
    width_ms = int(header["width_ms"])
    window_fields, bucket_fields = header["window_fields"], header["bucket_fields"]
    windows: dict[str, WindowState] = {}
    attempts: dict[int, dict[str, dict[str, int]]] = {}
    deltas: dict[int, dict[str, dict[str, int]]] = {}
    level: dict[str, dict[str, int]] = {}
    granted: dict[str, dict[str, int]] = {}
    signals: dict[str, Signals] = {}
    pool_granted: dict[str, int] = {}
    for part, (_, _, value) in sorted(chosen.items()):
        kind = part[0]
        if kind == "w":
            windows[part[1]] = _window_from(value, width_ms, window_fields, bucket_fields)
        elif kind == "c":
            entitlement, proxy = part[1], part[2]
            for i, n in value[0]:
                attempts.setdefault(int(i), {}).setdefault(entitlement, {})[proxy] = int(n)
            for i, n in value[1]:
                deltas.setdefault(int(i), {}).setdefault(entitlement, {})[proxy] = int(n)
            if value[2] is not None:
                level.setdefault(entitlement, {})[proxy] = int(value[2])
        elif kind == "g":
            granted[part[1]] = {p: int(n) for p, n in value.items()}
        elif kind == "t":
            signals = {e: Signals(float(b), float(d)) for e, b, d in value[0]}
            pool_granted = {p: int(n) for p, n in value[1].items()}
    state = PoolState(
        pool=header["pool"], width_ms=width_ms, closed_through=header["closed_through"], windows=windows,
        attempts=_in_order(attempts), signals=signals, mean_slo_ms=header["mean_slo_ms"],
        last_version=header["last_version"],
        metrics=tuple(MetricsPoint(int(t), r, w) for t, r, w in header["metrics"]),
        offsets=dict(header["offsets"]), in_flight=level, in_flight_deltas=_in_order(deltas), granted=granted,
        pool_granted=pool_granted)
    if state.pool != pool:
        raise ValueError(f"header of pool {state.pool!r} under {pool!r}")
    slots = {part: (slot, present[part] > 1) for part, (_, slot, _) in chosen.items()}
    return Stored(state, int(header["partition"]), group, slots), stale


def _in_order(rows: dict[int, dict[str, dict[str, int]]]) -> dict[int, dict[str, dict[str, int]]]:
    return {i: {e: dict(sorted(p.items())) for e, p in sorted(rows[i].items())} for i in sorted(rows)}


def entries_of(pool: str, items: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The table entries (any version) of one pool."""
    return [(k, v) for k, v in items if (owner := owner_of_key(k)) is not None and owner[0] == pool]


def read(pool: str, items: Iterable[tuple[bytes, bytes]], width_ms: int) -> tuple[Stored, str]:
    """``restore`` of one pool from a whole table's items (tests, tools)."""
    return restore(pool, entries_of(pool, items), width_ms)


# ---- the whole state as one value (tests and benchmarks compare states by it) --------------------------------------

def to_dict(state: PoolState) -> dict[str, Any]:
    """Every field of ``state``, in key order: two states are equal when their dicts are."""
    return {
        "pool": state.pool, "width_ms": state.width_ms, "closed_through": state.closed_through,
        "windows": {name: _window(w) for name, w in sorted(state.windows.items())},
        "attempts": [[i, {e: dict(sorted(p.items())) for e, p in sorted(a.items())}]
                     for i, a in sorted(state.attempts.items())],
        "signals": {name: [s.burst, s.debt] for name, s in sorted(state.signals.items())},
        "mean_slo_ms": state.mean_slo_ms, "last_version": state.last_version,
        "metrics": [[p.t_ms, p.replicas_ready, p.waiting] for p in state.metrics],
        "offsets": dict(sorted(state.offsets.items())),
        "in_flight": {e: dict(sorted(p.items())) for e, p in sorted(state.in_flight.items())},
        "in_flight_deltas": [[i, {e: dict(sorted(p.items())) for e, p in sorted(d.items())}]
                             for i, d in sorted(state.in_flight_deltas.items())],
        "granted": {e: dict(sorted(g.items())) for e, g in sorted(state.granted.items())},
        "pool_granted": dict(sorted(state.pool_granted.items())),
    }
