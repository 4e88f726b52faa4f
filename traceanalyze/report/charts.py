"""Chart and table data for the report page, as plain dicts of coordinates and labels that the templates draw as
inline SVG (``templates/_heatmap.html.j2``, ``_timeline.html.j2``, ``_charts.html.j2``): no script, no chart
library, every label escaped by Jinja2's autoescape. Deterministic for a given model.

* :func:`heatmap`: a rank × step grid of one per-step figure (step time, exposed communication). Beyond
  :data:`MAX_HEAT_ROWS` ranks or :data:`MAX_HEAT_COLS` steps, neighbouring ranks (steps) share a cell that shows
  their value farthest from the median, so one outlier among 1,000 ranks still shows. Colour: diverging around
  the grid's median, red above and blue below, full at the largest deviation or :data:`HEAT_MIN_SPAN` of the
  median, whichever is larger (step times of synchronous ranks differ by a few % and stay light).
* :func:`timeline`: the lanes of :func:`traceanalyze.metrics.where.timeline_model` scaled to the page, with the
  findings' markers.
* :func:`rank_bars`: compute / non-compute / idle % bars for at most :data:`MAX_BARS` ranks (outliers first).
* :func:`step_lines`: step time per profiler step, one polyline per rank up to :data:`MAX_LINES` ranks, else
  min / median / max across ranks.
* :func:`rank_order`: ranks with the outliers first, for tables that show the first rows and fold the rest.
"""

from __future__ import annotations

import math
from statistics import median

from traceanalyze.fmt import finite

MAX_HEAT_ROWS = 128
MAX_HEAT_COLS = 40
HEAT_WIDTH = 400  # px of the grid (two heatmaps side by side)
MAX_BARS = 12
MAX_LINES = 16
SHOWN_RANKS = 8  # rows of a per-rank table shown before the fold
OUTLIER_Z = 3.5  # robust z-score (median absolute deviation × 1.4826) from which a rank is an outlier
MID, HIGH, LOWC = (248, 249, 250), (201, 42, 42), (25, 113, 194)  # #f8f9fa, red #c92a2a above, blue #1971c2 below
HEAT_MIN_SPAN = 0.10  # deviation from the median (share of it) that gets the full colour at least
KIND_COLORS = {"compute": "#3b6fb6", "communication": "#f0a73a", "idle": "#dee2e6"}


def _color(t: float) -> str:
    """-1 (blue) … 0 (near white) … 1 (red)."""
    t = min(1.0, max(-1.0, t))
    end = HIGH if t >= 0 else LOWC
    return "#" + "".join(f"{round(a + (b - a) * abs(t)):02x}" for a, b in zip(MID, end, strict=True))


def _groups(ids: list[int], limit: int) -> list[list[int]]:
    size = max(1, math.ceil(len(ids) / limit))
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def _label(ids: list[int]) -> str:
    return str(ids[0]) if len(ids) == 1 else f"{ids[0]}–{ids[-1]}"


