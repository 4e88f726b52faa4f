"""Replay a :class:`~traceanalyze.replay.graph.Graph`: event-driven list scheduling in the measured order of each
resource (Lumos, MLSys 2025, Algorithm 1; dPRO ``Replayer``), vectorised per resource.

Each task starts at ``max(end of the previous task of its resource + chain gap, (start or end) of each explicit
predecessor + its offset)``; a resource's first task without an incoming edge starts where it was measured. A
complete collective instance starts on every participant at the latest participant's ready time and lasts its
transfer time, so its end = latest ready + transfer (straggler paper, OSDI 2025, §3.2), never the measured kernel
duration, which holds the waiting.

Along one resource the recurrence ``s_k = max(s_{k-1} + d_{k-1} + g_k, R_k)`` is a running maximum
(``s = c + maximum.accumulate(R − c)`` with ``c`` the cumulative durations and gaps), so a pass over all tasks is
a few NumPy calls per resource. Explicit edges and rendezvous make ``R`` depend on other resources: passes repeat
until no start moves (a fixed point: the times only grow from the first pass, and each pass settles at least the
next cross-resource dependency in time order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traceanalyze.replay.graph import K_COLL, Graph

MAX_PASSES = 400  # a pass settles at least one more cross-resource dependency; real graphs settle in far fewer
TOLERANCE_US = 1e-3


@dataclass
class Replay:
    """Replayed start and end (µs) per task, the passes it took, and whether it settled."""

    start: np.ndarray
    end: np.ndarray
    passes: int
    converged: bool

    def step_times(self, g: Graph) -> dict[tuple[int, int], float]:
        """(rank, step) -> replayed duration (µs) of that ``ProfilerStep#N`` (its end marker − begin marker)."""
        return {(r, s): float(self.start[e] - self.start[b]) for r, s, b, e, _ in g.steps}


def replay(g: Graph, dur: np.ndarray | None = None, gap: np.ndarray | None = None,
           transfer: np.ndarray | None = None, keep_binding: bool = False) -> Replay:
    """Replay ``g`` with the given per-task durations and chain gaps (µs; default the measured ones) and per-instance
    transfer times (default the measured transfer).

    Returns:
        :class:`Replay`; with ``keep_binding`` it also carries ``binding`` (per task: the task whose time set its
        start, -1 for none) for :func:`critical_path`.
    """
    n = g.start.size
    d = (g.chain_dur if dur is None else dur).astype(float).copy()
    cg = (g.chain_gap if gap is None else gap).astype(float)
    tr = g.inst_transfer if transfer is None else transfer
    ct = np.flatnonzero(g.inst >= 0)
    ci = g.inst[ct]
    d[ct] = tr[ci]
    first = g.first
    inc = np.zeros(n)
    if n > 1:
        inc[1:] = d[:-1] + cg[1:]
    inc[first] = 0.0
    cs = np.cumsum(inc)
    seg_first = np.maximum.accumulate(np.where(first, np.arange(n), 0)) if n else np.zeros(0, np.int64)
    c = cs - cs[seg_first]
    # one running maximum over all resources: resource i's values are lifted by i x span, so no maximum crosses
    # into the next resource (float64 keeps 1e-6 µs at 1e10 µs)
    span = float(np.ptp(g.start)) + float(c.max(initial=0.0)) + 1e6 if n else 1.0
    seg_off = (np.cumsum(first) - 1) * (4 * span)
    floor = -2 * span
    # a resource's first task starts where it was measured unless an edge says when (a launch, a wait)
    pinned = first.copy()
    pinned[g.dep_dst] = False
    r0 = np.full(n, -np.inf)
    r0[pinned] = g.start[pinned]
    # explicit edges grouped by destination once
    o = np.argsort(g.dep_dst, kind="stable")
    dsrc, ddst, dend, doff = g.dep_src[o], g.dep_dst[o], g.dep_end[o], g.dep_off[o]
    udst, ustart = np.unique(ddst, return_index=True) if ddst.size else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    n_inst = tr.size
    m_ready = np.full(n_inst, -np.inf)
    s = np.full(n, -np.inf)
    e = s
    converged = False
    passes = 0
    prev_ct = np.clip(ct - 1, 0, None)
    ct_first = first[ct]
    for passes in range(1, MAX_PASSES + 1):  # noqa: B007
        r = r0.copy()
        if udst.size:
            vals = np.where(dend, e[dsrc] if passes > 1 else -np.inf, s[dsrc]) + doff
            vals = np.nan_to_num(vals, nan=-np.inf)
            r[udst] = np.maximum(r[udst], np.maximum.reduceat(vals, ustart))
        r_dep = r[ct].copy()
        if ct.size:
            r[ct] = np.maximum(r[ct], m_ready[ci])
        new_s = _seg_running_max(r - c, seg_off, floor) + c
        new_e = new_s + d
        if ct.size:
            ready = np.maximum(np.where(ct_first, -np.inf, new_e[prev_ct] + cg[ct]), r_dep)
            new_m = np.full(n_inst, -np.inf)
            np.maximum.at(new_m, ci, ready)
        else:
            new_m = m_ready
        with np.errstate(invalid="ignore"):  # -inf - -inf: a task still without a start did not move
            moved = np.nanmax(np.abs(np.nan_to_num(new_s - s, nan=0.0, posinf=1e18, neginf=1e18))) if n else 0.0
        s, e, m_ready = new_s, new_e, new_m
        if passes > 1 and moved < TOLERANCE_US:
            converged = True
            break
    out = Replay(start=s, end=e, passes=passes, converged=converged)
    if keep_binding:
        out.binding = _binding(g, s, e, d, cg, ct, ci, dsrc, ddst, dend, doff)  # type: ignore[attr-defined]
    return out


