"""Imbalance rules: a straggler rank the others wait for, a rank idle while the others work."""

from __future__ import annotations

import statistics
import weakref
from dataclasses import dataclass

import numpy as np

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
    """Imbalance: a straggler the others wait for, from the work per step (:func:`straggler_by_work`, needs the
    excess to show in the per-step medians) or from the arrivals at each collective instance
    (:func:`straggler_by_arrival`, one step is enough). One finding per straggler: when both name the same rank the
    work finding keeps its figures and takes the arrival evidence; when they name different ranks the arrival one,
    which measures who kept whom waiting, is kept. A rank the late-entry rule names (:func:`rule_late_entry`: its
    work before the collective is balanced, its step begins late) is no straggler: balancing the work wins nothing."""
    entry = set(late_entry_ranks(ev))
    work = [f for f in straggler_by_work(ev) if not set(f.ranks) <= entry]
    late = [f for f in straggler_by_arrival(ev) if not set(f.ranks) <= entry]
    if not (work and late):
        return work or late
    w, a = work[0], late[0]
    if set(w.ranks) & set(a.ranks):
        w.evidence = [*w.evidence, *(x for x in a.evidence if x not in w.evidence and not x.startswith(_WHY_PREFIXES))]
        return [w]
    return [a]


_WHY_PREFIXES = ("per op against the median rank", "host gaps (no op", "largest host gaps on rank")


def straggler_by_work(ev: RunEvidence) -> list[Finding]:
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


def _late_steps_text(late: list[int], late_steps: dict[int, list[int]], steps: list[int]) -> list[str]:
    """Evidence: in how many steps the first of ``late`` arrives last (the same rank each time?), and the others."""
    main = late[0]
    if len(steps) >= 2:
        same = [st for st in steps if st in late_steps[main]]
        return [f"rank {main} arrives last and costs the others {LATE_WAIT_PCT:g}% or more in {len(same)} of "
                f"{len(steps)} steps" + ("" if len(late) == 1 else "; also " + ", ".join(
                    f"rank {x} in {len(late_steps[x])}" for x in late[1:]))
                + (" (the same rank each time)" if len(late) == 1 and len(same) == len(steps) else "")]
    return ["also late: " + ", ".join(f"rank {x}" for x in late[1:])] if len(late) > 1 else []


@dataclass
class Arrivals:
    """Who kept whom waiting in the analysed steps (:func:`late_arrivals`): the skew rows ``r`` and the rows analysed
    ``use``; ``cost`` (step, late rank) -> median over the other ranks of their wait for it / their step;
    ``late_steps``: late rank -> the steps its cost reached :data:`LATE_WAIT_PCT`; ``late``: the late ranks, the
    main one first; ``steps``: the analysed steps; ``impact``: the median over them of the late ranks' summed cost,
    % of the step."""

    r: dict
    use: np.ndarray
    cost: dict[tuple[int, int], float]
    late_steps: dict[int, list[int]]
    late: list[int]
    steps: list[int]
    impact: float


def union_us(spans: list[tuple[float, float]]) -> float:
    """µs covered by the union of the intervals ``spans`` ((from, to), µs): a rank that waits at several
    collectives in flight at once (gloo's buckets, queued while the first one waits) waits once."""
    total, end = 0.0, -np.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _analysed(r: dict) -> np.ndarray:
    """The skew rows the arrival rules analyse: those of counted steps, else of every step (a run with none
    counted)."""
    use = r["counted"].astype(bool) & (r["step"] >= 0) & np.isfinite(r["step_time_us"])
    return use if use.any() else (r["step"] >= 0) & np.isfinite(r["step_time_us"])


# late_arrivals(ev) per skew object (ev.skew): two rules, the late-entry test and the verdict each ask for it (four
# times a run, ~10 ms of Python each on 8 ranks). Kept while the skew lives (weakref.finalize drops the entry), with
# the other inputs it reads (the number of ranks, the mode) checked on each hit.
_ARRIVALS: dict[int, tuple[tuple[int, str], Arrivals | None]] = {}


