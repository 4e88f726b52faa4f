"""Batch: analyze every run of an archive, keep one catalog of them, and flag regressions.

``traceanalyze batch ARCHIVE -o OUTDIR`` finds every run under ARCHIVE (:func:`traceanalyze.discover.discover`:
nested folders, any mix of sizes), analyzes each one with the code path of ``traceanalyze report`` (one
:func:`traceanalyze.pipeline.analyze` per run, its own DuckDB), and writes::

    OUTDIR/catalog.duckdb                 one row per run, all findings, every rank's metrics (tables below)
    OUTDIR/index.html                     every run linked; top-cause distribution; step time over time per group
    OUTDIR/runs/<slug>/report.html|json|duckdb           what ``report`` writes for that run
    OUTDIR/runs/<slug>/regression.html|json|duckdb       a flagged run compared with its group's reference run

**Incremental.** A run is keyed on its files' paths (relative to ARCHIVE), sizes and mtimes (plus the tool
version and the options that change results): a re-run analyzes only new or changed runs, and runs gone from
the archive drop out of the catalog (their ``runs/<slug>`` folder is removed).

**Regressions.** Runs are grouped by what makes them comparable: the model name the logs or configs state, else
the run's folder name (date-, id- and ``traces``-like folder names are skipped: ``llama/2026-11-01/traces`` is
``llama``), plus the world size. Within a group, a run whose step time exceeds ``threshold`` × the median step
time of the group's earlier runs is flagged, and explained against the earlier run closest to that median
exactly as ``report RUN --baseline REF`` does; the finding tied to the largest part of the step-time difference
is named.

**Errors.** One bad run never stops the batch: it gets a catalog row with ``status = 'error'`` and the message,
and the index lists it.

**Beyond one machine.** The per-run work, :func:`analyze_run` and :func:`explain_regression`, is a pure
function of a run's files: it takes a plain dict, writes only under ``OUTDIR/runs/<slug>/`` and returns plain
dicts (the catalog rows); only this process writes the catalog and the index. So any engine that runs Python
functions can fan it out. Two executors are built in: ``local`` (``concurrent.futures.ProcessPoolExecutor``,
one run per process, ``--jobs`` processes) and ``dask`` (``dask.distributed.Client``: a ``LocalCluster`` by
default, or ``--scheduler tcp://host:8786`` for a real cluster whose workers see ARCHIVE and OUTDIR at the same
paths, e.g. on a shared file system, and have traceanalyze installed). Dask rather than Ray or Spark: it is a
pure-Python install (``pip install 'traceanalyze[dask]'``, about 45 MB, a few seconds), its local cluster is one
process tree that needs no service, and its futures API is the one ``concurrent.futures`` already uses here, so
both executors share one code path; Ray brings a large native runtime and its own object store, Spark a JVM.
Nothing here schedules work itself: the executors do.

Catalog tables (``OUTDIR/catalog.duckdb``; open it with ``traceanalyze sql``):

- ``runs``: one row per run (columns in :data:`traceanalyze.store.CATALOG_DDL`): ``run_id`` (the run's folder
  relative to ARCHIVE), ``status`` (ok / partial / error) and ``error``, ``date`` (UTC: the first event of the traces,
  ``baseTimeNanoseconds`` applied, else the folder's mtime; ``date_source`` says which), ``world_size``,
  ``gpu_model``, ``mode``, ``step_time_us``, ``mfu_pct``, the top finding (``top_cause``, ``top_kind``,
  ``top_impact_pct``, ...: the highest-ranked finding of high or medium severity, NULL for a healthy run),
  ``findings`` (JSON, every finding), ``group_key``, the regression verdict (``regression``,
  ``regression_ratio``, ``regression_reference``, ``regression_cause``, ``regression_finding``, ...), and the
  report files (relative to OUTDIR).
- ``findings``: one row per finding of each run (``run_id``, ``pos`` 1 = top, cause, kind, severity, ...).
- ``rank_metrics``: the per-rank metrics of every run (``report``'s ``rank_metrics`` with ``run_id`` the
  catalog's run id).
- ``batches``: one row per ``batch`` invocation (runs analyzed, unchanged, removed, seconds, bytes).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from traceanalyze import pipeline, store
from traceanalyze.discover import discover
from traceanalyze.errors import TraceanalyzeError, UsageError, one_line
from traceanalyze.executors import DaskExecutor, LocalExecutor
from traceanalyze.findings import DIED_KINDS
from traceanalyze.fmt import ranges
from traceanalyze.limits import REGRESSION_THRESHOLD
from traceanalyze.options import Options
from traceanalyze.report import render_batch_index, render_html
from traceanalyze.report.assemble import to_json
from traceanalyze.report.paths import page_model
from traceanalyze.safety import atomic_path, atomic_write_text, check_outputs
from traceanalyze.store import CATALOG_DDL, CATALOG_VERSION
from traceanalyze.version import __version__

# the Options fields a batch takes (``--link-bw``, ``--peak-tflops``): they travel in each task and enter each run's
# fingerprint; every run is parsed by one process (``jobs=1``: the batch runs several at once)
BATCH_OPTIONS = ("link_bw_gbps", "peak_tflops")
_EPOCH_NS = 10**18  # event times above this are epoch ns (after 2001-09-09); below, a trace-relative clock

_RUN_COLUMNS = [name for name, _ in store.table_columns(CATALOG_DDL, "runs")]
_RANK_COLUMNS = [name for name, _ in store.table_columns(CATALOG_DDL, "rank_metrics") if name != "run_id"]
_FINDING_COLUMNS = ["cause", "kind", "severity", "impact_pct", "ranks", "title", "evidence", "recommendation"]
_REGRESSION_COLUMNS = [c for c in _RUN_COLUMNS if c.startswith("regression")]

# folder names that say when or which attempt, not what ran: skipped when naming a run's group
_NOT_A_NAME = re.compile(
    r"^(?:\d{4}[-_.]?\d{2}[-_.]?\d{2}(?:[T_ .-]?\d{2}[-:_.]?\d{2}(?:[-:_.]?\d{2})?)?Z?"   # dates, timestamps
    r"|(?:run|job|attempt|trial|try|seed|rep|repeat|iter|step|v|version)?[-_.]?\d+"       # run_3, 0042
    r"|[0-9a-f]{8,}"                                                                       # hashes
    r"|traces?|profiles?|profiler|logs?|tb|tensorboard|kineto|pt_traces?|torch_traces?|output|outputs)$",
    re.IGNORECASE)
_DATE_AFFIX = re.compile(r"[-_.]?\d{4}-?\d{2}-?\d{2}(?:[T_-]?\d{4,6})?$|^\d{4}-?\d{2}-?\d{2}[-_.]")


@dataclass
class BatchResult:
    """What one :func:`run_batch` did. Run ids are paths relative to the archive."""

    outdir: Path
    catalog: Path
    index: Path
    runs: list[dict]                         # every catalog row, by date
    analyzed: list[str] = field(default_factory=list)     # (re)analyzed by this invocation
    unchanged: list[str] = field(default_factory=list)    # taken from the catalog as they were
    removed: list[str] = field(default_factory=list)      # gone from the archive, dropped from the catalog
    errors: list[str] = field(default_factory=list)       # runs with status error
    regressions: list[str] = field(default_factory=list)  # runs flagged as regressions
    explained: list[str] = field(default_factory=list)    # regressions compared by this invocation
    seconds: float = 0.0
    trace_bytes: int = 0                     # on-disk trace bytes of the runs analyzed by this invocation
    json_bytes: int = 0                      # decompressed JSON bytes of those

    @property
    def runs_per_s(self) -> float:
        return len(self.analyzed) / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.trace_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


# ---------------------------------------------------------------------------------------------------------
# Per-run work: pure functions of a run's files (plain dicts in and out; writes only under runs/<slug>/)

def analyze_run(task: dict) -> dict:
    """Analyze one run exactly as ``traceanalyze report`` does and write its report files.

    Args:
        task: ``{"run_id", "slug", "path", "files", "outdir", "fingerprint", "n_files", "trace_bytes",
            "link_bw_gbps", "peak_tflops"}`` (plain values: it travels to other processes or machines).

    Returns:
        ``{"run": catalog row (dict), "findings": [dict], "rank_metrics": [dict]}``. Never raises for a bad
        run: the row then has ``status = "error"`` and the message.
    """
    t0 = time.perf_counter()
    out = Path(task["outdir"]) / "runs" / task["slug"]
    out.mkdir(parents=True, exist_ok=True)
    rel = f"runs/{task['slug']}"
    row: dict = {c: None for c in _RUN_COLUMNS}
    row.update(run_id=task["run_id"], path=task["path"], slug=task["slug"], status="error",
               fingerprint=task["fingerprint"], n_files=task["n_files"], trace_bytes=task["trace_bytes"],
               json_bytes=0, group_name=_folder_group_name(task["run_id"]), name=Path(task["path"]).name,
               analyzed_at=_dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None), regression=False)
    row["date"], row["date_source"] = _mtime_date(task["path"]), "mtime"
    result = {"run": row, "findings": [], "rank_metrics": []}
    try:
        a = pipeline.analyze(task["files"], run_options(task, out / "report.duckdb"))
    except Exception as exc:  # a bad run must not stop the batch: its row says why
        row["error"] = one_line(exc)
        row["analyze_s"] = round(time.perf_counter() - t0, 3)
        row["group_key"] = _group_key(row["group_name"], None)
        return result
    try:
        _fill_row(a, row, result, out, rel, page_model(a.model, [task["path"]], bool(task.get("show_paths"))))
    except Exception as exc:
        row["status"], row["error"] = "error", one_line(exc)
    finally:
        a.con.close()
    row["group_key"] = _group_key(row["group_name"], row["world_size"])
    row["analyze_s"] = round(time.perf_counter() - t0, 3)
    return result


def run_options(task: dict, db: Path, baseline: list | None = None) -> Options:
    """The :class:`Options` of one run's analysis: the batch's options (:data:`BATCH_OPTIONS`) that ``task``
    carries, its database and, for a regression's comparison, the reference run's files as the baseline."""
    return Options(baseline=baseline, db=db, jobs=1, show_paths=bool(task.get("show_paths")),
                   **{k: task.get(k) for k in BATCH_OPTIONS})


def _fill_row(a, row: dict, result: dict, out: Path, rel: str, page: dict) -> None:
    """Write one analyzed run's report files (``page``: its model as the pages show it) and fill its catalog row,
    rank metrics and findings."""
    model = a.model
    run = next((r for r in model["runs"] if r.get("role") == "subject"), model["runs"][0])
    atomic_write_text(out / "report.json", to_json(page))
    row["report_json"] = f"{rel}/report.json"
    atomic_write_text(out / "report.html", render_html(page))
    row["report_html"], row["report_db"] = f"{rel}/report.html", f"{rel}/report.duckdb"
    rid = run["run_id"]
    first_ns, json_bytes = a.con.execute(
        "WITH f AS (SELECT file_id FROM files WHERE run_id = $1) "
        "SELECT least((SELECT min(ts_ns) FROM cpu_ops WHERE file_id IN (SELECT file_id FROM f)), "
        "(SELECT min(ts_ns) FROM kernels WHERE file_id IN (SELECT file_id FROM f))), "
        "(SELECT sum(bytes_read) FROM files WHERE run_id = $1)", [rid]).fetchone()
    row["json_bytes"] = int(json_bytes or 0)
    if first_ns is not None and first_ns > _EPOCH_NS:
        row["date"] = _dt.datetime.fromtimestamp(first_ns / 1e9, _dt.timezone.utc).replace(tzinfo=None)
        row["date_source"] = "trace"
    facts = run.get("log_facts") or {}
    if facts.get("model_name"):
        row["group_name"] = str(facts["model_name"][0])
    findings = model.get("findings") or []
    top = next((f for f in findings if f.get("severity") in ("high", "medium")), None)
    mfu = run.get("mfu_pct")  # model FLOPs over the step against the GPU's best dense peak
    if mfu is None:
        mfu = a.con.execute("SELECT median(mfu_pct) FROM log_steps WHERE run_id = ?", [rid]).fetchone()[0]
    row.update(name=run.get("name"), world_size=run.get("world_size"), backend=run.get("backend"),
               mode=run.get("mode"), gpu_model=run.get("gpu_model"), step_time_us=run.get("step_time_us"),
               mfu_pct=mfu, verdict=model.get("verdict"), n_findings=len(findings),
               step_time_unprofiled_us=(run.get("profiler_overhead") or {}).get("unprofiled_step_time_us"),
               step_time_unprofiled_source=(run.get("profiler_overhead") or {}).get("source"),
               findings=json.dumps(findings, default=str))
    row.update(died_summary(findings, run.get("deaths") or []))
    if top is not None:
        row.update(top_cause=top["cause"], top_kind=top["kind"], top_severity=top["severity"],
                   top_impact_pct=top["impact_pct"], top_title=top["title"])
    cols = [d[0] for d in a.con.execute("SELECT * FROM rank_metrics LIMIT 0").description]
    for vals in a.con.execute("SELECT * FROM rank_metrics WHERE run_id = ? ORDER BY rank", [rid]).fetchall():
        d = dict(zip(cols, vals, strict=True))
        result["rank_metrics"].append({c: d.get(c) for c in _RANK_COLUMNS})
    result["findings"] = [{c: (json.dumps(f.get(c)) if c in ("ranks", "evidence") else f.get(c))
                           for c in _FINDING_COLUMNS} for f in findings]
    problems = [w for w in model.get("warnings") or [] if w.get("level") in ("error", "partial")]
    usable = (any((r.get("window_us") or 0) > 0 for r in run.get("ranks") or []) or run.get("log_steps")
              or row["died"])
    if not usable:
        row["status"] = "error"
        row["error"] = "nothing could be analyzed: " + ("; ".join(_warning_text(w) for w in problems[:3])
                                                         or "no rank has any activity and no log has steps")
        result["rank_metrics"] = []  # empty ranks: nothing to compare with other runs
    else:
        row["status"] = "partial" if problems else "ok"
        row["error"] = "; ".join(_warning_text(w) for w in problems[:3]) or None


def died_summary(findings: list[dict], deaths: list[dict]) -> dict:
    """The catalog's ``died``, ``died_kind`` and ``died_ranks`` of a run from its report's findings of
    :data:`~traceanalyze.findings.DIED_KINDS` (``cuda_oom``: "CUDA OOM on rank 6"; ``host_oom``: "host OOM: 8 ranks
    SIGKILLed"; both: joined by "; ") and its ``deaths`` records (the processes killed when no rank is named);
    all None for a run that did not die."""
    died = [f for f in findings if f.get("kind") in DIED_KINDS]
    if not died:
        return {"died": None, "died_kind": None, "died_ranks": None}
    parts, all_ranks = [], set()
    for f in died:
        ranks = sorted({r for r in f.get("ranks") or [] if isinstance(r, int)})
        all_ranks.update(ranks)
        if f["kind"] == "cuda_oom":
            parts.append("CUDA OOM" + (f" on rank {ranks[0]}" if len(ranks) == 1 else
                                       f" on ranks {ranges(ranks)}" if ranks else ""))
        else:
            n = len(ranks) or sum(1 for d in deaths if d.get("kind") == "host")
            who = (f"rank {ranks[0]}" if len(ranks) == 1 else f"{n} ranks" if ranks else
                   f"{n} process{'es' if n != 1 else ''}")
            parts.append(f"host OOM: {who} SIGKILLed")
    return {"died": "; ".join(parts), "died_kind": died[0]["kind"], "died_ranks": json.dumps(sorted(all_ranks))}


def explain_regression(task: dict) -> dict:
    """Compare a flagged run with its reference run, as ``report RUN --baseline REF`` does.

    Args:
        task: ``{"run_id", "slug", "outdir", "files", "ref_files", "ref_run_id", "regression_key",
            "link_bw_gbps", "peak_tflops"}``.

    Returns:
        The ``regression_*`` columns of the run's catalog row that the comparison fills (part, delta, cause,
        kind, finding, report, key, error). Never raises.
    """
    out = Path(task["outdir"]) / "runs" / task["slug"]
    res = {"regression_key": task["regression_key"], "regression_part": None, "regression_delta_us": None,
           "regression_cause": None, "regression_kind": None, "regression_finding": None,
           "regression_report": None, "regression_error": None}
    db = out / "regression.duckdb"
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not db.exists() and (out / "report.duckdb").exists():
            with atomic_path(db) as tmp:  # the run's traces are parsed already: a warm cache, never half a copy
                shutil.copyfile(out / "report.duckdb", tmp)
        a = pipeline.analyze(task["files"], run_options(task, db, task["ref_files"]))
    except Exception as exc:
        res["regression_error"] = one_line(exc)
        return res
    try:
        model = a.model
        page = page_model(model, (), bool(task.get("show_paths")))  # paths from each run's folder
        atomic_write_text(out / "regression.json", to_json(page))
        atomic_write_text(out / "regression.html", render_html(page))
        res["regression_report"] = f"runs/{task['slug']}/regression.html"
        comp = model.get("comparison") or {}
        res["regression_delta_us"] = comp.get("delta_us")
        findings = model.get("findings") or []
        parts = sorted((p for p in comp.get("parts") or [] if (p.get("delta_us") or 0) > 0),
                       key=lambda p: -p["delta_us"])
        chosen = None
        for p in parts:
            if p.get("finding"):
                chosen = next((f for f in findings if f.get("title") == p["finding"]), None)
                if chosen is not None:
                    res["regression_part"] = p["part"]
                    break
        if parts and res["regression_part"] is None:
            res["regression_part"] = parts[0]["part"]
        if chosen is None:  # no part tied to a finding: the comparison's top finding
            chosen = next((f for f in findings if f.get("severity") in ("high", "medium")), None)
        if chosen is not None:
            res.update(regression_cause=chosen["cause"], regression_kind=chosen["kind"],
                       regression_finding=chosen["title"])
    except Exception as exc:
        res["regression_error"] = one_line(exc)
    finally:
        a.con.close()
    return res


def _warning_text(w: dict) -> str:
    return f"{Path(w['file']).name}: {w['message']}" if w.get("file") else str(w.get("message"))


def _mtime_date(path: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromtimestamp(os.stat(path).st_mtime, _dt.timezone.utc).replace(tzinfo=None)
    except OSError:
        return None


def _folder_group_name(run_id: str) -> str:
    """The name of what ran, from the run's folder path: the deepest folder whose name is not a date, a
    timestamp, an attempt number, a hash or a generic ``traces``/``logs`` folder (a date affix is cut)."""
    parts = [p for p in run_id.replace("\\", "/").split("/") if p and p != "."]
    for p in reversed(parts):
        if not _NOT_A_NAME.match(p):
            return _DATE_AFFIX.sub("", p) or p
    return parts[-1] if parts else run_id


def _group_key(name: str | None, world_size: int | None) -> str:
    return f"{name or '?'} / {world_size if world_size else '?'} ranks"


# ---------------------------------------------------------------------------------------------------------
# The batch

def find_runs(archive: str | Path) -> list[dict]:
    """Every run under ``archive``: ``{"run_id", "path", "files", "traces", "n_files", "trace_bytes",
    "stat"}``, where ``stat`` lists ``(path, size, mtime_ns)`` of each file (the incremental key)."""
    root = Path(archive)
    disc = discover([root])
    rroot = root.resolve()
    specs = []
    for run in disc.runs:
        files = [str(p) for p in run.traces] + [str(s.path) for s in run.sidecars]
        stat = []  # paths relative to the archive: a moved or re-mounted archive is not analyzed again
        for f in files:
            fr = Path(f).resolve()
            name = fr.relative_to(rroot).as_posix() if fr.is_relative_to(rroot) else str(fr)
            try:
                st = os.stat(f)
                stat.append((name, st.st_size, st.st_mtime_ns))
            except OSError:
                stat.append((name, -1, -1))
        try:
            rel = run.path.resolve().relative_to(rroot).as_posix()
        except ValueError:
            rel = run.path.as_posix()
        rel = rel if rel not in ("", ".") else (rroot.name or "run")
        trace_set = {str(p) for p in run.traces}
        specs.append({"run_id": rel, "path": str(run.path.resolve()), "files": files,
                      "n_files": len(files), "stat": sorted(stat),
                      "trace_bytes": sum(s for f, (_, s, _) in zip(files, stat, strict=True)
                                         if f in trace_set and s > 0)})
    return specs


def _fingerprint(spec: dict, options: dict) -> str:
    h = hashlib.sha256(f"traceanalyze {__version__} catalog {CATALOG_VERSION}\n".encode())
    h.update(json.dumps(options, sort_keys=True).encode())
    for p, size, mtime in spec["stat"]:
        h.update(f"\n{p}\t{size}\t{mtime}".encode())
    return h.hexdigest()


def _slug(run_id: str) -> str:
    s = "__".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", p).strip("._") or "_" for p in run_id.split("/"))
    return s[:150] or "run"


def open_catalog(path: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (create) the catalog database. Raises :class:`TraceanalyzeError` when it is in use or unusable, and
    :class:`~traceanalyze.errors.UsageError` (file untouched) for a file that is not a traceanalyze batch catalog
    (:func:`traceanalyze.store.check_own_db`); an unmarked catalog of an earlier traceanalyze gets the marker."""
    if not read_only:
        store.check_own_db(path, "catalog")
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0]
        if "lock" in first.lower():
            raise TraceanalyzeError(f"{path}: in use by another process (is another batch running on this "
                                    "output folder?)") from None
        raise TraceanalyzeError(f"{path}: cannot open the catalog ({first})") from None
    if not read_only:
        store.create_catalog(con)
    return con


