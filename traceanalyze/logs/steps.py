"""Step times without the profiler: capture's ``steps_rank{r}.json`` (:func:`parse_capture_steps`), and the choice of
the run's unprofiled step time (:func:`measured_unprofiled_step`).

The profiler slows host-bound steps (recording each op costs µs), so a profiled step overstates the real one. The
step time without it comes, in this order, from ``capture`` (the steps :mod:`traceanalyze.capture` timed outside the
recorded window), ``log`` (the training log's step times, when most of its steps ran without the profiler), else
none (the replay's ``estimate`` from the trace alone is not made here).

Inputs are hostile (docs/safety.md): the file is read whole through :func:`~traceanalyze.logs.read.read_text` (at
most 64 MiB, a gzip bomb never inflated in full); a list is read up to :data:`MAX_CAPTURE_STEPS` values; a value
that is not a number, NaN, infinite, zero or negative, or longer than a day (:data:`MAX_DUR_US`) is dropped and
counted in one warning per list; JSON nested deeper than the decoder's bound is a warning. Valid values are kept.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceanalyze.limits import MAX_CAPTURE_STEPS, MAX_DUR_US, MAX_WORLD_SIZE
from traceanalyze.logs.read import read_text
from traceanalyze.names import UNPROFILED_KEY, rank_from_name

PROFILED_KEY = "profiled_step_ms"
MIN_LOG_STEPS = 3  # steady logged step times (after each rank's first) that a log needs to count as a step time
PROFILER_FLAGS = ("record_shapes", "with_stack", "profile_memory")


@dataclass
class CaptureSteps:
    """One ``steps_rank{r}.json``: ``rank`` (the file's, else its name's; None when neither is plausible), the steps
    timed without the profiler and the recorded ones in µs, how they were timed (``cuda_synchronize`` /
    ``perf_counter``, None when not said), the profiler's options, and the warnings about the file's content."""

    path: str
    rank: int | None = None
    unprofiled_us: list[float] = field(default_factory=list)
    profiled_us: list[float] = field(default_factory=list)
    timing: str | None = None
    profiler: dict[str, bool] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def parse_capture_steps(path: Path, max_bytes: int | None = None) -> CaptureSteps:
    """Read capture's ``steps_rank{r}.json`` (``.gz`` too; module docstring for the bounds).

    Never raises on content: JSON that does not parse, nests too deep, is not an object or has no
    ``unprofiled_step_ms`` list gives no step times and a warning; dropped values are counted in one warning per
    list. Raises :class:`~traceanalyze.errors.InputError` when the file cannot be read or is over its bound.
    """
    path = Path(path)
    res = CaptureSteps(path=str(path), rank=rank_from_name(path))
    try:
        data = json.loads(read_text(path, max_bytes), parse_int=_bounded_int)
    except RecursionError:
        res.warnings.append("nested deeper than the JSON decoder's bound; no step times read")
        return res
    except ValueError:
        res.warnings.append("not JSON; no step times read")
        return res
    if not isinstance(data, dict):
        res.warnings.append("not a JSON object; no step times read")
        return res
    rank = _plain_rank(data.get("rank"))
    if rank is not None:
        res.rank = rank
    elif data.get("rank") is not None:
        res.warnings.append("implausible rank (must be an integer from 0 to "
                            f"{MAX_WORLD_SIZE - 1:,}); " + ("taken from the file name" if res.rank is not None
                                                            else "the rank is unknown"))
    res.unprofiled_us = _times_us(data, UNPROFILED_KEY, res.warnings, required=True)
    res.profiled_us = _times_us(data, PROFILED_KEY, res.warnings, required=False)
    if data.get("timing") in ("cuda_synchronize", "perf_counter"):
        res.timing = data["timing"]
    prof = data.get("profiler") if isinstance(data.get("profiler"), dict) else {}
    res.profiler = {k: prof[k] for k in PROFILER_FLAGS if isinstance(prof.get(k), bool)}
    return res


def _bounded_int(text: str) -> int | float:
    """A JSON integer; one of more than 30 digits (no step time or rank) as ±1e300, never a huge int (Python
    refuses to build one of more than 4,300 digits, which would cost the whole file)."""
    if len(text) > 30:
        return -1e300 if text.startswith("-") else 1e300
    return int(text)


def _plain_rank(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_WORLD_SIZE else None


def _times_us(data: dict, key: str, warnings: list[str], required: bool) -> list[float]:
    """The valid values of the list ``data[key]`` (ms) in µs; what was dropped, and why, in one warning."""
    vals = data.get(key)
    if not isinstance(vals, list):
        if vals is not None or required:
            warnings.append(f"no {key} list" + ("" if vals is None else " (not a list)") + "; no step times read")
        return []
    n = len(vals)
    out: list[float] = []
    dropped: dict[str, int] = {}
    for v in vals[:MAX_CAPTURE_STEPS]:
        why = _why_not_a_step_time(v)
        if why is None:
            out.append(float(v) * 1e3)
        else:
            dropped[why] = dropped.get(why, 0) + 1
    if n > MAX_CAPTURE_STEPS:
        warnings.append(f"{key}: {n:,} values, more than {MAX_CAPTURE_STEPS:,}; only the first {MAX_CAPTURE_STEPS:,} "
                        "read")
    if dropped:
        reasons = ", ".join(f"{c:,} {why}" for why, c in sorted(dropped.items(), key=lambda x: (-x[1], x[0])))
        warnings.append(f"{key}: {sum(dropped.values()):,} of {min(n, MAX_CAPTURE_STEPS):,} values dropped "
                        f"({reasons}); {len(out):,} kept")
    return out


def _why_not_a_step_time(v: Any) -> str | None:
    """Why ``v`` (ms) is no step time, or None when it is one."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "not a number"
    x = float(v) if isinstance(v, float) or abs(v) < 1 << 60 else math.copysign(1e300, v)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "infinite"
    if x <= 0:
        return "zero or negative"
    if x * 1e3 > MAX_DUR_US:
        return "longer than a day"
    return None


