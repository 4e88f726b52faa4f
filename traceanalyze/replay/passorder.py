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
    # each rank's streams in pass order, and its edges between them, as Python lists grouped by rank (a few
    # streams and edges per rank: a NumPy call per rank cost more than the work)
    ms = np.flatnonzero(stream)
    ms = ms[np.lexsort((pos[ms], rank[ms]))]
    members: dict[int, list[int]] = {}
    for r, k in zip(rank[ms].tolist(), ms.tolist(), strict=True):
        members.setdefault(r, []).append(k)
    edges: dict[int, tuple[list[int], list[int]]] = {}
    for r, a_, b_ in zip(rank[src].tolist(), src.tolist(), dst.tolist(), strict=True):
        e = edges.setdefault(r, ([], []))
        e[0].append(a_)
        e[1].append(b_)
    out, pos_l = list(order), pos.tolist()
    for r in np.unique(rank[src[back]]).tolist():
        mine = members[r]
        placed = _topological(mine, *edges[r])
        if placed is not None:
            for at, k in zip([pos_l[m] for m in mine], placed, strict=True):  # mine: in pass order already
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
              prev_ct: np.ndarray) -> list[tuple[list[int], bool]]:
    """What each resource part of a pass without waves reads (what ``simulate._wave_deps`` says of waves), as
    ``(deps, self_dep)`` per part of ``segs`` (``(lo, hi, ua, ub, ca, cb, resource)`` in pass order): ``deps`` the
    other parts it reads, ascending (those that hold its edges' sources, ``dsrc`` sliced by ``ustart``/``ustop``,
    and its collective tasks' previous tasks ``prev_ct``, and the previous part of its resource: the running
    maximum it carries on); ``self_dep``: whether it reads its own times. Python lists: a pass reads a part's few
    entries one by one."""
    sg = np.array(segs, np.int64).reshape(-1, 7)
    k = sg.shape[0]
    o = np.argsort(sg[:, 0], kind="stable")
    ro = np.argsort(sg[:, 6], kind="stable")  # each resource's parts in pass order
    prev = np.full(k, -1, np.int64)
    same = sg[ro, 6][1:] == sg[ro, 6][:-1]
    prev[ro[1:][same]] = ro[:-1][same]
    ua, ub, ca, cb = sg[:, 2], sg[:, 3], sg[:, 4], sg[:, 5]
    has = ub > ua
    da = np.where(has, ustart[np.minimum(ua, max(ustart.size - 1, 0))] if ustart.size else 0, 0)
    db = np.where(has, ustop[np.maximum(ub - 1, 0)] if ustop.size else 0, 0)
    pos = np.concatenate([dsrc[_spans(da, db - da)].astype(np.int64), prev_ct[_spans(ca, cb - ca)].astype(np.int64)])
    owner = np.concatenate([np.repeat(np.arange(k), db - da), np.repeat(np.arange(k), cb - ca)])
    read = o[np.searchsorted(sg[o, 0], pos, side="right") - 1]
    self_dep = np.zeros(k, bool)
    self_dep[owner[read == owner]] = True
    owner, read = np.append(owner, np.arange(k)), np.append(read, prev)
    keep = (read != owner) & (read >= 0)
    keys = owner[keep] * max(k, 1) + read[keep]
    if k * k <= 4 * keys.size + 1024:  # each part's sorted, distinct: a table (every edge's pair) or a sort
        table = np.zeros(k * k, bool)
        table[keys] = True
        pairs = np.flatnonzero(table)
    else:
        pairs = np.unique(keys)
    at = np.zeros(k + 1, np.int64)
    np.cumsum(np.bincount(pairs // max(k, 1), minlength=k), out=at[1:])
    deps = (pairs % max(k, 1)).tolist()
    return [(deps[a:b], x) for a, b, x in zip(at[:-1].tolist(), at[1:].tolist(), self_dep.tolist(), strict=True)]


def _spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of the ranges ``[start, start + length)``, one after another."""
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total, dtype=np.int64)


def resource_slices(g: Graph, udst: np.ndarray, ct: np.ndarray
                    ) -> tuple[list[tuple[int, int, int, int, int, int]], list[int]]:
    """Resources in the order their edges mostly run (host threads launch onto gloo threads and streams), each a
    slice ``(lo, hi)`` of the task arrays with its slices of edge destinations and collective tasks: a pass sees
    this pass's launches. Also each one's phase (0 host, 1 gloo thread, 2 stream, 3 other)."""
    n = g.start.size
    bounds = np.append(np.flatnonzero(g.first), n).astype(np.int64)
    prefix = [g.res_names[int(g.res[b])].split(":")[0] for b in bounds[:-1]]
    rank_of = {"host": 0, "comm": 1, "stream": 2}
    # every slice bound at once: one searchsorted per array, not one per resource (thousands at 512 ranks)
    none = np.zeros(bounds.size, np.int64)
    u_at = np.searchsorted(udst, bounds.astype(udst.dtype, copy=False)) if udst.size else none
    c_at = np.searchsorted(ct, bounds.astype(ct.dtype, copy=False)) if ct.size else none
    segs, phases = [], []
    for k in forward_order(g, bounds[:-1], sorted(range(len(prefix)), key=lambda k: rank_of.get(prefix[k], 3)),
                            np.array([x == "stream" for x in prefix], bool)):
        segs.append((int(bounds[k]), int(bounds[k + 1]), int(u_at[k]), int(u_at[k + 1]), int(c_at[k]),
                     int(c_at[k + 1])))
        phases.append(rank_of.get(prefix[k], 3))
    return segs, phases


def wave_keys(g: Graph, segs: list[tuple[int, int, int, int, int, int]], phases: list[int], min_resources: int
              ) -> list[tuple[int, int]] | None:
    """Each resource's wave (:mod:`.simulate`'s docstring) ``(phase, k)``: the k-th resource of its rank in that
    phase. None when the waves would hold fewer than ``min_resources`` resources on average, or an edge joins two
    ranks (then the pass goes resource by resource)."""
    if not segs or (g.dep_src.size and np.any(g.rank[g.dep_src] != g.rank[g.dep_dst])):
        return None
    # k counts the earlier resources of the same (phase, rank), in segs' order: one stable sort, not a loop
    ph = np.asarray(phases, np.int64)
    group = ph * (int(g.rank.max(initial=0)) + 1) + g.rank[np.array([x[0] for x in segs], np.int64)]
    o = np.argsort(group, kind="stable")
    new = np.ones(o.size, bool)
    new[1:] = group[o][1:] != group[o][:-1]
    heads = np.flatnonzero(new)
    k = np.empty(o.size, np.int64)
    k[o] = np.arange(o.size) - np.repeat(heads, np.diff(np.append(heads, o.size)))
    keys = list(zip(phases, k.tolist(), strict=True))
    return None if len(segs) < min_resources * len(set(keys)) else keys


__all__ = ["forward_order", "part_deps", "resource_slices", "wave_keys"]
