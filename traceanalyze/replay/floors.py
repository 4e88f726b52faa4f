"""The floors of a replayed step (:func:`step_floors`): the busy time of each step's busiest resource, which no
prediction of a rewrite goes below (:class:`traceanalyze.replay.whatif._Pricer`), and the GPU's busy time per
step (:func:`gpu_busy_us`, the run's ``profiler_overhead.gpu_busy_us``)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from traceanalyze.replay import graph as gr


def step_floors(g: gr.Graph, d: np.ndarray, cg: np.ndarray, groups: tuple | None = None) -> dict[int, float]:
    """Per counted step: the busy time no replay of these durations can beat, µs: the longest, over ranks, of each
    GPU stream's kernels, copies and sets in the step (``d``) and of each host thread's tasks and the gaps before
    them (``d + cg``: its remaining work). A step is never shorter than the work its busiest resource must do.
    GPU runs only (``{}`` for CPU runs, whose replay of measured ops already holds each thread's work).
    ``groups``: :func:`floor_groups` of ``g`` when already computed."""
    groups = groups if groups is not None else floor_groups(g)
    if groups is None:
        return {}
    w = d[groups.sel]
    w[groups.host] += cg[groups.host_tasks]  # host threads: their tasks and the gaps before them
    return _busiest(groups, w)


def _busiest(groups: FloorGroups, w: np.ndarray) -> dict[int, float]:
    """Step -> the largest sum of ``w`` (per task of ``groups``' selection) over one resource in that step, at
    least 0 (steps in the order their first group comes)."""
    busy = np.bincount(groups.inv, weights=w, minlength=groups.step_idx.size)
    top = np.zeros(len(groups.steps))
    np.fmax.at(top, groups.step_idx, busy)  # fmax: a NaN sum never wins, as max(top, NaN) keeps top
    return dict(zip(groups.steps, top.tolist(), strict=True))


def gpu_busy_us(groups: FloorGroups | None, d: np.ndarray, m_long: dict) -> float | None:
    """Median over the counted steps of the busiest GPU stream's kernels, copies and sets in the step (µs), or
    None (a CPU run, no device work)."""
    if groups is None:
        return None
    w = d[groups.sel]
    w[groups.host] = 0.0
    per = _busiest(groups, w)
    vals = [per[s] for s in m_long if per.get(s)]
    return round(float(np.median(vals)), 3) if vals else None


class FloorGroups(NamedTuple):
    """What a floor sums (:func:`floor_groups`): ``sel`` the tasks, ``host`` the positions in ``sel`` of the host
    tasks (``host_tasks``: their task ids), ``inv`` each one's (resource, step) group, ``step_idx`` each group's
    step as a position in ``steps`` (the step numbers, in the order their first group comes)."""

    sel: np.ndarray
    host: np.ndarray
    host_tasks: np.ndarray
    inv: np.ndarray
    step_idx: np.ndarray
    steps: list[int]


def floor_groups(g: gr.Graph) -> FloorGroups | None:
    """The tasks a floor sums and their (resource, step) groups (:class:`FloorGroups`): the same for every
    rewrite of ``g``, so :class:`_Pricer` computes it once; None for CPU runs or without such tasks."""
    if g.mode != "gpu":
        return None
    dev_all = np.isin(g.kind, (gr.K_KERNEL, gr.K_MEMCPY, gr.K_MEMSET))
    sel = np.flatnonzero((g.step >= 0) & (dev_all | (g.kind == gr.K_HOST)))
    if sel.size == 0:
        return None
    width = int(g.step.max(initial=0)) + 2
    keys, inv = gr.small_unique(g.res[sel].astype(np.int64) * width + g.step[sel])
    uniq, first, of = np.unique(keys % width, return_index=True, return_inverse=True)
    o = np.argsort(first, kind="stable")  # the steps in the order of their first group
    at = np.empty(o.size, np.int64)
    at[o] = np.arange(o.size)
    host = np.flatnonzero(~dev_all[sel])
    itype = np.int32 if g.start.size < 2**31 else np.int64  # held through the what-ifs: 1,024 ranks' peak
    return FloorGroups(sel.astype(itype), host.astype(itype), sel[host].astype(itype), inv.astype(itype),
                        at[of.reshape(-1)], uniq[o].tolist())
