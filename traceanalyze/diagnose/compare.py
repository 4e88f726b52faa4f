"""Comparing two runs: the step-time delta as a sum of parts, which finding explains each part, config
differences, and findings from throughput alone."""

from __future__ import annotations

import math
import statistics

from traceanalyze import hardware
from traceanalyze.diagnose.config import compile_cost_us, compile_fills_window
from traceanalyze.diagnose.evidence import RunEvidence, rank_steps, severity
from traceanalyze.diagnose.interconnect import interconnect_recommendation, slow_topology_pairs, transport_note
from traceanalyze.diagnose.precision import CPU_PRECISION_ADVICE
from traceanalyze.diagnose.verdict import KIND_TO_SCENARIO
from traceanalyze.findings import Finding
from traceanalyze.replay.scenarios import ALL, REGISTRY, by_name


def effective_batch_of(ev: RunEvidence) -> float | None:
    """Effective (global) batch = per-device micro-batch × gradient accumulation × data-parallel size."""
    gb = ev.fact("global_batch")
    if gb:
        return float(gb)
    pdb, ga = ev.fact("per_device_batch"), ev.fact("gradient_accumulation_steps")
    ws = ev.fact("world_size") or ev.world_size
    if pdb and ga and ws:
        return float(pdb) * float(ga) * float(ws)
    return None


def throughput_per_rank(ev: RunEvidence) -> tuple[float, str] | None:
    """Per-rank speed, higher is better: (value, what). Tokens/s per GPU from the logs, else 1e6 / step time (µs)
    from the trace's profiler steps, else from the logs' step time. None when nothing says."""
    tps = [s.tokens_per_s for s in ev.log_steps if s.tokens_per_s]
    if tps:
        return statistics.median(tps), "tokens/s per GPU (log)"
    if ev.step_time_us:
        return 1e6 / ev.step_time_us, "steps/s (trace)"
    ms = [s.step_time_ms for s in ev.log_steps if s.step_time_ms]
    if ms:
        return 1e3 / statistics.median(ms), "steps/s (log)"
    return None


def _ranks_of(ev: RunEvidence) -> int:
    ws = ev.fact("world_size") or ev.world_size or len(ev.ranks) or 1
    return int(float(ws))


def compare(subject: RunEvidence, baseline: RunEvidence, subject_findings: list[Finding],
            baseline_findings: list[Finding] | None = None, attribute: bool = True) -> tuple[dict, list[Finding]]:
    """Explain subject − baseline step time as a sum of parts and flag config differences.

    Parts per counted profiler step (median over ranks of each rank's median over its steps): compute, exposed
    communication, idle, and other (the rest of the run's step time, :mod:`traceanalyze.metrics.steps`), each
    subject − baseline in µs; they add up to the step-time delta. A part that grew names the subject's finding
    that explains it, only when that finding can (:func:`explains`): its cause differs between the runs, or its
    estimated cost grew with the delta. With ``attribute`` False (the runs are not comparable, :func:`comparability`)
    no part names a finding and the comparison adds none. Returns ``(comparison dict, extra findings)``.
    """
    def parts(ev: RunEvidence) -> dict[str, float]:
        if not ev.steps:
            return {}
        ranks = sorted({s["rank"] for s in ev.steps})

        def med(key: str) -> float:
            return statistics.median(statistics.median(s[key] for s in ev.steps_of(r)) for r in ranks)
        d = {"step": ev.step_time_us or med("step_time_us"), "compute": med("compute_us"),
             "exposed communication": med("exposed_comm_us"), "idle": med("idle_us")}
        d["other"] = d["step"] - d["compute"] - d["exposed communication"] - d["idle"]
        return d

    ps, pb = parts(subject), parts(baseline)
    kinds_of = {"compute": ("fp32_matmul", "autocast_missing", "straggler"),
                "exposed communication": ("slow_collectives", "topology", "straggler", "late_entry"),
                "idle": ("dataloader", "launch_bound", "idle_rank", "compile_overhead", "straggler", "late_entry"),
                "other": ("compile_overhead", "dataloader", "launch_bound", "late_entry")}
    rows = []
    for part in ("compute", "exposed communication", "idle", "other"):
        if part in ps and part in pb:
            d = ps[part] - pb[part]
            f = next((f for f in subject_findings if attribute and f.kind in kinds_of[part] and f.severity != "low"
                      and explains(f, d, subject, baseline, baseline_findings or [])), None)
            rows.append({"part": part, "subject_us": round(ps[part], 1), "baseline_us": round(pb[part], 1),
                         "delta_us": round(d, 1), "finding": f.title if f else None})
    diffs = config_diffs(subject, baseline)
    extra: list[Finding] = []
    extra += _compare_throughput(subject, baseline, subject_findings) if attribute else []
    es, eb = (effective_batch_of(subject), effective_batch_of(baseline)) if attribute else (None, None)
    if es and eb and es != eb and _ranks_of(subject) < _ranks_of(baseline):
        subject, baseline, es, eb = baseline, subject, eb, es  # the finding belongs to the run that scaled out
    if es and eb and es != eb:
        ratio = es / eb
        diffs.append({"key": "effective batch", "subject": es, "baseline": eb})
        ga = subject.fact("gradient_accumulation_steps")
        impact = round(100 * (1 - 1 / ratio), 1) if ratio > 1 else 0.0
        ev_lines = [f"effective batch {es:,.0f} vs {eb:,.0f} in the baseline ({ratio:g}×)",
                    f"gradient accumulation {ga if ga is not None else '?'} in both runs while the data-parallel "
                    f"size went {baseline.fact('world_size') or baseline.world_size} → "
                    f"{subject.fact('world_size') or subject.world_size}"]
        losses_s = [s.loss for s in subject.log_steps if s.loss is not None]
        losses_b = [s.loss for s in baseline.log_steps if s.loss is not None]
        if losses_s and losses_b:
            ev_lines.append(f"final logged loss {losses_s[-1]:g} vs {losses_b[-1]:g} in the baseline")
        extra.append(Finding(
            "config", "gradient_accumulation", "high" if ratio >= 2 or ratio <= 0.5 else "medium", impact, [],
            f"Effective batch grew {ratio:g}× against the baseline: gradient accumulation was not scaled with the "
            "number of ranks", ev_lines,
            f"divide gradient_accumulation_steps by the world-size ratio ({ga} → "
            f"{max(1, round(float(ga) / ratio)) if ga else '?'}) to keep the baseline's effective batch, or scale "
            "the learning rate with the batch (linear scaling) and expect fewer optimizer steps per epoch",
            run=subject.name))
    comp = {"subject": subject.name, "baseline": baseline.name,
            "subject_step_us": ps.get("step") or subject.step_time_us,
            "baseline_step_us": pb.get("step") or baseline.step_time_us,
            "parts": rows, "config_diffs": diffs}
    if (t := compile_tradeoff(subject, baseline, [*subject_findings, *(baseline_findings or [])])) is not None:
        comp["compile"] = t
    if comp["subject_step_us"] is not None and comp["baseline_step_us"] is not None:
        comp["delta_us"] = round(comp["subject_step_us"] - comp["baseline_step_us"], 1)
    return comp, extra


