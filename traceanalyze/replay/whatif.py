"""What-ifs: each one rewrites task durations, gaps or transfer times and replays the graph; the findings' impact
comes from them (:func:`traceanalyze.diagnose.apply_to_findings`). Design: ``shared/WHATIF.md`` §6,
``docs/replay.md``.

Step times follow the one step definition (:mod:`traceanalyze.metrics.steps`): a step's time is the longest
duration of that ``ProfilerStep#N`` over the ranks; the run's step time is the median over the counted steps.
The replay error is |replayed − measured| / measured of the run's step time. A what-if's predicted step time is,
per counted step, the measured time less the replayed saving (replay of the graph − replay of the rewritten
graph), then the median over steps; ``saving_pct`` = 100 × (measured − predicted) / measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import duckdb
import numpy as np

from traceanalyze import store
from traceanalyze.executors import on_own_cursor, release_free_memory
from traceanalyze.hardware import GpuInfo
from traceanalyze.metrics.steps import longest_per_step, median
from traceanalyze.metrics.where import MAX_TIMELINE_LANES, lanes_to_show
from traceanalyze.replay import gaps, optimizer, overhead, precision, simulate, skew
from traceanalyze.replay import graph as gr

SCENARIOS = ("no_straggler", "aligned_step_starts", "ideal_interconnect", "tf32_matmul", "bf16_matmul",
             "bf16_channels_last", "no_dataloader_wait", "no_compile", "fused_optimizer", "no_launch_overhead",
             "no_host_sync", "all")
CAUSES = {"no_straggler": "imbalance: straggler ranks",
          "aligned_step_starts": "imbalance: ranks that enter the step late (work between steps)",
          "ideal_interconnect": "interconnect: slow collectives",
          "tf32_matmul": "precision: fp32 matrix math (TF32 off)",
          "bf16_matmul": "precision: fp32 matrix math",
          "bf16_channels_last": "precision: fp32 matrix math, NCHW activations (conv net)",
          "no_dataloader_wait": "config: data-loader wait",
          "no_compile": "config: torch.compile time",
          "fused_optimizer": "config: an optimizer that launches kernels per parameter (foreach=False)",
          "no_launch_overhead": "config: kernel-launch overhead",
          "no_host_sync": "config: the host waits for the GPU (blocking syncs)",
          "all": "every fix above together"}
NO_SAVING = "no measurable saving"  # how a late pricer's reason starts when the replay priced the fix to nothing
UNRELIABLE_ERROR_PCT = 5.0  # replay error above which the what-ifs are marked unreliable (straggler paper §3.3)
# bf16 over fp32 matrix-math speed-up (low, mid, high). GPUs: bf16 tensor cores vs TF32 (2x) up to fp32 CUDA
# cores (8-16x on sm80/sm90 datasheets); CPUs without AMX: half the bytes moved, conversions eat part of it, up to
# CPU_BF16_SPEEDUP (the speed-up the precision rule of traceanalyze.diagnose assumes).
CPU_BF16_SPEEDUP = 2.0  # bf16 halves bytes moved; CPUs with AMX/AVX512-BF16 gain more
BF16_SPEEDUP_GPU = (2.0, 4.0, 8.0)
BF16_SPEEDUP_CPU = (1.25, 1.5, CPU_BF16_SPEEDUP)
CAST_SHARE = 0.1  # cast (aten::_to_copy) cost added, as a share of the matrix-math time saved
STRAGGLER_EXCESS_PCT = 25.0  # a rank working this much longer per step than the median rank is a straggler
# (4 gloo ranks on 2 cores differ by up to ~20 % from scheduling alone: sample_traces/healthy)
LATE_ENTRY_PCT = 10.0  # a rank whose step begins this share of the median step after the median rank's enters late
MIN_SAVING_US = 1.0  # a scenario whose rewrite changes less than this is left out (it does not apply)
MIN_PRECISION_PCT = 0.5  # a precision rewrite removing less than this share of the step is not replayed
PRECISION_SCENARIOS = ("tf32_matmul", "bf16_matmul", "bf16_channels_last")  # GPU: replay.precision's rewrites
# a scenario that does all another does and more: "all" combines the larger one only
SUPERSEDES = {"bf16_matmul": ("tf32_matmul",), "bf16_channels_last": ("tf32_matmul", "bf16_matmul")}

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def _sub(base: np.ndarray, cut: np.ndarray) -> np.ndarray:
    return np.clip(base - cut, 0.0, None)


def _rw_dataloader(g, d, cg, tr, ctx):
    return _sub(d, g.cover["dataloader"]), _sub(cg, g.gap_cover["dataloader"]), tr


def _rw_compile(g, d, cg, tr, ctx):
    return _sub(d, g.cover["compile"]), _sub(cg, g.gap_cover["compile"]), tr


def _rw_launch(g, d, cg, tr, ctx):
    """CUDA graphs (or torch.compile mode="reduce-overhead"): the host time between consecutive launches and the
    launch calls themselves go; one graph launch per step remains, a few µs."""
    if g.prec_class is not None:
        d = np.where(g.prec_class == gr.P_LAUNCH, 0.0, d)
    return d, _sub(cg, g.gap_cover["launch"]), tr


def _rw_fused(g, d, cg, tr, ctx):
    """A fused optimizer (``torch.optim.AdamW(fused=True)``): the per-parameter loop under ``Optimizer.step``
    becomes the few ``multi_tensor_apply`` launches of PyTorch's fused kernel, and the optimizer's kernels the time
    its bytes take at HBM bandwidth (:mod:`.optimizer`: the model, its constants and their sources)."""
    return (*optimizer.rewrite(g, d, cg, ctx["opt"]), tr)


def _rw_tf32(g, d, cg, tr, ctx, bound: str = "mid"):
    return precision.rewrite(g, d, ctx["prec"], "tf32_matmul", bound), cg, tr


def _rw_bf16(g, d, cg, tr, ctx, speedup: float | None = None, bound: str = "mid"):
    if g.mode == "gpu" and ctx.get("prec"):
        return precision.rewrite(g, d, ctx["prec"], "bf16_matmul", bound), cg, tr
    r = speedup or ctx["bf16"][1]
    mm = g.cover["matmul_fp32"]
    return d - mm * (1 - 1 / r) * (1 - CAST_SHARE), cg, tr


def _rw_bf16_channels_last(g, d, cg, tr, ctx, bound: str = "mid"):
    """bf16 autocast + channels_last on a conv net with NCHW activations (:mod:`.precision`)."""
    return precision.rewrite(g, d, ctx["prec"], "bf16_channels_last", bound), cg, tr


def _rw_interconnect(g, d, cg, tr, ctx):
    ideal = gr.ideal_transfer_us(g, ctx["link_gbps"])
    return d, cg, np.where(g.inst_bytes > 0, np.minimum(tr, ideal), tr)


def _busy_us(g: gr.Graph) -> dict[int, float]:
    """Per rank: median over its counted steps of the host time it spends working (host tasks and the gaps
    between them, waits left out), µs."""
    width = int(g.step.max(initial=0)) + 2
    counted = np.array([r * width + s for r, s, _, _, c in g.steps if c], dtype=np.int64)
    key = g.rank * width + g.step
    sel = np.flatnonzero((g.kind == gr.K_HOST) & (g.step >= 0) & np.isin(key, counted))
    if sel.size == 0:
        return {}
    keys, inv = np.unique(key[sel], return_inverse=True)
    per = np.bincount(inv.reshape(-1), weights=g.chain_dur[sel] + g.chain_gap[sel])
    out: dict[int, list[float]] = {}
    for k, v in zip((keys // width).tolist(), per.tolist(), strict=True):
        out.setdefault(int(k), []).append(v)
    return {r: float(np.median(v)) for r, v in out.items()}


def _stragglers(g: gr.Graph) -> set[int]:
    """Ranks whose working host time per step is more than :data:`STRAGGLER_EXCESS_PCT` above the median rank's."""
    busy = _busy_us(g)
    if len(busy) < 2:
        return set()
    mid = float(np.median(list(busy.values())))
    return {r for r, b in busy.items() if b > mid * (1 + STRAGGLER_EXCESS_PCT / 100)}


def _straggler_ranks(g: gr.Graph, ctx: dict) -> set[int]:
    """The ranks ``no_straggler`` rewrites: those the straggler finding names (``ctx["stragglers"]``, priced for
    it: :func:`_late_pricer`), else the replay's own test (:func:`_stragglers`)."""
    return set(ctx.get("stragglers") or ()) or _stragglers(g)


