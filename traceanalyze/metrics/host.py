"""Host-side costs: torch.compile overhead, data-loader waits, launch-bound GPU work.

- **compile**: per rank, the union of the dynamo/inductor timing ranges (``entire_frame_compile``,
  ``backend_compile``, ``inductor_compile``, ``* (dynamo_timed)``, ... ``shared/FORMATS.md`` §6) in µs; compiled
  frames and recompiles from ``Torch-Compiled Region: F/R`` and ``compile_id=F/R`` (R > 0 is a recompile);
  first profiler step vs the median of the later ones.
- **data loader**: time in ``enumerate(DataLoader)#...__next__`` (or ``enumerate(DataPipe)#...``) on the training
  thread, within the counted profiler steps (µs, % of the step): with ``num_workers=0`` the loader runs inline and
  the step waits for it.
- **launch-bound** (GPU): kernels launched per counted step and the median kernel duration against GPU idle %:
  many tiny kernels with an idle GPU mean the host cannot launch fast enough.
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
        SELECT f.rank, sum(c.dur_ns) / 1e3, (SELECT sum(e - s) FROM st WHERE st.file_id = c.file_id) / 1e3
        FROM cpu_ops c JOIN files f USING (file_id)
        JOIN st ON st.file_id = c.file_id AND st.tid = c.tid AND c.ts_ns >= st.s AND c.ts_ns < st.e
        WHERE f.run_id = ? AND is_dataloader_op(c.name)
        GROUP BY f.rank, c.file_id""", [run_id, run_id]).fetchall()
    step_us: dict[int, float] = {}
    for r, us, file_step_us in rows:  # one row per window: a rank's windows add up
        res.loader_us[r] = res.loader_us.get(r, 0.0) + float(us)
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
