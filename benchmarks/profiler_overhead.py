"""The profiler's own host cost per recorded event: measured on this machine's CPU (issue 29), and fitted on every
GPU side whose step without the profiler was measured (issue 37).

    pip install '.[torch]'
    python benchmarks/profiler_overhead.py            # the CPU loops: medians of 5 repetitions
    python benchmarks/profiler_overhead.py --fit      # the model fitted on the GPU sides, with a leave-one-out error

``--fit``: every side of ``../shared/traces/gpu/h200`` and ``tests/data/gpu/h100`` traced with ``record_shapes`` and
timed without the profiler in the same loop (the schedule's wait steps and the steps after the window, synced each
step: ``truth_side.json``'s ``profiled_loop_ms``, as ``gpu_pairs.py`` reads it). For each (µs per op, per shape
copied, per runtime call) on a grid, each side's estimate (:mod:`traceanalyze.replay.overhead`: the graph replayed
without that cost) is compared with its measured loop; the grid point with the least mean |error| is the fit. The
leave-one-out error fits on all sides but one and predicts that one.

Times the same loop of small aten ops (``torch.add`` on 16-element tensors, one op recorded per call) and of empty
Python ``torch.profiler.record_function`` ranges (what inductor wraps every Triton launch in while a profiler runs)
without the profiler, then under ``torch.profiler.profile`` with ``record_shapes`` off and on, and with
``with_stack``. The difference per call is the profiler's host cost per recorded event; the ratios between the
settings are what :mod:`traceanalyze.replay.overhead` uses beside the H200 calibration (``gpu_pairs.py
--calibrate``), which fixes the absolute figures on a GPU host.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

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


ROOT = Path(__file__).resolve().parent.parent
GRID = {"per_op": [0.5, 1.0, 1.5, 2.0, 2.5, 2.9, 3.5], "per_shape": [0.0, 0.25, 0.5, 0.75, 1.0, 1.25],
        "per_call": [1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 5.9]}


def _sides() -> list[tuple[Path, float]]:
    """(side folder, its loop synced each step without the profiler, ms) for every GPU side that has one."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_pairs

    out = []
    for root in (gpu_pairs.H200, gpu_pairs.H100):
        gpu_pairs.CUR = root
        for f in sorted(root.glob("*/*")):
            if f.parent.name == "compile" or not (f / "truth_side.json").exists():
                continue  # the compile sides are profiled from step 0: no unprofiled steps in the loop
            ms = gpu_pairs.synced_ms(f.parent.name, f.name)
            if ms:
                out.append((f, ms))
    return out


def _estimator(folder: Path):
    """A function (per_op, per_shape, per_call) -> the side's estimated step without the profiler (ms)."""
    from traceanalyze.options import Options
    from traceanalyze.pipeline import analyze
    from traceanalyze.replay import overhead, whatif

    box: dict = {}
    orig = whatif._Pricer.unprofiled

    def spy(self, con, run_id, d, cg, tr):
        box.update(pr=self, con=con, run_id=run_id, arrs=(d, cg, tr))
        return orig(self, con, run_id, d, cg, tr)

    whatif._Pricer.unprofiled = spy
    try:
        a = analyze(folder, Options(jobs=1))
    finally:
        whatif._Pricer.unprofiled = orig
    pr, (d, cg, tr) = box["pr"], box["arrs"]
    shapes = bool(pr.cfg and pr.cfg.get("record_shapes"))
    caveat = (a.model["runs"][0].get("profiler_overhead") or {}).get("caveat")

    def est(per_op: float, per_shape: float, per_call: float) -> float:
        d2, cg2 = overhead.unprofiled(pr.g, d, cg, per_op, per_call, per_shape if shapes else 0.0)
        rp = whatif.simulate.replay(pr.g, d2, cg2, tr)
        pr.u_long = whatif._longest(rp.step_times(pr.g), pr.counted)
        return pr.base(d2, cg2, None)["estimated_step_time_us"] / 1e3

    est.con, est.caveat = a.con, caveat
    return est


def fit() -> None:
    sides = _sides()
    grid = list(itertools.product(GRID["per_op"], GRID["per_shape"], GRID["per_call"]))
    errs = {}  # side -> per grid point: error %
    left = []  # sides with a caveat: the profiler's cost there is not per event (overhead.estimate_range)
    from traceanalyze.replay import overhead

    now = (overhead.per_op_us({"record_shapes": True}), overhead.PER_SHAPE_US, overhead.PER_CALL_US)
    if now not in grid:
        grid.append(now)
    for f, truth in sides:
        e = _estimator(f)
        errs[f] = [100 * (e(*p) - truth) / truth for p in grid]
        e.con.close()
        if e.caveat:
            left.append(f)
    sides = [(f, t) for f, t in sides if f not in left]
    for f in left:
        print(f"left out of the fit (the report's caveat): {f.parent.name}/{f.name}, error at the fit below "
              "printed with the rest")

    def best(keep: list[Path]) -> int:
        return min(range(len(grid)), key=lambda i: statistics.mean(abs(errs[f][i]) for f in keep))

    b = best([f for f, _ in sides])
    print(f"{len(sides)} sides, {len(grid)} grid points; fit: {grid[b][0]} µs per op, {grid[b][1]} µs per shape "
          f"copied, {grid[b][2]} µs per runtime call; mean |error| "
          f"{statistics.mean(abs(errs[f][b]) for f, _ in sides):.1f} %\n")
    print("| side | synced loop ms | fitted error % | leave-one-out fit | leave-one-out error % |\n"
          "|---|--:|--:|---|--:|")
    loo = []
    for f, truth in sides:
        i = best([g for g, _ in sides if g != f])
        loo.append(errs[f][i])
        name = f"{f.parent.parent.name}/{f.parent.name}/{f.name}"
        print(f"| {name} | {truth:.1f} | {errs[f][b]:+.1f} | {grid[i]} | {errs[f][i]:+.1f} |")
    print(f"\nleave-one-out |error|: mean {statistics.mean(abs(x) for x in loo):.1f} %, "
          f"max {max(abs(x) for x in loo):.1f} %")
    i_now = grid.index(now)
    print(f"the model in traceanalyze/replay/overhead.py {now}: mean |error| "
          f"{statistics.mean(abs(errs[f][i_now]) for f, _ in sides):.1f} %, max "
          f"{max(abs(errs[f][i_now]) for f, _ in sides):.1f} %")
    for f in left:
        print(f"| {f.parent.parent.name}/{f.parent.name}/{f.name} (caveat) | | {errs[f][b]:+.1f} at the fit | | |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="fit the model on the GPU sides (no torch needed)")
    if ap.parse_args().fit:
        sys.path.insert(0, str(ROOT))
        fit()
    else:
        main()
