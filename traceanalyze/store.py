"""Store: the DuckDB database every later stage reads: its schema, its version and its marker.

The database is an artifact: users open it with ``duckdb FILE`` (or ``traceanalyze sql FILE "..."``).
Event tables carry ``file_id``; ``files`` maps a file to its run, rank and profiling window, so per-rank
queries join on it. Times are integer nanoseconds (``ts_ns``, ``dur_ns``); ``ts_ns`` is on the rank's
own clock (``baseTimeNanoseconds`` applied), not aligned across hosts. See ``docs/schema.md``.

This module is the only one that holds DDL: the report database (:data:`DDL`, the macros, the metric, idle and
replay tables) and the batch catalog (:data:`CATALOG_DDL`). The columns of the tables the parser fills are read
from that DDL (:data:`EVENT_COLUMNS`), so :mod:`traceanalyze.ingest.parse` builds its Arrow schemas from them.

It also recognises our DuckDB files (docs/safety.md): ``--db``, the parse cache and the batch catalog change only
a DuckDB file that traceanalyze created, recognised by its marker table (:data:`MARKER_TABLE`: tool, schema
version, role; :func:`check_own_db`), and a database a user hands in is opened read-only, without file-system
access and without extension autoload/autoinstall, its configuration locked (:func:`open_untrusted`).

Loading parsed files into these tables (the parse cache, transactions) is :mod:`traceanalyze.ingest.load`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from traceanalyze.errors import EnvironmentFailure, TraceanalyzeError, UsageError

SCHEMA_VERSION = 7  # 7: run_deaths; a database written with another version is rebuilt: it is a cache of the traces

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
    pg_name VARCHAR, pg_desc VARCHAR, pg_ranks VARCHAR, seq BIGINT,
    comms_id VARCHAR               -- "Comms Id": one value on every participant of an instance (newer kineto)
);
CREATE TABLE IF NOT EXISTS cuda_syncs (  -- Kineto cuda_sync rows: a stream waiting on an event, a host sync
    file_id INTEGER,
    name VARCHAR,                  -- Stream Wait Event | Event Sync | Stream Sync | Context Sync
    device BIGINT, stream BIGINT,  -- the stream that waits (Stream Wait Event) or is synchronized
    ts_ns BIGINT, dur_ns BIGINT,
    correlation BIGINT,            -- == the cuda_runtime call's (cudaStreamWaitEvent, cudaStreamSynchronize, ...)
    wait_on_stream BIGINT,         -- Stream Wait Event: the stream the awaited event was recorded on
    wait_on_corr BIGINT            -- ... and the correlation of that cudaEventRecord call
);
CREATE TABLE IF NOT EXISTS memory_events (  -- the allocator's [memory] instants (profile_memory=True); no rows without
    file_id INTEGER,
    pid BIGINT, tid BIGINT,        -- the thread that allocated or freed
    ts_ns BIGINT,                  -- when, on the rank's clock (ns)
    device_type BIGINT,            -- "Device Type": 0 CPU, 1 CUDA (c10::DeviceType)
    device_id BIGINT,              -- "Device Id": -1 for the CPU, the GPU's index
    addr BIGINT,                   -- "Addr": the block's address; an allocation and its free share it
    bytes BIGINT,                  -- "Bytes": > 0 allocated, < 0 freed
    total_allocated BIGINT,        -- "Total Allocated" after this event (bytes, on this device)
    total_reserved BIGINT          -- "Total Reserved" by the caching allocator after this event (bytes)
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
CREATE TABLE IF NOT EXISTS run_deaths (  -- a process that died of memory or was killed, as a log records it
    run_id INTEGER,
    kind VARCHAR,                  -- cuda_oom | host_oom (the kernel's OOM killer named it) | killed (a SIGKILL)
    form VARCHAR,                  -- torch>=2.2 | torch 2.0-2.1 | torch<=1.13 | torchrun | kernel | shell
    rank INTEGER, local_rank INTEGER, host VARCHAR, gpu INTEGER, pid BIGINT,
    tried_bytes BIGINT, free_bytes BIGINT, capacity_bytes BIGINT, in_use_bytes BIGINT, allocated_bytes BIGINT,
    reserved_unallocated_bytes BIGINT, rss_bytes BIGINT,
    signal VARCHAR, exit_code INTEGER,
    phase VARCHAR,                 -- checkpoint_load when the kill came while the checkpoint loaded, else NULL
    file VARCHAR, line INTEGER     -- the log and the line that records it
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
# kernel_class: communication is NCCL/RCCL, DeepEP's dispatch/combine, NVSHMEM and the custom collectives (vLLM's
# custom all-reduce, symmetric memory, userbuffers); the naming table is docs/kernel_names.md.
MACROS = r"""
CREATE OR REPLACE MACRO kernel_class(cat, name) AS CASE
    WHEN regexp_matches(name, '^(void )?(nccl|rccl'
        '|(deep_ep::(intranode|internode|internode_ll)::)?(notify_dispatch|cached_notify|cached_notify_dispatch'
        '|cached_notify_combine|dispatch|combine|clean_low_latency_buffer)(<|\(|$)'
        '|deep_ep::(intranode|internode|internode_ll)::barrier(<|\(|$)'
        '|((\(anonymous namespace\)|[a-z_0-9]+)::){0,3}(nvshmem|cross_device_reduce_[12]stage'
        '|one_shot_all_reduce|two_shot_all_reduce|multimem_(all_reduce|all_gather|one_shot)|allToAllV'
        '|exchangeSplitAndOffset|k?userbuffers_))') THEN 'communication'
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


