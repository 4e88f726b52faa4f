"""Store: the DuckDB database every later stage reads, its schema, and the parse cache.

The database is an artifact: users open it with ``duckdb FILE`` (or ``traceanalyze sql FILE "..."``).
Event tables carry ``file_id``; ``files`` maps a file to its run, rank and profiling window, so per-rank
queries join on it. Times are integer nanoseconds (``ts_ns``, ``dur_ns``); ``ts_ns`` is on the rank's
own clock (``baseTimeNanoseconds`` applied), not aligned across hosts. See ``docs/schema.md``.

Re-running on unchanged files does not parse them again: a file whose resolved path, size, mtime and content
fingerprint (:func:`fingerprint`) match a row of ``files`` keeps its rows; rows of files no longer among the
inputs are deleted (:func:`forget_files`). Files are loaded in transactions of up to :data:`TRANSACTION_FILES`
files (a split file's parts one by one), so an interrupted ingest leaves every committed file usable; the files of
the open transaction are parsed again by the next run.
"""

from __future__ import annotations

import importlib.abc
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from traceanalyze.errors import InputError, TraceanalyzeError

if TYPE_CHECKING:
    from traceanalyze.ingest import TraceFile

SCHEMA_VERSION = 4  # a database written with another version is rebuilt: it is a cache of the traces

DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
INSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');
CREATE TABLE IF NOT EXISTS files (
    file_id INTEGER PRIMARY KEY,   -- stable id of one parsed trace file
    path VARCHAR UNIQUE,           -- resolved path
    size_bytes BIGINT,             -- file size on disk
    mtime_ns BIGINT,               -- modification time; with size the cache key
    status VARCHAR,                -- ok | partial | error | loading (a split file not yet complete)
    message VARCHAR,               -- why partial or error
    bytes_read BIGINT,             -- decompressed JSON bytes read
    base_time_ns BIGINT,           -- baseTimeNanoseconds (0 for old traces with absolute ts)
    header JSON,                   -- top-level keys except traceEvents
    n_kernels BIGINT, n_cpu_ops BIGINT,
    run_id INTEGER,                -- set per report: the run this file belongs to
    rank INTEGER,                  -- distributedInfo.rank, else from the name
    "window" INTEGER               -- 0, 1, ...: profiling windows of one rank, by start time
);
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY,
    name VARCHAR, path VARCHAR,
    role VARCHAR,                  -- subject | baseline
    world_size INTEGER,            -- distributedInfo.world_size (max over files), else ranks found
    backend VARCHAR,               -- nccl | gloo | ...
    mode VARCHAR,                  -- gpu (kernels present) | cpu (gloo/CPU-only: ops are the activity)
    gpu_model VARCHAR, gpu_count INTEGER,
    nccl_version VARCHAR, cuda_runtime_version VARCHAR
);
CREATE TABLE IF NOT EXISTS kernels (
    file_id INTEGER,
    cat VARCHAR,                   -- kernel | gpu_memcpy | gpu_memset | gpu_user_annotation
    name VARCHAR, device BIGINT, stream BIGINT,
    ts_ns BIGINT, dur_ns BIGINT,   -- start on the rank's clock, duration (ns)
    correlation BIGINT,            -- == cuda_runtime.correlation of the launch
    external_id BIGINT,            -- == cpu_ops.external_id of the launching op
    bytes BIGINT                   -- memcpy/memset bytes
);
CREATE TABLE IF NOT EXISTS cpu_ops (
    file_id INTEGER,
    cat VARCHAR,                   -- cpu_op | user_annotation | cuda_runtime | cuda_driver
    name VARCHAR, pid BIGINT, tid BIGINT,
    ts_ns BIGINT, dur_ns BIGINT,
    external_id BIGINT, correlation BIGINT,
    input_types VARCHAR,           -- JSON text of args["Input type"] (record_shapes)
    input_dims VARCHAR,            -- JSON text of args["Input Dims"]
    kernel_backend VARCHAR         -- "triton" on inductor launches
);
CREATE TABLE IF NOT EXISTS comm_events (  -- the kernels / cpu_ops rows that carry collective metadata
    file_id INTEGER,
    source VARCHAR,                -- kernels (NCCL kernels) | cpu_ops (record_param_comms, nccl:* annotations)
    cat VARCHAR, name VARCHAR,
    ts_ns BIGINT, dur_ns BIGINT,   -- as in the source row: join on (file_id, ts_ns, correlation)
    correlation BIGINT, external_id BIGINT,
    collective VARCHAR,            -- "Collective name": allreduce, _allgather_base, ...
    in_nelems BIGINT, out_nelems BIGINT,  -- "In/Out msg nelems" (or "In/Out msg size" in older kineto)
    group_size BIGINT, comm_dtype VARCHAR,
    pg_name VARCHAR, pg_desc VARCHAR, pg_ranks VARCHAR, seq BIGINT
);
CREATE TABLE IF NOT EXISTS threads (
    file_id INTEGER, pid BIGINT, tid BIGINT,
    kind VARCHAR,                  -- thread_name | process_name | process_labels
    label VARCHAR
);
CREATE TABLE IF NOT EXISTS warnings (
    run_id INTEGER, file VARCHAR, message VARCHAR
);
CREATE TABLE IF NOT EXISTS run_facts (  -- what logs and configs state: per_device_batch, precision, ...
    run_id INTEGER, key VARCHAR, value VARCHAR, num DOUBLE, source VARCHAR
);
CREATE TABLE IF NOT EXISTS log_steps (  -- one row per step line of a training log
    run_id INTEGER, file VARCHAR, framework VARCHAR, rank INTEGER, step INTEGER, iter INTEGER, loss DOUBLE,
    lr DOUBLE, grad_norm DOUBLE, tokens_per_s DOUBLE, tflops DOUBLE, mfu_pct DOUBLE, step_time_ms DOUBLE,
    memory_gib DOUBLE, epoch DOUBLE
);
CREATE TABLE IF NOT EXISTS nccl_channels (  -- NCCL_DEBUG=INFO channel lines
    run_id INTEGER, file VARCHAR, host VARCHAR, device INTEGER, channel INTEGER, src_rank INTEGER,
    dst_rank INTEGER, transport VARCHAR, detail VARCHAR
);
CREATE TABLE IF NOT EXISTS topology_links (  -- nvidia-smi topo -m matrix cells
    run_id INTEGER, file VARCHAR, a VARCHAR, b VARCHAR, link VARCHAR
);
CREATE TABLE IF NOT EXISTS collective_calls (  -- collectives matched across ranks, per operation and size
    run_id INTEGER, collective VARCHAR, size_bytes BIGINT, count INTEGER, n_ranks INTEGER, transfer_us DOUBLE,
    wait_us DOUBLE, algbw_gbps DOUBLE, busbw_gbps DOUBLE
);
CREATE TABLE IF NOT EXISTS findings (
    run_id INTEGER, cause VARCHAR, kind VARCHAR, severity VARCHAR, impact_pct DOUBLE, ranks VARCHAR,
    title VARCHAR, evidence VARCHAR, recommendation VARCHAR
);
CREATE TABLE IF NOT EXISTS report_cache (  -- the last report's model, keyed by its inputs and options
    key VARCHAR, model JSON
);
"""

# Macros stored in the database so users can classify rows the way the metrics do, in their own queries.
MACROS = r"""
CREATE OR REPLACE MACRO kernel_class(cat, name) AS CASE
    WHEN regexp_matches(name, '^(void )?(nccl|rccl)') THEN 'communication'
    WHEN cat IN ('gpu_memcpy', 'gpu_memset') OR regexp_matches(name, '^(Memcpy|Memset|dma)') THEN 'memory'
    ELSE 'compute' END;
