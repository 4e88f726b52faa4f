#!/usr/bin/env python3
"""Benchmark: `traceanalyze report` end to end against Holistic Trace Analysis on the same traces.

    pip install '.[bench]'            # HTA 0.5.0 + psutil (HTA pulls in jupyterlab)
    python benchmarks/bench.py        # 8-rank scale set from ../shared/tools/make_scale_set.py
    python benchmarks/bench.py --traces DIR --runs 5 --scaling --big
    git worktree add /tmp/before COMMIT && python benchmarks/bench.py --runs 7 --skip-hta --baseline /tmp/before

In the same run, alternating, it times (a) HTA: ``TraceAnalysis`` load plus ``get_temporal_breakdown``,
``get_comm_comp_overlap``, ``get_idle_time_breakdown``, ``get_gpu_kernel_breakdown``, and (b)
``traceanalyze report`` (ingest, all metrics, findings, HTML) into a fresh database (cold), then a re-run on the
unchanged files (cached). Each is a separate process; the figures are medians of ``--runs`` runs, with the peak
memory of the whole process tree (sum of PSS, sampled every 40 ms) and the input rate in MB/s of decompressed
JSON. Every measurement is two runs of the same command: one timed with nothing watching it, one watched for
memory, so the sampler's own cost (a few % of a core) never lands in a time.
``--scaling`` repeats traceanalyze on 1, 2, 4 and 8 ranks; ``--big`` ingests one ~2 GB plain-JSON file
(``make_scale_set.py --ranks 1 --repeat 45 --no-gzip``) ``--runs`` times to check throughput and streaming memory.

Issue 18's rows, each printed against its target:

* ``--ranks-sweep``: 128, 256, 512 and 1,024 small real ranks (``make_scale_set.py --ranks 1024 --source
  trace_filter/sampled_rank-0.json.gz``; the smaller sets are its first ranks), traceanalyze cold beside HTA,
  alternating, ``--sweep-runs`` each (HTA takes ~200 s on 1,024 ranks, so its time and memory come from one
  watched run);
* ``--big-gz``: one .gz of ~2 GB of JSON (``--repeat 40``) against the same file as plain JSON: MB/s and memory
  (one watched run each);
* ``--fixed-cost``: a cold report of one 5 MB rank (``--ranks 1 --repeat 3`` of sampled_rank-0) minus a bare
  ``python -c pass``, wall and CPU, medians of ``--runs`` alternating pairs (with ``--baseline``, that tree's
  report in each round too), and in the same rounds the report's third-party imports alone (the modules outside
  the standard library and traceanalyze that the report holds at its end and a bare interpreter does not): the
  part of the fixed cost that traceanalyze's own code cannot take off;
* ``--dask``: the scale set again through ``--executor dask`` (a local cluster of 2 workers).

The scale guard (issue 38), ``python benchmarks/bench.py --scale [--skip-hta] [--scale-runs N]``: the cold report on
64, 256 and 1,024 small real ranks (``make_scale_set.py --ranks 1024 --source trace_filter/sampled_rank-0.json.gz``,
built once into ``--work``; the smaller sets are its first ranks), each size ``--scale-runs`` times (medians). Per
size it prints the wall time, the CPU time (user + sys of the report process and of the processes it waited for: its
parse workers; ``os.wait4``), the mean number of cores busy over a run (the median CPU time over the median wall
time, against the CPUs this process may run on: near that number, the report is CPU-bound and only less CPU makes it
faster), the largest resident set of those processes (``ru_maxrss``), the peak memory of the whole process tree (sum
of PSS, from a second, watched run; psutil), and the CPU growth against linear from 64 ranks:
``cpu_N / cpu_64 / (N / 64)``. It exits with status 1 when a size grows more than 1.15× linear (work that grows with
ranks², such as a loop over the ranks over arrays of every rank), and prints HTA 0.5.0's time on 256 ranks beside
the report's when HTA is installed (the ``bench`` extra; ``--skip-hta`` skips it): HTA runs right after each of the
report's runs on 256 ranks, unwatched like them, and the ratio is of the two medians, so that both sides see the
same minutes of a VM whose speed drifts. It is a benchmark, not a timed test: run it on a quiet machine, in every
change to the replay, the metrics or the load. Nothing else runs with ``--scale``.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traceanalyze.executors import usable_cpus

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


def run_timed(cmd: list[str], env: dict | None = None) -> float:
    """Run ``cmd`` with nothing else watching it (``env``: default :data:`BENCH_ENV`); return its wall time in
    seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env or BENCH_ENV,
                          cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr.decode(errors='replace')[-2000:]}")
    return wall


