"""Small synthetic Kineto traces for tests that must run without ../shared or torch."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def write_trace(path: Path, rank: int, events: list[dict], *, world_size: int = 2, backend: str = "gloo",
                base_ns: int = 1_700_000_000_000_000_000) -> Path:
    """Write a new-schema Kineto trace (relative ``ts`` in µs, ``baseTimeNanoseconds``) for ``rank``."""
    doc = {"schemaVersion": 1, "deviceProperties": [], "record_shapes": 1,
           "distributedInfo": {"backend": backend, "rank": rank, "world_size": world_size},
           "baseTimeNanoseconds": base_ns, "traceEvents": events}
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    return path


def x(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args) -> dict:
    """One complete (``ph: X``) event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kernel(name: str, ts: float, dur: float, stream: int, corr: int, launch_ts: float) -> list[dict]:
    """A GPU kernel on ``stream`` and the ``cudaLaunchKernel`` that launched it at ``launch_ts``."""
    return [x("kernel", name, ts, dur, pid=0, tid=stream, stream=stream, correlation=corr, device=0),
            x("cuda_runtime", "cudaLaunchKernel", launch_ts, 1.0, correlation=corr)]


def cpu_job(rank: int, offset_us: float, steps: int = 3, slow: float = 0.0) -> list[dict]:
    """A CPU (gloo) rank: per step compute (``aten::mm``) then one ``gloo:all_reduce`` that ends at the same true
    time on every rank; this rank's clock reads ``offset_us`` ahead; ``slow`` µs of extra compute per step."""
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}]
    t = 1000.0
    for s in range(1, steps + 1):
        step_len = 10_000.0
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t + offset_us, step_len))
        comp = 3000.0 + slow
        ev.append(x("cpu_op", "aten::mm", t + 100 + offset_us, comp, **{"Input type": ["float", "float"],
                                                                         "Input Dims": [[64, 64], [64, 64]]}))
        end = t + 9000.0  # the collective ends together on every rank (true time)
        start = t + 100 + comp + 50
        ev.append(x("cpu_op", "c10d::allreduce_", start + offset_us, 20.0))
        ev.append(x("user_annotation", "gloo:all_reduce", start + offset_us, end - start, tid=2,
                    **{"Input type": ["float"], "Input Dims": [[4096]]}))
        t += step_len
    return ev