def run_batch(archive: str | Path, outdir: str | Path, *, jobs: int | None = None, executor: str = "local",
              scheduler: str | None = None, threshold: float = REGRESSION_THRESHOLD, force: bool = False,
              link_bw_gbps: float | None = None, peak_tflops: float | None = None, show_paths: bool = False,
              on_run: Callable[[dict], None] | None = None, dask_processes: bool = True) -> BatchResult:
    """Analyze every new or changed run under ``archive``; update ``outdir``'s catalog, reports and index.

    Args:
        archive: folder holding runs (any depth).
        outdir: output folder (catalog.duckdb, index.html, runs/).
        jobs: runs analyzed at once (default: CPU count); each run is parsed by one process.
        executor: ``"local"`` (processes on this machine) or ``"dask"``.
        scheduler: Dask scheduler address (``tcp://host:8786``); implies ``executor="dask"``.
        threshold: a run is a regression above ``threshold`` × its group's median step time of earlier runs.
        force: re-analyze every run, changed or not.
        link_bw_gbps, peak_tflops, show_paths: as for ``report`` (``--link-bw``, ``--peak-tflops``,
            ``--show-paths``).
        on_run: called with each run's catalog row as its analysis finishes.
        dask_processes: Dask local cluster with worker processes (False: threads in this process).

    Returns:
        :class:`BatchResult`.

    Raises:
        TraceanalyzeError: the archive does not exist or holds no run, the catalog is in use, or the executor
            cannot start.
    """
    t0 = time.perf_counter()
    started = _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)
    archive, outdir = Path(archive), Path(outdir)
    if not archive.is_dir():
        raise TraceanalyzeError(f"{archive}: no such folder")
    jobs = jobs or os.cpu_count() or 1
    if scheduler:
        executor = "dask"
    opts = Options(link_bw_gbps=link_bw_gbps, peak_tflops=peak_tflops, show_paths=show_paths)  # checked first
    # plain values: tasks travel to other processes
    options = {**{k: getattr(opts, k) for k in BATCH_OPTIONS}, "show_paths": opts.show_paths}
    specs = find_runs(archive)
    if not specs:
        raise TraceanalyzeError(f"{archive}: no run found (no Kineto trace or training log in any folder)")
    # outputs: never an input of any run (docs/safety.md), checked before anything is written
    check_outputs([("catalog", outdir / "catalog.duckdb"), ("index", outdir / "index.html")],
                  [f for s in specs for f in s["files"]], [archive])
    if outdir.resolve() == archive.resolve():
        raise UsageError(f"-o {outdir}: is the archive itself; write the batch output to another folder")
    if archive.resolve().is_relative_to(outdir.resolve()):
        # runs that leave the archive have their output folders removed: never where the archive lies
        raise UsageError(f"-o {outdir}: holds the archive {archive}; write the batch output to another folder")
    outdir.mkdir(parents=True, exist_ok=True)
    con = open_catalog(outdir / "catalog.duckdb")
    (outdir / "runs").mkdir(exist_ok=True)
    try:
        return _run(con, archive, outdir, specs, options, jobs, executor, scheduler, threshold, force, on_run,
                    dask_processes, t0, started)
    finally:
        con.close()


