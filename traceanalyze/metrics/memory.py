"""Memory per rank and device, from the allocator's ``[memory]`` events (traces recorded with
``profile_memory=True``; table ``memory_events``).

Per rank and device (``"CPU"``, ``"GPU 0"``, ...), over every profiling window of the rank:

- **peak allocated / peak reserved** (bytes): the largest ``Total Allocated`` / ``Total Reserved`` any event of
  the window carries. On the CPU the counts start at the profiler's start (PyTorch warns "Memory block of unknown
  size was allocated before the profiling started"): CPU figures are what was allocated *while profiling*, and
  the CPU allocator reserves nothing (its reserved peak is None). GPU figures are the caching allocator's own
  totals, memory allocated before the profiler started included.
- **allocated at each step's end** (bytes): ``Total Allocated`` of the device's last event at or before the end of
  each ``ProfilerStep#N`` (every step of the window, its last one included); ``growth_bytes_per_step`` is the
  median of the step-to-step increments and ``rising`` says whether every increment is positive (at least
  :data:`MIN_GROWTH_STEPS` steps).
- **largest allocations by op**: each allocation (``Bytes`` > 0) belongs to the innermost ``cpu_op`` enclosing
  its timestamp on its thread (``"(no op)"`` outside any); per op the allocations, their bytes and the largest.
- **not freed**: allocations inside the window's steps (its last step left out: what it allocates may be freed
  after the window ends) whose address is not freed before it is allocated again or the window ends, by op.

Only runs with ``memory_events`` rows get here (:func:`has_memory`): a trace without them costs one indexed query.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from traceanalyze.limits import MAX_ALLOC_BYTES
from traceanalyze.store import header_dict

MIN_GROWTH_STEPS = 3  # steps with an allocated value at their end before growth is judged (2 increments)
TOP_OPS = 5  # ops listed per rank and device (largest allocations, and allocations not freed)
NO_OP = "(no op)"
# files whose allocations are attributed to ops together (the working set: their events and ops, beside the
# replay's graph on the other thread); 8 at a time put the 8-rank scale set's peak at 445 MB of PSS, 2 at 381 MB in
# the same time (benchmarks/bench.py --baseline, 3 runs each)
FILES_PER_QUERY = 2
SUM_CAP = 1 << 62  # bytes: a sum of allocations is held at this (hostile counts of 1 PiB each would wrap an int64)


@dataclass
class MemoryRow:
    """Memory of one rank on one device. Bytes throughout; ``step_end_allocated`` is ``[[step, bytes], ...]``;
    ``top_ops`` / ``unfreed_ops`` are ``[{"op", "count", "bytes", "largest_bytes"}, ...]``, most bytes first."""

    rank: int
    device: str  # "CPU" | "GPU <index>"
    n_events: int
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None  # None on the CPU (its allocator reserves nothing)
    total_bytes: int | None = None  # the GPU's totalGlobalMem from the trace header; None when unknown or CPU
    step_end_allocated: list = field(default_factory=list)
    growth_bytes_per_step: float | None = None  # median increment of step_end_allocated (bytes per step)
    rising: bool = False  # every increment > 0, over at least MIN_GROWTH_STEPS steps
    top_ops: list = field(default_factory=list)
    unfreed_ops: list = field(default_factory=list)
    unfreed_bytes: int = 0  # allocated inside the steps (not the last) and never freed in the window
    unfreed_steps: int = 0  # the steps those allocations were counted over

    def model(self) -> dict:
        """The row as the report model's ``runs[i].ranks[j].memory[k]`` (docs/schema.md)."""
        return asdict(self)


_FILES = "SELECT file_id, rank FROM files WHERE run_id = $run_id AND status <> 'error' AND rank IS NOT NULL"


