"""A real 2-rank gloo training job on CPU recorded with :mod:`traceanalyze.capture` (run by tests/test_capture.py).

Usage: ``python tests/capture_job.py OUT_DIR [STEPS]``. Each rank trains a tiny MLP with DDP for STEPS steps
(default 10: the recorded window, then the 5 steps ``time_after`` times without the profiler) inside
``capture.profile(OUT_DIR, wait=1, warmup=1, active=3)``.
"""

from __future__ import annotations

import os
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world: int, out_dir: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from traceanalyze import capture

    torch.set_num_threads(1)
    os.environ["RANK"] = str(rank)
    capture.prepare_env(out_dir)  # before the process group, as documented
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture.profile(out_dir, wait=1, warmup=1, active=3) as prof:
        for _ in range(steps):
            x = torch.randn(32, 64)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("WORLD_SIZE", "2")
    mp.spawn(worker, args=(2, out_dir, steps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
