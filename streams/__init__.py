"""The stream agents: event bus → per-entitlement usage, burst, debt and priority → limit updates and scale intent.

Pure: ``pool_state`` (the per-pool algebra over the core), ``capacity``, ``state`` (serialisation), ``params``,
``progress.horizon``. Shells: ``processor`` (batches and ticks, no Faust), ``app`` (the Faust app factory),
``readers`` (specs and heartbeats), ``admin`` (topics), ``deadletter``, ``metrics``, ``main`` (the CLI entry).
"""
