"""The pools' state in the agents: the pure algebra over one pool's aggregate state (events in, ticks out), its batch
fast path and parameters, and how it is kept in the Faust table (snapshot plus journal).
"""
