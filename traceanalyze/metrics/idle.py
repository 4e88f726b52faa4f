"""GPU idle time per rank and stream, split into host wait, kernel wait and other (HTA's definition).

Holistic Trace Analysis 0.5.0 ``BreakdownAnalysis.get_idle_time_breakdown`` (``docs/hta_reference.md`` A.8),
computed in SQL on the store, per rank, profiling window and stream:

- events: ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` rows with a stream (``gpu_user_annotation`` is not
  GPU work), after the profiler-step filter of :mod:`.steps` (in a window with two or more ``ProfilerStep#N``,
  only kernels whose launch, the ``cuda_runtime``/``cuda_driver`` row with the same ``correlation``, starts
  before the window's last step are counted, as HTA does; the same filter as :mod:`.breakdown`);
- per stream, events sorted by start; ``prev_end`` = end of the *previous event in that order* (not the
  running maximum); ``gap = start - prev_end`` (may be negative when events overlap on a stream);
- **host wait**: the launching runtime call started after ``prev_end``: the GPU had finished and waited for
  the CPU to launch more work;
- else **kernel wait**: ``gap`` < 30 µs (HTA ``consecutive_kernel_delay``; negative gaps land here): the
  normal delay between back-to-back kernels;
- else **other**: the kernel was launched in time but started late (waiting on another stream's event,
  a synchronization, a memcpy from the host, ...).

The first event of each stream has no gap. Times are summed per category (µs); ``*_pct`` are shares of the
stream's summed gaps (HTA ``idle_time_ratio`` × 100; None when the stream has no gap at all). Sums are per
stream, so they are not comparable with the rank-level idle time of the temporal breakdown (streams run in
parallel). Several profiling windows of one rank are computed separately and their sums added.

Differences from HTA: traceanalyze keeps ns precision, while HTA rounds fractional ``ts`` up and ends down to
whole µs (``docs/hta_reference.md`` A.2). On traces with fractional timestamps each gap can differ by up to
2 µs, which moves a gap near the 30 µs threshold between kernel wait and other and shifts ratios by a few
tenths of a percentage point at most on the real traces.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from traceanalyze.metrics._sql import counted_kernels_with_launch_sql
from traceanalyze.store import insert_rows

CONSECUTIVE_KERNEL_DELAY_US = 30.0  # HTA default: a gap below this is "kernel wait"

# GPU work on a stream: the events whose gaps are classified
_EVENTS = "k.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND k.stream IS NOT NULL AND k.stream <> -1"

_SQL = f"""
WITH f AS (SELECT file_id, rank FROM files WHERE run_id = $run_id AND status <> 'error'),
ev AS (
    SELECT f.rank, k.file_id, k.stream, k.ts_ns, k.ts_ns + k.dur_ns AS end_ns, k.launch_ns,
           lag(k.ts_ns + k.dur_ns) OVER w AS prev_end
    FROM ({counted_kernels_with_launch_sql("$run_id", _EVENTS)}) k JOIN f USING (file_id)
    WINDOW w AS (PARTITION BY k.file_id, k.stream ORDER BY k.ts_ns, k.dur_ns)),
cls AS (
    SELECT rank, stream, ts_ns - prev_end AS gap,
           CASE WHEN prev_end IS NULL THEN 'none'
                WHEN launch_ns > prev_end THEN 'host_wait'
                WHEN ts_ns - prev_end < $delay_ns THEN 'kernel_wait'
                ELSE 'other' END AS category
    FROM ev)
SELECT rank, stream, count(*) AS n,
       coalesce(sum(gap) FILTER (WHERE category = 'host_wait'), 0) AS host_wait,
       coalesce(sum(gap) FILTER (WHERE category = 'kernel_wait'), 0) AS kernel_wait,
       coalesce(sum(gap) FILTER (WHERE category = 'other'), 0) AS other
FROM cls GROUP BY rank, stream ORDER BY rank, stream
"""


@dataclass
class IdleRow:
    """One rank's stream: GPU idle gaps by category (µs) and their shares of ``idle_us`` (%)."""

    run_id: int
    rank: int
    stream: int
    n_kernels: int
    idle_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_us: float
    host_wait_pct: float | None
    kernel_wait_pct: float | None
    other_pct: float | None

    def model(self) -> dict:
        """The report-model row: ``{rank, stream, host_wait_us, kernel_wait_us, other_us, ...}`` (no run_id)."""
        # the fields are plain numbers: vars() is the copy asdict() makes, without its deep copy of each value
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(self).items() if k != "run_id"}


def idle_breakdown(con: duckdb.DuckDBPyConnection, run_id: int,
                   consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US) -> list[IdleRow]:
    """GPU idle time of each rank and stream of a run, split into host wait, kernel wait and other.

    Args:
        con: the store (the ``profiler_step`` macro must exist: :data:`traceanalyze.metrics.MACROS`).
        run_id: the run (its files must have ``run_id`` and ``rank`` set).
        consecutive_kernel_delay_us: gaps shorter than this (µs) that are not host waits are kernel waits.

    Returns:
        :class:`IdleRow` per (rank, stream) with at least one kernel, memcpy or memset, sorted by rank and
        stream; empty for a run without GPU activity (CPU mode). Definitions in the module docstring.
    """
    rows = con.execute(_SQL, {"run_id": run_id, "delay_ns": int(round(consecutive_kernel_delay_us * 1e3))}).fetchall()
    out = []
    for rank, stream, n, host, kern, other in rows:
        host, kern, other = float(host) / 1e3, float(kern) / 1e3, float(other) / 1e3
        total = host + kern + other

        def pct(x: float, total: float = total) -> float | None:
            return 100.0 * x / total if total else None

        out.append(IdleRow(run_id, int(rank), int(stream), int(n), total, host, kern, other,
                           pct(host), pct(kern), pct(other)))
    return out


def save(con: duckdb.DuckDBPyConnection, rows: list[IdleRow]) -> None:
    """Append rows to the ``idle_breakdown`` table (created by :data:`traceanalyze.store.IDLE_TABLE`, replaced per
    report)."""
    cols = list(IdleRow.__dataclass_fields__)
    insert_rows(con, "idle_breakdown", cols, [[getattr(r, c) for c in cols] for r in rows])
