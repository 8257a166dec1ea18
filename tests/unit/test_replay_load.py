"""Open-loop load: seeded, per-entitlement independent, rates from slots, lengths within bounds."""

from __future__ import annotations

from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.load import Lengths, LoadSpec, SplitLengths, poisson_arrivals, rate_for_slots, service_time_s

L64 = Lengths(64, 64)


def test_rate_is_slots_over_the_full_load_service_time() -> None:
    model = ReplicaModel()
    assert abs(service_time_s(model, 64, 64) - (64 * 0.0668 + 16 * 64 * 0.000125)) < 1e-9
    assert abs(rate_for_slots(6, model, L64, L64) - 6 / service_time_s(model, 64, 64)) < 1e-12


def test_arrivals_are_seeded_and_independent_per_entitlement() -> None:
    a = LoadSpec("a", 2.0, L64, L64)
    b = LoadSpec("b", 3.0, L64, L64, start_s=10.0, end_s=20.0)
    both = poisson_arrivals([a, b], 60.0, seed=1)
    assert both == poisson_arrivals([a, b], 60.0, seed=1)
    assert [x for x in both if x.entitlement == "a"] == poisson_arrivals([a], 60.0, seed=1)
    assert all(10.0 <= x.t_s < 20.0 for x in both if x.entitlement == "b")
    assert poisson_arrivals([a], 60.0, seed=2) != poisson_arrivals([a], 60.0, seed=1)
    n = sum(1 for x in poisson_arrivals([a], 2000.0, seed=3))
    assert 3600 < n < 4400  # Poisson(4000)
    assert all(x.t_s == round(x.t_s, 3) for x in both)  # a millisecond grid: a log reproduces them exactly


def test_split_lengths_stay_within_the_total_range() -> None:
    split = SplitLengths(Lengths(32, 176))
    spec = LoadSpec("a", 5.0, split.prompt, split.output, split)
    arrivals = poisson_arrivals([spec], 200.0, seed=4)
    assert all(32 <= x.prompt_tokens + x.output_tokens <= 176 for x in arrivals)
    assert all(abs(x.prompt_tokens - x.output_tokens) <= 1 for x in arrivals)
    assert split.prompt.mean + split.output.mean == 104


def test_a_closed_loop_client_sends_the_same_requests_whatever_the_order_they_are_asked_in() -> None:
    """Each client has its own seeded stream: client 1's requests do not depend on how many client 0 sent."""
    import itertools

    from tokenpools.replay.load import ClosedLoad, closed_requests

    load = ClosedLoad("a", 2, Lengths(10, 20), Lengths(5, 9), stagger_s=0.5, start_s=1.0)
    first = list(itertools.islice(closed_requests(load, 7, 1), 5))
    list(itertools.islice(closed_requests(load, 7, 0), 50))
    assert list(itertools.islice(closed_requests(load, 7, 1), 5)) == first
    assert first != list(itertools.islice(closed_requests(load, 8, 1), 5))
    assert all(10 <= p <= 20 and 5 <= o <= 9 for _, p, o in first)
    assert [rid for rid, _, _ in first][:2] == ["a-c001-000000", "a-c001-000001"]
    assert load.client_start_s(1) == 1.5
