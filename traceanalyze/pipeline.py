"""The flow in one call: discover → ingest/store → metrics → diagnose → a report model (a plain dict).

:func:`analyze` is what the CLI and the Python API run. The report model it builds is what the HTML,
JSON and Markdown renderers read; its JSON shape is documented in ``docs/schema.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from traceanalyze import hardware, ingest, store
from traceanalyze.discover import Discovery, Run, assign_ranks, check_headers, discover, window_grouping
from traceanalyze.errors import TraceanalyzeError
from traceanalyze.executors import DaskExecutor, map_large_blocks, release_free_memory
from traceanalyze.findings import DIED_KINDS
from traceanalyze.fmt import ranges, rank_spans
from traceanalyze.limits import MAX_OOM_EVENTS
from traceanalyze.safety import check_outputs
from traceanalyze.version import __version__

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from traceanalyze import diagnose, metrics
# diagnose, metrics (NumPy), logs and concurrent.futures (with logging: 7 ms) are imported where used: a cached
# re-run needs none of them

@dataclass
class Analysis:
    """Result of :func:`analyze`: the open database and the report model.

    ``model`` is the dict written as the JSON report: ``{"tool", "generated_at", "runs", "findings",
    "warnings", "skipped"}``; each run holds ``ranks`` (per-rank metrics), ``steps`` and ``top_kernels``.
    """

    con: duckdb.DuckDBPyConnection
    model: dict
    db_path: str | None = None
    discovery: Discovery | None = None
    errors: list[str] = field(default_factory=list)
    cached: bool = False  # the model came from the report cache: nothing was written


def analyze(inputs: list[str | Path] | str | Path, *, db: str | Path | None = None,
            baseline: list[str | Path] | str | Path | None = None, jobs: int | None = None,
            progress: Callable[[int], None] | None = None, on_total: Callable[[int], None] | None = None,
            link_bw_gbps: float | None = None, peak_tflops: float | None = None,
            max_decompressed: int | None = None, gpu: str | None = None,
            outputs: list[tuple[str, str | Path | None]] | None = None,
            follow_external_symlinks: bool = False, executor: str = "local",
            scheduler: str | None = None, read_only_hit: bool = False) -> Analysis:
    """Analyze every run found under ``inputs`` (and ``baseline``, when given) end to end.

    Args:
        inputs: folders or files holding the traces (and logs) of the run(s) to explain.
        db: DuckDB file to write (reused as a parse cache on a re-run); None keeps it in memory.
        baseline: folders or files of a run to compare against (the fast one).
        jobs: processes for parsing (default: CPU count).
        progress: called with the byte size of each trace file as it is loaded.
        on_total: called once with the total byte size of the trace files, before loading.
        link_bw_gbps: expected per-direction link bandwidth (GB/s) to judge busbw against; overrides what the
            topology, NCCL transport or GPU model suggest.
        peak_tflops: dense peak TFLOPS of the GPU for MFU; overrides the datasheet table.
        max_decompressed: bound in bytes on what one trace may inflate to (gzip bombs); default
            :data:`traceanalyze.ingest.parse.DEFAULT_MAX_DECOMPRESSED`. A file over it is an error row, the rest go on.
        gpu: the GPU when a trace's ``deviceProperties`` do not say (``--gpu``): a name or a compute capability
            (:func:`traceanalyze.hardware.parse_gpu_option`); GPU-dependent advice reads it.
        outputs: (option name, path) of the files the caller will write; checked with ``db`` against every
            input file once they are discovered, before anything is written
            (:func:`traceanalyze.safety.check_outputs`).
        follow_external_symlinks: read files and walk folders that symlinks inside an input folder point to
            outside it; without it they are skipped with a warning (:func:`traceanalyze.discover.discover`).
        executor: ``"local"`` (processes here) or ``"dask"``: the per-rank parse runs on a Dask cluster, with the
            executor of ``traceanalyze batch`` (:class:`traceanalyze.executors.DaskExecutor`, ``jobs`` local workers
            unless ``scheduler`` is given); the workers write Arrow IPC streams beside ``db`` that this process
            loads, so its memory is bounded by a file's part, not by the traces.
        scheduler: address of a running Dask scheduler (``tcp://host:8786``); implies ``executor="dask"``. Its
            workers must see the traces and the database's folder at the same paths.
        read_only_hit: a cached report may come with a read-only connection (no file access from SQL): what the
            command line takes when it only writes the reports, for one open of the database instead of two.

    Returns:
        :class:`Analysis`.

    Raises:
        TraceanalyzeError: no trace file at all, the database is locked or unusable, or an input is missing.
        UsageError: an output (or ``db``) is an input, two outputs share a path, or ``db`` is a file that is not
            a traceanalyze report database (left untouched).
    """
    subject_in = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    base_in = [] if baseline is None else ([baseline] if isinstance(baseline, (str, Path)) else list(baseline))
    disc, roles = _discover(subject_in, base_in, follow_external_symlinks)
    _check_outputs(disc, subject_in + base_in, db, outputs)
    all_paths = [p for r in disc.runs for p in r.traces]
    known: dict = {}  # each file's cache key and fingerprint, read once for the report's key and the load
    cache_key = _cache_key(disc, roles, link_bw_gbps, peak_tflops, max_decompressed, gpu, follow_external_symlinks,
                           known)
    con, cached = _open(db, cache_key, all_paths, progress, read_only_hit)
    if cached is not None:  # same inputs, same options, same tool: the stored report is still the answer
        return Analysis(con=con, model=cached, db_path=str(db) if db else None, discovery=disc, cached=True)
    if on_total:
        on_total(sum(_size(p) for p in all_paths))
    bound = {} if max_decompressed is None else {"max_decompressed": max_decompressed}
    loaded = {lf.path: lf for lf in _load(con, all_paths, jobs, progress, dict(bound, known=known), executor,
                                          scheduler, db)}
    release_free_memory()  # what loading freed (Arrow chunks, file lists) is not held through the analyses
    map_large_blocks()  # the replay's large arrays given back when freed, not left as holes in the heap
    ingest.forget_files(con, all_paths)  # rows of files that left the folder (README, Safety: never stale)
    # once per parse: the count stays in files.message for cached re-runs
    ingest.drop_impossible_durations(con, [lf.file_id for lf in loaded.values()
                                           if not lf.cached and lf.file_id is not None and lf.error is None])
    warnings = _reset_report(con, disc)
    runs_model, evidence, all_findings = _diagnose_runs(con, disc, roles, loaded, warnings, link_bw_gbps,
                                                        peak_tflops, gpu, max_decompressed)
    comparison = _compare(runs_model, evidence, all_findings)
    model = _report_model(con, runs_model, evidence, all_findings, warnings, comparison)
    con.execute("INSERT INTO report_cache VALUES (?, ?)", [cache_key, to_json(model, indent=None)])
    errors = [w["message"] if w["file"] is None else f"{w['file']}: {w['message']}" for w in warnings
              if w.get("level") == "error"]
    return Analysis(con=con, model=model, db_path=str(db) if db else None, discovery=disc, errors=errors)


def _open(db, cache_key: str, all_paths: list[Path], progress, read_only_hit: bool):
    """(the database's connection, the cached report model or None). With ``read_only_hit``, a database whose schema
    is current is first opened read-only (:func:`store.open_if_current`): a hit needs nothing else."""
    if read_only_hit and (ro := store.open_if_current(db)) is not None:
        cached = _from_cache(ro, cache_key, all_paths, progress)
        if cached is not None:
            return ro, cached
        ro.close()
    con = store.connect(db)
    return con, _from_cache(con, cache_key, all_paths, progress)


def _discover(subject_in: list, base_in: list, follow: bool) -> tuple[Discovery, dict]:
    """Every run of the inputs and of the baseline, with each run's role (``subject`` / ``baseline``).

    Raises:
        TraceanalyzeError: no run at all (each file that was there is named, with why it was skipped).
    """
    disc = discover(subject_in, follow_external_symlinks=follow)
    roles = {id(r): "subject" for r in disc.runs}
    if base_in:
        bdisc = discover(base_in, follow_external_symlinks=follow)
        for r in bdisc.runs:
            roles[id(r)] = "baseline"
            r.name = f"{r.name} (baseline)" if any(r.name == s.name for s in disc.runs) else r.name
        disc = Discovery(runs=disc.runs + bdisc.runs, skipped=disc.skipped + bdisc.skipped,
                         unreadable=disc.unreadable + bdisc.unreadable, warned=disc.warned + bdisc.warned)
    if not disc.runs:
        where = ", ".join(str(p) for p in subject_in)
        unreadable = set(disc.unreadable)
        # every file that was there, with why it was skipped: unreadable ones first
        listed = [f"{f}: {m.removesuffix('; skipped')}" for f, m in disc.skipped if f in unreadable] + [
            f"{f}: {m.removesuffix('; skipped')}" for f, m in [*disc.skipped, *disc.ignored] if f not in unreadable]
        more = f" (and {len(listed) - 5} more)" if len(listed) > 5 else ""
        files = "; ".join(listed[:5]) + more
        if unreadable:  # say which files were there but could not be read
            raise TraceanalyzeError(f"{where}: no readable trace or log; {files}")
        raise TraceanalyzeError(f"{where}: no Kineto trace or training log found (looked for *.json and *.json.gz "
                                "with a traceEvents array, and for logs, NCCL output, topology and configs)"
                                + (f"; skipped {files}" if listed else "; the input holds no files"))
    return disc, roles


def _from_cache(con, cache_key: str, all_paths: list[Path], progress) -> dict | None:
    """The stored report model of the same inputs and options, stamped now, or None."""
    cached = _cached_model(con, cache_key)
    if cached is not None:  # same inputs, same options, same tool: the stored report is still the answer
        cached["generated_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        cached["cached"] = True
        for run in cached["runs"]:
            for f in run["files"]:
                f["cached"] = True
        if progress:
            for p in all_paths:
                progress(_size(p))
    return cached


def _reset_report(con, disc: Discovery) -> list[dict]:
    """Empty the per-report tables; return the warning rows of the files discovery skipped or ignored."""
    for t in store.REPORT_TABLES:
        con.execute(f"DELETE FROM {t}")
    con.execute("UPDATE files SET run_id = NULL, rank = NULL, \"window\" = NULL")
    con.execute(store.METRIC_TABLES)
    con.execute(store.IDLE_TABLE)
    unreadable, warned = set(disc.unreadable), set(disc.warned)
    warnings: list[dict] = [{"file": f, "message": m,
                             "level": "error" if f in unreadable else "warning" if f in warned else "info"}
                            for f, m in disc.skipped]
    # every file walked and not used is listed too, with its folder (the Data quality table) and why: info only
    warnings += [{"file": f, "message": f"{m}; skipped", "level": "info"} for f, m in disc.ignored]
    return warnings


def _diagnose_runs(con, disc: Discovery, roles: dict, loaded, warnings: list[dict], link_bw_gbps, peak_tflops,
                   gpu, max_decompressed) -> tuple[list[dict], list, list]:
    """Each run built, diagnosed and priced by its what-if replay; returns (run models, evidence, findings)."""
    from traceanalyze import diagnose

    runs_model = []
    evidence: list[diagnose.RunEvidence] = []
    all_findings: list[diagnose.Finding] = []
    for run_id, run in enumerate(disc.runs, start=1):
        pending: list = []
        run_model, run_warnings, ev = _build_run(con, run_id, run, roles[id(run)], loaded, link_bw_gbps, peak_tflops,
                                                 gpu, max_decompressed, pending=pending)
        ev.whatif = list(run_model.get("whatif") or [])
        findings = diagnose.diagnose(ev)
        # a what-if for every finding that maps to a scenario, or why there is none (findings[i].whatif_missing)
        late = diagnose.price_missing_whatifs(findings, run_model["whatif"], ev.price_whatif, _no_replay(run_model))
        ev.price_whatif = None  # the graph it holds goes
        # impact from the what-if replay
        findings = diagnose.apply_to_findings(findings, run_model.get("whatif"), run_model.get("mode"))
        findings, dropped = diagnose.drop_profiler_only(findings, run_model.get("ranks") or [],
                                                        run_model.get("profiler_overhead"))
        if dropped:  # the report says so: in the JSON and as a data-quality row
            run_model["profiler_overhead"]["dropped_findings"] = dropped
            run_warnings += [{"file": None, "level": "info", "message": f"finding left out ({d['kind']}: "
                              f"{d['title']}): it {d['why']}"} for d in dropped]
        run_model["findings"] = diagnose.to_dicts(findings)
        run_model["partial"] = diagnose.partial_run(ev, findings)  # fewer ranks traced than the world size
        if run_model["steps"] and run_model["mode"] in ("gpu", "cpu"):
            run_model["timeline"] = _timeline(con, run_id, run_model, ev, findings)
        for wait in pending:  # the replay's tables, written meanwhile
            wait()
        if late:  # the replays of the what-ifs priced for a finding, after the replay's own
            store.insert_rows(con, "sim_result", None, late)
        warnings.extend(dict(w, run=w.get("run", run.name)) for w in run_warnings)
        all_findings.extend(findings)
        runs_model.append(run_model)
        evidence.append(ev)
    return runs_model, evidence, all_findings


def _no_replay(run_model: dict) -> str:
    """Why a run has no what-if replay to price a finding with (its ``whatif_missing``)."""
    if run_model.get("mode") == "logs":
        return "a log-only run has no trace to replay"
    return "the run has no counted profiler step to replay"


def _compare(runs_model: list[dict], evidence: list, all_findings: list) -> dict | None:
    """The subject-vs-baseline comparison, when two runs pair up (its findings are added to ``all_findings``)."""
    from traceanalyze import diagnose

    comparison = None
    pair = _comparison_pair(runs_model, evidence)
    if pair is not None:
        (si, bi) = pair
        subj_f = [f for f in all_findings if f.run == evidence[si].name]
        base_f = [f for f in all_findings if f.run == evidence[bi].name]
        comparison, extra = diagnose.compare(evidence[si], evidence[bi], subj_f, base_f)
        diagnose.price_missing_whatifs(extra, list(runs_model[si].get("whatif") or []), None,
                                       "found by the comparison with the baseline, after the replay")
        all_findings.extend(extra)
        for i in (si, bi):
            mine = [f for f in all_findings if f.run == evidence[i].name]
            runs_model[i]["findings"] = diagnose.to_dicts(diagnose.rank_findings(mine))
        if runs_model[bi]["role"] == "subject":  # implicit pair: say which run is the reference
            runs_model[bi]["role"] = "baseline"
        # the slow run's predictions checked against the fixed one, and what the faster run is bound by next
        comparison["whatif_check"] = diagnose.whatif_check(runs_model[si], runs_model[bi], evidence[si], evidence[bi])
        comparison["next_bottleneck"] = diagnose.next_bottleneck(runs_model[si], runs_model[bi])
    return comparison


def _report_model(con, runs_model: list[dict], evidence: list, all_findings: list, warnings: list[dict],
                  comparison: dict | None) -> dict:
    """The report model (``docs/schema.md``), its findings and warnings stored."""
    from traceanalyze import diagnose

    # the report's ranking: subject runs' findings first (the baseline is the reference, not the patient)
    subjects = {r["name"] for r in runs_model if r["role"] == "subject"}
    ranked = diagnose.rank_findings([f for f in all_findings if f.run in subjects])
    baseline_findings = diagnose.rank_findings([f for f in all_findings if f.run not in subjects])
    run_ids = {r["name"]: r["run_id"] for r in reversed(runs_model)}  # the first run of a name, as before
    store.insert_rows(con, "findings", None, [
        [run_ids[f.run], f.cause, f.kind, f.severity, f.impact_pct, json.dumps(f.ranks), f.title,
         json.dumps(f.evidence), f.recommendation] for f in ranked + baseline_findings])
    store.insert_rows(con, "warnings", ["file", "message"], [[w["file"], w["message"]] for w in warnings])

    model = {
        "tool": {"name": "traceanalyze", "version": __version__},
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "verdict": diagnose.verdict(ranked, [e for e in evidence if e.name in subjects]),
        # the subject run the verdict's "Partial: k of N ranks traced" speaks of (diagnose.partial_run), or None
        "partial": next(({"run": r["name"], **r["partial"]} for r in runs_model
                         if r["role"] == "subject" and r.get("partial")), None),
        "runs": runs_model,
        "findings": diagnose.to_dicts(ranked),
        "warnings": warnings,
    }
    if model["verdict"].startswith("Run died: "):  # the death the verdict names leads the cards
        top = next((f for f in model["findings"] if f["kind"] in DIED_KINDS), None)
        if top is not None:
            top["main"] = True
    elif model["verdict"].startswith("Main cause") or (model["partial"] and ". Main cause: " in model["verdict"]):
        # the finding the verdict names leads the report's cards
        top = next((f for f in model["findings"] if f["severity"] in ("high", "medium")), None)
        if top is not None:
            top["main"] = True
    if comparison is not None:
        model["comparison"] = comparison
    diagnose.assess_confidence(model)  # levels read the whole model: the what-ifs, the findings and the verdict
    return model


def _load(con, paths: list[Path], jobs: int | None, progress, bound: dict, executor: str, scheduler: str | None,
          db) -> list:
    """:func:`ingest.load_traces` in local processes, or on a Dask cluster (the executor ``batch`` uses)."""
    if executor == "local" and not scheduler:
        return ingest.load_traces(con, paths, jobs=jobs, progress=progress, **bound)
    if executor not in ("local", "dask"):
        raise TraceanalyzeError(f"unknown executor {executor!r} (local or dask)")
    import os

    ex = DaskExecutor(jobs or os.cpu_count() or 1, scheduler)
    # with a remote scheduler the workers write where they and this process both see: beside the database
    parts = Path(str(db) + ".parts") if scheduler and db is not None and str(db) != ":memory:" else None
    try:
        return ingest.load_traces(con, paths, jobs=jobs, progress=progress, executor=ex, parts_dir=parts, **bound)
    finally:
        ex.close()
        if parts is not None:
            import shutil

            shutil.rmtree(parts, ignore_errors=True)


def _check_outputs(disc: Discovery, given: list, db, outputs) -> None:
    """Guarantee 2 (README, Safety): no output is an input file, no two outputs share a path; then the database's
    folder is created."""
    outs = [(n, p) for n, p in (outputs or []) if p is not None]
    if db is not None and str(db) != ":memory:" and not any(n == "--db" for n, _ in outs):
        outs.append(("--db", db))
    if not outs:
        return
    inputs: list = [Path(p) for p in given if Path(p).is_file()]
    for r in disc.runs:
        inputs += r.traces
        inputs += [s.path for s in r.sidecars]
    inputs += [Path(f) for f, _ in disc.skipped]
    check_outputs(outs, inputs, [p for p in given if Path(p).is_dir()], is_own_db=store.is_own_db)
    if db is not None and str(db) != ":memory:":
        Path(db).parent.mkdir(parents=True, exist_ok=True)


def _cache_key(disc: Discovery, roles: dict, link_bw: float | None, peak: float | None,
               max_decompressed: int | None = None, gpu: str | None = None, follow: bool = False,
               known: dict | None = None) -> str:
    """Hash of everything a report depends on: tool version, options, and each input file's path and
    :func:`ingest.fingerprint` (size, mtime, content). ``known`` receives each trace's
    :func:`ingest.file_identity`, for the load to reuse."""
    import hashlib

    h = hashlib.sha256(f"{__version__}|{link_bw}|{peak}|{max_decompressed}|{gpu}|{follow}".encode())
    for r in disc.runs:
        h.update(f"|run {r.path} {roles.get(id(r))}".encode())
        traces = set(r.traces)
        for p in [*r.traces, *(s.path for s in r.sidecars)]:
            try:
                key, fp = ingest.file_identity(p)
            except OSError:
                h.update(f"|{p} missing".encode())
                continue
            h.update(f"|{key[0]} {fp}".encode())  # size, mtime and content
            if known is not None and p in traces:
                known[p] = (key, fp)
    for f, m in disc.skipped:
        h.update(f"|skipped {f} {m}".encode())
    return h.hexdigest()


def _cached_model(con, key: str) -> dict | None:
    rows = con.execute("SELECT model FROM report_cache WHERE key = ?", [key]).fetchall()
    if not rows:
        return None
    try:
        return json.loads(rows[0][0])
    except ValueError:
        return None


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _comparison_pair(runs_model: list[dict], evidence) -> tuple[int, int] | None:
    """(subject index, baseline index): the explicit baseline, else the smaller of exactly two runs."""
    from traceanalyze import diagnose

    subj = [i for i, r in enumerate(runs_model) if r["role"] == "subject"]
    base = [i for i, r in enumerate(runs_model) if r["role"] == "baseline"]
    if subj and base:
        return subj[0], base[0]
    if len(runs_model) == 2:
        a, b = 0, 1
        ta, tb = diagnose.throughput_per_rank(evidence[a]), diagnose.throughput_per_rank(evidence[b])
        if ta and tb and ta[1] == tb[1] and ta[0] != tb[0]:
            return (a, b) if ta[0] < tb[0] else (b, a)  # the slower run is the one to explain
        wa = evidence[a].fact("world_size") or evidence[a].world_size or 0
        wb = evidence[b].fact("world_size") or evidence[b].world_size or 0
        if wa != wb:
            return (a, b) if wa > wb else (b, a)
    return None


def _build_run(con, run_id: int, run: Run, role: str, loaded, link_bw_gbps: float | None = None,
               peak_tflops: float | None = None, gpu_option: str | None = None, max_decompressed: int | None = None,
               pending: list | None = None) -> tuple[dict, list[dict], diagnose.RunEvidence]:
    """One run through the stages: its files placed as ranks and windows, the facts their headers state, the
    metrics, the what-if replay and the evidence the rules read; returns (run model, warnings, evidence).
    ``pending``: receives the wait for the replay's tables instead of waiting here (call it before the database
    is complete)."""
    from traceanalyze import metrics

    warnings: list[dict] = []
    good, headers, ranks, by_rank, grouping = _place_files(con, run_id, run, loaded, warnings)
    facts, gpu = _header_facts(run, headers, by_rank, good, gpu_option, warnings)
    mode = metrics.run_mode(con, run_id)
    con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, run.name, str(run.path), role, facts["world_size"], facts["backend"], mode,
                 facts["gpu_model"], facts["gpu_count"], facts["nccl_version"], facts["cuda_runtime_version"]])
    a = _analyses(con, run_id, run, mode, facts, good, link_bw_gbps, peak_tflops, max_decompressed, warnings, gpu)
    # the evidence is gathered while the replay runs on; the run model waits for it
    ev, longest, compile_step_us = _evidence(con, run_id, run, a, facts, gpu, bool(good))
    compile_kernels = None
    if good and ev.compile_step is not None:  # the kernel table is of the steady steps: the compile step folded apart
        a.top = metrics.top_kernels(con, run_id, skip_step=ev.compile_step)
        compile_kernels = metrics.step_kernels(con, run_id, ev.compile_step)
    model = _run_model(run_id, run, role, a, ev, facts, by_rank, grouping, good, ranks, longest, compile_step_us)
    # the replay is done: its pricer is set; taken out of the list, so that dropping it frees the graph
    ev.price_whatif = a.pricer.pop() if a.pricer and a.step_rows else None
    if compile_kernels is not None and model.get("compile_step"):
        model["compile_step"].update(n_kernels=compile_kernels["n_kernels"], top_kernels=compile_kernels["top"],
                                     kernel_time_us=compile_kernels["kernel_time_us"])
    if pending is None:
        a.written()
    else:  # its tables are written while the run is diagnosed
        pending.append(a.written)
    for w in warnings:
        w.setdefault("run", run.name)
    return model, warnings, ev


def _place_files(con, run_id: int, run: Run, loaded, warnings: list[dict]):
    """The run's readable files as ranks and profiling windows (stored in ``files``); returns (good files,
    headers, rank of each path, files by rank, how files became ranks for the data-quality section)."""
    good = []
    # one query for the run's files, not one per file (2.4 s of the cross-rank work at 1,024 ranks)
    ids = [loaded[p].file_id for p in run.traces if loaded[p].file_id is not None]
    rows = {fid: (status, message, header) for fid, status, message, header in con.execute(
        "SELECT file_id, status, message, header FROM files WHERE file_id IN (SELECT unnest(?))", [ids]).fetchall()}
    for p in run.traces:
        lf = loaded[p]
        if lf.error or lf.file_id is None:
            warnings.append({"file": str(p), "message": lf.error or "not loaded", "level": "error"})
            continue
        status, message, _ = rows[lf.file_id]
        if status == "error":
            warnings.append({"file": str(p), "message": message, "level": "error"})
            continue
        if message:
            warnings.append({"file": str(p), "message": message,
                             "level": "partial" if status == "partial" else "warning"})
        good.append(lf)
    headers = {lf.path: store.header_dict(rows[lf.file_id][2]) for lf in good}
    headers, header_warnings = check_headers(headers)  # an implausible rank or world size: one warning per file
    warnings.extend({"file": f, "message": m, "level": "warning"} for f, m in header_warnings)
    ranks, rank_warnings = assign_ranks([lf.path for lf in good], headers)
    warnings.extend({"file": None, "message": m, "level": "warning"} for m in rank_warnings)
    by_rank: dict[int, list] = {}
    for lf in good:
        by_rank.setdefault(ranks[lf.path], []).append(lf)
    dropped = _check_files(con, run, by_rank, headers, warnings)
    good = [lf for lf in good if lf.path not in dropped]
    # a rank's windows are ordered by their first CPU op; only ranks with several files need that scan
    multi = [lf.file_id for lfs in by_rank.values() if len(lfs) > 1 for lf in lfs]
    starts = dict(con.execute("SELECT file_id, min(ts_ns) FROM cpu_ops WHERE file_id IN (SELECT unnest(?)) "
                              "GROUP BY file_id", [multi]).fetchall()) if multi else {}
    grouping: list[str] = []  # how files became ranks and windows, for the data-quality section
    placed: list[list[int]] = [[], [], []]  # file_id, rank, window: one UPDATE for the run
    for r, lfs in sorted(by_rank.items()):
        lfs.sort(key=lambda lf: (starts.get(lf.file_id) or 0, str(lf.path)))
        for w, lf in enumerate(lfs):
            for col, v in zip(placed, (lf.file_id, r, w), strict=True):
                col.append(v)
        if len(lfs) > 1:
            why = window_grouping([lf.path for lf in lfs], headers)
            warnings.append({"file": None, "level": "info",
                             "message": f"rank {r}: {len(lfs)} trace files read as {len(lfs)} successive profiling "
                                        f"windows of that rank ({why}); in time order: "
                                        f"{', '.join(lf.path.name for lf in lfs)}. Each window is analysed; the "
                                        "step statistics combine the steps of all windows"})
            grouping.append(f"rank {r}: {len(lfs)} profiling windows ({why})")
    if placed[0]:
        con.execute("UPDATE files SET run_id = ?, rank = p.rank, \"window\" = p.w FROM (SELECT unnest(?) AS fid, "
                    "unnest(?) AS rank, unnest(?) AS w) p WHERE files.file_id = p.fid", [run_id, *placed])
    if by_rank:
        n_files = sum(len(lfs) for lfs in by_rank.values())
        grouping.insert(0, f"{n_files} trace file{'s' if n_files != 1 else ''} read as {len(by_rank)} "
                           f"rank{'s' if len(by_rank) != 1 else ''}")
    return good, headers, ranks, by_rank, grouping


def _header_facts(run: Run, headers: dict, by_rank: dict, good: list, gpu_option: str | None,
                  warnings: list[dict]):
    """World size, backend, GPU and versions the headers state, the GPU resolved against ``--gpu``, and the
    missing ranks as spans; returns (facts, GPU)."""
    facts = _run_facts(headers.values(), by_rank)
    gpu = hardware.resolve(facts.pop("_gpu"), gpu_option)
    facts["gpu_capability"] = gpu.sm
    facts["gpu_source"] = gpu.source if (gpu.name or gpu.capability) else None
    if gpu_option and gpu.source != "--gpu" and good:
        warnings.append({"file": None, "level": "info",
                         "message": f"--gpu {gpu_option} ignored: the trace's deviceProperties say {gpu.label}"})
    if facts["world_size"] and by_rank:
        missing = [r for r in range(facts["world_size"]) if r not in by_rank]  # world size <= 2^20
        if missing:  # a count and ranges, never the ranks one by one
            warnings.append({"file": None, "level": "warning",
                             "message": f"{len(missing):,} of {facts['world_size']:,} ranks have no trace "
                                        f"(ranks {ranges(missing)}): copy every rank's trace file into "
                                        f"{run.path} for a complete picture"})
        facts["missing_ranks"] = rank_spans(missing)  # [first, last] pairs: bounded by the gaps, not the ranks
        facts["n_missing_ranks"] = len(missing)
    return facts, gpu


@dataclass
class _RunAnalyses:
    """What the metrics, the sidecars and the replay of one run gave (:func:`_analyses`)."""

    mode: str
    rank_rows: list
    step_rows: list
    side: dict
    coll: Any
    link: dict
    prec: Any
    comp: Any
    loader: Any
    launch: Any
    idle_rows: list
    top: list
    replay: Callable[[], tuple]  # waits for the replay: (replay, whatif, picture) models
    written: Callable[[], None]  # waits for the replay's tables (_write_replay)
    n_rows: int = 0  # kernels and CPU ops of the run (what decides whether analyses overlap)
    pricer: list = field(default_factory=list)  # the replay's pricer of one more what-if, once it is done


def _analyses(con, run_id: int, run: Run, mode: str, facts: dict, good: list, link_bw_gbps, peak_tflops,
              max_decompressed, warnings: list[dict], gpu=None) -> _RunAnalyses:
    """Every metric of one run, its logs and its what-if replay; the pure-SQL ones and the replay overlap."""
    from concurrent.futures import ThreadPoolExecutor

    from traceanalyze import metrics
    from traceanalyze.metrics import idle
    from traceanalyze.metrics.collectives import CollectiveSummary, analyze_collectives, match_collectives
    from traceanalyze.metrics.host import compile_stats, launch_stats, loader_stats
    from traceanalyze.metrics.precision import analyze_precision

    # two pure-SQL analyses run on a second connection meanwhile: DuckDB works without the GIL, so they overlap
    # with the Python parts of the others (-0.08 s on 8 ranks). Both then hold their working memory at once, so
    # a run of many events computes them in turn instead.
    n_rows = con.execute("SELECT coalesce(sum(n_kernels + n_cpu_ops), 0) FROM files WHERE run_id = ?",
                         [run_id]).fetchone()[0]
    bg = ThreadPoolExecutor(max_workers=1) if n_rows <= OVERLAP_MAX_ROWS else None
    cur = con.cursor()
    idle_result = _deferred(bg, idle.idle_breakdown, cur, run_id) if good and mode == "gpu" else None
    top_result = _deferred(bg, metrics.top_kernels, cur, run_id) if good else None
    if bg is not None:
        bg.shutdown(wait=False)
    side_warnings: list[dict] = []  # added after the step metrics' own, in the order they always came
    rp, matched = None, None
    beside = n_rows <= OVERLAP_MAX_ROWS  # the what-if replay (NumPy and DuckDB, mostly without the GIL) overlaps
    if good and beside and n_rows >= EARLY_REPLAY_MIN_ROWS:
        # ... with every analysis below: it needs the clock offsets, the expected link and the host CPU, not the
        # step metrics (its result is kept only if the run has steps, as before)
        side = _read_sidecars(con, run_id, run, side_warnings, max_decompressed)
        _log_covers_run(con, run_id, side)
        link = _expected_link(facts, side, link_bw_gbps)
        matched = match_collectives(con, run_id, mode)
        rp = _ReplayRun(con, run_id, mode, facts["world_size"], matched.clock_offsets_us, link,
                        _cpu_host(side["facts"], mode, facts["world_size"]), beside=True, gpu=gpu,
                        unprofiled=side.get("unprofiled"))
    rank_rows, step_rows = metrics.compute_run_metrics(con, run_id)
    metrics.save(con, rank_rows, step_rows)
    warnings.extend(_window_differences(rank_rows))
    if rp is None:
        side = _read_sidecars(con, run_id, run, side_warnings, max_decompressed)
        _log_covers_run(con, run_id, side)
        link = _expected_link(facts, side, link_bw_gbps)
    warnings.extend(side_warnings)
    if not good:
        mode = "logs"
        warnings.append({"file": str(run.path), "level": "warning",
                         "message": "no trace found: no Kineto trace (*.json, *.json.gz with a traceEvents array) "
                                    "for this run; the report shows what its logs say"})
    steps_by_rank: dict[int, list[tuple[int, int, int]]] = {}
    for st in step_rows:
        steps_by_rank.setdefault(st.rank, []).append((st.step, st.start_ns, st.start_ns + int(st.step_time_us * 1e3)))
    coll = analyze_collectives(con, run_id, mode, facts["world_size"], steps_by_rank, matched) if good else None
    if rp is None and good and step_rows:  # ... with the analyses below, or in turn for a big run
        rp = _ReplayRun(con, run_id, mode, facts["world_size"], coll.clock_offsets_us if coll else None, link,
                        _cpu_host(side["facts"], mode, facts["world_size"]), beside=beside, gpu=gpu,
                        unprofiled=side.get("unprofiled"))
    replay, written = rp.finish(bool(step_rows), warnings) if rp is not None else (lambda: ({}, [], {}), lambda: None)
    prec = (analyze_precision(con, run_id, mode, facts["gpu_model"], peak_tflops, gpu.capability if gpu else None)
            if good else None)
    comp = compile_stats(con, run_id) if good else None
    loader = loader_stats(con, run_id) if good else None
    launch = launch_stats(con, run_id) if good and mode == "gpu" else None
    idle_rows = idle_result() if idle_result else []
    top = top_result() if top_result else []
    cur.close()
    idle.save(con, idle_rows)
    if coll is not None:
        cols = list(CollectiveSummary.__dataclass_fields__)
        store.insert_rows(con, "collective_calls", ["run_id", *cols],
                    [[run_id, *(getattr(c, f) for f in cols)] for c in coll.summaries])
    return _RunAnalyses(mode, rank_rows, step_rows, side, coll, link, prec, comp, loader, launch, idle_rows, top,
                        replay, written, n_rows, rp.pricer if rp is not None else [])


class _ReplayRun:
    """One run's what-if replay (:func:`_replay`) on a cursor of its own: ``beside`` the analyses, on a thread
    started now (its graph built on one thread: the analyses use the other CPU), else in turn, when
    :meth:`finish` is called (its graph built on every CPU)."""

    def __init__(self, con, run_id: int, mode: str, world: int | None, offsets: dict | None, link: dict, cpu: tuple,
                 beside: bool, gpu=None, unprofiled: dict | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.cur = con.cursor()
        self.writes: list[Callable[[], None]] = []  # the sim_* tables: written after the replay, on its thread
        self.warnings: list[dict] = []  # the replay's, added to the run's once it is kept and written
        self.pricer: list = []  # the replay's pricer of one more what-if (whatif.replay_run), once it is done
        self.pool = ThreadPoolExecutor(max_workers=1) if beside else None
        self.result = _deferred(self.pool, _replay, self.cur, run_id, mode, world, offsets, link, cpu, self.warnings,
                                self.writes, 1 if beside else None, gpu, unprofiled, self.pricer)

    def finish(self, keep: bool, warnings: list[dict]) -> tuple[Callable[[], tuple], Callable[[], None]]:
        """(wait for the replay's models, wait for its tables): with ``keep`` False (a run without steps: no
        replay, as always) the models are empty and nothing is written once it ends. In turn, both are done
        here."""
        if not keep:  # after the replay, on its thread: what it leaves to write is dropped
            _deferred(self.pool, _discard_writes, self.writes)
        written = _deferred(self.pool, _write_replay, self.cur, self.writes, self.warnings)
        if self.pool is not None:
            self.pool.shutdown(wait=False)
        replay = self.result if keep else (lambda: ({}, [], {}))

        def done() -> None:
            written()
            if keep:
                warnings.extend(self.warnings)

        if self.pool is None:  # in turn: replayed, written and freed before the next stage
            models = replay()
            done()
            return (lambda: models), (lambda: None)
        return replay, done


def _evidence(con, run_id: int, run: Run, a: _RunAnalyses, facts: dict, gpu, good: bool):
    """What the rules read about the run (:class:`diagnose.RunEvidence`); returns (evidence, longest rank's µs
    per counted step without the compile step, the compile step's µs)."""
    from traceanalyze import diagnose
    from traceanalyze.metrics import host, steps, where

    mode, rank_rows, step_rows, side, coll, link = a.mode, a.rank_rows, a.step_rows, a.side, a.coll, a.link
    prec, comp, loader, launch, idle_rows = a.prec, a.comp, a.loader, a.launch, a.idle_rows
    ranks_model = [_rank_model(r) for r in rank_rows]
    memory_rows = _memory_beside(con, run_id, a.n_rows) if good else None
    steps_model = [asdict(s) for s in step_rows]
    # the run's step time: median over the counted steps of the longest rank's duration (metrics.steps)
    # ... the compile step (torch.compile in the first step) shown apart: it is no steady step (diagnose)
    compile_step = diagnose.compile_step_of(steps_model, comp)
    longest = steps.longest_per_step((st.step, st.step_time_us) for st in step_rows)
    compile_step_us = longest.pop(compile_step, None)
    step_time = steps.median(longest.values())
    world = facts["world_size"]
    if not good:  # log-only: what the logs say, else NCCL's communicator size, else the ranks that logged
        ws_fact = side["facts"].get("world_size")
        log_ranks = {st.rank for st in side["log_steps"] if st.rank is not None}
        if ws_fact and ws_fact[0].num:
            world = int(ws_fact[0].num)
        elif side["nccl"] is not None and getattr(side["nccl"], "nranks", None):
            world = int(side["nccl"].nranks)
        elif log_ranks:
            world = max(log_ranks) + 1
    ev = diagnose.RunEvidence(
        name=run.name, mode=mode, world_size=world, gpu_model=facts["gpu_model"], ranks=ranks_model,
        steps=steps_model, step_time_us=step_time, coll=coll, prec=prec, compile=comp, loader=loader,
        launch=launch, facts=side["facts"], log_steps=side["log_steps"], nccl=side["nccl"],
        topology=side["topology"], link=link, idle=[r.model() for r in idle_rows], gpu=gpu, compile_step=compile_step)
    view = None
    if good and mode == "gpu":  # blocking calls, the optimizer, the top CPU ops of the steady steps: on a cursor
        # and thread of their own, beside the two analyses below (DuckDB works without the GIL)
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=1) if a.n_rows <= OVERLAP_MAX_ROWS else None  # big: in turn (memory)
        cur = con.cursor()
        view = _deferred(pool, host.host_view, cur, run_id, compile_step)
        if pool is not None:
            pool.shutdown(wait=False)
    if good and steps_model:
        ev.rank_ops = where.op_time_per_step(con, run_id, mode)
        ev.host_gaps, ev.gap_us_per_step = where.host_gaps(con, run_id)
    if view is not None:
        ev.host = view()
        cur.close()
    ev.unprofiled = side.get("unprofiled")  # the step without the profiler, measured (capture or log)
    ev.ooms = side.get("ooms") or []
    if memory_rows is not None:  # before the rules read the ranks
        _add_memory(ranks_model, memory_rows())
    return ev, longest, compile_step_us


