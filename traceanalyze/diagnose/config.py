"""Config rules: torch.compile, the data loader, a launch- or host-bound step, the effective batch, memory."""

from __future__ import annotations

import statistics

from traceanalyze.diagnose.evidence import (
    HOST_BOUND_WAIT_PCT,
    RunEvidence,
    main_stream_host_wait,
    ms_text,
    rank_steps,
    severity,
    step_us,
)
from traceanalyze.findings import Finding
from traceanalyze.fmt import fmt_bytes, ranges
from traceanalyze.limits import MAX_BATCH, MAX_GRAD_ACCUM, MAX_WORLD_SIZE, whole_in_bounds
from traceanalyze.metrics.host import OPTIMIZER_MIN_KERNELS
from traceanalyze.replay.scenarios import for_kind

MIN_COMPILE_PCT = 10.0  # compile share of a job whose length a log or config states, worth a finding
MIN_COMPILE_STEADY_STEPS = 100  # without a stated job length: a compile that costs this many steady steps ...
MIN_COMPILE_S = 60.0  # ... or this many seconds is a finding (medium: its share of the job is not known)
COMPILE_FILLS_PCT = 50.0  # compile share of a window without a steady step that makes the window a compile window
COMPILE_FILLS_TITLE = "torch.compile fills the profiled window"
COMPILE_CACHE_ADVICE = ("keep the compile cache warm between runs: a persistent TORCHINDUCTOR_CACHE_DIR with "
                        "TORCHINDUCTOR_FX_GRAPH_CACHE=1 (and TORCHINDUCTOR_AUTOGRAD_CACHE=1), or the mega-cache "
                        "torch.compiler.save_cache_artifacts() / load_cache_artifacts() across machines; compile per "
                        "block (regional compilation) for large models")
PROFILE_AFTER_WARMUP = ("profile after warm-up: torch.profiler.schedule(wait=1, warmup=2, active=3) with the compile "
                        "step in wait/warmup, so the trace holds steady steps")
MIN_LOADER_PCT = 10.0
HOST_BOUND_IDLE_PCT = 40.0  # GPU idle from which host wait is looked at
MIN_HOST_SYNC_PCT = 10.0  # GPU idle inside blocking calls, % of the step, worth a finding
STEP_SYNC_WHATIF = for_kind("step_sync").name  # the what-if whose saving a step_sync finding is (the host runs ahead)
MIN_OPTIMIZER_PCT = 10.0  # host-bound optimizer time, % of the step, worth a finding
TINY_KERNEL_US = 20.0  # median kernel at or below this: the host's launches, not its other work, set the pace


def job_steps(ev: RunEvidence) -> float | None:
    """The job's number of optimizer steps when a log or config states it (``total_optimization_steps``, which
    ``max_steps`` and ``training.steps`` also state), else None."""
    v = ev.fact("total_optimization_steps")
    try:
        n = float(v) if v is not None else 0.0
    except ValueError:
        return None
    return n if n > 0 else None


def compile_fills_window(ev: RunEvidence) -> float | None:
    """The share (%) of the profiled window that torch.compile takes when the window holds no steady step to measure
    (no step besides the compile step, or a single step), and it is :data:`COMPILE_FILLS_PCT` % or more; else
    None."""
    c = ev.compile
    if c is None or not c.compile_us:
        return None
    others = {s["step"] for s in ev.steps if s["step"] != ev.compile_step}
    if (ev.compile_step is None and len(others) >= 2) or (ev.compile_step is not None and others):
        return None
    worst = max(c.compile_us, key=c.compile_us.get)
    window = c.window_us.get(worst) or 0.0
    share = 100 * c.compile_us[worst] / window if window else 0.0
    return min(share, 100.0) if share >= COMPILE_FILLS_PCT else None


def compile_cost_us(ev: RunEvidence) -> tuple[float, str]:
    """What torch.compile costs once (µs) and how it was measured: the compile step's time above the steady step
    when the trace has a compile step, else the longest rank's dynamo/inductor compile ranges."""
    c = ev.compile
    ranges_us = max(c.compile_us.values()) if c and c.compile_us else 0.0
    if ev.compile_step is not None and c and c.first_step_us and c.steady_step_us:
        return c.first_step_us - c.steady_step_us, "the compile step above the steady step"
    return ranges_us, "dynamo/inductor compile ranges"


def rule_compile(ev: RunEvidence) -> list[Finding]:
    """Config: torch.compile's one-time cost (per cold start), weighed against the job when a log or config states
    its length (impact = compile / (steps × steady step)); without one the finding says the cost per restart and is
    medium at most. A window that holds only the compile step is said as such (the steady step is unknown). Frames
    that recompile are a finding of their own."""
    c = ev.compile
    if c is not None and c.compile_us:
        fills = compile_fills_window(ev)
        out = [_compile_window_finding(ev, fills)] if fills is not None else _compile_trace_finding(ev)
        if c.recompiles:
            impact = round(min(out[0].impact_pct if out else 0.0, 5.0), 1)
            out.append(Finding("config", "recompiles", "medium" if c.recompiles > 2 else "low", impact,
                               sorted(c.compile_us), f"{c.recompiles} recompilation(s) of compiled frames",
                               [f"{c.frames} frame(s) compiled, {c.recompiles} recompiled (compile id R > 0)"],
                               "run with TORCH_LOGS=recompiles to see the failing guard; mark dynamic dims with "
                               "torch._dynamo.mark_dynamic or keep shapes static (pad batches)"))
        return out
    return _compile_log_finding(ev) if ev.fact("compile_time_s") else []


