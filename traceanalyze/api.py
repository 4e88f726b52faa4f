"""Python API for notebooks: ``import traceanalyze as ta; a = ta.analyze("traces/")``.

:func:`analyze` runs the same pipeline as ``traceanalyze report`` (:func:`traceanalyze.pipeline.analyze`) and
returns a :class:`Report`: the report model, the open DuckDB database, and pandas DataFrames of what the HTML
report shows. :func:`load` reopens a database that ``report`` (or :func:`analyze` with ``db=``) wrote.

Units follow the database (``docs/schema.md``): times in µs (``*_us``), shares in % (``*_pct``), bandwidth in
GB/s (1e9 bytes/s), sizes in bytes; event times in the raw tables are integer ns on each rank's own clock.

pandas is an optional dependency (``pip install 'traceanalyze[pandas]'``): the DataFrame properties and
:meth:`Report.sql` raise :class:`ImportError` naming that extra when it is missing; everything else (the
model, ``con``, ``to_html``/``to_json``/``to_markdown``, ``export``) works without it.
"""

from __future__ import annotations

import html as _html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceanalyze import pipeline
from traceanalyze.errors import TraceanalyzeError
from traceanalyze.options import Options
from traceanalyze.report import render_html, render_markdown
from traceanalyze.report.assemble import to_json
from traceanalyze.report.paths import page_model
from traceanalyze.safety import atomic_write_text, check_outputs
from traceanalyze.store import open_untrusted, untrusted_error

if TYPE_CHECKING:
    import duckdb
    import pandas as pd

    from traceanalyze.export import ExportResult

__all__ = ["Report", "analyze", "load"]

_PANDAS_HINT = ("pandas is needed for DataFrames: pip install 'traceanalyze[pandas]' "
                "(or use Report.con.sql(query).arrow() without it)")


def _pd():
    try:
        import pandas
    except ImportError as exc:
        raise ImportError(_PANDAS_HINT) from exc
    return pandas


def analyze(inputs: str | Path | list[str | Path], *, baseline: str | Path | list[str | Path] | None = None,
            db: str | Path | None = None, jobs: int | None = None, link_bw_gbps: float | None = None,
            peak_tflops: float | None = None, gpu: str | None = None,
            follow_external_symlinks: bool = False, max_decompressed_bytes: int | None = None,
            show_paths: bool = False) -> Report:
    """Analyze the traces (and logs) under ``inputs`` and return a :class:`Report`.

    Args:
        inputs: a folder or file, or a list of them, holding every rank's Kineto trace (``*.json[.gz]``) and the
            logs beside them; folders are walked recursively, one run per folder of traces.
        baseline: traces of a faster run to explain the difference against (optional).
        db: DuckDB file to write, reused as a parse cache on the next call (default: in memory).
        jobs: parse processes (default: the CPU count).
        link_bw_gbps: expected per-direction link bandwidth between ranks (GB/s), to judge busbw against.
        peak_tflops: dense peak TFLOPS of one GPU for MFU.
        gpu: the GPU when the traces' ``deviceProperties`` do not say: a name (``"V100"``) or a compute capability
            (``"sm80"``); precision advice depends on it (:mod:`traceanalyze.hardware`).
        follow_external_symlinks: read what symlinks inside the input folders point to outside them (skipped with
            a warning by default; docs/safety.md).
        max_decompressed_bytes: bound in bytes on what one trace, log or config may inflate to (gzip bombs;
            default :data:`traceanalyze.limits.DEFAULT_MAX_DECOMPRESSED`): a file over it is a warning row.
        show_paths: the HTML, Markdown and JSON reports (``to_html``, ``to_markdown``, ``to_json``) show absolute
            paths; by default each path is shown from its input folder's name. ``Report.model`` keeps them.

    Returns:
        :class:`Report` (close it, or use it as a context manager, to release a ``db`` file).

    Raises:
        TraceanalyzeError: an input does not exist, nothing to analyze was found, or the database is in use
            or unusable. Unreadable trace files do not raise: they are listed in ``Report.warnings``.
        UsageError: an option is out of range (:class:`traceanalyze.options.Options`).
    """
    options = Options(baseline=baseline, db=db, jobs=jobs, link_bw_gbps=link_bw_gbps, peak_tflops=peak_tflops, gpu=gpu,
                      follow_external_symlinks=follow_external_symlinks, max_decompressed_bytes=max_decompressed_bytes,
                      show_paths=show_paths)
    a = pipeline.analyze(inputs, options)
    given = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    return Report(a.con, a.model, db_path=a.db_path, show_paths=show_paths, inputs=given + list(options.baseline))


