"""Export: one Chrome/Perfetto trace holding every rank of a run, clocks aligned, findings marked.

The output is a Chrome trace-event JSON object (``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``, gzip
when the name ends in ``.gz``) that Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open:

- one *process* per rank: ``pid`` = rank, named ``rank N`` and sorted by rank;
- *threads*: the rank's CPU threads (``tid`` = the OS thread id, named as in the trace) and one per GPU stream
  (``tid`` = ``GPU_TID_BASE + device * 100000 + stream``, named ``GPU d stream s``);
- events (``ph: "X"``, ``ts``/``dur`` in µs with ns decimals) read from the DuckDB store: GPU kernels, memcpys
  and memsets; user annotations (``ProfilerStep#N``, ``record_function`` ranges, ``gloo:*``) and their GPU
  projections; and the *top-level* CPU ops of each thread (ops not nested in another op; their children are
  left out to bound the size);
- a **"traceanalyze findings"** thread per rank (sorted first) with annotated ranges whose ``args`` hold the
  finding's title: the straggler's profiler steps (with its compute against the median), the *exposed
  communication* intervals (communication time not under compute; GPU: NCCL kernels minus compute kernels,
  CPU: ``gloo:``/``c10d::`` ranges minus the training thread's ``aten::`` ops), and the torch.compile
  ranges (union of the dynamo/inductor timing ranges).

Timestamps are aligned across ranks: each rank's clock offset (:func:`traceanalyze.metrics.collectives.
analyze_collectives`: the median difference of matched collective ends against the lowest rank) is
subtracted, then the earliest aligned event of the run becomes ``ts`` 0. After alignment the end of a matched
collective lands at (nearly) the same ``ts`` on every rank.

Size is bounded by ``max_events``: finding ranges and annotations come first, then kernels, then top-level
CPU ops; a class that does not fit whole keeps its longest events, and ``otherData.dropped`` says how many
of each class were left out.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np

from traceanalyze.errors import TraceanalyzeError
from traceanalyze.limits import DEFAULT_MAX_EVENTS
from traceanalyze.metrics.breakdown import training_thread_sql, union
from traceanalyze.metrics.collectives import analyze_collectives
from traceanalyze.metrics.host import compile_intervals
from traceanalyze.metrics.where import host_gaps
from traceanalyze.safety import atomic_path
from traceanalyze.version import __version__

GPU_TID_BASE = 1_000_000_000
FINDINGS_TID = 999_999_999
FINDINGS_THREAD = "traceanalyze findings"
STRAGGLER_GAPS = 5  # the straggler's largest host gaps marked


@dataclass
class ExportResult:
    """What :func:`export_trace` wrote: the path, the run, event counts kept and dropped per class, and the
    clock offsets subtracted (µs, by rank)."""

    path: Path
    run: str
    ranks: list[int]
    n_events: int
    kept: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    clock_offsets_us: dict[int, float] = field(default_factory=dict)


def _run_row(con: duckdb.DuckDBPyConnection, run: str | int | None) -> tuple[int, str, str, int | None]:
    rows = con.execute("SELECT run_id, name, role, mode, world_size FROM runs ORDER BY run_id").fetchall()
    rows = [r for r in rows if r[3] in ("gpu", "cpu")]
    if not rows:
        raise TraceanalyzeError("nothing to export: no run with trace files in the database")
    if run is None:
        pick = next((r for r in rows if r[2] == "subject"), rows[0])
    else:
        pick = next((r for r in rows if r[0] == run or r[1] == str(run)), None)
        if pick is None:
            names = ", ".join(repr(r[1]) for r in rows)
            raise TraceanalyzeError(f"no run named {run!r} in the database (runs: {names})")
    return pick[0], pick[1], pick[3], pick[4]


def clock_offsets_ns(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world_size: int | None) -> dict[int, int]:
    """rank -> clock offset (ns) against the lowest rank, from matched collective ends (0 when none match)."""
    coll = analyze_collectives(con, run_id, mode, world_size)
    return {int(r): int(round(us * 1e3)) for r, us in coll.clock_offsets_us.items()}


def _subtract(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray) -> list[tuple[int, int]]:
    """Sorted disjoint intervals A minus sorted disjoint intervals B (ns)."""
    out = []
    j = 0
    nb = len(b_s)
    for s, e in zip(a_s.tolist(), a_e.tolist(), strict=True):
        cur = s
        while j < nb and b_e[j] <= cur:
            j += 1
        k = j
        while k < nb and b_s[k] < e:
            if b_s[k] > cur:
                out.append((cur, int(b_s[k])))
            cur = max(cur, int(b_e[k]))
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _exposed_comm(con, run_id: int, mode: str) -> dict[int, list[tuple[int, int]]]:
    """rank -> exposed communication intervals (ns, own clock): ∪comm − ∪compute, per profiling window. CPU mode:
    compute is the training thread's (:func:`traceanalyze.metrics.breakdown.training_thread_sql`) when one holds
    profiler steps, else every thread's."""
    if mode == "gpu":
        sql = """
            SELECT f.rank, f.file_id, kernel_class(k.cat, k.name) AS klass, k.ts_ns AS s, k.ts_ns + k.dur_ns AS e
            FROM kernels k JOIN files f USING (file_id)
            WHERE f.run_id = ? AND k.cat <> 'gpu_user_annotation' AND kernel_class(k.cat, k.name) <> 'memory'"""
    else:
        sql = f"""
            WITH main AS (SELECT file_id, tid FROM ({training_thread_sql("$1")}) WHERE steps > 0)
            SELECT f.rank, f.file_id, cpu_op_class(c.cat, c.name) AS klass, c.ts_ns AS s, c.ts_ns + c.dur_ns AS e
            FROM cpu_ops c JOIN files f USING (file_id) LEFT JOIN main m ON m.file_id = c.file_id
            WHERE f.run_id = $1 AND (cpu_op_class(c.cat, c.name) = 'communication'
                  OR (cpu_op_class(c.cat, c.name) = 'compute' AND (m.tid IS NULL OR c.tid = m.tid)))"""
    res = con.execute(sql, [run_id]).fetchnumpy()
    out: dict[int, list[tuple[int, int]]] = {}
    if not len(res["rank"]):
        return out
    rank = np.asarray(res["rank"], dtype=np.int64)
    fid = np.asarray(res["file_id"], dtype=np.int64)
    klass = np.asarray(res["klass"]).astype(str)
    s = np.asarray(res["s"], dtype=np.int64)
    e = np.asarray(res["e"], dtype=np.int64)
    for f in np.unique(fid):
        sel = fid == f
        comm = sel & (klass == "communication")
        if not comm.any():
            continue
        comp = sel & (klass == "compute")
        cs, ce = union(s[comm], e[comm])
        ps, pe = union(s[comp], e[comp])
        out.setdefault(int(rank[sel][0]), []).extend(_subtract(cs, ce, ps, pe))
    return out