def config_diffs(subject: RunEvidence, baseline: RunEvidence) -> list[dict]:
    """The settings the two runs' logs, configs and traces state differently: ``{key, subject, baseline}``."""
    diffs = []
    for key in ("precision", "gradient_accumulation_steps", "per_device_batch", "global_batch", "world_size",
                "compile", "learning_rate"):
        a, b = subject.fact(key), baseline.fact(key)
        if a is not None and b is not None and str(a) != str(b):
            diffs.append({"key": key, "subject": a, "baseline": b})
    if subject.world_size != baseline.world_size:
        diffs.append({"key": "ranks in trace", "subject": subject.world_size, "baseline": baseline.world_size})
    sm, bm = (subject.prec.main_dtype if subject.prec else None), (baseline.prec.main_dtype if baseline.prec else None)
    if sm and bm and sm != bm:
        diffs.append({"key": "matmul dtype", "subject": sm, "baseline": bm})
    return diffs


PRECISION_KINDS = ("fp32_matmul", "autocast_missing")
MIN_SHARE_DIFF_POINTS = 10.0  # fp32 share of matrix math that must differ for precision to explain a delta


def explains(f: Finding, delta_us: float, subject: RunEvidence, baseline: RunEvidence,
             baseline_findings: list[Finding]) -> bool:
    """Whether the subject's finding ``f`` can explain a part of the step that grew by ``delta_us`` (µs).

    Only a slowdown is explained (``delta_us`` > 0). The cause must differ between the runs: the baseline has no
    finding of that kind (precision: and the fp32 share of matrix math differs by :data:`MIN_SHARE_DIFF_POINTS`
    points or more), or it scales with the delta: the finding's estimated cost per step (impact % × step time)
    grew by at least half of ``delta_us`` against the baseline's finding of that kind.
    """
    if delta_us <= 0:
        return False
    if f.kind in PRECISION_KINDS and subject.prec and baseline.prec and f.kind != "autocast_missing":
        if abs(subject.prec.fp32_share_pct - baseline.prec.fp32_share_pct) < MIN_SHARE_DIFF_POINTS:
            return False  # both runs do their matrix math in the same precision: it cannot explain a difference
    same = [b for b in baseline_findings if b.kind == f.kind]
    if not same:
        return True
    b = max(same, key=lambda x: x.impact_pct)
    grown = (f.impact_pct * (subject.step_time_us or 0.0) - b.impact_pct * (baseline.step_time_us or 0.0)) / 100
    return grown >= 0.5 * delta_us


def _same_precision_advice(subject: RunEvidence, prec_b: str) -> str:
    """Advice for a run in fp32 whose baseline uses ``prec_b``: what the subject's GPU supports
    (:func:`traceanalyze.hardware.precision_advice`; both options when the GPU is unknown)."""
    if subject.mode == "cpu":
        return (f"set the same precision as the baseline ({prec_b}; the single-device default is often fp32): "
                + CPU_PRECISION_ADVICE)
    return (f"set the same precision as the baseline ({prec_b}; the single-device default is often fp32): "
            + hardware.precision_advice(subject.gpu))


