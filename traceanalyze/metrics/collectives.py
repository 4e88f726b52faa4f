"""Collectives matched across ranks: wait vs transfer, algbw/busbw, clock offsets, who arrives last.

A *call* is one collective on one rank: an NCCL/RCCL kernel (GPU mode) or a ``gloo:<op>`` range (CPU mode,
whose duration includes waiting for peers). Calls are matched across ranks as the n-th call of the same
operation and size (``collective``, ``nelems``) on each rank, in start order.

For a matched call (nccl-tests ``PERFORMANCE.md`` conventions):

- transfer ≈ the shortest duration across ranks (the last rank to arrive waits for nobody);
- wait on rank r = its duration − transfer, the head of the call before the last rank arrives; a rank's wait
  time is the union of these intervals (DDP buckets on separate threads wait at the same time);
- algbw = bytes / transfer (GB/s = 1e9 B/s); busbw = algbw × factor, factor = 2(n−1)/n for all_reduce,
  (n−1)/n for all_gather, reduce_scatter, all_to_all, 1 for broadcast, reduce, send/recv;
  bytes for all_gather/reduce_scatter count the full (n × per-rank) buffer.

Clock offsets: all ranks leave a collective together, so rank r's offset is the median over matched calls of
(end on r − end on the reference rank, the lowest present). Ranks on one host have offsets near 0; ranks on
other hosts can be off by ms. Arrival order uses starts minus offsets; the rank that arrives last most often
is the one the others wait for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from traceanalyze.metrics.breakdown import clip, kernel_classes, length

DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "int": 4, "int32": 4, "i32": 4, "u32": 4, "uint32": 4,
    "bfloat16": 2, "c10::bfloat16": 2, "bf16": 2, "__nv_bfloat16": 2, "half": 2, "c10::half": 2, "f16": 2,
    "float16": 2, "double": 8, "float64": 8, "f64": 8, "long": 8, "long int": 8, "int64": 8, "i64": 8,
    "u64": 8, "int8": 1, "int8_t": 1, "i8": 1, "u8": 1, "uint8": 1, "unsigned char": 1, "char": 1, "byte": 1,
    "bool": 1, "f8e4m3": 1, "f8e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

_OPS = {  # normalised collective name -> busbw factor as a function of n
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}


def normalize_collective(name: str) -> str:
    """``ncclKernel_AllReduce_RING_LL_Sum_float`` / ``allreduce`` / ``gloo:all_reduce`` -> ``all_reduce``."""
    n = name.lower()
    n = re.sub(r"^(gloo|nccl|c10d)[:_]+", "", n)
    n = re.sub(r"^(ncclkernel_|nccldevkernel_|kernel_|devkernel_)", "", n)
    flat = n.replace("_", "")
    for key in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv", "barrier",
                "reduce", "send", "recv"):
        if flat.startswith(key) or key in flat[:20]:
            return {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                    "alltoall": "all_to_all", "sendrecv": "send_recv", "send": "send_recv",
                    "recv": "send_recv"}.get(key, key)
    return n.split("(")[0][:40]


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor for ``collective`` on ``n`` ranks (1.0 when unknown or n < 2)."""
    if n < 2:
        return 1.0
    f = _OPS.get(collective)
    return f(n) if f else 1.0


def _dtype_bytes(dtype: str | None) -> int | None:
    if not dtype:
        return None
    return DTYPE_BYTES.get(dtype.strip().lower())


def _kernel_dtype(name: str) -> str | None:
    """Element type from an NCCL kernel name: ``..._Sum_float(`` or ``..._Sum_bf16_RING_LL``."""
    m = re.search(r"_(?:Sum|Prod|Max|Min|Avg|PreMulSum|SumPostDiv)_([A-Za-z0-9_]+?)(?:_RING|_TREE|_NVLS|_COLLNET|\(|$)",
                  name)
    return m.group(1) if m else None


@dataclass
class Calls:
    """The collective calls of one run as NumPy columns of equal length, sorted by rank, then start.

    ``rank``, ``nelems``, ``nbytes``, ``group_size``, ``start``, ``end``: int64 (times in ns); ``op``: the
    normalised name (object array of str). ``nelems``/``nbytes`` are 0 where ``has_nelems``/``has_bytes`` is
    False (not known); ``group_size`` is 0 when not known.
    """

    rank: np.ndarray
    op: np.ndarray
    nelems: np.ndarray
    has_nelems: np.ndarray
    nbytes: np.ndarray
    has_bytes: np.ndarray
    group_size: np.ndarray
    start: np.ndarray
    end: np.ndarray