def _compile_ranges(con, run_id: int) -> dict[int, list[tuple[int, int]]]:
    """rank -> the union of its torch.compile ranges (ns, own clock)."""
    out = {}
    for r, (s, e) in compile_intervals(con, run_id).items():
        us, ue = union(s, e)
        out[r] = list(zip(us.tolist(), ue.tolist(), strict=True))
    return out


def _finding_events(con, run_id: int, mode: str) -> list[tuple[int, int, int, str, dict]]:
    """(rank, start_ns, end_ns, name, args) ranges for the findings track, on each rank's own clock."""
    findings = con.execute("SELECT kind, title, ranks, cause FROM findings WHERE run_id = ? ORDER BY impact_pct DESC",
                           [run_id]).fetchall()
    by_kind: dict[str, tuple[str, list[int], str]] = {}
    for kind, title, ranks, cause in findings:
        try:
            rk = [int(x) for x in json.loads(ranks or "[]")]
        except (ValueError, TypeError):
            rk = []
        by_kind.setdefault(kind, (title, rk, cause))
    out: list[tuple[int, int, int, str, dict]] = []

    if "straggler" in by_kind:  # where the straggler loses time: its largest host gaps, not its whole steps
        title, rk, cause = by_kind["straggler"]
        gaps, per_step = host_gaps(con, run_id, rk, top=STRAGGLER_GAPS)
        for r, gs in gaps.items():
            for g in gs:
                out.append((r, g.start_ns, g.end_ns, f"straggler: host gap in step {g.step}",
                            {"finding": title, "cause": cause, "step": g.step, "gap_ms": round(g.dur_us / 1e3, 3),
                             "from_step_start_ms": round(g.offset_us / 1e3, 3),
                             "host_gap_ms_per_step": round(per_step.get(r, 0.0) / 1e3, 3)}))

    comm_title = None
    for kind in ("slow_collectives", "topology"):
        if kind in by_kind:
            comm_title = by_kind[kind][0]
            break
    for r, ivs in _exposed_comm(con, run_id, mode).items():
        for s, e in ivs:
            args = {"finding": comm_title} if comm_title else {"note": "no interconnect finding for this run"}
            out.append((r, s, e, "exposed communication", {**args, "cause": "interconnect"}))

    comp_title = by_kind.get("compile_overhead", (None,))[0] or by_kind.get("recompiles", (None,))[0]
    for r, ivs in _compile_ranges(con, run_id).items():
        for s, e in ivs:
            args = {"finding": comp_title} if comp_title else {"note": "no compile finding for this run"}
            out.append((r, s, e, "torch.compile", {**args, "cause": "config"}))
    return out


