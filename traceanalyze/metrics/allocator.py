"""The CUDA caching allocator's own calls to the driver inside the steps: cache flushes.

PyTorch's caching allocator keeps freed GPU memory for reuse and calls ``cudaMalloc``/``cudaFree`` only when its
cache cannot serve a request: on a GPU near capacity it then frees every cached block it can and retries (a "cache
flush", counted by ``torch.cuda.memory_stats()["num_alloc_retries"]``), and ``torch.cuda.empty_cache()`` frees
them on request (``transformers``' ``torch_empty_cache_steps``). In a steady training step neither should happen.
Each costs twice: ``cudaFree`` synchronizes the device (the host waits for the GPU to drain: CUDA Driver API,
``cuMemFree``: "this API may perform implicit synchronization"), and the ``cudaMalloc`` calls that follow stall the
host while the GPU waits for its next launch. The calls are in every GPU trace (Kineto's ``cuda_runtime`` and
``cuda_driver`` rows), with or without ``profile_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from traceanalyze.metrics.host import ON_STEP_SQL, last_device_end_sql, steady_steps_sql

# the allocator's synchronous device-memory calls (the stream-ordered cudaMallocAsync/cudaFreeAsync do not
# synchronize, and the pinned-host cudaHostAlloc/cudaFreeHost are another allocator's)
FREE_CALLS = ("cudaFree", "cuMemFree", "cuMemFree_v2", "hipFree")
MALLOC_CALLS = ("cudaMalloc", "cuMemAlloc", "cuMemAlloc_v2", "hipMalloc")
ALLOCATOR_CALLS = FREE_CALLS + MALLOC_CALLS

_FLUSH_SQL = f"""
WITH {{st}},
b AS MATERIALIZED (
    SELECT row_number() OVER () AS call_id, c.file_id, st.rank, st.step, c.name, c.ts_ns, c.dur_ns
    FROM cpu_ops c JOIN st ON {ON_STEP_SQL}
    WHERE c.cat IN ('cuda_runtime', 'cuda_driver') AND c.name IN (SELECT unnest($3::VARCHAR[]))),
{last_device_end_sql("k.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')")}
SELECT b.rank, any_value(n_st.n), count(DISTINCT b.step) FILTER (WHERE b.name IN (SELECT unnest($4::VARCHAR[]))),
       count(*) FILTER (WHERE b.name IN (SELECT unnest($4::VARCHAR[]))),
       count(*) FILTER (WHERE b.name NOT IN (SELECT unnest($4::VARCHAR[]))), sum(b.dur_ns),
       sum(b.ts_ns + b.dur_ns - greatest(b.ts_ns, coalesce(last.last_end, b.ts_ns))), max(b.dur_ns)
FROM b LEFT JOIN last USING (call_id) JOIN n_st USING (rank)
GROUP BY b.rank ORDER BY b.rank
"""


@dataclass
class CacheFlush:
    """One rank's allocator calls per steady step: how many ``cudaFree`` and ``cudaMalloc`` (µs: the host time in
    them, and the part of it during which the rank's GPU runs nothing)."""

    rank: int
    steps: int  # counted steps
    steps_with_frees: int  # of them, those with a cudaFree
    frees_per_step: float
    mallocs_per_step: float
    us_per_step: float  # host µs in the calls, per step
    gpu_idle_us_per_step: float  # of it, µs with no kernel, copy or memset running on the rank's GPU
    max_us: float  # the longest single call

    def model(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(self).items()}


def has_frees(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether any trace of the run holds a ``cudaFree`` (:data:`FREE_CALLS`): one scan of the names that stops at
    the first (a few ms on 800,000 CPU ops, a tenth of :func:`cache_flushes`' query). Without one the allocator
    never flushes and neither the metric nor the replay's ``allocator`` category is computed."""
    return con.execute("SELECT 1 FROM cpu_ops WHERE name IN (SELECT unnest($2::VARCHAR[])) AND file_id IN "
                       "(SELECT file_id FROM files WHERE run_id = $1) LIMIT 1", [run_id, list(FREE_CALLS)]
                       ).fetchone() is not None


def cache_flushes(con: duckdb.DuckDBPyConnection, run_id: int, skip_step: int | None = None) -> list[CacheFlush]:
    """Per rank, the allocator's ``cudaFree``/``cudaMalloc`` calls (:data:`ALLOCATOR_CALLS`) in the counted steps
    on the step thread, the compile step ``skip_step`` left out; ranks with none have no row. GPU idle: the call's
    tail after the last device task running during it ended (the whole call when none runs), as in
    :func:`traceanalyze.metrics.host.blocking_calls`. Rows by rank; none when the run frees nothing
    (:func:`has_frees`)."""
    if not has_frees(con, run_id):
        return []
    rows = con.execute(steady_steps_sql(con, run_id, _FLUSH_SQL),
                       [run_id, skip_step, list(ALLOCATOR_CALLS), list(FREE_CALLS)]).fetchall()
    return [CacheFlush(int(rank), int(n), int(with_frees), frees / n, mallocs / n, total / 1e3 / n,
                       max(0.0, float(idle)) / 1e3 / n, mx / 1e3)
            for rank, n, with_frees, frees, mallocs, total, idle, mx in rows if n]
