"""One rank of a small DDP language-model training job, recorded with torch.profiler.

`generate.py` starts one process per rank (``python sample_traces/workload.py --config CFG --result-dir RES``)
with the usual ``torch.distributed`` environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``). Each rank trains a tiny GPT-like model on synthetic tokens with DDP (gloo) and AdamW,
prints one torchtune-style line per optimizer step to stdout (``Step N | loss:... step_time_ms:... ``,
where N is the same number as the trace's ``ProfilerStep#N``), writes one gzipped Kineto trace
(``rank{r}.<ns>.pt.trace.json.gz``) into the scenario folder, and its measured step times into
``RES/result_rank{r}.json``.

Knobs in :class:`JobConfig` reproduce the slowdowns: extra compute on one rank (straggler), a host sleep on
one rank (idle straggler), pure-Python work after the optimizer step on one rank (late entry into
the next step), bf16 autocast vs fp32, ``torch.compile``, an expensive pure-Python per-sample
transform or a slow per-sample read (data-loader bound). ``link_probe_bytes`` times a gloo all-reduce
before training (the link bandwidth the job sees).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from traceanalyze import capture  # env_rank{r}.json, as a user's capture.profile writes it


@dataclass
class JobConfig:
    """Everything one training job needs; serialised as JSON between generate.py and the ranks."""

    scenario: str
    out_dir: str
    vocab: int = 2048
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 64
    micro_batch: int = 8
    grad_accum: int = 1
    steps: int = 8
    lr: float = 1e-3
    dtype: str = "float32"  # "float32", or "bfloat16" = torch.autocast("cpu", dtype=torch.bfloat16)
    compile: bool = False
    # Rank that runs straggler_extra_forwards extra no-grad forward passes of the model (on the same
    # micro-batch) before backward; a forward is about 1/3 of forward+backward, so 3 doubles its compute.
    straggler_rank: int | None = None
    straggler_extra_forwards: int = 0
    # ms that straggler_rank sleeps (host idle, outside any profiler range) at the start of every step.
    straggler_sleep_ms: float = 0.0
    # ms that straggler_rank sleeps between forward and backward (a host stall: host idle, no profiler range).
    straggler_stall_ms: float = 0.0
    # ms of pure-Python work straggler_rank does after opt.step() every step, before the next one (one rank's own
    # logging, metrics or checkpoint bookkeeping: no torch op, so no profiler range; a host gap at its step's end).
    straggler_tail_ms: float = 0.0
    # torch intra-op threads per rank: with world x threads above the cores, the ranks share cores.
    threads: int = 1
    # Merge rounds of the pure-Python "tokenizer" run per sample in Dataset.__getitem__ (0 = none).
    tokenizer_rounds: int = 0
    tokenizer_text_chars: int = 256
    # ms of time.sleep per sample in Dataset.__getitem__: a read from slow storage (I/O wait, CPU idle),
    # which DataLoader workers can overlap with compute even when every core is busy training.
    sample_read_ms: float = 0.0
    num_workers: int = 0
    profile_wait: int = 1
    profile_warmup: int = 1
    profile_active: int = 3
    seed: int = 0
    # Bytes of the fp32 buffer all-reduced (after a warm-up, LINK_PROBE_ROUNDS times, each after a
    # barrier) before training, to measure the link; 0 = no probe. Printed as a "# link probe" line.
    link_probe_bytes: int = 0
    # profile_memory=True: the trace gets the allocator's [memory] events (allocations, frees, totals).
    profile_memory: bool = False
    # Rank that keeps leak_bytes_per_step of fresh fp32 tensors alive every step (a list that only grows, like
    # a metric history that keeps tensors instead of floats): its allocated memory rises every step.
    leak_rank: int | None = None
    leak_bytes_per_step: int = 0


LINK_PROBE_ROUNDS = 5


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention (SDPA) and a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, d_model) -> same shape."""
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    """Token + position embedding, ``n_layers`` blocks, final LayerNorm and an untied LM head."""

    def __init__(self, cfg: JobConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: (batch, seq) int64 tokens -> logits (batch, seq, vocab)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def matmul_params(model: nn.Module) -> int:
    """Number of weights that take part in matmuls (all nn.Linear weights)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def python_tokenize(text: str, rounds: int) -> list[int]:
    """A deliberately slow byte-pair-style tokenizer in pure Python: ``rounds`` greedy merges of the
    most frequent adjacent pair, each a full pass over the sequence (what a naive custom tokenizer does)."""
    ids = [ord(ch) for ch in text]
    next_id = 256
    for _ in range(rounds):
        counts: dict[tuple[int, int], int] = {}
        for pair in zip(ids, ids[1:], strict=False):
            counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = max(counts, key=counts.__getitem__)
        merged: list[int] = []
        i = 0
        while i < len(ids):
            if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
                merged.append(next_id)
                i += 2
            else:
                merged.append(ids[i])
                i += 1
        # Merging shortens the text; re-expand so every round does the same amount of work.
        ids = (merged * (len(text) // max(1, len(merged)) + 1))[: len(text)]
        next_id += 1
    return ids


class SyntheticTokens(Dataset):
    """Deterministic learnable sequences (arithmetic progressions mod vocab), optionally produced
    through :func:`python_tokenize` on a synthetic text first (the data-loader-bound scenario)."""

    def __init__(self, cfg: JobConfig, n_samples: int) -> None:
        self.cfg = cfg
        self.n = n_samples

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        rng = random.Random(cfg.seed * 1_000_003 + i)
        start, stride = rng.randrange(cfg.vocab), rng.randrange(1, 17)
        if cfg.tokenizer_rounds:
            alphabet = "abcdefghijklmnopqrstuvwxyz     .,"
            text = "".join(rng.choice(alphabet) for _ in range(cfg.tokenizer_text_chars))
            start = (start + sum(python_tokenize(text, cfg.tokenizer_rounds))) % cfg.vocab
        if cfg.sample_read_ms:
            time.sleep(cfg.sample_read_ms / 1000)
        seq = torch.tensor([(start + stride * t) % cfg.vocab for t in range(cfg.seq_len + 1)])
        return seq[:-1], seq[1:]


def extra_forwards(model: nn.Module, x: torch.Tensor, n: int) -> None:
    """The straggler's real extra work: ``n`` forward passes without grad (like an extra evaluation or
    metrics pass that only one rank runs)."""
    with torch.no_grad():
        for _ in range(n):
            model(x)


def host_work(ms: float) -> int:
    """``ms`` of pure-Python CPU work (no torch op, so no profiler range: a host gap in the trace), like the
    logging, metrics or checkpoint bookkeeping one rank does after the optimizer step. Busy until its deadline, so
    that its length does not depend on the host's speed. Returns a checksum (so the loop is not optimised away)."""
    deadline = time.perf_counter() + ms / 1000
    acc = 0
    while time.perf_counter() < deadline:
        acc = (acc * 31 + sum(range(1000))) % 1_000_003
    return acc


