"""The runtime layer every component stands on: the clock, the Kafka clients, the specs follower, dead letters,
retry pacing and the scanner of OpenAI streams (the proxy forwards them, the calibration measures them).

It exists so that infrastructure is written once: a component (proxy, agents, controllers, replay recorder) builds
its Kafka clients, reads time, follows the specs topic and dead-letters records only through these modules, and so
cannot drift from the others. Runtime imports the contract (``tokenpools.topics``), the configuration and the
core, never a component. Import the modules themselves (``tokenpools.runtime.kafka``); nothing is re-exported here,
so importing one does not pay for the others' dependencies.
"""
