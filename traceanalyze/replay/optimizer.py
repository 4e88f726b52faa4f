"""The ``fused_optimizer`` what-if on GPU runs: an optimizer that loops over its parameters (``foreach=False``: one
small kernel per parameter and operation, launched from Python) re-timed as PyTorch's fused one (``fused=True``).

The model (``shared/WHATIF.md`` §6; the numbers of the H100 pair in ``tests/data/gpu/h100/optimizer``):

- **Host.** PyTorch's fused Adam/AdamW (``torch/optim/adam.py``, ``adamw.py``: ``_fused_adam``/``_fused_adamw``
  call ``torch._fused_adam_``/``_fused_adamw_``) and fused SGD (``torch/optim/sgd.py``: ``_fused_sgd``) update
  every parameter of a step in ``multi_tensor_apply`` kernels (``aten/src/ATen/native/cuda/MultiTensorApply.cuh``,
  ``fused_adam_impl.cu``, ``fused_sgd_kernel.cu``). Each launch takes the next tensors in chunks of
  :data:`CHUNK_ELEMENTS` elements, one block per chunk, and is sent when it holds :data:`MAX_TENSORS` tensors (by
  the kernel's depth: the tensor lists it reads) or :data:`MAX_BLOCKS` blocks (:func:`fused_launches` replays
  that loop on the parameters' sizes); Adam and AdamW first add one to every step counter
  (``torch._foreach_add_(state_steps, 1)``, one depth-1 launch per 110 tensors). So the per-parameter loop
  inside ``Optimizer.step`` (its launch calls and the host time between them: one Python iteration and 7 to 8 ATen
  dispatches per parameter) becomes those few launches, each at the run's median launch-call time. The host time
  under ``Optimizer.step`` before its first launch (``_init_group`` gathering parameters, gradients and states,
  which the fused optimizer does too) and after its last stays: on the H100 pair it is 0.64–0.74 ms per step
  before the first launch on the slow side and 0.74–0.83 ms before the first op on the fused side (profiled).
  The fused op's own dispatch of its tensor lists is not modelled (0.25–0.35 ms profiled on the fused side).
- **GPU.** The fused kernel is memory-bound: each element of each parameter is read once from every tensor list
  and written once to every list it updates (AdamW: read param, grad, exp_avg, exp_avg_sq, write param, exp_avg,
  exp_avg_sq: 7 × 4 = 28 bytes per fp32 element; amsgrad reads and writes max_exp_avg_sq too; SGD with momentum
  reads param, grad, momentum_buffer and writes param, momentum_buffer), at
  :data:`~traceanalyze.replay.precision.COPY_EFFICIENCY` of the GPU's HBM bandwidth
  (:func:`traceanalyze.hardware.gpu_peaks`). The H100 pair's fused side moved 58.1 M elements × 28 bytes
  = 1.63 GB in 0.61 ms (4 kernels): 2.66 TB/s, 79 % of 3,350 GB/s. The optimizer's kernels of a step are scaled
  together to that time, never up, and never below :data:`~traceanalyze.replay.precision.MIN_KERNEL_US` per fused
  launch. The elements come from the ``Input Dims`` of the ops that launch the optimizer's kernels
  (``record_shapes=True``); without them the kernels keep their measured time and the launches are counted from
  the tensors alone (at least one per :data:`MAX_TENSORS` tensors).

It applies where the ``host_optimizer`` rule's situation holds (:func:`per_parameter`): kernels launched under
``Optimizer.step`` ranges, at least :data:`~traceanalyze.metrics.host.OPTIMIZER_MIN_KERNELS` per step, none of them
multi-tensor or fused; and the optimizer is one PyTorch has a fused CUDA kernel for (:data:`FUSED`).
"""

from __future__ import annotations

import json
import math
from collections import Counter

import duckdb
import numpy as np

from traceanalyze.hardware import Peaks
from traceanalyze.metrics.host import MULTI_TENSOR_KERNELS, OPTIMIZER_MIN_KERNELS
from traceanalyze.replay import graph as gr
from traceanalyze.replay.precision import COPY_EFFICIENCY, MIN_KERNEL_US

