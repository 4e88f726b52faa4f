"""Executors: where many independent tasks run, yielding ``(task, result, error)`` as each one finishes.

Two are built in: :class:`LocalExecutor` (``concurrent.futures`` worker processes) and :class:`DaskExecutor`
(``dask.distributed``: a local cluster, or a real one at a scheduler's address). ``traceanalyze batch`` runs one
run per task on either; the parse of the trace files (:func:`traceanalyze.ingest.load_traces`) runs one file or
part per task on a :class:`DaskExecutor`. A task that fails yields its error as one line, never an exception,
so one bad task never stops the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from traceanalyze.errors import TraceanalyzeError, one_line


class LocalExecutor:
    """``--jobs`` worker processes (``ProcessPoolExecutor``), one run per process at a time; inline for 1 job.

    A worker that dies (killed for memory, a crash in a native library) breaks the pool: the runs it took down
    with it are then retried one at a time, each in a fresh process, so only the culprit is reported."""

    name = "local"

    def __init__(self, jobs: int) -> None:
        self.jobs = max(1, jobs)

    def results(self, fn: Callable[[dict], dict], tasks: list[dict]) -> Iterator[tuple[dict, dict | None, str | None]]:
        if self.jobs == 1 or len(tasks) <= 1:
            for t in tasks:
                try:
                    yield t, fn(t), None
                except Exception as exc:
                    yield t, None, one_line(exc)
            return
        # multiprocessing (~20 ms to import) only when a pool starts: importing this module costs nothing
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        if "forkserver" in mp.get_all_start_methods():
            ctx = mp.get_context("forkserver")  # not fork: this process holds an open DuckDB (threads)
            ctx.set_forkserver_preload(["traceanalyze.batch", "traceanalyze.pipeline", "traceanalyze.report"])
        else:
            ctx = mp.get_context("spawn")
        retry: list[dict] = []
        pool = ProcessPoolExecutor(max_workers=min(self.jobs, len(tasks)), mp_context=ctx)
        try:
            futs = {pool.submit(fn, t): t for t in tasks}
            for fut in as_completed(futs):
                t = futs[fut]
                try:
                    yield t, fut.result(), None
                except BrokenProcessPool:
                    retry.append(t)
                except Exception as exc:
                    yield t, None, one_line(exc)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        for t in retry:
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as solo:
                try:
                    yield t, solo.submit(fn, t).result(), None
                except BrokenProcessPool:
                    yield t, None, "the worker process died while analyzing this run (out of memory?)"
                except Exception as exc:
                    yield t, None, one_line(exc)

    def close(self) -> None:
        pass


class DaskExecutor:
    """``dask.distributed``: a ``LocalCluster`` of ``jobs`` single-threaded worker processes, or the cluster
    whose scheduler is at ``scheduler`` (``tcp://host:8786``)."""

    name = "dask"

    def __init__(self, jobs: int, scheduler: str | None = None, processes: bool = True) -> None:
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise TraceanalyzeError("the dask executor needs Dask: pip install 'traceanalyze[dask]'") from None
        self.cluster = None
        try:
            if scheduler:
                self.client = Client(scheduler, timeout="30s")
            else:
                self.cluster = LocalCluster(n_workers=max(1, jobs), threads_per_worker=1, processes=processes,
                                            dashboard_address=None)
                self.client = Client(self.cluster)
        except OSError as exc:
            raise TraceanalyzeError(f"cannot reach the Dask scheduler {scheduler or '(local)'}: {exc}") from None

    def results(self, fn: Callable[[dict], dict], tasks: list[dict]) -> Iterator[tuple[dict, dict | None, str | None]]:
        from dask.distributed import as_completed as dask_completed

        futs = [self.client.submit(fn, t, pure=False) for t in tasks]
        by_key = {f.key: t for f, t in zip(futs, tasks, strict=True)}
        for fut in dask_completed(futs):
            t = by_key[fut.key]
            try:
                yield t, fut.result(), None
            except Exception as exc:  # KilledWorker after Dask's own retries, or a bug
                yield t, None, one_line(exc)
            fut.release()

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (``os.sched_getaffinity``), else ``os.cpu_count()`` where
    the platform has no affinity (not Linux); at least 1."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _glibc_call(name: str, *args: int) -> bool:
    """``name(*args)`` of glibc, true when it returned non-zero; False where there is no glibc (macOS, musl,
    Windows) or no such function."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's name; find_library would start ldconfig
        return bool(getattr(libc, name)(*args))
    except (OSError, AttributeError):
        return False


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the operating system (glibc ``malloc_trim``; Dask's workers do the
    same). NumPy arrays freed after a big build stay in the heap, fragmented, and count in the peak of what
    follows. Returns False where there is no glibc (macOS, musl, Windows): nothing to do there."""
    return _glibc_call("malloc_trim", 0)


CACHE_HEADROOM_BYTES = 32 << 20  # what DuckDB may take on other threads while drop_cached_blocks lowers its limit


def drop_cached_blocks(con: Any) -> bool:
    """Let DuckDB drop the blocks of a database file it keeps cached from earlier reads (its buffer pool keeps
    every block read, up to its memory limit: ~120 MB at 1,024 ranks, held through the replay's peak). Its memory
    limit is lowered for a moment to what it holds besides them plus :data:`CACHE_HEADROOM_BYTES`, which makes it
    evict them (they are on disk: a later query reads them again), then put back (a limit of the caller's own as
    DuckDB shows it, to 0.1 GiB). Nothing is done for an in-memory database (its blocks would go to temporary
    files). Returns whether the cache was dropped."""
    import duckdb

    on_disk = con.execute("SELECT path IS NOT NULL AND path <> '' FROM duckdb_databases() "
                          "WHERE database_name = current_database()").fetchone()
    if not on_disk or not on_disk[0]:
        return False
    limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    held = con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() "
                       "WHERE tag <> 'BASE_TABLE'").fetchone()[0]
    try:
        con.execute(f"SET memory_limit = '{int(held) + CACHE_HEADROOM_BYTES}B'")
        return True
    except duckdb.Error:  # more is pinned than that: nothing changed
        return False
    finally:
        con.execute("RESET memory_limit")
        if con.execute("SELECT current_setting('memory_limit')").fetchone()[0] != limit:
            con.execute(f"SET memory_limit = '{limit}'")


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MAP_ON_ITS_OWN_BYTES = 2 << 20  # allocations this large or larger get a mapping of their own (map_large_blocks)


