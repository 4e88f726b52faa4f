"""The ``no_host_sync`` graph is built for every rank at once (issue 38: rank by rank over arrays of every rank it
took 41 s at 1,024 ranks); it is the graph the rank-by-rank rule gives, to the bit, on a 40-rank NCCL job and on
random graphs with ties in time, one-stream ranks and steps left out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.synth import write_gpu_job
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.replay import graph as gr
from traceanalyze.replay.scenarios import host


def _by_rank(g: gr.Graph) -> tuple[np.ndarray, ...]:
    """The rule of :func:`host.without_host_syncs`, stream by stream and rank by rank (the reference): each
    blocking wait precedes the first task of every stream of its rank that starts at or after the task after the
    wait; each device task of a step on a rank's other streams follows the busiest stream's last task ended by its
    start (+ the tolerance). New edges end to start, as event waits, after the kept ones; edges ordered by
    destination."""
    sync = host._host_sync_edges(g)
    dev = np.isin(g.kind, gr.GPU_KINDS)
    new: list[tuple[int, int]] = []
    for s in sorted(set(g.res[dev].tolist())):
        ids = np.flatnonzero(g.res == s)
        for e in np.flatnonzero(sync & (g.rank[g.dep_dst] == g.rank[ids[0]])).tolist():
            j = int(np.searchsorted(g.start[ids], g.start[g.dep_dst[e]]))
            if j < ids.size:
                new.append((int(g.dep_src[e]), int(ids[j])))
    busy = np.bincount(g.res[dev], weights=g.dur[dev], minlength=int(g.res.max(initial=0)) + 1)
    for r in sorted(set(g.rank[dev].tolist())):
        streams = sorted(set(g.res[dev & (g.rank == r)].tolist()))
        main = max(streams, key=lambda x: (busy[x], -x))
        ids = np.flatnonzero(g.res == main)
        ends = np.maximum.accumulate(g.start[ids] + g.dur[ids])
        for t in np.flatnonzero(dev & (g.rank == r) & (g.res != main) & (g.step >= 0)).tolist():
            j = int(np.searchsorted(ends, g.start[t] + host.ANCHOR_TOLERANCE_US, side="right")) - 1
            if j >= 0:
                new.append((int(ids[j]), t))
    s2 = np.array([*g.dep_src[~sync].tolist(), *(a for a, _ in new)], g.dep_src.dtype)  # the graph's task ids
    d2 = np.array([*g.dep_dst[~sync].tolist(), *(b for _, b in new)], g.dep_dst.dtype)
    end = np.concatenate([g.dep_end[~sync], np.ones(len(new), g.dep_end.dtype)])
    off = np.concatenate([g.dep_off[~sync], np.zeros(len(new), g.dep_off.dtype)])
    typ = np.concatenate([g.dep_type[~sync], np.full(len(new), gr.DEP_TYPES.index("event_wait"), g.dep_type.dtype)])
    o = np.argsort(d2, kind="stable")
    return s2[o], d2[o], end[o], off[o], typ[o]


def _same(g: gr.Graph) -> None:
    free = host.without_host_syncs(g)
    got = (free.dep_src, free.dep_dst, free.dep_end, free.dep_off, free.dep_type)
    for a, b in zip(got, _by_rank(g), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def _random_graph(g: gr.Graph, rng: np.random.Generator) -> gr.Graph:
    """``g`` with random tasks and edges: up to 6 ranks of up to 4 resources (host or device), times on a coarse
    grid (ties), some tasks outside the steps; edges of every type between any tasks."""
    rank, res, kind, start, dur, step = [], [], [], [], [], []
    for r in range(int(rng.integers(1, 7))):
        for _ in range(int(rng.integers(1, 5))):
            n = int(rng.integers(1, 12))
            host = rng.random() < 0.35
            rank += [r] * n
            res += [len(set(res))] * n
            kind += [gr.K_HOST] * n if host else rng.choice(list(gr.GPU_KINDS), n).tolist()
            start += np.sort(rng.choice([-1.0, 0.0, 1.0, 2.0, 2.5, 3.0, 5.0, 7.0, 7.5, 10.0], n)).tolist()
            dur += rng.choice([0.0, 0.5, 1.0, 3.0, 6.0], n).tolist()
            step += rng.integers(-1, 3, n).tolist()
    n, e = len(rank), int(rng.integers(0, 30))
    return dataclasses.replace(
        g, rank=np.array(rank, g.rank.dtype), res=np.array(res, g.res.dtype), kind=np.array(kind, g.kind.dtype),
        start=np.array(start), dur=np.array(dur), step=np.array(step, g.step.dtype),
        dep_src=rng.integers(0, n, e).astype(g.dep_src.dtype), dep_dst=rng.integers(0, n, e).astype(g.dep_dst.dtype),
        dep_end=rng.random(e) < 0.5, dep_off=rng.random(e),
        dep_type=rng.integers(0, len(gr.DEP_TYPES), e).astype(g.dep_type.dtype))


@pytest.fixture(scope="module")
def gpu40(tmp_path_factory) -> gr.Graph:
    folder = write_gpu_job(tmp_path_factory.mktemp("job"), 40, steps=4, straggler=17)
    a = analyze(folder, Options(jobs=1))
    return gr.build(a.con, 1, "gpu", 40)


def test_no_host_sync_graph_of_40_ranks_is_the_rank_by_rank_graph(gpu40):
    g, dev = gpu40, np.isin(gpu40.kind, gr.GPU_KINDS)
    assert {len(set(g.res[dev & (g.rank == r)].tolist())) for r in g.ranks} == {2}  # a GEMM and an NCCL stream
    sync = host._host_sync_edges(g)
    assert sync.sum() == 240  # per rank, 3 steps' syncs on both streams
    assert host._sync_order_edges(g, dev, sync)[0].size == 400
    assert host._side_stream_anchors(g, dev)[0].size == 120  # each step's NCCL kernel after its GEMM
    _same(g)


def test_no_host_sync_graph_of_random_graphs_is_the_rank_by_rank_graph(gpu40):
    rng = np.random.default_rng(38)
    for _ in range(300):
        _same(_random_graph(gpu40, rng))