@dataclass
class CollectiveSummary:
    """Per operation and message size: matched calls across ranks (µs, bytes, GB/s)."""

    collective: str
    size_bytes: int | None
    count: int
    n_ranks: int
    transfer_us: float  # mean transfer time of one call
    wait_us: float  # mean wait per rank per call
    algbw_gbps: float | None
    busbw_gbps: float | None


@dataclass
class CollectiveAnalysis:
    """What :func:`analyze_collectives` returns. Per-rank dicts are keyed by rank (µs)."""

    mode: str
    matched: bool  # calls could be matched across ≥ 2 ranks
    summaries: list[CollectiveSummary] = field(default_factory=list)
    wait_us: dict[int, float] = field(default_factory=dict)
    transfer_us: dict[int, float] = field(default_factory=dict)
    last_arrivals: dict[int, int] = field(default_factory=dict)
    n_matched_calls: int = 0
    clock_offsets_us: dict[int, float] = field(default_factory=dict)
    total_bytes: int = 0
    busbw_gbps: float | None = None  # transfer-time-weighted over all sized calls
    per_step_wait_us: dict[tuple[int, int], float] = field(default_factory=dict)  # (rank, step) -> wait


def _calls(con: duckdb.DuckDBPyConnection, run_id: int, mode: str) -> Calls:
    """The run's collective calls: NCCL/RCCL kernels (GPU mode) or ``gloo:*`` ranges (CPU mode)."""
    if mode == "gpu":
        comm = [name for name, klass in kernel_classes(con, run_id).items() if klass == "communication"]
        res = con.execute("""
            SELECT f.rank, k.name, coalesce(nullif(m.collective, ''), k.name) AS coll, m.in_nelems, m.out_nelems,
                   m.comm_dtype, m.group_size, k.ts_ns, k.ts_ns + k.dur_ns AS end_ns
            FROM kernels k JOIN files f USING (file_id)
            LEFT JOIN comm_events m ON m.file_id = k.file_id AND m.source = 'kernels' AND m.ts_ns = k.ts_ns
                 AND m.name = k.name AND m.correlation IS NOT DISTINCT FROM k.correlation
            WHERE f.run_id = ? AND k.cat = 'kernel' AND k.name IN (SELECT unnest(?))
            ORDER BY f.rank, k.ts_ns""", [run_id, comm]).fetchnumpy()
        # the string helpers run once per distinct value: thousands of calls share a handful of names
        op = _apply(res["coll"].tolist(), normalize_collective, object)
        inn, has_in = _int_column(res["in_nelems"])
        outn, has_out = _int_column(res["out_nelems"])
        # all_gather counts the gathered output (the full buffer); other ops their input, else the output
        use_out = ((op == "all_gather") & has_out & (outn != 0)) | ~has_in
        nelems = np.where(use_out, outn, inn)
        has_nelems = np.where(use_out, has_out, has_in)
        # element size: the record's dtype, else the one in the kernel name (..._Sum_bf16_...); 0 when unknown
        by_dtype = _apply(res["comm_dtype"].tolist(), lambda dt: _dtype_bytes(dt) or 0, np.int64)
        by_name = _apply(res["name"].tolist(), lambda n: _dtype_bytes(_kernel_dtype(n)) or 0, np.int64)
        size = np.where(by_dtype > 0, by_dtype, by_name)
        group_size = _int_column(res["group_size"])[0]
    else:
        res = con.execute("""
            SELECT f.rank, c.name, c.input_dims, c.input_types, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns
            FROM cpu_ops c JOIN files f USING (file_id)
            WHERE f.run_id = ? AND c.cat = 'user_annotation' AND c.name LIKE 'gloo:%'
            ORDER BY f.rank, c.ts_ns""", [run_id]).fetchnumpy()
        op = _apply(res["name"].tolist(), normalize_collective, object)
        dims, code = _factorize(res["input_dims"].tolist())
        numel = [_numel(d) for d in dims]
        has_nelems = np.array([n is not None for n in numel], dtype=bool)[code]
        nelems = np.array([n or 0 for n in numel], dtype=np.int64)[code]
        size = _apply(res["input_types"].tolist(), lambda t: _first_dtype_bytes(t) or 0, np.int64)
        group_size = np.zeros(op.size, dtype=np.int64)
    has_bytes = has_nelems & (size > 0)
    return Calls(rank=np.asarray(res["rank"], dtype=np.int64), op=op, nelems=nelems, has_nelems=has_nelems,
                 nbytes=np.where(has_bytes, nelems * size, 0), has_bytes=has_bytes, group_size=group_size,
                 start=np.asarray(res["ts_ns"], dtype=np.int64), end=np.asarray(res["end_ns"], dtype=np.int64))