def map_large_blocks() -> bool:
    """From now on, serve every allocation of :data:`MAP_ON_ITS_OWN_BYTES` (2 MiB) or more in this process with a
    mapping of its own, given back to the operating system when freed (glibc ``mallopt(M_MMAP_THRESHOLD)``).

    By default glibc raises that threshold, up to 32 MiB, each time a mapped block is freed; the replay's NumPy
    arrays of 2-32 MiB (per-chunk and per-wave arrays, sort orders, masks) then come from the heap, and the holes
    they leave when freed are not reused by the next, larger arrays: the peak holds both. Measured peaks (RSS, the
    analyses after loading, in turn): the 8-rank scale set 322-346 -> 285-287 MB, 1,024 small ranks 923-945 ->
    799 MB. The cost is the page faults of fresh mappings: the 8-rank graph build 0.65 -> 0.79-0.84 s. At 1 MiB
    the peaks were 298-302 and 778 MB, for 40 % more faults.
    Returns False where there is no glibc (macOS, musl, Windows): nothing changes there.
    """
    done = _glibc_call("mallopt", M_MMAP_THRESHOLD, MAP_ON_ITS_OWN_BYTES)
    _MAPPED[0] = _MAPPED[0] or done
    return done


_MAPPED = [False]  # map_large_blocks took effect: reuse_freed_blocks puts it back after
_REUSING = [0]  # reuse_freed_blocks' callers inside it now: the last one out puts map_large_blocks' setting back
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter (malloc.h)
TRIM_DEFAULT_BYTES = 128 << 10  # glibc's default M_TRIM_THRESHOLD
HEAP_BLOCKS_MAX_BYTES = 32 << 20  # the largest M_MMAP_THRESHOLD glibc takes on 64-bit systems (HEAP_MAX_SIZE / 2)
KEEP_FREED_BYTES = 1 << 30  # M_TRIM_THRESHOLD while reusing: the heap's free top is kept, not given back


