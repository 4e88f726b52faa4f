"""The graph's tasks (module docstring of :mod:`traceanalyze.replay.graph`): host tasks (runtime calls, or a CPU
run's top-level ops and gloo ranges), device tasks (kernels, memcpys, memsets, NCCL kernels), step markers, sorted
into resource order (:class:`Tasks`), and each task's step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traceanalyze import matmath
from traceanalyze.metrics.collectives import communication_names, int_column
from traceanalyze.replay.graph.model import (
    K_BEGIN,
    K_COLL,
    K_END,
    K_HOST,
    K_KERNEL,
    K_MEMCPY,
    K_MEMSET,
    LAUNCH_CALLS,
    SYNC_CALLS,
    T_SHIFT,
    WAIT_GAP_US,
)
from traceanalyze.replay.graph.source import (
    RunClock,
    dense_codes,
    encode_names,
    fetch_arrow,
    in_files,
    unify_names,
    unique_rows,
)


@dataclass
class Tasks:
    """Every task of the run in resource order (the graph's task ids), as :func:`order_tasks` sorts them.

    ``cols``: the source columns read after the sort (``rank``, ``kind``, ``corr``, ``fid``, ``ext`` (the launching
    op's fp32 code, or a marker's step), ``flag`` (:func:`_name_flags`), ``idle``); ``rk``: 0 host, 1 stream, 2 gloo
    thread. ``uniq``: the resources' keys (rank, rk, a, b), ``res`` each task's index into them;
    ``rel``: start in ns since the run's start; ``start``/``dur``/``end``/``gap`` in µs; ``first``: the first task
    of its resource.
    """

    cols: dict[str, np.ndarray]
    names: object
    name_code: np.ndarray
    uniq: np.ndarray
    res: np.ndarray
    res_names: list[str]
    rk: np.ndarray
    rel: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    end: np.ndarray
    first: np.ndarray
    gap: np.ndarray

    @property
    def n(self) -> int:
        return int(self.start.size)

    @property
    def kind(self) -> np.ndarray:
        return self.cols["kind"]

    def resource_ids(self, rank, rk: int, a, b) -> np.ndarray:
        """Each row's resource index (into ``uniq``) from its (rank, ``rk``, pid|device, tid|stream), -1 for a
        resource with no task."""
        lookup = {tuple(u): i for i, u in enumerate(self.uniq.tolist())}
        cols = [np.asarray(c).astype(np.int64, copy=False) for c in (rank, a, b)]
        if cols[0].size == 0:
            return np.zeros(0, np.int64)
        # the distinct (rank, a, b) are few (threads, streams): look those up, then map every row (a Python
        # lookup per row cost 0.3 s per 400k CPU ops)
        codes, uniqs = [], []
        for c in cols:
            u, inv = np.unique(c, return_inverse=True)
            codes.append(inv.reshape(-1).astype(np.int64))
            uniqs.append(u)
        key = (codes[0] * uniqs[1].size + codes[1]) * uniqs[2].size + codes[2]
        ukey, kinv = np.unique(key, return_inverse=True)
        n1, n2 = uniqs[1].size, uniqs[2].size
        ids = np.array([lookup.get((int(uniqs[0][k // (n1 * n2)]), rk, int(uniqs[1][(k // n2) % n1]),
                                    int(uniqs[2][k % n2])), -1) for k in ukey.tolist()], dtype=np.int64)
        return ids[kinv.reshape(-1)]

    @property
    def rank(self) -> np.ndarray:
        return self.cols["rank"]


def host_tasks(con, rc: RunClock, fids: list[int], dev_keys: np.ndarray | None = None
               ) -> tuple[dict[str, np.ndarray] | None, dict]:
    """``(event calls, task columns)`` of the host tasks: the runtime calls (GPU runs) that an edge can touch
    (:func:`_fold_calls`; ``dev_keys``: the sorted (file_id << 40) + correlation of the device tasks), else each
    thread's top-level ops with the ``gloo:*`` ranges as collectives on their own threads. ``idle``: µs since the
    thread's previous call (folded calls included), +inf where unknown. The event calls (GPU runs; None otherwise)
    are the ``cudaEventRecord`` and ``cudaStreamWaitEvent`` calls among the rows read (:func:`_event_calls`)."""

    # the names as codes into the distinct names (fetch_arrow): each row's flag is its name's (_name_flags)
    if rc.mode == "gpu":
        h = fetch_arrow(con, f"""SELECT c.file_id, c.pid, c.tid, c.ts_ns, c.dur_ns, c.correlation, c.name,
                   c.cat = 'cuda_runtime' AND c.correlation IS NOT NULL AS rt
            FROM cpu_ops c WHERE {in_files("c.file_id", fids, "$1")} AND c.cat IN ('cuda_runtime', 'cuda_driver')""",
            [fids], hash_names=True)
        h["flag"] = _name_flags(h["name"][1])[h["name"][0]]
        waits = _event_calls(h)
        h = _fold_calls(h, np.zeros(0, np.int64) if dev_keys is None else dev_keys)
        idle = h.pop("idle")
    else:
        h = fetch_arrow(con, f"""SELECT c.file_id, c.pid, c.tid, c.ts_ns, c.dur_ns, c.correlation, c.name
            FROM cpu_ops c WHERE {in_files("c.file_id", fids, "$1")}
              AND c.cat IN ('cpu_op', 'user_annotation') AND profiler_step(c.cat, c.name) IS NULL
            ORDER BY c.file_id, c.pid, c.tid, c.ts_ns, c.dur_ns DESC""", [fids])
        # top-level ops of each thread: those that start after every earlier op of the thread ended
        thr = _thread_codes(h["file_id"], h["pid"], h["tid"])
        ts = np.asarray(h["ts_ns"], np.int64) - rc.origin
        end = ts + np.asarray(h["dur_ns"], np.int64)
        top = ts >= _seg_cummax_excl(np.clip(end, 0, (1 << T_SHIFT) - 1), thr)
        h = {k: ((v[0][top], v[1]) if k == "name" else v[top]) for k, v in h.items()}
        h["flag"] = _name_flags(h["name"][1])[h["name"][0]]
        idle = np.full(int(top.sum()), np.inf)
        waits = None
    flag = np.asarray(h["flag"], np.int64)
    coll = (flag == 3) & (rc.mode != "gpu")
    return waits, dict(rank=rc.rank_of(np.asarray(h["file_id"], np.int64)), rk=np.where(coll, 2, 0),
                a=np.asarray(h["pid"], np.int64), b=np.asarray(h["tid"], np.int64), kind=np.where(coll, K_COLL, K_HOST),
                ts=np.asarray(h["ts_ns"], np.int64), dur=np.asarray(h["dur_ns"], np.int64), name=h["name"],
                corr=np.asarray(h["correlation"], np.int64), fid=np.asarray(h["file_id"], np.int64),
                ext=np.zeros(flag.size, np.int64), flag=flag, idle=idle.astype(np.float32))


def _event_calls(h: dict) -> dict[str, np.ndarray]:
    """The ``cudaEventRecord`` and ``cudaStreamWaitEvent`` runtime calls (with a correlation) among the runtime
    calls ``h`` (its ``rt`` column popped): ``file_id``, ``corr``, ``is_wait``, in (file, correlation) order, for
    :func:`.deps.event_wait_edges`: taken from the rows read here, not by one more read of the chunk's CPU ops
    (~4 ms of CPU per 100k runtime calls)."""
    rt = np.asarray(h.pop("rt"), bool)
    codes, names = h["name"]
    code = np.array([1 if n == "cudaEventRecord" else 2 if n == "cudaStreamWaitEvent" else 0
                     for n in names.to_pylist()], np.int8)
    sel = np.flatnonzero(rt & (code[codes] > 0))
    fid, corr = np.asarray(h["file_id"], np.int64)[sel], np.asarray(h["correlation"], np.int64)[sel]
    o = np.lexsort((corr, fid))
    return {"file_id": fid[o], "corr": corr[o], "is_wait": code[codes[sel[o]]] == 2}


def _fold_calls(h: dict, dev_keys: np.ndarray) -> dict:
    """The runtime calls ``h`` (``fetch_arrow`` columns) without those no edge can touch, plus ``idle`` (µs).

    A call is kept when it is a launch or a synchronize (``flag``), when device work was launched under its
    correlation (``dev_keys``), or when it starts :data:`WAIT_GAP_US` or more after the end of its thread's previous
    call (a wait may end there, :func:`.deps.wait_edges`). The others (``cudaStreamIsCapturing``, ``cudaEventQuery``,
    ``cudaStreamWaitEvent``, ...; about half the calls) join the gap before the next task, which keeps the
    thread's time; ``idle`` keeps each kept call's own idle time before it, for :func:`.deps.wait_edges`."""
    fid = np.asarray(h["file_id"], np.int64)
    ts, dur = np.asarray(h["ts_ns"], np.int64), np.asarray(h["dur_ns"], np.int64)
    thr = _thread_codes(fid, h["pid"], h["tid"])
    o = _task_order(thr, ts, np.zeros(ts.size, np.int8), -dur)  # np.lexsort((-dur, ts, thr)), one sort
    prev_end = np.empty(ts.size, np.float64)
    prev_end[o[1:]] = (ts[o[:-1]] + dur[o[:-1]]).astype(np.float64)
    idle = np.full(ts.size, np.inf)
    same = np.zeros(ts.size, bool)
    same[o[1:]] = thr[o[1:]] == thr[o[:-1]]
    idle[same] = (ts[same] - prev_end[same]) / 1e3
    del prev_end, same, o, thr
    corr = np.asarray(h["correlation"], np.int64)
    key = (fid << 40) + corr
    j = np.clip(np.searchsorted(dev_keys, key), 0, max(dev_keys.size - 1, 0))
    launched = (corr > 0) & (dev_keys[j] == key) if dev_keys.size else np.zeros(ts.size, bool)
    keep = (np.asarray(h["flag"], np.int64) != 0) | launched | (idle >= WAIT_GAP_US)
    out = {k: ((v[0][keep], v[1]) if k == "name" else v[keep]) for k, v in h.items()}
    out["idle"] = idle[keep]
    return out


def device_tasks(con, rc: RunClock, fids: list[int]) -> dict:
    """Task columns of the GPU runs' kernels, memcpys and memsets; NCCL kernels are collectives, and ``ext`` is the
    launching op's code (:func:`.labels.precision_classes`): 0 none or not fp32, bit 0 fp32 inputs, bit 1 on autocast's
    fp32 list, bit 2 in place."""
    k = fetch_arrow(con, f"""SELECT k.file_id, CASE k.cat WHEN 'gpu_memcpy' THEN 1 WHEN 'gpu_memset' THEN 2
               ELSE 0 END AS catc, k.name, k.device, k.stream, k.ts_ns, k.dur_ns, k.correlation, k.external_id,
               k.cat = 'kernel' AND k.external_id IS NOT NULL AS has_op
        FROM kernels k WHERE {in_files("k.file_id", fids, "$1")} AND k.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')""",
        [fids], hash_names=True)
    fid = np.asarray(k["file_id"], np.int64)
    opcode = _launching_op_codes(con, rc, fids, fid, np.asarray(k.pop("external_id"), np.int64),
                                 np.asarray(k.pop("has_op"), bool))
    cat = np.asarray(k["catc"], np.int64)
    # a collective: a kernel (catc 0) of a communication kernel's name, found per name, not per row (the list as a
    # join in the query cost 1-3 ms of CPU per 300k kernels)
    names = k["name"][1].to_pylist()
    comm = communication_names(con, names)
    is_comm = np.array([n in comm for n in names], bool)
    kind = np.where((cat == 0) & is_comm[k["name"][0]], K_COLL,
                    np.where(cat == 1, K_MEMCPY, np.where(cat == 2, K_MEMSET, K_KERNEL)))
    return dict(rank=rc.rank_of(np.asarray(k["file_id"], np.int64)), rk=np.ones(cat.size, np.int64),
                a=np.asarray(k["device"], np.int64), b=np.asarray(k["stream"], np.int64), kind=kind,
                ts=np.asarray(k["ts_ns"], np.int64), dur=np.asarray(k["dur_ns"], np.int64),
                name=k["name"], corr=np.asarray(k["correlation"], np.int64),
                fid=fid, ext=opcode,
                flag=np.zeros(cat.size, np.int64), idle=np.full(cat.size, np.inf, np.float32))