def materialize_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """``profiler_steps(run_id)`` computed once (a dozen metrics read it, each a scan of every CPU op) into an
    in-memory database attached to the report's (``con``'s cursors see it), read by a TEMP macro of that name. Call it
    when the run's files are placed: nothing changes the CPU ops or placement later, so the stored macro agrees."""
    db, mem, macro = _steps_db(con)
    con.execute(f"""ATTACH IF NOT EXISTS ':memory:' AS {mem}; CREATE TABLE IF NOT EXISTS {mem}.main.step_rows AS
        SELECT 0 AS run_id, * FROM {db}.main.profiler_steps(NULL) LIMIT 0;
        DELETE FROM {mem}.main.step_rows WHERE run_id = {run_id:d};
        INSERT INTO {mem}.main.step_rows SELECT {run_id:d}, * FROM {db}.main.profiler_steps({run_id:d}); {macro}""")


def _steps_db(con: duckdb.DuckDBPyConnection) -> tuple[str, str, str]:
    """(database name, that of :func:`materialize_steps`' (never the same), its TEMP macro): names quoted."""
    db = con.execute("SELECT current_database()").fetchone()[0].replace('"', '""')
    return f'"{db}"', f'"{db}_steps"', ('CREATE OR REPLACE TEMP MACRO profiler_steps(rid) AS TABLE SELECT * EXCLUDE '
                                        f'(run_id) FROM "{db}_steps".main.step_rows WHERE run_id = rid')


def forget_steps(con: duckdb.DuckDBPyConnection) -> None:
    """Drop :func:`materialize_steps`' objects: a caller keeping ``con`` (the API's) reads the stored macro, live."""
    con.execute(f"DROP MACRO TABLE IF EXISTS temp.main.profiler_steps; DETACH DATABASE IF EXISTS {_steps_db(con)[1]}")