def _memory_beside(con, run_id: int, n_rows: int) -> Callable[[], list] | None:
    """Each rank's memory per device (:func:`traceanalyze.metrics.memory.memory_rows`), computed on a cursor and
    thread of its own beside the other evidence (in turn for a big run, as the analyses); the returned callable
    waits for the rows. None for a run whose traces hold no ``[memory]`` events (one indexed query)."""
    from concurrent.futures import ThreadPoolExecutor

    from traceanalyze.metrics import memory

    if not memory.has_memory(con, run_id):
        return None
    pool = ThreadPoolExecutor(max_workers=1) if n_rows <= OVERLAP_MAX_ROWS else None
    cur = con.cursor()
    rows = _deferred(pool, memory.memory_rows, cur, run_id)
    if pool is not None:
        pool.shutdown(wait=False)

    def done() -> list:
        try:
            return rows()
        finally:
            cur.close()

    return done


def _add_memory(ranks_model: list[dict], rows: list) -> None:
    """The memory rows as ``ranks[j]["memory"]`` (one dict per device), on the ranks that have any."""
    by_rank: dict[int, list[dict]] = {}
    for row in rows:
        by_rank.setdefault(row.rank, []).append(row.model())
    for r in ranks_model:
        if r.get("rank") in by_rank:
            r["memory"] = by_rank[r["rank"]]


