"""Everything a report depends on, in one frozen object: :class:`Options`.

The command line (``traceanalyze report``), the Python API (:func:`traceanalyze.api.analyze`) and the batch
(:mod:`traceanalyze.batch`) each build one and hand it to :func:`traceanalyze.pipeline.analyze`. It is validated
once, here (:meth:`Options.__post_init__`, field by field with :func:`check`): the messages a user sees for a bad
value come from this module, on the command line as in Python. The report cache's key is derived from
:meth:`Options.report_key` (plus the input files), so a new field that changes the report must be marked
``report=True`` below.

A leaf module: it imports nothing of the project but :mod:`traceanalyze.errors` and the version.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from traceanalyze.errors import UsageError
from traceanalyze.version import __version__

MAX_JOBS = 256  # parse processes of one report (``-j``); a batch's runs at once are bounded by its own option
EXECUTORS = ("local", "dask")

PathLike = str | Path


def _report(default: Any = None, **kw: Any) -> Any:
    """A field the report's content depends on: part of :meth:`Options.report_key`."""
    return field(default=default, metadata={"report": True}, **kw)


@dataclass(frozen=True)
class Options:
    """What one analysis reads, writes and assumes; units in the names (GB/s, TFLOPS, bytes).

    Attributes:
        baseline: folders or files of a run to compare against (the fast one); empty for none.
        db: DuckDB file to write (reused as a parse cache on a re-run); None keeps it in memory.
        outputs: (option name, path) of the files the caller will write; checked with ``db`` against every input
            file once they are discovered, before anything is written (:func:`traceanalyze.safety.check_outputs`).
        jobs: processes for parsing (default: CPU count), 1 to :data:`MAX_JOBS`.
        link_bw_gbps: expected per-direction link bandwidth (GB/s, 1e9 bytes/s) to judge busbw against; overrides
            what the topology, NCCL transport or GPU model suggest.
        peak_tflops: dense peak TFLOPS of the GPU for MFU; overrides the datasheet table.
        max_decompressed_bytes: bound in bytes on what one trace, log or config may inflate to (gzip bombs); None:
            :data:`traceanalyze.limits.DEFAULT_MAX_DECOMPRESSED`. A file over it is an error row, the rest go on.
        gpu: the GPU when a trace's ``deviceProperties`` do not say (``--gpu``): a name or a compute capability
            (:func:`traceanalyze.hardware.parse_gpu_option`).
        follow_external_symlinks: read files and walk folders that symlinks inside an input folder point to
            outside it; without it they are skipped with a warning (:func:`traceanalyze.discover.discover`).
        executor: ``"local"`` (processes here) or ``"dask"`` (the per-rank parse on a Dask cluster,
            :class:`traceanalyze.executors.DaskExecutor`: ``jobs`` local workers unless ``scheduler`` is given).
        scheduler: address of a running Dask scheduler (``tcp://host:8786``); implies ``executor="dask"``.
        read_only_hit: a cached report may come with a read-only connection (no file access from SQL): what the
            command line takes when it only writes the reports, for one open of the database instead of two.
        show_paths: the HTML, Markdown and JSON reports show absolute paths; by default a path is shown from its
            input folder's name (:func:`traceanalyze.report.paths.page_model`). The report model keeps them either
            way, so it is not part of the cache key.
    """

    baseline: tuple[PathLike, ...] = _report(default=())
    db: PathLike | None = None
    outputs: tuple[tuple[str, PathLike | None], ...] = ()
    jobs: int | None = None
    link_bw_gbps: float | None = _report()
    peak_tflops: float | None = _report()
    max_decompressed_bytes: int | None = _report()
    gpu: str | None = _report()
    follow_external_symlinks: bool = _report(default=False)
    executor: str = "local"
    scheduler: str | None = None
    read_only_hit: bool = False
    show_paths: bool = False

    def __post_init__(self) -> None:
        # a single path or any iterable becomes a tuple: the object stays immutable and comparable
        base = self.baseline
        base = () if base is None else (base,) if isinstance(base, (str, Path)) else tuple(base)
        object.__setattr__(self, "baseline", base)
        object.__setattr__(self, "outputs", tuple((str(n), p) for n, p in (self.outputs or ())))
        for f in fields(self):
            check(f.name, getattr(self, f.name))

    def report_key(self) -> str:
        """The tool's version and every report-affecting option, as stable text for the report cache's key
        (:func:`traceanalyze.store.report_cache_key`). The baseline's files enter the key through discovery."""
        return "|".join([__version__, *(f"{getattr(self, f.name)}" for f in fields(self)
                                         if f.metadata.get("report") and f.name != "baseline")])


def _positive(value: Any, what: str) -> None:
    # the wording of click's ranges: the command line printed these before Options checked them
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"{value} is not in the range {what}")


def check(name: str, value: Any) -> Any:
    """Validate one field of :class:`Options`; return the value.

    Raises:
        UsageError: the value is out of range or of the wrong kind (the message names the value, not the field:
            the caller adds the option's name, as the command line does).
    """
    if value is None:
        return value
    if name == "jobs":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOBS:
            raise UsageError(f"{value} is not in the range 1<=x<={MAX_JOBS}")
    elif name in ("link_bw_gbps", "peak_tflops"):
        _positive(value, "x>0")
    elif name == "max_decompressed_bytes":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UsageError(f"{value!r} is not a size such as 512M or 64G")
    elif name == "executor" and value not in EXECUTORS:
        raise UsageError(f"unknown executor {value!r} (local or dask)")
    elif name in ("gpu", "scheduler") and not isinstance(value, str):
        raise UsageError(f"{value!r} is not text")
    return value


class Progress(Protocol):
    """What :func:`traceanalyze.pipeline.analyze` reports while loading: byte sizes of the trace files."""

    def total(self, n: int) -> None:
        """Called once with the total byte size of the trace files, before loading."""

    def step(self, n: int) -> None:
        """Called with the byte size of each trace file as it is loaded (or found in the report cache)."""
