"""Checks and facts of one run's loaded trace files, before any metric: the files of a folder that do not belong
together (copies, overlapping windows of one rank, mixed runs) and what the trace headers state (world size,
backend, GPU, versions, missing ranks).

The run is a :class:`traceanalyze.discover.Run` and the files :class:`traceanalyze.ingest.LoadedFile` rows; both
are read by attribute only (``discover`` is a sibling of ``ingest``: neither imports the other).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb

from traceanalyze import hardware
from traceanalyze.fmt import ranges, rank_spans

MIXED_RUN_GAP_NS = 3600 * 10**9  # ranks of one job start their first profiling window within seconds
EPOCH_2001_NS = 10**18  # starts before this are relative clocks, not comparable across files


def names(paths: list, limit: int = 4) -> str:
    """Up to ``limit`` file names, sorted, then how many more."""
    listed = sorted(Path(p).name for p in paths)
    return ", ".join(listed[:limit]) + (f" and {len(listed) - limit} more" if len(listed) > limit else "")


def check_files(con: duckdb.DuckDBPyConnection, run: Any, by_rank: dict[int, list], headers: dict,
                warnings: list[dict]) -> set:
    """Find the files of one folder that do not belong together; return the paths left out.

    * Two files of one rank whose time spans overlap are not two profiling windows: identical ones (same span
      and event counts) are copies, read once; different ones are left out with a warning naming both.
    * Different ``distributedInfo.world_size`` values, or ranks whose first traces start more than
      :data:`MIXED_RUN_GAP_NS` apart, mean the folder mixes runs: a warning names the files of each side.
    """
    ids = [lf.file_id for lfs in by_rank.values() for lf in lfs]
    if not ids:
        return set()
    marks = ", ".join("?" * len(ids))
    spans = {fid: (lo, hi, n) for fid, lo, hi, n in con.execute(
        "SELECT file_id, min(ts_ns), max(ts_ns + dur_ns), count(*) FROM (SELECT file_id, ts_ns, dur_ns FROM kernels "
        f"WHERE file_id IN ({marks}) UNION ALL SELECT file_id, ts_ns, dur_ns FROM cpu_ops WHERE file_id IN ({marks})) "
        "GROUP BY file_id", ids + ids).fetchall()}
    counts = dict(con.execute(f"SELECT file_id, [n_kernels, n_cpu_ops] FROM files WHERE file_id IN ({marks})",
                              ids).fetchall())
    dropped: set = set()
    for r, lfs in by_rank.items():
        if len(lfs) < 2:
            continue
        kept: list = []
        for lf in sorted(lfs, key=lambda lf: ((spans.get(lf.file_id) or (0,))[0], str(lf.path))):
            s = spans.get(lf.file_id)
            twin = next((k for k in kept if s and spans.get(k.file_id)
                         and s[0] < spans[k.file_id][1] and spans[k.file_id][0] < s[1]), None)
            if twin is None:
                kept.append(lf)
                continue
            dropped.add(lf.path)
            if s == spans[twin.file_id] and counts.get(lf.file_id) == counts.get(twin.file_id):
                msg = f"a copy of {twin.path} (rank {r}, the same events); read once"
            else:
                msg = (f"rank {r} again, at the same time as {twin.path}: not a second profiling window; left out "
                       "(two runs in one folder? put each run's traces in its own folder)")
            warnings.append({"file": str(lf.path), "level": "warning", "message": msg})
        lfs[:] = kept
    by_ws: dict[int, list] = {}
    for lfs in by_rank.values():
        for lf in lfs:
            di = headers.get(lf.path, {}).get("distributedInfo")
            ws = di.get("world_size") if isinstance(di, dict) else None
            if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0:
                by_ws.setdefault(ws, []).append(lf.path)
    if len(by_ws) > 1:
        sides = "; ".join(f"world_size {ws} in {names(ps)}" for ws, ps in sorted(by_ws.items()))
        warnings.append({"file": None, "level": "warning",
                         "message": f"{run.path} mixes runs ({sides}): put each run's traces in its own folder"})
        return dropped
    firsts = []
    for lfs in by_rank.values():
        starts = [(spans[lf.file_id][0], lf.path) for lf in lfs if spans.get(lf.file_id)]
        if starts:
            firsts.append(min(starts))
    if len(firsts) > 1 and all(t > EPOCH_2001_NS for t, _ in firsts):
        firsts.sort()
        gap, i = max((firsts[j + 1][0] - firsts[j][0], j + 1) for j in range(len(firsts) - 1))
        if gap > MIXED_RUN_GAP_NS:
            early, late = [p for _, p in firsts[:i]], [p for _, p in firsts[i:]]
            warnings.append({"file": None, "level": "warning",
                             "message": f"{run.path} seems to mix runs: {names(late)} start {gap / 3.6e12:.1f} h "
                                        f"after {names(early)} (the ranks of one job start within seconds); put "
                                        "each run's traces in its own folder"})
    return dropped


def run_facts(headers: Iterable[dict], by_rank: dict) -> dict:
    """World size, backend, GPU model and versions from the trace headers (first one that says); ``_gpu``: the
    first header's :func:`traceanalyze.hardware.from_properties`, for :func:`header_facts` to resolve."""
    facts = {"world_size": None, "backend": None, "gpu_model": None, "gpu_count": None,
             "nccl_version": None, "cuda_runtime_version": None, "pg_config": None, "_gpu": None}
    for h in headers:
        di = h.get("distributedInfo") if isinstance(h.get("distributedInfo"), dict) else {}
        ws = di.get("world_size")
        if isinstance(ws, int) and ws > 0 and not isinstance(ws, bool):
            facts["world_size"] = max(facts["world_size"] or 0, ws)
        if di.get("backend") and not facts["backend"]:
            facts["backend"] = str(di["backend"])
        if di.get("nccl_version") and not facts["nccl_version"]:
            facts["nccl_version"] = str(di["nccl_version"])
        if di.get("pg_config") and not facts["pg_config"]:
            facts["pg_config"] = di["pg_config"]
        props = h.get("deviceProperties") or h.get("computeProperties")
        if isinstance(props, list) and props and not facts["gpu_model"]:
            names = [p.get("name") for p in props if isinstance(p, dict) and p.get("name")]
            if names:
                facts["gpu_model"] = str(names[0])
                facts["gpu_count"] = len(names)
        if facts["_gpu"] is None:
            facts["_gpu"] = hardware.from_properties(
                props, "deviceProperties" if h.get("deviceProperties") else "computeProperties")
        crv = h.get("cuda_runtime_version")
        if crv and not facts["cuda_runtime_version"]:
            facts["cuda_runtime_version"] = str(crv)
    if facts["world_size"] is None and len(by_rank) > 1:
        facts["world_size"] = max(by_rank) + 1
    elif facts["world_size"] is None and by_rank:
        facts["world_size"] = max(by_rank) + 1
    return facts


