"""The whole local stack (``tokenpools up``): the real services and the control plane as subprocesses.

``lifecycle`` (``Stack``: start in dependency order, reconcile replicas, stop in reverse), ``pools`` (one pool's
simulator replicas behind its Service), ``components`` (the stack's processes and their error), ``probes``
(readiness checks that answer now), ``config`` (pure: what a stack runs, derived from a config file), ``state``
(the state file ``tokenpools down`` reads). Only ``lifecycle`` knows the ``Stack``; the others never import it.
"""
