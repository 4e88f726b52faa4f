"""How sure the report is: a confidence level (high / medium / low) for every finding, what-if and verdict.

The level is not the severity (how much a cause costs) nor the replay's self-check alone. It is the lowest of the
caps that named inputs put on it (the rule, with its thresholds, is in ``docs/confidence.md``):

==========================  =========================================================  =====================
input                       cap                                                        applies to
==========================  =========================================================  =====================
counted profiler steps      0: low; 1: medium ("one profiled step")                    all
ranks traced                fewer than the world size: medium; a finding the missing   all
                            ranks could explain (waits inside collectives): low
step-to-step noise          coefficient of variation (sample σ / mean) of the run's    all
                            step time over the counted steps: > 10 %: medium,
                            > 25 %: low
replay fidelity             replay error > 5 % (the straggler paper's bound,           what-ifs, and findings
                            :data:`~traceanalyze.replay.whatif.UNRELIABLE_ERROR_PCT`):  priced by one
                            medium; > 15 %: low; ``reliable: false``: low
stated range                the what-if's 90 % range (:func:`saving_range`) wider than  what-ifs
                            20 pp: medium, 40 pp: low
model error measured        the fix's family measured on fewer than 3 pairs, or none    what-ifs
                            (:data:`FAMILY_ERROR_PP`): medium
step without the profiler   estimated from the trace while the profiler's cost is      what-ifs
                            ≥ 10 % of the step: medium
saving within noise         a predicted saving smaller than the step-to-step noise:    what-ifs
                            low
unpriced impact             a finding no what-if prices (``whatif_missing``): medium   findings
late start, one step        ``aligned_step_starts`` from one counted step: low (what   what-ifs, and the
                            delayed the rank came before the trace)                    findings it prices
==========================  =========================================================  =====================

So one profiled step, or a partial run, never gives "high". Everything here reads the report model
(``docs/schema.md``) and adds to it; nothing is measured again.
"""

from __future__ import annotations

import statistics
from typing import Any

from traceanalyze.diagnose.config import MEMORY_KINDS
from traceanalyze.diagnose.verdict import finding_scenario
from traceanalyze.findings import DIED_KINDS
from traceanalyze.replay.scenarios import ALL, by_name

LEVELS = ("high", "medium", "low")
NOISE_MEDIUM_PCT = 10.0  # σ/mean of the step time above which a single figure is not "high"
NOISE_LOW_PCT = 25.0
REPLAY_MEDIUM_PCT = 5.0  # = replay.whatif.UNRELIABLE_ERROR_PCT (Lin et al., straggler analysis, §3.3)
REPLAY_LOW_PCT = 15.0
RANGE_MEDIUM_PP = 20.0  # width of a what-if's model range, in points of saving
RANGE_LOW_PP = 40.0
# share of a what-if's replayed critical path spent in idle the replay keeps as measured because no dependency
# explains it (replay.gaps): a wait that would end sooner once the work around it is faster, replayed as fixed
UNEXPLAINED_MEDIUM_PCT = 10.0
UNEXPLAINED_LOW_PCT = 25.0
OVERHEAD_MEDIUM_PCT = 10.0  # profiler cost (% of the profiled step) above which an estimated base step matters
# findings whose evidence is time spent waiting inside collectives: a missing rank may be what they wait for
WAIT_CAUSES = frozenset({"interconnect", "imbalance"})
UNPROFILED_WORDS = {"capture": "measured", "log": "from the log", "estimate": "estimated"}