def _run(con, archive, outdir, specs, options, jobs, executor_name, scheduler, threshold, force, on_run,
         dask_processes, t0, started) -> BatchResult:
    known = {r[0]: (r[1], r[2], r[3]) for r in
             con.execute("SELECT run_id, fingerprint, slug, report_html FROM runs").fetchall()}
    res = BatchResult(outdir=outdir, catalog=outdir / "catalog.duckdb", index=outdir / "index.html", runs=[])
    tasks = _tasks(con, known, res, outdir, specs, options, force)
    tasks.sort(key=lambda t: -t["trace_bytes"])  # biggest first: the long runs do not finish last
    ex = None
    try:
        if tasks:
            ex = _executor(executor_name, jobs, scheduler, dask_processes)
            for task, out, err in ex.results(analyze_run, tasks):
                if out is None:  # the worker itself failed (died, or the executor lost it)
                    out = {"run": {c: None for c in _RUN_COLUMNS}, "findings": [], "rank_metrics": []}
                    out["run"].update(run_id=task["run_id"], path=task["path"], slug=task["slug"], status="error",
                                      error=err, fingerprint=task["fingerprint"], n_files=task["n_files"],
                                      trace_bytes=task["trace_bytes"], date=_mtime_date(task["path"]),
                                      date_source="mtime", group_name=_folder_group_name(task["run_id"]),
                                      regression=False)
                    out["run"]["group_key"] = _group_key(out["run"]["group_name"], None)
                _store(con, out)
                res.analyzed.append(task["run_id"])
                res.trace_bytes += int(out["run"].get("trace_bytes") or 0)
                res.json_bytes += int(out["run"].get("json_bytes") or 0)
                if on_run is not None:
                    on_run(out["run"])
        explain = _flag_regressions(con, specs, threshold, outdir, options)
        if explain:
            if ex is None:
                ex = _executor(executor_name, jobs, scheduler, dask_processes)
            for task, out, err in ex.results(explain_regression, explain):
                if out is None:
                    out = {"regression_key": task["regression_key"], "regression_error": err}
                sets = ", ".join(f"{k} = ?" for k in out)
                con.execute(f"UPDATE runs SET {sets} WHERE run_id = ?", [*out.values(), task["run_id"]])
                res.explained.append(task["run_id"])
    finally:
        if ex is not None:
            ex.close()
    rows = _catalog_rows(con)
    res.runs = rows
    res.errors = [r["run_id"] for r in rows if r["status"] == "error"]
    res.regressions = [r["run_id"] for r in rows if r["regression"]]
    res.seconds = time.perf_counter() - t0
    atomic_write_text(res.index, render_batch_index(rows, archive=str(archive.resolve()), threshold=threshold,
                                                    stats=res))
    res.seconds = time.perf_counter() - t0
    con.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [started, round(res.seconds, 3), str(archive.resolve()), executor_name, jobs, len(rows),
                 len(res.analyzed), len(res.unchanged), len(res.removed), len(res.errors), len(res.regressions),
                 res.trace_bytes, res.json_bytes])
    return res