def _compile_window_finding(ev: RunEvidence, share: float) -> Finding:
    c = ev.compile
    worst = max(c.compile_us, key=c.compile_us.get)
    comp, window = c.compile_us[worst], c.window_us.get(worst) or 0.0
    title = (f"{COMPILE_FILLS_TITLE} ({comp / 1e6:,.1f} s of {window / 1e6:,.1f} s on rank {worst}): "
             "the steady step is unknown")
    lines = [f"rank {worst} spends {comp / 1e6:,.1f} s in dynamo/inductor compile ranges, {share:.0f}% of its "
             f"{window / 1e6:,.1f} s profiled window, and the trace holds no step after the compile step: the "
             "steady step time cannot be measured from it",
             f"{len(c.compile_us)} rank(s) compile; {c.frames} compiled frame(s), {c.recompiles} recompile(s)"]
    return Finding("config", "compile_overhead", "medium", round(share, 1), sorted(c.compile_us), title, lines,
                   f"{PROFILE_AFTER_WARMUP}; {COMPILE_CACHE_ADVICE}",
                   assumption="a one-time cost per cold start; the steady step is not in the trace")


def _compile_trace_finding(ev: RunEvidence) -> list[Finding]:
    c = ev.compile
    worst = max(c.compile_us, key=c.compile_us.get)
    cost, how = compile_cost_us(ev)
    steady = c.steady_step_us or ev.step_time_us or 0.0
    n_job = job_steps(ev)
    equiv = cost / steady if steady else 0.0
    lines = [f"torch.compile costs {cost / 1e6:,.1f} s ({how}) once per cold start: every restart without a warm "
             f"compile cache pays it again; {c.compile_us[worst] / 1e6:,.1f} s in dynamo/inductor compile ranges on "
             f"rank {worst}", f"{c.frames} compiled frame(s), {c.recompiles} recompile(s)"]
    if c.first_step_us and c.steady_step_us:
        lines.append(f"first profiled step {ms_text(c.first_step_us)} vs steady state {ms_text(c.steady_step_us)} "
                     f"({c.first_step_us / c.steady_step_us:.0f}×)")
    if ev.fact("compile_time_s"):
        lines.append(f"log: compile took {float(ev.fact('compile_time_s')):,.0f} s")
    if n_job:
        share = 100 * cost / (cost + n_job * steady) if cost + n_job * steady else 0.0
        if share < MIN_COMPILE_PCT:
            return []
        impact, sev, assumed = round(share, 1), severity(share), ""
        title = f"torch.compile took {cost / 1e6:,.1f} s once (a cold start): {share:.0f}% of a {n_job:,.0f}-step job"
        lines.insert(1, f"{share:.0f}% of the job's {n_job:,.0f} steps (stated by a log or config) at the steady "
                        f"{ms_text(steady)} per step")
    else:
        if equiv < MIN_COMPILE_STEADY_STEPS and cost < MIN_COMPILE_S * 1e6:
            return []
        window = c.window_us.get(worst) or 0.0
        impact = round(min(100.0, 100 * cost / window), 1) if window else 0.0
        sev, assumed = "medium", "a one-time cost per cold start: no log or config states the number of steps"
        title = (f"torch.compile took {cost / 1e6:,.1f} s once (a cold start), the time of {equiv:,.0f} steady "
                 "steps" if steady else f"torch.compile took {cost / 1e6:,.1f} s once (a cold start)")
        lines.insert(1, f"no log or config states the job's length: the cost is per restart, {equiv:,.0f} steady "
                        f"steps of {ms_text(steady)}; {impact:.0f}% of the profiled window (its impact here)")
    return [Finding("config", "compile_overhead", sev, impact, sorted(c.compile_us), title, lines,
                    f"{COMPILE_CACHE_ADVICE}; {PROFILE_AFTER_WARMUP}", assumption=assumed)]


def _compile_log_finding(ev: RunEvidence) -> list[Finding]:
    """A compile time a log states (no compile ranges in a trace): weighed against the stated job, else against the
    logged steps (medium at most)."""
    secs = float(ev.fact("compile_time_s"))
    steps = [s.step_time_ms for s in ev.log_steps if s.step_time_ms]
    n_job = job_steps(ev)
    impact = 0.0
    if n_job and steps:
        impact = round(100 * secs * 1e3 / (secs * 1e3 + n_job * statistics.median(steps)), 1)
    elif steps:
        impact = round(min(100.0, 100 * secs * 1e3 / (secs * 1e3 + sum(steps))), 1)
    elif n_job is not None and secs >= 600:
        impact = 30.0  # a stated job without step times: ten minutes or more of compile is worth a ticket
    if not (secs >= 60 or impact >= MIN_COMPILE_PCT):
        return []
    sev = severity(impact)
    if not (n_job and steps) and sev == "high":
        sev = "medium"  # without a stated job length (or step time) the share of the job is not known
    return [Finding("config", "compile_overhead", sev, impact, [],
                    f"torch.compile took {secs / 60:,.0f} min before training started",
                    [f"log: compile time {secs:,.0f} s, once per cold start (every restart pays it again)"]
                    + ([f"the job states {n_job:,.0f} steps"] if n_job else []),
                    f"{COMPILE_CACHE_ADVICE}; check host memory: compile workers of every rank share it")]


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
                     f"{ld.share_pct[worst]:.1f}%, {ms_text(ld.loader_us[worst])} over the profiled steps)"],
                    "use DataLoader(num_workers=4 or more, pin_memory=True, persistent_workers=True, "
                    "prefetch_factor=2) and move expensive per-sample transforms offline or into the workers")]


