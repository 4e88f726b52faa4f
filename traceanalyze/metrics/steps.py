"""The profiler-step filter: which ``ProfilerStep#N`` ranges count as steps, for every metric and the replay.

One definition, used by the breakdown, the per-step table, the collectives' per-step wait, the data-loader and
launch figures, and (through :func:`step_set`) by any later analysis. It lives in the database as the table
macro ``profiler_steps(run_id)`` (see :data:`STEP_MACROS`), so a user's own query sees the same steps::

    SELECT rank, step, (end_ns - start_ns) / 1e3 AS us FROM profiler_steps(1) WHERE counted

A *step* is one ``ProfilerStep#N`` range of one rank and profiling window. The PyTorch profiler records it as a
``user_annotation`` (PyTorch 1.10 and later) or as a ``cpu_op`` (PyTorch 1.8/1.9, category ``Operator`` in the
2021 schema, which ingest maps to ``cpu_op``). A step is **counted** when

1. it is not the last step of a window that holds two or more steps: that step is partial at the window's edge,
   it holds the profiler's own teardown and its kernels may run past the end of the trace (HTA
   ``Trace.load_traces``, ``include_last_profiler_step=False``, drops it for the same reason); and
2. the same step number is counted (rule 1) on every rank that has profiler steps, so every figure that
   compares or combines ranks sees the same steps.

Steps of all windows of a rank are combined. The run's **step time** is the median over the counted step
numbers of the longest duration of that step over the ranks (a duration on one clock, so no clock offset between
hosts can skew it); a rank's step time is the median of its own counted steps.

The kernels the temporal breakdown and the idle-time breakdown count follow rule 1 as HTA does: those launched
(``cuda_runtime``/``cuda_driver`` row with the kernel's ``correlation``) before the start of the window's last
step (:func:`step_cutoff_sql`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import duckdb

from traceanalyze import store

# The SQL lives in the store (store.STEP_MACROS: installed with every database, and importable without NumPy)
STEP_MACROS = store.STEP_MACROS


def step_cutoff_sql(run_param: str = "$1") -> str:
    """SQL of ``(file_id, cutoff_ns)``: per window with two or more steps, the start of its last step (rule 1 of
    the module docstring). Kernels launched at or after it are left out of the breakdowns; a window without a
    row keeps every kernel. ``run_param`` is the SQL expression of the run id (a parameter)."""
    return f"SELECT file_id, start_ns AS cutoff_ns FROM profiler_steps({run_param}) WHERE window_edge"


def counted_kernels_sql(run_param: str = "$1", kernel_where: str = "TRUE") -> str:
    """SQL of the run's ``kernels`` rows (all columns) that the breakdowns count: every kernel of a window without
    a cutoff, else those launched before it (:func:`step_cutoff_sql`). ``run_param`` as there; ``kernel_where``
    (a condition on ``k``) narrows the kernels before their launches are looked up, which is much cheaper than
    filtering the result."""
    return f"""WITH cut AS ({step_cutoff_sql(run_param)}),
    kk AS (SELECT k.* FROM kernels k JOIN files f ON f.file_id = k.file_id AND f.run_id = {run_param}
           WHERE {kernel_where}),
    launched AS (SELECT DISTINCT r.file_id, r.correlation FROM cpu_ops r JOIN cut c USING (file_id)
                 WHERE r.correlation IN (SELECT correlation FROM kk) AND r.cat IN ('cuda_runtime', 'cuda_driver')
                   AND r.ts_ns < c.cutoff_ns)
    SELECT kk.* FROM kk LEFT JOIN cut c ON c.file_id = kk.file_id
    LEFT JOIN launched l ON l.file_id = kk.file_id AND l.correlation = kk.correlation
    WHERE c.file_id IS NULL OR l.file_id IS NOT NULL"""


def counted_op_sql(alias: str = "c", run_param: str = "$1") -> str:
    """SQL condition on a ``cpu_ops`` row ``alias``: it starts inside a counted step of its file and thread, or
    the run has no profiler step at all (then every op counts)."""
    return (f"(NOT EXISTS (SELECT 1 FROM profiler_steps({run_param})) OR EXISTS (SELECT 1 FROM "
            f"profiler_steps({run_param}) s WHERE s.counted AND s.file_id = {alias}.file_id AND s.pid = {alias}.pid "
            f"AND s.tid = {alias}.tid AND {alias}.ts_ns >= s.start_ns AND {alias}.ts_ns < s.end_ns))")


@dataclass
class ProfilerStep:
    """One counted step of one rank and window: times in ns on the rank's clock, ``duration_us`` in µs."""

    rank: int
    window: int
    step: int
    start_ns: int
    end_ns: int
    pid: int | None
    tid: int | None

    @property
    def duration_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1e3


def step_set(con: duckdb.DuckDBPyConnection, run_id: int, *, counted_only: bool = True) -> list[ProfilerStep]:
    """The run's profiler steps (module docstring), sorted by rank, window and start.

    Args:
        con: the store, with ``files.run_id``, ``rank`` and ``window`` set for the run.
        run_id: the run.
        counted_only: False also returns the steps left out (window edges, steps missing on some rank).
    """
    rows = con.execute("SELECT rank, \"window\", step, start_ns, end_ns, pid, tid FROM profiler_steps(?) "
                       + ("WHERE counted " if counted_only else "") + "ORDER BY rank, \"window\", start_ns",
                       [run_id]).fetchall()
    return [ProfilerStep(int(r), int(w), int(s), int(a), int(b), p, t) for r, w, s, a, b, p, t in rows]


def run_step_time_us(steps: list[ProfilerStep]) -> float | None:
    """The run's step time (µs): median over step numbers of the longest duration of that step over the ranks.

    Two windows of one rank never share a step number (the profiler counts steps across windows), so each step
    number is one training step. None without steps.
    """
    longest: dict[int, float] = {}
    for s in steps:
        longest[s.step] = max(longest.get(s.step, 0.0), s.duration_us)
    return float(statistics.median(longest.values())) if longest else None


def rank_step_time_us(steps: list[ProfilerStep], rank: int) -> float | None:
    """Median duration (µs) of ``rank``'s steps in ``steps``; None when it has none."""
    d = [s.duration_us for s in steps if s.rank == rank]
    return float(statistics.median(d)) if d else None


__all__ = ["STEP_MACROS", "ProfilerStep", "counted_kernels_sql", "counted_op_sql", "rank_step_time_us",
           "run_step_time_us", "step_cutoff_sql", "step_set"]