def _launching_op_codes(con, rc: RunClock, fids: list[int], fid: np.ndarray, ext: np.ndarray,
                        kernel: np.ndarray) -> np.ndarray:
    """Per device task (file ``fid``, External id ``ext``; ``kernel``: a kernel with an External id, not a copy or
    memset), the code of the op that launched it (kernel External id == cpu_op External id) when that op's inputs
    are fp32: 1 fp32, +2 on autocast's fp32 list, +4 in place (an update of fp32 state: parameters, gradients,
    optimizer moments, which autocast leaves fp32); 0 otherwise. The ops are read apart and matched here: a join in
    the kernels' query cost 80 ms on the scale set even with no op to match (no ``Input type`` without
    ``record_shapes``)."""
    m = con.execute(f"""SELECT c.file_id, c.external_id,
                   1 + CASE WHEN list_contains($1, c.name) THEN 2 ELSE 0 END
                     + CASE WHEN suffix(c.name, '_') OR c.name LIKE 'aten::%foreach%'
                                 OR c.name LIKE '%fused_adam%' THEN 4 ELSE 0 END AS code
            FROM cpu_ops c WHERE {in_files("c.file_id", fids, "$2")} AND c.cat = 'cpu_op'
              AND c.external_id IS NOT NULL
              AND (c.input_types LIKE '["float"%' OR c.input_types LIKE '[''float''%')""",
                    [list(matmath.AUTOCAST_FP32_OPS), fids]).fetchnumpy()
    out = np.zeros(fid.size, np.int64)
    m_fid = np.asarray(m["file_id"], np.int64)
    sel = np.flatnonzero(kernel)
    if not (m_fid.size and sel.size):
        return out
    m_ext, m_code = np.asarray(m["external_id"], np.int64), np.asarray(m["code"], np.int64)
    lo = min(int(m_ext.min()), int(ext[sel].min()))
    span = max(int(m_ext.max()), int(ext[sel].max())) - lo + 1
    if (max(int(m_fid.max()), int(fid[sel].max())) + 1) * span < 1 << 62:
        # (file, External id) as one int64 key: one stable sort of the ops, nearly sorted as they come (a lexsort
        # of the two columns cost 8 ms against 2 for the 256-rank set's 396k ops), one search for every kernel (a
        # loop over the files cost 0.1 s at 256 ranks)
        m_key = m_fid * span + (m_ext - lo)
        o = np.argsort(m_key, kind="stable")
        m_key, m_code = _or_runs(m_code[o], m_key[o])
        k_key = fid[sel] * span + (ext[sel] - lo)
        at = np.clip(np.searchsorted(m_key, k_key), 0, m_key.size - 1)
        hit = m_key[at] == k_key
        out[sel[hit]] = m_code[at[hit]]
        return out
    m_fid, m_ext, m_code = _by_op(m_fid, m_ext, m_code)
    by_file = sel[np.argsort(fid[sel], kind="stable")]  # ids too wide for one key: the kernels by file, once
    k_fid = fid[by_file]
    for f in np.unique(m_fid).tolist():  # per file (a rank): its ops' External ids, sorted by _by_op
        lo, hi = np.searchsorted(m_fid, [f, f + 1])
        a, b = np.searchsorted(k_fid, [f, f + 1])
        sub = by_file[a:b]
        at = np.clip(np.searchsorted(m_ext[lo:hi], ext[sub]), 0, hi - lo - 1)
        hit = m_ext[lo:hi][at] == ext[sub]
        out[sub[hit]] = m_code[lo:hi][at[hit]]
    return out