def _compare_throughput(subject: RunEvidence, baseline: RunEvidence, have: list[Finding]) -> list[Finding]:
    """Findings from logs alone when two runs differ: poor scaling to more ranks, fp32 against bf16."""
    out: list[Finding] = []
    ts, tb = throughput_per_rank(subject), throughput_per_rank(baseline)
    ns, nb = _ranks_of(subject), _ranks_of(baseline)
    rel = ts[0] / tb[0] if ts and tb and tb[0] > 0 and ts[1] == tb[1] else None
    prec_s, prec_b = subject.fact("precision"), baseline.fact("precision")
    if prec_s == "fp32" and prec_b in ("bf16", "fp16") and not any(f.cause == "precision" for f in have):
        impact = round(100 * (1 - rel), 1) if rel is not None and rel < 1 else 10.0
        ev_lines = [f"precision {prec_s} in {subject.name} vs {prec_b} in {baseline.name} (config/log)"]
        if rel is not None:
            ev_lines.append(f"per-rank speed {ts[0]:,.1f} vs {tb[0]:,.1f} {ts[1]}: {1 / rel:.1f}× slower")
        out.append(Finding("precision", "autocast_missing", severity(impact), impact, [],
                           f"{subject.name} runs in fp32 while {baseline.name} uses {prec_b}", ev_lines,
                           _same_precision_advice(subject, prec_b), run=subject.name))
    if ns > nb and rel is not None and rel < 0.5 and not any(f.cause == "interconnect" for f in have):
        eff = rel
        impact = round(100 * (1 - eff), 1)
        ev_lines = [f"per-rank speed on {ns} ranks {ts[0]:,.1f} vs {tb[0]:,.1f} {ts[1]} on {nb}: scaling efficiency "
                    f"{100 * eff:.0f}%", f"{ns} ranks deliver {ns * eff:.2f}× the throughput of {nb}"]
        note = transport_note(subject)
        if note:
            ev_lines.append(note)
        pairs = slow_topology_pairs(subject)
        if pairs:
            ev_lines.append("GPU links: " + ", ".join(f"{a}–{b} {lk}" for a, b, lk in pairs[:4]))
        kind = "topology" if pairs else "slow_collectives"
        out.append(Finding("interconnect", kind, severity(impact), impact, [],
                           f"Scaling to {ns} ranks loses {impact:.0f}% of per-rank throughput", ev_lines,
                           interconnect_recommendation(subject, pairs), run=subject.name))
    return out


def compile_cost_s(ev: RunEvidence) -> float | None:
    """torch.compile's one-time cost of a run (s): from its trace (:func:`~.config.compile_cost_us`), else the
    compile time its log states; None for an eager run."""
    if ev.compile is not None and ev.compile.compile_us:
        return compile_cost_us(ev)[0] / 1e6
    secs = ev.fact("compile_time_s")
    return float(secs) if secs else None


def logged_steady_ms(ev: RunEvidence) -> list[float]:
    """The logged step times (ms) after the first logged step (its warm-up), every rank's, in step order."""
    timed = sorted((s.step, s.step_time_ms) for s in ev.log_steps if s.step_time_ms)
    return [ms for step, ms in timed if step != timed[0][0]] if timed else []


def steady_step_ms(ev: RunEvidence, source: str) -> float | None:
    """A run's steady step (ms) from ``source``: ``unprofiled`` (measured without the profiler: a capture sidecar or
    the training log, :func:`traceanalyze.logs.measured_unprofiled_step`), ``log`` (the logged step times after the
    first), ``trace`` (the profiler steps, the compile step left out) or ``gpu`` (the GPU's busy time per steady
    step: the device work, whatever the host adds); None when the run has none (a window that holds only the
    compile step has no trace figure)."""
    if source == "unprofiled":
        us = (ev.unprofiled or {}).get("step_time_us")
        return us / 1e3 if us else None
    if source == "log":
        steady = logged_steady_ms(ev)
        return statistics.median(steady) if steady else None
    if compile_fills_window(ev) is not None or not ev.step_time_us:
        return None
    if source == "trace":
        return ev.step_time_us / 1e3
    busy = [statistics.median(s["step_time_us"] - s["idle_us"] for s in rs) for r in ev.ranks
            if (rs := rank_steps(ev, r["rank"])) and "idle_us" in rs[0]]
    return statistics.median(busy) / 1e3 if busy else None