def _fmt_us(ns: int) -> float:
    return round(ns / 1e3, 3)


class _Budget:
    """The events still allowed under ``max_events``, and how many of each class were kept and dropped."""

    def __init__(self, max_events: int) -> None:
        self.left = max_events
        self.kept: dict[str, int] = {}
        self.dropped: dict[str, int] = {}

    def fit(self, cls: str, total: int) -> int | None:
        """How many of ``total`` events of a class fit; None = all. Records kept/dropped."""
        n = min(total, self.left)
        self.left -= n
        self.kept[cls] = n
        if n < total:
            self.dropped[cls] = total - n
            return n
        return None


def _offsets_sql(offsets: dict[int, int], ranks: list[int]) -> str:
    """A table expression ``(rank, off)``: each rank's clock offset (ns) to subtract."""
    return "(SELECT * FROM (VALUES " + ", ".join(f"({r}, {offsets.get(r, 0)})" for r in ranks) + ") t(rank, off))"


def _aligned_origin(con: duckdb.DuckDBPyConnection, run_id: int, off_sql: str) -> int:
    """The run's earliest event on the aligned clock (ns): ``ts`` 0 of the export."""
    return con.execute(f"""
        SELECT min(t) FROM (
            SELECT min(k.ts_ns - o.off) AS t FROM kernels k JOIN files f USING (file_id) JOIN {off_sql} o USING (rank)
            WHERE f.run_id = $1
            UNION ALL
            SELECT min(c.ts_ns - o.off) FROM cpu_ops c JOIN files f USING (file_id) JOIN {off_sql} o USING (rank)
            WHERE f.run_id = $1 AND c.cat IN ('cpu_op', 'user_annotation'))""", [run_id]).fetchone()[0] or 0


_EVENT_ORDER = "rank, pid, tid, device, stream, ts, dur DESC, name, cat, external_id, correlation"


def _event_queries(off_sql: str) -> dict[str, str]:
    """Class -> SQL of its events (``rank, pid, tid, device, stream, cat, name, ts`` (aligned ns), ``dur, external_id,
    correlation``), in the order classes take the event budget: annotations, kernels, top-level CPU ops."""
    return {
        "annotations": f"""
            SELECT f.rank, c.pid, c.tid, NULL::BIGINT AS device, NULL::BIGINT AS stream, c.cat, c.name,
                   c.ts_ns - o.off AS ts, c.dur_ns AS dur, c.external_id, c.correlation
            FROM cpu_ops c JOIN files f USING (file_id) JOIN {off_sql} o USING (rank)
            WHERE f.run_id = $1 AND c.cat = 'user_annotation'
            UNION ALL
            SELECT f.rank, NULL, NULL, k.device, k.stream, k.cat, k.name, k.ts_ns - o.off, k.dur_ns, k.external_id,
                   k.correlation
            FROM kernels k JOIN files f USING (file_id) JOIN {off_sql} o USING (rank)
            WHERE f.run_id = $1 AND k.cat = 'gpu_user_annotation'""",
        "kernels": f"""
            SELECT f.rank, NULL::BIGINT AS pid, NULL::BIGINT AS tid, k.device, k.stream, k.cat, k.name,
                   k.ts_ns - o.off AS ts, k.dur_ns AS dur, k.external_id, k.correlation
            FROM kernels k JOIN files f USING (file_id) JOIN {off_sql} o USING (rank)
            WHERE f.run_id = $1 AND k.cat <> 'gpu_user_annotation'""",
        "cpu_ops": f"""
            WITH ops AS (
                SELECT f.rank, c.pid, c.tid, c.cat, c.name, c.ts_ns, c.dur_ns, c.external_id, c.correlation, o.off,
                       max(c.ts_ns + c.dur_ns) OVER (
                           PARTITION BY c.file_id, c.pid, c.tid ORDER BY c.ts_ns, c.dur_ns DESC
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
                FROM cpu_ops c JOIN files f USING (file_id) JOIN {off_sql} o USING (rank)
                WHERE f.run_id = $1 AND c.cat = 'cpu_op')
            SELECT rank, pid, tid, NULL::BIGINT AS device, NULL::BIGINT AS stream, cat, name, ts_ns - off AS ts,
                   dur_ns AS dur, external_id, correlation
            FROM ops WHERE prev_end IS NULL OR ts_ns >= prev_end""",
    }


