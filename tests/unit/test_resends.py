"""core.resends: each completion counted once whatever copies of it the broker holds, in whatever order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.resends import MAX_AHEAD, Seen, Sighting, decode_seen, encode_seen, forget, sight, stream_key


@st.composite
def deliveries(draw: st.DrawFn, max_n: int = 40) -> tuple[list[int], list[int]]:
    """A stream's completions 1..n with their token counts, and an interleaving of them in which each appears at
    least once (up to 3 copies), in any order."""
    n = draw(st.integers(1, max_n))
    tokens = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    copies = [s for s in range(1, n + 1) for _ in range(draw(st.integers(1, 3)))]
    return tokens, draw(st.permutations(copies))


def count(order: list[int], tokens: list[int], max_ahead: int) -> tuple[list[int], int]:
    seen: Seen | None = None
    counted: list[int] = []
    total = 0
    for sequence in order:
        seen, sighting = sight(seen, sequence, 1_000 + sequence, max_ahead)
        if sighting is Sighting.FIRST:
            counted.append(sequence)
            total += tokens[sequence - 1]
    return counted, total


@settings(max_examples=300)
@given(deliveries())
def test_each_completion_counted_once_and_totals_are_the_deduplicated_sum(case: tuple[list[int], list[int]]) -> None:
    """Invariant: any interleaving of duplicates of a sequence of completions, with no more numbers waiting above
    a gap than the bound → each counted exactly once, and the total is the sum of the distinct completions."""
    tokens, order = case
    counted, total = count(order, tokens, MAX_AHEAD)
    assert sorted(counted) == list(range(1, len(tokens) + 1))
    assert total == sum(tokens)


@settings(max_examples=300)
@given(deliveries(), st.integers(0, 5))
def test_never_counted_twice_even_beyond_the_bound(case: tuple[list[int], list[int]], max_ahead: int) -> None:
    """Invariant: whatever the bound, no completion counts twice; and the state never holds more than the bound."""
    tokens, order = case
    seen: Seen | None = None
    counted: list[int] = []
    for sequence in order:
        seen, sighting = sight(seen, sequence, 0, max_ahead)
        assert len(seen.ahead) <= max_ahead
        assert all(n > seen.through + 1 for n in seen.ahead)
        if sighting is Sighting.FIRST:
            counted.append(sequence)
    assert len(counted) == len(set(counted))


def test_a_gap_beyond_the_bound_is_given_up() -> None:
    seen, _ = sight(None, 1, 0, max_ahead=2)
    for n in (3, 4):
        seen, first = sight(seen, n, 0, max_ahead=2)
        assert first is Sighting.FIRST
    assert (seen.through, seen.ahead) == (1, frozenset({3, 4}))
    seen, _ = sight(seen, 6, 0, max_ahead=2)  # three waiting: the gap at 2 is given up, 3 and 4 close up
    assert (seen.through, seen.ahead) == (4, frozenset({6}))
    assert sight(seen, 2, 0, max_ahead=2)[1] is Sighting.AGAIN


def test_in_order_stream_keeps_nothing_ahead_and_newest_time() -> None:
    seen = None
    for n in range(1, 6):
        seen, first = sight(seen, n, 100 * n)
        assert first is Sighting.FIRST
    assert seen == Seen(5, frozenset(), 500)
    again, sighting = sight(seen, 3, 50)
    assert sighting is Sighting.AGAIN and again is seen


def test_forget_drops_streams_idle_before_the_cutoff() -> None:
    streams = {"a": Seen(3, frozenset(), 100), "b": Seen(1, frozenset({3}), 200)}
    assert forget(streams, 150) == {"b": streams["b"]}


def test_encoding_round_trips() -> None:
    seen = Seen(7, frozenset({9, 12}), 1_700_000_000_000)
    assert decode_seen(encode_seen(seen)) == seen


def test_identity_needs_both_fields() -> None:
    assert stream_key("p", 5, 1) == "p@5"
    assert stream_key("p", None, 1) is None and stream_key("p", 5, None) is None


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="`sequence` must be >= 1, got 0"):
        sight(None, 0, 0)
    with pytest.raises(ValueError, match="`max_ahead` must be >= 0, got -1"):
        sight(None, 1, 0, max_ahead=-1)