def late_arrivals(ev: RunEvidence) -> Arrivals | None:
    """:func:`_late_arrivals` of ``ev``, computed once per skew object (the callers only read the result)."""
    sk = ev.skew
    if sk is None:
        return None
    key = (len(ev.ranks), ev.mode)
    hit = _ARRIVALS.get(id(sk))
    if hit is not None and hit[0] == key:
        return hit[1]
    a = _late_arrivals(ev)
    if hit is None:  # the first time this skew is seen: its entry goes with it
        try:
            weakref.finalize(sk, _ARRIVALS.pop, id(sk), None)
        except TypeError:  # an object without weak references (a test's stand-in): not kept
            return a
    _ARRIVALS[id(sk)] = (key, a)
    return a


def _late_arrivals(ev: RunEvidence) -> Arrivals | None:
    """The late ranks of the run from the arrivals at each collective instance (``ev.skew``,
    :mod:`traceanalyze.replay.skew`: per complete instance and rank, its arrival and its wait for the last arriver).
    Per counted step (every step with one when none is counted) and late rank L: each other rank's waits at the
    instances L arrived last, over that rank's step time; the *cost* is the median over the other ranks. The late
    ranks are those whose cost reaches :data:`LATE_WAIT_PCT` in more than half the steps; None when there is none,
    or more than :data:`LATE_MAX_RANKS_SHARE` of the ranks (a spread, not a late rank)."""
    sk = ev.skew
    if sk is None or not sk.n or len(ev.ranks) < 2 or ev.mode == "logs":
        return None
    r = sk.rows
    use = _analysed(r)
    if not use.any():
        return None
    cost: dict[tuple[int, int], float] = {}  # (step, late rank) -> median over the other ranks of wait / step
    per: dict[tuple[int, int, int], list] = {}  # (step, late rank, waiting rank) -> its waits (from, to) µs
    step_of: dict[tuple[int, int], float] = {}  # (step, rank) -> step time µs
    ranks_in: dict[int, set[int]] = {}  # step -> ranks with a call in it
    lasts: dict[int, set[int]] = {}  # step -> ranks that arrived last somewhere in it
    for st, rk, lr, w, t, at in zip(r["step"][use].tolist(), r["rank"][use].tolist(), r["last_rank"][use].tolist(),
                                    r["wait_us"][use].tolist(), r["step_time_us"][use].tolist(),
                                    r["arrival_us"][use].tolist(), strict=True):
        step_of[(st, rk)] = t
        ranks_in.setdefault(st, set()).add(rk)
        if rk != lr:
            per.setdefault((st, lr, rk), []).append((at, at + w))
            lasts.setdefault(st, set()).add(lr)
    for st, members in ranks_in.items():
        for lr in lasts.get(st, ()):
            shares = [union_us(per.get((st, lr, o), [])) / step_of[(st, o)] for o in members
                      if o != lr and step_of[(st, o)] > 0]
            if shares:
                cost[(st, lr)] = statistics.median(shares)
    late_steps: dict[int, list[int]] = {}  # late rank -> the steps it cost the others the threshold or more
    for (st, lr), c in cost.items():
        if 100 * c >= LATE_WAIT_PCT:
            late_steps.setdefault(lr, []).append(st)
    # a rank late in half the steps or fewer is the run's noise (who reaches a collective last varies), not a
    # straggler: one step names it alone, two need it late in both, three in two
    late_steps = {lr: v for lr, v in late_steps.items() if 2 * len(v) > len(ranks_in)}
    n_ranks = len(set(r["rank"].tolist()))
    if not late_steps or len(late_steps) > max(1, int(LATE_MAX_RANKS_SHARE * n_ranks)):
        return None
    late = sorted(late_steps, key=lambda x: (-len(late_steps[x]), -max(cost[(s, x)] for s in late_steps[x]), x))
    steps = sorted(ranks_in)
    per_step_cost = [sum(cost.get((st, lr), 0.0) for lr in late) for st in steps]
    return Arrivals(r, use, cost, late_steps, late, steps, round(100 * statistics.median(per_step_cost), 1))