def rule_launch_bound(ev: RunEvidence) -> list[Finding]:
    """Config: the GPU idles waiting for the host. Read from the idle breakdown, not a kernel count: the GPU is idle
    :data:`HOST_BOUND_IDLE_PCT` % or more and host wait (the next kernel launched only after the previous one
    ended; HTA idle-time breakdown) is :data:`HOST_BOUND_WAIT_PCT` % or more of the busiest stream's idle time.
    ``launch_bound`` when kernels are tiny (median ≤ :data:`TINY_KERNEL_US` µs: launches set the pace, CUDA graphs
    help), else ``host_bound`` (the CPU does other work between launches). Impact: half the idle share.

    Read from the steady steps only: with a compile step, the idle share is the steady steps' and the host wait and
    kernel figures those of :func:`traceanalyze.metrics.host.steady_launch_stats`; a window that holds only the
    compile step gives no finding."""
    if ev.mode != "gpu" or not ev.ranks or compile_fills_window(ev) is not None:
        return []
    steady = steady_launch(ev)
    if steady is None:
        return []
    idle, host_wait, ln, where = steady
    if idle < HOST_BOUND_IDLE_PCT or host_wait is None or host_wait < HOST_BOUND_WAIT_PCT:
        return []
    step = ev.step_time_us or 0.0
    tiny = ln is not None and ln.median_kernel_us is not None and ln.median_kernel_us <= TINY_KERNEL_US
    evidence = [f"GPU idle {idle:.0f}% of {where} (median over ranks); host wait is {host_wait:.0f}% of the "
                "idle time on the busiest stream (the CPU had not launched the next kernel yet; HTA idle-time "
                "breakdown)"]
    if ln is not None and ln.kernels_per_step:
        dens = f", {ln.kernels_per_step / (step / 1e3):,.1f} per ms of step" if step else ""
        evidence.append(f"{ln.kernels_per_step:,.0f} kernels per step{dens}, median "
                        f"{ln.median_kernel_us or 0:.1f} µs each; launch calls take "
                        f"{ms_text(ln.launch_us_per_step)} per "
                        "step on the host")
    if ev.prec is not None and ev.prec.matmul_efficiency_pct is not None:
        evidence.append(f"matrix-math efficiency {ev.prec.matmul_efficiency_pct:.1f}% "
                        f"({ev.prec.achieved_tflops:.1f} TFLOPS of {ev.prec.peak_tflops:g} while GEMMs run)")
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


def steady_launch(ev: RunEvidence) -> tuple[float, float | None, object, str] | None:
    """(GPU idle %, host wait % of the busiest stream's idle, launch stats, what the idle covers) for the launch rule:
    the trace window's figures, or with a compile step the steady steps' (None when they are missing)."""
    if ev.compile_step is None:
        return (statistics.median(r["idle_pct"] for r in ev.ranks), main_stream_host_wait(ev), ev.launch,
                "the trace window")
    if ev.host is None or ev.host.steady_launch is None:
        return None
    per_rank = []
    for r in ev.ranks:
        rs = [s for s in rank_steps(ev, r["rank"]) if s["step"] != ev.compile_step and s.get("step_time_us")]
        if rs:
            per_rank.append(statistics.median(100 * s["idle_us"] / s["step_time_us"] for s in rs))
    if not per_rank:
        return None
    return (statistics.median(per_rank), ev.host.steady_host_wait_pct, ev.host.steady_launch,
            "the steady steps")


def rule_host_sync(ev: RunEvidence) -> list[Finding]:
    """Config: the host waits for the GPU in a blocking CUDA call (a ``*Synchronize``, or a copy that blocks:
    ``.item()``, ``.cpu()``, a device-to-host or pageable ``.to()``), per steady step
    (:func:`traceanalyze.metrics.host.blocking_calls`). Two costs: the GPU idles while the host sits in the call
    (impact: on the rank where it is largest, that idle time over the step; the other ranks wait for it in their
    collectives), or, for a wait at the step's end while the GPU is busy, the GPU idles after it while the host
    launches the next step (impact: the ``no_host_sync`` replay's saving, the host running ahead). A finding from
    :data:`MIN_HOST_SYNC_PCT` %; none without a profiler step."""
    # without a profiler step there is no step to take a share of (the GPU window is not one)
    if ev.mode != "gpu" or ev.host is None or not ev.host.blocking or not ev.ranks or not ev.steps:
        return []
    by_rank: dict[int, list] = {}
    for b in ev.host.blocking:
        by_rank.setdefault(b.rank, []).append(b)
    shares = {}
    for r in ev.ranks:
        # a step is at least as long as the blocking calls in it: a share never passes 100 %
        step = max(step_us(ev, r), sum(b.us_per_step for b in by_rank.get(r["rank"], [])))
        if r["rank"] in by_rank and step > 0:
            shares[r["rank"]] = 100 * sum(b.gpu_idle_us_per_step for b in by_rank[r["rank"]]) / step
    if not shares:
        return []
    worst = max(shares, key=shares.get)
    impact = round(shares[worst], 1)
    if impact < MIN_HOST_SYNC_PCT:
        return _step_sync(ev, by_rank)
    rows = sorted(by_rank[worst], key=lambda b: -b.gpu_idle_us_per_step)
    top = rows[0]
    ranks = sorted(r for r, v in shares.items() if v >= MIN_HOST_SYNC_PCT)
    step = next(step_us(ev, r) for r in ev.ranks if r["rank"] == worst)
    where = f" under {top.op}" if top.op else ""
    idle_us = sum(b.gpu_idle_us_per_step for b in rows)
    evidence = [f"rank {worst}: {ms_text(sum(b.us_per_step for b in rows))} of its {ms_text(step)} step in blocking "
                f"CUDA calls, the GPU idle for {ms_text(idle_us)} of it ({impact:.0f}% of the step)"]
    evidence += _blocking_lines(rows)
    if len(ranks) > 1 or len(ev.ranks) > 1:
        evidence.append(f"ranks blocking {MIN_HOST_SYNC_PCT:g}% of the step or more: {ranges(ranks)} of "
                        f"{len(ev.ranks)} traced; the others wait for them in their collectives")
    return [Finding("config", "host_sync", severity(impact), impact, ranks,
                    f"The host blocks in {top.call}{where}: the GPU idles {ms_text(idle_us)} "
                    f"({impact:.0f}%) of each step on rank {worst}", evidence, _sync_advice(rows))]