def _rw_straggler(g, d, cg, tr, ctx):
    """The straggler ranks' op classes (step, name, n-th occurrence on the rank) at the mean over their peers
    (the other ranks); a class that fewer than half the peers run is the straggler's extra work and goes; the gap
    before each task the same. The peers keep their measured times (their own noise stays, as in a healthy run);
    a collective's transfer goes to the median of its (operation, bytes) class."""
    slow = _straggler_ranks(g, ctx)
    sel = np.flatnonzero((g.step >= 0) & np.isin(g.kind, (gr.K_HOST, gr.K_KERNEL, gr.K_MEMCPY, gr.K_MEMSET)))
    d, cg = d.copy(), cg.copy()
    if sel.size and slow:
        cls = g.step[sel].astype(np.int64) * (int(g.name_code.max(initial=0)) + 1) + g.name_code[sel]
        o = np.lexsort((g.start[sel], cls, g.rank[sel]))
        rk, cl = g.rank[sel][o], cls[o]
        newgrp = np.ones(o.size, dtype=bool)
        newgrp[1:] = (rk[1:] != rk[:-1]) | (cl[1:] != cl[:-1])
        grp_start = np.maximum.accumulate(np.where(newgrp, np.arange(o.size), 0))
        key = np.stack([cl, np.arange(o.size) - grp_start], axis=1)
        _, kid = np.unique(key, axis=0, return_inverse=True)
        kid = kid.reshape(-1)
        idx = sel[o]
        peer = ~np.isin(rk, list(slow))
        cnt = np.bincount(kid[peer], minlength=kid.max() + 1)
        n_peers = len(set(g.ranks) - slow)
        mean_d = np.bincount(kid[peer], weights=d[idx][peer], minlength=cnt.size) / np.maximum(cnt, 1)
        mean_g = np.bincount(kid[peer], weights=cg[idx][peer], minlength=cnt.size) / np.maximum(cnt, 1)
        keep = cnt[kid] * 2 >= n_peers
        mine = ~peer
        d[idx[mine]] = np.where(keep[mine], mean_d[kid[mine]], 0.0)
        cg[idx[mine]] = np.where(keep[mine], mean_g[kid[mine]], 0.0)
    tr = tr.copy()
    if tr.size:
        pairs: dict[tuple, list[int]] = {}
        for i, (c, b) in enumerate(zip(g.inst_coll, g.inst_bytes.tolist(), strict=True)):
            pairs.setdefault((c, b), []).append(i)
        for members in pairs.values():
            tr[members] = float(np.median(tr[members]))
    return d, cg, tr


def _late_entries(g: gr.Graph) -> set[int]:
    """Ranks that enter the counted steps late: in more than half of them, the rank's ``ProfilerStep`` begins
    :data:`LATE_ENTRY_PCT` % of the median step time or more after the median rank's (the replay's aligned clocks)."""
    begins: dict[int, dict[int, float]] = {}
    lengths = []
    for r, s, b, e, c in g.steps:
        if c:
            begins.setdefault(s, {})[r] = float(g.start[b])
            lengths.append(float(g.start[e] - g.start[b]))
    if not lengths:
        return set()
    bar = LATE_ENTRY_PCT / 100 * float(np.median(lengths))
    late: dict[int, int] = {}
    for by in begins.values():
        mid = float(np.median(list(by.values())))
        for r, t in by.items():
            if len(by) > 1 and t - mid >= bar:
                late[r] = late.get(r, 0) + 1
    return {r for r, k in late.items() if 2 * k > len(begins)}


def _late_ranks(g: gr.Graph, ctx: dict) -> set[int]:
    """The ranks ``aligned_step_starts`` moves: those the late-entry finding names (``ctx["late_ranks"]``, priced
    for it: :func:`_late_pricer`), else the replay's own test (:func:`_late_entries`)."""
    return set(ctx.get("late_ranks") or ()) or _late_entries(g)


def _rw_aligned(g, d, cg, tr, ctx):
    """The late ranks' work between steps goes: in every traced step, the host gap after their last task before the
    step-end marker (work after the optimizer that no op records: one rank's logging, evaluation or checkpoint
    bookkeeping), the gap between that marker and the next step's begin marker, and the gap before their first task
    in the step, each at most the other ranks' median of the same gap of the same step. Their first traced step
    starts with the others (:func:`_aligned_starts`: the delay from before the trace). The work inside the steps is
    unchanged. Physical reason: a collective returns on a rank only once every rank of its group has called it
    (PyTorch, ``torch.distributed`` collective semantics), so a rank that enters the step late holds the others at
    its first collective for the time it entered late; and each rank's host thread runs its work in order (the
    straggler paper's replay, OSDI 2025, and Lumos' list scheduling, ``shared/WHATIF.md`` §5: a delay shifts
    everything after it on that worker), so work at the end of one step delays that rank's entry into the next by
    as much. Its untraced CPU time is kept as gaps (WHATIF.md pitfall 8), which is what this rewrite removes."""
    late = _late_ranks(g, ctx)
    slots = _between_step_gaps(g)
    if not late or slots.size == 0:
        return d, cg, tr
    cg = cg.copy()
    task, step, rank, kind = slots.T
    is_late = np.isin(rank, list(late))
    for key in np.unique(step * 3 + kind).tolist():
        mine = (step * 3 + kind) == key
        ref = cg[task[mine & ~is_late]]
        if ref.size:
            cut = task[mine & is_late]
            cg[cut] = np.minimum(cg[cut], float(np.median(ref)))
    return d, cg, tr


def _between_step_gaps(g: gr.Graph) -> np.ndarray:
    """Rows ``(task, step, rank, slot)`` of the host gaps between two steps' work, each stored on the task after it:
    slot 0 the gap before a step-end marker (after the step's last task), 1 the gap before a step-begin marker (from
    the previous step's end marker), 2 the gap before the first task of a step (after its begin marker)."""
    rows = []
    for r, s, b, e, _ in g.steps:
        rows.append((e, s, r, 0))
        if not g.first[b]:
            rows.append((b, s, r, 1))
        if b + 1 < e and not g.first[b + 1]:
            rows.append((b + 1, s, r, 2))
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def _without_gap_cut(g: gr.Graph, cut: np.ndarray | None) -> gr.Graph:
    """``g`` with each explicit edge's offset less the µs the rewrite cut from the host gap before the edge's
    destination (``cut``, per task; None or nothing cut: ``g`` itself). An edge into the task after a host gap
    holds that gap too (a synchronize's edge runs from the awaited kernel's end to the next task's start), so work
    taken out of the gap must leave the edge as well; a positive offset is cut down to 0 at most, others are kept. A
    shallow copy: only the offsets are new."""
    if cut is None or not cut.any():
        return g
    off = g.dep_off - np.minimum(cut[g.dep_dst], np.clip(g.dep_off, 0, None))
    return dataclasses.replace(g, dep_off=off)


def _aligned_starts(g: gr.Graph, ctx: dict) -> np.ndarray | None:
    """Per task, where the replay starts it when pinned (:func:`~traceanalyze.replay.simulate.pinned_tasks`): the
    late ranks' (:func:`_late_ranks`) pinned tasks earlier by how much later their first traced step began than the
    other ranks' median begin of that step (µs), so that they enter the trace with the others; None when no late
    rank entered its first traced step late. The delay before the trace is not in it (the step before's tail, an
    untraced stall, the profiler starting later on that rank): this assumes it goes."""
    late = _late_ranks(g, ctx)
    if not late:
        return None
    first = min((s for r, s, _, _, _ in g.steps if r in late), default=None)
    begins = {r: float(g.start[b]) for r, s, b, _, _ in g.steps if s == first}
    ref = [t for r, t in begins.items() if r not in late]
    if not ref:
        return None
    mid = float(np.median(ref))
    shift = {r: begins[r] - mid for r in late if begins.get(r, mid) > mid}
    if not shift:
        return None
    by_rank = np.zeros(int(g.rank.max(initial=0)) + 1)
    for r, dt in shift.items():
        by_rank[r] = dt
    starts = g.start.copy()
    pinned = simulate.pinned_tasks(g)
    starts[pinned] -= by_rank[g.rank[pinned]]  # one pass over the tasks (a mask per late rank grew with ranks²)
    return starts


def _rw_host_sync(g, d, cg, tr, ctx):
    """The blocking waits go from the graph itself (:func:`_without_host_syncs`); a copy call that holds the host
    (a pageable ``cudaMemcpy*``, whose host stages the bytes) becomes an asynchronous one from pinned memory: it
    returns once enqueued, at the median cost of the run's launch calls, and the copy engine moves the bytes as
    measured on the GPU (CUDA C++ Best Practices Guide, "Pinned Memory" and "Asynchronous and Overlapping
    Transfers")."""
    copies, cost = _host_copies(g)
    if copies.size:
        d = d.copy()
        d[copies] = np.minimum(d[copies], cost)
    return d, cg, tr