def _run_model(run_id: int, run: Run, role: str, a: _RunAnalyses, ev, facts: dict, by_rank: dict, grouping: list,
               good: list, ranks: dict, longest: dict, compile_step_us) -> dict:
    """The run's part of the report model (``docs/schema.md``, ``runs[i]``)."""
    from traceanalyze import diagnose

    coll, prec, comp, loader, side, link, top, idle_rows = a.coll, a.prec, a.comp, a.loader, a.side, a.link, a.top, \
        a.idle_rows
    replay_model, whatif, picture = a.replay()
    _add_skew(ev, (replay_model or {}).pop("collective_skew", None))
    mode, world, ranks_model, steps_model, step_time, compile_step = ev.mode, ev.world_size, ev.ranks, ev.steps, \
        ev.step_time_us, ev.compile_step
    model = {
        "run_id": run_id,
        "name": run.name,
        "path": str(run.path),
        "role": role,
        "mode": mode,
        **facts,
        "world_size": world,
        "ranks_found": sorted(by_rank),
        "file_grouping": "; ".join(grouping) if len(grouping) > 1 else None,
        "files": [{"path": str(lf.path), "rank": ranks[lf.path], "cached": lf.cached} for lf in good],
        "sidecars": [{"path": str(s.path), "kind": s.kind} for s in run.sidecars],
        "ranks": ranks_model,
        "steps": steps_model,
        "top_kernels": top,
        "step_time_us": step_time,
        "step_stat": diagnose.step_stat(len(longest)),
        "compile_step": ({"step": compile_step, "step_time_us": compile_step_us} if compile_step is not None
                         else None),
        "link": link,
        "clock_offsets_us": coll.clock_offsets_us if coll else {},
        "collectives": [asdict(c) for c in coll.summaries] if coll else [],
        "idle_breakdown": [r.model() for r in idle_rows],
        "collective_wait_us": coll.wait_us if coll else {},
        "dtype_mix": prec.mix if prec else [],
        "precision": ({k: v for k, v in asdict(prec).items() if k != "mix"} if prec else None),
        "compile": asdict(comp) if comp and (comp.compile_us or comp.compiled_regions) else None,
        "dataloader": asdict(loader) if loader and loader.loader_us else None,
        "host": ev.host.model() if ev.host is not None else None,
        "log_facts": {k: [f.value for f in v] for k, v in side["facts"].items()},
        "log_steps": len(side["log_steps"]),
        "log_step_time_ms": _log_step_time(side["log_steps"]),
        "deaths": [asdict(o) for o in side.get("ooms") or []],
        "profiler_overhead": (replay_model or {}).pop("profiler_overhead", None),
        "replay": replay_model or None,
        "whatif": whatif,
        "replay_picture": picture or None,
    }
    model["effective_batch"] = diagnose.effective_batch_of(ev)
    model["mfu_pct"], model["mfu"] = _mfu(prec, ev.gpu, model)
    return model


