"""Metrics: per run, rank and profiler step, computed from the store. One analyzer per concern:

- :mod:`.breakdown`: temporal breakdown, comm/comp overlap, exposed communication, top kernels (HTA definitions);
- :mod:`.collectives`: collectives matched across ranks, wait vs transfer, algbw/busbw, clock offsets;
- :mod:`.precision`: dtype mix of GEMM/convolution/attention time, tensor-core share, achieved TFLOPS;
- :mod:`.host`: compile overhead, data-loader waits, launch-bound steps.
"""

from traceanalyze.metrics.breakdown import (
    MACROS,
    RankMetrics,
    StepMetrics,
    compute_run_metrics,
    run_mode,
    save,
    step_kernels,
    top_kernels,
)

__all__ = ["MACROS", "RankMetrics", "StepMetrics", "compute_run_metrics", "run_mode", "save",
           "step_kernels", "top_kernels"]
