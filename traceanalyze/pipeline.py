"""The flow in one call: discover → ingest/store → metrics → diagnose → a report model (a plain dict).

:func:`analyze` is what the CLI, the Python API and the batch run, each with an :class:`~traceanalyze.options.Options`.
It runs the stages and holds nothing else: one run's stages are :mod:`traceanalyze.stages`, the report cache is
:mod:`traceanalyze.store`'s, the model's pure parts :mod:`traceanalyze.report.assemble`'s. The report model it
builds is what the HTML, JSON and Markdown renderers read; its JSON shape is documented in ``docs/schema.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from traceanalyze import ingest, stages, store
from traceanalyze.discover import Discovery, Run, discover
from traceanalyze.errors import TraceanalyzeError, UsageError
from traceanalyze.executors import map_large_blocks, on_thread, release_free_memory
from traceanalyze.findings import CONFIG_FAULT, DIED_KINDS
from traceanalyze.options import Options, Progress
from traceanalyze.report.assemble import to_json
from traceanalyze.safety import check_outputs
from traceanalyze.version import __version__

__all__ = ["Analysis", "analyze", "to_json"]
NOT_COMPARABLE = ("not comparable", "same run")  # comparability statuses that leave the comparison without a verdict
# diagnose (NumPy) is imported where used: a cached re-run needs none of it


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


def analyze(inputs: list[str | Path] | str | Path, options: Options | None = None, *,
            progress: Progress | None = None) -> Analysis:
    """Analyze every run found under ``inputs`` (and ``options.baseline``, when given) end to end.

    Args:
        inputs: folders or files holding the traces (and logs) of the run(s) to explain.
        options: what the report depends on and where it is written (:class:`traceanalyze.options.Options`);
            None: the defaults (an in-memory database).
        progress: told the total byte size of the trace files before loading (``total``), then each file's as it
            is loaded or found in the report cache (``step``).

    Returns:
        :class:`Analysis`.

    Raises:
        TraceanalyzeError: no trace file at all, the database is locked or unusable, or an input is missing.
        UsageError: an output (or ``db``) is an input, two outputs share a path, or ``db`` is a file that is not
            a traceanalyze report database (left untouched).
    """
    opts = options if options is not None else Options()
    db = opts.db
    subject_in = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    base_in = list(opts.baseline)
    disc, roles = _discover(subject_in, base_in, opts.follow_external_symlinks)
    _check_outputs(disc, subject_in + base_in, db, opts.outputs)
    all_paths = [p for r in disc.runs for p in r.traces]
    known, step = {}, progress.step if progress is not None else None  # known: file identities, read once
    with stages.begun_parse(db, all_paths, opts) as begun:  # a new database's files parse while it opens
        opening = on_thread(store.connect, db, name="traceanalyze-open") if begun is not None else None
        cache_key = _cache_key(disc, roles, opts, known)
        con, cached = (opening(), None) if opening else _open(db, cache_key, opts.read_only_hit, bool(all_paths))
        if cached is not None:  # same inputs, same options, same tool: the stored report is still the answer
            for p in all_paths if step else ():
                step(_size(p))
            return Analysis(con=con, model=cached, db_path=str(db) if db else None, discovery=disc, cached=True)
        if progress is not None:
            progress.total(sum(_size(p) for p in all_paths))
        loaded = {lf.path: lf for lf in stages.load_traces(con, all_paths, opts, step, known, begun)}
    imported = on_thread(stages.import_diagnose, name="traceanalyze-import")  # while the database is tidied
    release_free_memory()  # what loading freed (Arrow chunks, file lists) is not held through the analyses
    map_large_blocks()  # the replay's large arrays given back when freed, not left as holes in the heap
    ingest.forget_files(con, all_paths)  # rows of files that left the folder (docs/safety.md: never stale)
    # once per parse: the count stays in files.message for cached re-runs
    ingest.drop_impossible_durations(con, [lf.file_id for lf in loaded.values()
                                           if not lf.cached and lf.file_id is not None and lf.error is None])
    warnings = _reset_report(con, disc)
    imported()
    runs_model, evidence, all_findings = _diagnose_runs(con, disc, roles, loaded, warnings, opts)
    comparison = _compare(runs_model, evidence, all_findings, roles.get("same_run") or {})
    model = _report_model(con, runs_model, evidence, all_findings, warnings, comparison)
    store.store_report(con, cache_key, to_json(model, indent=None))
    store.forget_steps(con)  # the steps computed once for the stages: the caller's queries compute them live
    errors = [w["message"] if w["file"] is None else f"{w['file']}: {w['message']}" for w in warnings
              if w.get("level") == "error"]
    return Analysis(con=con, model=model, db_path=str(db) if db else None, discovery=disc, errors=errors)


def _open(db, cache_key: str, read_only_hit: bool, parse: bool):
    """(the database's connection, the cached report model or None). With ``read_only_hit``, a current database is
    first opened read-only (:func:`store.open_if_current`): a hit needs nothing else. A database made now opens on a
    thread (DuckDB frees the GIL: ~50 ms) while the parse's modules import (if :func:`stages.begun_parse` did not)."""
    if parse and store.is_new(db):
        opened = on_thread(store.connect, db, name="traceanalyze-open")
        stages.import_parse()
        return opened(), None
    if read_only_hit and (ro := store.open_if_current(db)) is not None:
        cached = store.cached_report(ro, cache_key)
        if cached is not None:
            return ro, cached
        ro.close()
    con = store.connect(db)
    return con, store.cached_report(con, cache_key)


def _discover(subject_in: list, base_in: list, follow: bool) -> tuple[Discovery, dict]:
    """Every run of the inputs and of the baseline, with each run's role (``subject`` / ``baseline``).

    Raises:
        TraceanalyzeError: no run at all (each file that was there is named, with why it was skipped).
    """
    disc = discover(subject_in, follow_external_symlinks=follow)
    roles = {id(r): "subject" for r in disc.runs}
    if base_in:
        bdisc = discover(base_in, follow_external_symlinks=follow)
        bdisc.runs = _drop_same_runs(disc.runs, bdisc.runs, roles)
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


def _drop_same_runs(subjects: list[Run], baselines: list[Run], roles: dict) -> list[Run]:
    """The baseline's runs less those whose traces are a subject run's own (``--baseline`` given the subject's
    folder): that comparison is of a run with itself, ``not comparable: same run``, kept in ``roles["same_run"]``
    as ``{subject name: baseline path}``.

    Raises:
        UsageError: a baseline run shares some, not all, of its trace files with a subject run.
    """
    mine = {frozenset(p.resolve() for p in s.traces): s for s in subjects if s.traces}
    kept = []
    for r in baselines:
        files = frozenset(p.resolve() for p in r.traces)
        same = mine.get(files)
        if same is not None:
            roles.setdefault("same_run", {})[same.name] = str(r.path)
            continue
        shared = next((p for s in mine for p in s if p in files), None)
        if shared is not None:
            raise UsageError(f"{shared}: this trace is in both the inputs and the baseline; pass the baseline's own "
                             "folder")
        kept.append(r)
    return kept


def _cache_key(disc: Discovery, roles: dict, options: Options, known: dict) -> str:
    """The report cache's key (:func:`store.report_cache_key`) of these options and the discovered files; ``known``
    receives each trace's :func:`ingest.file_identity`, for the load to reuse."""
    same = sorted(roles.get("same_run", {}).items())
    return store.report_cache_key(options.report_key() + (f"|same run {same}" if same else ""),
                                  ((r.path, roles.get(id(r)), _identities(r, known)) for r in disc.runs), disc.skipped)


def _identities(run: Run, known: dict) -> Iterator[tuple[Path, tuple | None]]:
    """Each trace and sidecar of ``run`` with its identity (size, mtime and content), None when it is gone."""
    traces = set(run.traces)
    for p in [*run.traces, *(s.path for s in run.sidecars)]:
        try:
            identity = ingest.file_identity(p)
        except OSError:
            yield p, None
            continue
        if p in traces:
            known[p] = identity
        yield p, identity


def _check_outputs(disc: Discovery, given: list, db, outputs) -> None:
    """Guarantee 2 (docs/safety.md): no output is an input file, no two outputs share a path; then the database's
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


def _reset_report(con, disc: Discovery) -> list[dict]:
    """Empty the per-report tables; return the warning rows of the files discovery skipped or ignored."""
    with store.transaction(con):  # in one call: 18 statements in turn cost ~7 ms more
        con.execute("".join(f"DELETE FROM {t};\n" for t in store.REPORT_TABLES)
                    + 'UPDATE files SET run_id = NULL, rank = NULL, "window" = NULL;\n'
                    + store.METRIC_TABLES + store.IDLE_TABLE)
    unreadable, warned = set(disc.unreadable), set(disc.warned)
    warnings: list[dict] = [{"file": f, "message": m,
                             "level": "error" if f in unreadable else "warning" if f in warned else "info"}
                            for f, m in disc.skipped]
    # every file walked and not used is listed too, with its folder (the Data quality table) and why: info only
    warnings += [{"file": f, "message": f"{m}; skipped", "level": "info"} for f, m in disc.ignored]
    return warnings


def _diagnose_runs(con, disc: Discovery, roles: dict, loaded: dict, warnings: list[dict],
                   options: Options) -> tuple[list[dict], list, list]:
    """Each run built, diagnosed and priced by its what-if replay; returns (run models, evidence, findings)."""
    from traceanalyze import diagnose

    done: dict[int, tuple] = {}  # run id -> (run model, warnings, findings, evidence)
    base_ev = None
    for run_id, run in _baseline_first(disc.runs, roles):
        pending: list = []
        run_model, run_warnings, ev = stages.build_run(con, run_id, run, roles[id(run)], loaded, options,
                                                       pending=pending,
                                                       baseline=base_ev if roles[id(run)] == "subject" else None)
        ev.whatif = list(run_model.get("whatif") or [])
        findings = diagnose.diagnose(ev)
        # a what-if for every finding that maps to a scenario, or why there is none (findings[i].whatif_missing)
        late = diagnose.price_missing_whatifs(findings, run_model["whatif"], ev.price_whatif, _no_replay(run_model))
        ev.price_whatif = None  # the graph it holds goes; then each finding's impact from the what-if replay
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
            run_model["timeline"] = stages.timeline(con, run_id, run_model, ev, findings)
        for wait in pending:  # the replay's tables, written meanwhile
            wait()
        if late:  # the replays of the what-ifs priced for a finding, after the replay's own
            store.insert_rows(con, "sim_result", None, late)
        done[run_id] = (run_model, [dict(w, run=w.get("run", run.name)) for w in run_warnings], findings, ev)
        if roles[id(run)] == "baseline" and base_ev is None:
            base_ev = ev
    ordered = [done[k] for k in sorted(done)]  # the report lists the runs in discovery order, whatever ran first
    for _, run_warnings, _, _ in ordered:
        warnings.extend(run_warnings)
    return [o[0] for o in ordered], [o[3] for o in ordered], [f for o in ordered for f in o[2]]


def _baseline_first(runs: list, roles: dict) -> list[tuple[int, Run]]:
    """(run id, run) in the order they are analyzed: the baseline's runs first when there is a subject too
    (``--baseline``), so that its measured figures can price the subject's what-ifs (its busbw:
    :func:`traceanalyze.stages.analyses`); run ids follow discovery order either way."""
    numbered = list(enumerate(runs, start=1))
    if {roles[id(r)] for r in runs} != {"subject", "baseline"}:
        return numbered
    return sorted(numbered, key=lambda ir: roles[id(ir[1])] != "baseline")


def _no_replay(run_model: dict) -> str:
    """Why a run has no what-if replay to price a finding with (its ``whatif_missing``)."""
    if run_model.get("mode") == "logs":
        return "a log-only run has no trace to replay"
    return "the run has no counted profiler step to replay"


def _compare(runs_model: list[dict], evidence: list, all_findings: list, same_run: dict) -> dict | None:
    """The subject-vs-baseline comparison, when two runs pair up (its findings are added to ``all_findings``);
    ``same_run``: {subject name: baseline path} of a baseline that is the subject's own traces."""
    from traceanalyze import diagnose

    comparison = None
    pair = _comparison_pair(runs_model, evidence)
    si = next((i for i, r in enumerate(runs_model) if r["name"] in same_run and r["role"] == "subject"), None)
    if pair is None and si is not None:  # the subject against itself: nothing to compare
        comparison, _ = diagnose.compare(evidence[si], evidence[si], [], [], attribute=False)
        comparison["baseline"] = same_run[runs_model[si]["name"]]
        comparison["comparable"] = diagnose.comparability(runs_model[si], runs_model[si], evidence[si],
                                                          evidence[si], same_files=True)
        return comparison
    if pair is not None:
        (si, bi) = pair
        subj_f = [f for f in all_findings if f.run == evidence[si].name]
        base_f = [f for f in all_findings if f.run == evidence[bi].name]
        comp_ok = diagnose.comparability(runs_model[si], runs_model[bi], evidence[si], evidence[bi])
        ok = comp_ok["status"] not in NOT_COMPARABLE
        comparison, extra = diagnose.compare(evidence[si], evidence[bi], subj_f, base_f, attribute=ok)
        comparison["comparable"] = comp_ok
        diagnose.price_missing_whatifs(extra, list(runs_model[si].get("whatif") or []), None,
                                       "found by the comparison with the baseline, after the replay")
        all_findings.extend(extra)
        for i in (si, bi):
            mine = [f for f in all_findings if f.run == evidence[i].name]
            runs_model[i]["findings"] = diagnose.to_dicts(diagnose.rank_findings(mine))
        if runs_model[bi]["role"] == "subject":  # implicit pair: say which run is the reference
            runs_model[bi]["role"] = "baseline"
        if ok:  # the slow run's predictions checked against the fixed one, and what the faster run is bound by next
            comparison["whatif_check"] = diagnose.whatif_check(runs_model[si], runs_model[bi], evidence[si],
                                                               evidence[bi])
            comparison["next_bottleneck"] = diagnose.next_bottleneck(runs_model[si], runs_model[bi])
    return comparison


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
    elif model["verdict"].startswith(CONFIG_FAULT) or (model["partial"] and f". {CONFIG_FAULT}" in model["verdict"]):
        # a config fault that changes what is trained leads the cards (findings.CONFIG_FAULT)
        top = next((f for f in model["findings"] if f.get("effect") and f["severity"] in ("high", "medium")), None)
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


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0
