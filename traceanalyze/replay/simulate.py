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

A pass visits the resources in order, each one seeing what the resources before it set in this pass. Only the
order among one rank's resources matters: every explicit edge stays inside a rank, and a rendezvous reads the
ready times gathered after the last slab (below). So with many ranks the resources are visited in *waves*
(:class:`_Wave`): the k-th resource of every rank in one pass phase at once, in NumPy calls over the whole wave,
with the same times to the bit as one resource at a time (thousands of resources at 1,024 ranks: a few NumPy calls
each were most of the replay).

A task that waits for a resource visited after its own (a host's synchronize on its stream, a wait on another
thread or on a collective) reads that resource's time from the pass before, so each such wait in a row cost one
more pass: the 8-rank scale set's host waits twice a step and settled in 12 passes. On a graph of
:data:`SLABS_MIN_TASKS` tasks or more, each rank's resources are cut at the start of every such wait and visited
*slab by slab* (every resource's part before the first cut, then every part up to the next, ...), the running
maximum carried from one part of a resource to the next and the rendezvous' ready times gathered after each slab
(Gauss-Seidel rather than Jacobi sweeps): the wait then reads a part visited earlier in the same pass, and the
scale set settles in 2 passes. The graph is acyclic, so the fixed point is the same one, to the bit. A rank with
more waits than :data:`PART_TASKS` allows (each part costs a few NumPy calls) is not cut: a wait left uncut would
still cost its pass.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from traceanalyze.replay.graph import K_COLL, Graph
from traceanalyze.replay.passorder import part_deps, resource_slices, wave_keys

MAX_PASSES = 400  # a pass settles at least one more cross-resource dependency; real graphs settle in far fewer
SLABS_MIN_TASKS = 20_000  # smaller graphs replay in a few ms: one slab (no cuts to plan)
PART_TASKS = 500  # tasks per part (or wave) a pass visits, at least: each costs a few NumPy calls (~45 µs)
WAVE_MIN_RESOURCES = 32  # waves replace the resource-by-resource pass when they hold this many resources on average
# (below, the gathers cost more than the calls they save: 8 ranks 0.15 -> 0.25 s; 128 ranks 0.25 -> 0.18 s)
TOLERANCE_US = 1e-3
_LAST_ORDER: list = [()]  # _pass_order's last two (a graph and its no_host_sync rewrite): (structure, weakly,
# the settings, the order) each
UNKNOWN = -1e15  # µs: a start not yet known (below any real time; finite so that differences stay finite)


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


@dataclass
class Layout:
    """The part of a replay's plan that depends on the graph's structure only (its resources, edges, collective
    instances and measured starts), not on the durations, gaps, edge offsets or pinned starts a replay is given:
    the same for the base replay and every rewrite that changes only those (:func:`layout_of`, passed to
    :func:`replay`). ``ct``/``ci``: the collective tasks and their instances (task order; ``prev_ct``, each one's
    previous task, and ``ct_first``, whether it is its resource's first); ``eo``: the edges' order by destination
    (None: already so); ``dsrc``/``ddst``/``dend`` in that order, grouped by destination (``udst``: the
    destinations, ``ustart``/``ustop``: each one's slice); ``pinned``: the tasks :func:`pinned_tasks` pins;
    ``segs``/``slab_end``/``n_res``/``waves``: the pass order (:class:`_Plan`). With waves, ``perm`` (new position
    -> task), ``eperm`` (edge in wave order -> edge of the graph), ``sidx``, ``ct_w``/``prev_ct_w`` (the
    collective tasks' positions) and ``pinned_w`` (the pinned tasks') give the wave order (:func:`_lay_out_waves`)."""

    of: tuple  # the graph's structural arrays it was computed from (compared by identity: a rewrite makes new ones)
    ct: np.ndarray
    ci: np.ndarray
    prev_ct: np.ndarray
    ct_first: np.ndarray
    eo: np.ndarray | None
    dsrc: np.ndarray
    ddst: np.ndarray
    dend: np.ndarray
    udst: np.ndarray
    ustart: np.ndarray
    ustop: np.ndarray
    pinned: np.ndarray
    segs: list[tuple[int, int, int, int, int, int, int]]
    slab_end: set[int]
    n_res: int
    waves: list[_Wave] | None = None
    perm: np.ndarray | None = None
    eperm: np.ndarray | None = None
    sidx: np.ndarray | None = None
    ct_w: np.ndarray | None = None
    prev_ct_w: np.ndarray | None = None
    pinned_w: np.ndarray | None = None
    seg_deps: list[tuple[list[int], bool]] | None = None  # without waves: each part's (passorder.part_deps)

    def fits(self, g: Graph) -> bool:
        """Whether this layout was computed from ``g``'s structure (the very same arrays)."""
        return len(self.of) == len(now := _structure(g)) and all(a is b for a, b in zip(self.of, now, strict=True))


def _structure(g: Graph) -> tuple:
    """The graph's arrays a :class:`Layout` depends on."""
    return (g.first, g.dep_src, g.dep_dst, g.dep_end, g.res, g.rank, g.inst, g.start, g.res_names)


@dataclass
class _Plan:
    """What every pass of :func:`replay` reads: the tasks' durations ``d`` and chain gaps ``cg`` (µs; with waves,
    the collective tasks' only, in ``ct``'s order: the only ones a pass reads), the chain
    offsets ``c`` along each resource and the ``floor`` below every time, the start ``r0`` of the pinned first
    tasks and the edges' offsets ``doff`` (in wave order with waves, else in task order grouped by destination),
    the collective tasks ``ct`` with their instances ``ci`` (and each one's previous task and first flag), the
    explicit edges grouped by destination (``udst``: the destinations, ``ustart``/``ustop``: each one's slice of
    ``dsrc``/``dend``/``doff``) and the resource slices in pass order (:func:`_resource_slices`), taken from the
    :class:`Layout`."""

    d: np.ndarray
    cg: np.ndarray
    c: np.ndarray
    floor: float
    r0: np.ndarray
    ct: np.ndarray
    ci: np.ndarray
    prev_ct: np.ndarray
    ct_first: np.ndarray
    dsrc: np.ndarray
    dend: np.ndarray
    doff: np.ndarray
    udst: np.ndarray
    ustart: np.ndarray
    ustop: np.ndarray
    segs: list[tuple[int, int, int, int, int, int, int]]  # (lo, hi, ua, ub, ca, cb, resource) in pass order
    slab_end: set[int]  # the positions in segs (or in waves) after which the rendezvous' ready times are gathered
    n_res: int  # resources (the running maximum is carried per resource from one slab to the next)
    waves: list[_Wave] | None = None
    sidx: np.ndarray | None = None  # with waves: each edge's source time in se (its start, or n + its end)
    se: np.ndarray | None = None  # with waves: the starts then the ends of the tasks, in wave order
    track: _Track | None = None  # what the last visit of each wave (or resource part) saw
    seg_deps: list[tuple[list[int], bool]] | None = None  # without waves: the parts' (passorder.part_deps)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of the ranges ``[start, start + length)``, one after another (int64)."""
    keep = lengths > 0
    st, ln = np.asarray(starts, np.int64)[keep], np.asarray(lengths, np.int64)[keep]
    total = int(ln.sum())
    if not total:
        return np.zeros(0, np.int64)
    step = np.ones(total, np.int64)
    step[0] = st[0]
    step[np.cumsum(ln)[:-1]] = st[1:] - (st[:-1] + ln[:-1] - 1)  # each range's first index, from the last one
    return np.cumsum(step)


@dataclass
class _Wave:
    """Resources of different ranks replayed together (one resource of each rank at most): their task slices
    ``lo``/``n`` (the wave's tasks are these slices one after another), their edge slices of ``dsrc``/``dend``/
    ``doff`` (``e_lo``/``e_n``) with the destinations' first edge (``red``, into the wave's edges) and position
    (``pos``, into the wave's tasks), their collective tasks (``c_lo``/``c_n``: slices of ``ct``) and those
    tasks' positions (``cpos``), and the slices grouped by length for the running maximum (``buckets``: each
    ``(starts in the wave's tasks, lengths, longest)``)."""

    lo: np.ndarray
    n: np.ndarray
    e_lo: np.ndarray
    e_n: np.ndarray
    red: np.ndarray
    pos: np.ndarray
    c_lo: np.ndarray
    c_n: np.ndarray
    cpos: np.ndarray
    buckets: list[tuple[np.ndarray, np.ndarray, int]]
    res: np.ndarray  # each slice's resource (its index in the slab-less resource order)
    base: np.ndarray  # each slice's first position among the wave's tasks
    cc_i: np.ndarray  # its collective tasks (indices into the plan's ct)
    size: int  # its tasks
    e_size: int  # its edges
    at: int = 0  # where the wave's tasks start in the plan's arrays, once they are laid out wave by wave
    e_at: int = 0  # ... and its edges
    deps: np.ndarray | None = None  # the other waves whose times it reads (edge sources, previous parts: _wave_deps)
    self_dep: bool = False  # whether it reads its own times (an edge inside the wave)


@dataclass
class _Track:
    """What a replay over waves remembers of each wave's last visit, to skip a wave whose inputs did not change
    since (its times would come out the same, to the bit): ``stamp`` counts the visits and gathers; per wave the
    stamp of its last visit (``seen``), of its last visit that changed its times or carried maximum (``changed``),
    and its carried maximum (``carry``); ``m_changed``: the stamp of the last gather that changed ``m_ready``."""

    seen: np.ndarray
    changed: np.ndarray
    carry: list
    stamp: int = 0
    m_changed: int = 0

    def stale(self, j: int, w: _Wave) -> bool:
        """Whether wave ``j`` must be visited again: an input changed since its last visit (or it never was)."""
        last = self.seen[j]
        if last < 0 or (w.self_dep and self.changed[j] == last) or (w.cpos.size and self.m_changed > last):
            return True
        return bool(w.deps.size and self.changed[w.deps].max() > last)


def _seg_cummax(x: np.ndarray, buckets: list[tuple[np.ndarray, np.ndarray, int]], in_place: bool = False
                ) -> np.ndarray:
    """The running maximum of ``x`` restarted at each slice: each bucket's slices as the rows of one array (rows
    padded at their end, where the padding cannot reach a slice's own prefix), accumulated along the rows. A
    bucket of slices of one length that follow each other (every rank with as many tasks on that resource, as in
    data-parallel runs) is such an array already: accumulated in place, with no gather. ``in_place``: written
    into ``x`` (each slice's prefix is its own, whatever another bucket wrote in the padding it reads)."""
    out = x if in_place else x.copy()  # a one-task slice is its own running maximum
    last = x.size - 1
    for st, ln, width in buckets:
        if ln.min() == width and st[-1] - st[0] == (st.size - 1) * width:  # equal rows, back to back
            rows = out[st[0]: st[0] + st.size * width].reshape(st.size, width)
            np.maximum.accumulate(rows, axis=1, out=rows)
            continue
        idx = np.minimum(st[:, None] + np.arange(width), last)
        acc = np.maximum.accumulate(x[idx], axis=1)
        if ln.min() == width:  # every slice fills its row
            out[idx] = acc
        else:
            valid = np.arange(width) < ln[:, None]
            out[idx[valid]] = acc[valid]
    return out


def replay(g: Graph, dur: np.ndarray | None = None, gap: np.ndarray | None = None,
           transfer: np.ndarray | None = None, keep_binding: bool = False, starts: np.ndarray | None = None,
           layout: Layout | None = None) -> Replay:
    """Replay ``g`` with the given per-task durations and chain gaps (µs; default the measured ones) and per-instance
    transfer times (default the measured transfer). ``starts``: per task, where a pinned task
    (:func:`pinned_tasks`) starts (µs on the graph's clock; default where it was measured): a rank that enters
    the trace earlier or later. ``layout``: :func:`layout_of` a graph with ``g``'s structure (the base graph's
    for a rewrite of its durations, gaps, offsets or starts), computed here when None or not ``g``'s.

    Returns:
        :class:`Replay`; with ``keep_binding`` it also carries ``binding`` (per task: the task whose time set its
        start, -1 for none) for :func:`critical_path`.
    """
    n = g.start.size
    tr = g.inst_transfer if transfer is None else transfer
    lay = layout_of(g) if (own := layout is None or not layout.fits(g)) else layout  # own: nobody else holds it
    p: _Plan | None = _plan(g, lay, dur, gap, tr, starts=starts)
    if p.waves is not None:  # the starts, then the ends, in one array (see _wave_pass)
        p.se = np.full(2 * n, UNKNOWN)
        p.track = _Track(seen=np.full(len(p.waves), -1, np.int64), changed=np.zeros(len(p.waves), np.int64),
                         carry=[None] * len(p.waves))
        s, e = p.se[:n], p.se[n:]
    else:
        s = np.full(n, UNKNOWN)
        e = s.copy()
        k = len(p.segs)
        p.track = _Track(seen=[-1] * k, changed=[0] * k, carry=[math.nan] * k)  # type: ignore[arg-type]
    ready = np.full(p.ct.size, UNKNOWN)
    m_ready = np.full(tr.size, UNKNOWN)
    converged, passes = False, 0
    for passes in range(1, MAX_PASSES + 1):  # noqa: B007
        # waves measure how far the starts moved as they write them (no copy of the graph's size)
        before = s.copy() if p.waves is None else None
        moved = _pass(p, s, e, ready, m_ready)  # gathers m_ready after each slab
        if before is not None:
            np.subtract(s, before, out=before)  # in place: no temporaries of the graph's size
            moved = float(np.max(np.abs(before, out=before))) if n else 0.0
            del before
        if passes > 1 and moved < TOLERANCE_US:
            converged = True
            break
    kept = (p.cg, p.doff) if keep_binding and lay.perm is None else None  # the binding's: in task order
    if lay.perm is not None:  # back to task order, the plan released first (its arrays are the graph's size)
        se, p = p.se, None
        s, e = np.empty(n), np.empty(n)
        s[lay.perm], e[lay.perm] = se[:n], se[n:]
        del se
    p = None
    if own:  # the wave order is not read below: released before the binding's graph-sized temporaries (the peak)
        lay.waves = lay.perm = lay.eperm = lay.sidx = lay.ct_w = lay.prev_ct_w = lay.pinned_w = None
        lay.udst = lay.ustop = None
    unknown = s <= UNKNOWN / 2
    s[unknown] = e[unknown] = -np.inf
    out = Replay(start=s, end=e, passes=passes, converged=converged)
    if keep_binding:  # the chain gaps as given (no copy of the durations: the binding reads the ends)
        cg = kept[0] if kept else np.asarray(g.chain_gap if gap is None else gap, dtype=float)
        doff = kept[1] if kept else (g.dep_off if lay.eo is None else g.dep_off[lay.eo])
        out.binding = _binding(g, s, e, cg, lay, doff)  # type: ignore[attr-defined]
    return out


def _lay_out_waves(lay: Layout, n: int) -> None:
    """Order the replay's task and edge arrays wave after wave, in pass order, so that a wave's tasks and edges are
    one slice each (:func:`_wave_pass` reads and writes them in place instead of gathering and scattering them):
    sets ``lay``'s ``perm``, ``eperm``, ``sidx``, ``ct_w`` and ``prev_ct_w`` and each wave's place. The per-task
    values are the same; only their order changes."""
    assert lay.waves is not None
    perm = np.concatenate([_ranges(w.lo, w.n) for w in lay.waves])  # new position -> task
    itype = np.int32 if 2 * n < 2**31 else np.int64
    perm = perm.astype(itype)
    inv = np.empty(n, itype)
    inv[perm] = np.arange(n, dtype=itype)
    at = e_at = 0
    for w in lay.waves:
        w.at, w.e_at = at, e_at
        at += w.size
        e_at += w.e_size
    eperm = np.concatenate([_ranges(w.e_lo, w.e_n) for w in lay.waves]).astype(itype)
    src = inv[lay.dsrc[eperm]]
    lay.sidx = np.where(lay.dend[eperm], src + itype(n), src)  # into se: the source's end, or its start
    del src
    lay.perm = perm
    lay.eperm = eperm if lay.eo is None else lay.eo[eperm].astype(itype)  # into the graph's own edge order
    lay.ct_w, lay.prev_ct_w, lay.pinned_w = inv[lay.ct], inv[lay.prev_ct], inv[lay.pinned]


def pinned_tasks(g: Graph) -> np.ndarray:
    """Per task: whether the replay starts it where it was measured (or at ``replay``'s ``starts``): a resource's
    first task without an incoming edge (a launch, a wait)."""
    pinned = g.first.copy()
    pinned[g.dep_dst] = False
    return pinned


def layout_of(g: Graph) -> Layout:
    """The structural part of ``g``'s replay plan (:class:`Layout`): the collective tasks, the edges by destination,
    the pinned tasks and the resource slices, slabs and waves in pass order."""
    n = g.start.size
    ct = np.flatnonzero(g.inst >= 0)
    eo = None if np.all(g.dep_dst[1:] >= g.dep_dst[:-1]) else np.argsort(g.dep_dst, kind="stable")  # built so
    dsrc, ddst, dend = (g.dep_src, g.dep_dst, g.dep_end) if eo is None else (g.dep_src[eo], g.dep_dst[eo],
                                                                             g.dep_end[eo])
    # each destination's first edge: np.unique(ddst, return_index=True) of the sorted edges, without its sort
    ustart = np.flatnonzero(np.r_[True, ddst[1:] != ddst[:-1]]) if ddst.size else np.zeros(0, np.int64)
    udst = ddst[ustart] if ddst.size else np.zeros(0, np.int64)
    ustop = np.append(ustart[1:], ddst.size).astype(np.int64)
    n_res, keys, subs, slab_of = _pass_order(g, udst, ct)
    wv = _waves(subs, slab_of, keys, udst, ustart, ustop, ct) if keys else None
    order = np.argsort(slab_of, kind="stable")  # slab by slab, resources in pass order within one
    last = np.append(slab_of[order][1:] != slab_of[order][:-1], True) if order.size else np.zeros(0, bool)
    lay = Layout(of=_structure(g), ct=ct, ci=g.inst[ct], prev_ct=np.clip(ct - 1, 0, None), ct_first=g.first[ct],
                 eo=eo, dsrc=dsrc, ddst=ddst, dend=dend, udst=udst, ustart=ustart, ustop=ustop,
                 pinned=np.flatnonzero(pinned_tasks(g)),
                 segs=[tuple(x) for x in subs[order].tolist()] if wv is None else [],
                 slab_end=wv[1] if wv else set(np.flatnonzero(last).tolist()), n_res=n_res,
                 waves=wv[0] if wv else None)
    if lay.waves is not None:
        _lay_out_waves(lay, n)
        _wave_deps(lay, n)
    else:
        lay.seg_deps = part_deps(lay.segs, lay.ustart, lay.ustop, lay.dsrc, lay.prev_ct)
    return lay


def _pass_order(g: Graph, udst: np.ndarray, ct: np.ndarray) -> tuple:
    """(resources, their wave keys or None, the parts ``(lo, hi, ua, ub, ca, cb, resource)``, each part's slab) of
    ``g`` (:func:`.passorder.resource_slices`, :func:`.passorder.wave_keys`, :func:`_slabs`): a few rows per
    resource, the same for every replay of one structure. Kept for the last two structures planned, by weak references
    (no graph held), so that a run replayed in turn, which re-plans its layout per replay (memory), plans this part
    once (256 ranks: ~25 ms of each ~65 ms layout)."""
    now, conf = _structure(g), (WAVE_MIN_RESOURCES, PART_TASKS, SLABS_MIN_TASKS, _slabs)
    kept = _LAST_ORDER[0]
    for of, c, out in kept:
        if c == conf and len(of) == len(now) and all(
                (r() if isinstance(r, weakref.ref) else r) is a for r, a in zip(of, now, strict=True)):
            return out
    n = g.start.size
    segs, phases = resource_slices(g, udst, ct)
    keys = wave_keys(g, segs, phases, WAVE_MIN_RESOURCES)
    # cuts per rank while the parts (or waves) a pass visits stay within one per PART_TASKS tasks
    units = len(set(keys)) if keys else len(segs)
    cuts = (n // PART_TASKS) // max(units, 1) - 1 if n >= SLABS_MIN_TASKS else 0
    out = (len(segs), keys, *_slabs(g, segs, udst, ct, cuts))
    # one tuple, replaced whole: a replay on another thread reads the old one or the new one
    _LAST_ORDER[0] = ((tuple(weakref.ref(a) if isinstance(a, np.ndarray) else a for a in now), conf, out),
                      *kept[:1])
    return out


def _wave_deps(lay: Layout, n: int) -> None:
    """Each wave's ``deps`` and ``self_dep``: the waves that hold its edges' sources and its collective tasks'
    previous tasks (positions in wave order), and those that hold the previous part of each of its resources (the
    running maximum it carries on)."""
    waves = lay.waves
    at = np.array([w.at for w in waves], np.int64)
    res = np.concatenate([w.res for w in waves])
    sizes = np.array([w.res.size for w in waves], np.int64)
    of = np.repeat(np.arange(len(waves)), sizes)
    o = np.lexsort((of, res))  # each resource's parts in wave order
    prev = np.full(res.size, -1, np.int64)
    same = res[o][1:] == res[o][:-1]
    prev[o[1:][same]] = of[o[:-1][same]]
    ends = np.cumsum(sizes)
    for j, w in enumerate(waves):
        src = lay.sidx[w.e_at: w.e_at + w.e_size].astype(np.int64)
        pos = np.concatenate([np.where(src >= n, src - n, src), lay.prev_ct_w[w.cc_i].astype(np.int64)])
        # the waves read, marked in a table of the waves (a few dozen): no sort of the wave's edges
        read = np.bincount(np.searchsorted(at, pos, side="right") - 1, minlength=len(waves)) > 0
        w.self_dep = bool(read[j])
        parts = prev[ends[j] - sizes[j]: ends[j]]  # its parts' slice
        read[parts[parts >= 0]] = True
        read[j] = False
        w.deps = np.flatnonzero(read)


def _plan(g: Graph, lay: Layout, dur: np.ndarray | None, gap: np.ndarray | None, tr: np.ndarray,
          starts: np.ndarray | None = None) -> _Plan:
    """One replay's plan (:class:`_Plan`): durations with each complete collective at its transfer time, the chain
    offsets, the pinned starts (``starts``, default the measured ones) and the edges' offsets, in ``lay``'s order."""
    n = g.start.size
    d = np.array(g.chain_dur if dur is None else dur, dtype=float)  # a copy: collectives get their transfer time
    d[lay.ct] = tr[lay.ci]
    cg = np.asarray(g.chain_gap if gap is None else gap, dtype=float)
    first = g.first
    c = np.zeros(n)
    if n > 1:
        np.add(d[:-1], cg[1:], out=c[1:])
    c[first] = 0.0
    np.cumsum(c, out=c)
    # less each task's resource's first value: the same gather as by each task's first task, resource by resource
    heads = np.flatnonzero(first)
    if heads.size == 0 or heads[0] != 0:
        heads = np.append(0, heads)
    np.subtract(c, np.repeat(c[heads], np.diff(np.append(heads, n))), out=c)  # made before c is written
    at = g.start if starts is None else starts
    floor = -2.0 * (float(np.ptp(at)) + float(c.max(initial=0.0)) + 1e6) if n else -1.0
    # a finite "not yet known" time: no NaN from -inf - -inf, and still below every real time after offsets
    r0 = np.full(n, UNKNOWN)
    if lay.perm is None:
        r0[lay.pinned] = at[lay.pinned]
        return _Plan(d=d, cg=cg, c=c, floor=floor, r0=r0, ct=lay.ct, ci=lay.ci, prev_ct=lay.prev_ct,
                     ct_first=lay.ct_first, dsrc=lay.dsrc, dend=lay.dend,
                     doff=g.dep_off if lay.eo is None else g.dep_off[lay.eo], udst=lay.udst, ustart=lay.ustart,
                     ustop=lay.ustop, segs=lay.segs, slab_end=lay.slab_end, n_res=lay.n_res, seg_deps=lay.seg_deps)
    # in wave order, one array at a time, each old one released before the next is copied
    perm = lay.perm
    r0[lay.pinned_w] = at[lay.pinned]
    d = d[perm]
    cg = cg[lay.ct]
    c = c[perm]
    return _Plan(d=d, cg=cg, c=c, floor=floor, r0=r0, ct=lay.ct_w, ci=lay.ci, prev_ct=lay.prev_ct_w,
                 ct_first=lay.ct_first, dsrc=np.zeros(0, perm.dtype), dend=lay.dend, doff=g.dep_off[lay.eperm],
                 udst=lay.udst, ustart=lay.ustart, ustop=lay.ustop, segs=[], slab_end=lay.slab_end,
                 n_res=lay.n_res, waves=lay.waves, sidx=lay.sidx)


def _slabs(g: Graph, segs: list[tuple[int, int, int, int, int, int]], udst: np.ndarray, ct: np.ndarray,
           max_cuts: int) -> tuple[np.ndarray, np.ndarray]:
    """Each resource slice of ``segs`` cut into slabs (module docstring) at its rank's cut times: the start of
    every task that waits for a resource visited after its own (a synchronize, a wait on another thread or on a
    collective), when no rank has more than ``max_cuts`` of them. Returns the non-empty parts as rows ``(lo, hi,
    ua, ub, ca, cb, resource)``, resource by resource, and each part's slab; without cuts, ``segs`` whole in one
    slab."""
    sl = np.array(segs, np.int64).reshape(-1, 6)
    whole = np.column_stack([sl, np.arange(sl.shape[0])]), np.zeros(sl.shape[0], np.int64)
    if max_cuts <= 0 or not g.dep_src.size or not segs:
        return whole
    visit = np.zeros(int(g.res.max(initial=0)) + 1, np.int64)
    visit[g.res[sl[:, 0]]] = np.arange(sl.shape[0])
    dst = g.dep_dst[visit[g.res[g.dep_src]] > visit[g.res[g.dep_dst]]].astype(np.int64)
    if not dst.size:
        return whole
    ranks, r_of = np.unique(g.rank[dst], return_inverse=True)
    o = np.lexsort((g.start[dst], r_of))
    cut_r, cut_t = r_of[o], g.start[dst][o]
    keep = np.ones(o.size, bool)
    keep[1:] = (cut_r[1:] != cut_r[:-1]) | (cut_t[1:] != cut_t[:-1])
    cut_r, cut_t = cut_r[keep], cut_t[keep]
    per = np.bincount(cut_r, minlength=ranks.size)
    if per.max() > max_cuts:  # some waits left uncut would each still cost a pass: no gain
        return whole
    at = np.full((ranks.size, int(per.max())), np.inf)  # a rank with fewer cuts: its last slabs empty
    at[cut_r, np.arange(cut_r.size) - np.repeat(np.cumsum(per) - per, per)] = cut_t
    # every resource's cuts in one search: (its slice in task order, time) keys over the tasks, sorted so
    lo, hi = sl[:, 0], sl[:, 1]
    row = np.searchsorted(ranks, g.rank[lo])
    has = (row < ranks.size) & (ranks[np.minimum(row, ranks.size - 1)] == g.rank[lo])
    t0, span = float(g.start.min()), float(np.ptp(g.start)) + 1.0
    first_at = np.flatnonzero(g.first)
    task_key = np.repeat(np.arange(first_at.size, dtype=float), np.diff(np.append(first_at, g.start.size)))
    task_key = task_key * span + (g.start - t0)
    q = np.where(has[:, None], at[np.minimum(row, ranks.size - 1)], np.inf)
    slot = np.searchsorted(first_at, lo).astype(float)[:, None]
    pos = np.searchsorted(task_key, np.where(np.isinf(q), (slot + 1) * span - 0.5, slot * span + (q - t0)))
    # in order along each resource whatever the keys' rounding (far-apart clocks): the parts tile [lo, hi) exactly
    pos = np.maximum.accumulate(np.clip(pos, lo[:, None], hi[:, None]), axis=1)
    bounds = np.column_stack([lo, pos, hi])
    a, b = bounds[:, :-1], bounds[:, 1:]
    nz = b > a
    res, slab = np.nonzero(nz)  # row-major: resource by resource, slab by slab
    a, b = a[nz], b[nz]
    u_a = np.searchsorted(udst, a) if udst.size else np.zeros(a.size, np.int64)
    u_b = np.searchsorted(udst, b) if udst.size else np.zeros(a.size, np.int64)
    c_a = np.searchsorted(ct, a) if ct.size else np.zeros(a.size, np.int64)
    c_b = np.searchsorted(ct, b) if ct.size else np.zeros(a.size, np.int64)
    return np.column_stack([a, b, u_a, u_b, c_a, c_b, res]).astype(np.int64), slab.astype(np.int64)


def _waves(subs: np.ndarray, slab_of: np.ndarray, keys: list[tuple[int, int]], udst: np.ndarray,
           ustart: np.ndarray, ustop: np.ndarray, ct: np.ndarray) -> tuple[list[_Wave], set[int]]:
    """The parts of the resources (:func:`_slabs`: ``subs``, ``slab_of``) as waves: wave (slab, phase, k) holds the
    parts in that slab of the resources of wave key (phase, k) (:func:`_wave_keys`: ``keys``), and waves run in
    (slab, phase, k) order, which keeps each rank's resources in pass order. Returns the waves and the positions
    of each slab's last wave."""
    kp, kk = (np.array([k[i] for k in keys], np.int64)[subs[:, 6]] for i in (0, 1))
    o = np.lexsort((kk, kp, slab_of))  # stable: a wave's parts in resource order
    trip = np.column_stack([slab_of[o], kp[o], kk[o]])
    new = np.ones(o.size, bool)
    new[1:] = np.any(trip[1:] != trip[:-1], axis=1)
    starts = np.flatnonzero(new)
    # destination i's edges are [ustart[i], ustop[i]), and ustop[i] == ustart[i + 1]: one array with its end
    edge_at = np.append(ustart, ustop[-1] if ustop.size else 0).astype(np.int64)
    waves = [_wave(subs[o[a:b]], udst, ustart, edge_at, ct)
             for a, b in zip(starts, np.append(starts[1:], o.size), strict=True)]
    slab = trip[starts, 0]
    return waves, set(np.flatnonzero(np.append(slab[1:] != slab[:-1], True)).tolist())


def _wave(sl: np.ndarray, udst: np.ndarray, ustart: np.ndarray, edge_at: np.ndarray, ct: np.ndarray) -> _Wave:
    """One :class:`_Wave` from its resources' slices ``(lo, hi, ua, ub, ca, cb, resource)`` (rows of ``sl``);
    ``edge_at``: each destination's first edge, then the number of edges."""
    lo, n = sl[:, 0], sl[:, 1] - sl[:, 0]
    base = np.cumsum(n) - n  # each slice's first position among the wave's tasks
    ua, ub = sl[:, 2], sl[:, 3]
    e_lo = edge_at[ua]
    e_n = edge_at[ub] - e_lo
    u = _ranges(ua, ub - ua)  # the wave's destinations, slice by slice
    owner = np.repeat(np.arange(sl.shape[0]), ub - ua)
    pos = udst[u] - lo[owner] + base[owner]
    # each destination's first edge among the wave's edges (edges of one slice follow its destinations' order)
    e_base = np.cumsum(e_n) - e_n
    red = ustart[u] - e_lo[owner] + e_base[owner]
    c_lo, c_n = sl[:, 4], sl[:, 5] - sl[:, 4]
    cc = _ranges(c_lo, c_n)
    c_owner = np.repeat(np.arange(sl.shape[0]), c_n)
    cpos = ct[cc] - lo[c_owner] + base[c_owner]
    buckets = []
    width_class = np.ceil(np.log2(np.maximum(n, 1))).astype(np.int64)
    for w in np.unique(width_class[n > 1]):
        m = (width_class == w) & (n > 1)
        buckets.append((base[m], n[m], int(n[m].max())))
    return _Wave(lo=lo, n=n, e_lo=e_lo, e_n=e_n, red=red, pos=pos, c_lo=c_lo, c_n=c_n, cpos=cpos, buckets=buckets,
                 res=sl[:, 6].copy(), base=base, cc_i=cc, size=int(n.sum()), e_size=int(e_n.sum()))


def _pass(p: _Plan, s: np.ndarray, e: np.ndarray, ready: np.ndarray, m_ready: np.ndarray) -> float | None:
    """One pass over the resources: each task's start from its chain and its predecessors' current times, in
    place in ``s``/``e``; ``ready``: each collective task's ready time, for its instance's rendezvous. Returns how
    far a start moved at most (µs) in a pass over waves; None resource by resource (the caller compares). After
    each slab (module docstring) ``m_ready``, each instance's latest ready time, is gathered again, in place."""
    carry = np.full(p.n_res, p.floor)  # per resource: the running maximum where its previous part ended
    if p.waves is not None:
        moved, trk = 0.0, p.track
        for j, w in enumerate(p.waves):
            if trk.stale(j, w):
                trk.stamp += 1
                trk.seen[j] = trk.stamp
                moved = max(moved, _wave_pass(p, w, s, e, ready, m_ready, carry, j))
            else:  # its inputs as at its last visit: so are its times, and the maximum it carries on
                carry[w.res] = trk.carry[j]
            if j in p.slab_end:
                _gather_tracked(p, ready, m_ready)
        return moved
    _seg_pass(p, s, e, ready, m_ready, carry)
    return None


def _seg_pass(p: _Plan, s: np.ndarray, e: np.ndarray, ready: np.ndarray, m_ready: np.ndarray,
              carry: np.ndarray) -> None:
    """:func:`_pass` resource part by resource part (no waves). A part none of whose inputs changed since its last
    visit (``p.track``; what it reads: ``p.seg_deps``) is skipped, as a wave is: its times would come out the
    same, to the bit, and the maximum it carries on is the one it carried then."""
    r0, c, d, cg, floor, ct, ci = p.r0, p.c, p.d, p.cg, p.floor, p.ct, p.ci
    dsrc, dend, doff, udst, ustart, ustop = p.dsrc, p.dend, p.doff, p.udst, p.ustart, p.ustop
    prev_ct, ct_first, trk = p.prev_ct, p.ct_first, p.track
    seen, changed, carried = trk.seen, trk.changed, trk.carry  # lists: a part's few entries read one by one
    for j, (lo, hi, ua, ub, ca, cb, res) in enumerate(p.segs):
        last = seen[j]
        deps, self_dep = p.seg_deps[j]
        if not (last < 0 or (self_dep and changed[j] == last) or (cb > ca and trk.m_changed > last)
                or any(changed[k] > last for k in deps)):
            carry[res] = carried[j]
        else:
            trk.stamp += 1
            seen[j] = trk.stamp
            r = r0[lo:hi].copy()
            if ub > ua:
                da, db = int(ustart[ua]), int(ustop[ub - 1])
                src, off = dsrc[da:db], doff[da:db]
                vals = np.where(dend[da:db], e[src], s[src]) + off
                idx = udst[ua:ub] - lo
                r[idx] = np.maximum(r[idx], np.maximum.reduceat(vals, ustart[ua:ub] - da))
            if cb > ca:
                cidx = ct[ca:cb] - lo
                r_dep = r[cidx].copy()
                r[cidx] = np.maximum(r_dep, m_ready[ci[ca:cb]])
            cc = c[lo:hi]
            run = np.maximum(r - cc, floor)
            run[0] = max(run[0], carry[res])
            np.maximum.accumulate(run, out=run)
            out = carry[res] = float(run[-1])
            new_s = np.where(run <= floor, UNKNOWN, run + cc)
            # a carried maximum compared as a number, its sign with it (a NaN counts as changed)
            if not (out == carried[j] and math.copysign(1.0, out) == math.copysign(1.0, carried[j])) or \
                    not _same_bits(new_s, s[lo:hi]):
                changed[j] = seen[j]
            carried[j] = out
            s[lo:hi] = new_s
            e[lo:hi] = new_s + d[lo:hi]
            if cb > ca:
                pc = prev_ct[ca:cb]
                ready[ca:cb] = np.maximum(np.where(ct_first[ca:cb], UNKNOWN, e[pc] + cg[ct[ca:cb]]), r_dep)
        if j in p.slab_end:
            _gather_tracked(p, ready, m_ready)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two float arrays hold the very same values, bit for bit (0.0 and -0.0 differ)."""
    return bool(np.array_equal(a.view(np.int64), b.view(np.int64)))


def _gather_tracked(p: _Plan, ready: np.ndarray, m_ready: np.ndarray) -> None:
    """:func:`_gather_ready` after a slab, noting in ``p.track`` whether ``m_ready`` changed."""
    before = m_ready.copy() if p.ct.size else None
    _gather_ready(p, ready, m_ready)
    if before is not None and not _same_bits(before, m_ready):
        p.track.stamp += 1
        p.track.m_changed = p.track.stamp


def _gather_ready(p: _Plan, ready: np.ndarray, m_ready: np.ndarray) -> None:
    """Each instance's latest ready time over its participants (``m_ready``, in place) from ``ready``: this pass's
    where a participant's slab was visited, the pass before's where not yet."""
    if p.ct.size:
        m_ready.fill(UNKNOWN)
        np.maximum.at(m_ready, p.ci, ready)


def _wave_pass(p: _Plan, w: _Wave, s: np.ndarray, e: np.ndarray, ready: np.ndarray, m_ready: np.ndarray,
               carry: np.ndarray, j: int) -> float:
    """:func:`_pass` over one wave's resources at once: the same operations, on the wave's tasks one slice after
    another (laid out so by :func:`_lay_out_waves`: ``w.at`` on), written in place. ``s`` and ``e`` are the two
    halves of ``p.se``, where ``p.sidx`` finds an edge's source time in one gather. Returns how far a start of the
    wave moved at most (µs). ``carry``: per resource, the running maximum where its part in the slab before
    ended (read at each slice's first task, then set at its last). ``j``: the wave's position, where ``p.track``
    notes whether its times or carried maximum changed."""
    sl = slice(w.at, w.at + w.size)
    r = p.r0[sl].copy()
    if w.red.size:
        es = slice(w.e_at, w.e_at + w.e_size)
        vals = p.se[p.sidx[es]]
        vals += p.doff[es]
        # one edge per destination (launches, waits): the edges are their own maximum
        r[w.pos] = np.maximum(r[w.pos], vals if w.red.size == vals.size else np.maximum.reduceat(vals, w.red))
    cc_i = w.cc_i if w.cpos.size else None
    if cc_i is not None:
        r_dep = r[w.cpos]
        r[w.cpos] = np.maximum(r_dep, m_ready[p.ci[cc_i]])
    cc = p.c[sl]
    np.subtract(r, cc, out=r)
    np.maximum(r, p.floor, out=r)
    r[w.base] = np.maximum(r[w.base], carry[w.res])
    run = _seg_cummax(r, w.buckets, in_place=True) if w.buckets else r  # r is this call's own
    out = carry[w.res] = run[w.base + w.n - 1]
    trk = p.track
    changed = trk.carry[j] is None or not _same_bits(out, trk.carry[j])
    trk.carry[j] = out
    unknown = run <= p.floor
    new_s = np.add(run, cc, out=run)
    np.copyto(new_s, UNKNOWN, where=unknown)
    s_w = s[sl]
    moved = 0.0
    if new_s.size:
        diff = np.subtract(new_s, s_w)
        moved = float(np.abs(diff, out=diff).max())
        changed = changed or moved > 0 or not _same_bits(new_s, s_w)
    if changed:
        trk.changed[j] = trk.seen[j]
    s_w[...] = new_s
    np.add(new_s, p.d[sl], out=e[sl])
    if cc_i is not None:
        ready[cc_i] = np.maximum(np.where(p.ct_first[cc_i], UNKNOWN, e[p.prev_ct[cc_i]] + p.cg[cc_i]), r_dep)
    return moved


def _binding(g: Graph, s: np.ndarray, e: np.ndarray, cg: np.ndarray, lay: Layout, doff: np.ndarray) -> np.ndarray:
    """Per task, the predecessor whose time set its start (-1: its measured first start). ``lay``: the edges by
    destination (``doff``: their offsets, µs, in that order) and the collective tasks."""
    n = s.size
    heads = np.flatnonzero(g.first)  # each resource's first task: no chain before it
    best = np.empty(n)  # the chain: the previous task's end plus the gap
    best[:1] = -np.inf
    np.add(e[:-1], cg[1:], out=best[1:])
    best[heads] = -np.inf
    who = np.arange(-1, n - 1)
    who[heads] = -1
    dsrc, ddst, ct, ci = lay.dsrc, lay.ddst, lay.ct, lay.ci
    if ddst.size:
        # the source's start, or its end (a synchronize's edge, the sync-free graph's anchors), plus the offset
        vals = np.where(lay.dend, e[dsrc], s[dsrc])
        vals += doff
        if lay.ustart.size == vals.size:  # one edge per destination (launches, waves): each its own, no gather
            dd, vv, ss = ddst, vals, dsrc
        else:
            top = _last_max(vals, lay.ustart)
            if top is None:  # a NaN: the sort's order (NaN last)
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
        arrival = np.zeros(int(ci.max()) + 1, np.int64)  # per instance: its last participant's task
        arrival[ci[o[last]]] = ct[o[last]]
        lateness = arrival[ci]
        mine = lateness != ct
        later = s[ct] > best[ct] + TOLERANCE_US
        sel = mine & later
        who[ct[sel]] = lateness[sel]
    return who


def _last_max(vals: np.ndarray, starts: np.ndarray) -> np.ndarray | None:
    """Per group of ``vals`` (the groups start at ``starts``, ascending, and tile it): the index of its largest
    value, the last one among equals (as the last of a stable sort); None when a value is NaN."""
    if starts.size == vals.size:  # one value per group (launches, waves): its own
        return np.arange(vals.size)
    if np.isnan(vals).any():  # its group's maximum is NaN, equal to none of its values
        return None
    # each group's largest (value, index): its largest value, the last index among equals
    return np.maximum.reduceat(pair_keys(vals, np.arange(vals.size)), starts).imag.astype(np.int64)


def pair_keys(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """``first + second·i`` (complex128, the shape of ``first``): NumPy orders complex numbers by their real parts,
    then their imaginary ones, so a running maximum or ``reduceat`` of these keys orders (first, second) pairs in
    one pass, without a sort. Both parts exact: floats, or integers below 2**53. NaN has no order: callers check."""
    out = np.empty(np.shape(first), np.complex128)
    out.real, out.imag = first, second
    return out


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


def on_critical_paths(rp: Replay, ends: np.ndarray) -> np.ndarray:
    """Per task: whether it is on the path that sets the start of any task in ``ends`` (the binding predecessors
    walked back to a pinned start, all ends at once). In this max-plus recurrence a task's start is the length of
    that path; shortening tasks off it cannot move the end, so a rewrite that changes none of them saves exactly
    nothing (the longest path of a DAG: Kelley and Walker's critical path method)."""
    who = rp.binding  # type: ignore[attr-defined]
    n = who.size
    mark = np.zeros(n, dtype=bool)
    # most bindings are the chain (the task before on the same resource): walk each run of them as one range
    idx = np.arange(n)
    run_lo = np.where(who == idx - 1, 0, idx)
    np.maximum.accumulate(run_lo, out=run_lo)  # the first task of the chain run that ends at each task
    t = np.unique(ends[(ends >= 0) & (ends < n)])
    while t.size:
        lo = run_lo[t]
        for a, b in zip(lo.tolist(), t.tolist(), strict=True):
            mark[a: b + 1] = True
        t = who[lo]
        t = np.unique(t[t >= 0])
        t = t[~mark[t]]
    return mark


__all__ = ["Layout", "Replay", "critical_path", "layout_of", "on_critical_paths", "pinned_tasks", "replay", "K_COLL"]
