"""The fleet counts (docs/fleet.md): each pool's counts in event time, the timer that publishes them, and the hold-back
of a moving per-proxy split.
"""
