"""The events the profiler recorded on each host task's thread (``Graph.prof_events``): what the profiler's own
host cost is paid for (:mod:`traceanalyze.replay.overhead`)."""

from __future__ import annotations

import numpy as np

from traceanalyze.replay.graph.model import T_SHIFT, Graph, host_resources
from traceanalyze.replay.graph.source import RunClock, fetch_arrow, in_files, unique_rows
from traceanalyze.replay.graph.tasks import Tasks

PROFILER_EVENTS_BATCH = 250_000  # CPU ops whose profiler events are counted at once (profiler_events)


def profiler_events(con, rc: RunClock, g: Graph | Tasks, fids: list[int] | None = None) -> np.ndarray:
    """Per host task (and step marker) of ``g``: the events the profiler recorded on its thread from the end of the
    thread's previous task to its own end, each counted at its start, as four uint16 rows (8 bytes a task; a count
    over 65,535 is clipped): ``[0]`` cpu ops and annotations recorded in C++, ``[1]`` runtime and driver calls,
    ``[2]`` the ranges Python opens only while a profiler runs (inductor's ``triton_*`` launches, ``## Call
    CompiledFxGraph``, compiled regions), ``[3]`` the shapes ``record_shapes`` copied for those ops (each op's
    ``Input Dims`` entries: one per input, one more per tensor of a list input); 0 for device tasks. The
    profiler's own host cost is paid per recorded event (:mod:`traceanalyze.replay.overhead`).

    ``g``: the graph, or the tasks of a chunk of whole ranks (:class:`.tasks.Tasks`, read as the graph's
    ``rank``/``res``/``res_names``/``start``/``dur``/``first``) with ``fids`` its files (default: the run's)."""
    out = np.zeros((4, g.start.size), np.uint16)
    # the host threads: resources named host:pid/tid (:func:`.tasks.order_tasks`), each with its rank
    first = np.flatnonzero(g.first)
    res_first = np.full(len(g.res_names), -1, np.int64)
    res_first[g.res[first]] = first
    host = host_resources(g) & (res_first >= 0)
    threads = {}
    for r in np.flatnonzero(host).tolist():
        pid, _, tid = g.res_names[r][5:].partition("/")
        threads[(int(g.rank[res_first[r]]), int(pid), int(tid))] = r
    idx = np.flatnonzero(host[g.res])
    if not idx.size:
        return out
    # by batches of files (bounded memory: the events of 8 ranks at once held 55 MB), each thread once (a code per
    # row from SQL: no per-row lookup), the events by thread and time
    fids = [int(f) for f in (rc.fid if fids is None else fids)]
    sizes = dict(con.execute("SELECT file_id, coalesce(n_cpu_ops, 0) FROM files WHERE list_contains(?, file_id)",
                             [fids]).fetchall())
    # each host task's window [lo, hi) as sortable keys (resource << T_SHIFT + ns), computed once for all batches
    lim = (1 << T_SHIFT) - 1
    res = g.res[idx].astype(np.int64) << T_SHIFT
    def end_ns(i: np.ndarray) -> np.ndarray:  # of the host tasks and the tasks before them only, not of every task
        return np.clip(((g.start[i] + g.dur[i]) * 1e3).astype(np.int64), 0, lim)

    e_ns = end_ns(idx)
    s_ns = np.clip((g.start[idx] * 1e3).astype(np.int64), 0, lim)
    prev_e = end_ns(np.maximum(idx - 1, 0))  # task 0 is the first of its resource: its prev_e is not read
    win = (idx, g.rank[idx], res + np.where(g.first[idx], s_ns, np.minimum(prev_e, s_ns)), res + e_ns)
    del res, e_ns, s_ns, prev_e
    batch: list[int] = []
    n = 0
    for f in [*fids, None]:
        if f is not None and sizes.get(f, 0) > PROFILER_EVENTS_BATCH:  # one file over a batch: by time ranges
            for lo, hi in _time_parts(con, f, -(-sizes[f] // PROFILER_EVENTS_BATCH)):
                _count_events(con, rc, threads, [f], win, out, lo, hi)
            continue
        if f is not None and (not batch or n + sizes.get(f, 0) <= PROFILER_EVENTS_BATCH):
            batch.append(f)
            n += sizes.get(f, 0)
            continue
        if batch:
            _count_events(con, rc, threads, batch, win, out)
        batch, n = ([f], sizes.get(f, 0)) if f is not None else ([], 0)
    return out


def _time_parts(con, fid: int, parts: int) -> list[tuple[int | None, int | None]]:
    """``[lo, hi)`` ranges of trace time (ns; None: open) that cut the CPU ops of file ``fid`` into about ``parts``
    parts of as many ops (approximate quantiles: a part may hold somewhat more). Counts add up over any such cut."""
    qs = [k / parts for k in range(1, parts)]
    cuts = con.execute("SELECT approx_quantile(ts_ns, ?::FLOAT[]) FROM cpu_ops WHERE file_id = ?",
                       [qs, fid]).fetchall()[0][0] or []
    bounds = sorted({int(c) for c in cuts if c is not None})
    return list(zip([None, *bounds], [*bounds, None], strict=True))


def _count_events(con, rc: RunClock, threads: dict, fids: list[int], win: tuple, out: np.ndarray,
                  ts_lo: int | None = None, ts_hi: int | None = None) -> None:
    """Add the profiler events of the files ``fids`` to ``out`` (:func:`profiler_events`), in place; only those
    that start in ``[ts_lo, ts_hi)`` (trace ns; None: open). ``threads``: (rank, pid, tid) -> the host thread's
    resource; ``win``: the host tasks (ids, ranks, window start and end keys)."""
    # the rows as they are stored (no join, no thread codes in SQL: that window and join cost as much as the scan),
    # read through Arrow (NULL read as 0, as the NumPy fetch's masked rows were; 30 % less than fetchnumpy)
    r = fetch_arrow(con, f"""SELECT c.file_id, c.pid, c.tid, c.ts_ns,
                   CASE WHEN c.cat IN ('cuda_runtime', 'cuda_driver') THEN 1
                        -- starts_with, not LIKE: DuckDB does not make a LIKE with an ESCAPE a prefix test (the
                        -- 256-rank set's 923k ops: 0.01 s of CPU)
                        WHEN starts_with(c.name, 'triton_') OR starts_with(c.name, '## Call CompiledFxGraph')
                             OR starts_with(c.name, 'Torch-Compiled Region') OR c.name IN ('CompiledFunction',
                             'CompiledFunctionBackward') THEN 2 ELSE 0 END AS kind,
                   -- the shapes record_shapes copied: the '[' of Input Dims less the outer one (no JSON parse)
                   CASE WHEN c.input_dims IS NULL THEN 0
                        ELSE greatest(length(c.input_dims) - length(replace(c.input_dims, '[', '')) - 1, 0)
                   END AS shapes
            FROM cpu_ops c
            WHERE {in_files("c.file_id", fids, "$1")}
              AND c.cat IN ('cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver')
              AND ($2::BIGINT IS NULL OR c.ts_ns >= $2) AND ($3::BIGINT IS NULL OR c.ts_ns < $3)""",
              [fids, ts_lo, ts_hi])  # fids: the run's ranked files (rc.fid)
    fid = np.asarray(r["file_id"], np.int64)
    if fid.size == 0:
        return
    # the threads (file, pid, tid), sorted, and each row's index into them
    th, code = unique_rows(fid, np.asarray(r["pid"], np.int64), np.asarray(r["tid"], np.int64))
    del fid
    th_rank = rc.rank_of(th[:, 0])
    th_res = np.array([threads.get((rk, a, b), -1) for rk, (_, a, b) in
                       zip(th_rank.tolist(), th.tolist(), strict=True)], np.int64)
    th_shift = rc.origin + rc.off_ns[np.clip(th_rank, 0, rc.world)]
    lim = (1 << T_SHIFT) - 1
    kind, shapes = np.asarray(r["kind"], np.int8), np.asarray(r["shapes"], np.int64)
    ts = np.asarray(r["ts_ns"], np.int64)
    del r
    if (th_res < 0).any():  # rows of threads without a host task: dropped (most batches have none: no copies)
        ok = th_res[code] >= 0
        kind, shapes, ts, code = kind[ok], shapes[ok], ts[ok], code[ok]
        del ok
    keys = (th_res[code] << T_SHIFT) + np.clip(ts - th_shift[code], 0, lim)
    del ts, code
    # the rows come by thread and time: sorted already, as a rule (the sort and its takes cost 5 ms per 250k)
    if keys.size > 1 and (keys[1:] < keys[:-1]).any():
        o = np.argsort(keys, kind="stable")
        keys, kind, shapes = keys[o], kind[o], shapes[o]
        del o
    idx, ranks, lo_key, hi_key = win
    m = np.flatnonzero(np.isin(ranks, np.unique(th_rank)))  # the host tasks of these ranks
    sel = idx[m]
    hi_i = np.searchsorted(keys, hi_key[m], side="left")
    lo_i = np.searchsorted(keys, lo_key[m], side="left")
    # events of kinds 1 and 2 (shapes: their count) before each position, then the count in [lo, hi); kind 0 is
    # what is left of the window's events (no cumulative sum of its own)
    cnt = [np.clip(hi_i - lo_i, 0, None), None, None, None]
    for i, v in ((1, kind == 1), (2, kind == 2), (3, shapes)):
        if not v.any():  # none in these files: nothing to add (most runs have no kind 2, many no shapes)
            continue
        cum = np.concatenate([[0], np.cumsum(v, dtype=np.int64)])
        cnt[i] = np.clip(cum[hi_i] - cum[lo_i], 0, None)
        if i < 3:
            cnt[0] -= cnt[i]
    for i, c in enumerate(cnt):
        if c is not None and (i or c.any()):
            out[i, sel] = np.minimum(out[i, sel].astype(np.int64) + c, np.iinfo(np.uint16).max)
