"""The admission proxy: an OpenAI-compatible reverse proxy that decides locally, streams through, and reports
every decision and completion to Kafka without ever waiting on it.

Layout (each module small, one concern):

- ``app``: the composition root (``build_app``, ``listening``) — builds every object below and wires them;
- ``server`` + ``messages``: the HTTP/1.1 server (asyncio.Protocol + httptools) and its request/response types;
- ``handlers``: the request path (auth → parse → admit → forward → settle → events);
- ``auth``, ``body``, ``estimate``, ``sse``, ``responses``: pure helpers of the request path;
- ``forward``: the upstream calls (streaming pass-through and plain JSON); ``upstream``: the backend client;
- ``pools``: per-pool admission state and limits in force (version rule, TTL fallback), time as an argument;
- ``events`` + ``spool``: the bounded event queue, the Kafka producer loop and the on-disk spool;
- ``limits_consumer``, ``heartbeat``: background tasks talking to Kafka;
- ``metrics``: a per-app Prometheus registry fed from plain counters;
- ``main``: ``tokenpools proxy`` (argument parsing and the event loop).
"""
