"""Collective instances matched across ranks (module docstring of :mod:`traceanalyze.replay.graph`): by Comms Id,
else (process group, Seq), else the per-step ordinal; complete or not, and each one's transfer time."""

from __future__ import annotations

import json

import numpy as np

from traceanalyze.metrics.collectives import Calls, busbw_factor, collective_calls, int_column
from traceanalyze.replay.graph.model import K_COLL, Graph
from traceanalyze.replay.graph.source import RunClock, unique_rows


def match_collectives(con, g: Graph, rc: RunClock, coll_fid: np.ndarray, coll_ts: np.ndarray,
                      calls: Calls | None = None) -> None:
    """Instances across ranks (the package docstring): fills ``g.inst*``, drops incomplete ones from the rendezvous.
    ``calls``: the run's collective calls when the caller has them (:func:`_collective_meta`)."""
    tasks = np.flatnonzero(g.kind == K_COLL)
    if tasks.size == 0:
        return
    meta = _task_meta(_collective_meta(con, rc.run_id, rc.mode, calls), coll_fid, coll_ts, rc.origin)
    # Comms Id when every call has one (identical on all participants by construction, kineto #1286), else
    # (process group, Seq) when every call has a Seq, else the per-step order. Decided over the tasks that have a
    # call: kernels launched with no c10d call (DeepEP, NVSHMEM, custom all-reduce) pair by their own per-step
    # order and never send the NCCL calls beside them to it
    called = meta["called"]
    use_cid = bool(called.any()) and all(c is not None for c in meta["comms_id"][called].tolist())
    use_seq = not use_cid and bool(called.any()) and bool(meta["has_seq"][called].all())
    rank = g.rank[tasks]
    start, end = g.start[tasks], g.start[tasks] + g.dur[tasks]
    inst, n_inst, by = _instances(rank, g.step[tasks], start, meta, use_seq, use_cid)
    complete, coll_name, inst_bytes, inst_n, reasons = _check_instances(g, rank, inst, n_inst, meta)
    g.inst[tasks] = inst
    g.inst_all = inst
    g.inst_transfer = _instance_transfer(inst, n_inst, complete, start, end)
    g.inst_complete, g.inst_coll = complete, coll_name
    g.inst_bytes, g.inst_n = inst_bytes, inst_n
    g.inst_matched_by = by
    # incomplete instances keep their measured durations: no rendezvous
    inc = ~complete[inst]
    g.inst[tasks[inc]] = -1
    n_inc = int((~complete).sum())
    if n_inc:
        g.unmatched.append(_unmatched_note(reasons, n_inc, n_inst))
        g.partial = reasons["peers"] > 0


def _collective_meta(con, run_id: int, mode: str, calls: Calls | None = None) -> dict[str, np.ndarray]:
    """Per collective call (file, start): normalised name, bytes, process group, Seq, group ranks, Comms Id
    (:func:`traceanalyze.metrics.collectives.collective_calls`; CPU runs carry no process group). ``calls``: the
    analyses' (the same query), when they carry the process-group columns a GPU run needs; else read here."""
    if calls is None or (calls.groups is not None) != (mode == "gpu"):
        calls = collective_calls(con, run_id, mode, groups=mode == "gpu")
    n = calls.op.size
    if calls.groups is not None:
        seq, has_seq = int_column(calls.groups["seq"])
        pg = np.asarray(calls.groups["pg_name"], dtype=object)
        pg_ranks = np.asarray(calls.groups["pg_ranks"], dtype=object)
        cid = calls.groups["comms_id"]
        comms_id = np.array([c if c not in (None, "") else None for c in cid.tolist()], dtype=object)
    else:
        seq, has_seq = np.zeros(n, np.int64), np.zeros(n, bool)
        pg = np.full(n, None, dtype=object)
        pg_ranks = np.full(n, None, dtype=object)
        comms_id = np.full(n, None, dtype=object)
    return {"fid": calls.file_id, "ts": calls.start, "op": calls.op, "bytes": calls.nbytes.astype(np.int64),
            "seq": seq, "has_seq": has_seq, "pg": pg, "pg_ranks": pg_ranks, "comms_id": comms_id}


