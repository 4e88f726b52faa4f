"""The view model: everything the report page and the Markdown summary show, derived defensively from the report
model (a dict, see ``docs/schema.md``): optional keys may be missing, values may be None, NaN or of the wrong type.

Bounded output: per-step tables show at most :data:`MAX_STEP_ROWS` steps × :data:`MAX_STEP_COLS` ranks, per-rank
tables show the ranks findings name and the outliers first and fold the rest, the charts' bounds are in
:mod:`traceanalyze.report.charts` (heatmap cells group ranks beyond 128 rows, 32 timeline lanes, 12 bars, 16
lines), and the file list shows up to :data:`MAX_FILE_ROWS` files; every cut is stated next to the table or chart.
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median
from typing import Any

from traceanalyze.findings import DIED_KINDS
from traceanalyze.fmt import finite, fmt_float, fmt_flop, fmt_int, fmt_ms, fmt_pct, ranges, text
from traceanalyze.report import charts
from traceanalyze.report.replay import confidence_view, replay_view  # confidence_view: markdown's too

MAX_STEP_ROWS = 40
MAX_STEP_COLS = 16
MAX_FILE_ROWS = 256
MAX_MEMORY_ROWS = 64  # rows of the memory table (rank × device, the growing ranks first); the rest counted
MAX_HOST_ROWS = 12  # rows of each host table (top CPU ops, blocking calls: the most GPU idle first)
SLOW_STEP_FRAC = 0.05  # a rank's step is marked slow when it is this much above the step's median across ranks
OUTLIER_POINTS = 15.0  # a rank whose compute % or idle % is this many points off the run's median is flagged

CAUSES = ("interconnect", "precision", "imbalance", "config")
CAUSE_COLORS = {"interconnect": "#6741d9", "precision": "#0c8599", "imbalance": "#e8590c", "config": "#5c940d",
                "other": "#495057"}
CAUSE_LABELS = {"interconnect": "Interconnect", "precision": "Precision", "imbalance": "Imbalance",
                "config": "Configuration", "other": "Other"}
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}
LEVEL_ORDER = {"error": 0, "partial": 1, "warning": 2, "info": 3}
BREAKDOWN_COLORS = ("#3b6fb6", "#f0a73a", "#ced4da")  # compute, non-compute, idle

MODE_TEXT = {
    "gpu": "GPU mode: the breakdown comes from the GPU kernels in each trace. Compute is time with a compute "
           "kernel running; non-compute is time with only communication (NCCL) or memory-copy kernels running; "
           "idle is time with no kernel on the GPU.",
    "cpu": "CPU mode: these traces hold no GPU kernels (CPU-only or gloo training), so the breakdown comes from "
           "the training thread's operators. Compute is time in aten:: ops; non-compute is c10d::/gloo: "
           "communication not hidden under them; idle is time the training thread ran no op.",
    "logs": "No trace found: this run is reported from its logs, NCCL output and configs alone, so it has no time "
            "breakdown, timeline or what-if replay. Profile a few steps (traceanalyze.capture) for those.",
}

DEFINITIONS = [
    ("Trace window", "From the first to the last kernel (GPU mode) or over the profiler steps (CPU mode), per "
                     "rank. When a trace holds two or more profiler steps, the last one is left out (it often "
                     "holds the profiler's own teardown), as Holistic Trace Analysis does."),
    ("Idle %", "Share of the window with no kernel running (CPU mode: no op on the training thread)."),
    ("Compute %", "Share of the window with at least one compute kernel (CPU mode: aten:: op) running."),
    ("Non-compute %", "Share of the window busy with only communication or memory kernels. "
                      "Idle + compute + non-compute = 100 %."),
    ("Comm/comp overlap %", "Share of communication time during which a compute kernel also runs. High is good: "
                            "the communication is hidden."),
    ("Exposed communication", "Communication time not hidden under compute. This is what communication costs "
                              "in step time."),
    ("Step time", "A rank's: the median duration of its counted ProfilerStep#N ranges (the last, partial step of "
                  "each profiling window and steps missing on some rank are left out). The run's: the median over "
                  "those steps of the slowest rank's duration."),
    ("Impact %", "Estimated share of step time that fixing a finding would win back; findings are ranked by it."),
]

PER_STEP_KEYS = ("step_time_us", "compute_us", "exposed_comm_us", "idle_us", "comm_us")


# ---------------------------------------------------------------------------------------------------------
# Reading the model defensively

def as_list(x: Any) -> list:
    """``x`` as a list when it is a list or tuple, else an empty list."""
    return list(x) if isinstance(x, (list, tuple)) else []


def as_dict(x: Any) -> dict:
    """``x`` when it is a dict, else an empty dict."""
    return x if isinstance(x, dict) else {}


def mean(xs: Iterable[Any]) -> float | None:
    """The mean of the finite numbers among ``xs``; None without any."""
    vals = [v for v in (finite(x) for x in xs) if v is not None]
    return sum(vals) / len(vals) if vals else None


def sorted_ranks(run: dict) -> list[dict]:
    """A run's per-rank rows by rank; rows without an integer rank last."""
    return sorted((r for r in as_list(run.get("ranks")) if isinstance(r, dict)),
                  key=lambda r: r.get("rank") if isinstance(r.get("rank"), int) else 1 << 30)


