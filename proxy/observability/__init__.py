"""What the proxy records and renders: its Prometheus metrics (and the GenAI names) and the lean histogram. It reads
nothing of admission: the views over the live state are ``proxy.views``.
"""
