"""PoolState ⇄ the Faust table: per pool a snapshot, and a journal of what each batch changed since it.

The table (its changelog is what a restarted worker restores) holds, per pool, state version 2:

- the **snapshot** ``v2/<pool>``: the whole ``PoolState``, the Kafka partition of the pool's events (the timer,
  which runs outside any stream event, writes the changelog to it, so recovery finds it with the pool's events),
  and the number of the write *group* it was written in;
- **journal entries** ``v2/<pool>␟<group>`` (␟ is the byte 0x1f), one per batch since the snapshot: what the batch
  changed, as new values: the source offsets and backend-metrics samples, the buckets of the usage windows its
  events fell in (``core.windows``), and the *cells* of the (entitlement, proxy) pairs it counted: that proxy's
  attempts and in-flight deltas per open window and its in-flight level (and a shard's late floor,
  ``streams.shard_windows``), and the re-send streams its decisions and completions were numbered in (``seen``,
  ``pool_state.resend_stream``: the numbers seen of each) and those cells' reservation sums (``reserved``). A shard's outbox (the summaries of its last close) changes only at a close, a tick:
  it is in the snapshot, with the close that made it.

Why this cut: a batch changes the offsets, the buckets its events fall in, the cells of the pairs they came
through and the streams of their identities; nothing else (signals, grants, closed windows are the tick's). Those changes are small (~70 bytes an
event at E = 400, P = 200) but spread over most entitlements (500 events touch ~280 of 400), so a key per
entitlement window or per cell pays a key, a stamp and a record per change: measured, a batch wrote 20 % of the
one-value layout's bytes that way, a tick 3.8x (it rewrites nearly every window and cell, and deletes the emptied
cells), a restore took 19x. One entry per batch pays that once: 9.3 % (``benchmarks/state_writes.py``). A tick changes most of the state (every window closes, the
signals move, the window's cells go), so it writes the snapshot, then deletes the entries it covers (tombstones:
value None, which Faust's memory store takes as a delete on restore). A batch also writes a snapshot, instead of an
entry, when the entries since the last one would outweigh it, so the table holds at most about twice a snapshot
and a restore reads at most that.

Crashes: a worker stops anywhere in its sequence of writes; the changelog (one partition per pool, written in
order) keeps a prefix of it. Each group is one record (plus deletes of records it makes obsolete), so the restored
table holds the snapshot of some group g and the entries g + 1, g + 2, ... up to the last group that reached the
changelog: applied in order they give exactly the state after that group. Entries at or before the snapshot's
group, or after a gap, are ignored and deleted at the pool's next write, before anything that could make them
count. Events after the restored offsets are read again and folded as if the crash had not happened (the fold
skips what the offsets hold): no event lost, none counted twice; a tick lost with its snapshot is redone by the
next tick over the same windows. The streams seen travel with the offsets, in the same group: a restored state
recognises a re-send exactly as the crashed worker would have (a tick forgets old streams: it writes a snapshot).

Values are JSON (orjson); floats survive the round trip exactly, and restored maps are in key order, as the agents
build them. A worker that finds a value of another state version (``v1/<pool>``: one value holding the whole
state) or one computed with another window width starts that pool afresh and says why (``restore``); the old keys
are deleted at the pool's next write.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import orjson

from tokenpools.core import resends
from tokenpools.core.tick import Signals
from tokenpools.core.windows import Bucket, WindowState
from tokenpools.streams.capacity import MetricsPoint
from tokenpools.streams.table.pool_state import Outcome, PoolState, Position
from tokenpools.topics.codec import decode, encode
from tokenpools.topics.records import Record, RequestCompleted, RequestDecided, WindowSummary

STATE_VERSION = 2
_PREFIX = f"v{STATE_VERSION}/".encode()
_SEP = b"\x1f"
_VERSIONED = re.compile(rb"v(\d+)/")


# ---- keys ------------------------------------------------------------------------------------------------------

def table_key(pool: str) -> bytes:
    """The pool's snapshot key."""
    return _PREFIX + pool.encode()


def entry_key(pool: str, group: int) -> bytes:
    """The key of the pool's journal entry of write group ``group``."""
    return table_key(pool) + _SEP + b"%d" % group


def pool_of_key(key: bytes | str) -> str | None:
    """The pool a snapshot key is for; None for a journal entry's key or a key of another state version."""
    raw = key.encode() if isinstance(key, str) else key
    return raw[len(_PREFIX):].decode() if raw.startswith(_PREFIX) and _SEP not in raw else None