def compile_tradeoff(subject: RunEvidence, baseline: RunEvidence, findings: list[Finding]) -> dict | None:
    """When one run is compiled and the other eager: the compile's one-time cost, the steady saving per step of the
    compiled run (both runs' steady steps from their traces, else both from their logs) and the break-even step
    count (compile cost / saving per step; None when the compiled steps are not faster). The compiled run's
    ``compile_overhead`` finding gets the figures as evidence. None when the runs do not pair that way."""
    costs = {id(e): compile_cost_s(e) for e in (subject, baseline)}
    compiled = [e for e in (subject, baseline) if costs[id(e)]]
    if len(compiled) != 1:
        return None
    comp_ev = compiled[0]
    eager = baseline if comp_ev is subject else subject
    for source in ("unprofiled", "log", "trace"):
        c_ms, e_ms = steady_step_ms(comp_ev, source), steady_step_ms(eager, source)
        if c_ms and e_ms:
            break
    else:
        return None
    cost = costs[id(comp_ev)]
    saving = e_ms - c_ms
    gc, ge = steady_step_ms(comp_ev, "gpu"), steady_step_ms(eager, "gpu")
    if source == "trace" and gc and ge and ge - gc > saving:
        # the profiled steps hide the saving (the profiler slows the host of both runs): the device work saved is
        # the figure the traces can vouch for
        source, c_ms, e_ms, saving = "gpu", gc, ge, ge - gc
    even = math.ceil(cost * 1e3 / saving) if saving > 0 else None
    out = {"compiled": comp_ev.name, "eager": eager.name, "compile_s": round(cost, 3), "source": source,
           "compiled_step_ms": round(c_ms, 3), "eager_step_ms": round(e_ms, 3),
           "saving_ms_per_step": round(saving, 3), "saving_pct": round(100 * saving / e_ms, 1),
           "break_even_steps": even}
    what = {"unprofiled": "steady step without the profiler", "log": "steady step in the logs",
            "trace": "profiled steady step", "gpu": "GPU busy time per steady step (the profiled steps do not show "
            "the saving: the profiler slows the host of both runs)"}[source]
    line = (f"against {eager.name} (eager): {what} {c_ms:,.1f} ms compiled vs {e_ms:,.1f} ms "
            f"eager, " + (f"{saving:,.1f} ms ({100 * saving / e_ms:.0f}%) saved per step: the {cost:,.1f} s compile "
                          f"pays back after {even:,} steps" if even is not None else
                          "the compiled steps are not faster: the compile never pays back"))
    for f in findings:
        if f.kind == "compile_overhead" and f.run == comp_ev.name and line not in f.evidence:
            f.evidence = [*f.evidence, line]
    return out


# The what-if a fix between the two runs checks (issue 31): the subject's findings of these kinds name the cause
# the what-if removes: the kinds it prices (KIND_TO_SCENARIO), and those a fix of that cause removes with them (the
# record's ``also_fixes``: for the launch what-if the host-side kinds CUDA graphs or a fused optimizer remove).
# Precision what-ifs are picked by the runs' matrix-math dtypes (:func:`_precision_scenario`).
CHECK_KINDS: dict[str, tuple[str, ...]] = {
    sc: tuple(k for k, s in KIND_TO_SCENARIO.items() if s == sc) + by_name(sc).also_fixes
    for sc in dict.fromkeys(KIND_TO_SCENARIO.values())}
CHANGED_COST_SHARE = 0.5  # a baseline finding costing less than this share of the subject's (µs per step): changed
_TICKET = ("high", "medium")


def _precision_scenario(subject: RunEvidence, baseline: RunEvidence) -> str | None:
    """The precision what-if the baseline's matrix-math dtype checks: the subject's main dtype is fp32 and the
    baseline's bf16/fp16 (``bf16_matmul``; ``bf16_channels_last`` when the subject's activations are NCHW and the
    baseline's channels_last, as their kernel names say) or tf32 (``tf32_matmul``); None otherwise or when either
    is unknown."""
    sm = subject.prec.main_dtype if subject.prec else None
    bm = baseline.prec.main_dtype if baseline.prec else None
    if sm != "fp32" or bm is None:
        return None
    fixes = [s for s in REGISTRY if s.precision is not None and bm in s.precision.dtypes]
    layout = (subject.prec.layout, baseline.prec.layout) == ("NCHW", "channels_last")
    # the switch with channels_last where the layouts say so and one exists for this dtype, else the plain one
    return next((s.name for s in fixes if s.precision.channels_last == layout), None) or next(
        (s.name for s in fixes if not s.precision.channels_last), None)


def _cost_us(f: dict, step_us: float | None) -> float:
    """A finding's estimated cost per step (µs): impact % × the run's step time."""
    imp = f.get("impact_pct")
    return float(imp) * float(step_us or 0.0) / 100 if isinstance(imp, (int, float)) and math.isfinite(imp) else 0.0


