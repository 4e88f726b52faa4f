#!/usr/bin/env python3
"""Render the example reports in reports/ from the committed sample_traces/ with the tool itself.

    python reports/render.py        # from the repository root, after `pip install .`

One report per scenario (`reports/<scenario>.html` + `.md`), and the comparisons the stories are about
(`slow_vs_fast_interconnect`, `fp32_vs_bf16`, `compile_cold_vs_warm`; `grad_accum` pairs its two runs by itself).

Three GPU pages at scale, from NCCL jobs that `tests/synth.py` generates into a temporary folder (nothing large is
committed): `gpu_2_of_8_ranks` (only 2 of an 8-rank job's traces: an inconclusive verdict), `gpu_8_ranks` and
`gpu_64_ranks` (rank 5, resp. 37, idles 30 ms on the host each step; the others wait for it in the all_reduce).

With ``../shared`` beside the checkout, also the real H200 pairs (``../shared/traces/gpu/h200``, ours): each slow
side against its fixed twin (``h200_<pair>``), so the page shows the predicted saving beside the measured one; and
our H100 allocator pair from ``tests/data/gpu/h100`` (``h100_allocator``: ``torch.cuda.empty_cache()`` every step).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.synth, the trace generator
SAMPLES = ROOT / "sample_traces"
OUT = ROOT / "reports"
PAIRS = {
    "slow_vs_fast_interconnect": ("slow_interconnect", "fast_interconnect"),
    "fp32_vs_bf16": ("precision_fp32", "precision_bf16"),
    "compile_cold_vs_warm": ("compile_cold", "compile_warm"),
}


H200 = ROOT.parent / "shared" / "traces" / "gpu" / "h200"
H200_PAIRS = {"h200_precision": ("precision/slow", "precision/fixed"), "h200_launch": ("launch/slow", "launch/fixed"),
              "h200_dataloader": ("dataloader/slow", "dataloader/fixed")}
H100 = ROOT / "tests" / "data" / "gpu" / "h100"  # ours, in the repository: the allocator pair (issue 41)
H100_PAIRS = {"h100_allocator": ("allocator/slow", "allocator/fixed")}
GPU_JOBS = {"gpu_2_of_8_ranks": (8, 6, 6, [0, 1]), "gpu_8_ranks": (8, 6, 5, None), "gpu_64_ranks": (64, 8, 37, None)}


def gpu_job(name: str, tmp: Path) -> Path:
    """Write the generated NCCL job ``name`` of :data:`GPU_JOBS` (world, steps, straggler, ranks kept) under ``tmp``."""
    from tests.synth import write_gpu_job

    world, steps, straggler, keep = GPU_JOBS[name]
    folder = write_gpu_job(tmp / name, world, steps, straggler=straggler)
    for r in range(world):
        if keep is not None and r not in keep:
            (folder / f"rank{r}.json").unlink()
    return folder


def report(args: list[str], name: str, db_dir: Path, root: Path = ROOT) -> None:
    cmd = [sys.executable, "-m", "traceanalyze.cli", "report", *args, "-o", str(OUT / f"{name}.html"),
           "--md", str(OUT / f"{name}.md"), "--db", str(db_dir / f"{name}.duckdb"), "-q"]
    subprocess.run(cmd, check=True)
    # the reports are committed: keep them free of this machine's absolute paths
    for ext in (".html", ".md"):
        p = OUT / f"{name}{ext}"
        p.write_text(p.read_text(encoding="utf-8").replace(str(root) + "/", ""), encoding="utf-8")
    print(f"wrote reports/{name}.html")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for d in sorted(SAMPLES.iterdir()):
            # run folders only: sample_traces/pairs/ (slow runs and fixed twins) holds no scenario.json and
            # gets no example report
            if (d / "scenario.json").exists():
                report([str(d)], d.name, Path(tmp))
        for name, (subject, baseline) in PAIRS.items():
            if (SAMPLES / subject).exists() and (SAMPLES / baseline).exists():
                report([str(SAMPLES / subject), "--baseline", str(SAMPLES / baseline)], name, Path(tmp))
        for name in GPU_JOBS:
            folder = gpu_job(name, Path(tmp))
            report([str(folder)], name, Path(tmp), root=Path(tmp))
        for name, (subject, baseline) in H100_PAIRS.items():
            report([str(H100 / subject), "--baseline", str(H100 / baseline)], name, Path(tmp))
        for name, (subject, baseline) in H200_PAIRS.items():
            if (H200 / subject).is_dir() and (H200 / baseline).is_dir():
                report([str(H200 / subject), "--baseline", str(H200 / baseline)], name, Path(tmp), root=ROOT.parent)


if __name__ == "__main__":
    main()
