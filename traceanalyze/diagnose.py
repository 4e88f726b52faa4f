"""Diagnose: rules that turn a run's metrics and its logs into ranked *findings*.

A finding has ``cause`` ∈ {interconnect, precision, imbalance, config}, a finer ``kind``, a ``severity``
(high / medium / low), ``impact_pct`` (the estimated share of step time that fixing it would win back),
``ranks``, a one-line ``title``, ``evidence`` (the numbers behind it) and a ``recommendation``. Findings are
ranked by impact. Severity follows impact: ≥ 25 % high, ≥ 10 % medium, else low; a healthy run gets no
high-severity finding. Two exceptions say what they are in their evidence: a CPU precision estimate whose gain per
step is below :data:`CPU_PRECISION_TICKET_PCT` or within the run's own step-to-step noise is low (not worth a
ticket on this evidence; a straggler within that noise too), and a GPU idle above
:data:`IDLE_EXPLAIN_PCT` that no finding explains gets a medium ``unexplained_idle`` finding (never "healthy").

:func:`verdict` turns the ranked findings into the report's first sentence: "Inconclusive: ..." when the traced
ranks wait in collectives for ranks whose traces are missing, "Main cause: ..." for the top finding of high or
medium severity (with the assumption it rests on, when it has one), else "No significant slowdown found".

Each rule is a plain function ``rule(ev: RunEvidence) -> list[Finding]``; :data:`RULES` lists them. The
thresholds are module constants so they read as configuration.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from dataclasses import replace as dataclasses_replace

from traceanalyze import hardware
from traceanalyze.findings import Finding
from traceanalyze.fmt import ranges, short_name
from traceanalyze.hardware import GpuInfo
from traceanalyze.metrics.collectives import CollectiveAnalysis
from traceanalyze.metrics.host import CompileStats, LaunchStats, LoaderStats
from traceanalyze.metrics.precision import PrecisionMix
from traceanalyze.replay.whatif import CPU_BF16_SPEEDUP  # the speed-up the what-if replay assumes at most

HIGH, MEDIUM = 25.0, 10.0  # impact % thresholds for severity
MIN_EXPOSED_COMM_PCT = 10.0  # exposed transfer share of step worth a finding
STRAGGLER_EXCESS_PCT = 15.0  # slowest rank's compute above the median, % of the median
MIN_FP32_SHARE = 50.0  # % of matrix-math time in fp32 without tensor cores
MIN_COMPILE_PCT = 10.0
COMPILE_HORIZON_STEPS = 1000  # job length assumed when logs do not state total_optimization_steps
MIN_LOADER_PCT = 10.0
IDLE_RANK_PCT = 80.0
GPU_FP32_SPEEDUP_DEFAULT = 4.0  # bf16 tensor cores vs fp32 CUDA cores, conservative (peaks differ 8-16x)
CPU_PRECISION_TICKET_PCT = 20.0  # CPU bf16 gain (an assumed speedup the trace cannot confirm) worth a ticket
NOISE_SIGMAS = 2.0  # a CPU precision gain per step must exceed this many standard deviations of the step times
MIN_UNTRACED_WAIT_PCT = 10.0  # share of the step the traced ranks wait for untraced ones worth an inconclusive verdict
IDLE_EXPLAIN_PCT = 50.0  # a GPU idle above this is never healthy without a finding that explains it
HOST_BOUND_IDLE_PCT = 40.0  # GPU idle from which host wait is looked at
HOST_BOUND_WAIT_PCT = 50.0  # host wait share of the busiest stream's idle that makes a step host-bound
TINY_KERNEL_US = 20.0  # median kernel at or below this: the host's launches, not its other work, set the pace
COMPILE_STEP_RATIO = 3.0  # a first step this many times the steady one, with compile ranges, is the compile step
IDLE_EXPLAINERS = ("slow_collectives", "topology", "untraced_ranks", "straggler", "idle_rank", "dataloader",
                   "launch_bound", "host_bound", "compile_overhead")
CPU_PRECISION_ADVICE = ("on a CPU with AMX or AVX512-BF16 (lscpu | grep -E 'amx|avx512_bf16'), run the step under "
                        "torch.autocast('cpu', dtype=torch.bfloat16) (bf16: true / --bf16 in a trainer config); "
                        "without them bf16 matmuls are emulated and can be slower than fp32: keep fp32 there")


@dataclass
class RunEvidence:
    """Everything the rules read about one run. Times in µs unless the name says otherwise."""

    name: str
    mode: str  # gpu | cpu | logs
    world_size: int | None
    gpu_model: str | None
    ranks: list[dict]
    steps: list[dict]
    step_time_us: float | None
    coll: CollectiveAnalysis | None = None
    prec: PrecisionMix | None = None
    compile: CompileStats | None = None
    loader: LoaderStats | None = None
    launch: LaunchStats | None = None
    facts: dict[str, list] = field(default_factory=dict)  # key -> [logs.Fact]
    log_steps: list = field(default_factory=list)  # [logs.LogStep]
    nccl: object | None = None  # logs.NcclInfo
    topology: object | None = None  # logs.Topology
    link: dict = field(default_factory=dict)  # {"expected_gbps", "source"}
    idle: list[dict] = field(default_factory=list)  # GPU idle breakdown per rank and stream (metrics.idle)
    gpu: GpuInfo = field(default_factory=GpuInfo)  # name and compute capability (traceanalyze.hardware)
    rank_ops: dict[int, dict[str, float]] = field(default_factory=dict)  # rank -> op -> µs per step (metrics.where)
    host_gaps: dict[int, list] = field(default_factory=dict)  # rank -> largest [metrics.where.HostGap]
    gap_us_per_step: dict[int, float] = field(default_factory=dict)  # rank -> host gap µs per counted step
    compile_step: int | None = None  # the profiler step that holds torch.compile (left out of step times)
    # steps grouped by rank, made on first use (the rules ask per rank: one pass over the steps, not one per rank)
    _by_rank: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def steps_of(self, rank: int) -> list[dict]:
        """The rank's rows of ``steps``, in their order (``[]`` for a rank without steps)."""
        key = (id(self.steps), len(self.steps))
        if self._by_rank is None or self._by_rank[0] != key:  # built again if ``steps`` was replaced or grew
            by: dict[int, list[dict]] = {}
            for st in self.steps:
                by.setdefault(st["rank"], []).append(st)
            self._by_rank = (key, by)
        return self._by_rank[1].get(rank, [])

    def fact(self, key: str):
        """The first stated value of a fact (its ``num`` when numeric, else its text), or None."""
        fs = self.facts.get(key) or []
        if not fs:
            return None
        return fs[0].num if fs[0].num is not None else fs[0].value