def owner_of_key(key: bytes) -> tuple[str, int] | None:
    """(pool, state version) of any state key (snapshot or entry, this version or another); None: not one."""
    found = _VERSIONED.match(key)
    if found is None:
        return None
    return key[found.end():].split(_SEP, 1)[0].decode(), int(found.group(1))


# ---- the snapshot: the whole state ----------------------------------------------------------------------------

_BUCKET_FIELDS = tuple(f.name for f in fields(Bucket))
_WINDOW_FIELDS = tuple(f.name for f in fields(WindowState) if f.name not in ("width_ms", "buckets"))


def _window(w: WindowState) -> dict[str, Any]:
    """Fields by name, buckets as value lists in ``bucket_fields`` order (recorded once per state)."""
    out: dict[str, Any] = {name: getattr(w, name) for name in _WINDOW_FIELDS}
    out["buckets"] = [[i, [getattr(b, n) for n in _BUCKET_FIELDS]] for i, b in sorted(w.buckets.items())]
    return out


def _window_from(data: dict[str, Any], width_ms: int, bucket_fields: list[str]) -> WindowState:
    known = {n: data[n] for n in _WINDOW_FIELDS if n in data}
    buckets = {int(i): _bucket(values, bucket_fields) for i, values in data["buckets"]}
    return WindowState(width_ms=width_ms, buckets=buckets, **known)


def _bucket(values: list[Any], bucket_fields: list[str]) -> Bucket:
    return Bucket(**{n: v for n, v in zip(bucket_fields, values) if n in _BUCKET_FIELDS})


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
    """Every field of ``state``, maps in key order (the snapshot's ``state``; equal states give equal dicts)."""
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
        "metrics": _metrics(state.metrics),
        "offsets": dict(sorted(state.offsets.items())),
        "in_flight": {e: dict(sorted(p.items())) for e, p in sorted(state.in_flight.items())},
        "in_flight_deltas": [[i, {e: dict(sorted(p.items())) for e, p in sorted(d.items())}]
                             for i, d in sorted(state.in_flight_deltas.items())],
        "granted": _maps_by_key(state.granted),
        "pool_granted": _by_key(state.pool_granted),
        **({"late_floor": {e: dict(sorted(p.items())) for e, p in sorted(state.late_floor.items())}}
           if state.late_floor else {}),
        **({"outbox": [orjson.loads(encode(s)) for s in state.outbox]} if state.outbox else {}),
        **({"seen": {k: resends.encode_seen(v) for k, v in sorted(state.seen.items())}} if state.seen else {}),
        **({"reserved": {e: dict(sorted(p.items())) for e, p in sorted(state.reserved.items())}}
           if state.reserved else {}),
    }


def _metrics(points: Iterable[MetricsPoint]) -> list[list[Any]]:
    return [[p.t_ms, p.replicas_ready, p.waiting] for p in points]


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
        late_floor={e: {p: int(n) for p, n in c.items()} for e, c in data.get("late_floor", {}).items()},
        outbox=tuple(decode(WindowSummary, orjson.dumps(s)) for s in data.get("outbox", ())),
        seen={k: resends.decode_seen(v) for k, v in data.get("seen", {}).items()},
        reserved={e: {p: int(n) for p, n in c.items()} for e, c in data.get("reserved", {}).items()},
    )


# ---- a journal entry: what a batch changed ---------------------------------------------------------------------

Cell = tuple[str, str]  # (entitlement, proxy)


def touched(items: Iterable[tuple[Record, Position | None]], outcomes: Iterable[Outcome]) -> set[Cell]:
    """The cells a batch's fold (and ``track_in_flight``) may have changed: those of its usage events that counted
    (applied, or late: a late one moves the in-flight level)."""
    cells: set[Cell] = set()
    for (record, _), outcome in zip(items, outcomes, strict=True):
        if outcome is Outcome.DUPLICATE or outcome is Outcome.IGNORED:
            continue
        if (type(record) is RequestDecided or type(record) is RequestCompleted) and record.entitlement is not None:
            cells.add((record.entitlement, record.proxy_id))
    return cells