def _by_op(fid: np.ndarray, ext: np.ndarray, code: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(fid, ext, code)`` sorted by (file, External id), the codes of one (file, External id) OR-ed together.
    Sorted and grouped here, not by the query: the ops come nearly sorted from the store, and DuckDB's GROUP BY and
    ORDER BY of the 256-rank set's 396k fp32 ops cost 0.04 s of CPU more than this."""
    o = np.lexsort((ext, fid))
    return _or_runs(code[o], fid[o], ext[o])


def _or_runs(code: np.ndarray, *keys: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(*keys, code)`` with each run of rows equal in every key (sorted) made one, its codes OR-ed together."""
    new = np.zeros(code.size, bool)
    new[:1] = True
    for k in keys:
        new[1:] |= k[1:] != k[:-1]
    if new.all():
        return (*keys, code)
    at = np.flatnonzero(new)
    return (*(k[at] for k in keys), np.bitwise_or.reduceat(code, at))


def marker_tasks(st: dict[str, np.ndarray]) -> dict:
    """Task columns of the step markers: a begin and an end marker per ``ProfilerStep#N`` (``st``: the
    ``profiler_steps`` rows), on the step's thread; ``ext`` holds the step number."""
    import pyarrow as pa

    n_st = st["step"].size
    return dict(rank=np.concatenate([st["rank"], st["rank"]]).astype(np.int64),
                rk=np.zeros(2 * n_st, np.int64),
                a=np.concatenate([int_column(st["pid"])[0]] * 2),
                b=np.concatenate([int_column(st["tid"])[0]] * 2),
                kind=np.concatenate([np.full(n_st, K_BEGIN), np.full(n_st, K_END)]),
                ts=np.concatenate([st["start_ns"], st["end_ns"]]).astype(np.int64),
                dur=np.zeros(2 * n_st, np.int64),
                name=encode_names(pa.array([f"ProfilerStep#{s}" for s in st["step"].tolist()] * 2, pa.string())),
                corr=np.zeros(2 * n_st, np.int64), fid=np.concatenate([st["file_id"]] * 2).astype(np.int64),
                ext=np.concatenate([st["step"]] * 2).astype(np.int64), flag=np.zeros(2 * n_st, np.int64),
                idle=np.full(2 * n_st, np.inf, np.float32))


def order_tasks(parts: list[dict], rc: RunClock) -> Tasks:
    """All tasks in resource order: by resource (rank, host|stream|comm, pid|device, tid|stream; comm = the gloo
    threads), then start; at one start an end marker, then a begin marker, then the longest task first."""
    names, codes = unify_names([p.pop("name") for p in parts])
    # each part's column is released as soon as it is concatenated (the parts are the graph's size again)
    cols = {c: np.concatenate([p.pop(c) for p in parts]) for c in list(parts[0])}
    cols["name"] = codes
    n = cols["ts"].size
    rel = rc.rel_ns(cols["ts"], cols["rank"])
    is_coll_host = (cols["kind"] == K_COLL) & (cols["rk"] == 2)
    rk = np.where(is_coll_host, 2, cols.pop("rk"))  # the source's rk goes: only this one is read after the sort
    uniq, res = unique_rows(cols["rank"], rk, cols.pop("a"), cols.pop("b"))
    kind_order = np.select([cols["kind"] == K_END, cols["kind"] == K_BEGIN], [0, 1], 2)
    dur_ns = cols.pop("dur")
    del cols["ts"]  # read after the sort only for the collectives, as rel + the rank's shift (RunClock.abs_ns)
    order = _task_order(res, rel, kind_order, -dur_ns)
    del kind_order
    dur = dur_ns[order] / 1e3
    del dur_ns
    for c in cols:  # one column at a time, so that only one extra copy is alive
        cols[c] = cols[c][order]
    name_code = cols.pop("name")
    res, rel, rk = res[order], rel[order], rk[order]
    prefix = {0: "host", 1: "stream", 2: "comm"}
    res_names = [f"{prefix[int(r[1])]}:{int(r[2])}/{int(r[3])}" for r in uniq]
    start = rel / 1e3
    end = start + dur
    first = np.ones(n, dtype=bool)
    first[1:] = res[1:] != res[:-1]
    gap = np.zeros(n)
    gap[1:] = start[1:] - end[:-1]
    gap[first] = 0.0
    return Tasks(cols=cols, names=names, name_code=name_code, uniq=uniq, res=res, res_names=res_names, rk=rk,
                  rel=rel, start=start, dur=dur, end=end, first=first, gap=gap)


def _task_order(res: np.ndarray, rel: np.ndarray, kind_order: np.ndarray, neg_dur: np.ndarray) -> np.ndarray:
    """``np.lexsort((neg_dur, kind_order, rel, res))``: one stable sort of (resource, start) as one int64 key, then
    the few rows of equal key (a step's end and the next one's begin marker) sorted by the other two (four sorts of
    the graph's rows cost ~0.1 s at 256 ranks)."""
    if res.size == 0:
        return np.zeros(0, np.intp)
    lo = int(rel.min())
    span = int(rel.max()) - lo + 1
    if (int(res.max()) + 1) * span >= 1 << 62:  # no room in an int64: the four sorts
        return np.lexsort((neg_dur, kind_order, rel, res))
    key = res * span + (rel - lo)
    o = np.argsort(key, kind="stable")
    key = key[o]
    tie = key[1:] == key[:-1]
    del key
    if not tie.any():
        return o
    in_tie = np.zeros(o.size, bool)
    in_tie[1:] |= tie
    in_tie[:-1] |= tie
    pos = np.flatnonzero(in_tie)
    group = np.cumsum(np.concatenate([[True], ~tie]))[pos]
    sub = o[pos]  # ascending within a group (a stable sort): kept so among rows equal in all four keys
    o[pos] = sub[np.lexsort((neg_dur[sub], kind_order[sub], group))]
    return o


def step_markers(t: Tasks, st: dict[str, np.ndarray]) -> tuple[np.ndarray, list[tuple[int, int, int, int, bool]]]:
    """(per task: the step of each marker, -1 elsewhere; the steps as (rank, step, begin task, end task, counted))."""
    kind, rank, fid = t.kind, t.rank, t.cols["fid"]
    step = np.full(t.n, -1, dtype=np.int64)
    is_marker = (kind == K_BEGIN) | (kind == K_END)
    step[is_marker] = t.cols["ext"][is_marker]
    steps: list[tuple[int, int, int, int, bool]] = []
    e_by = {(int(rank[i]), int(step[i]), int(fid[i])): int(i) for i in np.flatnonzero(kind == K_END)}
    counted = {(int(r), int(s), int(f)): bool(c) for r, s, f, c in zip(
        st["rank"].tolist(), st["step"].tolist(), st["file_id"].tolist(), st["counted"].tolist(), strict=True)}
    for i in np.flatnonzero(kind == K_BEGIN).tolist():
        key = (int(rank[i]), int(step[i]), int(fid[i]))
        if key in e_by:
            steps.append((key[0], key[1], i, e_by[key], counted.get(key, False)))
    return step, steps


def steps_by_anchor(t: Tasks, steps: list[tuple[int, int, int, int, bool]], anchor: np.ndarray,
                     step: np.ndarray) -> np.ndarray:
    """Each task's step: the step (of its rank) that its anchor time (a device task's launch) falls in; markers
    keep their own, tasks in no step get -1."""
    rank = t.rank
    is_marker = (t.kind == K_BEGIN) | (t.kind == K_END)
    sb = np.array([(r, t.start[b], t.start[e], s) for r, s, b, e, _ in steps])
    o = np.lexsort((sb[:, 1], sb[:, 0]))
    sb = sb[o]
    key_s = sb[:, 0] * 1e12 + sb[:, 1]
    q = rank * 1e12 + anchor
    j = np.searchsorted(key_s, q, side="right") - 1
    jc = np.clip(j, 0, None)
    inside = (j >= 0) & (sb[jc, 0] == rank) & (anchor < sb[jc, 2])
    return np.where(is_marker, step, np.where(inside, sb[jc, 3].astype(np.int64), -1))


def _name_flags(names) -> np.ndarray:
    """Per distinct name (an Arrow string array, :func:`.source.fetch_arrow`), a host row's ``flag``: 1 a
    synchronize (:data:`SYNC_CALLS`), 2 a launch (:data:`LAUNCH_CALLS`), 3 a gloo range (``gloo:*``), else 0. Found
    per name, not per row: in the query, each list was a join of its own (5-9 ms of CPU per 300k runtime calls)."""
    sync, launch = set(SYNC_CALLS), set(LAUNCH_CALLS)
    return np.array([1 if n in sync else 2 if n in launch else 3 if n is not None and n.startswith("gloo:") else 0
                     for n in names.to_pylist()], np.int64)


def _seg_cummax_excl(values: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` (int64 ≥ 0, < 2^T_SHIFT) over the previous rows of the same ``seg`` (sorted),
    -1 for a segment's first row."""
    key = seg.astype(np.int64) << T_SHIFT
    run = np.maximum.accumulate(values + key)
    prev = np.empty_like(run)
    if run.size:
        prev[0] = -1
        prev[1:] = run[:-1]
        same = np.empty(run.size, dtype=bool)
        same[0] = False
        same[1:] = seg[1:] == seg[:-1]
        prev = np.where(same, prev - key, -1)
    return prev


def _thread_codes(fid, pid, tid) -> np.ndarray:
    return dense_codes(np.asarray(fid, np.int64), int_column(pid)[0], int_column(tid)[0])
