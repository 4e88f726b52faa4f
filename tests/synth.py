"""Small synthetic Kineto traces for tests that must run without ../shared or torch."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def write_trace(path: Path, rank: int, events: list[dict], *, world_size: int = 2, backend: str = "gloo",
                base_ns: int = 1_700_000_000_000_000_000, device_properties: list | None = None) -> Path:
    """Write a new-schema Kineto trace (relative ``ts`` in µs, ``baseTimeNanoseconds``) for ``rank``."""
    doc = {"schemaVersion": 1, "deviceProperties": device_properties or [], "record_shapes": 1,
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


def mem(ts: float, nbytes: int, allocated: int, reserved: int, addr: int, *, device_type: int = 1,
        device_id: int = 0, pid: int = 1, tid: int = 1) -> dict:
    """One allocator ``[memory]`` instant (profile_memory=True): ``nbytes`` > 0 allocates at ``addr``, < 0 frees;
    ``allocated``/``reserved`` are the device's totals after it (bytes)."""
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": pid, "tid": tid, "ts": ts,
            "args": {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": nbytes,
                     "Device Id": device_id, "Device Type": device_type, "Addr": addr, "finished": False}}


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


def gpu_job(rank: int, world: int, steps: int = 6, *, straggler: int | None = None, gap_us: float = 30_000.0,
            transfer_us: float = 12_000.0) -> list[dict]:
    """A GPU (NCCL) rank of a data-parallel job: per profiler step the host launches a forward and a backward
    kernel (30 and 45 ms on stream 7), then an all_reduce (stream 20) that every rank leaves together after
    ``transfer_us`` once the last rank arrives. Rank ``straggler`` sits idle on the host for ``gap_us`` (no op,
    no annotation: like a blocking read) before its forward, so the others wait for it in the all_reduce. Small,
    fixed per-rank jitter keeps ranks apart. Steps start together on every rank (the step ends at the collective);
    the last profiler step is a partial one, as the profiler writes it."""
    ev: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}]
    fwd, bwd, launch = 30_000.0, 45_000.0, 200.0
    corr = rank * 100_000 + 1
    t = 1_000.0
    for s in range(steps):
        jit = [((r * 37 + s * 11) % 7) * 150.0 for r in range(world)]
        gaps = [gap_us if r == straggler else 0.0 for r in range(world)]
        ready = [t + 300.0 + gaps[r] + launch + fwd + bwd + jit[r] for r in range(world)]
        end = max(ready) + transfer_us
        last = s == steps - 1
        step_end = end + 500.0 if not last else t + 300.0 + gaps[rank] + launch + 1000.0
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, step_end - t))
        h = t + 300.0 + gaps[rank]
        for name, dur, kdur in (("aten::linear", launch / 2, fwd), ("aten::mm", launch / 2, bwd)):
            ev.append(x("cpu_op", name, h, dur, **{"Input type": ["c10::BFloat16", "c10::BFloat16"],
                                                    "Input Dims": [[4096, 4096], [4096, 4096]]}))
            start = h + launch + (0.0 if name == "aten::linear" else fwd) + jit[rank]
            ev += kernel(f"ampere_bf16_s16816gemm_bf16_128x128_{name[6:]}", start, kdur, 7, corr, h + 10)
            corr += 1
            h += dur
        if last:
            break
        ar_start = ready[rank]
        ev.append(x("cpu_op", "c10d::allreduce_", h + 10, 20.0))
        ev += kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", ar_start,
                     end - ar_start, 20, corr, h + 15)
        corr += 1
        ev.append(x("cuda_runtime", "cudaStreamSynchronize", h + 40, end - h - 40 + 200.0))
        t = step_end
    return ev


def write_gpu_job(folder: Path, world: int, steps: int = 6, **kw) -> Path:
    """Write ``world`` ranks of :func:`gpu_job` into ``folder`` (``rank{r}.json``) and return it."""
    for r in range(world):
        write_trace(folder / f"rank{r}.json", r, gpu_job(r, world, steps, **kw), world_size=world, backend="nccl")
    return folder