class _EventWriter:
    """Writes the ``traceEvents`` array to ``fh``, one event at a time; a thread's name goes out before its first
    event (GPU streams as ``GPU d stream s``, CPU threads as the trace names them)."""

    def __init__(self, fh, thread_names: dict[tuple[int, int], str]) -> None:
        self.fh = fh
        self.thread_names = thread_names
        self.seen_threads: set[tuple[int, int]] = set()
        self.first = True

    def emit(self, ev: dict) -> None:
        self.fh.write(("" if self.first else ",\n") + json.dumps(ev, ensure_ascii=False, allow_nan=False))
        self.first = False

    def process_names(self, ranks: list[int]) -> None:
        """One process per rank, sorted by rank, with the findings thread first."""
        emit = self.emit
        for r in ranks:
            emit({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
            emit({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
            emit({"ph": "M", "name": "thread_name", "pid": r, "tid": FINDINGS_TID, "args": {"name": FINDINGS_THREAD}})
            emit({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": FINDINGS_TID, "args": {"sort_index": -1}})

    def events(self, cur: duckdb.DuckDBPyConnection, origin: int) -> int:
        """Write the rows of an :func:`_event_queries` cursor as complete events; returns how many."""
        emit, seen_threads, thread_names = self.emit, self.seen_threads, self.thread_names
        n = 0
        while True:
            rows = cur.fetchmany(50_000)
            if not rows:
                return n
            for rank, _pid, tid, device, stream, cat, name, ts, dur, ext, corr in rows:
                if stream is not None:
                    dev = device if device is not None and device >= 0 else 0
                    t = GPU_TID_BASE + dev * 100_000 + (stream if stream >= 0 else 99_999)
                    label = f"GPU {dev} stream {stream}"
                else:
                    t = int(tid) if tid is not None else 0
                    label = thread_names.get((rank, t)) or f"thread {t}"
                if (rank, t) not in seen_threads:
                    seen_threads.add((rank, t))
                    emit({"ph": "M", "name": "thread_name", "pid": rank, "tid": t, "args": {"name": label}})
                args = {}
                if ext is not None:
                    args["External id"] = ext
                if corr is not None:
                    args["correlation"] = corr
                if stream is not None:
                    args["stream"] = stream
                emit({"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": t,
                      "ts": _fmt_us(ts - origin), "dur": _fmt_us(dur), "args": args})
                n += 1


def export_trace(con: duckdb.DuckDBPyConnection, out_path: str | Path, *, run: str | int | None = None,
                 max_events: int = DEFAULT_MAX_EVENTS) -> ExportResult:
    """Write one merged, clock-aligned Chrome/Perfetto trace of a run's ranks (module docstring).

    Args:
        con: a report database (after :func:`traceanalyze.pipeline.analyze`, or opened from a ``--db`` file).
        out_path: ``*.json`` or ``*.json.gz`` (gzip); parent folders are created.
        run: run name or id (default: the first subject run with traces).
        max_events: bound on the number of events written (metadata events not counted).

    Returns:
        :class:`ExportResult`.

    Raises:
        TraceanalyzeError: no run with traces in the database, an unknown ``run``, or ``max_events`` < 1.
        OSError: the file cannot be written.
    """
    if max_events < 1:
        raise TraceanalyzeError("--max-events must be at least 1")
    run_id, run_name, mode, world = _run_row(con, run)
    offsets = clock_offsets_ns(con, run_id, mode, world)
    files = con.execute("SELECT file_id, rank FROM files WHERE run_id = ? AND status <> 'error' ORDER BY rank",
                        [run_id]).fetchall()
    ranks = sorted({r for _, r in files})
    off_sql = _offsets_sql(offsets, ranks)
    origin = _aligned_origin(con, run_id, off_sql)
    budget = _Budget(max_events)
    findings = _finding_events(con, run_id, mode)
    findings.sort(key=lambda x: x[2] - x[1], reverse=True)
    lim = budget.fit("findings", len(findings))
    findings = findings[:lim] if lim is not None else findings
    out_path = Path(out_path)
    opener = gzip.open if out_path.name.endswith(".gz") else open
    n_written = 0
    thread_names = _thread_names(con, run_id)
    # written beside the target and renamed into place: an error or a full disk never leaves half a trace
    with atomic_path(out_path) as tmp_path, opener(tmp_path, "wt", encoding="utf-8") as fh:
        # the first key marks the file as ours, so discovery skips it if it is written beside the traces
        fh.write('{"traceanalyze_export": ' + json.dumps(__version__) + ', "displayTimeUnit": "ms", "traceEvents": [\n')
        w = _EventWriter(fh, thread_names)
        w.process_names(ranks)
        for r, s, e, name, args in findings:
            w.emit({"ph": "X", "cat": "traceanalyze", "name": name, "pid": r, "tid": FINDINGS_TID,
                    "ts": _fmt_us(s - offsets.get(r, 0) - origin), "dur": _fmt_us(e - s), "args": args})
            n_written += 1
        for cls, sql in _event_queries(off_sql).items():
            total = con.execute(f"SELECT count(*) FROM ({sql})", [run_id]).fetchone()[0]
            lim = budget.fit(cls, total)
            # one total order, so that two exports of one database are the same file (a parallel scan's order is
            # not); under the budget, the longest events are kept, ties broken the same way every time
            q = (f"SELECT * FROM ({sql}) ORDER BY {_EVENT_ORDER}" if lim is None else
                 f"SELECT * FROM (SELECT * FROM ({sql}) ORDER BY dur DESC, {_EVENT_ORDER} LIMIT {int(lim)}) "
                 f"ORDER BY {_EVENT_ORDER}")
            n_written += w.events(con.execute(q, [run_id]), origin)
        meta = {"tool": "traceanalyze", "run": run_name, "mode": mode, "ranks": ranks,
                "clock_offsets_us": {str(r): round(o / 1e3, 3) for r, o in offsets.items()},
                "origin_ns": int(origin), "kept": budget.kept, "dropped": budget.dropped}
        fh.write("\n], \"otherData\": " + json.dumps(meta) + "}\n")
    return ExportResult(path=out_path, run=run_name, ranks=ranks, n_events=n_written, kept=budget.kept,
                        dropped=budget.dropped, clock_offsets_us={r: round(o / 1e3, 3) for r, o in offsets.items()})


def _thread_names(con, run_id: int) -> dict[tuple[int, int], str]:
    rows = con.execute("""
        SELECT f.rank, t.tid, any_value(t.label) FROM threads t JOIN files f USING (file_id)
        WHERE f.run_id = ? AND t.kind = 'thread_name' AND t.label IS NOT NULL AND t.tid IS NOT NULL
        GROUP BY ALL""", [run_id]).fetchall()
    return {(int(r), int(t)): str(label).strip() for r, t, label in rows}


def export_target(report_path: str | Path, export_path: str | Path) -> Path:
    """Where :func:`export_beside` writes: ``export_path``, relative to the report's folder unless absolute."""
    target = Path(export_path)
    return target if target.is_absolute() else Path(report_path).resolve().parent / target


def export_beside(con: duckdb.DuckDBPyConnection, report_path: str | Path, export_path: str | Path, *,
                  run: str | int | None = None, max_events: int = DEFAULT_MAX_EVENTS) -> tuple[str, ExportResult]:
    """Write the merged trace for a report and return the link the report shows, with the result.

    A relative ``export_path`` is taken relative to the report's folder (``report --export merged.json.gz`` puts
    the file beside the HTML), an absolute one is kept. The link is the path relative to the report's folder
    when the file lies below it, else the absolute path. Raises as :func:`export_trace`.
    """
    report_dir = Path(report_path).resolve().parent
    target = export_target(report_path, export_path)
    res = export_trace(con, target, run=run, max_events=max_events)
    try:
        link = target.resolve().relative_to(report_dir).as_posix()
    except ValueError:
        link = target.resolve().as_posix()
    return link, res
