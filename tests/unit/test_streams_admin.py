"""The agents' start-up check of existing topics: fewer partitions than declared is refused, naming each topic."""

from __future__ import annotations

from tokenpools.streams.admin import Shortfall, refusal, shortfalls
from tokenpools.topics.declarations import topics_for

TOPICS = topics_for("t.", partitions=32)


def test_topics_with_fewer_partitions_than_declared_are_the_shortfalls() -> None:
    counts = {t.name: t.partitions for t in TOPICS.all()}
    assert shortfalls(TOPICS, counts) == []
    counts.update({"t.requests": 4, "t.limits": 64, "t.counts": 0})  # 0: not known yet, not a shortfall
    del counts["t.scale"]  # absent: not known either
    assert shortfalls(TOPICS, counts) == [Shortfall("t.requests", 4, 32)]
    assert shortfalls(topics_for("t.", partitions=1), {"t.requests": 4, "t.specs": 1}) == []


def test_the_refusal_names_each_topic_and_both_ways_out() -> None:
    text = refusal([Shortfall("t.requests", 4, 32), Shortfall("t.completions", 8, 32)])
    assert text.startswith("2 existing topic(s) have fewer partitions than declared: t.requests has 4, wants 32, "
                           "t.completions has 8, wants 32.")
    assert "set kafka.topic_partitions to 4 to keep the topics as they are" in text
    assert "topics/README.md, section Partitions" in text
