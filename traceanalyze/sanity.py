"""Impossible durations (README, Safety): events whose duration cannot be true are dropped from the metrics.

At parse time (:mod:`traceanalyze.ingest`) an event with a negative duration or a negative timestamp, or longer
than one day, is dropped and counted. Here, once a trace file is loaded, a GPU kernel, memcpy or CPU op longer
than its rank's trace span is dropped too: the span is the profiler's own recording, the ``"cat": "Trace"`` event
(``PyTorch Profiler (0)``) that kineto writes into every trace, kept by the parser under
:data:`traceanalyze.ingest.SPAN_KEY` in the file's header. Nothing recorded in a window can last longer than the
window; such durations come from end times never written (a CUPTI fault) or from edited files. A trace without
that event (hand-made or converted) is only checked at parse time.

The count goes into the file's ``message``, so every report on the database, cached or not, shows the warning row.
"""

from __future__ import annotations

import duckdb

EVENT_TABLES = ("kernels", "cpu_ops")


def drop_impossible_durations(con: duckdb.DuckDBPyConnection, file_id: int, header: dict) -> int:
    """Delete the kernels and CPU ops of one loaded file that are longer than its trace span (and their
    ``comm_events`` copies); note the count in ``files.message`` and lower ``n_kernels``/``n_cpu_ops``.

    Returns the number of events dropped (0 when the header holds no span). Raises duckdb.Error on a database
    failure.
    """
    from traceanalyze.ingest import SPAN_KEY

    span_us = header.get(SPAN_KEY)
    if not isinstance(span_us, (int, float)) or isinstance(span_us, bool) or not span_us > 0:
        return 0
    span_ns = int(round(span_us * 1000))
    counts = {t: con.execute(f"SELECT count(*) FROM {t} WHERE file_id = ? AND dur_ns > ?",
                             [file_id, span_ns]).fetchone()[0] for t in EVENT_TABLES}
    n = sum(counts.values())
    if not n:
        return 0
    con.execute("BEGIN TRANSACTION")
    try:
        for t in (*EVENT_TABLES, "comm_events"):
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
    return n
