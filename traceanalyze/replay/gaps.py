"""Idle time the replay keeps as a fixed gap because no dependency explains it (issue 37 item 1).

The replay keeps each resource's measured gap before a task (``Graph.chain_gap``) unless an explicit edge models
the wait: a launch (the stream waited for the host), an event wait (for another stream), a synchronize (the host
waited for the GPU), a wait on another thread or a collective. A gap that stays is replayed as a fixed delay: a
what-if that makes the work around it faster cannot shorten it, although in the real run it may have been a wait
that ends sooner (WHATIF.md pitfall 2: a stream's idle before a kernel that waited for an event the trace does not
name; a helper thread's hand-off from the main thread). These functions say how much of that there is, per resource,
and how much of a what-if's critical path runs through it, which lowers the what-if's confidence.

What counts as *unexplained* idle, per task (µs of its chain gap):

- on a GPU stream, a kept gap of :data:`DISPATCH_US` or more: a stream has no work of its own between kernels,
  and a shorter gap is the device's own latency from one kernel to the next (a few µs on Ampere and Hopper; NVIDIA,
  "Getting Started with CUDA Graphs", 2019), which no wait explains and no fix removes;
- on a host thread, a kept gap of :data:`~traceanalyze.replay.graph.WAIT_GAP_US` (1 ms) or more labelled ``host``
  or unlabelled: shorter gaps are the dispatch work between runtime calls, and gaps under data-loader, compile,
  optimizer or launch ranges are that work, which the what-ifs model.
"""

from __future__ import annotations

import numpy as np

from traceanalyze.replay import graph as gr
from traceanalyze.replay import simulate

DISPATCH_US = 10.0  # gaps between a stream's kernels shorter than this are device dispatch latency, not waits
HOST_LABELS = (-1, gr.GAP_LABELS.index("host"))  # gap labels whose long kept gaps are unexplained (not modelled work)


def unexplained_us(g: gr.Graph, cg: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
    """Per task, the µs of its chain gap ``cg`` (the graph's, or a rewrite's) that is unexplained idle (module
    docstring); float array of the graph's task count, or with ``idx`` (task ids) of those tasks only."""
    kind, label = (g.kind, g.gap_label) if idx is None else (g.kind[idx], g.gap_label[idx])
    cg = cg if idx is None else cg[idx]
    dev = np.isin(kind, gr.GPU_KINDS) & (kind != gr.K_COLL) & (cg >= DISPATCH_US)
    host = (kind == gr.K_HOST) & np.isin(label, HOST_LABELS) & (cg >= gr.WAIT_GAP_US)
    return np.where(dev | host, np.clip(cg, 0, None), 0.0)


def _in_pairs(g: gr.Graph, pairs: set[tuple[int, int]]) -> np.ndarray:
    """Per task: whether its (rank, step) is one of ``pairs`` (a step's tasks only), by a lookup table over
    rank × step where that range is not much wider than the tasks (an ``isin`` over the keys sorts every task);
    else (step numbers from a file can reach 2^31) by ``isin`` over the same exact keys."""
    width = max(int(g.step.max(initial=0)), max(s for _, s in pairs)) + 1
    n_rank = max(int(g.rank.max(initial=0)), max(r for r, _ in pairs)) + 1
    keys = np.array([r * width + s for r, s in pairs if r >= 0 and s >= 0], np.int64)
    sel = g.step >= 0
    task_keys = g.rank[sel].astype(np.int64) * width + g.step[sel]
    out = np.zeros(g.step.size, bool)
    if n_rank * width <= 4 * g.step.size + 1024:
        table = np.zeros(n_rank * width, bool)
        table[keys] = True
        out[sel] = table[task_keys]
    else:
        out[sel] = np.isin(task_keys, keys)
    return out


def summary(g: gr.Graph, counted: set[tuple[int, int]], top: int = 5) -> dict:
    """``replay.unexplained_gaps`` of the measured graph, per counted step (the mean over the counted (rank, step)
    pairs, µs): for the GPU streams and for the host threads, ``idle_us`` (the measured gaps before their tasks:
    streams' idle; threads' gaps of 1 ms or more), ``kept_us`` (of it, the unexplained part the replay keeps) and
    ``kept_pct``; ``resources``: the ``top`` resources by kept µs (``resource``, ``idle_us``, ``kept_us``,
    ``kept_pct``). Empty dict for a graph without counted steps."""
    if not counted:
        return {}
    in_step = _in_pairs(g, counted)
    n = float(len(counted))
    dev = np.isin(g.kind, gr.GPU_KINDS) & (g.kind != gr.K_COLL)
    host = g.kind == gr.K_HOST
    idle = np.where(dev, g.gap, np.where(host & (g.gap >= gr.WAIT_GAP_US), g.gap, 0.0)) * in_step
    kept = unexplained_us(g, g.chain_gap) * in_step
    out: dict = {}
    for name, m in (("streams", dev), ("threads", host)):
        i, k = float(idle[m].sum()) / n, float(kept[m].sum()) / n
        out[name] = {"idle_us": round(i, 1), "kept_us": round(k, 1), "kept_pct": round(100 * k / i, 1) if i else 0.0}
    res_idle = np.bincount(g.res, weights=idle, minlength=len(g.res_names))
    res_kept = np.bincount(g.res, weights=kept, minlength=len(g.res_names))
    order = np.argsort(-res_kept, kind="stable")[:top]
    out["resources"] = [{"resource": g.res_names[r], "idle_us": round(float(res_idle[r]) / n, 1),
                         "kept_us": round(float(res_kept[r]) / n, 1),
                         "kept_pct": round(100 * float(res_kept[r] / res_idle[r]), 1) if res_idle[r] else 0.0}
                        for r in order.tolist() if res_kept[r] > 0]
    return out


def on_path_pct(g: gr.Graph, rp: simulate.Replay, cg: np.ndarray, counted: set[tuple[int, int]]) -> float:
    """How much of a replayed step its critical path spends in unexplained kept gaps, %: the kept gaps
    (:func:`unexplained_us` of ``cg``) of the tasks on the paths that set the counted steps' markers
    (:func:`~traceanalyze.replay.simulate.on_critical_paths`) whose start the gap set (their binding is the task
    before on the same resource), summed per (rank, step) of the task, over that replayed step; the median over the
    counted pairs. ``rp``: a replay kept with its binding."""
    ends = np.array([e for r, s, b, e, c in g.steps if c and (r, s) in counted], np.int64)
    if not ends.size:
        return 0.0
    mark = simulate.on_critical_paths(rp, ends)
    binding = rp.binding  # type: ignore[attr-defined]
    sel = np.flatnonzero(mark & (binding == np.arange(binding.size) - 1) & (g.step >= 0))
    kept = unexplained_us(g, cg, sel)
    sel, kept = sel[kept > 0], kept[kept > 0]
    width = int(g.step.max(initial=0)) + 1
    keys, inv = np.unique(g.rank[sel].astype(np.int64) * width + g.step[sel], return_inverse=True)
    on = dict(zip(keys.tolist(), np.bincount(inv.reshape(-1), weights=kept).tolist(), strict=True))
    vals = []
    for r, s, b, e, c in g.steps:
        length = float(rp.start[e] - rp.start[b])
        if c and (r, s) in counted and length > 0:
            vals.append(100 * min(on.get(r * width + s, 0.0), length) / length)
    return round(float(np.median(vals)), 1) if vals else 0.0