def _fixed_cause(scenario: str, subject_run: dict, baseline_run: dict, subject: RunEvidence,
                 baseline: RunEvidence) -> str | None:
    """Why the baseline is the subject with ``scenario``'s cause fixed, or None when it is not (the rule of
    :func:`whatif_check`)."""
    rec = by_name(scenario)
    if rec is not None and rec.precision is not None:
        ps = _precision_scenario(subject, baseline)
        if ps is not None:
            layout = (f"; activations {subject.prec.layout} here, {baseline.prec.layout} in the baseline"
                      if by_name(ps).precision.channels_last else "")
            return (f"matrix math in {subject.prec.main_dtype} here, {baseline.prec.main_dtype} in the baseline"
                    + layout if ps == scenario else None)
    kinds = CHECK_KINDS.get(scenario, ())  # none for a precision switch no finding kind maps to
    mine = [f for f in subject_run.get("findings") or [] if f.get("kind") in kinds and f.get("severity") in _TICKET]
    if not mine:
        return None
    f = max(mine, key=lambda x: _cost_us(x, subject_run.get("step_time_us")))
    theirs = [b for b in baseline_run.get("findings") or [] if b.get("kind") in kinds and b.get("severity") in _TICKET]
    if not theirs:
        return f"{f.get('kind')} finding here, none in the baseline"
    cost_s = _cost_us(f, subject_run.get("step_time_us"))
    cost_b = max(_cost_us(b, baseline_run.get("step_time_us")) for b in theirs)
    if cost_s > 0 and cost_b < CHANGED_COST_SHARE * cost_s:
        return (f"{f.get('kind')} finding costs {cost_s / 1e3:,.1f} ms per step here, "
                f"{cost_b / 1e3:,.1f} ms in the baseline")
    return None


def _step_basis(subject_run: dict, baseline_run: dict) -> tuple[float, float, str, dict] | None:
    """(subject step µs, baseline step µs, basis, sources): both runs' step time without the profiler
    (``profiler_overhead.unprofiled_step_time_us``, basis ``unprofiled``) when both have one, else both runs'
    profiled step time (``step_time_us``, basis ``profiled``); None when a run has neither."""
    po_s, po_b = subject_run.get("profiler_overhead") or {}, baseline_run.get("profiler_overhead") or {}
    us, ub = po_s.get("unprofiled_step_time_us"), po_b.get("unprofiled_step_time_us")
    if _positive(us) and _positive(ub):
        return float(us), float(ub), "unprofiled", {"subject": po_s.get("source"), "baseline": po_b.get("source")}
    us, ub = subject_run.get("step_time_us"), baseline_run.get("step_time_us")
    if _positive(us) and _positive(ub):
        return float(us), float(ub), "profiled", {"subject": "trace", "baseline": "trace"}
    return None


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def whatif_check(subject_run: dict, baseline_run: dict, subject: RunEvidence, baseline: RunEvidence) -> list[dict]:
    """The subject's what-ifs whose cause the baseline fixed, each with its predicted saving against the one measured
    between the two runs (``comparison.whatif_check``, ``docs/schema.md``).

    ``subject_run``/``baseline_run``: the runs' report models (``runs[i]``: ``whatif``, ``findings``,
    ``profiler_overhead``, ``step_time_us``). A what-if of the subject (``all`` left out) is checked when the
    baseline has its cause fixed:

    - precision (``bf16_matmul``, ``tf32_matmul``, ``bf16_channels_last``): the subject's main matrix-math dtype is
      fp32 and the baseline's is bf16 or fp16 (``bf16_matmul``; ``bf16_channels_last`` instead when the kernel names
      say the subject's activations are NCHW and the baseline's channels_last) or tf32 (``tf32_matmul``); when
      either dtype is unknown,
      ``bf16_matmul`` follows the finding rule below with the precision kinds;
    - every other what-if (and precision without dtypes): the subject has a finding of the what-if's kinds
      (:data:`CHECK_KINDS`) of medium or high severity, and the baseline has none of those kinds at medium or high
      severity, or its costliest one costs less than :data:`CHANGED_COST_SHARE` of the subject's
      (impact % × step time, µs per step).

    Measured saving = 100 × (1 − baseline step / subject step), both runs' step time without the profiler when both
    have one (basis ``unprofiled``; the source of each: measured by capture, from the log, or estimated), else both
    runs' profiled step time (basis ``profiled``). ``error_pp`` = predicted − measured, in points. When several
    what-ifs are checked, each is set against the same measured saving (the runs differ in all their causes); but
    a what-if whose finding is part of a larger one whose what-if is checked too (``part_of``: a per-parameter
    optimizer inside a launch-bound step, whose CUDA graph removes the optimizer's launches with the rest) is not:
    the baseline's saving is the whole's, of which the part prices a share (:func:`_drop_parts`).

    ``predicted_step_us`` is the subject's step the what-if predicts, to set beside ``baseline_step_us`` (the
    baseline's measured one); ``priced_from`` says what priced it: the baseline's measured busbw where the subject's
    link came from the baseline (``runs[i].link.from_baseline``, the what-if's assumptions state it), the
    baseline's measured matrix-math speed-up or loader wait where the what-if row says so (its ``priced_from``:
    :mod:`traceanalyze.replay.frombase`), else the model.

    Returns ``[{scenario, cause, predicted_saving_pct, predicted_range_pct, measured_saving_pct, error_pp, basis,
    basis_source, subject_step_us, baseline_step_us, reliable, why, predicted_step_us, priced_from}]``, ``[]`` when
    nothing is checked.
    """
    basis = _step_basis(subject_run, baseline_run)
    if basis is None:
        return []
    s_us, b_us, how, sources = basis
    measured = 100 * (1 - b_us / s_us)
    out = []
    for w in subject_run.get("whatif") or []:
        if not isinstance(w, dict) or w.get("scenario") == ALL or not _positive(abs(w.get("saving_pct") or 0)):
            continue
        why = _fixed_cause(str(w.get("scenario")), subject_run, baseline_run, subject, baseline)
        if why is None:
            continue
        pred = float(w["saving_pct"])
        rng = w.get("range_saving_pct")
        link = subject_run.get("link") if isinstance(subject_run.get("link"), dict) else {}
        from_base = bool(link.get("from_baseline")) and str(link.get("source")) in str(w.get("assumptions"))
        out.append({"scenario": w["scenario"], "cause": w.get("cause"), "predicted_saving_pct": round(pred, 2),
                    "predicted_range_pct": list(rng) if isinstance(rng, list) and len(rng) == 2 else None,
                    "measured_saving_pct": round(measured, 2), "error_pp": round(pred - measured, 2),
                    "basis": how, "basis_source": sources, "subject_step_us": round(s_us, 3),
                    "baseline_step_us": round(b_us, 3), "reliable": bool(w.get("reliable", False)), "why": why,
                    "predicted_step_us": (round(float(w["predicted_step_time_us"]), 3)
                                          if _positive(w.get("predicted_step_time_us")) else None),
                    "priced_from": (w.get("priced_from") if isinstance(w.get("priced_from"), str) else
                                    f"the baseline's busbw ({link.get('expected_gbps'):g} GB/s)" if from_base
                                    else "the model")})
    return _drop_parts(out, subject_run)


