"""What the rules read about one run (:class:`RunEvidence`), severity from impact, and the helpers and
thresholds that several rules share."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from traceanalyze.hardware import GpuInfo
from traceanalyze.metrics.collectives import CollectiveAnalysis
from traceanalyze.metrics.host import CompileStats, HostView, LaunchStats, LoaderStats
from traceanalyze.metrics.precision import PrecisionMix

HIGH, MEDIUM = 25.0, 10.0  # impact % thresholds for severity
CPU_PRECISION_TICKET_PCT = 20.0  # CPU bf16 gain (an assumed speedup the trace cannot confirm) worth a ticket
NOISE_SIGMAS = 2.0  # a CPU precision gain per step must exceed this many standard deviations of the step times
HOST_BOUND_WAIT_PCT = 50.0  # host wait share of the busiest stream's idle that makes a step host-bound
COMPILE_STEP_RATIO = 3.0  # a first step this many times the steady one, with compile ranges, is the compile step


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
    # () -> (rank_ops, host_gaps, gap_us_per_step) (the properties below, metrics.where): called on first use, as
    # only the straggler rules' evidence lines read them (~0.13 s CPU of two queries on 256 ranks); None: empty
    where_source: Callable[[], tuple[dict, dict, dict]] | None = None
    compile_step: int | None = None  # the profiler step that holds torch.compile (left out of step times)
    host: HostView | None = None  # the steady steps' host side: blocking calls, optimizer, top ops (GPU runs)
    unprofiled: dict | None = None  # the step time measured without the profiler: {"step_time_us", "source", ...}
    # the replay's pricer of one more what-if for a finding (diagnose.price_missing_whatifs; it holds the replay's
    # graph: dropped once the findings are priced), None without a replay
    price_whatif: Any = None
    whatif: list = field(default_factory=list)  # the replay's what-if rows (runs[i].whatif), before the findings
    ooms: list = field(default_factory=list)  # [logs.OomEvent]: the out-of-memory errors and kills the logs record
    # the caching allocator's cudaFree/cudaMalloc calls in the counted steps, per rank that has any
    # (traceanalyze.metrics.allocator.CacheFlush; GPU runs)
    cache_flush: list = field(default_factory=list)
    skew: Any = None  # arrival skew per collective instance (traceanalyze.replay.skew.Skew), None without one
    # optimizer steps per counted profiler step (traceanalyze.metrics.accumulation), read when a log or config
    # states gradient accumulation; None otherwise
    accumulation: dict | None = None
    # steps grouped by rank, made on first use (the rules ask per rank: one pass over the steps, not one per rank)
    _by_rank: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _where: tuple | None = field(default=None, init=False, repr=False, compare=False)  # where_source's, once

    def _where_parts(self) -> tuple[dict, dict, dict]:
        if self._where is None:
            self._where = self.where_source() if self.where_source is not None else ({}, {}, {})
            self.where_source = None  # what it holds (the store's connection) is not needed again
        return self._where

    @property
    def rank_ops(self) -> dict[int, dict[str, float]]:
        """Rank -> op -> µs per counted step (:func:`traceanalyze.metrics.where.op_time_per_step`)."""
        return self._where_parts()[0]

    @property
    def host_gaps(self) -> dict[int, list]:
        """Rank -> its largest host gaps, [:class:`traceanalyze.metrics.where.HostGap`]
        (:func:`traceanalyze.metrics.where.host_gaps`)."""
        return self._where_parts()[1]

    @property
    def gap_us_per_step(self) -> dict[int, float]:
        """Rank -> host gap µs per counted step (:func:`traceanalyze.metrics.where.host_gaps`)."""
        return self._where_parts()[2]

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


def ms_text(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:,.1f} ms"


def rank_steps(ev: RunEvidence, rank: int) -> list[dict]:
    """The rank's counted steps, the compile step left out when there are others."""
    rs = ev.steps_of(rank)
    steady = [s for s in rs if s["step"] != ev.compile_step]
    return steady or rs


def per_step(ev: RunEvidence, r: dict, key: str) -> float | None:
    """A rank's µs of ``key`` per counted profiler step (median over its steps, as its step time; the compile step
    left out), else over its whole window."""
    rs = rank_steps(ev, r["rank"])
    if rs and key in rs[0]:
        return statistics.median(s[key] for s in rs)
    return r.get(key)


def step_us(ev: RunEvidence, r: dict) -> float:
    rs = rank_steps(ev, r["rank"]) if ev.compile_step is not None else []
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


def step_noise_us(ev: RunEvidence) -> float | None:
    """Standard deviation (µs) of the counted steps' durations over ranks and steps (the compile step left out);
    None with fewer than three."""
    vals = [s["step_time_us"] for s in ev.steps if s["step"] != ev.compile_step and s.get("step_time_us")]
    return statistics.stdev(vals) if len(vals) >= 3 else None


def main_stream_host_wait(ev: RunEvidence) -> float | None:
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


def wait_per_step(ev: RunEvidence, window: bool = False) -> dict[int, float]:
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
        steady = {s["step"] for s in rank_steps(ev, r["rank"])}
        per = [w for st, w in by_rank.get(r["rank"], []) if st in steady]
        if per and not window:
            out[r["rank"]] = sum(per) / max(1, len(steady))
        else:
            out[r["rank"]] = ev.coll.wait_us.get(r["rank"], 0.0) / n
    return out
