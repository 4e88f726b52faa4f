"""A synthetic expert-parallel GPU rank whose communication is DeepEP's kernels, not NCCL's (issue 40)."""

from __future__ import annotations

from pathlib import Path

from tests.synth import kernel, write_trace, x

NOTIFY = "void deep_ep::intranode::notify_dispatch<2>(int const*, int*, int const*, int*, int, int, int, bool const*)"
DISPATCH = "void deep_ep::intranode::dispatch<2, 768, 8192>(int4*, float*, int*, long*, float*, int*, int4 const*)"
COMBINE = "void combine<__nv_bfloat16, 2, 768>(__nv_bfloat16*, float*, int*, __nv_bfloat16 const*, float const*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
SHARED = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
BF16 = {"Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Dims": [[4096, 4096], [4096, 4096]]}


def ep_job(rank: int, world: int = 2, steps: int = 4, *, attn_us: float = 8_000.0, expert_us: float = 6_000.0,
           shared_us: float = 12_000.0, notify_us: float = 50.0, dispatch_us: float = 2_000.0,
           combine_us: float = 1_500.0, names: tuple[str, str, str] = (NOTIFY, DISPATCH, COMBINE)) -> list[dict]:
    """One rank of a DeepEP expert-parallel job. Per profiler step the host launches, on stream 7, an attention
    GEMM, DeepEP's ``notify_dispatch`` and ``dispatch``, an expert GEMM and a (namespace-less) ``combine``, and a
    shared-expert GEMM on stream 13 that runs beside the attention GEMM and the dispatch; a
    ``cudaStreamSynchronize`` ends the step. Each DeepEP kernel is a rendezvous: every rank leaves it the given
    time after the last rank arrives; per-rank jitter on the GEMMs makes the others wait. Steps start together.
    ``names``: the three communication kernels' names (notify, dispatch, combine)."""
    notify, dispatch, combine = names
    ev: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}]
    corr = rank * 100_000 + 1
    t = 1_000.0
    for s in range(steps):
        jit = [((r * 37 + s * 11) % 7) * 150.0 for r in range(world)]
        h = t + 300.0
        k0 = h + 200.0
        # attention GEMM, then the rendezvous of notify_dispatch: every rank leaves it together
        arrive = [k0 + attn_us + jit[r] for r in range(world)]
        notify_end = max(arrive) + notify_us
        dispatch_start = notify_end + 5.0
        dispatch_end = dispatch_start + dispatch_us
        expert_arrive = [dispatch_end + 5.0 + expert_us + jit[(r + 1) % world] for r in range(world)]
        combine_end = max(expert_arrive) + combine_us
        step_end = combine_end + 100.0
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, step_end - t))
        ev.append(x("cpu_op", "aten::linear", h, 40.0, **BF16))
        ev += kernel(GEMM, k0, attn_us + jit[rank], 7, corr, h + 10)
        ev.append(x("cpu_op", "DeepEP::dispatch", h + 50, 40.0))
        ev += kernel(notify, arrive[rank], notify_end - arrive[rank], 7, corr + 1, h + 55)
        ev += kernel(dispatch, dispatch_start, dispatch_us, 7, corr + 2, h + 65)
        ev.append(x("cpu_op", "aten::mm", h + 100, 40.0, **BF16))
        ev += kernel(SHARED, h + 120.0, shared_us, 13, corr + 3, h + 110)
        ev += kernel(GEMM, dispatch_end + 5.0, expert_us + jit[(rank + 1) % world], 7, corr + 4, h + 120)
        ev.append(x("cpu_op", "DeepEP::combine", h + 150, 40.0))
        ev += kernel(combine, expert_arrive[rank], combine_end - expert_arrive[rank], 7, corr + 5, h + 160)
        corr += 6
        ev.append(x("cuda_runtime", "cudaStreamSynchronize", h + 210, combine_end - h - 210 + 10.0))
        t = step_end
    return ev


def write_ep_job(folder: Path, world: int = 2, steps: int = 4, **kw) -> Path:
    """Write ``world`` ranks of :func:`ep_job` into ``folder`` (``rank{r}.json``) and return it."""
    for r in range(world):
        write_trace(folder / f"rank{r}.json", r, ep_job(r, world, steps, **kw), world_size=world, backend="nccl")
    return folder


def mixed_rank(rank: int, steps: int = 2) -> list[dict]:
    """One GPU rank of 2: per profiler step two NCCL all-reduces that carry their record (process group, "Comms Id")
    and one DeepEP ``dispatch`` kernel that carries none, all on stream 20, ending together on both ranks."""
    ev: list[dict] = []
    corr = 100 + 1000 * rank
    for s in range(steps):
        t = 1000.0 + 4000.0 * s
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, 3500.0))
        for i, n in enumerate((1024, 4096)):
            start = t + 100 + 1000 * i
            k = kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", start, 800.0, 20, corr, start - 50)
            k[0]["args"].update({"Collective name": "allreduce", "In msg nelems": n, "Out msg nelems": n,
                                 "Group size": 2, "dtype": "Float", "Process Group Name": "0",
                                 "Process Group Ranks": "[0, 1]", "Comms Id": f"0:{s}:{n}"})
            ev += k
            corr += 1
        ev += kernel(DISPATCH, t + 2200, 300.0, 20, corr, t + 2100)
        corr += 1
    return ev
