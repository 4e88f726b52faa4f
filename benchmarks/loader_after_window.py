"""Is ``capture.profile``'s after-window timing of a loader-bound step biased by the DataLoader's prefetch queue,
refilled while the trace is written? (tests/data/gpu/h200/loader/after_window.json; its README says what it showed.)

The loader pair's slow side of ``record_gpu.py`` (2 workers, prefetch_factor 4: up to 8 batches buffered), each step
timed alone (CUDA-synchronised): 30 steady steps, 30 steps after a 3 s pause (as long as a trace export), and a
``capture.profile(wait=2, warmup=2, active=4, time_after=30)`` loop. Writes ``$OUT/loader_after.json``.

Usage (on the GPU machine, from the project root): ``OUT=DIR PYTHONPATH=. python3 benchmarks/loader_after_window.py``.
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_gpu as R  # noqa: E402

from traceanalyze import capture  # noqa: E402


def build():
    torch.manual_seed(0)
    model = R.GPT(d=768, h=12, layers=4, seq=512).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    loader = torch.utils.data.DataLoader(R.CpuHeavy(), batch_size=32, shuffle=False, num_workers=2,
                                         persistent_workers=True, prefetch_factor=4)
    it = iter(loader)

    def step():
        idx, tgt = next(it)
        R.bf16_gpt_step(model, opt, idx.to("cuda", non_blocking=True), tgt.to("cuda", non_blocking=True))
    return step


def timed_step(step) -> float:
    t = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return round((time.perf_counter() - t) * 1e3, 2)


def per_step(step, n):
    return [timed_step(step) for _ in range(n)]


def main() -> None:
    out = os.environ.get("OUT", "/tmp")
    step = build()
    per_step(step, 10)
    res = {"steady_before": per_step(step, 30)}
    time.sleep(3.0)  # a pause like the trace's export: the 2 workers refill the queue
    res["after_3s_pause"] = per_step(step, 30)
    d = "/tmp/la"
    per = []
    with capture.profile(d, wait=2, warmup=2, active=4, time_after=30) as prof:
        for _ in range(8 + 30):
            per.append(timed_step(step))
            prof.step()
    res["capture_loop"] = per
    with open(f"{d}/steps_rank0.json") as f:
        res["steps_json"] = json.load(f)
    with open(f"{out}/loader_after.json", "w") as f:
        json.dump(res, f, indent=1)
    for k in ("steady_before", "after_3s_pause", "capture_loop"):
        print(k, res[k])
    print("unprofiled_step_ms", res["steps_json"]["unprofiled_step_ms"])


if __name__ == "__main__":
    main()
