"""The batch index page (``traceanalyze batch``'s ``OUTDIR/index.html``): every run of the catalog linked, the
top-cause distribution, step time over time per group, regressions, runs that died and errors. One self-contained
page from ``templates/batch_index.html.j2`` (autoescaped; its charts are inline SVG the template draws from
:mod:`traceanalyze.report.charts`), sortable without a script (CSS order variables per row)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from traceanalyze.report import charts
from traceanalyze.report.html import render_template
from traceanalyze.report.model import CAUSE_COLORS, CAUSE_LABELS, CAUSES
from traceanalyze.version import __version__

MAX_GROUP_CHARTS = 40  # the index draws step time over time for at most this many groups (the busiest)

_ORDERS = (("date", "date"), ("step", "step time"), ("impact", "impact"), ("cause", "top cause"),
           ("group", "group"), ("died", "died"), ("status", "status"))
_NONE_COLOR, _ERROR_COLOR = "#2b8a3e", "#c92a2a"


def render_batch_index(rows: list[dict], *, archive: str, threshold: float, stats: Any = None) -> str:
    """The batch index: one self-contained HTML page (inline CSS and SVG, no script, no network request)
    linking every run's report.

    Args:
        rows: the catalog's ``runs`` rows as dicts (any order; shown newest first).
        archive: the archive folder, for the title.
        threshold: the regression threshold (× the group's median), stated on the page.
        stats: this invocation's :class:`traceanalyze.batch.BatchResult` (runs analyzed, unchanged, removed,
            seconds, rates), or None.
    """
    rows = sorted(rows, key=lambda r: (r.get("date") or _dt.datetime.min, r["run_id"]), reverse=True)
    runs = [_row_view(r) for r in rows]
    orders = _sort_orders(rows)
    for rv in runs:
        rv["style"] = ";".join(f"--o-{k}:{orders[k][rv['run_id']]}" for k in orders)
    dist = _cause_distribution(rows)
    groups = _group_views(rows)
    charted = [g for g in groups if g["n_points"] >= 2][:MAX_GROUP_CHARTS]
    for i, g in enumerate(charted):
        g["chart"] = _group_chart(g, f"ta-group-{i}")
    v = {
        "title": f"traceanalyze batch: {Path(archive).name or archive}",
        "archive": archive, "tool_name": "traceanalyze", "tool_version": __version__,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cause_colors": CAUSE_COLORS, "threshold": threshold,
        "n": len(rows), "n_ok": sum(1 for r in rows if r["status"] == "ok"),
        "n_partial": sum(1 for r in rows if r["status"] == "partial"),
        "n_error": sum(1 for r in rows if r["status"] == "error"),
        "n_died": sum(1 for r in rows if r.get("died")),
        "stats": stats, "runs": runs, "orders": _ORDERS,
        "regressions": [rv for rv in runs if rv["regression"]],
        "errors": [rv for rv in runs if rv["status"] == "error"],
        "dist": dist, "dist_chart": _cause_chart(dist) if dist else None,
        "groups": groups, "charted": charted,
        "n_uncharted": sum(1 for g in groups if g["n_points"] >= 2) - len(charted),
    }
    return render_template("batch_index.html.j2", v=v)


def _sort_orders(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per sort key of :data:`_ORDERS` but the date (the page's own order), each run's position."""

    def order(key) -> dict[str, int]:
        return {r["run_id"]: i for i, r in enumerate(sorted(rows, key=key))}

    big = float("inf")
    return {
        "step": order(lambda r: (-(r.get("step_time_unprofiled_us") or r.get("step_time_us") or -1), r["run_id"])),
        "impact": order(lambda r: (-(r.get("top_impact_pct") or -1), r["run_id"])),
        "cause": order(lambda r: ((r.get("top_cause") or "~") if r["status"] != "error" else "~~",
                                  -(r.get("top_impact_pct") or 0), r["run_id"])),
        "group": order(lambda r: (r.get("group_key") or "~", -(r["date"].timestamp() if r.get("date") else -big),
                                  r["run_id"])),
        # the runs that died first, by kind (CUDA, then host), newest first
        "died": order(lambda r: (0 if r.get("died") else 1, r.get("died_kind") or "",
                                 -(r["date"].timestamp() if r.get("date") else -big), r["run_id"])),
        "status": order(lambda r: ({"error": 0}.get(r["status"], 1 if r.get("died") else 2 if r.get("regression")
                                                     else 3 if r["status"] == "partial" else 4),
                                   -(r["date"].timestamp() if r.get("date") else -big), r["run_id"])),
    }


