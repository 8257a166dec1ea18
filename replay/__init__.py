"""Offline replay: record the event topics, replay them (or the paper's experiments) through the core in event time.

- ``trace``: the log format (hour-partitioned Parquet per record type, schema-checked); ``recorder``: topics → log;
- ``backend``: the backends the replayer runs requests on: the discrete-event vLLM replica model (``backend.simulator``,
  calibrated by ``backend.model``) and a log's recorded service times (``backend.recorded``);
- ``scenario``, ``load``: what one run is (pool, entitlements, membership, open-loop load or closed-loop clients,
  parameters);
- ``policy`` (token pools: the core's AdmissionController and its admission queue, windows and the agents' pool_tick) and
  ``baseline`` (no admission control, and the ``POLICIES`` registry); ``replayer``: the deterministic event loop;
- ``experiments``: the paper's Exp 1 and Exp 2; ``metrics``, ``results``, ``plots``, ``report``, ``texts``: outputs;
- ``logio``, ``log_replay``: replay as a log and logs as replays; ``sweep``: parameter grids; ``runner``: end to end;
- ``usage`` (usage rows, their aggregation and reconciliation), ``usage_sources`` (a log, the usage topic) and
  ``usage_cli`` (``tokenpools usage``): the ledger's reader;
- ``cli`` (record, replay, experiment) and ``demo`` (``tokenpools demo``): the command handlers.
"""
