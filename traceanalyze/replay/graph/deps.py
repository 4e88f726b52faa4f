"""The graph's explicit edges (``sim_dep``; :data:`~traceanalyze.replay.graph.model.DEP_TYPES`): ``launch`` (a
device task from its runtime call; a gloo collective from the ``c10d::*`` call that issued it), ``event_wait``
(cross-stream event waits), ``gpu_cpu_sync`` (a blocking synchronize call), ``inter_thread`` and
``collective_wait`` (a long host gap that waited for another thread's task or a collective). Each finder adds its
edges to :class:`Edges` and adjusts the chain gaps and durations the edge now models."""

from __future__ import annotations

import numpy as np

from traceanalyze.replay.graph.model import K_BEGIN, K_COLL, K_HOST, T_SHIFT, WAIT_GAP_US, WAIT_TAIL
from traceanalyze.replay.graph.source import RunClock, fetch, in_files, unique_rows
from traceanalyze.replay.graph.tasks import Tasks


class Edges:
    """The explicit edges as they are found (:data:`.model.DEP_TYPES` codes), in order."""

    def __init__(self) -> None:
        self.lists: tuple[list, list, list, list, list] = ([], [], [], [], [])

    def extend(self, src, dst, from_end, off, etype) -> None:
        _extend(*self.lists, src, dst, from_end, off, etype)

    def relax_launches(self, dst: np.ndarray) -> None:
        """The launch edges into ``dst`` require only the launch (offset 0 from the call's start): what delayed
        those tasks past their launch is modelled by another edge."""
        if not dst.size:
            return
        for d_arr, off_arr, type_arr in zip(self.lists[1], self.lists[3], self.lists[4], strict=True):
            m = (type_arr == 0) & np.isin(d_arr, dst)
            off_arr[m] = 0.0

    def arrays(self) -> list[np.ndarray]:
        """(src, dst, from_end, offset, type) arrays."""
        return [np.concatenate(x) if x else np.zeros(0) for x in self.lists]


def launch_edges(t: Tasks, dev: np.ndarray, edges: Edges, anchor: np.ndarray, cg: np.ndarray) -> None:
    """Launch edges: device task <- the runtime call of the same file and correlation; the device task's anchor
    becomes its launch time."""
    cols = t.cols
    host_rt = np.flatnonzero((t.rk == 0) & (t.kind == K_HOST) & (cols["corr"] > 0))
    if not (dev.size and host_rt.size):
        return
    hk = (cols["fid"][host_rt] << 40) + cols["corr"][host_rt]
    o = np.argsort(hk, kind="stable")
    hk, hsrc = hk[o], host_rt[o]
    dk = (cols["fid"][dev] << 40) + cols["corr"][dev]
    j = np.clip(np.searchsorted(hk, dk), 0, max(hk.size - 1, 0))
    ok = (hk[j] == dk) & (cols["corr"][dev] > 0)
    d, s = dev[ok], hsrc[j[ok]]
    _add_launch(d, s, t.start, t.end, t.first, cg, *edges.lists)
    anchor[d] = t.start[s]