def load(db: str | Path) -> Report:
    """Reopen a report database written by ``traceanalyze report`` (``--db``) or ``analyze(..., db=...)``.

    The database may come from anyone, so it is opened as untrusted (:func:`traceanalyze.store.open_untrusted`):
    read-only, without file-system access (a view over ``read_text('/etc/passwd')`` fails), without extension
    autoload/autoinstall, its configuration locked. The report model is the one stored with the last report.

    Raises:
        TraceanalyzeError: the file does not exist, is not a traceanalyze database, is in use by a running
            report, holds no stored report, or tries to read files outside itself.
    """
    import duckdb

    p = Path(db)
    if not p.is_file():
        raise TraceanalyzeError(f"{p}: no such database file")
    con = open_untrusted(p)
    try:
        row = con.execute("SELECT model FROM report_cache LIMIT 1").fetchone()
    except duckdb.PermissionException as exc:
        con.close()
        raise untrusted_error(p, exc) from None
    except duckdb.Error:
        row = None
    if not row:
        con.close()
        raise TraceanalyzeError(f"{p}: no stored report in this database (run traceanalyze report on the traces)")
    return Report(con, json.loads(row[0]), db_path=str(p))


class Report:
    """One analysis: the report model, the DuckDB database behind it, and DataFrames of its tables.

    Attributes:
        con: the open DuckDB connection (tables and macros in ``docs/schema.md``).
        model: the report model, the dict written as the JSON report (shape in ``docs/schema.md``), with absolute
            paths; the reports show them from the input folders' names unless ``show_paths``.
        db_path: the database file, or None for an in-memory database.
        show_paths: the reports (``to_html``, ``to_markdown``, ``to_json``) show absolute paths.
        inputs: the folders or files given, which the reports show paths from (besides each run's folder).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, model: dict, db_path: str | None = None, *,
                 show_paths: bool = False, inputs: list[str | Path] | None = None) -> None:
        self.con = con
        self.model = model
        self.db_path = db_path
        self.show_paths = show_paths
        self.inputs = list(inputs or [])

    # ---- context manager ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the database connection (a file database can then be opened by another process)."""
        self.con.close()

    def __enter__(self) -> Report:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plain facts ----------------------------------------------------------------------------------------
    @property
    def verdict(self) -> str:
        """One sentence: the main cause of slowness, or that none was found."""
        return str(self.model.get("verdict") or "")

    @property
    def warnings(self) -> list[dict]:
        """Data-quality notes: dicts with ``file`` (path or None), ``message``, ``level`` (error / partial /
        warning / info) and ``run``."""
        return list(self.model.get("warnings") or [])

    # ---- DataFrames -----------------------------------------------------------------------------------------
    def sql(self, query: str, params: list | dict | None = None) -> pd.DataFrame:
        """Run a SQL query on the report database and return the result as a DataFrame.

        Tables and macros (``kernels``, ``cpu_ops``, ``rank_metrics``, ``kernel_class(cat, name)``, ...) are
        listed in ``docs/schema.md``; ``params`` binds ``?`` / ``$name`` placeholders.

        Raises:
            TraceanalyzeError: the query failed (the message is DuckDB's first line).
            ImportError: pandas is not installed.
        """
        pd = _pd()
        import duckdb

        try:
            cur = self.con.execute(query, params) if params is not None else self.con.execute(query)
        except duckdb.Error as exc:
            raise TraceanalyzeError(f"query failed: {str(exc).splitlines()[0]}") from None
        if cur.description is None:
            return pd.DataFrame()
        return cur.df()

    @property
    def runs(self) -> pd.DataFrame:
        """One row per run: ``run_id, name, path, role`` (subject / baseline), ``world_size, backend, mode``
        (gpu / cpu; log-only runs are not listed), ``gpu_model, gpu_count, nccl_version, cuda_runtime_version``.

        Raises: ImportError without pandas.
        """
        return self.sql("SELECT * FROM runs ORDER BY run_id")

    @property
    def ranks(self) -> pd.DataFrame:
        """Per-rank metrics, one row per run × rank (HTA temporal breakdown; definitions in the README).

        Columns: ``run`` (name), ``role``, ``rank``, ``mode``, ``n_files``; µs: ``window_us`` (first kernel start
        to last kernel end), ``busy_us``, ``idle_us``, ``compute_us``, ``non_compute_us``, ``comm_us``,
        ``exposed_comm_us`` (communication not under compute), ``kernel_compute_us`` / ``kernel_comm_us`` /
        ``kernel_memory_us`` (summed durations), ``step_time_us`` (mean ``ProfilerStep``, None without steps);
        %: ``idle_pct``, ``compute_pct``, ``non_compute_pct`` (of the window), ``comm_comp_overlap_pct``;
        counts: ``n_kernels``, ``n_steps``.

        Raises: ImportError without pandas.
        """
        return self.sql("""SELECT r.name AS run, r.role, m.* EXCLUDE (run_id) FROM rank_metrics m
                           JOIN runs r USING (run_id) ORDER BY m.run_id, m.rank""")

    @property
    def steps(self) -> pd.DataFrame:
        """Per profiler step and rank: ``run, rank, step`` (N of ``ProfilerStep#N``), ``start_ns`` (rank's own
        clock), and in µs ``step_time_us, compute_us, comm_us, exposed_comm_us, idle_us``.

        Raises: ImportError without pandas.
        """
        return self.sql("""SELECT r.name AS run, s.* EXCLUDE (run_id) FROM step_metrics s
                           JOIN runs r USING (run_id) ORDER BY s.run_id, s.rank, s.step""")

    @property
    def kernels(self) -> pd.DataFrame:
        """Top kernels per run (CPU mode: top ops), as in the report: ``run, name, klass`` (compute /
        communication / memory; CPU: compute / communication), ``count``, ``total_us``, ``mean_us``, ``pct`` (of
        all kernel or op time of the run, summed over ranks). Every kernel is in ``sql("SELECT * FROM kernels")``.

        Raises: ImportError without pandas.
        """
        cols = ["run", "name", "klass", "count", "total_us", "mean_us", "pct"]
        rows = [{"run": r.get("name"), **k} for r in self.model.get("runs", []) for k in r.get("top_kernels") or []]
        return _pd().DataFrame(rows, columns=cols)

    @property
    def collectives(self) -> pd.DataFrame:
        """Collectives matched across ranks, per run, operation and message size: ``run, collective``
        (all_reduce, all_gather, ...), ``size_bytes``, ``count`` (matched calls), ``n_ranks``, ``transfer_us`` (mean
        per call: the shortest duration across ranks), ``wait_us`` (mean per rank per call), ``algbw_gbps``,
        ``busbw_gbps`` (nccl-tests conventions; None when the size is unknown).

        Raises: ImportError without pandas.
        """
        return self.sql("""SELECT r.name AS run, c.* EXCLUDE (run_id) FROM collective_calls c
                           JOIN runs r USING (run_id) ORDER BY c.run_id, c.transfer_us * c.count DESC""")

    @property
    def idle(self) -> pd.DataFrame:
        """GPU idle time per run, rank and stream (HTA ``get_idle_time_breakdown``; GPU runs only): ``run, rank,
        stream, n_kernels``, µs ``idle_us, host_wait_us, kernel_wait_us, other_us``, and their shares of
        ``idle_us`` in % ``host_wait_pct, kernel_wait_pct, other_pct`` (None for a stream without gaps).

        Raises: ImportError without pandas.
        """
        return self.sql("""SELECT r.name AS run, i.* EXCLUDE (run_id) FROM idle_breakdown i
                           JOIN runs r USING (run_id) ORDER BY i.run_id, i.rank, i.stream""")

    @property
    def findings(self) -> pd.DataFrame:
        """The ranked findings of the subject run(s), most impact first: ``run, cause`` (interconnect /
        precision / imbalance / config), ``kind``, ``severity`` (high / medium / low), ``impact_pct`` (share of
        step time that fixing it would win back), ``ranks`` (list of int), ``title``, ``evidence`` (list of
        str), ``recommendation``.

        Raises: ImportError without pandas.
        """
        cols = ["run", "cause", "kind", "severity", "impact_pct", "ranks", "title", "evidence", "recommendation"]
        rows = [{c: f.get(c) for c in cols} for f in self.model.get("findings") or []]
        return _pd().DataFrame(rows, columns=cols)

    # ---- outputs --------------------------------------------------------------------------------------------
    def _check_output(self, name: str, path: str | Path) -> None:
        """Refuse an output that is one of the report's inputs (traces, sidecars) or its database (docs/safety.md:
        outputs never equal inputs). Raises UsageError."""
        inputs = [e["path"] for r in self.model.get("runs") or [] for key in ("files", "sidecars")
                  for e in r.get(key) or [] if isinstance(e, dict) and e.get("path")]
        check_outputs([(name, path)], inputs + ([self.db_path] if self.db_path else []))

    def to_json(self, path: str | Path | None = None) -> str:
        """The report model as JSON text (NaN becomes null); also written to ``path`` when given.

        Raises: OSError when ``path`` cannot be written; UsageError when it is an input of the report.
        """
        text = to_json(page_model(self.model, self.inputs, self.show_paths))
        if path is not None:
            self._check_output("path", path)
            atomic_write_text(path, text)
        return text

    def to_markdown(self, path: str | Path | None = None) -> str:
        """The Markdown summary for a ticket (what ``report --format md`` prints); also written to ``path``.

        Raises: OSError when ``path`` cannot be written; UsageError when it is an input of the report.
        """
        text = render_markdown(page_model(self.model, self.inputs, self.show_paths))
        if path is not None:
            self._check_output("path", path)
            atomic_write_text(path, text)
        return text

    def to_html(self, path: str | Path, *, export: str | Path | None = None,
                max_events: int | None = None) -> Path:
        """Write the self-contained HTML report (what ``traceanalyze report`` writes) and return its path.

        Args:
            path: the HTML file; parent folders are created.
            export: also write the merged multi-rank trace (``*.json[.gz]``, see :meth:`export`) beside the
                report (a relative path is relative to the report's folder) and link it from the report.
            max_events: bound on the merged trace's events (default 2,000,000).

        Raises:
            OSError: a file cannot be written. TraceanalyzeError: ``export`` with no run to export.
        """
        from traceanalyze.export import DEFAULT_MAX_EVENTS, export_beside

        out = Path(path)
        self._check_output("path", out)
        if export is not None:
            from traceanalyze.export import export_target

            self._check_output("export", export_target(out, export))
            link, _ = export_beside(self.con, out, export, max_events=max_events or DEFAULT_MAX_EVENTS)
            self.model["export_path"] = link
        atomic_write_text(out, render_html(page_model(self.model, self.inputs, self.show_paths)))
        return out

    def export(self, path: str | Path, *, run: str | int | None = None,
               max_events: int | None = None) -> ExportResult:
        """Write one Chrome/Perfetto trace of every rank of a run, clocks aligned, findings marked
        (``traceanalyze export``; details in :mod:`traceanalyze.export`).

        Args:
            path: ``*.json`` or ``*.json.gz``. run: run name or id (default: the first subject run).
            max_events: bound on the events written (default 2,000,000).

        Returns:
            :class:`traceanalyze.export.ExportResult` (path, ranks, events kept and dropped, clock offsets).

        Raises:
            TraceanalyzeError: no run with traces, or an unknown run. OSError: the file cannot be written.
        """
        from traceanalyze.export import DEFAULT_MAX_EVENTS, export_trace

        self._check_output("path", path)
        return export_trace(self.con, path, run=run, max_events=max_events or DEFAULT_MAX_EVENTS)

    # ---- display --------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        runs = ", ".join(f"{r.get('name')} ({len(r.get('ranks') or [])} ranks)" for r in self.model.get("runs", []))
        return f"<traceanalyze.Report {runs or 'no run'}: {self.verdict}>"

    def _repr_html_(self) -> str:
        """Compact HTML for Jupyter: verdict, findings table, per-rank table of each run (all text escaped)."""
        e = _html.escape
        parts = ['<div class="traceanalyze-report">',
                 f"<p><b>Verdict:</b> {e(self.verdict)}</p>"]
        findings = self.model.get("findings") or []
        if findings:
            parts.append("<table><thead><tr><th>#</th><th>Severity</th><th>Impact (%)</th><th>Cause</th>"
                         "<th>Finding</th><th>Ranks</th></tr></thead><tbody>")
            for i, f in enumerate(findings, 1):
                ranks = ", ".join(str(r) for r in f.get("ranks") or [])
                parts.append(f"<tr><td>{i}</td><td>{e(str(f.get('severity', '')))}</td>"
                             f"<td>{_num(f.get('impact_pct'), 1)}</td><td>{e(str(f.get('cause', '')))}</td>"
                             f"<td>{e(str(f.get('title', '')))}</td><td>{e(ranks)}</td></tr>")
            parts.append("</tbody></table>")
        else:
            parts.append("<p>No findings.</p>")
        for run in self.model.get("runs") or []:
            parts.append(f"<p><b>Run {e(str(run.get('name')))}</b> ({e(str(run.get('role')))}, "
                         f"{e(str(run.get('mode')))} mode, median step {_num(_ms(run.get('step_time_us')), 2)} ms)</p>")
            ranks = run.get("ranks") or []
            if not ranks:
                continue
            parts.append("<table><thead><tr><th>Rank</th><th>Step (ms)</th><th>Idle (%)</th><th>Compute (%)</th>"
                         "<th>Non-compute (%)</th><th>Overlap (%)</th><th>Exposed comm (ms)</th></tr></thead><tbody>")
            for r in ranks:
                parts.append(f"<tr><td>{e(str(r.get('rank')))}</td><td>{_num(_ms(r.get('step_time_us')), 2)}</td>"
                             f"<td>{_num(r.get('idle_pct'), 2)}</td><td>{_num(r.get('compute_pct'), 2)}</td>"
                             f"<td>{_num(r.get('non_compute_pct'), 2)}</td>"
                             f"<td>{_num(r.get('comm_comp_overlap_pct'), 2)}</td>"
                             f"<td>{_num(_ms(r.get('exposed_comm_us')), 2)}</td></tr>")
            parts.append("</tbody></table>")
        parts.append("<p><small>DataFrames: <code>.ranks</code>, <code>.steps</code>, <code>.kernels</code>, "
                     "<code>.collectives</code>, <code>.idle</code>, <code>.findings</code>; SQL: <code>.sql(...)"
                     "</code>; full report: <code>.to_html(path)</code>.</small></p></div>")
        return "".join(parts)


def _ms(us: Any) -> float | None:
    return us / 1e3 if isinstance(us, (int, float)) and not isinstance(us, bool) else None


def _num(x: Any, digits: int) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or x != x:
        return "—"
    return f"{x:,.{digits}f}"
