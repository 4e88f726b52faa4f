"""Host-side costs: torch.compile overhead, data-loader waits, launch-bound GPU work.

- **compile**: per rank, the union of the dynamo/inductor timing ranges (``entire_frame_compile``,
  ``backend_compile``, ``inductor_compile``, ``* (dynamo_timed)``, ... ``shared/FORMATS.md`` §6) in µs; compiled
  frames and recompiles from ``Torch-Compiled Region: F/R`` and ``compile_id=F/R`` (R > 0 is a recompile);
  first profiler step vs the median of the later ones.
- **data loader**: time in ``enumerate(DataLoader)#...__next__`` (or ``enumerate(DataPipe)#...``) on the training
  thread, within the counted profiler steps (µs, % of the step): with ``num_workers=0`` the loader runs inline and
  the step waits for it.
- **launch-bound** (GPU): kernels launched per counted step and the median kernel duration against GPU idle %:
  many tiny kernels with an idle GPU mean the host cannot launch fast enough; over the steady steps only when a
  compile step is left out (:func:`steady_launch_stats`).
- **host view** (GPU, :func:`host_view`), per steady step (counted, the compile step left out) on the step thread:
  the blocking CUDA calls with the op around them and the GPU idle inside them (:func:`blocking_calls`), the
  optimizer's host time and kernels (:func:`optimizer_stats`), the top CPU ops (:func:`top_cpu_ops`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb
import numpy as np

from traceanalyze.metrics.breakdown import length

COMPILE_RANGE_NAMES = (
    "entire_frame_compile", "backend_compile", "inductor_compile", "entire_backward_compile", "dynamo",
    "_compile.compile_inner", "compile_fx_inner", "create_aot_dispatcher_function", "bytecode_tracing",
    "compile_attempt_0", "fx_codegen_and_compile", "async_compile.wait", "compile_file",
)
# the names as traced, and as torch._dynamo's dynamo_timed records them
COMPILE_RANGES = (*COMPILE_RANGE_NAMES, *(f"{n} (dynamo_timed)" for n in COMPILE_RANGE_NAMES))
_REGION = re.compile(r"Torch-Compiled Region: (\d+)/(\d+)")
_COMPILE_ID = re.compile(r"compile_id=(\d+)/(\d+)")


@dataclass
class CompileStats:
    """torch.compile cost on each rank (µs) and what was compiled."""

    compile_us: dict[int, float] = field(default_factory=dict)
    frames: int = 0
    recompiles: int = 0
    compiled_regions: int = 0  # calls of compiled regions seen (warm runs still show them)
    first_step_us: float | None = None
    steady_step_us: float | None = None
    window_us: dict[int, float] = field(default_factory=dict)  # profiled span per rank (steps, else trace)


@dataclass
class LoaderStats:
    """Per rank: data-loader time (µs) and its share of the profiled steps (%)."""

    loader_us: dict[int, float] = field(default_factory=dict)
    share_pct: dict[int, float] = field(default_factory=dict)
    n_steps: dict[int, int] = field(default_factory=dict)  # counted steps the rank's loader time is over (not in JSON)

    def wait_us_per_step(self) -> float | None:
        """Data-loader µs per rank and counted step: the mean over the counted (rank, step) pairs of the ranks with
        loader time; None without one."""
        n = sum(self.n_steps.get(r, 0) for r in self.loader_us)
        return sum(self.loader_us.values()) / n if n else None


@dataclass
class LaunchStats:
    """GPU launch pressure: kernels per step, median kernel duration (µs), runtime-call time per step (µs)."""

    kernels_per_step: float | None = None
    median_kernel_us: float | None = None
    launch_us_per_step: float | None = None


def compile_intervals(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Rank -> (starts, ends) in ns of its torch.compile ranges (:data:`COMPILE_RANGES` ``cpu_op`` rows, on the
    rank's clock, overlapping), ranks in the order the rows come."""
    rows = con.execute("""
        SELECT f.rank, c.ts_ns, c.ts_ns + c.dur_ns FROM cpu_ops c JOIN files f USING (file_id)
        WHERE f.run_id = ? AND c.cat = 'cpu_op' AND c.name IN (SELECT unnest(?))""",
                       [run_id, list(COMPILE_RANGES)]).fetchall()
    per: dict[int, list[tuple[int, int]]] = {}
    for r, s, e in rows:
        per.setdefault(r, []).append((s, e))
    out = {}
    for r, iv in per.items():
        a = np.array(iv, dtype=np.int64)
        out[r] = (a[:, 0], a[:, 1])
    return out


