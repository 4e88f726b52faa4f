"""Config rules: torch.compile, the data loader, a launch- or host-bound step, the effective batch."""

from __future__ import annotations

import statistics

from traceanalyze.diagnose.evidence import HOST_BOUND_WAIT_PCT, RunEvidence, main_stream_host_wait, ms_text, severity
from traceanalyze.findings import Finding

MIN_COMPILE_PCT = 10.0
COMPILE_HORIZON_STEPS = 1000  # job length assumed when logs do not state total_optimization_steps
MIN_LOADER_PCT = 10.0
HOST_BOUND_IDLE_PCT = 40.0  # GPU idle from which host wait is looked at
TINY_KERNEL_US = 20.0  # median kernel at or below this: the host's launches, not its other work, set the pace


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
            ev_lines = [f"rank {worst} spends {ms_text(comp)} in dynamo/inductor compile ranges: {share:.0f}% of a job "
                        f"of {float(horizon):,.0f} steps at the steady {ms_text(steady)} per step",
                        f"{c.frames} compiled frame(s), {c.recompiles} recompile(s)"]
            if c.first_step_us and c.steady_step_us:
                ev_lines.append(f"first profiled step {ms_text(c.first_step_us)} vs steady state "
                                f"{ms_text(c.steady_step_us)} "
                                f"({c.first_step_us / c.steady_step_us:.0f}×)")
            if log_compile_s:
                ev_lines.append(f"log: compile took {float(log_compile_s):,.0f} s")
            assumed = "" if ev.fact("total_optimization_steps") else (
                f"assuming a {COMPILE_HORIZON_STEPS:,}-step job: no log or config states the number of steps")
            if assumed:
                ev_lines.append(assumed)
            out.append(Finding("config", "compile_overhead", severity(impact), impact, sorted(c.compile_us),
                               f"torch.compile takes {ms_text(comp)}, {share:.0f}% of a {float(horizon):,.0f}-step job",
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
                     f"{ld.share_pct[worst]:.1f}%, {ms_text(ld.loader_us[worst])} over the profiled steps)"],
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
    host_wait = main_stream_host_wait(ev)
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
                        f"{ln.median_kernel_us or 0:.1f} µs each; launch calls take "
                        f"{ms_text(ln.launch_us_per_step)} per "
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
