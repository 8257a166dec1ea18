"""``tokenpools controller --config FILE [--kubeconfig PATH | --in-cluster | --no-kubernetes] [--dry-run]``.

Settings come from the config file's TokenPoolsSettings document, ``TOKENPOOLS_*`` env and ``--set`` (groups
``kafka``, ``prometheus``, ``kubernetes``, ``scaling``, ``controllers``, ``streams.metrics_staleness_s``); the
flags below win over the settings of the same names.

- With Kubernetes (the default; ``--kubeconfig`` or ``--in-cluster`` choose how to connect) the TokenPool and
  TokenEntitlement custom resources are the source; the config file supplies only settings (pools or entitlements
  in it are ignored, with a warning).
- ``--no-kubernetes``: the config file's documents are the source, reloaded when the file changes; the scaler
  only logs its decisions.

With Kubernetes several replicas may run: the one that holds the Lease (``controllers.lease_*``) runs the loops,
the others stand by (``leader``); ``--dry-run``, ``--no-kubernetes`` and ``controllers.leader_election=false``
act at once, without a Lease. ``--http-port`` serves ``/healthz`` (leader or standby) and ``/metrics``. SIGTERM
or SIGINT stops the loops, then releases the Lease, so a standby takes over at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tokenpools.controllers.app import ControllerOptions, build_controller
from tokenpools.controllers.kube import KubeMode, new_api_client
from tokenpools.controllers.leader import LeaderElector, LeaseStore, lead
from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.controllers.metrics import serve as serve_http
from tokenpools.controllers.promql import DEFAULT_SELECTOR
from tokenpools.controllers.supervisor import LoopState, LoopStatus, run_loops
from tokenpools.config.problems import translate
from tokenpools.config.settings import ControllersSettings
from tokenpools.errors import ConfigError, ConfigProblem
from tokenpools.runtime.clock import Clock, SystemClock

log = logging.getLogger("tokenpools.controllers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, type=Path, metavar="FILE",
                        help="YAML config: settings, and with --no-kubernetes the TokenPool/TokenEntitlement documents")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--kubeconfig", type=Path, metavar="PATH", help="kubeconfig file (default: kubernetes.kubeconfig, "
                      "else $KUBECONFIG or ~/.kube/config, else in-cluster)")
    mode.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    mode.add_argument("--no-kubernetes", action="store_true", help="no cluster: pools and entitlements from --config")
    parser.add_argument("--dry-run", action="store_true", help="read and publish, but never write to Kubernetes")
    parser.add_argument("--namespace", help="namespace of the custom resources and backends (default: kubernetes.namespace)")
    knobs = parser.add_argument_group("loop knobs", "each overrides the setting controllers.<name> of the same name")
    knobs.add_argument("--metrics-interval-s", type=float, help="seconds between samples (default 5)")
    knobs.add_argument("--rate-window-s", type=float,
                       help="PromQL rate()/quantile window, seconds, >= 4 scrape intervals (default 30)")
    knobs.add_argument("--metrics-selector",
                       help="label matchers of a pool's backends; {pool}, {model}, {namespace} are filled in "
                            f"(default {DEFAULT_SELECTOR})")
    knobs.add_argument("--resync-s", type=float, help="re-evaluate at least this often, seconds (default 30)")
    knobs.add_argument("--scale-command-max-age-s", type=float,
                       help="ignore scale commands older than this, seconds (default 30)")
    knobs.add_argument("--http-host", help="listen address of /healthz and /metrics (default 127.0.0.1)")
    knobs.add_argument("--http-port", type=int,
                       help="listen port of /healthz and /metrics, 0 for a free one, -1 for none (default -1)")


def _settings_only(path: Path, overrides: list[str]) -> tuple[Any, int]:
    """Settings from the TokenPoolsSettings document of ``path`` (Kubernetes mode: CRs are the source), and how
    many TokenPool/TokenEntitlement documents of it are ignored."""
    from tokenpools.config import load_settings

    from tokenpools.config.yamlio import YamlSyntaxError, parse_documents

    try:
        documents = [d.data for d in parse_documents(path.read_text(encoding="utf-8"))]
    except (OSError, UnicodeDecodeError) as exc:  # as load_config says it
        raise ConfigError([ConfigProblem(str(path), f"cannot read: {exc.strerror if isinstance(exc, OSError) else exc}")]) from None
    except YamlSyntaxError as exc:
        raise ConfigError([ConfigProblem(str(path), str(exc), line=exc.line)]) from None
    kinds = [d.get("kind") if isinstance(d, dict) else None for d in documents]
    settings_docs = [d for d, k in zip(documents, kinds, strict=True) if k == "TokenPoolsSettings"]
    if len(settings_docs) > 1:
        raise ConfigError([ConfigProblem(str(path), "only one TokenPoolsSettings document is allowed")])
    ignored = sum(1 for k in kinds if k in ("TokenPool", "TokenEntitlement"))
    spec = settings_docs[0].get("spec") if settings_docs else {}
    if not isinstance(spec, dict):
        raise ConfigError([ConfigProblem(str(path), "TokenPoolsSettings spec must be a mapping", kind="TokenPoolsSettings")])
    return load_settings(spec, overrides, source=str(path)), ignored


def controller_options(args: argparse.Namespace, settings: Any) -> ControllerOptions:
    if args.no_kubernetes:
        mode, kubeconfig = None, None
    elif args.in_cluster:
        mode, kubeconfig = KubeMode.IN_CLUSTER, None
    else:
        kubeconfig = args.kubeconfig or settings.kubernetes.kubeconfig
        mode = KubeMode.KUBECONFIG if kubeconfig is not None else KubeMode.AUTO
    try:
        flags = {name: getattr(args, name, None) for name in type(settings.controllers).model_fields}
        return ControllerOptions.from_settings(settings, args.config, mode, kubeconfig=kubeconfig,
                                               namespace=args.namespace, dry_run=args.dry_run, **flags)
    except ValidationError as exc:  # a knob out of range: name its flag, one line each (not pydantic's dump)
        raise ConfigError(ConfigProblem("command line", message, path=_flag(loc))
                          for loc, message in translate(exc, ControllersSettings, by_alias=False)) from None
    except ValueError as exc:
        raise ConfigError([ConfigProblem("command line", str(exc))]) from None


def _flag(loc: tuple[int | str, ...]) -> str:
    """The option of a ``controllers`` field and the setting it overrides (``--resync-s (controllers.resync_s)``),
    or ``controllers`` for a check across fields (an empty location)."""
    field = ".".join(str(p) for p in loc)
    return f"--{field.replace('_', '-')} (controllers.{field})" if loc else "controllers"


@dataclass(slots=True)
class Serving:
    """What ``/healthz`` reports: the role, and the loops of the current term."""

    options: ControllerOptions
    elector: LeaderElector | None = None
    statuses: dict[str, LoopStatus] = field(default_factory=dict)

    def leading(self) -> bool:
        return self.elector is None or self.elector.leading()

    def health(self) -> dict[str, Any]:
        leading = self.leading()
        report: dict[str, Any] = {"role": "leader" if leading else "standby", "identity": self.options.instance,
                                  "loops": {n: s.state.value for n, s in self.statuses.items()} if leading else {}}
        if self.elector is not None:
            report["lease"] = {"name": f"{self.elector.store.namespace}/{self.elector.store.name}",
                               "holder": self.elector.holder}
        return report


async def _term(options: ControllerOptions, settings: Any, serving: Serving, metrics: ControllerMetrics) -> int:
    """One term of acting: the loops, built afresh, until they all stop (or the term is cancelled)."""
    serving.statuses = {}
    acting = serving.elector.leading if serving.elector is not None else None
    try:
        async with build_controller(options, settings, acting=acting, controller_metrics=metrics) as controller:
            log.info("controller running: %s, loops %s%s", "no Kubernetes" if options.kubernetes is None else
                     f"Kubernetes namespace {options.namespace}", ", ".join(controller.loops),
                     " (dry run)" if options.dry_run else "")
            statuses = await run_loops(controller.loops, statuses=serving.statuses)
    finally:
        metrics.set_entitlement_states({})  # between terms (a standby) the states are the next leader's to export
        metrics.set_readings({})
    failed = [s for s in statuses.values() if s.state is LoopState.FAILED]
    for s in failed:
        log.error("loop %s failed: %s", s.name, s.last_error)
    return 2 if failed else 0  # exit codes: 2, a loop stopped on a permanent error (1 is a finding)


async def serve(options: ControllerOptions, settings: Any, clock: Clock | None = None) -> int:
    clock = clock or SystemClock()
    metrics = ControllerMetrics()
    serving = Serving(options)
    metrics.leading_from(serving.leading)
    async with contextlib.AsyncExitStack() as stack:
        if options.leader_election and options.kubernetes is not None:
            api = await stack.enter_async_context(await new_api_client(options.kubernetes, options.kubeconfig))
            store = LeaseStore(api, options.lease_namespace, options.knobs.lease_name)
            serving.elector = LeaderElector(store, options.instance, options.lease_timing, clock, metrics)
            log.info("controller standing by for %s as %s (loops run while it is held)", store, options.instance)
        if options.knobs.http_port >= 0:
            runner, _ = await serve_http(metrics, serving.health, options.knobs.http_host, options.knobs.http_port)
            stack.push_async_callback(runner.cleanup)
        elector = serving.elector
        work = (lead(elector, lambda: _term(options, settings, serving, metrics)) if elector
                else _term(options, settings, serving, metrics))
        task = asyncio.create_task(work)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            log.info("controller stopping")
            return 0
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def run(args: argparse.Namespace) -> int:
    from tokenpools.config import load_config, load_settings

    overrides = getattr(args, "overrides", [])
    if args.no_kubernetes:
        loaded = load_config(args.config)
        settings, ignored = load_settings(loaded.settings_values, overrides, source=str(args.config)), 0
    else:
        settings, ignored = _settings_only(args.config, overrides)
    options = controller_options(args, settings)  # every input checked before the first log line
    if ignored:
        log.warning("%s: %d TokenPool/TokenEntitlement documents ignored: with Kubernetes the custom resources "
                    "are the source (use --no-kubernetes to serve the file)", args.config, ignored)
    return asyncio.run(serve(options, settings))
