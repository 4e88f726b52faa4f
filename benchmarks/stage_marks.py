"""When a cold report's stages end, for two or more source trees, in interleaved runs: on a VM whose speed swings
by tens of percent between minutes, the pairs of runs made back to back are what can be compared.

    python benchmarks/stage_marks.py /tmp/traceanalyze-bench/sweep256 --trees /work/before /work/main --runs 5

Each run is a fresh process (``python -c``, the tree first on ``PYTHONPATH``, a new database) that marks, in seconds
from its start, the end of the load (``stages.load_traces``), the start and end of the diagnosis
(``stages.build_run``) and the end of the report. Prints each run's marks, then per tree the median of each mark,
and how many rounds each later tree ended its load and its report before the first tree did.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

DRIVER = r"""
import json, sys, time
t0 = time.perf_counter()
from traceanalyze import cli, stages
marks = {}
def wrap(name):
    f = getattr(stages, name)
    def w(*a, **k):
        marks.setdefault(name + "_start", time.perf_counter() - t0)
        try:
            return f(*a, **k)
        finally:
            marks[name + "_end"] = time.perf_counter() - t0
    setattr(stages, name, w)
wrap("load_traces"); wrap("build_run")
d = sys.argv[2]
sys.argv = ["traceanalyze", "report", sys.argv[1], "-o", d + "/r.html", "--db", d + "/r.duckdb", "-q"]
try:
    cli.main()
except SystemExit:
    pass
marks["report_end"] = time.perf_counter() - t0
print(json.dumps(marks))
"""

MARKS = ("load_traces_end", "build_run_start", "build_run_end", "report_end")


def one_run(tree: str, traces: str) -> dict[str, float]:
    """The stage marks (s from the process's start) of one cold report of ``traces`` by ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": tree}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled once, not at every run
    with tempfile.TemporaryDirectory(prefix="stage-marks-") as d:
        out = subprocess.run([sys.executable, "-c", DRIVER, traces, d], env=env, cwd=tree, capture_output=True,
                             text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces")
    ap.add_argument("--trees", nargs="+", required=True, help="source trees (the first is the reference)")
    ap.add_argument("--runs", type=int, default=5, help="rounds; each runs every tree once, in turn")
    args = ap.parse_args()
    for tree in args.trees:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "traceanalyze"], cwd=tree, check=True)
    res: dict[str, list[dict]] = {t: [] for t in args.trees}
    for i in range(args.runs):
        for tree in args.trees:
            m = one_run(tree, args.traces)
            res[tree].append(m)
            print(f"round {i + 1} {tree}: " + " ".join(f"{k} {m[k]:.3f}" for k in MARKS if k in m), flush=True)
    ref = res[args.trees[0]]
    print(f"\n| tree | {' | '.join(MARKS)} | rounds with the load ended first | rounds with the report ended first |")
    print("|---|" + "--:|" * (len(MARKS) + 2))
    for tree in args.trees:
        med = [statistics.median(m[k] for m in res[tree] if k in m) for k in MARKS]
        won = [sum(a[k] < b[k] for a, b in zip(res[tree], ref, strict=True)) for k in ("load_traces_end", "report_end")]
        cells = " | ".join(f"{x:.3f}" for x in med)
        print(f"| {tree} | {cells} | " + (" | ".join(f"{w} of {args.runs}" for w in won) if tree != args.trees[0]
                                          else "reference | reference") + " |")


if __name__ == "__main__":
    main()