def sorted_runs(model: dict) -> list[dict]:
    """The model's runs, the subject runs first."""
    runs = [r for r in as_list(model.get("runs")) if isinstance(r, dict)]
    runs.sort(key=lambda r: 0 if r.get("role", "subject") == "subject" else 1)
    return runs


def steady_steps(run: dict) -> list[dict]:
    """A run's per-step rows without its compile step (all of them when nothing else is left)."""
    compile_step = as_dict(run.get("compile_step")).get("step")
    steps = [s for s in as_list(run.get("steps")) if isinstance(s, dict)]
    return [s for s in steps if s.get("step") != compile_step] or steps


# ---------------------------------------------------------------------------------------------------------
# Findings, verdict, comparison, warnings

def _cause(f: dict) -> str:
    c = f.get("cause")
    return c if c in CAUSES else "other"


def sorted_findings(model: dict) -> list[dict]:
    """The findings: the one the verdict names first (``main``: a specific cause the diagnosis ranks above the symptom
    it explains, e.g. a blocking host sync above the collectives that wait for it), then by impact (unknown last),
    then severity (a config fault of medium or high severity that changes what is trained, ``effect``, right after
    the main one: the verdict names it there), each with ``cause_key``, ``cause_label``, ``severity_key``,
    ``evidence`` (strings),
    ``ranks_text`` and ``died`` (a finding that says the run died: :data:`~traceanalyze.findings.DIED_KINDS`) added."""
    fs = [f for f in as_list(model.get("findings")) if isinstance(f, dict)]

    def key(f: dict) -> tuple:
        imp = finite(f.get("impact_pct"))
        fault = bool(f.get("effect")) and f.get("severity") in ("high", "medium")
        return (f.get("main") is not True, not fault, -(imp if imp is not None else -1.0),
                SEVERITY_ORDER.get(str(f.get("severity")), 3))

    out = []
    for f in sorted(fs, key=key):
        out.append({**f, "cause_key": _cause(f), "cause_label": CAUSE_LABELS[_cause(f)],
                    "severity_key": f.get("severity") if f.get("severity") in SEVERITY_ORDER else "low",
                    "evidence": [str(e) for e in as_list(f.get("evidence"))],
                    "ranks_text": ranges(as_list(f.get("ranks"))), "conf": confidence_view(f.get("confidence")),
                    "died": f.get("kind") in DIED_KINDS})
    return out


def verdict(model: dict, findings: list[dict]) -> tuple[str, str]:
    """(verdict sentence, cause key for its colour)."""
    v = model.get("verdict")
    top = findings[0] if findings else None
    if isinstance(v, str) and v.strip():
        healthy = not findings or v.lower().startswith("no significant")
        return v.strip(), ("healthy" if healthy else top["cause_key"])
    if top is not None:
        return str(top.get("title") or "See the findings below."), top["cause_key"]
    return "No significant slowdown found: no diagnosis rule fired on these traces.", "healthy"


def partial_view(p: Any) -> dict | None:
    """The model's ``partial`` (``{run, traced_ranks, world_size, could_explain}``: fewer ranks traced than the world
    size) for the top of the page: ``traced``, ``world``, ``missing``, ``run`` and ``could_explain`` (kinds in words,
    at most 8); None when absent or not two whole numbers with fewer traced than the world size."""
    p = as_dict(p)
    k, n = p.get("traced_ranks"), p.get("world_size")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (k, n)) or not 0 < k < n:
        return None
    kinds = [text(x).replace("_", " ") for x in as_list(p.get("could_explain"))[:8]]
    return {"traced": k, "world": n, "missing": n - k, "run": text(p.get("run")), "could_explain": kinds}


