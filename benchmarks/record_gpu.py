"""Record single-GPU what-if pairs on a real NVIDIA GPU (issue 29's pairs; issue 37's conv, loader, optimizer).

Each pair is a slow run and the same job with one cause fixed. Every side is profiled (Kineto, gzip) and timed
without the profiler (CUDA-synchronised wall clock over N steps), so a what-if predicted from the slow side's trace
can be checked against the fixed side's measured step time.

  precision   slow: fp32 GPT, TF32 off (plain torch.profiler)   | fixed: bf16 autocast   | tf32: fp32 with TF32 on
  launch      slow: 40-layer small MLP, eager, many tiny kernels | fixed: the whole step as one CUDA graph
  dataloader  slow: DataLoader num_workers=0, CPU-heavy samples  | fixed: num_workers=12, pin_memory
  compile     slow: torch.compile, cold cache, profiled from step 0 | fixed: eager
  conv        slow: ResNet-50 fp32 (NCHW, PyTorch's default TF32 settings) | bf16: bf16 autocast, NCHW
              | fixed: bf16 autocast + channels_last | slow_sync: the slow side under capture.profile
              (Kineto's cuda_sync rows: which stream waited on which event)
  loader      slow: DataLoader num_workers=3 on CPU-heavy samples | fixed: num_workers=12, pin_memory
              (both under capture.profile: profiled and unprofiled steps of a loader with workers)
  optimizer   slow: AdamW foreach=False | foreach: AdamW foreach=True | fixed: AdamW fused=True
  memory      one side under capture.profile(profile_memory=True) whose step keeps 8 MiB more every step
  oom         the CUDA out-of-memory message of this torch (a log for the OOM parser), no trace

Usage (on the GPU machine, from the project root):
  PYTHONPATH=. python3 benchmarks/record_gpu.py OUTDIR [PAIR ...]
  RECORD_SMOKE=1 python3 benchmarks/record_gpu.py /tmp/smoke conv optimizer   # tiny sizes, CPU: the script runs
"""
import json
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

T0 = time.time()
BUDGET_S = float(os.environ.get("BUDGET_S", "420"))
SMOKE = os.environ.get("RECORD_SMOKE") == "1"  # a CPU dry run at tiny sizes: checks the script, records nothing real
DEV = "cpu" if SMOKE else "cuda"
if SMOKE:
    torch.cuda.synchronize = lambda *a, **k: None


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


# ---------------------------------------------------------------- models
class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=32000, d=1024, h=16, layers=12, seq=1024):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def gpt_loss(model, idx, tgt):
    logits = model(idx)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), tgt.view(-1))


def bf16_gpt_step(model, opt, idx, tgt):
    """One training step of a GPT under bf16 autocast (the loader, optimizer and memory sides)."""
    with torch.autocast(DEV, dtype=torch.bfloat16):
        loss = gpt_loss(model, idx, tgt)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def mlp(width=512, layers=40):
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    return nn.Sequential(*mods, nn.Linear(width, 10))


# ---------------------------------------------------------------- helpers
def profiler(out_dir, *, plain, wait=2, warmup=2, active=4, record_shapes=True):
    """The project's capture.profile (as its README tells users), or a plain torch.profiler like most users'."""
    if not plain:
        from traceanalyze import capture
        return capture.profile(out_dir, wait=wait, warmup=warmup, active=active, record_shapes=record_shapes)
    from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler
    return torch.profiler.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=record_shapes,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=tensorboard_trace_handler(out_dir, use_gzip=True))


