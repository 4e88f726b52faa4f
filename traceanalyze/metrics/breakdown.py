"""Metrics: per run, rank and profiler step, from the store. Definitions follow Holistic Trace Analysis
(HTA 0.5.0, ``hta/analyzers/breakdown_analysis.py``) so the figures can be checked against it.

GPU mode (the run has kernels). A kernel's class comes from its name and category (HTA
``get_kernel_type``, widened): *communication* when the name starts with ``nccl``/``rccl`` (``ncclKernel_*``,
``ncclDevKernel_*``) or is one of DeepEP's expert-parallel kernels (``deep_ep::intranode::dispatch<…>``,
``combine<…>``, ``notify_dispatch``, ``cached_notify``, the low-latency ``internode_ll`` ones), NVSHMEM's, or a
custom collective's (vLLM's ``cross_device_reduce_*``, symmetric memory's ``one_shot_all_reduce_kernel``,
``multimem_*``, ``allToAllV``, userbuffers); *memory* for ``gpu_memcpy``/``gpu_memset`` (names
``Memcpy*``/``Memset*``), else *compute* (the ``kernel_class`` macro, ``store.MACROS``; naming table in
``docs/kernel_names.md``). ``gpu_user_annotation`` rows are not kernels and are left out. A compute kernel of no
known family is flagged when such kernels weigh (:mod:`.kernels`).

Profiler-step filter: :mod:`.steps`, the one definition of a step used by every metric. The breakdown counts
the kernels launched (``cuda_runtime``/``cuda_driver`` row with the same ``correlation``) before the start of
the last step of their window, when the window holds two or more steps (as HTA ``Trace.load_traces`` does by
default): that step is partial and holds the profiler's own teardown. ``kernel_*_us`` and ``n_kernels`` count
the same kernels. Per rank and profiling window:

- trace window = last kernel end − first kernel start (µs);
- busy = length of the union of all kernel intervals; idle = window − busy;
- compute = length of the union of compute kernels; non-compute = busy − compute;
- idle %, compute %, non-compute % = each / window × 100 (the HTA temporal breakdown);
- comm/comp overlap % = |∪comm ∩ ∪compute| / |∪comm| × 100 (HTA ``get_comm_comp_overlap``);
- exposed communication = |∪comm| − |∪comm ∩ ∪compute| (µs): communication not hidden under compute.

CPU mode (gloo or CPU-only traces, no kernels): the *training thread* is the thread that holds the
``ProfilerStep#N`` annotations (else the one with the most ``aten::`` time). Its ``aten::*`` ops are compute;
``c10d::*`` ops and ``gloo:*`` ranges on any thread are communication. The window is the span of the counted
profiler steps (:mod:`.steps`: the partial last step of a window is left out, as in GPU mode; else of all ops).
The same formulas then apply to these intervals.

Several windows of one rank (two files) are computed separately and their times summed; each window's own
figures are kept in ``RankMetrics.windows``. Step times are medians over the counted steps of all windows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import duckdb
import numpy as np

from traceanalyze import store
from traceanalyze.metrics._sql import (  # training_thread_sql: export's too
    LAUNCH_CATS,
    counted_kernels_sql,
    kernel_names_class_sql,
    training_thread_sql,
)
from traceanalyze.metrics.steps import median, step_set

# Stored in the database (see store.MACROS) so users can classify rows the same way in their own queries.
MACROS = store.MACROS

# The tables save() fills are created by the store (traceanalyze.store.METRIC_TABLES), replaced per report.


# ---------------------------------------------------------------------------------------------------------
# Interval arithmetic on NumPy arrays (ns). Each function documents its input shapes.

def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals ``[starts[i], ends[i])`` (shape (n,), int64 ns, any order) into sorted disjoint ones."""
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    emax = np.maximum.accumulate(e)
    brk = np.flatnonzero(s[1:] > emax[:-1])  # a gap before interval i+1
    first = np.concatenate(([0], brk + 1))
    last = np.concatenate((brk, [s.size - 1]))
    return s[first], emax[last]