def straggler_by_arrival(ev: RunEvidence) -> list[Finding]:
    """Imbalance: one rank (or a few) arrives last at collective instances and the others' wait there costs them
    :data:`LATE_WAIT_PCT` % of their step or more: named from a single step (:func:`late_arrivals`). Impact: the
    median over the analysed steps of the late ranks' summed cost in that step. The evidence names the instance
    that cost most (collective, offset into the step on the median waiting rank, the wait median and range over the
    other ranks), whether the same rank is last in every step, and why it was late (:func:`_straggler_where`)."""
    a = late_arrivals(ev)
    if a is None:
        return []
    r, use, late, impact, sk = a.r, a.use, a.late, a.impact, ev.skew
    main = late[0]
    evidence = _late_instance(r, use, main, a.late_steps[main], a.cost)
    evidence += _late_steps_text(late, a.late_steps, a.steps)
    waited = sk.waited_for_others_us
    evidence.append(f"over the run, rank {main} kept the others waiting {ms_text(sk.kept_others_waiting_us.get(main))} "
                    f"in total and waited {ms_text(waited.get(main, 0.0))} itself; the rank that waited most is rank "
                    f"{max(sorted(waited), key=lambda x: waited[x])} ({ms_text(max(waited.values()))})")
    med_wait = _median_wait_caused(r, use, main)
    where, host_idle = _straggler_where(ev, main, med_wait, _comp_excess(ev, main))
    evidence += where
    who = f"Rank {main}" if len(late) == 1 else "Ranks " + ", ".join(str(x) for x in sorted(late))
    coll = _top_collective(r, use, main)
    title = (f"{who} arrive{'s' if len(late) == 1 else ''} last at the {coll}: the other ranks wait {impact:.0f}% "
             "of the step for " + ("it" if len(late) == 1 else "them"))
    if host_idle:
        rec = (f"rank {main} reaches the {coll} late because its host is idle, not working: look at what it does in "
               "the gaps listed (data loading on that rank, logging, checkpointing or evaluation on one rank, a "
               "blocking .item()/sync, garbage collection) and move it off the step or give every rank the same")
    else:
        rec = (f"rank {main} reaches the {coll} late: the ops listed take longer there than on the median rank; "
               "balance the work before that collective across ranks (equal sequence lengths, tokens or samples per "
               "rank; for all_to_all, equal splits), move rank-specific work off the step, and check that device "
               "for throttling")
    return [Finding("imbalance", "straggler", severity(impact), impact, sorted(late), title, evidence, rec)]


@dataclass
class Entry:
    """How a late rank entered one step (µs, on the aligned clocks): ``lead``, its ``ProfilerStep`` begin after the
    other ranks' median begin; ``work``, its time from its begin to the instance where it kept the others waiting
    longest (its work before that collective), ``others_work`` the other ranks' median of the same; ``wait``, the
    others' median wait there; ``step_us``, their median step time; ``coll``, the collective."""

    step: int
    lead: float
    work: float
    others_work: float
    wait: float
    step_us: float
    coll: str

    @property
    def late_start(self) -> bool:
        """The wait comes from the late start: it is :data:`LATE_ENTRY_SHARE` of the others' wait or more and
        more than the rank's extra work before the collective."""
        return self.lead >= LATE_ENTRY_SHARE * self.wait and self.work - self.others_work < self.lead


def _waits_by_instance(r: dict, sel: np.ndarray, late: int) -> dict[int, float]:
    """Instance -> the other ranks' waits summed (µs) at the skew rows ``sel`` (rows where ``late`` arrived last)."""
    out: dict[int, float] = {}
    for i, w, rk in zip(r["instance_id"][sel].tolist(), r["wait_us"][sel].tolist(), r["rank"][sel].tolist(),
                        strict=True):
        if rk != late:
            out[i] = out.get(i, 0.0) + w
    return out


