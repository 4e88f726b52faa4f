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

from traceanalyze.limits import MAX_ALLOC_BYTES
from traceanalyze.store import header_dict

MIN_GROWTH_STEPS = 3  # steps with an allocated value at their end before growth is judged (2 increments)
TOP_OPS = 5  # ops listed per rank and device (largest allocations, and allocations not freed)
NO_OP = "(no op)"
# files whose allocations one query attributes to ops (its working set: their events and ops): the 8-rank scale
# set's memory rows take 0.26 s in one query, 0.50 s a file at a time
FILES_PER_QUERY = 8
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
_DEVICE = "CASE WHEN m.device_type = 0 THEN 'CPU' " \
          "WHEN m.device_type = 1 THEN 'GPU ' || coalesce(CAST(m.device_id AS VARCHAR), '?') " \
          "ELSE 'device ' || coalesce(CAST(m.device_type AS VARCHAR), '?') || ':' " \
          "|| coalesce(CAST(m.device_id AS VARCHAR), '?') END"


def has_memory(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether any file of the run holds ``[memory]`` events."""
    return con.execute(f"SELECT 1 FROM memory_events WHERE file_id IN (SELECT file_id FROM ({_FILES})) LIMIT 1",
                       {"run_id": run_id}).fetchone() is not None


def memory_rows(con: duckdb.DuckDBPyConnection, run_id: int) -> list[MemoryRow]:
    """Every rank's memory per device (see the module), ordered by rank and device; [] without memory events."""
    peaks = con.execute(f"""
        SELECT f.rank, {_DEVICE} AS device, count(*), max(m.total_allocated), max(m.total_reserved),
               any_value(m.file_id), any_value(m.device_id)
        FROM memory_events m JOIN ({_FILES}) f USING (file_id)
        GROUP BY ALL ORDER BY f.rank, device""", {"run_id": run_id}).fetchall()
    rows = {}
    for rank, device, n, alloc, reserved, file_id, device_id in peaks:
        cpu = device == "CPU"
        rows[(rank, device)] = MemoryRow(
            rank=rank, device=device, n_events=n, peak_allocated_bytes=alloc,
            peak_reserved_bytes=None if cpu and not reserved else reserved,
            total_bytes=None if cpu else gpu_total_bytes(con, file_id, device_id))
    for rank, device, step, alloc in _step_ends(con, run_id):
        if (rank, device) in rows and alloc is not None:
            rows[(rank, device)].step_end_allocated.append([step, alloc])
    for r in rows.values():
        _growth(r)
    ops = _ops(con, run_id)
    for (rank, device), (top, unfreed, n_steps) in ops.items():
        if (rank, device) in rows:
            r = rows[(rank, device)]
            r.top_ops, r.unfreed_steps = top, n_steps
            r.unfreed_ops = unfreed
            r.unfreed_bytes = sum(o["bytes"] for o in unfreed)
    for r in rows.values():
        r.unfreed_ops = r.unfreed_ops[:TOP_OPS]
    return list(rows.values())


def gpu_total_bytes(con: duckdb.DuckDBPyConnection, file_id: int, device_id: int | None) -> int | None:
    """``totalGlobalMem`` (bytes) of GPU ``device_id`` in the file's ``deviceProperties``; None when the header
    has none, or a value that is not an integer in (0, MAX_ALLOC_BYTES]."""
    row = con.execute("SELECT header FROM files WHERE file_id = ?", [file_id]).fetchone()
    props = header_dict(row[0] if row else None).get("deviceProperties")
    if not isinstance(props, list):
        return None
    for p in props[:1024]:
        if isinstance(p, dict) and p.get("id") == device_id:
            v = p.get("totalGlobalMem")
            return v if type(v) is int and 0 < v <= MAX_ALLOC_BYTES else None
    return None


def _step_ends(con: duckdb.DuckDBPyConnection, run_id: int) -> list[tuple]:
    """``(rank, device, step, allocated bytes)`` at each profiler step's end, per device of the step's file."""
    return con.execute(f"""
        WITH s AS (SELECT file_id, rank, step, end_ns FROM profiler_steps($run_id)),
        d AS (SELECT DISTINCT file_id, device_type, device_id FROM memory_events
              WHERE file_id IN (SELECT file_id FROM s)),
        sd AS (SELECT s.*, d.device_type, d.device_id FROM s JOIN d USING (file_id)),
        m AS (SELECT file_id, device_type, device_id, ts_ns, total_allocated FROM memory_events
              WHERE file_id IN (SELECT file_id FROM s))
        SELECT sd.rank, {_DEVICE.replace("m.", "sd.")} AS device, sd.step, arg_max(m.total_allocated, m.ts_ns)
        FROM sd ASOF JOIN m ON sd.file_id = m.file_id AND sd.device_type IS NOT DISTINCT FROM m.device_type
             AND sd.device_id IS NOT DISTINCT FROM m.device_id AND sd.end_ns >= m.ts_ns
        GROUP BY ALL ORDER BY sd.rank, device, sd.step""", {"run_id": run_id}).fetchall()


def _growth(r: MemoryRow) -> None:
    """``growth_bytes_per_step`` and ``rising`` of a row from its allocated memory at the steps' ends."""
    vals = [b for _, b in sorted(r.step_end_allocated)]
    if len(vals) < 2:
        return
    inc = [b - a for a, b in zip(vals, vals[1:], strict=False)]
    r.growth_bytes_per_step = float(statistics.median(inc))
    r.rising = len(vals) >= MIN_GROWTH_STEPS and all(d > 0 for d in inc)


# Each allocation (Bytes > 0) of the run with its op and whether it stays: one DuckDB query, ASOF joins in place of
# Python loops over the events (on the 8-rank scale set, 28,000 memory events and 60,000 ops a rank: 0.94 s -> SQL).
# An allocation stays when it is made inside a step (the one that started last before it, if it has not ended; the
# window's last step left out) and not freed (the next event at its address is no free).
# An allocation's op is the op that started last before it on its thread, if it still runs then: the innermost op
# (allocations happen inside the op that asks for memory). At one start, the shorter op is the inner one: the keys
# are (ns since the file's first op or event) × 1024 plus a rank of the op's duration that is larger for shorter ops.
# The rows carry numbers only (the device's name is made per group at the end: dev_id is null on the CPU, whose
# name has no index), and the events are read from the table, not from the window's output, for the first times
# and the threads (0.30 -> 0.28 s of CPU on the scale set).
_BY_OP = f"""
WITH f AS (SELECT * FROM ({_FILES}) WHERE file_id IN (SELECT unnest($files))),
me AS (SELECT m.*, f.rank FROM memory_events m JOIN f USING (file_id)),
base AS (SELECT file_id, min(t) - 1 AS t0 FROM (SELECT file_id, min(ts_ns) AS t FROM me GROUP BY file_id UNION ALL
          SELECT file_id, min(ts_ns) FROM cpu_ops WHERE file_id IN (SELECT file_id FROM f) GROUP BY file_id)
          GROUP BY file_id),
ev AS (
    SELECT file_id, rank, device_type, CASE WHEN device_type = 0 THEN NULL ELSE device_id END AS dev_id,
           coalesce(pid, -1) AS pid, coalesce(tid, -1) AS tid, ts_ns, bytes,
           lead(bytes) OVER (PARTITION BY file_id, device_type, device_id, addr
                             ORDER BY ts_ns, bytes DESC) AS next_bytes
    FROM me),
st AS (SELECT file_id, start_ns, end_ns FROM profiler_steps($run_id) WHERE NOT window_edge),
a AS (SELECT a.file_id, a.rank, a.device_type, a.dev_id, a.pid, a.tid, a.ts_ns, a.bytes,
             coalesce(coalesce(a.next_bytes >= 0, true) AND a.ts_ns <= st.end_ns, false) AS kept,
             (a.ts_ns - base.t0) * 1024 + 1023 AS k
      FROM (SELECT * FROM ev WHERE bytes > 0) a JOIN base USING (file_id)
      ASOF LEFT JOIN st ON a.file_id = st.file_id AND a.ts_ns >= st.start_ns),
o AS (SELECT c.file_id, coalesce(c.pid, -1) AS pid, coalesce(c.tid, -1) AS tid, c.ts_ns + c.dur_ns AS end_ns,
             c.name, (c.ts_ns - base.t0) * 1024 + 1022 - least(1022, floor(log2(c.dur_ns + 1)) * 16)::BIGINT AS k
      FROM cpu_ops c JOIN base USING (file_id)
      WHERE c.cat = 'cpu_op' AND c.dur_ns >= 0 AND (c.file_id, coalesce(c.pid, -1), coalesce(c.tid, -1))
            IN (SELECT DISTINCT file_id, coalesce(pid, -1), coalesce(tid, -1) FROM me)),
j AS (SELECT a.rank, a.device_type, a.dev_id, a.bytes, a.kept, CASE WHEN o.end_ns >= a.ts_ns THEN o.name END AS op
      FROM a ASOF LEFT JOIN o ON a.file_id = o.file_id AND a.pid = o.pid AND a.tid = o.tid AND a.k >= o.k),
g AS (SELECT rank, device_type, dev_id AS device_id, op, kept, count(*) AS n,
             least(sum(bytes::HUGEINT), {SUM_CAP})::BIGINT AS total, max(bytes) AS big
      FROM j GROUP BY ALL)
SELECT rank, {_DEVICE.replace("m.", "g.")} AS device, coalesce(op, '{NO_OP}') AS op, kept, n, total, big FROM g
"""


def _ops(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[tuple[int, str], tuple[list, list, int]]:
    """Per (rank, device): the top ops by bytes allocated, the ops of the allocations inside the steps never
    freed (both most bytes first), and the number of steps those were counted over. :data:`FILES_PER_QUERY` files
    at a time."""
    n_steps = dict(con.execute("SELECT rank, count(*) FROM profiler_steps($run_id) WHERE NOT window_edge "
                               "GROUP BY rank", {"run_id": run_id}).fetchall())
    top: dict[tuple, dict[str, list[int]]] = {}
    unfreed: dict[tuple, dict[str, list[int]]] = {}
    files = [r[0] for r in con.execute(f"SELECT DISTINCT file_id FROM memory_events WHERE file_id IN "
                                       f"(SELECT file_id FROM ({_FILES})) ORDER BY file_id",
                                       {"run_id": run_id}).fetchall()]
    for i in range(0, len(files), FILES_PER_QUERY):  # the join's working set: a few ranks' events and ops
        rows = con.execute(_BY_OP, {"run_id": run_id, "files": files[i:i + FILES_PER_QUERY]}).fetchall()
        for rank, device, op, kept, n, nbytes, big in rows:  # every allocation once in top, the kept ones again
            _tally(top.setdefault((rank, device), {}), str(op), n, nbytes, big)
            if kept:
                _tally(unfreed.setdefault((rank, device), {}), str(op), n, nbytes, big)
    return {k: (_ranked(v)[:TOP_OPS], _ranked(unfreed.get(k, {})), n_steps.get(k[0], 0)) for k, v in top.items()}


def _tally(acc: dict[str, list[int]], op: str, n: int, nbytes, big: int) -> None:
    """Add one file's ``n`` allocations of ``op`` (``nbytes`` in all, the largest ``big``) to a rank's tally."""
    t = acc.setdefault(op, [0, 0, 0])
    t[0] += n
    t[1] += int(nbytes)
    t[2] = max(t[2], big)


def _ranked(acc: dict[str, list[int]]) -> list[dict]:
    return [{"op": op, "count": c, "bytes": b, "largest_bytes": big}
            for op, (c, b, big) in sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))]
