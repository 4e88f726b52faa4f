"""The graph's build (:func:`build`): the run's ranks in chunks of whole ranks, each chunk's tasks, edges and
labels built on a thread of its own, the chunks joined, then the collectives matched across ranks and (GPU runs)
the profiler's events counted."""

from __future__ import annotations

import threading

import duckdb
import numpy as np

from traceanalyze.executors import on_own_cursor, usable_cpus
from traceanalyze.metrics.collectives import Calls
from traceanalyze.replay.graph.deps import (
    Edges,
    event_wait_edges,
    gloo_issue_edges,
    launch_edges,
    sync_edges,
    wait_edges,
)
from traceanalyze.replay.graph.events import profiler_events
from traceanalyze.replay.graph.instances import match_collectives
from traceanalyze.replay.graph.labels import categories, precision_classes
from traceanalyze.replay.graph.model import K_COLL, Graph
from traceanalyze.replay.graph.source import RunClock, fetch, run_clock, unify_names
from traceanalyze.replay.graph.tasks import (
    Tasks,
    device_tasks,
    host_tasks,
    marker_tasks,
    order_tasks,
    step_markers,
    steps_by_anchor,
)

BUILD_CHUNK_EVENTS = 1_000_000  # kernels + CPU ops of the ranks whose graph is built at once by one thread (bounds what
# the build holds beside the graph: the 8-rank scale set is 1 chunk on one thread, 2 on two; 1,024 small ranks are 5)
BUILD_THREADS_MAX = 2  # threads that build chunks at once (DuckDB and NumPy work without the GIL); each holds a chunk


def build(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world_size: int | None,
          clock_offsets_us: dict | None = None, max_chunk_events: int = BUILD_CHUNK_EVENTS,
          threads: int | None = None, calls: Calls | None = None) -> Graph:
    """Build the run's graph from the store (the package docstring); nothing is written (see :func:`.writer.save`).

    Args:
        con: the store with ``files.run_id``/``rank`` set.
        run_id: the run.
        mode: ``gpu`` (kernels present) or ``cpu`` (gloo / CPU-only: top-level ops are the host tasks).
        world_size: ranks in the job (a collective whose group reaches a rank not in the folder is incomplete).
        clock_offsets_us: rank -> offset (µs) to subtract from its times (``metrics.collectives``), or None.
        max_chunk_events: kernels and CPU ops read at once by one thread (:func:`_rank_chunks`); the graph does not
            depend on it.
        threads: chunks built at once, each on a cursor of its own (default :func:`build_threads`; 1 where the
            caller runs other work meanwhile); the graph does not depend on it. On GPU runs the profiler's events
            (:func:`.events.profiler_events`) are counted on one more thread: on one thread, each chunk's from when
            its tasks are ordered, beside the rest of the build (the tail waits only for the last chunk's); on
            several, the whole graph's after the join, beside the collectives' matching.
        calls: the run's collective calls (:func:`traceanalyze.metrics.collectives.match_collectives` with
            ``groups`` on GPU runs), when the caller has them; else read here. The graph does not depend on it.
    """
    threads = build_threads() if threads is None else max(1, threads)
    rc = run_clock(con, run_id, mode, world_size, clock_offsets_us)
    st = fetch(con, "SELECT file_id, rank, step, start_ns, end_ns, pid, tid, counted FROM profiler_steps(?)",
                [run_id])
    chunks = _build_chunks(con, rc, _rank_chunks(con, rc, max_chunk_events, threads), st, threads)
    base = np.cumsum([0] + [ch["n"] for ch in chunks])  # each chunk's first task id
    c = _join_chunks(chunks)
    del chunks
    # edges in one canonical order (destination, source, type), whatever the chunks
    dep = c.pop("dep")
    o = np.lexsort((dep[4], dep[0], dep[1])) if dep[0].size else np.zeros(0, np.int64)
    # narrow the codes and task ids (below 2^31: the graph would not fit in memory long before): ~60 MB at 1,024
    # ranks; each array narrowed (and sorted) in turn, its wide copy released before the next
    for i, t in enumerate((np.int32, np.int32, bool, float, np.int8)):
        dep[i] = dep[i][o].astype(t, copy=False)
    del o
    c["res"] = c["res"].astype(np.int32)
    c["kind"] = c["kind"].astype(np.int8)
    codes, names = c.pop("name")
    codes = codes.astype(np.int32)
    g = Graph(run_id=run_id, mode=mode, ranks=rc.ranks, world_size=rc.world, res_names=c["res_names"],
              rank=c["rank"], res=c["res"], kind=c["kind"], name=names,
              name_code=codes, step=c["step"], start=c["start"],
              dur=c["dur"], gap=c["gap"], first=c["first"], chain_gap=c["cg"], chain_dur=c["cd"],
              gap_label=c["gap_label"], cover=c["cover"], gap_cover=c["gap_cover"],
              dep_src=dep[0], dep_dst=dep[1], dep_end=dep[2],
              dep_off=dep[3], dep_type=dep[4],
              inst=np.full(c["start"].size, -1, np.int32), inst_transfer=np.zeros(0),
              inst_complete=np.zeros(0, bool), inst_coll=[], inst_bytes=np.zeros(0, np.int64),
              inst_n=np.zeros(0, np.int64), inst_matched_by=[], steps=c["steps"], missing_edges=[],
              prec_class=c["prec"], prof_events=np.zeros((4, c["start"].size), np.uint16))
    if mode == "gpu" and not c["event_waits"]:
        g.missing_edges.append("cross-stream event waits (the traces hold neither cuda_sync \"Stream Wait Event\" "
                               "rows nor cudaStreamWaitEvent calls: streams are ordered only by their launches)")
    counted = c.pop("events")  # each chunk's profiler events, counted beside the build since its tasks were ordered
    if mode == "gpu" and not counted:  # else the graph's, on a thread of their own beside the collectives' matching
        counted = [on_own_cursor(con, profiler_events, rc, g, name="traceanalyze-events")]
    match_collectives(con, g, rc, c["coll_fid"], c["coll_ts"], calls)
    if len(counted) == 1:  # the graph's counts as they are (the zeros it holds were never written: no memory)
        g.prof_events = counted.pop()()
    for i, (lo, hi) in enumerate(zip(base[:-1].tolist(), base[1:].tolist(), strict=True)) if counted else ():
        g.prof_events[:, lo:hi] = counted[i]()
        counted[i] = None  # each chunk's counts released once copied
    return g