def _blocking_lines(rows: list) -> list[str]:
    return [f"{b.call}{_op_path(b)}: {b.calls_per_step:g} call(s) per step, {ms_text(b.us_per_step)} per step, "
            f"GPU idle {ms_text(b.gpu_idle_us_per_step)} (longest call {ms_text(b.max_us)})" for b in rows[:3]]


def _step_sync(ev: RunEvidence, by_rank: dict[int, list]) -> list[Finding]:
    """``step_sync``: the host waits while the GPU is busy (the GPU idles little in the call), then the GPU idles
    while the host launches the next step: priced by the ``no_host_sync`` replay (the host running ahead), a finding
    when that saves :data:`MIN_HOST_SYNC_PCT` % or more. None on a partial run: there the host waits for collectives
    that wait for untraced ranks, whose timing no replay can move."""
    if ev.world_size and len(ev.ranks) < ev.world_size:
        return []
    w = next((x for x in ev.whatif if x.get("scenario") == STEP_SYNC_WHATIF and x.get("reliable")), None)
    if w is None or not isinstance(w.get("saving_pct"), (int, float)) or w["saving_pct"] < MIN_HOST_SYNC_PCT:
        return []
    rank = max(by_rank, key=lambda r: sum(b.us_per_step for b in by_rank[r]))
    rows = sorted(by_rank[rank], key=lambda b: -b.us_per_step)
    top, impact = rows[0], round(float(w["saving_pct"]), 1)
    where = f" under {top.op}" if top.op else ""
    u = w["predicted_step_time_us"] + w["saving_us"]
    evidence = [f"rank {rank}: the host waits {ms_text(sum(b.us_per_step for b in rows))} per step in blocking CUDA "
                f"calls while the GPU works; the GPU then idles while the host launches the next step",
                f"without the wait (no_host_sync replay: the host queues the next step while the GPU runs) the step "
                f"takes {ms_text(w['predicted_step_time_us'])} instead of {ms_text(u)}, without the profiler",
                *_blocking_lines(rows)]
    return [Finding("config", "step_sync", severity(impact), impact, sorted(by_rank),
                    f"The host waits for the GPU in {top.call}{where} every step: the GPU idles while the next "
                    f"step is launched ({impact:.0f}% of the step)", evidence,
                    "let the host run ahead: no torch.cuda.synchronize() or .item() in every step (time with CUDA "
                    "events; read the loss every N steps); " + _sync_advice(rows))]


def _op_path(b) -> str:
    ops = [o for o in (b.op, b.inner_op) if o]
    ops = ops[:1] if len(ops) == 2 and ops[0] == ops[1] else ops
    return f" under {' › '.join(ops)}" if ops else " (outside any op)"


def _sync_advice(rows: list) -> str:
    names = {o for b in rows[:3] for o in (b.op, b.inner_op) if o}
    calls = {b.call for b in rows[:3]}
    out = []
    if names & {"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"}:
        out.append(".item() (or a Python if/print on a GPU tensor) waits for the GPU each step: keep the value on "
                   "the GPU (accumulate the loss in a tensor) and read it every N steps")
    if names & {"aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu"} or any("Memcpy" in c for c in calls):
        out.append("a copy between host and GPU blocks: copy from pinned memory (DataLoader(pin_memory=True) or "
                   "tensor.pin_memory()) with .to(device, non_blocking=True), and no .cpu()/.tolist()/.numpy() "
                   "inside the step")
    if any("Synchronize" in c for c in calls) and not names:
        out.append("an explicit torch.cuda.synchronize() (or stream/event synchronize) in the step: remove it, "
                   "time with CUDA events")
    out.append("find every sync in the step with torch.cuda.set_sync_debug_mode('warn')")
    return "; ".join(out)


