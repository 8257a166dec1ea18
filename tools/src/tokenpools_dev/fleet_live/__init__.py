"""The live fleet run: one seeded schedule of many small guaranteed entitlements, sent through 1 and then N proxy
replicas of a real local stack behind a random balancer, and the refusals of each run side by side.

``scenario`` (pure: the config and the schedule as functions of the scenario and its seed), ``figures`` (pure: what a
run refused, and the comparison), ``runner`` (starts a stack per proxy count and sends the schedule).
``benchmarks/fleet_live.py`` prints the table; ``tests/integration/test_live_fleet.py`` asserts on it.
"""
