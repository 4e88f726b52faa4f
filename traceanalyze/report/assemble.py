"""Pure parts of assembling the report model (``docs/schema.md``) from what the stages computed: the ranks' rows,
their memory, the notes on profiling windows that differ, and the model as JSON text. Dicts and dataclasses in,
dicts and text out: nothing here reads the database or imports the stages (the report layer's contract).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any


def to_json(model: dict, indent: int | None = 1) -> str:
    """The report model as JSON text (NaN/inf become null). ``indent=None`` writes it compact, with the standard
    library's C encoder: the report cache's form (1,024 ranks: 0.05 s against 0.21-0.28 s indented, which is
    pure Python)."""
    seps = (",", ":") if indent is None else None
    try:
        return json.dumps(model, indent=indent, separators=seps, default=str, allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere (the model holds no cycles)
        return json.dumps(clean_json(model), indent=indent, separators=seps, default=str)


def is_finite(o: float) -> bool:
    """Whether a float is neither NaN nor an infinity."""
    return o == o and o not in (float("inf"), float("-inf"))


def clean_json(o: Any) -> Any:
    """``o`` with every NaN or infinity (at any depth of dicts, lists and tuples) as None; tuples become lists."""
    if isinstance(o, float):
        return o if is_finite(o) else None
    if isinstance(o, dict):
        return {k: clean_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean_json(v) for v in o]
    return o


def rank_model(r: Any) -> dict:
    """One rank's row of ``runs[i].ranks``: a :class:`traceanalyze.metrics.RankMetrics` as a dict without its
    ``run_id``, floats rounded to 3 decimals (µs and %)."""
    d = asdict(r)
    d.pop("run_id")
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}


def add_memory(ranks_model: list[dict], rows: list) -> None:
    """The memory rows (:class:`traceanalyze.metrics.memory.MemoryRow`, each with ``rank`` and ``model()``) as
    ``ranks[j]["memory"]`` (one dict per device), on the ranks that have any."""
    by_rank: dict[int, list[dict]] = {}
    for row in rows:
        by_rank.setdefault(row.rank, []).append(row.model())
    for r in ranks_model:
        if r.get("rank") in by_rank:
            r["memory"] = by_rank[r["rank"]]


def add_cache_flush(ranks_model: list[dict], rows: list) -> None:
    """The allocator's calls per step (:class:`traceanalyze.metrics.allocator.CacheFlush`) as
    ``ranks[j]["cache_flush"]``, on the ranks that have any."""
    by_rank = {row.rank: row.model() for row in rows}
    for r in ranks_model:
        if r.get("rank") in by_rank:
            r["cache_flush"] = by_rank[r["rank"]]


WINDOW_STEP_DIFF = 0.10  # windows of one rank whose median step times differ by more than this are named
WINDOW_IDLE_DIFF_POINTS = 10.0  # ... or whose idle % differ by more than this many points


def window_differences(rank_rows: list) -> list[dict]:
    """An info row per rank (:class:`traceanalyze.metrics.RankMetrics`) whose profiling windows differ: median step
    time apart by more than :data:`WINDOW_STEP_DIFF`, or idle % by more than :data:`WINDOW_IDLE_DIFF_POINTS`; each
    names the files."""
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
