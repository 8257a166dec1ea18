"""Who may call what: API keys held as digests, the tenancy they map to, and the persistent map the views are
swapped whole with.
"""
