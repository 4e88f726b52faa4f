"""How much idle the replay keeps as measured because no dependency explains it, on every trace folder we hold.

    python benchmarks/unexplained_gaps.py                   # samples, ../shared/traces/real, both GPU sets
    python benchmarks/unexplained_gaps.py --no-event-waits  # the same without cross-stream waits (as before issue 37)

Per folder: ``runs[0].replay.unexplained_gaps`` (:mod:`traceanalyze.replay.gaps`): per counted step, the GPU
streams' idle (gaps of 10 µs or more) and the host threads' gaps of 1 ms or more, with the part the replay keeps as a
fixed delay; and the largest ``unexplained_gap_pct`` of the folder's what-ifs (the share of a predicted step's
critical path in such gaps). ``--no-event-waits`` builds the graph without any event_wait edge, which is what a
trace whose cuda_sync rows name no awaited stream (torch 2.11) or that has no rows got before issue 37.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"


def folders() -> list[Path]:
    out = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir() and p.name != "pairs")
    out += sorted({p.parent for p in (ROOT / "sample_traces" / "pairs").glob("*/*/*.json*")})
    if (SHARED / "real").exists():
        out += sorted(p for p in (SHARED / "real").glob("*/*") if p.is_dir())
    for gpu in (SHARED / "gpu" / "h200", ROOT / "tests" / "data" / "gpu" / "h100"):
        out += sorted(p for p in gpu.glob("*/*") if p.is_dir() and any(p.glob("*.json.gz")))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-event-waits", action="store_true", help="no cross-stream event_wait edges")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from traceanalyze.options import Options
    from traceanalyze.pipeline import analyze
    from traceanalyze.replay.graph import deps

    if args.no_event_waits:
        deps._stream_waits = lambda *a: (np.zeros(0, np.int64),) * 4
    print("| folder | streams: kept of idle ms/step | threads: kept of idle ms/step | most kept on | "
          "largest what-if on-path % |\n|---|--:|--:|---|--:|")
    for f in folders():
        a = analyze(f, Options(jobs=1))
        a.con.close()
        run = (a.model.get("runs") or [{}])[0]
        ug = (run.get("replay") or {}).get("unexplained_gaps") or {}
        if not ug:
            continue
        st, th = ug["streams"], ug["threads"]
        top = ", ".join(f"{r['resource']} {r['kept_us'] / 1e3:.1f}" for r in ug.get("resources", [])[:2])
        on = max((w.get("unexplained_gap_pct") or 0.0 for w in run.get("whatif") or []), default=0.0)
        name = str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f.relative_to(ROOT.parent))
        print(f"| {name} | {st['kept_us'] / 1e3:.2f} of {st['idle_us'] / 1e3:.2f} ({st['kept_pct']:.1f} %) | "
              f"{th['kept_us'] / 1e3:.2f} of {th['idle_us'] / 1e3:.2f} ({th['kept_pct']:.1f} %) | {top} | {on:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
