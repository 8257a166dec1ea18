"""What the proxy shows of its live state: the scrape-time gauges and the read API (``GET /v1/tokenpools/limits``)."""