def comparison(model: dict, findings: list[dict]) -> dict | None:
    """The comparison with its baseline: parts (empty ones dropped, a "not attributed" rest added) with bar sizes
    and shares, the step-time delta and ratio; None without a comparison."""
    c = as_dict(model.get("comparison"))
    if not c:
        return None
    by_title = {str(f.get("title")): f for f in findings}
    parts = []
    for p in as_list(c.get("parts")):
        if not isinstance(p, dict):
            continue
        if all(not finite(p.get(k)) for k in ("subject_us", "baseline_us", "delta_us")) and not p.get("finding"):
            continue  # an empty part (0 vs 0) only adds noise
        f = by_title.get(str(p.get("finding"))) if p.get("finding") else None
        parts.append({**p, "cause_key": f["cause_key"] if f else None})
    delta = finite(c.get("delta_us"))
    if delta is None:
        s, b = finite(c.get("subject_step_us")), finite(c.get("baseline_step_us"))
        delta = s - b if s is not None and b is not None else None
    total = sum(v for v in (finite(p.get("delta_us")) for p in parts) if v is not None)
    if delta is not None and parts and abs(delta - total) > max(1.0, 0.005 * abs(delta)):
        parts.append({"part": "not attributed", "subject_us": None, "baseline_us": None,
                      "delta_us": delta - total, "finding": None, "cause_key": None, "residual": True})
    biggest = max((abs(finite(p.get("delta_us")) or 0.0) for p in parts), default=0.0) or 1.0
    for p in parts:
        d = finite(p.get("delta_us")) or 0.0
        p["bar_pct"] = round(100 * abs(d) / biggest, 1)
        p["bar_dir"] = "slower" if d > 0 else "faster"
        p["share_pct"] = 100 * d / delta if delta else None
    ratio = None
    s, b = finite(c.get("subject_step_us")), finite(c.get("baseline_step_us"))
    if s and b:
        ratio = s / b
    nb = as_dict(c.get("next_bottleneck"))
    return {**c, "parts": parts, "delta_us": delta, "ratio": ratio,
            "config_diffs": [d for d in as_list(c.get("config_diffs")) if isinstance(d, dict)],
            "whatif_check": [w for w in as_list(c.get("whatif_check")) if isinstance(w, dict)],
            "has_check": "whatif_check" in c,
            "next_bottleneck": ({**nb, "cause_key": nb.get("cause") if nb.get("cause") in CAUSES else "other"}
                                if nb else None)}


def warning_rows(model: dict) -> list[dict]:
    """The data-quality warnings, errors first (unknown levels read as warnings)."""
    ws = []
    for w in as_list(model.get("warnings")):
        if not isinstance(w, dict):
            continue
        level = w.get("level") if w.get("level") in LEVEL_ORDER else "warning"
        ws.append({"level": level, "file": w.get("file"), "message": text(w.get("message")), "run": w.get("run")})
    return sorted(ws, key=lambda w: LEVEL_ORDER[w["level"]])


# ---------------------------------------------------------------------------------------------------------
# Ranks that stand out

