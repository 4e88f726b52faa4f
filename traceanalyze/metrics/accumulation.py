"""What one profiler step holds when the run accumulates gradients: optimizer steps per counted profiler step and
the optimizer's host time per step (:func:`optimizer_steps`).

A profiler step (``ProfilerStep#N``, one ``prof.step()``) is what the training loop makes it: the HF Trainer
recipe calls ``prof.step()`` in a callback's ``on_step_end``, once per optimizer step (after the gradient
accumulation's micro-batches, ``transformers.TrainerCallback``), while a loop that calls it per batch makes it one
micro-batch. The trace tells which: ``torch.optim.Optimizer.step`` records an ``Optimizer.step#<Class>.step`` range
on every call (``torch/optim/optimizer.py``, ``profile_hook_step``), so one per counted profiler step is an
optimizer step, and fewer (one every GA profiler steps) a micro-batch."""

from __future__ import annotations

import duckdb

OPTIMIZER_STEP_SHARE = 0.75  # optimizer steps per profiler step from which the profiler step is an optimizer step

_SQL = """
WITH st AS (SELECT * FROM profiler_steps($1) WHERE counted),
o AS (
    SELECT DISTINCT st.rank, st.step, c.file_id, c.tid, c.ts_ns AS s, c.ts_ns + c.dur_ns AS e
    FROM st JOIN cpu_ops c ON c.file_id = st.file_id AND c.pid = st.pid AND c.tid = st.tid
         AND c.ts_ns >= st.start_ns AND c.ts_ns < st.end_ns
    WHERE c.cat IN ('cpu_op', 'user_annotation') AND c.name LIKE 'Optimizer.step#%'),
top AS (SELECT * FROM o WHERE NOT EXISTS (
    SELECT 1 FROM o p WHERE p.file_id = o.file_id AND p.tid = o.tid AND p.s <= o.s AND p.e >= o.e
                        AND (p.s < o.s OR p.e > o.e))),
n AS (SELECT rank, count(*) AS n_steps FROM st GROUP BY rank)
SELECT n.rank, any_value(n.n_steps), count(top.s), coalesce(sum(top.e - top.s), 0)
FROM n LEFT JOIN top USING (rank) GROUP BY n.rank ORDER BY n.rank
"""


def optimizer_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> dict | None:
    """``{"per_step", "optimizer_us", "profiler_step"}`` over the run's counted profiler steps (every rank):
    outermost ``Optimizer.step#...`` ranges per counted step, their host µs per counted step, and what a profiler
    step is: ``"optimizer step"`` (at least :data:`OPTIMIZER_STEP_SHARE` optimizer steps per profiler step, at most
    1.5), ``"micro-batch"`` (fewer, at least one in the counted steps), else None (no optimizer range in them, or
    several per profiler step: not known). None without a counted step."""
    rows = con.execute(_SQL, [run_id]).fetchall()
    steps = sum(int(r[1]) for r in rows)
    if not steps:
        return None
    n_opt = sum(int(r[2]) for r in rows)
    per = n_opt / steps
    what = ("optimizer step" if OPTIMIZER_STEP_SHARE <= per <= 1.5 else
            "micro-batch" if 0 < per < OPTIMIZER_STEP_SHARE else None)
    return {"per_step": round(per, 3), "optimizer_us": round(sum(float(r[3]) for r in rows) / 1e3 / steps, 3),
            "profiler_step": what}