CREATE OR REPLACE MACRO cpu_op_class(cat, name) AS CASE
    WHEN name LIKE 'c10d::%' OR name LIKE 'gloo:%' OR name LIKE 'nccl:%' THEN 'communication'
    WHEN cat = 'cpu_op' AND name LIKE 'aten::%' THEN 'compute'
    ELSE 'other' END;
"""

# The profiler-step filter: one definition of a step for every metric (documented in traceanalyze.metrics.steps)
STEP_MACROS = r"""
CREATE OR REPLACE MACRO profiler_step(cat, name) AS
    CASE WHEN cat IN ('user_annotation', 'cpu_op') AND name LIKE 'ProfilerStep#%'
         THEN TRY_CAST(regexp_extract(name, '#(\d+)', 1) AS INTEGER) END;
CREATE OR REPLACE MACRO is_dataloader_op(name) AS
    name LIKE 'enumerate(DataLoader)#%' OR name LIKE 'enumerate(DataPipe)#%';
CREATE OR REPLACE MACRO profiler_steps(rid) AS TABLE
WITH s AS (
    SELECT c.file_id, f.rank, f."window", profiler_step(c.cat, c.name) AS step,
           min(c.ts_ns) AS start_ns, max(c.ts_ns + c.dur_ns) AS end_ns,
           arg_min(c.pid, c.ts_ns) AS pid, arg_min(c.tid, c.ts_ns) AS tid
    FROM cpu_ops c JOIN files f USING (file_id)
    WHERE f.run_id = rid AND f.rank IS NOT NULL AND profiler_step(c.cat, c.name) IS NOT NULL
    GROUP BY c.file_id, f.rank, f."window", profiler_step(c.cat, c.name)),
w AS (SELECT file_id, count(*) AS n, max(start_ns) AS last_start FROM s GROUP BY file_id),
e AS (SELECT s.*, (w.n >= 2 AND s.start_ns = w.last_start) AS window_edge FROM s JOIN w USING (file_id)),
ok AS (SELECT step FROM e WHERE NOT window_edge GROUP BY step
       HAVING count(DISTINCT rank) = (SELECT count(DISTINCT rank) FROM e))
SELECT e.file_id, e.rank, e."window", e.step, e.start_ns, e.end_ns, e.pid, e.tid, e.window_edge,
       (NOT e.window_edge AND e.step IN (SELECT step FROM ok)) AS counted
