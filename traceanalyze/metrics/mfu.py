"""Model FLOPs utilization (MFU) of a run: the model's FLOPs per step over the step time, against the GPU's dense
peak. ``prec`` is the run's :class:`traceanalyze.metrics.precision.PrecisionSummary` (its ``model_flops_per_step``);
``run`` the run's part of the report model (its ``mode``, ``step_time_us`` and ``profiler_overhead``).
"""

from __future__ import annotations

from typing import Any

from traceanalyze import hardware


def mfu(prec: Any, gpu: hardware.GpuInfo | None, run: dict) -> tuple[float | None, dict | None]:
    """MFU (%) and how it was made: model FLOPs per rank and step (:func:`traceanalyze.metrics.precision.model_flops`)
    over the step time (without the profiler when known: ``profiler_overhead``, else the profiled one), against the
    GPU's best dense peak (bf16 on sm80+, fp16 before: :func:`traceanalyze.hardware.gpu_peaks`). (None, None) on CPU
    runs or without shapes."""
    flops = getattr(prec, "model_flops_per_step", None)
    if not flops or run.get("mode") != "gpu":
        return None, None
    po = run.get("profiler_overhead") or {}
    step, source = po.get("unprofiled_step_time_us"), po.get("source")
    if not step:
        step, source = run.get("step_time_us"), "profiled"
    peaks = hardware.gpu_peaks(gpu)
    dtype = hardware.half_dtype(gpu) if gpu is not None else "bf16"
    peak = peaks.tflops.get(dtype) or max(peaks.tflops.values())
    if not step or not peak:
        return None, None
    pct = 100 * flops / (step / 1e6) / (peak * 1e12)
    return round(pct, 2), {"model_flops_per_step": round(flops), "step_time_us": round(step, 3),
                           "step_source": source, "peak_tflops": peak, "peak_dtype": dtype,
                           "peak_reference": peaks.reference, "assumed": peaks.assumed or None,
                           "ops": getattr(prec, "model_flops_ops", 0)}