def steps_cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A cursor of ``con`` reading the steps :func:`materialize_steps` computed on ``con`` (first), not again."""
    cur = con.cursor()
    cur.execute(_steps_db(cur)[2])
    return cur


# Tables that describe the latest report only; emptied before a report is recomputed.
REPORT_TABLES = ("runs", "warnings", "run_facts", "log_steps", "run_deaths", "nccl_channels", "topology_links",
                 "collective_calls", "findings", "report_cache")

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
    edge_type VARCHAR,             -- launch | gpu_cpu_sync | inter_thread | collective_wait | event_wait
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

# Arrival skew per collective instance (traceanalyze.replay.skew): who waited for whom, one row per instance x rank.
SKEW_DDL = """
CREATE TABLE IF NOT EXISTS collective_skew (  -- complete collective instances of sim_coll, each rank's arrival
    run_id INTEGER, instance_id BIGINT,  -- instance_id: sim_coll's
    step INTEGER,                  -- the ProfilerStep#N the rank's call is in (NULL outside steps)
    collective VARCHAR, rank INTEGER, n_ranks INTEGER,
    arrival_us DOUBLE,             -- start of the rank's collective, aligned clocks (as sim_task.start_us)
    step_offset_us DOUBLE,         -- arrival_us minus the start of the rank's step
    wait_us DOUBLE,                -- last arriver's arrival minus this rank's, at most its duration (0: last)
    dur_us DOUBLE, transfer_us DOUBLE,  -- the rank's measured duration; the instance's transfer estimate
    is_last BOOLEAN, last_rank INTEGER   -- this rank arrived last; the rank that arrived last
);
"""
DDL += SKEW_DDL
REPORT_TABLES += ("collective_skew",)

# The per-rank metrics (traceanalyze.metrics.breakdown.RankMetrics): a table of the report database, and one of the
# batch catalog (every run of an archive), each after its run_id column.
RANK_METRIC_COLUMNS = """rank INTEGER, mode VARCHAR, n_files INTEGER,
    window_us DOUBLE, busy_us DOUBLE, idle_us DOUBLE, compute_us DOUBLE, non_compute_us DOUBLE,
    idle_pct DOUBLE, compute_pct DOUBLE, non_compute_pct DOUBLE,
    comm_us DOUBLE, comm_comp_overlap_pct DOUBLE, exposed_comm_us DOUBLE,
    kernel_compute_us DOUBLE, kernel_comm_us DOUBLE, kernel_memory_us DOUBLE, n_kernels BIGINT,
    n_steps INTEGER, step_time_us DOUBLE"""

# Metric tables (traceanalyze.metrics), replaced by every report.
METRIC_TABLES = f"""
CREATE OR REPLACE TABLE rank_metrics (
    run_id INTEGER, {RANK_METRIC_COLUMNS}
);
CREATE OR REPLACE TABLE step_metrics (
    run_id INTEGER, rank INTEGER, step INTEGER, start_ns BIGINT, step_time_us DOUBLE,
    compute_us DOUBLE, comm_us DOUBLE, exposed_comm_us DOUBLE, idle_us DOUBLE
);
"""

IDLE_TABLE = """
CREATE OR REPLACE TABLE idle_breakdown (  -- GPU idle time per rank and stream (HTA get_idle_time_breakdown)
    run_id INTEGER, rank INTEGER, stream BIGINT,
    n_kernels BIGINT,              -- kernels, memcpys and memsets counted on the stream
    idle_us DOUBLE,                -- sum of gaps between consecutive events of the stream
    host_wait_us DOUBLE,           -- gaps where the launch started after the previous event ended
    kernel_wait_us DOUBLE,         -- other gaps shorter than 30 us (back-to-back launches)
    other_us DOUBLE,               -- the remaining gaps (cross-stream waits, syncs, ...)
    host_wait_pct DOUBLE, kernel_wait_pct DOUBLE, other_pct DOUBLE   -- shares of idle_us (HTA idle_time_ratio)
);
"""


# The tables the parser fills, in the order they are filled: their columns come from the DDL above.
EVENT_TABLES = ("kernels", "cpu_ops", "comm_events", "threads", "cuda_syncs", "memory_events")


def table_columns(ddl: str, table: str) -> list[tuple[str, str]]:
    """``(name, type)`` of every column of the ``CREATE TABLE`` of ``table`` in ``ddl``, in order.

    Comments and constraints (``PRIMARY KEY``, ``UNIQUE``) are left out; quoted names (``"window"``) unquoted.
    Raises ValueError when ``ddl`` does not create ``table``."""
    text = re.sub(r"--[^\n]*", "", ddl)
    m = re.search(rf"CREATE (?:OR REPLACE )?TABLE (?:IF NOT EXISTS )?{re.escape(table)} \((.*?)\);", text, re.S)
    if m is None:
        raise ValueError(f"no CREATE TABLE {table} in this DDL")
    return [(c.split()[0].strip('"'), c.split()[1]) for c in m.group(1).split(",") if c.strip()]


# table -> (column, DuckDB type) of each column the parser writes: every column but file_id (added on loading)
EVENT_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    t: tuple(c for c in table_columns(DDL, t) if c[0] != "file_id") for t in EVENT_TABLES}


# ---------------------------------------------------------------------------------------------------------
# The batch catalog (traceanalyze.batch): one row per run of an archive, its findings and rank metrics.

CATALOG_VERSION = "3"  # 2: step_time_unprofiled_us; 3: died, died_kind, died_ranks

CATALOG_DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
INSERT OR IGNORE INTO meta VALUES ('catalog_version', '{CATALOG_VERSION}');
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,    -- the run's folder relative to ARCHIVE
    path VARCHAR,                  -- the run's folder (resolved)
    slug VARCHAR,                  -- its output folder: OUTDIR/runs/<slug>/
    status VARCHAR,                -- ok | partial (some trace unreadable or truncated) | error
    error VARCHAR,                 -- why error (or what was partial)
    fingerprint VARCHAR,           -- sha256 of the files' paths (in ARCHIVE), sizes, mtimes, version, options
    n_files INTEGER,               -- trace files + logs/configs
    trace_bytes BIGINT,            -- trace files' size on disk
    json_bytes BIGINT,             -- decompressed trace JSON read
    date TIMESTAMP,                -- UTC: first trace event, else the folder's mtime
    date_source VARCHAR,           -- trace | mtime
    name VARCHAR,                  -- run name in its report
    group_name VARCHAR,            -- model name from logs/configs, else the folder name
    group_key VARCHAR,             -- group_name + world size: runs that are compared with each other
    world_size INTEGER, backend VARCHAR, mode VARCHAR, gpu_model VARCHAR,
    step_time_us DOUBLE,           -- median over ranks of the mean ProfilerStep time
    step_time_unprofiled_us DOUBLE,  -- the step without the profiler, as the report prices fixes on; NULL if unknown
    step_time_unprofiled_source VARCHAR,  -- how: the report's profiler_overhead.source (measured | estimate | ...)
    mfu_pct DOUBLE,                -- from GEMM FLOPs in the trace, else the logs' median; NULL if unknown
    verdict VARCHAR,
    died VARCHAR,                  -- the run died: "CUDA OOM on rank 6", "host OOM: 8 ranks SIGKILLed"; NULL if not
    died_kind VARCHAR,             -- cuda_oom | host_oom: the kind of the report's first finding of a death
    died_ranks JSON,               -- the ranks that died (the findings' ranks), [] when no log names them
    top_cause VARCHAR, top_kind VARCHAR, top_severity VARCHAR, top_impact_pct DOUBLE, top_title VARCHAR,
    n_findings INTEGER,
    findings JSON,                 -- every finding of the run, ranked (the report's "findings")
    report_html VARCHAR, report_json VARCHAR, report_db VARCHAR,   -- relative to OUTDIR
    analyzed_at TIMESTAMP, analyze_s DOUBLE,
    regression BOOLEAN,            -- step time > threshold × median of the group's earlier runs (never a run that died)
    regression_ratio DOUBLE,       -- step time / that median
    regression_median_us DOUBLE,   -- the median of the group's earlier runs
    regression_reference VARCHAR,  -- run_id of the earlier run compared against (closest to the median)
    regression_part VARCHAR,       -- the part of the step that grew most (compute, exposed communication, ...)
    regression_delta_us DOUBLE,    -- step-time difference against the reference
    regression_cause VARCHAR, regression_kind VARCHAR,
    regression_finding VARCHAR,    -- title of the finding that explains the difference
    regression_report VARCHAR,     -- comparison report (relative to OUTDIR)
    regression_key VARCHAR,        -- fingerprints of run + reference: the comparison is redone when it changes
    regression_error VARCHAR
);
CREATE TABLE IF NOT EXISTS findings (
    run_id VARCHAR, pos INTEGER,   -- 1 = the run's top finding
    cause VARCHAR, kind VARCHAR, severity VARCHAR, impact_pct DOUBLE, ranks JSON, title VARCHAR,
    evidence JSON, recommendation VARCHAR
);
CREATE TABLE IF NOT EXISTS rank_metrics (
    run_id VARCHAR, {RANK_METRIC_COLUMNS}
);
CREATE TABLE IF NOT EXISTS batches (
    started_at TIMESTAMP, seconds DOUBLE, archive VARCHAR, executor VARCHAR, jobs INTEGER,
    n_runs INTEGER, analyzed INTEGER, unchanged INTEGER, removed INTEGER, errors INTEGER, regressions INTEGER,
    trace_bytes BIGINT,            -- trace bytes (on disk) of the runs analyzed by this invocation
    json_bytes BIGINT
);
"""


