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

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from traceanalyze.limits import MAX_COLLECTIVE_ELEMENTS
from traceanalyze.metrics.breakdown import clip, kernel_classes, length
from traceanalyze.metrics.precision import dtype_bytes, first_input_bytes, record_json

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
    # a kernel of no NCCL name (DeepEP, NVSHMEM, ...): its qualified name without return type, template and
    # parameters (``void deep_ep::intranode::dispatch<8, 768>(…)`` -> ``deep_ep::intranode::dispatch``)
    return re.split(r"[<(]", re.sub(r"^void\s+", "", n), maxsplit=1)[0][:40]


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor for ``collective`` on ``n`` ranks (1.0 when unknown or n < 2)."""
    if n < 2:
        return 1.0
    f = _OPS.get(collective)
    return f(n) if f else 1.0


def nccl_kernel_dtype(name: str) -> str | None:
    """Element type from an NCCL kernel name: ``..._Sum_float(`` or ``..._Sum_bf16_RING_LL``."""
    m = re.search(r"_(?:Sum|Prod|Max|Min|Avg|PreMulSum|SumPostDiv)_([A-Za-z0-9_]+?)(?:_RING|_TREE|_NVLS|_COLLNET|\(|$)",
                  name)
    return m.group(1) if m else None


@dataclass
class Calls:
    """The collective calls of one run as NumPy columns of equal length, sorted by rank, then start.

    ``rank``, ``file_id``, ``nelems``, ``nbytes``, ``group_size``, ``start``, ``end``: int64 (times in ns); ``op``:
    the normalised name (object array of str). ``nelems``/``nbytes`` are 0 where ``has_nelems``/``has_bytes`` is
    False (not known); ``group_size`` is 0 when not known. ``groups`` (only when asked for, GPU mode) holds the
    records' ``pg_name``, ``seq``, ``pg_ranks`` and ``comms_id`` columns as fetched.
    """

    rank: np.ndarray
    file_id: np.ndarray
    op: np.ndarray
    nelems: np.ndarray
    has_nelems: np.ndarray
    nbytes: np.ndarray
    has_bytes: np.ndarray
    group_size: np.ndarray
    start: np.ndarray
    end: np.ndarray
    groups: dict[str, np.ndarray] | None = None


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


def communication_kernels(con: duckdb.DuckDBPyConnection, run_id: int) -> list[str]:
    """Names of the run's communication kernels (the ``kernel_class`` macro once per distinct name)."""
    return [name for name, klass in kernel_classes(con, run_id).items() if klass == "communication"]


def communication_names(con: duckdb.DuckDBPyConnection, names: list[str | None]) -> set[str]:
    """The communication kernels among ``names`` (``kernel``-category kernel names; None skipped), by the rule
    :func:`communication_kernels` applies to a run's: for a caller that holds its names already (the replay graph's
    chunks: a few hundred names, not a read of the run's kernels)."""
    if not names:
        return set()
    return {n for n, c in con.execute("SELECT n, kernel_class('kernel', n) = 'communication' FROM "
                                      "unnest(?::VARCHAR[]) t(n) WHERE n IS NOT NULL", [names]).fetchall() if c}


# A collective call with what its record says: GPU mode an NCCL/RCCL kernel and its comm_events row (matched on
# file, start, name and correlation); CPU mode a gloo:* range. Parameters: the run id, then (GPU) the names of the
# communication kernels; {groups} adds the process-group columns.
_GPU_CALLS_SQL = """
    SELECT f.rank, k.file_id, k.name, k.correlation, coalesce(nullif(m.collective, ''), k.name) AS coll, m.in_nelems,
           m.out_nelems, m.comm_dtype, m.group_size, {groups}k.ts_ns, k.ts_ns + k.dur_ns AS end_ns
    FROM kernels k JOIN files f USING (file_id)
    LEFT JOIN comm_events m ON m.file_id = k.file_id AND m.source = 'kernels' AND m.ts_ns = k.ts_ns
         AND m.name = k.name AND m.correlation IS NOT DISTINCT FROM k.correlation
    WHERE f.run_id = ? AND f.rank IS NOT NULL AND k.cat = 'kernel' AND k.name IN (SELECT unnest(?))
    ORDER BY f.rank, k.ts_ns"""
_GPU_GROUP_COLUMNS = "m.pg_name, m.seq, m.pg_ranks, m.comms_id, "
_CPU_CALLS_SQL = """
    SELECT f.rank, c.file_id, c.name, c.input_dims, c.input_types, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns
    FROM cpu_ops c JOIN files f USING (file_id)
    WHERE f.run_id = ? AND f.rank IS NOT NULL AND c.cat = 'user_annotation' AND c.name LIKE 'gloo:%'
    ORDER BY f.rank, c.ts_ns"""


def collective_calls(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, *,
                     groups: bool = False) -> Calls:
    """The run's collective calls (:class:`Calls`): NCCL/RCCL kernels (GPU mode) or ``gloo:*`` ranges (CPU mode).

    Message size: GPU mode, the record's element count (all_gather: the gathered output, the full buffer; other
    operations their input, else the output) times the element size of the record's dtype, else of the dtype in
    the kernel name (``..._Sum_bf16_...``); CPU mode, the first input tensor's ``Input Dims`` and ``Input type``.
    ``groups`` also fetches the process-group columns (GPU mode).
    """
    if mode == "gpu":
        sql = _GPU_CALLS_SQL.format(groups=_GPU_GROUP_COLUMNS if groups else "")
        res = con.execute(sql, [run_id, communication_kernels(con, run_id)]).fetchnumpy()
        # the string helpers run once per distinct value: thousands of calls share a handful of names
        op = apply_distinct(res["coll"].tolist(), normalize_collective, object)
        _name_send_recv_by_annotation(con, run_id, res, op)
        nelems, has_nelems, size = _gpu_message_sizes(res, op)
        group_size = int_column(res["group_size"])[0]
        group_cols = {c: res[c] for c in ("pg_name", "seq", "pg_ranks", "comms_id")} if groups else None
    else:
        res = con.execute(_CPU_CALLS_SQL, [run_id]).fetchnumpy()
        op = apply_distinct(res["name"].tolist(), normalize_collective, object)
        dims, code = factorize(res["input_dims"].tolist())
        n = [numel(d) for d in dims]
        has_nelems = np.array([x is not None for x in n], dtype=bool)[code]
        nelems = np.array([x or 0 for x in n], dtype=np.int64)[code]
        size = apply_distinct(res["input_types"].tolist(), lambda t: first_input_bytes(t) or 0, np.int64)
        group_size = np.zeros(op.size, dtype=np.int64)
        group_cols = None
    has_bytes = has_nelems & (size > 0)
    # nelems ≤ MAX_COLLECTIVE_ELEMENTS and size ≤ 16 bytes: nelems * size stays far inside int64
    return Calls(rank=np.asarray(res["rank"], dtype=np.int64), file_id=np.asarray(res["file_id"], dtype=np.int64),
                 op=op, nelems=nelems, has_nelems=has_nelems, nbytes=np.where(has_bytes, nelems * size, 0),
                 has_bytes=has_bytes, group_size=group_size, start=np.asarray(res["ts_ns"], dtype=np.int64),
                 end=np.asarray(res["end_ns"], dtype=np.int64), groups=group_cols)


# The ``nccl:*`` annotation (``record_function``, older PyTorch) around the launch of each of the run's SendRecv
# kernels that carry no "Collective name": parameters the run id and the kernels' (file, correlation) pairs.
_SEND_RECV_ANNOTATION_SQL = """
    WITH k AS (SELECT unnest(?) AS file_id, unnest(?) AS correlation),
    launch AS (SELECT c.file_id, c.correlation, c.tid, c.ts_ns FROM cpu_ops c JOIN k USING (file_id, correlation)
               WHERE c.cat IN ('cuda_runtime', 'cuda_driver')),
    ann AS (SELECT c.file_id, c.tid, c.ts_ns, c.ts_ns + c.dur_ns AS end_ns, c.name FROM cpu_ops c
            JOIN files f USING (file_id)
            WHERE f.run_id = ? AND c.cat = 'user_annotation' AND c.name LIKE 'nccl:%')
    SELECT l.file_id, l.correlation, arg_max(a.name, a.ts_ns) AS name FROM launch l
    JOIN ann a ON a.file_id = l.file_id AND a.tid = l.tid AND a.ts_ns <= l.ts_ns AND l.ts_ns < a.end_ns
    GROUP BY ALL"""


def _name_send_recv_by_annotation(con: duckdb.DuckDBPyConnection, run_id: int, res: dict[str, np.ndarray],
                                  op: np.ndarray) -> None:
    """Rename in place (``op``: normalised names of the rows of ``res``, :data:`_GPU_CALLS_SQL`) the SendRecv kernels
    without a "Collective name" after the innermost ``nccl:*`` annotation around their launch (same file and
    thread): NCCL runs ``all_to_all`` as grouped send/recv, one ``ncclKernel_SendRecv`` per rank, and older
    PyTorch names the collective only in that annotation (``nccl:all_to_all``). A kernel without one stays
    ``send_recv`` (a point-to-point transfer)."""
    bare = np.flatnonzero((op == "send_recv") & np.asarray([c == n for c, n in zip(
        res["coll"].tolist(), res["name"].tolist(), strict=True)], dtype=bool)) if op.size else np.zeros(0, np.int64)
    corr = np.ma.filled(res["correlation"], -1).astype(np.int64) if "correlation" in res else None
    if bare.size == 0 or corr is None:
        return
    fid = np.asarray(res["file_id"], dtype=np.int64)
    rows = con.execute(_SEND_RECV_ANNOTATION_SQL, [fid[bare].tolist(), corr[bare].tolist(), run_id]).fetchall()
    named = {(int(f), int(c)): normalize_collective(str(n)) for f, c, n in rows if n}
    for i in bare.tolist():
        new = named.get((int(fid[i]), int(corr[i])))
        if new in _OPS and new != "barrier":
            op[i] = new


def _gpu_message_sizes(res: dict[str, np.ndarray], op: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(elements, elements known, bytes per element or 0) of each NCCL call (:func:`collective_calls`)."""
    inn, has_in = int_column(res["in_nelems"])
    outn, has_out = int_column(res["out_nelems"])
    # all_gather counts the gathered output (the full buffer); other ops their input, else the output
    use_out = ((op == "all_gather") & has_out & (outn != 0)) | ~has_in
    nelems = np.where(use_out, outn, inn)
    # a count below 0 or beyond any real message is a corrupt field: unknown, so that bytes never wrap in int64
    plausible = (nelems >= 0) & (nelems <= MAX_COLLECTIVE_ELEMENTS)
    has_nelems = np.where(use_out, has_out, has_in) & plausible
    nelems = np.where(plausible, nelems, 0)
    # element size: the record's dtype, else the one in the kernel name (..._Sum_bf16_...); 0 when unknown
    by_dtype = apply_distinct(res["comm_dtype"].tolist(), lambda dt: dtype_bytes(dt) or 0, np.int64)
    by_name = apply_distinct(res["name"].tolist(), lambda n: dtype_bytes(nccl_kernel_dtype(n)) or 0, np.int64)
    return nelems, has_nelems, np.where(by_dtype > 0, by_dtype, by_name)


def factorize(values: Iterable) -> tuple[list, np.ndarray]:
    """(the distinct values in order of first appearance, each value's index into that list as int64)."""
    index: dict = {}
    codes = [index.setdefault(v, len(index)) for v in values]
    return list(index), np.array(codes, dtype=np.int64)


def apply_distinct(values: list, fn: Callable[[Any], Any], dtype: type) -> np.ndarray:
    """``fn`` of each value as a NumPy array of ``dtype``, calling ``fn`` once per distinct value."""
    distinct, codes = factorize(values)
    return np.array([fn(v) for v in distinct], dtype=dtype)[codes] if distinct else np.array([], dtype=dtype)


def int_column(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values with NULL read as 0, not-NULL mask) of an integer column from ``fetchnumpy``."""
    return np.ma.filled(col, 0).astype(np.int64), ~np.ma.getmaskarray(col)


def numel(dims_json: str | None) -> int | None:
    """Elements of the first tensor in an ``Input Dims`` JSON list (``[[132992]]`` -> 132992)."""
    d = record_json(dims_json)
    while isinstance(d, list) and d and isinstance(d[0], list):
        if all(isinstance(x, int) for x in d[0]):
            d = d[0]
            break
        d = d[0]
    if isinstance(d, list) and d and all(isinstance(x, int) and x >= 0 for x in d):
        n = math.prod(d)  # Python ints: no int64 wrap; a count beyond any real message is corrupt
        return n if n <= MAX_COLLECTIVE_ELEMENTS else None
    return None


@dataclass
class _Matches:
    """Calls matched across ranks (:func:`analyze_collectives`): the n-th call of one (op, size) key on every rank.

    Per call: ``col`` its rank's column (into ``ranks``, sorted: column 0 is the reference rank), ``key`` its index
    into ``keys`` (numbered in order of first appearance), ``in_match`` whether it is in a match and ``match`` (for
    those) the match's row. Per key: ``n_occ`` its matches (0: unmatched) and ``first_match`` its first row.
    ``order`` sorts the calls by key and column, start order kept. ``starts``/``ends``: (matches, ranks) ns;
    ``ref``: per match, the reference rank's call.
    """

    ranks: np.ndarray
    col: np.ndarray
    keys: list
    key: np.ndarray
    order: np.ndarray
    in_match: np.ndarray
    match: np.ndarray
    n_occ: np.ndarray
    first_match: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    ref: np.ndarray


def _match_calls(calls: Calls) -> _Matches:
    """Pair the n-th call of each (op, size) key across ranks, in start order (module docstring)."""
    ranks = np.unique(calls.rank)  # sorted: ranks[0] is the reference
    n_ranks = len(ranks)
    col = np.searchsorted(ranks, calls.rank)  # each call's rank as a column index
    # key (op, nelems), numbered in order of first appearance (the order summaries keep on ties)
    keys, key = factorize(zip(calls.op.tolist(), calls.has_nelems.tolist(), calls.nelems.tolist(), strict=True))
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
    return _Matches(ranks=ranks, col=col, keys=keys, key=key, order=order, in_match=in_match, match=match,
                    n_occ=n_occ, first_match=first_match, starts=starts, ends=ends, ref=ref)


@dataclass
class MatchedCalls:
    """The run's collective calls matched across its ranks, and each rank's clock offset (what
    :func:`match_collectives` returns; :func:`analyze_collectives` goes on from it)."""

    calls: Calls
    matches: _Matches | None  # None: no collective call
    offsets_ns: np.ndarray  # per rank of ``matches.ranks``: the median of its call ends minus the first rank's
    clock_offsets_us: dict[int, float]  # rank -> offset (µs), rounded to the ns


def match_collectives(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, *, groups: bool = False
                      ) -> MatchedCalls:
    """The run's collective calls (:func:`collective_calls`), matched across ranks, and each rank's clock offset:
    the median over matched calls of (its end − the first rank's end), ns and µs. The ranks of one collective
    finish it together once the last one has arrived (the assumption behind the wait/transfer split, straggler
    paper §3.2, as in :mod:`traceanalyze.replay.graph`), so what differs in the ends is the clocks. Needs no
    step: the what-if replay, which reads only the offsets, can start from it before the step metrics exist.
    Raises nothing of its own (DuckDB errors pass through). ``groups``: the calls carry their process-group columns
    (:func:`collective_calls`; the replay's graph, :mod:`traceanalyze.replay.graph`, then needs no query of its own)."""
    calls = collective_calls(con, run_id, mode, groups=groups)
    if not calls.start.size:
        return MatchedCalls(calls, None, np.zeros(0), {})
    m = _match_calls(calls)
    n_match = m.starts.shape[0]
    offsets = np.array([float(np.median(m.ends[:, i] - m.ends[:, 0])) if n_match else 0.0
                        for i in range(len(m.ranks))])
    return MatchedCalls(calls, m, offsets,
                        {int(r): round(float(o) / 1e3, 3) for r, o in zip(m.ranks, offsets, strict=True)})


def analyze_collectives(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world_size: int | None,
                        steps: dict[int, list[tuple[int, int, int]]] | None = None,
                        matched: MatchedCalls | None = None) -> CollectiveAnalysis:
    """Match collective calls across the run's ranks and split their time into wait and transfer.

    Args:
        con: the store. run_id: the run. mode: ``"gpu"`` or ``"cpu"`` (see :mod:`.breakdown`).
        world_size: ranks in the job, for the busbw factor when calls carry no ``Group size``.
        steps: rank -> [(step, start_ns, end_ns)], to attribute wait to profiler steps.
        matched: :func:`match_collectives` of this run, when the caller has it already.

    Returns:
        :class:`CollectiveAnalysis`; with a single rank present nothing can be matched (``matched`` False)
        and transfer is the call's own duration, an upper bound.
    """
    mc = match_collectives(con, run_id, mode) if matched is None else matched
    calls, m, offsets = mc.calls, mc.matches, mc.offsets_ns
    res = CollectiveAnalysis(mode=mode, matched=False)
    if m is None:
        return res
    ranks, n_ranks, n_match = m.ranks, len(m.ranks), m.starts.shape[0]
    res.clock_offsets_us = dict(mc.clock_offsets_us)
    res.matched = n_match > 0
    res.n_matched_calls = n_match
    durs = m.ends - m.starts
    transfer = durs.min(axis=1)
    last = np.argmax(m.starts - offsets, axis=1)  # arrival = start minus clock offset; ties: the lower rank
    res.last_arrivals = {int(ranks[i]): int(n) for i, n in enumerate(np.bincount(last, minlength=n_ranks)) if n}
    res.transfer_us = _transfer_per_rank(calls, m, transfer)
    if n_match:
        res.wait_us, res.per_step_wait_us = _wait_per_rank(m, transfer, steps or {})
    agg = _per_key(calls, m, transfer, durs, world_size)
    res.summaries = [_summary(a, n_ranks) for a in sorted(agg, key=lambda a: -a["t"])]
    res.total_bytes, res.busbw_gbps = _total_busbw(calls, m, transfer, agg, world_size)
    return res


def _transfer_per_rank(calls: Calls, m: _Matches, transfer: np.ndarray) -> dict[int, float]:
    """Rank -> transfer time (µs): a matched call counts its match's transfer, a call of an unmatched key its own
    duration (an upper bound). Added one by one in key, then start order (cumsum; np.sum pairs), as earlier
    versions did, so the float totals stay the same."""
    counted = m.in_match | (m.n_occ == 0)[m.key]
    t_ns = calls.end - calls.start
    t_ns[m.in_match] = transfer[m.match]
    out: dict[int, float] = {}
    for i, r in enumerate(m.ranks):
        mine = m.order[(m.col[m.order] == i) & counted[m.order]]
        if mine.size:
            out[int(r)] = float(np.cumsum(t_ns[mine] / 1e3)[-1])
    return out


def _wait_per_rank(m: _Matches, transfer: np.ndarray, steps: dict[int, list[tuple[int, int, int]]]
                   ) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
    """(rank -> wait µs, (rank, step) -> wait µs). Concurrent calls (DDP buckets on separate threads) wait at the
    same time: wall time counts, not the sum."""
    wait: dict[int, float] = {}
    per_step: dict[tuple[int, int], float] = {}
    for i, r in enumerate(m.ranks):
        w_s, w_e = m.starts[:, i], m.ends[:, i] - transfer  # the wait: the head of the call, before the last rank
        wait[int(r)] = length(w_s, w_e) / 1e3
        for step, s, e in steps.get(int(r), []):
            cs, ce = clip(w_s, w_e, s, e)
            per_step[(int(r), step)] = length(cs, ce) / 1e3
    return wait, per_step


def _per_key(calls: Calls, m: _Matches, transfer: np.ndarray, durs: np.ndarray, world_size: int | None
             ) -> list[dict]:
    """Per matched key, in key order: op, matches ``n``, summed transfer ``t`` and wait ``w`` (ns), the message
    ``bytes`` (the reference rank's first call) and the ``group`` size for the busbw factor."""
    n_ranks = len(m.ranks)
    agg = []
    for k in np.flatnonzero(m.n_occ):
        rows = slice(m.first_match[k], m.first_match[k] + m.n_occ[k])
        r0 = m.ref[m.first_match[k]]  # the reference rank's first call of the key
        agg.append({"op": m.keys[k][0], "n": int(m.n_occ[k]), "t": float(transfer[rows].sum()),
                    "w": float((durs[rows].sum(axis=1) - transfer[rows] * n_ranks).sum()),
                    "bytes": int(calls.nbytes[r0]) if calls.has_bytes[r0] else None,
                    "group": int(calls.group_size[r0]) or world_size or n_ranks})
    return agg


def _summary(a: dict, n_ranks: int) -> CollectiveSummary:
    """One key's :class:`CollectiveSummary` from its :func:`_per_key` sums: means per call (and rank)."""
    t_us = a["t"] / a["n"] / 1e3
    alg = a["bytes"] / (a["t"] / a["n"] / 1e9) / 1e9 if a["bytes"] and a["t"] > 0 else None
    return CollectiveSummary(
        collective=a["op"], size_bytes=a["bytes"], count=a["n"], n_ranks=n_ranks, transfer_us=round(t_us, 3),
        wait_us=round(a["w"] / a["n"] / n_ranks / 1e3, 3),
        algbw_gbps=round(alg, 4) if alg is not None else None,
        busbw_gbps=round(alg * busbw_factor(a["op"], a["group"]), 4) if alg is not None else None)


def _total_busbw(calls: Calls, m: _Matches, transfer: np.ndarray, agg: list[dict], world_size: int | None
                 ) -> tuple[int, float | None]:
    """(bytes of the sized calls, their busbw in GB/s or None). Sized: the reference rank's call has bytes, the
    transfer took time, and it is not a barrier. busbw weights each call by its transfer time and takes the
    factor of the operation with the most transfer time."""
    ref = m.ref
    sized = calls.has_bytes[ref] & (calls.nbytes[ref] != 0) & (transfer > 0) & (calls.op[ref] != "barrier")
    total_t = float(transfer[sized].sum())
    total_bytes = int(calls.nbytes[ref][sized].sum())
    if total_t <= 0:
        return total_bytes, None
    group = world_size or len(m.ranks)
    main_op = max(agg, key=lambda a: a["t"])["op"]
    return total_bytes, round(total_bytes / (total_t / 1e9) / 1e9 * busbw_factor(main_op, group), 4)
