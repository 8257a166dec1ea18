"""A sharded pool's two stages (docs/scaling.md#the-two-stage-topology): stage 1, a shard's events into window
summaries (``shard_windows``); stage 2, the shards' summaries into the pool's tick (``summaries``).
"""
