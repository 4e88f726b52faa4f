"""Checks made once trace files are loaded (:func:`.load.load_traces`): impossible durations.

Impossible durations (docs/safety.md): at parse time (:mod:`.parse`) an event with a negative duration or a negative
timestamp, or longer than one day, is dropped and counted. Once a trace file is loaded, a GPU kernel, memcpy or CPU op
longer than its rank's trace span is dropped too (:func:`drop_impossible_durations`).
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb

from traceanalyze import store

SPAN_CHECKED = ("kernels", "cpu_ops")  # the tables whose events must fit in the trace span


def drop_impossible_durations(con: duckdb.DuckDBPyConnection, file_ids: Iterable[int]) -> int:
    """Delete the kernels and CPU ops of newly loaded files that are longer than their file's trace span (and
    their ``comm_events`` copies); note each file's count in its ``files.message`` and lower its
    ``n_kernels``/``n_cpu_ops``.

    The span is the profiler's own recording, the ``"cat": "Trace"`` event (``PyTorch Profiler (0)``) that
    kineto writes into every trace, kept by the parser under :data:`.parse.SPAN_KEY` in the file's header.
    Nothing recorded in a window can last longer than the window; such durations come from end times never
    written (a CUPTI fault) or from edited files. A trace without that event (hand-made or converted) is only
    checked at parse time. The count goes into the file's ``message``, so every report on the database, cached or
    not, shows the warning row. Call it once per parse of a file (for the files just loaded, not cached ones).

    The events are counted for all the files at once (one query per table); only files with events to drop are
    changed, each in its own transaction. Returns the number of events dropped (0 when no header holds a span).
    Raises duckdb.Error on a database failure.
    """
    ids = list(dict.fromkeys(file_ids))
    if not ids:  # nothing parsed (a cached run): .parse is not imported
        return 0
    spans = _trace_spans(con, ids)
    if not spans:
        return 0
    span_ns = {fid: int(round(span_us * 1000)) for fid, span_us in spans.items()}
    counts: dict[int, dict[str, int]] = {fid: dict.fromkeys(SPAN_CHECKED, 0) for fid in span_ns}
    for t in SPAN_CHECKED:
        for fid, n in con.execute(
                f"SELECT file_id, count(*) FROM {t} JOIN (SELECT unnest(?::INTEGER[]) AS file_id, "
                "unnest(?::BIGINT[]) AS span_ns) USING (file_id) WHERE dur_ns > span_ns GROUP BY file_id",
                [list(span_ns), list(span_ns.values())]).fetchall():
            counts[fid][t] = n
    dropped = 0
    for fid, n_by_table in counts.items():
        n = sum(n_by_table.values())
        if n:
            _drop_longer(con, fid, span_ns[fid], spans[fid], n_by_table)
            dropped += n
    return dropped


def _trace_spans(con: duckdb.DuckDBPyConnection, file_ids: list[int]) -> dict[int, float]:
    """file_id -> the trace span (µs) its stored header holds, for the files whose header holds a valid one."""
    from traceanalyze.ingest import parse

    spans: dict[int, float] = {}
    for fid, text in con.execute("SELECT file_id, header FROM files WHERE file_id IN (SELECT unnest(?::INTEGER[]))",
                                 [file_ids]).fetchall():
        span_us = store.header_dict(text).get(parse.SPAN_KEY)
        if isinstance(span_us, (int, float)) and not isinstance(span_us, bool) and span_us > 0:
            spans[fid] = span_us
    return spans


def _drop_longer(con: duckdb.DuckDBPyConnection, file_id: int, span_ns: int, span_us: float,
                 counts: dict[str, int]) -> None:
    """Delete one file's events longer than its span (``counts`` of them per table) and note it in its row."""
    n = sum(counts.values())
    con.execute("BEGIN TRANSACTION")
    try:
        for t in (*SPAN_CHECKED, "comm_events"):
            con.execute(f"DELETE FROM {t} WHERE file_id = ? AND dur_ns > ?", [file_id, span_ns])
        what = (f"{n} kernel{'s' if n != 1 else ''} or op{'s' if n != 1 else ''} longer than the rank's trace span "
                f"({span_us / 1e6:.6g} s, the profiler's recording) dropped from the metrics "
                f"({counts['kernels']} GPU, {counts['cpu_ops']} CPU): impossible durations")
        con.execute("UPDATE files SET message = concat_ws('; ', message, ?), n_kernels = n_kernels - ?, "
                    "n_cpu_ops = n_cpu_ops - ? WHERE file_id = ?", [what, counts["kernels"], counts["cpu_ops"],
                                                                     file_id])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