def _cell(state: PoolState, entitlement: str, proxy: str) -> list[Any] | None:
    """A cell's attempts and in-flight deltas per window, its in-flight level and (a shard's) late floor; None: the
    state has none."""
    attempts = [[i, n] for i, a in sorted(state.attempts.items())
                if (n := a.get(entitlement, {}).get(proxy)) is not None]
    deltas = [[i, n] for i, d in sorted(state.in_flight_deltas.items())
              if (n := d.get(entitlement, {}).get(proxy)) is not None]
    level = state.in_flight.get(entitlement, {}).get(proxy)
    floor = state.late_floor.get(entitlement, {}).get(proxy)
    if attempts or deltas or level is not None or floor is not None:
        return [attempts, deltas, level, floor]
    return None


def _same(a: object, b: object) -> bool:
    return a is b or a == b


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


def _entry(before: PoolState, state: PoolState, cells: set[Cell]) -> dict[str, Any] | None:
    """What changed from ``before`` to ``state``, where a batch changes things: the offsets and metrics, the
    windows' buckets (and scalars, when they moved) and ``cells``. None when anything else changed (a snapshot
    is written then).

    Compact, as it is written per batch: per entitlement ``[scalars or None, buckets, cells]``, a cell
    ``[attempts, deltas]`` (+ ``[level]`` when it has one, + ``[level or None, floor]`` when a shard's late floor
    has one), each a flat ``[i, n, i, n, ...]``; window indices are
    counted from ``base``, the last ticked window. The re-send streams that changed go under ``seen``, new values
    (``core.resends.encode_seen``); the key is absent when none did, so a batch without identities writes what it
    always wrote. The cells' reservation sums that changed go under ``reserved`` (None: the cell has none now). A stream gone (only a tick forgets one) takes a snapshot."""
    if not (before.pool == state.pool and before.width_ms == state.width_ms
            and before.closed_through == state.closed_through and before.mean_slo_ms == state.mean_slo_ms
            and before.last_version == state.last_version and _same(before.signals, state.signals)
            and _same(before.granted, state.granted) and _same(before.pool_granted, state.pool_granted)
            and _same(before.outbox, state.outbox)):
        return None
    if any(e not in state.windows for e in before.windows) or any(k not in state.seen for k in before.seen):
        return None
    base = state.closed_through or 0
    changes: dict[str, list[Any]] = {}
    for name, window in state.windows.items():
        old = before.windows.get(name)
        if window is old:
            continue
        scalars = [getattr(window, n) for n in _WINDOW_FIELDS]
        if old is not None and any(i not in window.buckets for i in old.buckets):
            return None
        buckets = [[i - base, [getattr(b, n) for n in _BUCKET_FIELDS]] for i, b in sorted(window.buckets.items())
                   if old is None or old.buckets.get(i) != b]
        moved = old is None or scalars != [getattr(old, n) for n in _WINDOW_FIELDS]
        if buckets or moved:
            changes[name] = [scalars if moved else None, buckets, {}]
    for entitlement, proxy in sorted(cells):
        cell = _cell(state, entitlement, proxy)
        packed = None
        if cell is not None:
            attempts, deltas, level, floor = cell
            packed = [[x for i, n in attempts for x in (i - base, n)], [x for i, n in deltas for x in (i - base, n)]]
            if level is not None or floor is not None:
                packed.append(level)
            if floor is not None:
                packed.append(floor)
        changes.setdefault(entitlement, [None, [], {}])[2][proxy] = packed
    # every stream is compared (an identity check, unless it moved), only the changed ones sorted: a pool holds one
    # per (entitlement, proxy process, kind), the few a batch touched are what the entry writes
    moved = [(k, v) for k, v in state.seen.items() if not _same(before.seen.get(k), v)]
    seen = {k: resends.encode_seen(v) for k, v in sorted(moved, key=_first)}
    reserved: dict[str, dict[str, int | None]] = {}
    for entitlement, proxy in sorted(cells):
        now = state.reserved.get(entitlement, {}).get(proxy)
        if now != before.reserved.get(entitlement, {}).get(proxy):
            reserved.setdefault(entitlement, {})[proxy] = now
    return {"base": base, "offsets": dict(sorted(state.offsets.items())), "metrics": _metrics(state.metrics),
            "changes": dict(sorted(changes.items())), **({"seen": seen} if seen else {}),
            **({"reserved": reserved} if reserved else {})}


