"""``tokenpools agents --config FILE``: the stream agents worker (a Faust app run in-process) until SIGINT/SIGTERM.

Settings come from the config file's TokenPoolsSettings document, ``TOKENPOOLS_*`` env and ``--set`` (groups
``streams``, ``kafka``, ``policy``, ``scaling``). Missing topics are created as declared by ``tokenpools.topics``
(pool-keyed ones with ``kafka.topic_partitions``) before the worker starts, and existing ones with fewer partitions
refused (``streams.admin``); the state table takes the source topics' partition count. The file may hold settings
only: the agents follow the specs topic (``runtime.specs``) and start with no pools until it brings them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
from typing import Any

from tokenpools.argtypes import positive
from tokenpools.errors import PermanentError, RetryableError

log = logging.getLogger("tokenpools.streams")

MEMBERSHIP_HISTORY_MS = 600_000  # ten minutes of spec changes: a window closed later than this ticks with today's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="YAML file: settings, and the TokenPool/TokenEntitlement documents to start from (with "
                             "Kafka, settings only will do: the specs topic brings the pools)")
    # --http-port/--http-host as the controller's (one job, one name); --metrics-port/--metrics-host, the former
    # names, are still accepted
    parser.add_argument("--http-port", "--metrics-port", dest="http_port", type=int, default=9102,
                        help="listen port of /metrics, 0 for a free one, -1 for none (default 9102; --metrics-port: "
                             "its former name)")
    parser.add_argument("--http-host", "--metrics-host", dest="http_host", default="127.0.0.1",
                        help="listen address of /metrics (default 127.0.0.1; --metrics-host: its former name)")
    parser.add_argument("--fast-join", action="store_true",
                        help="short consumer-group timeouts (rebalance 2 s, session 6 s): tests and benchmarks")
    parser.add_argument("--batch-max", type=positive(int), default=5000, help="records per agent batch (default 5000)")


async def serve(args: argparse.Namespace, loaded: Any, settings: Any) -> int:
    from tokenpools.runtime.backoff import Backoff, Retries
    from tokenpools.runtime.kafka import KafkaClients
    from tokenpools.runtime.specs import Catalogue
    from tokenpools.streams.admin import ensure_topics
    from tokenpools.streams.app import AgentsOptions, build_agents
    from tokenpools.streams.budgets.ledger import params_from_settings
    from tokenpools.streams.table.params import from_settings
    from tokenpools.topics.shards import too_many_shards

    kafka = KafkaClients(settings.kafka)
    topics = kafka.topics()
    await kafka.require_access("agents")  # a refused login or TLS stops here; an outage is retried below
    retries = Retries(Backoff(initial_s=1.0, max_s=15.0))
    while True:
        try:
            partitions = await ensure_topics(kafka, topics, client="agents-admin")
            break
        except RetryableError as exc:
            delay_s = retries.failed(exc.delay_s)
            log.warning("%s; retrying in %.1f s", exc, delay_s)
            await asyncio.sleep(delay_s)
    if problems := too_many_shards(((p.name, p.shards) for p in loaded.pools.values()), partitions):
        raise PermanentError("; ".join(problems))
    options = AgentsOptions(
        streams=settings.streams, partitions=partitions, batch_max=args.batch_max, fast_join=args.fast_join,
        metrics_host=args.http_host, metrics_port=None if args.http_port < 0 else args.http_port,
        ledger=params_from_settings(settings.budgets))
    # membership history: a window may be ticked this late (a lagging worker, a takeover) and still see its own
    catalogue = Catalogue.from_loaded(loaded, history_ms=MEMBERSHIP_HISTORY_MS)
    agents = build_agents(from_settings(settings), topics, catalogue, options, kafka)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await agents.app.start()
    gc.freeze()  # start-up objects never need collecting: shorter, rarer collections on the hot path
    gc.set_threshold(50_000, 20, 20)  # batches allocate ~10^4 short-lived objects: collect per batch, not per 700
    log.info("agents %s started: pools %s, %d partitions, tick %.1f s, grace %.1f s", options.streams.app_id,
             ", ".join(agents.catalogue.pools), partitions, settings.streams.tick_s, settings.streams.grace_s)
    crashed = asyncio.ensure_future(agents.app.wait_until_stopped())
    try:
        await asyncio.wait([asyncio.ensure_future(stop.wait()), crashed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        log.info("agents %s stopping", options.streams.app_id)
        await agents.app.stop()
    return 2 if agents.app.crash_reason is not None else 0  # exit codes: 2, stopped on its environment (never 1)


def run(args: argparse.Namespace) -> int:
    from tokenpools.config import SpecsSource, load_config, load_settings

    loaded = load_config(args.config, SpecsSource.TOPIC)  # the agents always follow the specs topic
    settings = load_settings(loaded.settings_values, getattr(args, "overrides", []))
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(args, loaded, settings))
    return uvloop.run(serve(args, loaded, settings))
