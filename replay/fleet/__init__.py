"""A deterministic model of limit enforcement across a fleet of proxies (docs/fleet.md).

It measures a distribution design (how fleet-wide limits become per-proxy shares) against one exact enforcer on
the same trace:

- ``trace``: entitlements with static fleet-wide limits and their open-loop Poisson requests, from a seed;
- ``balancers``: which proxy a request reaches (``random``, ``round_robin``, ``key_affinity``; ``BALANCERS``);
- ``policies``: the distribution designs (``exact``, the reference; ``shares``, per-proxy shares; ``counts``, fleet counts
  with bounded growth, the rules the live proxies run, in ``tokenpools.core.fleet``; ``POLICIES``), and ``wire``:
  the record a proxy reads per update under ``shares`` (``counts``' is the live ``topics.counts.CountsRecord``);
- ``model``: the event-time loop over P real ``AdmissionController``s (ticks, counts instants, updates);
  ``metrics``: refusals, false refusals, overshoot and update cost, judged against the fleet-wide truth;
- ``compare``: the exact enforcer and each design on one seeded trace, as rows; ``table``: those rows as text;
  ``cli``: ``tokenpools fleet``, one fleet (P, balancer) compared. ``benchmarks/fleet.py`` runs ``compare`` over
  a grid of P and balancers, timed, and judges the targets;
- ``budget``: a long-window budget enforced by P proxies from the agents' published ledger (with the proxies'
  reservations in flight on it, by the core's rule: ``tokenpools.core.budget_reservations``), its overshoot and the
  bounds on it (docs/budgets.md#the-overshoot-measured; ``benchmarks/fleet_budget.py`` prints the table).
"""