def _tasks(con, known: dict, res: BatchResult, outdir: Path, specs: list[dict], options: dict, force: bool
           ) -> list[dict]:
    """Drop the runs gone from the archive, keep the unchanged ones; return the tasks of the runs to analyze."""
    current = {s["run_id"] for s in specs}
    # runs gone from the archive: out of the catalog, their outputs removed
    for run_id, (_, slug, _) in known.items():
        if run_id not in current:
            _delete_run(con, run_id)
            target = (outdir / "runs" / slug) if slug else None
            if target is not None and target.is_dir() and target.resolve().parent == (outdir / "runs").resolve():
                shutil.rmtree(target, ignore_errors=True)
            res.removed.append(run_id)
    # compared case-folded: runs/RUN and runs/run are one folder on a case-insensitive file system
    taken = {v[1].casefold() for k, v in known.items() if k in current and v[1]}
    tasks = []
    for s in specs:
        fp = _fingerprint(s, options)
        s["fingerprint"] = fp
        old = known.get(s["run_id"])
        if old is not None and old[1]:
            s["slug"] = old[1]
        else:
            slug = _slug(s["run_id"])
            if slug.casefold() in taken:
                slug = f"{slug}-{hashlib.sha1(s['run_id'].encode()).hexdigest()[:8]}"
            s["slug"] = slug
            taken.add(slug.casefold())
        fresh = (old is not None and old[0] == fp and not force
                 and (old[2] is None or (outdir / old[2]).exists()))
        if fresh:
            res.unchanged.append(s["run_id"])
            con.execute("UPDATE runs SET path = ? WHERE run_id = ?", [s["path"], s["run_id"]])
            continue
        tasks.append({"run_id": s["run_id"], "slug": s["slug"], "path": s["path"], "files": s["files"],
                      "outdir": str(outdir.resolve()), "fingerprint": fp, "n_files": s["n_files"],
                      "trace_bytes": s["trace_bytes"], **options})
    return tasks


