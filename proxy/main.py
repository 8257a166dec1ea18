"""``tokenpools proxy --config FILE``: load the config, build the app, serve until SIGINT/SIGTERM.

Settings come from the config file's TokenPoolsSettings document, ``TOKENPOOLS_*`` env and ``--set`` (the
``proxy`` and ``kafka`` groups); ``--host``, ``--port``, ``--proxy-id`` and ``--no-kafka`` win over them and are
checked like them. Specs are live (docs/tenancy.md): with Kafka the proxy follows the specs topic from the file's
documents on, and the file may hold settings only (the proxy starts with no pools and is not ready until it has read
the topic); without Kafka it watches the file (``proxy.config_poll_interval_s``), which must then hold a pool. Kafka clients are the runtime's (``KafkaClients``), with the ``kafka`` group's security. uvloop
runs the event loop when it is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import time
from typing import TYPE_CHECKING, Any

from tokenpools.errors import ConfigError, ConfigProblem
from tokenpools.proxy.app import ProxyApp, build_app, listening
from tokenpools.proxy.inputs.live_specs import bind_states, tenancy_of
from tokenpools.proxy.options import ProxyConfig, ProxyOptions

if TYPE_CHECKING:
    from tokenpools.runtime.kafka import KafkaClients

log = logging.getLogger("tokenpools.proxy")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="YAML file: settings, and the TokenPool/TokenEntitlement documents to start from (with "
                             "Kafka, settings only will do: the specs topic brings the pools)")
    parser.add_argument("--host", help="listen address (default: proxy.host)")
    parser.add_argument("--port", type=int, help="listen port, 0 for a free one (default: proxy.port)")
    parser.add_argument("--proxy-id", help="this replica's id (default: proxy.proxy_id, else <hostname>-<pid>)")
    parser.add_argument("--no-kafka", action="store_true",
                        help="do not talk to Kafka: static limits, the policy run once with no measurement (no fair "
                             "share, debt or priority between entitlements; docs/guide.md step 1); events spooled")


def proxy_config(loaded: Any, settings: Any, now_s: float) -> ProxyConfig:
    """The proxy's view of a ``LoadedConfig``: states from the file, else from capacity admission (``bind``); a key
    digest maps to every entitlement listing it (one per pool, one tenant: docs/tenancy.md)."""
    try:
        config = ProxyConfig(
            pools=dict(loaded.pools), endpoints=dict(loaded.endpoints),
            entitlements=bind_states(loaded.pools, loaded.entitlements, now_s),
            key_digests=dict(loaded.entitlements_by_key_hash), constants=settings.policy.to_constants(),
            limit_config=settings.policy.to_limit_config(), reservation=settings.policy.to_reservation_config())
        tenancy_of(config, 0)  # a key the proxy could not route is refused at start, as a live change would be
        return config
    except ValueError as exc:  # what a proxy needs beyond a valid file (every pool it fronts has an endpoint)
        raise ConfigError([ConfigProblem(loaded.source, str(exc))]) from None


def proxy_options(settings: Any, args: argparse.Namespace) -> ProxyOptions:
    """The proxy group with the flags applied; the replica's id is the flag, else the setting, else <hostname>-<pid>."""
    proxy_id = args.proxy_id or settings.proxy.proxy_id or f"{socket.gethostname()}-{os.getpid()}"
    from pydantic import ValidationError

    from tokenpools.config import ProxySettings
    from tokenpools.config.problems import translate

    try:
        return ProxyOptions.from_settings(settings, proxy_id, host=args.host, port=args.port,
                                          kafka_enabled=False if args.no_kafka else None)
    except ValidationError as exc:
        problems = translate(exc, ProxySettings, by_alias=False, prefix=("proxy",))
        raise ConfigError([ConfigProblem("command line", message, path=".".join(str(p) for p in loc))
                           for loc, message in problems]) from None


async def serve(app: ProxyApp, options: ProxyOptions, kafka: KafkaClients | None = None) -> None:
    if kafka is not None:  # credentials that cannot work stop the proxy here; an unreachable cluster is spooled for
        await kafka.require_access("proxy")  # as any outage is
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with listening(app, options.settings.host, options.settings.port) as url:
        log.info("proxy %s listening on %s", options.proxy_id, url)
        gc.freeze()  # start-up objects never need collecting: shorter GC pauses on the request path
        gc.set_threshold(50_000, 20, 20)  # requests make few cycles: collect young objects less often (measured)
        await stop.wait()
        log.info("proxy %s stopping", options.proxy_id)


def run(args: argparse.Namespace) -> int:
    from tokenpools.config import SpecsSource, load_config, load_settings, require_pools
    from tokenpools.runtime.kafka import KafkaClients

    loaded = load_config(args.config, SpecsSource.TOPIC)  # whether it may: once the settings say where specs come from
    settings = load_settings(loaded.settings_values, getattr(args, "overrides", []))
    options = proxy_options(settings, args)
    require_pools(loaded, SpecsSource.TOPIC if options.settings.kafka_enabled else SpecsSource.FILE)
    kafka = KafkaClients(settings.kafka) if options.settings.kafka_enabled else None
    from pathlib import Path

    from tokenpools.runtime.specs import Catalogue

    app = build_app(proxy_config(loaded, settings, time.time()), options, kafka=kafka,
                    catalogue=Catalogue.from_loaded(loaded), watch=Path(args.config))
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(app, options, kafka))
    else:
        uvloop.run(serve(app, options, kafka))
    return 0
