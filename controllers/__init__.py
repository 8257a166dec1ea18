"""Controllers: where tokenpools touches the platform (Prometheus in, Kubernetes out).

Pure modules (decisions, no I/O): ``promql`` (queries, answers parsed), ``reading`` (answers → a pool's reading:
vLLM's series when fresh, else the proxies' view, and the BackendMetricsSample it publishes), ``reconcile``
(custom resources → verdicts: valid, Bound/Degraded/Expired/Pending), ``status`` (status documents),
``scaler_policy`` (scale command → replicas, with bounds, floor, stabilisation and cooldown), ``lease`` (leader
election: what to write to the Lease, and whether this replica leads), ``api_keys`` (keys held in Secrets → the
digests the specs topic carries).
Shells: ``metrics_loop``, ``entitlements_loop`` + ``crd_watch``, ``scaler_loop``, ``kube``, ``secrets``, ``publisher``, wired
by ``app`` and run by ``main`` under ``supervisor``, on the replica that holds the Lease (``leader``; ``metrics``
serves ``/healthz`` and ``/metrics``). README.md says how the replicas elect a leader and how API keys in Secrets are read.
This package imports neither ``proxy`` nor ``streams``.
"""