def _lowest(caps: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """(the lowest level among ``caps``, the reasons that gave it); ("high", []) when nothing caps it."""
    if not caps:
        return "high", []
    worst = max(LEVELS.index(lv) for lv, _ in caps)
    return LEVELS[worst], list(dict.fromkeys(w for lv, w in caps if LEVELS.index(lv) == worst))


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x else None


def basis(run: dict) -> dict:
    """What a run's figures rest on: ``steps`` (counted profiler steps), ``ranks_traced``, ``world_size``,
    ``partial`` (fewer ranks traced than the world size), ``step_noise_pct`` (sample σ / mean × 100 of the run's
    step time, the longest rank's, over the counted steps but the compile step, which is apart; None with fewer
    than two), ``replay_error_pct``,
    ``unprofiled`` (how the step time without the profiler was had: ``measured`` (capture sidecar), ``from the
    log``, ``estimated``, or None), ``profiler_overhead_pct`` and ``line``, the sentence the page shows on top.

    Args:
        run: ``runs[i]`` of the report model (its ``steps``, ``ranks_found``, ``world_size``, ``replay``,
            ``profiler_overhead``).
    """
    longest: dict[int, float] = {}
    cs = run.get("compile_step") if isinstance(run.get("compile_step"), dict) else {}
    for s in run.get("steps") or []:
        t = _num(s.get("step_time_us"))
        if t is not None and isinstance(s.get("step"), int) and s["step"] != cs.get("step"):
            longest[s["step"]] = max(longest.get(s["step"], 0.0), t)
    vals = [v for v in longest.values() if v > 0]
    noise = (round(100 * statistics.stdev(vals) / statistics.fmean(vals), 2) if len(vals) >= 2 else None)
    traced = len(run.get("ranks_found") or [])
    world = run.get("world_size") if isinstance(run.get("world_size"), int) else None
    world = max(world or traced, traced)
    po = run.get("profiler_overhead") or {}
    unprof = UNPROFILED_WORDS.get(po.get("source")) if isinstance(po, dict) else None
    rp = run.get("replay") or {}
    line = (f"From {len(vals)} step{'s' if len(vals) != 1 else ''} × {traced} of {world} rank"
            f"{'s' if world != 1 else ''}" + (f" (step time σ {noise:g} % of the mean)" if noise is not None else "")
            + f"; step time without the profiler: {unprof or 'not estimated'}")
    return {"steps": len(vals), "ranks_traced": traced, "world_size": world, "partial": traced < world,
            "step_noise_pct": noise, "replay_error_pct": _num(rp.get("error_pct")) if rp else None,
            "unprofiled": unprof, "profiler_overhead_pct": _num(po.get("overhead_pct")) if po else None,
            "unprofiled_caveat": po.get("caveat") if isinstance(po, dict) and unprof == "estimated" else None,
            "line": line}


def _run_caps(b: dict, wait_finding: bool = False) -> list[tuple[str, str]]:
    caps: list[tuple[str, str]] = []
    if b["steps"] == 0:
        caps.append(("low", "no counted profiler step"))
    elif b["steps"] == 1:
        caps.append(("medium", "one profiled step"))
    if b["partial"]:
        missing = f"{b['ranks_traced']} of {b['world_size']} ranks traced"
        if wait_finding:
            caps.append(("low", f"{missing}: the untraced ranks may be what these waits are for"))
        else:
            caps.append(("medium", missing))
    noise = b["step_noise_pct"]
    if noise is not None and noise > NOISE_LOW_PCT:
        caps.append(("low", f"step time varies {noise:g} % (σ/mean) from step to step"))
    elif noise is not None and noise > NOISE_MEDIUM_PCT:
        caps.append(("medium", f"step time varies {noise:g} % (σ/mean) from step to step"))
    return caps


def _memory_caps(b: dict) -> list[tuple[str, str]]:
    """The caps on a memory finding: the run's (:func:`_run_caps`) but the step-time noise, which its bytes do not
    depend on."""
    return [c for c in _run_caps(b) if "from step to step" not in c[1]]


# -- the range: a stated uncertainty model (docs/confidence.md, "The range") ----------------------------------------
Z90 = 1.645  # two-sided 90 % of a normal error with a known σ
# two-sided 90 % of Student's t with n degrees of freedom: σ estimated from n pairs (the mean error taken as 0)
T90 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
       12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}
