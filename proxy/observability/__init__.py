"""What the proxy shows: its Prometheus metrics (and the GenAI names), the lean histogram, and the read API.
"""