FROM e;
"""

MACROS += STEP_MACROS

WORKER_CHUNK_ROWS = 1 << 13  # rows a parse worker holds before writing them out
PART_BYTES = 128 << 20  # a plain-JSON file over SPLIT_MIN_BYTES is parsed in byte ranges of about this size
INGEST_MEMORY_LIMIT = "64MB"  # DuckDB's buffer pool while trace files are loaded (see load_traces)
# Whole files share a transaction, up to this many files or TRANSACTION_ROWS rows: a COMMIT syncs to disk, and one
# per file was 21.8 s of a 47 s report on 1,024 small ranks. The rows bound keeps a transaction's memory bounded.
TRANSACTION_FILES = 64
TRANSACTION_ROWS = 2_000_000

# Tables that describe the latest report only; emptied before a report is recomputed.
REPORT_TABLES = ("runs", "warnings", "run_facts", "log_steps", "nccl_channels", "topology_links", "collective_calls",
                 "findings", "report_cache")

# What-if replay (traceanalyze.replay, docs/replay.md): each rank's dependency graph and the replayed step times.
# Host and stream order edges are implicit (consecutive tasks of one resource); the view sim_edge lists them with
# the explicit ones, and sim_gap the host gaps (each stored on the task that follows it).
REPLAY_DDL = """
CREATE TABLE IF NOT EXISTS sim_task (
    run_id INTEGER, task_id BIGINT, rank INTEGER,
    resource VARCHAR,              -- host:<pid>/<tid> | stream:<device>/<stream> | comm:<pid>/<tid> (gloo thread)
    kind VARCHAR,                  -- host | kernel | memcpy | memset | collective | step_begin | step_end
    name VARCHAR, step INTEGER,    -- step: the ProfilerStep#N it starts in (NULL outside steps)
    start_us DOUBLE, dur_us DOUBLE,  -- measured, on the rank's clock minus the run's first timestamp
    gap_us DOUBLE,                 -- measured host gap before this task on its resource (host resources)
    gap_label VARCHAR              -- dataloader | compile | optimizer | launch | host: what encloses the gap
);
CREATE TABLE IF NOT EXISTS sim_dep (  -- explicit edges: dst may start at (start or end of src) + offset_us
    run_id INTEGER, src BIGINT, dst BIGINT,
    edge_type VARCHAR,             -- launch | gpu_cpu_sync | inter_thread | collective_wait
    from_end BOOLEAN, offset_us DOUBLE
);
CREATE TABLE IF NOT EXISTS sim_coll (  -- collective instances matched across ranks (rendezvous)
    run_id INTEGER, instance_id BIGINT, rank INTEGER, task_id BIGINT, matched_by VARCHAR, collective VARCHAR,
    bytes BIGINT, start_us DOUBLE, end_us DOUBLE, transfer_us DOUBLE, blocking_us DOUBLE, complete BOOLEAN
);
CREATE TABLE IF NOT EXISTS sim_result (  -- step time per rank and step: measured, and replayed per scenario
    run_id INTEGER, scenario VARCHAR, rank INTEGER, step INTEGER, measured_us DOUBLE, replayed_us DOUBLE
);
CREATE OR REPLACE VIEW sim_gap AS
    SELECT run_id, task_id AS before_task, rank, resource, start_us - gap_us AS start_us, gap_us AS dur_us,
           gap_label AS label, step FROM sim_task WHERE gap_us > 0;
CREATE OR REPLACE VIEW sim_edge AS
    SELECT run_id, lag(task_id) OVER w AS src, task_id AS dst,
           CASE WHEN resource LIKE 'stream:%' THEN 'stream_order' ELSE 'host_order' END AS edge_type,
           gap_us AS weight_us
    FROM sim_task WINDOW w AS (PARTITION BY run_id, resource ORDER BY start_us, task_id)
    QUALIFY lag(task_id) OVER w IS NOT NULL
    UNION ALL SELECT run_id, src, dst, edge_type, offset_us FROM sim_dep
    UNION ALL SELECT a.run_id, a.task_id, b.task_id, 'collective', b.transfer_us FROM sim_coll a
        JOIN sim_coll b ON a.run_id = b.run_id AND a.instance_id = b.instance_id AND a.rank <> b.rank
        WHERE a.complete;
"""
DDL += REPLAY_DDL
REPORT_TABLES += ("sim_task", "sim_dep", "sim_coll", "sim_result")


@dataclass
class LoadedFile:
    """One trace file's place in the store after :func:`load_traces`."""

    path: Path
    file_id: int | None
    cached: bool
    info: TraceFile | None
    error: str | None


def connect(db_path: str | Path | None) -> duckdb.DuckDBPyConnection:
    """Open (or create) the database and make sure the schema exists.

    ``db_path`` None gives an in-memory database. Raises :class:`TraceanalyzeError` when another process
    holds the file (two concurrent reports on one database) or the file is not a DuckDB database.

    Only a database traceanalyze created is opened for writing (:func:`traceanalyze.safety.check_own_db`): an
    existing file without the marker table of a report database, or a batch catalog, raises
    :class:`~traceanalyze.errors.UsageError` and is left byte-identical. An unmarked database of an earlier
    traceanalyze (its tables and ``meta.schema_version``) is migrated: it gets the marker, and its tables are
    rebuilt when the schema version differs.
    """
    from traceanalyze.safety import check_own_db, write_marker

    check_own_db(db_path, "report")
    try:
        con = duckdb.connect(str(db_path) if db_path else ":memory:")
    except duckdb.IOException as exc:
        msg = str(exc)
        if "lock" in msg.lower():
            raise TraceanalyzeError(
                f"{db_path}: the database is in use by another traceanalyze run; wait for it to finish "
                "or pass a different --db") from None
        _raise_environment(db_path, msg)
        raise TraceanalyzeError(f"{db_path}: cannot open the database ({msg.splitlines()[0]})") from None
    except duckdb.Error as exc:
        raise TraceanalyzeError(f"{db_path}: not a usable DuckDB database ({str(exc).splitlines()[0]})") from None
    _drop_if_old(con)
    con.execute(DDL)
    # the cache key's content part (README, Safety: the cache is never stale); NULL in a database of an earlier
    # version, so none of its rows is reused before the file is read again
    con.execute("ALTER TABLE files ADD COLUMN IF NOT EXISTS fingerprint VARCHAR")
    con.execute(MACROS)
    write_marker(con, SCHEMA_VERSION, "report")
    return con


def _raise_environment(path, msg: str) -> None:
    """DuckDB's messages for a refused write (disk full, permission, read-only) as an EnvironmentFailure."""
    import errno

    from traceanalyze.errors import EnvironmentFailure

    low = msg.lower()
    for needle, code, why in (("no space left", errno.ENOSPC, "the disk is full"),
                              ("read-only file system", errno.EROFS, "the folder is on a read-only file system"),
                              ("permission denied", errno.EACCES, "permission denied")):
        if needle in low:
            raise EnvironmentFailure(f"{path}: cannot write the database: {why}; free space or pass --db in a "
                                     "folder you can write to", stage="opening the database", code=code) from None