def gloo_issue_edges(con, rc: RunClock, t: Tasks, edges: Edges, anchor: np.ndarray, cg: np.ndarray,
                      fids: list[int]) -> None:
    """CPU runs: gloo collective <- the top-level task holding the latest ``c10d::*`` call (of the rank) at or
    before its start; the collective's anchor becomes that call's start."""
    rank, res, rel = t.rank, t.res, t.rel
    coll = np.flatnonzero(t.kind == K_COLL)
    c10 = fetch(con, f"""SELECT c.file_id, c.pid, c.tid, c.ts_ns FROM cpu_ops c
        WHERE {in_files("c.file_id", fids, "?")} AND c.name LIKE 'c10d::%' AND c.name NOT LIKE 'c10d::wait%'
        ORDER BY c.ts_ns""", [fids])
    if not (coll.size and c10["ts_ns"].size):
        return
    c_rank = rc.rank_of(np.asarray(c10["file_id"], np.int64))
    c_rel = rc.rel_ns(np.asarray(c10["ts_ns"], np.int64), c_rank)
    # the c10d call's host resource, then the task of that resource containing it
    c_res = t.resource_ids(c_rank, 0, c10["pid"], c10["tid"])
    keep = c_res >= 0
    c_rank, c_rel, c_res = c_rank[keep], c_rel[keep], c_res[keep]
    # per rank: latest c10d call at or before each collective's start
    rk_key = (c_rank << T_SHIFT) + np.clip(c_rel, 0, None)
    o = np.argsort(rk_key, kind="stable")
    rk_key, c_rel_s, c_res_s = rk_key[o], c_rel[o], c_res[o]
    q = (rank[coll] << T_SHIFT) + np.clip(rel[coll], 0, None)
    j = np.searchsorted(rk_key, q, side="right") - 1
    ok = (j >= 0) & ((rk_key[np.clip(j, 0, None)] >> T_SHIFT) == rank[coll])
    coll, j = coll[ok], j[ok]
    issue_rel, issue_res = c_rel_s[j], c_res_s[j]
    task_key = (res.astype(np.int64) << T_SHIFT) + np.clip(rel, 0, None)
    task = np.searchsorted(task_key, (issue_res << T_SHIFT) + np.clip(issue_rel, 0, None), side="right") - 1
    ok = (task >= 0) & (res[np.clip(task, 0, None)] == issue_res)
    d, s, issue = coll[ok], task[ok], issue_rel[ok] / 1e3
    _add_launch(d, s, t.start, t.end, t.first, cg, *edges.lists, issue=issue)
    anchor[d] = issue


def event_wait_edges(con, rc: RunClock, t: Tasks, edges: Edges, cg: np.ndarray, anchor: np.ndarray,
                      fids: list[int], calls: dict[str, np.ndarray]) -> int:
    """Cross-stream event waits (WHATIF.md §2, HTA's previous/next launch rule): the last device task launched on
    the awaited stream before the ``cudaEventRecord`` -> the first device task launched on the waiting stream after
    the ``cudaStreamWaitEvent``. When the wait held the task back (the awaited task ended after the waiting stream's
    previous task and after the launch, ``anchor``), the task's stream gap and its launch delay were the wait: this
    edge carries the measured latency, the chain gap goes, and the launch edge keeps only the launch (start no
    earlier than the call). The waits come from :func:`_stream_waits` (``calls``: the chunk's record and wait calls,
    :func:`.tasks.host_tasks`). Returns the waits found (0: none)."""
    dev = np.flatnonzero(t.rk == 1)
    if not dev.size:
        return 0
    # device tasks by (resource, launch correlation): one sortable key (resources < 2^22, correlations < 2^41)
    lim = (1 << T_SHIFT) - 1
    key = (t.res[dev].astype(np.int64) << T_SHIFT) + np.clip(t.cols["corr"][dev], 0, lim)
    o = np.argsort(key, kind="stable")
    key, dsorted = key[o], dev[o]
    res_wait, res_rec, wait_corr, rec_corr = _stream_waits(con, rc, t, dev, fids, calls)
    n_rows = int(res_wait.size)
    if not n_rows:
        return 0
    q_src = (res_rec << T_SHIFT) + np.clip(rec_corr, 0, lim)
    q_dst = (res_wait << T_SHIFT) + np.clip(wait_corr, 0, lim)
    i_src = np.searchsorted(key, q_src, side="left") - 1  # the last launched before the record
    i_dst = np.searchsorted(key, q_dst, side="right")  # the first launched after the wait
    ok = ((res_wait >= 0) & (res_rec >= 0) & (res_wait != res_rec) & (i_src >= 0) & (i_dst < key.size))
    i_src, i_dst = np.clip(i_src, 0, key.size - 1), np.clip(i_dst, 0, key.size - 1)
    ok &= ((key[i_src] >> T_SHIFT) == res_rec) & ((key[i_dst] >> T_SHIFT) == res_wait)
    pairs = np.unique(np.stack([dsorted[i_src[ok]], dsorted[i_dst[ok]]], axis=1), axis=0)
    if not pairs.size:
        return n_rows
    src, dst = pairs[:, 0], pairs[:, 1]
    prev_end = np.where(t.first[dst], -np.inf, t.end[np.clip(dst - 1, 0, None)])
    # a stream made to wait several times before its next launch waits for the latest of them: only the awaited
    # task that ended last can have held the task back (the others would carry a wait that was not theirs)
    o = np.lexsort((t.end[src], dst))
    last = np.ones(dst.size, bool)
    last[o[:-1]] = dst[o[1:]] != dst[o[:-1]]
    binds = last & (t.end[src] >= prev_end) & (t.end[src] >= anchor[dst])
    off = np.where(binds, np.clip(t.start[dst] - t.end[src], 0, None), 0.0)
    cg[dst[binds]] = 0.0
    edges.relax_launches(dst[binds])
    edges.extend(src, dst, True, off, 4)
    return n_rows