def length(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length (ns) of the union of the intervals."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def clip(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals cut to ``[lo, hi)``; empty ones dropped."""
    s = np.maximum(starts, lo)
    e = np.minimum(ends, hi)
    keep = e > s
    return s[keep], e[keep]


@dataclass
class Breakdown:
    """Times in µs over one window; percentages of ``window_us``."""

    window_us: float = 0.0
    busy_us: float = 0.0
    idle_us: float = 0.0
    compute_us: float = 0.0
    non_compute_us: float = 0.0
    comm_us: float = 0.0
    overlap_us: float = 0.0
    exposed_comm_us: float = 0.0

    def add(self, o: Breakdown) -> None:
        for k, v in asdict(o).items():
            setattr(self, k, getattr(self, k) + v)


def clipped_lengths(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window ``[lo[j], hi[j])`` (ns, shape (w,)), the length (int64 ns) of the union of the intervals within
    it: |∪ clip(intervals, lo, hi)|, the same as :func:`length` of :func:`clip` per window, from one
    :func:`union` and two binary searches per window instead of a sort per window."""
    keep = ends > starts  # what clip() would drop in every window
    s, e = union(starts[keep], ends[keep])
    cum = np.concatenate(([0], np.cumsum(e - s)))
    i = np.searchsorted(e, lo, side="right")  # the first merged interval ending after lo
    j = np.searchsorted(s, hi, side="left")  # those starting before hi: [0, j)
    some = i < j
    ii, jj = np.where(some, i, 0), np.where(some, j - 1, 0)
    out = cum[j] - cum[i]
    if s.size:  # less the first one's part before lo, the last one's after hi
        out = out - np.maximum(lo - s[ii], 0) - np.maximum(e[jj] - hi, 0)
    return np.where(some, np.maximum(out, 0), 0)


def breakdowns(lo: np.ndarray, hi: np.ndarray, all_iv, compute_iv, comm_iv) -> list[Breakdown]:
    """The temporal breakdown (HTA's: busy, compute, communication, their overlap, idle) of each window
    ``[lo[j], hi[j])`` (ns, int64 arrays of shape (w,)); each ``*_iv`` is (starts, ends) int64 arrays in ns, merged
    once for all windows. The overlap is |∪c ∩ ∪m| = |∪c| + |∪m| − |∪(c ∪ m)|."""
    busy = clipped_lengths(*all_iv, lo, hi)
    comp = clipped_lengths(*compute_iv, lo, hi)
    comm = clipped_lengths(*comm_iv, lo, hi)
    both = clipped_lengths(np.concatenate((compute_iv[0], comm_iv[0])), np.concatenate((compute_iv[1], comm_iv[1])),
                           lo, hi)
    out = []
    for w, busy_, comp_, comm_, both_ in zip((hi - lo).tolist(), busy.tolist(), comp.tolist(), comm.tolist(),
                                             both.tolist(), strict=True):
        ov = comp_ + comm_ - both_ if comm_ else 0  # |∪c ∩ ∪m| = |∪c| + |∪m| − |∪(c ∪ m)|
        out.append(Breakdown(window_us=w / 1e3, busy_us=busy_ / 1e3, idle_us=(w - busy_) / 1e3,
                             compute_us=comp_ / 1e3, non_compute_us=(busy_ - comp_) / 1e3, comm_us=comm_ / 1e3,
                             overlap_us=ov / 1e3, exposed_comm_us=(comm_ - ov) / 1e3))
    return out


def _pct(x: float, total: float) -> float:
    return 100.0 * x / total if total > 0 else 0.0


@dataclass
class RankMetrics:
    """One rank's figures: times in µs, shares in %. ``step_time_us`` is the median duration of the rank's counted
    profiler steps (:mod:`.steps`), all windows together. ``windows`` holds one dict per profiling window
    (``window, file, n_steps, steps`` (first–last counted step), ``step_time_us`` (median), ``window_us,
    idle_pct, compute_pct, non_compute_pct, exposed_comm_us``)."""

    run_id: int
    rank: int
    mode: str
    n_files: int
    window_us: float
    busy_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    comm_us: float
    comm_comp_overlap_pct: float
    exposed_comm_us: float
    kernel_compute_us: float
    kernel_comm_us: float
    kernel_memory_us: float
    n_kernels: int
    n_steps: int
    step_time_us: float | None
    files: list[str] = field(default_factory=list)
    windows: list[dict] = field(default_factory=list)


@dataclass
class StepMetrics:
    """One profiler step of one rank (µs)."""

    run_id: int
    rank: int
    step: int
    start_ns: int
    step_time_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    idle_us: float


def run_mode(con: duckdb.DuckDBPyConnection, run_id: int) -> str:
    """``"gpu"`` when the run has GPU kernels, else ``"cpu"``."""
    # EXISTS stops at the first kernel: a count read every kernel (~15 ms on 256 ranks, and it is asked thrice)
    any_kernel = con.execute("SELECT EXISTS (SELECT 1 FROM kernels JOIN files USING (file_id) WHERE run_id = ? "
                             "AND cat <> 'gpu_user_annotation')", [run_id]).fetchone()[0]
    return "gpu" if any_kernel else "cpu"


def kernel_classes(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[str, str]:
    """Name -> class (``compute``, ``communication``, ``memory``) of the run's ``kernel``-category kernels.

    The ``kernel_class`` macro runs once per distinct name: its regex on every kernel row costs more than the
    queries that then select kernels by name.
    """
    return dict(con.execute("""
        SELECT k.name, kernel_class('kernel', k.name) FROM kernels k JOIN files f USING (file_id)
        WHERE f.run_id = ? AND k.cat = 'kernel' AND k.name IS NOT NULL GROUP BY k.name""", [run_id]).fetchall())


_CLASSES = ("compute", "communication", "memory")


def _intervals(con, sql: str, params: list) -> dict[tuple[int, int], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Fetch (rank, window, klass, ts_ns, end_ns) rows and split them by (rank, window) and class.

    Returns (rank, window) -> {"all" | "compute" | "communication" | "memory": (starts, ends)}, int64 ns arrays
    in row order, keys sorted.
    """
    # the class as a small code: a column of Python strings costs ~10 MB and slow comparisons on 150k kernels
    codes = " ".join(f"WHEN '{c}' THEN {i}" for i, c in enumerate(_CLASSES, start=1))
    res = con.execute(f"SELECT rank, \"window\", CASE klass {codes} ELSE 0 END::TINYINT AS klass, ts_ns, end_ns "
                      f"FROM ({sql})", params).fetchnumpy()
    out: dict[tuple[int, int], dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    if not len(res["rank"]):
        return out
    rank = np.asarray(res["rank"], dtype=np.int64)
    win = np.asarray(res["window"], dtype=np.int64)
    klass = np.asarray(res["klass"], dtype=np.int8)
    ts = np.asarray(res["ts_ns"], dtype=np.int64)
    end = np.asarray(res["end_ns"], dtype=np.int64)
    keys = rank * 1_000_003 + win
    # one stable sort groups the rows of each (rank, window) and keeps their order inside it
    order = np.argsort(keys, kind="stable")
    for idx in np.split(order, np.flatnonzero(np.diff(keys[order])) + 1):
        d = {"all": (ts[idx], end[idx])}
        k = klass[idx]
        for code, cls in enumerate(_CLASSES, start=1):
            m = idx[k == code]
            d[cls] = (ts[m], end[m])
        out[(int(rank[idx[0]]), int(win[idx[0]]))] = d
    return out


# Kernels counted by the breakdown, with the profiler-step filter (see the module docstring and .steps); the
# class once per distinct name (._sql.kernel_names_class_sql).
_KLASS = "coalesce(n.klass, kernel_class(k.cat, k.name))"
_DEVICE_WORK = "k.cat <> 'gpu_user_annotation'"
_NAMES_JOIN = f"LEFT JOIN ({kernel_names_class_sql('$1', _DEVICE_WORK)}) n ON n.cat = k.cat AND n.name = k.name"
_GPU_INTERVALS_SQL = f"""
SELECT f.rank, f."window", {_KLASS} AS klass, k.ts_ns, k.ts_ns + k.dur_ns AS end_ns
FROM ({counted_kernels_sql("$1", _DEVICE_WORK, few=False)}) k JOIN files f USING (file_id)
{_NAMES_JOIN}
"""

# CPU mode: every op that is compute or communication (compute is then narrowed to the training thread).
_CPU_INTERVALS_SQL = """
SELECT f.rank, f."window", cpu_op_class(c.cat, c.name) AS klass, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns,
       c.pid, c.tid
FROM cpu_ops c JOIN files f USING (file_id)
WHERE f.run_id = ? AND cpu_op_class(c.cat, c.name) <> 'other'"""


def _steps(con, run_id: int) -> dict[int, list[tuple[int, int, int, int]]]:
    """rank -> [(step, window, start_ns, end_ns)] of the counted profiler steps (:func:`.steps.step_set`)."""
    out: dict[int, list[tuple[int, int, int, int]]] = {}
    for s in step_set(con, run_id):
        out.setdefault(s.rank, []).append((s.step, s.window, s.start_ns, s.end_ns))
    return out


def _training_threads(con, run_id: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, window) -> (pid, tid) of the training thread (:func:`._sql.training_thread_sql`)."""
    rows = con.execute(f"""
        SELECT f.rank, f."window", t.pid, t.tid FROM ({training_thread_sql("$1")}) t JOIN files f USING (file_id)
        """, [run_id]).fetchall()
    return {(r, w): (pid, tid) for r, w, pid, tid in rows}


def _window_intervals(con, run_id: int, mode: str) -> dict[tuple[int, int], dict[str, tuple[np.ndarray,
                                                                                             np.ndarray]]]:
    """The intervals each (rank, window) counts (:func:`_intervals`): GPU mode the counted kernels, CPU mode the
    ops, with compute narrowed to the training thread."""
    if mode == "gpu":
        return _intervals(con, _GPU_INTERVALS_SQL, [run_id])
    threads = _training_threads(con, run_id)
    return _restrict_cpu_compute(con, run_id, _intervals(con, _CPU_INTERVALS_SQL, [run_id]), threads)


def compute_run_metrics(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[list[RankMetrics],
                                                                                list[StepMetrics]]:
    """Per-rank and per-step metrics of one run (definitions in the module docstring).

    Returns ``(ranks, steps)`` sorted by rank (and step). Ranks whose files hold no usable events still get a
    row with zero times, so a missing activity is visible rather than silently dropped.
    """
    mode = run_mode(con, run_id)
    files = con.execute("SELECT rank, \"window\", path FROM files WHERE run_id = ? AND status <> 'error' "
                        "ORDER BY rank, \"window\"", [run_id]).fetchall()
    iv = _window_intervals(con, run_id, mode)
    steps = _steps(con, run_id)

    by_rank: dict[int, list[str]] = {}
    windows: dict[int, set[int]] = {}
    for r, w, path in files:
        by_rank.setdefault(r, []).append(path)
        windows.setdefault(r, set()).add(w)
    rank_rows: list[RankMetrics] = []
    step_rows: list[StepMetrics] = []
    paths = {(r, w): path for r, w, path in files}
    for r in sorted(by_rank):
        total = Breakdown()
        ks: dict[str, float] = {"n": 0}
        win_rows: list[dict] = []
        rsteps: list[StepMetrics] = []
        for w in sorted(windows[r]):
            d = iv.get((r, w))
            if not d:
                continue
            if mode == "gpu":
                _add_kernel_sums(ks, d)
            wb, wsteps = _window_breakdown(run_id, r, w, mode, d, steps.get(r, []))
            total.add(wb)
            rsteps.extend(wsteps)
            win_rows.append(_window_row(w, paths.get((r, w)), wb, wsteps))
        step_rows.extend(rsteps)
        rank_rows.append(_rank_row(run_id, r, mode, by_rank[r], total, ks, rsteps, win_rows))
    return rank_rows, step_rows


def _add_kernel_sums(ks: dict[str, float], d: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Add one window's summed (not merged) kernel time per class (µs) and kernel count (``n``) to ``ks``: the
    kernels the breakdown counts."""
    ks["n"] += int(d["all"][0].size)
    for cls in _CLASSES:
        ks[cls] = ks.get(cls, 0.0) + float((d[cls][1] - d[cls][0]).sum()) / 1e3


def _window_breakdown(run_id: int, rank: int, window: int, mode: str, d: dict[str, tuple[np.ndarray, np.ndarray]],
                      rank_steps: list[tuple[int, int, int, int]]) -> tuple[Breakdown, list[StepMetrics]]:
    """The breakdown of one profiling window of a rank, and of each of its counted steps.

    The window is the span of the kernels (GPU), else of the counted steps (CPU: no partial edge step), else of
    the ops; in CPU mode busy time is the union of compute and communication ops.
    """
    comm_iv = d["communication"]
    compute_iv = d["compute"]
    if mode == "gpu":
        win = (int(d["all"][0].min()), int(d["all"][1].max()))
        all_iv = d["all"]
    else:
        st = [s for s in rank_steps if s[1] == window]  # counted steps: no partial edge step
        if st:
            win = (min(s[2] for s in st), max(s[3] for s in st))
        else:
            win = (int(d["all"][0].min()), int(d["all"][1].max()))
        all_iv = (np.concatenate((compute_iv[0], comm_iv[0])), np.concatenate((compute_iv[1], comm_iv[1])))
    mine = [st for st in rank_steps if st[1] == window]
    lo = np.array([win[0]] + [st[2] for st in mine], np.int64)
    hi = np.array([win[1]] + [st[3] for st in mine], np.int64)
    wb, *bs = breakdowns(lo, hi, all_iv, compute_iv, comm_iv)  # the window's, then each step's
    wsteps = [StepMetrics(run_id, rank, step, s, (e - s) / 1e3, b.compute_us, b.comm_us, b.exposed_comm_us, b.idle_us)
              for (step, _w, s, e), b in zip(mine, bs, strict=True)]
    return wb, wsteps


def _window_row(window: int, path: str | None, wb: Breakdown, wsteps: list[StepMetrics]) -> dict:
    """One entry of ``RankMetrics.windows``."""
    return {
        "window": window, "file": path, "n_steps": len(wsteps),
        "steps": f"{wsteps[0].step}–{wsteps[-1].step}" if wsteps else None,
        "step_time_us": median(s.step_time_us for s in wsteps),
        "window_us": wb.window_us, "idle_pct": _pct(wb.idle_us, wb.window_us),
        "compute_pct": _pct(wb.compute_us, wb.window_us),
        "non_compute_pct": _pct(wb.non_compute_us, wb.window_us), "exposed_comm_us": wb.exposed_comm_us}


def _rank_row(run_id: int, rank: int, mode: str, files: list[str], total: Breakdown, ks: dict[str, float],
              rsteps: list[StepMetrics], win_rows: list[dict]) -> RankMetrics:
    """A rank's :class:`RankMetrics` from its windows' summed breakdown, kernel sums and counted steps."""
    return RankMetrics(
        run_id=run_id, rank=rank, mode=mode, n_files=len(files),
        window_us=total.window_us, busy_us=total.busy_us, idle_us=total.idle_us,
        compute_us=total.compute_us, non_compute_us=total.non_compute_us,
        idle_pct=_pct(total.idle_us, total.window_us), compute_pct=_pct(total.compute_us, total.window_us),
        non_compute_pct=_pct(total.non_compute_us, total.window_us),
        comm_us=total.comm_us, comm_comp_overlap_pct=_pct(total.overlap_us, total.comm_us),
        exposed_comm_us=total.exposed_comm_us,
        kernel_compute_us=ks.get("compute", 0.0), kernel_comm_us=ks.get("communication", 0.0),
        kernel_memory_us=ks.get("memory", 0.0), n_kernels=int(ks.get("n", 0)),
        n_steps=len(rsteps), step_time_us=median(s.step_time_us for s in rsteps),
        files=files, windows=win_rows)


def _restrict_cpu_compute(con, run_id, iv, threads):
    """In CPU mode only the training thread's aten ops are compute (worker threads would double count)."""
    res = con.execute("""
        SELECT f.rank, f."window", c.pid, c.tid, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns
        FROM cpu_ops c JOIN files f USING (file_id)
        WHERE f.run_id = ? AND cpu_op_class(c.cat, c.name) = 'compute'""", [run_id]).fetchnumpy()
    out = {}
    rank = np.asarray(res["rank"], dtype=np.int64)
    win = np.asarray(res["window"], dtype=np.int64)
    pid = np.asarray(res["pid"], dtype=np.float64)
    tid = np.asarray(res["tid"], dtype=np.float64)
    ts = np.asarray(res["ts_ns"], dtype=np.int64)
    end = np.asarray(res["end_ns"], dtype=np.int64)
    for key, d in iv.items():
        th = threads.get(key)
        sel = (rank == key[0]) & (win == key[1])
        if th is not None:
            sel &= (pid == th[0]) & (tid == th[1])
        d = dict(d)
        d["compute"] = (ts[sel], end[sel])
        out[key] = d
    return out


def top_kernels(con: duckdb.DuckDBPyConnection, run_id: int, limit: int = 15,
                skip_step: int | None = None) -> list[dict]:
    """The kernels (GPU mode) or ops (CPU mode) with the most total time across ranks.

    Returns dicts with ``name, klass, count, total_us, mean_us, pct`` (pct of all kernel/op time the table counts),
    and in GPU mode ``op`` (the CPU op that launched most of the kernel's time: the ``cpu_op`` with the kernel's
    External id, joined at ingest) and ``n_ops`` (how many distinct ops launched it). In CPU mode only leaf-level
    ``aten::`` ops and communication ops are listed (nested ops double count). ``skip_step``: the compile step
    (:func:`traceanalyze.diagnose.compile_step_of`), left out: its kernels (launched inside that profiler step of
    their file) or ops (starting inside it) are not counted (:func:`step_kernels` folds them apart).
    """
    gpu = run_mode(con, run_id) == "gpu"
    rows = _kernel_rows(con, run_id, gpu, "outside" if skip_step is not None else None, skip_step, limit)
    if gpu and rows:
        _add_launch_ops(con, run_id, rows)
    return rows


def step_kernels(con: duckdb.DuckDBPyConnection, run_id: int, step: int, limit: int = 5) -> dict:
    """The kernels (GPU mode; ops in CPU mode, as :func:`top_kernels` counts them) of one profiler step, for the
    compile step's folded row: ``{step, n_kernels, kernel_time_us, top}`` (``top``: its first ``limit`` rows, as
    :func:`top_kernels` gives them, ``pct`` of that step's time). Kernels count when launched inside the step of
    their file, ops when they start inside it."""
    gpu = run_mode(con, run_id) == "gpu"
    top = _kernel_rows(con, run_id, gpu, "inside", step, limit)
    n, us = con.execute(f"SELECT count(*), coalesce(sum(dur_ns), 0) / 1e3 FROM ({_kernel_base_sql(gpu, 'inside')})",
                        [run_id, step]).fetchone()
    if gpu and top:
        _add_launch_ops(con, run_id, top)
    return {"step": step, "n_kernels": int(n), "kernel_time_us": round(float(us), 3), "top": top}


def _kernel_base_sql(gpu: bool, where_step: str | None) -> str:
    """SQL of the rows :func:`top_kernels` counts, ``(cat, name, dur_ns)`` (GPU) or ``(name, klass, dur_ns)``
    (CPU); parameters ``$1`` the run and, with
    ``where_step`` (``inside`` / ``outside`` the profiler step ``$2``), that step."""
    if gpu:
        base = "SELECT k.cat, k.name, k.dur_ns FROM kernels k JOIN files f USING (file_id)"
        where = "f.run_id = $1 AND k.cat <> 'gpu_user_annotation'"
        if where_step is not None:  # the kernel's launch (runtime row of its correlation) inside the step
            base += f""" LEFT JOIN (
                SELECT DISTINCT r.file_id, r.correlation FROM cpu_ops r
                JOIN profiler_steps($1) ps ON ps.file_id = r.file_id AND ps.step = $2
                WHERE r.cat IN {LAUNCH_CATS} AND r.correlation IS NOT NULL
                  AND r.ts_ns >= ps.start_ns AND r.ts_ns < ps.end_ns) l
                ON l.file_id = k.file_id AND l.correlation = k.correlation"""
            where += f" AND l.file_id IS {'NOT ' if where_step == 'inside' else ''}NULL"
        return f"{base} WHERE {where}"
    base = ("SELECT c.name, cpu_op_class(c.cat, c.name) AS klass, c.dur_ns FROM cpu_ops c JOIN files f "
            "USING (file_id) WHERE f.run_id = $1 AND cpu_op_class(c.cat, c.name) <> 'other'")
    if where_step is not None:
        base += (f" AND {'' if where_step == 'inside' else 'NOT '}EXISTS (SELECT 1 FROM profiler_steps($1) ps "
                 "WHERE ps.file_id = c.file_id AND ps.step = $2 AND c.ts_ns >= ps.start_ns AND c.ts_ns < ps.end_ns)")
    return base


def _kernel_rows(con, run_id: int, gpu: bool, where_step: str | None, step: int | None, limit: int) -> list[dict]:
    """The first ``limit`` rows of :func:`_kernel_base_sql` grouped by name and class, by total time."""
    params = [run_id, step, limit] if where_step is not None else [run_id, limit]
    lim = "$3" if where_step is not None else "$2"
    # GPU: the kernels grouped by (cat, name) first and classed after, once a name: classing each kernel by a join
    # on its name was 12 of 21 ms on the 8-rank scale set. A name in two categories of one class (never seen) has
    # the mean of both, their sum over their count.
    base = _kernel_base_sql(gpu, where_step)
    if gpu:
        k = (f"SELECT name, kernel_class(cat, name) AS klass, n, ns, nd, mean FROM (SELECT cat, name, count(*) AS n, "
             f"sum(dur_ns) AS ns, count(dur_ns) AS nd, avg(dur_ns) AS mean FROM ({base}) GROUP BY cat, name)")
        count, mean = "sum(n)", "CASE WHEN count(*) = 1 THEN any_value(mean) ELSE sum(ns) / sum(nd) END"
    else:
        k, count, mean = f"SELECT name, klass, dur_ns AS ns, dur_ns AS mean FROM ({base})", "count(*)", "avg(mean)"
    sql = f"""
        WITH k AS ({k})
        SELECT name, klass, {count} AS count, sum(ns) / 1e3 AS total_us,
               {mean} / 1e3 AS mean_us, 100.0 * sum(ns) / (SELECT sum(ns) FROM k) AS pct
        FROM k GROUP BY ALL ORDER BY total_us DESC, name, klass LIMIT {lim}"""  # ties by name: one order every run
    cur = con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def _add_launch_ops(con, run_id: int, rows: list[dict]) -> None:
    """Set each kernel row's ``op`` (the launching CPU op with the most of its time, by name) and ``n_ops``."""
    found = con.execute("""
        SELECT k.name, o.name, sum(k.dur_ns) AS ns FROM kernels k JOIN files f USING (file_id)
        JOIN cpu_ops o ON o.file_id = k.file_id AND o.external_id = k.external_id AND o.cat = 'cpu_op'
        WHERE f.run_id = $1 AND k.external_id IS NOT NULL AND k.name IN (SELECT unnest($2))
        GROUP BY k.name, o.name""", [run_id, [r["name"] for r in rows]]).fetchall()
    ops: dict[str, list[tuple[float, str]]] = {}
    for kname, op, ns in found:
        ops.setdefault(kname, []).append((float(ns or 0), str(op)))
    for r in rows:
        mine = sorted(ops.get(r["name"], []), key=lambda x: (-x[0], x[1]))
        r["op"] = mine[0][1] if mine else None
        r["n_ops"] = len(mine)


def save(con: duckdb.DuckDBPyConnection, ranks: list[RankMetrics], steps: list[StepMetrics]) -> None:
    """Write the metric rows into ``rank_metrics`` / ``step_metrics`` (tables are replaced per report)."""
    cols = [f for f in RankMetrics.__dataclass_fields__ if f not in ("files", "windows")]
    store.insert_rows(con, "rank_metrics", cols, [[getattr(r, c) for c in cols] for r in ranks])
    cols = list(StepMetrics.__dataclass_fields__)
    store.insert_rows(con, "step_metrics", cols, [[getattr(s, c) for c in cols] for s in steps])