class _Unpacked:
    """A snapshot's state as plain dicts, for entries to be applied to in place."""

    def __init__(self, state: PoolState) -> None:
        self.state = state
        self.windows = dict(state.windows)
        self.attempts = {i: {e: dict(p) for e, p in a.items()} for i, a in state.attempts.items()}
        self.deltas = {i: {e: dict(p) for e, p in d.items()} for i, d in state.in_flight_deltas.items()}
        self.level = {e: dict(p) for e, p in state.in_flight.items()}
        self.floor = {e: dict(p) for e, p in state.late_floor.items()}
        self.offsets = dict(state.offsets)
        self.metrics = state.metrics
        self.seen = dict(state.seen)
        self.reserved = {e: dict(p) for e, p in state.reserved.items()}

    def apply(self, entry: dict[str, Any], bucket_fields: list[str]) -> None:
        base = int(entry["base"])
        self.offsets = dict(entry["offsets"])
        self.metrics = tuple(MetricsPoint(int(t), r, w) for t, r, w in entry["metrics"])
        for name, (scalars, buckets, cells) in entry["changes"].items():
            if scalars is not None or buckets:
                self._window(name, scalars, [(base + int(i), values) for i, values in buckets], bucket_fields)
            for proxy, cell in cells.items():
                self._cell(name, proxy, cell, base)
        for stream, seen in entry.get("seen", {}).items():
            self.seen[stream] = resends.decode_seen(seen)
        for entitlement, per_proxy in entry.get("reserved", {}).items():
            into = self.reserved.setdefault(entitlement, {})
            for proxy, n in per_proxy.items():
                if n is None:
                    into.pop(proxy, None)
                else:
                    into[proxy] = int(n)
            if not into:
                del self.reserved[entitlement]

    def _window(self, name: str, scalars: list[Any] | None, buckets: list[tuple[int, list[Any]]],
                bucket_fields: list[str]) -> None:
        old = self.windows.get(name)
        if scalars is None:
            if old is None:
                raise ValueError(f"window {name!r} changed but never stored")
            base = old
        else:
            base = WindowState(width_ms=self.state.width_ms, buckets=old.buckets if old else {},
                               **dict(zip(_WINDOW_FIELDS, scalars)))
        merged = dict(base.buckets)
        merged.update((i, _bucket(values, bucket_fields)) for i, values in buckets)
        self.windows[name] = replace(base, buckets=merged)

    def _cell(self, entitlement: str, proxy: str, cell: list[Any] | None, base: int) -> None:
        """The cell replaced whole: its old values out of every map, the new ones in."""
        for rows in (self.attempts, self.deltas):
            for i in list(rows):
                row = rows[i].get(entitlement)
                if row is not None and row.pop(proxy, None) is not None and not row:
                    del rows[i][entitlement]
                    if not rows[i]:
                        del rows[i]
        for levels in (self.level, self.floor):
            level = levels.get(entitlement)
            if level is not None and level.pop(proxy, None) is not None and not level:
                del levels[entitlement]
        if cell is None:
            return
        for rows, flat in ((self.attempts, cell[0]), (self.deltas, cell[1])):
            for k in range(0, len(flat), 2):
                rows.setdefault(base + int(flat[k]), {}).setdefault(entitlement, {})[proxy] = int(flat[k + 1])
        if len(cell) > 2 and cell[2] is not None:
            self.level.setdefault(entitlement, {})[proxy] = int(cell[2])
        if len(cell) > 3:
            self.floor.setdefault(entitlement, {})[proxy] = int(cell[3])

    def packed(self) -> PoolState:
        """The state, its maps in key order (as a snapshot restores them)."""
        def rows(by_window: dict[int, dict[str, dict[str, int]]]) -> dict[int, dict[str, dict[str, int]]]:
            return {i: {e: dict(sorted(p.items())) for e, p in sorted(by_window[i].items())}
                    for i in sorted(by_window)}

        return replace(self.state, windows=dict(sorted(self.windows.items())), attempts=rows(self.attempts),
                       in_flight_deltas=rows(self.deltas),
                       in_flight={e: dict(sorted(p.items())) for e, p in sorted(self.level.items())},
                       late_floor={e: dict(sorted(p.items())) for e, p in sorted(self.floor.items())},
                       offsets=self.offsets, metrics=self.metrics, seen=dict(sorted(self.seen.items())),
                       reserved={e: dict(sorted(p.items())) for e, p in sorted(self.reserved.items())})


# ---- write groups and restore ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Stored:
    """A pool's state as the table holds it: ``group`` is its last write group (0: none), ``entries`` the groups
    of the journal entries since the snapshot, ``stale`` table keys to delete at the next write (entries no
    restore may apply, keys of another state version)."""

    state: PoolState
    partition: int | None
    group: int = 0
    entries: tuple[int, ...] = ()
    journal_bytes: int = 0
    snapshot_bytes: int = 0
    stale: tuple[bytes, ...] = ()


