"""Load: parse trace files (:mod:`.parse`) in worker processes and load their rows into the store.

Re-running on unchanged files does not parse them again: a file whose resolved path, size, mtime and content
fingerprint (:func:`.cache.fingerprint`) match a row of ``files`` keeps its rows; rows of files no longer among the
inputs are deleted (:func:`.cache.forget_files`). Files are loaded in transactions of up to :data:`TRANSACTION_FILES`
files (a split file's parts one by one), so an interrupted ingest leaves every committed file usable; the files of
the open transaction are parsed again by the next run.

The checks made once files are loaded (impossible durations) are in :mod:`.checks`.

:mod:`.parse` (NumPy, PyArrow, msgspec) is imported only where files are parsed or loaded: a cached report never
parses, and does not pay for those imports.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from traceanalyze import store
from traceanalyze.ingest.cache import CacheKey, LoadedFile, cached_files, stat_key
from traceanalyze.ingest.held import HeldRows
from traceanalyze.ingest.workers import (  # block_pandas, WORKER_CHUNK_ROWS: this module's names before
    WORKER_CHUNK_ROWS,  # noqa: F401
    block_pandas,  # noqa: F401
    in_order,
    is_group,
    pandas_blocked,
    parse_group,
    parse_one,
    parse_task,
    worker_init,
)
from traceanalyze.limits import DEFAULT_MAX_DECOMPRESSED

if TYPE_CHECKING:
    from traceanalyze.ingest.parse import TraceFile

PART_BYTES = 128 << 20  # a plain-JSON file over SPLIT_MIN_BYTES is parsed in byte ranges of about this size
INGEST_MEMORY_LIMIT = "64MB"  # DuckDB's buffer pool while trace files are loaded (see load_traces)
# Whole files share a transaction, up to this many files or TRANSACTION_ROWS rows: a COMMIT syncs to disk, and one
# per file was 21.8 s of a 47 s report on 1,024 small ranks. A COMMIT costs less per row the more rows it holds
# (optimistic writes fill whole row groups): on those ranks, 256 files a transaction instead of 64 took this
# process's CPU while loading from 10-12 s to 6.7-8.3 s, its peak unchanged (243-248 MB; the rows go to disk in
# row groups as they come, the buffer pool is INGEST_MEMORY_LIMIT). The rows bound caps what a crash re-parses.
TRANSACTION_FILES = 256
TRANSACTION_ROWS = 4_000_000
# ... whose events are inserted as they come, every this many rows and whenever the next parse is not done yet: the
# INSERT overlaps with the parsing of the next files (at the end, all at once, it left this process idle while 8
# ranks of 47 MB were parsed)
INSERT_ROWS = 250_000
# ... but a table's rows go in only once at least this many are held (one DuckDB row group), else at a later INSERT
# or the commit: an INSERT costs DuckDB 2-4 ms whatever its rows (256 ranks: 8 INSERTs of 832 threads rows, 16 ms).
# This process's insert CPU in a cold report, medians of 5: 8 ranks 0.58 -> 0.52 s, 256 ranks 0.96 -> 0.85 s.
# Inserting whole row groups only (each table's rows cut at multiples of 122,880) did not help: this INSERT (an
# Arrow stream, one thread) appends to the transaction's last row group, it does not fill a partial one again.
INSERT_TABLE_ROWS = 122_880
# Small whole files are parsed several to a task (see parse_group): files up to GROUP_MAX_BYTES on disk, up to
# GROUP_FILES a task, and at least GROUP_TASKS_PER_CPU tasks per process, so that the processes stay busy to the
# end and the first files are loaded while the next ones are parsed (8 ranks: one file a task, as before)
GROUP_MAX_BYTES = 4 << 20
GROUP_FILES = 16
GROUP_TASKS_PER_CPU = 8
GROUP_TAIL_DIVISOR = 4  # the last n_cpu * GROUP_FILES files go this many times fewer to a task

_parse_one = parse_one  # load's own name for it: tests replace it here

# ---------------------------------------------------------------------------------------------------------
# Loading

def load_traces(con: duckdb.DuckDBPyConnection, paths: Iterable[Path], *, jobs: int | None = None,
                progress: Callable[[int], None] | None = None,
                max_decompressed: int = DEFAULT_MAX_DECOMPRESSED, executor=None, parts_dir: str | Path | None = None,
                known: dict[Path, tuple[CacheKey, str]] | None = None, begun: Begun | None = None) -> list[LoadedFile]:
    """Parse the trace files not already in the store (cache key: resolved path, size, mtime and
    :func:`fingerprint`) and load them.

    Files are parsed into Arrow IPC streams, in ``jobs`` processes (default: the CPU count, at most the number of
    files; in this process when that is one). This process loads each file in its own transaction as soon as it
    is parsed, while the others are still being parsed. A plain-JSON file over :data:`.parse.SPLIT_MIN_BYTES` is
    parsed in byte ranges of about :data:`PART_BYTES`, committed one by one (see :class:`_FileLoad`). While
    loading, DuckDB runs one thread with a buffer pool of :data:`INGEST_MEMORY_LIMIT`. ``progress`` is called with
    each file's size in bytes as it finishes. Returns one :class:`LoadedFile` per path, in input order; a file that
    failed has ``error`` set and no rows.

    A ``.gz`` file that inflates to more than :data:`.parse.SPLIT_MIN_BYTES` is inflated here (ISA-L, every
    member) into part files cut before an event (:func:`.parse.inflate_parts`), which the processes parse like
    the byte ranges of a plain file; a stream that turns out damaged or truncated is parsed whole instead, which
    reports it.

    ``executor`` (an object with ``results(fn, tasks)``, as :class:`traceanalyze.executors.DaskExecutor`) parses
    the files there instead of in local processes: the workers write Arrow IPC streams into ``parts_dir`` (a
    folder that they and this process both see, default a temporary folder), which this process loads as above.

    ``known``: path -> :func:`file_identity` for paths read already in this run (the report's cache key).
    ``begun``: the parse :func:`begin_parse` began, loaded here when it parses the files that need it (else
    stopped, and the files parsed as above).
    """
    paths = list(paths)
    out, todo, prints, alias = cached_files(con, paths, progress, known)
    if begun is not None and not begun.takes(todo, max_decompressed, executor, parts_dir):
        begun.close()  # a file changed meanwhile: parsed again, as usual
        begun = None
    if todo:
        with _loading(con, parts_dir, begun.tmp if begun is not None else None) as tmp:
            if begun is None:
                plan, results, pool = _parsing(todo, tmp, max_decompressed, jobs, executor)
            else:
                plan, results, pool = begun.plan, begun.results, begun.pool
                begun.taken = True
            try:
                _load_results(con, results, plan, prints, out, progress, (tmp, max_decompressed))
            finally:
                if pool is not None:
                    pool.shutdown(cancel_futures=True)
    return [out[alias.get(p, p)] for p in paths]


@contextlib.contextmanager
def _loading(con: duckdb.DuckDBPyConnection, parts_dir: str | Path | None, tmp: str | None = None) -> Iterator[str]:
    """A temporary folder for the parsers' output (in ``parts_dir`` when given; ``tmp``, one made already), and the
    settings of this process while it loads; the folder is removed and the settings put back at the end."""
    import pyarrow as pa

    if parts_dir is not None:
        Path(parts_dir).mkdir(parents=True, exist_ok=True)
    tmp = tmp or tempfile.mkdtemp(prefix="traceanalyze-", dir=parts_dir)
    # DuckDB keeps every block it just wrote in its buffer pool (~12 MB per 47 MB trace); they are on disk
    # already, so a low limit while loading only lets them go, and the analysis re-reads what it needs
    con.execute(f"SET memory_limit = '{INGEST_MEMORY_LIMIT}'")
    # the parse workers use every core meanwhile: a second DuckDB thread only adds hand-off cost (-25 % CPU)
    con.execute("SET threads = 1")
    # the system allocator for Arrow while loading, as in the workers (see worker_init): the IPC chunks read
    # here and a parse in this process (one file, -j 1) leave less behind (-15 to -20 MB); put back after
    arrow_pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield tmp
    finally:
        pa.set_memory_pool(arrow_pool)
        con.execute("RESET memory_limit")
        con.execute("RESET threads")
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class _Plan:
    """The parse tasks of one load, as far as they are made (:func:`_work_items` fills it as it goes)."""

    keys: dict[str, tuple[Path, CacheKey]]  # file -> (the path as given, its cache key)
    n_parts: dict[str, int] = field(default_factory=dict)  # file -> its number of parse tasks
    origin: dict[str, str] = field(default_factory=dict)  # part file inflated from a .gz -> that .gz
    whole: dict[str, str | None] = field(default_factory=dict)  # .gz split into part files -> its last part
    # (None: parse it whole)


def _work_items(todo: list[tuple[Path, CacheKey]], tmp: str, max_decompressed: int, n_cpu: int, plan: _Plan):
    """The parse tasks ``(path, out_dir, key, max_decompressed, byte_range[, part])``, file by file, parts of a file
    in order; fills ``plan`` (parts per file; the part files of a .gz inflated into parts)."""
    from traceanalyze.ingest import parse  # NumPy, PyArrow, msgspec: only where files are parsed

    per_group = max(1, min(GROUP_FILES, len(todo) // (n_cpu * GROUP_TASKS_PER_CPU)))
    # the last files in smaller tasks, where there are many tasks to each process: the processes then finish
    # together, and the last group's insert here is short (at 256 ranks on 2 cores a last task of 16 files left one
    # core idle for its ~0.2 s)
    tail = n_cpu * per_group if n_cpu > 1 and len(todo) >= 4 * n_cpu * per_group else 0
    tail_from = len(todo) - tail
    group: list[str] = []
    for i, (p, k) in enumerate(todo):
        if per_group > 1 and k[1] <= GROUP_MAX_BYTES:  # one task, the parse of a whole file (no split below)
            plan.n_parts[str(p)] = 1
            group.append(str(p))
            if len(group) >= (per_group if i < tail_from else max(1, per_group // GROUP_TAIL_DIVISOR)):
                yield (group, tmp, f"g{i}", max_decompressed)
                group = []
            continue
        if group:  # the files in task order: a group before the next file
            yield (group, tmp, f"g{i}", max_decompressed)
            group = []
        est = 0
        if n_cpu > 1 and k[1] >= parse.SPLIT_MIN_BYTES >> 6:
            with open(p, "rb") as fh:
                if fh.read(2) == b"\x1f\x8b":
                    est = parse.gzip_json_size(p)
        if est >= parse.SPLIT_MIN_BYTES:
            yield from _gz_part_items(p, i, est, tmp, max_decompressed, n_cpu, plan)
            continue
        # a big plain-JSON file is cut into byte ranges at event boundaries: more ranges than processes, so that
        # the first ones are loaded while the others are still being parsed, and each range is committed alone
        # (with one process too: memory stays bounded by a range)
        n_ranges = max(n_cpu, -(-k[1] // PART_BYTES))
        points = parse.split_points(p, n_ranges) if n_ranges > 1 else [0]
        ends = points[1:] + [k[1]]
        plan.n_parts[str(p)] = len(points)
        for j, (a, b) in enumerate(zip(points, ends, strict=True)):
            yield (str(p), tmp, f"f{i}p{j}", max_decompressed, None if len(points) == 1 else (a, b))
    if group:
        yield (group, tmp, f"g{len(todo)}", max_decompressed)


def _gz_part_items(p: Path, i: int, est: int, tmp: str, max_decompressed: int, n_cpu: int, plan: _Plan):
    """The parse tasks of a big ``.gz`` file (``est`` bytes of JSON): it is inflated into part files, each
    yielded as soon as the next one has started (a part's task says whether it starts and ends at an event)."""
    from traceanalyze.ingest import parse

    n = max(n_cpu, -(-est // PART_BYTES))
    state: dict = {}
    # inflating far past what the gzip trailer says is a bomb: stop, and let the whole parse report it
    bound = min(max_decompressed, 2 * est + (256 << 20))
    prev, j = None, 0
    for j, name in enumerate(parse.inflate_parts(p, tmp, f"f{i}g", -(-est // n), bound, state)):
        plan.origin[name] = str(p)
        if prev is not None:
            yield (prev, tmp, f"f{i}p{j - 1}", max_decompressed, None, (j > 1, True))
        prev = name
    if prev is not None:
        yield (prev, tmp, f"f{i}p{j}", max_decompressed, None, (j > 0, False))
    plan.n_parts[str(p)] = j + 1
    plan.whole[str(p)] = prev if state.get("clean") else None


def _parsing(todo: list[tuple[Path, CacheKey]], tmp: str, max_decompressed: int, jobs: int | None, executor
             ) -> tuple[_Plan, Iterable[tuple], object | None]:
    """The parse of ``todo`` into ``tmp`` started (:func:`_work_items`, :func:`_start_parsing`; ``jobs`` None: the
    CPU count): its plan, its results and its pool (None: none)."""
    n_cpu = max(1, jobs or os.cpu_count() or 1)
    plan = _Plan(keys={str(p): (p, k) for p, k in todo})
    small = all(k[1] <= GROUP_MAX_BYTES for _, k in todo)
    return plan, *_start_parsing(_work_items(todo, tmp, max_decompressed, n_cpu, plan), n_cpu, executor, small)


def _start_parsing(items: Iterator[tuple], n_cpu: int, executor, small: bool = False
                   ) -> tuple[Iterable[tuple], object | None]:
    """Start parsing the tasks: on ``executor``, in a pool of up to ``n_cpu`` processes, or here when there is
    only one task. Returns the results (``_parse_one``'s, in task order) and the pool to shut down, if any.
    ``small``: every file is small (``GROUP_MAX_BYTES``): the processes keep the heap they free
    (:func:`.workers.worker_init`)."""
    head = list(itertools.islice(items, n_cpu))  # one task (one small file): parsed here, no pool
    work = itertools.chain(head, items)
    n_jobs = max(1, min(n_cpu, len(head)))
    if executor is not None:
        return in_order(executor.results(parse_task, list(enumerate(work)))), None
    if n_jobs == 1:
        return map(lambda w: parse_group(w) if is_group(w) else _parse_one(w), work), None
    from concurrent.futures import ProcessPoolExecutor  # multiprocessing: not for one file or a re-run

    pool = ProcessPoolExecutor(max_workers=n_jobs, initializer=worker_init, initargs=(pandas_blocked(), small))
    # a .gz is inflated meanwhile, part by part
    futures = [pool.submit(parse_group if is_group(w) else _parse_one, w) for w in work]
    return _as_ready(futures), pool


@dataclass
class Begun:
    """A parse begun before the database opened (:func:`begin_parse`), for :func:`load_traces` to load."""

    todo: list[tuple[Path, CacheKey]]  # the files it parses, with their cache keys
    max_decompressed: int
    tmp: str  # the parsers' output folder
    plan: _Plan
    results: Iterable[tuple]
    pool: object
    taken: bool = False  # load_traces loads it (and removes the folder and shuts the pool down)

    def takes(self, todo: list[tuple[Path, CacheKey]], max_decompressed: int, executor, parts_dir) -> bool:
        """Whether this parse is the one :func:`load_traces` would start now (the same files, keys and bound)."""
        return (todo, max_decompressed, executor, parts_dir) == (self.todo, self.max_decompressed, None, None)

    def close(self) -> None:
        """Stop the parse and remove its folder, unless :func:`load_traces` took them (then: nothing)."""
        if not self.taken:
            self.taken = True
            self.pool.shutdown(cancel_futures=True)
            shutil.rmtree(self.tmp, ignore_errors=True)


def begin_parse(paths: Iterable[Path], *, jobs: int | None = None,
                max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> Begun | None:
    """Begin parsing ``paths`` in local processes before the database opens (a database made now: nothing in it is
    cached). The processes parse while this process reads the files' fingerprints for the report's cache key and
    opens the database, where one core was idle, and they fork before DuckDB runs threads here. Give the result to
    :func:`load_traces` (``begun``), which loads it if the files are still the ones parsed, and :meth:`Begun.close`
    it in every case. None where there is one core or one task (parsed in this process as it loads)."""
    n_cpu = max(1, jobs or os.cpu_count() or 1)  # one (a batch's runs): nothing begun, nothing imported here
    todo: list[tuple[Path, CacheKey]] = []
    seen: set[str] = set()
    for p in paths if n_cpu > 1 else ():
        with contextlib.suppress(OSError):  # an unreadable file: load_traces reports it
            if (key := stat_key(p))[0] not in seen:  # one file under two names (a link): parsed once
                seen.add(key[0])
                todo.append((p, key))
    if not todo:
        return None
    tmp = tempfile.mkdtemp(prefix="traceanalyze-")
    try:
        plan, results, pool = _parsing(todo, tmp, max_decompressed, n_cpu, None)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if pool is None:  # one task: parsed here, as it loads
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    return Begun(todo, max_decompressed, tmp, plan, results, pool)


WAITING = object()  # a result of :func:`_as_ready`: the next parse is not done yet (the loader may insert meanwhile)


def _as_ready(futures: list) -> Iterator[tuple | list[tuple] | object]:
    """The futures' results in order, with :data:`WAITING` before each one that is not done yet: the loader inserts
    what it holds instead of waiting idle, so that at the end only the last task's rows are left to insert (256
    ranks: the held rows, up to :data:`INSERT_ROWS`, were ~0.3 s on one core after the last parse)."""
    for f in futures:
        if not f.done():
            yield WAITING
        yield f.result()


def _load_results(con: duckdb.DuckDBPyConnection, results: Iterable[tuple], plan: _Plan, prints: dict[str, str],
                  out: dict[Path, LoadedFile], progress: Callable[[int], None] | None,
                  whole: tuple[str, int]) -> None:
    """Load the parse results as they arrive (in task order: the parts of a file together): whole files in
    batches (:class:`_Batch`), split files part by part (:class:`_FileLoad`). Fills ``out``."""
    batch = _Batch(con, prints)
    load: _FileLoad | None = None
    try:
        for res in results:
            if res is WAITING:
                batch.insert_held()
                continue
            if isinstance(res, list):  # a group of whole files: in one transaction's inserts
                for f in batch.add_group([(*plan.keys[r[0]], *r[1:]) for r in res]):
                    out[f.path] = f
                    if progress:
                        progress(plan.keys[str(f.path)][1][1])
                continue
            path_s, info, tables, err = res
            part_file = path_s if path_s in plan.origin else None
            path_s = plan.origin.get(path_s, path_s)
            p, key = plan.keys[path_s]
            if plan.n_parts[path_s] == 1 and path_s not in plan.whole:
                out[p] = batch.add(p, key, info, tables, err)
                if progress:
                    progress(key[1])
                continue
            if load is None:
                batch.commit()  # a split file commits part by part: no batch open meanwhile
                load = _FileLoad(con, p, key, plan.n_parts[path_s], whole)
                if path_s in plan.whole:
                    load.tail = plan.whole[path_s]
                    load.force_whole = plan.whole[path_s] is None
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


def _join_parts(parts: list[tuple[TraceFile | None, str | None]]) -> tuple[TraceFile | None, str | None]:
    """One summary for a file parsed in byte ranges, from each part's (summary, error): the first part's header
    plus the keys after the events (``baseTimeNanoseconds``) that the last part read; counts and warnings of all
    parts."""
    from traceanalyze.ingest import parse

    errs = [e for _, e in parts if e]
    if errs or len(parts) == 1:
        return (None, errs[0]) if errs else (parts[0][0], None)
    infos = [i for i, _ in parts]
    first, last = infos[0], infos[-1]
    first.header = {**first.header, **last.header}
    first.base_time_ns = parse.header_base_ns(first.header)
    first.partial = last.partial
    first.bytes_read = sum(i.bytes_read for i in infos)
    first.skipped_events = sum(i.skipped_events for i in infos)
    first.warnings = [w for i in infos for w in i.warnings]
    first.counts = {k: sum(i.counts.get(k, 0) for i in infos) for k in first.counts}
    return first, None


def _delete_tmp(tables: dict | set | None) -> None:
    """Delete a parse's temporary IPC streams (table name -> file, or the files)."""
    for f in (tables.values() if isinstance(tables, dict) else tables or ()):
        Path(f).unlink(missing_ok=True)


class _Batch:
    """Whole (unsplit) trace files loaded into the store, many per transaction.

    Up to :data:`TRANSACTION_FILES` files or :data:`TRANSACTION_ROWS` rows share one transaction. Their events are
    inserted as the files arrive, while the next ones are still being parsed, every :data:`INSERT_ROWS` rows or
    when the next parse is not done (:meth:`insert_held`): each table with at least :data:`INSERT_TABLE_ROWS` rows
    held is filled by one ``INSERT`` that reads those files' Arrow IPC streams one after another (per file, the
    main process only reads its summary); a table with fewer waits (:class:`.held.HeldRows`). The last ``INSERT``
    takes all, then the ``files`` rows and the ``COMMIT``. A file loaded
    again (changed on disk, or left ``loading`` by an interrupted run) has its old rows deleted in the same
    transaction.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, prints: dict[str, str]) -> None:
        self.con = con
        self.prints = prints  # resolved path -> content fingerprint (:func:`fingerprint`), stored with the file
        # (file_id, base_time_ns, table -> IPC stream, table -> rows) of the files added since the last insert
        self.items: list[tuple[int, int, dict, dict]] = []
        self.held = HeldRows()  # the rows of the transaction's files not inserted yet
        self.rows: list[list] = []  # files rows
        self.old: list[int] = []  # file_ids whose rows go
        self.n_rows = 0
        self.pending_rows = 0  # rows not inserted yet
        self.open = False  # the transaction has begun (some events are inserted)
        self.next_id: int | None = None
        self.old_ids: dict[str, int] | None = None

    def add(self, path: Path, key: CacheKey, info: TraceFile | None, tables: dict | None,
            err: str | None) -> LoadedFile:
        loaded = self._hold(path, key, info, tables, err)
        self._flush()
        return loaded

    def add_group(self, files: list[tuple]) -> list[LoadedFile]:
        """:meth:`add` of each ``(path, key, info, tables, err)`` of a group (:func:`parse_group`): all in the
        same transaction and insert, as their rows share streams."""
        loaded = [self._hold(*f) for f in files]
        self._flush()
        return loaded

    def _hold(self, path: Path, key: CacheKey, info: TraceFile | None, tables: dict | None,
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
            self.items.append((file_id, int(info.base_time_ns), tables, info.counts))
            n = sum(info.counts.values())
            self.n_rows += n
            self.pending_rows += n
        return LoadedFile(path, file_id, False, info, err)

    def _flush(self) -> None:
        if len(self.rows) >= TRANSACTION_FILES or self.n_rows >= TRANSACTION_ROWS:
            self.commit()
        elif self.pending_rows >= INSERT_ROWS:
            self.insert_held()

    def insert_held(self) -> None:
        """Insert the events of the files held now (the parsers are busy), of each table with enough rows."""
        if self.items:
            try:
                self._insert()
            except BaseException:
                self.abort()
                raise

    def _insert(self, whole: bool = False) -> None:
        """Insert the events of the files held (the transaction begins with the first): the rows of each table
        with at least :data:`INSERT_TABLE_ROWS` held, or (``whole``, before the commit) all of them."""
        if not self.open:
            self.con.execute("BEGIN TRANSACTION")
            self.open = True
        if self.items or whole and not self.held.empty():
            _insert_part(self.con, self.items, held=self.held, least=0 if whole else INSERT_TABLE_ROWS)
        self.items = []
        self.pending_rows = self.held.total()

    def commit(self) -> None:
        """Insert the files held so far and commit their transaction; their temporary streams are deleted."""
        if not self.rows:
            return
        con = self.con
        try:
            self._insert(whole=True)
            if self.old:
                for t in (*store.EVENT_TABLES, "files"):
                    con.execute(f"DELETE FROM {t} WHERE file_id IN (SELECT unnest(?))", [self.old])
            store.insert_rows(con, "files", ["file_id", "path", "size_bytes", "mtime_ns", "status", "message",
                                             "bytes_read", "base_time_ns", "header", "n_kernels", "n_cpu_ops",
                                             "fingerprint"], self.rows)
            con.execute("COMMIT")
        except BaseException:
            self.abort()
            raise
        finally:
            self._clear()

    def _clear(self) -> None:
        _delete_tmp({f for _, _, tables, _ in self.items for f in tables.values()})
        self.held.close()
        self.items, self.rows, self.old, self.n_rows, self.pending_rows, self.open = [], [], [], 0, 0, False
        self.next_id = None  # asked again: a split file between two batches takes the next id

    def abort(self) -> None:
        if self.open:
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # the transaction is gone already
        self._clear()


class _FileLoad:
    """One trace file loaded into the store, a part (byte range) at a time as the parts arrive.

    A file parsed in one piece is loaded in one transaction. A file cut into byte ranges is loaded part by part
    while the later parts are still being parsed, one transaction per part: DuckDB holds a transaction's rows in
    memory until it commits, so one transaction for a multi-GB file would need memory in proportion to the file.
    Its ``files`` row says ``loading`` until the last part is in; such a file is never a cache hit, and its rows
    are deleted when it is loaded again (an interrupted run) or when a part fails.

    ``baseTimeNanoseconds`` often follows the events, so the parts are shifted by the value read from the file's
    tail beforehand (:func:`.parse.tail_base_time_ns`) and corrected at the end in the rare case the parsed
    header says otherwise.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, key: CacheKey, n_parts: int,
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
        for t in store.EVENT_TABLES:
            self.con.execute(f"DELETE FROM {t} WHERE file_id = ?", [file_id])

    def _split_broken(self) -> bool:
        return self.force_whole or any(i is not None and not i.split_ok for i, _ in self.parts)

    def add(self, info: TraceFile | None, tables: dict | None, err: str | None) -> None:
        self.parts.append((info, err))
        if info is None or any(e for _, e in self.parts) or self._split_broken():
            _delete_tmp(tables)
            return  # the file fails, or is parsed whole at the end: nothing more is inserted
        if self.base is None:
            if not self.split:
                self.base = int(info.base_time_ns)
            else:
                from traceanalyze.ingest import parse

                self.base = parse.tail_base_time_ns(self.tail or self.path, info.header)
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
            _delete_tmp(tables)

    def _parse_whole(self) -> None:
        """A part did not end between two events (guarantee 7): drop the parts' rows and parse the file in one
        piece in this process, so that its rows are exactly those of an unsplit parse."""
        tmp, max_decompressed = self.whole or (tempfile.gettempdir(), DEFAULT_MAX_DECOMPRESSED)
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
        if self._split_broken():
            self._parse_whole()
        info, err = _join_parts(self.parts)
        if self.split:
            self.con.execute("BEGIN TRANSACTION")
        try:
            if info is None:
                self._write_error(err)
            else:
                self._write_done(info)
            self.con.execute("COMMIT")
        except BaseException:
            self.abort()
            raise
        return LoadedFile(self.path, self.file_id, False, info, err)

    def _write_error(self, err: str | None) -> None:
        """The file failed: its rows go, and its ``files`` row says why."""
        con = self.con
        if self.split:
            self._delete_rows(self.file_id)
            con.execute("DELETE FROM files WHERE file_id = ?", [self.file_id])
        else:
            con.execute("ROLLBACK")  # drop what was inserted
            con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO files (file_id, path, size_bytes, mtime_ns, status, message) "
                    "VALUES (?, ?, ?, ?, 'error', ?)", [self.file_id, *self.key, err])

    def _write_done(self, info: TraceFile) -> None:
        """All parts are in: shift them if the parsed ``baseTimeNanoseconds`` differs from the one they were
        inserted with, and write the file's ``files`` row (in place of the ``loading`` one)."""
        con = self.con
        resolved, size, mtime = self.key
        base = int(info.base_time_ns)
        if self.base is not None and base != self.base:
            for t, cols in store.EVENT_COLUMNS.items():
                if any(name == "ts_ns" for name, _ in cols):
                    con.execute(f"UPDATE {t} SET ts_ns = ts_ns + ? WHERE file_id = ?", [base - self.base, self.file_id])
        con.execute("DELETE FROM files WHERE file_id = ?", [self.file_id])  # the 'loading' row, if any
        con.execute(
            "INSERT INTO files (file_id, path, size_bytes, mtime_ns, status, message, bytes_read, "
            "base_time_ns, header, n_kernels, n_cpu_ops) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [self.file_id, resolved, size, mtime, "partial" if info.partial else "ok",
             "; ".join(info.warnings) or None, info.bytes_read, base,
             json.dumps(info.header, default=str), info.counts.get("kernels", 0),
             info.counts.get("cpu_ops", 0)])

    def abort(self) -> None:
        try:
            self.con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction open


def _insert_part(con: duckdb.DuckDBPyConnection, file_id, base: int = 0, tables: dict | None = None, *,
                 held: HeldRows | None = None, least: int = 0) -> None:
    """Insert parsed parts from the Arrow IPC streams their parsers wrote.

    Either one part (``file_id``, ``base``, ``tables``: table name -> stream file) or, with ``file_id`` a list of
    ``(file_id, base_time_ns, tables, table -> rows)``, many files with one ``INSERT`` per table: DuckDB reads the
    streams one after another, a chunk at a time, with each row's ``file_id`` and ``ts_ns + base`` added on the way.
    ``held``: the rows that earlier calls of the transaction held back, to which these are added; a table goes in
    only with at least ``least`` rows held, else its rows stay there (see :mod:`.held`).
    """
    import numpy as np
    import pyarrow as pa

    from traceanalyze.ingest import compute as pc  # not pyarrow.compute: see there
    from traceanalyze.ingest import parse  # not at module level: a cached report never parses

    rows = held if held is not None else HeldRows()
    rows.add(file_id if isinstance(file_id, list) else [(file_id, base, tables, None)])
    try:
        for t, schema in parse.TABLES.items():
            if not rows.due(t, least):  # no rows of this table held, or too few for an INSERT of their own yet
                continue
            names = ", ".join(f'"{c}"' for c in schema.names)
            out_schema = pa.schema([("file_id", pa.int32()), *schema])
            ts_at = schema.names.index("ts_ns") if "ts_ns" in schema.names else None

            def batches(t=t, ts_at=ts_at, out_schema=out_schema):
                for fid, shift, b in rows.take(t):
                    cols = b.columns
                    if ts_at is not None and shift:
                        cols[ts_at] = pc.add(cols[ts_at], shift)
                    yield pa.RecordBatch.from_arrays([pa.array(np.full(b.num_rows, fid, np.int32)), *cols],
                                                     schema=out_schema)

            con.register("_incoming", pa.RecordBatchReader.from_batches(out_schema, batches()))  # a chunk at a time
            try:
                con.execute(f"INSERT INTO {t} (file_id, {names}) SELECT file_id, {names} FROM _incoming")
            finally:
                con.unregister("_incoming")
    finally:
        if held is None:  # its streams are read: they go
            rows.close()