def _drop_parts(rows: list[dict], subject_run: dict) -> list[dict]:
    """``rows`` less those of a what-if that prices a finding of the subject that is part of a larger finding
    (``part_of``) whose own what-if has a row: the measured saving is the whole's fix."""
    checked = {r["scenario"] for r in rows}
    parts = set()
    for f in subject_run.get("findings") or []:
        if not isinstance(f, dict) or not f.get("part_of"):
            continue
        own, whole = KIND_TO_SCENARIO.get(f.get("kind")), KIND_TO_SCENARIO.get(f["part_of"])
        if whole in checked and whole != own:
            parts.add(own)
    return [r for r in rows if r["scenario"] not in parts]


def next_bottleneck(subject_run: dict, baseline_run: dict) -> dict | None:
    """The faster run's own top finding (``comparison.next_bottleneck``): of the run with the shorter step
    (:func:`_step_basis`; the baseline when neither says), its first finding of high or medium severity in the
    report's ranking, as ``{run, title, cause, kind, severity, impact_pct}``; None when that run is healthy (no
    such finding)."""
    basis = _step_basis(subject_run, baseline_run)
    faster = subject_run if basis is not None and basis[0] < basis[1] else baseline_run
    top = next((f for f in faster.get("findings") or [] if isinstance(f, dict) and f.get("severity") in _TICKET), None)
    if top is None:
        return None
    return {"run": faster.get("name"), "title": top.get("title"), "cause": top.get("cause"), "kind": top.get("kind"),
            "severity": top.get("severity"), "impact_pct": top.get("impact_pct")}


# ---------------------------------------------------------------------------------------------------------
# Whether the two runs can be compared (issue 40 item 3) and which step times the ratio uses (item 2)

NOISE_FLOOR_PCT = 2.0  # a step-time difference below this (or 2× the runs' step noise) is no difference (nsys-ai: 2 %)
NOISE_SIGMAS_FLOOR = 2.0  # ... the floor in standard errors of the difference of the two runs' mean steps (~95 %)
MIN_KERNEL_OVERLAP = 0.1  # time-weighted Jaccard of compute kernel names below which the runs ran other work
LOW_KERNEL_OVERLAP = 0.5  # ... below which the comparison holds with a caveat
NOISY_CV_PCT = 10.0  # step-to-step coefficient of variation above which a run's steps are noisy (a caveat)


def kernel_overlap(subject_top: list, baseline_top: list) -> float | None:
    """Time-weighted Jaccard of the two runs' kernel names (on a CPU run its ops): Σ min(share) / Σ max(share)
    over the names of either run's top kernels (``runs[i].top_kernels``), each name's share of its run's time of the
    kernels listed; communication kernels left out (a faster link changes their time, not the work). 1 = the same
    kernels in the same proportions, 0 = no kernel in common; None when a run lists none."""
    def shares(top: list) -> dict[str, float]:
        t: dict[str, float] = {}
        for k in top or []:
            if not isinstance(k, dict) or k.get("klass") == "communication":
                continue
            us = k.get("total_us")
            if isinstance(us, (int, float)) and math.isfinite(us) and us > 0:
                t[str(k.get("name"))] = t.get(str(k.get("name")), 0.0) + float(us)
        total = sum(t.values())
        return {n: v / total for n, v in t.items()} if total > 0 else {}

    a, b = shares(subject_top), shares(baseline_top)
    if not a or not b:
        return None
    names = set(a) | set(b)
    return sum(min(a.get(n, 0.0), b.get(n, 0.0)) for n in names) / sum(max(a.get(n, 0.0), b.get(n, 0.0))
                                                                          for n in names)