def severity(impact: float) -> str:
    """high / medium / low from an impact % (module thresholds)."""
    return "high" if impact >= HIGH else "medium" if impact >= MEDIUM else "low"


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:,.1f} ms"


def _rank_steps(ev: RunEvidence, rank: int) -> list[dict]:
    """The rank's counted steps, the compile step left out when there are others."""
    rs = ev.steps_of(rank)
    steady = [s for s in rs if s["step"] != ev.compile_step]
    return steady or rs


def _per_step(ev: RunEvidence, r: dict, key: str) -> float | None:
    """A rank's µs of ``key`` per counted profiler step (median over its steps, as its step time; the compile step
    left out), else over its whole window."""
    rs = _rank_steps(ev, r["rank"])
    if rs and key in rs[0]:
        return statistics.median(s[key] for s in rs)
    return r.get(key)


def _step_us(ev: RunEvidence, r: dict) -> float:
    rs = _rank_steps(ev, r["rank"]) if ev.compile_step is not None else []
    if rs:
        return statistics.median(s["step_time_us"] for s in rs)
    return r.get("step_time_us") or r.get("window_us") or 0.0


def compile_step_of(steps: list[dict], compile_stats: CompileStats | None) -> int | None:
    """The profiler step that holds torch.compile: the first counted step number when the trace has compile ranges
    and that step takes :data:`COMPILE_STEP_RATIO` × the steady step or more, and other steps exist; else None.
    ``steps`` are step rows (``step``, ``step_time_us``)."""
    c = compile_stats
    numbers = sorted({s["step"] for s in steps})
    if (c is None or not c.compile_us or len(numbers) < 2 or not c.first_step_us or not c.steady_step_us
            or c.first_step_us < COMPILE_STEP_RATIO * c.steady_step_us):
        return None
    return numbers[0]


def step_stat(n: int) -> str:
    """How a step time over ``n`` steps was taken, in words: a median needs three values to differ from a mean."""
    return f"median of {n} steps" if n >= 3 else "mean of 2 steps" if n == 2 else "1 step" if n == 1 else "no step"


# ---------------------------------------------------------------------------------------------------------
# Rules

def rule_exposed_communication(ev: RunEvidence) -> list[Finding]:
    """Interconnect: communication transfer time not hidden under compute is a large share of the step."""
    if not ev.ranks or ev.mode == "logs":
        return []
    rows = []
    for r in ev.ranks:
        exposed = _per_step(ev, r, "exposed_comm_us") or 0.0
        step = _step_us(ev, r) if ev.steps else r["window_us"]
        n_steps = max(1, r.get("n_steps") or 1)
        wait = (ev.coll.wait_us.get(r["rank"], 0.0) / n_steps) if ev.coll and ev.coll.matched and ev.steps else 0.0
        if not ev.steps and ev.coll and ev.coll.matched:
            wait = ev.coll.wait_us.get(r["rank"], 0.0)
        transfer = max(0.0, exposed - wait)
        rows.append((r["rank"], exposed, transfer, step))
    shares = [100 * t / s for _, _, t, s in rows if s > 0]
    if not shares:
        return []
    share = statistics.median(shares)
    if share < MIN_EXPOSED_COMM_PCT:
        return []
    exposed_med = statistics.median(e for _, e, _, _ in rows)
    step_med = statistics.median(s for _, _, _, s in rows)
    evidence = [f"exposed communication {_ms(exposed_med)} of {_ms(step_med)} per step "
                f"(median over {len(rows)} rank(s)); transfer not explained by waiting for a slower rank: "
                f"{share:.1f}% of the step"]
    overlaps = [r["comm_comp_overlap_pct"] for r in ev.ranks]
    evidence.append(f"comm/compute overlap {statistics.median(overlaps):.1f}% "
                    "(share of communication time hidden under compute)")
    if ev.coll and not ev.coll.matched:
        evidence.append("only one rank's trace: waiting for peers cannot be separated from transfer, so this is an "
                        "upper bound")
    elif ev.world_size and ev.world_size > len(ev.ranks):
        evidence.append(f"{len(ev.ranks)} of {ev.world_size} ranks traced: waiting for the untraced ranks cannot be "
                        "separated from transfer, so this is an upper bound")
    expected = ev.link.get("expected_gbps")
    kind = "slow_collectives"
    if ev.coll and ev.coll.busbw_gbps is not None:
        s = f"measured busbw {ev.coll.busbw_gbps:.3g} GB/s over {ev.coll.total_bytes / 1e6:,.1f} MB of collectives"
        if expected:
            s += f"; expected {expected:g} GB/s ({ev.link.get('source')}): {100 * ev.coll.busbw_gbps / expected:.0f}%"
        evidence.append(s)
        for c in (ev.coll.summaries or [])[:3]:
            if c.size_bytes:
                evidence.append(f"{c.collective} of {c.size_bytes / 1e6:,.2f} MB × {c.count}: transfer "
                                f"{_ms(c.transfer_us)}, busbw {c.busbw_gbps or 0:.3g} GB/s, wait {_ms(c.wait_us)}")
    transport = _transport_note(ev)
    if transport:
        evidence.append(transport)
    topo_pairs = _slow_topology_pairs(ev)
    if topo_pairs:
        kind = "topology"
        evidence.append("GPU links: " + ", ".join(f"{a}–{b} {lk}" for a, b, lk in topo_pairs[:4]))
    rec = _interconnect_recommendation(ev, topo_pairs)
    impact = round(share, 1)
    return [Finding("interconnect", kind, severity(impact), impact, [r for r, *_ in rows],
                    f"Communication is exposed: {share:.0f}% of the step waits on collectives' transfer",
                    evidence, rec)]


