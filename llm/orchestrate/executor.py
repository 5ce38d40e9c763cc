"""Where the jobs of a sweep run (`map_jobs`): ``local`` worker processes on this machine (the
default) or ``ray`` tasks on a Ray instance, local or a cluster's (the ``ray`` extra).

Both keep the results in job order, show a tqdm bar over finished jobs and fail fast: the first
job to raise stops the others (queued ones are dropped; Ray ends the running ones too, and
`map_jobs` waits until they have ended) and its error propagates; local workers die with their driver (`die_with_parent`). Ray runs one task
per job, each asking `cpus_per_job` CPUs of the scheduler (a job sets its own torch threads,
`llm.orchestrate.jobs.run_job`) and ``gpus_per_job(job)`` GPUs (a job that trains on CUDA asks for
one, `llm.orchestrate.sweep.unit_gpus`; Ray then sets its ``CUDA_VISIBLE_DEVICES``), as
`ray_task_options` builds the request. `map_jobs` uses the Ray instance this
process is connected to, if any; else it connects to `address` (``ray start --head`` on a cluster's
head node prints it) or, with none, starts a local instance of `workers` CPUs. It disconnects only
from an instance it connected to itself (which stops one it started), never from the caller's.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numerics
from experiment.cli import progress_bar
from shaping import import_methods, imported_methods

__all__ = [
    "EXECUTORS",
    "RAY_EXTRA",
    "check_executor",
    "die_with_parent",
    "map_jobs",
    "ray_task_options",
]

EXECUTORS = ("local", "ray")
RAY_EXTRA = "the ray extra: pip install 'ray>=2.40' (or pip install -e '.[ray]' in the checkout)"


def _import_ray() -> Any:
    """The `ray` module, or an ImportError that names the extra to install."""
    try:
        import ray  # a heavy optional dependency (the ray extra): imported only when asked for
    except ImportError as e:
        raise ImportError(f"executor 'ray' needs Ray, which is not installed: {RAY_EXTRA}") from e
    return ray


def check_executor(executor: str, address: str | None = None) -> None:
    """Raise unless `executor` is one of `EXECUTORS`, its library is installed and `address`
    is for it.

    Raises:
        ValueError: an unknown executor, or `address` with the local one.
        ImportError: ``ray`` without Ray installed (the message names the extra).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
    if address is not None and executor != "ray":
        raise ValueError(f"address {address!r} is for executor 'ray', not {executor!r}")
    if executor == "ray":
        _import_ray()


def map_jobs(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    *,
    workers: int,
    progress: bool,
    desc: str,
    name: Callable[[Any], str],
    executor: str = "local",
    address: str | None = None,
    cpus_per_job: float = 1,
    gpus_per_job: Callable[[Any], float] | None = None,
    log: bool = False,
) -> list[Any]:
    """`fn` over `jobs` (results in job order) with a tqdm bar over finished jobs, or with `log`
    and no `progress` (a run in the background, its stderr a file) a line each (`experiment.cli.progress_bar`).

    Args:
        fn: the job function; module-level (it is pickled by reference).
        workers: ``local``: worker processes (inline when ``<= 1``); ``ray``: CPUs of a local Ray
            instance it starts (unused on a running instance or a cluster).
        executor: ``local`` (spawned processes) or ``ray`` (module docstring).
        address: ``ray`` only: the instance to connect to (``HOST:6379``, ``auto``); None: the
            one this process is connected to, else ``RAY_ADDRESS``, else a new local one.
        cpus_per_job: ``ray`` only: the CPUs each task asks of the scheduler.
        gpus_per_job: ``ray`` only: the GPUs a job's task asks of the scheduler, a function of
            the job (None: none); see `ray_task_options`.

    Raises:
        ValueError: an unknown executor, or `address` with the local one.
        ImportError: ``ray`` without Ray installed.
    """
    check_executor(executor, address)
    bar = progress_bar(len(jobs), desc, "run", progress=progress or log, log=log and not progress)
    try:
        if executor == "ray":
            return _map_ray(fn, jobs, bar, name, workers, address, cpus_per_job, gpus_per_job)
        return _map_local(fn, jobs, bar, name, workers)
    finally:
        bar.close()


def _map_local(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    bar: Any,
    name: Callable[[Any], str],
    workers: int,
) -> list[Any]:
    """Inline when ``workers <= 1``, else in `workers` spawned processes."""
    results: list[Any] = [None] * len(jobs)
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            bar.set_postfix_str(name(job))
            results[i] = fn(job)
            bar.update(1)
        return results
    # spawn, not fork: a forked child inherits torch's thread pools and can deadlock.
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=start_worker,
        initargs=(os.getpid(), imported_methods()),
    ) as pool:
        futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        try:
            for fut in cf.as_completed(futures):
                i = futures[fut]
                results[i] = fut.result()
                bar.set_postfix_str(name(jobs[i]))
                bar.update(1)
        except BaseException:
            # Fail fast: without this the pool's exit would run every queued job first.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return results


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCHDOG_S = 1.0
"""How often a worker without a parent-death signal checks that its driver is alive."""