def _task_meta(meta: dict[str, np.ndarray], fid: np.ndarray, ts: np.ndarray, origin: int) -> dict[str, np.ndarray]:
    """Per collective task, its call's :func:`_collective_meta` (looked up by file and start; defaults where none
    matches): ``op``, ``bytes``, ``seq``, ``has_seq``, ``pg`` ("" for none), ``pg_ranks``, ``comms_id`` and
    ``called`` (whether the task's call was found with a record: a process group, Seq or Comms Id)."""
    mkey = np.stack([np.asarray(meta["fid"], np.int64), np.asarray(meta["ts"], np.int64)], axis=1)  # not per row
    order = np.lexsort((mkey[:, 1], mkey[:, 0])) if mkey.size else np.zeros(0, np.int64)
    mk_sorted = (mkey[order, 0] << 44) + (mkey[order, 1] - origin) if mkey.size else np.zeros(0, np.int64)
    q = (fid.astype(np.int64) << 44) + (ts - origin)
    j = np.clip(np.searchsorted(mk_sorted, q), 0, max(mk_sorted.size - 1, 0))
    found = mk_sorted.size > 0 and True
    hit = (mk_sorted[j] == q) if found else np.zeros(fid.size, bool)
    mi = order[j] if found else np.zeros(fid.size, np.int64)

    def col(name, default):
        v = np.asarray(meta[name])[mi] if found else np.full(fid.size, default)
        return np.where(hit, v, default)

    pg, comms_id, has_seq = col("pg", None), col("comms_id", None), col("has_seq", False).astype(bool)
    # a record of the call: a process group, a Seq or a Comms Id (kernels of DeepEP, NVSHMEM, ... carry none)
    called = hit & (has_seq | np.array([bool(p) or c is not None for p, c in zip(pg.tolist(), comms_id.tolist(),
                                                                               strict=True)], dtype=bool))
    return {"op": col("op", "unknown"), "bytes": col("bytes", 0).astype(np.int64),
            "seq": col("seq", 0).astype(np.int64), "has_seq": has_seq,
            "pg": np.array([p if p else "" for p in pg.tolist()], dtype=object),
            "pg_ranks": col("pg_ranks", None), "comms_id": comms_id, "called": called}


_BY = {"cid": "Comms Id", "seq": "process group and Seq", "ord": "per-step ordinal", "bare": "per-step ordinal"}