def compile_stats(con: duckdb.DuckDBPyConnection, run_id: int) -> CompileStats:
    """Compile time per rank, frames/recompiles, and first vs steady step time (module docstring)."""
    res = CompileStats()
    for r, (s, e) in compile_intervals(con, run_id).items():
        res.compile_us[r] = length(s, e) / 1e3
    ids = set()
    regions = 0
    for (name,) in con.execute("""
            SELECT c.name FROM cpu_ops c JOIN files f USING (file_id)
            WHERE f.run_id = ? AND (c.name LIKE 'Torch-Compiled Region:%' OR c.name LIKE '%compile_id=%')""",
                               [run_id]).fetchall():
        m = _REGION.search(name) or _COMPILE_ID.search(name)
        if m:
            ids.add((int(m.group(1)), int(m.group(2))))
        if name.startswith("Torch-Compiled Region"):
            regions += 1
    res.frames = len({f for f, _ in ids})
    res.recompiles = len({(f, r) for f, r in ids if r > 0})
    res.compiled_regions = regions
    steps = con.execute("""
        SELECT step, median(step_time_us) FROM step_metrics WHERE run_id = ? GROUP BY step ORDER BY step""",
                        [run_id]).fetchall()
    if len(steps) >= 2:
        res.first_step_us = float(steps[0][1])
        res.steady_step_us = float(np.median([s[1] for s in steps[1:]]))
    for r, w in con.execute("""
            SELECT rank, sum(step_time_us) FROM step_metrics WHERE run_id = ? GROUP BY rank""", [run_id]).fetchall():
        res.window_us[r] = float(w)
    for r, w in con.execute("SELECT rank, window_us FROM rank_metrics WHERE run_id = ?", [run_id]).fetchall():
        res.window_us.setdefault(r, float(w))
    return res


def loader_stats(con: duckdb.DuckDBPyConnection, run_id: int) -> LoaderStats:
    """Data-loader time inside the counted profiler steps (:mod:`.steps`) on the training thread, per rank: the
    ``enumerate(DataLoader)#...`` / ``enumerate(DataPipe)#...`` ops (category ``DataLoader`` in the 2021 schema,
    ``cpu_op`` since), over the summed duration of those steps."""
    res = LoaderStats()
    rows = con.execute("""
        WITH st AS (SELECT file_id, tid, start_ns AS s, end_ns AS e FROM profiler_steps(?) WHERE counted)
        SELECT f.rank, sum(c.dur_ns) / 1e3, (SELECT sum(e - s) FROM st WHERE st.file_id = c.file_id) / 1e3,
               (SELECT count(*) FROM st WHERE st.file_id = c.file_id)
        FROM cpu_ops c JOIN files f USING (file_id)
        JOIN st ON st.file_id = c.file_id AND st.tid = c.tid AND c.ts_ns >= st.s AND c.ts_ns < st.e
        WHERE f.run_id = ? AND is_dataloader_op(c.name)
        GROUP BY f.rank, c.file_id""", [run_id, run_id]).fetchall()
    step_us: dict[int, float] = {}
    for r, us, file_step_us, n in rows:  # one row per window: a rank's windows add up
        res.loader_us[r] = res.loader_us.get(r, 0.0) + float(us)
        res.n_steps[r] = res.n_steps.get(r, 0) + int(n or 0)
        step_us[r] = step_us.get(r, 0.0) + float(file_step_us or 0.0)
        if step_us[r]:
            res.share_pct[r] = round(100.0 * res.loader_us[r] / step_us[r], 2)
    return res