def create_catalog(con: duckdb.DuckDBPyConnection) -> None:
    """Create the batch catalog's tables in ``con`` and mark it as a catalog (:func:`write_marker`).

    A catalog of another :data:`CATALOG_VERSION` (an older layout) has its tables dropped first: every run is
    analyzed again."""
    version = None
    try:
        version = con.execute("SELECT value FROM meta WHERE key = 'catalog_version'").fetchone()
    except duckdb.Error:
        pass
    if version is not None and version[0] != CATALOG_VERSION:  # older layout: start over, re-analyze all
        for t in ("meta", "runs", "findings", "rank_metrics", "batches"):
            con.execute(f"DROP TABLE IF EXISTS {t}")
    con.execute(CATALOG_DDL)
    write_marker(con, int(CATALOG_VERSION), "catalog")


# ---------------------------------------------------------------------------------------------------------
# Opening the report database, and writing rows

def connect(db_path: str | Path | None) -> duckdb.DuckDBPyConnection:
    """Open (or create) the database and make sure the schema exists; ``db_path`` None: an in-memory database.
    Raises :class:`TraceanalyzeError` when another process holds the file (two concurrent reports on one database)
    or the file is not a DuckDB database. Only a database traceanalyze created is opened for writing
    (:func:`check_own_db`): an existing file without the marker table of a report database, or a batch catalog,
    raises :class:`~traceanalyze.errors.UsageError` and is left byte-identical. An unmarked database of an earlier
    traceanalyze (its tables and ``meta.schema_version``) is migrated: it gets the marker, and its tables are
    rebuilt when the schema version differs."""
    check_own_db(db_path, "report")
    new = is_new(db_path)  # holds nothing: no schema to check, no old tables to drop (two queries fewer)
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
    if new or not _schema_current(con):
        with transaction(con):
            if not new:
                _drop_if_old(con)
            con.execute(DDL + _FINGERPRINT_DDL + MACROS)
            write_marker(con, SCHEMA_VERSION, "report")
            con.execute(f"COMMENT ON TABLE {MARKER_TABLE} IS '{_SCHEMA_STAMP}'")
    return con