def _instances(rank: np.ndarray, step: np.ndarray, start: np.ndarray, meta: dict[str, np.ndarray], use_seq: bool,
               use_cid: bool) -> tuple[np.ndarray, int, list[str]]:
    """(per collective task, its instance; the number of instances; how each instance was matched): calls of one
    Comms Id (``use_cid``), else of one (process group, Seq) (``use_seq``), else the n-th call of a process group
    in one profiler step on each rank. A task with no call is the n-th call-less communication kernel of its step
    on each rank. Instances are numbered in order of first appearance among the tasks."""
    pg, seq, comms_id, called = meta["pg"], meta["seq"], meta["comms_id"], meta["called"]
    n = rank.size
    o = np.lexsort((start, step, pg, rank))
    # each key as four integers (kind, then its fields), strings as codes: one pass of NumPy, not a loop of tuples.
    # The per-step ordinals count along ``o`` per (rank, group, step); group "bare" for call-less tasks shares its
    # counter with a process group of that name, as the keys (rank, name, step) did
    names: dict = {"bare": 0}
    pgc = np.array([names.setdefault(p, len(names)) for p in pg.tolist()], np.int64) if n else np.zeros(0, np.int64)
    ord_mode = called & (not use_cid) & (not use_seq)
    counted = ~called | ord_mode
    grp = np.where(called, pgc, 0)
    ordinal = np.zeros(n, np.int64)
    c = o[counted[o]]  # the counted tasks in the order of o
    if c.size:
        gid = unique_rows(rank.astype(np.int64)[c], grp[c], step.astype(np.int64)[c])[1]
        by = np.argsort(gid, kind="stable")
        gs = gid[by]
        head = np.ones(gs.size, bool)
        head[1:] = gs[1:] != gs[:-1]
        at = np.flatnonzero(head)
        ordinal[c[by]] = np.arange(gs.size) - np.repeat(at, np.diff(np.append(at, gs.size)))
    kind = np.where(~called, 0, 1 if use_cid else 2 if use_seq else 3)
    cids: dict = {}
    f1 = np.where(~called, step, 0).astype(np.int64)
    if use_cid:
        f1[called] = [cids.setdefault(str(x), len(cids)) for x in comms_id[called].tolist()]
    else:
        f1[called] = pgc[called]
    f2 = np.where(~called, ordinal, 0 if use_cid else (seq if use_seq else step)).astype(np.int64)
    f3 = np.where(ord_mode, ordinal, 0).astype(np.int64)
    code = unique_rows(kind.astype(np.int64), f1, f2, f3)[1] if n else np.zeros(0, np.int64)
    # instances numbered in order of first appearance among the tasks
    _, first = np.unique(code, return_index=True)
    renum = np.empty(first.size, np.int64)
    renum[np.argsort(first, kind="stable")] = np.arange(first.size)
    kinds = ("bare", "cid", "seq", "ord")
    return renum[code], int(first.size), [_BY[kinds[int(k)]] for k in kind[np.sort(first)].tolist()]


def _check_instances(g: Graph, rank: np.ndarray, inst: np.ndarray, n_inst: int, meta: dict[str, np.ndarray]
                     ) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, dict[str, int]]:
    """(complete, name, bytes, group size) per instance and the count of incomplete ones by reason. Complete: one
    call on each rank of its group, every one in the folder, not a send/recv, name and bytes alike (TraceLens
    ``strict_metadata_check``)."""
    op, nbytes, pg_ranks = meta["op"], meta["bytes"], meta["pg_ranks"]
    present = set(g.ranks)
    rank = rank.astype(np.int64)
    first = np.unique(inst, return_index=True)[1]  # each instance's first task (instances number 0..n_inst-1)
    coll_name: list[str] = [str(x) for x in op[first].tolist()]
    inst_bytes = np.asarray(nbytes[first], np.int64)
    cnt = np.bincount(inst, minlength=n_inst)
    # a rank twice in one instance: equal neighbours once the tasks are sorted by (instance, rank)
    o = np.lexsort((rank, inst))
    twice = (inst[o][1:] == inst[o][:-1]) & (rank[o][1:] == rank[o][:-1])
    duplicate = np.bincount(inst[o][1:][twice], minlength=n_inst) > 0
    # the group each instance expects (its first call's ranks, else the world): per distinct group, whether every
    # rank is in the folder, its size, and whether each task's rank is in it
    inst_n = np.zeros(n_inst, np.int64)
    size, missing = np.zeros(n_inst, np.int64), np.zeros(n_inst, bool)
    outside = np.zeros(rank.size, bool)
    texts = [x if x is None or isinstance(x, str) else repr(x) for x in pg_ranks[first].tolist()]
    codes: dict = {}
    grp = np.array([codes.setdefault(x, len(codes)) for x in texts], np.int64)
    task_grp = grp[inst]
    # the instances and the tasks of each group as slices of one sort: a hostile trace may name a group per call,
    # and a mask per group over every task would be groups x tasks
    by_i, by_t = np.argsort(grp, kind="stable"), np.argsort(task_grp, kind="stable")
    at_i = np.searchsorted(grp[by_i], np.arange(len(codes) + 1))
    at_t = np.searchsorted(task_grp[by_t], np.arange(len(codes) + 1))
    for k in range(len(codes)):
        ii, tt = by_i[at_i[k]:at_i[k + 1]], by_t[at_t[k]:at_t[k + 1]]
        expected = _group_ranks(pg_ranks[first[ii[0]]]) or list(range(g.world_size))
        inst_n[ii], size[ii], missing[ii] = len(expected), len(set(expected)), bool(set(expected) - present)
        outside[tt] = ~np.isin(rank[tt], list(set(expected)))
    # ranks distinct: set(ranks) == set(expected) when none is outside it and there are as many
    peers = ~duplicate & (missing | (np.bincount(inst, weights=outside, minlength=n_inst) > 0) | (cnt != size))
    p2p = ~duplicate & ~peers & np.array([c == "send_recv" for c in coll_name], bool)
    # name and bytes of every call alike those of the first
    op_code = np.array([str(x) for x in op.tolist()], dtype=object)
    differs = (op_code != op_code[first][inst]) | (np.asarray(nbytes, np.int64) != inst_bytes[inst])
    mismatch = ~duplicate & ~peers & ~p2p & (np.bincount(inst, weights=differs, minlength=n_inst) > 0)
    complete = ~(duplicate | peers | p2p | mismatch)
    reasons = {"peers": int(peers.sum()), "mismatch": int(mismatch.sum()), "duplicate": int(duplicate.sum()),
               "p2p": int(p2p.sum())}
    return complete, coll_name, inst_bytes, inst_n, reasons


