"""Controllers: where tokenpools touches the platform (Prometheus in, Kubernetes out).

Pure modules (decisions, no I/O): ``promql`` (queries and answers → BackendMetricsSample), ``reconcile``
(custom resources → verdicts: valid, Bound/Degraded/Expired/Pending), ``status`` (status documents),
``scaler_policy`` (scale command → replicas, with bounds, floor, stabilisation and cooldown).
Shells: ``metrics_loop``, ``entitlements_loop`` + ``crd_watch``, ``scaler_loop``, ``kube``, ``publisher``, wired
by ``app`` and run by ``main`` under ``supervisor``. This package imports neither ``proxy`` nor ``streams``.
"""