def heatmap(steps: list[dict], key: str, title: str, skip_step: int | None = None) -> dict | None:
    """A rank × step grid of ``key`` (µs) from the model's step rows, in ms (module docstring). None with fewer
    than one value or when every value is zero. ``skip_step`` (the compile step) is left out."""
    cells: dict[tuple[int, int], float] = {}
    for s in steps:
        r, st, v = s.get("rank"), s.get("step"), finite(s.get(key))
        if isinstance(r, int) and isinstance(st, int) and v is not None and st != skip_step:
            cells[(r, st)] = v / 1e3
    if not cells or not any(cells.values()):
        return None
    ranks = sorted({r for r, _ in cells})
    step_ids = sorted({s for _, s in cells})
    rows, cols = _groups(ranks, MAX_HEAT_ROWS), _groups(step_ids, MAX_HEAT_COLS)
    lo, hi = min(cells.values()), max(cells.values())
    med = median(list(cells.values()))
    span = max(hi - med, med - lo, HEAT_MIN_SPAN * abs(med), 1e-9)
    cw = min(40.0, HEAT_WIDTH / len(cols))
    ch = 18.0 if len(rows) <= 16 else max(3.0, min(10.0, 480.0 / len(rows)))
    label_w = 90 if len(rows) > 1 and any(len(g) > 1 for g in rows) else 60
    out_cells = []
    for i, rg in enumerate(rows):
        for j, sg in enumerate(cols):
            vals = [(cells[(r, s)], r, s) for r in rg for s in sg if (r, s) in cells]
            if not vals:
                continue
            v, r, s = max(vals, key=lambda c: (abs(c[0] - med), c[0]))
            t = (v - med) / span
            who = f"rank {r}" if len(rg) == 1 else f"ranks {_label(rg)} (farthest: rank {r})"
            when = f"step {s}" if len(sg) == 1 else f"steps {_label(sg)} (farthest: step {s})"
            out_cells.append({"x": round(label_w + j * cw, 2), "y": round(i * ch, 2), "w": round(cw - 1, 2),
                              "h": round(max(1.0, ch - (1 if ch > 4 else 0)), 2), "fill": _color(t),
                              "title": f"{who}, {when}: {v:,.2f} ms"})
    row_labels = []
    every = max(1, math.ceil(len(rows) / (480 / 12)))  # at most one label per 12 px
    for i, rg in enumerate(rows):
        if i % every == 0:
            row_labels.append({"y": round(i * ch + ch / 2 + 4, 2), "text": f"rank {_label(rg)}"})
    col_labels = []
    every_c = max(1, math.ceil(len(cols) / 15))
    for j, sg in enumerate(cols):
        if j % every_c == 0:
            col_labels.append({"x": round(label_w + j * cw + cw / 2, 2), "text": _label(sg)})
    height = len(rows) * ch
    return {"title": title, "cells": out_cells, "row_labels": row_labels, "col_labels": col_labels,
            "width": round(label_w + len(cols) * cw + 4, 2), "height": round(height + 34, 2), "grid_h": height,
            "label_w": label_w, "lo": med - span, "hi": med + span, "median": med, "lo_color": _color(-1),
            "mid_color": _color(0), "hi_color": _color(1),
            "n_ranks": len(ranks), "n_steps": len(step_ids),
            "grouped": (f"{len(ranks)} ranks in {len(rows)} rows" if len(rows) < len(ranks) else "")
            + ("; " if len(rows) < len(ranks) and len(cols) < len(step_ids) else "")
            + (f"{len(step_ids)} steps in {len(cols)} columns" if len(cols) < len(step_ids) else "")}


def timeline(tl: dict | None, width: int = 860) -> dict | None:
    """Page coordinates for the median step's lanes (``timeline`` of the run model): one row per lane, x scaled to
    the longest lane, segments coloured by kind, markers outlined, ticks every quarter."""
    if not tl or not tl.get("lanes"):
        return None
    lanes = [ln for ln in tl["lanes"] if isinstance(ln, dict)]
    span = max((finite(ln.get("dur_us")) or 0.0) for ln in lanes) or 1.0
    label_w, lane_h = 70, 16 if len(lanes) <= 16 else 10
    scale = (width - label_w) / span
    rows = []
    for i, ln in enumerate(lanes):
        segs = []
        for s in ln.get("segments") or []:
            a, d = finite(s.get("start_us")) or 0.0, finite(s.get("dur_us")) or 0.0
            segs.append({"x": round(label_w + a * scale, 2), "w": round(max(0.5, d * scale), 2),
                         "fill": KIND_COLORS.get(s.get("kind"), "#868e96"),
                         "title": f"rank {ln.get('rank')}: {s.get('kind')} {a / 1e3:,.2f}–{(a + d) / 1e3:,.2f} ms"})
        rows.append({"rank": ln.get("rank"), "y": 4 + i * (lane_h + 3), "h": lane_h, "segments": segs,
                     "dur_ms": (finite(ln.get("dur_us")) or 0.0) / 1e3})
    y_of = {r["rank"]: r["y"] for r in rows}
    markers = []
    for m in tl.get("markers") or []:
        if m.get("rank") in y_of:
            a, d = finite(m.get("start_us")) or 0.0, finite(m.get("dur_us")) or 0.0
            markers.append({"x": round(label_w + a * scale, 2), "w": round(max(2.0, d * scale), 2),
                            "y": y_of[m["rank"]] - 1, "h": lane_h + 2,
                            "title": f"rank {m['rank']}: {m.get('label')} {a / 1e3:,.2f}–{(a + d) / 1e3:,.2f} ms "
                                     f"({d / 1e3:,.2f} ms)"})
    height = 4 + len(rows) * (lane_h + 3)
    ticks = [{"x": round(label_w + f * span * scale, 2), "text": f"{f * span / 1e3:,.1f} ms",
              "anchor": "end" if f == 1.0 else "start" if f == 0 else "middle"} for f in (0, 0.25, 0.5, 0.75, 1.0)]
    return {"step": tl.get("step"), "rows": rows, "markers": markers, "ticks": ticks, "width": width,
            "height": height + 22, "lanes_h": height, "label_w": label_w, "n_ranks": tl.get("n_ranks"),
            "n_lanes": len(rows), "colors": KIND_COLORS}