def _factorize(values: Iterable) -> tuple[list, np.ndarray]:
    """(the distinct values in order of first appearance, each value's index into that list as int64)."""
    index: dict = {}
    codes = [index.setdefault(v, len(index)) for v in values]
    return list(index), np.array(codes, dtype=np.int64)


def _apply(values: list, fn: Callable[[Any], Any], dtype: type) -> np.ndarray:
    """``fn`` of each value as a NumPy array of ``dtype``, calling ``fn`` once per distinct value."""
    distinct, codes = _factorize(values)
    return np.array([fn(v) for v in distinct], dtype=dtype)[codes] if distinct else np.array([], dtype=dtype)


def _int_column(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values with NULL read as 0, not-NULL mask) of an integer column from ``fetchnumpy``."""
    return np.ma.filled(col, 0).astype(np.int64), ~np.ma.getmaskarray(col)


def _numel(dims_json: str | None) -> int | None:
    """Elements of the first tensor in an ``Input Dims`` JSON list (``[[132992]]`` -> 132992)."""
    if not dims_json:
        return None
    try:
        d = json.loads(dims_json)
    except ValueError:
        return None
    while isinstance(d, list) and d and isinstance(d[0], list):
        if all(isinstance(x, int) for x in d[0]):
            d = d[0]
            break
        d = d[0]
    if isinstance(d, list) and d and all(isinstance(x, int) and x >= 0 for x in d):
        return int(np.prod(d, dtype=np.int64))
    return None


def _first_dtype_bytes(types_json: str | None) -> int | None:
    if not types_json:
        return None
    try:
        t = json.loads(types_json)
    except ValueError:
        return None
    if isinstance(t, list) and t and isinstance(t[0], str):
        return _dtype_bytes(t[0])
    return None


def analyze_collectives(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world_size: int | None,
                        steps: dict[int, list[tuple[int, int, int]]] | None = None) -> CollectiveAnalysis:
    """Match collective calls across the run's ranks and split their time into wait and transfer.

    Args:
        con: the store. run_id: the run. mode: ``"gpu"`` or ``"cpu"`` (see :mod:`.breakdown`).
        world_size: ranks in the job, for the busbw factor when calls carry no ``Group size``.
        steps: rank -> [(step, start_ns, end_ns)], to attribute wait to profiler steps.

    Returns:
        :class:`CollectiveAnalysis`; with a single rank present nothing can be matched (``matched`` False)
        and transfer is the call's own duration, an upper bound.
    """
    calls = _calls(con, run_id, mode)
    res = CollectiveAnalysis(mode=mode, matched=False)
    if not calls.start.size:
        return res
    ranks = np.unique(calls.rank)  # sorted: ranks[0] is the reference
    n_ranks = len(ranks)
    col = np.searchsorted(ranks, calls.rank)  # each call's rank as a column index
    # key (op, nelems), numbered in order of first appearance (the order summaries keep on ties)
    keys, key = _factorize(zip(calls.op.tolist(), calls.has_nelems.tolist(), calls.nelems.tolist(), strict=True))
    n_keys = len(keys)
    # occurrence: the call is the occ-th of its key on its rank (a stable sort keeps start order)
    order = np.lexsort((col, key))
    group = (key * n_ranks + col)[order]
    occ = np.empty_like(key)
    occ[order] = np.arange(order.size) - np.searchsorted(group, group)
    count = np.bincount(key * n_ranks + col, minlength=n_keys * n_ranks).reshape(n_keys, n_ranks)
    # a key present on every rank (≥ 2) is matched: its first min(count) calls on each rank pair up, in order
    n_occ = count.min(axis=1) if n_ranks >= 2 else np.zeros(n_keys, dtype=np.int64)
    first_match = np.concatenate(([0], np.cumsum(n_occ)[:-1]))
    n_match = int(n_occ.sum())
    in_match = occ < n_occ[key]
    match = (first_match[key] + occ)[in_match]  # the match (row below) of each call in one
    # one row per match, one column per rank (ns)
    starts = np.zeros((n_match, n_ranks), dtype=np.int64)
    ends = np.zeros((n_match, n_ranks), dtype=np.int64)
    starts[match, col[in_match]] = calls.start[in_match]
    ends[match, col[in_match]] = calls.end[in_match]
    ref = np.zeros(n_match, dtype=np.int64)  # index of the reference rank's call of each match
    ref[match[col[in_match] == 0]] = np.flatnonzero(in_match & (col == 0))

    offsets = np.array([float(np.median(ends[:, i] - ends[:, 0])) if n_match else 0.0 for i in range(n_ranks)])
    res.clock_offsets_us = {int(r): round(float(o) / 1e3, 3) for r, o in zip(ranks, offsets, strict=True)}
    res.matched = n_match > 0
    res.n_matched_calls = n_match
    durs = ends - starts
    transfer = durs.min(axis=1)
    last = np.argmax(starts - offsets, axis=1)  # arrival = start minus clock offset; ties: the lower rank
    res.last_arrivals = {int(ranks[i]): int(n) for i, n in enumerate(np.bincount(last, minlength=n_ranks)) if n}

    # transfer per rank: a matched call counts its match's transfer, a call of an unmatched key its own duration
    # (an upper bound). Added one by one in key, then start order (cumsum; np.sum pairs), as earlier versions did,
    # so the float totals stay the same.
    counted = in_match | (n_occ == 0)[key]
    t_ns = calls.end - calls.start
    t_ns[in_match] = transfer[match]
    for i, r in enumerate(ranks):
        mine = order[(col[order] == i) & counted[order]]
        if mine.size:
            res.transfer_us[int(r)] = float(np.cumsum(t_ns[mine] / 1e3)[-1])
    if n_match:
        # concurrent calls (DDP buckets on separate threads) wait at the same time: count wall time, not the sum
        for i, r in enumerate(ranks):
            w_s, w_e = starts[:, i], ends[:, i] - transfer  # the wait: the head of the call, before the last rank
            res.wait_us[int(r)] = length(w_s, w_e) / 1e3
            for step, s, e in (steps or {}).get(int(r), []):
                cs, ce = clip(w_s, w_e, s, e)
                res.per_step_wait_us[(int(r), step)] = length(cs, ce) / 1e3

    agg = []  # per matched key, in key order
    for k in np.flatnonzero(n_occ):
        rows = slice(first_match[k], first_match[k] + n_occ[k])
        r0 = ref[first_match[k]]  # the reference rank's first call of the key
        agg.append({"op": keys[k][0], "n": int(n_occ[k]), "t": float(transfer[rows].sum()),
                    "w": float((durs[rows].sum(axis=1) - transfer[rows] * n_ranks).sum()),
                    "bytes": int(calls.nbytes[r0]) if calls.has_bytes[r0] else None,
                    "group": int(calls.group_size[r0]) or world_size or n_ranks})
    for a in sorted(agg, key=lambda a: -a["t"]):
        t_us = a["t"] / a["n"] / 1e3
        alg = a["bytes"] / (a["t"] / a["n"] / 1e9) / 1e9 if a["bytes"] and a["t"] > 0 else None
        res.summaries.append(CollectiveSummary(
            collective=a["op"], size_bytes=a["bytes"], count=a["n"], n_ranks=n_ranks, transfer_us=round(t_us, 3),
            wait_us=round(a["w"] / a["n"] / n_ranks / 1e3, 3),
            algbw_gbps=round(alg, 4) if alg is not None else None,
            busbw_gbps=round(alg * busbw_factor(a["op"], a["group"]), 4) if alg is not None else None))
    # sized calls: the reference rank's call has bytes, the transfer took time, and it is not a barrier
    sized = calls.has_bytes[ref] & (calls.nbytes[ref] != 0) & (transfer > 0) & (calls.op[ref] != "barrier")
    total_t = float(transfer[sized].sum())
    res.total_bytes = int(calls.nbytes[ref][sized].sum())
    if total_t > 0:
        group = world_size or n_ranks
        # busbw of all sized calls together, weighting each by its transfer time (factor of the dominant op)
        main_op = max(agg, key=lambda a: a["t"])["op"]
        res.busbw_gbps = round(res.total_bytes / (total_t / 1e9) / 1e9 * busbw_factor(main_op, group), 4)
    return res