def timed(step, n):
    """Mean wall ms per step over n steps (one sync before and after: the throughput a user sees)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(n):
        step(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3 / n


AFTER_STEPS = 5  # capture.profile's time_after: the steps it times without the profiler after the window


def run_side(name, out_dir, step, *, plain=False, warm=3, n=20, prof_steps=8, record_shapes=True, meta=None):
    os.makedirs(out_dir, exist_ok=True)
    for i in range(warm):
        step(i)
    torch.cuda.synchronize()
    ms1 = timed(step, n)
    per = []
    with profiler(out_dir, plain=plain, record_shapes=record_shapes) as prof:
        # capture.profile also times AFTER_STEPS steps past the window without the profiler (steps_rank0.json)
        for i in range(prof_steps + (0 if plain else AFTER_STEPS)):
            t = time.perf_counter()
            step(i)
            torch.cuda.synchronize()
            per.append((time.perf_counter() - t) * 1e3)
            prof.step()
    ms2 = timed(step, n)
    rec = {"side": name, "wall_ms_per_step": [round(ms1, 3), round(ms2, 3)],
           "wall_ms_per_step_mean": round((ms1 + ms2) / 2, 3),
           "profiled_loop_ms": [round(x, 3) for x in per], **(meta or {})}
    with open(os.path.join(out_dir, "truth_side.json"), "w") as f:
        json.dump(rec, f, indent=1)
    log(name, rec["wall_ms_per_step"], "profiled", rec["profiled_loop_ms"][4:])
    return rec


def gpt_data(b, t, vocab=32000):
    g = torch.Generator(device=DEV).manual_seed(0)
    idx = torch.randint(0, vocab, (b, t), device=DEV, generator=g)
    return idx, torch.roll(idx, -1, 1)


# ---------------------------------------------------------------- pairs
def pair_precision(out):
    res = {}
    for side in ("slow", "fixed", "tf32"):
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = side == "tf32"
        torch.backends.cudnn.allow_tf32 = side == "tf32"
        model = GPT().to(DEV)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        idx, tgt = gpt_data(8, 1024)

        def step(i, model=model, opt=opt, side=side, idx=idx, tgt=tgt):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=side == "fixed"):
                loss = gpt_loss(model, idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        res[side] = run_side(f"precision/{side}", f"{out}/precision/{side}", step, plain=True, n=10,
                             meta={"config": "GPT d1024 L12 h16 seq1024 batch8 AdamW fused",
                                   "dtype": {"slow": "fp32, TF32 off", "fixed": "bf16 autocast",
                                             "tf32": "fp32, TF32 on"}[side]})
        del model, opt
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return res


def pair_launch(out):
    res = {}
    for side in ("slow", "fixed"):
        torch.manual_seed(0)
        model = mlp().to(DEV)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=side == "fixed", foreach=False)
        x = torch.randn(64, 512, device=DEV)
        y = torch.randint(0, 10, (64,), device=DEV)
        if side == "slow":
            def step(i, model=model, opt=opt, x=x, y=y):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
        else:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(g):
                F.cross_entropy(model(x), y).backward()
                opt.step()

            def step(i, g=g):
                g.replay()
        res[side] = run_side(f"launch/{side}", f"{out}/launch/{side}", step, n=50, prof_steps=10,
                             meta={"config": "MLP 40x(Linear512+LayerNorm+GELU) batch64 Adam foreach=False",
                                   "mode": "eager" if side == "slow" else "whole step captured as one CUDA graph"})
        del model, opt
        torch.cuda.empty_cache()
    return res


class CpuHeavy(torch.utils.data.Dataset):
    """A sample costs a few ms of CPU (like decoding and augmenting an image)."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        import numpy as np
        r = np.random.default_rng(i)
        a = r.standard_normal(100_000).astype("float32")
        a.sort()
        tok = (np.abs(a[:512]) * 1000).astype("int64") % 32000
        t = torch.from_numpy(tok)
        return t, torch.roll(t, -1)


