"""Imbalance rules: a straggler rank the others wait for, a rank idle while the others work."""

from __future__ import annotations

import statistics

from traceanalyze.diagnose.evidence import (
    NOISE_SIGMAS,
    RunEvidence,
    ms_text,
    per_step,
    severity,
    step_noise_us,
    step_us,
    wait_per_step,
)
from traceanalyze.findings import Finding
from traceanalyze.fmt import short_name

STRAGGLER_EXCESS_PCT = 15.0  # slowest rank's compute above the median, % of the median
IDLE_RANK_PCT = 80.0


def rule_straggler(ev: RunEvidence) -> list[Finding]:
    """Imbalance: one rank works longer per step and the others wait for it in the collectives.

    Per rank, *work* = step time − time waiting in collectives for slower peers (the collectives' wait, see
    :mod:`traceanalyze.metrics.collectives`). The straggler has the most work; its excess over the median is
    what the others spend waiting, and what balancing would win back (impact = excess / step time). With matched
    collectives the rank must also arrive last at half of them or more (clock offsets applied). Without matched
    collectives, compute time per step stands in for work.
    """
    if len(ev.ranks) < 2 or ev.mode == "logs":
        return []
    step = {r["rank"]: step_us(ev, r) for r in ev.ranks}
    comp = {r["rank"]: per_step(ev, r, "compute_us") or 0.0 for r in ev.ranks}
    waits = wait_per_step(ev)
    work = {r: step[r] - waits.get(r, 0.0) for r in step} if waits else comp
    med = statistics.median(work.values())
    slow = max(work, key=work.get)
    step_med = statistics.median(step.values())
    if med <= 0 or step_med <= 0:
        return []
    excess = work[slow] - med
    excess_pct = 100 * excess / med
    impact = round(100 * excess / step_med, 1)
    if excess_pct < STRAGGLER_EXCESS_PCT or impact < 3:
        return []
    if waits and ev.coll.last_arrivals.get(slow, 0) < 0.5 * ev.coll.n_matched_calls:
        return []  # the others are not waiting for this rank: it does not arrive last at most collectives
    noise = step_noise_us(ev)
    sev = severity(impact)
    if noise is not None and excess <= NOISE_SIGMAS * noise:
        sev = "low"  # a rank that is slower by less than the run's step-to-step noise is no straggler to chase
    comp_med = statistics.median(comp.values())
    evidence = [f"rank {slow} works {ms_text(work[slow])} per step (outside collective waits) vs a median of "
                f"{ms_text(med)} (+{excess_pct:.0f}%); compute {ms_text(comp[slow])} vs median {ms_text(comp_med)}"]
    where, host_idle = _straggler_where(ev, slow, excess, comp[slow] - comp_med)
    evidence += where
    if waits:
        others = [w for r, w in waits.items() if r != slow]
        evidence.append(f"the other ranks wait a mean of {ms_text(statistics.mean(others))} per step in collectives; "
                        f"rank {slow} waits {ms_text(waits.get(slow, 0.0))}")
        last = ev.coll.last_arrivals.get(slow, 0)
        evidence.append(f"rank {slow} arrives last at {last} of {ev.coll.n_matched_calls} matched collectives")
    if host_idle:
        rec = (f"rank {slow}'s extra time is idle host time, not work: look at what its host does in the gaps listed "
               "(the export marks them): data loading on that rank, logging, checkpointing or evaluation on rank "
               f"{slow} only, a blocking .item()/sync, garbage collection; move that work off the training step or "
               "give every rank the same")
    else:
        rec = (f"rank {slow} does more work: the ops listed take longer there than on the median rank; balance data "
               "across ranks (equal sequence lengths / bucketing per rank), move rank-specific work such as "
               "evaluation, logging or checkpointing off the training step, and check that device for throttling")
    if sev == "low":
        evidence.append(f"its excess {ms_text(excess)} per step is within {NOISE_SIGMAS:g} standard deviations of this "
                        f"run's step times (σ {ms_text(noise)}): may be noise; not worth a ticket on this evidence")
    return [Finding("imbalance", "straggler", sev, impact, [slow],
                    f"Rank {slow} is a straggler: the other ranks wait {impact:.0f}% of the step for it",
                    evidence, rec)]


