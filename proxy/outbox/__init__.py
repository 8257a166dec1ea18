"""Events out to Kafka without the request path ever waiting: the queue and producer loop, the spool, the packing of
events into records, the watermarks and the heartbeat.
"""