def _seg_running_max(v: np.ndarray, seg_off: np.ndarray, floor: float) -> np.ndarray:
    """Running maximum of ``v`` restarted at each resource (see :func:`replay`); -inf stays -inf."""
    low = v < floor
    out = np.maximum.accumulate(np.where(low, floor, v) + seg_off) - seg_off
    out[out <= floor] = -np.inf
    return out


def _binding(g: Graph, s, e, d, cg, ct, ci, dsrc, ddst, dend, doff) -> np.ndarray:
    """Per task, the predecessor whose time set its start (-1: its measured first start)."""
    n = s.size
    best = np.full(n, -np.inf)
    who = np.full(n, -1, np.int64)
    chain = np.full(n, -np.inf)
    chain[1:] = e[:-1] + cg[1:]
    chain[g.first] = -np.inf
    best, who = chain.copy(), np.where(g.first, -1, np.arange(n) - 1)
    if ddst.size:
        vals = np.where(dend, e[dsrc], s[dsrc]) + doff
        o = np.lexsort((vals, ddst))
        last = np.ones(o.size, dtype=bool)
        last[:-1] = ddst[o][1:] != ddst[o][:-1]
        top = o[last]
        dd, vv, ss = ddst[top], vals[top], dsrc[top]
        better = vv > best[dd] + TOLERANCE_US
        best[dd[better]] = vv[better]
        who[dd[better]] = ss[better]
    if ct.size:
        # the last participant to arrive sets the instance's start on every other participant
        ready = s[ct]
        o = np.lexsort((ready, ci))
        last = np.ones(o.size, dtype=bool)
        last[:-1] = ci[o][1:] != ci[o][:-1]
        arr = {int(ci[i]): int(ct[i]) for i in o[last].tolist()}
        lateness = np.array([arr[int(m)] for m in ci.tolist()])
        mine = lateness != ct
        later = s[ct] > best[ct] + TOLERANCE_US
        sel = mine & later
        who[ct[sel]] = lateness[sel]
    return who


def critical_path(g: Graph, rp: Replay, end_task: int, stop_us: float) -> list[int]:
    """Tasks on the path that set ``end_task``'s start, walking the binding predecessors back to ``stop_us``."""
    who = rp.binding  # type: ignore[attr-defined]
    path: list[int] = []
    t = end_task
    seen = set()
    while t >= 0 and t not in seen and rp.start[t] >= stop_us - TOLERANCE_US and len(path) < 100_000:
        seen.add(t)
        path.append(t)
        t = int(who[t])
    return path


__all__ = ["Replay", "critical_path", "replay", "K_COLL"]