def _add_skew(ev, sk) -> None:
    """Who waited for whom (``sk``: :class:`traceanalyze.replay.skew.Skew`, or None without a replay) into the
    evidence (``ev.skew``) and each rank of the run model: ``waited_for_others_us`` and ``kept_others_waiting_us``
    (µs summed over the run's complete collective instances; None when no instance is complete)."""
    ev.skew = sk if sk is not None and sk.n else None
    for r in ev.ranks:
        has = ev.skew is not None
        r["waited_for_others_us"] = round(sk.waited_for_others_us.get(r["rank"], 0.0), 3) if has else None
        r["kept_others_waiting_us"] = round(sk.kept_others_waiting_us.get(r["rank"], 0.0), 3) if has else None


def _log_step_time(log_steps: list) -> dict | None:
    """Median step time (ms) the logs state, over their steps after the first (warm-up, compile), with the count
    and the steps it covers; None when no log states one."""
    import statistics

    timed = sorted((st.step, st.step_time_ms) for st in log_steps if st.step_time_ms is not None)
    if not timed:
        return None
    steady = [ms for step, ms in timed if step != timed[0][0]] or [ms for _, ms in timed]
    return {"median_ms": round(statistics.median(steady), 3), "n": len(steady),
            "steps": f"{timed[0][0]}–{timed[-1][0]}"}


