"""The profiler's own host cost, and the step time without the profiler.

The profiler pays host time for every event it records: entering and leaving each op and annotation (more with
``record_shapes``, which copies every input's shape and dtype, and with ``with_stack``, which walks the Python
stack) and CUPTI's callback around every runtime and driver call. A GPU-bound step hides that cost; a host-bound
step (small kernels, a Python-heavy loop) runs slower under the profiler than without it. NVIDIA's Nsight and NeMo
guides list "compare profiled and unprofiled step time" as a pitfall; nothing in the trace says how much.

The estimate (:func:`unprofiled`): each host task's gap, then its own duration (at most half of it), shrinks by
``ops × per_op_us + calls × per_call_us`` (:func:`per_op_us`, :data:`PER_CALL_US`; the events from
:func:`traceanalyze.replay.graph.events.profiler_events`),
and the graph is replayed: a GPU-bound step stays, a host-bound one shrinks.

Calibration (``python benchmarks/profiler_overhead.py --fit``, issue 37): fitted on every GPU side whose loop was
also timed without the profiler (the shared H200 sides and ours on an H100, ``record_shapes=True``: 14 sides), by
the grid point whose estimates miss those loops least: 2.0 µs per recorded op, 0.5 µs more per input shape
``record_shapes`` copies (an op carries 2–3 in a GPT, 4 in a ResNet: 3–4 µs an op), 4.0 µs per runtime or driver
call. Mean |error| 5.4 % (leave-one-out 5.9 %, max 27.3 %: a step that keeps a tensor per step with
``profile_memory``), against 6.1 % (max 29.2 %) for the per-op model it replaced (2.9 µs an op, 5.9 a call). The
sides whose steps wait on a multi-process DataLoader are left out of the fit: their workers compete with the
profiler for the cores, which no per-event cost describes (:func:`estimate_range` says so instead). Without
``record_shapes`` an op costs 1.0 µs (the CPU loops of ``benchmarks/profiler_overhead.py``: about a third).

Those wall times were taken with one sync per N steps while the traced loops sync every step: the estimate is the
loop as traced; ``no_host_sync`` (:mod:`.whatif`) prices the loop without its per-step wait, and is what the wall
time is checked against (``benchmarks/gpu_pairs.py``).
"""

from __future__ import annotations

import json

import duckdb
import numpy as np

from traceanalyze.replay import graph as gr

# µs of host time per recorded event (module docstring: the calibration): per op or annotation, by what is recorded;
# per runtime or driver call (CUPTI's callback and activity record, whatever the options)
PER_OP_US = {"base": 1.0, "record_shapes": 1.0, "with_stack": 2.2, "profile_memory": 0.5}
PER_SHAPE_US = 0.5  # per input shape record_shapes copies (graph.events row 3), on top of its per-op share
PER_CALL_US = 4.0
# µs per range Python opens only while a profiler runs (inductor's record_function around each Triton launch, the
# compiled graph's call): an empty torch.profiler.record_function costs 9.4 µs under the profiler on this project's
# CPU (benchmarks/profiler_overhead.py), all of it profiler-only
PER_PY_RANGE_US = 9.4
# µs of host time CUPTI adds per node when a CUDA graph is enqueued (cudaGraphLaunch instruments each of them): the
# launch pair's fixed side replays a ~3,850-kernel graph per step, 13.8 ms profiled against 6.9 ms without the
# profiler, the kernels waiting on that enqueue: 1.8 µs per node
PER_KERNEL_US = 1.8
# µs of GPU time CUPTI's kernel activity record adds between two kernels already queued on a stream: in that graph
# the kernels follow each other 0.42 µs apart (median chain gap) under the profiler; without it the GPU-bound
# step runs at 6.93 ms for 5.84 ms of kernels, 0.28 µs between kernels: 0.14 µs is the profiler's
PER_KERNEL_DEVICE_US = 0.14
RANGE = (0.6, 1.4)  # the estimate's range: per-event cost × these (the sides above spread by about that much)
MAX_DUR_CUT = 0.5  # a task's own duration shrinks by at most this share (the call itself is real work)