def is_new(db_path: str | Path | None) -> bool:
    """Whether opening ``db_path`` creates the database: in memory, or no file and no write-ahead log (replayed)."""
    return not db_path or str(db_path) == ":memory:" or not any(Path(f"{db_path}{e}").exists() for e in ("", ".wal"))


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """The ``with`` block's statements as one transaction (a file database syncs once), rolled back if one fails."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def checkpoint_meanwhile(con: duckdb.DuckDBPyConnection) -> Callable[[], None]:
    """Start writing ``con``'s write-ahead log into the database file (DuckDB's ``CHECKPOINT``) on a thread, while
    the caller does work that does not touch the database (rendering the report); returns a callable that waits
    for it. ``close`` would otherwise do the same work after the rendering (1,024 ranks: 0.6-0.75 s, mostly the
    replay's tables). A failed checkpoint is left to ``close``, which retries it; nothing is raised."""
    import threading

    cur = con.cursor()  # DuckDB works without the GIL: the rendering goes on meanwhile

    def run() -> None:
        try:
            cur.execute("CHECKPOINT")
        except duckdb.Error:
            pass
        finally:
            cur.close()

    t = threading.Thread(target=run, name="traceanalyze-checkpoint", daemon=True)
    t.start()
    return t.join


def _schema_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the schema of this exact DDL is in place already (a re-run): one query instead of the ~40 statements
    of the DDL and the macros (~30 ms). The stamp, a hash of the DDL, the macros and the version, is the marker
    table's comment, written last in the transaction that ran them; a DDL changed without a version bump differs
    in the stamp too, and a table dropped by hand is seen."""
    try:
        stamp, n_tables = con.execute(
            f"SELECT max(comment) FILTER (WHERE table_name = '{MARKER_TABLE}'), count(*) FILTER (WHERE table_name "
            "IN (SELECT unnest(?))) FROM duckdb_tables() WHERE schema_name = 'main'", [list(_DDL_TABLES)]).fetchone()
        if stamp != _SCHEMA_STAMP or n_tables != len(_DDL_TABLES):
            return False
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return row is not None and row[0] == str(SCHEMA_VERSION)
    except duckdb.Error:
        return False


def open_if_current(db_path: str | Path | None) -> duckdb.DuckDBPyConnection | None:
    """A read-only connection to the database at ``db_path`` when it is a traceanalyze report database whose schema
    is in place (marker and stamp), else None (no file, another database, an older schema, in use, unreadable).

    For a cached re-run, which only reads: one open of the file where :func:`connect` opens it twice (read-only
    for :func:`check_own_db`, then for writing), ~0.06 s for a database of 8 ranks. Opened as
    :func:`open_untrusted`, as :func:`db_marker` opens a file before it is known to be ours."""
    if db_path is None or str(db_path) == ":memory:" or not Path(db_path).is_file():
        return None
    try:
        con = open_untrusted(db_path)
    except TraceanalyzeError:  # connect() says why, as before
        return None
    try:
        marker = con.execute(f"SELECT tool, schema_version, role FROM {MARKER_TABLE}").fetchall()
        if marker == [(TOOL, SCHEMA_VERSION, "report")] and _schema_current(con):
            return con
    except duckdb.Error:  # no marker table, or one of another shape: not ours
        pass
    con.close()
    return None


def _raise_environment(path, msg: str) -> None:
    """DuckDB's messages for a refused write (disk full, permission, read-only) as an EnvironmentFailure."""
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


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, cols: list[str] | None, rows: list[list]) -> None:
    """Insert ``rows`` (values in ``cols`` order; all of the table's columns, in order, when ``cols`` is None)
    into ``table`` with one statement, one list per column (``executemany`` runs it once per row: far dearer).

    Raises:
        duckdb.Error: a value does not fit its column (the whole insert is refused)."""
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


