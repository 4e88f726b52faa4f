"""The store's rows as arrays for the graph's build: queries read as NumPy columns (:func:`fetch`,
:func:`fetch_arrow`), task names held once as Arrow dictionaries (:func:`encode_names`, :func:`unify_names`), and
the run's files, ranks and clocks (:class:`RunClock`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traceanalyze.ingest import compute as pc
from traceanalyze.metrics import allocator  # Arrow's compute functions without importing pyarrow.compute

FETCH_BATCH_ROWS = 1 << 17  # rows per Arrow batch read from DuckDB by fetch_arrow (a result with strings)
WHOLE_BATCH_ROWS = 1 << 26  # rows of the one Arrow batch of a result without strings (_numpy_columns)


def fetch(con, sql: str, params: list) -> dict[str, np.ndarray]:
    return con.execute(sql, params).fetchnumpy()


def in_files(col: str, fids: list[int], param: str) -> str:
    """SQL: ``col`` (a file id) is one of ``fids``, read from the list parameter ``param`` (``?`` or ``$n``). The
    ids' range is spelled out too: DuckDB skips the row groups outside it (a chunk's or a batch's files are a run of
    the sorted ids), where ``list_contains`` alone reads every row of the table (0.01-0.02 s per events batch)."""
    lo, hi = (min(fids), max(fids)) if fids else (0, -1)
    return f"{col} BETWEEN {lo:d} AND {hi:d} AND list_contains({param}, {col})"


def fetch_arrow(con, sql: str, params: list, hash_names: bool = False) -> dict:
    """Columns of a query: ``name`` as (per row: index into the distinct names, the distinct names, sorted, as an
    Arrow string array), the others as NumPy arrays with NULL read as 0. A result without strings is read whole
    (:func:`_numpy_columns`: its arrays are read only); one with strings streams from DuckDB in batches of
    :data:`FETCH_BATCH_ROWS`, each converted as it comes: the whole result never exists as Arrow (at 1,024 ranks
    that was hundreds of MB beside the arrays made from it).

    ``hash_names`` (a query without ORDER BY: its rows come in the same order through the projection that wraps
    it): the rows read each name's 64-bit DuckDB hash, not its string, and a second query over the same rows reads
    the distinct names once (:func:`_hashed_names`): DuckDB hashes its dictionary-compressed strings without
    making them, where a string column costs its copy into Arrow and a dictionary encode per batch (the 256-rank
    set's 308k kernels: 0.04 s of CPU against 0.01 s). Such a query had better test a list with ``list_contains``,
    not ``IN (SELECT unnest(...))``: DuckDB keeps that mark join in the distinct names' query too."""
    import pyarrow as pa

    con.complete()  # DuckDB 2 refuses a new query while a DB-API result of this connection is unfinished
    if hash_names:
        out = _hashed_names(con, sql, params)
        if out is not None:
            return out
        con.complete()
    rel = con.sql(sql, params=params)
    if "name" not in rel.columns:  # no strings: read whole (:func:`_numpy_columns`)
        return _numpy_columns(rel)
    reader = rel.to_arrow_reader(FETCH_BATCH_ROWS)
    parts: dict[str, list] = {c: [] for c in reader.schema.names}
    for batch in reader:
        for c, a in zip(batch.schema.names, batch.columns, strict=True):
            parts[c].append(encode_names(a) if c == "name" else _numpy_column(a))
        del batch
    out: dict = {}
    for c in list(parts):
        chunks = parts.pop(c)
        if c == "name":
            out[c] = unify_names(chunks)[::-1] if chunks else (np.zeros(0, np.int64), pa.array([], pa.string()))
        else:
            out[c] = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)  # callers cast as they need
    return out


