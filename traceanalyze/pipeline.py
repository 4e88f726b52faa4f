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

import duckdb

from traceanalyze import __version__, metrics, store
from traceanalyze.discover import Discovery, Run, assign_ranks, discover
from traceanalyze.errors import TraceanalyzeError


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


def analyze(inputs: list[str | Path] | str | Path, *, db: str | Path | None = None,
            baseline: list[str | Path] | str | Path | None = None, jobs: int | None = None,
            progress: Callable[[int], None] | None = None, on_total: Callable[[int], None] | None = None,
            ) -> Analysis:
    """Analyze every run found under ``inputs`` (and ``baseline``, when given) end to end.

    Args:
        inputs: folders or files holding the traces (and logs) of the run(s) to explain.
        db: DuckDB file to write (reused as a parse cache on a re-run); None keeps it in memory.
        baseline: folders or files of a run to compare against (the fast one).
        jobs: processes for parsing (default: CPU count).
        progress: called with the byte size of each trace file as it is loaded.
        on_total: called once with the total byte size of the trace files, before loading.

    Returns:
        :class:`Analysis`.

    Raises:
        TraceanalyzeError: no trace file at all, the database is locked or unusable, or an input is missing.
    """
    subject_in = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    base_in = [] if baseline is None else ([baseline] if isinstance(baseline, (str, Path)) else list(baseline))
    disc = discover(subject_in)
    roles = {id(r): "subject" for r in disc.runs}
    if base_in:
        bdisc = discover(base_in)
        for r in bdisc.runs:
            roles[id(r)] = "baseline"
            r.name = f"{r.name} (baseline)" if any(r.name == s.name for s in disc.runs) else r.name
        disc = Discovery(runs=disc.runs + bdisc.runs, skipped=disc.skipped + bdisc.skipped)
    if not disc.runs:
        where = ", ".join(str(p) for p in subject_in)
        raise TraceanalyzeError(f"{where}: no Kineto trace found (looked for *.json and *.json.gz with a "
                                "traceEvents array)")

    con = store.connect(db)
    con.execute(metrics.MACROS)
    all_paths = [p for r in disc.runs for p in r.traces]
    if on_total:
        on_total(sum(_size(p) for p in all_paths))
    loaded = {lf.path: lf for lf in store.load_traces(con, all_paths, jobs=jobs, progress=progress)}

    con.execute("DELETE FROM runs")
    con.execute("DELETE FROM warnings")
    con.execute("UPDATE files SET run_id = NULL, rank = NULL, \"window\" = NULL")
    con.execute(metrics.METRIC_TABLES)
    warnings: list[dict] = [{"file": f, "message": m} for f, m in disc.skipped]
    runs_model = []
    for run_id, run in enumerate(disc.runs, start=1):
        run_model, run_warnings = _build_run(con, run_id, run, roles[id(run)], loaded)
        warnings.extend(run_warnings)
        runs_model.append(run_model)
    for w in warnings:
        con.execute("INSERT INTO warnings VALUES (NULL, ?, ?)", [w["file"], w["message"]])

    model = {
        "tool": {"name": "traceanalyze", "version": __version__},
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": runs_model,
        "findings": [],
        "warnings": warnings,
    }
    errors = [w["message"] if w["file"] is None else f"{w['file']}: {w['message']}" for w in warnings
              if w.get("level") == "error"]
    return Analysis(con=con, model=model, db_path=str(db) if db else None, discovery=disc, errors=errors)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _build_run(con, run_id: int, run: Run, role: str, loaded) -> tuple[dict, list[dict]]:
    warnings: list[dict] = []
    good = []
    for p in run.traces:
        lf = loaded[p]
        if lf.error or lf.file_id is None:
            warnings.append({"file": str(p), "message": lf.error or "not loaded", "level": "error"})
            continue
        status, message = con.execute("SELECT status, message FROM files WHERE file_id = ?",
                                      [lf.file_id]).fetchone()
        if status == "error":
            warnings.append({"file": str(p), "message": message, "level": "error"})
            continue
        if message:
            warnings.append({"file": str(p), "message": message,
                             "level": "partial" if status == "partial" else "warning"})
        good.append(lf)
    headers = {lf.path: store.file_header(con, lf.file_id) for lf in good}
    ranks, rank_warnings = assign_ranks([lf.path for lf in good], headers)
    warnings.extend({"file": None, "message": m, "level": "warning"} for m in rank_warnings)
    starts = dict(con.execute("SELECT file_id, min(ts_ns) FROM cpu_ops GROUP BY file_id").fetchall())
    by_rank: dict[int, list] = {}
    for lf in good:
        by_rank.setdefault(ranks[lf.path], []).append(lf)
    for r, lfs in by_rank.items():
        lfs.sort(key=lambda lf: (starts.get(lf.file_id) or 0, str(lf.path)))
        for w, lf in enumerate(lfs):
            con.execute("UPDATE files SET run_id = ?, rank = ?, \"window\" = ? WHERE file_id = ?",
                        [run_id, r, w, lf.file_id])
        if len(lfs) > 1:
            warnings.append({"file": None, "level": "info",
                             "message": f"rank {r} has {len(lfs)} trace files; read as {len(lfs)} profiling "
                                        "windows of that rank"})

    facts = _run_facts(headers.values(), by_rank)
    if facts["world_size"] and by_rank:
        missing = sorted(set(range(facts["world_size"])) - set(by_rank))
        if missing:
            warnings.append({"file": None, "level": "warning",
                             "message": f"{len(missing)} of {facts['world_size']} ranks have no trace "
                                        f"(ranks {_ranges(missing)}): copy every rank's trace file into "
                                        f"{run.path} for a complete picture"})
        facts["missing_ranks"] = missing
    mode = metrics.run_mode(con, run_id)
    con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, run.name, str(run.path), role, facts["world_size"], facts["backend"], mode,
                 facts["gpu_model"], facts["gpu_count"], facts["nccl_version"], facts["cuda_runtime_version"]])
    rank_rows, step_rows = metrics.compute_run_metrics(con, run_id)
    metrics.save(con, rank_rows, step_rows)
    model = {
        "run_id": run_id,
        "name": run.name,
        "path": str(run.path),
        "role": role,
        "mode": mode,
        **facts,
        "ranks_found": sorted(by_rank),
        "files": [{"path": str(lf.path), "rank": ranks[lf.path], "cached": lf.cached} for lf in good],
        "sidecars": [{"path": str(s.path), "kind": s.kind} for s in run.sidecars],
        "ranks": [_rank_model(r) for r in rank_rows],
        "steps": [asdict(s) for s in step_rows],
        "top_kernels": metrics.top_kernels(con, run_id),
        "step_time_us": _median([r.step_time_us for r in rank_rows if r.step_time_us is not None]),
    }
    for w in warnings:
        w.setdefault("run", run.name)
    return model, warnings