def step_noise_pct(ev: RunEvidence) -> tuple[float, int, str] | None:
    """(coefficient of variation %, steps, source) of a run's step time from step to step: sample standard
    deviation / mean of the longest rank's time of each counted profiler step (the compile step left out), else of
    the logged step times after the first; None with fewer than two steps."""
    longest: dict[int, float] = {}
    for s in ev.steps:
        if s.get("step") != ev.compile_step and isinstance(s.get("step_time_us"), (int, float)):
            longest[s["step"]] = max(longest.get(s["step"], 0.0), float(s["step_time_us"]))
    vals, src = list(longest.values()), "profiler steps"
    if len(vals) < 2:
        vals, src = logged_steady_ms(ev), "logged steps"
    if len(vals) < 2 or statistics.fmean(vals) <= 0:
        return None
    return 100 * statistics.stdev(vals) / statistics.fmean(vals), len(vals), src


def step_ratio(subject: RunEvidence, baseline: RunEvidence) -> dict | None:
    """Subject step / baseline step, by the logs' step times where both runs log them (the median of each run's
    logged steps after the first: they cover the whole run, not the profiled window), else by the profiled steps
    (each run's step time, :mod:`traceanalyze.metrics.steps`). ``{value, basis, subject_ms, baseline_ms, n_subject,
    n_baseline, profiled, sentence}``; None when either run has no step time."""
    def logged(ev: RunEvidence) -> tuple[float, int] | None:
        steady = logged_steady_ms(ev)
        return (statistics.median(steady), len(steady)) if steady else None

    ls, lb = logged(subject), logged(baseline)
    prof = (subject.step_time_us / baseline.step_time_us if subject.step_time_us and baseline.step_time_us
            else None)
    if ls and lb and lb[0] > 0:
        v = ls[0] / lb[0]
        n = f"{ls[1]} logged steps each" if ls[1] == lb[1] else f"{ls[1]} and {lb[1]} logged steps"
        sentence = f"{v:.3g}× by the logs' step times (median of {n}, all ranks)" + (
            f"; {prof:.3g}× by profiled steps" if prof else "")
        return {"value": round(v, 4), "basis": "log", "subject_ms": round(ls[0], 3), "baseline_ms": round(lb[0], 3),
                "n_subject": ls[1], "n_baseline": lb[1], "profiled": round(prof, 4) if prof else None,
                "sentence": sentence}
    if prof:
        return {"value": round(prof, 4), "basis": "profiled", "subject_ms": round(subject.step_time_us / 1e3, 3),
                "baseline_ms": round(baseline.step_time_us / 1e3, 3),
                "n_subject": len({s["step"] for s in subject.steps}), "n_baseline": len({s["step"] for s in
                                                                                      baseline.steps}),
                "profiled": round(prof, 4), "sentence": f"{prof:.3g}× by profiled steps (the logs state no step "
                                                         "time for both runs)"}
    return None


def _identical(subject: RunEvidence, baseline: RunEvidence) -> bool:
    """The two runs' profiler steps are the same to the nanosecond on every rank (a copy of the same traces)."""
    def key(ev: RunEvidence) -> list:
        return sorted((s["rank"], s["step"], s.get("start_ns"), s["step_time_us"]) for s in ev.steps)
    return bool(subject.steps) and key(subject) == key(baseline)