def launch_stats(con: duckdb.DuckDBPyConnection, run_id: int) -> LaunchStats:
    """Kernels per profiler step, median kernel duration, launch-call time per step (GPU runs)."""
    res = LaunchStats()
    row = con.execute("""
        SELECT count(*), median(k.dur_ns) / 1e3 FROM kernels k JOIN files f USING (file_id)
        WHERE f.run_id = ? AND k.cat = 'kernel'""", [run_id]).fetchone()
    if not row or not row[0]:
        return res
    res.median_kernel_us = float(row[1])
    # per step: the kernels launched, and the launch calls made, inside the counted steps (.steps)
    n_steps, n_kernels, launch = con.execute("""
        WITH st AS MATERIALIZED (SELECT file_id, start_ns AS s, end_ns AS e FROM profiler_steps($1) WHERE counted),
        rt AS MATERIALIZED (
               SELECT c.file_id, c.correlation, c.dur_ns, c.name FROM cpu_ops c JOIN files f USING (file_id)
               JOIN st ON st.file_id = c.file_id AND c.ts_ns >= st.s AND c.ts_ns < st.e
               WHERE f.run_id = $1 AND c.cat IN ('cuda_runtime', 'cuda_driver'))
        SELECT (SELECT count(*) FROM st),
               (SELECT count(*) FROM kernels k JOIN rt ON rt.file_id = k.file_id AND rt.correlation = k.correlation
                WHERE k.cat = 'kernel'),
               (SELECT sum(dur_ns) / 1e3 FROM rt WHERE name LIKE '%LaunchKernel%' OR name = 'cuLaunchKernel')""",
                                          [run_id]).fetchone()
    if n_steps:
        res.kernels_per_step = n_kernels / n_steps
        res.launch_us_per_step = float(launch) / n_steps if launch else None
    return res


# ---------------------------------------------------------------------------------------------------------
# The host view of a GPU run's steady steps: blocking calls, the optimizer, the top CPU ops

BLOCKING_COPY_US = 50.0  # a copy call this long blocked the host (a device-to-host or pageable copy)
MULTI_TENSOR_KERNELS = ("multi_tensor_apply", "_fused_", "fused_adam", "fused_sgd")  # foreach / fused optimizers
MULTI_TENSOR_OPS = ("aten::_foreach_", "aten::_fused_")
OPTIMIZER_MIN_KERNELS = 50  # kernels per optimizer step from which a loop over parameters shows
TOP_OPS = 10  # CPU ops listed per run in the host view

# the profiler steps the host view reads: counted and not the compile step ($2), on the step thread; a run
# without profiler steps counts each file's whole window as one step. The two are separate SQL, chosen in Python
# (:func:`steady_steps_sql`): a fallback branch in the same query scans and joins every CPU op even when the run
# has steps (~6 ms a query on 256 ranks). Shared with traceanalyze.metrics.allocator.
_N_ST_SQL = "n_st AS (SELECT rank, count(*) AS n FROM st GROUP BY rank)"
_STEPS_ST_SQL = f"""st AS MATERIALIZED (
    SELECT file_id, rank, pid, tid, step, start_ns AS s, end_ns AS e FROM profiler_steps($1)
    WHERE counted AND ($2 IS NULL OR step <> $2)),
{_N_ST_SQL}"""
_WINDOWS_ST_SQL = f"""st AS MATERIALIZED (
    SELECT f.file_id, f.rank, NULL::BIGINT AS pid, NULL::BIGINT AS tid, NULL::INTEGER AS step,
           min(c.ts_ns) AS s, max(c.ts_ns + c.dur_ns) AS e
    FROM files f JOIN cpu_ops c USING (file_id)
    -- no step to leave out: $2 (the compile step) is named only so that both forms take the same parameters
    WHERE f.run_id = $1 AND f.rank IS NOT NULL AND ($2::INTEGER IS NULL OR TRUE)
    GROUP BY f.file_id, f.rank),
{_N_ST_SQL}"""


