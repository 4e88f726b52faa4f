"""Ingest: Kineto trace files into the store, in three rooms:

- :mod:`.parse`: one trace file decoded into columns (Arrow tables or IPC streams), streaming, memory bounded by a
  chunk; a pure function of the file (:func:`.parse.parse_trace`).
- :mod:`.load`: the files not in the parse cache parsed in worker processes and loaded into the store
  (:func:`load_traces`).
- :mod:`.checks`: the checks made once a file is loaded (:func:`drop_impossible_durations`).

The package re-exports what the pipeline and the command line use, from :mod:`.load` and :mod:`.checks`. Import
parse's names from :mod:`traceanalyze.ingest.parse`: it pulls in NumPy, PyArrow and msgspec, which a cached report
(it never parses) does not import, so importing this package must not import it.
"""

from traceanalyze.ingest.checks import drop_impossible_durations
from traceanalyze.ingest.load import (
    LoadedFile,
    block_pandas,
    file_identity,
    fingerprint,
    forget_files,
    load_traces,
)

__all__ = ["LoadedFile", "block_pandas", "drop_impossible_durations", "file_identity", "fingerprint", "forget_files",
           "load_traces"]