# the step without the profiler: RMS of the leave-one-out errors (% of the step) of benchmarks/profiler_overhead.py
# --fit on the 8 GPU sides where the profiler costs ≥ 10 % of the step (launch fixed/slow, precision/fixed,
# dataloader/slow on the H200; conv/fixed, optimizer slow/fixed/foreach on the H100; +2.7 −13.7 +3.0 +5.2 +4.3
# −0.4 −23.2 +1.2 %), carried whole into the saving (points of the step) where the saving rests on it; the
# profile_memory side (+27.3 %) is left out: the estimate's docstring says it misses there
PROFILER_ERROR_PCT = 9.9
# the model's own error per scenario family: the root mean square of (predicted − measured saving, points of the
# step) over the family's pairs, the whole error (noise and profiler included); benchmarks/whatif.py --calibration
# refits it and docs/confidence.md lists the pairs. family -> (σ pp, pairs it came from)
FAMILY_ERROR_PP: dict[str, tuple[float, tuple[str, ...]]] = {
    "precision": (4.63, ("h200 precision slow→fixed", "h200 precision slow→tf32", "h100 conv slow→bf16",
                         "h100 conv slow_sync→bf16", "h100 conv slow→fixed", "cpu precision_fp32→precision_bf16")),
    "host": (7.73, ("h200 launch slow→fixed", "h100 optimizer slow→fixed", "h100 allocator slow→fixed",
                    "h100 allocator every4→fixed")),
    "input": (3.5, ("h200 dataloader slow→fixed", "h100 loader slow→fixed", "cpu pairs/dataloader")),
    "ranks": (5.96, ("cpu pairs/host_stall", "cpu pairs/late_entry", "cpu pairs/late_entry_1step",
                     "cpu pairs/slow_interconnect", "cpu pairs/straggler_compute", "cpu pairs/straggler_compute_2",
                     "cpu pairs/straggler_sleep", "cpu straggler→healthy", "cpu slow_interconnect→fast_interconnect")),
    "compile": (0.63, ("cpu pairs/compile",)),
}
POOLED_ERROR_PP = 5.61  # every pair together: a family measured on fewer than MIN_FAMILY_PAIRS takes at least it
MIN_FAMILY_PAIRS = 3
FAMILY_OF = {"bf16_matmul": "precision", "tf32_matmul": "precision", "bf16_channels_last": "precision",
             "no_launch_overhead": "host", "fused_optimizer": "host", "no_host_sync": "host", "no_cache_flush": "host",
             "no_dataloader_wait": "input", "no_straggler": "ranks", "aligned_step_starts": "ranks",
             "ideal_interconnect": "ranks", "no_compile": "compile"}


def t90(n: int) -> float:
    """The 90 % factor for a σ estimated from ``n`` pairs (:data:`T90`, the next smaller tabled n; Z90 past 30)."""
    return Z90 if n > 30 else T90[max(k for k in T90 if k <= max(n, 1))]


def model_error(scenario: str | None) -> tuple[float, int]:
    """(σ pp of the model's own error for ``scenario``'s family (:data:`FAMILY_ERROR_PP`), the pairs it rests on); a
    family measured on fewer than :data:`MIN_FAMILY_PAIRS` pairs, a scenario of no family and ``all`` rest on every
    pair: the larger of their family's and the pooled error, with every pair's count."""
    sigma, pairs = FAMILY_ERROR_PP.get(FAMILY_OF.get(scenario or "", ""), (0.0, ()))
    if len(pairs) >= MIN_FAMILY_PAIRS:
        return sigma, len(pairs)
    return max(sigma, POOLED_ERROR_PP), sum(len(p) for _, p in FAMILY_ERROR_PP.values())


