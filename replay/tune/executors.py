"""Where trials run: in this process, in a pool of worker processes, or as Ray tasks on an existing cluster.

Every executor takes a batch of jobs (trial number, ``--set`` items) for one part of the log and hands back a
``Pending`` whose ``result()`` is their results in the batch's order, so the search sees the same results whatever
ran them. Submitting does not wait: the search keeps the next batch queued behind the one it waits for, and the
workers never idle at a batch's end (``search.run``). None schedules anything of its own: the process pool is
``concurrent.futures``', the cluster's is Ray's, and ``Serial`` runs a batch when its results are asked for.

- ``Serial``: the parts are already decoded in this process.
- ``Processes``: each worker decodes the log once, in its initializer, and keeps it for every trial it runs
  (cached by the log's digest, which the worker checks against the one the parent read).
- ``RayCluster``: ``ray.init(address=…)`` joins a running cluster; each part of the log goes into the object
  store once (``ray.put``) and every task gets its reference, which a worker process resolves on its first trial
  of that part and keeps (deserialising a one-hour log's part for every trial cost a tenth of the trial). The cluster's workers must import this same
  tokenpools (one virtualenv on every node, or a Ray runtime environment that installs it).
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from tokenpools.errors import PermanentError
from tokenpools.replay.logio import LogData, read_log, split_log
from tokenpools.replay.tune.trials import TrialContext, TrialResult, run_trial

TUNING, HELD_OUT = "tuning", "held-out"
Job = tuple[int, tuple[str, ...]]


class Pending(Protocol):
    def result(self) -> list[TrialResult]: ...


class Executor(Protocol):
    def submit(self, part: str, jobs: Sequence[Job]) -> Pending: ...
    def close(self) -> None: ...


class _Lazy:
    """A serial batch: run when its results are first asked for, once."""

    def __init__(self, run: Callable[[], list[TrialResult]]) -> None:
        self._run: Callable[[], list[TrialResult]] | None = run
        self._results: list[TrialResult] = []

    def result(self) -> list[TrialResult]:
        if self._run is not None:
            self._results, self._run = self._run(), None
        return self._results


class _Gathered:
    """A batch of futures (``concurrent.futures``' or Ray's, through ``get``), gathered in the batch's order."""

    def __init__(self, futures: list[Any], get: Callable[[list[Any]], list[TrialResult]]) -> None:
        self._futures, self._get = futures, get

    def result(self) -> list[TrialResult]:
        return self._get(self._futures)


def log_parts(data: LogData, holdout_fraction: float) -> dict[str, LogData]:
    """{"tuning": …, "held-out": …}; with no hold-out, the whole log is the tuning part."""
    if holdout_fraction <= 0:
        return {TUNING: data}
    tuning, held_out = split_log(data, holdout_fraction)
    return {TUNING: tuning, HELD_OUT: held_out}


class Serial:
    def __init__(self, parts: Mapping[str, LogData], context: TrialContext) -> None:
        self.parts, self.context = parts, context

    def submit(self, part: str, jobs: Sequence[Job]) -> Pending:
        jobs = list(jobs)
        return _Lazy(lambda: [run_trial(self.parts[part], self.context, number, items) for number, items in jobs])

    def close(self) -> None:
        pass


@functools.lru_cache(maxsize=2)
def _worker_parts(log: str, digest: str, holdout_fraction: float) -> dict[str, LogData]:
    """A worker process's decoded log (its only state, filled by the pool's initializer)."""
    data = read_log(Path(log))
    if data.digest != digest:
        raise PermanentError(f"{log} changed while tuning (digest {data.digest[:12]}, expected {digest[:12]})")
    return log_parts(data, holdout_fraction)


def _init_worker(log: str, digest: str, holdout_fraction: float) -> None:
    _worker_parts(log, digest, holdout_fraction)


def _worker_task(log: str, digest: str, holdout_fraction: float, context: TrialContext, part: str,
                 number: int, items: tuple[str, ...]) -> TrialResult:
    return run_trial(_worker_parts(log, digest, holdout_fraction)[part], context, number, items)


class Processes:
    """A ``ProcessPoolExecutor`` of ``workers`` spawned processes (spawn, not fork: polars' threads do not survive
    a fork)."""

    def __init__(self, log: Path, digest: str, holdout_fraction: float, context: TrialContext, workers: int) -> None:
        self.key = (str(log), digest, holdout_fraction)
        self.context = context
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_init_worker, initargs=self.key)

    def submit(self, part: str, jobs: Sequence[Job]) -> Pending:
        futures = [self.pool.submit(_worker_task, *self.key, self.context, part, number, items)
                   for number, items in jobs]
        return _Gathered(futures, lambda fs: [f.result() for f in fs])

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class _Part:
    """A part of the log in Ray's object store, as a task's argument Ray does not resolve (only a task's own
    arguments are fetched and deserialised for it, every time); equal and hashed by the part's digest, so a
    worker process's ``_ray_part`` fetches each part once and keeps it for every later trial it runs."""

    def __init__(self, digest: str, ref: Any) -> None:
        self.digest, self.ref = digest, ref

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Part) and other.digest == self.digest


@functools.lru_cache(maxsize=2)
def _ray_part(part: _Part) -> LogData:
    import ray

    data: LogData = ray.get(part.ref)
    return data


def _ray_task(part: _Part, context: TrialContext, number: int, items: tuple[str, ...]) -> TrialResult:
    return run_trial(_ray_part(part), context, number, items)


class RayCluster:
    def __init__(self, address: str, parts: Mapping[str, LogData], context: TrialContext) -> None:
        import logging

        import ray

        self.ray = ray
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        # once per part into the object store, once per part into each worker process (_ray_part)
        self.parts = {name: _Part(data.digest, ray.put(data)) for name, data in parts.items()}
        self.context_ref = ray.put(context)
        self.task = ray.remote(num_cpus=1)(_ray_task)

    def submit(self, part: str, jobs: Sequence[Job]) -> Pending:
        refs = [self.task.remote(self.parts[part], self.context_ref, number, items) for number, items in jobs]
        return _Gathered(refs, lambda rs: list(self.ray.get(rs)))

    def close(self) -> None:
        self.ray.shutdown()


class Closing:
    """``with Closing(executor) as e:`` closes it on the way out."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def __enter__(self) -> Executor:
        return self.executor

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.executor.close()
