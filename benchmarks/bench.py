#!/usr/bin/env python3
"""Benchmark: `traceanalyze report` end to end against Holistic Trace Analysis on the same traces.

    pip install '.[bench]'            # HTA 0.5.0 + psutil (HTA pulls in jupyterlab)
    python benchmarks/bench.py        # 8-rank scale set from ../shared/tools/make_scale_set.py
    python benchmarks/bench.py --traces DIR --runs 5 --scaling --big

In the same run, alternating, it times (a) HTA: ``TraceAnalysis`` load plus ``get_temporal_breakdown``,
``get_comm_comp_overlap``, ``get_idle_time_breakdown``, ``get_gpu_kernel_breakdown``, and (b)
``traceanalyze report`` (ingest, all metrics, findings, HTML) into a fresh database (cold), then a re-run on the
unchanged files (cached). Each is a separate process; the figures are medians of ``--runs`` runs, with the peak
memory of the whole process tree (sum of PSS, sampled every 40 ms) and the input rate in MB/s of decompressed
JSON. Every measurement is two runs of the same command: one timed with nothing watching it, one watched for
memory, so the sampler's own cost (a few % of a core) never lands in a time.
``--scaling`` repeats traceanalyze on 1, 2, 4 and 8 ranks; ``--big`` ingests one ~2 GB plain-JSON file
(``make_scale_set.py --ranks 1 --repeat 45 --no-gzip``) ``--runs`` times to check throughput and streaming memory.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MAKE_SCALE_SET = SHARED / "tools" / "make_scale_set.py"

# Installed packages run from compiled bytecode; an editable checkout under PYTHONDONTWRITEBYTECODE=1 would
# recompile every module of the project on each run (~0.1 s), which no installed copy does.
BENCH_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

HTA_SCRIPT = """
import sys, warnings
warnings.filterwarnings("ignore")
import logging; logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
a.get_idle_time_breakdown(ranks=sorted(a.t.traces), visualize=False)
a.get_gpu_kernel_breakdown(visualize=False)
"""


def _pss_bytes(p) -> int:
    """PSS of one process: /proc/PID/smaps_rollup where Linux has it (cheap), else psutil's full memory info."""
    try:
        with open(f"/proc/{p.pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return p.memory_full_info().pss
    except (AttributeError, OSError):
        return p.memory_info().rss


def run_timed(cmd: list[str]) -> float:
    """Run ``cmd`` with nothing else watching it; return its wall time in seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=BENCH_ENV)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr.decode(errors='replace')[-2000:]}")
    return wall


def run_sampled(cmd: list[str]) -> float:
    """Run ``cmd``; return the peak memory in MB of the process and all its children.

    Memory is the sum of each process's PSS (proportional set size: shared pages split between the processes
    that map them), so forked workers that share the parent's pages are not counted twice; for a single
    process it equals its RSS minus what other processes share with it. It is sampled every 40 ms, from
    ``/proc/PID/smaps_rollup`` where available. The sampler costs a few % of a core, so times are taken in
    separate runs (:func:`run_timed`).
    """
    import psutil

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=BENCH_ENV)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            total = 0
            for p in [ps] + ps.children(recursive=True):
                try:
                    total += _pss_bytes(p)
                except psutil.Error:
                    pass
            peak = max(peak, total)
        except psutil.Error:
            pass
        time.sleep(0.04)
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace")[-2000:]
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{err}")
    return peak / 1e6


def run_measured(cmd: list[str], fresh_db: Path | None = None) -> tuple[float, float]:
    """(wall seconds, peak memory MB) of ``cmd`` from two runs: one timed alone, one watched for memory.
    ``fresh_db`` is deleted before each (a cold run)."""
    if fresh_db:
        fresh_db.unlink(missing_ok=True)
    wall = run_timed(cmd)
    if fresh_db:
        fresh_db.unlink(missing_ok=True)
    return wall, run_sampled(cmd)


def json_megabytes(folder: Path) -> float:
    """Decompressed JSON size of every trace in ``folder`` (MB, 1e6 bytes)."""
    total = 0
    for f in sorted(folder.iterdir()):
        if f.name.endswith(".json.gz"):
            with gzip.open(f, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    total += len(chunk)
        elif f.name.endswith(".json"):
            total += f.stat().st_size
    return total / 1e6


def traceanalyze_cmd(folder: Path, out: Path, db: Path) -> list[str]:
    return [sys.executable, "-m", "traceanalyze.cli", "report", str(folder), "-o", str(out), "--db", str(db), "-q"]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, help="folder of traces (default: build the 8-rank scale set)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hta-python", default=sys.executable, help="interpreter that has HTA installed")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--scaling", action="store_true", help="also time 1, 2, 4, 8 ranks")
    ap.add_argument("--big", action="store_true", help="also ingest one ~2 GB plain JSON file")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "traceanalyze-bench")
    args = ap.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    traces = args.traces
    if traces is None:
        if not MAKE_SCALE_SET.exists():
            raise SystemExit(f"{MAKE_SCALE_SET} not found: pass --traces DIR")
        traces = args.work / "scale8"
        if not traces.exists() or len(list(traces.glob("*.json.gz"))) < 8:
            subprocess.run([sys.executable, str(MAKE_SCALE_SET), str(traces), "--ranks", "8"], check=True,
                           stdout=subprocess.DEVNULL)
    mb = json_megabytes(traces)
    gz_mb = sum(f.stat().st_size for f in traces.iterdir() if f.is_file()) / 1e6
    print(f"input: {traces} ({gz_mb:.1f} MB on disk, {mb:.1f} MB of JSON)", flush=True)

    hta_t, hta_m, cold_t, cold_m, warm_t, warm_m = [], [], [], [], [], []
    out = args.work / "report.html"
    for i in range(args.runs):
        if not args.skip_hta:
            t, m = run_measured([args.hta_python, "-c", HTA_SCRIPT, str(traces)])
            hta_t.append(t)
            hta_m.append(m)
            print(f"run {i + 1}: HTA {t:.2f} s, {m:.0f} MB", flush=True)
        db = args.work / "cold.duckdb"
        t, m = run_measured(traceanalyze_cmd(traces, out, db), fresh_db=db)
        cold_t.append(t)
        cold_m.append(m)
        t2, m2 = run_measured(traceanalyze_cmd(traces, out, db))
        warm_t.append(t2)
        warm_m.append(m2)
        print(f"run {i + 1}: traceanalyze cold {t:.2f} s, {m:.0f} MB; cached {t2:.2f} s, {m2:.0f} MB", flush=True)

    rows = [("traceanalyze report, cold", median(cold_t), median(cold_m)),
            ("traceanalyze report, cached re-run", median(warm_t), median(warm_m))]
    if hta_t:
        rows.insert(0, ("HTA 0.5.0 load + 4 analyses", median(hta_t), median(hta_m)))
    print(f"\n| {args.runs} runs, medians | time (s) | peak memory, PSS (MB) | JSON MB/s |")
    print("|---|--:|--:|--:|")
    for name, t, m in rows:
        print(f"| {name} | {t:.2f} | {m:.0f} | {mb / t:.0f} |")
    if hta_t:
        print(f"\nspeed-up over HTA: {median(hta_t) / median(cold_t):.1f}× cold, "
              f"{median(hta_t) / median(warm_t):.1f}× cached; memory {median(cold_m) / median(hta_m):.2f}× of HTA's")

    if args.scaling:
        files = sorted(f for f in traces.iterdir() if f.name.endswith((".json", ".json.gz")))
        print("\n| ranks | JSON MB | time (s) | MB/s | peak PSS (MB) |\n|--:|--:|--:|--:|--:|")
        for k in (1, 2, 4, 8):
            if k > len(files):
                break
            sub = args.work / f"ranks{k}"
            shutil.rmtree(sub, ignore_errors=True)
            sub.mkdir()
            for f in files[:k]:
                (sub / f.name).symlink_to(f.resolve())
            ts, ms = [], []
            for _ in range(args.runs):
                db = args.work / f"r{k}.duckdb"
                t, m = run_measured(traceanalyze_cmd(sub, out, db), fresh_db=db)
                ts.append(t)
                ms.append(m)
            kmb = mb * k / len(files)
            print(f"| {k} | {kmb:.0f} | {median(ts):.2f} | {kmb / median(ts):.0f} | {median(ms):.0f} |", flush=True)

    if args.big:
        big = args.work / "big"
        if not big.exists():
            subprocess.run([sys.executable, str(MAKE_SCALE_SET), str(big), "--ranks", "1", "--repeat", "45",
                            "--no-gzip"], check=True, stdout=subprocess.DEVNULL)
        bmb = json_megabytes(big)
        ts, ms = [], []
        for _ in range(args.runs):
            db = args.work / "big.duckdb"
            t, m = run_measured(traceanalyze_cmd(big, out, db), fresh_db=db)
            ts.append(t)
            ms.append(m)
        t, m = median(ts), median(ms)
        print(f"\nsingle file {bmb:.0f} MB of JSON, median of {args.runs}: {t:.1f} s, {bmb / t:.0f} MB/s, "
              f"peak PSS {m:.0f} MB (runs: {', '.join(f'{x:.1f}' for x in ts)} s)")


if __name__ == "__main__":
    main()
