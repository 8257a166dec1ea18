"""``--mode live``: the paper's experiments on the real local stack (``devstack``), with the load generator.

``runner`` (stack + passes), ``control`` (the scenario's timeline), ``observe`` (topics, Prometheus), ``assemble``
(a pass as a ``ReplayResult``), ``report`` (results.json, figures, report.md), ``cli`` (the ``--mode live`` handler).
"""
