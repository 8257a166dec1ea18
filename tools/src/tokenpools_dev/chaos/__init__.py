"""The chaos run (``benchmarks/chaos.py``): a seeded schedule of faults against the real local stack under closed-loop
load, then a checker of the history it leaves.

``schedule`` (pure: the faults as a function of the seed), ``checker`` (pure: the history → the figures and the
findings), ``scenario`` (pure: the config and the clients), ``runner`` (starts the stack, sends the load, injects the
faults, records the topics and builds the history).
"""