def _part_scores(subject_run: dict, baseline_run: dict, subject: RunEvidence, baseline: RunEvidence,
                 why: list[str], caveats: list[str]) -> dict:
    """The comparability score's parts (each 0-1 with its figures); fills ``why`` (not comparable) and ``caveats``."""
    parts: dict[str, dict] = {}
    gs, gb = subject.gpu_model, baseline.gpu_model
    parts["gpu"] = {"subject": gs, "baseline": gb, "score": 1.0 if gs == gb else 0.0 if gs and gb else 0.5}
    if gs and gb and gs != gb:
        why.append(f"different GPUs ({gs} vs {gb})")
    elif gs != gb:
        caveats.append("one run's GPU model is unknown")
    ws, wb = _ranks_of(subject), _ranks_of(baseline)
    parts["world_size"] = {"subject": ws, "baseline": wb, "score": 1.0 if ws == wb else 0.5}
    if ws != wb:
        caveats.append(f"world sizes differ ({ws} vs {wb} ranks): per-rank figures compare, the step time carries "
                       "the scaling (more ranks, more communication per step)")
    ov = kernel_overlap(subject_run.get("top_kernels") or [], baseline_run.get("top_kernels") or [])
    parts["kernel_overlap"] = {"jaccard": None if ov is None else round(ov, 3), "score": 0.5 if ov is None else
                               round(ov, 3)}
    expected_change = any(d["key"] in ("precision", "matmul dtype", "compile") for d in config_diffs(subject, baseline))
    if ov is not None and ov < MIN_KERNEL_OVERLAP and not expected_change:
        why.append(f"the runs share {100 * ov:.0f}% of their kernel time by name (time-weighted Jaccard): they ran "
                   "other work")
    elif ov is not None and ov < LOW_KERNEL_OVERLAP:
        caveats.append(f"kernel names overlap {100 * ov:.0f}% by time" + (" (the precision or compile setting "
                                                                         "differs, which renames kernels)"
                                                                         if expected_change else ""))
    has = [bool(e.steps) for e in (subject, baseline)]
    timed = [throughput_per_rank(e) is not None for e in (subject, baseline)]
    parts["step_alignment"] = {"profiler_steps": has, "score": 1.0 if all(has) else 0.5 if all(timed) else 0.25}
    if not all(timed):
        caveats.append("a run states no speed (no profiler step, no logged step time or tokens/s): only the "
                       "settings compare")
    elif not all(has):
        caveats.append("a run has no profiler step: the step is not split into parts")
    noise = [step_noise_pct(e) for e in (subject, baseline)]
    cvs = [n[0] for n in noise if n is not None]
    worst = max(cvs, default=0.0)
    parts["noise"] = {"subject_cv_pct": None if noise[0] is None else round(noise[0][0], 2),
                      "baseline_cv_pct": None if noise[1] is None else round(noise[1][0], 2),
                      "subject_steps": None if noise[0] is None else noise[0][1],
                      "baseline_steps": None if noise[1] is None else noise[1][1],
                      "score": round(max(0.0, 1 - worst / (2 * NOISY_CV_PCT)), 3)}
    if worst > NOISY_CV_PCT:
        caveats.append(f"noisy steps (coefficient of variation up to {worst:.0f}%)")
    return parts


def comparability(subject_run: dict, baseline_run: dict, subject: RunEvidence, baseline: RunEvidence,
                  same_files: bool = False) -> dict:
    """Whether the subject and the baseline can be compared, and the step-time ratio the comparison states
    (``comparison.comparable``, ``docs/comparisons.md``).

    Parts, each scored 0-1: the same GPU model, the same world size (different: a caveat, 0.5), the kernel-name
    overlap (:func:`kernel_overlap`), step alignment (both runs have profiler steps: 1; a speed from the logs only:
    0.5; a run without any speed: 0.25, only their settings compare) and the step noise (1 − the noisier run's
    coefficient of variation / 20 %). ``score`` = the lowest part. Not comparable: the same traces (``same run``),
    different GPUs, or a kernel overlap below :data:`MIN_KERNEL_OVERLAP` when neither precision nor compile
    differ. A step-time difference below the noise floor, max(:data:`NOISE_FLOOR_PCT`, 2 standard errors of the
    difference of the two runs' mean steps: 2 × √(CVₛ²/nₛ + CV_b²/n_b), a two-sample z-test at about 95 %), is
    ``no difference``. Returns ``{status, score, parts, why, caveats,
    noise_floor_pct, difference_pct, ratio, verdict}``.
    """
    why: list[str] = []
    caveats: list[str] = []
    same = same_files or _identical(subject, baseline)
    parts = _part_scores(subject_run, baseline_run, subject, baseline, why, caveats)
    nz = parts["noise"]
    var = sum(nz[f"{k}_cv_pct"] ** 2 / nz[f"{k}_steps"] for k in ("subject", "baseline")
              if nz[f"{k}_cv_pct"] is not None)
    floor = max(NOISE_FLOOR_PCT, NOISE_SIGMAS_FLOOR * math.sqrt(var))
    ratio = step_ratio(subject, baseline)
    diff = None if ratio is None else 100 * (ratio["value"] - 1)
    if same:
        status = "same run"
        verdict = ("not comparable: same run (the baseline's traces are the subject's own"
                   + (")" if same_files else ": identical profiler steps)"))
    elif why:
        status, verdict = "not comparable", "not comparable: " + "; ".join(why)
    elif diff is not None and abs(diff) < floor:
        status = "no difference"
        verdict = (f"no difference: step times differ by {diff:+.1f}% ({ratio['basis']}), below the noise floor of "
                   f"{floor:.1f}% (max of {NOISE_FLOOR_PCT:g}% and {NOISE_SIGMAS_FLOOR:g} standard errors of the "
                   "difference of the runs' mean steps)")
    else:
        status = "comparable"
        verdict = (f"{subject.name}'s step is {ratio['value']:.3g}× the baseline's ({baseline.name}): "
                   f"{ratio['sentence']}" if ratio else f"{subject.name} against {baseline.name}: no step ratio")
    return {"status": status, "score": 0.0 if same else min(p["score"] for p in parts.values()), "parts": parts,
            "why": why, "caveats": caveats, "noise_floor_pct": round(floor, 2),
            "difference_pct": None if diff is None else round(diff, 2), "ratio": ratio, "verdict": verdict}