def _entry(r: dict, use: np.ndarray, late: int, step: int) -> Entry | None:
    """:class:`Entry` of rank ``late`` into ``step``, at the instance of that step where the others waited for it
    longest (summed over them); None when it kept nobody waiting there."""
    sel = use & (r["step"] == step) & (r["last_rank"] == late)
    inst_w = _waits_by_instance(r, sel, late)
    if not inst_w:
        return None
    top = max(sorted(inst_w), key=lambda i: inst_w[i])
    rows = np.flatnonzero(sel & (r["instance_id"] == top)).tolist()
    mine = [j for j in rows if int(r["rank"][j]) == late]
    others = [j for j in rows if int(r["rank"][j]) != late]
    if not mine or not others:
        return None
    off = {j: float(r["step_offset_us"][j]) for j in rows}
    begin = {j: float(r["arrival_us"][j]) - off[j] for j in rows}
    m = mine[0]
    return Entry(step, begin[m] - statistics.median(begin[j] for j in others), off[m],
                 statistics.median(off[j] for j in others), statistics.median(float(r["wait_us"][j]) for j in others),
                 statistics.median(float(r["step_time_us"][j]) for j in others), str(r["collective"][m]))


def _entries(a: Arrivals, rank: int) -> list[Entry]:
    """The rank's :class:`Entry` into each step it was late in (``a.late_steps``)."""
    return [x for st in a.late_steps.get(rank, []) if (x := _entry(a.r, a.use, rank, st)) is not None]


def late_entry_ranks(ev: RunEvidence, a: Arrivals | None = None) -> list[int]:
    """The late ranks (:func:`late_arrivals`) whose wait comes from entering the step late (:attr:`Entry.late_start`)
    in more than half the steps they were late in, main one first. ``a``: :func:`late_arrivals` when computed."""
    a = a if a is not None else late_arrivals(ev)
    if a is None:
        return []
    out = []
    for rank in a.late:
        ent = _entries(a, rank)
        if ent and 2 * sum(x.late_start for x in ent) > len(ent):
            out.append(rank)
    return out


def _tails(ev: RunEvidence, rank: int) -> dict[int, float]:
    """Step -> µs of host time on ``rank``'s step thread after its last op of the step, before the step ends (the
    gap that ends with the step: work after the optimizer that no op records), among its largest host gaps
    (``ev.host_gaps``)."""
    ends = {s["step"]: s["step_time_us"] for s in ev.steps_of(rank) if s.get("step_time_us")}
    return {g.step: g.dur_us for g in ev.host_gaps.get(rank, [])
            if g.step in ends and g.offset_us + g.dur_us >= ends[g.step] - 1.0}


def _entry_cause(ev: RunEvidence, a: Arrivals, main: int, ent: list[Entry]) -> tuple[list[str], bool]:
    """Evidence on where rank ``main``'s late start comes from, and whether the trace shows it (several steps, one
    ending with a gap that the next one's late start follows)."""
    tails = _tails(ev, main)
    others = [t for r in ev.ranks if r["rank"] != main for t in _tails(ev, r["rank"]).values()]
    ot = ms_text(statistics.median(others) if others else 0.0)
    lead_of = {x.step: x.lead for x in ent}
    # a gap that explains a late start is half of it or more
    chained = [(s, t) for s, t in sorted(tails.items()) if s + 1 in lead_of and t >= LATE_ENTRY_SHARE * lead_of[s + 1]]
    if chained and len(a.steps) >= 2:
        s, t = max(chained, key=lambda x: x[1])
        return [f"the cause is in the trace: rank {main}'s step {s} ends with {ms_text(t)} of host time after its "
                f"last op (after its optimizer step, before its step-end marker; the other ranks' largest such gap: "
                f"{ot}), and it begins step {s + 1} {ms_text(lead_of[s + 1])} after the others: work at the end of "
                f"one step on rank {main} only delays its entry into the next"], True
    out = [f"the delay comes from before the traced step{'s' if len(a.steps) > 1 else ''}: the step before's tail "
           f"(work after opt.step() on rank {main} only), an untraced stall (the data loader, the host) or the "
           f"profiler starting later on rank {main}; the trace holds {len(a.steps)} analysed step"
           f"{'s' if len(a.steps) > 1 else ''}, not what came before"]
    lead = max(lead_of.values())
    if tails and max(tails.values()) >= LATE_ENTRY_SHARE * lead:
        s, t = max(tails.items(), key=lambda x: x[1])
        out.append(f"rank {main}'s step {s} ends with {ms_text(t)} of host time after its last op (before its "
                   f"step-end marker; the other ranks' largest such gap: {ot}): the same work at the end of the step "
                   "before would explain its late start")
    return out, False


