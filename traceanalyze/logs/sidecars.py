"""A run's sidecars (training logs, NCCL output, topology, configs, capture's env and step files): read, stored
(``log_steps``, ``nccl_channels``, ``topology_links``, ``run_facts``, ``run_deaths``) and turned into what the later
stages read: the expected link bandwidth, the step time the logs state and the step time without the profiler.

The log parsers (~100 patterns compiled, yaml) are imported by :func:`read_sidecars` only when the run has a
sidecar to read.
"""

from __future__ import annotations

import statistics
from typing import Any

import duckdb

from traceanalyze import hardware, store
from traceanalyze.errors import TraceanalyzeError
from traceanalyze.limits import MAX_MEMORY_BYTES, MAX_OOM_EVENTS
from traceanalyze.logs.batch import check_batch_facts
from traceanalyze.logs.steps import measured_unprofiled_step, parse_capture_steps


def read_sidecars(con: duckdb.DuckDBPyConnection, run_id: int, run: Any, warnings: list[dict],
                  max_bytes: int | None = None) -> dict:
    """Parse the run's logs, NCCL output, topology and configs; store them; return what diagnosis reads.

    Each file is bounded like a trace (``max_bytes``, ``--max-decompressed``); one that is over it, unreadable or
    too big for memory is a warning row naming it, and the others are still read. ``run``: a
    :class:`traceanalyze.discover.Run` (its ``sidecars``). Returns ``{"facts", "log_steps", "nccl", "topology",
    "capture_steps", "ooms", "unprofiled"}``."""
    if run.sidecars:  # the parsers (yaml, ~100 patterns compiled on import) only when there is a file to read
        from traceanalyze.logs.configs import parse_config
        from traceanalyze.logs.env import parse_env
        from traceanalyze.logs.text import parse_text_log
        from traceanalyze.logs.topology import parse_topology
    facts: dict[str, list] = {}
    log_steps: list = []
    nccl = None
    topology = None
    ooms: list = []  # :class:`OomEvent`: the out-of-memory errors and kills the logs record
    capture_steps: list = []  # :class:`CaptureSteps` of capture's steps_rank{r}.json
    for sc in run.sidecars:
        try:
            if sc.kind in ("training_log", "nccl_debug"):
                res = parse_text_log(sc.path, max_bytes)
                for f in res.facts:
                    facts.setdefault(f.key, []).append(f)
                log_steps.extend(res.steps)
                kept = res.ooms[: max(0, MAX_OOM_EVENTS - len(ooms))]  # bounded over the run's logs too
                ooms.extend(kept)
                warnings.extend({"file": str(sc.path), "message": m, "level": "warning"} for m in res.bad_values)
                store.insert_rows(con, "run_deaths", None, death_rows(run_id, str(sc.path), kept, warnings))
                store.insert_rows(con, "log_steps", None, [
                    [run_id, str(sc.path), res.framework, st.rank, st.step, st.iter, st.loss, st.lr, st.grad_norm,
                     st.tokens_per_s, st.tflops, st.mfu_pct, st.step_time_ms, st.memory_gib, st.epoch]
                    for st in res.steps])
                if res.nccl is not None and (res.nccl.channels or res.nccl.version):
                    if nccl is None:
                        nccl = res.nccl
                    else:
                        nccl.channels.extend(res.nccl.channels)
                    store.insert_rows(con, "nccl_channels", None, [
                        [run_id, str(sc.path), c.host, c.device, c.channel, c.src_rank, c.dst_rank, c.transport,
                         c.detail] for c in res.nccl.channels])
                warnings.extend({"file": str(sc.path), "message": m, "level": "info"} for m in res.warnings)
                timed = [st.step_time_ms for st in res.steps if st.step_time_ms is not None]
                if res.framework in ("console", "step_times") and timed:
                    what = "console step lines" if res.framework == "console" else "a step-time JSON"
                    warnings.append({"file": str(sc.path), "level": "info",
                                     "message": f"used: {what} with {len(timed)} step time(s), median "
                                                f"{statistics.median(timed):,.1f} ms (the run's step time from logs)"})
            elif sc.kind == "topology":
                topology = parse_topology(sc.path, max_bytes)
                warnings.extend({"file": str(sc.path), "message": m, "level": "info"} for m in topology.warnings
                                if "longer than" in m)
                store.insert_rows(con, "topology_links", None,
                                  [[run_id, str(sc.path), lk.a, lk.b, lk.link] for lk in topology.links])
            elif sc.kind == "config":
                for f in parse_config(sc.path, max_bytes):
                    facts.setdefault(f.key, []).append(f)
            elif sc.kind == "env":  # env_rank{r}.json from traceanalyze.capture
                for f in parse_env(sc.path, max_bytes):
                    facts.setdefault(f.key, []).append(f)
            elif sc.kind == "steps":  # steps_rank{r}.json: steps capture timed without the profiler
                capture_steps.append(parse_capture_steps(sc.path, max_bytes))
                warnings.extend({"file": str(sc.path), "message": m, "level": "warning"}
                                for m in capture_steps[-1].warnings)
        except TraceanalyzeError as exc:
            warnings.append({"file": str(sc.path), "message": str(getattr(exc, "problem", exc)), "level": "warning"})
        except MemoryError:  # never the report's end for one sidecar
            warnings.append({"file": str(sc.path), "level": "warning",
                             "message": "ran out of memory while reading it; skipped (lower --max-decompressed)"})
    # a gradient accumulation or batch that is no recipe's (0, negative, nan, 1e30): dropped, one warning each
    warnings.extend({"file": None, "message": m, "level": "warning"} for m in check_batch_facts(facts))
    store.insert_rows(con, "run_facts", None,
                      [[run_id, key, f.value, f.num, f.source] for key, fs in facts.items() for f in fs])
    side = {"facts": facts, "log_steps": log_steps, "nccl": nccl, "topology": topology, "capture_steps": capture_steps,
            "ooms": ooms}
    # the step time without the profiler (capture, else the log): measured_unprofiled_step
    side["unprofiled"] = measured_unprofiled_step(side) if run.sidecars else None
    return side