def _host_copies(g: gr.Graph) -> tuple[np.ndarray, float]:
    """(task ids of the host's copy calls in the steps, ``*Memcpy*``; the median duration of the run's launch calls,
    µs: what an asynchronous copy call costs the host)."""
    launch = g.dep_src[g.dep_type == gr.DEP_TYPES.index("launch")]
    launch = launch[g.kind[launch] == gr.K_HOST]
    codes = gr.name_codes(g, "memcpy")
    if not (launch.size and codes):
        return np.zeros(0, np.int64), 0.0
    copies = np.flatnonzero((g.kind == gr.K_HOST) & (g.step >= 0) & np.isin(g.name_code, codes))
    return copies, float(np.median(g.chain_dur[launch]))


REWRITES: dict[str, Callable] = {"no_straggler": _rw_straggler, "aligned_step_starts": _rw_aligned,
                                 "ideal_interconnect": _rw_interconnect,
                                 "tf32_matmul": _rw_tf32, "bf16_matmul": _rw_bf16,
                                 "bf16_channels_last": _rw_bf16_channels_last, "no_dataloader_wait": _rw_dataloader,
                                 "no_compile": _rw_compile, "fused_optimizer": _rw_fused,
                                 "no_launch_overhead": _rw_launch,
                                 "no_host_sync": _rw_host_sync}
SYNC_EDGE = gr.DEP_TYPES.index("gpu_cpu_sync")
ANCHOR_TOLERANCE_US = 1.0  # a side-stream task measured to start within this of a busiest-stream task's end follows it


def _host_sync_edges(g: gr.Graph) -> np.ndarray:
    """Per explicit edge: whether it is a blocking GPU->CPU wait (``gpu_cpu_sync``: a synchronize call, a blocking
    copy) of a profiler step."""
    sync = g.dep_type == SYNC_EDGE
    if sync.any():
        sync &= g.step[g.dep_dst] >= 0
    return sync


def _without_host_syncs(g: gr.Graph) -> gr.Graph:
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
    return dataclasses.replace(g, dep_src=s2[o], dep_dst=d2[o], dep_end=end[o], dep_off=off[o], dep_type=typ[o])


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
    (:func:`_without_host_syncs`). The busiest stream holds the most device time (ties: the first); a rank with
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
    at = np.minimum(np.searchsorted(main_rank, g.rank[cand]), main.size - 1)
    mine = (main_rank[at] == g.rank[cand]) & (main[at] != g.res[cand])
    side, main_of = cand[mine], main[at[mine]]
    by_res = np.unique(main)
    lo, hi = np.searchsorted(g.res, by_res), np.searchsorted(g.res, by_res, side="right")
    idx, seg = _ranges(lo, hi)
    ends = _segment_cummax(g.start[idx] + g.dur[idx], seg)
    qseg = np.searchsorted(by_res, main_of)
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
    ascending, ``v`` ascending within each segment. The values are ranked first (exactly: equal values, equal
    ranks), so that (segment, rank) is one sortable integer."""
    u = np.unique(np.concatenate([v, q]))
    m = u.size + 1
    kv = vseg.astype(np.int64) * m + np.searchsorted(u, v)
    kq = qseg.astype(np.int64) * m + np.searchsorted(u, q)
    return np.searchsorted(kv, kq, side=side) - np.searchsorted(vseg, qseg)


def _segment_cummax(v: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """The running maximum of ``v`` restarted at each segment (``seg`` ascending): exactly the floats of
    ``np.maximum.accumulate`` per segment, from their ranks offset by segment."""
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


def _applies(g: gr.Graph, scenario: str, ctx: dict) -> bool:
    if scenario == "no_straggler":
        return bool(_stragglers(g))
    if scenario == "aligned_step_starts":
        return bool(_late_entries(g))
    if scenario == "ideal_interconnect":
        return bool(ctx.get("link_gbps")) and bool((g.inst_bytes > 0).any())
    if scenario == "bf16_matmul" and ctx.get("native_bf16") is False:
        return False  # emulated bf16 is slower than fp32: no fix on this host (_left_out says why)
    if scenario in PRECISION_SCENARIOS and g.mode == "gpu":
        return bool(ctx.get("prec")) and precision.applies(g, ctx["prec"], scenario)
    if scenario in ("tf32_matmul", "bf16_channels_last"):
        return False
    key = {"bf16_matmul": "matmul_fp32", "no_dataloader_wait": "dataloader", "no_compile": "compile"}.get(scenario)
    if key:
        return float(g.cover[key].sum() + g.gap_cover.get(key, np.zeros(1)).sum()) >= MIN_SAVING_US
    if scenario == "fused_optimizer":
        return bool((ctx.get("opt") or {}).get("applies"))
    if scenario == "no_launch_overhead":
        return g.mode == "gpu" and float(g.gap_cover["launch"].sum()) >= MIN_SAVING_US
    if scenario == "no_host_sync":
        if g.mode != "gpu":
            return False
        copies, cost = _host_copies(g)
        return bool(_host_sync_edges(g).any()) or float(np.clip(g.chain_dur[copies] - cost, 0, None).sum()) >= \
            MIN_SAVING_US
    return False


def _left_out(g: gr.Graph, ctx: dict) -> list[dict]:
    """What-ifs the trace would support but the host rules out, each ``{"scenario", "why"}``: bf16 on a CPU that
    has neither AMX nor AVX512-BF16 (``env_rank{r}.json`` ``cpu.native_bf16``), where oneDNN emulates bf16 and
    the matmuls run slower than in fp32."""
    if ctx.get("native_bf16") is not False or float(g.cover["matmul_fp32"].sum()) < MIN_SAVING_US:
        return []
    return [{"scenario": "bf16_matmul",
             "why": f"the host CPU ({ctx.get('cpu_model') or 'model unknown'}) has neither AMX nor AVX512-BF16: "
                    "bf16 matmuls would be emulated, slower than fp32, so bf16 autocast is no fix on this host"}]


def _named_ranks(scenario: str, ctx: dict, g: gr.Graph) -> str:
    """``1, 3 (why)``: the ranks a scenario of :data:`RANK_SCENARIOS` rewrites, and whether a finding named them or
    the replay's own test did."""
    key, words = RANK_SCENARIOS[scenario]
    ranks = _straggler_ranks(g, ctx) if scenario == "no_straggler" else _late_ranks(g, ctx)
    test = (f"working host time per step > {STRAGGLER_EXCESS_PCT:g} % over the median rank" if scenario ==
            "no_straggler" else f"step begins ≥ {LATE_ENTRY_PCT:g} % of the step after the median rank's")
    return f"{', '.join(str(r) for r in sorted(ranks))} ({f'named by the {words} finding' if ctx.get(key) else test})"


def _assumptions(scenario: str, ctx: dict, g: gr.Graph) -> str:
    if scenario == "no_straggler":
        return (f"straggler rank(s) {_named_ranks(scenario, ctx, g)}: each op class (step, name, n-th call) and the "
                "gap before it at the mean of the other ranks, work they do not do removed; the other ranks "
                "unchanged; each collective's transfer at the median of its size class" + _cores_note(scenario, ctx))
    if scenario == "aligned_step_starts":
        return (f"late rank(s) {_named_ranks(scenario, ctx, g)}: their first traced step starts with the other "
                "ranks' median (the delay before the trace, which it does not show, assumed to go), and in every step "
                "the host gap after their last task before the step ends, the gap between steps and the gap before "
                "their first task at most the other ranks' median; the work inside the steps and the other ranks "
                "unchanged" + _cores_note(scenario, ctx))
    if scenario == "ideal_interconnect":
        return (f"transfer = bytes × busbw factor ÷ {ctx['link_gbps']:g} GB/s ({ctx['link_source']}), capped at "
                "the measured transfer; latency term ignored" + _cores_note(scenario, ctx))
    if scenario in PRECISION_SCENARIOS and ctx.get("prec"):
        return precision.assumptions(scenario, ctx["prec"])
    if scenario == "bf16_matmul":
        lo, mid, hi = ctx["bf16"]
        return (f"fp32 matrix math {mid:g}× faster in bf16 (range {lo:g}–{hi:g}× gives the range), plus casts at "
                f"{CAST_SHARE:.0%} of the time saved; no measured bf16 kernel of the same shape is used; collective "
                "bytes unchanged (DDP reduces fp32 gradients under autocast)")
    if scenario == "no_dataloader_wait":
        return "host time under DataLoader ranges removed (workers prefetch; launch order kept)"
    if scenario == "no_compile":
        return "host time under dynamo/inductor compile ranges removed (a warm cache still traces frames)"
    if scenario == "fused_optimizer":
        return optimizer.assumptions(ctx["opt"], g, ctx["d0"])
    if scenario == "no_launch_overhead":
        return ("CUDA graphs: the kernel-launch calls and the host time between consecutive launches removed (one "
                "graph launch per step remains); the host's other work, the GPU's kernels unchanged")
    if scenario == "no_host_sync":
        return ("every blocking wait for the GPU in the steps removed (no synchronize or .item() each step, pinned "
                "memory with non_blocking=True): the host queues the next launches while the GPU runs, so a step "
                "takes the longer of the host's work and the GPU's (a two-stage pipeline); a value the host reads "
                "from the GPU arrives a step later")
    return "every applicable rewrite at once; savings do not add up"