_CURSOR_LOCK = threading.Lock()  # cursors are opened one at a time, whatever thread opens them


class _EventTasks:
    """The columns of a chunk's :class:`.tasks.Tasks` that :func:`.events.profiler_events` reads (the rest, its
    source columns, is released with the chunk, whenever its events are counted)."""

    __slots__ = ("dur", "first", "rank", "res", "res_names", "start")

    def __init__(self, t: Tasks) -> None:
        self.rank, self.res, self.res_names = t.rank, t.res, t.res_names
        self.start, self.dur, self.first = t.start, t.dur, t.first


def build_threads() -> int:
    """Threads for :func:`build`: the CPUs this process may run on, at most :data:`BUILD_THREADS_MAX`."""
    return max(1, min(BUILD_THREADS_MAX, usable_cpus()))


def _rank_chunks(con, rc: RunClock, max_events: int, threads: int = 1) -> list[list[int]]:
    """The run's file ids in chunks of whole ranks, in rank order. A chunk holds at most ``max_events`` kernels and
    CPU ops (one rank over it is a chunk of its own), and is closed once it holds an even share of the run's over
    ``threads``: each thread builds a chunk at a time, so what building holds beside the graph is bounded by
    ``threads`` chunks, not by the run, and a run of less than that still gives every thread a chunk. (Smaller
    chunks would hold less, but their arrays fall under glibc's mmap threshold and fragment the heap: 1,024 ranks
    in chunks of 500k events peaked at 1,035 MB, in chunks of 1M at 800 MB.)"""
    rows = con.execute("""SELECT rank, list(file_id ORDER BY file_id),
               sum(coalesce(n_kernels, 0) + coalesce(n_cpu_ops, 0))
        FROM files WHERE run_id = ? AND rank IS NOT NULL GROUP BY rank ORDER BY rank""", [rc.run_id]).fetchall()
    cap = max(1, max_events)
    share = -(-sum(int(n or 0) for _, _, n in rows) // max(1, threads))
    chunks: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for _, fids, n in rows:
        if cur and (size + int(n or 0) > cap or size >= share):
            chunks.append(cur)
            cur, size = [], 0
        cur += [int(f) for f in fids]
        size += int(n or 0)
    return [*chunks, cur] if cur else chunks


def _build_chunks(con, rc: RunClock, groups: list[list[int]], st: dict[str, np.ndarray], threads: int
                  ) -> list[dict]:
    """:func:`_build_chunk` of each group of file ids, in order: on ``threads`` threads when there are several
    groups, each thread on a cursor of its own (a DuckDB connection runs one query at a time). The GIL is free
    while DuckDB reads and NumPy sorts and searches, so two threads build the 8-rank scale set's graph in about
    half the time one takes (0.24-0.33 s against 0.42-0.85 s)."""
    def chunk_of(cur, fids: list[int]) -> dict:
        # the events beside a chunk only on one thread (beside the analyses: the tail is the critical path); on
        # several, after the join (their temporaries beside two chunks' raised the peak at 1,024 ranks)
        return _build_chunk(cur, rc, fids, {k: v[np.isin(st["file_id"], fids)] for k, v in st.items()},
                            con if threads <= 1 else None)

    n = min(threads, len(groups))
    if n <= 1:
        return [chunk_of(con, fids) for fids in groups]
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()
    cursors: list = []

    def task(fids: list[int]) -> dict:
        cur = getattr(local, "cur", None)
        if cur is None:
            with _CURSOR_LOCK:  # cursor() on one connection from several threads at once: one at a time
                cur = local.cur = con.cursor()
                cursors.append(cur)
        return chunk_of(cur, fids)

    try:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="traceanalyze-graph") as pool:
            return list(pool.map(task, groups))
    finally:
        for cur in cursors:
            cur.close()


