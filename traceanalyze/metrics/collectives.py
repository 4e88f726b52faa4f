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
from dataclasses import dataclass, field

import duckdb
import numpy as np

from traceanalyze.metrics.breakdown import clip, length

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
class Call:
    """One collective call on one rank (ns)."""

    rank: int
    op: str
    nelems: int | None
    nbytes: int | None
    group_size: int | None
    start: int
    end: int


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


def _calls(con: duckdb.DuckDBPyConnection, run_id: int, mode: str) -> list[Call]:
    if mode == "gpu":
        rows = con.execute("""
            SELECT f.rank, k.name, m.collective, m.in_nelems, m.out_nelems, m.comm_dtype, m.group_size,
                   k.ts_ns, k.ts_ns + k.dur_ns
            FROM kernels k JOIN files f USING (file_id)
            LEFT JOIN comm_events m ON m.file_id = k.file_id AND m.source = 'kernels' AND m.ts_ns = k.ts_ns
                 AND m.name = k.name AND m.correlation IS NOT DISTINCT FROM k.correlation
            WHERE f.run_id = ? AND k.cat = 'kernel' AND kernel_class(k.cat, k.name) = 'communication'
            ORDER BY f.rank, k.ts_ns""", [run_id]).fetchall()
        out = []
        for rank, name, coll, inn, outn, dt, gs, s, e in rows:
            op = normalize_collective(coll or name)
            nel = outn if op == "all_gather" and outn else (inn if inn is not None else outn)
            size = _dtype_bytes(dt) or _dtype_bytes(_kernel_dtype(name))
            out.append(Call(rank, op, nel, nel * size if nel is not None and size else None, gs, s, e))
        return out
    rows = con.execute("""
        SELECT f.rank, c.name, c.input_dims, c.input_types, c.ts_ns, c.ts_ns + c.dur_ns
        FROM cpu_ops c JOIN files f USING (file_id)
        WHERE f.run_id = ? AND c.cat = 'user_annotation' AND c.name LIKE 'gloo:%'
        ORDER BY f.rank, c.ts_ns""", [run_id]).fetchall()
    out = []
    for rank, name, dims, types, s, e in rows:
        op = normalize_collective(name)
        nel = _numel(dims)
        size = _first_dtype_bytes(types)
        out.append(Call(rank, op, nel, nel * size if nel is not None and size else None, None, s, e))
    return out


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
    if not calls:
        return res
    ranks = sorted({c.rank for c in calls})
    by_key: dict[tuple[str, int | None], dict[int, list[Call]]] = {}
    for c in calls:
        by_key.setdefault((c.op, c.nelems), {}).setdefault(c.rank, []).append(c)
    ref = ranks[0]
    diffs: dict[int, list[float]] = {r: [] for r in ranks}
    matches: list[tuple[tuple[str, int | None], dict[int, Call]]] = []
    for key, per_rank in by_key.items():
        n_occ = min(len(v) for v in per_rank.values()) if len(per_rank) == len(ranks) else 0
        if len(ranks) < 2 or n_occ == 0:
            for r, lst in per_rank.items():  # unmatched: duration is an upper bound on transfer
                for c in lst:
                    res.transfer_us[r] = res.transfer_us.get(r, 0.0) + (c.end - c.start) / 1e3
            continue
        for i in range(n_occ):
            m = {r: per_rank[r][i] for r in ranks}
            matches.append((key, m))
            for r in ranks:
                diffs[r].append(m[r].end - m[ref].end)
    offsets = {r: float(np.median(diffs[r])) if diffs[r] else 0.0 for r in ranks}
    res.clock_offsets_us = {r: round(o / 1e3, 3) for r, o in offsets.items()}
    res.matched = bool(matches)
    res.n_matched_calls = len(matches)
    agg: dict[tuple[str, int | None], dict] = {}
    total_t, total_b = 0.0, 0
    wait_iv: dict[int, list[tuple[int, int]]] = {r: [] for r in ranks}
    for key, m in matches:
        durs = {r: m[r].end - m[r].start for r in ranks}
        transfer = min(durs.values())
        arrival = {r: m[r].start - offsets[r] for r in ranks}
        last = max(arrival, key=arrival.get)
        res.last_arrivals[last] = res.last_arrivals.get(last, 0) + 1
        for r in ranks:
            # the wait is the head of the call, before the last rank arrives
            wait_iv[r].append((m[r].start, m[r].start + durs[r] - transfer))
            res.transfer_us[r] = res.transfer_us.get(r, 0.0) + transfer / 1e3
        a = agg.setdefault(key, {"n": 0, "t": 0.0, "w": 0.0, "bytes": m[ref].nbytes,
                                 "group": m[ref].group_size or world_size or len(ranks)})
        a["n"] += 1
        a["t"] += transfer
        a["w"] += sum(durs.values()) - transfer * len(ranks)
        if m[ref].nbytes and transfer > 0 and key[0] != "barrier":
            total_t += transfer
            total_b += m[ref].nbytes
    # concurrent calls (DDP buckets on separate threads) wait at the same time: count wall time, not the sum
    for r, iv in wait_iv.items():
        if not iv:
            continue
        a_s = np.array([x[0] for x in iv], dtype=np.int64)
        a_e = np.array([x[1] for x in iv], dtype=np.int64)
        res.wait_us[r] = length(a_s, a_e) / 1e3
        for step, s, e in (steps or {}).get(r, []):
            cs, ce = clip(a_s, a_e, s, e)
            res.per_step_wait_us[(r, step)] = length(cs, ce) / 1e3
    for (op, _nel), a in sorted(agg.items(), key=lambda kv: -kv[1]["t"]):
        t_us = a["t"] / a["n"] / 1e3
        alg = a["bytes"] / (a["t"] / a["n"] / 1e9) / 1e9 if a["bytes"] and a["t"] > 0 else None
        res.summaries.append(CollectiveSummary(
            collective=op, size_bytes=a["bytes"], count=a["n"], n_ranks=len(ranks), transfer_us=round(t_us, 3),
            wait_us=round(a["w"] / a["n"] / len(ranks) / 1e3, 3),
            algbw_gbps=round(alg, 4) if alg is not None else None,
            busbw_gbps=round(alg * busbw_factor(op, a["group"]), 4) if alg is not None else None))
    res.total_bytes = total_b
    if total_t > 0:
        group = world_size or len(ranks)
        # busbw of all sized calls together, weighting each by its transfer time (factor of the dominant op)
        main_op = max(agg.items(), key=lambda kv: kv[1]["t"])[0][0]
        res.busbw_gbps = round(total_b / (total_t / 1e9) / 1e9 * busbw_factor(main_op, group), 4)
    return res