def link_probe(n_bytes: int, world: int) -> dict:
    """Time ``LINK_PROBE_ROUNDS`` gloo all-reduces of an fp32 buffer of ``n_bytes`` (after one warm-up), each
    started right after a barrier. Returns the median time in ms, the algorithm bandwidth (bytes / time) and
    the bus bandwidth (algbw x 2(n-1)/n, the nccl-tests definition for all-reduce), both in GB/s (1e9 B/s)."""
    buf = torch.ones(max(1, n_bytes // 4))
    dist.all_reduce(buf)
    times = []
    for _ in range(LINK_PROBE_ROUNDS):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t0)
    t = sorted(times)[len(times) // 2]
    algbw = buf.numel() * 4 / t / 1e9
    return {
        "bytes": buf.numel() * 4,
        "rounds": LINK_PROBE_ROUNDS,
        "median_ms": round(t * 1000, 3),
        "times_ms": [round(x * 1000, 3) for x in times],
        "algbw_GBps": round(algbw, 4),
        "busbw_GBps": round(algbw * 2 * (world - 1) / world, 4),
    }


def batches(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless iterator over the loader, advancing the DistributedSampler's epoch."""
    epoch = 0
    while True:
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def run(cfg: JobConfig, result_dir: Path) -> None:
    """Train ``cfg.steps`` optimizer steps under the profiler; write step times to
    ``result_dir/result_rank{r}.json``."""
    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir = Path(cfg.out_dir)
    # versions and the host CPU (native bf16 or not), as traceanalyze.capture.profile writes them
    (out_dir / f"env_rank{rank}.json").write_text(json.dumps(capture.environment(rank, world), default=str))

    torch.manual_seed(cfg.seed)
    model = TinyLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_micro = cfg.micro_batch * cfg.seq_len
    model_flops = 6 * matmul_params(model) * tokens_per_micro
    print(
        f"# traceanalyze sample scenario={cfg.scenario} rank={rank} world_size={world} backend=gloo "
        f"torch={torch.__version__} threads={torch.get_num_threads()}"
    )
    print(
        f"# model TinyLM params={n_params} grad_bytes={4 * n_params} "
        f"fwd_bwd_matmul_flops_per_micro_batch={model_flops}"
    )
    print(f"# config {json.dumps(dataclasses.asdict(cfg), sort_keys=True)}")
    sys.stdout.flush()
    if cfg.link_probe_bytes:
        print(f"# link probe {json.dumps(link_probe(cfg.link_probe_bytes, world), sort_keys=True)}", flush=True)

    ddp: nn.Module = DDP(model)
    if cfg.compile:
        ddp = torch.compile(ddp)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    n_samples = cfg.micro_batch * cfg.grad_accum * world * (cfg.steps + 1)
    data = SyntheticTokens(cfg, n_samples)
    loader = DataLoader(
        data,
        batch_size=cfg.micro_batch,
        num_workers=cfg.num_workers,
        sampler=DistributedSampler(data, num_replicas=world, rank=rank, seed=cfg.seed),
    )
    stream = batches(loader)
    extra = cfg.straggler_extra_forwards if cfg.straggler_rank == rank else 0
    sleep_s = cfg.straggler_sleep_ms / 1000 if cfg.straggler_rank == rank else 0.0
    stall_s = cfg.straggler_stall_ms / 1000 if cfg.straggler_rank == rank else 0.0
    tail_ms = cfg.straggler_tail_ms if cfg.straggler_rank == rank else 0.0
    leak_elems = cfg.leak_bytes_per_step // 4 if cfg.leak_rank == rank else 0
    kept: list[torch.Tensor] = []  # the leak: grows by leak_bytes_per_step every step, never freed

    step_times: list[float] = []
    prof = profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        profile_memory=cfg.profile_memory,
        with_stack=False,
        schedule=schedule(
            wait=cfg.profile_wait, warmup=cfg.profile_warmup, active=cfg.profile_active, repeat=1
        ),
        on_trace_ready=tensorboard_trace_handler(str(out_dir), worker_name=f"rank{rank}", use_gzip=True),
    )
    with prof:
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            if sleep_s:
                time.sleep(sleep_s)  # host idle, in no profiler range: an unlabelled gap of this rank
            total = 0.0
            for micro in range(cfg.grad_accum):
                x, y = next(stream)
                last = micro == cfg.grad_accum - 1
                with contextlib.nullcontext() if last else model_no_sync(ddp):
                    with autocast_ctx(cfg):
                        loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
                    if extra:
                        with autocast_ctx(cfg):
                            extra_forwards(model, x, extra)
                    if stall_s:
                        time.sleep(stall_s)  # host stall before backward, in no profiler range
                    (loss / cfg.grad_accum).backward()
                total += loss.item() / cfg.grad_accum
            opt.step()
            opt.zero_grad(set_to_none=True)
            if leak_elems:
                kept.append(torch.full((leak_elems,), total))  # aten::full -> aten::empty: kept, never freed
            if tail_ms:
                host_work(tail_ms)  # this rank only, after the optimizer, in no profiler range
            dt = time.perf_counter() - t0
            step_times.append(round(dt * 1000, 3))
            tps = tokens_per_micro * cfg.grad_accum / dt
            print(
                f"Step {step} | loss:{total:.4f} lr:{cfg.lr:g} tokens_per_second_per_gpu:{tps:.1f} "
                f"step_time_ms:{dt * 1000:.1f} ",
                flush=True,
            )
            prof.step()
    if cfg.compile:
        from torch._dynamo.utils import counters

        kept = ("inductor", "aot_autograd", "stats")
        print(f"# compile counters {json.dumps({k: dict(counters[k]) for k in kept}, sort_keys=True)}")
    dist.barrier()
    (result_dir / f"result_rank{rank}.json").write_text(
        json.dumps({"rank": rank, "step_times_ms": step_times, "n_params": n_params})
    )
    dist.destroy_process_group()


def autocast_ctx(cfg: JobConfig) -> contextlib.AbstractContextManager:
    """bf16 CPU autocast when ``cfg.dtype == "bfloat16"``, else nothing (plain fp32)."""
    if cfg.dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def model_no_sync(ddp: nn.Module) -> contextlib.AbstractContextManager:
    """DDP's no_sync() (gradient accumulation without an all-reduce), also through torch.compile."""
    inner = getattr(ddp, "_orig_mod", ddp)
    return inner.no_sync()


def main() -> None:
    """CLI: ``--config`` JSON file of a JobConfig, ``--result-dir`` where to write the step times."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, type=Path)
    ap.add_argument("--result-dir", required=True, type=Path)
    args = ap.parse_args()
    cfg = JobConfig(**json.loads(args.config.read_text()))
    os.makedirs(cfg.out_dir, exist_ok=True)
    run(cfg, args.result_dir)


if __name__ == "__main__":
    main()