def _stream_waits(con, rc: RunClock, t: Tasks, dev: np.ndarray, fids: list[int], calls: dict[str, np.ndarray]
                  ) -> tuple[np.ndarray, ...]:
    """Each ``cudaStreamWaitEvent`` call of the ranks of ``fids`` (``calls``: their ``cudaEventRecord`` and
    ``cudaStreamWaitEvent`` calls, :func:`.tasks.host_tasks`): (waiting stream's resource, awaited stream's
    resource, the wait call's correlation, the awaited ``cudaEventRecord``'s correlation), int64 arrays, -1 where
    unknown.

    A ``cuda_syncs`` "Stream Wait Event" row with the call's correlation names the waiting stream, and, from older
    Kineto, the awaited stream and record (``wait_on_stream``, ``wait_on_corr``). Kineto from 2025 writes -1 for
    both (only an event id, which PyTorch reuses), and a trace without ``cuda_sync`` rows has neither. Then the
    record is the rank's last ``cudaEventRecord`` call before the wait, and the awaited stream is the one of the last
    device task launched before that record (PyTorch and cuDNN record an event right after the work the other
    stream must wait for; a wait on its own stream is no wait). On a rank without rows, each device task launched
    first on its stream since a wait call stands for a wait of its stream (cuDNN records on the main stream, makes
    several side streams wait, then launches on each). Correlations count the process's runtime calls in order,
    whatever the thread."""
    w = _with_sync_rows(con, calls, fids)
    none = (np.zeros(0, np.int64),) * 4
    if not w["file_id"].size:
        return none
    rank = rc.rank_of(np.asarray(w["file_id"], np.int64))
    corr = np.asarray(w["corr"], np.int64)
    rkey = (rank << T_SHIFT) + corr
    if rkey.size > 1 and (rkey[1:] < rkey[:-1]).any():  # the calls in (rank, correlation) order (as the query
        # orders them wherever file ids ascend with ranks: then nothing is copied)
        o = np.argsort(rkey, kind="stable")
        w = {k: v[o] for k, v in w.items()}
        rank, corr, rkey = rank[o], corr[o], rkey[o]
    is_wait = np.asarray(w["is_wait"], bool)
    wi = np.flatnonzero(is_wait)
    if not wi.size:
        return none
    rec = np.flatnonzero(~is_wait)
    j = np.searchsorted(rkey[rec], rkey[wi], side="left") - 1  # the last record before each wait
    jc = np.clip(j, 0, None)
    has_rec = (j >= 0) & (rank[rec[jc]] == rank[wi]) if rec.size else np.zeros(wi.size, bool)
    rec_corr = np.where(has_rec, corr[rec[jc]] if rec.size else -1, -1)
    # device tasks of the rank in launch order: the stream launched to last before / first after a correlation
    dkey = (t.rank[dev].astype(np.int64) << T_SHIFT) + np.clip(t.cols["corr"][dev], 0, (1 << T_SHIFT) - 1)
    o = np.argsort(dkey, kind="stable")
    dkey, dres = dkey[o], t.res[dev][o].astype(np.int64)

    stream, dev_id, on_stream, on_corr = (np.asarray(w[k][wi], np.int64) for k in
                                          ("stream", "device", "wait_on_stream", "wait_on_corr"))
    rk, wcorr = rank[wi], corr[wi]
    row_ranks = np.unique(rk[stream >= 0])
    res_wait = t.resource_ids(rk, 1, dev_id, stream)
    keep = np.isin(rk, row_ranks)  # a rank with rows: its waits as the rows say
    # a rank without rows: the first task launched on each stream since a wait, waiting on the wait before it
    first_since = _first_launches_after_waits(dkey, dres, (rk[~keep] << T_SHIFT) + wcorr[~keep])
    inf_key = dkey[first_since]
    iw = np.searchsorted(rkey[wi], inf_key, side="left") - 1  # the last wait before the task's launch
    rk = np.concatenate([rk[keep], inf_key >> T_SHIFT])
    res_wait = np.concatenate([res_wait[keep], dres[first_since]])
    wcorr = np.concatenate([wcorr[keep], wcorr[np.clip(iw, 0, None)]])
    rec_corr = np.concatenate([rec_corr[keep], rec_corr[np.clip(iw, 0, None)]])
    on_stream = np.concatenate([on_stream[keep], np.full(first_since.size, -1)])
    on_corr = np.concatenate([on_corr[keep], np.full(first_since.size, -1)])
    dev_id = np.concatenate([dev_id[keep], np.full(first_since.size, -1)])
    known = (on_stream >= 0) & (on_corr >= 0)
    rec_corr = np.where(known, on_corr, rec_corr)
    res_rec = np.where(known, t.resource_ids(rk, 1, dev_id, on_stream),
                       _launched_before(dkey, dres, (rk << T_SHIFT) + np.clip(rec_corr, 0, None)))
    res_rec = np.where(rec_corr >= 0, res_rec, -1)
    return res_wait, res_rec, wcorr, rec_corr