def _executor(name: str, jobs: int, scheduler: str | None, processes: bool):
    if name == "dask":
        return DaskExecutor(jobs, scheduler, processes=processes)
    if name != "local":
        raise TraceanalyzeError(f"unknown executor {name!r} (local or dask)")
    return LocalExecutor(jobs)


def _delete_run(con, run_id: str) -> None:
    for t in ("runs", "findings", "rank_metrics"):
        con.execute(f"DELETE FROM {t} WHERE run_id = ?", [run_id])


def _store(con, out: dict) -> None:
    """Replace one run's rows in the catalog, in one transaction (an interrupted batch keeps finished runs)."""
    row = out["run"]
    con.execute("BEGIN TRANSACTION")
    try:
        _delete_run(con, row["run_id"])
        con.execute(f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES ({', '.join('?' * len(_RUN_COLUMNS))})",
                    [row.get(c) for c in _RUN_COLUMNS])
        for i, f in enumerate(out["findings"], start=1):
            con.execute(f"INSERT INTO findings (run_id, pos, {', '.join(_FINDING_COLUMNS)}) "
                        f"VALUES (?, ?, {', '.join('?' * len(_FINDING_COLUMNS))})",
                        [row["run_id"], i, *[f.get(c) for c in _FINDING_COLUMNS]])
        if out["rank_metrics"]:
            con.executemany(f"INSERT INTO rank_metrics (run_id, {', '.join(_RANK_COLUMNS)}) "
                            f"VALUES (?, {', '.join('?' * len(_RANK_COLUMNS))})",
                            [[row["run_id"], *[m.get(c) for c in _RANK_COLUMNS]] for m in out["rank_metrics"]])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _catalog_rows(con) -> list[dict]:
    rel = con.execute("SELECT * FROM runs ORDER BY date DESC NULLS LAST, run_id")
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]


