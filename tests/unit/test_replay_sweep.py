"""Sweeps: a cartesian grid, one row per point, parameters applied."""

from __future__ import annotations

import pytest

from tokenpools.replay.experiments import build
from tokenpools.replay.sweep import markdown, parse_grid, points, run_sweep


def test_grid_parsing_and_points() -> None:
    grid = parse_grid(["streams.tick_s=2,5,10", "policy.gamma_debt=0.5,0.7"])
    assert grid == {"streams.tick_s": ["2", "5", "10"], "policy.gamma_debt": ["0.5", "0.7"]}
    assert len(points(grid)) == 6 and points(grid)[1] == {"streams.tick_s": "2", "policy.gamma_debt": "0.7"}
    with pytest.raises(ValueError, match="KEY=V1,V2"):
        parse_grid(["streams.tick_s"])
    with pytest.raises(ValueError, match="twice"):
        parse_grid(["a.b=1", "a.b=2"])


def test_one_row_per_grid_point_with_the_parameters_applied() -> None:
    seen = []

    def builder(items: list[str]):
        scenario = build("exp1", [*items, "load.compress=0.2"])
        seen.append((scenario.params.tick_s, scenario.retry.max_retries))
        return scenario

    df = run_sweep(builder, {"streams.tick_s": ["2", "5"], "load.max_retries": ["0", "3"]},
                   lambda runs: {"decisions": len(runs["token-pools"].decisions.t_s)})
    assert df.height == 4 and df.columns == ["streams.tick_s", "load.max_retries", "decisions"]
    assert seen == [(2.0, 0), (2.0, 3), (5.0, 0), (5.0, 3)]
    assert markdown(df).count("\n") == 6