def has_memory(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether any file of the run holds ``[memory]`` events."""
    return con.execute(f"SELECT 1 FROM memory_events WHERE file_id IN (SELECT file_id FROM ({_FILES})) LIMIT 1",
                       {"run_id": run_id}).fetchone() is not None


def memory_rows(con: duckdb.DuckDBPyConnection, run_id: int) -> list[MemoryRow]:
    """Every rank's memory per device (see the module), ordered by rank and device; [] without memory events."""
    # one read of the events, :data:`FILES_PER_QUERY` files at a time, gives the peaks, the allocated bytes at the
    # steps' ends and the allocations by op: a grouped query for the peaks and an ASOF join for the step ends
    # cost 6 and 36 ms of CPU more on the 8-rank scale set (the join sorted every event)
    t = _Tally(con.execute(_STEPS, {"run_id": run_id}).fetchall())
    files = [r[0] for r in con.execute(f"SELECT DISTINCT file_id FROM memory_events WHERE file_id IN "
                                       f"(SELECT file_id FROM ({_FILES})) ORDER BY file_id",
                                       {"run_id": run_id}).fetchall()]
    for i in range(0, len(files), FILES_PER_QUERY):  # the working set: a few ranks' events and ops
        t.add(con, {"run_id": run_id, "files": files[i:i + FILES_PER_QUERY]})
    # the GPU rows' headers in one query: one a row cost 0.35 ms each (a third of a second on 1,024 ranks)
    gpu_files = sorted({p[3] for (_, device), p in t.peaks.items() if device != "CPU"})
    headers = dict(con.execute("SELECT file_id, header FROM files WHERE list_contains($1, file_id)",
                               [gpu_files]).fetchall()) if gpu_files else {}
    ends: dict[tuple, list] = {}
    for (rank, device, step), (_, alloc) in sorted(t.step_end.items()):
        ends.setdefault((rank, device), []).append([step, alloc])
    rows = []
    for (rank, device), (n, alloc, reserved, file_id, device_id) in sorted(t.peaks.items()):
        cpu = device == "CPU"
        r = MemoryRow(rank=rank, device=device, n_events=n, peak_allocated_bytes=alloc,
                      peak_reserved_bytes=None if cpu and not reserved else reserved,
                      total_bytes=None if cpu else header_total_bytes(headers.get(file_id), device_id),
                      step_end_allocated=ends.get((rank, device), []))
        _growth(r)
        if (rank, device) in t.top:
            unfreed = _ranked(t.unfreed.get((rank, device), {}))
            r.top_ops, r.unfreed_steps = _ranked(t.top[(rank, device)])[:TOP_OPS], t.n_steps.get(rank, 0)
            r.unfreed_ops, r.unfreed_bytes = unfreed[:TOP_OPS], sum(o["bytes"] for o in unfreed)
        rows.append(r)
    return rows


def header_total_bytes(header: str | None, device_id: int | None) -> int | None:
    """``totalGlobalMem`` (bytes) of GPU ``device_id`` in a file's ``deviceProperties`` (``header``: its
    ``files.header`` value); None without a header, or with none there, or a value that is not an integer in
    (0, MAX_ALLOC_BYTES]."""
    props = header_dict(header).get("deviceProperties")
    if not isinstance(props, list):
        return None
    for p in props[:1024]:
        if isinstance(p, dict) and p.get("id") == device_id:
            v = p.get("totalGlobalMem")
            return v if type(v) is int and 0 < v <= MAX_ALLOC_BYTES else None
    return None


def _growth(r: MemoryRow) -> None:
    """``growth_bytes_per_step`` and ``rising`` of a row from its allocated memory at the steps' ends."""
    vals = [b for _, b in sorted(r.step_end_allocated)]
    if len(vals) < 2:
        return
    inc = [b - a for a, b in zip(vals, vals[1:], strict=False)]
    r.growth_bytes_per_step = float(statistics.median(inc))
    r.rising = len(vals) >= MIN_GROWTH_STEPS and all(d > 0 for d in inc)


# Each allocation (Bytes > 0) with its op and whether it stays: two plain reads and NumPy sorts (the events and ops
# come nearly in time order, which its stable sorts run through fast). On the 8-rank scale set (28,000 memory events
# and 60,000 ops a rank) the memory rows took 0.34 s of CPU with a lead() window and two ASOF joins; 0.22 s so.
# A null device type or index reads -2 in the sorts (a stored one is -1 or more).
# An allocation stays when it is made inside a step (the one that started last before it, if it has not ended; the
# window's last step left out) and not freed (the next event at its address, by time then larger Bytes first, is
# no free).
# An allocation's op is the op that started last before it on its thread, if it still runs then: the innermost op
# (allocations happen inside the op that asks for memory). At one start, the shorter op is the inner one.
_STEPS = "SELECT rank, file_id, step, start_ns, end_ns, window_edge FROM profiler_steps($run_id)"
_BATCH = f"SELECT * FROM ({_FILES}) WHERE file_id IN (SELECT unnest($files))"
# the events with their thread's (pid, tid) (null: -1); the threads that allocate are numbered in NumPy
# (:func:`_threads`) and passed to the ops' query as lists: a numbering in SQL scanned the events twice (half the
# events' query)
_EVENTS = f"""
WITH f AS ({_BATCH})
SELECT m.file_id, f.rank, m.device_type, CASE WHEN m.device_type = 0 THEN NULL ELSE m.device_id END AS dev_id,
       coalesce(m.device_type, -2) AS dt, coalesce(m.device_id, -2) AS di, coalesce(m.addr, 0) AS addr,
       m.addr IS NULL AS no_addr, coalesce(m.pid, -1) AS pid, coalesce(m.tid, -1) AS tid, m.ts_ns, m.bytes,
       coalesce(m.total_allocated, -1) AS alloc, coalesce(m.total_reserved, -1) AS reserved
FROM memory_events m JOIN f USING (file_id)"""
_OPS = """
WITH th AS (SELECT unnest($th_file) AS file_id, unnest($th_pid) AS pid, unnest($th_tid) AS tid,
                   unnest($th_n) AS thread)
SELECT th.thread, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns, c.name
FROM cpu_ops c JOIN th ON c.file_id = th.file_id AND coalesce(c.pid, -1) = th.pid AND coalesce(c.tid, -1) = th.tid
WHERE c.file_id IN (SELECT unnest($files)) AND c.cat = 'cpu_op' AND c.dur_ns >= 0"""
_BY_OP = f"""
SELECT rank, coalesce(device_type, -2) AS dt, coalesce(dev_id, -2) AS di, coalesce(op, '{NO_OP}') AS op, kept,
       count(*) AS n, least(sum(bytes::HUGEINT), {SUM_CAP})::BIGINT AS total, max(bytes) AS big
FROM _allocs GROUP BY ALL"""  # the devices named as the peaks' (:func:`_device_name`)


class _Tally:
    """What :func:`memory_rows` adds up over its batches of files, keyed by (rank, device): ``peaks`` (events,
    peak allocated, peak reserved, a file and the device index: its header's GPU), ``step_end`` ((rank, device,
    step) -> (ts, allocated bytes) of the device's last event at or before the step's end), ``top`` and
    ``unfreed`` (op -> [allocations, bytes, largest]); ``n_steps``: rank -> steps not at a window's edge. ``steps``:
    the run's profiler steps ``(rank, file, step, start, end, window_edge)`` (:data:`_STEPS`)."""

    def __init__(self, steps: list[tuple]) -> None:
        self.n_steps: dict[int, int] = {}
        by_file: dict[int, list[tuple[int, int]]] = {}  # file -> its steps' (start, end) in ns
        ends: dict[int, list[tuple[int, int]]] = {}  # file -> its steps' (step, end), every step
        for rank, f, step, start, end, edge in steps:
            if end is not None:
                ends.setdefault(f, []).append((step, end))
            if edge:
                continue
            self.n_steps[rank] = self.n_steps.get(rank, 0) + 1
            if start is not None:  # one whose end is unknown holds nothing
                by_file.setdefault(f, []).append((start, end if end is not None else np.iinfo(np.int64).min))
        self.within = {f: np.array(sorted(se), dtype=np.int64).T for f, se in by_file.items()}
        self.ends = {f: np.array(se, dtype=np.int64).T for f, se in ends.items()}
        self.peaks: dict[tuple, list] = {}
        self.step_end: dict[tuple, tuple[int, int]] = {}
        self.top: dict[tuple, dict[str, list[int]]] = {}
        self.unfreed: dict[tuple, dict[str, list[int]]] = {}

    def add(self, con: duckdb.DuckDBPyConnection, params: dict) -> None:
        """One batch of files (``params["files"]``): their events read once."""
        ev = con.sql(_EVENTS, params=params).to_arrow_table()
        e = {c: ev[c].to_numpy() for c in ("file_id", "rank", "dt", "di", "addr", "no_addr", "pid", "tid", "ts_ns",
                                           "bytes", "alloc", "reserved")}
        self._devices(e)
        con.register("_allocs", _allocations(con, params, ev, e, self.within))
        try:
            rows = con.execute(_BY_OP).fetchall()
        finally:
            con.unregister("_allocs")
        for rank, dt, di, op, kept, n, nbytes, big in rows:  # every allocation once in top, the kept ones again
            device = _device_name(dt, di)
            _tally(self.top.setdefault((rank, device), {}), str(op), n, nbytes, big)
            if kept:
                _tally(self.unfreed.setdefault((rank, device), {}), str(op), n, nbytes, big)

    def _devices(self, e: dict[str, np.ndarray]) -> None:
        """The peaks and step ends of a batch's events, per file and device (events sorted by them, then time:
        the stable sort keeps the stored order of events at one ns, the last of which the ASOF join this
        replaced took)."""
        order = np.lexsort((e["ts_ns"], e["di"], e["dt"], e["file_id"]))
        if not len(order):
            return
        f, dt, di, ts = e["file_id"][order], e["dt"][order], e["di"][order], e["ts_ns"][order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (f[1:] != f[:-1]) | (dt[1:] != dt[:-1]) | (di[1:] != di[:-1])
        starts = np.flatnonzero(new)
        alloc, reserved = e["alloc"][order], e["reserved"][order]  # null: -1
        peak_a, peak_r = np.maximum.reduceat(alloc, starts), np.maximum.reduceat(reserved, starts)
        bounds = np.append(starts, len(order)).tolist()
        for j, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
            file_id, rank, t, i = int(f[a]), int(e["rank"][order[a]]), int(dt[a]), int(di[a])
            device = _device_name(t, i)
            p = self.peaks.setdefault((rank, device), [0, None, None, file_id, None if i == -2 else i])
            p[0] += b - a
            p[1], p[2] = _larger(p[1], int(peak_a[j])), _larger(p[2], int(peak_r[j]))
            if file_id in self.ends:
                self._step_ends(rank, device, self.ends[file_id], ts[a:b], alloc[a:b])

    def _step_ends(self, rank: int, device: str, ends: np.ndarray, ts: np.ndarray, alloc: np.ndarray) -> None:
        """Each step's (``ends``: step numbers, end ns) allocated bytes at its end from one device's events of its
        file (``ts``, sorted; ``alloc``, null -1): that of the last event at or before it, if not null; of two
        (CPU indexes, files of one rank) the later one's."""
        at = np.searchsorted(ts, ends[1], side="right") - 1
        for step, k in zip(ends[0].tolist(), at.tolist(), strict=False):
            if k >= 0 and alloc[k] >= 0:
                key, t = (rank, device, step), int(ts[k])
                if key not in self.step_end or t > self.step_end[key][0]:
                    self.step_end[key] = (t, int(alloc[k]))


def _device_name(dt: int, di: int) -> str:
    """A device's name from its type and index (null: -2): ``CPU`` (its index left out), ``GPU 3`` (``GPU ?``
    without an index), else ``device TYPE:INDEX``, ``?`` for a null."""
    if dt == 0:
        return "CPU"
    if dt == 1:
        return f"GPU {di if di != -2 else '?'}"
    return f"device {dt if dt != -2 else '?'}:{di if di != -2 else '?'}"


def _larger(a: int | None, b: int) -> int | None:
    """The larger of a peak so far (None: none) and one of a batch (-1: none)."""
    return a if b < 0 else b if a is None else max(a, b)


def _allocations(con: duckdb.DuckDBPyConnection, params: dict, ev: pa.Table, e: dict[str, np.ndarray],
                 steps: dict[int, np.ndarray]) -> pa.Table:
    """The allocations of a batch of files (``ev``: their events, :data:`_EVENTS`; ``e``: its columns in NumPy):
    rank, device_type, dev_id, bytes, op (its name; null outside any op) and kept (made inside a step and not
    freed; see above)."""
    order = np.lexsort((-e["bytes"], e["ts_ns"], e["addr"], e["no_addr"], e["di"], e["dt"], e["file_id"]))
    same = np.ones(max(len(order) - 1, 0), dtype=bool)  # the next event (by address, then time) is at its address
    for c in ("file_id", "dt", "di", "addr", "no_addr"):
        col = e[c][order]
        same &= col[1:] == col[:-1]
    freed = np.zeros(len(order), dtype=bool)
    freed[order[:-1]] = same & (e["bytes"][order[1:]] < 0)
    allocs = np.flatnonzero(e["bytes"] > 0)
    kept = (~freed & _in_step(e["file_id"], e["ts_ns"], steps, params["files"]))[allocs]
    a = {"ts_ns": e["ts_ns"][allocs]}
    a["thread"], th = _threads(e["file_id"][allocs], e["pid"][allocs], e["tid"][allocs])
    ops = con.sql(_OPS, params={"files": params["files"], **th}).to_arrow_table()
    op_at, op_ok = _innermost(a, {c: ops[c].to_numpy() for c in ("thread", "ts_ns", "end_ns")})
    return pa.table({"rank": ev["rank"].take(allocs), "device_type": ev["device_type"].take(allocs),
                     "dev_id": ev["dev_id"].take(allocs), "bytes": pa.array(e["bytes"][allocs]),
                     "op": ops["name"].take(pa.array(op_at, mask=~op_ok)) if len(ops) else
                     pa.nulls(len(allocs), pa.string()),
                     "kept": pa.array(kept)})


def _threads(file_id: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, dict[str, list[int]]]:
    """Each allocation's thread, numbered from 1 by (file, pid, tid), and the threads as :data:`_OPS`' parameters
    (``th_file``, ``th_pid``, ``th_tid``, ``th_n``: its number). The allocations come in runs of one thread: only
    the runs' first rows are sorted (a sort of every row's three keys cost more than the SQL numbering)."""
    n = len(file_id)
    head = np.ones(n, dtype=bool)
    head[1:] = (file_id[1:] != file_id[:-1]) | (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    heads = np.flatnonzero(head)
    keys = np.stack([file_id[heads].astype(np.int64), pid[heads].astype(np.int64), tid[heads].astype(np.int64)],
                    axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    thread = np.repeat(inv.reshape(-1) + 1, np.diff(np.append(heads, n)))
    return thread, {"th_file": uniq[:, 0].tolist(), "th_pid": uniq[:, 1].tolist(), "th_tid": uniq[:, 2].tolist(),
                    "th_n": list(range(1, len(uniq) + 1))}


def _innermost(a: dict[str, np.ndarray], o: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """For each allocation (``a``: thread, ts_ns), the index of its op in ``o`` (thread, ts_ns, end_ns), and
    whether it has one (see above; threads are numbered from 1). Among the ops of a thread sorted by start, an
    allocation's op is the shortest of the last ones that started at or before it (at one ns; of one power of two
    of duration, the shortest is the inner one too), if it still runs then."""
    n_o, n_a = len(o["ts_ns"]), len(a["ts_ns"])
    op_at, op_ok = np.zeros(n_a, dtype=np.int64), np.zeros(n_a, dtype=bool)
    if not n_o or not n_a:
        return op_at, op_ok
    s_ops = np.lexsort((o["ts_ns"], o["thread"]))  # the ops by thread and start (they come nearly so: fast)
    t_s, ts_s, end_s = o["thread"][s_ops], o["ts_ns"][s_ops], o["end_ns"][s_ops]
    new = np.ones(n_o, dtype=bool)  # a run: the ops of one thread that start at one ns
    new[1:] = (t_s[1:] != t_s[:-1]) | (ts_s[1:] != ts_s[:-1])
    starts = np.flatnonzero(new)
    run = np.cumsum(new) - 1
    # the shortest op of each run (the one that ends first; the last of those that end together)
    best = np.maximum.reduceat(np.where(end_s == np.minimum.reduceat(end_s, starts)[run], np.arange(n_o), -1), starts)
    above = np.full(n_a, -1, dtype=np.int64)  # each allocation's last op at or before it on its thread (sorted ops)
    a_by = np.argsort(a["thread"], kind="stable")
    n_t = int(max(t_s[-1], a["thread"][a_by[-1]]))
    o_at, a_at = np.searchsorted(t_s, np.arange(1, n_t + 2)), np.searchsorted(a["thread"][a_by], np.arange(1, n_t + 2))
    for t in range(n_t):  # a few threads a file
        rows = a_by[a_at[t]:a_at[t + 1]]
        k = np.searchsorted(ts_s[o_at[t]:o_at[t + 1]], a["ts_ns"][rows], side="right")
        above[rows] = np.where(k > 0, o_at[t] + k - 1, -1)
    has = above >= 0
    j = s_ops[best[run[np.maximum(above, 0)]]]
    op_at[has] = j[has]
    op_ok[:] = has & (o["end_ns"][j] >= a["ts_ns"])
    return op_at, op_ok


def _in_step(file_id: np.ndarray, ts: np.ndarray, steps: dict[int, np.ndarray], files: list[int]) -> np.ndarray:
    """Whether each event (its file, its ts in ns) is inside the step of its file that started last at or before
    it (``steps``: file -> its steps' starts and ends, by start)."""
    out = np.zeros(len(ts), dtype=bool)
    for f in files:
        if f in steps:
            starts, ends = steps[f]
            rows = np.flatnonzero(file_id == f)
            j = np.searchsorted(starts, ts[rows], side="right") - 1
            out[rows] = (j >= 0) & (ts[rows] <= ends[np.maximum(j, 0)])
    return out


def _tally(acc: dict[str, list[int]], op: str, n: int, nbytes, big: int) -> None:
    """Add one file's ``n`` allocations of ``op`` (``nbytes`` in all, the largest ``big``) to a rank's tally."""
    t = acc.setdefault(op, [0, 0, 0])
    t[0] += n
    t[1] += int(nbytes)
    t[2] = max(t[2], big)


def _ranked(acc: dict[str, list[int]]) -> list[dict]:
    return [{"op": op, "count": c, "bytes": b, "largest_bytes": big}
            for op, (c, b, big) in sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))]
