"""Precision rule: matrix math in fp32 (no tensor cores on a GPU; no bf16 on a CPU). On a GPU conv net whose kernel
names say the activations are NCHW, the advice adds channels_last to bf16 autocast (PyTorch's AMP and channels_last
guides), which the ``bf16_channels_last`` what-if prices (:mod:`traceanalyze.replay.precision`)."""

from __future__ import annotations

import statistics

from traceanalyze import hardware
from traceanalyze.diagnose.evidence import (
    CPU_PRECISION_TICKET_PCT,
    HIGH,
    NOISE_SIGMAS,
    RunEvidence,
    ms_text,
    severity,
    step_noise_us,
)
from traceanalyze.findings import Finding
from traceanalyze.replay.precision import CONV_SHARE_MIN  # where bf16_channels_last applies: the same conv share
from traceanalyze.replay.scenarios.precision import CPU_BF16_SPEEDUP  # the speed-up the what-if replay assumes at most

MIN_FP32_SHARE = 50.0  # % of matrix-math time in fp32 without tensor cores
GPU_FP32_SPEEDUP_DEFAULT = 4.0  # bf16 over fp32 when no peak is known (never: gpu_peaks assumes one and says so)
CPU_PRECISION_ADVICE = ("on a CPU with AMX or AVX512-BF16 (lscpu | grep -E 'amx|avx512_bf16'), run the step under "
                        "torch.autocast('cpu', dtype=torch.bfloat16) (bf16: true / --bf16 in a trainer config); "
                        "without them bf16 matmuls are emulated and can be slower than fp32: keep fp32 there")


CHANNELS_LAST_ADVICE = ("this is a conv net on NCHW activations: also convert the model and each input batch to "
                        "channels_last (model = model.to(memory_format=torch.channels_last); "
                        "x = x.to(memory_format=torch.channels_last)): cuDNN's tensor-core convolutions compute in "
                        "NHWC, so on NCHW tensors every activation is transposed into and out of them, and batch "
                        "norm and the elementwise kernels run on NCHW (PyTorch's AMP guide for conv nets)")


def nchw_conv_net(ev: RunEvidence) -> str | None:
    """The evidence that run ``ev`` is a GPU conv net on NCHW activations, as kernel names say it
    (:attr:`traceanalyze.metrics.precision.PrecisionMix.layout`): convolutions are at least
    :data:`~traceanalyze.replay.precision.CONV_SHARE_MIN` % of the matrix math, on a GPU with tensor cores (or
    unknown); None when it is not."""
    p = ev.prec
    if ev.mode != "gpu" or p is None or p.layout != "NCHW" or p.conv_share_pct < CONV_SHARE_MIN:
        return None
    if ev.gpu.capability is not None and not hardware.features(ev.gpu.capability).tensor_cores:
        return None
    n = max(1, len(ev.ranks))
    us = p.layout_us
    return (f"convolutions are {p.conv_share_pct:.0f}% of matrix-math time and the activations are NCHW: kernels "
            f"on NCHW tensors {ms_text(us.get('nchw', 0.0) / n)} and cuDNN's NCHW↔NHWC transposes "
            f"{ms_text(us.get('transpose', 0.0) / n)} per rank (kernel names)")


def rule_precision(ev: RunEvidence) -> list[Finding]:
    """Precision: most matrix-math time runs in fp32 without tensor cores."""
    p = ev.prec
    if p is None or p.gemm_time_us <= 0 or p.fp32_share_pct < MIN_FP32_SHARE:
        return []
    busy = statistics.median(r["compute_us"] for r in ev.ranks) if ev.ranks else 0
    n_ranks = max(1, len(ev.ranks))
    gemm_per_rank = p.gemm_time_us / n_ranks
    fp32_us = gemm_per_rank * p.fp32_share_pct / 100
    if ev.mode == "gpu":  # the precision what-if's point estimate (replay.precision): peak ratio / √2
        ratio = hardware.gpu_peaks(ev.gpu).ratio("fp32", hardware.half_dtype(ev.gpu))
        k = max(ratio / 2 ** 0.5, 1.0) if ratio else GPU_FP32_SPEEDUP_DEFAULT
    else:
        k = CPU_BF16_SPEEDUP
    window = statistics.median(r["window_us"] for r in ev.ranks) if ev.ranks else 0
    impact = round(100 * fp32_us * (1 - 1 / k) / window, 1) if window else 0.0
    evidence = [f"{p.fp32_share_pct:.0f}% of matrix-math time ({ms_text(p.gemm_time_us / n_ranks)} per rank) runs in "
                f"fp32{' on CUDA cores (no tensor cores)' if ev.mode == 'gpu' else ''}; "
                f"matrix math is {100 * gemm_per_rank / busy:.0f}% of compute" if busy else
                f"{p.fp32_share_pct:.0f}% of matrix-math time runs in fp32"]
    evidence.append("dtype mix: " + ", ".join(f"{m.get('label') or m['dtype']} {m['pct']:.0f}%" for m in p.mix[:4])
                    + f" (from {p.source})")
    if p.matmul_efficiency_pct is not None:
        evidence.append(f"achieved {p.achieved_tflops:.1f} TFLOPS = {p.matmul_efficiency_pct:.1f}% of "
                        f"{p.peak_tflops:g} TFLOPS "
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
        noise = step_noise_us(ev)
        gain = impact / 100 * (ev.step_time_us or 0.0)
        if impact < CPU_PRECISION_TICKET_PCT:
            sev = "low"  # the speedup is assumed, not known for this CPU: a small estimate is no main cause
            evidence.append(f"estimated gain {impact:.0f}% of the step is below the {CPU_PRECISION_TICKET_PCT:g}% "
                            "worth a ticket for an assumed CPU speedup; measure it with one bf16 run")
        elif noise is not None and gain <= NOISE_SIGMAS * noise:
            sev = "low"  # a gain a re-run could not tell from noise is not worth a ticket
            evidence.append(f"estimated gain {ms_text(gain)} per step is within {NOISE_SIGMAS:g} standard deviations "
                            "of "
                            f"this run's step times (σ {ms_text(noise)} over {len(ev.steps)} rank-steps): not worth a "
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
        conv = nchw_conv_net(ev)
        if conv is not None:
            evidence.append(conv)
            rec += "; " + CHANNELS_LAST_ADVICE
    return [Finding("precision", "fp32_matmul", sev or severity(impact), impact, [r["rank"] for r in ev.ranks],
                    f"Matrix math runs in fp32: {p.fp32_share_pct:.0f}% of GEMM time",
                    evidence, rec)]