def _flags(run: dict, findings: list[dict]) -> dict[int, list[str]]:
    """Per rank, short labels that single it out: ranks named by imbalance findings, then outliers.

    An outlier is a rank whose compute % or idle % is more than ``OUTLIER_POINTS`` points (and more than three
    median absolute deviations) off the run's median; when more than a quarter of the ranks qualify, none is
    flagged (that is a spread, visible in the chart, not an odd rank).
    """
    ranks = [r for r in as_list(run.get("ranks")) if isinstance(r, dict)]
    n = len(ranks)
    flags: dict[int, list[str]] = {}
    for f in findings:
        if f["cause_key"] != "imbalance" or (f.get("run") not in (None, run.get("name"))):
            continue
        named = [r for r in as_list(f.get("ranks")) if isinstance(r, int)]
        if named and len(named) < max(n, 2):
            for r in named:
                flags.setdefault(r, []).append(str(f.get("kind") or "imbalance").replace("_", " "))
    if n >= 3:
        for key, label in (("compute_pct", "compute"), ("idle_pct", "idle")):
            vals = [finite(r.get(key)) for r in ranks]
            good = [v for v in vals if v is not None]
            if len(good) < 3:
                continue
            med = median(good)
            mad = median(abs(v - med) for v in good)
            limit = max(OUTLIER_POINTS, 3 * mad)
            out = [(r, v) for r, v in zip(ranks, vals, strict=True) if v is not None and abs(v - med) > limit]
            if len(out) > max(1, n // 4):
                continue  # a wide spread, not a few odd ranks: the chart shows it, a flag on each would be noise
            for r, v in out:
                lab = f"outlier: {label} {v:.1f} % (median {med:.1f} %)"
                flags.setdefault(r.get("rank"), [])
                if lab not in flags[r.get("rank")]:
                    flags[r.get("rank")].append(lab)
    return flags


def _stragglers(run: dict, findings: list[dict]) -> list[int]:
    """The ranks the run's straggler and late-entry findings name (the ranks the others wait for)."""
    return [r for f in findings if f.get("kind") in ("straggler", "late_entry")
            and f.get("run") in (None, run.get("name")) for r in as_list(f.get("ranks")) if isinstance(r, int)]


def _shown_and_folded(ranks: list[dict], rank_ids: list[int], order: list[int],
                      marked: list[Any]) -> tuple[list[dict], list[dict]]:
    """The per-rank table's rows in ``order`` (rows without an integer rank last), split at the fold: every rank
    when there are few, else the ``marked`` ones (stragglers, flagged, outliers), at least
    :data:`charts.SHOWN_RANKS` and at most 16."""
    head = len(dict.fromkeys(r for r in marked if r in rank_ids))
    n_show = len(rank_ids) if len(rank_ids) <= charts.SHOWN_RANKS + 2 else max(charts.SHOWN_RANKS, min(head, 16))
    by_rank = {r.get("rank"): r for r in ranks}
    ordered = [by_rank[r] for r in order if r in by_rank] + [r for r in ranks if not isinstance(r.get("rank"), int)]
    return ordered[:n_show], ordered[n_show:]


def per_step_medians(steps: list[dict]) -> dict[int, dict[str, float]]:
    """Per rank, the median over its steps of each figure of :data:`PER_STEP_KEYS` (µs), and ``n`` steps."""
    by: dict[int, list[dict]] = {}
    for s in steps:
        if isinstance(s.get("rank"), int):
            by.setdefault(s["rank"], []).append(s)
    out: dict[int, dict[str, float]] = {}
    for r, rows in by.items():
        d: dict[str, float] = {"n": len(rows)}
        for k in PER_STEP_KEYS:
            vals = [v for v in (finite(x.get(k)) for x in rows) if v is not None]
            if vals:
                d[k] = median(vals)
        out[r] = d
    return out


# ---------------------------------------------------------------------------------------------------------
# One run: facts, per-step table, charts, tables

def _ranks_fact(run: dict, found: list) -> str:
    """``8 of 16 (no trace for ranks 8–15)``."""
    world = run.get("world_size")
    missing = as_list(run.get("missing_ranks"))
    out = f"{len(found)} of {world}" if isinstance(world, int) else str(len(found))
    if missing:
        n_missing = run.get("n_missing_ranks") if isinstance(run.get("n_missing_ranks"), int) else len(missing)
        out += f" (no trace for rank{'s' if n_missing > 1 else ''} {ranges(missing)})"
    return out


def _hardware_facts(run: dict, mode: str | None) -> list[tuple[str, str]]:
    """GPU, backend, NCCL and CUDA versions (the GPU ones always in GPU mode, "—" or "not recorded" if unknown)."""
    facts = []
    if run.get("gpu_model") or mode == "gpu":
        gpu = text(run.get("gpu_model"))
        if isinstance(run.get("gpu_count"), int) and run.get("gpu_model"):
            gpu += f" × {run['gpu_count']} visible"
        facts.append(("GPU", gpu if run.get("gpu_model") else "not recorded in the trace"))
    facts.append(("Backend", text(run.get("backend"))))
    if run.get("nccl_version") or mode == "gpu":
        facts.append(("NCCL version", text(run.get("nccl_version"))))
    if run.get("cuda_runtime_version") or mode == "gpu":
        facts.append(("CUDA runtime", text(run.get("cuda_runtime_version"))))
    return facts


def _step_facts(run: dict, stat: str) -> list[tuple[str, str]]:
    """The step time, the compile step kept apart, and the step time the logs state."""
    facts = [(f"Step time ({stat}{', compile step apart' if run.get('compile_step') else ''})",
              f"{fmt_ms(run.get('step_time_us'))} ms")]
    cstep = as_dict(run.get("compile_step"))
    if cstep:
        facts.append((f"Compile step (step {text(cstep.get('step'))})", f"{fmt_ms(cstep.get('step_time_us'))} ms, "
                      "holds torch.compile; left out of the step time"))
    log_st = as_dict(run.get("log_step_time_ms"))
    if finite(log_st.get("median_ms")) is not None:
        facts.append(("Step time from logs", f"{fmt_float(log_st.get('median_ms'), 2)} ms (median of "
                      f"{fmt_int(log_st.get('n'))} logged steps after the first, steps {text(log_st.get('steps'))})"))
    return facts


def _run_facts(run: dict, mode: str | None, found: list, files: list[dict], stat: str) -> list[tuple[str, str]]:
    """The run's facts table: (label, text) rows."""
    facts = [("Ranks with a trace", _ranks_fact(run, found)), ("Mode", (mode or text(run.get("mode"))).upper())]
    facts += _hardware_facts(run, mode)
    facts += _step_facts(run, stat)
    n_cached = sum(1 for f in files if f.get("cached"))
    facts.append(("Files read", f"{len(files)} trace file{'s' if len(files) != 1 else ''}"
                  + (f" ({n_cached} from cache)" if n_cached else "")))
    if finite(run.get("effective_batch")) is not None:
        facts.append(("Effective (global) batch", fmt_float(run.get("effective_batch"), 0)))
    link = as_dict(run.get("link"))
    if link:
        gbps = (f"{fmt_float(link.get('expected_gbps'))} GB/s" if finite(link.get("expected_gbps")) is not None
                else "not known")
        facts.append(("Expected link bandwidth", gbps + (f" ({link['source']})" if link.get("source") else "")))
    if mfu_text(run):
        facts.append(("MFU (model FLOPs utilization)", mfu_text(run)))
    return facts


def mfu_text(run: dict) -> str | None:
    """The run's MFU with what it is made of, one line: ``4.85 % from op-shape FLOPs (10.5 TFLOP per rank and step
    over 218.73 ms without the profiler), peak 989 TFLOPS (H200 dense bf16 datasheet)``; None without it."""
    m, pct = as_dict(run.get("mfu")), finite(run.get("mfu_pct"))
    if pct is None or not m:
        return None
    step = ("without the profiler" if m.get("step_source") not in (None, "profiled") else "profiled")
    peak = (f"{fmt_float(m.get('peak_tflops'), 0)} TFLOPS (--peak-tflops)" if m.get("peak_source") == "--peak-tflops"
            else f"{fmt_float(m.get('peak_tflops'), 0)} TFLOPS ({text(m.get('peak_reference'))} dense "
                 f"{text(m.get('peak_dtype'))} datasheet{'; assumed' if m.get('assumed') else ''})")
    return (f"{fmt_pct(pct, 2)} % from {text(m.get('flops_source') or 'op-shape')} FLOPs "
            f"({fmt_flop(m.get('model_flops_per_step'))} per rank and step over {fmt_ms(m.get('step_time_us'))} ms "
            f"{step}), peak {peak}")


def _kept_waiting_rank(run: dict) -> tuple[int | None, float] | None:
    """(the rank that kept the others waiting longest at the collectives, or None when none did by
    :data:`SLOW_STEP_FRAC` of the step per other rank and step; its ``kept_others_waiting_us``), or None when the
    run has no arrival skew (``runs[i].ranks[j].kept_others_waiting_us``). A rank whose step is the longest because
    it waited is never the one marked."""
    kept = {r.get("rank"): finite(r.get("kept_others_waiting_us")) for r in as_list(run.get("ranks"))
            if isinstance(r, dict) and isinstance(r.get("rank"), int)}
    kept = {k: v for k, v in kept.items() if v is not None}
    if not kept:
        return None
    top = max(sorted(kept), key=lambda k: kept[k])
    steps = {s.get("step") for s in as_list(run.get("steps")) if isinstance(s, dict)}
    step_us = finite(run.get("step_time_us"))
    per = kept[top] / max(1, len(kept) - 1) / max(1, len(steps))
    return (top if step_us and per >= SLOW_STEP_FRAC * step_us else None), kept[top]


def _step_row(step: Any, times: dict[Any, Any], cols: list[int], stragglers: list[int],
              compile_step: Any, by_time: bool = True) -> dict:
    """One row of the per-step table: the columns' step times, each marked when it is one of ``stragglers`` (the
    straggler finding's ranks, or the rank that kept the others waiting); with none and ``by_time`` (a run without
    arrival skew), the slowest when it is :data:`SLOW_STEP_FRAC` above the median. Then max, median, spread."""
    cells = [times.get(rk) for rk in cols]
    nums = [v for v in (finite(c) for c in times.values()) if v is not None]
    hi = max(nums) if nums else None
    med = median(nums) if nums else None
    slow = hi is not None and med is not None and len(nums) > 1 and hi > med * (1 + SLOW_STEP_FRAC)
    marks = ([rk in stragglers for rk in cols] if stragglers or not by_time else  # the straggler finding's rank
             [slow and finite(c) == hi for c in cells])
    return {"step": step, "cells": list(zip(cells, marks, strict=True)), "compile": step == compile_step,
            "max": hi, "median": med, "spread_pct": (100 * (hi - min(nums)) / hi) if hi else None}


def _step_table(run: dict, rank_ids: list[int], order: list[int], stragglers: list[int],
                compile_step: Any) -> dict:
    """The per-step table, steps × ranks, bounded: ``step_cols``, ``step_rows`` and the ``step_note`` on cuts."""
    by_step: dict[Any, dict[Any, Any]] = {}
    for s in as_list(run.get("steps")):
        if isinstance(s, dict):
            by_step.setdefault(s.get("step"), {})[s.get("rank")] = s.get("step_time_us")
    step_ids = sorted(by_step, key=lambda x: x if isinstance(x, int) else 1 << 60)
    kept = None if stragglers else _kept_waiting_rank(run)
    marked = stragglers or ([kept[0]] if kept and kept[0] is not None else [])
    step_cols = (order if stragglers else rank_ids)[:MAX_STEP_COLS]
    step_rows = [_step_row(st, by_step[st], step_cols, marked, compile_step, by_time=kept is None)
                 for st in step_ids[:MAX_STEP_ROWS]]
    step_note = []
    if len(step_ids) > MAX_STEP_ROWS:
        step_note.append(f"first {MAX_STEP_ROWS} of {len(step_ids)} steps shown")
    if len(rank_ids) > MAX_STEP_COLS:
        step_note.append(f"ranks {ranges(step_cols)} of {len(rank_ids)} shown as columns; max and median cover "
                         "all ranks")
    return {"step_cols": step_cols, "step_rows": step_rows, "step_note": "; ".join(step_note),
            "kept_rank": kept}


def _run_charts(run: dict, ranks: list[dict], order: list[int], flags: dict[int, list[str]],
                marked: list[int], compile_step: Any) -> dict:
    """The run's charts (:mod:`traceanalyze.report.charts`): breakdown bars, step-time lines, heatmaps, timeline."""
    all_steps = [s for s in as_list(run.get("steps")) if isinstance(s, dict)]
    steady = [s for s in all_steps if s.get("step") != compile_step] or all_steps
    return {
        "bars": charts.rank_bars(ranks, order, flags),
        "bar_note": (f"{charts.MAX_BARS} of {len(ranks)} ranks drawn, the marked and outlying ones first; the heatmaps "
                     "show every rank" if len(ranks) > charts.MAX_BARS else ""),
        "lines": charts.step_lines(steady, marked),
        "heat_step": charts.heatmap(all_steps, "step_time_us", "Step time (ms)", compile_step),
        "heat_comm": charts.heatmap(all_steps, "exposed_comm_us", "Exposed communication per step (ms)", compile_step),
        "timeline": charts.timeline(as_dict(run.get("timeline"))),
    }


def _fact_rows(d: dict) -> list[tuple[str, str]]:
    """A dict of facts as (label, text) rows: ``*_us`` keys shown in ms, ``*_pct`` in %, unknown (None) left out."""
    rows = []
    for k, v in d.items():
        if v is None or v == [] or v == {}:
            continue
        key = str(k)
        unit = ""
        if key.endswith("_us"):
            key, unit = key[:-3], "ms"
        elif key.endswith("_pct"):
            key, unit = key[:-4], "%"
        label = key.replace("_", " ").strip()
        label = label[:1].upper() + label[1:]
        rows.append((label + (f" ({unit})" if unit else ""), _scalar(v, unit)))
    return rows


# the precision summary's FLOP figures under names that say what they measure (metrics/mfu.py's docstring)
_PRECISION_LABELS = {
    "gemm_time_us": "Matrix-math kernel time, all counted steps and ranks (ms)",
    "peak_tflops": "Peak TFLOPS of the main dtype",
    "achieved_tflops": "GEMM kernels' rate while they run (TFLOPS; aten::mm/addmm/bmm/baddbmm kernels only)",
    "matmul_efficiency_pct": "GEMM kernels' rate / peak (%)",
    "model_flops_per_step": "Model FLOPs per rank and step (GEMM, convolution, attention; from op shapes)",
    "model_flops_ops": "Matrix ops with shapes (model FLOPs)",
}


def precision_rows(prec: dict) -> list[tuple[str, str]]:
    """The precision summary as (label, text) rows (:func:`_fact_rows`), its FLOP figures named for what they
    measure and the model FLOPs readable (``10.5 TFLOP``)."""
    rows = []
    for key, v in prec.items():
        for label, val in _fact_rows({key: v}):
            rows.append((_PRECISION_LABELS.get(key, label), fmt_flop(v) if key == "model_flops_per_step" else val))
    return rows


def _scalar(v: Any, unit: str = "") -> str:
    """One fact as text; per-rank dicts (``{"0": x, "1": y}``) as ``rank 0: x · rank 1: y``."""
    if isinstance(v, (list, tuple)):
        uniq = list(dict.fromkeys(_scalar(x, unit) for x in v))  # the same fact from several logs: once
        s = ", ".join(uniq[:20]) + (f", … ({len(uniq)} values)" if len(uniq) > 20 else "")
        return s or "—"
    if isinstance(v, dict):
        per_rank = all(str(k).isdigit() for k in v)
        items = list(v.items())
        s = " · ".join(f"{'rank ' if per_rank else ''}{k}: {_scalar(x, unit)}" for k, x in items[:32])
        return s + (f" · … ({len(items)} entries)" if len(items) > 32 else "")
    if isinstance(v, bool):
        return "yes" if v else "no"
    if unit == "ms":
        return fmt_ms(v)
    if unit == "%":
        return fmt_pct(v, 1)
    if isinstance(v, float):
        return fmt_float(v, 3 if abs(v) < 1 else 2)
    s = text(v)
    return s if len(s) <= 300 else s[:299] + "…"


def _extras(run: dict) -> list[dict]:
    """The torch.compile and log-fact tables, those with rows."""
    extras = []
    for key, title in (("compile", "torch.compile"), ("log_facts", "Facts from the logs")):
        rows = _fact_rows(as_dict(run.get(key)))
        if rows:
            extras.append({"title": title, "rows": rows})
    return extras


def _rank_extra(run: dict, ranks: list[dict]) -> dict:
    """Per rank, its collective wait (µs) and data-loader share (%), and whether the run has either."""
    waits = as_dict(run.get("collective_wait_us"))
    loader = as_dict(as_dict(run.get("dataloader")).get("share_pct"))
    rank_extra = {r.get("rank"): {"wait_us": waits.get(str(r.get("rank")), waits.get(r.get("rank"))),
                                  "loader_pct": loader.get(str(r.get("rank")), loader.get(r.get("rank")))}
                  for r in ranks}
    return {"rank_extra": rank_extra, "has_wait": bool(waits), "has_loader": bool(loader)}


def _idle_rows(run: dict, order: list[int]) -> tuple[list[dict], list[dict]]:
    """GPU idle per stream: each rank's busiest stream, the outliers first, shown; the other streams folded."""
    rows = [d for d in as_list(run.get("idle_breakdown")) if isinstance(d, dict)]
    pos = {r: i for i, r in enumerate(order)}
    best: dict[Any, dict] = {}
    for d in rows:
        cur = best.get(d.get("rank"))
        if cur is None or (finite(d.get("n_kernels")) or 0) > (finite(cur.get("n_kernels")) or 0):
            best[d.get("rank")] = d
    main = sorted(best.values(), key=lambda d: pos.get(d.get("rank"), 1 << 30))
    shown = {id(m) for m in main}  # by identity, as before: a set, not a scan of main per row (1,024 ranks: 0.6 s)
    rest = [d for d in rows if id(d) not in shown]
    return main[:charts.SHOWN_RANKS], main[charts.SHOWN_RANKS:] + rest


def _kernel_rows(rows: Any) -> list[dict]:
    """Kernel (or op) table rows with their names (and launching ops) as text."""
    return [{**k, "name": "" if k.get("name") is None else str(k.get("name")),
             "op": None if k.get("op") is None else str(k.get("op"))} for k in as_list(rows) if isinstance(k, dict)]


def _run_tables(run: dict, ranks: list[dict], mode: str | None) -> dict:
    """The run's other tables: kernels, dtype mix, windows, collectives, idle breakdown, precision, link, clocks."""
    kernels = _kernel_rows(run.get("top_kernels"))
    cstep = as_dict(run.get("compile_step"))
    offsets = as_dict(run.get("clock_offsets_us"))
    return {
        "kernels": kernels, "kernels_title": "Top ops (CPU)" if mode == "cpu" else "Top GPU kernels",
        "kernels_have_op": any(k.get("op") for k in kernels),
        "compile_kernels": ({"step": cstep.get("step"), "n_kernels": cstep.get("n_kernels"),
                             "kernel_time_us": cstep.get("kernel_time_us"),
                             "top": _kernel_rows(cstep.get("top_kernels"))} if "n_kernels" in cstep else None),
        "dtype_mix": [d for d in as_list(run.get("dtype_mix")) if isinstance(d, dict)],
        "windows": [dict(w, rank=r.get("rank")) for r in ranks for w in as_list(r.get("windows"))
                    if isinstance(w, dict)] if any(len(as_list(r.get("windows"))) > 1 for r in ranks) else [],
        "file_grouping": run.get("file_grouping"),
        "collectives": [c for c in as_list(run.get("collectives")) if isinstance(c, dict)],
        "idle_breakdown": [d for d in as_list(run.get("idle_breakdown")) if isinstance(d, dict)],
        "precision_rows": precision_rows(as_dict(run.get("precision"))),
        "link": as_dict(run.get("link")), "clock_offsets": sorted(offsets.items(), key=lambda kv: str(kv[0]).zfill(8)),
        "extras": _extras(run),
    }


def memory_view(run: dict) -> dict | None:
    """The memory table (``runs[i].ranks[j].memory``, traces recorded with ``profile_memory=True``): one row per rank
    and device, the rows whose memory rises every step first, at most :data:`MAX_MEMORY_ROWS`; None without any.
    Each row: ``rank, device`` (text), the byte figures, ``first_end``/``last_end`` (``[step, bytes]`` of the first
    and last step's end, or None), ``top_op``/``unfreed_op`` (``{"op", "bytes"}`` or None)."""
    rows = []
    for r in as_list(run.get("ranks")):
        if not isinstance(r, dict):
            continue
        for m in as_list(r.get("memory")):
            if isinstance(m, dict):
                rows.append(_memory_row(m))
    if not rows:
        return None
    rows.sort(key=lambda d: (not d["rising"], str(d["rank"]).zfill(8), d["device"]))
    return {"rows": rows[:MAX_MEMORY_ROWS], "more": max(0, len(rows) - MAX_MEMORY_ROWS)}


def _memory_row(m: dict) -> dict:
    ends = [e for e in as_list(m.get("step_end_allocated")) if isinstance(e, list) and len(e) == 2]

    def op(key: str) -> dict | None:
        first = next((o for o in as_list(m.get(key)) if isinstance(o, dict)), None)
        return None if first is None else {"op": text(first.get("op")), "bytes": finite(first.get("bytes"))}

    return {"rank": text(m.get("rank")), "device": text(m.get("device")), "rising": m.get("rising") is True,
            **{k: finite(m.get(k)) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "total_bytes",
                                             "growth_bytes_per_step", "unfreed_bytes")},
            "first_end": ends[0] if ends else None, "last_end": ends[-1] if len(ends) > 1 else None,
            "top_op": op("top_ops"), "unfreed_op": op("unfreed_ops")}


