"""The pure policy core of token pools.

Everything in this package is a function of its arguments: no I/O, no clock, no Kafka, HTTP or Kubernetes
imports (an import-linter contract in pyproject.toml enforces it). Time always arrives as an argument
(``now_s``). The proxy, the stream agents and the offline replayer all run these same functions, which is what
makes a replay of a recorded log reproduce the live decisions.
"""
