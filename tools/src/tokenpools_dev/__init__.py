"""Development tooling for tokenpools, installed beside the product (distribution ``tokenpools-dev``).

``devstack`` starts real services (Kafka, llm-d-inference-sim, Prometheus, etcd + kube-apiserver) and the whole
local stack; ``loadgen`` sends an experiment's load through the proxies; ``live`` runs the paper's experiments on
that stack; ``proxy`` and ``streams`` hold the test doubles, harnesses and benchmark tools of those components.
The product never imports this package.
"""
