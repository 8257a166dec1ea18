"""The fleet's reservations in flight on the budget records (docs/budgets.md#the-others-reservations-in-flight): pure.

A budget record counts the completions before its ``through_ms``. A request another proxy admitted before then and
had not completed by then is in no record, and no proxy but its own counts it: with requests of seconds that is
most of what a fleet overspends. The agents read every admission and completion, so they know it: per entitlement
and proxy they keep the tokens reserved by requests admitted and not completed (``reserve``: + an admission's
``cost_tokens``, − a completion's ``reserved_tokens``, in event time), and each budget record carries those levels
at its ``through_ms``. A proxy adds the *other* proxies' levels to its own spending (``pending_units``), and for
itself keeps what it knows exactly: its completions since ``through_ms`` and its reservations now.

The agents (``streams.fleet_counts``, ``streams.ledger``), the proxy (``proxy.budgets``) and the fleet model
(``replay.fleet.budget``) run these functions, so the benchmark measures the product's rule.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tokenpools.core.budgets import Weights


def reserve(levels: dict[str, int], proxy: str, delta_tokens: int) -> None:
    """One event of ``proxy`` into the per-proxy ``levels``, in place (the agents apply it per event, on a hot path):
    an admission (``delta_tokens`` its reservation, > 0) or a completion (− its reservation). A level never goes
    below 0 (a completion of a request admitted before the levels started, e.g. before a worker took the partition
    over) and a proxy at 0 is not kept."""
    level = levels.get(proxy, 0) + delta_tokens
    if level > 0:
        levels[proxy] = level
    else:
        levels.pop(proxy, None)


def reserved_units(tokens: int, weights: Weights) -> float:
    """What ``tokens`` reserved in flight cost at most in a budget's units. A record carries reserved tokens, not
    their split between the prompt and the output estimate, so they are priced at the higher of the two weights:
    never less than the reservations' ``request_units`` (the check errs towards refusing), and exact when the two
    weights are equal (a budget in tokens)."""
    return tokens * max(weights.prompt, weights.completion)


def others_reserved_tokens(levels: Mapping[str, int], proxy_id: str) -> int:
    """The tokens the *other* proxies had reserved in flight at the record's ``through_ms``; ``proxy_id``'s own
    level is left out: the proxy counts its own reservations as it holds them now."""
    return sum(n for p, n in levels.items() if p != proxy_id)


def pending_units(own_units: float, levels: Mapping[str, int], proxy_id: str, weights: Weights) -> float:
    """What a proxy adds to a record's published spending before the check (``core.budgets.admits``): its own
    spending the record does not include (``own_units``: its completions at or after ``through_ms`` and its
    reservations now) and the other proxies' reservations in flight at ``through_ms`` (``levels``, the record's)."""
    others = reserved_units(others_reserved_tokens(levels, proxy_id), weights)
    return math.fsum((own_units, others))
