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
step (:func:`traceanalyze.metrics._sql.step_cutoff_sql`, with the other SQL fragments of this filter).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb

from traceanalyze import store

# The SQL lives in the store (store.STEP_MACROS: installed with every database, and importable without NumPy)
STEP_MACROS = store.STEP_MACROS


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


def median(values: Iterable[float]) -> float | None:
    """The median (:func:`statistics.median`: the mean of the two middle values for an even count) as a float;
    None for no values. The step times (of the run, a rank, a window, the replay) are this median."""
    v = list(values)
    return float(statistics.median(v)) if v else None


def longest_per_step(durations: Iterable[tuple[int, float]]) -> dict[int, float]:
    """Step number -> the longest of its ``(step, duration)`` pairs (the slowest rank's duration of that step), in
    order of first appearance."""
    longest: dict[int, float] = {}
    for step, d in durations:
        longest[step] = max(longest.get(step, 0.0), d)
    return longest


def run_step_time_us(steps: list[ProfilerStep]) -> float | None:
    """The run's step time (µs): median over step numbers of the longest duration of that step over the ranks.

    Two windows of one rank never share a step number (the profiler counts steps across windows), so each step
    number is one training step. None without steps.
    """
    return median(longest_per_step((s.step, s.duration_us) for s in steps).values())


def rank_step_time_us(steps: list[ProfilerStep], rank: int) -> float | None:
    """Median duration (µs) of ``rank``'s steps in ``steps``; None when it has none."""
    return median(s.duration_us for s in steps if s.rank == rank)


__all__ = ["STEP_MACROS", "ProfilerStep", "longest_per_step", "median", "rank_step_time_us", "run_step_time_us",
           "step_set"]