def header_facts(run: Any, headers: dict, by_rank: dict, good: list, gpu_option: str | None,
                 warnings: list[dict]) -> tuple[dict, hardware.GpuInfo]:
    """World size, backend, GPU and versions the headers state, the GPU resolved against ``--gpu``, and the
    missing ranks as spans; returns (facts, GPU)."""
    facts = run_facts(headers.values(), by_rank)
    gpu = hardware.resolve(facts.pop("_gpu"), gpu_option)
    facts["gpu_capability"] = gpu.sm
    facts["gpu_source"] = gpu.source if (gpu.name or gpu.capability) else None
    if gpu_option and gpu.source != "--gpu" and good:
        warnings.append({"file": None, "level": "info",
                         "message": f"--gpu {gpu_option} ignored: the trace's deviceProperties say {gpu.label}"})
    if facts["world_size"] and by_rank:
        missing = [r for r in range(facts["world_size"]) if r not in by_rank]  # world size <= 2^20
        if missing:  # a count and ranges, never the ranks one by one
            warnings.append({"file": None, "level": "warning",
                             "message": f"{len(missing):,} of {facts['world_size']:,} ranks have no trace "
                                        f"(ranks {ranges(missing)}): copy every rank's trace file into "
                                        f"{run.path} for a complete picture"})
        facts["missing_ranks"] = rank_spans(missing)  # [first, last] pairs: bounded by the gaps, not the ranks
        facts["n_missing_ranks"] = len(missing)
    return facts, gpu