def rule_host_optimizer(ev: RunEvidence) -> list[Finding]:
    """Config: the optimizer's step takes a large share of a host-bound step because it launches kernels per
    parameter (no ``multi_tensor_apply`` or fused kernel, no ``aten::_foreach_``/``_fused_`` op in it:
    ``foreach=False``), :func:`traceanalyze.metrics.host.optimizer_stats`. Impact: its host time per steady step
    over the step, times the GPU's idle share of the step (a GPU-bound step hides host time)."""
    o = ev.host.optimizer if ev.host is not None else None
    if ev.mode != "gpu" or o is None or o.multi_tensor or o.kernels_per_step < OPTIMIZER_MIN_KERNELS:
        return []
    step = ev.step_time_us or 0.0
    if not step or not ev.ranks:
        return []
    opt_us = statistics.median(o.us_per_step.values())
    idle = statistics.median(_steady_idle_pct(ev, r["rank"]) for r in ev.ranks)
    share = 100 * opt_us / step
    impact = round(share * idle / 100, 1)
    if impact < MIN_OPTIMIZER_PCT:
        return []
    evidence = [f"{o.name} takes {ms_text(opt_us)} of the {ms_text(step)} step on the host ({share:.0f}%), "
                f"launching {o.kernels_per_step:,.0f} kernels per step, none of them multi-tensor or fused: the "
                "optimizer loops over the parameters (foreach=False)",
                f"the GPU is idle {idle:.0f}% of the steady step: the host's time is the step's"]
    return [Finding("config", "host_optimizer", severity(impact), impact, sorted(o.us_per_step),
                    f"The optimizer step takes {share:.0f}% of the step on the host, one kernel per parameter",
                    evidence,
                    "construct the optimizer with fused=True (e.g. torch.optim.AdamW(params, fused=True): one "
                    "kernel for all parameters), or foreach=True (a few multi-tensor kernels); or compile or "
                    "CUDA-graph the optimizer step")]


def _steady_idle_pct(ev: RunEvidence, rank: int) -> float:
    rs = [s for s in rank_steps(ev, rank) if s.get("step_time_us")]
    return statistics.median(100 * s["idle_us"] / s["step_time_us"] for s in rs) if rs else 0.0


GA_WHATIF = for_kind("gradient_accumulation")  # its what-if: arithmetic on the stated batch (replay.scenarios.batch)