def _numpy_column(a, writable: bool = True) -> np.ndarray:
    """An Arrow column of a DuckDB batch as a NumPy array, NULL read as 0 (False); ``writable``: a copy (a view
    would keep the whole DuckDB batch, its strings too, alive until the end), else a view where Arrow can."""
    import pyarrow as pa

    if a.null_count:
        a = pc.fill_null(a, False if pa.types.is_boolean(a.type) else 0)
    return a.to_numpy(zero_copy_only=False, writable=writable)


def _numpy_columns(rel) -> dict[str, np.ndarray]:
    """The columns of a DuckDB relation without strings as NumPy arrays, NULL read as 0 (False), read only: the
    result read whole as one Arrow batch (:data:`WHOLE_BATCH_ROWS`), each column a view of it where Arrow can (no
    NULL, not boolean), else one copy. DuckDB fills the result on all its threads, and nothing is copied twice: a
    reader's batches (~30k rows each, however many were asked for), each copied, then joined, cost 0.01 s of CPU
    more per 250k rows (the 256-rank set's 249k runtime calls: 36 ms against 23 ms). The peak is the result's size,
    as the joined batches' was."""
    tbl = rel.to_arrow_table(WHOLE_BATCH_ROWS)
    out: dict[str, np.ndarray] = {}
    for c in tbl.column_names:
        chunks = tbl.column(c).chunks
        tbl = tbl.drop_columns([c])  # a copied column's Arrow buffers go once it is made
        parts = [_numpy_column(a, writable=False) for a in chunks]
        del chunks
        # callers cast as they need
        out[c] = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return out


def _hashed_names(con, sql: str, params: list) -> dict | None:
    """:func:`fetch_arrow` of ``sql`` with ``name`` read as hashes, then coded against the distinct names; None
    where two distinct names share a hash (the caller then reads the strings)."""
    import pyarrow as pa

    names = con.sql(f"SELECT hash(name) AS h, name FROM (SELECT DISTINCT name FROM ({sql}))",
                    params=params).to_arrow_table()
    name = pc.cast(names.column("name").combine_chunks(), pa.string())
    hashes = names.column("h").to_numpy()
    if np.unique(hashes).size != hashes.size:
        return None
    con.complete()
    out = _numpy_columns(con.sql(f"SELECT * REPLACE (hash(name) AS name) FROM ({sql})", params=params))
    # the names sorted as unify_names sorts them; each row's code found by its hash among the sorted hashes
    by_name = pc.array_sort_indices(name, "at_end").to_numpy()
    hashes = hashes[by_name]
    o = np.argsort(hashes)
    h_rows = out.pop("name")
    codes = o[np.searchsorted(hashes[o], h_rows)].astype(np.int64) if h_rows.size else np.zeros(0, np.int64)
    out["name"] = (codes, pc.take(name, pa.array(by_name)))
    return out


def encode_names(names) -> tuple[np.ndarray, object]:
    """(per row: index into the distinct names, the distinct names as an Arrow string array) of an Arrow string
    column: a graph holds each of its few hundred names once, not once per task."""
    import pyarrow as pa

    enc = pc.dictionary_encode(names, "encode")  # an Arrow array: a batch's column, or the step markers
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, pc.cast(enc.dictionary, pa.string())


def unify_names(parts: list[tuple[np.ndarray, object]]) -> tuple[object, np.ndarray]:
    """(the distinct names, sorted, as an Arrow string array; per row of the concatenated parts: its index into
    them) of several :func:`encode_names` results. ``parts`` is emptied on the way (its codes are released as
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


def unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct tuples of ``cols`` (int64 arrays of one length) in sorted order as a (k, len(cols)) matrix, each
    row's index into them). Rows come from the store in runs of one tuple (a thread's calls, a stream's kernels:
    56 runs in 400k CPU ops, 32k in 178k kernels), so the runs' first rows are sorted, not every row (a lexsort of
    the stacked rows cost ~60 ms per 400k, ``np.unique(axis=0)`` ~50x that)."""
    n = cols[0].size if cols else 0
    if n == 0:
        return np.zeros((0, len(cols)), np.int64), np.zeros(0, np.int64)
    new = np.zeros(n, bool)
    new[0] = True
    for c in cols:
        new[1:] |= c[1:] != c[:-1]
    at = np.flatnonzero(new)
    keys = np.stack([np.asarray(c, np.int64)[at] for c in cols], axis=1)
    o = np.lexsort(keys.T[::-1])
    k = keys[o]
    step = np.ones(at.size, bool)
    step[1:] = (k[1:] != k[:-1]).any(axis=1)
    run_code = np.empty(at.size, np.int64)
    run_code[o] = np.cumsum(step) - 1
    return k[step], np.repeat(run_code, np.diff(np.append(at, n)))


