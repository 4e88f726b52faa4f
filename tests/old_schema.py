"""Rewrite a new-schema Kineto trace (PyTorch 2.x) into the 2021 form PyTorch 1.8/1.9 wrote, for tests.

The 2021 form, as in the PyTorch profiler's own sample traces (torch-tb-profiler ``samples/``): capitalised
categories (``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, ``Operator``), ``ProfilerStep#N`` as a ``cpu_op``
instead of a ``user_annotation``, the data loader's ``enumerate(DataLoader)#...__next__`` in a ``DataLoader``
category, absolute epoch-µs ``ts`` (no ``baseTimeNanoseconds``), no ``distributedInfo``, and
``tensorboard_trace_handler`` file names ``<worker>.<ms timestamp>.pt.trace.json.gz``.

Usage: ``python tests/old_schema.py SRC.json[.gz] DST.json[.gz] [--shift-us US] [--step-offset N]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

CATEGORY_2021 = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset", "cuda_runtime": "Runtime",
                 "cpu_op": "Operator"}


def to_2021(src: Path, dst: Path, *, shift_us: float = 0.0, step_offset: int = 0,
            device_properties: list | None = None) -> Path:
    """Write ``src`` in the 2021 form to ``dst``; ``shift_us`` moves every event later (a later profiling
    window), ``step_offset`` renumbers ``ProfilerStep#N`` to ``N + step_offset``."""
    opener = gzip.open if str(src).endswith(".gz") else open
    with opener(src, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    base_us = doc.get("baseTimeNanoseconds", 0) / 1000
    events = []
    for e in doc["traceEvents"]:
        e = dict(e)
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = round(e["ts"] + base_us + shift_us, 3)
        name, cat = e.get("name", ""), e.get("cat")
        if name.startswith("ProfilerStep#"):
            e["cat"] = "cpu_op"
            e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + step_offset}"
        elif name.startswith("enumerate(DataLoader)#"):
            e["cat"] = "DataLoader"
        elif cat in CATEGORY_2021:
            e["cat"] = CATEGORY_2021[cat]
        events.append(e)
    out = {"schemaVersion": 1, "deviceProperties": device_properties or [], "traceEvents": events}
    dst.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open if dst.name.endswith(".gz") else open)(dst, "wt", encoding="utf-8") as fh:
        json.dump(out, fh)
    return dst


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--shift-us", type=float, default=0.0)
    ap.add_argument("--step-offset", type=int, default=0)
    a = ap.parse_args()
    to_2021(a.src, a.dst, shift_us=a.shift_us, step_offset=a.step_offset)
