"""Offline replay: record the event topics, replay them (or the paper's experiments) through the core in event time.

- ``trace``: the log format (hour-partitioned Parquet per record type, schema-checked); ``recorder``: topics → log;
- ``backend_sim`` / ``backend_model``: the discrete-event vLLM replica model the replayer uses as the backend
  (its mechanics in ``backend_sim_core``, pool level, and ``backend_sim_batching``, per replica);
- ``scenario``, ``load``: what one run is (pool, entitlements, membership, open-loop load, parameters);
- ``policy`` (token pools: the core's AdmissionController, windows and control_tick) and ``baseline`` (no admission
  control, and the ``POLICIES`` registry); ``replayer``: the deterministic event loop;
- ``experiments``: the paper's Exp 1 and Exp 2; ``metrics``, ``results``, ``plots``, ``report``, ``texts``: outputs;
- ``logio``, ``log_replay``: replay as a log and logs as replays; ``sweep``: parameter grids; ``runner``: end to end;
- ``cli`` (record, replay, experiment) and ``demo`` (``tokenpools demo``): the command handlers.
"""
