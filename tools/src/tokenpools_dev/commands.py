"""The rows tokenpools-dev adds to the product's command line, named by its entry points (tools/pyproject.toml).

``tokenpools up``/``down`` (the local stack, ``devstack.cli``), ``tokenpools load`` (``loadgen.cli``) in the group
``tokenpools.commands``, and ``tokenpools experiment NAME --mode live`` (``live.cli``) in
``tokenpools.experiment_modes``. The product loads this module to list them; it imports only
``tokenpools.commands``, so ``tokenpools --help`` stays as light with the tooling installed as without it.
"""

from __future__ import annotations

from tokenpools.commands import Command

UP = Command("up", "tokenpools_dev.devstack.cli:up", "start the local stack: Kafka, simulators, Prometheus, "
             "kube-apiserver, agents, controller, proxies", arguments="tokenpools_dev.devstack.cli:add_up_arguments")
DOWN = Command("down", "tokenpools_dev.devstack.cli:down", "stop the local stack `tokenpools up` started",
               arguments="tokenpools_dev.devstack.cli:add_down_arguments")
LOAD = Command("load", "tokenpools_dev.loadgen.cli:load", "send an experiment's load (or a steady one) through the "
               "proxies, open or closed loop", arguments="tokenpools_dev.loadgen.cli:add_load_arguments")
LIVE = Command("live", "tokenpools_dev.live.cli:experiment_live", "against a local stack of real services "
               "(tokenpools up's), with the load generator", arguments="tokenpools_dev.live.cli:add_live_arguments")