_DEATH_BYTES = ("tried_bytes", "free_bytes", "capacity_bytes", "in_use_bytes", "allocated_bytes",
                "reserved_unallocated_bytes", "rss_bytes")


def death_kind(ev: Any) -> str:
    """``run_deaths.kind`` of one :class:`~traceanalyze.logs.OomEvent`: ``cuda_oom``, ``host_oom`` when the kernel's
    OOM killer named the process, else ``killed`` (a SIGKILL whose sender the record does not say)."""
    return "cuda_oom" if ev.kind == "cuda" else "host_oom" if ev.oom_killer else "killed"


def death_rows(run_id: int, file: str, ooms: list, warnings: list[dict]) -> list[list]:
    """The ``run_deaths`` rows of one log's records (:class:`~traceanalyze.logs.OomEvent`); a size outside 0 to
    :data:`~traceanalyze.limits.MAX_MEMORY_BYTES` bytes is stored as NULL with a warning (the parser bounds them
    already: this keeps the table's promise whatever fills the records)."""
    rows = []
    for ev in ooms:
        sizes = []
        for key in _DEATH_BYTES:
            v = getattr(ev, key)
            if v is not None and not (isinstance(v, int) and 0 <= v <= MAX_MEMORY_BYTES):
                warnings.append({"file": file, "level": "warning",
                                 "message": f"{ev.source}: {key} {str(v)[:32]} is out of range; stored as NULL"})
                v = None
            sizes.append(v)
        _, _, line = ev.source.rpartition(":")
        rows.append([run_id, death_kind(ev), ev.form, ev.rank, ev.local_rank, ev.host, ev.gpu, ev.pid, *sizes,
                     ev.signal, ev.exitcode, ev.phase, file, int(line) if line.isdigit() else None])
    return rows


