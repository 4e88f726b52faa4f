"""Each rank's dependency graph, built from the store and written back to it (``sim_task``, ``sim_dep``,
``sim_coll``; views ``sim_edge`` and ``sim_gap``). Design: ``shared/WHATIF.md`` §1-4, ``docs/replay.md``.

Tasks (one row of ``sim_task`` each; times in µs, measured, on the rank's clock minus its collective clock
offset and the run's first timestamp):

- **host**: GPU runs: the ``cuda_runtime``/``cuda_driver`` calls of every thread. CPU runs (gloo): the top-level
  ops of every thread, ``ProfilerStep#N`` itself left out so that its children are the tasks;
- **gaps**: the host time between two consecutive host tasks of a thread, stored on the task that follows it
  (``gap_us``) and labelled by what encloses it (``dataloader``, ``compile``, ``optimizer``, ``launch`` between two
  kernel launches, else ``host``); the view ``sim_gap`` lists them as rows;
- **kernel / memcpy / memset** on their ``(device, stream)``; **collective**: an NCCL/RCCL kernel or a ``gloo:*``
  range (on its gloo thread);
- **step_begin / step_end**: zero-length markers at each ``ProfilerStep#N`` boundary, on the step's thread.

Edges: host and stream order (consecutive tasks of a resource, implicit), and in ``sim_dep``: ``launch``
(``correlation``; gloo: the ``c10d::*`` call that issued it), ``gpu_cpu_sync`` (a blocking synchronize call
waits for the last device task to end before it returns), ``inter_thread`` and ``collective_wait`` (a host gap of
≥ :data:`WAIT_GAP_US` that ends after a task of another thread, or a collective, of the rank ended in its last
three quarters: the thread waited for it). Launch weights follow HTA's rule: the measured launch latency when
the stream was idle at launch, else 0 and the stream order governs. Collective rendezvous: ``sim_coll``.

Collective instances are matched across ranks by ``(process group, Seq)`` when every call carries ``Seq``, else
by the per-rank ordinal within each ``ProfilerStep#N`` (per process group); an instance is complete when every
rank of its group is in the folder, each has one call, and name and bytes agree (TraceLens
``strict_metadata_check``). Transfer = median over ranks of (end − latest start) (straggler paper §3.2);
incomplete instances keep their measured duration and are listed as unmatched.

The package, by what it builds: :mod:`.model` (the :class:`Graph` record, its codes and shared constants),
:mod:`.source` (the store's rows as arrays, the run's clocks), :mod:`.tasks` (tasks in resource order, their steps),
:mod:`.deps` (the explicit edges), :mod:`.labels` (precision classes, categories, gap labels), :mod:`.events`
(profiler events per host task), :mod:`.instances` (collectives matched across ranks), :mod:`.builder`
(:func:`build`: chunks of ranks on threads, joined) and :mod:`.writer` (:func:`save`). The names below are the
public API; a tuning constant is read where it is used (``events.PROFILER_EVENTS_BATCH``, ``builder.BUILD_*``,
``source.FETCH_BATCH_ROWS``, ``writer.SAVE_SLICE_ROWS``): its copy here is for reading, not patching.
"""

from traceanalyze.replay.graph.builder import BUILD_CHUNK_EVENTS, BUILD_THREADS_MAX, build, build_threads
from traceanalyze.replay.graph.events import PROFILER_EVENTS_BATCH
from traceanalyze.replay.graph.instances import ideal_transfer_us
from traceanalyze.replay.graph.model import (
    CATEGORIES,
    DEP_TYPES,
    GAP_LABELS,
    GPU_KINDS,
    K_BEGIN,
    K_COLL,
    K_END,
    K_HOST,
    K_KERNEL,
    K_MEMCPY,
    K_MEMSET,
    KINDS,
    LAUNCH_CALLS,
    MATMUL_OPS,
    P_ATTN_FP32,
    P_LAUNCH,
    P_MEM,
    P_MEM_IN_PLACE,
    P_MM_FP32,
    P_MM_LOWP,
    P_MM_TF32,
    PRECISION_CLASSES,
    SYNC_CALLS,
    WAIT_GAP_US,
    WAIT_TAIL,
    Graph,
    name_codes,
    rank_step_groups,
    small_unique,
)
from traceanalyze.replay.graph.source import FETCH_BATCH_ROWS
from traceanalyze.replay.graph.writer import SAVE_SLICE_ROWS, save

__all__ = [
    "BUILD_CHUNK_EVENTS", "BUILD_THREADS_MAX", "CATEGORIES", "DEP_TYPES", "FETCH_BATCH_ROWS", "GAP_LABELS",
    "GPU_KINDS", "K_BEGIN", "K_COLL", "K_END", "K_HOST", "K_KERNEL", "K_MEMCPY", "K_MEMSET", "KINDS", "LAUNCH_CALLS",
    "MATMUL_OPS", "P_ATTN_FP32", "P_LAUNCH", "P_MEM", "P_MEM_IN_PLACE", "P_MM_FP32", "P_MM_LOWP", "P_MM_TF32",
    "PRECISION_CLASSES", "PROFILER_EVENTS_BATCH", "SAVE_SLICE_ROWS", "SYNC_CALLS", "WAIT_GAP_US", "WAIT_TAIL",
    "Graph", "build", "build_threads", "ideal_transfer_us", "name_codes", "rank_step_groups", "save", "small_unique",
]
