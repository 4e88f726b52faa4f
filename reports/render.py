#!/usr/bin/env python3
"""Render the example reports in reports/ from the committed sample_traces/ with the tool itself.

    python reports/render.py        # from the repository root, after `pip install .`

One report per scenario (`reports/<scenario>.html` + `.md`), and the comparisons the stories are about
(`slow_vs_fast_interconnect`, `fp32_vs_bf16`, `compile_cold_vs_warm`; `grad_accum` pairs its two runs by itself).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
OUT = ROOT / "reports"
PAIRS = {
    "slow_vs_fast_interconnect": ("slow_interconnect", "fast_interconnect"),
    "fp32_vs_bf16": ("precision_fp32", "precision_bf16"),
    "compile_cold_vs_warm": ("compile_cold", "compile_warm"),
}


def report(args: list[str], name: str, db_dir: Path) -> None:
    cmd = [sys.executable, "-m", "traceanalyze.cli", "report", *args, "-o", str(OUT / f"{name}.html"),
           "--md", str(OUT / f"{name}.md"), "--db", str(db_dir / f"{name}.duckdb"), "-q"]
    subprocess.run(cmd, check=True)
    # the reports are committed: keep them free of this machine's absolute paths
    for ext in (".html", ".md"):
        p = OUT / f"{name}{ext}"
        p.write_text(p.read_text(encoding="utf-8").replace(str(ROOT) + "/", ""), encoding="utf-8")
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


if __name__ == "__main__":
    main()
