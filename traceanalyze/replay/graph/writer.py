"""The graph written to the store: ``sim_task``, ``sim_dep`` and ``sim_coll`` (:func:`save`)."""

from __future__ import annotations

import duckdb
import numpy as np

from traceanalyze.replay.graph.model import DEP_TYPES, GAP_LABELS, K_COLL, K_HOST, KINDS, Graph, host_resources

DUCKDB_ROW_GROUP_ROWS = 122_880  # DuckDB's rows per row group (its default row_group_size)
# sim_task rows written per INSERT by save: whole row groups. A slice that ends inside one leaves a partial row
# group that the next INSERT fills again (1 << 18 rows a slice: the 617,472 tasks of 256 ranks cost 0.04-0.08 s
# more CPU, ~10 %)
SAVE_SLICE_ROWS = 2 * DUCKDB_ROW_GROUP_ROWS


def save(con: duckdb.DuckDBPyConnection, g: Graph) -> None:
    """Write the graph to ``sim_task``, ``sim_dep`` and ``sim_coll`` (rows of ``g.run_id`` replaced)."""
    import pyarrow as pa

    for t in ("sim_task", "sim_dep", "sim_coll"):
        con.execute(f"DELETE FROM {t} WHERE run_id = ?", [g.run_id])
    host = host_resources(g)
    con.begin()  # one transaction: a commit per slice costs DuckDB more memory than the slices save
    try:
        for lo in range(0, g.start.size, SAVE_SLICE_ROWS):  # in slices: the Arrow copy of a slice at a time
            con.register("_sim_task_in", _task_rows(g, lo, min(g.start.size, lo + SAVE_SLICE_ROWS), host))
            con.execute("INSERT INTO sim_task SELECT run_id, task_id, rank, resource::VARCHAR, kind::VARCHAR, "
                        "name::VARCHAR, step, start_us, dur_us, gap_us, gap_label::VARCHAR FROM _sim_task_in")
            con.unregister("_sim_task_in")
    except BaseException:
        con.rollback()
        raise
    con.commit()
    dt = pa.DictionaryArray.from_arrays(pa.array(g.dep_type.astype(np.int32)), pa.array(list(DEP_TYPES)))
    con.register("_sim_dep_in", pa.table({"src": pa.array(g.dep_src), "dst": pa.array(g.dep_dst), "t": dt,
                                          "e": pa.array(g.dep_end), "o": pa.array(g.dep_off)}))
    con.execute("INSERT INTO sim_dep SELECT ?, src, dst, t::VARCHAR, e, o FROM _sim_dep_in", [g.run_id])
    con.unregister("_sim_dep_in")
    ct = np.flatnonzero(g.kind == K_COLL)
    inst_all = _instance_of_tasks(g, ct)
    keep = inst_all >= 0
    ct, inst_all = ct[keep], inst_all[keep]
    if ct.size:
        latest = np.full(g.inst_transfer.size, -np.inf)
        np.maximum.at(latest, inst_all, g.start[ct])
        blocking = np.where(g.inst_complete[inst_all], latest[inst_all] - g.start[ct], 0.0)
        coll_names = pa.DictionaryArray.from_arrays(pa.array(inst_all.astype(np.int32)), pa.array(g.inst_coll))
        by = pa.DictionaryArray.from_arrays(pa.array(inst_all.astype(np.int32)), pa.array(g.inst_matched_by))
        con.register("_sim_coll_in", pa.table({
            "i": pa.array(inst_all), "r": pa.array(g.rank[ct].astype(np.int32)), "t": pa.array(ct), "m": by,
            "c": coll_names, "b": pa.array(g.inst_bytes[inst_all]), "s": pa.array(g.start[ct]),
            "e": pa.array(g.start[ct] + g.dur[ct]), "x": pa.array(g.inst_transfer[inst_all]),
            "w": pa.array(blocking), "ok": pa.array(g.inst_complete[inst_all])}))
        con.execute("INSERT INTO sim_coll SELECT ?, i, r, t, m::VARCHAR, c::VARCHAR, b, s, e, x, w, ok "
                    "FROM _sim_coll_in", [g.run_id])
        con.unregister("_sim_coll_in")


def _task_rows(g: Graph, lo: int, hi: int, host: np.ndarray):
    """Rows ``lo:hi`` of ``sim_task`` as an Arrow table (``host``: per resource, a host thread)."""
    import pyarrow as pa

    sl = slice(lo, hi)
    res, kind, step, gap_label = g.res[sl], g.kind[sl], g.step[sl], g.gap_label[sl]
    return pa.table({
        "run_id": pa.array(np.full(hi - lo, g.run_id, np.int32)),
        "task_id": pa.array(np.arange(lo, hi, dtype=np.int64)), "rank": pa.array(g.rank[sl].astype(np.int32)),
        "resource": pa.DictionaryArray.from_arrays(pa.array(res.astype(np.int32)), pa.array(g.res_names)),
        "kind": pa.DictionaryArray.from_arrays(pa.array(kind.astype(np.int32)), pa.array(list(KINDS))),
        "name": pa.DictionaryArray.from_arrays(pa.array(g.name_code[sl].astype(np.int32)), g.name),
        "step": pa.array(step.astype(np.int32), mask=step < 0),
        "start_us": pa.array(g.start[sl]), "dur_us": pa.array(g.dur[sl]),
        "gap_us": pa.array(np.where(host[res] | (kind != K_HOST), g.gap[sl], 0.0)),
        "gap_label": pa.DictionaryArray.from_arrays(pa.array(gap_label, mask=gap_label < 0), pa.array(GAP_LABELS))})


def _instance_of_tasks(g: Graph, ct: np.ndarray) -> np.ndarray:
    """Instance of each collective task ``ct`` (all of them, in task order), complete or not (``g.inst`` holds -1
    for incomplete ones)."""
    return g.inst_all if g.inst_all is not None else g.inst[ct]
