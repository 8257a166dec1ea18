"""The replayer reserves with the proxy's output estimate, fed with the completions in event time
(docs/reservations.md): Exp 2's clients send no max_tokens, so once it has learned, admitted requests reserve less
than n_in + the pool default; with ``policy.reservation_quantile=1`` every reservation is n_in + max_tokens."""

from __future__ import annotations

from tokenpools.replay.experiments import build
from tokenpools.replay.logio import completed_frame, decided_frame
from tokenpools.replay.replayer import replay


def test_exp2_reserves_the_estimate_and_the_log_says_so() -> None:
    result = replay(build("exp2", ["load.compress=0.3"]), "token-pools")
    d = result.decisions
    caps = [p + m for p, m in zip(d.prompt_tokens, d.max_tokens)]
    assert all(p <= c <= cap for p, c, cap in zip(d.prompt_tokens, d.cost_tokens, caps))
    admitted = [(c, cap) for c, cap, o in zip(d.cost_tokens, caps, d.outcome) if o == "admitted"]
    assert admitted[0][0] == admitted[0][1]  # nothing learned yet: the cap
    lower = sum(1 for c, cap in admitted if c < cap)
    assert lower > len(admitted) / 2  # most reserve the learned estimate, not the 176-token default
    decided = decided_frame(result)
    assert decided["cost_tokens"].to_list() == d.cost_tokens
    completed = completed_frame(result)
    assert (completed["reserved_tokens"] <= completed["kv_bytes"] // result.scenario.pool.kv_bytes_per_token).all()


def test_quantile_one_reserves_max_tokens() -> None:
    result = replay(build("exp2", ["load.compress=0.3", "policy.reservation_quantile=1"]), "token-pools")
    d = result.decisions
    assert d.cost_tokens == [p + m for p, m in zip(d.prompt_tokens, d.max_tokens)]