# what-ifs that change how many ranks compute at once: on ranks that share CPU cores each op's measured duration
# holds the others' load, so a replay of measured durations cannot price them (README: How accurate is it)
CONCURRENCY_SCENARIOS = ("no_straggler", "aligned_step_starts", "ideal_interconnect")


def _changes_concurrency(scenario: str, ctx: dict) -> bool:
    """Whether ``scenario`` (``all``: any scenario it combines) changes how many ranks compute at once."""
    if scenario == "all":
        return any(s in CONCURRENCY_SCENARIOS for s in ctx.get("applicable") or ())
    return scenario in CONCURRENCY_SCENARIOS


def _cores_note(scenario: str, ctx: dict) -> str:
    """``; <why>`` in a concurrency what-if's assumptions when it is not known whether the ranks share cores."""
    cs = ctx.get("core_sharing") or {}
    if cs.get("shared") is None and cs.get("why") and _changes_concurrency(scenario, ctx):
        return f"; {cs['why']}"
    return ""


def _why_not(g: gr.Graph, scenario: str, ctx: dict) -> str:
    """Why ``scenario`` does not apply to the run's graph (:func:`_applies` False), in words."""
    if scenario == "no_straggler":
        return (f"no rank's working host time per step is more than {STRAGGLER_EXCESS_PCT:g} % over the median "
                "rank's (the replay's straggler test)")
    if scenario == "aligned_step_starts":
        return (f"no rank's step begins {LATE_ENTRY_PCT:g} % of the step or more after the median rank's in most "
                "counted steps (the replay's late-entry test)")
    if scenario == "ideal_interconnect":
        if not ctx.get("link_gbps"):
            return "the link's expected bandwidth is unknown (pass --link-bw GB/s)"
        return "no collective in the replayed steps states its message size"
    if scenario == "bf16_matmul" and ctx.get("native_bf16") is False:
        lo = _left_out(g, ctx)
        return lo[0]["why"] if lo else "no fp32 matrix math in the replayed steps"
    if scenario == "tf32_matmul" and g.mode != "gpu":
        return "TF32 is a GPU feature"
    if scenario == "bf16_channels_last" and g.mode != "gpu":
        return "channels_last is priced on GPU runs (cuDNN's NHWC tensor-core convolutions)"
    if scenario == "bf16_channels_last" and _applies(g, "bf16_matmul", ctx):
        return precision.channels_last_why_not(ctx["prec"])
    if scenario in PRECISION_SCENARIOS:
        return "no fp32 matrix math in the replayed steps that the precision model rewrites"
    if scenario == "no_dataloader_wait":
        return "no host time under DataLoader ranges in the replayed steps"
    if scenario == "no_compile":
        return "no host time under torch.compile (dynamo/inductor) ranges in the replayed steps"
    if scenario == "fused_optimizer":
        return (ctx.get("opt") or {}).get("why") or "a CPU run launches no optimizer kernels"
    if scenario == "no_launch_overhead":
        return ("a CPU run launches no kernels" if g.mode != "gpu" else
                "no host gap between kernel launches in the replayed steps")
    if scenario == "no_host_sync":
        return ("a CPU run has no GPU to wait for" if g.mode != "gpu" else
                "no blocking wait for the GPU (synchronize, blocking copy) in the replayed steps")
    return f"no scenario {scenario!r}"


# scenarios priced for the ranks a finding names: scenario -> (the ctx key that holds them, the finding in words)
RANK_SCENARIOS = {"no_straggler": ("stragglers", "straggler"), "aligned_step_starts": ("late_ranks", "late-entry")}


def _late_pricer(pr: _Pricer, ctx: dict, base: Arrays, measured: dict, err: float, reliable: bool) -> Callable:
    """The pricer of one more scenario on this run's graph, for a finding the replay's own tests did not price
    (:func:`traceanalyze.diagnose.price_missing_whatifs`): ``price(scenario, ranks=None) -> (whatif row or None,
    why there is none, sim_result rows)``. ``ranks``: the ranks a finding names, for the scenarios of
    :data:`RANK_SCENARIOS` (``no_straggler`` for a straggler finding's, ``aligned_step_starts`` for a late-entry
    finding's). It holds the graph until it is dropped."""
    g = pr.g
    replayed = set(g.ranks)

    def price(scenario: str, ranks: list[int] | None = None) -> tuple[dict | None, str, list]:
        if scenario not in REWRITES:
            return None, f"no scenario {scenario!r}", []
        c = ctx
        if scenario in RANK_SCENARIOS and ranks:
            named = {r for r in ranks if r in replayed}
            if not named or len(named) >= len(g.ranks):
                return None, f"the {RANK_SCENARIOS[scenario][1]} finding's ranks are not among the replayed ranks " \
                             "with peers", []
            c = dict(ctx, **{RANK_SCENARIOS[scenario][0]: named})
        elif not _applies(g, scenario, ctx):
            return None, _why_not(g, scenario, ctx), []
        if c is ctx and scenario in pr.skipped:  # priced by the replay already, for no row: not again
            return None, pr.skipped[scenario], []
        rows: list = []
        out = _price_scenarios(pr, [scenario], c, base, measured, rows, err, reliable)
        return (out[0], "", rows) if out else (None, pr.skipped.get(scenario, NO_SAVING), [])

    return price


def _longest(times: dict[tuple[int, int], float], counted: set[tuple[int, int]]) -> dict[int, float]:
    """Step -> its longest time over the ranks, of the counted (rank, step) times."""
    return longest_per_step((s, t) for (r, s), t in times.items() if (r, s) in counted)


