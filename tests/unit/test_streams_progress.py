"""``Progress.contiguous``: the agent folds a source partition's records without a hole in their offsets.

After a takeover Faust's consumer handed the agent offset 30 of a partition, then 39 on: the records between were
never read, their events missing from the pool's state for good (the takeover test saw a moved pool's KV limit
differ from the uninterrupted run's). The records from a hole on wait and the partition is read again from it.
"""

from __future__ import annotations

from typing import NamedTuple

from tokenpools.streams.event_time.progress import MAX_REWINDS, Progress


class Rec(NamedTuple):
    topic: str
    partition: int
    offset: int


def _note(progress: Progress, records: list[Rec]) -> None:
    for r in records:
        progress.note(r.topic, r.partition, r.offset, None)


def test_records_after_a_hole_wait_and_the_partition_is_read_again_from_the_first_missing_offset() -> None:
    progress = Progress()
    first = [Rec("req", 3, 29), Rec("req", 3, 30), Rec("cmp", 3, 7)]
    kept, rewind, accepted = progress.contiguous(first)  # the first records since the assignment: as they come
    assert (kept, rewind, accepted) == (first, {}, {})
    _note(progress, kept)
    batch = [Rec("req", 3, 39), Rec("cmp", 3, 8), Rec("req", 3, 40), Rec("cmp", 3, 9)]
    kept, rewind, accepted = progress.contiguous(batch)
    assert kept == [Rec("cmp", 3, 8), Rec("cmp", 3, 9)] and rewind == {("req", 3): 31} and accepted == {}
    _note(progress, kept)
    again = [Rec("req", 3, o) for o in range(31, 41)] + [Rec("cmp", 3, 9), Rec("cmp", 3, 10)]  # 9: read twice
    kept, rewind, accepted = progress.contiguous(again)
    assert kept == again and rewind == {} and accepted == {}


def test_a_hole_inside_a_batch_holds_back_the_rest_of_its_partition_only() -> None:
    progress = Progress()
    batch = [Rec("req", 1, 5), Rec("req", 1, 6), Rec("req", 1, 9), Rec("req", 2, 0), Rec("req", 1, 10),
             Rec("req", 2, 1)]
    kept, rewind, _ = progress.contiguous(batch)
    assert kept == [Rec("req", 1, 5), Rec("req", 1, 6), Rec("req", 2, 0), Rec("req", 2, 1)]
    assert rewind == {("req", 1): 7}


def test_a_hole_the_broker_keeps_is_accepted_after_the_re_reads_and_a_rebalance_starts_afresh() -> None:
    progress = Progress()
    _note(progress, [Rec("req", 0, 4)])
    for _ in range(MAX_REWINDS):  # the records were deleted (retention): every re-read starts at 12
        assert progress.contiguous([Rec("req", 0, 12)])[1] == {("req", 0): 5}
    kept, rewind, accepted = progress.contiguous([Rec("req", 0, 12)])
    assert kept == [Rec("req", 0, 12)] and rewind == {} and accepted == {("req", 0): 5}
    _note(progress, kept)
    progress.forget([("req", 0)])  # revoked: its next first record is taken as it comes
    assert progress.contiguous([Rec("req", 0, 40)]) == ([Rec("req", 0, 40)], {}, {})


def test_a_partitions_first_record_after_its_assignment_is_held_to_the_committed_offset() -> None:
    # the takeover test: the group had committed 77 of a completions partition (the worker before folded through
    # 76), the new owner's consumer handed it 78 first; 77 never came and its completion was missing for good
    progress = Progress()
    first = [Rec("cmp", 0, 78), Rec("req", 0, 83)]
    assert progress.unplaced(first) == [("cmp", 0), ("req", 0)]
    progress.start("cmp", 0, 77)
    progress.start("req", 0, 83)
    assert progress.unplaced(first) == []
    kept, rewind, accepted = progress.contiguous(first)
    assert kept == [Rec("req", 0, 83)] and rewind == {("cmp", 0): 77} and accepted == {}
    _note(progress, kept)
    again = [Rec("cmp", 0, 76), Rec("cmp", 0, 77), Rec("cmp", 0, 78)]  # at or below the commit: read again, kept
    assert progress.contiguous(again) == (again, {}, {})
    _note(progress, again)
    progress.forget([("cmp", 0)])  # revoked: where it starts is asked again at its next assignment
    assert progress.unplaced([Rec("cmp", 0, 90)]) == [("cmp", 0)]
    assert progress.contiguous([Rec("cmp", 0, 90)]) == ([Rec("cmp", 0, 90)], {}, {})  # no commit known: as it comes