def _build_chunk(con, rc: RunClock, fids: list[int], st: dict[str, np.ndarray], root) -> dict:
    """The graph's arrays for the ranks of ``fids`` (tasks, edges, categories; task ids local to the chunk).
    Every edge but a collective's rendezvous joins tasks of one rank, so chunks of whole ranks join without
    loss (:func:`_join_chunks`). ``root``: the build's connection, whose cursor counts the chunk's profiler
    events (it outlives ``con``, a thread's cursor closed once its chunks are built)."""
    dev = device_tasks(con, rc, fids) if rc.mode == "gpu" else None
    dev_keys = np.sort((dev["fid"] << 40) + dev["corr"]) if dev is not None else None
    waits, host = host_tasks(con, rc, fids, dev_keys)
    parts = [host]
    del host, dev_keys
    if dev is not None:
        parts.append(dev)
    del dev
    parts.append(marker_tasks(st))
    t = order_tasks(parts, rc)
    del parts
    # the chunk's profiler events counted on a cursor and thread of their own from now on, beside the rest of the
    # build (mostly DuckDB reads and NumPy sorts, which free the GIL): they need only the tasks in resource order
    events = []
    if rc.mode == "gpu" and root is not None:
        with _CURSOR_LOCK:  # on_own_cursor opens a cursor before it returns
            events.append(on_own_cursor(root, profiler_events, rc, _EventTasks(t), fids, name="traceanalyze-events"))
    step, steps = step_markers(t, st)
    edges = Edges()
    anchor, cg, cd = t.start.copy(), t.gap.copy(), t.dur.copy()
    dev = np.flatnonzero(t.rk == 1)
    launch_edges(t, dev, edges, anchor, cg)
    if rc.mode != "gpu":
        gloo_issue_edges(con, rc, t, edges, anchor, cg, fids)
    if steps:
        step = steps_by_anchor(t, steps, anchor, step)
    event_waits = 0
    if rc.mode == "gpu":
        event_waits = event_wait_edges(con, rc, t, edges, cg, anchor, fids, waits)
        sync_edges(t, dev, edges, cd)
    del anchor
    wait_edges(t, rc.mode, edges, cg)
    # categories: host time under dataloader / compile / optimizer ranges and fp32 matmuls (CPU runs)
    prec = precision_classes(t) if rc.mode == "gpu" else np.zeros(t.n, np.int8)  # GPU runs only
    cover, gap_cover, gap_label, zero = categories(con, rc, t, fids, prec)
    coll = t.kind == K_COLL
    return dict(n=t.n, rank=t.rank, res=t.res, kind=t.kind, name=(t.name_code, t.names), step=step, start=t.start,
                dur=t.dur, gap=t.gap, first=t.first, cg=cg, cd=cd, gap_label=gap_label, cover=cover,
                event_waits=event_waits, prec=prec, events=events, zero=zero,
                gap_cover=gap_cover, dep=edges.arrays(), steps=steps, res_names=t.res_names,
                coll_fid=t.cols["fid"][coll], coll_ts=rc.abs_ns(t.rel[coll], t.rank[coll]))


def _join_chunks(chunks: list[dict]) -> dict:
    """One chunk's arrays for the whole run: task ids, resources and edges offset by the chunks before; each
    array is joined and its parts released in turn (the peak is the graph plus one array)."""
    if len(chunks) == 1:
        return chunks[0]
    base = np.cumsum([0] + [c["n"] for c in chunks])
    res_base = np.cumsum([0] + [len(c["res_names"]) for c in chunks])
    out: dict = {"steps": [(r, s, b + int(o), e + int(o), k) for c, o in zip(chunks, base, strict=False)
                           for r, s, b, e, k in c["steps"]], "event_waits": sum(c["event_waits"] for c in chunks),
                 "res_names": [n for c in chunks for n in c["res_names"]],
                 "events": [w for c in chunks for w in c.pop("events")]}
    out["name"] = unify_names([c.pop("name") for c in chunks])[::-1]
    for c, o, ro in zip(chunks, base, res_base, strict=False):
        c["res"] = c["res"] + ro
        src, dst, *rest = c["dep"]
        c["dep"] = [src + o, dst + o, *rest]
    for k in ("rank", "res", "kind", "step", "start", "dur", "gap", "first", "cg", "cd", "gap_label", "coll_fid",
              "coll_ts", "prec"):
        out[k] = np.concatenate([c.pop(k) for c in chunks])
    deps = [c.pop("dep") for c in chunks]
    out["dep"] = []
    for i in range(5):  # each column joined, then its parts released
        out["dep"].append(np.concatenate([d[i] for d in deps]))
        for d in deps:
            d[i] = None
    for k in ("cover", "gap_cover"):
        out[k] = {}
        for cat in list(chunks[0][k]):
            arrs = [c[k].pop(cat) for c in chunks]
            # all-zero categories stay calloc'd zeros (no memory until written); a chunk's known zeros unread
            nonzero = any(a.any() for a, c in zip(arrs, chunks, strict=True) if cat not in c["zero"][k])
            out[k][cat] = np.concatenate(arrs) if nonzero else np.zeros(int(base[-1]))
    return out