def outliers(ranks: list[dict], per_step: dict[int, dict[str, float]]) -> list[int]:
    """Ranks whose per-step step time, exposed communication or idle, or whose idle %, is :data:`OUTLIER_Z` robust
    z-scores or more off the median rank (worst first)."""
    scores: dict[int, float] = {}
    series: list[dict[int, float]] = []
    for key in ("step_time_us", "exposed_comm_us", "idle_us"):
        series.append({r: v[key] for r, v in per_step.items() if finite(v.get(key)) is not None})
    series.append({r["rank"]: r["idle_pct"] for r in ranks if isinstance(r.get("rank"), int)
                   and finite(r.get("idle_pct")) is not None})
    for d in series:
        if len(d) < 3:
            continue
        med = median(list(d.values()))
        mad = median([abs(v - med) for v in d.values()]) * 1.4826
        floor = max(mad, 0.01 * abs(med), 1e-9)
        for r, v in d.items():
            z = abs(v - med) / floor
            if z >= OUTLIER_Z:
                scores[r] = max(scores.get(r, 0.0), z)
    return sorted(scores, key=lambda r: (-scores[r], r))


def rank_order(rank_ids: list[int], first: list[int]) -> list[int]:
    """``first`` (flagged and outlier ranks, in order), then the others by rank."""
    head = list(dict.fromkeys(r for r in first if r in rank_ids))
    return head + [r for r in rank_ids if r not in head]


def rank_bars(ranks: list[dict], order: list[int], flags: dict[int, list[str]], width: int = 860) -> dict | None:
    """Stacked bars of compute / non-compute / idle % per rank, at most :data:`MAX_BARS` (``order``'s first)."""
    by = {r.get("rank"): r for r in ranks}
    rest = [r for r in ranks if r.get("rank") not in order]  # ranks without an integer id come last
    shown = [r for r in [by[k] for k in order if k in by] + rest if finite(r.get("idle_pct")) is not None][:MAX_BARS]
    if not shown:
        return None
    label_w, bar_h = 150, 20
    scale = (width - label_w - 10) / 100
    rows = []
    for i, r in enumerate(shown):
        x = float(label_w)
        parts = []
        for key, label, color in (("compute_pct", "compute", "#3b6fb6"), ("non_compute_pct", "non-compute", "#f0a73a"),
                                  ("idle_pct", "idle", "#ced4da")):
            v = finite(r.get(key)) or 0.0
            w = v * scale
            parts.append({"x": round(x, 2), "w": round(w, 2), "fill": color, "v": v,
                          "text": f"{v:.0f}" if w >= 28 else "", "tx": round(x + w / 2, 2),
                          "title": f"rank {r.get('rank')}: {label} {v:.2f} %"})
            x += w
        fl = flags.get(r.get("rank")) or []
        rows.append({"y": i * (bar_h + 6), "h": bar_h, "parts": parts,
                     "label": f"rank {r.get('rank')}" + (f" ◀ {fl[0].split(':')[0]}" if fl else "")})
    ticks = [{"x": round(label_w + p * scale, 2), "text": f"{p}%"} for p in (0, 25, 50, 75, 100)]
    return {"rows": rows, "ticks": ticks, "width": width, "height": len(rows) * (bar_h + 6) + 22,
            "bars_h": len(rows) * (bar_h + 6), "n_shown": len(rows), "n_ranks": len(ranks)}


LINE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#7b4173", "#3182bd", "#e6550d")


