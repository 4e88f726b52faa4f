"""Arrival skew per collective instance: who waited for whom (table ``collective_skew``, ``docs/schema.md``).

The instances are the replay's (:func:`traceanalyze.replay.graph.build`: Comms Id, else process group and Seq,
else the per-step order; only *complete* ones: every rank of the group traced, one call each, name and size
alike). For each instance and participating rank, on the clocks the replay aligns (each rank's clock minus its
collective clock offset, :func:`traceanalyze.metrics.collectives.match_collectives`, minus the run's first
timestamp; µs):

- ``arrival_us``: the start of the rank's collective (NCCL kernel, or ``gloo:*`` range);
- the *last arriver*: the rank with the latest arrival (ties: the lowest rank);
- ``wait_us``: the rank's arrival to the last arriver's arrival, at most the rank's own collective duration (the
  time it sat in the collective before the last rank came; a larger gap than its duration can only be a clock
  error, and the duration bounds it). The wait is measured from the arrivals rather than as duration − transfer
  estimate, because the arrival gap names the rank that was waited for; the row keeps ``dur_us`` and
  ``transfer_us`` (the replay's transfer estimate) for the other reading. The last arriver's wait is 0.

Per rank, :class:`Skew` sums ``waited_for_others_us`` (its waits) and ``kept_others_waiting_us`` (the other ranks'
waits at the instances where it arrived last). Everything is one DuckDB query over the graph's collective tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np

from traceanalyze.replay import graph as gr

# One row per (complete instance, rank): parameters none; inputs the registered Arrow tables _skew_calls (instance,
# rank, step, start_us, dur_us) and _skew_steps (rank, step, begin_us, end_us, counted), _skew_inst (instance,
# collective, transfer_us).
_SKEW_SQL = """
    WITH c AS (
        SELECT k.instance, k.rank, k.step, k.start_us, k.dur_us,
               max(k.start_us) OVER w AS last_us,
               first_value(k.rank) OVER (PARTITION BY k.instance ORDER BY k.start_us DESC, k.rank) AS last_rank,
               count(*) OVER w AS n_ranks
        FROM _skew_calls k WINDOW w AS (PARTITION BY k.instance))
    SELECT c.instance AS instance_id, c.step, i.collective, c.rank, c.n_ranks, c.start_us AS arrival_us,
           c.start_us - s.begin_us AS step_offset_us, s.end_us - s.begin_us AS step_time_us,
           coalesce(s.counted, false) AS counted,
           greatest(least(c.last_us - c.start_us, c.dur_us), 0.0) AS wait_us,
           c.dur_us, i.transfer_us, c.rank = c.last_rank AS is_last, c.last_rank
    FROM c JOIN _skew_inst i ON i.instance = c.instance
    LEFT JOIN _skew_steps s ON s.rank = c.rank AND s.step = c.step
    ORDER BY c.instance, c.rank"""

COLUMNS = ("instance_id", "step", "collective", "rank", "n_ranks", "arrival_us", "step_offset_us", "step_time_us",
           "counted", "wait_us", "dur_us", "transfer_us", "is_last", "last_rank")


@dataclass
class Skew:
    """The run's ``collective_skew`` rows as NumPy columns (:data:`COLUMNS`; ``step`` -1 and ``step_offset_us`` /
    ``step_time_us`` NaN outside a profiler step; times µs) and, per rank, ``waited_for_others_us`` and
    ``kept_others_waiting_us`` summed over all rows (µs)."""

    rows: dict[str, np.ndarray]
    waited_for_others_us: dict[int, float] = field(default_factory=dict)
    kept_others_waiting_us: dict[int, float] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.rows["rank"].size) if self.rows else 0

    def kept_in_step(self, step: int) -> dict[int, float]:
        """Rank -> µs the other ranks waited for it at the instances of profiler step ``step``."""
        r = self.rows
        if not self.n:
            return {}
        sel = (r["step"] == step) & ~r["is_last"]
        out: dict[int, float] = {}
        for lr, w in zip(r["last_rank"][sel].tolist(), r["wait_us"][sel].tolist(), strict=True):
            out[int(lr)] = out.get(int(lr), 0.0) + float(w)
        return out


def empty() -> Skew:
    """A :class:`Skew` without rows (no complete instance, or no replay)."""
    return Skew({c: np.zeros(0) for c in COLUMNS})


def collective_skew(con: duckdb.DuckDBPyConnection, g: gr.Graph) -> Skew:
    """The arrival skew of every complete collective instance of ``g`` (module docstring), computed by DuckDB on
    ``con`` (a cursor of its own when the caller runs other queries meanwhile); nothing is written
    (:func:`save`)."""
    import pyarrow as pa

    ct = np.flatnonzero(g.kind == gr.K_COLL)
    if ct.size == 0 or g.inst_complete.size == 0:
        return empty()
    inst = np.asarray(g.inst_all if g.inst_all is not None else g.inst[ct], dtype=np.int64)
    keep = (inst >= 0) & g.inst_complete[np.clip(inst, 0, None)]
    ct, inst = ct[keep], inst[keep]
    if ct.size == 0:
        return empty()
    calls = pa.table({"instance": pa.array(inst), "rank": pa.array(g.rank[ct].astype(np.int64)),
                      "step": pa.array(g.step[ct].astype(np.int64)), "start_us": pa.array(g.start[ct]),
                      "dur_us": pa.array(g.dur[ct])})
    n_st = len(g.steps)
    b = np.array([s[2] for s in g.steps], dtype=np.int64)
    e = np.array([s[3] for s in g.steps], dtype=np.int64)
    steps = pa.table({"rank": pa.array(np.array([s[0] for s in g.steps], dtype=np.int64)),
                      "step": pa.array(np.array([s[1] for s in g.steps], dtype=np.int64)),
                      "begin_us": pa.array(g.start[b] if n_st else np.zeros(0)),
                      "end_us": pa.array(g.start[e] if n_st else np.zeros(0)),
                      "counted": pa.array(np.array([bool(s[4]) for s in g.steps], dtype=bool))})
    insts = pa.table({"instance": pa.array(np.arange(len(g.inst_coll), dtype=np.int64)),
                      "collective": pa.array([str(c) for c in g.inst_coll], pa.string()),
                      "transfer_us": pa.array(np.asarray(g.inst_transfer, dtype=float))})
    for name, t in (("_skew_calls", calls), ("_skew_steps", steps), ("_skew_inst", insts)):
        con.register(name, t)
    try:
        res = con.execute(_SKEW_SQL).fetchnumpy()
    finally:
        for name in ("_skew_calls", "_skew_steps", "_skew_inst"):
            con.unregister(name)
    rows = {c: np.asarray(np.ma.filled(res[c], np.nan) if c in ("step_offset_us", "step_time_us") else res[c])
            for c in COLUMNS}
    rows["collective"] = np.asarray(res["collective"], dtype=object)
    rows["step"] = np.asarray(res["step"], dtype=np.int64)
    rank, last, wait = rows["rank"].astype(np.int64), rows["last_rank"].astype(np.int64), rows["wait_us"]
    ranks = sorted(set(rank.tolist()))
    idx = np.searchsorted(ranks, rank)
    waited = np.bincount(idx, weights=wait, minlength=len(ranks))
    kept = np.bincount(np.searchsorted(ranks, last), weights=wait, minlength=len(ranks))
    return Skew(rows, {r: float(w) for r, w in zip(ranks, waited.tolist(), strict=True)},
                {r: float(k) for r, k in zip(ranks, kept.tolist(), strict=True)})


def save(con: duckdb.DuckDBPyConnection, run_id: int, skew: Skew) -> None:
    """Write ``skew`` to ``collective_skew`` (rows of ``run_id`` replaced)."""
    import pyarrow as pa

    con.execute("DELETE FROM collective_skew WHERE run_id = ?", [run_id])
    if not skew.n:
        return
    r = skew.rows
    step = r["step"]
    con.register("_skew_in", pa.table({
        "instance_id": pa.array(r["instance_id"].astype(np.int64)), "step": pa.array(step, mask=step < 0),
        "collective": pa.array(r["collective"].tolist(), pa.string()), "rank": pa.array(r["rank"].astype(np.int32)),
        "n_ranks": pa.array(r["n_ranks"].astype(np.int32)), "arrival_us": pa.array(r["arrival_us"]),
        "step_offset_us": pa.array(r["step_offset_us"], from_pandas=True),
        "wait_us": pa.array(r["wait_us"]), "dur_us": pa.array(r["dur_us"]), "transfer_us": pa.array(r["transfer_us"]),
        "is_last": pa.array(r["is_last"].astype(bool)), "last_rank": pa.array(r["last_rank"].astype(np.int32))}))
    try:
        con.execute("INSERT INTO collective_skew SELECT ?, instance_id, step, collective, rank, n_ranks, arrival_us, "
                    "step_offset_us, wait_us, dur_us, transfer_us, is_last, last_rank FROM _skew_in", [run_id])
    finally:
        con.unregister("_skew_in")


__all__ = ["COLUMNS", "Skew", "collective_skew", "empty", "save"]
