"""SQL fragments shared by several metrics (private to :mod:`traceanalyze.metrics`).

Each function returns SQL text to embed in a metric's query; none runs a query. ``run_param`` is the SQL
expression of the run id: a numbered or named parameter (``"$1"``, ``"$run_id"``), never ``?``, since a fragment
may name it more than once.

- the profiler-step filter (:mod:`.steps`): :func:`step_cutoff_sql` (rule 1 of the step definition as a cutoff
  time per window), :func:`counted_kernels_sql` (the kernels the breakdowns count; with their launch time:
  :func:`counted_kernels_with_launch_sql`) and :func:`counted_op_sql` (the CPU ops inside counted steps);
- the CPU *training thread* of each trace file: :func:`training_thread_sql`;
- the ``kernel_class`` macro once per distinct kernel name: :func:`kernel_names_class_sql`.
"""

from __future__ import annotations

# The runtime calls that launch GPU work: a kernel's launch is the row of this category with its correlation.
LAUNCH_CATS = "('cuda_runtime', 'cuda_driver')"


def step_cutoff_sql(run_param: str = "$1") -> str:
    """SQL of ``(file_id, cutoff_ns)``: per window with two or more steps, the start of its last step (rule 1 of
    :mod:`.steps`). Kernels launched at or after it are left out of the breakdowns; a window without a row keeps
    every kernel."""
    return f"SELECT file_id, start_ns AS cutoff_ns FROM profiler_steps({run_param}) WHERE window_edge"


def counted_kernels_sql(run_param: str = "$1", kernel_where: str = "TRUE", *, few: bool = True) -> str:
    """SQL of the run's ``kernels`` rows (all columns) that the breakdowns count: every kernel of a window without
    a cutoff, else those launched (a :data:`LAUNCH_CATS` row with the kernel's correlation) before it
    (:func:`step_cutoff_sql`). ``kernel_where`` (a condition on ``k``) narrows the kernels before their launches
    are looked up, which is much cheaper than filtering the result. ``few``: only the launches of the selected
    kernels' correlations are looked up, much cheaper when ``kernel_where`` keeps few kernels (the GEMMs), a third
    dearer when it keeps nearly all (the temporal breakdown: ``few=False``)."""
    only = "r.correlation IN (SELECT correlation FROM kk)" if few else "r.correlation IS NOT NULL"
    # a semi join on the launches (EXISTS), not a join on their DISTINCT (file, correlation): the grouping of
    # every launch was half the temporal breakdown's query (62 -> 47 ms of CPU on the 8-rank scale set)
    return f"""WITH cut AS ({step_cutoff_sql(run_param)}),
    kk AS (SELECT k.* FROM kernels k JOIN files f ON f.file_id = k.file_id AND f.run_id = {run_param}
           WHERE {kernel_where}),
    launched AS (SELECT r.file_id, r.correlation FROM cpu_ops r JOIN cut c USING (file_id)
                 WHERE {only} AND r.cat IN {LAUNCH_CATS}
                   AND r.ts_ns < c.cutoff_ns)
    SELECT kk.* FROM kk LEFT JOIN cut c ON c.file_id = kk.file_id
    WHERE c.file_id IS NULL OR EXISTS (SELECT 1 FROM launched l WHERE l.file_id = kk.file_id
                                       AND l.correlation = kk.correlation)"""


def counted_kernels_with_launch_sql(run_param: str = "$1", kernel_where: str = "TRUE") -> str:
    """:func:`counted_kernels_sql` with each kernel's launch time ``launch_ns`` (its first :data:`LAUNCH_CATS` row with
    the kernel's correlation, NULL when none), for a query that needs the launch time anyway (the idle breakdown's
    host wait). The same rule, written on that column, so the runtime calls are read once: joining
    :func:`counted_kernels_sql` to a launch-time table instead costs the idle breakdown half its time again on a
    240k-kernel trace. One detail differs: launch rows with a negative correlation are not read here (as the idle
    breakdown always did); on every sample and real trace both fragments count the same kernels."""
    return f"""WITH cut AS ({step_cutoff_sql(run_param)}),
    kk AS (SELECT k.* FROM kernels k JOIN files f ON f.file_id = k.file_id AND f.run_id = {run_param}
           WHERE {kernel_where}),
    launch AS (SELECT r.file_id, r.correlation, min(r.ts_ns) AS launch_ns
               FROM cpu_ops r JOIN files f ON f.file_id = r.file_id AND f.run_id = {run_param}
               WHERE r.correlation IS NOT NULL AND r.correlation >= 0 AND r.cat IN {LAUNCH_CATS} GROUP BY ALL)
    SELECT kk.*, l.launch_ns FROM kk LEFT JOIN launch l ON l.file_id = kk.file_id AND l.correlation = kk.correlation
    LEFT JOIN cut c ON c.file_id = kk.file_id
    WHERE c.file_id IS NULL OR (l.launch_ns IS NOT NULL AND l.launch_ns < c.cutoff_ns)"""


def counted_op_sql(alias: str = "c", run_param: str = "$1") -> str:
    """SQL condition on a ``cpu_ops`` row ``alias``: it starts inside a counted step of its file and thread, or
    the run has no profiler step at all (then every op counts)."""
    return (f"(NOT EXISTS (SELECT 1 FROM profiler_steps({run_param})) OR EXISTS (SELECT 1 FROM "
            f"profiler_steps({run_param}) s WHERE s.counted AND s.file_id = {alias}.file_id AND s.pid = {alias}.pid "
            f"AND s.tid = {alias}.tid AND {alias}.ts_ns >= s.start_ns AND {alias}.ts_ns < s.end_ns))")


def training_thread_sql(run_param: str = "$1") -> str:
    """SQL of ``(file_id, pid, tid, steps)``: per trace file of the run, its *training thread*, the thread that
    holds the most ``ProfilerStep#N`` annotations (``steps``, 0 when none does), else the one with the most
    ``aten::`` time. The CPU-mode breakdown counts only its ``aten::`` ops as compute (worker threads would count
    twice)."""
    return f"""SELECT file_id, pid, tid, steps FROM (
        SELECT c.file_id, c.pid, c.tid,
               count(*) FILTER (WHERE profiler_step(c.cat, c.name) IS NOT NULL) AS steps,
               sum(c.dur_ns) FILTER (WHERE c.name LIKE 'aten::%') AS aten_ns
        FROM cpu_ops c JOIN files f USING (file_id) WHERE f.run_id = {run_param} GROUP BY ALL)
    QUALIFY row_number() OVER (PARTITION BY file_id ORDER BY steps DESC, aten_ns DESC NULLS LAST) = 1"""


def kernel_names_class_sql(run_param: str = "$1", kernel_where: str = "TRUE") -> str:
    """SQL of ``(cat, name, klass)``: the ``kernel_class`` macro of each distinct (cat, name) of the run's
    ``kernels`` rows ``k`` that ``kernel_where`` keeps. Joined back on (cat, name) with a fallback to the macro on the
    row (``coalesce(n.klass, kernel_class(k.cat, k.name))``: a NULL name does not join); the macro's regex on
    every row took two thirds of the temporal breakdown's query on 8 ranks."""
    return f"""SELECT cat, name, kernel_class(cat, name) AS klass FROM (SELECT DISTINCT k.cat, k.name FROM kernels k
        JOIN files f ON f.file_id = k.file_id AND f.run_id = {run_param} WHERE {kernel_where})"""
