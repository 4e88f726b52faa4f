"""The memory what-if on GPU runs: ``no_cache_flush``, the caching allocator's ``cudaFree``/``cudaMalloc`` calls in
the steps gone (:mod:`traceanalyze.metrics.allocator`): the cache keeps its blocks from one step to the next, as it
does when nothing empties it and the GPU has room for every block a step needs."""

from __future__ import annotations

from traceanalyze.replay import graph as gr
from traceanalyze.replay.scenarios.base import MIN_SAVING_US, Arrays, Scenario, covered_us, less


def _rw_cache_flush(g: gr.Graph, d, cg, tr, ctx: dict) -> Arrays:
    """Each call's measured time, its wait for the GPU to drain included, removed (``g.cover``/``g.gap_cover``
    ``allocator``: most calls are folded into the host gap before the next task): a cached block is handed out
    on the host in about a microsecond (PyTorch's CUDACachingAllocator), against the call's milliseconds. The host
    then launches on while the GPU runs, and the replay decides which of the two bounds the step."""
    return less(d, g.cover["allocator"]), less(cg, g.gap_cover["allocator"]), tr


def _applies(g: gr.Graph, ctx: dict) -> bool:
    return g.mode == "gpu" and covered_us(g, "allocator") >= MIN_SAVING_US


NO_CACHE_FLUSH = Scenario(
    name="no_cache_flush", cause="config: the caching allocator frees and re-allocates GPU memory every step",
    rewrite=_rw_cache_flush, applies=_applies,
    why_not=lambda g, ctx: ("a CPU run has no GPU allocator" if g.mode != "gpu" else
                            "no cudaFree or cudaMalloc call in the replayed steps"),
    assumptions=lambda ctx, g: (
        "every cudaFree/cudaMalloc call in the steps removed, its wait for the GPU included (no "
        "torch.cuda.empty_cache() in the loop, room on the GPU for every cached block): the host launches on while "
        "the GPU runs; the kernels, copies and the host's other work unchanged"),
    kinds=("memory_cache_flush",), cuts_spans=True)
SCENARIOS = (NO_CACHE_FLUSH,)