@contextlib.contextmanager
def reuse_freed_blocks() -> Iterator[None]:
    """Inside, allocations up to :data:`HEAP_BLOCKS_MAX_BYTES` (32 MiB) come from the C heap, which keeps what is
    freed for the next ones (glibc ``mallopt``: ``M_MMAP_THRESHOLD`` raised, ``M_TRIM_THRESHOLD`` to
    :data:`KEEP_FREED_BYTES`); after, :func:`map_large_blocks`' setting is put back and the heap's free pages
    given back (:func:`release_free_memory`). For a phase that allocates and frees arrays of the same few sizes
    again and again (the what-if replays of one graph: each replay's graph-sized arrays), where a fresh mapping
    per array costs its page faults each time: at 256 ranks the replay after the build took 0.88 s of CPU with a
    mapping per array, 0.65 s reusing the heap. Only after :func:`map_large_blocks` took effect (else nothing
    changes: there would be no setting to put back)."""
    if not _MAPPED[0]:
        yield
        return
    _REUSING[0] += 1
    keep_freed_blocks()
    try:
        yield
    finally:
        _REUSING[0] -= 1
        if not _REUSING[0]:
            _glibc_call("mallopt", M_MMAP_THRESHOLD, MAP_ON_ITS_OWN_BYTES)
            _glibc_call("mallopt", M_TRIM_THRESHOLD, TRIM_DEFAULT_BYTES)
            release_free_memory()


def keep_freed_blocks() -> bool:
    """From now on, allocations up to :data:`HEAP_BLOCKS_MAX_BYTES` (32 MiB) in this process come from the C heap,
    which keeps the pages freed (glibc ``mallopt``: ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``, as in
    :func:`reuse_freed_blocks`, never put back). For a process that ends with its work, such as a parse worker of
    small files: each file's inflated blocks, joined and sliced bytes and Arrow columns reuse the last file's pages
    instead of faulting in fresh ones (a small rank of the sweep set: ~300 page faults to ~20), and the process's
    peak is what it was (the heap holds at most what the largest file needed). Returns False where there is no
    glibc."""
    return (_glibc_call("mallopt", M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
            and _glibc_call("mallopt", M_MMAP_THRESHOLD, HEAP_BLOCKS_MAX_BYTES))


def on_own_cursor(con: Any, fn: Callable[..., Any], *args: Any, name: str = "traceanalyze-beside"
                  ) -> Callable[[], Any]:
    """Start ``fn(cursor, *args)`` now, on a new cursor of the DuckDB connection ``con`` and a thread of its own
    (a connection runs one query at a time; DuckDB and NumPy's sorts free the GIL, so the caller's own work goes on
    beside it). Returns the wait for ``fn``'s result, which raises what ``fn`` raised; the cursor is closed when
    ``fn`` ends."""
    cur = con.cursor()

    def run() -> Any:
        try:
            return fn(cur, *args)
        finally:
            cur.close()

    return on_thread(run, name=name)


def on_thread(fn: Callable[..., Any], *args: Any, name: str = "traceanalyze-beside") -> Callable[[], Any]:
    """Start ``fn(*args)`` now on a thread of its own; returns the wait for its result, which raises what ``fn``
    raised."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return pool.submit(fn, *args).result
    finally:
        pool.shutdown(wait=False)
