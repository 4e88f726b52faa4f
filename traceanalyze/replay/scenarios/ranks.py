"""The what-ifs between ranks: ``no_straggler`` (the straggler ranks' work at their peers'), ``aligned_step_starts``
(the ranks that enter the step late start with the others) and ``ideal_interconnect`` (collectives at the link's
expected bandwidth). Design: ``shared/WHATIF.md`` §5-6, ``docs/replay.md``."""

from __future__ import annotations

import numpy as np

from traceanalyze.replay import graph as gr
from traceanalyze.replay import simulate
from traceanalyze.replay.scenarios.base import Scenario

STRAGGLER_EXCESS_PCT = 25.0  # a rank working this much longer per step than the median rank is a straggler
# (4 gloo ranks on 2 cores differ by up to ~20 % from scheduling alone: sample_traces/healthy)
LATE_ENTRY_PCT = 10.0  # a rank whose step begins this share of the median step after the median rank's enters late
STRAGGLER_TEST = f"working host time per step > {STRAGGLER_EXCESS_PCT:g} % over the median rank"
LATE_ENTRY_TEST = f"step begins ≥ {LATE_ENTRY_PCT:g} % of the step after the median rank's"


def _busy_us(g: gr.Graph) -> dict[int, float]:
    """Per rank: median over its counted steps of the host time it spends working (host tasks and the gaps
    between them, waits left out), µs."""
    host = np.flatnonzero((g.kind == gr.K_HOST) & (g.step >= 0))
    width, keys, inv = gr.rank_step_groups(g, host)  # every (rank, step) of the host tasks, then the counted ones
    per = np.bincount(inv, weights=g.chain_dur[host] + g.chain_gap[host], minlength=keys.size)
    hit = np.isin(keys, np.array([r * width + s for r, s, _, _, c in g.steps if c], dtype=np.int64))
    return _medians_by(keys[hit] // width, per[hit]) if hit.any() else {}


def _medians_by(group: np.ndarray, vals: np.ndarray) -> dict[int, float]:
    """Group -> ``np.median`` of its ``vals`` (``group`` ascending), every group in one sort: the middle value, or
    the mean of the two middle ones, as ``np.median`` computes them (a ``np.median`` per rank took 10 ms at 256
    ranks); a group holding a NaN by ``np.median`` itself."""
    ids, first, n = np.unique(group, return_index=True, return_counts=True)
    v = vals[np.lexsort((vals, group))]
    mid = (v[first + (n - 1) // 2] + v[first + n // 2]) / 2
    out = dict(zip(ids.astype(np.int64).tolist(), mid.tolist(), strict=True))
    for i in np.flatnonzero(np.add.reduceat(np.isnan(vals), first) > 0).tolist() if vals.size else ():
        out[int(ids[i])] = float(np.median(vals[first[i]:first[i] + n[i]]))
    return out


def _stragglers(g: gr.Graph) -> set[int]:
    """Ranks whose working host time per step is more than :data:`STRAGGLER_EXCESS_PCT` above the median rank's."""
    busy = _busy_us(g)
    if len(busy) < 2:
        return set()
    mid = float(np.median(list(busy.values())))
    return {r for r, b in busy.items() if b > mid * (1 + STRAGGLER_EXCESS_PCT / 100)}


def _straggler_ranks(g: gr.Graph, ctx: dict) -> set[int]:
    """The ranks ``no_straggler`` rewrites: those the straggler finding names (``ctx["stragglers"]``, priced for
    it by the replay's late pricer), else the replay's own test (:func:`_stragglers`)."""
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
    for it by the replay's late pricer), else the replay's own test (:func:`_late_entries`)."""
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


def _rw_interconnect(g, d, cg, tr, ctx):
    ideal = gr.ideal_transfer_us(g, ctx["link_gbps"])
    return d, cg, np.where(g.inst_bytes > 0, np.minimum(tr, ideal), tr)


def _named(ranks: set[int], ctx: dict, key: str, words: str, test: str) -> str:
    """``1, 3 (why)``: the ranks a rewrite of named ranks changes, and whether a finding named them (``ctx[key]``)
    or the replay's own test did."""
    return f"{', '.join(str(r) for r in sorted(ranks))} ({f'named by the {words} finding' if ctx.get(key) else test})"


def _straggler_assumptions(ctx: dict, g: gr.Graph) -> str:
    named = _named(_straggler_ranks(g, ctx), ctx, "stragglers", "straggler", STRAGGLER_TEST)
    return (f"straggler rank(s) {named}: each op class (step, name, n-th call) and the gap before it at the mean of "
            "the other ranks, work they do not do removed; the other ranks unchanged; each collective's transfer at "
            "the median of its size class")


def _aligned_assumptions(ctx: dict, g: gr.Graph) -> str:
    named = _named(_late_ranks(g, ctx), ctx, "late_ranks", "late-entry", LATE_ENTRY_TEST)
    return (f"late rank(s) {named}: their first traced step starts with the other ranks' median (the delay before "
            "the trace, which it does not show, assumed to go), and in every step the host gap after their last task "
            "before the step ends, the gap between steps and the gap before their first task at most the other "
            "ranks' median; the work inside the steps and the other ranks unchanged")


def _interconnect_why_not(g: gr.Graph, ctx: dict) -> str:
    if not ctx.get("link_gbps"):
        return "the link's expected bandwidth is unknown (pass --link-bw GB/s)"
    return "no collective in the replayed steps states its message size"


NO_STRAGGLER = Scenario(
    name="no_straggler", cause="imbalance: straggler ranks", rewrite=_rw_straggler,
    applies=lambda g, ctx: bool(_stragglers(g)),
    why_not=lambda g, ctx: (f"no rank's working host time per step is more than {STRAGGLER_EXCESS_PCT:g} % over the "
                            "median rank's (the replay's straggler test)"),
    assumptions=_straggler_assumptions, kinds=("straggler", "idle_rank"), rank_kinds=("straggler",),
    ranks_ctx="stragglers", ranks_finding="straggler", changes_concurrency=True, collective_waits=True)
ALIGNED_STEP_STARTS = Scenario(
    name="aligned_step_starts", cause="imbalance: ranks that enter the step late (work between steps)",
    rewrite=_rw_aligned, applies=lambda g, ctx: bool(_late_entries(g)),
    why_not=lambda g, ctx: (f"no rank's step begins {LATE_ENTRY_PCT:g} % of the step or more after the median "
                            "rank's in most counted steps (the replay's late-entry test)"),
    assumptions=_aligned_assumptions, kinds=("late_entry",), rank_kinds=("late_entry",), ranks_ctx="late_ranks",
    ranks_finding="late-entry", changes_concurrency=True, collective_waits=True,
    one_step_caveat=("one traced step: the late start comes from before it, which the trace does not show; the "
                     "saving assumes that delay goes"),
    starts=_aligned_starts)
IDEAL_INTERCONNECT = Scenario(
    name="ideal_interconnect", cause="interconnect: slow collectives", rewrite=_rw_interconnect,
    applies=lambda g, ctx: bool(ctx.get("link_gbps")) and bool((g.inst_bytes > 0).any()),
    why_not=_interconnect_why_not,
    assumptions=lambda ctx, g: (f"transfer = bytes × busbw factor ÷ {ctx['link_gbps']:g} GB/s "
                                f"({ctx['link_source']}), capped at the measured transfer; latency term ignored"),
    kinds=("slow_collectives", "topology"), changes_concurrency=True, collective_waits=True)
SCENARIOS = (NO_STRAGGLER, ALIGNED_STEP_STARTS, IDEAL_INTERCONNECT)


def comparable_busbw(subject: list, baseline: list) -> tuple[float, float, int] | None:
    """(subject's busbw, baseline's busbw, calls of the baseline) in GB/s over the collectives both runs call with
    the same operation and message size (:class:`traceanalyze.metrics.collectives.CollectiveSummary` rows: the
    ``collective_calls`` table): each run's median over those calls, each (operation, size) weighted by its call
    count. busbw as nccl-tests defines it (algbw × the operation's bus factor, e.g. 2(n−1)/n for all_reduce).
    None when no (operation, size) with a busbw is in both."""
    def by_key(rows: list) -> dict:
        return {(c.collective, c.size_bytes): c for c in rows
                if c.size_bytes and c.busbw_gbps is not None and c.busbw_gbps > 0 and c.count > 0}

    s, b = by_key(subject), by_key(baseline)
    keys = sorted(set(s) & set(b), key=str)
    if not keys:
        return None

    def median(rows: list) -> float:
        return float(np.median([c.busbw_gbps for c in rows for _ in range(min(c.count, 10_000))]))
    return median([s[k] for k in keys]), median([b[k] for k in keys]), sum(b[k].count for k in keys)


def link_from_baseline(stated: dict, subject: list, baseline_name: str, baseline: list) -> dict:
    """The link ``ideal_interconnect`` prices the subject with when it is compared with a baseline (``--baseline``):
    the baseline's measured busbw over the collectives both runs call alike (:func:`comparable_busbw`), when it is
    higher than the subject's (the baseline fixes the interconnect: its busbw is the bandwidth the fix restores),
    else ``stated`` (the link the run's sidecars or GPU state, ``logs.sidecars.expected_link``) unchanged. The
    stated figure stays in the dict (``stated_gbps``, ``stated_source``). ``subject``/``baseline``: the runs'
    collective summaries (``collective_calls``)."""
    got = comparable_busbw(subject, baseline)
    if got is None or not got[1] > got[0]:
        return stated
    sub, base, n = got
    return {"expected_gbps": round(base, 4), "from_baseline": True,
            "source": (f"link from baseline: {base:.3g} GB/s busbw, median of {n} comparable collective call"
                       f"{'s' if n != 1 else ''} of {baseline_name} (nccl-tests busbw; {sub:.3g} GB/s here)"),
            "stated_gbps": stated.get("expected_gbps"), "stated_source": stated.get("source")}