def pair_dataloader(out):
    res = {}
    for side in ("slow", "fixed"):
        torch.manual_seed(0)
        model = GPT(d=768, h=12, layers=4, seq=512).to(DEV)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        kw = dict(num_workers=0) if side == "slow" else dict(num_workers=12, pin_memory=True,
                                                             persistent_workers=True, prefetch_factor=4)
        loader = torch.utils.data.DataLoader(CpuHeavy(), batch_size=16, shuffle=False, **kw)
        it = iter(loader)

        def step(i, it=it, model=model, opt=opt):
            idx, tgt = next(it)
            idx, tgt = idx.to(DEV, non_blocking=True), tgt.to(DEV, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = gpt_loss(model, idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        res[side] = run_side(f"dataloader/{side}", f"{out}/dataloader/{side}", step, n=20, warm=5,
                             meta={"config": "GPT d768 L4 seq512 batch16 bf16; sample = sort of 100k floats",
                                   "loader": kw})
        del it, loader, model, opt
        torch.cuda.empty_cache()
    return res


def pair_compile(out):
    res = {}
    cache = tempfile.mkdtemp(prefix="inductor-cold-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    for side in ("slow", "fixed"):
        torch.manual_seed(0)
        model = GPT(d=768, h=12, layers=6, seq=512).to(DEV)
        fwd = torch.compile(model) if side == "slow" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        idx, tgt = gpt_data(16, 512)

        def step(i, fwd=fwd, opt=opt, idx=idx, tgt=tgt):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = fwd(idx)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), tgt.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        d = f"{out}/compile/{side}"
        os.makedirs(d, exist_ok=True)
        per = []
        with profiler(d, plain=False, wait=0, warmup=0, active=6, record_shapes=False) as prof:
            for i in range(6):
                t = time.perf_counter()
                step(i)
                torch.cuda.synchronize()
                per.append((time.perf_counter() - t) * 1e3)
                prof.step()
        ms = timed(step, 30)
        rec = {"side": f"compile/{side}", "step0_ms": round(per[0], 1), "profiled_loop_ms": [round(x, 3) for x in per],
               "steady_wall_ms_per_step": round(ms, 3),
               "config": "GPT d768 L6 seq512 batch16 bf16 autocast; " +
                         ("torch.compile default mode, empty inductor+triton cache, profiled from step 0"
                          if side == "slow" else "eager, profiled from step 0")}
        with open(os.path.join(d, "truth_side.json"), "w") as f:
            json.dump(rec, f, indent=1)
        log(rec["side"], "step0", rec["step0_ms"], "steady", ms, per)
        res[side] = rec
        del model, fwd, opt
        torch.cuda.empty_cache()
    return res


def _sized(full, smoke):
    return smoke if SMOKE else full


def resnet50():
    if SMOKE:  # a tiny conv net: the smoke run checks the script, not the model
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, 1000))
    import torchvision

    return torchvision.models.resnet50()


def pair_conv(out):
    res = {}
    batch, px = _sized(128, 2), _sized(224, 64)
    for side in ("slow", "bf16", "fixed", "slow_sync"):
        torch.manual_seed(0)
        cl = side == "fixed"
        amp = side in ("bf16", "fixed")
        # true fp32 on the slow sides (TF32 off, as the precision pair): fp32 where bf16 was meant
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        model = resnet50().to(DEV)
        x = torch.randn(batch, 3, px, px, device=DEV)
        if cl:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(i, model=model, opt=opt, x=x, y=y, amp=amp):
            with torch.autocast(DEV, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        res[side] = run_side(f"conv/{side}", f"{out}/conv/{side}", step, plain=side != "slow_sync", n=20,
                             meta={"config": f"ResNet-50 batch {batch} {px}px SGD momentum",
                                   "dtype": "bf16 autocast" if amp else "fp32",
                                   "memory_format": "channels_last" if cl else "NCHW (contiguous)",
                                   "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32,
                                            "cudnn": torch.backends.cudnn.allow_tf32},
                                   "profiler": "plain torch.profiler" if side != "slow_sync"
                                   else "traceanalyze capture.profile (cuda_sync events)"})
        del model, opt
        if not SMOKE:
            torch.cuda.empty_cache()
    return res


def pair_loader(out):
    res = {}
    for side in ("slow", "fixed"):
        torch.manual_seed(0)
        model = GPT(d=_sized(768, 64), h=_sized(12, 4), layers=_sized(4, 1), seq=512).to(DEV)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not SMOKE)
        kw = dict(num_workers=2, persistent_workers=True, prefetch_factor=4) if side == "slow" else dict(
            num_workers=12, pin_memory=not SMOKE, persistent_workers=True, prefetch_factor=4)
        loader = torch.utils.data.DataLoader(CpuHeavy(), batch_size=32, shuffle=False, **kw)
        it = iter(loader)

        def step(i, it=it, model=model, opt=opt):
            idx, tgt = next(it)
            bf16_gpt_step(model, opt, idx.to(DEV, non_blocking=True), tgt.to(DEV, non_blocking=True))

        res[side] = run_side(f"loader/{side}", f"{out}/loader/{side}", step, n=20, warm=8,
                             meta={"config": "GPT d768 L4 seq512 batch32 bf16; sample = sort of 100k floats",
                                   "loader": kw, "cpu_count": os.cpu_count()})
        del it, loader, model, opt
        import gc

        gc.collect()  # the persistent workers end here, not during the next pair
        if not SMOKE:
            torch.cuda.empty_cache()
    return res


