"""A tiny GPT-2 trained with Hugging Face ``transformers.Trainer`` on CPU, recorded with torch.profiler.

Reproduces the LLaMA-Factory gradient-accumulation mistake: the same recipe (per-device batch 2,
``gradient_accumulation_steps=8``) run on 1 process and on 2 processes; the 2-process run silently
doubles the effective batch. ``generate.py`` runs this file directly for 1 process and under
``python -m torch.distributed.run --nproc_per_node 2`` for 2 (Trainer then uses DDP over gloo).

Everything the process prints (stdout and stderr, Trainer banner, ``{'loss': ...}`` dicts, progress bar,
warnings) goes to ``OUT/rank{RANK}.log``. The profiler is attached with a ``TrainerCallback`` and writes
``OUT/rank{RANK}.<ns>.pt.trace.json.gz``; measured per-optimizer-step wall times go to
``RESULT_DIR/result_rank{RANK}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def redirect_output(log_path: Path) -> None:
    """Send this process's fd 1 and 2 (so Python, C++ and child output alike) to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main() -> None:
    """CLI: --out DIR --result-dir DIR [--per-device N --grad-accum N --max-steps N]."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--result-dir", required=True, type=Path)
    ap.add_argument("--per-device", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    redirect_output(args.out / f"rank{rank}.log")

    # Imported after the redirect so that import-time warnings land in the log too.
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class TokenDataset(torch.utils.data.Dataset):
        """Random token sequences; labels = inputs (GPT2LMHeadModel shifts them itself)."""

        def __init__(self, n: int, seq_len: int, vocab: int) -> None:
            g = torch.Generator().manual_seed(1234)
            self.data = torch.randint(0, vocab, (n, seq_len), generator=g)

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.data[i], "labels": self.data[i]}

    class ProfilerCallback(TrainerCallback):
        """Drives torch.profiler from the Trainer loop: one ``prof.step()`` per optimizer step, and
        records each step's wall time (from the previous step's end, so data fetch is included)."""

        def __init__(self, prof: profile) -> None:
            self.prof = prof
            self.step_times_ms: list[float] = []
            self.last = 0.0

        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            self.prof.start()
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            now = time.perf_counter()
            self.step_times_ms.append(round((now - self.last) * 1000, 3))
            self.prof.step()
            self.last = time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            self.prof.stop()

    model_cfg = GPT2Config(
        vocab_size=1024,
        n_positions=args.seq_len,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=1023,
        eos_token_id=1023,
    )
    model = GPT2LMHeadModel(model_cfg)
    n_samples = args.per_device * args.grad_accum * world * args.max_steps
    dataset = TokenDataset(n_samples, args.seq_len, model_cfg.vocab_size)

    prof = profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        profile_memory=False,
        with_stack=False,
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(args.out), worker_name=f"rank{rank}", use_gzip=True),
    )
    callback = ProfilerCallback(prof)
    with tempfile.TemporaryDirectory(prefix="ta_hf_") as tmp:
        training_args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=args.per_device,
            gradient_accumulation_steps=args.grad_accum,
            max_steps=args.max_steps,
            learning_rate=5e-4,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            ddp_backend="gloo" if world > 1 else None,  # a 1-process run is plain, not distributed
            dataloader_num_workers=0,
            seed=0,
            log_level="info",
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=[callback])
        trainer.train()
    print(f"torch.get_num_threads()={torch.get_num_threads()} rank={rank} world_size={world}", flush=True)
    (args.result_dir / f"result_rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "step_times_ms": callback.step_times_ms,
                "n_params": sum(p.numel() for p in model.parameters()),
                "model": {
                    "n_layer": model_cfg.n_layer,
                    "n_embd": model_cfg.n_embd,
                    "n_head": model_cfg.n_head,
                    "vocab_size": model_cfg.vocab_size,
                    "n_positions": model_cfg.n_positions,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
