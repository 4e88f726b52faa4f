#!/usr/bin/env python3
"""Benchmark: parse time of a trace holding one event with a long string (docs/safety.md 5: linear in bytes).

    python benchmarks/long_event.py                 # 15, 30 and 60 MB strings, 3 runs each
    python benchmarks/long_event.py --mb 60 120 --runs 5

Each trace has 1,000 CPU ops around one op whose name is ``--mb`` MB of ``x``. The figures are the median
``parse_trace`` time over ``--runs`` runs and the bytes the structural scanner went through, per byte of the file
(2.0 means each byte twice: linear). The tests check the mechanism (``scanned_bytes``), never a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from traceanalyze.ingest.parse import parse_trace


def write(path: Path, mb: int) -> None:
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(1000)]
    with open(path, "w") as fh:
        fh.write('{"traceEvents": [')
        fh.write(", ".join(json.dumps(e) for e in ops[:500]))
        fh.write(', {"ph": "X", "cat": "cpu_op", "name": "' + "x" * (mb << 20) + '", "pid": 1, "tid": 1, "ts": 5, '
                 '"dur": 1}, ')
        fh.write(", ".join(json.dumps(e) for e in ops[500:]))
        fh.write("]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, nargs="+", default=[15, 30, 60])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'MB':>5} {'median s':>9} {'MB/s':>7} {'scanned/bytes':>14}")
        for mb in args.mb:
            f = Path(tmp) / f"long{mb}.json"
            write(f, mb)
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                info, _ = parse_trace(f)
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            ratio = info.scanned_bytes / info.bytes_read
            print(f"{mb:>5} {med:>9.2f} {info.bytes_read / med / 1e6:>7.0f} {ratio:>14.2f}")
            f.unlink()


if __name__ == "__main__":
    main()
