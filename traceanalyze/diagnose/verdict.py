"""Every rule over one run (:func:`diagnose`), the idle no rule explains, ranking, impact from the what-if replay
and the report's first sentence (:func:`verdict`)."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import replace as dataclasses_replace

from traceanalyze.diagnose.config import (
    COMPILE_FILLS_TITLE,
    MEMORY_KINDS,
    rule_compile,
    rule_dataloader,
    rule_effective_batch_single,
    rule_host_optimizer,
    rule_host_sync,
    rule_launch_bound,
    rule_memory_cache_flush,
    rule_memory_growth,
    rule_memory_imbalance,
    rule_memory_near_capacity,
)
from traceanalyze.diagnose.evidence import (
    CPU_PRECISION_TICKET_PCT,
    HOST_BOUND_WAIT_PCT,
    MEDIUM,
    RunEvidence,
    main_stream_host_wait,
    severity,
)
from traceanalyze.diagnose.imbalance import late_arrivals, rule_idle_rank, rule_late_entry, rule_straggler
from traceanalyze.diagnose.interconnect import rule_exposed_communication, rule_untraced_ranks
from traceanalyze.diagnose.oom import died_verdict, rule_died
from traceanalyze.diagnose.precision import rule_precision
from traceanalyze.findings import CONFIG_FAULT, Finding
from traceanalyze.replay.scenarios import ALL, ARITHMETIC, REGISTRY, by_name
from traceanalyze.replay.whatif import NO_SAVING

IDLE_EXPLAIN_PCT = 50.0  # a GPU idle above this is never healthy without a finding that explains it
WAIT_VERDICT_PCT = 10.0  # a rank that waits this share of its step for other ranks is never "no significant slowdown"
IDLE_EXPLAINERS = ("slow_collectives", "topology", "untraced_ranks", "straggler", "late_entry", "idle_rank",
                   "dataloader", "launch_bound", "host_bound", "compile_overhead", "host_sync", "step_sync",
                   "host_optimizer", "memory_cache_flush")


RULES = [rule_died, rule_exposed_communication, rule_untraced_ranks, rule_straggler, rule_late_entry, rule_idle_rank,
         rule_precision, rule_compile, rule_dataloader, rule_launch_bound, rule_effective_batch_single, rule_host_sync,
         rule_host_optimizer, rule_memory_growth, rule_memory_near_capacity, rule_memory_imbalance,
         rule_memory_cache_flush]
# A specific cause ranks above the general findings it explains, which are then its symptoms: kind -> (the kinds it
# explains, the share of a symptom's impact its own impact must exceed). A blocking call the GPU idles in makes
# the other ranks wait in their collectives (and its rank look slow).
SPECIFIC_CAUSES = {
    "host_sync": (("slow_collectives", "topology", "untraced_ranks", "straggler", "idle_rank", "launch_bound",
                   "host_bound", "unexplained_idle"), 0.0),
    # a rank the others wait for at their collectives: their GPUs sit in the collective or idle behind it, which a
    # launch- or host-bound finding reads as launch cost
    "straggler": (("launch_bound", "host_bound"), 0.5),
    "late_entry": (("launch_bound", "host_bound"), 0.5),
}
# A finding that is part of a larger one: kind -> (the kinds it is part of, its own fix in a few words). An optimizer
# that loops over the parameters is part of a launch- or host-bound step's host time: CUDA graphs (the launch-bound
# fix) remove its launches with the rest, a fused optimizer only its own. Findings rank by what their fixes save
# (the headline is the one that saves most); a part that saves no more than its whole follows it, is named inside it
# (:func:`verdict`) and carries ``part_of``, the whole's kind.
PARTS = {"host_optimizer": (("launch_bound", "host_bound"), "a fused optimizer alone")}
AMPLIFIERS = ("step_sync",)
ARITHMETIC_HOW = "arithmetic"  # WHATIF_OF_KIND's "how" of a what-if its rule prices from the stated facts
NO_SLOWDOWN = "No significant slowdown found"


def diagnose(ev: RunEvidence) -> list[Finding]:
    """Every finding of one run, ranked by impact (then severity); a GPU idle that no finding explains gets one."""
    out: list[Finding] = []
    for rule in RULES:
        for f in rule(ev):
            f.run = ev.name
            out.append(f)
    out += [dataclasses_replace(f, run=ev.name) for f in unexplained_idle(ev, out)]
    return rank_findings(out)


def unexplained_idle(ev: RunEvidence, found: list[Finding]) -> list[Finding]:
    """Config, medium: the GPU is idle more than :data:`IDLE_EXPLAIN_PCT` % of the window and no finding of medium
    or high severity among :data:`IDLE_EXPLAINERS` says why. The report must not call such a run healthy."""
    if ev.mode != "gpu" or not ev.ranks:
        return []
    idle = statistics.median(r["idle_pct"] for r in ev.ranks)
    if idle <= IDLE_EXPLAIN_PCT or any(f.kind in IDLE_EXPLAINERS and f.severity != "low" for f in found):
        return []
    evidence = [f"GPU idle {idle:.0f}% of the trace window (median over {len(ev.ranks)} rank(s))"]
    hw = main_stream_host_wait(ev)
    if hw is not None:
        evidence.append(f"on the busiest stream, host wait is {hw:.0f}% of the idle time (below the "
                        f"{HOST_BOUND_WAIT_PCT:g}% that makes a step host-bound): the rest waits on other streams, "
                        "syncs or copies")
    if ev.prec is not None and ev.prec.matmul_efficiency_pct is not None:
        evidence.append(f"matrix-math efficiency {ev.prec.matmul_efficiency_pct:.1f}%")
    return [Finding("config", "unexplained_idle", "medium", round(idle - IDLE_EXPLAIN_PCT, 1),
                    [r["rank"] for r in ev.ranks],
                    f"The GPU is idle {idle:.0f}% of the time and no rule explains it", evidence,
                    "open the trace around the idle gaps (traceanalyze export, Perfetto): look for host syncs, "
                    "waits on other streams, CPU work between steps, or ranks missing from the traces")]


def rank_findings(fs: list[Finding]) -> list[Finding]:
    """Sort by severity then impact (what the fix saves), highest first, a finding with an ``effect`` (no share of
    step time: what is trained) after the step-time findings of its severity; a part of a larger finding that saves no
    more than it is linked to it (``part_of``, :data:`PARTS`) and stays below it; then a specific cause of medium
    or high severity moves just above the first general finding of its run that it explains
    (:data:`SPECIFIC_CAUSES`)."""
    order = {"high": 0, "medium": 1, "low": 2}
    out = sorted(fs, key=lambda f: (order[f.severity], f.impact_pct is None, -(f.impact_pct or 0.0)))
    _link_parts(out)
    for spec in [f for f in out if f.kind in SPECIFIC_CAUSES and f.severity != "low"]:
        kinds, ratio = SPECIFIC_CAUSES[spec.kind]
        at = next((i for i, g in enumerate(out) if g.kind in kinds and g.run == spec.run
                   and spec.impact_pct > ratio * g.impact_pct
                   and (g.kind != "straggler" or set(g.ranks) <= set(spec.ranks))), None)
        if at is not None and at < out.index(spec):
            out.remove(spec)
            out.insert(at, spec)
    # a wait at each step's end only stops other costs from overlapping the GPU's work (a host stall, a straggler):
    # beside another finding of medium or high severity of its run, which names what is to be hidden, it follows
    # it, at medium at most
    for amp in [f for f in out if f.kind in AMPLIFIERS]:
        last = max((i for i, g in enumerate(out) if g.run == amp.run and g.severity != "low"
                    and g.kind not in AMPLIFIERS), default=-1)
        if last >= 0 and amp.severity == "high":
            amp.severity = "medium"
        if last > out.index(amp):
            out.remove(amp)
            out.insert(last, amp)
    return out


def _link_parts(fs: list[Finding]) -> None:
    """Set ``part_of`` on each finding of :data:`PARTS` of medium or high severity: the kind of the first finding
    of its run, ranked above it (its fix saves at least as much) and of medium or high severity, that it is part of;
    None when there is none (it then ranks by its own saving, as any finding)."""
    for part in fs:
        if part.kind not in PARTS:
            continue
        whole = next((g for g in fs if g.kind in PARTS[part.kind][0] and g.run == part.run and g.severity != "low"
                      and g.impact_pct >= part.impact_pct and set(part.ranks) & set(g.ranks)), None)
        part.part_of = whole.kind if whole is not None and part.severity != "low" else None


# finding kinds no what-if prices, each with why no scenario models it
UNPRICED_KINDS: dict[str, str] = {
    "untraced_ranks": "the ranks the traced ones wait for have no trace: no scenario can replay their work",
    "host_bound": "no scenario models removing the host's own work between launches (CUDA graphs, "
                  "no_launch_overhead, only remove the launch calls)",
    "unexplained_idle": "no rule names the cause of this idle time, so no scenario removes it",
    "cuda_oom": "the run died: there is no step to make faster",
    "host_oom": "the run died: there is no step to make faster",
    **dict.fromkeys(MEMORY_KINDS, "memory use does not set the step time: no scenario models it"),
}
# finding kind -> (the what-if scenario that removes its cause, how it is priced) or (None, why no scenario models
# it): the one table the impacts (apply_to_findings), the pricing of a finding's missing what-if
# (price_missing_whatifs) and ``whatif_missing`` read, from the scenarios' records (their ``kinds``) and
# :data:`UNPRICED_KINDS`. How it is priced: "ranks" prices the scenario for the finding's own ranks (a straggler the
# rule names, whatever the replay's own test says: the record's ``rank_kinds``), "" as the replay finds it,
# "arithmetic" by its rule from the run's stated facts (a record of ARITHMETIC: never replayed, no ``whatif`` row).
WHATIF_OF_KIND: dict[str, tuple[str | None, str]] = {
    **{k: (s.name, "ranks" if k in s.rank_kinds else "") for s in REGISTRY for k in s.kinds},
    **{k: (s.name, ARITHMETIC_HOW) for s in ARITHMETIC for k in s.kinds},
    **{k: (None, why) for k, why in UNPRICED_KINDS.items()},
}
# the replayed what-if of each kind (the impacts and the comparison's check read it)
KIND_TO_SCENARIO = {k: sc for k, (sc, how) in WHATIF_OF_KIND.items() if sc is not None and how != ARITHMETIC_HOW}
# A scenario that prices a kind's fix more fully where the replay offers it (a record's ``extends``): the finding's
# advice then names that fix. A conv net on NCHW activations is advised bf16 autocast and channels_last
# (diagnose.precision), priced together.
WIDER_SCENARIO = {s.extends: s.name for s in REGISTRY if s.extends}
# finding kind -> the smaller fix its advice offers first, with that fix's what-if (a record's ``offered_first``)
OFFERED_FIRST = {k: s.name for s in REGISTRY for k in s.offered_first}


def finding_scenario(kind: str, whatifs: list[dict] | None) -> str | None:
    """The what-if that prices a finding of ``kind`` in a run with what-if rows ``whatifs``: its
    :data:`KIND_TO_SCENARIO` scenario, or the :data:`WIDER_SCENARIO` one where the run has a row of it."""
    sc = KIND_TO_SCENARIO.get(kind)
    wide = WIDER_SCENARIO.get(sc or "")
    if wide and any(isinstance(w, dict) and w.get("scenario") == wide for w in whatifs or []):
        return wide
    return sc
# One-time costs: their rule spreads them over an assumed job length, while no_compile prices the profiled
# steps (the compile step included); the two are not the same share, so these findings keep the rule's figure.
AMORTIZED_KINDS = frozenset({"compile_overhead", "recompiles"})


def apply_to_findings(findings: list[Finding], whatifs: list[dict] | None, mode: str | None = None) -> list[Finding]:
    """Set each finding's ``impact_pct`` from the what-if that removes its cause (:data:`KIND_TO_SCENARIO`) and its
    severity from that impact (:func:`severity`), except that a finding its rule judged not worth a ticket
    (severity low: within the run's noise, or an assumed gain the trace cannot confirm) stays low; findings without
    a what-if keep the rule's estimate. On a CPU run (``mode="cpu"``) the bf16 speed-up is assumed, not known for
    that CPU, so a precision finding priced below :data:`CPU_PRECISION_TICKET_PCT` is low, and never high. Returns
    the findings ranked by severity, then impact (:func:`rank_findings`). ``whatifs``: the run model's ``whatif``
    rows (:func:`traceanalyze.replay.whatif.replay_run`). The rules decide which causes exist; the replay decides
    what each costs."""
    by = {w["scenario"]: w for w in whatifs or []}
    for f in findings:
        if f.kind in AMORTIZED_KINDS:
            continue
        w = by.get(finding_scenario(f.kind, whatifs) or "")
        if w is None or not w.get("reliable", False):
            continue
        impact = max(0.0, float(w["saving_pct"]))
        if math.isfinite(impact):
            f.impact_pct = round(impact, 1)
            rec = by_name(w["scenario"])
            if f.severity != "low":  # the rules decide what is worth a ticket; the replay, what it costs
                f.severity = severity(impact)
                if mode == "cpu" and rec is not None and rec.precision is not None:  # an assumed CPU speed-up
                    f.severity = "low" if impact < CPU_PRECISION_TICKET_PCT else "medium"
            f.evidence = [*f.evidence, f"impact from the what-if replay ({w['scenario']}): predicted step time "
                                       f"{w['predicted_step_time_us'] / 1e3:.2f} ms, {impact:.1f}% saved"
                                       + _range_text(w)]
            if rec is not None and rec.extends and rec.extends in by:
                f.evidence.append(_channels_last_split(by[rec.extends], w))
        first = OFFERED_FIRST.get(f.kind)
        if first and by.get(first, {}).get("reliable"):
            _offer_tf32_first(f, by[first])
    return rank_findings(findings)


# the replay's pricer of one scenario for a finding: (scenario, the finding's ranks or None) -> (the what-if row or
# None, why there is none, the sim_result rows of its replay); traceanalyze.replay.whatif.replay_run's ``pricer``
PriceWhatif = Callable[[str, list[int] | None], tuple[dict | None, str, list]]


def price_missing_whatifs(findings: list[Finding], whatifs: list[dict], price: PriceWhatif | None,
                          no_price: str = "the run has no what-if replay (no counted profiler step)") -> list[list]:
    """A what-if for every finding that maps to a scenario (:data:`WHATIF_OF_KIND`), in the same run: a finding
    whose scenario the replay did not price on its own gets it priced now by ``price`` (for the finding's own ranks
    where the table says ``"ranks"``), the row added to ``whatifs`` (before ``all``, which combines the replay's own
    scenarios only). A finding that still has none gets ``whatif_missing``: the table's reason for a kind no scenario
    models, else the pricer's (the replay was skipped, the rewrite does not apply or saves nothing). ``price`` None:
    the run has no replay, ``no_price`` says why. Returns the ``sim_result`` rows of the new replays (``run_id,
    scenario, rank, step, measured_us, replayed_us``)."""
    sim_rows: list[list] = []
    why_not: dict[str, str] = {}
    for f in findings:
        sc, how = WHATIF_OF_KIND.get(f.kind, (None, "no scenario models this kind of finding"))
        if sc is None:
            f.whatif_missing = how
            continue
        if how == ARITHMETIC_HOW:  # its rule priced it (the evidence says how); a finding of another rule did not
            f.whatif_missing = None if f.effect is not None else (
                f"its what-if ({sc}) is arithmetic on the run's stated batch, not a replay: its figures are in the "
                f"run's own {f.kind.replace('_', ' ')} finding")
            continue
        if any(w.get("scenario") == sc for w in whatifs):
            continue
        if sc not in why_not:
            row, why, rows = price(sc, f.ranks if how == "ranks" else None) if price is not None else (
                None, no_price, [])
            if row is not None:
                at = next((i for i, w in enumerate(whatifs) if w.get("scenario") == ALL), len(whatifs))
                whatifs.insert(at, row)
                sim_rows += rows
                continue
            why_not[sc] = why
        f.whatif_missing = why_not[sc]
        if why_not[sc].startswith(NO_SAVING) and f.kind not in AMORTIZED_KINDS and f.impact_pct > 0:
            # the replay priced the fix and it saves nothing: the rule's estimate would promise what it cannot win
            f.evidence = [*f.evidence, f"the rule estimated {f.impact_pct:.1f}% of the step, but the what-if replay "
                                       f"says: {why_not[sc]}"]
            f.impact_pct, f.severity = 0.0, "low"
    return sim_rows


PROFILER_ONLY_KINDS = {"unexplained_idle": IDLE_EXPLAIN_PCT, "launch_bound": 40.0, "host_bound": 40.0}


def drop_profiler_only(findings: list[Finding], ranks: list[dict], overhead: dict | None
                       ) -> tuple[list[Finding], list[dict]]:
    """The findings that exist only because of the profiler left out: a GPU-idle finding (``unexplained_idle``,
    ``launch_bound``, ``host_bound``) whose GPU idle, on the step without the profiler (``overhead``: the run's
    ``profiler_overhead``), falls below the idle its rule starts at (:data:`PROFILER_ONLY_KINDS`). The GPU's busy
    time per step is the profiled step × (1 − the median rank's GPU idle share); without the profiler the step is
    ``unprofiled_step_time_us``. Returns (kept findings, ``[{kind, title, why}]`` of those left out)."""
    if not overhead or not ranks:
        return findings, []
    u, m = overhead.get("unprofiled_step_time_us"), overhead.get("profiled_step_time_us")
    idle = [r.get("idle_pct") for r in ranks if isinstance(r.get("idle_pct"), (int, float))]
    if not (u and m and idle) or u >= m:
        return findings, []
    # the replay's GPU busy time per counted step when it has one (a window-wide idle share counts a compile step)
    busy = overhead.get("gpu_busy_us") or m * (1 - sorted(idle)[len(idle) // 2] / 100)
    idle_u = max(0.0, 100 * (1 - busy / u))
    kept, dropped = [], []
    for f in findings:
        floor = PROFILER_ONLY_KINDS.get(f.kind)
        if floor is not None and idle_u < floor:
            dropped.append({"kind": f.kind, "title": f.title,
                            "why": f"exists only under the profiler: the GPU is busy {busy / 1e3:.2f} ms a step, "
                                   f"{idle_u:.0f}% idle of the {u / 1e3:.2f} ms step without the profiler "
                                   f"({overhead.get('source')}) against {100 * (1 - busy / m):.0f}% of the "
                                   f"{m / 1e3:.2f} ms profiled one (the rule starts at {floor:g}%)"})
        else:
            kept.append(f)
    return kept, dropped


def _range_text(w: dict) -> str:
    """`` (model range a–b%)`` for a what-if that carries one, else ''."""
    r = w.get("range_saving_pct")
    return f" (model range {r[0]:.1f}–{r[1]:.1f}%)" if r and len(r) == 2 else ""


def _channels_last_split(alone: dict, both: dict) -> str:
    """Which of bf16 autocast and channels_last carries the saving: bf16 alone (``alone``, the row of the scenario
    ``both`` extends) and both (``both``, bf16 autocast and channels_last), % of the step."""
    a, b = max(0.0, float(alone["saving_pct"])), max(0.0, float(both["saving_pct"]))
    return (f"bf16 alone (what-if {alone['scenario']}): {a:.1f}% saved; + channels_last: {b:.1f}%: channels_last adds "
            f"{b - a:.1f} points (the layout transposes go, batch norm and elementwise kernels move bf16 bytes)")


TF32_ONE_LINE = ("torch.set_float32_matmul_precision('high') and torch.backends.cudnn.allow_tf32 = True (TF32 tensor "
                 "cores for fp32 matmuls and convolutions, one line before training)")


def _offer_tf32_first(f: Finding, w: dict) -> None:
    """A GPU precision finding offers TF32 first (one line of code, no change of dtype), with its own what-if;
    bf16 autocast, the larger change, follows."""
    saved = max(0.0, float(w["saving_pct"]))
    f.evidence = [*f.evidence, f"TF32 alone (what-if {w['scenario']}): predicted step time "
                               f"{w['predicted_step_time_us'] / 1e3:.2f} ms, {saved:.1f}% saved" + _range_text(w)]
    f.recommendation = (f"first, one line: {TF32_ONE_LINE}, predicted to save {saved:.0f}%; then, for the rest, "
                        + f.recommendation)


def to_dicts(fs: list[Finding]) -> list[dict]:
    """Findings as plain dicts for the JSON report (``whatif_missing``, ``part_of`` and ``effect`` only where
    set)."""
    out = []
    for f in fs:
        d = asdict(f)
        for k in ("whatif_missing", "part_of", "effect"):
            if d.get(k) is None:
                d.pop(k, None)
        out.append(d)
    return out


# the findings that waits inside collectives make, which ranks missing from the traces could explain: the traced
# ranks may be waiting for them (untraced_ranks), or their wait reads as transfer (slow_collectives, topology)
PARTIAL_EXPLAINS = ("untraced_ranks", "slow_collectives", "topology")


def partial_run(ev: RunEvidence, findings: list[Finding]) -> dict | None:
    """``{"traced_ranks", "world_size", "could_explain"}`` when fewer of the run's ranks have a trace than its world
    size (``distributedInfo.world_size``, else the highest rank + 1), else None (log-only runs too).
    ``could_explain``: the kinds of the run's findings (:data:`PARTIAL_EXPLAINS`, in ranking order) that the missing
    ranks could explain: waits inside collectives."""
    traced = {r.get("rank") for r in ev.ranks}
    if ev.mode == "logs" or not traced or not ev.world_size or ev.world_size <= len(traced):
        return None
    kinds: list[str] = []
    for f in findings:
        if f.run == ev.name and f.kind in PARTIAL_EXPLAINS and f.kind not in kinds:
            kinds.append(f.kind)
    return {"traced_ranks": len(traced), "world_size": int(ev.world_size), "could_explain": kinds}


def partial_text(p: dict) -> str:
    """``Partial: k of N ranks traced`` and the findings the missing ranks could explain (:func:`partial_run`)."""
    s = f"Partial: {p['traced_ranks']} of {p['world_size']} ranks traced"
    if p.get("could_explain"):
        s += (" (the missing ranks could explain the waits inside collectives: "
              + ", ".join(k.replace("_", " ") for k in p["could_explain"]) + ")")
    return s


def verdict(findings: list[Finding], runs: list[RunEvidence] | None = None) -> str:
    """One sentence for the top of the report (see the module docstring). ``runs`` (the subject runs' evidence)
    adds the GPU idle share to an inconclusive verdict; when one of them has fewer traced ranks than its world size,
    the verdict starts with ``Partial: k of N ranks traced`` (:func:`partial_text`). A run that died (a finding of
    :data:`~traceanalyze.findings.DIED_KINDS`) says so before anything else: ``Run died: ...``
    (:func:`~traceanalyze.diagnose.oom.died_verdict`)."""
    died = died_verdict(findings)
    if died is not None:
        return died
    part = next((p for e in runs or [] if (p := partial_run(e, findings)) is not None), None)
    body = _verdict_body(findings, runs, part is not None)
    return body if part is None else f"{partial_text(part)}. {body}"


def _waiting_text(findings: list[Finding], runs: list[RunEvidence] | None) -> str | None:
    """The verdict when no finding reaches medium severity while the ranks wait :data:`WAIT_VERDICT_PCT` % of their
    step or more at collectives for the same rank(s) (:func:`~traceanalyze.diagnose.imbalance.late_arrivals`: in
    more than half the steps): such a run is not healthy, whatever the what-ifs price. Waits that move from rank to
    rank (ranks that share cores) name no one and leave the verdict alone. None otherwise."""
    for ev in runs or []:
        a = late_arrivals(ev)
        if a is None or a.impact < WAIT_VERDICT_PCT:
            continue
        who = ", ".join(str(r) for r in sorted(a.late))
        named = next((f for f in findings if f.run == ev.name and f.cause == "imbalance"
                      and set(f.ranks) & set(a.late)), None)
        return (f"Not healthy: the other ranks wait {a.impact:.0f}% of their step in collectives for rank"
                f"{'s' if len(a.late) > 1 else ''} {who}"
                + (f" ({_lower(headline(named.title))})" if named is not None else "")
                + "; no fix the what-if replay prices reaches medium severity: see who waited for whom (the "
                "collective skew) and trace several steps on every rank to see what comes before the wait.")
    return None


def _verdict_body(findings: list[Finding], runs: list[RunEvidence] | None, partial: bool) -> str:
    """The verdict after its ``Partial:`` prefix (:func:`verdict`), and the first memory finding of medium or high
    severity after it (memory does not slow the step: it never is the main cause). A config fault that changes
    what is trained (a finding with an ``effect``, medium or high) leads it (:func:`fault_text`) unless a step-time
    finding of medium or high severity does; then it follows that one, as ``Also a config fault: ...``. A fault
    that the comparison with a baseline states too (a finding of its kind without ``effect``) is left to that one."""
    mem = next((f for f in findings if f.kind in MEMORY_KINDS and f.severity in ("high", "medium")), None)
    timed = [f for f in findings if f.kind not in MEMORY_KINDS and f.effect is None]
    body = _slowdown_text(timed, runs, partial)
    fault = next((f for f in findings if f.effect is not None and f.severity in ("high", "medium")
                  and not any(g.kind == f.kind and g.run == f.run and g.effect is None for g in timed)), None)
    if fault is not None and not any(f.severity in ("high", "medium") for f in timed):
        rest = "No step-time cause reaches medium severity." if body.startswith(NO_SLOWDOWN) else body
        body = f"{fault_text(fault)} {rest}"
    elif fault is not None:
        body = f"{body} Also a config fault: {fault_text(fault).removeprefix(CONFIG_FAULT)}"
    return body if mem is None else f"{body} Also: {mem.title}."


def fault_text(f: Finding) -> str:
    """``Config fault: <title> (<assumption>): <the fix>. It changes what is trained, not the step time: <effect>.``
    for a finding with an ``effect``."""
    cond = f" ({f.assumption})" if f.assumption else ""
    return (f"{CONFIG_FAULT}{f.title[0].lower()}{f.title[1:]}{cond}: {f.recommendation.split('; ')[0]}. It changes "
            f"what is trained, not the step time: {f.effect}.")


def _slowdown_text(findings: list[Finding], runs: list[RunEvidence] | None, partial: bool) -> str:
    """What slows the run: the verdict without its prefix and its memory note."""
    top = [f for f in findings if f.severity in ("high", "medium")]
    waits = None if top else _waiting_text(findings, runs)
    if waits is not None:
        return waits
    if not top and partial:  # a wait the missing ranks could explain, judged inconclusive, is no healthy run
        inc = next((f for f in findings if f.kind in PARTIAL_EXPLAINS and f.impact_pct >= MEDIUM), None)
        if inc is not None:
            return f"{inc.title}; no other finding reaches medium severity."
        return f"{NO_SLOWDOWN} in the traced ranks: no finding reaches medium severity."
    if not top:
        return f"{NO_SLOWDOWN}: no finding reaches medium severity."
    window = next((f for f in top if f.kind == "compile_overhead" and f.title.startswith(COMPILE_FILLS_TITLE)), None)
    if window is not None:
        return (f"Inconclusive: {window.title[0].lower()}{window.title[1:]}; profile after warm-up (a profiler "
                "schedule with the compile step in wait/warmup) and keep the compile cache warm "
                "(TORCHINDUCTOR_CACHE_DIR, the FX graph cache or torch.compiler's mega-cache).")
    inc = next((f for f in top if f.kind == "untraced_ranks"), None)
    if inc is not None and top[0].kind != "host_sync":
        ev = next((e for e in runs or [] if e.name == inc.run), None)
        s = inc.title + (f" ({len(ev.ranks)} of {ev.world_size} ranks traced)" if ev and ev.world_size
                         and not partial else "")
        if ev is not None and ev.mode == "gpu" and ev.ranks:  # a sentence of its own: one percentage each
            s += f". The GPU is idle {statistics.median(r['idle_pct'] for r in ev.ranks):.0f}%"
        other = next((f for f in top if f is not inc and f.cause != "interconnect" and f.kind not in AMPLIFIERS),
                     None)
        if other is not None:
            s += f". Also: {headline(other.title)}, {_saves(other)}"
        return s + "."
    f = top[0]
    if f.kind == "unexplained_idle":
        return f"Not healthy: {f.title[0].lower()}{f.title[1:]}; see the GPU idle breakdown and the timeline."
    if f.kind == "compile_overhead" and f.assumption:  # a one-time cost: no share of a job that is not stated
        return f"Main cause: config (compile overhead): {f.title} ({f.assumption})."
    # one percentage a sentence, what the fix wins back; the finding's own measures stay in its title and evidence
    s = f"Main cause: {f.cause} ({f.kind.replace('_', ' ')}): {headline(f.title)} — {_saves(f)}"
    if f.kind == "host_sync" and any(g.kind in SPECIFIC_CAUSES["host_sync"][0][:5] for g in top):
        s += "; the other ranks' wait in collectives is its symptom"
    s += f" ({f.assumption})." if f.assumption else "."
    for part in (g for g in top if g.part_of == f.kind and g.run == f.run):
        s += (f" Part of it: {_lower(headline(part.title))}; {PARTS[part.kind][1]} saves about "
              f"{part.impact_pct:.0f}%.")
    return s


# a measure inside a finding's title, which the verdict leaves to the finding: ": 33% of each step ...",
# " (16% of the step)", " takes 42% of the step on the host"
_TITLE_MEASURES = (re.compile(r"\s*\([^()]*\d%[^()]*\)"), re.compile(r"\s+takes [\d.]+% of (?:the|each) step[^,;:]*"))


def headline(title: str) -> str:
    """A finding's title without the measure it states (the verdict's one percentage is what the fix saves):
    ``Rank 1 is a straggler: the other ranks wait 28% of the step for it`` → ``Rank 1 is a straggler``."""
    head, sep, rest = title.partition(": ")
    if sep and "%" in rest and "%" not in head:
        return head
    for pat in _TITLE_MEASURES:
        title = pat.sub("", title)
    return title.strip()


def _lower(s: str) -> str:
    return s[:1].lower() + s[1:]


def _saves(f: Finding) -> str:
    """What fixing ``f`` wins back, as the verdict says it."""
    return f"fixing it saves about {f.impact_pct:.0f}% of step time"
