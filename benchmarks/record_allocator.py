"""Record the allocator pair on one NVIDIA GPU (issue 41: a GPU near capacity whose caching allocator retries).

A GPT step in bf16 with a variable sequence length (a cycle of 8 lengths, as packed or bucketed batches give) on a
GPU that a ballast tensor fills, the way a large model's weights and optimizer state fill it. Each side runs in its
own process (``PYTORCH_CUDA_ALLOC_CONF`` is read once, when CUDA starts), is profiled with
``capture.profile(profile_memory=True)`` and timed without the profiler.

  slow        the room left beside the ballast is a little more than the step's peak allocated memory (probed:
              the largest of ``ROOM_FACTORS`` at which the allocator still retries): blocks cached for one
              length do not fit the next, so the allocator frees its cache (``cudaFree``, which synchronizes the
              device) and calls ``cudaMalloc`` again, step after step
  headroom    the same job with room for every cached block (the step's peak reserved × 1.5): no retries
  expandable  the slow side's room, with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (the usual advice)

Usage (on the GPU machine, from the project root): ``PYTHONPATH=. python3 benchmarks/record_allocator.py OUTDIR``.
Each side writes ``OUTDIR/allocator/SIDE/`` (trace, ``env_rank0.json``, ``steps_rank0.json``, ``truth_side.json``);
``OUTDIR/allocator/truth.json`` gathers the sides.
"""
import json
import os
import subprocess
import sys
import time

SEQS = (512, 1536, 1024, 2048, 768, 1792, 1280, 256)  # one cycle of per-step sequence lengths
CONST_SEQ = 1024
ROOM_FACTORS = (1.25, 1.15, 1.1, 1.06, 1.03)  # room beside the ballast = the step's own peak allocated × this
MIB = 1 << 20
T0 = time.time()
SMOKE = os.environ.get("RECORD_SMOKE") == "1"  # a CPU dry run at tiny sizes with stubbed CUDA memory calls
DEV = "cpu" if SMOKE else "cuda"