def rule_late_entry(ev: RunEvidence) -> list[Finding]:
    """Imbalance: ranks wait :data:`LATE_WAIT_PCT` % of their step or more at a collective for a rank that does no
    more work before it than they do but begins its step later (:func:`late_entry_ranks`): the wait comes from
    before the step (the step before's tail, an untraced stall, the profiler starting later), which equalising the
    work inside the step cannot win back. Impact: as the arrival rule's (:func:`late_arrivals`), for these ranks;
    priced by the ``aligned_step_starts`` what-if. With several steps traced, a gap at the end of one step of the
    late rank that its late start into the next follows is named as the cause."""
    a = late_arrivals(ev)
    late = late_entry_ranks(ev, a)
    if a is None or not late:
        return []
    main = late[0]
    ent = _entries(a, main)
    worst = max(ent, key=lambda x: (x.wait, -x.step))
    impact = round(100 * statistics.median(sum(a.cost.get((st, lr), 0.0) for lr in late) for st in a.steps), 1)
    st_t, from_start = max(worst.step_us, 1e-9), 100 * min(worst.lead, worst.wait) / max(worst.wait, 1e-9)
    evidence = [f"step {worst.step}: rank {main} begins its step {ms_text(worst.lead)} after the other ranks (median) "
                f"and reaches the {worst.coll} {ms_text(worst.work)} into it, the others {ms_text(worst.others_work)} "
                f"into theirs: the work before it is balanced; the others wait a median of {ms_text(worst.wait)} "
                f"there ({100 * worst.wait / st_t:.0f}% of their step), {from_start:.0f}% of it from the late start"]
    if len(ent) > 1:
        evidence.append(f"rank {main} begins its step {ms_text(min(x.lead for x in ent))}–"
                        f"{ms_text(max(x.lead for x in ent))} after the others in {len(ent)} of {len(a.steps)} steps")
    cause, chained = _entry_cause(ev, a, main, ent)
    evidence += cause + _late_instance(a.r, a.use, main, a.late_steps[main], a.cost)[:1]
    evidence.append("equalising the work inside the step (the no_straggler what-if) wins nothing back: the work "
                    f"before the {worst.coll} is already balanced")
    who = f"Rank {main}" if len(late) == 1 else "Ranks " + ", ".join(str(x) for x in sorted(late))
    title = (f"{who} enter{'s' if len(late) == 1 else ''} the step late: the other ranks wait {impact:.0f}% of their "
             f"step for {'it' if len(late) == 1 else 'them'} at the {worst.coll}")
    return [Finding("imbalance", "late_entry", severity(impact), impact, sorted(late), title, evidence,
                    _entry_advice(main, worst.coll, chained))]


def _entry_advice(main: int, coll: str, chained: bool) -> str:
    """The late-entry finding's recommendation: move the work between steps (named when the trace shows it), else
    trace what comes before the step."""
    fix = (f"move it off the step (a background thread or process, or outside the training loop every N steps) or do "
           "it on every rank; balancing the compute inside the step will not help, the work before the "
           f"{coll} is already balanced")
    if chained:
        return (f"rank {main} does work at the end of every step, after the optimizer (the gap before its step ends): "
                f"logging, evaluation, checkpointing or metrics on rank {main} only, which delays its entry into the "
                f"next step; {fix}")
    return (f"rank {main} begins the step late for a reason before the traced step: trace several steps on every rank "
            "(torch.profiler.schedule(wait=1, warmup=1, active=3): active ≥ 2, so that the step before is in the "
            "trace) and the data loader's time on each rank (its DataLoader __next__ ranges), and look at what rank "
            f"{main} does between steps (after opt.step(): logging, evaluation or checkpointing on one rank; its data "
            f"loader; the profiler starting later there); then {fix}")


LATE_ENTRY_SHARE = 0.5  # a late start this share of the others' wait or more (and more than extra work) explains it
LATE_WAIT_PCT = 10.0  # the others' wait for a late rank, median share of their step, that names it
LATE_MAX_RANKS_SHARE = 0.25  # more late ranks than this share of the ranks is a spread, not a straggler


