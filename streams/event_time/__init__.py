"""How far event time has come: a partition's processing horizon and the proxies' watermarks, which together close
windows.
"""
