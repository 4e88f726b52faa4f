"""What each task is, for the what-ifs: its precision class (:data:`~traceanalyze.replay.graph.model.
PRECISION_CLASSES`, from the kernel's name and its launching op's inputs), the µs of it and of the gap before it
under each category (dataloader, compile, optimizer ranges, launch gaps, fp32 matrix math), and each gap's
label."""

from __future__ import annotations

import numpy as np

from traceanalyze import matmath
from traceanalyze.metrics.allocator import ALLOCATOR_CALLS, FREE_CALLS
from traceanalyze.metrics.collectives import int_column
from traceanalyze.metrics.host import COMPILE_RANGES
from traceanalyze.replay.graph.model import (
    CATEGORIES,
    GAP_LABELS,
    K_HOST,
    K_KERNEL,
    MATMUL_OPS,
    P_ATTN_FP32,
    P_LAUNCH,
    P_MEM,
    P_MEM_IN_PLACE,
    P_MM_FP32,
    P_MM_LOWP,
    P_MM_TF32,
    T_SHIFT,
)
from traceanalyze.replay.graph.source import RunClock, fetch, in_files
from traceanalyze.replay.graph.tasks import Tasks


def precision_classes(t: Tasks) -> np.ndarray:
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


def categories(con, rc: RunClock, t: Tasks, fids: list[int], prec: np.ndarray
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray, dict[str, set[str]]]:
    """µs of each host task and of the gap before it under each category (the package docstring), each gap's label,
    and the categories known all zero without a scan (``{"cover": ..., "gap_cover": ...}``: calloc'd zeros, which
    :func:`.builder._join_chunks` joins without reading); ``prec``: :func:`precision_classes` (GPU runs: the fp32
    matrix-math kernels are ``matmul_fp32``)."""
    mode, origin, off_ns, world = rc.mode, rc.origin, rc.off_ns, rc.world
    res, rk, kind, flag = t.res, t.rk, t.kind, t.cols["flag"]
    start, end, gap, first = t.start, t.end, t.gap, t.first
    n = start.size
    # the allocator's cudaFree (5) and cudaMalloc (6) calls (GPU runs: runtime calls no edge touches are folded
    # into the gap before the next task, traceanalyze.replay.graph.tasks._fold_calls, so their time is found as a
    # range)
    r = fetch(con, f"""SELECT c.file_id, c.pid, c.tid, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns,
               CASE WHEN c.cat IN ('cuda_runtime', 'cuda_driver') THEN 6 - (list_contains($6, c.name))::INT
                    WHEN is_dataloader_op(c.name) THEN 0 WHEN list_contains($1, c.name) THEN 1
                    WHEN c.name LIKE 'Optimizer.%' THEN 2 ELSE 4 END AS cat
        FROM cpu_ops c WHERE {in_files("c.file_id", fids, "$4")}
          AND ((c.cat IN ('cpu_op', 'user_annotation')
                AND (is_dataloader_op(c.name) OR list_contains($1, c.name) OR c.name LIKE 'Optimizer.%'
                     OR ($2 AND list_contains($3, c.name)
                         AND (c.input_types LIKE '["float"%' OR c.input_types LIKE '[''float''%'))))
               OR ($7 AND c.cat IN ('cuda_runtime', 'cuda_driver') AND list_contains($5, c.name)))""",
               [list(COMPILE_RANGES), mode != "gpu", list(MATMUL_OPS), fids, list(ALLOCATOR_CALLS),
                list(FREE_CALLS), rc.frees])
    r_rank = rc.rank_of(np.asarray(r["file_id"], np.int64))  # fids: ranked files of the run (no join to files)
    r_res = t.resource_ids(r_rank, 0, int_column(r["pid"])[0], int_column(r["tid"])[0])
    shift = origin + off_ns[np.clip(r_rank, 0, world)]
    lo = np.clip(np.asarray(r["ts_ns"], np.int64) - shift, 0, (1 << T_SHIFT) - 1)
    hi = np.clip(np.asarray(r["end_ns"], np.int64) - shift, 0, (1 << T_SHIFT) - 1)
    cat = np.asarray(r["cat"], np.int64)
    if (cat == 6).any():  # a thread's cudaMalloc calls are a flush's only where it also frees: else the cache grows
        cat = np.where(cat == 6, np.where(np.isin(r_res, r_res[cat == 5]), 5, -1), cat)
    # only the tasks of the threads that hold a range can be covered (elsewhere the cover is 0 exactly): their
    # rows (contiguous per resource, in resource order) are searched, the others stay calloc'd zeros
    sub = _rows_of(res, np.unique(r_res[r_res >= 0]))
    # each such task's start and end as keys of its resource (:func:`_covered`), made once for every category; the
    # previous task's end only for each resource's first task (:func:`_task_and_gap_cover`)
    res_key = res[sub].astype(np.int64) << T_SHIFT
    e_ns = np.clip((end[sub] * 1e3).astype(np.int64), 0, (1 << T_SHIFT) - 1)
    s_key = res_key + np.clip((start[sub] * 1e3).astype(np.int64), 0, (1 << T_SHIFT) - 1)
    first_s = first[sub]
    at_f = sub[first_s]
    p_first = res_key[first_s] + np.where(at_f > 0, np.clip((end[at_f - 1] * 1e3).astype(np.int64), 0,
                                                            (1 << T_SHIFT) - 1), 0)
    e_key = res_key + e_ns
    del res_key, e_ns
    host = (rk == 0) & (kind == K_HOST)
    host_s, first_gap_s = host[sub], host[sub] & ~first_s
    cover: dict[str, np.ndarray] = {}
    gap_cover: dict[str, np.ndarray] = {}
    zero: set[str] = set()  # categories with no range: all-zero gap cover
    for ci, cname in enumerate(CATEGORIES):
        if cname == "launch":
            continue
        code = 4 if cname == "matmul_fp32" else ci
        m = (cat == code) & (r_res >= 0)
        cover[cname], gap_cover[cname] = np.zeros(n), np.zeros(n)
        if not m.any():  # calloc'd zeros: no memory until written (most runs have no ranges of most kinds)
            zero.add(cname)
            continue
        u = _union_cover(r_res[m], lo[m], hi[m])
        c_task, c_gap = _task_and_gap_cover(u, s_key, e_key, first_s, p_first)
        cover[cname][sub] = np.where(host_s, c_task, 0.0)
        gap_cover[cname][sub] = np.where(first_gap_s, np.clip(c_gap, 0, None), 0.0)
    # the fp32 matrix-math kernels (GPU runs: GEMM, convolution, attention on CUDA cores): the whole kernel
    zero_cover = {*zero, "launch"}  # the task covers known all zero (calloc'd: _join_chunks reads none of them)
    if mode == "gpu":
        fp32 = np.isin(prec, (P_MM_FP32, P_ATTN_FP32))
        cover["matmul_fp32"] = np.where(fp32, end - start, 0.0) if fp32.any() else np.zeros(n)
        zero_cover = (zero_cover - {"matmul_fp32"}) | (set() if fp32.any() else {"matmul_fp32"})
    # launch overhead: the gap between two kernel launches of one thread, outside dataloader/compile ranges
    is_launch = flag == 2
    prev_launch = np.concatenate([[False], is_launch[:-1]])
    lg = host & ~first & is_launch & prev_launch & (mode == "gpu")
    gap_cover["launch"] = np.where(lg, np.clip(gap - gap_cover["dataloader"] - gap_cover["compile"]
                                               - gap_cover["allocator"], 0, None), 0.0)
    cover["launch"] = np.zeros(n)
    return cover, gap_cover, _gap_labels(gap_cover, zero, gap, ~host | first), {"cover": zero_cover, "gap_cover": zero}