def host_view(run: dict) -> dict | None:
    """The host side of a GPU run's steady steps (``runs[i].host``): the top CPU ops and the blocking CUDA calls
    (names as text), each at most :data:`MAX_HOST_ROWS` rows; None without either."""
    host = as_dict(run.get("host"))

    def rows(key: str, names: tuple[str, ...], by: str) -> list[dict]:
        out = [{**d, **{n: None if d.get(n) is None else str(d.get(n)) for n in names}}
               for d in as_list(host.get(key)) if isinstance(d, dict)]
        out.sort(key=lambda d: -(finite(d.get(by)) or 0.0))
        return out[:MAX_HOST_ROWS]

    top = rows("top_ops", ("name", "cat"), "us_per_step")
    blocking = rows("blocking_calls", ("call", "op", "inner_op"), "gpu_idle_us_per_step")
    if not top and not blocking:
        return None
    return {"top_ops": top, "blocking_calls": blocking}


def run_view(run: dict, findings: list[dict], idx: int = 1) -> dict:
    """Everything the report page shows of one run (``findings``: :func:`sorted_findings`; ``idx``: its position,
    for chart ids)."""
    ranks = sorted_ranks(run)
    mode = run.get("mode") if run.get("mode") in MODE_TEXT else None
    flags = _flags(run, findings)
    rank_ids = [r.get("rank") for r in ranks if isinstance(r.get("rank"), int)]
    found = as_list(run.get("ranks_found")) or rank_ids
    files = [f for f in as_list(run.get("files")) if isinstance(f, dict)]
    cstep = as_dict(run.get("compile_step"))
    stat = str(run.get("step_stat") or "median")

    # Per-step figures per rank (medians over the steady steps), the outliers first, the straggler's cells marked
    per_step = per_step_medians(steady_steps(run))
    stragglers = _stragglers(run, findings)
    outl = charts.outliers(ranks, per_step)
    order = charts.rank_order(rank_ids, stragglers + [r for r in flags if isinstance(r, int)] + outl)
    shown, folded = _shown_and_folded(ranks, rank_ids, order, stragglers + list(flags) + outl)
    idle_shown, idle_folded = _idle_rows(run, order)
    return {
        "name": text(run.get("name")), "path": run.get("path"), "role": run.get("role") or "subject",
        "mode": mode, "mode_text": MODE_TEXT.get(mode or "", "The trace mode could not be determined."),
        "facts": _run_facts(run, mode, found, files, stat),
        "files": files[:MAX_FILE_ROWS], "files_more": max(0, len(files) - MAX_FILE_ROWS),
        "sidecars": [s for s in as_list(run.get("sidecars")) if isinstance(s, dict)],
        "ranks": ranks, "flags": flags, "show_kernel_cols": mode != "cpu",
        "ranks_shown": shown, "ranks_folded": folded, "per_step": per_step,
        "outliers": outl, "stragglers": stragglers, "idx": idx,
        **_run_charts(run, ranks, order, flags, stragglers + [r for r in flags if isinstance(r, int)],
                      cstep.get("step")),
        "idle_shown": idle_shown, "idle_folded": idle_folded,
        "compile_step": cstep or None, "step_stat": stat,
        **_step_table(run, rank_ids, order, stragglers, cstep.get("step")),
        **_run_tables(run, ranks, mode),
        **_rank_extra(run, ranks),
        **replay_view(run),
        "step_time_us": run.get("step_time_us"),
        "profiler_overhead": as_dict(run.get("profiler_overhead")) or None,
        "host": host_view(run),
        "memory": memory_view(run),
        "mean_idle": mean(r.get("idle_pct") for r in ranks),
        "mean_compute": mean(r.get("compute_pct") for r in ranks),
        "mean_non_compute": mean(r.get("non_compute_pct") for r in ranks),
        "world_size": run.get("world_size"), "n_found": len(found),
    }