def _late_instance(r: dict, use, late: int, steps: list[int], cost: dict) -> list[str]:
    """Evidence on the instance where rank ``late`` cost the others most (``r``: the skew rows, ``use`` the rows
    analysed): which collective, where in the step, the wait median and range over the other ranks, its own
    duration."""
    worst = max(steps, key=lambda s: (cost[(s, late)], -s))
    sel = use & (r["last_rank"] == late) & (r["step"] == worst)
    inst_w = _waits_by_instance(r, sel, late)
    top = max(sorted(inst_w), key=lambda i: inst_w[i])
    rows = np.flatnonzero(sel & (r["instance_id"] == top))
    others = [j for j in rows.tolist() if int(r["rank"][j]) != late]
    mine = next(j for j in rows.tolist() if int(r["rank"][j]) == late)
    waits = [float(r["wait_us"][j]) for j in others]
    offs = [float(r["step_offset_us"][j]) for j in others]
    steps_t = [float(r["step_time_us"][j]) for j in others]
    off, st_t = statistics.median(offs), max(statistics.median(steps_t), 1e-9)  # > 0: a cost was computed
    coll = str(r["collective"][mine])
    out = [f"step {worst}, {coll} (instance {top}, {len(rows)} ranks): rank {late} arrives last, "
           f"{ms_text(float(r['arrival_us'][mine]) - min(float(r['arrival_us'][j]) for j in others))} after the first; "
           f"the others wait a median of {ms_text(statistics.median(waits))} (range "
           f"{ms_text(min(waits))}–{ms_text(max(waits))}, median {100 * statistics.median(waits) / st_t:.0f}% of "
           f"their step); rank {late}'s own {coll} takes {float(r['dur_us'][mine]):,.0f} µs",
           f"where: the others reach it {ms_text(off)} into the step ({100 * off / st_t:.0f}% of the median waiting "
           f"rank's {ms_text(st_t)} step); rank {late} reaches it {ms_text(float(r['step_offset_us'][mine]))} into "
           "its own"]
    nxt = min(others, key=lambda j: (float(r["wait_us"][j]), int(r["rank"][j])))  # the next-to-last to arrive
    if min(waits) < 0.5 * statistics.median(waits):
        out.append(f"the next-to-last, rank {int(r['rank'][nxt])}, arrives {ms_text(min(waits))} before rank {late}: "
                   f"rank {late} arriving with it would save {ms_text(min(waits))} ({100 * min(waits) / st_t:.0f}% "
                   "of the step); the rest of the others' wait is a spread of arrivals across ranks (uneven work "
                   f"before the {coll} on every rank)")
    n_inst = len(inst_w)
    if n_inst > 1:
        out.append(f"rank {late} arrives last at {n_inst} instances of step {worst}; the one above costs most")
    return out


def _median_wait_caused(r: dict, use, late: int) -> float:
    """Median over the other ranks of the wait (µs per analysed step) they spent at instances ``late`` arrived
    last at."""
    sel = use & (r["last_rank"] == late) & (r["rank"] != late)
    if not sel.any():
        return 0.0
    n_steps = max(1, len(set(r["step"][use].tolist())))
    by: dict[int, float] = {}
    for rk, w in zip(r["rank"][sel].tolist(), r["wait_us"][sel].tolist(), strict=True):
        by[rk] = by.get(rk, 0.0) + w
    return statistics.median(by.values()) / n_steps


def _top_collective(r: dict, use, late: int) -> str:
    """The collective at which rank ``late`` kept the others waiting longest in total."""
    sel = use & (r["last_rank"] == late)
    by: dict[str, float] = {}
    for c, w in zip(r["collective"][sel].tolist(), r["wait_us"][sel].tolist(), strict=True):
        by[str(c)] = by.get(str(c), 0.0) + w
    return max(sorted(by), key=lambda c: by[c]) if by else "collective"


def _comp_excess(ev: RunEvidence, rank: int) -> float:
    """The rank's compute per step above the median rank's (µs)."""
    comp = {r["rank"]: per_step(ev, r, "compute_us") or 0.0 for r in ev.ranks}
    return comp.get(rank, 0.0) - statistics.median(comp.values()) if comp else 0.0


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