def range_sources(w: dict, b: dict | None, model: tuple[float, int] | None = None) -> dict:
    """The uncertainty sources of what-if row ``w``'s saving, in points of the step: ``noise_pp`` (the standard
    error of the measured run's step time: σ/mean over √ counted steps; 0 with fewer than two), ``profiler_pp``
    (:data:`PROFILER_ERROR_PCT` where the saving rests on the profiler's estimated cost: an estimated step without
    the profiler, or host time, while the profiler costs ≥ 10 % of the step), ``model_pp`` and ``pairs`` (the
    family's error and its pairs, :func:`model_error`, unless ``model`` gives them), ``precision_pp`` ([below,
    above] the saving: the precision model's range), ``kept_pp`` (idle the replay kept as measured on the predicted
    step's path, which may end with the work around it: added above only)."""
    b = b or {}
    saving = _num(w.get("saving_pct")) or 0.0
    noise, steps = b.get("step_noise_pct"), b.get("steps") or 0
    noise_pp = noise / steps ** 0.5 if isinstance(noise, (int, float)) and steps >= 2 else 0.0
    over = _num(b.get("profiler_overhead_pct"))
    on_estimate = over is not None and over >= OVERHEAD_MEDIUM_PCT and (b.get("unprofiled") == "estimated"
                                                                       or _host_time(w))
    r = w.get("range_saving_pct")
    prec = [0.0, 0.0]
    if isinstance(r, list) and len(r) == 2 and all(_num(x) is not None for x in r):
        prec = [max(0.0, saving - float(min(r))), max(0.0, float(max(r)) - saving)]
    kept = _num(w.get("unexplained_gap_pct")) or 0.0
    model_pp, pairs = model_error(w.get("scenario")) if model is None else model
    return {"noise_pp": noise_pp, "profiler_pp": PROFILER_ERROR_PCT if on_estimate else 0.0, "model_pp": model_pp,
            "pairs": pairs, "precision_pp": prec, "kept_pp": kept * (100 - saving) / 100}


def saving_range(w: dict, b: dict | None, model: tuple[float, int] | None = None) -> list[float] | None:
    """[low, high] saving (% of the step) of what-if row ``w``: saving ∓ √((t σ)² + precision side²), σ the sources
    of :func:`range_sources` (noise, profiler, model) in quadrature, t = :func:`t90` of the family's pairs, the kept
    idle added above; clipped to 0–100; None without a saving. ``model`` = (σ pp, pairs) replaces the family's
    error (the calibration's leave-one-out)."""
    saving = _num(w.get("saving_pct"))
    if saving is None:
        return None
    src = range_sources(w, b, model)
    zs = t90(src["pairs"]) * (src["noise_pp"] ** 2 + src["profiler_pp"] ** 2 + src["model_pp"] ** 2) ** 0.5
    lo = saving - (zs ** 2 + src["precision_pp"][0] ** 2) ** 0.5
    hi = saving + (zs ** 2 + src["precision_pp"][1] ** 2) ** 0.5 + src["kept_pp"]
    return [round(max(0.0, min(100.0, x)), 1) for x in (lo, hi)]


def _host_time(w: dict) -> bool:
    """Whether what-if row ``w``'s saving is host time (launches, a per-parameter optimizer, blocking waits: its
    record's ``host_time``; ``all`` may hold one): on a host-bound step the profiler's own host cost, estimated per
    event, is of the same order as what it removes."""
    rec = by_name(w.get("scenario"))
    return w.get("scenario") == ALL or (rec is not None and rec.host_time)


