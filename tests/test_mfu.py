"""MFU that means MFU (issue 31, item 2): model FLOPs per step from every matrix op's Input Dims, over the step time
without the profiler, against the GPU's best dense peak; the matrix-math efficiency kept apart, under its own name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import shared
from tests.synth import x
from traceanalyze.metrics.precision import op_flops
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze

H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0}


def test_op_flops_of_each_matrix_op():
    assert op_flops("aten::mm", json.dumps([[64, 128], [128, 32]])) == 2 * 64 * 32 * 128
    assert op_flops("aten::addmm", json.dumps([[32], [64, 128], [128, 32]])) == 2 * 64 * 32 * 128
    assert op_flops("aten::bmm", json.dumps([[4, 64, 128], [4, 128, 32]])) == 2 * 4 * 64 * 32 * 128
    # attention: q [B, H, Sq, D], k [B, H, Sk, D]: 4·B·H·Sq·Sk·D forward, 2.5 times that backward
    fwd = 4 * 2 * 16 * 1024 * 1024 * 64
    q = [2, 16, 1024, 64]
    assert op_flops("aten::_scaled_dot_product_efficient_attention", json.dumps([q, q, q, []])) == fwd
    assert op_flops("aten::_scaled_dot_product_flash_attention_backward", json.dumps([q, q, q, q, q])) == 2.5 * fwd
    # convolution: input [N, C, H, W], weight [K, C, R, S]: 2·N·K·C·R·S·P·Q, P·Q = H·W forward; backward 2x from
    # the output gradient's own P·Q
    assert op_flops("aten::cudnn_convolution", json.dumps([[8, 64, 56, 56], [128, 64, 3, 3], []])) == \
        2 * 8 * 128 * 64 * 9 * 56 * 56
    assert op_flops("aten::convolution_backward", json.dumps([[8, 128, 28, 28], [8, 64, 56, 56], [128, 64, 3, 3]])) \
        == 2 * (2 * 8 * 128 * 64 * 9 * 28 * 28)
    assert op_flops("aten::mm", json.dumps([[64, 128]])) is None and op_flops("aten::relu", "[[4]]") is None


def _gemm_trace(path: Path, steps: int = 4) -> float:
    """One H100 rank: each 10 ms step launches one bf16 GEMM of 4096³ (an aten::mm with its Input Dims) that runs
    8 ms, then synchronizes. Returns the model FLOPs per step."""
    ev, t = [], 1000.0
    n = 4096
    for s in range(steps):
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, 10_000.0))
        ev.append(x("cpu_op", "aten::mm", t + 20, 30.0, **{"External id": s + 1, "Input type": ["c10::BFloat16"] * 2,
                                                              "Input Dims": [[n, n], [n, n]]}))
        ev.append(x("cuda_runtime", "cudaLaunchKernel", t + 30, 8.0, correlation=s + 1))
        ev.append(x("kernel", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", t + 100, 8000.0, pid=0, tid=7,
                    stream=7, correlation=s + 1, device=0, **{"External id": s + 1}))
        ev.append(x("cuda_runtime", "cudaDeviceSynchronize", t + 60, 8050.0))
        t += 10_000.0
    doc = {"schemaVersion": 1, "deviceProperties": [H100], "record_shapes": 1,
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
           "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": ev}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return 2.0 * n ** 3


def test_mfu_is_model_flops_over_the_step_against_the_best_dense_peak(tmp_path):
    flops = _gemm_trace(tmp_path / "run" / "rank0.json")
    run = analyze(tmp_path / "run", Options(jobs=1)).model["runs"][0]
    m = run["mfu"]
    assert (m["model_flops_per_step"], m["peak_tflops"], m["peak_dtype"], m["peak_reference"]) == \
        (round(flops), 989, "bf16", "H100")
    # the step without the profiler (estimated: this step is GPU-bound, so about the 10 ms measured)
    assert m["step_source"] == "estimate" and m["step_time_us"] == pytest.approx(10_000.0, rel=0.01)
    assert run["mfu_pct"] == pytest.approx(100 * flops / (m["step_time_us"] / 1e6) / 989e12, abs=0.01)
    assert run["mfu_pct"] == pytest.approx(1.39, abs=0.02)
    # the GEMM's own efficiency while it runs, against its dtype's peak, is another figure under its own name
    assert run["precision"]["matmul_efficiency_pct"] == pytest.approx(100 * flops / 8e-3 / 989e12, abs=0.05)
    assert "mfu_pct" not in run["precision"]


def test_h200_mfu_orders_the_sides_as_their_speed():
    mfu = {s: analyze(shared(f"traces/gpu/h200/precision/{s}"), Options(jobs=1)).model["runs"][0]["mfu_pct"]
           for s in ("slow", "tf32", "fixed")}
    # the same 10.5 TFLOP GPT step: fp32 218 ms, TF32 70 ms, bf16 ~34-39 ms, against 989 TFLOPS
    assert mfu["slow"] == pytest.approx(4.87, abs=0.05)
    assert mfu["slow"] < mfu["tf32"] < mfu["fixed"] and mfu["fixed"] > 5 * mfu["slow"]


def test_the_page_shows_mfu_with_its_flop_source_and_peak(tmp_path):
    from traceanalyze.report import render_html, render_markdown
    from traceanalyze.report.model import mfu_text

    _gemm_trace(tmp_path / "run" / "rank0.json")  # 137 GFLOP per step, ~10 ms, H100
    model = analyze(tmp_path / "run", Options(jobs=1)).model
    run = model["runs"][0]
    line = mfu_text(run)
    assert line == (f"{run['mfu_pct']:.2f} % from op-shape FLOPs (137 GFLOP per rank and step over "
                    f"{run['mfu']['step_time_us'] / 1e3:,.2f} ms without the profiler), peak 989 TFLOPS "
                    "(H100 dense bf16 datasheet)")
    assert f"MFU {line}" in render_markdown(model)
    page = render_html(model)
    assert "<th>MFU (model FLOPs utilization)</th><td>1.39 %" in page
    # the two FLOP figures under names that say what they measure; the count readable, not 137,438,953,472.00
    assert "<td>137 GFLOP</td>" in page and "137,438,953,472" not in page
    assert "GEMM kernels&#39; rate while they run (TFLOPS; aten::mm/addmm/bmm/baddbmm kernels only)" in page


def test_mfu_uses_the_peak_given_on_the_command_line(tmp_path):
    flops = _gemm_trace(tmp_path / "run" / "rank0.json")
    run = analyze(tmp_path / "run", Options(jobs=1, peak_tflops=500.0)).model["runs"][0]
    assert (run["mfu"]["peak_tflops"], run["mfu"]["peak_source"]) == (500.0, "--peak-tflops")
    assert run["mfu_pct"] == pytest.approx(100 * flops / (run["mfu"]["step_time_us"] / 1e6) / 500e12, abs=0.01)


def test_flop_counts_read_in_decimal_units():
    from traceanalyze.fmt import fmt_flop

    assert [fmt_flop(v) for v in (1_867_121_688_576, 82.9e9, 512, 3.2e15, None)] == \
        ["1.87 TFLOP", "82.9 GFLOP", "512 FLOP", "3.20 PFLOP", "—"]