def start_worker(parent: int, imports: Sequence[str] = ()) -> None:
    """A local worker's initializer: `die_with_parent`, then the driver's ``--import`` modules
    (`shaping.import_methods`), so that a method registered outside the package is known by name
    in the worker too (a spawned process starts from a fresh interpreter)."""
    die_with_parent(parent)
    import_methods(imports)


def with_imports(imports: Sequence[str], fn: Callable[[Any], Any], job: Any) -> Any:
    """``fn(job)`` after importing the driver's ``--import`` modules (a Ray task's body)."""
    import_methods(imports)
    return fn(job)


def die_with_parent(parent: int) -> None:
    """A worker's initializer: end this process when the driver `parent` ends, ``kill -9``
    included, so that no worker goes on training a dead sweep's queued runs.

    On Linux the kernel sends SIGKILL at the parent's death (``prctl(PR_SET_PDEATHSIG)``);
    elsewhere, or if that call fails, a daemon thread checks every `WATCHDOG_S` seconds that the
    parent is still this process's parent. A parent already gone ends the worker at once.
    """
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:  # the driver died before the signal was armed
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCHDOG_S)
    os._exit(1)


def ray_task_options(
    job: Any, cpus_per_job: float, gpus_per_job: Callable[[Any], float] | None
) -> dict[str, Any]:
    """The options of the Ray task of `job` (``ray.remote(...).options``): ``num_cpus``
    `cpus_per_job`, ``num_gpus`` ``gpus_per_job(job)`` (0 without it), and, where this process
    has ``SHARPENING_NUMERICS`` set (by the user, or by an extension following its study's
    version, `numerics.following`), a ``runtime_env`` that sets it in the task's worker too: a
    cluster's workers do not inherit this process's environment.

    Raises:
        ValueError: a negative CPU or GPU count, naming the job's count.
    """
    gpus = 0.0 if gpus_per_job is None else float(gpus_per_job(job))
    if cpus_per_job < 0 or gpus < 0:
        raise ValueError(
            f"cpus_per_job, gpus_per_job: expected >= 0, got {cpus_per_job}, {gpus} for {job!r}"
        )
    options: dict[str, Any] = {"num_cpus": cpus_per_job, "num_gpus": gpus}
    setting = os.environ.get(numerics.OPT_OUT_ENV)
    if setting is not None:
        options["runtime_env"] = {"env_vars": {numerics.OPT_OUT_ENV: setting}}
    return options


CANCEL_PATIENCE = 120.0
"""Seconds `map_jobs` (Ray) waits, after a job failed, for the other jobs' tasks to end."""


def _end_tasks(ray: Any, refs: Sequence[Any], patience: float = CANCEL_PATIENCE) -> None:
    """End the Ray tasks `refs` and wait until each has (at most `patience` seconds): dropped if
    queued, its worker killed if running, so that no CPU or GPU of a cluster that stays up is held
    by a job whose sweep has failed. A run's files are written atomically, so a killed job loses
    no more than its own progress.

    `ray.cancel(ref, force=True)`: without `force` Ray 2.60 leaves a running task to finish (a
    `time.sleep` or a training step is not interrupted). Raising right after the cancels lost
    some of them under load (2 of 14 failed sweeps left a task running to its end); holding the
    references until every task has ended, the cancel asked again each second, freed the cluster
    in 26 of 26 (`tests/llm/test_executor.py`)."""
    deadline = time.monotonic() + patience
    pending = list(refs)
    while pending and time.monotonic() < deadline:
        for ref in pending:
            ray.cancel(ref, force=True)
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)


def _map_ray(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    bar: Any,
    name: Callable[[Any], str],
    workers: int,
    address: str | None,
    cpus_per_job: float,
    gpus_per_job: Callable[[Any], float] | None,
) -> list[Any]:
    """One Ray task per job, gathered as they finish (`ray.wait`)."""
    ray = _import_ray()
    connected = not ray.is_initialized()
    if connected:
        if address is None and not os.environ.get("RAY_ADDRESS"):
            ray.init(num_cpus=max(1, workers))  # a local instance of its own
        else:
            ray.init(address=address)  # None: RAY_ADDRESS
    try:
        remote = ray.remote(num_cpus=cpus_per_job)(with_imports)
        imports = imported_methods()
        refs = [
            remote.options(**ray_task_options(job, cpus_per_job, gpus_per_job)).remote(
                imports, fn, job
            )
            for job in jobs
        ]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(jobs)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = index[ref]
                    try:
                        results[i] = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:
                        # The job's own exception, as the local executor raises it (the CLI's
                        # one-line error), the remote traceback chained.
                        if isinstance(e.cause, Exception):
                            raise e.cause from e
                        raise
                    bar.set_postfix_str(name(jobs[i]))
                    bar.update(1)
        except BaseException:
            _end_tasks(ray, pending)  # fail fast: the others are ended before the error goes up
            raise
        return results
    finally:
        if connected:
            ray.shutdown()