def replay_run(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world_size: int | None,
               clock_offsets_us: dict | None = None, link_gbps: float | None = None, link_source: str = "",
               gpu_sm: str | None = None, cpu_native_bf16: bool | None = None, cpu_model: str | None = None,
               defer: list | None = None, build_threads: int | None = None, gpu: GpuInfo | None = None,
               unprofiled_measured: dict | None = None, core_sharing: dict | None = None,
               pricer: list | None = None) -> tuple[dict, list[dict], dict]:
    """Build, store and replay the run's graph, then every what-if that applies.

    ``defer``: when a list, the writes (the graph's ``sim_*`` tables, ``collective_skew``, ``sim_result``) are
    appended to it as one callable for the caller to overlap with its other work. ``cpu_native_bf16``/``cpu_model``:
    the host CPU (``env_rank{r}.json``); on a CPU run, False leaves ``bf16_matmul`` out (``left_out`` says why).
    ``build_threads``: threads that build the graph. ``gpu``: the run's GPU (the precision peaks).
    ``unprofiled_measured``: ``{"step_time_us", "source"}`` measured without the profiler (``capture`` or ``log``),
    or None: estimated (:mod:`.overhead`). ``core_sharing`` (:func:`traceanalyze.logs.core_sharing`): on a CPU run
    whose ranks share cores, :data:`CONCURRENCY_SCENARIOS` are ``reliable: false`` with an ``unreliable_reason``.
    ``pricer``: when a list, receives :func:`_late_pricer`'s pricer of one more scenario (it holds the graph).

    On GPU runs every what-if is priced on the step without the profiler: its rewrite applies to the graph with the
    profiler's host cost taken out, its predicted step time and saving are for the unprofiled job, and no
    prediction is below the busy time of the work the rewrite leaves (:func:`_floors`). ``profiled_*`` fields keep
    the profiled figures.

    Returns:
        ``(replay, whatif, picture)``: ``replay`` and ``whatif`` as in the JSON contract (``docs/replay.md``; the
        replay's ``profiler_overhead`` is the run's), ``picture`` the cross-rank lanes of the median step for the
        HTML report.
    """
    g = gr.build(con, run_id, mode, world_size, clock_offsets_us, threads=build_threads)
    release_free_memory()  # the build's temporaries: ~100 MB of fragmented heap at 1,024 ranks
    results: list[list] = []
    sk = skew.collective_skew(con, g)  # who waited for whom: the instances as the graph matched them
    write = _Writes(con, g, run_id, sk, results)
    if defer is not None:  # else written before each return
        defer.append(write)
    base = simulate.replay(g, keep_binding=True)
    measured = {(r, s): float(g.start[e] - g.start[b]) for r, s, b, e, _ in g.steps}
    counted = {(r, s) for r, s, _, _, c in g.steps if c}
    base_t = base.step_times(g)
    m_long, b_long = _longest(measured, counted), _longest(base_t, counted)
    m_run, b_run = median(m_long.values()), median(b_long.values())
    if m_run is None or b_run is None:
        if defer is None:
            write()
        return {}, [], {}
    if defer is not None:
        write.start_beside()
    err = abs(b_run - m_run) / m_run * 100 if m_run else 0.0
    replay_model = _replay_model(g, base, measured, base_t, counted, m_run, b_run, err)
    ctx = {"link_gbps": link_gbps, "link_source": link_source or "expected link",
           "bf16": BF16_SPEEDUP_GPU if mode == "gpu" else BF16_SPEEDUP_CPU,
           "native_bf16": cpu_native_bf16 if mode == "cpu" else None, "cpu_model": cpu_model,
           "core_sharing": core_sharing if mode == "cpu" else None}
    if ctx["core_sharing"]:
        replay_model["core_sharing"] = core_sharing
    if mode == "gpu":
        ctx["prec"] = precision.context(con, g, gpu)
        ctx["opt"] = optimizer.context(con, g, ctx["prec"]["peaks"])
    replay_model["left_out"] = _left_out(g, ctx)
    replay_model["unexplained_gaps"] = gaps.summary(g, counted)
    replay_model["collective_skew"] = sk  # not for the JSON: the caller takes it out (traceanalyze.pipeline)
    picture = _picture(g, base, measured, counted, m_long, sk)  # now: base (3 graph-sized arrays) is not held below
    pr = _Pricer(g, counted, m_long, b_long, m_run)
    pr.on_path = simulate.on_critical_paths(base, _markers(g)) if mode != "gpu" else None  # GPU: the unprofiled's
    del base
    results += [[run_id, "replay", r, s, measured[(r, s)], base_t[(r, s)]] for r, s in sorted(measured)]
    applicable = ctx["applicable"] = [s for s in SCENARIOS[:-1] if _applies(g, s, ctx)]
    d0, cg0, tr0 = g.chain_dur, g.chain_gap, g.inst_transfer
    if mode == "gpu":  # the what-ifs are rewrites of the graph without the profiler's host cost
        d0, cg0 = pr.unprofiled(con, run_id, d0, cg0, tr0)
    ctx["d0"] = d0  # the durations the rewrites start from (fused_optimizer's launch call: their median)
    replay_model["profiler_overhead"] = pr.base(d0, cg0, unprofiled_measured)
    whatif = _price_scenarios(pr, applicable, ctx, (d0, cg0, tr0), measured, results, err, replay_model["reliable"])
    if pricer is not None:
        pricer.append(_late_pricer(pr, ctx, (d0, cg0, tr0), measured, err, replay_model["reliable"]))
    if defer is None:
        write()
    return replay_model, whatif, picture


class _Writes:
    """The replay's tables of one run (the graph's ``sim_task``, ``sim_dep``, ``sim_coll``, ``collective_skew``
    and the ``sim_result`` rows in ``results``), written when called. :meth:`start_beside` starts the graph's on a
    cursor and thread of their own: they read the measured graph only, so they are written while the what-ifs
    replay, when the caller's other work is done and a CPU is free (on the 8-rank scale set the writing took 0.3 s
    after the replay); the call then waits for them. :meth:`discard`: the caller keeps no replay of the run."""

    def __init__(self, con: duckdb.DuckDBPyConnection, g: gr.Graph, run_id: int, sk: skew.Skew,
                 results: list[list]) -> None:
        self.con, self.g, self.run_id, self.sk, self.results = con, g, run_id, sk, results
        self.beside: Callable[[], None] | None = None  # waits for the graph's tables (raises what they raised)

    def _save(self, con: duckdb.DuckDBPyConnection) -> None:
        gr.save(con, self.g)
        skew.save(con, self.run_id, self.sk)

    def start_beside(self) -> None:
        self.beside = on_own_cursor(self.con, self._save, name="traceanalyze-save")

    def __call__(self) -> None:
        if self.beside is not None:
            self.beside()
        else:
            self._save(self.con)
        store.insert_rows(self.con, "sim_result", None, self.results)

    def discard(self) -> None:
        """Nothing of the run stays in the tables: what was started beside is waited for, then deleted."""
        if self.beside is not None:
            with contextlib.suppress(duckdb.Error, ValueError, IndexError, KeyError):
                self.beside()
            for t in ("sim_task", "sim_dep", "sim_coll", "collective_skew"):
                self.con.execute(f"DELETE FROM {t} WHERE run_id = ?", [self.run_id])


def _step_noise_pct(g: gr.Graph, m_long: dict) -> float:
    """Step-to-step noise, % of the mean: σ over the counted steps' longest times, a step that torch.compile fills
    more than half of left out (a one-time cost, not noise; as :mod:`traceanalyze.diagnose.confidence` does)."""
    sel = g.step >= 0
    comp = np.bincount(g.step[sel], weights=g.cover["compile"][sel]) if sel.any() else np.zeros(0)
    vals = [v for s, v in m_long.items() if not (0 <= s < comp.size and comp[s] > 0.5 * v)]
    return float(100 * np.std(vals) / np.mean(vals)) if len(vals) > 1 and np.mean(vals) > 0 else 0.0