# ---------------------------------------------------------------------------------------------------------
# Our DuckDB files: the marker, and databases handed in by users

TOOL = "traceanalyze"
MARKER_TABLE = "traceanalyze_marker"  # one row: (tool, schema_version, role)
ROLES = {"report": "report database", "catalog": "batch catalog"}
# DuckDB's file header: 8 bytes of checksum, then the magic bytes (duckdb storage format, "DUCK" at offset 8)
_DUCKDB_MAGIC = b"DUCK"

# Set at connect (cannot be changed later with lock_configuration): a crafted view over read_text('/etc/passwd'),
# read_csv(...), COPY ... TO, ATTACH or an extension install fails with a PermissionException.
UNTRUSTED_CONFIG = {"enable_external_access": False, "autoload_known_extensions": False,
                    "autoinstall_known_extensions": False, "lock_configuration": True}

# The tables an unmarked database written before the marker existed holds: such a file is adopted (migrated).
_LEGACY = {"report": ({"meta", "files", "kernels", "cpu_ops", "runs", "report_cache"}, "schema_version"),
           "catalog": ({"meta", "runs", "findings", "rank_metrics", "batches"}, "catalog_version")}


def _is_duckdb_file(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(12)
    return len(head) == 12 and head[8:12] == _DUCKDB_MAGIC


def open_untrusted(path: str | Path, busy: str = "") -> duckdb.DuckDBPyConnection:
    """Open a DuckDB database a user hands in: read-only, no file-system access, no extension autoload/install,
    configuration locked (:data:`UNTRUSTED_CONFIG`). ``busy`` ends the message when another process holds it.

    Raises:
        TraceanalyzeError: the file cannot be opened (not a DuckDB database, in use, unreadable)."""
    try:
        return duckdb.connect(str(path), read_only=True, config=dict(UNTRUSTED_CONFIG))
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "lock" in first.lower():
            raise TraceanalyzeError(f"{path}: the database is in use by another traceanalyze run; wait for it to "
                                    f"finish{busy}") from None
        raise TraceanalyzeError(f"{path}: cannot open the database ({first})") from None


def untrusted_error(path: str | Path, exc: Exception) -> TraceanalyzeError:
    """The one-line error for a query on an untrusted database that failed (a refused file access named)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, duckdb.PermissionException):
        return TraceanalyzeError(f"{path}: refused: the database tries to read or write files outside itself "
                                 f"({first}); databases handed to traceanalyze are opened without file access")
    return TraceanalyzeError(f"query failed: {first}")


def _tables(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                                      "UNION ALL SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' "
                                      "AND NOT internal").fetchall()}


def db_marker(path: str | Path) -> tuple[str, int, str] | str | None:
    """What the database at ``path`` is: ``(tool, schema_version, role)`` from its marker; ``"legacy-report"`` or
    ``"legacy-catalog"`` for a database of an earlier traceanalyze (its tables and its ``meta`` version key, no
    marker); None for any other DuckDB database. Reads only (opened as :func:`open_untrusted`)."""
    try:
        con = open_untrusted(path, busy=" or pass a different --db")
    except TraceanalyzeError as exc:
        if "different configuration" not in str(exc):
            raise
        # this process holds it open already (a Python session that ran analyze on it): share that instance
        con = duckdb.connect(str(path))
    try:
        tables = _tables(con)
        if MARKER_TABLE in tables:
            row = con.execute(f"SELECT tool, schema_version, role FROM {MARKER_TABLE} LIMIT 1").fetchone()
            if row is not None and row[0] == TOOL:
                return str(row[0]), int(row[1]), str(row[2])
            return None
        for role, (need, key) in _LEGACY.items():
            if need <= tables:
                if con.execute("SELECT count(*) FROM meta WHERE key = ?", [key]).fetchone()[0]:
                    return f"legacy-{role}"
        return None
    except Exception:  # a view that reads files, a table of another shape: not ours
        return None
    finally:
        con.close()


def is_own_db(path: str | Path) -> bool:
    """Whether the DuckDB file at ``path`` is one traceanalyze wrote (its marker, or an earlier traceanalyze's
    tables: :func:`db_marker`); False for any other database and for a file that cannot be read. For
    :func:`traceanalyze.safety.check_outputs`, which replaces our own outputs found in an input folder."""
    try:
        return db_marker(path) is not None
    except (OSError, EOFError, TraceanalyzeError):
        return False


def check_own_db(path: str | Path | None, role: str) -> str:
    """Refuse, before anything is written, a database path that exists and is not traceanalyze's own of ``role``.

    Returns ``"new"`` (no file yet), ``"own"`` (marked, this role) or ``"legacy"`` (an unmarked database written
    by an earlier traceanalyze with this role's tables: the caller adds the marker, a migration).

    Raises:
        UsageError: the path is a folder, not a DuckDB file, a DuckDB database traceanalyze did not create, or
            one of the other role (a batch catalog passed as ``--db``, a report database as a catalog). The file
            is not opened for writing, so it stays byte-identical.
        TraceanalyzeError: the file is in use or unreadable."""
    if path is None or str(path) == ":memory:":
        return "new"
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return "new"
    what = ROLES[role]
    if not p.is_file():
        raise UsageError(f"{p}: not a file; the {what} must be a DuckDB file that traceanalyze creates")
    try:
        duck = _is_duckdb_file(p)
    except OSError as exc:
        raise TraceanalyzeError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if not duck:
        raise UsageError(f"{p}: exists and is not a DuckDB database; traceanalyze writes only databases it "
                         f"created, so it is left untouched: pass another path for the {what}")
    mark = db_marker(p)
    if isinstance(mark, tuple):
        if mark[2] == role:
            return "own"
        raise UsageError(f"{p}: is a traceanalyze {ROLES.get(mark[2], mark[2])}, not a {what}; it is left "
                         f"untouched: pass another path")
    if mark == f"legacy-{role}":
        return "legacy"
    if isinstance(mark, str):  # legacy database of the other role
        other = mark.removeprefix("legacy-")
        raise UsageError(f"{p}: is a traceanalyze {ROLES[other]}, not a {what}; it is left untouched: "
                         "pass another path")
    raise UsageError(f"{p}: is a DuckDB database that traceanalyze did not create (no {MARKER_TABLE} table); "
                     f"it is left untouched: pass another path for the {what}")


def write_marker(con: duckdb.DuckDBPyConnection, schema_version: int, role: str) -> None:
    """Create or refresh the marker table of a database traceanalyze writes."""
    con.execute(f"CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (tool VARCHAR, schema_version INTEGER, role VARCHAR)")
    row = con.execute(f"SELECT tool, schema_version, role FROM {MARKER_TABLE}").fetchall()
    if row != [(TOOL, schema_version, role)]:
        con.execute(f"DELETE FROM {MARKER_TABLE}")
        con.execute(f"INSERT INTO {MARKER_TABLE} VALUES (?, ?, ?)", [TOOL, schema_version, role])


# the cache key's content part (docs/safety.md: the cache is never stale); NULL in a database of an earlier
# version, so none of its rows is reused before the file is read again
_FINGERPRINT_DDL = "ALTER TABLE files ADD COLUMN IF NOT EXISTS fingerprint VARCHAR;\n"
# the tables :data:`DDL` creates, and the stamp :func:`connect` leaves once the schema is in place (_schema_current)
_DDL_TABLES = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", DDL)) + (MARKER_TABLE,)
_SCHEMA_STAMP = "schema " + hashlib.sha256(
    f"{SCHEMA_VERSION}|{DDL}|{_FINGERPRINT_DDL}|{MACROS}".encode()).hexdigest()[:16]


# ---- the report cache: one stored report model per key (tool version, options and input files) ---------------------

def report_cache_key(options_key: str, runs: Iterable[tuple[str, str | None, Iterable[tuple[Path, tuple | None]]]],
                     skipped: Iterable[tuple[str, str]]) -> str:
    """SHA-256 (hex) of everything a report depends on: ``options_key`` (the tool's version and the report-affecting
    options, :meth:`traceanalyze.options.Options.report_key`), each run's path and role with each of its files'
    identity (``(cache key, fingerprint)`` from :func:`traceanalyze.ingest.file_identity`: size, mtime and content;
    None for a file gone missing), and the files discovery skipped with why."""
    h = hashlib.sha256(options_key.encode())
    for path, role, files in runs:
        h.update(f"|run {path} {role}".encode())
        for p, identity in files:
            h.update((f"|{p} missing" if identity is None else f"|{identity[0][0]} {identity[1]}").encode())
    for f, m in skipped:
        h.update(f"|skipped {f} {m}".encode())
    return h.hexdigest()


def cached_report(con: duckdb.DuckDBPyConnection, key: str) -> dict | None:
    """The report model stored under ``key`` (:func:`report_cache_key`), stamped now (``generated_at``, UTC) and
    marked cached (the model and each run's files), or None: no such key, or a stored text that is no JSON."""
    import datetime as dt

    rows = con.execute("SELECT model FROM report_cache WHERE key = ?", [key]).fetchall()
    if not rows:
        return None
    try:
        cached = json.loads(rows[0][0])
    except ValueError:
        return None
    cached["generated_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    cached["cached"] = True
    for run in cached["runs"]:
        for f in run["files"]:
            f["cached"] = True
    return cached


def store_report(con: duckdb.DuckDBPyConnection, key: str, model_json: str) -> None:
    """Store a report model's compact JSON under its key (:func:`report_cache_key`)."""
    con.execute("INSERT INTO report_cache VALUES (?, ?)", [key, model_json])
