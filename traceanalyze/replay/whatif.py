"""What-ifs: each one rewrites task durations, gaps or transfer times and replays the graph; the findings' impact
comes from them (:func:`traceanalyze.diagnose.apply_to_findings`). Design: ``shared/WHATIF.md`` §6,
``docs/replay.md``. Each scenario is a record of :mod:`traceanalyze.replay.scenarios` (its rewrite, when it applies,
its assumptions and how it is priced); this module prices them, in the registry's order, then ``all``.

Step times follow the one step definition (:mod:`traceanalyze.metrics.steps`): a step's time is the longest
duration of that ``ProfilerStep#N`` over the ranks; the run's step time is the median over the counted steps.
The replay error is |replayed − measured| / measured of the run's step time. A what-if's predicted step time is,
per counted step, the measured time less the replayed saving (replay of the graph − replay of the rewritten
graph), then the median over steps; ``saving_pct`` = 100 × (measured − predicted) / measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import duckdb
import numpy as np

from traceanalyze import store
from traceanalyze.executors import drop_cached_blocks, on_own_cursor, release_free_memory, reuse_freed_blocks
from traceanalyze.hardware import GpuInfo
from traceanalyze.metrics.collectives import Calls
from traceanalyze.metrics.steps import longest_per_step, median
from traceanalyze.metrics.where import MAX_TIMELINE_LANES, lanes_to_show
from traceanalyze.replay import floors, gaps, optimizer, overhead, precision, simulate, skew
from traceanalyze.replay import graph as gr
from traceanalyze.replay.scenarios import ALL, ALL_CAUSE, MIN_SAVING_US, REGISTRY, Arrays, Scenario, by_name
from traceanalyze.replay.scenarios.host import pipelined_step_times, without_host_syncs
from traceanalyze.replay.scenarios.precision import BF16_SPEEDUP_CPU, BF16_SPEEDUP_GPU, CPU_BF16_SPEEDUP

SCENARIOS = (*(s.name for s in REGISTRY), ALL)  # the order they are priced in (scenarios.REGISTRY), then all
CAUSES = {**{s.name: s.cause for s in REGISTRY}, ALL: ALL_CAUSE}
NO_SAVING = "no measurable saving"  # how a late pricer's reason starts when the replay priced the fix to nothing
UNRELIABLE_ERROR_PCT = 5.0  # replay error above which the what-ifs are marked unreliable (straggler paper §3.3)
MIN_PRECISION_PCT = 0.5  # a precision rewrite removing less than this share of the step is not replayed


def _without_gap_cut(g: gr.Graph, cut: np.ndarray | None) -> gr.Graph:
    """``g`` with each explicit edge's offset less the µs the rewrite cut from the host gap before the edge's
    destination (``cut``, per task; None or nothing cut: ``g`` itself). An edge into the task after a host gap
    holds that gap too (a synchronize's edge runs from the awaited kernel's end to the next task's start), so work
    taken out of the gap must leave the edge as well; a positive offset is cut down to 0 at most, others are kept. A
    shallow copy: only the offsets are new."""
    if cut is None or not cut.any():
        return g
    off = g.dep_off - np.minimum(cut[g.dep_dst], np.clip(g.dep_off, 0, None))
    return dataclasses.replace(g, dep_off=off)


def _without_spanned_cut(g: gr.Graph, removed: tuple[np.ndarray, np.ndarray] | None) -> gr.Graph:
    """``g`` with each explicit edge's offset less the host time the rewrite removed on the destination's thread
    between the source's end and the destination's start (``removed``: per task, µs taken out of its duration and
    out of the gap before it; None: ``g`` itself). A synchronize's edge runs from the awaited kernel's end to the
    step's end, and spans whatever the host did after that kernel ended (``cudaFree`` calls freeing the cache): once
    that work is gone the edge must not keep it. Counted from the first task of the thread that starts at or after
    the source's end, with the removed part of the gap before it that fits after the source's end; a positive
    offset is cut down to 0 at most. A shallow copy: only the offsets are new."""
    if removed is None:
        return g
    r_dur, r_gap = (np.clip(x, 0, None) for x in removed)
    pos = np.flatnonzero(g.dep_end & (g.dep_off > 0))
    dst = g.dep_dst[pos]
    if not (pos.size and (r_dur.any() or r_gap.any())):
        return g
    # host time removed before each task's start on its resource: the durations of the tasks before it and the
    # gaps up to its own (task ids are in resource order, starts ascending within a resource)
    before = np.cumsum(r_dur) - r_dur + np.cumsum(r_gap)
    src_end = g.start[g.dep_src[pos]] + g.dur[g.dep_src[pos]]
    # the first task of the destination's resource starting at or after the source's end: one search over
    # (resource, rank of the start) keys, the tasks' own order (every edge at once)
    u = np.unique(np.concatenate([g.start, src_end]))
    m = np.int64(u.size + 1)
    keys = g.res.astype(np.int64) * m + np.searchsorted(u, g.start)
    k = np.minimum(np.searchsorted(keys, g.res[dst].astype(np.int64) * m + np.searchsorted(u, src_end)), dst)
    # of the gap before that first task, the removed part that can lie after the source's end (the removed calls
    # taken to sit at the gap's end: a cudaFree that waited for the GPU to drain frees after it)
    tail = np.minimum(r_gap[k], np.clip(g.start[k] - src_end, 0, None))
    span = np.clip(before[dst] - before[k] + tail, 0, None)
    off = g.dep_off.copy()
    off[pos] -= np.minimum(span, off[pos])
    return dataclasses.replace(g, dep_off=off)


def _left_out(g: gr.Graph, ctx: dict) -> list[dict]:
    """What-ifs the trace would support but the host rules out, each ``{"scenario", "why"}`` (each record's
    ``left_out``: bf16 on a CPU without AMX or AVX512-BF16)."""
    return [{"scenario": s.name, "why": why} for s in REGISTRY if s.left_out and (why := s.left_out(g, ctx))]


def _changes_concurrency(scenario: str, ctx: dict) -> bool:
    """Whether ``scenario`` (``all``: any scenario it combines) changes how many ranks compute at once."""
    if scenario == ALL:
        return any(by_name(s).changes_concurrency for s in ctx.get("applicable") or ())
    rec = by_name(scenario)
    return rec is not None and rec.changes_concurrency


def _cores_note(scenario: str, ctx: dict) -> str:
    """``; <why>`` in a concurrency what-if's assumptions when it is not known whether the ranks share cores."""
    cs = ctx.get("core_sharing") or {}
    if cs.get("shared") is None and cs.get("why") and _changes_concurrency(scenario, ctx):
        return f"; {cs['why']}"
    return ""


def _late_pricer(pr: _Pricer, ctx: dict, base: Arrays, measured: dict, err: float, reliable: bool) -> Callable:
    """The pricer of one more scenario on this run's graph, for a finding the replay's own tests did not price
    (:func:`traceanalyze.diagnose.price_missing_whatifs`): ``price(scenario, ranks=None) -> (whatif row or None,
    why there is none, sim_result rows)``. ``ranks``: the ranks a finding names, for a scenario that rewrites named
    ranks (its record's ``ranks_ctx``: a straggler finding's, a late-entry finding's). It holds the graph until it
    is dropped."""
    if not pr.hold:  # a run in turn (big): what a late replay can recompute is not held through the analyses
        pr.g_free, pr.groups = None, None  # the graph without host syncs (no_host_sync), the floors' grouping
    pr.hold, pr.layout = False, None  # not held through the rest of the report: each late replay plans its own
    g = pr.g
    replayed = set(g.ranks)

    def price(scenario: str, ranks: list[int] | None = None) -> tuple[dict | None, str, list]:
        rec = by_name(scenario)
        if rec is None:
            return None, f"no scenario {scenario!r}", []
        c = ctx
        if rec.ranks_ctx and ranks:
            named = {r for r in ranks if r in replayed}
            if not named or len(named) >= len(g.ranks):
                return None, f"the {rec.ranks_finding} finding's ranks are not among the replayed ranks with peers", []
            c = dict(ctx, **{rec.ranks_ctx: named})
        elif not rec.applies(g, ctx):
            return None, rec.why_not(g, ctx), []
        if c is ctx and scenario in pr.skipped:  # priced by the replay already, for no row: not again
            return None, pr.skipped[scenario], []
        rows: list = []
        out = _price_scenarios(pr, [scenario], c, base, measured, rows, err, reliable)
        return (out[0], "", rows) if out else (None, pr.skipped.get(scenario, NO_SAVING), [])

    return price


def _after_build(con: duckdb.DuckDBPyConnection, g: gr.Graph, gpu: GpuInfo | None,
                 beside: bool) -> Callable[[], tuple[dict, dict] | None]:
    """The build's temporaries released (~100 MB of fragmented heap at 1,024 ranks), then, with ``beside`` on a GPU
    run, its what-if contexts (:func:`_gpu_contexts`) started on a cursor and thread of their own: their queries
    (the optimizer's ranges, the casts' shapes) free the GIL while the main thread replays the graph. Returns the
    wait for them; else a callable that returns None. Not for a run in turn (``beside`` False: its memory at
    1,024 ranks)."""
    release_free_memory()
    if g.mode == "gpu" and beside:
        return on_own_cursor(con, _gpu_contexts, g, gpu, name="traceanalyze-contexts")
    return lambda: None


def _gpu_contexts(con: duckdb.DuckDBPyConnection, g: gr.Graph, gpu: GpuInfo | None) -> tuple[dict, dict]:
    """A GPU run's what-if contexts: (:func:`.precision.context`, :func:`.optimizer.context`)."""
    prec = precision.context(con, g, gpu)
    return prec, optimizer.context(con, g, prec["peaks"])


def _longest(times: dict[tuple[int, int], float], counted: set[tuple[int, int]]) -> dict[int, float]:
    """Step -> its longest time over the ranks, of the counted (rank, step) times."""
    return longest_per_step((s, t) for (r, s), t in times.items() if (r, s) in counted)


def replay_run(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world_size: int | None,
               clock_offsets_us: dict | None = None, link_gbps: float | None = None, link_source: str = "",
               gpu_sm: str | None = None, cpu_native_bf16: bool | None = None, cpu_model: str | None = None,
               defer: list | None = None, build_threads: int | None = None, gpu: GpuInfo | None = None,
               unprofiled_measured: dict | None = None, core_sharing: dict | None = None, pricer: list | None = None,
               baseline: dict | None = None, calls: Calls | None = None) -> tuple[dict, list[dict], dict]:
    """Build, store and replay the run's graph, then every what-if that applies.

    ``defer``: when a list, the writes (the graph's ``sim_*`` tables, ``collective_skew``, ``sim_result``) are
    appended to it as one callable for the caller to overlap with its other work. ``cpu_native_bf16``/``cpu_model``:
    the host CPU (``env_rank{r}.json``); on a CPU run, False leaves ``bf16_matmul`` out (``left_out`` says why).
    ``build_threads``: threads that build the graph. ``gpu``: the run's GPU (the precision peaks).
    ``unprofiled_measured``: ``{"step_time_us", "source"}`` measured without the profiler (``capture`` or ``log``),
    or None: estimated (:mod:`.overhead`). ``core_sharing`` (:func:`traceanalyze.logs.core_sharing`): on a CPU run
    whose ranks share cores, the what-ifs that change how many ranks compute at once (``changes_concurrency``) are
    ``reliable: false`` with an ``unreliable_reason``. ``calls``: the run's collective calls, when the caller has them.
    ``pricer``: when a list, receives :func:`_late_pricer`'s pricer of one more scenario (it holds the graph).
    ``baseline``: the compared baseline's measured figures (:func:`traceanalyze.replay.frombase.baseline_figures`):
    the what-ifs of the causes it fixes are priced from them (their rows' ``priced_from`` says so).

    On GPU runs every what-if is priced on the step without the profiler: its rewrite applies to the graph with the
    profiler's host cost taken out, its predicted step time and saving are for the unprofiled job, and no
    prediction is below the busy time of the work the rewrite leaves (:func:`.floors.step_floors`). ``profiled_*``
    fields keep the profiled figures.

    Returns:
        ``(replay, whatif, picture)``: ``replay`` and ``whatif`` as in the JSON contract (``docs/replay.md``; the
        replay's ``profiler_overhead`` is the run's), ``picture`` the cross-rank lanes of the median step for the
        HTML report.
    """
    g = gr.build(con, run_id, mode, world_size, clock_offsets_us, threads=build_threads, calls=calls)
    contexts = _after_build(con, g, gpu, beside=build_threads is not None)
    ctx = {"link_gbps": link_gbps, "link_source": link_source or "expected link",
           "bf16": BF16_SPEEDUP_GPU if mode == "gpu" else BF16_SPEEDUP_CPU,
           "native_bf16": cpu_native_bf16 if mode == "cpu" else None, "cpu_model": cpu_model,
           "core_sharing": core_sharing if mode == "cpu" else None, "baseline": baseline}
    # beside (not in turn: 1,024 ranks' memory), each replay reuses the heap its last one freed (page faults)
    with reuse_freed_blocks() if build_threads is not None else contextlib.nullcontext():
        return _replay_graph(con, g, ctx, contexts, defer, build_threads is None, gpu, unprofiled_measured, pricer)


def _replay_graph(con: duckdb.DuckDBPyConnection, g: gr.Graph, ctx: dict, contexts: Callable, defer: list | None,
                  in_turn: bool, gpu: GpuInfo | None, unprofiled_measured: dict | None, pricer: list | None
                  ) -> tuple[dict, list[dict], dict]:
    """:func:`replay_run` after the build: its graph ``g``, the what-ifs' context ``ctx`` (less what the replay
    adds), ``contexts`` (:func:`_after_build`), ``in_turn``: no other analysis runs meanwhile."""
    run_id, mode = g.run_id, g.mode
    results: list[list] = []
    sk = skew.collective_skew(con, g)  # who waited for whom: the instances as the graph matched them
    write = _Writes(con, g, run_id, sk, results, drop_cache=in_turn)  # one thread: a run in turn
    if defer is not None:  # else written before each return
        defer.append(write)
    base = simulate.replay(g, keep_binding=True, layout=(lay := None if write.drop_cache else simulate.layout_of(g)))
    measured = {(r, s): float(g.start[e] - g.start[b]) for r, s, b, e, _ in g.steps}
    counted = {(r, s) for r, s, _, _, c in g.steps if c}
    base_t = base.step_times(g)
    m_long, b_long = _longest(measured, counted), _longest(base_t, counted)
    m_run, b_run = median(m_long.values()), median(b_long.values())
    if m_run is None or b_run is None:
        contexts()
        if defer is None:
            write()
        return {}, [], {}
    if defer is not None:
        write.start_beside()
    err = abs(b_run - m_run) / m_run * 100 if m_run else 0.0
    replay_model = _replay_model(g, base, measured, base_t, counted, m_run, b_run, err)
    if ctx["core_sharing"]:
        replay_model["core_sharing"] = ctx["core_sharing"]
    if mode == "gpu":
        ctx["prec"], ctx["opt"] = contexts() or _gpu_contexts(con, g, gpu)
    replay_model.update(left_out=_left_out(g, ctx), unexplained_gaps=gaps.summary(g, counted))
    replay_model["collective_skew"] = sk  # not for the JSON: the caller takes it out (traceanalyze.pipeline)
    picture = _picture(g, base, measured, counted, m_long, sk)  # now: base (3 graph-sized arrays) is not held below
    pr, lay = _Pricer(g, counted, m_long, b_long, m_run, lay), None  # one layout at a time: see _Pricer
    pr.on_path = simulate.on_critical_paths(base, _markers(g)) if mode != "gpu" else None  # GPU: the unprofiled's
    del base
    results += [[run_id, "replay", r, s, measured[(r, s)], base_t[(r, s)]] for r, s in sorted(measured)]
    applicable = ctx["applicable"] = [s.name for s in REGISTRY if s.applies(g, ctx)]
    write.drop_cache_once_written()  # before the what-ifs' replays: the run's peak
    d0, cg0, tr0 = g.chain_dur, g.chain_gap, g.inst_transfer
    if mode == "gpu":  # the what-ifs are rewrites of the graph without the profiler's host cost
        d0, cg0 = pr.unprofiled(con, run_id, d0, cg0, tr0)
    ctx["d0"] = d0  # the durations the rewrites start from (fused_optimizer's launch call: their median)
    replay_model["profiler_overhead"] = pr.base(d0, cg0, unprofiled_measured)
    whatif = _price_scenarios(pr, applicable, ctx, (d0, cg0, tr0), measured, results, err, replay_model["reliable"])
    if pricer is not None:
        pricer.append(_late_pricer(pr, ctx, (d0, cg0, tr0), measured, err, replay_model["reliable"]))
    if defer is None:
        write()
    return replay_model, whatif, picture


class _Writes:
    """The replay's tables of one run (the graph's ``sim_task``, ``sim_dep``, ``sim_coll``, ``collective_skew``
    and the ``sim_result`` rows in ``results``), written when called. :meth:`start_beside` starts the graph's on a
    cursor and thread of their own: they read the measured graph only, so they are written while the what-ifs
    replay, when the caller's other work is done and a CPU is free (on the 8-rank scale set the writing took 0.3 s
    after the replay); the call then waits for them. :meth:`discard`: the caller keeps no replay of the run."""

    def __init__(self, con: duckdb.DuckDBPyConnection, g: gr.Graph, run_id: int, sk: skew.Skew,
                 results: list[list], drop_cache: bool = False) -> None:
        self.con, self.g, self.run_id, self.sk, self.results = con, g, run_id, sk, results
        self.drop_cache = drop_cache  # see drop_cache_once_written
        self.beside: Callable[[], None] | None = None  # waits for the graph's tables (raises what they raised)

    def _save(self, con: duckdb.DuckDBPyConnection) -> None:
        gr.save(con, self.g)
        skew.save(con, self.run_id, self.sk)

    def drop_cache_once_written(self) -> None:
        """With ``drop_cache`` (a run replayed in turn: no other analysis queries meanwhile), the graph's tables
        started beside are waited for, then DuckDB's cached reads of the build dropped
        (:func:`~traceanalyze.executors.drop_cached_blocks`: its memory limit lowered for a moment, with no query
        running), not held through the what-ifs' replays. What the writing raised is raised when called, as
        before."""
        if not self.drop_cache or self.beside is None:
            return
        try:
            self.beside()
        except Exception:  # noqa: BLE001 - raised again by __call__
            return
        drop_cached_blocks(self.con)

    def start_beside(self) -> None:
        if self.drop_cache:  # a run in turn: the build's cached reads are not held beside the tables being written
            drop_cached_blocks(self.con)
        self.beside = on_own_cursor(self.con, self._save, name="traceanalyze-save")

    def __call__(self) -> None:
        if self.beside is not None:
            self.beside()
        else:
            self._save(self.con)
        store.insert_rows(self.con, "sim_result", None, self.results)

    def discard(self) -> None:
        """Nothing of the run stays in the tables: what was started beside is waited for, then deleted."""
        if self.beside is not None:
            with contextlib.suppress(duckdb.Error, ValueError, IndexError, KeyError):
                self.beside()
            for t in ("sim_task", "sim_dep", "sim_coll", "collective_skew"):
                self.con.execute(f"DELETE FROM {t} WHERE run_id = ?", [self.run_id])


def _step_noise_pct(g: gr.Graph, m_long: dict) -> float:
    """Step-to-step noise, % of the mean: σ over the counted steps' longest times, a step that torch.compile fills
    more than half of left out (a one-time cost, not noise; as :mod:`traceanalyze.diagnose.confidence` does)."""
    sel = g.step >= 0
    comp = np.bincount(g.step[sel], weights=g.cover["compile"][sel]) if sel.any() else np.zeros(0)
    vals = [v for s, v in m_long.items() if not (0 <= s < comp.size and comp[s] > 0.5 * v)]
    return float(100 * np.std(vals) / np.mean(vals)) if len(vals) > 1 and np.mean(vals) > 0 else 0.0


class _Pricer:
    """Prices rewrites of one run's graph: each counted step's replayed saving taken off its step time without the
    profiler (measured, or estimated by :meth:`unprofiled`), never below the step's floor
    (:func:`.floors.step_floors`)."""

    def __init__(self, g: gr.Graph, counted: set, m_long: dict, b_long: dict, m_run: float,
                 layout: simulate.Layout | None = None) -> None:
        self.g, self.counted, self.m_long, self.b_long, self.m_run = g, counted, m_long, b_long, m_run
        # the replay layout (simulate.layout_of) of g or g_free, whichever was replayed last: reused by the replays
        # of its rewrites; one at a time (each holds ~30-50 bytes per task). Given none (a run in turn, big: at
        # 1,024 ranks g's layout, 78 MB, sat at the run's peak), it holds none: each replay plans its own
        self.hold = layout is not None
        self.layout = layout
        self.u_long, self.per_op, self.cfg = b_long, 0.0, None
        self.loader_mp = False  # the steps take batches from a multi-process DataLoader (overhead.estimate_range)
        self.groups = floors.floor_groups(g)  # the floors' grouping, the same for every rewrite
        self.last_floors: tuple | None = None  # (d, cg, floors): a rewrite's, from its saving bound to its predict
        self.est: dict = {}
        self.est_run = self.u_run = m_run
        self.scale = 1.0
        self.skipped: dict[str, str] = {}  # scenario -> why its rewrite gave no row (a late pricer reuses it)
        self.g_free: gr.Graph | None = None  # the graph without its blocking waits for the GPU (no_host_sync)
        self.on_path: np.ndarray | None = None  # per task: on the critical path of a counted step's marker
        self.kept_on_path = 0.0  # the last replay's critical path in unexplained kept gaps, % (gaps.on_path_pct)
        self.noise_pct = _step_noise_pct(g, m_long)

    def replay_long(self, arrs: Arrays, sync_free: bool = False, starts: np.ndarray | None = None,
                    cut: np.ndarray | None = None, spanned: tuple | None = None) -> tuple[dict, dict]:
        """(step -> longest replayed time over the counted ranks, (rank, step) -> replayed time); ``sync_free``:
        on the graph without its blocking waits for the GPU, the host running ahead (:func:`pipelined_step_times`);
        ``starts``: the pinned tasks' starts (a scenario's ``starts``), default the measured ones; ``cut``: per
        task, µs of the gap before it that the rewrite took out, also out of its incoming edges
        (:func:`_without_gap_cut`); ``spanned``: the host time the rewrite removed, also out of the edges that span
        it (:func:`_without_spanned_cut`)."""
        if sync_free:
            if self.g_free is None:
                self.g_free = without_host_syncs(self.g)
            g = _without_spanned_cut(_without_gap_cut(self.g_free, cut), spanned)
            rp = simulate.replay(g, *arrs, starts=starts, keep_binding=True, layout=self._layout(g))
            t = pipelined_step_times(g, rp)
        else:
            g = _without_spanned_cut(_without_gap_cut(self.g, cut), spanned)
            rp = simulate.replay(g, *arrs, starts=starts, keep_binding=True, layout=self._layout(g))
            t = rp.step_times(g)
        self.kept_on_path = gaps.on_path_pct(g, rp, arrs[1], self.counted)
        del rp
        self._release()
        return _longest(t, self.counted), t

    def _release(self) -> None:
        """A run in turn (``hold`` False: 1,024 ranks' memory) hands each replay's graph-sized arrays back to the
        system, not stacked up in the heap; others keep the freed pages for the next replay's arrays (at 256 ranks
        ~40 ms of the what-ifs' CPU went to faulting them in again)."""
        if not self.hold:
            release_free_memory()

    def _layout(self, g: gr.Graph) -> simulate.Layout | None:
        """The replay layout of ``g``'s structure: the one held when it fits, else a new one held instead (None
        when the pricer holds none: the replay plans its own)."""
        if not self.hold:
            return None
        if self.layout is None or not self.layout.fits(g):
            self.layout = None  # released before the next is planned
            self.layout = simulate.layout_of(g)
        return self.layout

    def unprofiled(self, con, run_id: int, d: np.ndarray, cg: np.ndarray, tr: np.ndarray) -> tuple:
        """The graph's durations and gaps less the profiler's host cost (:mod:`.overhead`), replayed."""
        self.cfg = overhead.profiler_config(con, run_id)
        self.per_op = overhead.per_op_us(self.cfg)
        self.loader_mp = overhead.multiprocess_loader(con, run_id)
        d, cg = overhead.unprofiled(self.g, d, cg, self.per_op, per_shape=overhead.per_shape_us(self.cfg))
        rp = simulate.replay(self.g, d, cg, tr, keep_binding=True, layout=self._layout(self.g))
        self.u_long = _longest(rp.step_times(self.g), self.counted)
        self.on_path = simulate.on_critical_paths(rp, _markers(self.g))
        del rp
        self._release()
        return d, cg

    def base(self, d: np.ndarray, cg: np.ndarray, measured: dict | None) -> dict:
        """Set the step without the profiler (``measured`` when it says, else the estimate) and return the run's
        ``profiler_overhead``."""
        floor_u = floors.step_floors(self.g, d, cg, self.groups)
        m, b, u = self.m_long, self.b_long, self.u_long
        # a floor above the measured step (work assigned to a step that runs past its end) never raises an estimate
        self.est = {s: max(m[s] - (b[s] - u[s]), min(floor_u.get(s, 0.0), m[s])) for s in m}
        self.est_run = median(self.est.values()) or self.m_run
        self.u_run, source = self.est_run, "estimate"
        if measured and (measured.get("step_time_us") or 0) > 0:
            self.u_run, source = float(measured["step_time_us"]), str(measured.get("source"))
        self.scale = self.u_run / self.est_run if self.est_run else 1.0  # a measurement rescales the estimates
        m_run, busy = self.m_run, floors.gpu_busy_us(self.groups, d, self.m_long)
        rng, caveat = overhead.estimate_range(m_run, self.est_run, busy, self.loader_mp)
        return {"unprofiled_step_time_us": round(self.u_run, 3), "profiled_step_time_us": round(m_run, 3),
                "overhead_pct": round(100 * (m_run - self.u_run) / m_run, 2) if m_run else 0.0, "source": source,
                "per_op_us": round(self.per_op, 3), "per_call_us": overhead.PER_CALL_US if self.per_op else 0.0,
                "per_shape_us": overhead.per_shape_us(self.cfg or {}) if self.per_op else 0.0,
                "estimated_step_time_us": round(self.est_run, 3), "estimated_range_us": rng, "caveat": caveat,
                "profiler": self.cfg or {}, "events_per_step": _events_per_step(self.g, self.counted),
                "gpu_busy_us": busy}

    def floors(self, d: np.ndarray, cg: np.ndarray) -> dict[int, float]:
        """:func:`.floors.step_floors` of ``d``, ``cg``; kept for these very arrays until :meth:`predict` (a rewrite
        with a saving bound needs them before its replay, then its prediction)."""
        if self.last_floors is not None and self.last_floors[0] is d and self.last_floors[1] is cg:
            return self.last_floors[2]
        out = floors.step_floors(self.g, d, cg, self.groups)
        self.last_floors = (d, cg, out)
        return out

    def predict(self, arrs: Arrays, sync_free: bool = False, starts: np.ndarray | None = None,
                cut: np.ndarray | None = None, spanned: tuple | None = None) -> tuple[float, dict, bool]:
        """(predicted step without the profiler, replayed (rank, step) times, whether a floor clamped it);
        ``sync_free``, ``starts``, ``cut``, ``spanned``: see :meth:`replay_long`."""
        w_long, t = self.replay_long(arrs, sync_free, starts, cut, spanned)
        floor = {s: min(v, self.est.get(s, v)) for s, v in self.floors(arrs[0], arrs[1]).items()}
        self.last_floors = None  # nor its arrays held
        per_step = {s: self.est[s] - (self.u_long[s] - w_long[s]) for s in self.m_long}
        clamped = any(per_step[s] < floor.get(s, 0.0) - 1e-6 for s in per_step)
        per_step = {s: max(v, floor.get(s, 0.0)) for s, v in per_step.items()}
        return (median(per_step.values()) or self.est_run) * self.scale, t, clamped


def _add_range(row: dict, pr: _Pricer, rec: Scenario, pred: float, arrs: Arrays, base: Arrays, ctx: dict) -> None:
    """A precision what-if's range (``range_us``, ``range_saving_pct``). GPU runs: without two more replays, the
    replayed saving scaled by the kernel time each end of the model's range removes against the point estimate's
    (the same kernels, so the same share on the path); CPU runs: replays at the assumed speed-ups' ends."""
    g, (d0, cg0, tr0), u = pr.g, base, pr.u_run
    if g.mode == "gpu" and ctx.get("prec"):
        cut_mid = float((d0 - arrs[0]).sum())
        ends = []
        for b in ("low", "high"):
            cut_b = float((d0 - rec.rewrite(g, d0, cg0, tr0, ctx, bound=b)[0]).sum())
            ends.append(u - (u - pred) * (cut_b / cut_mid if cut_mid > 0 else 1.0))
    else:
        ends = [pr.predict(rec.rewrite(g, d0, cg0, tr0, ctx, bound=b))[0] for b in ("low", "high")]
    row["range_us"] = [round(min(ends), 3), round(max(ends), 3)]
    row["range_saving_pct"] = [round(100 * (u - max(ends)) / u, 2), round(100 * (u - min(ends)) / u, 2)]


def _markers(g: gr.Graph) -> np.ndarray:
    """The begin and end markers of the counted steps (task ids): what a step time is measured between."""
    return np.array([t for _, _, b, e, c in g.steps if c for t in (b, e)], dtype=np.int64)


def _on_path_changes(pr: _Pricer, arrs: Arrays, base: Arrays, starts: np.ndarray | None = None) -> bool:
    """Whether the rewrite ``arrs`` (and the pinned starts ``starts``) changes a duration, chain gap, transfer or
    start of a task on the base replay's critical paths (:func:`traceanalyze.replay.simulate.on_critical_paths`);
    True when those paths are unknown. False means the replay would return the base step times to the bit."""
    if pr.on_path is None:
        return True
    g, (d0, cg0, tr0) = pr.g, base
    ch = (arrs[0] != d0) | (arrs[1] != cg0)
    if starts is not None:
        ch |= starts != g.start
    ct = np.flatnonzero(g.inst >= 0)
    if ct.size and arrs[2] is not tr0:
        ch[ct] |= arrs[2][g.inst[ct]] != tr0[g.inst[ct]]
    return bool((ch & pr.on_path).any())


def _rewritten(pr: _Pricer, sc: str, rec: Scenario | None, applicable: list[str], ctx: dict, base: Arrays,
               whatif: list[dict]) -> Arrays | None:
    """The graph's arrays after scenario ``sc`` (``all``: every scenario it combines, :func:`_combined`), or None
    when it is not replayed (``pr.skipped`` then says why)."""
    g, (d0, cg0, tr0) = pr.g, base
    if rec is None:
        # a fix that saves less than the step-to-step noise leaves "all" at the other fix, within that noise
        if sum(w["scenario"] != ALL and w["saving_pct"] > pr.noise_pct for w in whatif) < 2:
            return None  # one fix that saves anything: "all" would replay it again
        arrs: Arrays = (d0, cg0, tr0)
        for s in _combined(applicable, pr.skipped):
            arrs = by_name(s).rewrite(g, *arrs, ctx)
        return arrs
    if rec.extends and not any(w["scenario"] == rec.extends for w in whatif):
        # offered with the fix it extends (channels_last with bf16 autocast): where that saves nothing, neither is
        pr.skipped[sc] = pr.skipped.get(rec.extends, NO_SAVING)
        return None
    arrs = rec.rewrite(g, d0, cg0, tr0, ctx)
    # a replay never saves more than the work the rewrite removes: a precision fix that removes less than
    # MIN_PRECISION_PCT of the step (within a run's step-to-step noise) is not replayed
    if rec.precision is not None and g.mode == "gpu" and float(np.clip(d0 - arrs[0], 0, None).sum()) / max(
            1, len(pr.m_long)) < max(MIN_SAVING_US, MIN_PRECISION_PCT / 100 * pr.m_run):
        pr.skipped[sc] = (f"{NO_SAVING}: the {sc} rewrite removes less than {MIN_PRECISION_PCT:g} % of the "
                          "step's work (within a run's step-to-step noise), so it was not replayed")
        return None
    if rec.saving_bound is not None and (bound := rec.saving_bound(
            g, arrs, d0, pr.floors(arrs[0], arrs[1]), pr.est, pr.m_long)) <= pr.noise_pct:
        pr.skipped[sc] = (f"{NO_SAVING}: removing the waits saves at most {bound:.2f} % of the step (the time "
                          "the host waits and copies, and no step below its busiest resource's work), within "
                          "the step-to-step noise "
                          f"({pr.noise_pct:.2f} %), so it was not replayed")
        return None
    return arrs


def _price_scenarios(pr: _Pricer, applicable: list[str], ctx: dict, base: Arrays, measured: dict, results: list,
                     err: float, reliable: bool) -> list[dict]:
    """The ``whatif`` rows of the applicable scenarios, each alone, then ``all`` together (when several); each
    replay's step times are appended to ``results`` (``sim_result`` rows)."""
    g, (d0, cg0, tr0), m_run, run_id = pr.g, base, pr.m_run, pr.g.run_id
    whatif: list[dict] = []
    for sc in [*applicable, *([ALL] if len(applicable) > 1 else [])]:
        rec = by_name(sc)
        pr.last_floors = None  # the last rewrite's arrays not held
        arrs = _rewritten(pr, sc, rec, applicable, ctx, base, whatif)
        if arrs is None:
            if rec is None:
                break
            continue
        parts = [rec] if rec is not None else [by_name(s) for s in applicable]
        pin = next((p.starts for p in parts if p.starts is not None), None)
        starts = pin(g, ctx) if pin is not None else None
        cut = np.clip(cg0 - arrs[1], 0, None) if pin is not None else None
        if rec is not None and rec.skip_off_path and not _on_path_changes(pr, arrs, (d0, cg0, tr0), starts):
            pr.skipped[sc] = (f"{NO_SAVING}: none of the work the {sc} rewrite changes is on the critical path of "
                              "the replayed steps, so it cannot shorten them (not replayed)")
            continue
        spanned = (d0 - arrs[0], cg0 - arrs[1]) if any(p.cuts_spans for p in parts) else None
        pred, t, clamped = pr.predict(arrs, sync_free=any(p.runs_ahead for p in parts), starts=starts, cut=cut,
                                      spanned=spanned)
        results += [[run_id, sc, r, s, measured[(r, s)], t[(r, s)]] for r, s in sorted(measured)]
        row = _whatif_row(g, sc, ctx, pred, pr.u_run, err, reliable)
        row["unexplained_gap_pct"] = pr.kept_on_path
        row["profiled_predicted_step_time_us"] = round(max(m_run - (pr.u_run - pred), 0.0), 3)
        row["profiled_saving_pct"] = round(100 * (pr.u_run - pred) / m_run, 2) if m_run else 0.0
        if clamped:
            row["assumptions"] += ("; clamped to the floor: no step shorter than the busy time of the work this "
                                   "fix leaves (each GPU stream's kernels, the host's remaining work)")
        if rec is not None and rec.precision is not None:
            _add_range(row, pr, rec, pred, arrs, (d0, cg0, tr0), ctx)
        if rec is not None and rec.split_note is not None:
            alone = next((w for w in whatif if w["scenario"] == rec.extends), None)
            row["assumptions"] += rec.split_note(row, alone) if alone is not None else ""
        if row["saving_us"] >= MIN_SAVING_US or rec is None:
            whatif.append(row)
        else:
            pr.skipped[sc] = (f"{NO_SAVING}: the {sc} rewrite saves less than {MIN_SAVING_US:g} µs per step on the "
                              "replayed graph (other work bounds the step)")
    return whatif


def _combined(applicable: list[str], skipped: dict[str, str]) -> list[str]:
    """The scenarios ``all`` combines: the applicable ones, less one that extends another that was not priced
    (``extends``: channels_last is offered with bf16 only), less those a combined one does all of (``supersedes``:
    bf16 does what TF32 does, bf16 + channels_last what bf16 alone does)."""
    used = [s for s in applicable if not ((e := by_name(s).extends) and e in skipped)]
    superseded = {x for s in used for x in by_name(s).supersedes}
    return [s for s in used if s not in superseded]


def _events_per_step(g: gr.Graph, counted: set) -> float | None:
    """Median over counted (rank, step) of the profiler-recorded host events, or None."""
    if g.prof_events is None:
        return None
    ev = g.prof_events[:3].sum(axis=0)  # events (row 3 counts the shapes they copied)
    sel = (g.step >= 0) & (ev > 0)
    if not sel.any():
        return None
    width, keys, inv = gr.rank_step_groups(g, np.flatnonzero(sel))
    tot = np.bincount(inv, weights=ev[sel])
    vals = [v for k, v in zip(keys.tolist(), tot.tolist(), strict=True) if divmod(k, width) in counted]
    return round(float(np.median(vals)), 1) if vals else None


def _replay_model(g: gr.Graph, base: simulate.Replay, measured: dict, base_t: dict, counted: set, m_run: float,
                  b_run: float, err: float) -> dict:
    """The JSON contract's ``replay``: the replay's fidelity against the measured step times, run and ranks."""
    ranks = []
    by_rank: dict[int, list] = {}
    for k in sorted(counted):  # once: sorting per rank was quadratic (0.5 s at 1,024 ranks)
        by_rank.setdefault(k[0], []).append(k)
    for r in g.ranks:
        ms = [measured[k] for k in by_rank.get(r, [])]
        bs = [base_t[k] for k in by_rank.get(r, [])]
        if ms:
            ranks.append({"rank": r, "measured_step_time_us": round(median(ms), 3),
                          "replayed_step_time_us": round(median(bs), 3),
                          "error_pct": round(abs(median(bs) - median(ms)) / median(ms) * 100, 2)})
    replay_model = {
        "measured_step_time_us": round(m_run, 3), "replayed_step_time_us": round(b_run, 3),
        "error_pct": round(err, 2), "ranks": ranks, "unmatched": list(g.unmatched),
        "missing_edges": list(g.missing_edges), "partial": g.partial, "collective_instances": g.n_instances,
        "tasks": int(g.start.size), "edges": int(g.dep_src.size), "passes": base.passes,
        "converged": base.converged, "reliable": err <= UNRELIABLE_ERROR_PCT and base.converged}
    if not base.converged:
        replay_model["unmatched"].append(f"the replay did not settle in {base.passes} passes")
    return replay_model


def _assumptions(sc: str, ctx: dict, g: gr.Graph) -> str:
    """A row's ``assumptions``: its record's, with the note on shared cores (:func:`_cores_note`)."""
    rec = by_name(sc)
    if rec is None:
        return "every applicable rewrite at once; savings do not add up"
    return rec.assumptions(ctx, g) + _cores_note(sc, ctx)


def _whatif_row(g: gr.Graph, sc: str, ctx: dict, pred: float, m_run: float, err: float, reliable: bool) -> dict:
    """One row of the JSON contract's ``whatif``: the scenario's predicted step time and saving; ``reliable`` false
    with ``unreliable_reason`` when the replay misses the measured step or did not settle, or when the fix changes
    how many ranks compute at once on ranks that share CPU cores (``ctx["core_sharing"]``)."""
    row = {"scenario": sc, "cause": CAUSES[sc], "predicted_step_time_us": round(pred, 3),
           "saving_pct": round(100 * (m_run - pred) / m_run, 2), "saving_us": round(m_run - pred, 3),
           "assumptions": _assumptions(sc, ctx, g),
           # replay_fidelity_pct: how far the replay of the measured run misses its measured step (not a check of the
           # prediction: docs/confidence.md); replay_error_pct, the same figure, kept for the JSON's readers
           "confidence": {"replay_fidelity_pct": round(err, 2), "replay_error_pct": round(err, 2),
                          "collective_instances": g.n_instances},
           "reliable": reliable}
    rec = by_name(sc)
    if rec is not None and rec.priced_from is not None and (src := rec.priced_from(ctx, g)):
        row["priced_from"] = src  # a baseline's measured figure priced it (only with --baseline)
    why = []
    if not reliable:
        why.append(f"the replay misses the measured step time by {err:.1f} % (over {UNRELIABLE_ERROR_PCT:g} %)"
                   if err > UNRELIABLE_ERROR_PCT else "the replay did not settle")
    cs = ctx.get("core_sharing") or {}
    if g.mode == "cpu" and cs.get("shared") and _changes_concurrency(sc, ctx):
        why.append(cs.get("why") or "the ranks share CPU cores")
    if why:
        row["reliable"] = False
        row["unreliable_reason"] = "; ".join(why)
    return row


LANE_SEGMENTS = 400  # segments drawn per rank lane at most (the longest kept)
LABELS = ("compute", "host", "wait", "communication", "transfer", "dataloader", "compile", "optimizer", "launch")
_GAP_TO_LABEL = np.array([LABELS.index(x) if x in LABELS else 1 for x in gr.GAP_LABELS], np.int64)


def _task_labels(g: gr.Graph, idx: np.ndarray) -> np.ndarray:
    """Label code (:data:`LABELS`) of each task in ``idx``: its category when over half its time, else compute
    (host ops of CPU runs, device work) or host (runtime calls of GPU runs)."""
    lab = np.full(idx.size, 0 if g.mode != "gpu" else 1, np.int64)
    lab[g.kind[idx] != gr.K_HOST] = 0
    for c in ("optimizer", "compile", "dataloader"):
        lab[g.cover[c][idx] > 0.5 * g.dur[idx]] = LABELS.index(c)
    lab[g.kind[idx] == gr.K_COLL] = LABELS.index("communication")
    return lab


def _merge(start: np.ndarray, length: np.ndarray, lab: np.ndarray, crit: np.ndarray, tiny: float) -> list[list]:
    """Adjacent segments of one label and critical-path flag joined, and segments shorter than ``tiny`` µs
    folded into the one before: a lane stays a few dozen shapes whatever the op count. Input sorted by start."""
    if start.size == 0:
        return []
    end = start + length
    new = np.ones(start.size, dtype=bool)
    prev_end = np.maximum.accumulate(end)[:-1]
    joined = (start[1:] - prev_end <= tiny) & (((lab[1:] == lab[:-1]) & (crit[1:] == crit[:-1])) | (length[1:] < tiny))
    new[1:] = ~joined
    heads = np.flatnonzero(new)
    ends = np.maximum.reduceat(end, heads)
    return [[round(float(a), 1), round(float(b - a), 1), LABELS[int(c)], bool(k)]
            for a, b, c, k in zip(start[heads], ends, lab[heads], crit[heads], strict=True)]


def _picture(g: gr.Graph, rp: simulate.Replay, measured, counted, m_long, sk: skew.Skew | None = None) -> dict:
    """Lanes of the median counted step (one per rank shown; host thread of the step, then collectives), replayed
    times relative to the step's earliest start, critical-path tasks marked.

    At most :data:`~traceanalyze.metrics.where.MAX_TIMELINE_LANES` ranks are drawn, as in the measured timeline
    (:func:`~traceanalyze.metrics.where.lanes_to_show`): the rank that kept the others waiting, the slowest rank,
    the fastest, then ranks spread evenly; ``n_ranks`` says how many had the step. ``critical`` (the ★) marks the
    rank that kept the others waiting longest in that step (``sk``: :func:`.skew.collective_skew`, the others'
    waits summed at the instances it arrived last), never the one that waited: the slowest rank's step is the
    longest because it waits; none is marked when no rank kept another waiting (``kept_waiting_rank`` None)."""
    if not m_long:
        return {}
    steps_sorted = sorted(m_long, key=lambda s: m_long[s])
    step = steps_sorted[(len(steps_sorted) - 1) // 2]
    marks = {r: (b, e) for r, s, b, e, c in g.steps if s == step and (r, s) in counted}
    if not marks:
        return {}
    t0 = min(rp.start[b] for b, _ in marks.values())
    slow = max(marks, key=lambda r: rp.start[marks[r][1]] - rp.start[marks[r][0]])
    fast = min(marks, key=lambda r: rp.start[marks[r][1]] - rp.start[marks[r][0]])
    kept = {r: w for r, w in (sk.kept_in_step(step) if sk is not None else {}).items() if r in marks and w > 0}
    star = max(sorted(kept), key=lambda r: kept[r]) if kept else None
    show = set(lanes_to_show(sorted(marks), [r for r in (star, slow, fast) if r is not None], MAX_TIMELINE_LANES))
    on_path = np.zeros(g.start.size, dtype=bool)
    on_path[simulate.critical_path(g, rp, marks[slow][1], rp.start[marks[slow][0]])] = True
    waits = np.zeros(g.start.size, dtype=bool)
    waits[g.dep_dst[g.dep_type >= 1]] = True
    ct = np.flatnonzero(g.kind == gr.K_COLL)
    lanes = []
    for r in sorted(show):
        b, e = marks[r]
        lo, hi = rp.start[b], rp.start[e]
        tiny = (hi - lo) / 1000
        host = np.arange(b + 1, e)  # the step's thread: tasks between its markers (resource order)
        gp = host[(g.gap[host] > 0) & ~g.first[host]]
        gap_start = np.maximum(rp.end[gp - 1], lo)
        gap_lab = np.where(g.gap_label[gp] >= 0, _GAP_TO_LABEL[np.clip(g.gap_label[gp], 0, None)], 1)
        gap_lab[waits[gp]] = LABELS.index("wait")
        st = np.concatenate([gap_start, rp.start[host]])
        ln = np.concatenate([rp.start[gp] - gap_start, rp.end[host] - rp.start[host]])
        lab = np.concatenate([gap_lab, _task_labels(g, host)])
        crit = np.concatenate([on_path[gp], on_path[host]])
        o = np.argsort(st, kind="stable")
        keep = ln[o] > 0
        top = _merge(st[o][keep] - t0, ln[o][keep], lab[o][keep], crit[o][keep], tiny)
        cc = ct[(g.rank[ct] == r) & (rp.start[ct] >= lo) & (rp.start[ct] < hi)]
        cc = cc[np.argsort(rp.start[cc], kind="stable")]
        bottom = _merge(rp.start[cc] - t0, rp.end[cc] - rp.start[cc], np.full(cc.size, LABELS.index("transfer")),
                        on_path[cc], tiny)
        segs = [[*x, 0] for x in top] + [[*x, 1] for x in bottom]
        if len(segs) > LANE_SEGMENTS:
            keep_i = sorted(range(len(segs)), key=lambda k: (-segs[k][3], -segs[k][1]))[:LANE_SEGMENTS]
            segs = [segs[k] for k in sorted(keep_i)]
        lanes.append({"rank": r, "step_us": round(float(hi - lo), 1), "start_us": round(float(lo - t0), 1),
                      "end_us": round(float(hi - t0), 1), "critical": r == star, "segments": segs})
    span = max(ln["end_us"] for ln in lanes) or 1.0
    return {"step": step, "span_us": span, "lanes": lanes, "slowest_rank": slow, "kept_waiting_rank": star,
            "kept_waiting_us": round(kept[star], 1) if star is not None else None, "n_ranks": len(marks)}


__all__ = ["CAUSES", "CPU_BF16_SPEEDUP", "MIN_SAVING_US", "NO_SAVING", "SCENARIOS", "UNRELIABLE_ERROR_PCT",
           "pipelined_step_times", "replay_run"]
