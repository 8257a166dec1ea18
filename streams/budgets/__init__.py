"""Budgets and usage in the agents: each entitlement's ledger (pure), its shell over a batch's completions and the
budget records, and the tenant-budget alerts.
"""
