"""The graph's record (:class:`Graph`), its codes (task kinds, edge types, categories, gap labels, precision
classes) and the constants the build reads: what every module of :mod:`traceanalyze.replay.graph` and its callers
share."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KINDS = ("host", "kernel", "memcpy", "memset", "collective", "step_begin", "step_end")
K_HOST, K_KERNEL, K_MEMCPY, K_MEMSET, K_COLL, K_BEGIN, K_END = range(7)
GPU_KINDS = (K_KERNEL, K_MEMCPY, K_MEMSET, K_COLL)  # the task kinds that run on a GPU stream
DEP_TYPES = ("launch", "gpu_cpu_sync", "inter_thread", "collective_wait", "event_wait")
CATEGORIES = ("dataloader", "compile", "optimizer", "launch", "matmul_fp32", "allocator")
GAP_LABELS = ("host", "launch", "optimizer", "compile", "dataloader")  # sim_task.gap_label; code -1: none
# Graph.prec_class: what the precision what-ifs may re-time (traceanalyze.replay.precision)
# and, on host tasks, the kernel-launch calls that a CUDA graph replaces (the launch what-if)
P_MM_FP32, P_ATTN_FP32, P_MM_TF32, P_MEM, P_MM_LOWP, P_LAUNCH, P_MEM_IN_PLACE = 1, 2, 3, 4, 5, 6, 7
PRECISION_CLASSES = ("none", "matmul_fp32", "attention_fp32", "matmul_tf32", "memory_autocast", "matmul_16bit",
                     "launch_call", "memory_in_place")
WAIT_GAP_US = 1000.0  # a host gap this long may be a wait on another thread or a collective (Chakra, Lumos: 1 ms)
WAIT_TAIL = 0.25  # ... when the awaited task ended after this share of the gap
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "hipDeviceSynchronize",
              "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaMemcpyAsync",
                "cudaMemsetAsync", "cudaGraphLaunch", "hipLaunchKernel", "hipExtModuleLaunchKernel",
                "hipModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::_scaled_mm")
T_SHIFT = 41  # thread/rank index << T_SHIFT + ns since the run's start: one sortable int64 key (2^41 ns = 36 min)


@dataclass
class Graph:
    """The run's tasks in resource order (task id = index), their edges and collective instances.

    Arrays are per task unless named ``inst_*`` (per collective instance) or ``dep_*`` (per explicit edge).
    Times and durations are µs. ``chain_gap``/``chain_dur`` are what the replay adds along a resource: the measured
    gap and duration, less the waiting that an explicit edge now models (a synchronize call's blocked part, a
    waiting gap's head).
    """

    run_id: int
    mode: str
    ranks: list[int]
    world_size: int
    res_names: list[str]
    rank: np.ndarray
    res: np.ndarray
    kind: np.ndarray
    name: object  # pyarrow string array: the distinct task names
    name_code: np.ndarray  # per task: index of its name in ``name``
    step: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    gap: np.ndarray
    first: np.ndarray
    chain_gap: np.ndarray
    chain_dur: np.ndarray
    gap_label: np.ndarray  # int8 per task: index into GAP_LABELS, -1 for none
    cover: dict[str, np.ndarray]  # category -> µs of the task under it
    gap_cover: dict[str, np.ndarray]  # category -> µs of the gap before the task under it
    dep_src: np.ndarray
    dep_dst: np.ndarray
    dep_end: np.ndarray
    dep_off: np.ndarray
    dep_type: np.ndarray
    inst: np.ndarray  # per task: collective instance index, -1 for none
    inst_transfer: np.ndarray
    inst_complete: np.ndarray
    inst_coll: list[str]
    inst_bytes: np.ndarray
    inst_n: np.ndarray
    inst_matched_by: list[str]
    steps: list[tuple[int, int, int, int, bool]]  # (rank, step, begin task, end task, counted)
    inst_all: np.ndarray | None = None  # per collective task, in task order: its instance, complete or not
    unmatched: list[str] = field(default_factory=list)
    missing_edges: list[str] = field(default_factory=list)
    partial: bool = False
    prec_class: np.ndarray | None = None  # int8 per task: PRECISION_CLASSES index (GPU runs)
    prof_events: np.ndarray | None = None  # uint16 (4, tasks): profiler-recorded events by kind (profiler_events)

    @property
    def n_instances(self) -> int:
        """Complete collective instances (matched on every rank of their group)."""
        return int(self.inst_complete.sum())


def name_codes(g: Graph, part: str) -> list[int]:
    """Indices into ``g.name`` of the distinct task names that contain ``part`` (lower case), for ``g.name_code``."""
    names = g.name.to_pylist() if hasattr(g.name, "to_pylist") else list(g.name)
    return [i for i, n in enumerate(names) if n and part in n.lower()]


def small_unique(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_inverse=True)`` of non-negative int64 keys (the inverse flat), the same arrays; keys
    of a range not much wider than ``x`` counted in a table instead of sorted (rank × step, resource × step keys:
    a sort of every task each time)."""
    top = int(x.max(initial=-1)) + 1
    if x.size == 0 or int(x.min()) < 0 or top > 4 * x.size + 1024:
        keys, inv = np.unique(x, return_inverse=True)
        return keys, inv.reshape(-1)
    present = np.bincount(x, minlength=top) > 0
    pos = np.cumsum(present) - 1
    return np.flatnonzero(present).astype(x.dtype, copy=False), pos[x]


def rank_step_groups(g: Graph, sel: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """``(width, keys, inv)``: the (rank, step) groups of the tasks ``sel`` (ids with ``step >= 0``) as keys
    ``rank × width + step`` (sorted, distinct) and each task's index into them."""
    width = int(g.step.max(initial=0)) + 2
    keys, inv = small_unique(g.rank[sel].astype(np.int64) * width + g.step[sel])
    return width, keys, inv


def host_resources(g: Graph) -> np.ndarray:
    """Per resource of ``g``: a host thread (named ``host:pid/tid`` by :func:`.tasks.order_tasks`)."""
    return np.array([r.startswith("host:") for r in g.res_names], dtype=bool)