# ---------------------------------------------------------------------------------------------------------
# The whole report

def report_view(model: dict) -> dict:
    """Everything ``report.html.j2`` shows (as ``v``): verdict, findings, comparison, one view per run
    (:func:`run_view`), warnings, definitions and colours."""
    findings = sorted_findings(model)
    verdict_text, verdict_cause = verdict(model, findings)
    run_views = [run_view(r, findings, i) for i, r in enumerate(sorted_runs(model), start=1)]
    warnings = warning_rows(model)
    n_files = sum(len(rv["files"]) + rv["files_more"] for rv in run_views)
    n_bad = sum(1 for w in warnings if w["level"] in ("error", "partial"))
    counts = {lvl: sum(1 for w in warnings if w["level"] == lvl) for lvl in LEVEL_ORDER}
    tool = as_dict(model.get("tool"))
    subjects = [rv["name"] for rv in run_views if rv["role"] == "subject"] or [rv["name"] for rv in run_views]
    return {
        "title": "traceanalyze report: " + (", ".join(subjects) if subjects else "no run"),
        "verdict": verdict_text, "verdict_cause": verdict_cause, "findings": findings,
        "confidence": confidence_view(model.get("verdict_confidence")),
        "partial": partial_view(model.get("partial")),
        "multi_run": len(run_views) > 1, "runs": run_views, "comparison": comparison(model, findings),
        "warnings": warnings, "n_files": n_files, "n_bad": n_bad, "level_counts": counts,
        "tool_name": text(tool.get("name") or "traceanalyze"), "tool_version": text(tool.get("version")),
        "generated_at": text(model.get("generated_at")),
        "export_path": text(model["export_path"]) if model.get("export_path") else None,
        "cause_colors": CAUSE_COLORS, "cause_labels": CAUSE_LABELS, "breakdown_colors": BREAKDOWN_COLORS,
        "definitions": DEFINITIONS,
        "causes_present": sorted({f["cause_key"] for f in findings}, key=lambda c: list(CAUSE_COLORS).index(c)),
    }