def group_writes(before: Stored, state: PoolState, partition: int,
                 cells: set[Cell] | None = None) -> tuple[list[tuple[bytes, bytes | None]], Stored]:
    """The writes that take the table from ``before`` to ``state`` (one group), in order, and what it holds then.

    ``cells``: a batch's ``touched`` (None: a tick). The stale keys are deleted first; then a journal entry, or a
    snapshot followed by the deletes of the entries it covers: the snapshot for a tick, for a pool without one, for
    a change an entry does not carry, or when the entries would outweigh the snapshot."""
    group, pool = before.group + 1, state.pool
    entry = entry_key(pool, group)
    writes: list[tuple[bytes, bytes | None]] = [(key, None) for key in before.stale if key != entry]
    if cells is not None and before.snapshot_bytes:
        changes = _entry(before.state, state, cells)
        if changes is not None:
            value = orjson.dumps({"v": STATE_VERSION, "group": group, "partition": partition, **changes})
            if before.journal_bytes + len(value) <= before.snapshot_bytes:
                writes.append((entry, value))
                return writes, Stored(state, partition, group, (*before.entries, group),
                                      before.journal_bytes + len(value), before.snapshot_bytes)
    value = orjson.dumps({"v": STATE_VERSION, "group": group, "partition": partition, "state": to_dict(state)})
    writes.append((table_key(pool), value))
    writes += [(entry_key(pool, g), None) for g in before.entries]
    return writes, Stored(state, partition, group, (), 0, len(value))


def restore(pool: str, items: Iterable[tuple[bytes, bytes]], width_ms: int) -> tuple[Stored, str]:
    """The pool's state from its table entries (any order; others' are passed over), and why a stored state was
    not usable ("" when it was, or when there was none): then the state is new and every key of it is stale."""
    snapshot: bytes | None = None
    journal: dict[int, tuple[bytes, bytes]] = {}
    stale: list[bytes] = []
    why = ""
    for key, value in items:
        owner = owner_of_key(key)
        if owner is None or owner[0] != pool:
            continue
        if owner[1] != STATE_VERSION:
            stale.append(key)
            why = f"state version {owner[1]}, expected {STATE_VERSION}"
        elif key == table_key(pool):
            snapshot = value
        else:
            try:
                journal[int(key.split(_SEP, 1)[1])] = (key, value)
            except ValueError:
                stale.append(key)
    everything = stale + [key for key, _ in journal.values()]
    fresh = Stored(PoolState(pool=pool, width_ms=width_ms), None, stale=tuple(everything))
    if snapshot is None:
        return fresh, why
    try:
        data = orjson.loads(snapshot)
    except orjson.JSONDecodeError as exc:
        return fresh, f"not JSON: {exc}"
    if not isinstance(data, dict) or data.get("v") != STATE_VERSION:
        return fresh, f"state version {data.get('v') if isinstance(data, dict) else None!r}, expected {STATE_VERSION}"
    try:
        state, group, partition = from_dict(data["state"]), int(data["group"]), int(data["partition"])
        bucket_fields = data["state"]["bucket_fields"]
    except (KeyError, TypeError, ValueError) as exc:
        return fresh, f"malformed state: {exc!r}"
    if state.width_ms != width_ms:
        return fresh, f"window width {state.width_ms} ms, now {width_ms} ms"
    unpacked, applied, size = _Unpacked(state), [], 0
    while (found := journal.get(group + 1)) is not None:
        try:
            entry = orjson.loads(found[1])
            unpacked.apply(entry, bucket_fields)
            partition = int(entry["partition"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            why = f"journal entry {group + 1} not usable ({exc!r}): restored through group {group}"
            break
        group += 1
        applied.append(group)
        size += len(found[1])
    stale += [key for g, (key, _) in journal.items() if g not in applied]
    state = unpacked.packed() if applied else state
    return Stored(state, partition, group, tuple(applied), size, len(snapshot), tuple(stale)), why


def entries_of(pool: str, items: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The table entries (any state version) of one pool."""
    return [(k, v) for k, v in items if (owner := owner_of_key(k)) is not None and owner[0] == pool]


def read(pool: str, items: Iterable[tuple[bytes, bytes]], width_ms: int) -> tuple[Stored, str]:
    """``restore`` of one pool from a whole table's items (tests, tools)."""
    return restore(pool, entries_of(pool, items), width_ms)
