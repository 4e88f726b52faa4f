"""The order a replay pass visits a rank's streams in (:func:`traceanalyze.replay.simulate.replay`): one where the
edges between them run forward, so that a pass reads each stream's times from this pass, not the one before."""

from __future__ import annotations

import numpy as np

from traceanalyze.replay.graph import Graph


def forward_order(g: Graph, lo: np.ndarray, order: list[int], stream: np.ndarray) -> list[int]:
    """``order`` (the resource slices, starting at ``lo``, in pass order; ``stream``: which are GPU streams) with
    each rank's streams in an order where
    the edges between them all run forward, when the order given has one running back and such an order exists
    (they form no cycle; the first stream in ``order`` whose sources are all placed goes next, so an order already
    forward stays as it is). A back edge is read from the pass before: ``without_host_syncs``' anchors, one edge
    per task from the busiest stream to the others, cost a pass each and were too many per rank to cut into slabs
    (256 ranks: 8 passes instead of 2). The fixed point, so every time, is the same."""
    if not g.dep_src.size or stream.sum() < 2:
        return order
    slot = np.full(int(g.res.max(initial=0)) + 1, -1, np.int64)
    slot[g.res[lo[stream]]] = np.flatnonzero(stream)
    a, b = slot[g.res[g.dep_src]], slot[g.res[g.dep_dst]]
    keep = (a >= 0) & (b >= 0) & (a != b)  # between two streams (of one rank: edges stay inside a rank)
    if not keep.any():
        return order
    pairs = np.unique(a[keep] * lo.size + b[keep])
    src, dst = pairs // lo.size, pairs % lo.size
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order))
    back = pos[src] > pos[dst]
    if not back.any():
        return order
    rank = g.rank[lo].astype(np.int64)
    # each rank's streams in pass order, and its edges between them: one sort each, sliced per rank below
    ms = np.flatnonzero(stream)
    ms = ms[np.lexsort((pos[ms], rank[ms]))]
    eo = np.argsort(rank[src], kind="stable")
    src, dst = src[eo], dst[eo]
    out = list(order)
    for r in np.unique(rank[src[back[eo]]]).tolist():
        members = ms[np.searchsorted(rank[ms], r): np.searchsorted(rank[ms], r, side="right")].tolist()
        e_a, e_b = np.searchsorted(rank[src], r), np.searchsorted(rank[src], r, side="right")
        placed = _topological(members, src[e_a:e_b].tolist(), dst[e_a:e_b].tolist())
        if placed is not None:
            for at, k in zip(sorted(pos[members].tolist()), placed, strict=True):
                out[at] = k
    return out


def _topological(nodes: list[int], src: list[int], dst: list[int]) -> list[int] | None:
    """``nodes`` ordered so that every edge ``src[i] -> dst[i]`` runs forward, each time the first of ``nodes``
    whose sources are all placed; None when the edges form a cycle."""
    need = {k: 0 for k in nodes}
    for d in dst:
        need[d] += 1
    out_of: dict[int, list[int]] = {}
    for s_, d in zip(src, dst, strict=True):
        out_of.setdefault(s_, []).append(d)
    placed: list[int] = []
    left = list(nodes)
    while left:
        k = next((k for k in left if need[k] == 0), None)
        if k is None:
            return None
        left.remove(k)
        placed.append(k)
        for d in out_of.get(k, []):
            need[d] -= 1
    return placed


def part_deps(segs: list[tuple[int, ...]], ustart: np.ndarray, ustop: np.ndarray, dsrc: np.ndarray,
              prev_ct: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What each resource part of a pass without waves reads, as ``(at, deps, self_dep)`` (what
    ``simulate._wave_deps`` says of waves): part j of ``segs`` (``(lo, hi, ua, ub, ca, cb, resource)`` in pass
    order) reads the parts ``deps[at[j]:at[j + 1]]`` (those that hold its edges' sources, ``dsrc`` sliced by
    ``ustart``/``ustop``, and its collective tasks' previous tasks ``prev_ct``, and the previous part of its
    resource: the running maximum it carries on) and, where ``self_dep[j]``, its own times."""
    sg = np.array(segs, np.int64).reshape(-1, 7)
    k = sg.shape[0]
    o = np.argsort(sg[:, 0], kind="stable")
    lo_sorted = sg[o, 0]
    ro = np.argsort(sg[:, 6], kind="stable")  # each resource's parts in pass order
    prev = np.full(k, -1, np.int64)
    same = sg[ro, 6][1:] == sg[ro, 6][:-1]
    prev[ro[1:][same]] = ro[:-1][same]
    parts, self_dep = [], np.zeros(k, bool)
    for j, (_, _, ua, ub, ca, cb, _) in enumerate(sg.tolist()):
        da, db = (int(ustart[ua]), int(ustop[ub - 1])) if ub > ua else (0, 0)
        pos = np.concatenate([dsrc[da:db].astype(np.int64), prev_ct[ca:cb].astype(np.int64)])
        read = np.unique(o[np.searchsorted(lo_sorted, pos, side="right") - 1]) if pos.size else pos
        self_dep[j] = bool(np.isin(j, read))
        parts.append(np.setdiff1d(np.append(read, prev[j]), [j, -1]))
    at = np.zeros(k + 1, np.int64)
    np.cumsum([x.size for x in parts], out=at[1:])
    return at, (np.concatenate(parts) if parts else np.zeros(0, np.int64)), self_dep


__all__ = ["forward_order", "part_deps"]