def _drop_if_old(con: duckdb.DuckDBPyConnection) -> None:
    """A database from another schema version is a stale cache: drop its tables so they are rebuilt."""
    has_meta = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = 'meta'"
                           ).fetchone()[0]
    if not has_meta:
        return
    row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is not None and row[0] == str(SCHEMA_VERSION):
        return
    for (name,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall():
        con.execute(f'DROP TABLE "{name}"')


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


FINGERPRINT_BLOCK = 64 << 10  # bytes hashed at each end of a file
FINGERPRINT_WHOLE = 1 << 20  # files up to this size are hashed whole


def fingerprint(path: Path) -> str:
    """A content fingerprint of one file: SHA-256 over its size, mtime (ns) and bytes: the whole file up to
    :data:`FINGERPRINT_WHOLE`, else its first and last :data:`FINGERPRINT_BLOCK` (64 KiB each). A file rewritten
    with the same size and mtime restored (``cp -p``, ``touch -r``, a clock step) still differs at either end: a
    trace's header and its final events and metadata. Raises OSError when the file cannot be read."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        h.update(f"{st.st_size} {st.st_mtime_ns}|".encode())
        if st.st_size <= FINGERPRINT_WHOLE:
            h.update(fh.read(FINGERPRINT_WHOLE + 1))
        else:
            h.update(fh.read(FINGERPRINT_BLOCK))
            fh.seek(-FINGERPRINT_BLOCK, os.SEEK_END)
            h.update(fh.read(FINGERPRINT_BLOCK))
    return h.hexdigest()


def forget_files(con: duckdb.DuckDBPyConnection, keep: Iterable[Path]) -> int:
    """Delete the ``files`` rows, and their events, of every file that is not in ``keep`` (the trace files of
    this report): files that left the folder (or another folder's, in a shared ``--db``) are never reused, and
    their rows no longer travel with the database. Returns the number of files forgotten."""
    from traceanalyze.ingest import TABLES

    kept = []
    for p in keep:
        try:
            kept.append(str(Path(p).resolve()))
        except OSError:
            continue
    gone = [r[0] for r in con.execute("SELECT file_id FROM files WHERE path NOT IN (SELECT unnest(?::VARCHAR[]))",
                                      [kept]).fetchall()]
    if gone:
        con.execute("BEGIN TRANSACTION")
        try:
            for t in (*TABLES, "files"):
                con.execute(f"DELETE FROM {t} WHERE file_id IN (SELECT unnest(?::INTEGER[]))", [gone])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return len(gone)


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pandas":
            raise ImportError("pandas is not imported by the traceanalyze command line")
        return None


def block_pandas() -> None:
    """Make ``import pandas`` fail in this process unless it is already imported.

    pyarrow imports pandas, when installed, on its first array conversion: 0.2 s and ~50 MB in the main process
    and in each parse worker. The command line never builds a DataFrame, so it calls this first; the Python
    API does not (users' pandas must keep working).
    """
    if "pandas" not in sys.modules and not _pandas_blocked():
        sys.meta_path.insert(0, _NoPandas())


def _pandas_blocked() -> bool:
    return any(isinstance(f, _NoPandas) for f in sys.meta_path)


def _worker_init(no_pandas: bool) -> None:
    if no_pandas:  # as in the parent; matters where workers start fresh (spawn, forkserver) instead of forking
        block_pandas()
    import pyarrow as pa

    # mimalloc (pyarrow's default) keeps what a parse freed: ~35 MB more per worker, for no speed we can measure
    pa.set_memory_pool(pa.system_memory_pool())


def _parse_one(args: tuple) -> tuple[str, TraceFile | None, dict | None, str | None]:
    """Parse one file or one byte range of it, in a worker or here; return (path, summary, tables, error).

    ``tables`` maps table name to an Arrow IPC stream in ``out_dir``, written chunk by chunk, which DuckDB then
    reads a chunk at a time: memory bounded on both sides whatever the file's size, and cheaper than pickling
    the columns through a pipe. In this process too (one file, ``-j 1``) it is ~40 MB less than building the
    file's tables in memory, at the same speed.
    """
    import gc

    from traceanalyze.ingest import parse_trace

    path, out_dir, key, max_decompressed, byte_range = args[:5]
    part = args[5] if len(args) > 5 else None  # a part file inflated from a .gz (see _work_items)
    gc.disable()  # millions of short-lived objects; collection passes only cost time here
    try:
        info, tables = parse_trace(path, out_dir, key=key, max_decompressed=max_decompressed, byte_range=byte_range,
                                   chunk_rows=WORKER_CHUNK_ROWS, part=part)
        return path, info, tables, None
    except InputError as exc:
        return path, None, None, exc.problem
    except MemoryError:
        return path, None, None, "ran out of memory while parsing"
    except Exception as exc:  # a bug or an unforeseen input must not stop the other ranks
        return path, None, None, f"could not be parsed ({type(exc).__name__}: {exc})"
    finally:
        gc.enable()


def load_traces(con: duckdb.DuckDBPyConnection, paths: Iterable[Path], *, jobs: int | None = None,
                progress: Callable[[int], None] | None = None,
                max_decompressed: int = 64 << 30, executor=None, parts_dir: str | Path | None = None
                ) -> list[LoadedFile]:
    """Parse the trace files not already in the store (cache key: resolved path, size, mtime and
    :func:`fingerprint`) and load them.

    Files are parsed into Arrow IPC streams, in ``jobs`` processes (default: the CPU count, at most the number of
    files; in this process when that is one). This process loads each file in its own transaction as soon as it
    is parsed, while the others are still being parsed. A plain-JSON file over :data:`ingest.SPLIT_MIN_BYTES` is
    parsed in byte ranges of about :data:`PART_BYTES`, committed one by one (see :class:`_FileLoad`). While
    loading, DuckDB runs one thread with a buffer pool of :data:`INGEST_MEMORY_LIMIT`. ``progress`` is called with
    each file's size in bytes as it finishes. Returns one :class:`LoadedFile` per path, in input order; a file that
    failed has ``error`` set and no rows.

    A ``.gz`` file that inflates to more than :data:`ingest.SPLIT_MIN_BYTES` is inflated here (ISA-L, every member)
    into part files cut before an event (:func:`ingest.inflate_parts`), which the processes parse like the byte
    ranges of a plain file; a stream that turns out damaged or truncated is parsed whole instead, which reports it.

    ``executor`` (an object with ``results(fn, tasks)``, as :class:`traceanalyze.batch.DaskExecutor`) parses the
    files there instead of in local processes: the workers write Arrow IPC streams into ``parts_dir`` (a folder
    that they and this process both see, default a temporary folder), which this process loads as above.
    """
    paths = list(paths)
    out: dict[Path, LoadedFile] = {}
    todo: list[tuple[Path, tuple[str, int, int]]] = []
    prints: dict[str, str] = {}  # resolved path -> content fingerprint, stored once the file is loaded
    first: dict[str, Path] = {}  # resolved path -> the first of the given paths that names it
    alias: dict[Path, Path] = {}
    for p in paths:
        try:
            key = _stat_key(p)
            prints[key[0]] = fingerprint(p)
        except OSError as exc:
            out[p] = LoadedFile(p, None, False, None, f"cannot read ({exc.strerror or exc})")
            continue
        if first.setdefault(key[0], p) != p:  # one file under two names (a link): parsed and stored once
            alias[p] = first[key[0]]
            continue
        row = con.execute("SELECT file_id, status, message FROM files WHERE path = ? AND size_bytes = ? "
                          "AND mtime_ns = ? AND fingerprint = ?", [*key, prints[key[0]]]).fetchone()
        if row is not None and row[1] in ("ok", "partial"):
            out[p] = LoadedFile(p, row[0], True, None, None)
            if progress:
                progress(key[1])
        else:
            todo.append((p, key))
    if todo:
        import pyarrow as pa


        if parts_dir is not None:
            Path(parts_dir).mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="traceanalyze-", dir=parts_dir)
        # DuckDB keeps every block it just wrote in its buffer pool (~12 MB per 47 MB trace); they are on disk
        # already, so a low limit while loading only lets them go, and the analysis re-reads what it needs
        con.execute(f"SET memory_limit = '{INGEST_MEMORY_LIMIT}'")
        # the parse workers use every core meanwhile: a second DuckDB thread only adds hand-off cost (-25 % CPU)
        con.execute("SET threads = 1")
        # the system allocator for Arrow while loading, as in the workers (see _worker_init): the IPC chunks read
        # here and a parse in this process (one file, -j 1) leave less behind (-15 to -20 MB); put back after
        arrow_pool = pa.default_memory_pool()
        pa.set_memory_pool(pa.system_memory_pool())
        try:
            n_cpu = max(1, jobs or os.cpu_count() or 1)
            n_parts: dict[str, int] = {}
            origin: dict[str, str] = {}  # part file inflated from a .gz -> that .gz
            whole: dict[str, str | None] = {}  # .gz split into part files -> its last part (None: parse it whole)
            items = _work_items(todo, tmp, max_decompressed, n_cpu, n_parts, origin, whole)
            head = list(itertools.islice(items, n_cpu))  # one task (one small file): parsed here, no pool
            work = itertools.chain(head, items)
            n_jobs = max(1, min(n_cpu, len(head)))
            keys = {str(p): (p, k) for p, k in todo}
            pool = None
            if executor is None and n_jobs > 1:
                from concurrent.futures import ProcessPoolExecutor  # multiprocessing: not for one file or a re-run
            if executor is not None:
                results: Iterable = _in_order(executor.results(_parse_task, list(enumerate(work))))
            elif n_jobs == 1:
                results = map(_parse_one, work)
            else:
                pool = ProcessPoolExecutor(max_workers=n_jobs, initializer=_worker_init,
                                           initargs=(_pandas_blocked(),))
                futures = [pool.submit(_parse_one, w) for w in work]  # a .gz is inflated meanwhile, part by part
                results = (f.result() for f in futures)
            batch = _Batch(con, prints)
            try:
                load: _FileLoad | None = None
                for path_s, info, tables, err in results:  # in order: the parts of a file arrive together
                    part_file = path_s if path_s in origin else None
                    path_s = origin.get(path_s, path_s)
                    p, key = keys[path_s]
                    if n_parts[path_s] == 1 and path_s not in whole:
                        out[p] = batch.add(p, key, info, tables, err)
                        if progress:
                            progress(key[1])
                        continue
                    if load is None:
                        batch.commit()  # a split file commits part by part: no batch open meanwhile
                        load = _FileLoad(con, p, key, n_parts[path_s], (tmp, max_decompressed))
                        if path_s in whole:
                            load.tail = whole[path_s]
                            load.force_whole = whole[path_s] is None
                    load.add(info, tables, err)
                    if part_file is not None:
                        Path(part_file).unlink(missing_ok=True)
                    if load.done:
                        out[p] = load.finish()
                        load = None
                        con.execute("UPDATE files SET fingerprint = ? WHERE path = ?", [prints[key[0]], key[0]])
                        if progress:
                            progress(key[1])
                batch.commit()
            except BaseException:
                if load is not None:
                    load.abort()
                batch.abort()
                raise
            finally:
                if pool is not None:
                    pool.shutdown(cancel_futures=True)
        finally:
            pa.set_memory_pool(arrow_pool)
            con.execute("RESET memory_limit")
            con.execute("RESET threads")
            shutil.rmtree(tmp, ignore_errors=True)
    return [out[alias.get(p, p)] for p in paths]


def _work_items(todo, tmp: str, max_decompressed: int, n_cpu: int, n_parts: dict, origin: dict, whole: dict):
    """The parse tasks ``(path, out_dir, key, max_decompressed, byte_range[, part])``, file by file, parts of a file
    in order; fills ``n_parts`` (file -> parts), ``origin`` and ``whole`` (for .gz files inflated into parts)."""
    from traceanalyze.ingest import SPLIT_MIN_BYTES, gzip_json_size, inflate_parts, split_points

    for i, (p, k) in enumerate(todo):
        est = 0
        if n_cpu > 1 and k[1] >= SPLIT_MIN_BYTES >> 6:
            with open(p, "rb") as fh:
                if fh.read(2) == b"\x1f\x8b":
                    est = gzip_json_size(p)
        if est >= SPLIT_MIN_BYTES:
            n = max(n_cpu, -(-est // PART_BYTES))
            state: dict = {}
            # inflating far past what the gzip trailer says is a bomb: stop, and let the whole parse report it
            bound = min(max_decompressed, 2 * est + (256 << 20))
            prev, j = None, 0
            for j, name in enumerate(inflate_parts(p, tmp, f"f{i}g", -(-est // n), bound, state)):
                origin[name] = str(p)
                if prev is not None:
                    yield (prev, tmp, f"f{i}p{j - 1}", max_decompressed, None, (j > 1, True))
                prev = name
            if prev is not None:
                yield (prev, tmp, f"f{i}p{j}", max_decompressed, None, (j > 0, False))
            n_parts[str(p)] = j + 1
            whole[str(p)] = prev if state.get("clean") else None
            continue
        # a big plain-JSON file is cut into byte ranges at event boundaries: more ranges than processes, so that
        # the first ones are loaded while the others are still being parsed, and each range is committed alone
        # (with one process too: memory stays bounded by a range)
        n_ranges = max(n_cpu, -(-k[1] // PART_BYTES))
        points = split_points(p, n_ranges) if n_ranges > 1 else [0]
        ends = points[1:] + [k[1]]
        n_parts[str(p)] = len(points)
        for j, (a, b) in enumerate(zip(points, ends, strict=True)):
            yield (str(p), tmp, f"f{i}p{j}", max_decompressed, None if len(points) == 1 else (a, b))


def _parse_task(task: tuple[int, tuple]) -> tuple:
    """:func:`_parse_one` of an ``(index, task)`` pair, for executors that return results as they finish."""
    return _parse_one(task[1])


def _in_order(results):
    """``(task, result, error)`` of ``(index, task)`` pairs as an executor finishes them -> the results in task
    order, so that the parts of a file arrive together; only results that wait for an earlier one are held."""
    held: dict[int, tuple] = {}
    nxt = 0
    for task, res, err in results:
        held[task[0]] = res if res is not None else (task[1][0], None, None, f"could not be parsed ({err})")
        while nxt in held:
            yield held.pop(nxt)
            nxt += 1


def _join_parts(parts: list[tuple[TraceFile | None, str | None]]) -> tuple[TraceFile | None, str | None]:
    """One summary for a file parsed in byte ranges, from each part's (summary, error): the first part's header
    plus the keys after the events (``baseTimeNanoseconds``) that the last part read; counts and warnings of all
    parts."""
    from traceanalyze.ingest import _header_base_ns

    errs = [e for _, e in parts if e]
    if errs or len(parts) == 1:
        return (None, errs[0]) if errs else (parts[0][0], None)
    infos = [i for i, _ in parts]
    first, last = infos[0], infos[-1]
    first.header = {**first.header, **last.header}
    first.base_time_ns = _header_base_ns(first.header)
    first.partial = last.partial
    first.bytes_read = sum(i.bytes_read for i in infos)
    first.skipped_events = sum(i.skipped_events for i in infos)
    first.warnings = [w for i in infos for w in i.warnings]
    first.counts = {k: sum(i.counts.get(k, 0) for i in infos) for k in first.counts}
    return first, None


class _Batch:
    """Whole (unsplit) trace files loaded into the store, many per transaction.

    Up to :data:`TRANSACTION_FILES` files or :data:`TRANSACTION_ROWS` rows share one transaction, and each of its
    tables is filled by one ``INSERT`` that reads the files' Arrow IPC streams one after another: per file, the main
    process only reads its summary. A file loaded again (changed on disk, or left ``loading`` by an interrupted run)
    has its old rows deleted in the same transaction.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, prints: dict[str, str]) -> None:
        self.con = con
        self.prints = prints  # resolved path -> content fingerprint (:func:`fingerprint`), stored with the file
        self.items: list[tuple[int, int, dict]] = []  # (file_id, base_time_ns, table -> IPC stream) to insert
        self.rows: list[list] = []  # files rows
        self.old: list[int] = []  # file_ids whose rows go
        self.n_rows = 0
        self.next_id: int | None = None
        self.old_ids: dict[str, int] | None = None

    def add(self, path: Path, key: tuple[str, int, int], info: TraceFile | None, tables: dict | None,
            err: str | None) -> LoadedFile:
        if self.next_id is None:
            con = self.con
            # fetchall: DuckDB 2 keeps a half-read result open, which blocks register() below
            self.old_ids = dict(con.execute("SELECT path, file_id FROM files").fetchall())
            self.next_id = con.execute("SELECT coalesce(max(file_id), 0) + 1 FROM files").fetchall()[0][0]
        old = self.old_ids.pop(key[0], None)
        if old is not None:
            self.old.append(old)
        file_id = self.next_id
        self.next_id += 1
        resolved, size, mtime = key
        if info is None:
            self.rows.append([file_id, resolved, size, mtime, "error", err] + [None] * 5 + [self.prints.get(resolved)])
        else:
            self.rows.append([file_id, resolved, size, mtime, "partial" if info.partial else "ok",
                              "; ".join(info.warnings) or None, info.bytes_read, int(info.base_time_ns),
                              json.dumps(info.header, default=str), info.counts.get("kernels", 0),
                              info.counts.get("cpu_ops", 0), self.prints.get(resolved)])
            self.items.append((file_id, int(info.base_time_ns), tables))
            self.n_rows += sum(info.counts.values())
        if len(self.rows) >= TRANSACTION_FILES or self.n_rows >= TRANSACTION_ROWS:
            self.commit()
        return LoadedFile(path, file_id, False, info, err)

    def commit(self) -> None:
        """Insert the files held so far in one transaction; their temporary streams are deleted."""
        if not self.rows:
            return
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            if self.old:
                from traceanalyze.ingest import TABLES

                for t in (*TABLES, "files"):
                    con.execute(f"DELETE FROM {t} WHERE file_id IN (SELECT unnest(?))", [self.old])
            if self.items:
                _insert_part(con, self.items)
            insert_rows(con, "files", ["file_id", "path", "size_bytes", "mtime_ns", "status", "message",
                                       "bytes_read", "base_time_ns", "header", "n_kernels", "n_cpu_ops", "fingerprint"],
                        self.rows)
            con.execute("COMMIT")
        except BaseException:
            self.abort()
            raise
        finally:
            self._clear()

    def _clear(self) -> None:
        for _, _, tables in self.items:
            for f in (tables or {}).values():
                Path(f).unlink(missing_ok=True)
        self.items, self.rows, self.old, self.n_rows = [], [], [], 0
        self.next_id = None  # asked again: a split file between two batches takes the next id

    def abort(self) -> None:
        try:
            self.con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction open
        self._clear()


class _FileLoad:
    """One trace file loaded into the store, a part (byte range) at a time as the parts arrive.

    A file parsed in one piece is loaded in one transaction. A file cut into byte ranges is loaded part by part
    while the later parts are still being parsed, one transaction per part: DuckDB holds a transaction's rows in
    memory until it commits, so one transaction for a multi-GB file would need memory in proportion to the file.
    Its ``files`` row says ``loading`` until the last part is in; such a file is never a cache hit, and its rows
    are deleted when it is loaded again (an interrupted run) or when a part fails.

    ``baseTimeNanoseconds`` often follows the events, so the parts are shifted by the value read from the file's
    tail beforehand (:func:`ingest.tail_base_time_ns`) and corrected at the end in the rare case the parsed
    header says otherwise.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, key: tuple[str, int, int], n_parts: int,
                 whole: tuple[str, int] | None = None) -> None:
        self.con, self.path, self.key, self.n_parts = con, path, key, n_parts
        self.whole = whole  # (temporary folder, max_decompressed) for parsing the file whole after a bad split
        self.tail: str | None = None  # a .gz inflated into parts: the last part, whose end holds the tail keys
        self.force_whole = False  # a .gz whose inflation into parts did not end cleanly: parse it whole
        self.parts: list[tuple[TraceFile | None, str | None]] = []  # (summary, error) per part; rows go at once
        self.base: int | None = None  # the shift applied to the parts inserted so far
        self.split = n_parts > 1
        self.file_id = self._begin()

    @property
    def done(self) -> bool:
        return len(self.parts) == self.n_parts

    def _begin(self) -> int:
        con = self.con
        con.execute("BEGIN TRANSACTION")
        # fetchall: DuckDB 2 keeps a half-read result open, which blocks register() below
        old = next(iter(con.execute("SELECT file_id FROM files WHERE path = ?", [self.key[0]]).fetchall()), None)
        if old is not None:
            self._delete_rows(old[0])
            con.execute("DELETE FROM files WHERE file_id = ?", [old[0]])
        file_id = con.execute("SELECT coalesce(max(file_id), 0) + 1 FROM files").fetchall()[0][0]
        if self.split:
            con.execute("INSERT INTO files (file_id, path, size_bytes, mtime_ns, status) "
                        "VALUES (?, ?, ?, ?, 'loading')", [file_id, *self.key])
            con.execute("COMMIT")
        return file_id

    def _delete_rows(self, file_id: int) -> None:
        from traceanalyze.ingest import TABLES

        for t in TABLES:
            self.con.execute(f"DELETE FROM {t} WHERE file_id = ?", [file_id])

    def _split_broken(self) -> bool:
        return self.force_whole or any(i is not None and not i.split_ok for i, _ in self.parts)

    def add(self, info: TraceFile | None, tables: dict | None, err: str | None) -> None:
        self.parts.append((info, err))
        if info is None or any(e for _, e in self.parts) or self._split_broken():
            for f in (tables or {}).values():
                Path(f).unlink(missing_ok=True)
            return  # the file fails, or is parsed whole at the end: nothing more is inserted
        if self.base is None:
            if not self.split:
                self.base = int(info.base_time_ns)
            else:
                from traceanalyze.ingest import tail_base_time_ns

                self.base = tail_base_time_ns(self.tail or self.path, info.header)
        if self.split:
            self.con.execute("BEGIN TRANSACTION")
        try:
            _insert_part(self.con, self.file_id, self.base, tables)
            if self.split:
                self.con.execute("COMMIT")
        except BaseException:
            if self.split:
                self.abort()
            raise
        finally:  # a part's temporary files go at once: a 10 GB trace would otherwise pile up GBs of them
            for f in (tables or {}).values():
                Path(f).unlink(missing_ok=True)

    def _parse_whole(self) -> None:
        """A part did not end between two events (guarantee 7): drop the parts' rows and parse the file in one
        piece in this process, so that its rows are exactly those of an unsplit parse."""
        tmp, max_decompressed = self.whole or (tempfile.gettempdir(), 64 << 30)
        self.con.execute("BEGIN TRANSACTION")
        try:
            self._delete_rows(self.file_id)
            self.con.execute("COMMIT")
        except BaseException:
            self.abort()
            raise
        _, info, tables, err = _parse_one((str(self.path), tmp, f"whole{self.file_id}", max_decompressed, None))
        self.parts, self.split, self.base, self.tail, self.force_whole = [], True, None, None, False
        self.n_parts = 1
        self.add(info, tables, err)

    def finish(self) -> LoadedFile:
        con = self.con
        if self._split_broken():
            self._parse_whole()
        info, err = _join_parts(self.parts)
        resolved, size, mtime = self.key
        if self.split:
            con.execute("BEGIN TRANSACTION")
        try:
            if info is None:
                if self.split:
                    self._delete_rows(self.file_id)
                    con.execute("DELETE FROM files WHERE file_id = ?", [self.file_id])
                else:
                    con.execute("ROLLBACK")  # drop what was inserted
                    con.execute("BEGIN TRANSACTION")
                con.execute("INSERT INTO files (file_id, path, size_bytes, mtime_ns, status, message) "
                            "VALUES (?, ?, ?, ?, 'error', ?)", [self.file_id, resolved, size, mtime, err])
            else:
                base = int(info.base_time_ns)
                if self.base is not None and base != self.base:
                    from traceanalyze.ingest import TABLES

                    for t in (t for t, schema in TABLES.items() if "ts_ns" in schema.names):
                        con.execute(f"UPDATE {t} SET ts_ns = ts_ns + ? WHERE file_id = ?",
                                    [base - self.base, self.file_id])
                con.execute("DELETE FROM files WHERE file_id = ?", [self.file_id])  # the 'loading' row, if any
                con.execute(
                    "INSERT INTO files (file_id, path, size_bytes, mtime_ns, status, message, bytes_read, "
                    "base_time_ns, header, n_kernels, n_cpu_ops) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [self.file_id, resolved, size, mtime, "partial" if info.partial else "ok",
                     "; ".join(info.warnings) or None, info.bytes_read, base,
                     json.dumps(info.header, default=str), info.counts.get("kernels", 0),
                     info.counts.get("cpu_ops", 0)])
            con.execute("COMMIT")
        except BaseException:
            self.abort()
            raise
        return LoadedFile(self.path, self.file_id, False, info, err)

    def abort(self) -> None:
        try:
            self.con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction open


def _insert_part(con: duckdb.DuckDBPyConnection, file_id, base: int = 0, tables: dict | None = None) -> None:
    """Insert parsed parts from the Arrow IPC streams their parsers wrote.

    Either one part (``file_id``, ``base``, ``tables``: table name -> stream file) or, with ``file_id`` a list of
    ``(file_id, base_time_ns, tables)``, many files with one ``INSERT`` per table: DuckDB reads the streams one
    after another, a chunk at a time, with each row's ``file_id`` and ``ts_ns + base`` added on the way.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from traceanalyze.ingest import TABLES  # not at module level: a cached report never parses

    items = file_id if isinstance(file_id, list) else [(file_id, base, tables)]
    for t, schema in TABLES.items():
        names = ", ".join(f'"{c}"' for c in schema.names)
        out_schema = pa.schema([("file_id", pa.int32()), *schema])
        ts_at = schema.names.index("ts_ns") if "ts_ns" in schema.names else None

        def batches(t=t, ts_at=ts_at, out_schema=out_schema):
            for fid, shift, files in items:
                with pa.OSFile(files[t]) as fh:
                    for b in pa.ipc.open_stream(fh):
                        if not b.num_rows:
                            continue
                        cols = b.columns
                        if ts_at is not None and shift:
                            cols[ts_at] = pc.add(cols[ts_at], shift)
                        yield pa.RecordBatch.from_arrays([pa.array(np.full(b.num_rows, fid, np.int32)), *cols],
                                                         schema=out_schema)

        con.register("_incoming", pa.RecordBatchReader.from_batches(out_schema, batches()))  # read a chunk at a time
        try:
            con.execute(f"INSERT INTO {t} (file_id, {names}) SELECT file_id, {names} FROM _incoming")
        finally:
            con.unregister("_incoming")


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, cols: list[str] | None, rows: list[list]) -> None:
    """Insert ``rows`` (values in ``cols`` order; all of the table's columns, in order, when ``cols`` is None)
    into ``table`` with one statement, one list per column.

    ``executemany`` runs the statement once per row, which costs far more than the rows themselves.

    Raises:
        duckdb.Error: a value does not fit its column (the whole insert is refused).
    """
    if rows:
        values = ", ".join(f"unnest(${i + 1})" for i in range(len(rows[0])))
        target = f"{table} ({', '.join(cols)})" if cols is not None else table
        con.execute(f"INSERT INTO {target} SELECT {values}", [list(col) for col in zip(*rows, strict=True)])


def file_header(con: duckdb.DuckDBPyConnection, file_id: int) -> dict:
    """The stored top-level header of one file (``{}`` when none)."""
    row = con.execute("SELECT header FROM files WHERE file_id = ?", [file_id]).fetchone()
    return header_dict(row[0] if row else None)


def header_dict(text: str | None) -> dict:
    """A ``files.header`` value as a dict (``{}`` when none or not an object)."""
    if text is None:
        return {}
    try:
        h = json.loads(text)
        return h if isinstance(h, dict) else {}
    except ValueError:
        return {}
