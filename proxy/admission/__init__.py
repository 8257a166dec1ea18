"""The request path and its decisions: the body, the estimate, the pools' admission controllers, the waiting queues,
the retry identity, budgets, this proxy's own ledger, and the answers a refusal gets.
"""