def _rank_model(r: metrics.RankMetrics) -> dict:
    d = asdict(r)
    d.pop("run_id")
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _ranges(xs: list[int]) -> str:
    """[5, 6, 7, 9] -> '5–7, 9'."""
    out = []
    start = prev = xs[0]
    for x in xs[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}–{prev}" if prev > start else str(start))
        if x is not None:
            start = prev = x
    return ", ".join(out)


def _run_facts(headers, by_rank) -> dict:
    """World size, backend, GPU model and versions from the trace headers (first one that says)."""
    facts = {"world_size": None, "backend": None, "gpu_model": None, "gpu_count": None,
             "nccl_version": None, "cuda_runtime_version": None, "pg_config": None}
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
        crv = h.get("cuda_runtime_version")
        if crv and not facts["cuda_runtime_version"]:
            facts["cuda_runtime_version"] = str(crv)
    if facts["world_size"] is None and len(by_rank) > 1:
        facts["world_size"] = max(by_rank) + 1
    elif facts["world_size"] is None and by_rank:
        facts["world_size"] = max(by_rank) + 1
    return facts


def to_json(model: dict) -> str:
    """The report model as JSON text (NaN/inf become null)."""
    return json.dumps(model, indent=1, default=str, allow_nan=False) if _finite(model) else json.dumps(
        _clean(model), indent=1, default=str)


def _finite(o) -> bool:
    if isinstance(o, float):
        return o == o and o not in (float("inf"), float("-inf"))
    if isinstance(o, dict):
        return all(_finite(v) for v in o.values())
    if isinstance(o, (list, tuple)):
        return all(_finite(v) for v in o)
    return True


def _clean(o):
    if isinstance(o, float):
        return o if _finite(o) else None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o