CHUNK_ELEMENTS = 65_536  # kChunkSize: elements per block of a multi_tensor_apply kernel (MultiTensorApply.cuh)
# depth_to_max_tensors (tensors per launch by the number of tensor lists) and depth_to_max_blocks, for 4 KB of
# kernel arguments (MultiTensorApply.cuh, DepthToMaxConfig<false>): the H100 pair's fused AdamW launched 4 kernels
# of 320, 160, 168 and 304 blocks for 101 tensors in 952 chunks, as this table gives (the 32 KB table, 7× the
# tensors and blocks, would give 1)
MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
MAX_BLOCKS = 320
STEP_COUNTER_DEPTH = 1  # Adam/AdamW: torch._foreach_add_(state_steps, 1) before the fused kernel
# optimizer class (Optimizer.step#<class>.step) -> the fused kernel: tensor lists read, lists written, whether the
# step counters are added first. Adam/AdamW: param, grad, exp_avg, exp_avg_sq (amsgrad: + max_exp_avg_sq); SGD:
# param, grad (momentum: + momentum_buffer). PyTorch's fused=True optimizers on CUDA.
FUSED = {"Adam": (4, 3, True), "AdamW": (4, 3, True), "SGD": (2, 1, False)}
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2}

RANGE_TOLERANCE_US = 0.001  # a launch call's start against a range's ends on the graph's clock (µs from ns)
_RANGES_SQL = """
SELECT DISTINCT st.rank, st.step, st.start_ns, c.ts_ns, c.ts_ns + c.dur_ns
FROM profiler_steps($1) st JOIN cpu_ops c ON c.file_id = st.file_id AND c.pid = st.pid AND c.tid = st.tid
     AND c.ts_ns >= st.start_ns AND c.ts_ns < st.end_ns
WHERE c.cat IN ('cpu_op', 'user_annotation') AND c.name LIKE 'Optimizer.step#%'
"""
_PARAMS_SQL = """
WITH st AS (
    SELECT file_id, rank, pid, tid, step, start_ns AS s, end_ns AS e FROM profiler_steps($1)
    WHERE counted AND rank = (SELECT min(rank) FROM profiler_steps($1) WHERE counted)),
o AS (
    SELECT c.file_id, c.pid, c.tid, st.step, c.name, c.ts_ns AS s, c.ts_ns + c.dur_ns AS e
    FROM cpu_ops c JOIN st ON c.file_id = st.file_id AND c.pid = st.pid AND c.tid = st.tid
         AND c.ts_ns >= st.s AND c.ts_ns < st.e
    WHERE c.cat IN ('cpu_op', 'user_annotation') AND c.name LIKE 'Optimizer.step#%'),
o1 AS (SELECT * FROM o WHERE step = (SELECT min(step) FROM o)),
inside AS MATERIALIZED (
    SELECT DISTINCT c.file_id, c.pid, c.tid, c.cat, c.name, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns, c.correlation,
           c.input_dims, c.input_types
    FROM o1 JOIN cpu_ops c ON c.file_id = o1.file_id AND c.pid = o1.pid AND c.tid = o1.tid
         AND c.ts_ns >= o1.s AND c.ts_ns < o1.e
    WHERE c.cat IN ('cpu_op', 'cuda_runtime', 'cuda_driver')),
rt AS (
    SELECT i.file_id, i.pid, i.tid, i.ts_ns, i.correlation FROM inside i
    WHERE i.cat <> 'cpu_op' AND i.correlation IS NOT NULL
      AND EXISTS (SELECT 1 FROM kernels k WHERE k.file_id = i.file_id AND k.correlation = i.correlation
                  AND k.cat = 'kernel')),
enc AS (
    SELECT arg_max(op.name, op.ts_ns) AS name, max(op.ts_ns) AS op_ts, arg_max(op.input_dims, op.ts_ns) AS dims,
           arg_max(op.input_types, op.ts_ns) AS types
    FROM rt JOIN inside op ON op.cat = 'cpu_op' AND op.file_id = rt.file_id AND op.pid = rt.pid
         AND op.tid = rt.tid AND op.ts_ns <= rt.ts_ns AND op.end_ns >= rt.ts_ns
    GROUP BY rt.file_id, rt.ts_ns, rt.correlation)
SELECT DISTINCT (SELECT min(name) FROM o1), name, dims, types, op_ts FROM enc ORDER BY op_ts
"""


