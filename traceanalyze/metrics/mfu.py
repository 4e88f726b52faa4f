"""Model FLOPs utilization (MFU) of a run: the model's FLOPs per step over the step time, against the GPU's dense
peak. ``prec`` is the run's :class:`traceanalyze.metrics.precision.PrecisionSummary` (its ``model_flops_per_step``);
``run`` the run's part of the report model (its ``mode``, ``step_time_us`` and ``profiler_overhead``).

Two FLOP figures sit on the page and measure different things, per rank (one GPU) both:

- the model FLOPs per step (``mfu.model_flops_per_step``): every recorded matrix op of a counted step (GEMMs,
  convolutions, attention) from its op's shapes (:func:`traceanalyze.metrics.precision.model_flops`); MFU divides
  them by the whole step's time (without the profiler when known), so MFU is per GPU as the peak is;
- the GEMM kernels' rate (``precision.achieved_tflops``): the FLOPs of the ``aten::mm``/``addmm``/``bmm``/``baddbmm``
  kernels over those kernels' own time: how fast the GEMMs run while they run, not a share of the step. Model
  FLOPs divided by this rate is *not* a time within the step (convolutions and attention are not in the rate).
"""

from __future__ import annotations

from typing import Any

from traceanalyze import hardware

FLOP_SOURCE = "op-shape"  # where the model FLOPs come from: the recorded ops' Input Dims (record_shapes)


def mfu(prec: Any, gpu: hardware.GpuInfo | None, run: dict) -> tuple[float | None, dict | None]:
    """MFU (%) and how it was made: model FLOPs per rank and step (:func:`traceanalyze.metrics.precision.model_flops`)
    over the step time (without the profiler when known: ``profiler_overhead``, else the profiled one), against the
    GPU's best dense peak (bf16 on sm80+, fp16 before: :func:`traceanalyze.hardware.gpu_peaks`), or the peak given
    with ``--peak-tflops`` (the precision summary's ``peak_source``). (None, None) on CPU runs or without shapes."""
    flops = getattr(prec, "model_flops_per_step", None)
    if not flops or run.get("mode") != "gpu":
        return None, None
    po = run.get("profiler_overhead") or {}
    step, source = po.get("unprofiled_step_time_us"), po.get("source")
    if not step:
        step, source = run.get("step_time_us"), "profiled"
    peaks = hardware.gpu_peaks(gpu)
    dtype = hardware.half_dtype(gpu) if gpu is not None else "bf16"
    peak, peak_source = peaks.tflops.get(dtype) or max(peaks.tflops.values()), "datasheet"
    if getattr(prec, "peak_source", None) == "--peak-tflops" and getattr(prec, "peak_tflops", None):
        peak, peak_source = prec.peak_tflops, "--peak-tflops"
    if not step or not peak:
        return None, None
    pct = 100 * flops / (step / 1e6) / (peak * 1e12)
    return round(pct, 2), {"model_flops_per_step": round(flops), "flops_source": FLOP_SOURCE,
                           "step_time_us": round(step, 3), "step_source": source, "peak_tflops": peak,
                           "peak_dtype": dtype, "peak_source": peak_source, "peak_reference": peaks.reference,
                           "assumed": peaks.assumed or None, "ops": getattr(prec, "model_flops_ops", 0)}