class _Pricer:
    """Prices rewrites of one run's graph: each counted step's replayed saving taken off its step time without the
    profiler (measured, or estimated by :meth:`unprofiled`), never below the step's floor (:func:`_floors`)."""

    def __init__(self, g: gr.Graph, counted: set, m_long: dict, b_long: dict, m_run: float) -> None:
        self.g, self.counted, self.m_long, self.b_long, self.m_run = g, counted, m_long, b_long, m_run
        self.u_long, self.per_op, self.cfg = b_long, 0.0, None
        self.loader_mp = False  # the steps take batches from a multi-process DataLoader (overhead.estimate_range)
        self.groups = _floor_groups(g)  # the floors' grouping, the same for every rewrite
        self.est: dict = {}
        self.est_run = self.u_run = m_run
        self.scale = 1.0
        self.skipped: dict[str, str] = {}  # scenario -> why its rewrite gave no row (a late pricer reuses it)
        self.g_free: gr.Graph | None = None  # the graph without its blocking waits for the GPU (no_host_sync)
        self.on_path: np.ndarray | None = None  # per task: on the critical path of a counted step's marker
        self.kept_on_path = 0.0  # the last replay's critical path in unexplained kept gaps, % (gaps.on_path_pct)
        self.noise_pct = _step_noise_pct(g, m_long)

    def replay_long(self, arrs: Arrays, sync_free: bool = False, starts: np.ndarray | None = None,
                    cut: np.ndarray | None = None) -> tuple[dict, dict]:
        """(step -> longest replayed time over the counted ranks, (rank, step) -> replayed time); ``sync_free``:
        on the graph without its blocking waits for the GPU, the host running ahead (:func:`pipelined_step_times`);
        ``starts``: the pinned tasks' starts (:func:`_aligned_starts`), default the measured ones; ``cut``: per
        task, µs of the gap before it that the rewrite took out, also out of its incoming edges
        (:func:`_without_gap_cut`)."""
        if sync_free:
            if self.g_free is None:
                self.g_free = _without_host_syncs(self.g)
            g = _without_gap_cut(self.g_free, cut)
            rp = simulate.replay(g, *arrs, starts=starts, keep_binding=True)
            t = pipelined_step_times(g, rp)
        else:
            g = _without_gap_cut(self.g, cut)
            rp = simulate.replay(g, *arrs, starts=starts, keep_binding=True)
            t = rp.step_times(g)
        self.kept_on_path = gaps.on_path_pct(g, rp, arrs[1], self.counted)
        del rp
        release_free_memory()  # each replay's graph-sized arrays: not stacked up in the heap
        return _longest(t, self.counted), t

    def unprofiled(self, con, run_id: int, d: np.ndarray, cg: np.ndarray, tr: np.ndarray) -> tuple:
        """The graph's durations and gaps less the profiler's host cost (:mod:`.overhead`), replayed."""
        self.cfg = overhead.profiler_config(con, run_id)
        self.per_op = overhead.per_op_us(self.cfg)
        self.loader_mp = overhead.multiprocess_loader(con, run_id)
        d, cg = overhead.unprofiled(self.g, d, cg, self.per_op, per_shape=overhead.per_shape_us(self.cfg))
        rp = simulate.replay(self.g, d, cg, tr, keep_binding=True)
        self.u_long = _longest(rp.step_times(self.g), self.counted)
        self.on_path = simulate.on_critical_paths(rp, _markers(self.g))
        del rp
        release_free_memory()
        return d, cg

    def base(self, d: np.ndarray, cg: np.ndarray, measured: dict | None) -> dict:
        """Set the step without the profiler (``measured`` when it says, else the estimate) and return the run's
        ``profiler_overhead``."""
        floor_u = _floors(self.g, d, cg, self.groups)
        m, b, u = self.m_long, self.b_long, self.u_long
        # a floor above the measured step (work assigned to a step that runs past its end) never raises an estimate
        self.est = {s: max(m[s] - (b[s] - u[s]), min(floor_u.get(s, 0.0), m[s])) for s in m}
        self.est_run = median(self.est.values()) or self.m_run
        self.u_run, source = self.est_run, "estimate"
        if measured and (measured.get("step_time_us") or 0) > 0:
            self.u_run, source = float(measured["step_time_us"]), str(measured.get("source"))
        self.scale = self.u_run / self.est_run if self.est_run else 1.0  # a measurement rescales the estimates
        m_run, busy = self.m_run, _gpu_busy_us(self.groups, d, self.m_long)
        rng, caveat = overhead.estimate_range(m_run, self.est_run, busy, self.loader_mp)
        return {"unprofiled_step_time_us": round(self.u_run, 3), "profiled_step_time_us": round(m_run, 3),
                "overhead_pct": round(100 * (m_run - self.u_run) / m_run, 2) if m_run else 0.0, "source": source,
                "per_op_us": round(self.per_op, 3), "per_call_us": overhead.PER_CALL_US if self.per_op else 0.0,
                "per_shape_us": overhead.per_shape_us(self.cfg or {}) if self.per_op else 0.0,
                "estimated_step_time_us": round(self.est_run, 3), "estimated_range_us": rng, "caveat": caveat,
                "profiler": self.cfg or {}, "events_per_step": _events_per_step(self.g, self.counted),
                "gpu_busy_us": busy}

    def predict(self, arrs: Arrays, sync_free: bool = False, starts: np.ndarray | None = None,
                cut: np.ndarray | None = None) -> tuple[float, dict, bool]:
        """(predicted step without the profiler, replayed (rank, step) times, whether a floor clamped it);
        ``sync_free``, ``starts``, ``cut``: see :meth:`replay_long`."""
        w_long, t = self.replay_long(arrs, sync_free, starts, cut)
        floor = {s: min(v, self.est.get(s, v)) for s, v in _floors(self.g, arrs[0], arrs[1], self.groups).items()}
        per_step = {s: self.est[s] - (self.u_long[s] - w_long[s]) for s in self.m_long}
        clamped = any(per_step[s] < floor.get(s, 0.0) - 1e-6 for s in per_step)
        per_step = {s: max(v, floor.get(s, 0.0)) for s, v in per_step.items()}
        return (median(per_step.values()) or self.est_run) * self.scale, t, clamped


def _add_range(row: dict, pr: _Pricer, sc: str, pred: float, arrs: Arrays, base: Arrays, ctx: dict) -> None:
    """A precision what-if's range (``range_us``, ``range_saving_pct``). GPU runs: without two more replays, the
    replayed saving scaled by the kernel time each end of the model's range removes against the point estimate's
    (the same kernels, so the same share on the path); CPU runs: replays at the assumed speed-ups' ends."""
    g, (d0, cg0, tr0), u = pr.g, base, pr.u_run
    if g.mode == "gpu" and ctx.get("prec"):
        cut_mid = float((d0 - arrs[0]).sum())
        ends = []
        for b in ("low", "high"):
            cut_b = float((d0 - REWRITES[sc](g, d0, cg0, tr0, ctx, bound=b)[0]).sum())
            ends.append(u - (u - pred) * (cut_b / cut_mid if cut_mid > 0 else 1.0))
    else:
        ends = [pr.predict(_rw_bf16(g, d0, cg0, tr0, ctx, speedup=x))[0] for x in (ctx["bf16"][0], ctx["bf16"][2])]
    row["range_us"] = [round(min(ends), 3), round(max(ends), 3)]
    row["range_saving_pct"] = [round(100 * (u - max(ends)) / u, 2), round(100 * (u - min(ends)) / u, 2)]


def _markers(g: gr.Graph) -> np.ndarray:
    """The begin and end markers of the counted steps (task ids): what a step time is measured between."""
    return np.array([t for _, _, b, e, c in g.steps if c for t in (b, e)], dtype=np.int64)


def _sync_saving_bound(pr: _Pricer, arrs: Arrays, d0: np.ndarray) -> float:
    """The most ``no_host_sync`` can save, % of the step without the profiler: the median over the counted steps of
    the smaller of two bounds. The step less its floor under the rewrite (:func:`_floors`: no step beats its
    busiest resource's work, however the host and the GPU overlap); and, over the ranks, the most time the host
    spends blocked in the step's waits plus what the rewrite takes off its copy calls (a synced step is the host's
    work plus its wait; running ahead overlaps the two, so it gains at most the wait; a rank that waits for
    another in a collective gains at most what that one gains)."""
    g = pr.g
    floor = _floors(g, arrs[0], arrs[1], pr.groups)
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
    vals = [100 * min(pr.est[s] - floor.get(s, 0.0), per.get(s, 0.0)) / pr.est[s] for s in pr.m_long
            if pr.est.get(s)]
    return max(0.0, float(np.median(vals))) if vals else 100.0


def _on_path_changes(pr: _Pricer, arrs: Arrays, base: Arrays, starts: np.ndarray | None = None) -> bool:
    """Whether the rewrite ``arrs`` (and the pinned starts ``starts``) changes a duration, chain gap, transfer or
    start of a task on the base replay's critical paths (:func:`traceanalyze.replay.simulate.on_critical_paths`);
    True when those paths are unknown. False means the replay would return the base step times to the bit."""
    if pr.on_path is None:
        return True
    g, (d0, cg0, tr0) = pr.g, base
    ch = (arrs[0] != d0) | (arrs[1] != cg0)
    if starts is not None:
        ch |= starts != g.start
    ct = np.flatnonzero(g.inst >= 0)
    if ct.size and arrs[2] is not tr0:
        ch[ct] |= arrs[2][g.inst[ct]] != tr0[g.inst[ct]]
    return bool((ch & pr.on_path).any())