def fused_launches(numels: list[int], depth: int) -> int:
    """Kernel launches of one ``multi_tensor_apply`` over tensors of ``numels`` elements (in order) with ``depth``
    tensor lists: PyTorch's loop (MultiTensorApply.cuh) launches when the launch holds :data:`MAX_TENSORS`
    ``[depth]`` tensors whose chunks are all in, or :data:`MAX_BLOCKS` chunks of :data:`CHUNK_ELEMENTS` elements; a
    tensor whose chunks did not fit carries over into the next launch. Empty tensors are skipped."""
    max_t = MAX_TENSORS[min(max(depth, 1), max(MAX_TENSORS))]
    launches = blocks = tensors = 0
    for n in numels:
        if n <= 0:
            continue
        tensors += 1
        chunks = -(-n // CHUNK_ELEMENTS)
        for c in range(chunks):
            blocks += 1
            last = c == chunks - 1
            if (tensors == max_t and last) or blocks == MAX_BLOCKS:
                launches += 1
                blocks = 0
                tensors = 0 if last else 1
    return launches + (1 if blocks else 0)


def per_parameter(con: duckdb.DuckDBPyConnection, g: gr.Graph) -> dict:
    """The graph's per-parameter optimizer loop: ``{"applies": bool, "why": str, ...}``. Where it applies:
    ``launches`` (the launch calls inside ``Optimizer.step`` ranges in the steps, task ids: :func:`step_launches`),
    ``kernels`` (the device tasks they launch) and ``kernels_per_step`` (median over the counted (rank, step)). It
    applies on a GPU run whose ``Optimizer.step`` ranges launch at least
    :data:`~traceanalyze.metrics.host.OPTIMIZER_MIN_KERNELS` kernels per step, none of them multi-tensor or fused
    (the ``host_optimizer`` rule's situation)."""
    if g.mode != "gpu":
        return {"applies": False, "why": "a CPU run launches no optimizer kernels"}
    launch = g.dep_type == gr.DEP_TYPES.index("launch")
    src, dst = g.dep_src[launch], g.dep_dst[launch]
    mine = (g.kind[src] == gr.K_HOST) & (g.step[src] >= 0) & (g.cover["optimizer"][src] > 0) & \
        np.isin(g.kind[dst], (gr.K_KERNEL, gr.K_MEMCPY, gr.K_MEMSET))
    src, dst = src[mine], dst[mine]
    if src.size:
        inside = step_launches(con, g, src)
        src, dst = src[inside], dst[inside]
    if dst.size == 0:
        return {"applies": False, "why": "no kernel is launched inside an Optimizer.step range in the replayed "
                                         "steps"}
    names = g.name.to_pylist() if hasattr(g.name, "to_pylist") else list(g.name)
    multi = [i for i, n in enumerate(names) if n and any(p in n for p in MULTI_TENSOR_KERNELS)]
    if np.isin(g.name_code[dst], multi).any():
        return {"applies": False, "why": "the optimizer already launches multi-tensor or fused kernels "
                                         "(foreach or fused)"}
    counted = {(r, s) for r, s, _, _, c in g.steps if c}
    width, keys, inv = gr.rank_step_groups(g, dst)
    per = np.bincount(inv, minlength=keys.size)
    vals = [int(n) for k, n in zip(keys.tolist(), per.tolist(), strict=True) if divmod(k, width) in counted]
    kps = float(np.median(vals)) if vals else 0.0
    if kps < OPTIMIZER_MIN_KERNELS:
        return {"applies": False, "why": f"the optimizer launches {kps:g} kernels per step, under the "
                                         f"{OPTIMIZER_MIN_KERNELS} from which a loop over the parameters shows"}
    return {"applies": True, "why": "", "launches": np.unique(src), "kernels": dst, "kernels_per_step": kps}


def step_launches(con: duckdb.DuckDBPyConnection, g: gr.Graph, src: np.ndarray) -> np.ndarray:
    """Which of the host tasks ``src`` (launch calls under an ``Optimizer.*`` range: the graph's ``optimizer``
    cover, which holds ``zero_grad`` too) start inside an ``Optimizer.step`` range on their step's thread. The
    ranges are placed on the graph's clock by their step's begin marker: its start is the ``ProfilerStep``'s."""
    rows = con.execute(_RANGES_SQL, [g.run_id]).fetchall()
    begin = {(r, s): b for r, s, b, _, _ in g.steps}
    lo, hi, res = [], [], []
    for rank, step, st_ns, s_ns, e_ns in rows:
        b = begin.get((int(rank), int(step)))
        if b is not None:
            res.append(int(g.res[b]))
            lo.append(float(g.start[b]) + (s_ns - st_ns) / 1e3)
            hi.append(float(g.start[b]) + (e_ns - st_ns) / 1e3)
    out = np.zeros(src.size, bool)
    if not res:
        return out
    res_a, lo_a, hi_a = np.array(res), np.array(lo), np.array(hi)
    t = g.start[src]
    # the ranges and the calls grouped by thread once, each thread a slice of each (a mask per thread over every
    # rank's calls grew with ranks²)
    o = np.lexsort((lo_a, res_a))
    res_a, lo_a, hi_a = res_a[o], lo_a[o], hi_a[o]
    so = np.argsort(g.res[src], kind="stable")
    src_res = g.res[src][so]
    for r in np.unique(res_a).tolist():
        a, b = np.searchsorted(res_a, r), np.searchsorted(res_a, r, side="right")
        rl, rh = lo_a[a:b], np.maximum.accumulate(hi_a[a:b])
        sel = so[np.searchsorted(src_res, r):np.searchsorted(src_res, r, side="right")]
        j = np.searchsorted(rl, t[sel] + RANGE_TOLERANCE_US, side="right") - 1
        ok = j >= 0
        out[sel[ok]] = t[sel[ok]] < rh[j[ok]] + RANGE_TOLERANCE_US
    return out


def context(con: duckdb.DuckDBPyConnection, g: gr.Graph, peaks: Peaks) -> dict:
    """What the ``fused_optimizer`` rewrite needs for run ``g`` (:func:`per_parameter`, then, where it applies, the
    parameters of the lowest rank's first counted step with an optimizer step, read from the ops that launch its
    kernels: :func:`params`): ``applies``, ``why`` (when it does not), ``optimizer`` (the class), ``tensors``,
    ``elements`` (None without ``Input Dims``), ``launches_fused`` (per step), ``fused_us`` (the fused kernels'
    time per step from their bytes, µs; None without the elements), ``bytes`` (per step), ``peaks``."""
    out = per_parameter(con, g)
    if not out["applies"]:
        return out
    p = params(con, g.run_id)
    if p is None:
        return {"applies": False, "why": "no op under an Optimizer.step range is recorded launching its kernels"}
    spec = FUSED.get(p["optimizer"])
    if spec is None:
        return {"applies": False, "why": f"no fused kernel is modelled for {p['optimizer']} (PyTorch's fused=True "
                                         f"on CUDA: {', '.join(FUSED)}); foreach=True is not modelled"}
    depth, written, counters = spec
    depth += p["extra_state"]
    written += p["extra_state"]
    n_tensors = p["tensors"]
    numels = p["numels"] if p["numels"] is not None else [1] * n_tensors  # sizes unknown: the tensor limit only
    launches = fused_launches(numels, depth) + (fused_launches([1] * n_tensors, STEP_COUNTER_DEPTH) if counters else 0)
    elements = sum(p["numels"]) if p["numels"] is not None else None
    nbytes = elements * p["element_bytes"] * (depth + written) if elements is not None else None
    fused_us = nbytes / (peaks.hbm_gbps * 1e3 * COPY_EFFICIENCY) if nbytes else None  # GB/s × 1e3 = bytes per µs
    out.update(optimizer=p["optimizer"], tensors=n_tensors, elements=elements, launches_fused=launches,
               depth=depth, written=written, counters=counters, element_bytes=p["element_bytes"], bytes=nbytes,
               fused_us=max(fused_us, launches * MIN_KERNEL_US) if fused_us is not None else None, peaks=peaks,
               extra_state=p["extra_state"])
    return out


def params(con: duckdb.DuckDBPyConnection, run_id: int) -> dict | None:
    """The parameters one optimizer step updates, from the ops that launch kernels under ``Optimizer.step`` (the
    innermost op around each launch call, on the lowest rank's first counted step that has one): ``optimizer`` (the
    class: ``Optimizer.step#AdamW.step`` gives ``AdamW``), ``tensors`` (P), ``numels`` (elements per parameter in
    launch order, None when an op has no ``Input Dims``), ``element_bytes`` (of the first input's type; 4 when
    unknown) and ``extra_state`` (1 for a state list beyond the plain optimizer's: amsgrad's ``max_exp_avg_sq`` (an
    ``aten::maximum``), SGD's momentum buffer (an ``aten::mul_``)). A loop over the parameters launches each of its
    per-parameter ops once or a few times per parameter: P is the most common count of an op name's launches (the
    smallest on a tie: AdamW's two ``mul_`` per parameter, SGD's ``mul_`` and two ``add_``); the sizes are the
    first inputs of the first op name launched P times. None when no such op is recorded."""
    rows = con.execute(_PARAMS_SQL, [run_id]).fetchall()
    if not rows:
        return None
    opt = str(rows[0][0]).split("#", 1)[-1].removesuffix(".step")
    count = Counter(r[1] for r in rows)
    freq = Counter(count.values())
    p = min(freq, key=lambda n: (-freq[n], n))
    ref = next(r[1] for r in rows if count[r[1]] == p)
    numels: list[int] | None = []
    types = []
    for _, name, dims_text, types_text, _ in rows:
        if name != ref:
            continue
        n, t = _first_input(dims_text, types_text)
        types.append(t)
        if n is None:
            numels = None
        elif numels is not None:
            numels.append(n)
    names = set(count)
    extra = int("aten::maximum" in names) if opt in ("Adam", "AdamW") else int("aten::mul_" in names)
    return {"optimizer": opt, "tensors": p, "numels": numels, "element_bytes": ELEMENT_BYTES.get(types[0] or "", 4),
            "extra_state": extra}


def _first_input(dims_text: str | None, types_text: str | None) -> tuple[int | None, str | None]:
    """(elements of an op's first input from its ``Input Dims``, its ``Input type``), None where not recorded."""
    try:
        dims = json.loads(dims_text) if dims_text else None
        types = json.loads(types_text) if types_text else None
    except ValueError:
        return None, None
    t = types[0] if isinstance(types, list) and types and isinstance(types[0], str) else None
    if not (isinstance(dims, list) and dims and isinstance(dims[0], list) and dims[0]
            and all(isinstance(x, int) and 0 <= x < 1 << 40 for x in dims[0])):
        return None, t
    return int(math.prod(dims[0])), t


def rewrite(g: gr.Graph, d: np.ndarray, cg: np.ndarray, oc: dict) -> tuple[np.ndarray, np.ndarray]:
    """Task durations and chain gaps after ``fused_optimizer`` (module docstring); ``oc``: :func:`context`. On each
    host thread and step, from its first launch call under ``Optimizer.step`` to its last: the tasks under the range
    and the range's share of the gaps before them go, and the first launch call takes ``launches_fused`` × the
    median launch call of the run (in ``d``: µs). The optimizer's kernels of each (rank, step) are scaled together
    to ``fused_us`` when that is known and shorter."""
    d, cg = d.copy(), cg.copy()
    src = oc["launches"]
    if src.size == 0:
        return d, cg
    cost = launch_cost_us(g, d)
    width = int(g.step.max(initial=0)) + 2
    key = g.res[src].astype(np.int64) * width + g.step[src]
    o = np.argsort(key, kind="stable")
    heads = np.flatnonzero(np.r_[True, key[o][1:] != key[o][:-1]])
    first = np.minimum.reduceat(src[o], heads)  # one thread's tasks are consecutive ids, in time order
    last = np.maximum.reduceat(src[o], heads)
    n = last - first
    loop = np.repeat(first + 1 - np.r_[0, np.cumsum(n)[:-1]], n) + np.arange(int(n.sum()))
    under = loop[g.cover["optimizer"][loop] > 0]
    d[under] = 0.0
    cg[loop] = np.minimum(cg[loop], np.clip(g.chain_gap[loop] - g.gap_cover["optimizer"][loop], 0.0, None))
    d[first] = oc["launches_fused"] * cost
    if oc.get("fused_us"):
        k = oc["kernels"]
        _, keys, inv = gr.rank_step_groups(g, k)
        total = np.bincount(inv, weights=d[k], minlength=keys.size)
        r = np.minimum(1.0, oc["fused_us"] / np.maximum(total, 1e-9))
        d[k] = d[k] * r[inv]
    return d, cg


def launch_cost_us(g: gr.Graph, d: np.ndarray) -> float:
    """The median launch call of the run in ``d`` (µs): the host tasks that launch device work."""
    launch = g.dep_src[g.dep_type == gr.DEP_TYPES.index("launch")]
    launch = launch[g.kind[launch] == gr.K_HOST]
    return float(np.median(d[launch])) if launch.size else 0.0


def assumptions(oc: dict, g: gr.Graph, d: np.ndarray) -> str:
    """The model's assumptions with the figures of this run (``oc``: :func:`context`; ``d``: the durations it
    rewrites, for the launch call's cost)."""
    cost = launch_cost_us(g, d)
    peaks: Peaks = oc["peaks"]
    lists = oc["depth"]
    host = (f"fused {oc['optimizer']} (fused=True): the per-parameter loop under Optimizer.step "
            f"({oc['kernels_per_step']:,.0f} kernels per step, launched one by one) becomes {oc['launches_fused']} "
            f"launch(es) per step at the run's median launch call ({cost:.1f} µs): {oc['tensors']} parameter "
            f"tensors in multi_tensor_apply launches of at most {MAX_TENSORS[min(lists, 5)]} tensors and "
            f"{MAX_BLOCKS} blocks of {CHUNK_ELEMENTS:,} elements ({lists} tensor lists; PyTorch's "
            "MultiTensorApply.cuh, 4 KB kernel arguments)" + ("" if oc["elements"] is not None else
                                                               ", sizes unknown: the tensor limit only, at least")
            + (", plus the step counters' foreach add" if oc["counters"] else "")
            + "; the host time under Optimizer.step before its first launch and after its last (gathering the "
            "parameters, gradients and states, which the fused optimizer does too) and the host's other work "
            "unchanged; the fused op's own dispatch not modelled; the parameters of the lowest rank's first "
            "traced step on every rank")
    if oc.get("fused_us") is None:
        return host + ("; the optimizer's kernels keep their measured time (no Input Dims: the parameters' sizes "
                       "are unknown; record_shapes=True gives them)")
    return host + (f"; the optimizer's kernels of a step scaled together to {oc['fused_us'] / 1e3:.3f} ms: "
                   f"{oc['elements'] / 1e6:,.1f} M elements × {(lists + oc['written']) * oc['element_bytes']} bytes "
                   f"({lists} tensors read, {oc['written']} written, {oc['element_bytes']} bytes per element) at "
                   f"{COPY_EFFICIENCY:.0%} of {peaks.hbm_gbps:,.0f} GB/s ({peaks.reference}"
                   + (f"; {peaks.assumed}" if peaks.assumed else "") + "), never longer than measured")