def expected_link(facts: dict, side: dict, override: float | None) -> dict:
    """Expected per-direction GB/s between ranks and where the figure came from: ``override`` (``--link-bw``), else
    the slowest pair of ``nvidia-smi topo -m``, else the NCCL transport, else the GPU model's link
    (:data:`traceanalyze.hardware.GPU_LINK_GBPS`). ``facts``: the trace headers' facts; ``side``:
    :func:`read_sidecars`."""
    if override:
        return {"expected_gbps": override, "source": "--link-bw"}
    topo = side["topology"]
    if topo is not None and topo.links:
        gpus = topo.gpus
        worst = None
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                lk = topo.link(a, b)
                bw = hardware.expected_link_gbps(lk) if lk else None
                if bw is not None and (worst is None or bw < worst[0]):
                    worst = (bw, f"{a}–{b} {lk}")
        if worst:
            return {"expected_gbps": worst[0], "source": f"nvidia-smi topo -m, slowest pair {worst[1]}"}
    nccl = side["nccl"]
    if nccl is not None and getattr(nccl, "channels", None):
        t = nccl.transports()
        if t.get("NET") and any("Socket" in c.detail for c in nccl.channels):
            return {"expected_gbps": 1.25, "source": "NCCL NET/Socket (TCP; ~10 Gb/s Ethernet assumed)"}
        if t.get("NET"):
            return {"expected_gbps": 25.0, "source": "NCCL NET/IB (200 Gb/s HDR per port)"}
        if t.get("SHM"):
            return {"expected_gbps": 12.0, "source": "NCCL SHM (through host memory, PCIe)"}
    gpu = facts.get("gpu_model")
    if gpu:
        for key, bw, what in hardware.GPU_LINK_GBPS:
            if key.lower() in gpu.lower():
                return {"expected_gbps": bw, "source": f"{gpu}: {what}, per direction"}
    return {"expected_gbps": None, "source": "unknown: pass --link-bw GB/s"}


def log_step_time(log_steps: list) -> dict | None:
    """Median step time (ms) the logs state, over their steps after the first (warm-up, compile), with the count
    and the steps it covers; None when no log states one."""
    timed = sorted((st.step, st.step_time_ms) for st in log_steps if st.step_time_ms is not None)
    if not timed:
        return None
    steady = [ms for step, ms in timed if step != timed[0][0]] or [ms for _, ms in timed]
    return {"median_ms": round(statistics.median(steady), 3), "n": len(steady),
            "steps": f"{timed[0][0]}–{timed[-1][0]}"}


def log_covers_run(con: duckdb.DuckDBPyConnection, run_id: int, side: dict) -> None:
    """Keep a training log's step time as the step without the profiler only when most logged steps ran without it
    (:func:`traceanalyze.measured_unprofiled_step` against the trace's profiled steps, the window's last,
    partial one included); before either replay starts, so both see the same value."""
    if not (side["unprofiled"] and side["unprofiled"]["source"] == "log"):
        return
    n = con.execute("SELECT count(DISTINCT step) FROM profiler_steps(?)", [run_id]).fetchone()[0]
    if n:
        side["unprofiled"] = measured_unprofiled_step(side, n)


def cpu_host(facts: dict, mode: str | None = None, world: int | None = None
              ) -> tuple[bool | None, str | None, dict | None]:
    """(native bf16, CPU model, core sharing) of the run's hosts from ``env_rank{r}.json`` facts: native bf16 False
    when any rank's CPU lacks it, True when every one that says has it, None when none says; core sharing
    (:func:`traceanalyze.logs.core_sharing`) on CPU runs, None on others or when no file states the cores."""
    said = {f.value for f in facts.get("cpu_native_bf16") or []}
    model = next((f.value for f in facts.get("cpu_model") or []), None)
    sharing = None
    if mode == "cpu" and facts.get("cpu_count"):
        from traceanalyze.logs.env import core_sharing  # a GPU run (most) never needs the env parser

        sharing = core_sharing(facts, world)
    return (False if "false" in said else True if said else None), model, sharing