def whatif_confidence(w: dict, b: dict, model: tuple[float, int] | None = None) -> tuple[str, list[str]]:
    """(level, reasons) of one what-if row ``w`` (``runs[i].whatif[j]``) of a run with basis ``b``; ``model``: see
    :func:`saving_range`."""
    rec = by_name(w.get("scenario"))
    caps = _run_caps(b, wait_finding=rec is not None and rec.collective_waits)
    err = b["replay_error_pct"]
    if w.get("reliable") is False:
        caps.append(("low", str(w.get("unreliable_reason") or "the replay marks this what-if unreliable")))
    if err is not None and err > REPLAY_LOW_PCT:
        caps.append(("low", f"the replay misses the measured step by {err:g} %"))
    elif err is not None and err > REPLAY_MEDIUM_PCT:
        caps.append(("medium", f"the replay misses the measured step by {err:g} %"))
    if rec is not None and rec.one_step_caveat and b["steps"] <= 1:
        caps.append(("low", rec.one_step_caveat))
    rng = saving_range(w, b, model)
    fam = FAMILY_ERROR_PP.get(FAMILY_OF.get(w.get("scenario") or "", ""), (0.0, ()))[1]
    if len(fam) < MIN_FAMILY_PAIRS:
        caps.append(("medium", f"the model's error for this fix is measured on {len(fam)} pair"
                               f"{'s' if len(fam) != 1 else ''} (fewer than {MIN_FAMILY_PAIRS})" if fam else
                               "no recorded pair measures the model's error for this fix"))
    if rng is not None:
        width = rng[1] - rng[0]
        if width > RANGE_LOW_PP:
            caps.append(("low", f"the saving's range spans {width:.0f} points"))
        elif width > RANGE_MEDIUM_PP:
            caps.append(("medium", f"the saving's range spans {width:.0f} points"))
    kept = _num(w.get("unexplained_gap_pct"))
    if kept is not None and kept > UNEXPLAINED_MEDIUM_PCT:
        caps.append(("low" if kept > UNEXPLAINED_LOW_PCT else "medium",
                     f"{kept:g} % of the predicted step's critical path is idle time kept as measured (no dependency "
                     "explains it: it may be a wait that ends sooner once the work around it is faster)"))
    over = b["profiler_overhead_pct"]
    if b["unprofiled"] == "estimated" and over is not None and over >= OVERHEAD_MEDIUM_PCT:
        caps.append(("medium", f"priced on an estimated step without the profiler (the profiler costs {over:g} %)"))
    elif _host_time(w) and over is not None and over >= OVERHEAD_MEDIUM_PCT:
        # a measured unprofiled step rescales the prediction, but the host time the fix removes is still read off
        # the graph less the profiler's estimated cost, whose per-event figure spreads ±40 % (replay.overhead.RANGE)
        caps.append(("medium", f"the saving is host time, read off the trace less the profiler's estimated cost "
                               f"(the profiler costs {over:g} % of the profiled step)"))
    if b.get("unprofiled_caveat"):
        caps.append(("medium", "priced on an uncertain step without the profiler (a multi-process DataLoader "
                               "competes with the profiler for the cores)"))
    saving, noise = _num(w.get("saving_pct")), b["step_noise_pct"]
    if saving is not None and noise is not None and 0 < saving < noise:
        caps.append(("low", f"the saving ({saving:g} %) is within the step-to-step noise ({noise:g} %)"))
    return _lowest(caps)