def _price_scenarios(pr: _Pricer, applicable: list[str], ctx: dict, base: Arrays, measured: dict, results: list,
                     err: float, reliable: bool) -> list[dict]:
    """The ``whatif`` rows of the applicable scenarios, each alone, then ``all`` together (when several); each
    replay's step times are appended to ``results`` (``sim_result`` rows)."""
    g, (d0, cg0, tr0), m_run, run_id = pr.g, base, pr.m_run, pr.g.run_id
    whatif: list[dict] = []
    n_steps = max(1, len(pr.m_long))
    for sc in [*applicable, *(["all"] if len(applicable) > 1 else [])]:
        if sc == "all":
            # a fix that saves less than the step-to-step noise leaves "all" at the other fix, within that noise
            if sum(w["scenario"] != "all" and w["saving_pct"] > pr.noise_pct for w in whatif) < 2:
                break  # one fix that saves anything: "all" would replay it again
            arrs: Arrays = (d0, cg0, tr0)
            for s in _combined(applicable, pr.skipped):
                arrs = REWRITES[s](g, *arrs, ctx)
        elif sc == "bf16_channels_last" and not any(w["scenario"] == "bf16_matmul" for w in whatif):
            # channels_last is offered with bf16 autocast: where bf16 alone saves nothing, neither is priced
            pr.skipped[sc] = pr.skipped.get("bf16_matmul", NO_SAVING)
            continue
        else:
            arrs = REWRITES[sc](g, d0, cg0, tr0, ctx)
            # a replay never saves more than the work the rewrite removes: a precision fix that removes less than
            # MIN_PRECISION_PCT of the step (within a run's step-to-step noise) is not replayed
            if sc in PRECISION_SCENARIOS and g.mode == "gpu" and \
                    float(np.clip(d0 - arrs[0], 0, None).sum()) / n_steps < max(MIN_SAVING_US,
                                                                                MIN_PRECISION_PCT / 100 * m_run):
                pr.skipped[sc] = (f"{NO_SAVING}: the {sc} rewrite removes less than {MIN_PRECISION_PCT:g} % of the "
                                  "step's work (within a run's step-to-step noise), so it was not replayed")
                continue
        if sc == "no_host_sync" and (bound := _sync_saving_bound(pr, arrs, d0)) <= pr.noise_pct:
            pr.skipped[sc] = (f"{NO_SAVING}: removing the waits saves at most {bound:.2f} % of the step (the time "
                              "the host waits and copies, and no step below its busiest resource's work), within "
                              "the step-to-step noise "
                              f"({pr.noise_pct:.2f} %), so it was not replayed")
            continue
        aligned = sc == "aligned_step_starts" or (sc == "all" and "aligned_step_starts" in applicable)
        starts = _aligned_starts(g, ctx) if aligned else None
        cut = np.clip(cg0 - arrs[1], 0, None) if aligned else None
        if sc not in ("all", "no_host_sync") and not _on_path_changes(pr, arrs, (d0, cg0, tr0), starts):
            pr.skipped[sc] = (f"{NO_SAVING}: none of the work the {sc} rewrite changes is on the critical path of "
                              "the replayed steps, so it cannot shorten them (not replayed)")
            continue
        pred, t, clamped = pr.predict(arrs, sync_free=sc == "no_host_sync" or
                                      (sc == "all" and "no_host_sync" in applicable), starts=starts,
                                      cut=cut)
        results += [[run_id, sc, r, s, measured[(r, s)], t[(r, s)]] for r, s in sorted(measured)]
        row = _whatif_row(g, sc, ctx, pred, pr.u_run, err, reliable)
        row["unexplained_gap_pct"] = pr.kept_on_path
        row["profiled_predicted_step_time_us"] = round(max(m_run - (pr.u_run - pred), 0.0), 3)
        row["profiled_saving_pct"] = round(100 * (pr.u_run - pred) / m_run, 2) if m_run else 0.0
        if clamped:
            row["assumptions"] += ("; clamped to the floor: no step shorter than the busy time of the work this "
                                   "fix leaves (each GPU stream's kernels, the host's remaining work)")
        if sc in PRECISION_SCENARIOS:
            _add_range(row, pr, sc, pred, arrs, (d0, cg0, tr0), ctx)
        if sc == "bf16_channels_last":
            _split_note(row, whatif)
        if row["saving_us"] >= MIN_SAVING_US or sc == "all":
            whatif.append(row)
        else:
            pr.skipped[sc] = (f"{NO_SAVING}: the {sc} rewrite saves less than {MIN_SAVING_US:g} µs per step on the "
                              "replayed graph (other work bounds the step)")
    return whatif


def _combined(applicable: list[str], skipped: dict[str, str]) -> list[str]:
    """The scenarios ``all`` combines: the applicable ones, less ``bf16_channels_last`` where bf16 alone was not
    priced (it is offered with bf16 only), less those a combined one does all of (:data:`SUPERSEDES`: bf16 does what
    TF32 does, bf16 + channels_last what bf16 alone does)."""
    used = [s for s in applicable if not (s == "bf16_channels_last" and "bf16_matmul" in skipped)]
    return [s for s in used if not any(s in SUPERSEDES.get(o, ()) for o in used)]


def _split_note(row: dict, whatif: list[dict]) -> None:
    """The ``bf16_channels_last`` row's assumptions say which change carries its saving: bf16 alone (the
    ``bf16_matmul`` row, priced before it), and what channels_last adds, in points of the step."""
    alone = next((w for w in whatif if w["scenario"] == "bf16_matmul"), None)
    if alone is not None:
        row["assumptions"] += (f"; bf16 alone (bf16_matmul) {alone['saving_pct']:.1f} %, + channels_last "
                               f"{row['saving_pct']:.1f} %: channels_last adds "
                               f"{row['saving_pct'] - alone['saving_pct']:.1f} points")


def _floors(g: gr.Graph, d: np.ndarray, cg: np.ndarray, groups: tuple | None = None) -> dict[int, float]:
    """Per counted step: the busy time no replay of these durations can beat, µs: the longest, over ranks, of each
    GPU stream's kernels, copies and sets in the step (``d``) and of each host thread's tasks and the gaps before
    them (``d + cg``: its remaining work). A step is never shorter than the work its busiest resource must do.
    GPU runs only (``{}`` for CPU runs, whose replay of measured ops already holds each thread's work).
    ``groups``: :func:`_floor_groups` of ``g`` when already computed."""
    groups = groups if groups is not None else _floor_groups(g)
    if groups is None:
        return {}
    sel, dev, _, _ = groups
    return _busiest(groups, np.where(dev, d[sel], d[sel] + cg[sel]))


def _busiest(groups: tuple, w: np.ndarray) -> dict[int, float]:
    """Step -> the largest sum of ``w`` (per task of ``groups``' selection) over one resource in that step."""
    _, _, inv, steps = groups
    busy = np.bincount(inv, weights=w, minlength=steps.size)
    out: dict[int, float] = {}
    for step, b in zip(steps.tolist(), busy.tolist(), strict=True):
        out[step] = max(out.get(step, 0.0), b)
    return out


def _gpu_busy_us(groups: tuple | None, d: np.ndarray, m_long: dict) -> float | None:
    """Median over the counted steps of the busiest GPU stream's kernels, copies and sets in the step (µs), or
    None (a CPU run, no device work)."""
    if groups is None:
        return None
    sel, dev, _, _ = groups
    per = _busiest(groups, np.where(dev, d[sel], 0.0))
    vals = [per[s] for s in m_long if per.get(s)]
    return round(float(np.median(vals)), 3) if vals else None


def _floor_groups(g: gr.Graph) -> tuple | None:
    """(the tasks a floor sums, which of them are device tasks, each one's (resource, step) group, each group's
    step): the same for every rewrite of ``g``, so :class:`_Pricer` computes it once; None for CPU runs or
    without such tasks."""
    if g.mode != "gpu":
        return None
    dev_all = np.isin(g.kind, (gr.K_KERNEL, gr.K_MEMCPY, gr.K_MEMSET))
    sel = np.flatnonzero((g.step >= 0) & (dev_all | (g.kind == gr.K_HOST)))
    if sel.size == 0:
        return None
    width = int(g.step.max(initial=0)) + 2
    keys, inv = np.unique(g.res[sel].astype(np.int64) * width + g.step[sel], return_inverse=True)
    return sel, dev_all[sel], inv.reshape(-1), keys % width


def _events_per_step(g: gr.Graph, counted: set) -> float | None:
    """Median over counted (rank, step) of the profiler-recorded host events, or None."""
    if g.prof_events is None:
        return None
    ev = g.prof_events[:3].sum(axis=0)  # events (row 3 counts the shapes they copied)
    sel = (g.step >= 0) & (ev > 0)
    if not sel.any():
        return None
    width, keys, inv = gr.rank_step_groups(g, np.flatnonzero(sel))
    tot = np.bincount(inv, weights=ev[sel])
    vals = [v for k, v in zip(keys.tolist(), tot.tolist(), strict=True) if divmod(k, width) in counted]
    return round(float(np.median(vals)), 1) if vals else None


def _replay_model(g: gr.Graph, base: simulate.Replay, measured: dict, base_t: dict, counted: set, m_run: float,
                  b_run: float, err: float) -> dict:
    """The JSON contract's ``replay``: the replay's fidelity against the measured step times, run and ranks."""
    ranks = []
    by_rank: dict[int, list] = {}
    for k in sorted(counted):  # once: sorting per rank was quadratic (0.5 s at 1,024 ranks)
        by_rank.setdefault(k[0], []).append(k)
    for r in g.ranks:
        ms = [measured[k] for k in by_rank.get(r, [])]
        bs = [base_t[k] for k in by_rank.get(r, [])]
        if ms:
            ranks.append({"rank": r, "measured_step_time_us": round(median(ms), 3),
                          "replayed_step_time_us": round(median(bs), 3),
                          "error_pct": round(abs(median(bs) - median(ms)) / median(ms) * 100, 2)})
    replay_model = {
        "measured_step_time_us": round(m_run, 3), "replayed_step_time_us": round(b_run, 3),
        "error_pct": round(err, 2), "ranks": ranks, "unmatched": list(g.unmatched),
        "missing_edges": list(g.missing_edges), "partial": g.partial, "collective_instances": g.n_instances,
        "tasks": int(g.start.size), "edges": int(g.dep_src.size), "passes": base.passes,
        "converged": base.converged, "reliable": err <= UNRELIABLE_ERROR_PCT and base.converged}
    if not base.converged:
        replay_model["unmatched"].append(f"the replay did not settle in {base.passes} passes")
    return replay_model