def _timeline(con, run_id: int, run_model: dict, ev, findings) -> dict | None:
    """The median step's timeline (:func:`traceanalyze.metrics.where.timeline_model`): the ranks findings name
    first, the straggler's (or late rank's) largest host gaps in that step marked."""
    from traceanalyze.metrics import where

    named = [r for f in findings if f.severity != "low" and f.cause == "imbalance" and len(f.ranks) < len(ev.ranks)
             for r in f.ranks]
    st = where.median_step(run_model["steps"])
    marked: dict[int, list[dict]] = {}
    for f in findings:
        if f.kind in ("straggler", "late_entry") and st is not None:
            gaps, _ = where.host_gaps(con, run_id, f.ranks, top=3, step=st)
            for g in gaps.get(f.ranks[0], []):
                if g.dur_us >= 0.01 * (ev.step_time_us or 0.0):  # the gaps one can see at this scale
                    marked.setdefault(g.rank, []).append({"start_us": g.offset_us, "dur_us": g.dur_us,
                                                          "label": "host gap", "cause": f.cause})
    return where.timeline_model(con, run_id, run_model["mode"], run_model["steps"], marked, named)


def _mfu(prec, gpu, run: dict) -> tuple[float | None, dict | None]:
    """MFU (%) and how it was made: model FLOPs per rank and step (:func:`.metrics.precision.model_flops`) over the
    step time (without the profiler when known: ``profiler_overhead``, else the profiled one), against the GPU's best
    dense peak (bf16 on sm80+, fp16 before: :func:`traceanalyze.hardware.gpu_peaks`). (None, None) on CPU runs or
    without shapes."""
    flops = getattr(prec, "model_flops_per_step", None)
    if not flops or run.get("mode") != "gpu":
        return None, None
    po = run.get("profiler_overhead") or {}
    step, source = po.get("unprofiled_step_time_us"), po.get("source")
    if not step:
        step, source = run.get("step_time_us"), "profiled"
    peaks = hardware.gpu_peaks(gpu)
    dtype = hardware.half_dtype(gpu) if gpu is not None else "bf16"
    peak = peaks.tflops.get(dtype) or max(peaks.tflops.values())
    if not step or not peak:
        return None, None
    mfu = 100 * flops / (step / 1e6) / (peak * 1e12)
    return round(mfu, 2), {"model_flops_per_step": round(flops), "step_time_us": round(step, 3),
                           "step_source": source, "peak_tflops": peak, "peak_dtype": dtype,
                           "peak_reference": peaks.reference, "assumed": peaks.assumed or None,
                           "ops": getattr(prec, "model_flops_ops", 0)}