def _straggler_where(ev: RunEvidence, slow: int, excess_us: float, comp_excess_us: float) -> tuple[list[str], bool]:
    """Evidence lines on where rank ``slow`` spends its extra time (per-op difference against the median rank, its
    largest host gaps with their time ranges) and whether that time is idle host time rather than work: its host
    gaps per step exceed the median rank's by more than its extra compute does."""
    out: list[str] = []
    ops = ev.rank_ops
    if ops.get(slow) and len(ops) >= 2:
        names = {n for d in ops.values() for n in d}
        diffs = []
        for n in names:
            med = statistics.median(d.get(n, 0.0) for d in ops.values())
            diffs.append((ops[slow].get(n, 0.0) - med, n, med))
        diffs.sort(key=lambda t: (-t[0], t[1]))
        top = [t for t in diffs if t[0] > 0.02 * max(excess_us, 1.0)][:3]
        if top:
            out.append("per op against the median rank (per step): " + "; ".join(
                f"{short_name(n, 60)} {ms_text(ops[slow].get(n, 0.0))} vs {ms_text(m)} (+{ms_text(d)})"
                for d, n, m in top))
    host_idle = False
    gaps = ev.gap_us_per_step
    if slow in gaps and len(gaps) >= 2:
        med_gap = statistics.median(gaps.values())
        gap_excess = gaps[slow] - med_gap
        host_idle = gap_excess > max(comp_excess_us, 0.0) and gap_excess > 0.25 * excess_us
        out.append("host gaps (no op, annotation or runtime call on the step thread): "
                   f"{ms_text(gaps[slow])} per step on "
                   f"rank {slow} vs a median of {ms_text(med_gap)}")
    if ev.host_gaps.get(slow):
        out.append(f"largest host gaps on rank {slow}: " + "; ".join(
            f"step {g.step} +{g.offset_us / 1e3:,.1f}–{(g.offset_us + g.dur_us) / 1e3:,.1f} ms ({ms_text(g.dur_us)})"
            for g in ev.host_gaps[slow][:3]) + " (from the step's start)")
    return out, host_idle


def rule_idle_rank(ev: RunEvidence) -> list[Finding]:
    """Imbalance: a rank idle most of the window while the others work (trace), or near-zero MFU (logs)."""
    out = []
    if len(ev.ranks) >= 2 and ev.mode == "gpu":
        for r in ev.ranks:
            others = [o["idle_pct"] for o in ev.ranks if o["rank"] != r["rank"]]
            if r["idle_pct"] >= IDLE_RANK_PCT and statistics.median(others) < 50:
                impact = round(100 / max(ev.world_size or len(ev.ranks), 1), 1)
                out.append(Finding("imbalance", "idle_rank", severity(impact), impact, [r["rank"]],
                                   f"Rank {r['rank']} is idle {r['idle_pct']:.0f}% of the time",
                                   [f"rank {r['rank']} idle {r['idle_pct']:.1f}% vs a median of "
                                    f"{statistics.median(others):.1f}% on the other ranks"],
                                   "check that rank's data shard and device placement (a GPU doing no work still "
                                   "holds the job back); see its top kernels"))
    per_rank: dict[int, list[float]] = {}
    for s in ev.log_steps:
        if s.rank is not None and s.mfu_pct is not None:
            per_rank.setdefault(s.rank, []).append(s.mfu_pct)
    if len(per_rank) >= 2:
        mfu = {r: statistics.median(v) for r, v in per_rank.items()}
        med = statistics.median(mfu.values())
        for r, v in mfu.items():
            if med > 0 and v < 0.2 * med:
                impact = round(100 / max(ev.world_size or len(mfu), len(mfu)), 1)
                out.append(Finding("imbalance", "idle_rank", severity(impact), impact, [r],
                                   f"Rank {r} is barely used: MFU {v:.1f}% vs a median of {med:.1f}%",
                                   [f"log: rank {r} mfu {v:.2f}% (median of {len(mfu)} ranks {med:.2f}%)"],
                                   "check that rank's device and data shard; a rank that does almost no work "
                                   "wastes its share of the job"))
    return out