def _transport_note(ev: RunEvidence) -> str | None:
    n = ev.nccl
    if n is None or not getattr(n, "channels", None):
        return None
    counts = n.transports()
    details = sorted({c.detail for c in n.channels})
    return (f"NCCL {n.version or ''} transports: " + ", ".join(f"{t} ×{k}" for t, k in counts.most_common())
            + f" ({', '.join(details[:3])})")


def _slow_topology_pairs(ev: RunEvidence) -> list[tuple[str, str, str]]:
    t = ev.topology
    if t is None:
        return []
    gpus = t.gpus
    if ev.world_size and ev.world_size <= len(gpus):
        gpus = gpus[: ev.world_size]
    out = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            lk = t.link(a, b)
            if lk and not lk.startswith("NV"):
                out.append((a, b, lk))
    return out


def _interconnect_recommendation(ev: RunEvidence, topo_pairs) -> str:
    if topo_pairs:
        t = ev.topology
        pix = [(a, b) for a, b, lk in topo_pairs if lk in ("PIX", "PXB")]
        far = [(a, b, lk) for a, b, lk in topo_pairs if lk in ("NODE", "SYS", "PHB")]
        parts = []
        if pix:
            a, b = pix[0]
            parts.append(f"pair {a} with {b}, which share a PCIe switch ({t.link(a, b)}): run 2-GPU jobs on them "
                         f"(CUDA_VISIBLE_DEVICES={a[3:]},{b[3:]})")
        if far:
            a, b, lk = far[0]
            parts.append(f"avoid splitting the job across {a} and {b} ({lk}: traffic crosses the CPU)")
        parts.append("use NVLink-connected GPUs for data parallelism, or cut communication: larger DDP buckets, "
                     "gradient accumulation with no_sync(), FSDP/ZeRO only where memory needs it")
        return "; ".join(parts)
    n = ev.nccl
    if n is not None and any(c.transport == "NET" and "Socket" in c.detail for c in getattr(n, "channels", [])):
        return ("NCCL is moving data over TCP sockets (NET/Socket): use InfiniBand/RoCE (check NCCL_IB_DISABLE, "
                "NCCL_IB_HCA, NCCL_NET_GDR_LEVEL) or keep the job on one NVLink node; overlap the all-reduce with "
                "backward (DDP buckets) and accumulate gradients with no_sync()")
    if ev.mode == "cpu":
        return ("the gradient all-reduce is bound by the network between ranks: put ranks on a faster link, "
                "reduce what is sent (bf16 gradients via a DDP comm hook, fewer/larger buckets), and accumulate "
                "gradients locally with no_sync() so fewer all-reduces run")
    return ("check the link between GPUs (nvidia-smi topo -m, NCCL_DEBUG=INFO for the transport), overlap "
            "communication with compute (DDP bucket_cap_mb, FSDP prefetch), and reduce its volume (gradient "
            f"compression: DDP {hardware.grad_compression_hook(ev.gpu)}, gradient accumulation with no_sync())")


def _wait_per_step(ev: RunEvidence, window: bool = False) -> dict[int, float]:
    """Per traced rank, µs per counted step spent in collectives waiting for peers (matched collectives only): the
    mean over its steady steps of the collectives inside each step, or with ``window`` (or without per-step
    figures) the whole trace window's wait over its number of counted steps, as the exposed-communication rule
    counts it (a GPU runs a step's collectives after the host has left it)."""
    if not (ev.coll and ev.coll.matched):
        return {}
    out = {}
    by_rank: dict[int, list[tuple[int, float]]] = {}  # rank -> (step, wait): one pass, not one per rank
    for (rk, st), w in ev.coll.per_step_wait_us.items():
        by_rank.setdefault(rk, []).append((st, w))
    for r in ev.ranks:
        n = max(1, r.get("n_steps") or 1)
        steady = {s["step"] for s in _rank_steps(ev, r["rank"])}
        per = [w for st, w in by_rank.get(r["rank"], []) if st in steady]
        if per and not window:
            out[r["rank"]] = sum(per) / max(1, len(steady))
        else:
            out[r["rank"]] = ev.coll.wait_us.get(r["rank"], 0.0) / n
    return out