def _log_covers_run(con, run_id: int, side: dict) -> None:
    """Keep a training log's step time as the step without the profiler only when most logged steps ran without it
    (:func:`traceanalyze.logs.measured_unprofiled_step` against the trace's profiled steps, the window's last,
    partial one included); before either replay starts, so both see the same value."""
    if not (side["unprofiled"] and side["unprofiled"]["source"] == "log"):
        return
    from traceanalyze import logs

    n = con.execute("SELECT count(DISTINCT step) FROM profiler_steps(?)", [run_id]).fetchone()[0]
    if n:
        side["unprofiled"] = logs.measured_unprofiled_step(side, n)


def _cpu_host(facts: dict, mode: str | None = None, world: int | None = None
              ) -> tuple[bool | None, str | None, dict | None]:
    """(native bf16, CPU model, core sharing) of the run's hosts from ``env_rank{r}.json`` facts: native bf16 False
    when any rank's CPU lacks it, True when every one that says has it, None when none says; core sharing
    (:func:`traceanalyze.logs.core_sharing`) on CPU runs, None on others or when no file states the cores."""
    said = {f.value for f in facts.get("cpu_native_bf16") or []}
    model = next((f.value for f in facts.get("cpu_model") or []), None)
    sharing = None
    if mode == "cpu" and facts.get("cpu_count"):
        from traceanalyze import logs

        sharing = logs.core_sharing(facts, world)
    return (False if "false" in said else True if said else None), model, sharing


def _replay(con, run_id: int, mode: str, world: int | None, offsets: dict | None, link: dict, cpu: tuple,
            warnings: list[dict], writes: list, build_threads: int | None = None, gpu=None,
            unprofiled: dict | None = None, pricer: list | None = None):
    """The what-if replay of one run (traceanalyze.replay); a failure costs a warning, not the report. ``offsets``:
    rank -> clock offset (µs, :func:`.metrics.collectives.match_collectives`); ``cpu``: :func:`_cpu_host`;
    ``writes`` receives the writing of its tables (:func:`_write_replay`); ``build_threads``: threads building its
    graph (:func:`traceanalyze.replay.graph.build`); ``pricer`` receives the pricer of one more what-if for a
    finding (:func:`traceanalyze.diagnose.price_missing_whatifs`), one that says why on a failure."""
    from traceanalyze.replay.whatif import replay_run

    try:
        return replay_run(con, run_id, mode, world, offsets, link.get("expected_gbps"), link.get("source", ""),
                          cpu_native_bf16=cpu[0], cpu_model=cpu[1], defer=writes, build_threads=build_threads,
                          gpu=gpu, unprofiled_measured=unprofiled, core_sharing=cpu[2],
                          pricer=pricer)
    except (ValueError, IndexError, KeyError, duckdb.Error) as exc:  # a graph the replay cannot handle
        warnings.append({"file": None, "level": "warning", "message": f"what-if replay skipped: {exc}"})
        if pricer is not None:
            why = f"the replay was skipped: {exc}"[:300]
            pricer[:] = [lambda scenario, ranks=None: (None, why, [])]
        return {}, [], {}