def _cause_distribution(rows: list[dict]) -> list[tuple[str, int, str, str]]:
    """How many runs have each top cause, no significant finding, or an error: (label, count, colour, css class),
    the empty ones left out."""
    counts = {c: sum(1 for r in rows if r["status"] != "error" and r.get("top_cause") == c) for c in CAUSES}
    counts["other"] = sum(1 for r in rows if r["status"] != "error" and r.get("top_cause")
                          and r["top_cause"] not in CAUSES)
    dist = [(CAUSE_LABELS[c], counts[c], CAUSE_COLORS[c], f"cause-{c}") for c in counts if counts[c]]
    dist.append(("No significant finding",
                 sum(1 for r in rows if r["status"] != "error" and not r.get("top_cause")), _NONE_COLOR, "healthy"))
    dist.append(("Error (not analyzed)", sum(1 for r in rows if r["status"] == "error"), _ERROR_COLOR, "error"))
    return [d for d in dist if d[1]]


def _row_view(r: dict) -> dict:
    return {
        "run_id": r["run_id"], "status": r["status"], "error": r.get("error"),
        "date": r["date"].strftime("%Y-%m-%d %H:%M") if r.get("date") else "–",
        "date_source": r.get("date_source"), "group": r.get("group_key"), "world_size": r.get("world_size"),
        "mode": r.get("mode"), "gpu_model": r.get("gpu_model"), "step_time_us": r.get("step_time_us"),
        # the step the run's report prices its fixes on: without the profiler when known, else the profiled one
        "step_us": r.get("step_time_unprofiled_us") or r.get("step_time_us"),
        "step_profiled": not r.get("step_time_unprofiled_us"),
        "step_source": r.get("step_time_unprofiled_source"),
        "died": r.get("died"), "died_kind": r.get("died_kind"),
        "mfu_pct": r.get("mfu_pct"), "cause": r.get("top_cause"), "kind": r.get("top_kind"),
        "severity": r.get("top_severity"), "impact": r.get("top_impact_pct"), "title": r.get("top_title"),
        "report": r.get("report_html"), "regression": bool(r.get("regression")),
        "ratio": r.get("regression_ratio"), "reference": r.get("regression_reference"),
        "median_us": r.get("regression_median_us"), "part": r.get("regression_part"),
        "delta_us": r.get("regression_delta_us"), "reg_cause": r.get("regression_cause"),
        "reg_kind": r.get("regression_kind"), "reg_finding": r.get("regression_finding"),
        "reg_report": r.get("regression_report"), "reg_error": r.get("regression_error"),
    }


def _group_views(rows: list[dict]) -> list[dict]:
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r.get("group_key") or "?", {"key": r.get("group_key") or "?", "runs": [], "points": []})
        g["runs"].append(r)
        if r["status"] != "error" and r.get("step_time_us") and r.get("date") and not r.get("died"):
            g["points"].append(r)
    out = []
    for g in groups.values():
        g["points"].sort(key=lambda r: (r["date"], r["run_id"]))
        g["n_points"] = len(g["points"])
        g["n_regressions"] = sum(1 for r in g["runs"] if r.get("regression"))
        g["n_runs"] = len(g["runs"])
        out.append(g)
    out.sort(key=lambda g: (-g["n_regressions"], -g["n_points"], g["key"]))
    return out


def _cause_chart(dist: list[tuple[str, int, str, str]]) -> dict | None:
    """Horizontal bars: how many runs have each top cause (drawn by the template, charts.count_bars)."""
    return charts.count_bars([(d[0], d[1], d[2]) for d in dist])


def _group_chart(g: dict, chart_id: str) -> dict | None:
    """Step time (ms) of a group's runs over their dates; regressions as red dots (charts.time_points)."""
    pts = []
    for r in g["points"]:
        ms = r["step_time_us"] / 1e3
        title = f"{r['run_id']}: {ms:,.1f} ms" + (f"; top cause {r['top_cause']} ({r['top_kind']})"
                                                  if r.get("top_cause") else "")
        if r.get("regression"):
            why = (f"; explained by {r['regression_cause']} ({r['regression_kind']})" if r.get("regression_cause")
                   else "")
            title = f"{r['run_id']}: {ms:,.1f} ms, {r['regression_ratio']:.2f}× the earlier median{why}"
        pts.append({"date": r["date"], "ms": ms, "title": title, "regression": bool(r.get("regression"))})
    out = charts.time_points(pts)
    if out is not None:
        out["id"] = chart_id
        out["title"] = f"Step time over time: {g['key']}"
    return out
