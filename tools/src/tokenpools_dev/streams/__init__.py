"""The stream agents' test and benchmark support.

``scripted`` (scripted event streams and the reference computation the agents must match), ``harness`` (Kafka
side: produce a script, collect what the agents publish, run the worker as a subprocess), ``bench`` (the
pipeline benchmark's producer, counters and profiles).
"""
