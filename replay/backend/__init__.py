"""The replayer's backends: what the pool's vLLM replicas would have done with the admitted requests.

- ``simulator``: ``BackendSim``, the deterministic discrete-event model of a pool of replicas (its module docstring
  documents the model); ``batching``: its continuous batching on each replica; ``state``: its internal records
  and their invariants; ``records``: the events and snapshots it returns;
- ``model``: ``ReplicaModel``, the calibration of one replica;
- ``recorded``: ``RecordedBackend``, a log's own service times in the simulator's place (``replay.backend=recorded``).
"""