def pair_optimizer(out):
    res = {}
    for side in ("slow", "foreach", "fixed"):
        torch.manual_seed(0)
        model = GPT(d=_sized(512, 64), h=8, layers=_sized(8, 1), seq=256).to(DEV)
        kw = {"slow": dict(foreach=False), "foreach": dict(foreach=True), "fixed": dict(fused=True)}[side]
        if SMOKE:
            kw = dict(foreach=False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
        idx, tgt = gpt_data(16, 256) if not SMOKE else (torch.randint(0, 32000, (2, 256)),) * 2

        def step(i, model=model, opt=opt, idx=idx, tgt=tgt):
            bf16_gpt_step(model, opt, idx, tgt)

        res[side] = run_side(f"optimizer/{side}", f"{out}/optimizer/{side}", step, n=50, prof_steps=10,
                             meta={"config": "GPT d512 L8 h8 seq256 batch16 bf16 autocast",
                                   "optimizer": f"AdamW {kw}",
                                   "param_tensors": sum(1 for _ in model.parameters())})
        del model, opt
        if not SMOKE:
            torch.cuda.empty_cache()
    return res


def pair_memory(out):
    """One side whose step keeps an 8 MiB tensor alive every step (a leak: a list of activations)."""
    from traceanalyze import capture

    torch.manual_seed(0)
    model = GPT(d=_sized(512, 64), h=8, layers=_sized(4, 1), seq=256).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    idx, tgt = gpt_data(8, 256) if not SMOKE else (torch.randint(0, 32000, (2, 256)),) * 2
    kept = []
    d = f"{out}/memory/leak"
    per = []
    with capture.profile(d, wait=1, warmup=1, active=5, profile_memory=True) as prof:
        for _ in range(7 + 5):
            t = time.perf_counter()
            bf16_gpt_step(model, opt, idx, tgt)
            kept.append(torch.empty(2 << 20, dtype=torch.float32, device=DEV).fill_(1.0))  # 8 MiB kept
            torch.cuda.synchronize()
            per.append((time.perf_counter() - t) * 1e3)
            prof.step()
    rec = {"side": "memory/leak", "leak_bytes_per_step": 8 << 20, "profiled_loop_ms": [round(x, 3) for x in per],
           "config": "GPT d512 L4 seq256 batch8 bf16 AdamW foreach; each step keeps an 8 MiB fp32 tensor",
           "max_memory_allocated": torch.cuda.max_memory_allocated() if not SMOKE else None}
    with open(os.path.join(d, "truth_side.json"), "w") as f:
        json.dump(rec, f, indent=1)
    log("memory/leak", per)
    return rec


def pair_oom(out):
    """The CUDA out-of-memory message of this torch, as a failing process prints it (a log, no trace)."""
    import subprocess

    d = f"{out}/oom"
    os.makedirs(d, exist_ok=True)
    code = ("import torch\n"
            "keep = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
            "x = torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    with open(os.path.join(d, "cuda_oom.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    log("oom rc", p.returncode, (p.stderr or "").strip().splitlines()[-1:] )
    return {"returncode": p.returncode}


PAIRS = {"precision": pair_precision, "launch": pair_launch, "dataloader": pair_dataloader,
         "compile": pair_compile, "conv": pair_conv, "loader": pair_loader, "optimizer": pair_optimizer,
         "memory": pair_memory, "oom": pair_oom}


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or list(PAIRS)
    os.makedirs(out, exist_ok=True)
    truth = {"device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0), "torch": torch.__version__,
             "cuda": torch.version.cuda, "pairs": {}}
    log("device", truth["device"], "torch", truth["torch"])
    for n in names:
        if time.time() - T0 > BUDGET_S:
            log("budget spent, skipping", n)
            continue
        try:
            truth["pairs"][n] = PAIRS[n](out)
        except Exception as e:  # one pair failing keeps the others
            log("FAILED", n, repr(e))
            traceback.print_exc()
            truth["pairs"][n] = {"error": repr(e)}
        torch.cuda.synchronize()
        with open(os.path.join(out, "truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