def run_sampled(cmd: list[str], env: dict | None = None) -> float:
    """Run ``cmd``; return the peak memory in MB of the process and all its children.

    Memory is the sum of each process's PSS (proportional set size: shared pages split between the processes
    that map them), so forked workers that share the parent's pages are not counted twice; for a single
    process it equals its RSS minus what other processes share with it. It is sampled every 40 ms, from
    ``/proc/PID/smaps_rollup`` where available. The sampler costs a few % of a core, so times are taken in
    separate runs (:func:`run_timed`).
    """
    import psutil

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env or BENCH_ENV,
                            cwd=tempfile.gettempdir())
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


def run_measured(cmd: list[str], fresh_db: Path | None = None, env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, peak memory MB) of ``cmd`` from two runs: one timed alone, one watched for memory.
    ``fresh_db`` is deleted before each (a cold run)."""
    if fresh_db:
        fresh_db.unlink(missing_ok=True)
    wall = run_timed(cmd, env)
    if fresh_db:
        fresh_db.unlink(missing_ok=True)
    return wall, run_sampled(cmd, env)


def baseline_env(src: Path) -> dict:
    """The environment that runs the traceanalyze of the source tree ``src`` (``git worktree add DIR COMMIT``):
    first on ``PYTHONPATH``; every command runs from the temp folder, so no checkout shadows it."""
    return {**BENCH_ENV, "PYTHONPATH": str(src.resolve())}


def run_once(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak memory MB) from one run watched for memory: for the long runs (HTA on 1,024 ranks, the
    2 GB files), where a second run costs minutes; the sampler adds a few % of a core to the time."""
    t0 = time.perf_counter()
    peak = run_sampled(cmd)
    return time.perf_counter() - t0, peak


def run_cpu(cmd: list[str], env: dict | None = None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, largest RSS in MB) of one run of ``cmd`` with nothing watching it: the CPU time
    is user + sys of the process and of every process it waited for (its parse workers), from ``os.wait4``; the RSS
    is the largest of those processes', not their sum."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env or BENCH_ENV,
                                cwd=tempfile.gettempdir())
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n"
                             f"{err.read().decode(errors='replace')[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def has_hta(python: str) -> bool:
    """Whether ``python`` can import HTA (the ``bench`` extra)."""
    return subprocess.run([python, "-c", "import hta"], capture_output=True).returncode == 0


SCALE_SIZES = (64, 256, 1024)  # ranks of the scale guard (--scale)
HTA_SCALE_RANKS = 256  # the size the guard times HTA 0.5.0 on (issue 38: ≥ 10× there)
SCALE_GROWTH_MAX = 1.15  # CPU time per rank at most this many times the smallest size's


