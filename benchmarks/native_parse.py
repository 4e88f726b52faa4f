"""How much faster DuckDB's own JSON reader could turn one Kineto trace into the kernels and cpu_ops tables than
the project's parser (msgspec, then Arrow columns built in Python): a measurement for issue 18 (the scale set's
10x needs the parse's CPU time about halved), not a parser. It takes the CPU time of both on the same file and
compares what they produce, table by table (rows, and the sums of the integer columns).

The native path, in one process:
1. inflate the file (ISA-L, as the parser does) and cut out the ``traceEvents`` array (the parser's structural
   scanner finds where it ends);
2. write the array to a temporary file, which ``read_json(format='array')`` reads with DuckDB's threads, every value
   but ``ph`` and ``cat`` as JSON so that no type in a hostile file stops the read;
3. the table rows in SQL: the category mapping, ``ts`` in µs to integer ns with the parser's exact formula, and
   the same validity rules (finite, not negative, in range), each value read with ``TRY_CAST``.

What it leaves out, and a parser built this way would have to add: the 2021 schema's ``external id`` (DuckDB's
struct keys are case-insensitive: the args would be read as one JSON value instead), the lenient decoding of a
damaged event (the parser's one-by-one fallback), the counts of dropped events by reason, ``comm_events``,
``threads``, ``cuda_syncs``, a file cut off mid-write, and the bound on the bytes of one event.

Measured (2026-11-25, this project's 2-core VM, medians of 3-5 runs; both produce the same rows and sums):

| trace | the parser | native: read, SQL, insert | native: inflate and cut |
|---|--:|--:|--:|
| a 47 MB rank of the scale set | 0.47 s CPU | 0.49 s CPU | 0.55 s CPU |
| a 1.8 MB rank of the 1,024-rank set | 0.024 s | 0.036 s | 0.017 s |

``read_json`` itself is fast (0.15-0.2 s for the 47 MB rank, at one thread, with the values typed DOUBLE/BIGINT),
but a typed column fails the whole file on one value of another type (a string ``pid``, ``"ts": "12"``), and
reading every value as JSON or text and converting it with ``TRY_CAST`` in SQL costs what the Python parser
costs. So DuckDB's reader does not halve the parse; the cut as written here (the whole file joined, then the
scanner over all of it) is slower still. Reading the trace file as it is (one top-level object, ``traceEvents`` a
list of typed structs, then ``unnest``) takes 2.8 s and 400 MB for the 47 MB rank: the whole object is built first.

Run: ``python benchmarks/native_parse.py TRACE.json.gz [--threads 2] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

from traceanalyze import store
from traceanalyze.ingest import parse
from traceanalyze.limits import MAX_DUR_US, MAX_TS_US

_JSON_COLUMNS = ("{ph: 'VARCHAR', cat: 'VARCHAR', name: 'JSON', pid: 'JSON', tid: 'JSON', ts: 'JSON', dur: 'JSON', "
                 "args: 'STRUCT(\"External id\" JSON, correlation JSON, device JSON, stream JSON, "
                 "bytes JSON, \"Input type\" JSON, \"Input Dims\" JSON, kernel_backend JSON)'}")
_CPU = {k: v for k, v in parse.CPU_CATS.items() if v}  # python_function stacks are not kept


def _events_array(path: Path) -> bytes:
    """The bytes of the file's ``traceEvents`` array, ``[`` to ``]``."""
    blocks, state = parse._open_blocks(path, 64 << 30)
    data = b"".join(blocks)
    if state["error"]:
        raise SystemExit(f"{path}: {state['error']}")
    start = data.index(b"[", data.index(b'"traceEvents"'))
    sc = parse._Scanner()
    sc.depth = 1
    pos, _, depth = sc.scan(data, start + 1)
    end = int(pos[np.flatnonzero(depth == 0)[0]])  # the bracket that closes the array
    return data[start:end + 1]


def _int(expr: str) -> str:
    """A JSON value as BIGINT: numbers (an integral double too) and numeric strings; NULL otherwise."""
    return (f"coalesce(TRY_CAST(json_extract_string({expr}, '$') AS BIGINT), "
            f"TRY_CAST(TRY_CAST(json_extract_string({expr}, '$') AS DOUBLE) AS BIGINT))")