def _write_replay(cur, writes: list, warnings: list[dict]) -> None:
    """Write the replay's tables (``writes``, from :func:`_replay`) on its cursor, then close it; a failure costs a
    warning."""
    try:
        for w in writes:
            w()
    except (ValueError, IndexError, KeyError, duckdb.Error) as exc:
        warnings.append({"file": None, "level": "warning", "message": f"what-if replay tables not written: {exc}"})
    finally:
        writes.clear()  # the graph goes with them
        cur.close()


WINDOW_STEP_DIFF = 0.10  # windows of one rank whose median step times differ by more than this are named
WINDOW_IDLE_DIFF_POINTS = 10.0  # ... or whose idle % differ by more than this many points


def _window_differences(rank_rows) -> list[dict]:
    """An info row per rank whose profiling windows differ: median step time apart by more than
    :data:`WINDOW_STEP_DIFF`, or idle % by more than :data:`WINDOW_IDLE_DIFF_POINTS`; each names the files."""
    out = []
    for r in rank_rows:
        wins = r.windows
        if len(wins) < 2:
            continue
        diffs = []
        timed = [w for w in wins if w.get("step_time_us")]
        if len(timed) > 1:
            lo, hi = min(timed, key=lambda w: w["step_time_us"]), max(timed, key=lambda w: w["step_time_us"])
            if hi["step_time_us"] > (1 + WINDOW_STEP_DIFF) * lo["step_time_us"]:
                diffs.append(f"median step time {hi['step_time_us'] / 1e3:.2f} ms in {Path(hi['file']).name} vs "
                             f"{lo['step_time_us'] / 1e3:.2f} ms in {Path(lo['file']).name}")
        lo, hi = min(wins, key=lambda w: w["idle_pct"]), max(wins, key=lambda w: w["idle_pct"])
        if hi["idle_pct"] - lo["idle_pct"] > WINDOW_IDLE_DIFF_POINTS:
            diffs.append(f"idle {hi['idle_pct']:.1f}% in {Path(hi['file']).name} vs {lo['idle_pct']:.1f}% in "
                         f"{Path(lo['file']).name}")
        if diffs:
            out.append({"file": None, "level": "info",
                        "message": f"rank {r.rank}: its profiling windows differ ({'; '.join(diffs)}); see the "
                                   "profiling-windows table, the other figures combine them"})
    return out


def _discard_writes(writes: list) -> None:
    """Drop the replay's writes (a run kept without its replay): each one's ``discard`` (what it started writing
    is waited for and deleted), then the list."""
    for w in writes:
        discard = getattr(w, "discard", None)
        if discard is not None:
            discard()
    writes.clear()


def _deferred(pool: ThreadPoolExecutor | None, fn: Callable, *args) -> Callable[[], Any]:
    """``fn(*args)`` started now on ``pool`` (the returned callable waits for its result), or, without a pool,
    run when the returned callable is called: in turn, at the point where the result is needed."""
    if pool is None:
        return lambda: fn(*args)
    return pool.submit(fn, *args).result


def _read_sidecars(con, run_id: int, run: Run, warnings: list[dict], max_bytes: int | None = None) -> dict:
    """Parse the run's logs, NCCL output, topology and configs; store them; return what diagnosis reads.

    Each file is bounded like a trace (``max_bytes``, ``--max-decompressed``); one that is over it, unreadable or
    too big for memory is a warning row naming it, and the others are still read."""
    if run.sidecars:  # the log parsers compile ~100 patterns on import: only for runs that have logs
        from traceanalyze import logs

    facts: dict[str, list] = {}
    log_steps: list = []
    nccl = None
    topology = None
    ooms: list = []  # logs.OomEvent: the out-of-memory errors and kills the logs record
    capture_steps: list = []  # logs.CaptureSteps of capture's steps_rank{r}.json
    for sc in run.sidecars:
        try:
            if sc.kind in ("training_log", "nccl_debug"):
                res = logs.parse_text_log(sc.path, max_bytes)
                for f in res.facts:
                    facts.setdefault(f.key, []).append(f)
                log_steps.extend(res.steps)
                ooms.extend(res.ooms[: max(0, MAX_OOM_EVENTS - len(ooms))])  # bounded over the run's logs too
                store.insert_rows(con, "log_steps", None, [
                    [run_id, str(sc.path), res.framework, st.rank, st.step, st.iter, st.loss, st.lr, st.grad_norm,
                     st.tokens_per_s, st.tflops, st.mfu_pct, st.step_time_ms, st.memory_gib, st.epoch]
                    for st in res.steps])
                if res.nccl is not None and (res.nccl.channels or res.nccl.version):
                    if nccl is None:
                        nccl = res.nccl
                    else:
                        nccl.channels.extend(res.nccl.channels)
                    store.insert_rows(con, "nccl_channels", None, [
                        [run_id, str(sc.path), c.host, c.device, c.channel, c.src_rank, c.dst_rank, c.transport,
                         c.detail] for c in res.nccl.channels])
                warnings.extend({"file": str(sc.path), "message": m, "level": "info"} for m in res.warnings)
                timed = [st.step_time_ms for st in res.steps if st.step_time_ms is not None]
                if res.framework in ("console", "step_times") and timed:
                    import statistics

                    what = "console step lines" if res.framework == "console" else "a step-time JSON"
                    warnings.append({"file": str(sc.path), "level": "info",
                                     "message": f"used: {what} with {len(timed)} step time(s), median "
                                                f"{statistics.median(timed):,.1f} ms (the run's step time from logs)"})
            elif sc.kind == "topology":
                topology = logs.parse_topology(sc.path, max_bytes)
                warnings.extend({"file": str(sc.path), "message": m, "level": "info"} for m in topology.warnings
                                if "longer than" in m)
                store.insert_rows(con, "topology_links", None,
                                  [[run_id, str(sc.path), lk.a, lk.b, lk.link] for lk in topology.links])
            elif sc.kind == "config":
                for f in logs.parse_config(sc.path, max_bytes):
                    facts.setdefault(f.key, []).append(f)
            elif sc.kind == "env":  # env_rank{r}.json from traceanalyze.capture
                for f in logs.parse_env(sc.path, max_bytes):
                    facts.setdefault(f.key, []).append(f)
            elif sc.kind == "steps":  # steps_rank{r}.json: steps capture timed without the profiler
                capture_steps.append(logs.parse_capture_steps(sc.path, max_bytes))
                warnings.extend({"file": str(sc.path), "message": m, "level": "warning"}
                                for m in capture_steps[-1].warnings)
        except TraceanalyzeError as exc:
            warnings.append({"file": str(sc.path), "message": str(getattr(exc, "problem", exc)), "level": "warning"})
        except MemoryError:  # never the report's end for one sidecar
            warnings.append({"file": str(sc.path), "level": "warning",
                             "message": "ran out of memory while reading it; skipped (lower --max-decompressed)"})
    store.insert_rows(con, "run_facts", None,
                      [[run_id, key, f.value, f.num, f.source] for key, fs in facts.items() for f in fs])
    side = {"facts": facts, "log_steps": log_steps, "nccl": nccl, "topology": topology, "capture_steps": capture_steps,
            "ooms": ooms}
    # the step time without the profiler (capture, else the log): logs.measured_unprofiled_step
    side["unprofiled"] = logs.measured_unprofiled_step(side) if run.sidecars else None
    return side


