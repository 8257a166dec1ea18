"""One seeded trace through the exact enforcer and through distribution designs, as rows to compare.

What ``tokenpools fleet`` prints and ``benchmarks/fleet.py`` runs over its grid, in one place:

- ``policies_with`` adds a ``counts`` variant per growth fraction f to ``POLICIES`` (named by ``variant_name``);
- ``grid`` lists the runs (P × balancer × design, in that nesting), ``exact`` runs the reference and
  ``design_runs`` each design, lazily, so a caller can time each run: nothing here reads a clock. The trace and the
  balancer both draw from ``random.Random(seed)``, so a row is what ``model.run`` gives for its config and seed;
- ``Row`` is one run's figures and its refusal ratio to the exact enforcer; ``document`` turns a comparison into
  plain JSON values (``tokenpools fleet --json`` prints it, the benchmark adds its timings to it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenpools.replay.fleet.metrics import FleetFigures, refusal_ratio
from tokenpools.replay.fleet.model import FleetConfig, run
from tokenpools.replay.fleet.policies import POLICIES, Counts, DistributionPolicy
from tokenpools.replay.fleet.trace import Trace, TraceConfig, generate

EXACT = "exact"


def designs(policies: Mapping[str, DistributionPolicy] = POLICIES) -> list[str]:
    """The distribution designs a comparison can run: every policy but the central reference."""
    return [name for name, policy in policies.items() if not policy.central]


def variant_name(growth_fraction: float) -> str:
    """The name of ``counts`` with growth fraction f: ``counts_f<f>``."""
    return f"counts_f{growth_fraction:g}"


def policies_with(growth_fractions: Iterable[float]) -> dict[str, DistributionPolicy]:
    """``POLICIES`` plus a ``counts`` variant per growth fraction (``Counts`` rejects f < 1)."""
    policies: dict[str, DistributionPolicy] = dict(POLICIES)
    for f in growth_fractions:
        policies[variant_name(f)] = Counts(name=variant_name(f), growth_fraction=f)
    return policies


def trace_for(config: TraceConfig, seed: int) -> Trace:
    return generate(config, random.Random(seed))


def grid(proxies: Iterable[int], balancers: Iterable[str], design_names: Iterable[str], tick_s: float = 1.0,
         counts_interval_s: float = 0.1) -> list[FleetConfig]:
    """One config per (P, balancer, design), P outermost."""
    balancers, design_names = list(balancers), list(design_names)
    return [FleetConfig(proxies=p, policy=design, balancer=balancer, tick_s=tick_s,
                        counts_interval_s=counts_interval_s)
            for p in proxies for balancer in balancers for design in design_names]


def exact(trace: Trace, seed: int) -> FleetFigures:
    """The reference: one controller with the fleet limits sees every request (balancer and P do not matter)."""
    return run(trace, FleetConfig(proxies=1, policy=EXACT), random.Random(seed)).figures


@dataclass(frozen=True, slots=True)
class Row:
    """One design's run: its config, figures, refusals ÷ the exact enforcer's, and the last update a proxy read."""

    config: FleetConfig
    figures: FleetFigures
    ratio: float
    last_update: bytes | None

    @property
    def proxies(self) -> int:
        return self.config.proxies

    @property
    def balancer(self) -> str:
        return self.config.balancer

    @property
    def design(self) -> str:
        return self.config.policy

    def summary(self) -> dict[str, Any]:
        """The row as plain JSON values (an infinite ratio, when only the design refuses, is null)."""
        return {"proxies": self.proxies, "balancer": self.balancer, "design": self.design,
                "tick_s": self.config.tick_s, "counts_interval_s": self.config.counts_interval_s,
                **self.figures.summary(), "refusal_ratio": finite(self.ratio)}


def design_runs(trace: Trace, configs: Iterable[FleetConfig], seed: int, exact_figures: FleetFigures,
                policies: Mapping[str, DistributionPolicy] = POLICIES) -> Iterator[Row]:
    """Each config's run on ``trace``, its balancer seeded with ``seed``; one at a time, when asked for."""
    for config in configs:
        result = run(trace, config, random.Random(seed), policies)
        yield Row(config, result.figures, refusal_ratio(result.figures, exact_figures), result.last_update)


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def document(trace_config: TraceConfig, trace: Trace, seed: int, exact_figures: FleetFigures,
             rows: Sequence[Row]) -> dict[str, Any]:
    """The comparison as plain JSON values: the trace, the exact enforcer's figures, then each design's row."""
    return {
        "trace": {"entitlements": trace_config.entitlements, "duration_s": trace_config.duration_s,
                  "load": trace_config.load, "seed": seed, "requests": len(trace.requests)},
        "exact": exact_figures.summary(),
        "runs": [row.summary() for row in rows],
    }
