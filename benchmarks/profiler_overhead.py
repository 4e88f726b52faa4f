"""The profiler's own host cost per recorded event, measured on this machine's CPU (issue 29).

    pip install '.[torch]'
    python benchmarks/profiler_overhead.py            # medians of 5 repetitions

Times the same loop of small aten ops (``torch.add`` on 16-element tensors, one op recorded per call) and of empty
Python ``torch.profiler.record_function`` ranges (what inductor wraps every Triton launch in while a profiler runs)
without the profiler, then under ``torch.profiler.profile`` with ``record_shapes`` off and on, and with
``with_stack``. The difference per call is the profiler's host cost per recorded event; the ratios between the
settings are what :mod:`traceanalyze.replay.overhead` uses beside the H200 calibration (``gpu_pairs.py
--calibrate``), which fixes the absolute figures on a GPU host.
"""

from __future__ import annotations

import statistics
import time

N = 20_000
REPS = 5


def _loop(fn, n: int = N) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    a, b = torch.ones(16), torch.ones(16)

    def op():
        torch.add(a, b)

    def rf():
        with record_function("triton_poi_fused_add_0"):
            pass

    rows = []
    for name, fn in (("aten op (torch.add)", op), ("Python record_function", rf)):
        base = statistics.median(_loop(fn) for _ in range(REPS))
        out = {"none": base}
        for label, kw in (("profiled", {}), ("record_shapes", {"record_shapes": True}),
                          ("with_stack", {"record_shapes": True, "with_stack": True})):
            ts = []
            for _ in range(REPS):
                with profile(activities=[ProfilerActivity.CPU], **kw):
                    ts.append(_loop(fn))
            out[label] = statistics.median(ts)
        rows.append((name, out))
    print(f"torch {torch.__version__}, {N} calls x {REPS} repetitions, median µs per call\n")
    print("| event | no profiler | profiled | + record_shapes | + with_stack | cost per event (profiled, shapes, "
          "stack) |\n|---|--:|--:|--:|--:|---|")
    for name, o in rows:
        c = [o[k] - o["none"] for k in ("profiled", "record_shapes", "with_stack")]
        print(f"| {name} | {o['none']:.2f} | {o['profiled']:.2f} | {o['record_shapes']:.2f} | {o['with_stack']:.2f} "
              f"| {c[0]:.2f} / {c[1]:.2f} / {c[2]:.2f} µs |")


if __name__ == "__main__":
    main()