def _expected_link(facts: dict, side: dict, override: float | None) -> dict:
    """Expected per-direction GB/s between ranks and where the figure came from."""
    if override:
        return {"expected_gbps": override, "source": "--link-bw"}
    topo = side["topology"]
    if topo is not None and topo.links:
        gpus = topo.gpus
        worst = None
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                lk = topo.link(a, b)
                bw = hardware.expected_link_gbps(lk) if lk else None
                if bw is not None and (worst is None or bw < worst[0]):
                    worst = (bw, f"{a}–{b} {lk}")
        if worst:
            return {"expected_gbps": worst[0], "source": f"nvidia-smi topo -m, slowest pair {worst[1]}"}
    nccl = side["nccl"]
    if nccl is not None and getattr(nccl, "channels", None):
        t = nccl.transports()
        if t.get("NET") and any("Socket" in c.detail for c in nccl.channels):
            return {"expected_gbps": 1.25, "source": "NCCL NET/Socket (TCP; ~10 Gb/s Ethernet assumed)"}
        if t.get("NET"):
            return {"expected_gbps": 25.0, "source": "NCCL NET/IB (200 Gb/s HDR per port)"}
        if t.get("SHM"):
            return {"expected_gbps": 12.0, "source": "NCCL SHM (through host memory, PCIe)"}
    gpu = facts.get("gpu_model")
    if gpu:
        for key, bw, what in hardware.GPU_LINK_GBPS:
            if key.lower() in gpu.lower():
                return {"expected_gbps": bw, "source": f"{gpu}: {what}, per direction"}
    return {"expected_gbps": None, "source": "unknown: pass --link-bw GB/s"}


def _rank_model(r: metrics.RankMetrics) -> dict:
    d = asdict(r)
    d.pop("run_id")
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}


OVERLAP_MAX_ROWS = 2_000_000  # kernels + CPU ops up to which two analyses run at once (see _build_run)
# ... and from which the what-if replay starts before the step metrics (_analyses): there its graph outlasts the
# analyses (8 ranks of 47 MB: -0.3 to -0.5 s; 4 ranks: -0.1 to -0.3 s), below it only contends with them (one
# 5 MB rank: +0.04 s; 2 ranks of 47 MB and 128 ranks of 1.8 MB: no change)
EARLY_REPLAY_MIN_ROWS = 400_000
MIXED_RUN_GAP_NS = 3600 * 10**9  # ranks of one job start their first profiling window within seconds
_EPOCH_2001_NS = 10**18  # starts before this are relative clocks, not comparable across files


def _names(paths, limit: int = 4) -> str:
    names = sorted(Path(p).name for p in paths)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_files(con, run: Run, by_rank: dict[int, list], headers: dict, warnings: list[dict]) -> set:
    """Find the files of one folder that do not belong together; return the paths left out.

    * Two files of one rank whose time spans overlap are not two profiling windows: identical ones (same span
      and event counts) are copies, read once; different ones are left out with a warning naming both.
    * Different ``distributedInfo.world_size`` values, or ranks whose first traces start more than
      :data:`MIXED_RUN_GAP_NS` apart, mean the folder mixes runs: a warning names the files of each side.
    """
    ids = [lf.file_id for lfs in by_rank.values() for lf in lfs]
    if not ids:
        return set()
    marks = ", ".join("?" * len(ids))
    spans = {fid: (lo, hi, n) for fid, lo, hi, n in con.execute(
        "SELECT file_id, min(ts_ns), max(ts_ns + dur_ns), count(*) FROM (SELECT file_id, ts_ns, dur_ns FROM kernels "
        f"WHERE file_id IN ({marks}) UNION ALL SELECT file_id, ts_ns, dur_ns FROM cpu_ops WHERE file_id IN ({marks})) "
        "GROUP BY file_id", ids + ids).fetchall()}
    counts = dict(con.execute(f"SELECT file_id, [n_kernels, n_cpu_ops] FROM files WHERE file_id IN ({marks})",
                              ids).fetchall())
    dropped: set = set()
    for r, lfs in by_rank.items():
        if len(lfs) < 2:
            continue
        kept: list = []
        for lf in sorted(lfs, key=lambda lf: ((spans.get(lf.file_id) or (0,))[0], str(lf.path))):
            s = spans.get(lf.file_id)
            twin = next((k for k in kept if s and spans.get(k.file_id)
                         and s[0] < spans[k.file_id][1] and spans[k.file_id][0] < s[1]), None)
            if twin is None:
                kept.append(lf)
                continue
            dropped.add(lf.path)
            if s == spans[twin.file_id] and counts.get(lf.file_id) == counts.get(twin.file_id):
                msg = f"a copy of {twin.path} (rank {r}, the same events); read once"
            else:
                msg = (f"rank {r} again, at the same time as {twin.path}: not a second profiling window; left out "
                       "(two runs in one folder? put each run's traces in its own folder)")
            warnings.append({"file": str(lf.path), "level": "warning", "message": msg})
        lfs[:] = kept
    by_ws: dict[int, list] = {}
    for lfs in by_rank.values():
        for lf in lfs:
            di = headers.get(lf.path, {}).get("distributedInfo")
            ws = di.get("world_size") if isinstance(di, dict) else None
            if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0:
                by_ws.setdefault(ws, []).append(lf.path)
    if len(by_ws) > 1:
        sides = "; ".join(f"world_size {ws} in {_names(ps)}" for ws, ps in sorted(by_ws.items()))
        warnings.append({"file": None, "level": "warning",
                         "message": f"{run.path} mixes runs ({sides}): put each run's traces in its own folder"})
        return dropped
    firsts = []
    for lfs in by_rank.values():
        starts = [(spans[lf.file_id][0], lf.path) for lf in lfs if spans.get(lf.file_id)]
        if starts:
            firsts.append(min(starts))
    if len(firsts) > 1 and all(t > _EPOCH_2001_NS for t, _ in firsts):
        firsts.sort()
        gap, i = max((firsts[j + 1][0] - firsts[j][0], j + 1) for j in range(len(firsts) - 1))
        if gap > MIXED_RUN_GAP_NS:
            early, late = [p for _, p in firsts[:i]], [p for _, p in firsts[i:]]
            warnings.append({"file": None, "level": "warning",
                             "message": f"{run.path} seems to mix runs: {_names(late)} start {gap / 3.6e12:.1f} h "
                                        f"after {_names(early)} (the ranks of one job start within seconds); put "
                                        "each run's traces in its own folder"})
    return dropped


def _run_facts(headers, by_rank) -> dict:
    """World size, backend, GPU model and versions from the trace headers (first one that says)."""
    facts = {"world_size": None, "backend": None, "gpu_model": None, "gpu_count": None,
             "nccl_version": None, "cuda_runtime_version": None, "pg_config": None, "_gpu": None}
    for h in headers:
        di = h.get("distributedInfo") if isinstance(h.get("distributedInfo"), dict) else {}
        ws = di.get("world_size")
        if isinstance(ws, int) and ws > 0 and not isinstance(ws, bool):
            facts["world_size"] = max(facts["world_size"] or 0, ws)
        if di.get("backend") and not facts["backend"]:
            facts["backend"] = str(di["backend"])
        if di.get("nccl_version") and not facts["nccl_version"]:
            facts["nccl_version"] = str(di["nccl_version"])
        if di.get("pg_config") and not facts["pg_config"]:
            facts["pg_config"] = di["pg_config"]
        props = h.get("deviceProperties") or h.get("computeProperties")
        if isinstance(props, list) and props and not facts["gpu_model"]:
            names = [p.get("name") for p in props if isinstance(p, dict) and p.get("name")]
            if names:
                facts["gpu_model"] = str(names[0])
                facts["gpu_count"] = len(names)
        if facts["_gpu"] is None:
            facts["_gpu"] = hardware.from_properties(
                props, "deviceProperties" if h.get("deviceProperties") else "computeProperties")
        crv = h.get("cuda_runtime_version")
        if crv and not facts["cuda_runtime_version"]:
            facts["cuda_runtime_version"] = str(crv)
    if facts["world_size"] is None and len(by_rank) > 1:
        facts["world_size"] = max(by_rank) + 1
    elif facts["world_size"] is None and by_rank:
        facts["world_size"] = max(by_rank) + 1
    return facts


def to_json(model: dict, indent: int | None = 1) -> str:
    """The report model as JSON text (NaN/inf become null). ``indent=None`` writes it compact, with the standard
    library's C encoder: the report cache's form (1,024 ranks: 0.05 s against 0.21-0.28 s indented, which is
    pure Python)."""
    seps = (",", ":") if indent is None else None
    try:
        return json.dumps(model, indent=indent, separators=seps, default=str, allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere (the model holds no cycles)
        return json.dumps(_clean(model), indent=indent, separators=seps, default=str)


def _finite(o: float) -> bool:
    return o == o and o not in (float("inf"), float("-inf"))


def _clean(o):
    if isinstance(o, float):
        return o if _finite(o) else None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o