def profiler_config(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """What the run's profiler recorded: ``record_shapes``, ``with_stack``, ``profile_memory`` (bool each), from the
    trace headers where they say (PyTorch writes ``record_shapes`` in the header from 2.5), else from the events
    (``Input Dims`` on most ops: shapes were recorded)."""
    cfg = {"record_shapes": None, "with_stack": None, "profile_memory": None}
    for (hdr,) in con.execute("SELECT header FROM files WHERE run_id = ? AND rank IS NOT NULL LIMIT 64",
                              [run_id]).fetchall():
        try:
            h = json.loads(hdr) if isinstance(hdr, str) else (hdr or {})
        except ValueError:
            continue
        if not isinstance(h, dict):
            continue
        for k in cfg:
            v = h.get(k)
            if isinstance(v, (bool, int)) and not isinstance(v, float):
                cfg[k] = bool(v) or bool(cfg[k])
    if cfg["record_shapes"] is None:
        n, shaped = con.execute("""SELECT count(*), count(c.input_dims) FROM (
                SELECT c.input_dims FROM cpu_ops c JOIN files f USING (file_id)
                WHERE f.run_id = ? AND c.cat = 'cpu_op' LIMIT 20000) c""", [run_id]).fetchone()
        cfg["record_shapes"] = bool(n) and shaped > 0.3 * n
    return {k: bool(v) for k, v in cfg.items()}


def per_op_us(cfg: dict) -> float:
    """µs of host time the profiler adds per recorded op or annotation under ``cfg`` (:func:`profiler_config`):
    :data:`PER_OP_US` ``base`` plus each option's share."""
    return PER_OP_US["base"] + sum(PER_OP_US[k] for k in ("record_shapes", "with_stack", "profile_memory")
                                   if cfg.get(k))


def per_shape_us(cfg: dict) -> float:
    """µs of host time ``record_shapes`` adds per input shape it copies (:data:`PER_SHAPE_US`; 0 without it)."""
    return PER_SHAPE_US if cfg.get("record_shapes") else 0.0


def unprofiled(g: gr.Graph, d: np.ndarray, cg: np.ndarray, per_op: float, per_call: float = PER_CALL_US,
               per_shape: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``(durations, chain gaps)`` with the profiler's host cost taken out: per host task ``ops × per_op + shapes ×
    per_shape + calls × per_call`` µs, from the gap before it first, then from its own duration (at most
    :data:`MAX_DUR_CUT` of it). Copies."""
    if g.prof_events is None or (per_op <= 0 and per_call <= 0):
        return d, cg
    ev = g.prof_events  # uint16 rows: each product is float64, one row at a time
    cut = ev[0] * float(per_op)
    cut += ev[1] * float(per_call)
    cut += ev[2] * PER_PY_RANGE_US
    if per_shape > 0 and ev.shape[0] > 3:
        cut += ev[3] * float(per_shape)
    dev = np.isin(g.kind, (gr.K_KERNEL, gr.K_MEMCPY, gr.K_MEMSET)) & ~g.first
    cut[dev] = PER_KERNEL_DEVICE_US
    # a CUDA graph launch: CUPTI instruments every node it enqueues, so the call takes nodes × PER_KERNEL_US more
    share = np.full(cut.size, MAX_DUR_CUT)
    graph = _graph_launches(g)
    node_cg = None
    if graph.size:
        launch = (g.dep_type == 0) & np.isin(g.dep_src, graph)
        nodes = np.bincount(g.dep_src[launch], minlength=cut.size)
        cut[graph] += nodes[graph] * PER_KERNEL_US
        share[graph] = 0.99
        # the graph's kernels wait for that slow enqueue: without the profiler they follow each other at the gap
        # the graph shows between most of its kernels (the median), not at the stalls the enqueue left
        node = np.unique(g.dep_dst[launch])
        node = node[dev[node]]
        if node.size:
            node_cg = (node, float(np.median(cg[node])))
    from_gap = np.minimum(cg, cut)
    cg2 = cg - from_gap
    rest = cut - from_gap
    d2 = d - np.where(dev, 0.0, np.minimum(rest, d * share))
    if node_cg is not None:
        cg2[node_cg[0]] = np.minimum(cg2[node_cg[0]], node_cg[1])
    return d2, cg2


def multiprocess_loader(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether the run's steps take batches from a multi-process ``DataLoader`` (its worker processes run beside the
    training process; ``enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__``)."""
    return con.execute("""SELECT count(*) > 0 FROM cpu_ops c JOIN files f USING (file_id)
        WHERE f.run_id = ? AND c.cat = 'user_annotation'
          AND c.name LIKE 'enumerate(DataLoader)#\\_MultiProcessing%' ESCAPE '\\'""", [run_id]).fetchone()[0]


def estimate_range(profiled_us: float, est_us: float, gpu_busy_us: float | None, loader_mp: bool
                   ) -> tuple[list[float], str | None]:
    """(the step without the profiler's range ``[low, high]`` µs, a caveat or None). The profiler's cost taken out
    scaled by :data:`RANGE` (the per-event costs of the sides it was fitted on spread by about that much). A step
    that waits on a multi-process DataLoader's workers and is not GPU-bound (the estimate over 1.1 × the busiest
    stream's work) gets a caveat instead of a narrow range: the workers and the profiler's host work compete for
    the cores, so the loader's speed under the profiler is not its speed without it (the H100 loader pair: an
    estimate 28 % under the loop's time with 2 workers, 9 % over it with 12). The range is then from the busiest
    stream's work (no step is faster) to the profiled step."""
    cut = max(profiled_us - est_us, 0.0)
    rng = [profiled_us - cut * RANGE[1], profiled_us - cut * RANGE[0]]
    if loader_mp and gpu_busy_us and est_us > 1.1 * gpu_busy_us:
        return [round(min(gpu_busy_us, est_us), 3), round(profiled_us, 3)], (
            "the steps wait on a multi-process DataLoader and are not GPU-bound: its workers compete with the "
            "profiler's host work for the cores, so their speed under the profiler is not their speed without it; "
            "the step without the profiler is uncertain (time a few steps without the profiler: capture.profile "
            "does)")
    return [round(max(v, 0.0), 3) for v in rng], None


def _graph_launches(g: gr.Graph) -> np.ndarray:
    """Task ids of the host tasks that launch a CUDA graph (``cudaGraphLaunch``, ``cuGraphLaunch``)."""
    codes = gr.name_codes(g, "graphlaunch")
    if not codes:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.isin(g.name_code, codes) & (g.kind == gr.K_HOST))