def _stated_count(ev: RunEvidence, key: str, bound: float) -> int | None:
    """A batch fact as a whole number from 1 to ``bound``, else None (the logs' check warned and dropped a bad one,
    :func:`traceanalyze.logs.batch.check_batch_facts`; this never trusts that it ran)."""
    v = ev.fact(key)
    try:
        v = float(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None
    return whole_in_bounds(v, bound) if v is not None else None


def _ga_context(ev: RunEvidence, ga: int, ws: int) -> dict:
    """The stated batch and the measured step that :data:`GA_WHATIF`'s ``price`` reads."""
    comm = [statistics.median(s["exposed_comm_us"] for s in ev.steps_of(r["rank"])) for r in ev.ranks
            if ev.steps_of(r["rank"])] if ev.steps else []
    acc = ev.accumulation or {}
    c = {"ga": ga, "ws": ws, **{k: _stated_count(ev, f, MAX_BATCH) for k, f in (
        ("pdb", "per_device_batch"), ("global_batch", "global_batch"), ("seq_len", "seq_len"),
        ("num_examples", "num_examples"))},
         "step_us": ev.step_time_us if ev.mode in ("gpu", "cpu") else None,
         "profiler_step": acc.get("profiler_step"), "per_step": acc.get("per_step"),
         "optimizer_us": acc.get("optimizer_us"), "comm_us": statistics.median(comm) if comm else None}
    runtime, steps = ev.fact("train_runtime_s"), job_steps(ev)
    if not c["step_us"] and isinstance(runtime, float) and 0 < runtime < 1e9 and steps:  # an HF log, no trace
        c.update(step_us=1e6 * runtime / steps, profiler_step="optimizer step",
                 step_source=f"the log's train_runtime {runtime:,.1f} s / {steps:,.0f} optimizer steps")
    return c


def rule_effective_batch_single(ev: RunEvidence) -> list[Finding]:
    """Config (no baseline): gradient accumulation kept while the data-parallel size grew, the LLaMA-Factory fault
    (SFT on 8 cards with ``gradient_accumulation_steps`` kept from 1 card: world size × the effective batch, 1/world
    size the optimizer steps per epoch, a loss that does not match the 1-GPU run's). It changes what is trained,
    not the step time: ``impact_pct`` None, ``effect`` says what it changes, and :data:`GA_WHATIF` (``ga_scaled``)
    prices the fix by arithmetic.

    Evidence: world size > 1 and gradient accumulation > 1 (GA is how one GPU reaches a batch its memory cannot
    hold). Medium when GA ≥ the world size: dividing GA by it gives back the 1-GPU run's effective batch (within
    rounding), the shape of a 1-GPU recipe copied unchanged; low when GA < the world size: GA cannot go below 1,
    and a small GA on many ranks is as often a recipe tuned for them. Never high without a baseline: that the
    recipe came from one GPU is an assumption (with ``--baseline`` the comparison's finding states it)."""
    ga = _stated_count(ev, "gradient_accumulation_steps", MAX_GRAD_ACCUM)
    ws_v = ev.fact("world_size") or ev.world_size
    ws = whole_in_bounds(float(ws_v), MAX_WORLD_SIZE) if isinstance(ws_v, (int, float)) else None
    if not ga or not ws or ga <= 1 or ws <= 1:
        return []
    row = GA_WHATIF.price(_ga_context(ev, ga, ws)) if GA_WHATIF and GA_WHATIF.price else None
    if row is None:
        return []
    eff, new = row["effective_batch"], row["gradient_accumulation_steps"][1]
    title = (f"Effective batch {eff[0]:,.0f} is {ws}× a 1-GPU run's {eff[0] / ws:,.0f}: gradient accumulation {ga} "
             f"kept on {ws} ranks" if eff else
             f"Gradient accumulation {ga} kept on {ws} ranks: {ws}× the effective batch of a 1-GPU run")
    effect = (f"{ws}× the samples per optimizer step and 1/{ws} of the optimizer steps per epoch of a 1-GPU run of "
              "this recipe: the loss curve and learning-rate schedule will not match it")
    stated = f"gradient_accumulation_steps={ga}, world size {ws}" + (
        f", per-device batch {eff[0] / ga / ws:g}: effective batch {eff[0]:,.0f}" if eff else "")
    fix = (f"divide gradient_accumulation_steps by {ws} ({ga} → {new}) to keep the 1-GPU run's effective batch; or, "
           "if the larger batch is meant, scale the learning rate with it (linear scaling) and expect 1/"
           f"{ws} of the optimizer steps per epoch")
    return [Finding("config", "gradient_accumulation", "medium" if ga >= ws else "low", None, [], title,
                    [stated, *row["lines"]], fix,
                    assumption="if this recipe came from a 1-GPU run: no baseline or config says so", effect=effect)]


# --- memory (traces recorded with profile_memory=True: runs[i].ranks[j].memory, traceanalyze.metrics.memory) -------
MIN_GROWTH_BYTES = 1 << 20  # allocated memory rising by at least this per step (median increment) is a leak
GROWTH_HIGH_STEPS = 1000  # a leak that fills the GPU within this many more steps is high severity
NEAR_CAPACITY = 0.95  # a GPU's peak reserved at or above this share of its total memory
IMBALANCE_RATIO = 1.5  # one rank's peak allocated at or above this × the median rank's
IMBALANCE_MEDIUM_SHARE = 0.8  # ... medium when that rank's peak reserved is at least this share of its GPU
MEMORY_KINDS = ("memory_growth", "memory_near_capacity", "memory_imbalance")
LEAK_ADVICE = ("find what keeps tensors from one step to the next: a list or dict appended to every step (keep "
               "loss.item(), not the loss tensor), a cache or hook that holds activations, outputs kept with their "
               "autograd graph (detach them); torch.cuda.memory._record_memory_history() and "
               "torch.cuda.memory._dump_snapshot() show the stack of each allocation that stays")


def _memory_rows(ev: RunEvidence) -> list[dict]:
    """Every rank's memory rows (one per device), each with its ``rank``."""
    return [m for r in ev.ranks for m in (r.get("memory") or []) if isinstance(m, dict)]


def rule_memory_growth(ev: RunEvidence) -> list[Finding]:
    """Config, medium (high when the leak fills the GPU within :data:`GROWTH_HIGH_STEPS` more steps): on some rank
    and device the allocated memory at the end of each profiler step rises every step, by a median of at least
    :data:`MIN_GROWTH_BYTES` per step. A leak ends in an out-of-memory error, so it is worth a ticket whatever it
    costs the step (impact 0: it does not slow the step, no what-if prices it). Names the ranks, the bytes per
    step and the ops whose allocations inside the steps are never freed (``unfreed_ops``)."""
    grow = [m for m in _memory_rows(ev) if _grows(m)]
    if not grow:
        return []
    grow.sort(key=lambda m: (-m["growth_bytes_per_step"], m["rank"], m["device"]))
    ranks = sorted({m["rank"] for m in grow})
    sev = "medium"
    evidence = []
    for m in grow[:8]:
        evidence.append(_growth_line(m))
        steps_left = _steps_to_full(m)
        if steps_left is not None:
            evidence.append(f"rank {m['rank']} {m['device']}: at this rate its {fmt_bytes(m['total_bytes'])} are "
                            f"full in about {steps_left:,.0f} more steps (peak reserved "
                            f"{fmt_bytes(m['peak_reserved_bytes'])})")
            if steps_left <= GROWTH_HIGH_STEPS:
                sev = "high"
        if m.get("unfreed_ops"):
            evidence.append(_unfreed_line(m))
    top = grow[0]
    who = f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}"
    op = f" (allocations of {top['unfreed_ops'][0]['op']} never freed)" if top.get("unfreed_ops") else ""
    title = (f"Memory grows every step on {who}: +{fmt_bytes(top['growth_bytes_per_step'])} per step on "
             f"{top['device']}{op}")
    f = Finding("config", "memory_growth", sev, 0.0, ranks, title, evidence, LEAK_ADVICE,
                assumption="a leak does not slow the step: it ends the job in an out-of-memory error")
    return [f]


def _grows(m: dict) -> bool:
    """A device row whose allocated memory rises every step by a median of :data:`MIN_GROWTH_BYTES` or more."""
    return bool(m.get("rising")) and (m.get("growth_bytes_per_step") or 0) >= MIN_GROWTH_BYTES


def _growth_line(m: dict) -> str:
    pts = m["step_end_allocated"]
    return (f"rank {m['rank']} {m['device']}: allocated at the end of steps {pts[0][0]}–{pts[-1][0]}: "
            f"{fmt_bytes(pts[0][1])} → {fmt_bytes(pts[-1][1])}, higher after every step; median increment "
            f"{fmt_bytes(m['growth_bytes_per_step'])} per step ({m['growth_bytes_per_step']:,.0f} bytes, "
            f"{len(pts) - 1} increments)")


