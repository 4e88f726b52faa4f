"""Each rank's dependency graph, built from the store and written back to it (``sim_task``, ``sim_dep``,
``sim_coll``; views ``sim_edge`` and ``sim_gap``). Design: ``shared/WHATIF.md`` §1-4, ``docs/replay.md``.

Tasks (one row of ``sim_task`` each; times in µs, measured, on the rank's clock minus its collective clock
offset and the run's first timestamp):

- **host**: GPU runs: the ``cuda_runtime``/``cuda_driver`` calls of every thread. CPU runs (gloo): the top-level
  ops of every thread, ``ProfilerStep#N`` itself left out so that its children are the tasks;
- **gaps**: the host time between two consecutive host tasks of a thread, stored on the task that follows it
  (``gap_us``) and labelled by what encloses it (``dataloader``, ``compile``, ``optimizer``, ``launch`` between two
  kernel launches, else ``host``); the view ``sim_gap`` lists them as rows;
- **kernel / memcpy / memset** on their ``(device, stream)``; **collective**: an NCCL/RCCL kernel or a ``gloo:*``
  range (on its gloo thread);
- **step_begin / step_end**: zero-length markers at each ``ProfilerStep#N`` boundary, on the step's thread.

Edges: host and stream order (consecutive tasks of a resource, implicit), and in ``sim_dep``: ``launch``
(``correlation``; gloo: the ``c10d::*`` call that issued it), ``gpu_cpu_sync`` (a blocking synchronize call
waits for the last device task to end before it returns), ``inter_thread`` and ``collective_wait`` (a host gap of
≥ :data:`WAIT_GAP_US` that ends after a task of another thread, or a collective, of the rank ended in its last
three quarters: the thread waited for it). Launch weights follow HTA's rule: the measured launch latency when
the stream was idle at launch, else 0 and the stream order governs. Collective rendezvous: ``sim_coll``.

Collective instances are matched across ranks by ``(process group, Seq)`` when every call carries ``Seq``, else
by the per-rank ordinal within each ``ProfilerStep#N`` (per process group); an instance is complete when every
rank of its group is in the folder, each has one call, and name and bytes agree (TraceLens
``strict_metadata_check``). Transfer = median over ranks of (end − latest start) (straggler paper §3.2);
incomplete instances keep their measured duration and are listed as unmatched.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field

import duckdb
import numpy as np

from traceanalyze import matmath
from traceanalyze.executors import on_own_cursor
from traceanalyze.ingest import compute as pc  # Arrow's compute functions without importing pyarrow.compute
from traceanalyze.metrics.collectives import busbw_factor, collective_calls, communication_kernels, int_column
from traceanalyze.metrics.host import COMPILE_RANGES

KINDS = ("host", "kernel", "memcpy", "memset", "collective", "step_begin", "step_end")
K_HOST, K_KERNEL, K_MEMCPY, K_MEMSET, K_COLL, K_BEGIN, K_END = range(7)
GPU_KINDS = (K_KERNEL, K_MEMCPY, K_MEMSET, K_COLL)  # the task kinds that run on a GPU stream
DEP_TYPES = ("launch", "gpu_cpu_sync", "inter_thread", "collective_wait", "event_wait")
CATEGORIES = ("dataloader", "compile", "optimizer", "launch", "matmul_fp32")
GAP_LABELS = ("host", "launch", "optimizer", "compile", "dataloader")  # sim_task.gap_label; code -1: none
# Graph.prec_class: what the precision what-ifs may re-time (traceanalyze.replay.precision)
# and, on host tasks, the kernel-launch calls that a CUDA graph replaces (the launch what-if)
P_MM_FP32, P_ATTN_FP32, P_MM_TF32, P_MEM, P_MM_LOWP, P_LAUNCH, P_MEM_IN_PLACE = 1, 2, 3, 4, 5, 6, 7
PRECISION_CLASSES = ("none", "matmul_fp32", "attention_fp32", "matmul_tf32", "memory_autocast", "matmul_16bit",
                     "launch_call", "memory_in_place")
WAIT_GAP_US = 1000.0  # a host gap this long may be a wait on another thread or a collective (Chakra, Lumos: 1 ms)
WAIT_TAIL = 0.25  # ... when the awaited task ended after this share of the gap
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "hipDeviceSynchronize",
              "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaMemcpyAsync",
                "cudaMemsetAsync", "cudaGraphLaunch", "hipLaunchKernel", "hipExtModuleLaunchKernel",
                "hipModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::_scaled_mm")
# host-row flag computed by DuckDB (a Python pass over 500k names costs seconds): 1 sync, 2 launch, 3 gloo
_FLAG = ("CASE WHEN c.name IN (SELECT unnest($2)) THEN 1 WHEN c.name IN (SELECT unnest($3)) THEN 2 "
         "WHEN c.name LIKE 'gloo:%' THEN 3 ELSE 0 END AS flag")
BUILD_CHUNK_EVENTS = 1_000_000  # kernels + CPU ops of the ranks whose graph is built at once by one thread (bounds what
# the build holds beside the graph: the 8-rank scale set is 1 chunk on one thread, 2 on two; 1,024 small ranks are 5)
PROFILER_EVENTS_BATCH = 250_000  # CPU ops whose profiler events are counted at once (_profiler_events)
BUILD_THREADS_MAX = 2  # threads that build chunks at once (DuckDB and NumPy work without the GIL); each holds a chunk
FETCH_BATCH_ROWS = 1 << 17  # rows per Arrow batch read from DuckDB by _fetch_arrow
SAVE_SLICE_ROWS = 1 << 18  # sim_task rows written per INSERT by save
_T_SHIFT = 41  # thread/rank index << _T_SHIFT + ns since the run's start: one sortable int64 key (2^41 ns = 36 min)


@dataclass
class Graph:
    """The run's tasks in resource order (task id = index), their edges and collective instances.

    Arrays are per task unless named ``inst_*`` (per collective instance) or ``dep_*`` (per explicit edge).
    Times and durations are µs. ``chain_gap``/``chain_dur`` are what the replay adds along a resource: the measured
    gap and duration, less the waiting that an explicit edge now models (a synchronize call's blocked part, a
    waiting gap's head).
    """

    run_id: int
    mode: str
    ranks: list[int]
    world_size: int
    res_names: list[str]
    rank: np.ndarray
    res: np.ndarray
    kind: np.ndarray
    name: object  # pyarrow string array: the distinct task names
    name_code: np.ndarray  # per task: index of its name in ``name``
    step: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    gap: np.ndarray
    first: np.ndarray
    chain_gap: np.ndarray
    chain_dur: np.ndarray
    gap_label: np.ndarray  # int8 per task: index into GAP_LABELS, -1 for none
    cover: dict[str, np.ndarray]  # category -> µs of the task under it
    gap_cover: dict[str, np.ndarray]  # category -> µs of the gap before the task under it
    dep_src: np.ndarray
    dep_dst: np.ndarray
    dep_end: np.ndarray
    dep_off: np.ndarray
    dep_type: np.ndarray
    inst: np.ndarray  # per task: collective instance index, -1 for none
    inst_transfer: np.ndarray
    inst_complete: np.ndarray
    inst_coll: list[str]
    inst_bytes: np.ndarray
    inst_n: np.ndarray
    inst_matched_by: list[str]
    steps: list[tuple[int, int, int, int, bool]]  # (rank, step, begin task, end task, counted)
    inst_all: np.ndarray | None = None  # per collective task, in task order: its instance, complete or not
    unmatched: list[str] = field(default_factory=list)
    missing_edges: list[str] = field(default_factory=list)
    partial: bool = False
    prec_class: np.ndarray | None = None  # int8 per task: PRECISION_CLASSES index (GPU runs)
    prof_events: np.ndarray | None = None  # uint16 (4, tasks): profiler-recorded events by kind (_profiler_events)

    @property
    def n_instances(self) -> int:
        """Complete collective instances (matched on every rank of their group)."""
        return int(self.inst_complete.sum())


def name_codes(g: Graph, part: str) -> list[int]:
    """Indices into ``g.name`` of the distinct task names that contain ``part`` (lower case), for ``g.name_code``."""
    names = g.name.to_pylist() if hasattr(g.name, "to_pylist") else list(g.name)
    return [i for i, n in enumerate(names) if n and part in n.lower()]


def rank_step_groups(g: Graph, sel: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """``(width, keys, inv)``: the (rank, step) groups of the tasks ``sel`` (ids with ``step >= 0``) as keys
    ``rank × width + step`` (sorted, distinct) and each task's index into them."""
    width = int(g.step.max(initial=0)) + 2
    keys, inv = np.unique(g.rank[sel].astype(np.int64) * width + g.step[sel], return_inverse=True)
    return width, keys, inv.reshape(-1)


def _seg_cummax_excl(values: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` (int64 ≥ 0, < 2^_T_SHIFT) over the previous rows of the same ``seg`` (sorted),
    -1 for a segment's first row."""
    key = seg.astype(np.int64) << _T_SHIFT
    run = np.maximum.accumulate(values + key)
    prev = np.empty_like(run)
    if run.size:
        prev[0] = -1
        prev[1:] = run[:-1]
        same = np.empty(run.size, dtype=bool)
        same[0] = False
        same[1:] = seg[1:] == seg[:-1]
        prev = np.where(same, prev - key, -1)
    return prev


def _union_cover(keys: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Disjoint union of intervals per key (key << _T_SHIFT + ns): returns (starts, ends, cumulative covered ns
    before each interval) in one sorted key space, for :func:`_covered`."""
    if lo.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = keys.astype(np.int64) << _T_SHIFT
    a, b = lo + k, hi + k
    o = np.argsort(a, kind="stable")
    a, b = a[o], b[o]
    run_end = np.maximum.accumulate(b)
    new = np.ones(a.size, dtype=bool)
    new[1:] = a[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    starts = a[idx]
    ends = np.maximum.reduceat(b, idx)
    lengths = ends - starts
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return starts, ends, before


def _covered(cover, keys: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Covered ns up to time ``t`` (per key) in the union built by :func:`_union_cover`."""
    starts, ends, before = cover
    if starts.size == 0:
        return np.zeros(t.size, dtype=np.int64)
    x = (keys.astype(np.int64) << _T_SHIFT) + t
    i = np.searchsorted(starts, x, side="right") - 1
    ok = i >= 0
    ic = np.clip(i, 0, None)
    inside = np.minimum(x, ends[ic]) - starts[ic]
    return np.where(ok, before[ic] + np.clip(inside, 0, None), 0)


def _flag_args(run: list) -> list:
    return [*run, list(SYNC_CALLS), list(LAUNCH_CALLS)]


def _fetch(con, sql: str, params: list) -> dict[str, np.ndarray]:
    return con.execute(sql, params).fetchnumpy()


def _fetch_arrow(con, sql: str, params: list) -> dict:
    """Columns of a query: ``name`` as (per row: index into the distinct names, the distinct names as an Arrow
    string array), the others as NumPy arrays with NULL read as 0. The result streams from DuckDB in batches of
    :data:`FETCH_BATCH_ROWS`, each converted as it comes: the whole result never exists as Arrow (at 1,024 ranks
    that was hundreds of MB beside the arrays made from it)."""
    import pyarrow as pa

    con.complete()  # DuckDB 2 refuses a new query while a DB-API result of this connection is unfinished
    reader = con.sql(sql, params=params).to_arrow_reader(FETCH_BATCH_ROWS)
    parts: dict[str, list] = {c: [] for c in reader.schema.names}
    for batch in reader:
        for c, a in zip(batch.schema.names, batch.columns, strict=True):
            if c == "name":
                parts[c].append(_name_codes(a))
                continue
            if a.null_count:
                a = pc.fill_null(a, False if pa.types.is_boolean(a.type) else 0)
            # a copy: a view would keep the whole DuckDB batch (its strings too) alive until the end
            parts[c].append(a.to_numpy(zero_copy_only=False, writable=True))
        del batch
    out: dict = {}
    for c in list(parts):
        chunks = parts.pop(c)
        if c == "name":
            out[c] = _unify_names(chunks)[::-1] if chunks else (np.zeros(0, np.int64), pa.array([], pa.string()))
        else:
            out[c] = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)  # callers cast as they need
    return out


def _name_codes(names) -> tuple[np.ndarray, object]:
    """(per row: index into the distinct names, the distinct names as an Arrow string array) of an Arrow string
    column: a graph holds each of its few hundred names once, not once per task."""
    import pyarrow as pa

    enc = pc.dictionary_encode(names, "encode")  # an Arrow array: a batch's column, or the step markers
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, pc.cast(enc.dictionary, pa.string())


@dataclass
class _RunClock:
    """The run's files, ranks and clocks, as every part of :func:`build` reads them.

    ``origin``: the run's first CPU timestamp (ns); ``off_ns``: per rank 0..``world``, its clock offset (ns);
    ``fid``/``fid_rank``: the run's file ids (sorted) and each one's rank.
    """

    run_id: int
    mode: str
    ranks: list[int]
    world: int
    origin: int
    off_ns: np.ndarray
    fid: np.ndarray
    fid_rank: np.ndarray

    def rank_of(self, fids: np.ndarray) -> np.ndarray:
        """The rank of each file id (int64 array)."""
        return self.fid_rank[np.searchsorted(self.fid, fids)] if fids.size else np.zeros(0, np.int64)

    def rel_ns(self, ts: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Timestamps (ns, the rank's clock) as ns since the run's start on the reference clock."""
        return ts - self.origin - self.off_ns[np.clip(rank, 0, self.world)]


def _run_clock(con, run_id: int, mode: str, world_size: int | None, clock_offsets_us: dict | None) -> _RunClock:
    offs = {int(k): float(v) for k, v in (clock_offsets_us or {}).items()}
    files = _fetch(con, "SELECT file_id, rank FROM files WHERE run_id = ? AND rank IS NOT NULL ORDER BY file_id",
                   [run_id])
    file_rank = dict(zip(files["file_id"].tolist(), files["rank"].tolist(), strict=True))
    ranks = sorted(set(file_rank.values()))
    world = max(world_size or 0, (max(ranks) + 1) if ranks else 0)
    origin = con.execute("SELECT min(ts_ns) FROM cpu_ops JOIN files USING (file_id) WHERE run_id = ?",
                         [run_id]).fetchone()[0] or 0
    fid = np.array(sorted(file_rank), dtype=np.int64)
    fid_rank = np.array([file_rank[f] for f in fid.tolist()], dtype=np.int64)
    off_ns = np.array([int(offs.get(r, 0.0) * 1e3) for r in range(world + 1)], dtype=np.int64)
    return _RunClock(run_id=run_id, mode=mode, ranks=ranks, world=world, origin=origin, off_ns=off_ns, fid=fid,
                     fid_rank=fid_rank)


@dataclass
class _Tasks:
    """Every task of the run in resource order (the graph's task ids), as :func:`_order_tasks` sorts them.

    ``cols``: the source columns (``rank``, ``rk`` (0 host, 1 stream, 2 gloo thread), ``a``/``b`` (pid/tid or
    device/stream), ``kind``, ``ts``/``dur`` (ns), ``corr``, ``fid``, ``ext`` (fp32 GEMM flag, or a marker's step),
    ``flag`` (:data:`_FLAG`)). ``uniq``: the resources' keys (rank, rk, a, b), ``res`` each task's index into them;
    ``rel``: start in ns since the run's start; ``start``/``dur``/``end``/``gap`` in µs; ``first``: the first task
    of its resource.
    """

    cols: dict[str, np.ndarray]
    names: object
    name_code: np.ndarray
    uniq: np.ndarray
    res: np.ndarray
    res_names: list[str]
    rk: np.ndarray
    rel: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    end: np.ndarray
    first: np.ndarray
    gap: np.ndarray

    @property
    def n(self) -> int:
        return int(self.start.size)

    @property
    def kind(self) -> np.ndarray:
        return self.cols["kind"]

    def resource_ids(self, rank, rk: int, a, b) -> np.ndarray:
        """Each row's resource index (into ``uniq``) from its (rank, ``rk``, pid|device, tid|stream), -1 for a
        resource with no task."""
        lookup = {tuple(u): i for i, u in enumerate(self.uniq.tolist())}
        cols = [np.asarray(c).astype(np.int64, copy=False) for c in (rank, a, b)]
        if cols[0].size == 0:
            return np.zeros(0, np.int64)
        # the distinct (rank, a, b) are few (threads, streams): look those up, then map every row (a Python
        # lookup per row cost 0.3 s per 400k CPU ops)
        codes, uniqs = [], []
        for c in cols:
            u, inv = np.unique(c, return_inverse=True)
            codes.append(inv.reshape(-1).astype(np.int64))
            uniqs.append(u)
        key = (codes[0] * uniqs[1].size + codes[1]) * uniqs[2].size + codes[2]
        ukey, kinv = np.unique(key, return_inverse=True)
        n1, n2 = uniqs[1].size, uniqs[2].size
        ids = np.array([lookup.get((int(uniqs[0][k // (n1 * n2)]), rk, int(uniqs[1][(k // n2) % n1]),
                                    int(uniqs[2][k % n2])), -1) for k in ukey.tolist()], dtype=np.int64)
        return ids[kinv.reshape(-1)]

    @property
    def rank(self) -> np.ndarray:
        return self.cols["rank"]


class _Edges:
    """The explicit edges as they are found (:data:`DEP_TYPES` codes), in order."""

    def __init__(self) -> None:
        self.lists: tuple[list, list, list, list, list] = ([], [], [], [], [])

    def extend(self, src, dst, from_end, off, etype) -> None:
        _extend(*self.lists, src, dst, from_end, off, etype)

    def relax_launches(self, dst: np.ndarray) -> None:
        """The launch edges into ``dst`` require only the launch (offset 0 from the call's start): what delayed
        those tasks past their launch is modelled by another edge."""
        if not dst.size:
            return
        for d_arr, off_arr, type_arr in zip(self.lists[1], self.lists[3], self.lists[4], strict=True):
            m = (type_arr == 0) & np.isin(d_arr, dst)
            off_arr[m] = 0.0

    def arrays(self) -> list[np.ndarray]:
        """(src, dst, from_end, offset, type) arrays."""
        return [np.concatenate(x) if x else np.zeros(0) for x in self.lists]


def build(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world_size: int | None,
          clock_offsets_us: dict | None = None, max_chunk_events: int = BUILD_CHUNK_EVENTS,
          threads: int | None = None) -> Graph:
    """Build the run's graph from the store (module docstring); nothing is written (see :func:`save`).

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
            (:func:`_profiler_events`) are counted on one more thread, beside the collectives' matching at the end.
    """
    threads = build_threads() if threads is None else max(1, threads)
    rc = _run_clock(con, run_id, mode, world_size, clock_offsets_us)
    st = _fetch(con, "SELECT file_id, rank, step, start_ns, end_ns, pid, tid, counted FROM profiler_steps(?)",
                [run_id])
    comm = communication_kernels(con, run_id) if mode == "gpu" else []
    chunks = _build_chunks(con, rc, _rank_chunks(con, rc, max_chunk_events, threads), st, comm, threads)
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
    if mode != "gpu":
        _match_collectives(con, g, rc, c["coll_fid"], c["coll_ts"])
        return g
    # the profiler's events counted on a cursor and thread of their own, beside the collectives' matching: both
    # are mostly DuckDB reads and NumPy sorts, which free the GIL (the scale set: 0.13 s hidden behind 0.13-0.2 s)
    counted = on_own_cursor(con, _profiler_events, rc, g, name="traceanalyze-events")
    _match_collectives(con, g, rc, c["coll_fid"], c["coll_ts"])
    g.prof_events = counted()
    return g


def build_threads() -> int:
    """Threads for :func:`build`: the CPUs this process may run on, at most :data:`BUILD_THREADS_MAX`."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(BUILD_THREADS_MAX, n))


def _rank_chunks(con, rc: _RunClock, max_events: int, threads: int = 1) -> list[list[int]]:
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


def _build_chunks(con, rc: _RunClock, groups: list[list[int]], st: dict[str, np.ndarray], comm: list[str],
                  threads: int) -> list[dict]:
    """:func:`_build_chunk` of each group of file ids, in order: on ``threads`` threads when there are several
    groups, each thread on a cursor of its own (a DuckDB connection runs one query at a time). The GIL is free
    while DuckDB reads and NumPy sorts and searches, so two threads build the 8-rank scale set's graph in about
    half the time one takes (0.24-0.33 s against 0.42-0.85 s)."""
    def chunk_of(cur, fids: list[int]) -> dict:
        return _build_chunk(cur, rc, fids, {k: v[np.isin(st["file_id"], fids)] for k, v in st.items()}, comm)

    n = min(threads, len(groups))
    if n <= 1:
        return [chunk_of(con, fids) for fids in groups]
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()
    cursors: list = []
    lock = threading.Lock()

    def task(fids: list[int]) -> dict:
        cur = getattr(local, "cur", None)
        if cur is None:
            with lock:  # cursor() on one connection from several threads at once: one at a time
                cur = local.cur = con.cursor()
                cursors.append(cur)
        return chunk_of(cur, fids)

    try:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="traceanalyze-graph") as pool:
            return list(pool.map(task, groups))
    finally:
        for cur in cursors:
            cur.close()


def _build_chunk(con, rc: _RunClock, fids: list[int], st: dict[str, np.ndarray], comm: list[str]) -> dict:
    """The graph's arrays for the ranks of ``fids`` (tasks, edges, categories; task ids local to the chunk).
    Every edge but a collective's rendezvous joins tasks of one rank, so chunks of whole ranks join without
    loss (:func:`_join_chunks`)."""
    dev = _device_tasks(con, rc, fids, comm) if rc.mode == "gpu" else None
    dev_keys = np.sort((dev["fid"] << 40) + dev["corr"]) if dev is not None else None
    parts = [_host_tasks(con, rc, fids, dev_keys)]
    del dev_keys
    if dev is not None:
        parts.append(dev)
    del dev
    parts.append(_marker_tasks(st))
    t = _order_tasks(parts, rc)
    del parts
    step, steps = _step_markers(t, st)
    edges = _Edges()
    anchor, cg, cd = t.start.copy(), t.gap.copy(), t.dur.copy()
    dev = np.flatnonzero(t.rk == 1)
    _launch_edges(t, dev, edges, anchor, cg)
    if rc.mode != "gpu":
        _gloo_issue_edges(con, rc, t, edges, anchor, cg, fids)
    if steps:
        step = _steps_by_anchor(t, steps, anchor, step)
    event_waits = 0
    if rc.mode == "gpu":
        event_waits = _event_wait_edges(con, rc, t, edges, cg, anchor, fids)
        _sync_edges(t, dev, edges, cd)
    del anchor
    _wait_edges(t, rc.mode, edges, cg)
    # categories: host time under dataloader / compile / optimizer ranges and fp32 matmuls (CPU runs)
    prec = _precision_classes(t) if rc.mode == "gpu" else np.zeros(t.n, np.int8)  # GPU runs only
    cover, gap_cover, gap_label = _categories(con, rc, t, fids, prec)
    coll = t.kind == K_COLL
    return dict(n=t.n, rank=t.rank, res=t.res, kind=t.kind, name=(t.name_code, t.names), step=step, start=t.start,
                dur=t.dur, gap=t.gap, first=t.first, cg=cg, cd=cd, gap_label=gap_label, cover=cover,
                event_waits=event_waits, prec=prec,
                gap_cover=gap_cover, dep=edges.arrays(), steps=steps, res_names=t.res_names,
                coll_fid=t.cols["fid"][coll], coll_ts=t.cols["ts"][coll])


def _join_chunks(chunks: list[dict]) -> dict:
    """One chunk's arrays for the whole run: task ids, resources and edges offset by the chunks before; each
    array is joined and its parts released in turn (the peak is the graph plus one array)."""
    if len(chunks) == 1:
        return chunks[0]
    base = np.cumsum([0] + [c["n"] for c in chunks])
    res_base = np.cumsum([0] + [len(c["res_names"]) for c in chunks])
    out: dict = {"steps": [(r, s, b + int(o), e + int(o), k) for c, o in zip(chunks, base, strict=False)
                           for r, s, b, e, k in c["steps"]], "event_waits": sum(c["event_waits"] for c in chunks),
                 "res_names": [n for c in chunks for n in c["res_names"]]}
    out["name"] = _unify_names([c.pop("name") for c in chunks])[::-1]
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
            # all-zero categories stay calloc'd zeros (no memory until written)
            out[k][cat] = np.concatenate(arrs) if any(a.any() for a in arrs) else np.zeros(int(base[-1]))
    return out


def _host_tasks(con, rc: _RunClock, fids: list[int], dev_keys: np.ndarray | None = None) -> dict:
    """Task columns of the host tasks: the runtime calls (GPU runs) that an edge can touch (:func:`_fold_calls`;
    ``dev_keys``: the sorted (file_id << 40) + correlation of the device tasks), else each thread's top-level ops
    with the ``gloo:*`` ranges as collectives on their own threads. ``idle``: µs since the thread's previous call
    (folded calls included), +inf where unknown."""

    args = [*_flag_args([rc.run_id]), fids]
    if rc.mode == "gpu":
        h = _fetch_arrow(con, f"""SELECT c.file_id, c.pid, c.tid, c.ts_ns, c.dur_ns, c.correlation, c.name, {_FLAG}
            FROM cpu_ops c JOIN files f USING (file_id)
            WHERE f.run_id = $1 AND f.rank IS NOT NULL AND f.file_id IN (SELECT unnest($4))
              AND c.cat IN ('cuda_runtime', 'cuda_driver')""", args)
        h = _fold_calls(h, np.zeros(0, np.int64) if dev_keys is None else dev_keys)
        idle = h.pop("idle")
    else:
        h = _fetch_arrow(con, f"""SELECT c.file_id, c.pid, c.tid, c.ts_ns, c.dur_ns, c.correlation, c.name, {_FLAG}
            FROM cpu_ops c JOIN files f USING (file_id)
            WHERE f.run_id = $1 AND f.rank IS NOT NULL AND f.file_id IN (SELECT unnest($4))
              AND c.cat IN ('cpu_op', 'user_annotation') AND profiler_step(c.cat, c.name) IS NULL
            ORDER BY c.file_id, c.pid, c.tid, c.ts_ns, c.dur_ns DESC""", args)
        # top-level ops of each thread: those that start after every earlier op of the thread ended
        thr = _thread_codes(h["file_id"], h["pid"], h["tid"])
        ts = np.asarray(h["ts_ns"], np.int64) - rc.origin
        end = ts + np.asarray(h["dur_ns"], np.int64)
        top = ts >= _seg_cummax_excl(np.clip(end, 0, (1 << _T_SHIFT) - 1), thr)
        h = {k: ((v[0][top], v[1]) if k == "name" else v[top]) for k, v in h.items()}
        idle = np.full(int(top.sum()), np.inf)
    flag = np.asarray(h["flag"], np.int64)
    coll = (flag == 3) & (rc.mode != "gpu")
    return dict(rank=rc.rank_of(np.asarray(h["file_id"], np.int64)), rk=np.where(coll, 2, 0),
                a=np.asarray(h["pid"], np.int64), b=np.asarray(h["tid"], np.int64), kind=np.where(coll, K_COLL, K_HOST),
                ts=np.asarray(h["ts_ns"], np.int64), dur=np.asarray(h["dur_ns"], np.int64), name=h["name"],
                corr=np.asarray(h["correlation"], np.int64), fid=np.asarray(h["file_id"], np.int64),
                ext=np.zeros(flag.size, np.int64), flag=flag, idle=idle.astype(np.float32))


def _fold_calls(h: dict, dev_keys: np.ndarray) -> dict:
    """The runtime calls ``h`` (``_fetch_arrow`` columns) without those no edge can touch, plus ``idle`` (µs).

    A call is kept when it is a launch or a synchronize (``flag``), when device work was launched under its
    correlation (``dev_keys``), or when it starts :data:`WAIT_GAP_US` or more after the end of its thread's previous
    call (a wait may end there, :func:`_wait_edges`). The others (``cudaStreamIsCapturing``, ``cudaEventQuery``,
    ``cudaStreamWaitEvent``, ...; about half the calls) join the gap before the next task, which keeps the
    thread's time; ``idle`` keeps each kept call's own idle time before it, for :func:`_wait_edges`."""
    fid = np.asarray(h["file_id"], np.int64)
    ts, dur = np.asarray(h["ts_ns"], np.int64), np.asarray(h["dur_ns"], np.int64)
    thr = _thread_codes(fid, h["pid"], h["tid"])
    o = np.lexsort((-dur, ts, thr))
    prev_end = np.empty(ts.size, np.float64)
    prev_end[o[1:]] = (ts[o[:-1]] + dur[o[:-1]]).astype(np.float64)
    idle = np.full(ts.size, np.inf)
    same = np.zeros(ts.size, bool)
    same[o[1:]] = thr[o[1:]] == thr[o[:-1]]
    idle[same] = (ts[same] - prev_end[same]) / 1e3
    del prev_end, same, o, thr
    corr = np.asarray(h["correlation"], np.int64)
    key = (fid << 40) + corr
    j = np.clip(np.searchsorted(dev_keys, key), 0, max(dev_keys.size - 1, 0))
    launched = (corr > 0) & (dev_keys[j] == key) if dev_keys.size else np.zeros(ts.size, bool)
    keep = (np.asarray(h["flag"], np.int64) != 0) | launched | (idle >= WAIT_GAP_US)
    out = {k: ((v[0][keep], v[1]) if k == "name" else v[keep]) for k, v in h.items()}
    out["idle"] = idle[keep]
    return out


def _device_tasks(con, rc: _RunClock, fids: list[int], comm: list[str]) -> dict:
    """Task columns of the GPU runs' kernels, memcpys and memsets; NCCL kernels are collectives, and ``ext`` is the
    launching op's code (:func:`_precision_classes`): 0 none or not fp32, bit 0 fp32 inputs, bit 1 on autocast's
    fp32 list, bit 2 in place."""
    k = _fetch_arrow(con, """SELECT k.file_id, CASE k.cat WHEN 'gpu_memcpy' THEN 1 WHEN 'gpu_memset' THEN 2
               ELSE 0 END AS catc, k.name, k.device, k.stream, k.ts_ns, k.dur_ns, k.correlation,
               k.cat = 'kernel' AND k.name IN (SELECT unnest($2)) AS comm, k.external_id,
               k.cat = 'kernel' AND k.external_id IS NOT NULL AS has_op
        FROM kernels k JOIN files f USING (file_id)
        WHERE f.run_id = $1 AND f.rank IS NOT NULL AND f.file_id IN (SELECT unnest($3))
          AND k.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')""", [rc.run_id, comm, fids])
    cat = np.asarray(k["catc"], np.int64)
    fid = np.asarray(k["file_id"], np.int64)
    opcode = _launching_op_codes(con, rc, fids, fid, np.asarray(k.pop("external_id"), np.int64),
                                 np.asarray(k.pop("has_op"), bool))
    cat = np.asarray(k["catc"], np.int64)
    kind = np.where(np.asarray(k["comm"], bool), K_COLL,
                    np.where(cat == 1, K_MEMCPY, np.where(cat == 2, K_MEMSET, K_KERNEL)))
    return dict(rank=rc.rank_of(np.asarray(k["file_id"], np.int64)), rk=np.ones(cat.size, np.int64),
                a=np.asarray(k["device"], np.int64), b=np.asarray(k["stream"], np.int64), kind=kind,
                ts=np.asarray(k["ts_ns"], np.int64), dur=np.asarray(k["dur_ns"], np.int64),
                name=k["name"], corr=np.asarray(k["correlation"], np.int64),
                fid=fid, ext=opcode,
                flag=np.zeros(cat.size, np.int64), idle=np.full(cat.size, np.inf, np.float32))


def _launching_op_codes(con, rc: _RunClock, fids: list[int], fid: np.ndarray, ext: np.ndarray,
                        kernel: np.ndarray) -> np.ndarray:
    """Per device task (file ``fid``, External id ``ext``; ``kernel``: a kernel with an External id, not a copy or
    memset), the code of the op that launched it (kernel External id == cpu_op External id) when that op's inputs
    are fp32: 1 fp32, +2 on autocast's fp32 list, +4 in place (an update of fp32 state: parameters, gradients,
    optimizer moments, which autocast leaves fp32); 0 otherwise. The ops are read apart and matched here: a join in
    the kernels' query cost 80 ms on the scale set even with no op to match (no ``Input type`` without
    ``record_shapes``)."""
    m = con.execute("""SELECT c.file_id, c.external_id,
                   bit_or(1 + CASE WHEN c.name IN (SELECT unnest($2)) THEN 2 ELSE 0 END
                          + CASE WHEN suffix(c.name, '_') OR c.name LIKE 'aten::%foreach%'
                                      OR c.name LIKE '%fused_adam%' THEN 4 ELSE 0 END) AS code
            FROM cpu_ops c JOIN files f USING (file_id)
            WHERE f.run_id = $1 AND f.file_id IN (SELECT unnest($3)) AND c.cat = 'cpu_op'
              AND c.external_id IS NOT NULL
              AND (c.input_types LIKE '["float"%' OR c.input_types LIKE '[''float''%')
            GROUP BY c.file_id, c.external_id ORDER BY c.file_id, c.external_id""",
                    [rc.run_id, list(matmath.AUTOCAST_FP32_OPS), fids]).fetchnumpy()
    out = np.zeros(fid.size, np.int64)
    m_fid = np.asarray(m["file_id"], np.int64)
    if not m_fid.size:
        return out
    m_ext, m_code = np.asarray(m["external_id"], np.int64), np.asarray(m["code"], np.int64)
    by_file = np.flatnonzero(kernel)
    by_file = by_file[np.argsort(fid[by_file], kind="stable")]  # the kernels grouped by file, once
    k_fid = fid[by_file]
    for f in np.unique(m_fid).tolist():  # per file (a rank): its ops' External ids, sorted by the query
        lo, hi = np.searchsorted(m_fid, [f, f + 1])
        a, b = np.searchsorted(k_fid, [f, f + 1])
        sel = by_file[a:b]
        at = np.clip(np.searchsorted(m_ext[lo:hi], ext[sel]), 0, hi - lo - 1)
        hit = m_ext[lo:hi][at] == ext[sel]
        out[sel[hit]] = m_code[lo:hi][at[hit]]
    return out


def _marker_tasks(st: dict[str, np.ndarray]) -> dict:
    """Task columns of the step markers: a begin and an end marker per ``ProfilerStep#N`` (``st``: the
    ``profiler_steps`` rows), on the step's thread; ``ext`` holds the step number."""
    import pyarrow as pa

    n_st = st["step"].size
    return dict(rank=np.concatenate([st["rank"], st["rank"]]).astype(np.int64),
                rk=np.zeros(2 * n_st, np.int64),
                a=np.concatenate([int_column(st["pid"])[0]] * 2),
                b=np.concatenate([int_column(st["tid"])[0]] * 2),
                kind=np.concatenate([np.full(n_st, K_BEGIN), np.full(n_st, K_END)]),
                ts=np.concatenate([st["start_ns"], st["end_ns"]]).astype(np.int64),
                dur=np.zeros(2 * n_st, np.int64),
                name=_name_codes(pa.array([f"ProfilerStep#{s}" for s in st["step"].tolist()] * 2, pa.string())),
                corr=np.zeros(2 * n_st, np.int64), fid=np.concatenate([st["file_id"]] * 2).astype(np.int64),
                ext=np.concatenate([st["step"]] * 2).astype(np.int64), flag=np.zeros(2 * n_st, np.int64),
                idle=np.full(2 * n_st, np.inf, np.float32))


def _order_tasks(parts: list[dict], rc: _RunClock) -> _Tasks:
    """All tasks in resource order: by resource (rank, host|stream|comm, pid|device, tid|stream; comm = the gloo
    threads), then start; at one start an end marker, then a begin marker, then the longest task first."""
    names, codes = _unify_names([p.pop("name") for p in parts])
    # each part's column is released as soon as it is concatenated (the parts are the graph's size again)
    cols = {c: np.concatenate([p.pop(c) for p in parts]) for c in list(parts[0])}
    cols["name"] = codes
    n = cols["ts"].size
    rel = rc.rel_ns(cols["ts"], cols["rank"])
    is_coll_host = (cols["kind"] == K_COLL) & (cols["rk"] == 2)
    rk = np.where(is_coll_host, 2, cols["rk"])
    res_keys = np.stack([cols["rank"], rk, cols.pop("a"), cols.pop("b")], axis=1) if n else np.zeros((0, 4), np.int64)
    uniq, res = _unique_rows(res_keys)
    del res_keys
    kind_order = np.select([cols["kind"] == K_END, cols["kind"] == K_BEGIN], [0, 1], 2)
    dur_ns = cols.pop("dur")
    order = np.lexsort((-dur_ns, kind_order, rel, res))
    del kind_order
    dur = dur_ns[order] / 1e3
    del dur_ns
    for c in cols:  # one column at a time, so that only one extra copy is alive
        cols[c] = cols[c][order]
    name_code = cols.pop("name")
    res, rel, rk = res[order], rel[order], rk[order]
    prefix = {0: "host", 1: "stream", 2: "comm"}
    res_names = [f"{prefix[int(r[1])]}:{int(r[2])}/{int(r[3])}" for r in uniq]
    start = rel / 1e3
    end = start + dur
    first = np.ones(n, dtype=bool)
    first[1:] = res[1:] != res[:-1]
    gap = np.zeros(n)
    gap[1:] = start[1:] - end[:-1]
    gap[first] = 0.0
    return _Tasks(cols=cols, names=names, name_code=name_code, uniq=uniq, res=res, res_names=res_names, rk=rk,
                  rel=rel, start=start, dur=dur, end=end, first=first, gap=gap)


def _unify_names(parts: list[tuple[np.ndarray, object]]) -> tuple[object, np.ndarray]:
    """(the distinct names, sorted, as an Arrow string array; per row of the concatenated parts: its index into
    them) of several :func:`_name_codes` results. ``parts`` is emptied on the way (its codes are released as
    soon as they are remapped: a graph-sized array each at 1,024 ranks)."""
    import pyarrow as pa

    enc = pc.dictionary_encode(pa.concat_arrays([d for _, d in parts]), "encode")
    # sorted, so that the codes do not depend on how the rows came in (chunks, batches)
    by_name = pc.array_sort_indices(enc.dictionary, "at_end").to_numpy()
    rank_of = np.empty(by_name.size, np.int64)
    rank_of[by_name] = np.arange(by_name.size)
    remap = rank_of[enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
    base = np.cumsum([0] + [len(d) for _, d in parts])
    n = sum(c.size for c, _ in parts)
    joined = np.empty(n, np.int64)
    at = 0
    for i, b in enumerate(base[:-1].tolist()):
        c = parts[i][0]
        joined[at: at + c.size] = remap[b + c] if c.size else c
        at += c.size
        parts[i] = (None, None)  # type: ignore[assignment]  # this part's codes go now
    parts.clear()
    return pc.take(enc.dictionary, pa.array(by_name)), joined


def _step_markers(t: _Tasks, st: dict[str, np.ndarray]) -> tuple[np.ndarray, list[tuple[int, int, int, int, bool]]]:
    """(per task: the step of each marker, -1 elsewhere; the steps as (rank, step, begin task, end task, counted))."""
    kind, rank, fid = t.kind, t.rank, t.cols["fid"]
    step = np.full(t.n, -1, dtype=np.int64)
    is_marker = (kind == K_BEGIN) | (kind == K_END)
    step[is_marker] = t.cols["ext"][is_marker]
    steps: list[tuple[int, int, int, int, bool]] = []
    e_by = {(int(rank[i]), int(step[i]), int(fid[i])): int(i) for i in np.flatnonzero(kind == K_END)}
    counted = {(int(r), int(s), int(f)): bool(c) for r, s, f, c in zip(
        st["rank"].tolist(), st["step"].tolist(), st["file_id"].tolist(), st["counted"].tolist(), strict=True)}
    for i in np.flatnonzero(kind == K_BEGIN).tolist():
        key = (int(rank[i]), int(step[i]), int(fid[i]))
        if key in e_by:
            steps.append((key[0], key[1], i, e_by[key], counted.get(key, False)))
    return step, steps


def _launch_edges(t: _Tasks, dev: np.ndarray, edges: _Edges, anchor: np.ndarray, cg: np.ndarray) -> None:
    """Launch edges: device task <- the runtime call of the same file and correlation; the device task's anchor
    becomes its launch time."""
    cols = t.cols
    host_rt = np.flatnonzero((t.rk == 0) & (t.kind == K_HOST) & (cols["corr"] > 0))
    if not (dev.size and host_rt.size):
        return
    hk = (cols["fid"][host_rt] << 40) + cols["corr"][host_rt]
    o = np.argsort(hk, kind="stable")
    hk, hsrc = hk[o], host_rt[o]
    dk = (cols["fid"][dev] << 40) + cols["corr"][dev]
    j = np.clip(np.searchsorted(hk, dk), 0, max(hk.size - 1, 0))
    ok = (hk[j] == dk) & (cols["corr"][dev] > 0)
    d, s = dev[ok], hsrc[j[ok]]
    _add_launch(d, s, t.start, t.end, t.first, cg, *edges.lists)
    anchor[d] = t.start[s]


def _gloo_issue_edges(con, rc: _RunClock, t: _Tasks, edges: _Edges, anchor: np.ndarray, cg: np.ndarray,
                      fids: list[int]) -> None:
    """CPU runs: gloo collective <- the top-level task holding the latest ``c10d::*`` call (of the rank) at or
    before its start; the collective's anchor becomes that call's start."""
    rank, res, rel = t.rank, t.res, t.rel
    coll = np.flatnonzero(t.kind == K_COLL)
    c10 = _fetch(con, """SELECT c.file_id, c.pid, c.tid, c.ts_ns FROM cpu_ops c JOIN files f USING (file_id)
        WHERE f.run_id = ? AND f.rank IS NOT NULL AND f.file_id IN (SELECT unnest(?))
          AND c.name LIKE 'c10d::%' AND c.name NOT LIKE 'c10d::wait%'
        ORDER BY c.ts_ns""", [rc.run_id, fids])
    if not (coll.size and c10["ts_ns"].size):
        return
    c_rank = rc.rank_of(np.asarray(c10["file_id"], np.int64))
    c_rel = rc.rel_ns(np.asarray(c10["ts_ns"], np.int64), c_rank)
    # the c10d call's host resource, then the task of that resource containing it
    c_res = t.resource_ids(c_rank, 0, c10["pid"], c10["tid"])
    keep = c_res >= 0
    c_rank, c_rel, c_res = c_rank[keep], c_rel[keep], c_res[keep]
    # per rank: latest c10d call at or before each collective's start
    rk_key = (c_rank << _T_SHIFT) + np.clip(c_rel, 0, None)
    o = np.argsort(rk_key, kind="stable")
    rk_key, c_rel_s, c_res_s = rk_key[o], c_rel[o], c_res[o]
    q = (rank[coll] << _T_SHIFT) + np.clip(rel[coll], 0, None)
    j = np.searchsorted(rk_key, q, side="right") - 1
    ok = (j >= 0) & ((rk_key[np.clip(j, 0, None)] >> _T_SHIFT) == rank[coll])
    coll, j = coll[ok], j[ok]
    issue_rel, issue_res = c_rel_s[j], c_res_s[j]
    task_key = (res.astype(np.int64) << _T_SHIFT) + np.clip(rel, 0, None)
    task = np.searchsorted(task_key, (issue_res << _T_SHIFT) + np.clip(issue_rel, 0, None), side="right") - 1
    ok = (task >= 0) & (res[np.clip(task, 0, None)] == issue_res)
    d, s, issue = coll[ok], task[ok], issue_rel[ok] / 1e3
    _add_launch(d, s, t.start, t.end, t.first, cg, *edges.lists, issue=issue)
    anchor[d] = issue


def _steps_by_anchor(t: _Tasks, steps: list[tuple[int, int, int, int, bool]], anchor: np.ndarray,
                     step: np.ndarray) -> np.ndarray:
    """Each task's step: the step (of its rank) that its anchor time (a device task's launch) falls in; markers
    keep their own, tasks in no step get -1."""
    rank = t.rank
    is_marker = (t.kind == K_BEGIN) | (t.kind == K_END)
    sb = np.array([(r, t.start[b], t.start[e], s) for r, s, b, e, _ in steps])
    o = np.lexsort((sb[:, 1], sb[:, 0]))
    sb = sb[o]
    key_s = sb[:, 0] * 1e12 + sb[:, 1]
    q = rank * 1e12 + anchor
    j = np.searchsorted(key_s, q, side="right") - 1
    jc = np.clip(j, 0, None)
    inside = (j >= 0) & (sb[jc, 0] == rank) & (anchor < sb[jc, 2])
    return np.where(is_marker, step, np.where(inside, sb[jc, 3].astype(np.int64), -1))


def _event_wait_edges(con, rc: _RunClock, t: _Tasks, edges: _Edges, cg: np.ndarray, anchor: np.ndarray,
                      fids: list[int]) -> int:
    """Cross-stream event waits (WHATIF.md §2, HTA's previous/next launch rule): the last device task launched on
    the awaited stream before the ``cudaEventRecord`` -> the first device task launched on the waiting stream after
    the ``cudaStreamWaitEvent``. When the wait held the task back (the awaited task ended after the waiting stream's
    previous task and after the launch, ``anchor``), the task's stream gap and its launch delay were the wait: this
    edge carries the measured latency, the chain gap goes, and the launch edge keeps only the launch (start no
    earlier than the call). The waits come from :func:`_stream_waits`. Returns the waits found (0: none)."""
    dev = np.flatnonzero(t.rk == 1)
    if not dev.size:
        return 0
    # device tasks by (resource, launch correlation): one sortable key (resources < 2^22, correlations < 2^41)
    lim = (1 << _T_SHIFT) - 1
    key = (t.res[dev].astype(np.int64) << _T_SHIFT) + np.clip(t.cols["corr"][dev], 0, lim)
    o = np.argsort(key, kind="stable")
    key, dsorted = key[o], dev[o]
    res_wait, res_rec, wait_corr, rec_corr = _stream_waits(con, rc, t, dev, fids)
    n_rows = int(res_wait.size)
    if not n_rows:
        return 0
    q_src = (res_rec << _T_SHIFT) + np.clip(rec_corr, 0, lim)
    q_dst = (res_wait << _T_SHIFT) + np.clip(wait_corr, 0, lim)
    i_src = np.searchsorted(key, q_src, side="left") - 1  # the last launched before the record
    i_dst = np.searchsorted(key, q_dst, side="right")  # the first launched after the wait
    ok = ((res_wait >= 0) & (res_rec >= 0) & (res_wait != res_rec) & (i_src >= 0) & (i_dst < key.size))
    i_src, i_dst = np.clip(i_src, 0, key.size - 1), np.clip(i_dst, 0, key.size - 1)
    ok &= ((key[i_src] >> _T_SHIFT) == res_rec) & ((key[i_dst] >> _T_SHIFT) == res_wait)
    pairs = np.unique(np.stack([dsorted[i_src[ok]], dsorted[i_dst[ok]]], axis=1), axis=0)
    if not pairs.size:
        return n_rows
    src, dst = pairs[:, 0], pairs[:, 1]
    prev_end = np.where(t.first[dst], -np.inf, t.end[np.clip(dst - 1, 0, None)])
    # a stream made to wait several times before its next launch waits for the latest of them: only the awaited
    # task that ended last can have held the task back (the others would carry a wait that was not theirs)
    o = np.lexsort((t.end[src], dst))
    last = np.ones(dst.size, bool)
    last[o[:-1]] = dst[o[1:]] != dst[o[:-1]]
    binds = last & (t.end[src] >= prev_end) & (t.end[src] >= anchor[dst])
    off = np.where(binds, np.clip(t.start[dst] - t.end[src], 0, None), 0.0)
    cg[dst[binds]] = 0.0
    edges.relax_launches(dst[binds])
    edges.extend(src, dst, True, off, 4)
    return n_rows


def _stream_waits(con, rc: _RunClock, t: _Tasks, dev: np.ndarray, fids: list[int]) -> tuple[np.ndarray, ...]:
    """Each ``cudaStreamWaitEvent`` call of the ranks of ``fids``: (waiting stream's resource, awaited stream's
    resource, the wait call's correlation, the awaited ``cudaEventRecord``'s correlation), int64 arrays, -1 where
    unknown.

    A ``cuda_syncs`` "Stream Wait Event" row with the call's correlation names the waiting stream, and, from older
    Kineto, the awaited stream and record (``wait_on_stream``, ``wait_on_corr``). Kineto from 2025 writes -1 for
    both (only an event id, which PyTorch reuses), and a trace without ``cuda_sync`` rows has neither. Then the
    record is the rank's last ``cudaEventRecord`` call before the wait, and the awaited stream is the one of the last
    device task launched before that record (PyTorch and cuDNN record an event right after the work the other
    stream must wait for; a wait on its own stream is no wait). On a rank without rows, each device task launched
    first on its stream since a wait call stands for a wait of its stream (cuDNN records on the main stream, makes
    several side streams wait, then launches on each). Correlations count the process's runtime calls in order,
    whatever the thread."""
    w = _fetch(con, """SELECT o.file_id, o.correlation AS corr, o.name = 'cudaStreamWaitEvent' AS is_wait,
               coalesce(s.device, -1) AS device, coalesce(s.stream, -1) AS stream,
               coalesce(s.wait_on_stream, -1) AS wait_on_stream, coalesce(s.wait_on_corr, -1) AS wait_on_corr
        FROM cpu_ops o JOIN files f USING (file_id)
        LEFT JOIN cuda_syncs s ON s.file_id = o.file_id AND s.correlation = o.correlation
             AND s.name = 'Stream Wait Event'
        WHERE f.run_id = ? AND f.rank IS NOT NULL AND o.file_id IN (SELECT unnest(?)) AND o.cat = 'cuda_runtime'
          AND o.name IN ('cudaEventRecord', 'cudaStreamWaitEvent') AND o.correlation IS NOT NULL
        ORDER BY o.file_id, o.correlation""", [rc.run_id, fids])
    none = (np.zeros(0, np.int64),) * 4
    if not w["file_id"].size:
        return none
    rank = rc.rank_of(np.asarray(w["file_id"], np.int64))
    corr = np.asarray(w["corr"], np.int64)
    rkey = (rank << _T_SHIFT) + corr
    o = np.argsort(rkey, kind="stable")  # the calls in (rank, correlation) order
    w = {k: v[o] for k, v in w.items()}
    rank, corr, rkey = rank[o], corr[o], rkey[o]
    is_wait = np.asarray(w["is_wait"], bool)
    wi = np.flatnonzero(is_wait)
    if not wi.size:
        return none
    rec = np.flatnonzero(~is_wait)
    j = np.searchsorted(rkey[rec], rkey[wi], side="left") - 1  # the last record before each wait
    jc = np.clip(j, 0, None)
    has_rec = (j >= 0) & (rank[rec[jc]] == rank[wi]) if rec.size else np.zeros(wi.size, bool)
    rec_corr = np.where(has_rec, corr[rec[jc]] if rec.size else -1, -1)
    # device tasks of the rank in launch order: the stream launched to last before / first after a correlation
    dkey = (t.rank[dev].astype(np.int64) << _T_SHIFT) + np.clip(t.cols["corr"][dev], 0, (1 << _T_SHIFT) - 1)
    o = np.argsort(dkey, kind="stable")
    dkey, dres = dkey[o], t.res[dev][o].astype(np.int64)

    stream, dev_id, on_stream, on_corr = (np.asarray(w[k][wi], np.int64) for k in
                                          ("stream", "device", "wait_on_stream", "wait_on_corr"))
    rk, wcorr = rank[wi], corr[wi]
    row_ranks = np.unique(rk[stream >= 0])
    res_wait = t.resource_ids(rk, 1, dev_id, stream)
    keep = np.isin(rk, row_ranks)  # a rank with rows: its waits as the rows say
    # a rank without rows: the first task launched on each stream since a wait, waiting on the wait before it
    first_since = _first_launches_after_waits(dkey, dres, (rk[~keep] << _T_SHIFT) + wcorr[~keep])
    inf_key = dkey[first_since]
    iw = np.searchsorted(rkey[wi], inf_key, side="left") - 1  # the last wait before the task's launch
    rk = np.concatenate([rk[keep], inf_key >> _T_SHIFT])
    res_wait = np.concatenate([res_wait[keep], dres[first_since]])
    wcorr = np.concatenate([wcorr[keep], wcorr[np.clip(iw, 0, None)]])
    rec_corr = np.concatenate([rec_corr[keep], rec_corr[np.clip(iw, 0, None)]])
    on_stream = np.concatenate([on_stream[keep], np.full(first_since.size, -1)])
    on_corr = np.concatenate([on_corr[keep], np.full(first_since.size, -1)])
    dev_id = np.concatenate([dev_id[keep], np.full(first_since.size, -1)])
    known = (on_stream >= 0) & (on_corr >= 0)
    rec_corr = np.where(known, on_corr, rec_corr)
    res_rec = np.where(known, t.resource_ids(rk, 1, dev_id, on_stream),
                       _launched_before(dkey, dres, (rk << _T_SHIFT) + np.clip(rec_corr, 0, None)))
    res_rec = np.where(rec_corr >= 0, res_rec, -1)
    return res_wait, res_rec, wcorr, rec_corr


def _first_launches_after_waits(dkey: np.ndarray, dres: np.ndarray, wkey: np.ndarray) -> np.ndarray:
    """Indices into the launch-ordered device tasks (``dkey``: rank << _T_SHIFT + correlation; ``dres``: resource)
    of each task that is the first on its resource since a wait call (``wkey``, the waits' keys): the previous
    task of its resource and rank was launched before the latest wait that precedes it."""
    if not (wkey.size and dkey.size):
        return np.zeros(0, np.int64)
    wkey = np.sort(wkey)
    iw = np.searchsorted(wkey, dkey, side="left") - 1  # the latest wait before each launch
    iwc = np.clip(iw, 0, None)
    has = (iw >= 0) & ((wkey[iwc] >> _T_SHIFT) == (dkey >> _T_SHIFT))
    # the previous launch on the same resource: tasks ordered by (resource, launch)
    o = np.lexsort((dkey, dres))
    prev = np.full(dkey.size, -1, np.int64)
    same = dres[o][1:] == dres[o][:-1]
    prev[o[1:][same]] = dkey[o[:-1][same]]
    return np.flatnonzero(has & (prev < wkey[iwc]))


def _launched_before(dkey: np.ndarray, dres: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The resource of the last device task launched before each key ``q`` of the same rank (``dkey``: launch-
    ordered rank << _T_SHIFT + correlation; ``dres``: resource), -1 if none: the stream an event recorded at ``q``
    followed."""
    if not (q.size and dkey.size):
        return np.full(q.size, -1, np.int64)
    i = np.searchsorted(dkey, q, side="left") - 1
    ic = np.clip(i, 0, None)
    return np.where((i >= 0) & ((dkey[ic] >> _T_SHIFT) == (q >> _T_SHIFT)), dres[ic], -1)

def _sync_edges(t: _Tasks, dev: np.ndarray, edges: _Edges, cd: np.ndarray) -> None:
    """GPU->CPU syncs: the task after a blocking call waits for the last device task that ended before the call
    returned (the call's blocked part leaves its chain duration ``cd``)."""
    rank, res, start, end, dur = t.rank, t.res, t.start, t.end, t.dur
    sync = np.flatnonzero((t.kind == K_HOST) & (t.cols["flag"] == 1))
    sync = sync[(sync + 1 < t.n)]
    sync = sync[res[sync + 1] == res[sync]]
    if not (sync.size and dev.size):
        return
    dkey = (rank[dev] << _T_SHIFT) + np.clip((end[dev] * 1e3).astype(np.int64), 0, None)
    o = np.argsort(dkey, kind="stable")
    dkey, dsorted = dkey[o], dev[o]
    q = (rank[sync] << _T_SHIFT) + np.clip((end[sync] * 1e3).astype(np.int64) + 1000, 0, None)
    j = np.searchsorted(dkey, q, side="right") - 1
    ok = (j >= 0) & ((dkey[np.clip(j, 0, None)] >> _T_SHIFT) == rank[sync])
    s_call, src = sync[ok], dsorted[j[ok]]
    blocked = np.clip(end[src] - start[s_call], 0, dur[s_call])
    cd[s_call] = dur[s_call] - blocked
    nxt = s_call + 1
    off = start[nxt] - end[src]
    edges.extend(src, nxt, True, off, 1)
    # the stream a synchronize waits for is not in the trace without cuda_sync rows: every stream of the
    # rank, each through its last task that ended before the call returned, with the same return latency
    for r_id in np.unique(res[dev]).tolist():
        lo_i = int(np.searchsorted(res, r_id))
        hi_i = int(np.searchsorted(res, r_id, side="right"))
        ends = np.maximum.accumulate(end[lo_i:hi_i])
        mine = rank[s_call] == rank[lo_i]
        jj = np.searchsorted(ends, end[s_call] + 1.0, side="right") - 1
        ok2 = mine & (jj >= 0)
        other = lo_i + jj[ok2]
        keep = other != src[ok2]
        edges.extend(other[keep], nxt[ok2][keep], True, off[ok2][keep], 1)


def _wait_edges(t: _Tasks, mode: str, edges: _Edges, cg: np.ndarray) -> None:
    """Waits: a host gap of ≥ :data:`WAIT_GAP_US` that ends after another thread's task or a collective of the rank
    ended in its last three quarters waits for it (``inter_thread`` / ``collective_wait``); the gap's head leaves
    the chain gap ``cg``."""
    rank, res, kind, rk, start, end = t.rank, t.res, t.kind, t.rk, t.start, t.end
    # the idle time before each task: its gap, less the runtime calls folded into it (_host_tasks)
    gap = np.minimum(t.gap, t.cols.pop("idle"))
    hostres = (rk == 0) & (kind != K_BEGIN)
    w = np.flatnonzero(hostres & ~t.first & (gap >= WAIT_GAP_US))
    # CPU runs: only collectives (their threads' other tasks are not tied to the step's thread by any edge, so a
    # wait on them would pin it to measured times); GPU runs: other launching threads too (autograd's)
    cand = np.flatnonzero((((rk == 0) & (kind == K_HOST)) if mode == "gpu" else False) | (kind == K_COLL))
    if not (w.size and cand.size):
        return
    ckey = (rank[cand] << _T_SHIFT) + np.clip((end[cand] * 1e3).astype(np.int64), 0, None)
    o = np.argsort(ckey, kind="stable")
    ckey, csorted = ckey[o], cand[o]
    q = (rank[w] << _T_SHIFT) + np.clip((start[w] * 1e3).astype(np.int64), 0, None)
    # the candidate whose end is nearest the gap's end: the last one before it, or (a gloo range ends after
    # its completion callbacks, which run on the waiting thread) the first one after it, if already running
    j = np.searchsorted(ckey, q, side="right") - 1
    lo = start[w] - (1 - WAIT_TAIL) * gap[w]
    best_src = np.full(w.size, -1, np.int64)
    best_dist = np.full(w.size, np.inf)
    for jj in (j, j + 1):
        jc = np.clip(jj, 0, ckey.size - 1)
        src = csorted[jc]
        ok = ((jj >= 0) & (jj < ckey.size) & ((ckey[jc] >> _T_SHIFT) == rank[w]) & (end[src] > lo)
              & (res[src] != res[w]) & (start[src] < start[w]))
        if mode == "gpu":
            ok &= end[src] <= start[w]
        dist = np.abs(start[w] - end[src])
        better = ok & (dist < best_dist)
        best_src[better], best_dist[better] = src[better], dist[better]
    ok = best_src >= 0
    d, s = w[ok], best_src[ok]
    cg[d] = np.clip(start[d] - end[s], 0, None)
    edges.extend(s, d, True, start[d] - end[s], np.where(kind[s] == K_COLL, 3, 2))


def _unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows in sorted order, each row's index into them) of an int64 matrix; ``np.unique(axis=0)``
    sorts a structured view, ~50x slower on 500k rows."""
    if keys.shape[0] == 0:
        return keys, np.zeros(0, np.int64)
    o = np.lexsort(keys.T[::-1])
    k = keys[o]
    new = np.ones(k.shape[0], dtype=bool)
    new[1:] = (k[1:] != k[:-1]).any(axis=1)
    code = np.cumsum(new) - 1
    inv = np.empty(k.shape[0], np.int64)
    inv[o] = code
    return k[new], inv


def _thread_codes(fid, pid, tid) -> np.ndarray:
    keys = np.stack([np.asarray(fid, np.int64), int_column(pid)[0], int_column(tid)[0]], axis=1)
    if keys.size == 0:
        return np.zeros(0, np.int64)
    return _unique_rows(keys)[1]


def _extend(src_l, dst_l, end_l, off_l, type_l, src, dst, from_end, off, etype) -> None:
    src_l.append(np.asarray(src, np.int64))
    dst_l.append(np.asarray(dst, np.int64))
    end_l.append(np.full(np.size(src), from_end, dtype=bool))
    off_l.append(np.asarray(off, float))
    type_l.append(np.broadcast_to(np.asarray(etype, np.int64), np.shape(src)).copy())


def _add_launch(d, s, start, end, first, cg, *deps, issue=None) -> None:
    """Launch edges s -> d (HTA rule): the measured latency when d's resource was idle at launch, else 0 after
    the launch and the resource's order governs (its measured gap kept)."""
    launch = start[s] if issue is None else issue
    prev_end = np.where(first[d], -np.inf, end[np.clip(d - 1, 0, None)])
    busy = launch < prev_end
    off = np.where(busy, launch - start[s], start[d] - start[s])
    cg[d[~busy]] = 0.0
    _extend(*deps, s, d, False, off, 0)


def _precision_classes(t: _Tasks) -> np.ndarray:
    """Each task's precision class (int8, :data:`PRECISION_CLASSES`) for the precision what-ifs: a device kernel's
    matrix-math family and math mode from its name (:mod:`traceanalyze.matmath`), else from its launching op's
    ``Input type`` (``ext`` bit 0: fp32 inputs); a non-matrix kernel of an fp32 op that autocast would run in 16 bits
    (``P_MEM``: not on autocast's fp32 list, not in place); a non-matrix kernel of an in-place fp32 op not on that list
    (``P_MEM_IN_PLACE``: an optimizer's update of fp32 state, or ``relu_``/``add_`` on an activation); 0 for every
    other task."""
    names = t.names.to_pylist() if hasattr(t.names, "to_pylist") else list(t.names)
    fam = np.zeros(len(names) + 1, np.int8)
    mode = np.zeros(len(names) + 1, np.int8)  # 1 fp32, 2 tf32, 3 16-bit or narrower, 0 unknown
    codes = {"fp32": 1, "tf32": 2, "bf16": 3, "fp16": 3, "fp8": 3, "int8": 3}
    for i, nm in enumerate(names):
        f = matmath.kernel_family(nm or "")
        if f:
            fam[i] = {"gemm": 1, "conv": 1, "attention": 2}[f]
            mode[i] = codes.get(matmath.kernel_dtype(nm)[0] or "", 0)
    nc = np.clip(t.name_code, 0, len(names))
    ext = t.cols["ext"]
    kern = (t.rk == 1) & (t.kind == K_KERNEL)
    f, m = np.where(kern, fam[nc], 0), np.where(kern, mode[nc], 0)
    m = np.where((f > 0) & (m == 0) & ((ext & 1) == 1), 1, m)  # a name that does not tell: the op's fp32 inputs
    out = np.zeros(t.n, np.int8)
    out[(f == 1) & (m == 1)] = P_MM_FP32
    out[(f == 2) & (m == 1)] = P_ATTN_FP32
    out[(f > 0) & (m == 2)] = P_MM_TF32
    out[(f > 0) & (m == 3)] = P_MM_LOWP
    out[kern & (f == 0) & (ext == 1)] = P_MEM
    out[kern & (f == 0) & (ext == 5)] = P_MEM_IN_PLACE
    out[(t.rk == 0) & (t.kind == K_HOST) & (t.cols["flag"] == 2)] = P_LAUNCH
    return out


def _host_resources(g: Graph) -> np.ndarray:
    """Per resource of ``g``: a host thread (named ``host:pid/tid`` by :func:`_order_tasks`)."""
    return np.array([r.startswith("host:") for r in g.res_names], dtype=bool)


def _profiler_events(con, rc: _RunClock, g: Graph) -> np.ndarray:
    """Per host task (and step marker) of ``g``: the events the profiler recorded on its thread from the end of the
    thread's previous task to its own end, each counted at its start, as four uint16 rows (8 bytes a task; a count
    over 65,535 is clipped): ``[0]`` cpu ops and annotations recorded in C++, ``[1]`` runtime and driver calls,
    ``[2]`` the ranges Python opens only while a profiler runs (inductor's ``triton_*`` launches, ``## Call
    CompiledFxGraph``, compiled regions), ``[3]`` the shapes ``record_shapes`` copied for those ops (each op's
    ``Input Dims`` entries: one per input, one more per tensor of a list input); 0 for device tasks. The
    profiler's own host cost is paid per recorded event (:mod:`traceanalyze.replay.overhead`)."""
    out = np.zeros((4, g.start.size), np.uint16)
    # the host threads: resources named host:pid/tid (:func:`_order_tasks`), each with its rank
    first = np.flatnonzero(g.first)
    res_first = np.full(len(g.res_names), -1, np.int64)
    res_first[g.res[first]] = first
    host = _host_resources(g) & (res_first >= 0)
    threads = {}
    for r in np.flatnonzero(host).tolist():
        pid, _, tid = g.res_names[r][5:].partition("/")
        threads[(int(g.rank[res_first[r]]), int(pid), int(tid))] = r
    idx = np.flatnonzero(host[g.res])
    if not idx.size:
        return out
    # by batches of files (bounded memory: the events of 8 ranks at once held 55 MB), each thread once (a code per
    # row from SQL: no per-row lookup), the events by thread and time
    fids = [int(f) for f in rc.fid]
    sizes = dict(con.execute("SELECT file_id, coalesce(n_cpu_ops, 0) FROM files WHERE file_id IN (SELECT unnest(?))",
                             [fids]).fetchall())
    # each host task's window [lo, hi) as sortable keys (resource << _T_SHIFT + ns), computed once for all batches
    lim = (1 << _T_SHIFT) - 1
    res = g.res[idx].astype(np.int64) << _T_SHIFT
    e_ns = np.clip(((g.start + g.dur) * 1e3).astype(np.int64), 0, lim)
    s_ns = np.clip((g.start[idx] * 1e3).astype(np.int64), 0, lim)
    prev_e = np.concatenate([[0], e_ns[:-1]])[idx]
    win = (idx, g.rank[idx], res + np.where(g.first[idx], s_ns, np.minimum(prev_e, s_ns)), res + e_ns[idx])
    del res, e_ns, s_ns, prev_e
    batch: list[int] = []
    n = 0
    for f in [*fids, None]:
        if f is not None and sizes.get(f, 0) > PROFILER_EVENTS_BATCH:  # one file over a batch: by time ranges
            for lo, hi in _time_parts(con, f, -(-sizes[f] // PROFILER_EVENTS_BATCH)):
                _count_events(con, rc, threads, [f], win, out, lo, hi)
            continue
        if f is not None and (not batch or n + sizes.get(f, 0) <= PROFILER_EVENTS_BATCH):
            batch.append(f)
            n += sizes.get(f, 0)
            continue
        if batch:
            _count_events(con, rc, threads, batch, win, out)
        batch, n = ([f], sizes.get(f, 0)) if f is not None else ([], 0)
    return out


def _time_parts(con, fid: int, parts: int) -> list[tuple[int | None, int | None]]:
    """``[lo, hi)`` ranges of trace time (ns; None: open) that cut the CPU ops of file ``fid`` into about ``parts``
    parts of as many ops (approximate quantiles: a part may hold somewhat more). Counts add up over any such cut."""
    qs = [k / parts for k in range(1, parts)]
    cuts = con.execute("SELECT approx_quantile(ts_ns, ?::FLOAT[]) FROM cpu_ops WHERE file_id = ?",
                       [qs, fid]).fetchall()[0][0] or []
    bounds = sorted({int(c) for c in cuts if c is not None})
    return list(zip([None, *bounds], [*bounds, None], strict=True))


def _count_events(con, rc: _RunClock, threads: dict, fids: list[int], win: tuple, out: np.ndarray,
                  ts_lo: int | None = None, ts_hi: int | None = None) -> None:
    """Add the profiler events of the files ``fids`` to ``out`` (:func:`_profiler_events`), in place; only those
    that start in ``[ts_lo, ts_hi)`` (trace ns; None: open). ``threads``: (rank, pid, tid) -> the host thread's
    resource; ``win``: the host tasks (ids, ranks, window start and end keys)."""
    r = _fetch(con, """WITH ev AS MATERIALIZED (
                SELECT f.rank, c.pid, c.tid, c.ts_ns,
                       CASE WHEN c.cat IN ('cuda_runtime', 'cuda_driver') THEN 1
                            WHEN c.name LIKE 'triton\\_%' ESCAPE '\\' OR c.name LIKE '## Call CompiledFxGraph%'
                                 OR c.name LIKE 'Torch-Compiled Region%' OR c.name IN ('CompiledFunction',
                                 'CompiledFunctionBackward') THEN 2 ELSE 0 END AS kind,
                       -- the shapes record_shapes copied: the '[' of Input Dims less the outer one (no JSON parse)
                       CASE WHEN c.input_dims IS NULL THEN 0
                            ELSE greatest(length(c.input_dims) - length(replace(c.input_dims, '[', '')) - 1, 0)
                       END AS shapes
                FROM cpu_ops c JOIN files f USING (file_id)
                WHERE f.run_id = $1 AND f.rank IS NOT NULL AND f.file_id IN (SELECT unnest($2))
                  AND c.cat IN ('cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver')
                  AND ($3::BIGINT IS NULL OR c.ts_ns >= $3) AND ($4::BIGINT IS NULL OR c.ts_ns < $4)),
            code AS (SELECT rank, pid, tid, row_number() OVER (ORDER BY rank, pid, tid) - 1 AS th
                     FROM (SELECT DISTINCT rank, pid, tid FROM ev))
        SELECT code.th, ev.ts_ns, ev.kind, ev.shapes, code.rank AS th_rank, code.pid AS th_pid, code.tid AS th_tid
        FROM ev JOIN code ON code.rank = ev.rank AND code.pid IS NOT DISTINCT FROM ev.pid
                         AND code.tid IS NOT DISTINCT FROM ev.tid""", [rc.run_id, fids, ts_lo, ts_hi])
    code = np.asarray(r["th"], np.int64)
    if code.size == 0:
        return
    # the threads, in code order: the first row of each code
    first = np.zeros(int(code.max()) + 1, np.int64)
    first[code[::-1]] = np.arange(code.size - 1, -1, -1)
    th_rank = np.asarray(r["th_rank"], np.int64)[first]
    th_res = np.array([threads.get((int(rk), int(a), int(b)), -1) for rk, a, b in
                       zip(th_rank.tolist(), int_column(r["th_pid"])[0][first].tolist(),
                           int_column(r["th_tid"])[0][first].tolist(), strict=True)], np.int64)
    th_shift = rc.origin + rc.off_ns[np.clip(th_rank, 0, rc.world)]
    lim = (1 << _T_SHIFT) - 1
    r_res = th_res[code]
    ok = r_res >= 0
    kind = np.asarray(r["kind"], np.int8)[ok]
    shapes = np.asarray(r["shapes"], np.int64)[ok]
    keys = (r_res[ok] << _T_SHIFT) + np.clip(np.asarray(r["ts_ns"], np.int64)[ok] - th_shift[code[ok]], 0, lim)
    del r, r_res, code
    o = np.argsort(keys, kind="stable")
    keys, kind, shapes = keys[o], kind[o], shapes[o]
    del o
    idx, ranks, lo_key, hi_key = win
    m = np.flatnonzero(np.isin(ranks, np.unique(th_rank)))  # the host tasks of these ranks
    sel = idx[m]
    hi_i = np.searchsorted(keys, hi_key[m], side="left")
    lo_i = np.searchsorted(keys, lo_key[m], side="left")
    for i in range(4):  # events of each kind (shapes: their count) before each position, then the count in [lo, hi)
        cum = np.concatenate([[0], np.cumsum(kind == i if i < 3 else shapes, dtype=np.int64)])
        cnt = out[i, sel].astype(np.int64) + np.clip(cum[hi_i] - cum[lo_i], 0, None)
        out[i, sel] = np.minimum(cnt, np.iinfo(np.uint16).max)


def _categories(con, rc: _RunClock, t: _Tasks, fids: list[int], prec: np.ndarray
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """µs of each host task and of the gap before it under each category (module docstring), and each gap's label;
    ``prec``: :func:`_precision_classes` (GPU runs: the fp32 matrix-math kernels are ``matmul_fp32``)."""
    run_id, mode, origin, off_ns, world = rc.run_id, rc.mode, rc.origin, rc.off_ns, rc.world
    res, rk, kind, flag = t.res, t.rk, t.kind, t.cols["flag"]
    start, end, gap, first = t.start, t.end, t.gap, t.first
    n = start.size
    r = _fetch(con, """SELECT f.rank, c.pid, c.tid, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns,
               CASE WHEN is_dataloader_op(c.name) THEN 0 WHEN c.name IN (SELECT unnest($2)) THEN 1
                    WHEN c.name LIKE 'Optimizer.%' THEN 2 ELSE 4 END AS cat
        FROM cpu_ops c JOIN files f USING (file_id)
        WHERE f.run_id = $1 AND f.rank IS NOT NULL AND f.file_id IN (SELECT unnest($5))
          AND c.cat IN ('cpu_op', 'user_annotation')
          AND (is_dataloader_op(c.name) OR c.name IN (SELECT unnest($2)) OR c.name LIKE 'Optimizer.%'
               OR ($3 AND c.name IN (SELECT unnest($4))
                   AND (c.input_types LIKE '["float"%' OR c.input_types LIKE '[''float''%')))""",
               [run_id, list(COMPILE_RANGES), mode != "gpu", list(MATMUL_OPS), fids])
    r_res = t.resource_ids(r["rank"], 0, int_column(r["pid"])[0], int_column(r["tid"])[0])
    r_rank = np.asarray(r["rank"], np.int64)
    shift = origin + off_ns[np.clip(r_rank, 0, world)]
    lo = np.clip(np.asarray(r["ts_ns"], np.int64) - shift, 0, (1 << _T_SHIFT) - 1)
    hi = np.clip(np.asarray(r["end_ns"], np.int64) - shift, 0, (1 << _T_SHIFT) - 1)
    cat = np.asarray(r["cat"], np.int64)
    s_ns = np.clip((start * 1e3).astype(np.int64), 0, (1 << _T_SHIFT) - 1)
    e_ns = np.clip((end * 1e3).astype(np.int64), 0, (1 << _T_SHIFT) - 1)
    p_ns = np.concatenate([[0], e_ns[:-1]])
    host = (rk == 0) & (kind == K_HOST)
    cover: dict[str, np.ndarray] = {}
    gap_cover: dict[str, np.ndarray] = {}
    for ci, cname in enumerate(CATEGORIES):
        if cname == "launch":
            continue
        code = 4 if cname == "matmul_fp32" else ci
        m = (cat == code) & (r_res >= 0)
        if not m.any():  # calloc'd zeros: no memory until written (most runs have no ranges of most kinds)
            cover[cname], gap_cover[cname] = np.zeros(n), np.zeros(n)
            continue
        u = _union_cover(r_res[m], lo[m], hi[m])
        at_start = _covered(u, res, s_ns)
        c_task = (_covered(u, res, e_ns) - at_start) / 1e3
        c_gap = (at_start - _covered(u, res, p_ns)) / 1e3
        del at_start
        cover[cname] = np.where(host, c_task, 0.0)
        gap_cover[cname] = np.where(host & ~first, np.clip(c_gap, 0, None), 0.0)
    # the fp32 matrix-math kernels (GPU runs: GEMM, convolution, attention on CUDA cores): the whole kernel
    if mode == "gpu":
        fp32 = np.isin(prec, (P_MM_FP32, P_ATTN_FP32))
        cover["matmul_fp32"] = np.where(fp32, end - start, 0.0) if fp32.any() else np.zeros(n)
    # launch overhead: the gap between two kernel launches of one thread, outside dataloader/compile ranges
    is_launch = flag == 2
    prev_launch = np.concatenate([[False], is_launch[:-1]])
    lg = host & ~first & is_launch & prev_launch & (mode == "gpu")
    gap_cover["launch"] = np.where(lg, np.clip(gap - gap_cover["dataloader"] - gap_cover["compile"], 0, None), 0.0)
    cover["launch"] = np.zeros(n)
    label = np.zeros(n, np.int8)
    best = np.zeros(n)
    for code, cname in enumerate(GAP_LABELS[1:], start=1):
        c = gap_cover[cname]
        better = c > np.maximum(best, 0.5 * gap)
        label[better] = code
        best = np.maximum(best, c)
    label[~host | first] = -1
    return cover, gap_cover, label


def _collective_meta(con, run_id: int, mode: str) -> dict[str, np.ndarray]:
    """Per collective call (file, start): normalised name, bytes, process group, Seq, group ranks, Comms Id
    (:func:`traceanalyze.metrics.collectives.collective_calls`; CPU runs carry no process group)."""
    calls = collective_calls(con, run_id, mode, groups=mode == "gpu")
    n = calls.op.size
    if calls.groups is not None:
        seq, has_seq = int_column(calls.groups["seq"])
        pg = np.asarray(calls.groups["pg_name"], dtype=object)
        pg_ranks = np.asarray(calls.groups["pg_ranks"], dtype=object)
        cid = calls.groups["comms_id"]
        comms_id = np.array([c if c not in (None, "") else None for c in cid.tolist()], dtype=object)
    else:
        seq, has_seq = np.zeros(n, np.int64), np.zeros(n, bool)
        pg = np.full(n, None, dtype=object)
        pg_ranks = np.full(n, None, dtype=object)
        comms_id = np.full(n, None, dtype=object)
    return {"fid": calls.file_id, "ts": calls.start, "op": calls.op, "bytes": calls.nbytes.astype(np.int64),
            "seq": seq, "has_seq": has_seq, "pg": pg, "pg_ranks": pg_ranks, "comms_id": comms_id}


def _group_median(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Median of ``values`` per group id 0..n-1 (NaN for an empty group)."""
    o = np.lexsort((values, group))
    g, v = group[o], values[o]
    cnt = np.bincount(g, minlength=n)
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    lo = first + (cnt - 1) // 2
    hi = first + cnt // 2
    ok = cnt > 0
    out = np.full(n, np.nan)
    out[ok] = (v[np.clip(lo, 0, v.size - 1)][ok] + v[np.clip(hi, 0, v.size - 1)][ok]) / 2
    return out


def _group_ranks(text) -> list[int] | None:
    if not text:
        return None
    try:
        v = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v) and len(v) < 30:
        return [int(x) for x in v]
    return None  # truncated at 30 entries by kineto, or absent: the run's world size then


def _match_collectives(con, g: Graph, rc: _RunClock, coll_fid: np.ndarray, coll_ts: np.ndarray) -> None:
    """Instances across ranks (module docstring): fills ``g.inst*``, drops incomplete ones from the rendezvous."""
    tasks = np.flatnonzero(g.kind == K_COLL)
    if tasks.size == 0:
        return
    meta = _task_meta(_collective_meta(con, rc.run_id, rc.mode), coll_fid, coll_ts, rc.origin)
    # Comms Id when every call has one (identical on all participants by construction, kineto #1286), else
    # (process group, Seq) when every call has a Seq, else the per-step order
    use_cid = all(c is not None for c in meta["comms_id"].tolist())
    use_seq = not use_cid and bool(meta["has_seq"].all())
    rank = g.rank[tasks]
    start, end = g.start[tasks], g.start[tasks] + g.dur[tasks]
    inst, n_inst = _instances(rank, g.step[tasks], start, meta["pg"], meta["seq"], use_seq,
                              meta["comms_id"] if use_cid else None)
    complete, coll_name, inst_bytes, inst_n, reasons = _check_instances(g, rank, inst, n_inst, meta)
    g.inst[tasks] = inst
    g.inst_all = inst
    g.inst_transfer = _instance_transfer(inst, n_inst, complete, start, end)
    g.inst_complete, g.inst_coll = complete, coll_name
    g.inst_bytes, g.inst_n = inst_bytes, inst_n
    g.inst_matched_by = ["Comms Id" if use_cid else "process group and Seq" if use_seq else "per-step ordinal"
                         ] * n_inst
    # incomplete instances keep their measured durations: no rendezvous
    inc = ~complete[inst]
    g.inst[tasks[inc]] = -1
    n_inc = int((~complete).sum())
    if n_inc:
        g.unmatched.append(_unmatched_note(reasons, n_inc, n_inst))
        g.partial = reasons["peers"] > 0


def _task_meta(meta: dict[str, np.ndarray], fid: np.ndarray, ts: np.ndarray, origin: int) -> dict[str, np.ndarray]:
    """Per collective task, its call's :func:`_collective_meta` (looked up by file and start; defaults where none
    matches): ``op``, ``bytes``, ``seq``, ``has_seq``, ``pg`` ("" for none) and ``pg_ranks``."""
    mkey = np.array([(f, t) for f, t in zip(meta["fid"].tolist(), meta["ts"].tolist(), strict=True)],
                    dtype=np.int64).reshape(-1, 2)
    order = np.lexsort((mkey[:, 1], mkey[:, 0])) if mkey.size else np.zeros(0, np.int64)
    mk_sorted = (mkey[order, 0] << 44) + (mkey[order, 1] - origin) if mkey.size else np.zeros(0, np.int64)
    q = (fid.astype(np.int64) << 44) + (ts - origin)
    j = np.clip(np.searchsorted(mk_sorted, q), 0, max(mk_sorted.size - 1, 0))
    found = mk_sorted.size > 0 and True
    hit = (mk_sorted[j] == q) if found else np.zeros(fid.size, bool)
    mi = order[j] if found else np.zeros(fid.size, np.int64)

    def col(name, default):
        v = np.asarray(meta[name])[mi] if found else np.full(fid.size, default)
        return np.where(hit, v, default)

    return {"op": col("op", "unknown"), "bytes": col("bytes", 0).astype(np.int64),
            "seq": col("seq", 0).astype(np.int64), "has_seq": col("has_seq", False).astype(bool),
            "pg": np.array([p if p else "" for p in col("pg", None).tolist()], dtype=object),
            "pg_ranks": col("pg_ranks", None), "comms_id": col("comms_id", None)}


def _instances(rank: np.ndarray, step: np.ndarray, start: np.ndarray, pg: np.ndarray, seq: np.ndarray,
               use_seq: bool, comms_id: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """(per collective task, its instance; the number of instances): calls of one Comms Id (``comms_id`` given),
    else of one (process group, Seq), else the n-th call of a process group in one profiler step on each rank.
    Instances are numbered in order of first appearance among the tasks."""
    o = np.lexsort((start, step, pg, rank))
    keys: list[tuple] = [None] * rank.size  # type: ignore[list-item]
    ordinal: dict[tuple, int] = {}
    for i in o.tolist():
        if comms_id is not None:
            keys[i] = ("cid", str(comms_id[i]))
        elif use_seq:
            keys[i] = ("seq", pg[i], int(seq[i]))
        else:
            k = (int(rank[i]), pg[i], int(step[i]))
            ordinal[k] = ordinal.get(k, -1) + 1
            keys[i] = ("ord", pg[i], int(step[i]), ordinal[k])
    inst_of: dict[tuple, int] = {}
    inst = np.array([inst_of.setdefault(k, len(inst_of)) for k in keys], dtype=np.int64)
    return inst, len(inst_of)


def _check_instances(g: Graph, rank: np.ndarray, inst: np.ndarray, n_inst: int, meta: dict[str, np.ndarray]
                     ) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, dict[str, int]]:
    """(complete, name, bytes, group size) per instance and the count of incomplete ones by reason. Complete: one
    call on each rank of its group, every one in the folder, not a send/recv, name and bytes alike (TraceLens
    ``strict_metadata_check``)."""
    op, nbytes, pg_ranks = meta["op"], meta["bytes"], meta["pg_ranks"]
    present = set(g.ranks)
    complete = np.ones(n_inst, dtype=bool)
    coll_name: list[str] = [""] * n_inst
    inst_bytes = np.zeros(n_inst, np.int64)
    inst_n = np.zeros(n_inst, np.int64)
    by_inst: dict[int, list[int]] = {}
    for i, m in enumerate(inst.tolist()):
        by_inst.setdefault(m, []).append(i)
    reasons = {"peers": 0, "mismatch": 0, "duplicate": 0, "p2p": 0}
    for m, members in by_inst.items():
        rs = [int(rank[i]) for i in members]
        expected = _group_ranks(pg_ranks[members[0]]) or list(range(g.world_size))
        coll_name[m] = str(op[members[0]])
        inst_bytes[m] = int(nbytes[members[0]])
        inst_n[m] = len(expected)
        if len(set(rs)) != len(rs):
            complete[m] = False
            reasons["duplicate"] += 1
        elif set(expected) - present or set(rs) != set(expected):
            complete[m] = False
            reasons["peers"] += 1
        elif coll_name[m] == "send_recv":  # two parties, paired by peer: not a rendezvous of the whole group
            complete[m] = False
            reasons["p2p"] += 1
        elif len({(str(op[i]), int(nbytes[i])) for i in members}) > 1:
            complete[m] = False
            reasons["mismatch"] += 1
    return complete, coll_name, inst_bytes, inst_n, reasons


def _instance_transfer(inst: np.ndarray, n_inst: int, complete: np.ndarray, start: np.ndarray, end: np.ndarray
                       ) -> np.ndarray:
    """Per instance (µs): the median over participants of (end − latest start); an incomplete instance, the median
    measured duration; the shortest duration where the median is not positive."""
    latest = np.full(n_inst, -np.inf)
    np.maximum.at(latest, inst, start)
    after = np.where(complete[inst], end - latest[inst], end - start)
    med = _group_median(inst, after, n_inst)
    shortest = np.full(n_inst, np.inf)
    np.minimum.at(shortest, inst, end - start)
    return np.where(med > 0, med, shortest)


def _unmatched_note(reasons: dict[str, int], n_inc: int, n_inst: int) -> str:
    """The replay's note on the instances that kept their measured duration, by reason."""
    why = []
    if reasons["peers"]:
        why.append(f"{reasons['peers']} whose peers are not all in the folder")
    if reasons["mismatch"]:
        why.append(f"{reasons['mismatch']} whose name or size differ across ranks (the per-step order slipped)")
    if reasons["duplicate"]:
        why.append(f"{reasons['duplicate']} matched twice on one rank")
    if reasons["p2p"]:
        why.append(f"{reasons['p2p']} point-to-point send/recv (pairing by peer is not implemented)")
    return f"{n_inc} of {n_inst} collective instances kept their measured duration: " + "; ".join(why)


def save(con: duckdb.DuckDBPyConnection, g: Graph) -> None:
    """Write the graph to ``sim_task``, ``sim_dep`` and ``sim_coll`` (rows of ``g.run_id`` replaced)."""
    import pyarrow as pa

    for t in ("sim_task", "sim_dep", "sim_coll"):
        con.execute(f"DELETE FROM {t} WHERE run_id = ?", [g.run_id])
    host = _host_resources(g)
    con.begin()  # one transaction: a commit per slice costs DuckDB more memory than the slices save
    try:
        for lo in range(0, g.start.size, SAVE_SLICE_ROWS):  # in slices: the Arrow copy of a slice at a time
            con.register("_sim_task_in", _task_rows(g, lo, min(g.start.size, lo + SAVE_SLICE_ROWS), host))
            con.execute("INSERT INTO sim_task SELECT run_id, task_id, rank, resource::VARCHAR, kind::VARCHAR, "
                        "name::VARCHAR, step, start_us, dur_us, gap_us, gap_label::VARCHAR FROM _sim_task_in")
            con.unregister("_sim_task_in")
    except BaseException:
        con.rollback()
        raise
    con.commit()
    dt = pa.DictionaryArray.from_arrays(pa.array(g.dep_type.astype(np.int32)), pa.array(list(DEP_TYPES)))
    con.register("_sim_dep_in", pa.table({"src": pa.array(g.dep_src), "dst": pa.array(g.dep_dst), "t": dt,
                                          "e": pa.array(g.dep_end), "o": pa.array(g.dep_off)}))
    con.execute("INSERT INTO sim_dep SELECT ?, src, dst, t::VARCHAR, e, o FROM _sim_dep_in", [g.run_id])
    con.unregister("_sim_dep_in")
    ct = np.flatnonzero(g.kind == K_COLL)
    inst_all = _instance_of_tasks(g, ct)
    keep = inst_all >= 0
    ct, inst_all = ct[keep], inst_all[keep]
    if ct.size:
        latest = np.full(g.inst_transfer.size, -np.inf)
        np.maximum.at(latest, inst_all, g.start[ct])
        blocking = np.where(g.inst_complete[inst_all], latest[inst_all] - g.start[ct], 0.0)
        coll_names = pa.DictionaryArray.from_arrays(pa.array(inst_all.astype(np.int32)), pa.array(g.inst_coll))
        by = pa.DictionaryArray.from_arrays(pa.array(inst_all.astype(np.int32)), pa.array(g.inst_matched_by))
        con.register("_sim_coll_in", pa.table({
            "i": pa.array(inst_all), "r": pa.array(g.rank[ct].astype(np.int32)), "t": pa.array(ct), "m": by,
            "c": coll_names, "b": pa.array(g.inst_bytes[inst_all]), "s": pa.array(g.start[ct]),
            "e": pa.array(g.start[ct] + g.dur[ct]), "x": pa.array(g.inst_transfer[inst_all]),
            "w": pa.array(blocking), "ok": pa.array(g.inst_complete[inst_all])}))
        con.execute("INSERT INTO sim_coll SELECT ?, i, r, t, m::VARCHAR, c::VARCHAR, b, s, e, x, w, ok "
                    "FROM _sim_coll_in", [g.run_id])
        con.unregister("_sim_coll_in")


def _task_rows(g: Graph, lo: int, hi: int, host: np.ndarray):
    """Rows ``lo:hi`` of ``sim_task`` as an Arrow table (``host``: per resource, a host thread)."""
    import pyarrow as pa

    sl = slice(lo, hi)
    res, kind, step, gap_label = g.res[sl], g.kind[sl], g.step[sl], g.gap_label[sl]
    return pa.table({
        "run_id": pa.array(np.full(hi - lo, g.run_id, np.int32)),
        "task_id": pa.array(np.arange(lo, hi, dtype=np.int64)), "rank": pa.array(g.rank[sl].astype(np.int32)),
        "resource": pa.DictionaryArray.from_arrays(pa.array(res.astype(np.int32)), pa.array(g.res_names)),
        "kind": pa.DictionaryArray.from_arrays(pa.array(kind.astype(np.int32)), pa.array(list(KINDS))),
        "name": pa.DictionaryArray.from_arrays(pa.array(g.name_code[sl].astype(np.int32)), g.name),
        "step": pa.array(step.astype(np.int32), mask=step < 0),
        "start_us": pa.array(g.start[sl]), "dur_us": pa.array(g.dur[sl]),
        "gap_us": pa.array(np.where(host[res] | (kind != K_HOST), g.gap[sl], 0.0)),
        "gap_label": pa.DictionaryArray.from_arrays(pa.array(gap_label, mask=gap_label < 0), pa.array(GAP_LABELS))})


def _instance_of_tasks(g: Graph, ct: np.ndarray) -> np.ndarray:
    """Instance of each collective task ``ct`` (all of them, in task order), complete or not (``g.inst`` holds -1
    for incomplete ones)."""
    return g.inst_all if g.inst_all is not None else g.inst[ct]


def ideal_transfer_us(g: Graph, link_gbps: float) -> np.ndarray:
    """Per instance: bytes × busbw factor ÷ link bandwidth (µs), nccl-tests ``PERFORMANCE.md``; 0 when the bytes
    are unknown."""
    f = np.array([busbw_factor(c, int(n)) for c, n in zip(g.inst_coll, g.inst_n.tolist(), strict=True)])
    return g.inst_bytes * f / (link_gbps * 1e9) * 1e6 if f.size else np.zeros(0)
