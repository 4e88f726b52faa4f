"""The host what-ifs on GPU runs: ``fused_optimizer`` (a per-parameter optimizer loop as PyTorch's fused kernel:
:mod:`traceanalyze.replay.optimizer`), ``no_launch_overhead`` (CUDA graphs: the kernel-launch calls and the host
time between them gone) and ``no_host_sync`` (no blocking wait for the GPU in the steps: the host runs ahead,
replayed on the graph without those waits, :func:`without_host_syncs`, each step a two-stage pipeline,
:func:`pipelined_step_times`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from traceanalyze.replay import graph as gr
from traceanalyze.replay import optimizer, simulate
from traceanalyze.replay.scenarios.base import MIN_SAVING_US, Arrays, Scenario, less

SYNC_EDGE = gr.DEP_TYPES.index("gpu_cpu_sync")
ANCHOR_TOLERANCE_US = 1.0  # a side-stream task measured to start within this of a busiest-stream task's end follows it


def _rw_launch(g, d, cg, tr, ctx):
    """CUDA graphs (or torch.compile mode="reduce-overhead"): the host time between consecutive launches and the
    launch calls themselves go; one graph launch per step remains, a few µs."""
    if g.prec_class is not None:
        d = np.where(g.prec_class == gr.P_LAUNCH, 0.0, d)
    return d, less(cg, g.gap_cover["launch"]), tr


def _rw_fused(g, d, cg, tr, ctx):
    """A fused optimizer (``torch.optim.AdamW(fused=True)``): the per-parameter loop under ``Optimizer.step``
    becomes the few ``multi_tensor_apply`` launches of PyTorch's fused kernel, and the optimizer's kernels the time
    its bytes take at HBM bandwidth (:mod:`.optimizer`: the model, its constants and their sources)."""
    return (*optimizer.rewrite(g, d, cg, ctx["opt"]), tr)


def _rw_host_sync(g, d, cg, tr, ctx):
    """The blocking waits go from the graph itself (:func:`without_host_syncs`); a copy call that holds the host
    (a pageable ``cudaMemcpy*``, whose host stages the bytes) becomes an asynchronous one from pinned memory: it
    returns once enqueued, at the median cost of the run's launch calls, and the copy engine moves the bytes as
    measured on the GPU (CUDA C++ Best Practices Guide, "Pinned Memory" and "Asynchronous and Overlapping
    Transfers")."""
    copies, cost = _host_copies(g, ctx)
    if copies.size:
        d = d.copy()
        d[copies] = np.minimum(d[copies], cost)
    return d, cg, tr


def _host_copies(g: gr.Graph, ctx: dict | None = None) -> tuple[np.ndarray, float]:
    """(task ids of the host's copy calls in the steps, ``*Memcpy*``; the median duration of the run's launch calls,
    µs: what an asynchronous copy call costs the host). Kept in ``ctx`` (``host_copies``) for the same graph: asked
    for by the test of the scenario, its rewrite and ``all``'s (a search of every task each time)."""
    held = ctx.get("host_copies") if ctx is not None else None
    if held is not None and held[0] is g:
        return held[1], held[2]
    copies, cost = _copy_calls(g)
    if ctx is not None:
        ctx["host_copies"] = (g, copies, cost)
    return copies, cost


def _copy_calls(g: gr.Graph) -> tuple[np.ndarray, float]:
    """:func:`_host_copies`, searched."""
    launch = g.dep_src[g.dep_type == gr.DEP_TYPES.index("launch")]
    launch = launch[g.kind[launch] == gr.K_HOST]
    codes = gr.name_codes(g, "memcpy")
    if not (launch.size and codes):
        return np.zeros(0, np.int64), 0.0
    copies = np.flatnonzero((g.kind == gr.K_HOST) & (g.step >= 0) & np.isin(g.name_code, codes))
    return copies, float(np.median(g.chain_dur[launch]))


def _host_sync_edges(g: gr.Graph) -> np.ndarray:
    """Per explicit edge: whether it is a blocking GPU->CPU wait (``gpu_cpu_sync``: a synchronize call, a blocking
    copy) of a profiler step."""
    sync = g.dep_type == SYNC_EDGE
    if sync.any():
        sync &= g.step[g.dep_dst] >= 0
    return sync


def without_host_syncs(g: gr.Graph) -> gr.Graph:
    """``g`` without its steps' blocking GPU->CPU waits (:func:`_host_sync_edges`): the host goes on launching while
    the GPU works (CUDA's asynchronous launch queue). The order the wait kept on the GPU stays: each device task the
    host waited for still precedes the first task of every stream of its rank that started after the wait (as a
    stream-wait event would), since the next step's kernels need this one's results (:func:`_sync_order_edges`);
    and the work of each rank's other streams (collectives, copies) starts no earlier than the busiest stream's
    work it was measured to follow, since what triggers it there (gradients ready, data ready) is a cross-stream
    wait the trace does not record (:func:`_side_stream_anchors`). A shallow copy: only the edge arrays are new.
    Every rank at once, in a few sorts and searches over the tasks (rank by rank over arrays of every rank, it
    grew with ranks²: 35 s of a 1,024-rank report)."""
    sync = _host_sync_edges(g)
    dev = np.isin(g.kind, gr.GPU_KINDS)
    w_src, w_dst = _sync_order_edges(g, dev, sync)
    a_src, a_dst = _side_stream_anchors(g, dev)
    s2 = np.concatenate([g.dep_src[~sync], w_src, a_src])
    d2 = np.concatenate([g.dep_dst[~sync], w_dst, a_dst])
    n_old = int((~sync).sum())
    end = np.concatenate([g.dep_end[~sync], np.ones(s2.size - n_old, dtype=g.dep_end.dtype)])
    off = np.concatenate([g.dep_off[~sync], np.zeros(s2.size - n_old, dtype=g.dep_off.dtype)])
    typ = np.concatenate([g.dep_type[~sync], np.full(s2.size - n_old, gr.DEP_TYPES.index("event_wait"),
                                                     dtype=g.dep_type.dtype)])
    o = np.argsort(d2, kind="stable")  # the replay groups edges by destination
    it = g.dep_src.dtype  # the graph's task ids (the new edges' are int64): held through the what-ifs' peak
    return dataclasses.replace(g, dep_src=s2[o].astype(it, copy=False), dep_dst=d2[o].astype(it, copy=False),
                               dep_end=end[o], dep_off=off[o], dep_type=typ[o])


def _sync_order_edges(g: gr.Graph, dev: np.ndarray, sync: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, destination) edges, end to start: for each blocking wait (``sync``, per explicit edge) and each
    stream of its rank, the awaited device task precedes the stream's first task that starts at or after the task
    after the wait (none when no task of the stream does). Ordered by stream, then wait."""
    src, dst = g.dep_src[sync], g.dep_dst[sync]
    streams = np.unique(g.res[dev])
    lo, hi = np.searchsorted(g.res, streams), np.searchsorted(g.res, streams, side="right")
    by_rank = np.lexsort((streams, g.rank[lo]))  # each rank's streams, in resource order
    ranks = g.rank[lo][by_rank]
    a, b = np.searchsorted(ranks, g.rank[dst]), np.searchsorted(ranks, g.rank[dst], side="right")
    wait = np.repeat(np.arange(src.size), b - a)  # one (wait, stream of its rank) pair per row
    k = by_rank[np.repeat(a, b - a) + np.arange(wait.size) - np.repeat(np.cumsum(b - a) - (b - a), b - a)]
    o = np.lexsort((wait, k))
    wait, k = wait[o], k[o]
    used = np.unique(k)
    idx, seg = _ranges(lo[used], hi[used])
    qseg = np.searchsorted(used, k)
    j = _search_segments(g.start[idx], seg, g.start[dst[wait]], qseg, "left")
    ok = j < (hi - lo)[k]
    return src[wait][ok].astype(np.int64), (lo[k] + j)[ok].astype(np.int64)


def _side_stream_anchors(g: gr.Graph, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, destination) edges, end to start: each device task of a step on a rank's other streams starts no
    earlier than the end of the busiest stream's last task that had ended when it was measured to start
    (:func:`without_host_syncs`). The busiest stream holds the most device time (ties: the first); a rank with
    one stream has none."""
    busy = np.bincount(g.res[dev], weights=g.dur[dev], minlength=int(g.res.max(initial=0)) + 1)
    streams, first = np.unique(g.res[dev], return_index=True)
    rank = g.rank[np.flatnonzero(dev)[first]]
    o = np.lexsort((streams, -busy[streams], rank))  # per rank, the busiest stream first
    head = np.flatnonzero(np.r_[True, rank[o][1:] != rank[o][:-1]]) if o.size else np.zeros(0, np.int64)
    several = np.diff(np.append(head, o.size)) >= 2
    main_rank, main = rank[o][head][several], streams[o][head][several]  # ranks ascending
    if main.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cand = np.flatnonzero(dev & (g.step >= 0))
    of_rank = np.full(int(g.rank.max(initial=0)) + 1, -1, np.int64)  # rank -> its entry in main (a gather per task)
    of_rank[main_rank] = np.arange(main.size)
    at = of_rank[g.rank[cand]]
    mine = at >= 0
    mine[mine] = main[at[mine]] != g.res[cand[mine]]
    side = cand[mine]
    by_res = np.unique(main)
    lo, hi = np.searchsorted(g.res, by_res), np.searchsorted(g.res, by_res, side="right")
    idx, seg = _ranges(lo, hi)
    ends = _segment_cummax(g.start[idx] + g.dur[idx], seg)
    qseg = np.searchsorted(by_res, main)[at[mine]]  # each side task's main stream, as a segment of by_res
    j = _search_segments(ends, seg, g.start[side] + ANCHOR_TOLERANCE_US, qseg, "right") - 1
    ok = j >= 0
    return (lo[qseg] + j)[ok].astype(np.int64), side[ok].astype(np.int64)


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the indices of the ranges ``[lo, hi)`` one after another, the range each one is in) (int64)."""
    n = (hi - lo).astype(np.int64)
    seg = np.repeat(np.arange(n.size), n)
    return np.arange(seg.size) + np.repeat(lo.astype(np.int64) - (np.cumsum(n) - n), n), seg


def _search_segments(v: np.ndarray, vseg: np.ndarray, q: np.ndarray, qseg: np.ndarray, side: str) -> np.ndarray:
    """Per query ``q[i]``: ``np.searchsorted(v[vseg == qseg[i]], q[i], side)``, every query in one search. ``vseg``
    ascending, ``v`` ascending within each segment. The values are ranked among ``v``'s own (exactly: equal values,
    equal ranks), so that (segment, rank) is one sortable integer; a query's rank is where it would go among them
    (``side``), so the search over those integers counts the same values. Only ``v`` is sorted for the ranks: the
    queries (every side-stream task) may be many more."""
    u = np.unique(v)
    m = u.size + 1
    kv = vseg.astype(np.int64) * m + np.searchsorted(u, v)
    kq = qseg.astype(np.int64) * m + np.searchsorted(u, q, side=side)
    first = np.searchsorted(vseg, np.arange(int(qseg.max(initial=-1)) + 1))  # each segment's first value
    return np.searchsorted(kv, kq) - first[qseg]


def _segment_cummax(v: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """The running maximum of ``v`` restarted at each segment (``seg`` ascending): exactly the floats of
    ``np.maximum.accumulate`` per segment, from their ranks offset by segment; without a NaN, the running maximum
    of (segment, value) as complex numbers, which NumPy compares by their real part first (no ranking sort)."""
    if v.size and not np.isnan(v).any():
        return np.maximum.accumulate(simulate.pair_keys(seg, v)).imag.copy()
    u, inv = np.unique(v, return_inverse=True)
    off = seg.astype(np.int64) * max(u.size, 1)
    return u[np.maximum.accumulate(off + inv.reshape(-1)) - off] if v.size else v.copy()


def pipelined_step_times(g: gr.Graph, rp: simulate.Replay) -> dict[tuple[int, int], float]:
    """(rank, step) -> replayed step time when the host runs ahead of the GPU (µs): the longest of the host's step
    (its markers), the GPU's span of the step's device work (first start to last end, every stream of the rank) and
    the time from the end of the rank's device work of the step before to the end of this step's. Without a wait
    for the GPU a step's host work overlaps the GPU's, so the slower of the two sets the pace: the steady state of
    a two-stage pipeline (CUDA C++ Programming Guide, "Asynchronous Concurrent Execution"). The GPU work of two
    steps is never overlapped: the next step's kernels need this one's results (the optimizer's update, the
    reduced gradients), which a trace without cross-stream event waits does not show."""
    dev = np.flatnonzero(np.isin(g.kind, gr.GPU_KINDS) & (g.step >= 0))
    width, keys, inv = gr.rank_step_groups(g, dev)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    if dev.size:
        ends = np.full(keys.size, -np.inf)
        starts = np.full(keys.size, np.inf)
        np.maximum.at(ends, inv, rp.end[dev])
        np.minimum.at(starts, inv, rp.start[dev])
        last = dict(zip(keys.tolist(), ends.tolist(), strict=True))
        first = dict(zip(keys.tolist(), starts.tolist(), strict=True))
    out = {}
    for r, s, b, e, _ in g.steps:
        t = float(rp.start[e] - rp.start[b])
        k = r * width + s
        if k in last and np.isfinite(last[k]) and np.isfinite(first[k]):
            t = max(t, last[k] - first[k], last[k] - last.get(k - 1, float(rp.start[b])))
        out[(r, s)] = t
    return out


def _sync_saving_bound(g: gr.Graph, arrs: Arrays, d0: np.ndarray, floor: dict[int, float], est: dict[int, float],
                       steps) -> float:
    """The most ``no_host_sync`` can save, % of the step without the profiler (``est``, per step): the median over
    the counted steps (``steps``) of the smaller of two bounds. The step less its floor under the rewrite
    (``floor``, per step: no step beats its busiest resource's work, however the host and the GPU overlap); and,
    over the ranks, the most time the host spends blocked in the step's waits plus what the rewrite takes off its
    copy calls (a synced step is the host's work plus its wait; running ahead overlaps the two, so it gains at most
    the wait; a rank that waits for another in a collective gains at most what that one gains)."""
    calls = np.unique(g.dep_dst[_host_sync_edges(g)] - 1)
    calls = calls[calls >= 0]
    gain = np.zeros(g.start.size)
    gain[calls] = np.clip(g.dur[calls] - g.chain_dur[calls], 0, None)  # the blocked part (graph._sync_edges)
    gain += np.clip(d0 - arrs[0], 0, None)
    sel = np.flatnonzero((gain > 0) & (g.step >= 0))
    width, keys, inv = gr.rank_step_groups(g, sel)
    per: dict[int, float] = {}
    if sel.size:
        tot = np.bincount(inv, weights=gain[sel])
        for k, v in zip(keys.tolist(), tot.tolist(), strict=True):
            per[k % width] = max(per.get(k % width, 0.0), v)
    vals = [100 * min(est[s] - floor.get(s, 0.0), per.get(s, 0.0)) / est[s] for s in steps if est.get(s)]
    return max(0.0, float(np.median(vals))) if vals else 100.0


def _host_sync_applies(g: gr.Graph, ctx: dict) -> bool:
    if g.mode != "gpu":
        return False
    copies, cost = _host_copies(g, ctx)
    return bool(_host_sync_edges(g).any()) or float(np.clip(g.chain_dur[copies] - cost, 0, None).sum()) >= \
        MIN_SAVING_US


FUSED_OPTIMIZER = Scenario(
    name="fused_optimizer", cause="config: an optimizer that launches kernels per parameter (foreach=False)",
    rewrite=_rw_fused, applies=lambda g, ctx: bool((ctx.get("opt") or {}).get("applies")),
    why_not=lambda g, ctx: (ctx.get("opt") or {}).get("why") or "a CPU run launches no optimizer kernels",
    assumptions=lambda ctx, g: optimizer.assumptions(ctx["opt"], g, ctx["d0"]), kinds=("host_optimizer",),
    host_time=True)
NO_LAUNCH_OVERHEAD = Scenario(
    name="no_launch_overhead", cause="config: kernel-launch overhead", rewrite=_rw_launch,
    applies=lambda g, ctx: g.mode == "gpu" and float(g.gap_cover["launch"].sum()) >= MIN_SAVING_US,
    why_not=lambda g, ctx: ("a CPU run launches no kernels" if g.mode != "gpu" else
                            "no host gap between kernel launches in the replayed steps"),
    assumptions=lambda ctx, g: ("CUDA graphs: the kernel-launch calls and the host time between consecutive "
                                "launches removed (one graph launch per step remains); the host's other work, the "
                                "GPU's kernels unchanged"),
    kinds=("launch_bound",), also_fixes=("host_optimizer", "host_bound"), host_time=True)
NO_HOST_SYNC = Scenario(
    name="no_host_sync", cause="config: the host waits for the GPU (blocking syncs)", rewrite=_rw_host_sync,
    applies=_host_sync_applies,
    why_not=lambda g, ctx: ("a CPU run has no GPU to wait for" if g.mode != "gpu" else
                            "no blocking wait for the GPU (synchronize, blocking copy) in the replayed steps"),
    assumptions=lambda ctx, g: (
        "every blocking wait for the GPU in the steps removed (no synchronize or .item() each step, pinned memory "
        "with non_blocking=True): the host queues the next launches while the GPU runs, so a step takes the longer "
        "of the host's work and the GPU's (a two-stage pipeline); a value the host reads from the GPU arrives a "
        "step later"),
    kinds=("host_sync", "step_sync"), host_time=True, saving_bound=_sync_saving_bound, runs_ahead=True,
    skip_off_path=False)
SCENARIOS = (FUSED_OPTIMIZER, NO_LAUNCH_OVERHEAD, NO_HOST_SYNC)