def _with_sync_rows(con, calls: dict[str, np.ndarray], fids: list[int]) -> dict[str, np.ndarray]:
    """``calls`` (in (file, correlation) order) left-joined with the ``cuda_syncs`` "Stream Wait Event" rows of the
    same file and correlation: ``device``, ``stream``, ``wait_on_stream``, ``wait_on_corr`` (-1 where none or NULL);
    a call with several such rows once per row, as a SQL join. The rows are few (most traces have none): the
    calls themselves come from the runtime calls already read (:func:`.tasks.host_tasks`)."""
    cols = ("device", "stream", "wait_on_stream", "wait_on_corr")
    s = fetch(con, f"""SELECT file_id, correlation, {", ".join(f"coalesce({c}, -1) AS {c}" for c in cols)}
        FROM cuda_syncs WHERE {in_files("file_id", fids, "?")} AND name = 'Stream Wait Event'
          AND correlation IS NOT NULL""", [fids])
    fid, corr = calls["file_id"], calls["corr"]
    if not (fid.size and s["file_id"].size):
        return {**calls, **{c: np.full(fid.size, -1, np.int64) for c in cols}}
    # (file, correlation) as one code for calls and rows alike (their tuples' rank), each row's run found by search
    n = fid.size
    code = unique_rows(np.concatenate([fid, np.asarray(s["file_id"], np.int64)]),
                       np.concatenate([corr, np.asarray(s["correlation"], np.int64)]))[1]
    o = np.argsort(code[n:], kind="stable")
    s_code = code[n:][o]
    lo, hi = np.searchsorted(s_code, code[:n], "left"), np.searchsorted(s_code, code[:n], "right")
    reps = np.maximum(hi - lo, 1)
    ci = np.repeat(np.arange(n), reps)
    at = lo[ci] + np.arange(ci.size) - np.repeat(np.cumsum(reps) - reps, reps)
    hit = (hi - lo)[ci] > 0
    si = o[np.where(hit, at, 0)]
    out = {k: v[ci] for k, v in calls.items()}
    for c in cols:
        out[c] = np.where(hit, np.asarray(s[c], np.int64)[si], -1)
    return out


