"""What the proxy follows from Kafka or a file: limit updates and fleet counts, budget records, and the live specs.
"""
