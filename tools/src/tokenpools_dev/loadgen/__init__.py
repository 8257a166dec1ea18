"""The load generator: the experiments' open-loop schedule sent through the proxies with the openai client.

``plan`` (pure: request shapes, records, summaries), ``keys`` (which API key a client uses), ``client`` (the sender),
``cli`` (``tokenpools load``).
"""