def native(arr: bytes, con: duckdb.DuckDBPyConnection, tmp: str) -> dict[str, int]:
    """Load the events array ``arr`` (:func:`_events_array`) into ``con``'s kernels and cpu_ops (file_id 1) with
    DuckDB's JSON reader; returns rows per table."""
    f = os.path.join(tmp, "events.json")
    with open(f, "wb") as fh:
        fh.write(arr)
    gpu = ", ".join(f"('{k}', '{v}')" for k, v in parse.GPU_CATS.items())
    cpu = ", ".join(f"('{k}', '{v}')" for k, v in _CPU.items())
    con.execute(f"""CREATE OR REPLACE TEMP TABLE ev AS
        SELECT m.kind, m.gpu, e.name, e.pid, e.tid, e.args,
               TRY_CAST(json_extract_string(e.ts, '$') AS DOUBLE) AS ts,
               TRY_CAST(json_extract_string(e.dur, '$') AS DOUBLE) AS dur
        FROM read_json('{f}', format='array', columns={_JSON_COLUMNS}, maximum_object_size=16777216) e
        JOIN (SELECT k AS cat, v AS kind, true AS gpu FROM (VALUES {gpu}) t(k, v)
              UNION ALL SELECT k, v, false FROM (VALUES {cpu}) t(k, v)) m ON m.cat = e.cat
        WHERE e.ph = 'X'""")
    ok = (f"ts IS NOT NULL AND dur IS NOT NULL AND isfinite(ts) AND isfinite(dur) AND ts >= 0 AND dur >= 0 "
          f"AND ts <= {MAX_TS_US} AND dur <= {MAX_DUR_US}")
    ts_ns = "(floor(ts)::BIGINT * 1000 + round((ts - floor(ts)) * 1000)::BIGINT)"
    con.execute(f"""INSERT INTO kernels (file_id, cat, name, device, stream, ts_ns, dur_ns, external_id, correlation,
                    bytes)
        SELECT 1, kind, json_extract_string(name, '$'), coalesce({_int('args.device')}, {_int('pid')}),
               coalesce({_int('args.stream')}, {_int('tid')}), {ts_ns}, round(dur * 1000)::BIGINT,
               {_int('args."External id"')}, {_int('args.correlation')},
               {_int('args.bytes')}
        FROM ev WHERE gpu AND {ok}""")
    con.execute(f"""INSERT INTO cpu_ops (file_id, cat, name, pid, tid, ts_ns, dur_ns, external_id, correlation,
                    input_types, input_dims, kernel_backend)
        SELECT 1, kind, json_extract_string(name, '$'), {_int('pid')}, {_int('tid')}, {ts_ns},
               round(dur * 1000)::BIGINT, {_int('args."External id"')},
               {_int('args.correlation')}, args."Input type"::VARCHAR, args."Input Dims"::VARCHAR,
               json_extract_string(args.kernel_backend, '$')
        FROM ev WHERE NOT gpu AND {ok}""")
    con.execute("DROP TABLE ev")
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("kernels", "cpu_ops")}


def ours(path: Path, con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Load ``path`` with the project's parser (in memory, as one process) into ``con``'s kernels and cpu_ops."""
    _, tables = parse.parse_trace(path)
    for t in ("kernels", "cpu_ops"):
        arrow = tables[t]  # noqa: F841 (read by DuckDB's replacement scan)
        cols = ", ".join(arrow.schema.names)
        con.execute(f"INSERT INTO {t} (file_id, {cols}) SELECT 1, {cols} FROM arrow")
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("kernels", "cpu_ops")}


def _fresh(threads: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(store.DDL)
    con.execute(f"SET threads = {threads}")
    return con


def _sums(con: duckdb.DuckDBPyConnection) -> dict[str, tuple]:
    return {t: con.execute(f"SELECT count(*), sum(ts_ns), sum(dur_ns), sum(correlation), sum(external_id), "
                           f"count(DISTINCT name) FROM {t}").fetchone() for t in ("kernels", "cpu_ops")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--threads", type=int, default=1, help="DuckDB threads for the native read (default 1)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    times: dict[str, list[tuple[float, float]]] = {"ours": [], "cut": [], "native": []}
    sums = {}
    for _ in range(args.repeat):
        for how in ("ours", "native"):
            con = _fresh(1 if how == "ours" else args.threads)
            with tempfile.TemporaryDirectory() as tmp:
                w, c = time.perf_counter(), time.process_time()
                if how == "ours":
                    ours(args.trace, con)
                else:
                    arr = _events_array(args.trace)
                    times["cut"].append((time.perf_counter() - w, time.process_time() - c))
                    w, c = time.perf_counter(), time.process_time()
                    native(arr, con, tmp)
                    del arr
                times[how].append((time.perf_counter() - w, time.process_time() - c))
            sums[how] = _sums(con)
            con.close()
    for how, ts in times.items():
        what = {"ours": "the parser: inflate, parse, insert", "cut": "native, 1: inflate and cut out the array",
                "native": "native, 2-3: read_json, rows in SQL, insert"}[how]
        print(f"{how:6s}: median {statistics.median(t[0] for t in ts):.3f} s wall, "
              f"{statistics.median(t[1] for t in ts):.3f} s CPU ({what}; {len(ts)} runs)")
    for t in ("kernels", "cpu_ops"):
        same = sums["ours"][t] == sums["native"][t]
        print(f"{t}: {'same rows and sums' if same else 'DIFFER'}: ours {sums['ours'][t]}, native {sums['native'][t]}")


if __name__ == "__main__":
    main()
