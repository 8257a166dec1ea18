"""The agents count a shadow admission (docs/shadow.md) as what it is: an admitted, served request. A decided record
carrying ``would_refuse`` folds exactly as the same record without it, never as refused demand."""

from __future__ import annotations

from test_streams_pool_state import END_MS, EVENTS, PARAMS, VIEW, fold

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.streams.table import pool_state
from tokenpools.topics.codec import decode, encode
from tokenpools.topics.records import RequestDecided


def _shadowed(record: object) -> object:
    if isinstance(record, RequestDecided) and record.outcome is AdmissionOutcome.ADMITTED:
        return record.model_copy(update={"would_refuse": AdmissionOutcome.REFUSED_TOKEN_BUDGET})
    return record


def test_a_would_refuse_admission_folds_as_an_admission() -> None:
    shadowed = [(_shadowed(r), ts) for r, ts in EVENTS]
    assert sum(isinstance(r, RequestDecided) and r.would_refuse is not None for r, _ in shadowed) > 10
    assert pool_state.tick(fold(shadowed), VIEW, END_MS, PARAMS).updates == pool_state.tick(fold(EVENTS), VIEW, END_MS, PARAMS).updates


def test_the_field_round_trips_and_is_absent_when_unset() -> None:
    record = next(r for r, _ in EVENTS if isinstance(r, RequestDecided))
    assert b"would_refuse" not in encode(record)
    shadow = _shadowed(record)
    assert isinstance(shadow, RequestDecided)
    assert decode(RequestDecided, encode(shadow)).would_refuse is AdmissionOutcome.REFUSED_TOKEN_BUDGET
