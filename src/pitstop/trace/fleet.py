"""Many rank traces at once: one task per trace on a process pool or a Dask cluster, then one cross-rank step.

Each task (summary.summarize) reduces a trace to a small RankSummary where the file is, so only summaries
travel. A trace that cannot be read is reported and skipped; the rest are analysed. The pool is sized from the
cores and the free memory (a worker needs about WORKER_BYTES plus TEXT_SHARE of its trace's text at peak).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import struct
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.artifacts import GZIP_MAGIC, IngestError
from pitstop.core.profile import RankProfile
from pitstop.trace.crossrank import cross_rank
from pitstop.trace.summary import Failure, RankSummary, rank_from_name, summarize

WORKER_BYTES = 160 << 20  # interpreter, numpy and pitstop, plus the reader's buffers
TEXT_SHARE = 0.3  # peak memory per byte of trace text (columns and their numpy views), measured
Progress = Callable[[int, int, str], None]


@dataclass
class FleetResult:
    ranks: list[RankProfile]
    notes: list[str] = field(default_factory=list)
    skipped: list[Failure] = field(default_factory=list)
    summaries: list[RankSummary] = field(default_factory=list)


def text_bytes(path: Path) -> int:
    """The trace's text size: a gzip's trailer says it (modulo 4 GiB, so at least the file size)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            if f.read(2) != GZIP_MAGIC or size < 20:
                return size
            f.seek(-4, os.SEEK_END)
            (isize,) = struct.unpack("<I", f.read(4))
    except OSError:
        return size
    return max(isize, size)


def default_jobs(paths: list[Path]) -> int:
    """As many workers as cores, fewer when the free memory does not hold that many readers at once."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        cores = os.cpu_count() or 1
    import psutil

    biggest = max((text_bytes(p) for p in paths), default=0)
    need = WORKER_BYTES + TEXT_SHARE * biggest
    fit = int(0.8 * psutil.virtual_memory().available // need)
    return max(1, min(cores, len(paths), fit))


def _tasks(paths: list[Path]) -> list[tuple[str, int]]:
    """(path, the rank to use when the trace does not say): the number in its name, else its position."""
    return [
        (str(p.resolve()), named if (named := rank_from_name(p)) is not None else i)
        for i, p in enumerate(paths)
    ]


def _serial(tasks: list[tuple[str, int]]) -> Iterator[RankSummary | Failure]:
    for path, rank in tasks:
        yield summarize(path, rank)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BrokenProcessPool):
        return "the worker reading it died (out of memory?)"
    return f"internal error while reading it: {type(exc).__name__}: {exc}"


def _quiet_worker() -> None:
    """A forked worker never writes to the terminal: the parent's progress thread may have held the stream's
    lock at the fork, and a warning printed through it would hang the worker. Its result says everything."""
    warnings.simplefilter("ignore")
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the worker's whole life


def _pool(tasks: list[tuple[str, int]], jobs: int) -> Iterator[RankSummary | Failure]:
    # fork where there is one: spawn and forkserver re-run the main script in every worker, and a script
    # without a __main__ guard (some console-script wrappers) would start pitstop again there
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_quiet_worker) as pool:
        futures: dict[Future[RankSummary | Failure], str] = {
            pool.submit(summarize, path, rank): path for path, rank in tasks
        }
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as exc:  # a bug or a dead worker: this trace is skipped, the rest go on
                yield Failure(futures[future], _describe(exc))


@contextmanager
def _main_script_hidden() -> Iterator[None]:
    """While a LocalCluster starts its worker processes (spawned), hide the main script: a spawned process
    re-imports it, and a wrapper without a ``__main__`` guard would run pitstop again in every worker.
    The workers need only ``pitstop.trace.summary``, which they import by name."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


DASK_EXTRA = "pip install 'pitstop[dask]'"


def dask_api() -> types.SimpleNamespace:
    """dask.distributed's Client, LocalCluster and as_completed, or one line naming the extra to install.
    Asked before any trace is read, from the CLI and the Python API alike (a missing dask used to surface
    as a ModuleNotFoundError from inside the reading loop)."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError as exc:
        missing = (exc.name or "distributed").split(".")[0]
        raise IngestError(
            f"reading traces on dask needs dask and distributed ({missing} is not installed): {DASK_EXTRA}"
        ) from None
    return types.SimpleNamespace(Client=Client, LocalCluster=LocalCluster, as_completed=as_completed)


@contextmanager
def _dask_client(api: types.SimpleNamespace, address: str, jobs: int) -> Iterator[Any]:
    cluster = None
    try:
        if address == "local":
            with _main_script_hidden():
                cluster = api.LocalCluster(
                    n_workers=jobs,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
            client = api.Client(cluster)
        else:
            client = api.Client(address, timeout="20s")
    except (OSError, TimeoutError) as exc:
        if cluster is not None:
            cluster.close()
        raise IngestError(f"--dask {address}: cannot reach the scheduler ({exc})") from None
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _dask(
    api: types.SimpleNamespace, tasks: list[tuple[str, int]], address: str, jobs: int
) -> Iterator[RankSummary | Failure]:
    with _dask_client(api, address, jobs) as client:
        futures = client.map(summarize, [p for p, _ in tasks], [r for _, r in tasks], pure=False)
        paths = {f.key: p for f, (p, _) in zip(futures, tasks, strict=True)}
        for future in api.as_completed(futures):
            try:
                yield future.result()
            except Exception as exc:
                yield Failure(paths[future.key], _describe(exc))


def read_traces(
    paths: list[Path], jobs: int | None = None, dask: str | None = None, progress: Progress | None = None
) -> FleetResult:
    """Every trace into a RankProfile (in rank order) with the cross-rank fields filled in.

    ``jobs``: worker processes (default: from cores and free memory); ``dask``: "local" for a LocalCluster or
    a scheduler address, whose workers read the same paths.
    """
    api = dask_api() if dask else None  # before anything is read
    tasks = _tasks(paths)
    workers = jobs or default_jobs(paths)
    if dask and api is not None:
        results = _dask(api, tasks, dask, workers)
    elif workers > 1 and len(tasks) > 1:
        results = _pool(tasks, workers)
    else:
        results = _serial(tasks)
    summaries: list[RankSummary] = []
    failures: list[Failure] = []
    for done, result in enumerate(results, 1):
        (summaries if isinstance(result, RankSummary) else failures).append(result)  # type: ignore[arg-type]
        if progress is not None:
            progress(done, len(tasks), Path(result.path).name)
    if not summaries:  # named as the user named it
        first = failures[0]
        shown = {task: str(p) for (task, _), p in zip(tasks, paths, strict=True)}
        raise IngestError(f"{shown.get(first.path, first.path)}: {first.message}")
    summaries.sort(key=lambda s: (s.rank, s.path))
    notes = [f"skipped {Path(f.path).name} ({f.message})" for f in sorted(failures, key=lambda f: f.path)]
    seen: dict[int, str] = {}
    for s in summaries:
        if s.rank in seen:
            notes.append(f"{Path(s.path).name} and {Path(seen[s.rank]).name} both say rank {s.rank}")
        seen.setdefault(s.rank, s.path)
    notes += cross_rank(summaries) if len(summaries) > 1 else _single_notes(summaries[0])
    return FleetResult([s.profile for s in summaries], notes, failures, summaries)


def _single_notes(summary: RankSummary) -> list[str]:
    trace = summary.profile.trace
    return [f"rank {summary.rank}: {note}" for note in (trace.limitations if trace else [])]


__all__ = ["FleetResult", "default_jobs", "read_traces"]