A2A_KERNEL = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def all_to_all_job(rank: int, waits_us: list[float], *, compute_us: float = 15_000.0, transfer_us: float = 10.0,
                   steps: int = 1, lead_us: float = 0.0) -> list[dict]:
    """An NCCL rank of a job whose step is a GEMM then one all-to-all, as older PyTorch records it: a bare
    ``ncclKernel_SendRecv`` kernel (no "Collective name") launched inside a ``nccl:all_to_all`` annotation, on the
    GEMM's stream. ``waits_us[r]``: how long rank r sits in the all-to-all before the last rank arrives (0 for the
    last one): its GEMM is that much shorter than the last rank's ``compute_us``; every rank leaves the all-to-all
    ``transfer_us`` after the last arrival, and a ``cudaStreamSynchronize`` ends the step. Every rank starts each
    step at the same time, except that ``lead_us`` starts this rank's ``ProfilerStep`` that much earlier (idle host
    time before the step's work: a longer step that holds no work). ``steps`` profiler steps, each a full one."""
    ev: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}]
    corr = rank * 100_000 + 1
    t = 10_000.0
    last_gemm = compute_us + max(waits_us)
    for s in range(steps):
        gemm = last_gemm - waits_us[rank]
        k0 = t + 60.0
        arrive = k0 + gemm
        end = k0 + last_gemm + transfer_us
        step_end = end + 100.0
        ev.append(x("user_annotation", f"ProfilerStep#{s + 1}", t - lead_us, step_end - t + lead_us))
        ev.append(x("cpu_op", "aten::mm", t + 20.0, 30.0, **{"Input type": ["c10::BFloat16", "c10::BFloat16"],
                                                              "Input Dims": [[4096, 4096], [4096, 4096]]}))
        ev += kernel("ampere_bf16_s16816gemm_bf16_128x128_mm", k0, gemm, 7, corr, t + 30.0)
        corr += 1
        ev.append(x("user_annotation", "nccl:all_to_all", t + 55.0, 20.0, **{"Input Dims": [[1 << 20]],
                                                                            "Input type": ["c10::BFloat16"]}))
        ev += kernel(A2A_KERNEL, arrive, end - arrive, 7, corr, t + 60.0)
        corr += 1
        ev.append(x("cuda_runtime", "cudaStreamSynchronize", t + 80.0, end - t - 80.0 + 5.0))
        t = step_end
    return ev


def late_entry_job(rank: int, leads_us: list[float], *, compute_us: float = 30_000.0, transfer_us: float = 10.0,
                   steps: int = 1, tail_us: float = 0.0) -> list[dict]:
    """An NCCL rank of a job whose step is a GEMM then one all-to-all (bare ``ncclKernel_SendRecv`` under a
    ``nccl:all_to_all`` annotation, as in :func:`all_to_all_job`), with the same work on every rank: a
    ``compute_us`` GEMM before the all-to-all. Rank r begins its first ``ProfilerStep`` ``leads_us[r]`` after the
    earliest rank (its entry: what came before the trace), so the others wait in the all-to-all for the last one to
    arrive; every rank leaves it ``transfer_us`` after that arrival, and a ``cudaStreamSynchronize`` then ends the
    step 100 µs later. With ``tail_us``, the rank with the largest lead idles that long on the host after its
    synchronize before each step ends (work after the optimizer that no op records), and the next step begins as
    the last one ends: its entry into each next step is as late again. ``steps`` full profiler steps."""
    ev: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}]
    corr = rank * 100_000 + 1
    world = len(leads_us)
    late = max(range(world), key=lambda r: leads_us[r])
    begin = [10_000.0 + leads_us[r] for r in range(world)]
    for s in range(steps):
        arrive = [b + 60.0 + compute_us for b in begin]
        end = max(arrive) + transfer_us
        ends = [end + 100.0 + (tail_us if r == late else 0.0) for r in range(world)]
        t = begin[rank]
        ev.append(x("user_annotation", f"ProfilerStep#{s + 1}", t, ends[rank] - t))
        ev.append(x("cpu_op", "aten::mm", t + 20.0, 30.0, **{"Input type": ["c10::BFloat16", "c10::BFloat16"],
                                                              "Input Dims": [[4096, 4096], [4096, 4096]]}))
        ev += kernel("ampere_bf16_s16816gemm_bf16_128x128_mm", t + 60.0, compute_us, 7, corr, t + 30.0)
        corr += 1
        ev.append(x("user_annotation", "nccl:all_to_all", t + 55.0, 20.0, **{"Input Dims": [[1 << 20]],
                                                                            "Input type": ["c10::BFloat16"]}))
        ev += kernel(A2A_KERNEL, arrive[rank], end - arrive[rank], 7, corr, t + 60.0)
        corr += 1
        ev.append(x("cuda_runtime", "cudaStreamSynchronize", t + 80.0, end - t - 80.0 + 5.0))
        begin = ends
    return ev