def scale_guard(args, out: Path) -> bool:
    """The cold report on :data:`SCALE_SIZES` small real ranks: wall, CPU, mean cores busy and memory per size,
    and the CPU growth against linear from the smallest; True when no size grows more than
    :data:`SCALE_GROWTH_MAX` (module docstring)."""
    source = SHARED / "traces" / "real" / "hta" / "trace_filter" / "sampled_rank-0.json.gz"
    full = make_set(args.work / "r1024", "--ranks", str(max(SCALE_SIZES)), "--source", str(source))
    print(f"\nscale guard: cold reports of {full.name}'s first ranks, {args.scale_runs} timed run(s) per size "
          "(medians) and one watched for memory")
    print(f"| ranks | wall (s) | CPU (s) | mean cores busy (median CPU / median wall, of {usable_cpus()}) "
          "| max RSS (MB) | peak PSS, tree (MB) | CPU growth vs linear | load |\n|--:|--:|--:|--:|--:|--:|--:|---|")
    cpu, wall, growth = {}, {}, {}
    watch = importlib.util.find_spec("psutil") is not None
    hta = not args.skip_hta and has_hta(args.hta_python)
    hta_wall = []  # HTA on 256 ranks, each run right after one of the report's: both see the same minutes of the VM
    for k in SCALE_SIZES:
        sub = full if k == max(SCALE_SIZES) else subset(full, args.work / f"sweep{k}", k)
        db = args.work / f"scale{k}.duckdb"
        runs = []
        for _ in range(args.scale_runs):
            db.unlink(missing_ok=True)
            runs.append(run_cpu(traceanalyze_cmd(sub, out, db)))
            if hta and k == HTA_SCALE_RANKS:
                hta_wall.append(run_cpu([args.hta_python, "-c", HTA_SCRIPT, str(sub)])[0])
        wall[k], cpu[k], rss = (median([r[i] for r in runs]) for i in range(3))
        db.unlink(missing_ok=True)
        pss = f"{run_sampled(traceanalyze_cmd(sub, out, db)):.0f}" if watch else "no psutil"
        growth[k] = cpu[k] / cpu[SCALE_SIZES[0]] / (k / SCALE_SIZES[0])
        print(f"| {k} | {wall[k]:.2f} | {cpu[k]:.2f} | {cpu[k] / wall[k]:.2f} | {rss:.0f} | {pss} | {growth[k]:.2f}× "
              f"| {load()} |", flush=True)
    ok = max(growth.values()) <= SCALE_GROWTH_MAX
    print(f"\nCPU growth against linear from {SCALE_SIZES[0]} ranks: at most {max(growth.values()):.2f}× (target ≤ "
          f"{SCALE_GROWTH_MAX}×: {verdict(ok)})")
    if hta:
        ht, n = median(hta_wall), HTA_SCALE_RANKS
        print(f"HTA 0.5.0 on {n} ranks: {ht:.1f} s (median of {len(hta_wall)}, each run after one of the report's: "
              f"{', '.join(f'{t:.1f}' for t in hta_wall)} s); traceanalyze {ht / wall[n]:.1f}× faster (target ≥ 10×: "
              f"{verdict(ht / wall[n] >= 10)})")
    elif not args.skip_hta:
        print(f"HTA not run: {args.hta_python} cannot import hta (pip install '.[bench]'), or pass --skip-hta")
    return ok


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


def traceanalyze_cmd(folder: Path, out: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "traceanalyze.cli", "report", str(folder), "-o", str(out), "--db", str(db), "-q",
            *extra]


def load() -> str:
    """The 1-minute load average, printed beside every figure: the machine is shared."""
    return f"load {os.getloadavg()[0]:.1f}"


def make_set(folder: Path, *args: str) -> Path:
    """A set from ``make_scale_set.py`` (built once, kept in ``--work``)."""
    if not folder.exists() or not any(folder.iterdir()):
        subprocess.run([sys.executable, str(MAKE_SCALE_SET), str(folder), *args], check=True, stdout=subprocess.DEVNULL)
    return folder


