"""Ingest: Kineto trace files into the store, in four rooms:

- :mod:`.parse`: one trace file decoded into columns (Arrow tables or IPC streams), streaming, memory bounded by a
  chunk; a pure function of the file (:func:`.parse.parse_trace`).
- :mod:`.load`: the files not in the parse cache (:mod:`.cache`) parsed in worker processes and loaded into the store
  (:func:`load_traces`).
- :mod:`.spans`: the checks made once a file is loaded (:func:`drop_impossible_durations`).
- :mod:`.checks`: the checks and facts of one run's loaded files (copies, overlapping windows, the headers' facts).

The package re-exports what the pipeline and the command line use, from :mod:`.load` and :mod:`.spans`. Import
parse's names from :mod:`traceanalyze.ingest.parse`: it pulls in NumPy, PyArrow and msgspec, which a cached report
(it never parses) does not import, so importing this package must not import it.
"""

from traceanalyze.ingest.cache import LoadedFile, file_identity, fingerprint, forget_files
from traceanalyze.ingest.load import begin_parse, block_pandas, load_traces
from traceanalyze.ingest.spans import drop_impossible_durations

__all__ = ["LoadedFile", "begin_parse", "block_pandas", "drop_impossible_durations", "file_identity", "fingerprint",
           "forget_files", "load_traces"]
