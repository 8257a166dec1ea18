"""The paper's experiments as closed-loop clients (docs/load.md#open-and-closed-loop), and the ``load.mode`` item.

``experiment_clients`` takes an experiment's clients from the scenario ``replay.experiments`` builds with
``load.mode=closed`` (each entitlement's slots, its token lengths, its window, ``load.compress``): as many clients
as the slots the open loop's rate is derived from, so both models ask for the same share of the pool, one waiting
for its answers, the other not, and the live pass sends exactly what the simulation column replays. Exp 1:
guaranteed-a 6, spot-b 10, guaranteed-c 6 in [30 s, 60 s), 64/64 tokens. Exp 2: each elastic entitlement's
baseline slots (5), reports from its join at 210 s, lengths split from 32–176. An entitlement's clients start one
mean service time apart in all and think 0 s: the open loop's rates keep the slots busy, so do clients that send
again at once.

``load.mode=open|closed`` is a ``--set`` item here, as in the simulation's experiments; ``split_load_mode`` takes it
out before the rest reaches ``replay.experiments.build``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tokenpools.errors import ConfigError, PermanentError, override_problem
from tokenpools.replay.load import ClosedLoad
from tokenpools.replay.scenario import Scenario
from tokenpools_dev.loadgen.plan import LoadMode

MODE_KEY = "load.mode"


def split_load_mode(items: Sequence[str]) -> tuple[LoadMode, tuple[str, ...]]:
    """(the ``load.mode`` of ``--set`` items, default open; the other items). The last one given wins."""
    mode, rest = LoadMode.OPEN, []
    for item in items:
        key, _, value = item.partition("=")
        if key.strip() != MODE_KEY:
            rest.append(item)
            continue
        try:
            mode = LoadMode(value.strip())
        except ValueError:
            message = f"must be one of {', '.join(m.value for m in LoadMode)}, got {value.strip()!r}"
            raise ConfigError([override_problem(MODE_KEY, message)]) from None
    return mode, tuple(rest)


def experiment_clients(scenario: Scenario) -> tuple[ClosedLoad, ...]:
    """The closed-loop clients of ``scenario``, as ``replay.experiments`` defines them for the simulation (built with
    ``load.mode=closed``: ``closed_overrides``), so a live pass and its simulation column send the same load."""
    if not scenario.closed:
        raise PermanentError(f"experiment {scenario.name!r} was built open-loop: build it with {MODE_KEY}=closed "
                             "(closed_overrides) for its clients")
    return tuple(scenario.closed)


def closed_overrides(mode: LoadMode, overrides: Sequence[str]) -> tuple[str, ...]:
    """``overrides`` with the ``load.mode`` item the experiment is built with (``split_load_mode`` took it out)."""
    return (*overrides, f"{MODE_KEY}={mode.value}")


def with_clients(loads: Sequence[ClosedLoad], per_entitlement: int | None = None,
                 by_name: dict[str, int] | None = None, think_s: float | None = None,
                 stagger_s: float | None = None) -> tuple[ClosedLoad, ...]:
    """``loads`` with their numbers of clients (all, then by name) and timing replaced where given."""
    by_name = by_name or {}
    unknown = sorted(set(by_name) - {c.entitlement for c in loads})
    if unknown:
        raise PermanentError(f"--clients names {', '.join(unknown)}, not an entitlement of this load "
                             f"({', '.join(c.entitlement for c in loads)})")
    out = []
    for load in loads:
        changes: dict[str, object] = {}
        if per_entitlement:
            changes["clients"] = per_entitlement
        if load.entitlement in by_name:
            changes["clients"] = by_name[load.entitlement]
        if think_s is not None:
            changes["think_s"] = think_s
        if stagger_s is not None:
            changes["stagger_s"] = stagger_s
        try:
            out.append(replace(load, **changes))  # type: ignore[arg-type]
        except ValueError as exc:
            raise PermanentError(str(exc)) from None
    return tuple(out)


def describe(loads: Sequence[ClosedLoad]) -> str:
    """"22 clients (guaranteed-a 6, spot-b 10, guaranteed-c 6 in [30, 60) s)": a run's summary line. A window is
    shown where it is not the whole run's."""
    last = max((c.end_s for c in loads), default=0.0)
    parts = [f"{c.entitlement} {c.clients}" + (f" in [{c.start_s:g}, {c.end_s:g}) s" if c.start_s or c.end_s < last
                                                else "") for c in loads]
    return f"{sum(c.clients for c in loads)} clients ({', '.join(parts)})"