def has_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether the run has any profiler step (counted or not): which of the two step CTEs the host queries use."""
    return con.execute("SELECT EXISTS (SELECT 1 FROM profiler_steps(?))", [run_id]).fetchone()[0]


def steady_steps_sql(con: duckdb.DuckDBPyConnection, run_id: int, sql: str) -> str:
    """``sql`` (a query that starts ``WITH {st},``) with the CTEs ``st(file_id, rank, pid, tid, step, s, e)``, the
    counted steps per rank (the compile step ``$2`` left out; each file's window as one step in a run without
    profiler steps), and ``n_st(rank, n)``."""
    return sql.replace("{st}", _STEPS_ST_SQL if has_steps(con, run_id) else _WINDOWS_ST_SQL, 1)


ON_STEP_SQL = ("c.file_id = st.file_id AND (st.tid IS NULL OR (c.pid = st.pid AND c.tid = st.tid)) "
               "AND c.ts_ns >= st.s AND c.ts_ns < st.e")

def last_device_end_sql(kernel_where: str) -> str:
    """The CTE ``last(call_id, last_end)``: per host call of ``b`` (``call_id``, ``file_id``, ``ts_ns``,
    ``dur_ns``), where the last device task of ``kernels k`` that ``kernel_where`` keeps and that runs during the call
    ends (ns, at most the call's end); a call with none running has no row. The call's GPU idle is its tail after
    ``last_end`` (the whole call without a row)."""
    return f"""last AS (
    SELECT b.call_id, max(least(k.ts_ns + k.dur_ns, b.ts_ns + b.dur_ns)) AS last_end
    FROM b JOIN kernels k ON k.file_id = b.file_id AND k.ts_ns < b.ts_ns + b.dur_ns
         AND k.ts_ns + k.dur_ns > b.ts_ns
    WHERE {kernel_where} GROUP BY b.call_id)"""


_BLOCKING_SQL = f"""
WITH {{st}},
b AS MATERIALIZED (
    SELECT row_number() OVER () AS call_id, c.file_id, c.pid, c.tid, st.rank, c.name, c.ts_ns, c.dur_ns
    FROM cpu_ops c JOIN st ON {ON_STEP_SQL}
    WHERE c.cat IN ('cuda_runtime', 'cuda_driver')
      AND (c.name LIKE '%Synchronize'
           OR ((c.name LIKE 'cudaMemcpy%' OR c.name LIKE 'cuMemcpy%') AND c.dur_ns > $3))),
enc AS (
    SELECT b.call_id, arg_min(o.name, o.ts_ns) FILTER (WHERE o.name LIKE 'aten::%') AS outer_op,
           arg_max(o.name, o.ts_ns) AS inner_op
    FROM b JOIN cpu_ops o ON o.file_id = b.file_id AND o.pid = b.pid AND o.tid = b.tid
         AND o.ts_ns <= b.ts_ns AND o.ts_ns + o.dur_ns >= b.ts_ns + b.dur_ns
    WHERE o.cat = 'cpu_op' AND o.file_id IN (SELECT file_id FROM b) GROUP BY b.call_id),
{last_device_end_sql("k.cat = 'kernel' AND k.file_id IN (SELECT file_id FROM b)")}
SELECT b.rank, b.name, enc.outer_op, enc.inner_op, any_value(n_st.n), count(*), sum(b.dur_ns),
       sum(b.ts_ns + b.dur_ns - greatest(b.ts_ns, coalesce(last.last_end, b.ts_ns))) AS idle, max(b.dur_ns)
FROM b LEFT JOIN enc USING (call_id) LEFT JOIN last USING (call_id) JOIN n_st USING (rank)
GROUP BY ALL ORDER BY b.rank, idle DESC, b.name, enc.outer_op NULLS LAST
"""


@dataclass
class BlockingCall:
    """One rank's blocking CUDA call under one op, per steady step (µs): the time the host waits in it, and the
    part of it during which no kernel runs on the GPU."""

    rank: int
    call: str  # cudaStreamSynchronize, cudaMemcpyAsync, ...
    op: str | None  # the outermost aten op around the call (aten::item, aten::to, ...), None outside any
    inner_op: str | None  # the innermost CPU op around it (aten::_local_scalar_dense, aten::copy_, ...)
    calls_per_step: float
    us_per_step: float
    gpu_idle_us_per_step: float
    max_us: float  # the longest single call

    def model(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(self).items()}


def blocking_calls(con: duckdb.DuckDBPyConnection, run_id: int, skip_step: int | None = None) -> list[BlockingCall]:
    """The host's blocking CUDA calls in the steady steps, per rank, call and enclosing op.

    A call blocks when it is a ``*Synchronize`` (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
    ``cudaEventSynchronize``, their driver forms) or a copy (``cudaMemcpy*``, ``cuMemcpy*``) longer than
    :data:`BLOCKING_COPY_US` (a device-to-host or pageable copy waits for the GPU). Only the calls on the step
    thread inside the counted profiler steps count, the compile step ``skip_step`` left out; the op is found by
    time containment on the same thread. GPU idle = the call's tail after the last kernel of that rank that runs
    during it ended (the whole call when none runs): the GPU has drained and waits for the host. A sync that waits
    for queued work has next to none; a copy stuck on the host, or a sync on an idle GPU, has all of it. Rows
    sorted by rank, then GPU-idle time (most first)."""
    rows = con.execute(steady_steps_sql(con, run_id, _BLOCKING_SQL),
                       [run_id, skip_step, int(BLOCKING_COPY_US * 1e3)]).fetchall()
    return [BlockingCall(int(rank), name, outer, inner, n / n_steps, total / 1e3 / n_steps,
                         max(0.0, float(idle)) / 1e3 / n_steps, mx / 1e3)
            for rank, name, outer, inner, n_steps, n, total, idle, mx in rows]


_OPTIMIZER_SQL = f"""
WITH {{st}},
o AS MATERIALIZED (
    SELECT DISTINCT c.file_id, c.pid, c.tid, st.rank, c.name, c.ts_ns AS s, c.ts_ns + c.dur_ns AS e
    FROM cpu_ops c JOIN st ON {ON_STEP_SQL}
    WHERE c.cat IN ('cpu_op', 'user_annotation') AND c.name LIKE 'Optimizer.step#%'),
top AS (SELECT * FROM o WHERE NOT EXISTS (
    SELECT 1 FROM o p WHERE p.file_id = o.file_id AND p.tid = o.tid AND p.s <= o.s AND p.e >= o.e
                        AND (p.s < o.s OR p.e > o.e))),
inside AS (
    SELECT top.rank, c.cat, c.name, c.file_id, c.correlation
    FROM top JOIN cpu_ops c ON c.file_id = top.file_id AND c.pid = top.pid AND c.tid = top.tid
         AND c.ts_ns >= top.s AND c.ts_ns < top.e),
k AS (
    SELECT i.rank, count(k.correlation) AS n,
           count(*) FILTER (WHERE k.multi) + count(*) FILTER (
               WHERE i.cat = 'cpu_op' AND ({" OR ".join(f"i.name LIKE '{p}%'" for p in MULTI_TENSOR_OPS)})) AS multi
    FROM inside i LEFT JOIN (
        SELECT file_id, correlation, {" OR ".join(f"name LIKE '%{p}%'" for p in MULTI_TENSOR_KERNELS)} AS multi
        FROM kernels WHERE cat = 'kernel') k
      ON i.cat IN ('cuda_runtime', 'cuda_driver') AND k.file_id = i.file_id AND k.correlation = i.correlation
    GROUP BY i.rank)
SELECT top.rank, min(top.name), sum(top.e - top.s), any_value(n_st.n), any_value(coalesce(k.n, 0)),
       any_value(coalesce(k.multi, 0))
FROM top JOIN n_st USING (rank) LEFT JOIN k USING (rank)
GROUP BY top.rank ORDER BY top.rank
"""


@dataclass
class OptimizerStats:
    """The optimizer's step on the host, per steady step: ``Optimizer.step#...`` ranges (µs), the kernels they
    launch, and whether any is a multi-tensor (``foreach``) or fused kernel."""

    name: str  # Optimizer.step#Adam.step
    us_per_step: dict[int, float] = field(default_factory=dict)  # rank -> host µs per steady step
    kernels_per_step: float = 0.0  # median over ranks
    multi_tensor: bool = False  # a multi_tensor_apply / _fused_ kernel or an aten::_foreach_ / _fused_ op in it

    def model(self) -> dict:
        return {"name": self.name, "us_per_step": {r: round(v, 3) for r, v in self.us_per_step.items()},
                "kernels_per_step": round(self.kernels_per_step, 1), "multi_tensor": self.multi_tensor}


def optimizer_stats(con: duckdb.DuckDBPyConnection, run_id: int, skip_step: int | None = None) -> OptimizerStats | None:
    """The optimizer's host time and kernels per steady step (the compile step ``skip_step`` left out); None when
    the steady steps hold no ``Optimizer.step#...`` range. Nested ranges count once (the outermost)."""
    rows = con.execute(steady_steps_sql(con, run_id, _OPTIMIZER_SQL), [run_id, skip_step]).fetchall()
    if not rows:
        return None
    res = OptimizerStats(name=rows[0][1])
    for rank, _name, ns, n_steps, _kernels, _multi in rows:
        res.us_per_step[int(rank)] = ns / 1e3 / n_steps
    res.kernels_per_step = float(np.median([k / n for _, _, _, n, k, _ in rows]))
    res.multi_tensor = any(m for *_, m in rows)
    return res


_TOP_OPS_SQL = f"""
WITH {{st}}
SELECT c.name, c.cat, count(*), sum(c.dur_ns), (SELECT sum(n) FROM n_st)
FROM cpu_ops c JOIN st ON {ON_STEP_SQL}
WHERE c.cat IN ('cpu_op', 'user_annotation') AND profiler_step(c.cat, c.name) IS NULL
GROUP BY c.name, c.cat ORDER BY sum(c.dur_ns) DESC, c.name LIMIT $3
"""


def top_cpu_ops(con: duckdb.DuckDBPyConnection, run_id: int, skip_step: int | None = None,
                limit: int = TOP_OPS) -> list[dict]:
    """The CPU ops and annotations that take the most host time per steady step on the step thread: ``{name, cat,
    calls_per_step, us_per_step}``, inclusive time (an op's children are in it), per rank-step (the sum over
    ranks and steady steps over their number)."""
    rows = con.execute(steady_steps_sql(con, run_id, _TOP_OPS_SQL), [run_id, skip_step, limit]).fetchall()
    return [{"name": name, "cat": cat, "calls_per_step": round(n / steps, 2),
             "us_per_step": round(ns / 1e3 / steps, 3)} for name, cat, n, ns, steps in rows if steps]


_STEADY_LAUNCH_SQL = f"""
WITH {{st}},
rt AS MATERIALIZED (
    SELECT c.file_id, st.rank, c.correlation, c.ts_ns AS launch_ns, c.dur_ns, c.name
    FROM cpu_ops c JOIN st ON {ON_STEP_SQL}
    WHERE c.cat IN ('cuda_runtime', 'cuda_driver') AND c.correlation IS NOT NULL),
k AS (
    SELECT rt.rank, k.file_id, k.cat, k.stream, k.ts_ns, k.dur_ns, rt.launch_ns,
           lag(k.ts_ns + k.dur_ns) OVER (PARTITION BY k.file_id, k.stream ORDER BY k.ts_ns, k.dur_ns) AS prev_end
    FROM kernels k JOIN rt ON rt.file_id = k.file_id AND rt.correlation = k.correlation
    WHERE k.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND k.stream IS NOT NULL AND k.stream <> -1),
per AS (
    SELECT rank, stream, count(*) AS n, sum(greatest(ts_ns - prev_end, 0)) AS idle,
           sum(ts_ns - prev_end) FILTER (WHERE launch_ns > prev_end) AS host_wait
    FROM k GROUP BY rank, stream),
busiest AS (SELECT * FROM per QUALIFY row_number() OVER (PARTITION BY rank ORDER BY n DESC, stream) = 1)
SELECT (SELECT sum(n) FROM n_st),
       (SELECT count(*) FROM k WHERE cat = 'kernel'),
       (SELECT median(dur_ns) / 1e3 FROM k WHERE cat = 'kernel'),
       (SELECT sum(dur_ns) / 1e3 FROM rt WHERE name LIKE '%LaunchKernel%' OR name = 'cuLaunchKernel'),
       (SELECT median(100.0 * coalesce(host_wait, 0) / idle) FROM busiest WHERE idle > 0)
"""


def steady_launch_stats(con: duckdb.DuckDBPyConnection, run_id: int,
                        skip_step: int) -> tuple[LaunchStats, float | None]:
    """:func:`launch_stats` over the steady steps only (the compile step ``skip_step`` left out), and the host-wait
    share (%) of the GPU idle on each rank's busiest stream in those steps (median over ranks; the idle breakdown's
    host wait, :mod:`.idle`, read over the same steps); None without a gap."""
    n_steps, n_kernels, med, launch, host_wait = con.execute(steady_steps_sql(con, run_id, _STEADY_LAUNCH_SQL),
                                                             [run_id, skip_step]).fetchone()
    res = LaunchStats()
    if not n_steps:
        return res, None
    res.median_kernel_us = float(med) if med is not None else None
    res.kernels_per_step = n_kernels / n_steps
    res.launch_us_per_step = float(launch) / n_steps if launch else None
    return res, (float(host_wait) if host_wait is not None else None)


@dataclass
class HostView:
    """The host side of a GPU run's steady steps (:func:`host_view`)."""

    top_ops: list[dict] = field(default_factory=list)  # top_cpu_ops
    blocking: list[BlockingCall] = field(default_factory=list)  # blocking_calls
    optimizer: OptimizerStats | None = None  # optimizer_stats
    steady_launch: LaunchStats | None = None  # steady_launch_stats, only when a compile step is left out
    steady_host_wait_pct: float | None = None

    def model(self) -> dict:
        """The report model's ``runs[i].host``: ``{top_ops, blocking_calls, optimizer}``."""
        return {"top_ops": self.top_ops, "blocking_calls": [b.model() for b in self.blocking],
                "optimizer": self.optimizer.model() if self.optimizer else None}


def host_view(con: duckdb.DuckDBPyConnection, run_id: int, skip_step: int | None = None) -> HostView:
    """Every host figure of a GPU run's steady steps, the compile step ``skip_step`` left out."""
    v = HostView(top_cpu_ops(con, run_id, skip_step), blocking_calls(con, run_id, skip_step),
                 optimizer_stats(con, run_id, skip_step))
    if skip_step is not None:
        v.steady_launch, v.steady_host_wait_pct = steady_launch_stats(con, run_id, skip_step)
    return v