def _whatif_row(g: gr.Graph, sc: str, ctx: dict, pred: float, m_run: float, err: float, reliable: bool) -> dict:
    """One row of the JSON contract's ``whatif``: the scenario's predicted step time and saving; ``reliable`` false
    with ``unreliable_reason`` when the replay misses the measured step or did not settle, or when the fix changes
    how many ranks compute at once on ranks that share CPU cores (``ctx["core_sharing"]``)."""
    row = {"scenario": sc, "cause": CAUSES[sc], "predicted_step_time_us": round(pred, 3),
           "saving_pct": round(100 * (m_run - pred) / m_run, 2), "saving_us": round(m_run - pred, 3),
           "assumptions": _assumptions(sc, ctx, g),
           "confidence": {"replay_error_pct": round(err, 2), "collective_instances": g.n_instances},
           "reliable": reliable}
    why = []
    if not reliable:
        why.append(f"the replay misses the measured step time by {err:.1f} % (over {UNRELIABLE_ERROR_PCT:g} %)"
                   if err > UNRELIABLE_ERROR_PCT else "the replay did not settle")
    cs = ctx.get("core_sharing") or {}
    if g.mode == "cpu" and cs.get("shared") and _changes_concurrency(sc, ctx):
        why.append(cs.get("why") or "the ranks share CPU cores")
    if why:
        row["reliable"] = False
        row["unreliable_reason"] = "; ".join(why)
    return row


LANE_SEGMENTS = 400  # segments drawn per rank lane at most (the longest kept)
LABELS = ("compute", "host", "wait", "communication", "transfer", "dataloader", "compile", "optimizer", "launch")
_GAP_TO_LABEL = np.array([LABELS.index(x) if x in LABELS else 1 for x in gr.GAP_LABELS], np.int64)


def _task_labels(g: gr.Graph, idx: np.ndarray) -> np.ndarray:
    """Label code (:data:`LABELS`) of each task in ``idx``: its category when over half its time, else compute
    (host ops of CPU runs, device work) or host (runtime calls of GPU runs)."""
    lab = np.full(idx.size, 0 if g.mode != "gpu" else 1, np.int64)
    lab[g.kind[idx] != gr.K_HOST] = 0
    for c in ("optimizer", "compile", "dataloader"):
        lab[g.cover[c][idx] > 0.5 * g.dur[idx]] = LABELS.index(c)
    lab[g.kind[idx] == gr.K_COLL] = LABELS.index("communication")
    return lab


def _merge(start: np.ndarray, length: np.ndarray, lab: np.ndarray, crit: np.ndarray, tiny: float) -> list[list]:
    """Adjacent segments of one label and critical-path flag joined, and segments shorter than ``tiny`` µs
    folded into the one before: a lane stays a few dozen shapes whatever the op count. Input sorted by start."""
    if start.size == 0:
        return []
    end = start + length
    new = np.ones(start.size, dtype=bool)
    prev_end = np.maximum.accumulate(end)[:-1]
    joined = (start[1:] - prev_end <= tiny) & (((lab[1:] == lab[:-1]) & (crit[1:] == crit[:-1])) | (length[1:] < tiny))
    new[1:] = ~joined
    heads = np.flatnonzero(new)
    ends = np.maximum.reduceat(end, heads)
    return [[round(float(a), 1), round(float(b - a), 1), LABELS[int(c)], bool(k)]
            for a, b, c, k in zip(start[heads], ends, lab[heads], crit[heads], strict=True)]


def _picture(g: gr.Graph, rp: simulate.Replay, measured, counted, m_long, sk: skew.Skew | None = None) -> dict:
    """Lanes of the median counted step (one per rank shown; host thread of the step, then collectives), replayed
    times relative to the step's earliest start, critical-path tasks marked.

    At most :data:`~traceanalyze.metrics.where.MAX_TIMELINE_LANES` ranks are drawn, as in the measured timeline
    (:func:`~traceanalyze.metrics.where.lanes_to_show`): the rank that kept the others waiting, the slowest rank,
    the fastest, then ranks spread evenly; ``n_ranks`` says how many had the step. ``critical`` (the ★) marks the
    rank that kept the others waiting longest in that step (``sk``: :func:`.skew.collective_skew`, the others'
    waits summed at the instances it arrived last), never the one that waited: the slowest rank's step is the
    longest because it waits; none is marked when no rank kept another waiting (``kept_waiting_rank`` None)."""
    if not m_long:
        return {}
    steps_sorted = sorted(m_long, key=lambda s: m_long[s])
    step = steps_sorted[(len(steps_sorted) - 1) // 2]
    marks = {r: (b, e) for r, s, b, e, c in g.steps if s == step and (r, s) in counted}
    if not marks:
        return {}
    t0 = min(rp.start[b] for b, _ in marks.values())
    slow = max(marks, key=lambda r: rp.start[marks[r][1]] - rp.start[marks[r][0]])
    fast = min(marks, key=lambda r: rp.start[marks[r][1]] - rp.start[marks[r][0]])
    kept = {r: w for r, w in (sk.kept_in_step(step) if sk is not None else {}).items() if r in marks and w > 0}
    star = max(sorted(kept), key=lambda r: kept[r]) if kept else None
    show = set(lanes_to_show(sorted(marks), [r for r in (star, slow, fast) if r is not None], MAX_TIMELINE_LANES))
    on_path = np.zeros(g.start.size, dtype=bool)
    on_path[simulate.critical_path(g, rp, marks[slow][1], rp.start[marks[slow][0]])] = True
    waits = np.zeros(g.start.size, dtype=bool)
    waits[g.dep_dst[g.dep_type >= 1]] = True
    ct = np.flatnonzero(g.kind == gr.K_COLL)
    lanes = []
    for r in sorted(show):
        b, e = marks[r]
        lo, hi = rp.start[b], rp.start[e]
        tiny = (hi - lo) / 1000
        host = np.arange(b + 1, e)  # the step's thread: tasks between its markers (resource order)
        gp = host[(g.gap[host] > 0) & ~g.first[host]]
        gap_start = np.maximum(rp.end[gp - 1], lo)
        gap_lab = np.where(g.gap_label[gp] >= 0, _GAP_TO_LABEL[np.clip(g.gap_label[gp], 0, None)], 1)
        gap_lab[waits[gp]] = LABELS.index("wait")
        st = np.concatenate([gap_start, rp.start[host]])
        ln = np.concatenate([rp.start[gp] - gap_start, rp.end[host] - rp.start[host]])
        lab = np.concatenate([gap_lab, _task_labels(g, host)])
        crit = np.concatenate([on_path[gp], on_path[host]])
        o = np.argsort(st, kind="stable")
        keep = ln[o] > 0
        top = _merge(st[o][keep] - t0, ln[o][keep], lab[o][keep], crit[o][keep], tiny)
        cc = ct[(g.rank[ct] == r) & (rp.start[ct] >= lo) & (rp.start[ct] < hi)]
        cc = cc[np.argsort(rp.start[cc], kind="stable")]
        bottom = _merge(rp.start[cc] - t0, rp.end[cc] - rp.start[cc], np.full(cc.size, LABELS.index("transfer")),
                        on_path[cc], tiny)
        segs = [[*x, 0] for x in top] + [[*x, 1] for x in bottom]
        if len(segs) > LANE_SEGMENTS:
            keep_i = sorted(range(len(segs)), key=lambda k: (-segs[k][3], -segs[k][1]))[:LANE_SEGMENTS]
            segs = [segs[k] for k in sorted(keep_i)]
        lanes.append({"rank": r, "step_us": round(float(hi - lo), 1), "start_us": round(float(lo - t0), 1),
                      "end_us": round(float(hi - t0), 1), "critical": r == star, "segments": segs})
    span = max(ln["end_us"] for ln in lanes) or 1.0
    return {"step": step, "span_us": span, "lanes": lanes, "slowest_rank": slow, "kept_waiting_rank": star,
            "kept_waiting_us": round(kept[star], 1) if star is not None else None, "n_ranks": len(marks)}


__all__ = ["CAUSES", "CPU_BF16_SPEEDUP", "SCENARIOS", "replay_run"]