def _gap_labels(gap_cover: dict[str, np.ndarray], zero: set[str], gap: np.ndarray, none: np.ndarray) -> np.ndarray:
    """Each gap's label (int8 code into :data:`GAP_LABELS`): the category covering most of it, if over half; -1
    where ``none``. ``zero``: the categories whose cover is all zero (skipped: 0 never wins)."""
    n = gap.size
    label = np.zeros(n, np.int8)
    best = np.zeros(n)
    half = 0.5 * gap
    for code, cname in enumerate(GAP_LABELS[1:], start=1):
        if cname in zero:  # 0 never beats max(best, gap / 2) >= 0, nor raises best
            continue
        c = gap_cover[cname]
        better = c > np.maximum(best, half)
        label[better] = code
        best = np.maximum(best, c)
    label[none] = -1
    return label


def _task_and_gap_cover(u, s_key: np.ndarray, e_key: np.ndarray, first: np.ndarray, p_first: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(µs of each task, µs of the gap before it) covered by the union ``u`` (:func:`_union_cover`); keys as
    :func:`_covered` reads them, ``p_first`` the previous task's end keyed on the resource of each resource's
    ``first`` task. For the other tasks the previous task's end is on their resource: its cover is the previous
    task's, so the tasks are searched twice, not three times."""
    at_start, at_end = _covered(u, s_key), _covered(u, e_key)
    at_prev = np.concatenate([[0], at_end[:-1]])
    at_prev[first] = _covered(u, p_first)
    return (at_end - at_start) / 1e3, (at_start - at_prev) / 1e3


def _rows_of(res: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``res`` (sorted) equal to one of ``ids`` (sorted, distinct), ascending."""
    if not ids.size:
        return np.zeros(0, np.intp)
    lo, hi = np.searchsorted(res, ids, side="left"), np.searchsorted(res, ids, side="right")
    n = hi - lo
    # each row's offset from its run's start, plus that start
    return np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(int(n.sum()))


def _union_cover(keys: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Disjoint union of intervals per key (key << T_SHIFT + ns): returns (starts, ends, cumulative covered ns
    before each interval) in one sorted key space, for :func:`_covered`."""
    if lo.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = keys.astype(np.int64) << T_SHIFT
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


def _covered(cover, x: np.ndarray) -> np.ndarray:
    """Covered ns up to each time ``x`` (key << T_SHIFT + ns) in the union built by :func:`_union_cover`."""
    starts, ends, before = cover
    if starts.size == 0:
        return np.zeros(x.size, dtype=np.int64)
    i = np.searchsorted(starts, x, side="right") - 1
    ok = i >= 0
    ic = np.clip(i, 0, None)
    inside = np.minimum(x, ends[ic]) - starts[ic]
    return np.where(ok, before[ic] + np.clip(inside, 0, None), 0)
