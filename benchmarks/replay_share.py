"""What the what-if replay adds to a cold report (issue 16's speed target: at most 25 %).

    python benchmarks/replay_share.py /tmp/scale8 --runs 5

Runs ``traceanalyze report`` cold on FOLDER in turn with the replay stubbed out (``stages.replay`` returns
nothing) and with it, ``--runs`` pairs, each in a fresh process and a fresh database; prints every time and peak RSS
(the process's own, ``ru_maxrss``) and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import resource, sys, time
from traceanalyze import cli, stages
if sys.argv[1] == "stub":
    stages.replay = lambda *a, **k: ({}, [], {})
t = time.perf_counter()
try:
    sys.argv = ["traceanalyze", "report", sys.argv[2], "-o", sys.argv[3] + "/r.html", "--db",
                sys.argv[3] + "/r.duckdb", "-q"]
    cli.main()
except SystemExit:
    pass
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    res: dict[str, list[tuple[float, int]]] = {"stub": [], "full": []}
    for _ in range(args.runs):
        for mode in res:
            with tempfile.TemporaryDirectory() as out:
                r = subprocess.run([sys.executable, "-c", CHILD, mode, str(args.folder), out], capture_output=True,
                                   text=True, check=True)
            t, mb = r.stdout.split()[-2:]
            res[mode].append((float(t), int(mb)))
            print(f"{mode}: {float(t):.2f} s, {mb} MB", flush=True)
    med = {m: (statistics.median(t for t, _ in v), statistics.median(mb for _, mb in v)) for m, v in res.items()}
    share = 100 * (med["full"][0] / med["stub"][0] - 1)
    print(f"\nmedians: without the replay {med['stub'][0]:.2f} s, {med['stub'][1]:.0f} MB; with it "
          f"{med['full'][0]:.2f} s, {med['full'][1]:.0f} MB: +{share:.0f} % "
          f"(target ≤ 25 %: {'met' if share <= 25 else 'NOT met'})")


if __name__ == "__main__":
    main()