def measured_unprofiled_step(side: dict, n_profiled_steps: int | None = None) -> dict | None:
    """The run's step time without the profiler, from what its sidecars measured; None when they measured none.

    ``side`` is the pipeline's sidecar dict: ``capture_steps`` (a list of :class:`CaptureSteps`) and ``log_steps``
    (:class:`~traceanalyze.logs.model.LogStep` rows). In order:

    - ``capture``: the median over ranks of each rank's median unprofiled step time (files of one rank pooled; a
      file without a rank counts as a rank of its own): ``{"step_time_us", "source": "capture", "n_steps",
      "n_ranks", "profiled_step_time_us" (the same statistic over the recorded steps, or None), "timing",
      "profiler"}``;
    - ``log``: the same statistic over the training log's step times, each rank's first logged step left out
      (warm-up, compile), when at least :data:`MIN_LOG_STEPS` remain and, when ``n_profiled_steps`` (the trace's
      profiled steps) is given, more than twice as many, so most of them ran without the profiler and their median
      is an unprofiled step: ``{"step_time_us", "source": "log", "n_steps", "n_ranks", "steps": "first–last"}``.
    """
    by_rank: dict[object, list[float]] = {}
    prof_by_rank: dict[object, list[float]] = {}
    timing, flags = None, {}
    for cs in side.get("capture_steps") or []:
        key = cs.rank if cs.rank is not None else cs.path
        if cs.unprofiled_us:
            by_rank.setdefault(key, []).extend(cs.unprofiled_us)
            timing, flags = timing or cs.timing, flags or cs.profiler
        if cs.profiled_us:
            prof_by_rank.setdefault(key, []).extend(cs.profiled_us)
    if by_rank:
        return {"step_time_us": _median_of_medians(by_rank.values()), "source": "capture",
                "n_steps": sum(len(v) for v in by_rank.values()), "n_ranks": len(by_rank),
                "profiled_step_time_us": _median_of_medians(prof_by_rank.values()) if prof_by_rank else None,
                "timing": timing, "profiler": flags}
    return _from_log(side.get("log_steps") or [], n_profiled_steps)


def _from_log(log_steps: Iterable, n_profiled_steps: int | None) -> dict | None:
    timed: dict[object, list[tuple[int, float]]] = {}
    for st in log_steps:
        ms = st.step_time_ms
        if isinstance(ms, (int, float)) and _why_not_a_step_time(ms) is None and isinstance(st.step, int):
            timed.setdefault(st.rank, []).append((st.step, float(ms)))
    steady: dict[object, list[float]] = {}
    steps: list[int] = []
    for rank, rows in timed.items():
        rows.sort()
        kept = [(s, ms) for s, ms in rows if s != rows[0][0]]
        if kept:
            steady[rank] = [ms * 1e3 for _, ms in kept]
            steps.extend(s for s, _ in kept)
    n = max((len(v) for v in steady.values()), default=0)
    if n < max(MIN_LOG_STEPS, 2 * (n_profiled_steps or 0) + 1):
        return None
    return {"step_time_us": _median_of_medians(steady.values()), "source": "log",
            "n_steps": sum(len(v) for v in steady.values()), "n_ranks": len(steady),
            "steps": f"{min(steps)}–{max(steps)}"}


def _median_of_medians(groups: Iterable[list[float]]) -> float:
    return float(statistics.median(statistics.median(g) for g in groups if g))