def rule_untraced_ranks(ev: RunEvidence) -> list[Finding]:
    """Imbalance, inconclusive: the traces hold only some of the job's ranks and every traced rank waits in its
    collectives for peers a large share of each step, so the rank that holds the job back is among the missing
    ones. The exposed-communication rule takes that wait out of transfer time, so without this rule the wait
    would vanish from the report. Impact = the median traced rank's wait per step / its step time.

    When the traced ranks arrive together and all wait for a missing rank, their wait looks like transfer (the
    shortest duration across the traced ranks): then exposed communication of :data:`MIN_EXPOSED_COMM_PCT` % of
    the step or more is inconclusive too, as waiting for untraced ranks and transfer cannot be told apart."""
    traced = {r["rank"] for r in ev.ranks}
    if ev.mode == "logs" or not ev.world_size or ev.world_size <= len(traced) or len(traced) < 2:
        return []
    waits = _wait_per_step(ev, window=True)
    if not waits:
        return []
    shares = {r["rank"]: 100 * waits.get(r["rank"], 0.0) / s for r in ev.ranks if (s := _step_us(ev, r)) > 0}
    if not shares:
        return []
    share = statistics.median(shares.values())
    exposed = statistics.median(100 * (_per_step(ev, r, "exposed_comm_us") or 0.0) / s
                                for r in ev.ranks if (s := _step_us(ev, r)) > 0)
    # a traced rank that hardly waits is the straggler among the traced ones: rule_straggler's case, not this one
    waits_all = share >= MIN_UNTRACED_WAIT_PCT and min(shares.values()) >= MIN_UNTRACED_WAIT_PCT / 2
    if not waits_all and (exposed < MIN_EXPOSED_COMM_PCT or share >= MIN_UNTRACED_WAIT_PCT):
        return []
    idle = statistics.median(r["idle_pct"] for r in ev.ranks)
    missing = ev.world_size - len(traced)
    evidence = [f"{len(traced)} of {ev.world_size} ranks traced (ranks {ranges(sorted(traced))}); {missing} "
                "have no trace here",
                "collective wait per step: " + ", ".join(f"rank {r} {_ms(waits[r])} ({shares[r]:.0f}% of its step)"
                                                         for r in sorted(shares)[:8]),
                f"every traced rank waits: the rank they wait for is not in these traces; "
                f"{'GPU' if ev.mode == 'gpu' else 'training thread'} idle {idle:.0f}% (median over traced ranks)"]
    if waits_all:
        impact = round(share, 1)
        title = f"Inconclusive: {share:.0f}% of each step waits in collectives for ranks not in these traces"
    else:
        impact = round(exposed, 1)
        title = (f"Inconclusive: {exposed:.0f}% of each step is exposed communication with ranks not in these "
                 "traces, where waiting for them cannot be told from transfer")
        evidence[2] = (f"the traced ranks arrive together at their collectives (each waits {max(shares.values()):.0f}% "
                       "of its step at most for another traced rank): a rank they all wait for would look like "
                       "transfer; exposed communication is "
                       f"{exposed:.0f}% of the step (median over traced ranks)")
    return [Finding("imbalance", "untraced_ranks", severity(impact), impact, sorted(traced), title, evidence,
                    "trace every rank of the job (or the ranks that arrive last at the collectives) in one profiling "
                    "window: the slow rank, its cause, and whether the rest is transfer can only be told with "
                    "its trace; until then treat the other findings as partial")]


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
    step = {r["rank"]: _step_us(ev, r) for r in ev.ranks}
    comp = {r["rank"]: _per_step(ev, r, "compute_us") or 0.0 for r in ev.ranks}
    waits = _wait_per_step(ev)
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
    noise = _step_noise_us(ev)
    sev = severity(impact)
    if noise is not None and excess <= NOISE_SIGMAS * noise:
        sev = "low"  # a rank that is slower by less than the run's step-to-step noise is no straggler to chase
    comp_med = statistics.median(comp.values())
    evidence = [f"rank {slow} works {_ms(work[slow])} per step (outside collective waits) vs a median of "
                f"{_ms(med)} (+{excess_pct:.0f}%); compute {_ms(comp[slow])} vs median {_ms(comp_med)}"]
    where, host_idle = _straggler_where(ev, slow, excess, comp[slow] - comp_med)
    evidence += where
    if waits:
        others = [w for r, w in waits.items() if r != slow]
        evidence.append(f"the other ranks wait a mean of {_ms(statistics.mean(others))} per step in collectives; "
                        f"rank {slow} waits {_ms(waits.get(slow, 0.0))}")
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
        evidence.append(f"its excess {_ms(excess)} per step is within {NOISE_SIGMAS:g} standard deviations of this "
                        f"run's step times (σ {_ms(noise)}): may be noise; not worth a ticket on this evidence")
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
                f"{short_name(n, 60)} {_ms(ops[slow].get(n, 0.0))} vs {_ms(m)} (+{_ms(d)})" for d, n, m in top))
    host_idle = False
    gaps = ev.gap_us_per_step
    if slow in gaps and len(gaps) >= 2:
        med_gap = statistics.median(gaps.values())
        gap_excess = gaps[slow] - med_gap
        host_idle = gap_excess > max(comp_excess_us, 0.0) and gap_excess > 0.25 * excess_us
        out.append(f"host gaps (no op, annotation or runtime call on the step thread): {_ms(gaps[slow])} per step on "
                   f"rank {slow} vs a median of {_ms(med_gap)}")
    if ev.host_gaps.get(slow):
        out.append(f"largest host gaps on rank {slow}: " + "; ".join(
            f"step {g.step} +{g.offset_us / 1e3:,.1f}–{(g.offset_us + g.dur_us) / 1e3:,.1f} ms ({_ms(g.dur_us)})"
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


def rule_precision(ev: RunEvidence) -> list[Finding]:
    """Precision: most matrix-math time runs in fp32 without tensor cores."""
    p = ev.prec
    if p is None or p.gemm_time_us <= 0 or p.fp32_share_pct < MIN_FP32_SHARE:
        return []
    busy = statistics.median(r["compute_us"] for r in ev.ranks) if ev.ranks else 0
    n_ranks = max(1, len(ev.ranks))
    gemm_per_rank = p.gemm_time_us / n_ranks
    fp32_us = gemm_per_rank * p.fp32_share_pct / 100
    if ev.mode == "gpu":
        k = GPU_FP32_SPEEDUP_DEFAULT
        hi, lo = (hardware.peak_tflops(ev.gpu_model, hardware.half_dtype(ev.gpu)),
                  hardware.peak_tflops(ev.gpu_model, "fp32"))
        if hi and lo:
            k = min(max(hi / lo / 2, 2.0), 8.0)  # half the peak ratio: memory-bound parts gain less
    else:
        k = CPU_BF16_SPEEDUP
    window = statistics.median(r["window_us"] for r in ev.ranks) if ev.ranks else 0
    impact = round(100 * fp32_us * (1 - 1 / k) / window, 1) if window else 0.0
    evidence = [f"{p.fp32_share_pct:.0f}% of matrix-math time ({_ms(p.gemm_time_us / n_ranks)} per rank) runs in "
                f"fp32{' on CUDA cores (no tensor cores)' if ev.mode == 'gpu' else ''}; "
                f"matrix math is {100 * gemm_per_rank / busy:.0f}% of compute" if busy else
                f"{p.fp32_share_pct:.0f}% of matrix-math time runs in fp32"]
    evidence.append("dtype mix: " + ", ".join(f"{m.get('label') or m['dtype']} {m['pct']:.0f}%" for m in p.mix[:4])
                    + f" (from {p.source})")
    if p.mfu_pct is not None:
        evidence.append(f"achieved {p.achieved_tflops:.1f} TFLOPS = {p.mfu_pct:.1f}% of {p.peak_tflops:g} TFLOPS "
                        f"({p.peak_source})")
    sev = None
    no_bf16 = ev.mode == "cpu" and any(f.value == "false" for f in ev.facts.get("cpu_native_bf16") or [])
    if no_bf16:  # capture's env file says so: the fix would make this host slower
        src = next(f.source for f in ev.facts["cpu_native_bf16"] if f.value == "false")
        impact, sev = 0.0, "low"
        cpu = f"{ev.fact('cpu_model') or 'model unknown'}, {ev.fact('cpu_isa') or 'ISA unknown'}"
        evidence.append(f"{src}: the CPU ({cpu}) has neither AMX nor AVX512-BF16, so bf16 matmuls would be emulated "
                        "and slower than fp32: no saving on this host")
    elif ev.mode == "cpu":
        evidence.append(f"CPU trace: the estimate assumes bf16 matmuls run {CPU_BF16_SPEEDUP:g}× faster, which needs "
                        "AMX or AVX512-BF16; without them bf16 can be slower")
        impact = min(impact, HIGH - 0.1)  # the gain on this hardware is an estimate: never more than medium
        noise = _step_noise_us(ev)
        gain = impact / 100 * (ev.step_time_us or 0.0)
        if impact < CPU_PRECISION_TICKET_PCT:
            sev = "low"  # the speedup is assumed, not known for this CPU: a small estimate is no main cause
            evidence.append(f"estimated gain {impact:.0f}% of the step is below the {CPU_PRECISION_TICKET_PCT:g}% "
                            "worth a ticket for an assumed CPU speedup; measure it with one bf16 run")
        elif noise is not None and gain <= NOISE_SIGMAS * noise:
            sev = "low"  # a gain a re-run could not tell from noise is not worth a ticket
            evidence.append(f"estimated gain {_ms(gain)} per step is within {NOISE_SIGMAS:g} standard deviations of "
                            f"this run's step times (σ {_ms(noise)} over {len(ev.steps)} rank-steps): not worth a "
                            "ticket on this evidence; measure it with one bf16 run")
    precision_stated = ev.fact("precision")
    if precision_stated:
        evidence.append(f"config/log states precision {precision_stated}")
    rec = CPU_PRECISION_ADVICE if not no_bf16 else (
        "keep fp32 on this host; bf16 gains need a CPU with AMX or AVX512-BF16 (lscpu | grep -E 'amx|avx512_bf16') "
        "or a GPU with bf16 tensor cores")
    if ev.mode == "gpu":  # only what this GPU supports (traceanalyze.hardware)
        evidence.append(f"GPU: {ev.gpu.label}" + (f" (from {ev.gpu.source})" if ev.gpu.capability else
                                                   ": compute capability unknown"))
        rec = hardware.precision_advice(ev.gpu)
    return [Finding("precision", "fp32_matmul", sev or severity(impact), impact, [r["rank"] for r in ev.ranks],
                    f"Matrix math runs in fp32: {p.fp32_share_pct:.0f}% of GEMM time",
                    evidence, rec)]


def _step_noise_us(ev: RunEvidence) -> float | None:
    """Standard deviation (µs) of the counted steps' durations over ranks and steps (the compile step left out);
    None with fewer than three."""
    vals = [s["step_time_us"] for s in ev.steps if s["step"] != ev.compile_step and s.get("step_time_us")]
    return statistics.stdev(vals) if len(vals) >= 3 else None


def rule_compile(ev: RunEvidence) -> list[Finding]:
    """Config: torch.compile time is a large share of the profiled time, or frames recompile."""
    out = []
    c = ev.compile
    log_compile_s = ev.fact("compile_time_s")
    if c is not None and c.compile_us:
        worst = max(c.compile_us, key=c.compile_us.get)
        comp = c.compile_us[worst]
        steady = c.steady_step_us or ev.step_time_us or 0.0
        horizon = ev.fact("total_optimization_steps") or COMPILE_HORIZON_STEPS
        job_us = comp + float(horizon) * steady
        # the trace covers a few steps; compile is paid once per job, so weigh it against the job, not the window
        share = 100 * comp / job_us if job_us else 0.0
        if share >= MIN_COMPILE_PCT or comp >= 600e6:
            impact = round(share, 1)
            ev_lines = [f"rank {worst} spends {_ms(comp)} in dynamo/inductor compile ranges: {share:.0f}% of a job "
                        f"of {float(horizon):,.0f} steps at the steady {_ms(steady)} per step",
                        f"{c.frames} compiled frame(s), {c.recompiles} recompile(s)"]
            if c.first_step_us and c.steady_step_us:
                ev_lines.append(f"first profiled step {_ms(c.first_step_us)} vs steady state {_ms(c.steady_step_us)} "
                                f"({c.first_step_us / c.steady_step_us:.0f}×)")
            if log_compile_s:
                ev_lines.append(f"log: compile took {float(log_compile_s):,.0f} s")
            assumed = "" if ev.fact("total_optimization_steps") else (
                f"assuming a {COMPILE_HORIZON_STEPS:,}-step job: no log or config states the number of steps")
            if assumed:
                ev_lines.append(assumed)
            out.append(Finding("config", "compile_overhead", severity(impact), impact, sorted(c.compile_us),
                               f"torch.compile takes {_ms(comp)}, {share:.0f}% of a {float(horizon):,.0f}-step job",
                               ev_lines,
                               "keep the inductor cache warm between runs (persistent TORCHINDUCTOR_CACHE_DIR, FX "
                               "graph and AOTAutograd caches, torch.compiler.save_cache_artifacts), compile "
                               "per block (regional compilation) for large models, and profile after warm-up",
                               assumption=assumed))
        if c.recompiles:
            impact = round(min(share, 5.0), 1)
            out.append(Finding("config", "recompiles", "medium" if c.recompiles > 2 else "low", impact,
                               sorted(c.compile_us), f"{c.recompiles} recompilation(s) of compiled frames",
                               [f"{c.frames} frame(s) compiled, {c.recompiles} recompiled (compile id R > 0)"],
                               "run with TORCH_LOGS=recompiles to see the failing guard; mark dynamic dims with "
                               "torch._dynamo.mark_dynamic or keep shapes static (pad batches)"))
    elif log_compile_s:
        secs = float(log_compile_s)
        steps = [s.step_time_ms for s in ev.log_steps if s.step_time_ms]
        impact = 0.0
        if secs >= 600:
            impact = 30.0
        elif steps:
            impact = round(min(100.0, 100 * secs * 1e3 / (secs * 1e3 + sum(steps))), 1)
        if secs >= 60 or impact >= MIN_COMPILE_PCT:
            out.append(Finding("config", "compile_overhead", severity(impact), impact, [],
                               f"torch.compile took {secs / 60:,.0f} min before training started",
                               [f"log: compile time {secs:,.0f} s"],
                               "keep the inductor cache warm (persistent TORCHINDUCTOR_CACHE_DIR, "
                               "torch.compiler.save_cache_artifacts), compile per transformer block (regional "
                               "compilation), and check host memory: compile workers of every rank share it"))
    return out


def rule_dataloader(ev: RunEvidence) -> list[Finding]:
    """Config: the training thread waits for the data loader a large share of each step."""
    ld = ev.loader
    if ld is None or not ld.share_pct:
        return []
    share = statistics.median(ld.share_pct.values())
    if share < MIN_LOADER_PCT:
        return []
    impact = round(share, 1)
    worst = max(ld.share_pct, key=ld.share_pct.get)
    return [Finding("config", "dataloader", severity(impact), impact, sorted(ld.share_pct),
                    f"The input pipeline is the bottleneck: {share:.0f}% of each step waits for the DataLoader",
                    [f"median {share:.1f}% of step time in DataLoader __next__ (rank {worst}: "
                     f"{ld.share_pct[worst]:.1f}%, {_ms(ld.loader_us[worst])} over the profiled steps)"],
                    "use DataLoader(num_workers=4 or more, pin_memory=True, persistent_workers=True, "
                    "prefetch_factor=2) and move expensive per-sample transforms offline or into the workers")]


def rule_launch_bound(ev: RunEvidence) -> list[Finding]:
    """Config: the GPU idles waiting for the host. Read from the idle breakdown, not a kernel count: the GPU is idle
    :data:`HOST_BOUND_IDLE_PCT` % or more and host wait (the next kernel launched only after the previous one
    ended; HTA idle-time breakdown) is :data:`HOST_BOUND_WAIT_PCT` % or more of the busiest stream's idle time.
    ``launch_bound`` when kernels are tiny (median ≤ :data:`TINY_KERNEL_US` µs: launches set the pace, CUDA graphs
    help), else ``host_bound`` (the CPU does other work between launches). Impact: half the idle share."""
    ln = ev.launch
    if ev.mode != "gpu" or not ev.ranks:
        return []
    idle = statistics.median(r["idle_pct"] for r in ev.ranks)
    host_wait = _main_stream_host_wait(ev)
    if idle < HOST_BOUND_IDLE_PCT or host_wait is None or host_wait < HOST_BOUND_WAIT_PCT:
        return []
    step = ev.step_time_us or 0.0
    tiny = ln is not None and ln.median_kernel_us is not None and ln.median_kernel_us <= TINY_KERNEL_US
    evidence = [f"GPU idle {idle:.0f}% of the trace window (median over ranks); host wait is {host_wait:.0f}% of the "
                "idle time on the busiest stream (the CPU had not launched the next kernel yet; HTA idle-time "
                "breakdown)"]
    if ln is not None and ln.kernels_per_step:
        dens = f", {ln.kernels_per_step / (step / 1e3):,.1f} per ms of step" if step else ""
        evidence.append(f"{ln.kernels_per_step:,.0f} kernels per step{dens}, median "
                        f"{ln.median_kernel_us or 0:.1f} µs each; launch calls take {_ms(ln.launch_us_per_step)} per "
                        "step on the host")
    if ev.prec is not None and ev.prec.mfu_pct is not None:
        evidence.append(f"MFU {ev.prec.mfu_pct:.1f}% ({ev.prec.achieved_tflops:.1f} TFLOPS of {ev.prec.peak_tflops:g})")
    impact = round(idle * 0.5, 1)
    if tiny:
        return [Finding("config", "launch_bound", severity(impact), impact, [r["rank"] for r in ev.ranks],
                        f"Launch-bound: GPU idle {idle:.0f}% between tiny kernels, {host_wait:.0f}% of it waiting "
                        "for the host", evidence,
                        "capture the step in CUDA graphs (torch.compile(mode='reduce-overhead')), fuse small ops "
                        "(torch.compile), or raise the per-GPU batch so each kernel does more")]
    return [Finding("config", "host_bound", severity(impact), impact, [r["rank"] for r in ev.ranks],
                    f"Host-bound: GPU idle {idle:.0f}%, {host_wait:.0f}% of it waiting for the CPU", evidence,
                    "profile the CPU side of the step (py-spy, or the trace's CPU ops between the "
                    "launches): remove host syncs (.item(), .cpu(), print of tensors), move data loading "
                    "to DataLoader workers with pin_memory, and compile the step (torch.compile) to cut Python "
                    "overhead")]


def _main_stream_host_wait(ev: RunEvidence) -> float | None:
    """Median over ranks of host wait % on each rank's stream with the most kernels; None without data."""
    best: dict[int, dict] = {}
    for row in ev.idle:
        if row.get("host_wait_pct") is None:
            continue
        cur = best.get(row["rank"])
        if cur is None or row["n_kernels"] > cur["n_kernels"]:
            best[row["rank"]] = row
    if not best:
        return None
    return statistics.median(r["host_wait_pct"] for r in best.values())


def rule_effective_batch_single(ev: RunEvidence) -> list[Finding]:
    """Config (no baseline): gradient accumulation kept while the data-parallel size grew."""
    ga = ev.fact("gradient_accumulation_steps")
    ws = ev.fact("world_size") or ev.world_size
    if not ga or not ws or float(ga) <= 1 or float(ws) <= 1:
        return []
    pdb = ev.fact("per_device_batch")
    eff = ev.fact("global_batch") or (float(pdb) * float(ga) * float(ws) if pdb else None)
    return [Finding("config", "gradient_accumulation", "low", 0.0, [],
                    f"Effective batch {eff:,.0f} = per-device batch × gradient accumulation {float(ga):g} × "
                    f"{float(ws):g} ranks" if eff else
                    f"gradient accumulation {float(ga):g} on {float(ws):g} ranks",
                    [f"gradient_accumulation_steps={float(ga):g}, data-parallel size {float(ws):g}"
                     + (f", per-device batch {float(pdb):g}" if pdb else "")],
                    "if this recipe came from a single-GPU run, divide gradient_accumulation_steps by the number "
                    "of GPUs to keep its effective batch, or scale the learning rate with the batch")]


RULES = [rule_exposed_communication, rule_untraced_ranks, rule_straggler, rule_idle_rank, rule_precision, rule_compile,
         rule_dataloader, rule_launch_bound, rule_effective_batch_single]


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
    hw = _main_stream_host_wait(ev)
    if hw is not None:
        evidence.append(f"on the busiest stream, host wait is {hw:.0f}% of the idle time (below the "
                        f"{HOST_BOUND_WAIT_PCT:g}% that makes a step host-bound): the rest waits on other streams, "
                        "syncs or copies")
    if ev.prec is not None and ev.prec.mfu_pct is not None:
        evidence.append(f"MFU {ev.prec.mfu_pct:.1f}%")
    return [Finding("config", "unexplained_idle", "medium", round(idle - IDLE_EXPLAIN_PCT, 1),
                    [r["rank"] for r in ev.ranks],
                    f"The GPU is idle {idle:.0f}% of the time and no rule explains it", evidence,
                    "open the trace around the idle gaps (traceanalyze export, Perfetto): look for host syncs, "
                    "waits on other streams, CPU work between steps, or ranks missing from the traces")]


def rank_findings(fs: list[Finding]) -> list[Finding]:
    """Sort by severity then impact, highest first."""
    order = {"high": 0, "medium": 1, "low": 2}
    return sorted(fs, key=lambda f: (order[f.severity], -f.impact_pct))


# ---------------------------------------------------------------------------------------------------------
# Impact from the what-if replay (traceanalyze.replay.whatif)

# finding kind -> the what-if scenario that removes its cause
KIND_TO_SCENARIO = {"straggler": "no_straggler", "idle_rank": "no_straggler", "slow_collectives": "ideal_interconnect",
                    "topology": "ideal_interconnect", "exposed_communication": "ideal_interconnect",
                    "fp32_matmul": "bf16_matmul", "autocast_missing": "bf16_matmul", "compile_overhead": "no_compile",
                    "recompiles": "no_compile", "dataloader": "no_dataloader_wait",
                    "launch_bound": "no_launch_overhead"}
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
        w = by.get(KIND_TO_SCENARIO.get(f.kind, ""))
        if w is None or not w.get("reliable", False):
            continue
        impact = max(0.0, float(w["saving_pct"]))
        if math.isfinite(impact):
            f.impact_pct = round(impact, 1)
            if f.severity != "low":  # the rules decide what is worth a ticket; the replay, what it costs
                f.severity = severity(impact)
                if mode == "cpu" and w["scenario"] == "bf16_matmul":
                    f.severity = "low" if impact < CPU_PRECISION_TICKET_PCT else "medium"
            f.evidence = [*f.evidence, f"impact from the what-if replay ({w['scenario']}): predicted step time "
                                       f"{w['predicted_step_time_us'] / 1e3:.2f} ms, {impact:.1f}% saved"]
    return rank_findings(findings)


# ---------------------------------------------------------------------------------------------------------
# Comparing two runs

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
            baseline_findings: list[Finding] | None = None) -> tuple[dict, list[Finding]]:
    """Explain subject − baseline step time as a sum of parts and flag config differences.

    Parts per counted profiler step (median over ranks of each rank's median over its steps): compute, exposed
    communication, idle, and other (the rest of the run's step time, :mod:`traceanalyze.metrics.steps`), each
    subject − baseline in µs; they add up to the step-time delta. A part that grew names the subject's finding
    that explains it, only when that finding can (:func:`explains`): its cause differs between the runs, or its
    estimated cost grew with the delta. Returns ``(comparison dict, extra findings)``.
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
                "exposed communication": ("slow_collectives", "topology", "straggler"),
                "idle": ("dataloader", "launch_bound", "idle_rank", "compile_overhead", "straggler"),
                "other": ("compile_overhead", "dataloader", "launch_bound")}
    rows = []
    for part in ("compute", "exposed communication", "idle", "other"):
        if part in ps and part in pb:
            d = ps[part] - pb[part]
            f = next((f for f in subject_findings if f.kind in kinds_of[part] and f.severity != "low"
                      and explains(f, d, subject, baseline, baseline_findings or [])), None)
            rows.append({"part": part, "subject_us": round(ps[part], 1), "baseline_us": round(pb[part], 1),
                         "delta_us": round(d, 1), "finding": f.title if f else None})
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
    extra: list[Finding] = []
    extra += _compare_throughput(subject, baseline, subject_findings)
    es, eb = effective_batch_of(subject), effective_batch_of(baseline)
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
    if comp["subject_step_us"] is not None and comp["baseline_step_us"] is not None:
        comp["delta_us"] = round(comp["subject_step_us"] - comp["baseline_step_us"], 1)
    return comp, extra


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
        note = _transport_note(subject)
        if note:
            ev_lines.append(note)
        pairs = _slow_topology_pairs(subject)
        if pairs:
            ev_lines.append("GPU links: " + ", ".join(f"{a}–{b} {lk}" for a, b, lk in pairs[:4]))
        kind = "topology" if pairs else "slow_collectives"
        out.append(Finding("interconnect", kind, severity(impact), impact, [],
                           f"Scaling to {ns} ranks loses {impact:.0f}% of per-rank throughput", ev_lines,
                           _interconnect_recommendation(subject, pairs), run=subject.name))
    return out


def to_dicts(fs: list[Finding]) -> list[dict]:
    """Findings as plain dicts for the JSON report."""
    return [asdict(f) for f in fs]


def verdict(findings: list[Finding], runs: list[RunEvidence] | None = None) -> str:
    """One sentence for the top of the report (see the module docstring). ``runs`` (the subject runs' evidence)
    adds the GPU idle share to an inconclusive verdict."""
    top = [f for f in findings if f.severity in ("high", "medium")]
    if not top:
        return "No significant slowdown found: no finding reaches medium severity."
    inc = next((f for f in top if f.kind == "untraced_ranks"), None)
    if inc is not None:
        ev = next((e for e in runs or [] if e.name == inc.run), None)
        s = inc.title + (f" ({len(ev.ranks)} of {ev.world_size} ranks traced)" if ev and ev.world_size else "")
        if ev is not None and ev.mode == "gpu" and ev.ranks:
            s += f"; the GPU is idle {statistics.median(r['idle_pct'] for r in ev.ranks):.0f}%"
        other = next((f for f in top if f is not inc and f.cause != "interconnect"), None)
        if other is not None:
            s += f". Also: {other.title} (about {other.impact_pct:.0f}% of step time)"
        return s + "."
    f = top[0]
    if f.kind == "unexplained_idle":
        return f"Not healthy: {f.title[0].lower()}{f.title[1:]}; see the GPU idle breakdown and the timeline."
    s = f"Main cause: {f.cause} ({f.kind.replace('_', ' ')}): {f.title} — about {f.impact_pct:.0f}% of step time"
    return s + (f" ({f.assumption})." if f.assumption else ".")
