"""``tokenpools top``: a live terminal view of every pool's limits, the reference subscriber to the limits topic.

``model`` folds the records of the limits, effective-limits and usage topics into rows (pure, no Kafka, no clock),
``view`` draws the rows as rich tables, and ``app`` is the thin shell: the command's arguments, the Kafka consumer
and the screen.
"""
