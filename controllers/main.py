"""``tokenpools controller --config FILE [--kubeconfig PATH | --in-cluster | --no-kubernetes] [--dry-run]``.

Settings come from the config file's TokenPoolsSettings document, ``TOKENPOOLS_*`` env and ``--set`` (groups
``kafka``, ``prometheus``, ``kubernetes``, ``scaling``, ``controllers``, ``streams.metrics_staleness_s``); the
flags below win over the settings of the same names.

- With Kubernetes (the default; ``--kubeconfig`` or ``--in-cluster`` choose how to connect) the TokenPool and
  TokenEntitlement custom resources are the source; the config file supplies only settings (pools or entitlements
  in it are ignored, with a warning).
- ``--no-kubernetes``: the config file's documents are the source, reloaded when the file changes; the scaler
  only logs its decisions.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

import yaml

from tokenpools.controllers.app import ControllerOptions, build_controller
from tokenpools.controllers.kube import KubeMode
from tokenpools.controllers.promql import DEFAULT_SELECTOR
from tokenpools.controllers.supervisor import LoopState, run_loops
from tokenpools.errors import ConfigError, ConfigProblem

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


def _settings_only(path: Path, overrides: list[str]) -> Any:
    """Settings from the TokenPoolsSettings document of ``path`` (Kubernetes mode: CRs are the source)."""
    from tokenpools.config import load_settings

    try:
        documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError([ConfigProblem(str(path), f"cannot read: {exc}")]) from None
    kinds = [d.get("kind") if isinstance(d, dict) else None for d in documents]
    settings_docs = [d for d, k in zip(documents, kinds, strict=True) if k == "TokenPoolsSettings"]
    if len(settings_docs) > 1:
        raise ConfigError([ConfigProblem(str(path), "only one TokenPoolsSettings document is allowed")])
    ignored = sum(1 for k in kinds if k in ("TokenPool", "TokenEntitlement"))
    if ignored:
        log.warning("%s: %d TokenPool/TokenEntitlement documents ignored: with Kubernetes the custom resources "
                    "are the source (use --no-kubernetes to serve the file)", path, ignored)
    spec = settings_docs[0].get("spec") if settings_docs else {}
    if not isinstance(spec, dict):
        raise ConfigError([ConfigProblem(str(path), "TokenPoolsSettings spec must be a mapping", kind="TokenPoolsSettings")])
    return load_settings(spec, overrides, source=str(path))


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
    except ValueError as exc:
        raise ConfigError([ConfigProblem("command line", str(exc))]) from None


async def serve(options: ControllerOptions, settings: Any) -> int:
    async with build_controller(options, settings) as controller:
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(run_loops(controller.loops))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.cancel)
        log.info("controller running: %s, loops %s%s", "no Kubernetes" if options.kubernetes is None else
                 f"Kubernetes namespace {options.namespace}", ", ".join(controller.loops),
                 " (dry run)" if options.dry_run else "")
        try:
            statuses = await runner
        except asyncio.CancelledError:
            log.info("controller stopping")
            return 0
        failed = [s for s in statuses.values() if s.state is LoopState.FAILED]
        for s in failed:
            log.error("loop %s failed: %s", s.name, s.last_error)
        return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    from tokenpools.config import load_config, load_settings

    overrides = getattr(args, "overrides", [])
    if args.no_kubernetes:
        loaded = load_config(args.config)
        settings = load_settings(loaded.settings_values, overrides, source=str(args.config))
    else:
        settings = _settings_only(args.config, overrides)
    return asyncio.run(serve(controller_options(args, settings), settings))