def _instance_transfer(inst: np.ndarray, n_inst: int, complete: np.ndarray, start: np.ndarray, end: np.ndarray
                       ) -> np.ndarray:
    """Per instance (µs): the median over participants of (end − latest start); an incomplete instance, the median
    measured duration; the shortest duration where the median is not positive."""
    latest = np.full(n_inst, -np.inf)
    np.maximum.at(latest, inst, start)
    after = np.where(complete[inst], end - latest[inst], end - start)
    med = _group_median(inst, after, n_inst)
    shortest = np.full(n_inst, np.inf)
    np.minimum.at(shortest, inst, end - start)
    return np.where(med > 0, med, shortest)


def _group_median(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Median of ``values`` per group id 0..n-1 (NaN for an empty group)."""
    o = np.lexsort((values, group))
    g, v = group[o], values[o]
    cnt = np.bincount(g, minlength=n)
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    lo = first + (cnt - 1) // 2
    hi = first + cnt // 2
    ok = cnt > 0
    out = np.full(n, np.nan)
    out[ok] = (v[np.clip(lo, 0, v.size - 1)][ok] + v[np.clip(hi, 0, v.size - 1)][ok]) / 2
    return out


def _group_ranks(text) -> list[int] | None:
    if not text:
        return None
    try:
        v = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v) and len(v) < 30:
        return [int(x) for x in v]
    return None  # truncated at 30 entries by kineto, or absent: the run's world size then


def _unmatched_note(reasons: dict[str, int], n_inc: int, n_inst: int) -> str:
    """The replay's note on the instances that kept their measured duration, by reason."""
    why = []
    if reasons["peers"]:
        why.append(f"{reasons['peers']} whose peers are not all in the folder")
    if reasons["mismatch"]:
        why.append(f"{reasons['mismatch']} whose name or size differ across ranks (the per-step order slipped)")
    if reasons["duplicate"]:
        why.append(f"{reasons['duplicate']} matched twice on one rank")
    if reasons["p2p"]:
        why.append(f"{reasons['p2p']} point-to-point send/recv (pairing by peer is not implemented)")
    return f"{n_inc} of {n_inst} collective instances kept their measured duration: " + "; ".join(why)


def ideal_transfer_us(g: Graph, link_gbps: float) -> np.ndarray:
    """Per instance: bytes × busbw factor ÷ link bandwidth (µs), nccl-tests ``PERFORMANCE.md``; 0 when the bytes
    are unknown."""
    f = np.array([busbw_factor(c, int(n)) for c, n in zip(g.inst_coll, g.inst_n.tolist(), strict=True)])
    return g.inst_bytes * f / (link_gbps * 1e9) * 1e6 if f.size else np.zeros(0)