def _unfreed_line(m: dict) -> str:
    ops = "; ".join(f"{o['op']}: {o['count']} × up to {fmt_bytes(o['largest_bytes'])} = {fmt_bytes(o['bytes'])}"
                    for o in m["unfreed_ops"][:3])
    n = m.get("unfreed_steps") or 0
    per = f" ({fmt_bytes(m['unfreed_bytes'] / n)} per step)" if n else ""
    return (f"rank {m['rank']} {m['device']}: allocated inside {n} step{'s' if n != 1 else ''} and never freed in "
            f"the window: {fmt_bytes(m['unfreed_bytes'])}{per}; by op: {ops}")


def _steps_to_full(m: dict) -> float | None:
    """Steps until a growing GPU's reserved memory reaches its total at the median growth; None without a total."""
    total, reserved, g = m.get("total_bytes"), m.get("peak_reserved_bytes"), m.get("growth_bytes_per_step")
    if not total or reserved is None or not g or g <= 0:
        return None
    return max(0.0, (total - reserved) / g)


def rule_memory_near_capacity(ev: RunEvidence) -> list[Finding]:
    """Config, medium: a GPU's peak reserved memory is at least :data:`NEAR_CAPACITY` of its total memory
    (``deviceProperties`` ``totalGlobalMem``). The next larger batch, sequence or fragmentation ends in an
    out-of-memory error, and a caching allocator that must free its cache and retry (``cudaFree``, then
    ``cudaMalloc``) stalls the step: the evidence says whether the steps hold ``cudaFree`` calls
    (:func:`rule_memory_cache_flush` prices them). Impact 0: a full GPU is not slow in itself."""
    near = [m for m in _memory_rows(ev) if m.get("total_bytes") and m.get("peak_reserved_bytes") is not None
            and m["peak_reserved_bytes"] >= NEAR_CAPACITY * m["total_bytes"]]
    if not near:
        return []
    near.sort(key=lambda m: (-m["peak_reserved_bytes"] / m["total_bytes"], m["rank"], m["device"]))
    ranks = sorted({m["rank"] for m in near})
    top = near[0]
    share = 100 * top["peak_reserved_bytes"] / top["total_bytes"]
    evidence = [f"rank {m['rank']} {m['device']}: peak reserved {fmt_bytes(m['peak_reserved_bytes'])} of "
                f"{fmt_bytes(m['total_bytes'])} ({100 * m['peak_reserved_bytes'] / m['total_bytes']:.1f}%), "
                f"peak allocated {fmt_bytes(m['peak_allocated_bytes'])}" for m in near[:8]]
    flushing = sorted({c.rank for c in ev.cache_flush if c.rank in ranks and c.frees_per_step >= MIN_FLUSH_FREES})
    evidence.append(f"rank{'s' if len(flushing) > 1 else ''} {ranges(flushing)}: cudaFree in every step, the "
                    "allocator flushing its cache (its cost: the memory_cache_flush finding)" if flushing else
                    "no cudaFree in the counted steps: the allocator does not flush its cache yet, so the step is "
                    "not slowed by it (the next larger batch or sequence is)" if ev.mode == "gpu" else
                    "a CPU run: no GPU allocator")
    return [Finding("config", "memory_near_capacity", "medium", 0.0, ranks,
                    f"GPU memory is nearly full on rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}: "
                    f"{share:.0f}% of {top['device']} reserved at the peak", evidence,
                    "leave headroom: activation checkpointing, a smaller micro-batch with gradient accumulation, "
                    "bf16 activations, ZeRO/FSDP sharding of optimizer state; "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation",
                    assumption="how full the GPU is costs no step time until the allocator flushes its cache "
                               "(cudaFree in the steps: priced as memory_cache_flush)")]


def rule_memory_imbalance(ev: RunEvidence) -> list[Finding]:
    """Config, low (medium when that rank's GPU is at least :data:`IMBALANCE_MEDIUM_SHARE` reserved): one rank's
    peak allocated memory is at least :data:`IMBALANCE_RATIO` × the median rank's (the lower median: a real rank),
    on the GPUs (on the CPU in a CPU-only run). The largest rank sets the batch every rank can run. A rank whose
    memory grows every step (:func:`rule_memory_growth`) is left out: its peak is the leak's."""
    rows = _memory_rows(ev)
    gpu = [m for m in rows if m["device"].startswith("GPU")]
    use = gpu or [m for m in rows if m["device"] == "CPU"]
    peak: dict[int, dict] = {}
    for m in use:
        if m.get("peak_allocated_bytes") and (m["rank"] not in peak
                                              or m["peak_allocated_bytes"] > peak[m["rank"]]["peak_allocated_bytes"]):
            peak[m["rank"]] = m
    if len(peak) < 2:
        return []
    med = statistics.median_low(m["peak_allocated_bytes"] for m in peak.values())
    growing = {m["rank"] for m in rows if _grows(m)}
    high = sorted((m for m in peak.values() if med and m["peak_allocated_bytes"] >= IMBALANCE_RATIO * med
                   and m["rank"] not in growing), key=lambda m: -m["peak_allocated_bytes"])
    if not high:
        return []
    top = high[0]
    ranks = sorted(m["rank"] for m in high)
    full = [m for m in high if m.get("total_bytes") and m.get("peak_reserved_bytes") is not None
            and m["peak_reserved_bytes"] >= IMBALANCE_MEDIUM_SHARE * m["total_bytes"]]
    evidence = [f"rank {m['rank']} {m['device']}: peak allocated {fmt_bytes(m['peak_allocated_bytes'])}, "
                f"{m['peak_allocated_bytes'] / med:.2f}× the median rank's {fmt_bytes(med)}" for m in high[:8]]
    evidence.append("peak allocated per rank: " + ", ".join(
        f"{r}: {fmt_bytes(peak[r]['peak_allocated_bytes'])}" for r in sorted(peak)[:16]))
    return [Finding("config", "memory_imbalance", "medium" if full else "low", 0.0, ranks,
                    f"Rank {top['rank']} uses {top['peak_allocated_bytes'] / med:.1f}× the memory of the median rank "
                    f"({fmt_bytes(top['peak_allocated_bytes'])} against {fmt_bytes(med)})", evidence,
                    "balance what each rank holds: uneven pipeline stages or expert placement, a rank that also "
                    "evaluates, logs or checkpoints (gathering full tensors), a larger batch or sequence on one rank; "
                    "the largest rank sets the batch size every rank can run")]