def _flag_regressions(con, specs: list[dict], threshold: float, outdir: Path, options: dict) -> list[dict]:
    """Flag, per group, the runs slower than ``threshold`` × the median step time of the group's earlier runs;
    return the comparisons to (re)do. A run that died is neither flagged nor an earlier run of its group: its step
    time, if any, is of a run that never finished. Every run's flag is recomputed: a run added with an earlier date
    changes the history of the runs after it."""
    by_id = {s["run_id"]: s for s in specs}
    rows = con.execute("SELECT run_id, group_key, date, step_time_us, fingerprint, regression_key, "
                       "regression_report FROM runs WHERE status IN ('ok', 'partial') AND step_time_us > 0 "
                       "AND died IS NULL AND date IS NOT NULL ORDER BY group_key, date, run_id").fetchall()
    groups: dict[str, list[tuple]] = {}
    for r in rows:
        groups.setdefault(r[1], []).append(r)
    flagged: dict[str, dict] = {}
    for members in groups.values():
        for i, (run_id, _, date, step, fp, old_key, old_report) in enumerate(members):
            earlier = [m for m in members[:i] if m[2] < date]
            if not earlier:
                continue
            med = statistics.median(m[3] for m in earlier)
            ratio = step / med
            if ratio <= threshold:
                continue
            ref = min(reversed(earlier), key=lambda m: abs(m[3] - med))  # closest to the median, latest on ties
            key = f"{fp}:{ref[4]}"
            flagged[run_id] = {"ratio": ratio, "median": med, "ref": ref[0], "key": key,
                               "redo": key != old_key or not old_report or not (outdir / old_report).exists()}
    keep = ", ".join(f"{c} = NULL" for c in _REGRESSION_COLUMNS if c != "regression")
    con.execute(f"UPDATE runs SET regression = false, {keep} WHERE run_id NOT IN (SELECT unnest(?::VARCHAR[]))",
                [list(flagged)])
    tasks = []
    for run_id, f in flagged.items():
        con.execute("UPDATE runs SET regression = true, regression_ratio = ?, regression_median_us = ?, "
                    "regression_reference = ? WHERE run_id = ?", [round(f["ratio"], 3), f["median"], f["ref"], run_id])
        if f["redo"] and run_id in by_id and f["ref"] in by_id:
            slug = con.execute("SELECT slug FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
            tasks.append({"run_id": run_id, "slug": slug, "outdir": str(outdir.resolve()),
                          "files": by_id[run_id]["files"], "ref_files": by_id[f["ref"]]["files"],
                          "ref_run_id": f["ref"], "regression_key": f["key"], **options})
    return tasks