def finding_confidence(f: dict, b: dict | None, whatifs: list[dict]) -> dict:
    """``findings[i].confidence``: ``level``, ``range_pct`` ([low, high] % of the step that fixing it wins back:
    the range of the what-if that prices it (:func:`saving_range`), else the impact's with the pooled error; [0, 0]
    for a memory finding, whose level only the run's steps and ranks cap) and ``why`` (the reasons for a level below
    high; empty when high). A finding that the run died (``cuda_oom``, ``host_oom``) is high: the log states it, and no
    step, trace or replay stands behind it. A finding with an ``effect`` (what is trained, not step time) has no
    range and rests on the facts a log or config states, not on the trace's steps or ranks: high, or medium with an
    ``assumption`` (a recipe assumed to come from one GPU).

    Args:
        f: a finding (``findings[i]``). b: its run's :func:`basis` (None: run unknown, only the finding's own
            caps apply). whatifs: its run's ``whatif`` rows (levels already set by :func:`assess`).
    """
    if f.get("kind") in DIED_KINDS:  # the log states the death: no step, trace or replay is behind it
        return {"level": "high", "range_pct": None, "why": []}
    if f.get("kind") in MEMORY_KINDS:  # bytes the allocator counted, not a share of the step: no noise, no range
        level, why = _lowest(_memory_caps(b) if b else [])
        return {"level": level, "range_pct": [0.0, 0.0], "why": why}
    if f.get("effect"):  # what is trained, from stated facts: not the trace's steps, noise or ranks; no range
        level, why = _lowest([("medium", f["assumption"])] if f.get("assumption") else [])
        return {"level": level, "range_pct": None, "why": why}
    caps = _run_caps(b, wait_finding=f.get("cause") in WAIT_CAUSES) if b else []
    impact = _num(f.get("impact_pct")) or 0.0
    sc = finding_scenario(f.get("kind", ""), whatifs)
    w = next((x for x in whatifs if x.get("scenario") == sc), None) if sc else None
    if w is not None:
        conf = w.get("confidence") or {}
        if conf.get("level") in LEVELS:
            caps.extend((conf["level"], y) for y in conf.get("why") or [])
    else:
        caps.append(("medium", "no what-if replays this finding: its impact is the rule's estimate"))
    # the range of the what-if that prices it, else the finding's own impact with the pooled model error
    rng = saving_range(w if w is not None and _num(w.get("saving_pct")) is not None else {"saving_pct": impact}, b)
    level, why = _lowest(caps)
    return {"level": level, "range_pct": rng, "why": why}


def assess(model: dict) -> None:
    """Add confidence to a report model in place: ``runs[i].confidence_basis`` (:func:`basis`), ``level`` and
    ``why`` in each ``runs[i].whatif[j].confidence``, ``findings[i].confidence`` (:func:`finding_confidence`,
    also in ``runs[i].findings``) and ``verdict_confidence`` = ``{level, why, line}``: the level of the finding the
    verdict names (``findings[i].main``), else of the subject run's own inputs (a verdict that names no cause is
    as sure as the steps and ranks it rests on), with that run's ``line``; None without a run."""
    bases: dict[str, dict] = {}
    whatifs: dict[str, list[dict]] = {}
    for run in model.get("runs") or []:
        b = basis(run)
        run["confidence_basis"] = b
        bases[run.get("name", "")] = b
        rows = [w for w in run.get("whatif") or [] if isinstance(w, dict)]
        for w in rows:
            level, why = whatif_confidence(w, b)
            conf = w.get("confidence") if isinstance(w.get("confidence"), dict) else {}
            w["confidence"] = {**conf, "level": level, "range_pct": saving_range(w, b), "why": why}
        whatifs[run.get("name", "")] = rows
    for f in [*(model.get("findings") or []),
              *(f for run in model.get("runs") or [] for f in run.get("findings") or [])]:
        if isinstance(f, dict) and "confidence" not in f:
            run_name = f.get("run", "")
            f["confidence"] = finding_confidence(f, bases.get(run_name), whatifs.get(run_name, []))
    main = next((f for f in model.get("findings") or [] if f.get("main")), None)
    subject = next((r for r in model.get("runs") or [] if r.get("role") == "subject"), None)
    if main is not None and isinstance(main.get("confidence"), dict):
        b = bases.get(main.get("run", ""))
        model["verdict_confidence"] = {"level": main["confidence"]["level"], "why": main["confidence"]["why"],
                                       "line": b["line"] if b else None}
        if main.get("kind") in DIED_KINDS:
            model["verdict_confidence"]["line"] = "the run's logs record the death (see the finding's evidence)"
    elif subject is not None:  # no cause named: how sure "nothing found" is rests on the run alone
        b = bases[subject.get("name", "")]
        level, why = _lowest(_run_caps(b))
        model["verdict_confidence"] = {"level": level, "why": why, "line": b["line"]}
    else:
        model["verdict_confidence"] = None