def dense_codes(*cols: np.ndarray) -> np.ndarray:
    """Per row, the index of its tuple of ``cols`` among the distinct ones, sorted (:func:`unique_rows`)."""
    return unique_rows(*cols)[1]


@dataclass
class RunClock:
    """The run's files, ranks and clocks, as every part of :func:`.builder.build` reads them.

    ``origin``: the run's first CPU timestamp (ns); ``off_ns``: per rank 0..``world``, its clock offset (ns);
    ``fid``/``fid_rank``: the run's file ids (sorted) and each one's rank; ``frees``: a GPU run whose traces hold
    a ``cudaFree`` (:func:`traceanalyze.metrics.allocator.has_frees`: the graph's ``allocator`` category is looked
    for only then), asked once per run, not once per chunk of ranks.
    """

    run_id: int
    mode: str
    ranks: list[int]
    world: int
    origin: int
    off_ns: np.ndarray
    fid: np.ndarray
    fid_rank: np.ndarray
    frees: bool = False

    def rank_of(self, fids: np.ndarray) -> np.ndarray:
        """The rank of each file id (int64 array)."""
        return self.fid_rank[np.searchsorted(self.fid, fids)] if fids.size else np.zeros(0, np.int64)

    def rel_ns(self, ts: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Timestamps (ns, the rank's clock) as ns since the run's start on the reference clock."""
        return ts - self.origin - self.off_ns[np.clip(rank, 0, self.world)]

    def abs_ns(self, rel: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """:meth:`rel_ns` undone: ns since the run's start as timestamps (ns) on the rank's clock, exactly."""
        return rel + self.origin + self.off_ns[np.clip(rank, 0, self.world)]


def run_clock(con, run_id: int, mode: str, world_size: int | None, clock_offsets_us: dict | None) -> RunClock:
    offs = {int(k): float(v) for k, v in (clock_offsets_us or {}).items()}
    files = con.execute("SELECT file_id, rank FROM files WHERE run_id = ? ORDER BY file_id", [run_id]).fetchall()
    file_rank = {f: r for f, r in files if r is not None}
    ranks = sorted(set(file_rank.values()))
    world = max(world_size or 0, (max(ranks) + 1) if ranks else 0)
    # the run's files (ranked or not) by their ids, not a join to files: DuckDB skips the row groups outside their
    # range (0.5 ms against 3 on the 8-rank scale set)
    run_fids = [f for f, _ in files]
    origin = con.execute(f"SELECT min(c.ts_ns) FROM cpu_ops c WHERE {in_files('c.file_id', run_fids, '?')}",
                         [run_fids]).fetchone()[0] or 0
    fid = np.array(sorted(file_rank), dtype=np.int64)
    fid_rank = np.array([file_rank[f] for f in fid.tolist()], dtype=np.int64)
    off_ns = np.array([int(offs.get(r, 0.0) * 1e3) for r in range(world + 1)], dtype=np.int64)
    return RunClock(run_id=run_id, mode=mode, ranks=ranks, world=world, origin=origin, off_ns=off_ns, fid=fid,
                     fid_rank=fid_rank, frees=mode == "gpu" and allocator.has_frees(con, run_id))