def subset(src: Path, dst: Path, k: int) -> Path:
    """The first ``k`` ranks of ``src`` (by rank number) as hard links in ``dst`` (copies across file systems):
    the report does not follow symlinks out of its input folder."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    files = sorted((f for f in src.iterdir() if f.name.endswith((".json", ".json.gz"))),
                   key=lambda f: int("".join(c for c in f.name if c.isdigit()) or 0))
    for f in files[:k]:
        link_or_copy(f, dst / f.name)
    return dst


def link_or_copy(src: Path, dst: Path) -> None:
    """A hard link to ``src`` at ``dst``, or a copy where the file system has none."""
    try:
        os.link(src.resolve(), dst)
    except OSError:
        shutil.copyfile(src, dst)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def ranks_sweep(args, out: Path) -> None:
    """128..1,024 small ranks: traceanalyze cold beside HTA, alternating; speed-up, memory, growth per rank."""
    source = SHARED / "traces" / "real" / "hta" / "trace_filter" / "sampled_rank-0.json.gz"
    full = make_set(args.work / "r1024", "--ranks", "1024", "--source", str(source))
    print("\n| ranks | HTA (s) | HTA PSS (MB) | traceanalyze cold (s) | PSS (MB) | speed-up | s per 128 ranks | load |")
    print("|--:|--:|--:|--:|--:|--:|--:|---|")
    per = {}
    for k in (128, 256, 512, 1024):
        sub = subset(full, args.work / f"sweep{k}", k)
        hts, hms, ts, ms = [], [], [], []
        for _ in range(args.sweep_runs):
            if not args.skip_hta and k <= args.hta_max_ranks:
                t, m = run_once([args.hta_python, "-c", HTA_SCRIPT, str(sub)])
                hts.append(t)
                hms.append(m)
            db = args.work / f"sweep{k}.duckdb"
            t, m = run_measured(traceanalyze_cmd(sub, out, db), fresh_db=db)
            ts.append(t)
            ms.append(m)
        per[k] = (median(ts), median(ms), median(hts) if hts else None, median(hms) if hms else None)
        t, m, ht, hm = per[k]
        hta_cols = f"{ht:.1f} | {hm:.0f} | {ht / t:.1f}×" if ht else "not run | | "
        cols = hta_cols.split(" | ")
        print(f"| {k} | {cols[0]} | {cols[1]} | {t:.1f} | {m:.0f} | {cols[2]} | {t / k * 128:.2f} | {load()} |",
              flush=True)
    t, m, ht, hm = per[1024]
    growth = (per[1024][0] / 1024) / (per[128][0] / 128)
    print(f"\n1,024 ranks: {(ht or 0) / t:.1f}× HTA (target ≥ 10×: {verdict(bool(ht) and ht / t >= 10)}), peak "
          f"{m:.0f} MB (target ≤ 1,000 MB: {verdict(m <= 1000)}); time per rank at 1,024 vs 128: {growth:.2f}× "
          f"(no more than linear + 15 %: {verdict(growth <= 1.15)}; below 1: the per-run costs spread over more ranks)")


def big_gz(args, out: Path) -> None:
    """One .gz of ~2 GB of JSON against the same JSON as a plain file, alternating."""
    gz = make_set(args.work / "big-gz", "--ranks", "1", "--repeat", "40")
    plain = args.work / "big-plain"
    if not plain.exists():
        plain.mkdir()
        with gzip.open(next(gz.glob("*.json.gz")), "rb") as src, open(plain / "rank-0.json", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
    mb = json_megabytes(plain)
    res: dict[str, list] = {"gz": [], "plain": []}
    for _ in range(args.runs):
        for name, folder in (("gz", gz), ("plain", plain)):
            db = args.work / f"big-{name}.duckdb"
            db.unlink(missing_ok=True)
            res[name].append(run_once(traceanalyze_cmd(folder, out, db)))
            print(f"  {name}: {res[name][-1][0]:.1f} s, {res[name][-1][1]:.0f} MB, {load()}", flush=True)
    (tg, mg), (tp, mp_) = ((median([r[0] for r in res[n]]), median([r[1] for r in res[n]])) for n in ("gz", "plain"))
    ratio = tp / tg
    print(f"\n| {mb:.0f} MB of JSON, {args.runs} runs, medians | time (s) | MB/s | peak PSS (MB) |\n|---|--:|--:|--:|")
    print(f"| .json.gz | {tg:.1f} | {mb / tg:.0f} | {mg:.0f} |\n| .json | {tp:.1f} | {mb / tp:.0f} | {mp_:.0f} |")
    print(f".gz throughput {ratio:.0%} of plain JSON (target ≥ 90 %: {verdict(ratio >= 0.9)}); peak {mg:.0f} MB "
          f"(target ≤ 1,000 MB: {verdict(mg <= 1000)})")


def fixed_cost(args, out: Path) -> None:
    """A cold report of one 5 MB rank minus a bare interpreter start, alternating pairs: wall and CPU (user + sys,
    :func:`run_cpu`). With ``--baseline``, that tree's report runs in each round too (the same figures for it).

    In each round it also times the report's third-party imports alone (:func:`dependency_modules`: every module
    outside the standard library and traceanalyze that the report imported, in its order): what no change to
    traceanalyze's own code can take off the fixed cost, short of dropping a dependency from the report's path."""
    source = SHARED / "traces" / "real" / "hta" / "trace_filter" / "sampled_rank-0.json.gz"
    one = make_set(args.work / "one5", "--ranks", "1", "--repeat", "3", "--source", str(source))
    trees = {"now": None, **({"baseline": baseline_env(args.baseline)} if args.baseline else {})}
    rep: dict[str, list[tuple[float, float, float]]] = {k: [] for k in trees}
    db = args.work / "one5.duckdb"
    deps = dependency_modules(traceanalyze_cmd(one, out, db), db)
    bare, imports = [], []
    for _ in range(max(args.runs, 5)):
        for name, env in trees.items():
            db.unlink(missing_ok=True)
            rep[name].append(run_cpu(traceanalyze_cmd(one, out, db), env=env))
        bare.append(run_cpu([sys.executable, "-c", "pass"]))
        imports.append(run_cpu([sys.executable, "-c", IMPORT_ALL, *deps]))
    bw, bc = median([b[0] for b in bare]), median([b[1] for b in bare])
    iw, ic = median([r[0] for r in imports]) - bw, median([r[1] for r in imports]) - bc
    for name in trees:
        w, c = median([r[0] for r in rep[name]]), median([r[1] for r in rep[name]])
        print(f"\nfixed cost ({name}): cold report of a {json_megabytes(one):.1f} MB rank {w:.2f} s wall, {c:.2f} s "
              f"CPU - python -c pass {bw:.3f} s, {bc:.3f} s CPU = {w - bw:.2f} s wall, {c - bc:.2f} s CPU (target "
              f"≤ 0.5 s: {verdict(w - bw <= 0.5)}), {load()}")
    roots = sorted({m.split(".")[0] for m in deps if not m.startswith("_")})
    print(f"of which the third-party imports alone ({len(deps)} modules of {', '.join(roots)}): {iw:.2f} s wall, "
          f"{ic:.2f} s CPU beyond python -c pass; what is left for traceanalyze's own imports and work: "
          f"{median([r[0] for r in rep['now']]) - bw - iw:.2f} s wall")


# imports the modules named in argv in order; one that fails alone (a module another must import first) is skipped
IMPORT_ALL = ("import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
              "    except Exception:\n        pass")
# runs ``traceanalyze.cli`` on argv, then prints every module the process holds, in the order their imports began
MODULES_AFTER = """
import sys
from traceanalyze.cli import main
sys.argv = ["traceanalyze", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print("\\n".join("module " + k for k, v in list(sys.modules.items()) if v is not None))
"""
# the same list from a bare interpreter: what every Python process holds before it imports anything
BARE_MODULES = "import sys; print('\\n'.join('module ' + k for k in list(sys.modules)))"


def dependency_modules(cmd: list[str], db: Path) -> list[str]:
    """The modules outside the standard library and traceanalyze that the report ``cmd`` (:func:`traceanalyze_cmd`,
    run once here) held at its end and a bare ``python -c pass`` does not: its third-party imports, submodules
    included, in the order their imports began. Imports that failed (pandas, which the command line blocks) are
    not among them."""
    def modules(*args: str) -> list[str]:
        res = subprocess.run([sys.executable, "-c", MODULES_AFTER if args else BARE_MODULES, *args],
                             capture_output=True, text=True, env=BENCH_ENV, cwd=tempfile.gettempdir(), check=True)
        return [ln.removeprefix("module ") for ln in res.stdout.splitlines() if ln.startswith("module ")]

    db.unlink(missing_ok=True)
    bare = set(modules())
    return [m for m in modules(*cmd[cmd.index("report"):]) if m not in bare
            and m.split(".")[0] not in (*sys.stdlib_module_names, "traceanalyze")]


def main_table(args, mb: float, hta_t: list, hta_m: list, cold_t: list, cold_m: list, warm_t: list,
               warm_m: list) -> None:
    """The scale set's table (HTA, cold, cached) and its speed-up and memory against the targets."""
    rows = [("traceanalyze report, cold", median(cold_t), median(cold_m)),
            ("traceanalyze report, cached re-run", median(warm_t), median(warm_m))]
    if hta_t:
        rows.insert(0, ("HTA 0.5.0 load + 4 analyses", median(hta_t), median(hta_m)))
    print(f"\n| {args.runs} runs, medians | time (s) | peak memory, PSS (MB) | JSON MB/s |")
    print("|---|--:|--:|--:|")
    for name, t, m in rows:
        print(f"| {name} | {t:.2f} | {m:.0f} | {mb / t:.0f} |")
    if hta_t:
        sp, mem = median(hta_t) / median(cold_t), median(cold_m) / median(hta_m)
        print(f"\nspeed-up over HTA: {sp:.1f}× cold (target ≥ 10×: {verdict(sp >= 10)}), "
              f"{median(hta_t) / median(warm_t):.1f}× cached; memory {mem:.2f}× of HTA's (target ≤ 0.5×, issue 38: "
              f"{verdict(mem <= 0.5)}); re-run {median(warm_t):.2f} s (target ≤ 0.3 s: "
              f"{verdict(median(warm_t) <= 0.3)})")


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
    ap.add_argument("--ranks-sweep", action="store_true", help="128..1,024 small ranks beside HTA")
    ap.add_argument("--sweep-runs", type=int, default=1, help="runs per sweep size (HTA: ~200 s at 1,024 ranks)")
    ap.add_argument("--hta-max-ranks", type=int, default=1024, help="run HTA in the sweep up to this many ranks")
    ap.add_argument("--big-gz", action="store_true", help="one ~2 GB-of-JSON .gz against the same plain file")
    ap.add_argument("--fixed-cost", action="store_true", help="cold report of one 5 MB rank minus python start")
    ap.add_argument("--dask", action="store_true", help="the scale set through --executor dask (2 local workers)")
    ap.add_argument("--skip-main", action="store_true", help="only the rows asked for, not the scale set")
    ap.add_argument("--baseline", type=Path, help="a source tree of traceanalyze (git worktree add DIR COMMIT): its "
                    "cold report timed alternating with this one's, and the growth printed")
    ap.add_argument("--scale", action="store_true", help="only the scale guard: 64, 256 and 1,024 ranks, exit 1 "
                    f"when the CPU time grows more than {SCALE_GROWTH_MAX}x linear")
    ap.add_argument("--scale-runs", type=int, default=1, help="runs per size of the scale guard")
    args = ap.parse_args()

    args.work = args.work.resolve()  # every command runs from the temp folder (baseline_env)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.scale:
        raise SystemExit(0 if scale_guard(args, args.work / "report.html") else 1)
    traces = args.traces.resolve() if args.traces else None
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

    hta_t, hta_m, cold_t, cold_m, warm_t, warm_m, base_t, base_m = [], [], [], [], [], [], [], []
    out = args.work / "report.html"
    if args.fixed_cost:
        fixed_cost(args, out)
    for i in range(0 if args.skip_main else args.runs):
        if not args.skip_hta:
            t, m = run_measured([args.hta_python, "-c", HTA_SCRIPT, str(traces)])
            hta_t.append(t)
            hta_m.append(m)
            print(f"run {i + 1}: HTA {t:.2f} s, {m:.0f} MB", flush=True)
        db = args.work / "cold.duckdb"
        t, m = run_measured(traceanalyze_cmd(traces, out, db), fresh_db=db)
        cold_t.append(t)
        cold_m.append(m)
        if args.baseline:
            bt, bm = run_measured(traceanalyze_cmd(traces, out, db), fresh_db=db, env=baseline_env(args.baseline))
            base_t.append(bt)
            base_m.append(bm)
            print(f"run {i + 1}: baseline cold {bt:.2f} s, {bm:.0f} MB", flush=True)
        t2, m2 = run_measured(traceanalyze_cmd(traces, out, db))
        warm_t.append(t2)
        warm_m.append(m2)
        print(f"run {i + 1}: traceanalyze cold {t:.2f} s, {m:.0f} MB; cached {t2:.2f} s, {m2:.0f} MB, {load()}",
              flush=True)
    if not args.skip_main:
        main_table(args, mb, hta_t, hta_m, cold_t, cold_m, warm_t, warm_m)
    if base_t:
        grow = (median(cold_t) / median(base_t) - 1) * 100
        # the machine's speed drifts between runs: the median of each run's own ratio is robust to that drift
        paired = (median([c / b for b, c in zip(base_t, cold_t, strict=True)]) - 1) * 100
        print(f"\ncold report against the baseline {args.baseline} ({args.runs} runs each, alternating): medians "
              f"{median(base_t):.2f} s, {median(base_m):.0f} MB -> {median(cold_t):.2f} s, {median(cold_m):.0f} MB "
              f"({grow:+.1f} %); median of the runs' own ratios {paired:+.1f} % (target at most +10 %: "
              f"{verdict(max(grow, paired) <= 10)}); each run, baseline/now: "
              + ", ".join(f"{b:.2f}/{c:.2f}" for b, c in zip(base_t, cold_t, strict=True)))
    if args.dask:
        ts, ms = [], []
        for _ in range(args.runs):
            db = args.work / "dask.duckdb"
            t, m = run_measured(traceanalyze_cmd(traces, out, db, "--executor", "dask", "-j", "2"), fresh_db=db)
            ts.append(t)
            ms.append(m)
        print(f"\n| the scale set through --executor dask (local cluster, 2 workers) | {median(ts):.2f} s | "
              f"{median(ms):.0f} MB | {mb / median(ts):.0f} MB/s | {load()} |")
    if args.ranks_sweep:
        ranks_sweep(args, out)
    if args.big_gz:
        big_gz(args, out)

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
                link_or_copy(f, sub / f.name)
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