def step_lines(steps: list[dict], flagged: list[int], width: int = 860, height: int = 220) -> dict | None:
    """Step time (ms) per profiler step: one polyline per rank up to :data:`MAX_LINES` ranks, else min / median /
    max across ranks. None with fewer than two steps."""
    by_step: dict[int, dict[int, float]] = {}
    for s in steps:
        v, st, rk = finite(s.get("step_time_us")), s.get("step"), s.get("rank")
        if v is not None and isinstance(st, int) and isinstance(rk, int):
            by_step.setdefault(st, {})[rk] = v / 1e3
    ids = sorted(by_step)
    if len(ids) < 2:
        return None
    ranks = sorted({r for d in by_step.values() for r in d})
    series: list[tuple[str, list[float | None], bool]] = []
    if len(ranks) <= MAX_LINES:
        series = [(f"rank {r}", [by_step[s].get(r) for s in ids], r in flagged) for r in ranks]
    else:
        for label, fn in (("max", max), ("median", median), ("min", min)):
            series.append((f"{label} across ranks", [fn(list(by_step[s].values())) for s in ids], label == "max"))
    vals = [v for _, vs, _ in series for v in vs if v is not None]
    lo, hi = 0.8 * min(vals), 1.05 * max(vals)
    left, top, plot_w, plot_h = 60, 8, width - 80, height - 40
    xs = {s: left + (plot_w * i / (len(ids) - 1)) for i, s in enumerate(ids)}

    def y(v: float) -> float:
        return round(top + plot_h * (1 - (v - lo) / (hi - lo or 1)), 2)
    lines = []
    for n, (label, vs, thick) in enumerate(series):
        pts = [(round(xs[s], 2), y(v), s, v) for s, v in zip(ids, vs, strict=True) if v is not None]
        lines.append({"label": label, "color": LINE_COLORS[n % len(LINE_COLORS)], "thick": thick,
                      "points": " ".join(f"{px},{py}" for px, py, _, _ in pts),
                      "dots": [{"x": px, "y": py, "title": f"{label}, step {s}: {v:,.2f} ms"}
                               for px, py, s, v in pts] if len(ids) <= 60 else []})
    yticks = [{"y": y(lo + (hi - lo) * f), "text": f"{lo + (hi - lo) * f:,.0f}"} for f in (0, 0.5, 1)]
    every = max(1, math.ceil(len(ids) / 15))
    xticks = [{"x": round(xs[s], 2), "text": str(s)} for i, s in enumerate(ids) if i % every == 0]
    return {"lines": lines, "yticks": yticks, "xticks": xticks, "width": width, "height": height, "left": left,
            "top": top, "plot_w": plot_w, "plot_h": plot_h, "many": len(ranks) > MAX_LINES}


def count_bars(rows: list[tuple[str, int, str]], width: int = 640) -> dict | None:
    """Horizontal bars of counts: ``rows`` of (label, count, colour), in order (the batch index's top causes)."""
    if not rows:
        return None
    label_w, bar_h = 200, 20
    top = max(c for _, c, _ in rows) or 1
    scale = (width - label_w - 50) / top
    out = [{"y": i * (bar_h + 6), "h": bar_h, "label": lab, "w": round(max(1.0, c * scale), 2), "fill": col,
            "x": label_w, "tx": round(label_w + max(1.0, c * scale) + 6, 2), "n": c,
            "title": f"{lab}: {c} run{'s' if c != 1 else ''}"} for i, (lab, c, col) in enumerate(rows)]
    return {"rows": out, "width": width, "height": len(out) * (bar_h + 6), "label_w": label_w}


def time_points(points: list[dict], width: int = 860, height: int = 240) -> dict | None:
    """Step time (ms) of runs over their dates: ``points`` of ``{"date": datetime, "ms", "title", "regression"}``,
    in date order; x by date (runs of one day side by side), y from 0. None without points."""
    if not points:
        return None
    left, top, plot_w, plot_h = 60, 8, width - 80, height - 50
    t0 = points[0]["date"].timestamp()
    span = (points[-1]["date"].timestamp() - t0) or 1.0
    hi = 1.08 * max(p["ms"] for p in points) or 1.0
    pts = []
    for i, p in enumerate(points):
        xf = (p["date"].timestamp() - t0) / span if len(points) > 1 and span > 1.0 else i / max(1, len(points) - 1)
        pts.append({"x": round(left + plot_w * xf, 2), "y": round(top + plot_h * (1 - p["ms"] / hi), 2),
                    "title": p["title"], "regression": bool(p.get("regression"))})
    days = sorted({p["date"].strftime("%Y-%m-%d") for p in points})
    every = max(1, -(-len(days) // 8))
    xticks = []
    for d in days[::every]:
        first = next(q for q, p in zip(pts, points, strict=True) if p["date"].strftime("%Y-%m-%d") == d)
        xticks.append({"x": first["x"], "text": d})
    yticks = [{"y": round(top + plot_h * (1 - f), 2), "text": f"{hi * f:,.0f}"} for f in (0, 0.5, 1)]
    return {"points": pts, "line": " ".join(f"{p['x']},{p['y']}" for p in pts), "xticks": xticks, "yticks": yticks,
            "width": width, "height": height, "left": left, "top": top, "plot_w": plot_w, "plot_h": plot_h}