def _first_launches_after_waits(dkey: np.ndarray, dres: np.ndarray, wkey: np.ndarray) -> np.ndarray:
    """Indices into the launch-ordered device tasks (``dkey``: rank << T_SHIFT + correlation; ``dres``: resource)
    of each task that is the first on its resource since a wait call (``wkey``, the waits' keys): the previous
    task of its resource and rank was launched before the latest wait that precedes it."""
    if not (wkey.size and dkey.size):
        return np.zeros(0, np.int64)
    wkey = np.sort(wkey)
    iw = np.searchsorted(wkey, dkey, side="left") - 1  # the latest wait before each launch
    iwc = np.clip(iw, 0, None)
    has = (iw >= 0) & ((wkey[iwc] >> T_SHIFT) == (dkey >> T_SHIFT))
    # the previous launch on the same resource: tasks ordered by (resource, launch)
    o = np.lexsort((dkey, dres))
    prev = np.full(dkey.size, -1, np.int64)
    same = dres[o][1:] == dres[o][:-1]
    prev[o[1:][same]] = dkey[o[:-1][same]]
    return np.flatnonzero(has & (prev < wkey[iwc]))


def _launched_before(dkey: np.ndarray, dres: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The resource of the last device task launched before each key ``q`` of the same rank (``dkey``: launch-
    ordered rank << T_SHIFT + correlation; ``dres``: resource), -1 if none: the stream an event recorded at ``q``
    followed."""
    if not (q.size and dkey.size):
        return np.full(q.size, -1, np.int64)
    i = np.searchsorted(dkey, q, side="left") - 1
    ic = np.clip(i, 0, None)
    return np.where((i >= 0) & ((dkey[ic] >> T_SHIFT) == (q >> T_SHIFT)), dres[ic], -1)


def sync_edges(t: Tasks, dev: np.ndarray, edges: Edges, cd: np.ndarray) -> None:
    """GPU->CPU syncs: the task after a blocking call waits for the last device task that ended before the call
    returned (the call's blocked part leaves its chain duration ``cd``)."""
    rank, res, start, end, dur = t.rank, t.res, t.start, t.end, t.dur
    sync = np.flatnonzero((t.kind == K_HOST) & (t.cols["flag"] == 1))
    sync = sync[(sync + 1 < t.n)]
    sync = sync[res[sync + 1] == res[sync]]
    if not (sync.size and dev.size):
        return
    dkey = (rank[dev] << T_SHIFT) + np.clip((end[dev] * 1e3).astype(np.int64), 0, None)
    o = np.argsort(dkey, kind="stable")
    dkey, dsorted = dkey[o], dev[o]
    q = (rank[sync] << T_SHIFT) + np.clip((end[sync] * 1e3).astype(np.int64) + 1000, 0, None)
    j = np.searchsorted(dkey, q, side="right") - 1
    ok = (j >= 0) & ((dkey[np.clip(j, 0, None)] >> T_SHIFT) == rank[sync])
    s_call, src = sync[ok], dsorted[j[ok]]
    blocked = np.clip(end[src] - start[s_call], 0, dur[s_call])
    cd[s_call] = dur[s_call] - blocked
    nxt = s_call + 1
    off = start[nxt] - end[src]
    edges.extend(src, nxt, True, off, 1)
    # the stream a synchronize waits for is not in the trace without cuda_sync rows: every stream of the
    # rank, each through its last task that ended before the call returned, with the same return latency
    for r_id in np.unique(res[dev]).tolist():
        lo_i = int(np.searchsorted(res, r_id))
        hi_i = int(np.searchsorted(res, r_id, side="right"))
        ends = np.maximum.accumulate(end[lo_i:hi_i])
        mine = rank[s_call] == rank[lo_i]
        jj = np.searchsorted(ends, end[s_call] + 1.0, side="right") - 1
        ok2 = mine & (jj >= 0)
        other = lo_i + jj[ok2]
        keep = other != src[ok2]
        edges.extend(other[keep], nxt[ok2][keep], True, off[ok2][keep], 1)


def wait_edges(t: Tasks, mode: str, edges: Edges, cg: np.ndarray) -> None:
    """Waits: a host gap of ≥ :data:`WAIT_GAP_US` that ends after another thread's task or a collective of the rank
    ended in its last three quarters waits for it (``inter_thread`` / ``collective_wait``); the gap's head leaves
    the chain gap ``cg``."""
    rank, res, kind, rk, start, end = t.rank, t.res, t.kind, t.rk, t.start, t.end
    # the idle time before each task: its gap, less the runtime calls folded into it (host_tasks)
    gap = np.minimum(t.gap, t.cols.pop("idle"))
    hostres = (rk == 0) & (kind != K_BEGIN)
    w = np.flatnonzero(hostres & ~t.first & (gap >= WAIT_GAP_US))
    # CPU runs: only collectives (their threads' other tasks are not tied to the step's thread by any edge, so a
    # wait on them would pin it to measured times); GPU runs: other launching threads too (autograd's)
    cand = np.flatnonzero((((rk == 0) & (kind == K_HOST)) if mode == "gpu" else False) | (kind == K_COLL))
    if not (w.size and cand.size):
        return
    ckey = (rank[cand] << T_SHIFT) + np.clip((end[cand] * 1e3).astype(np.int64), 0, None)
    o = np.argsort(ckey, kind="stable")
    ckey, csorted = ckey[o], cand[o]
    q = (rank[w] << T_SHIFT) + np.clip((start[w] * 1e3).astype(np.int64), 0, None)
    # the candidate whose end is nearest the gap's end: the last one before it, or (a gloo range ends after
    # its completion callbacks, which run on the waiting thread) the first one after it, if already running
    j = np.searchsorted(ckey, q, side="right") - 1
    lo = start[w] - (1 - WAIT_TAIL) * gap[w]
    best_src = np.full(w.size, -1, np.int64)
    best_dist = np.full(w.size, np.inf)
    for jj in (j, j + 1):
        jc = np.clip(jj, 0, ckey.size - 1)
        src = csorted[jc]
        ok = ((jj >= 0) & (jj < ckey.size) & ((ckey[jc] >> T_SHIFT) == rank[w]) & (end[src] > lo)
              & (res[src] != res[w]) & (start[src] < start[w]))
        if mode == "gpu":
            ok &= end[src] <= start[w]
        dist = np.abs(start[w] - end[src])
        better = ok & (dist < best_dist)
        best_src[better], best_dist[better] = src[better], dist[better]
    ok = best_src >= 0
    d, s = w[ok], best_src[ok]
    cg[d] = np.clip(start[d] - end[s], 0, None)
    edges.extend(s, d, True, start[d] - end[s], np.where(kind[s] == K_COLL, 3, 2))


def _extend(src_l, dst_l, end_l, off_l, type_l, src, dst, from_end, off, etype) -> None:
    src_l.append(np.asarray(src, np.int64))
    dst_l.append(np.asarray(dst, np.int64))
    end_l.append(np.full(np.size(src), from_end, dtype=bool))
    off_l.append(np.asarray(off, float))
    type_l.append(np.broadcast_to(np.asarray(etype, np.int64), np.shape(src)).copy())


def _add_launch(d, s, start, end, first, cg, *deps, issue=None) -> None:
    """Launch edges s -> d (HTA rule): the measured latency when d's resource was idle at launch, else 0 after
    the launch and the resource's order governs (its measured gap kept)."""
    launch = start[s] if issue is None else issue
    prev_end = np.where(first[d], -np.inf, end[np.clip(d - 1, 0, None)])
    busy = launch < prev_end
    off = np.where(busy, launch - start[s], start[d] - start[s])
    cg[d[~busy]] = 0.0
    _extend(*deps, s, d, False, off, 0)