def smoke_stubs():
    """On the CPU: CUDA's memory calls answer fixed figures, so the script's logic runs end to end."""
    import torch
    c = torch.cuda
    c.synchronize = c.empty_cache = c.reset_peak_memory_stats = lambda *a, **k: None
    c.memory_stats = lambda *a, **k: {"num_alloc_retries": 0}
    c.memory_allocated = lambda *a, **k: 10 * MIB
    c.max_memory_allocated = lambda *a, **k: 30 * MIB
    c.max_memory_reserved = lambda *a, **k: 40 * MIB
    c.mem_get_info = lambda *a, **k: (200 * MIB, 1000 * MIB)


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def build(workload="cycle", empty_cache=0):
    """The step function: ``cycle`` runs :data:`SEQS` in turn, ``const`` :data:`CONST_SEQ` every step, ``random`` a
    seeded random length (a multiple of 8 from 256 to 2,048) each step; ``empty_cache`` N calls
    ``torch.cuda.empty_cache()`` after every N-th step (as ``transformers``' ``torch_empty_cache_steps=N`` does)."""
    import random

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from record_gpu import GPT, bf16_gpt_step, gpt_data

    torch.manual_seed(0)
    if SMOKE:
        smoke_stubs()
    model = GPT(d=64 if SMOKE else 1024, h=16, layers=1 if SMOKE else 8, seq=max(SEQS)).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not SMOKE)
    idx, tgt = gpt_data(2 if SMOKE else 16, max(SEQS))
    rng = random.Random(0)
    lens = {"cycle": list(SEQS), "const": [CONST_SEQ]}.get(workload) or [rng.randrange(256, 2049, 8)
                                                                          for _ in range(256)]
    if SMOKE:
        lens = [t // 16 for t in lens]

    def step(i):
        t = lens[i % len(lens)]
        bf16_gpt_step(model, opt, idx[:, :t].contiguous(), tgt[:, :t].contiguous())
        if empty_cache and (i + 1) % empty_cache == 0:
            torch.cuda.empty_cache()
    return step


def retries():
    import torch
    return torch.cuda.memory_stats().get("num_alloc_retries", 0)


def cycle(step, n=None):
    """Run n steps (one cycle of :data:`SEQS` by default); (retries, OOMs, mean wall ms per step)."""
    import torch
    n = n or len(SEQS)
    r0 = retries()
    torch.cuda.synchronize()
    t = time.perf_counter()
    ooms = 0
    for i in range(n):
        try:
            step(i)
        except torch.OutOfMemoryError:
            ooms += 1
    torch.cuda.synchronize()
    return retries() - r0, ooms, (time.perf_counter() - t) * 1e3 / n


def ballast_for(room):
    """A uint8 tensor that leaves ``room`` bytes of the GPU free (beside the CUDA context and what is held now)."""
    import torch
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    return torch.empty(max(0, free - int(room)), dtype=torch.uint8, device=DEV)


def side(name, out, room, workload="cycle", empty_cache=0):
    """One side in this process: probe the room when ``room`` is 0 (the slow side), then time, profile, time."""
    import torch

    from traceanalyze import capture

    step = build(workload, empty_cache)
    cycle(step)  # optimizer state, cuBLAS workspaces, autotuning
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    cycle(step)
    need_alloc = torch.cuda.max_memory_allocated() - base
    need_reserved = torch.cuda.max_memory_reserved() - base
    probes = []
    if room == 0:  # the slow side: the largest room at which the allocator retries without running out
        for f in ROOM_FACTORS:
            b = ballast_for(need_alloc * f)
            cycle(step, 2 * len(SEQS))  # the allocator settles: count the retries of the steady state
            r, o, ms = cycle(step, 2 * len(SEQS))
            probes.append({"factor": f, "retries": r, "ooms": o, "ms_per_step": round(ms, 3)})
            log(name, "probe", probes[-1])
            del b
            if r >= 3 and not o:
                room = int(need_alloc * f)
                break
        if room == 0:
            ok = [p for p in probes if not p["ooms"]]
            room = int(need_alloc * (max(ok, key=lambda p: p["retries"])["factor"] if ok else ROOM_FACTORS[0]))
    elif room < 0:  # the headroom side: room for every cached block
        room = int(need_reserved * 1.5)
    ballast = ballast_for(room)
    d = os.path.join(out, "allocator", name)
    os.makedirs(d, exist_ok=True)
    cycle(step)
    r1, o1, ms1 = cycle(step, 2 * len(SEQS))
    per = []
    with capture.profile(d, wait=1, warmup=1, active=len(SEQS), profile_memory=True,
                         time_after=len(SEQS)) as prof:  # the unprofiled steps: the same lengths as the traced
        for i in range(2 + 2 * len(SEQS)):
            t = time.perf_counter()
            step(i)
            torch.cuda.synchronize()
            per.append(round((time.perf_counter() - t) * 1e3, 3))
            prof.step()
    r2, o2, ms2 = cycle(step, 2 * len(SEQS))
    free, total = torch.cuda.mem_get_info()
    rec = {"side": f"allocator/{name}", "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
           "wall_ms_per_step": [round(ms1, 3), round(ms2, 3)], "wall_ms_per_step_mean": round((ms1 + ms2) / 2, 3),
           "retries_per_step": [r1 / (2 * len(SEQS)), r2 / (2 * len(SEQS))], "ooms": o1 + o2,
           "profiled_loop_ms": per, "room_bytes": room, "ballast_bytes": ballast.numel(),
           "step_peak_allocated_bytes": need_alloc, "step_peak_reserved_bytes": need_reserved,
           "persistent_bytes": base, "gpu_total_bytes": total, "gpu_free_bytes_after": free,
           "max_memory_reserved": torch.cuda.max_memory_reserved(), "probes": probes,
           "config": f"GPT d1024 L8 h16 batch 16 bf16 fused AdamW, workload {workload} (cycle: {list(SEQS)}), "
                     f"torch.cuda.empty_cache() every {empty_cache or 'no'} step(s)"}
    with open(os.path.join(d, "truth_side.json"), "w") as f:
        json.dump(rec, f, indent=1)
    log(name, "ms/step", rec["wall_ms_per_step"], "retries/step", rec["retries_per_step"], "room MiB", room // MIB)
    return rec


# name: (PYTORCH_CUDA_ALLOC_CONF, room: 0 probe / -1 headroom / "slow" the probed side's, workload, empty_cache)
SIDES = {
    "slow": ("", 0, "cycle", 0), "headroom": ("", -1, "cycle", 0),
    "expandable": ("expandable_segments:True", "slow", "cycle", 0),
    "random_slow": ("", 0, "random", 0), "random_headroom": ("", -1, "random", 0),
    "random_expandable": ("expandable_segments:True", "random_slow", "random", 0),
    "empty_cache": ("", -1, "cycle", 1),
    "const_empty_cache": ("", -1, "const", 1), "const_empty_cache_4": ("", -1, "const", 4),
    "const_headroom": ("", -1, "const", 0),
}


def main():
    if sys.argv[1] == "--side":
        side(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
        return
    out, names = sys.argv[1], sys.argv[2:] or list(SIDES)
    truth = {"sides": {}}
    for name in names:
        conf, room, workload, empty = SIDES[name]
        if isinstance(room, str):
            room = truth["sides"].get(room, {}).get("room_bytes", -1)
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        try:
            p = subprocess.run([sys.executable, __file__, "--side", name, out, str(room), workload,
                                str(empty)], env=env, timeout=300, capture_output=True, text=True)
        except subprocess.TimeoutExpired as e:
            truth["sides"][name] = {"error": "timeout", "stdout": str(e.stdout)[-2000:]}
            continue
        sys.stdout.write(p.stdout[-4000:] + p.stderr[-4000:])
        path = os.path.join(out, "allocator", name, "truth_side.json")
        if p.returncode or not os.path.exists(path):
            truth["sides"][name] = {"error": p.returncode, "stderr": p.stderr[-2000:]}
            continue
        with open(path) as f:
            truth["sides"][name] = json.load(f)
        with open(os.path.join(out, "allocator", "truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
