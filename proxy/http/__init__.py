"""The proxy's HTTP/1.1 server: connections parsed by httptools, the parsed requests and the responses, and what one
client may take. It knows nothing of admission: the handlers it calls are given to it (``proxy.app``).
"""