MIN_FLUSH_FREES = 1.0  # cudaFree calls per counted step (mean) from which the allocator flushes every step
MIN_FLUSH_PCT = 2.0  # ... and the allocator's calls take at least this share of the step


def rule_memory_cache_flush(ev: RunEvidence) -> list[Finding]:
    """Config: PyTorch's caching allocator frees GPU memory and allocates it again inside every step
    (:func:`traceanalyze.metrics.allocator.cache_flushes`: at least :data:`MIN_FLUSH_FREES` ``cudaFree`` per counted
    step on a rank, the calls taking :data:`MIN_FLUSH_PCT` % of its step or more). ``cudaFree`` synchronizes the
    device, so the host waits for the GPU to drain, and the GPU then waits for the host's next launches. The rule's
    estimate is the GPU idle inside the calls over the step; the ``no_cache_flush`` replay prices it. Whether the
    GPU is near capacity (the allocator's flush-and-retry) or not (``torch.cuda.empty_cache()`` in the loop) comes
    from the memory rows when the trace has them."""
    if ev.mode != "gpu" or not ev.cache_flush or not ev.ranks:
        return []
    steps = {r["rank"]: step_us(ev, r) for r in ev.ranks}
    rows = [c for c in ev.cache_flush if c.frees_per_step >= MIN_FLUSH_FREES and steps.get(c.rank)
            and 100 * c.us_per_step / max(steps[c.rank], c.us_per_step) >= MIN_FLUSH_PCT]
    if not rows:
        return []
    worst = max(rows, key=lambda c: (c.gpu_idle_us_per_step, -c.rank))
    step = max(steps[worst.rank], worst.us_per_step)
    impact = round(100 * worst.gpu_idle_us_per_step / step, 1)
    ranks = sorted(c.rank for c in rows)
    evidence = [f"rank {c.rank}: cudaFree in {c.steps_with_frees} of {c.steps} counted steps; "
                f"{c.frees_per_step:.1f} cudaFree and {c.mallocs_per_step:.1f} cudaMalloc per step (mean), "
                f"{ms_text(c.us_per_step)} of host time in them (longest call {ms_text(c.max_us)}), the GPU "
                f"idle for {ms_text(c.gpu_idle_us_per_step)} of it" for c in rows[:8]]
    full = _fullest_gpu(ev)
    if full is None:
        evidence.append("the trace has no [memory] events (profile_memory=True shows how full the GPU is)")
        why = "torch.cuda.empty_cache() in the loop, or a GPU so full that the allocator flushes its cache and retries"
    elif full["peak_reserved_bytes"] >= NEAR_CAPACITY * full["total_bytes"]:
        evidence.append(_reserved_line(full) + ": near capacity, so the allocator frees its cache and retries")
        why = "a GPU so full that the caching allocator flushes its cache and retries"
    else:
        evidence.append(_reserved_line(full) + ": room left, so something empties the cache on purpose")
        why = "torch.cuda.empty_cache() in the loop"
    often = ("every step" if worst.steps_with_frees == worst.steps else
             f"in {worst.steps_with_frees} of {worst.steps} steps")
    return [Finding("config", "memory_cache_flush", severity(impact), impact, ranks,
                    f"GPU memory is freed and allocated again {often} ({why}): {worst.frees_per_step:.0f} "
                    f"cudaFree per step on rank {worst.rank} (mean), the GPU idle "
                    f"{ms_text(worst.gpu_idle_us_per_step)} per step in them", evidence,
                    "keep the allocator's cache between steps: remove torch.cuda.empty_cache() from the training "
                    "loop (transformers: leave torch_empty_cache_steps unset); on a GPU near capacity leave "
                    "headroom (a smaller micro-batch with gradient accumulation, activation checkpointing) or set "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; torch.cuda.memory_stats()"
                    "['num_alloc_retries'] counts the allocator's flush-and-retry")]


def _fullest_gpu(ev: RunEvidence) -> dict | None:
    """The GPU memory row with the largest share of its total reserved at the peak, or None without one."""
    gpus = [m for m in _memory_rows(ev) if m.get("total_bytes") and m.get("peak_reserved_bytes") is not None]
    return max(gpus, key=lambda m: (m["peak_reserved_bytes"] / m["total_bytes"], -m["rank"]), default=None)


def _reserved_line(m: dict) -> str:
    return (f"rank {m['rank']} {m['device']}: peak reserved {fmt_bytes(m['peak_reserved_bytes'])} of "
            f"{fmt_bytes(m['total_bytes'])} ({100 * m['peak_reserved_bytes'] / m['total_bytes']:.1f}%)")
