"""Conv nets on NCHW activations (issue 37 item 3): the precision finding advises channels_last with bf16 autocast,
and the ``bf16_channels_last`` what-if prices both (traceanalyze.replay.precision), on a generated trace whose
arithmetic is worked out here and on the real ResNet-50 pairs of an H100 and an H200 (tests/data/gpu/h100/conv,
tests/data/gpu/h200/conv, truth.json)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.synth import x
from tests.test_whatif_gpu import DGRAD, FPROP, H100, WGRAD, _conv_trace
from traceanalyze import matmath
from traceanalyze.diagnose import confidence
from traceanalyze.hardware import GpuInfo, gpu_peaks
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.replay import graph as gr
from traceanalyze.replay import precision

H100_CONV = Path(__file__).resolve().parent / "data" / "gpu" / "h100" / "conv"
H200_CONV = H100_CONV.parent.parent / "h200" / "conv"  # the same pair recorded on an H200 (tests/data/gpu/h200)
TO_NHWC = ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
           "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float const*, float*)")
TO_NCHW = ("void cudnn::engines_precompiled::nhwcToNchwKernel<float, float, float, true, false, "
           "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nhwc2nchw_params_t<float>, float const*, float*)")
BN = ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, float const*, "
      "cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, "
      "float)")
RELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar("
        "at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator"
        "()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, float)")
SGD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> "
       ">(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
# (kernel, launching op, µs) in stream order: a conv layer's forward and backward on NCHW fp32 tensors, its batch
# norm and in-place ReLU, cuDNN's two layout transposes, and the optimizer's in-place update (under Optimizer.step)
LAYER = ((TO_NHWC, "aten::cudnn_convolution", 200.0), (FPROP, "aten::cudnn_convolution", 3000.0),
         (BN, "aten::cudnn_batch_norm", 800.0), (RELU, "aten::clamp_min_", 400.0),
         (DGRAD, "aten::convolution_backward", 4000.0), (TO_NCHW, "aten::convolution_backward", 300.0),
         (WGRAD, "aten::convolution_backward", 5000.0), (SGD, "aten::add_", 100.0))
CONV_US, TRANSPOSE_US, BN_US, RELU_US = 12_000.0, 500.0, 800.0, 400.0
STEP_US = 15_000.0


def test_layout_of_real_kernel_names():
    assert [matmath.activation_layout(n) for n in (TO_NHWC, TO_NCHW, FPROP, BN, RELU, DGRAD)] == [
        "transpose", "transpose", "nchw", "nchw", None, None]
    assert matmath.activation_layout("void at::native::batch_norm_collect_statistics_channels_last_kernel<at::"
                                     "native::Var, c10::BFloat16, float, 4>(c10::BFloat16 const*)") == "channels_last"
    assert matmath.activation_layout("void at::native::(anonymous namespace)::max_pool_forward_nhwc<c10::BFloat16, "
                                     "int>(c10::BFloat16 const*, int)") == "channels_last"
    # an NHWC tensor-core convolution runs in either layout: its name tells nothing
    assert matmath.activation_layout("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x"
                                     "128x64_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn") is None


def test_nchw_conv_net_is_advised_and_priced_channels_last(tmp_path):
    # one H100 rank, 15 ms steps: LAYER's kernels back to back on one stream (14.3 ms: GPU-bound), fp32 ops, no
    # Input Dims, the optimizer's add_ inside Optimizer.step#SGD.step
    _conv_trace(tmp_path / "rank0.pt.trace.json", layer=LAYER, step_us=STEP_US)
    a = analyze(tmp_path, Options(jobs=1))
    (run,) = a.model["runs"]
    p = run["precision"]
    # steps 0-2 counted: every conv kernel is a convolution; the fprop writes NCHW, the BN runs on NCHW
    assert (p["conv_share_pct"], p["layout"]) == (100.0, "NCHW")
    assert p["layout_us"] == {"nchw": 3 * (3000.0 + BN_US), "transpose": 3 * TRANSPOSE_US}
    by = {w["scenario"]: w for w in run["whatif"]}
    assert {"bf16_matmul", "bf16_channels_last"} <= set(by)

    # the arithmetic: the convolutions at the bf16/fp32 peak ratio / √2 plus casts at 10 % of the time saved (no
    # Input Dims), the same in both; bf16 alone: batch norm and the transposes (kernels of fp32 ops) × 0.75, the
    # in-place ReLU and the optimizer's add_ unchanged; + channels_last: the transposes gone, batch norm and the
    # ReLU (in place, outside Optimizer.step) × 0.5, the optimizer's add_ unchanged
    eff = gpu_peaks(GpuInfo(H100["name"], (9, 0))).ratio("fp32", "bf16") / math.sqrt(2)
    conv_saved = CONV_US * (1 - 1 / eff) * (1 - precision.CAST_SHARE_NO_SHAPES)
    assert conv_saved == pytest.approx(12_000 * (1 - math.sqrt(2) * 67 / 989) * 0.9)
    saved = {"bf16_matmul": conv_saved + (BN_US + TRANSPOSE_US) * (1 - precision.MEMORY_FACTORS[1]),
             "bf16_channels_last": conv_saved + TRANSPOSE_US + (BN_US + RELU_US) * 0.5}
    assert saved["bf16_channels_last"] - saved["bf16_matmul"] == pytest.approx(500 + 600 - 325)
    u = run["profiler_overhead"]["unprofiled_step_time_us"]
    for sc, s in saved.items():
        w = by[sc]
        assert w["saving_us"] == pytest.approx(s, abs=0.01), sc
        assert w["predicted_step_time_us"] == pytest.approx(u - s, abs=0.01), sc
        assert w["reliable"] and "clamped" not in w["assumptions"]
        lo, hi = w["range_us"]
        assert lo < w["predicted_step_time_us"] < hi
    cl = by["bf16_channels_last"]
    assert cl["cause"] == "precision: fp32 matrix math, NCHW activations (conv net)"
    assert cl["assumptions"].startswith("bf16 autocast + channels_last (convolutions 100 % of the fp32 matrix math")
    alone, both = by["bf16_matmul"]["saving_pct"], cl["saving_pct"]
    assert cl["assumptions"].endswith(f"; bf16 alone (bf16_matmul) {alone:.1f} %, + channels_last {both:.1f} %: "
                                      f"channels_last adds {both - alone:.1f} points")
    # "all": bf16 + channels_last does all bf16 alone does (and TF32), so it alone is combined (with no host sync)
    assert by["all"]["saving_us"] >= cl["saving_us"] - 0.01

    # the finding: its impact is the fix it advises, bf16 + channels_last, and it says what each change carries
    (f,) = [f for f in a.model["findings"] if f["kind"] == "fp32_matmul"]
    assert f["impact_pct"] == round(both, 1)
    assert "also convert the model and each input batch to channels_last" in f["recommendation"]
    assert ("convolutions are 100% of matrix-math time and the activations are NCHW: kernels on NCHW tensors 11.4 ms "
            "and cuDNN's NCHW↔NHWC transposes 1.5 ms per rank (kernel names)") in f["evidence"]
    assert f"bf16 alone (what-if bf16_matmul): {alone:.1f}% saved; + channels_last: {both:.1f}%: channels_last adds " \
           f"{both - alone:.1f} points" in " ".join(f["evidence"])
    # its range: the what-if's stated range (diagnose.confidence.saving_range), which holds the precision model's
    rng = f["confidence"]["range_pct"]
    assert rng == cl["confidence"]["range_pct"] == confidence.saving_range(cl, a.model["runs"][0]["confidence_basis"])
    assert rng[0] <= cl["range_saving_pct"][0] and rng[1] >= cl["range_saving_pct"][1]

    # the graph: the classes the rewrite reads
    con = a.con
    run_id = con.execute("SELECT run_id FROM runs WHERE role = 'subject'").fetchone()[0]
    g = gr.build(con, run_id, "gpu", 1)
    names = g.name.to_pylist()
    kern = g.kind == gr.K_KERNEL
    cls = {names[c]: gr.PRECISION_CLASSES[k]
           for c, k in zip(g.name_code[kern].tolist(), g.prec_class[kern].tolist(), strict=True)}
    assert [cls[n] for n, _, _ in LAYER] == ["memory_autocast", "matmul_fp32", "memory_autocast", "memory_in_place",
                                             "matmul_fp32", "memory_autocast", "matmul_fp32", "memory_in_place"]
    in_place = precision.activation_in_place(g)
    assert {names[c] for c in g.name_code[in_place].tolist()} == {RELU}  # the optimizer's add_ stays fp32


def test_a_gpt_is_not_advised_channels_last(tmp_path):
    """fp32 GEMMs, no convolution, no NCHW kernel: bf16 alone, no channels_last (as on the H200 GPT pairs)."""
    ev = []
    ext = 1
    for s in range(4):
        t = 1000.0 + s * 5000.0
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, 5000.0))
        ev.append(x("cpu_op", "aten::mm", t + 20, 30.0, **{"External id": ext, "Input type": ["float", "float"]}))
        ev.append(x("cuda_runtime", "cudaLaunchKernel", t + 30, 8.0, correlation=ext))
        ev.append(x("kernel", "volta_sgemm_128x64_nn", t + 100, 4000.0, pid=0, tid=7, stream=7, correlation=ext,
                    device=0, **{"External id": ext}))
        ev.append(x("cuda_runtime", "cudaDeviceSynchronize", t + 60, 4045.0))
        ext += 1
    doc = {"schemaVersion": 1, "deviceProperties": [H100], "traceEvents": ev,
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(doc))
    m = analyze(tmp_path, Options(jobs=1)).model
    (run,) = m["runs"]
    assert (run["precision"]["conv_share_pct"], run["precision"]["layout"]) == (0.0, None)
    assert {w["scenario"] for w in run["whatif"]} >= {"bf16_matmul"}
    assert "bf16_channels_last" not in {w["scenario"] for w in run["whatif"]}
    (f,) = [f for f in m["findings"] if f["kind"] == "fp32_matmul"]
    assert "channels_last" not in f["recommendation"]


# ---------------------------------------------------------------------------------------------------------
# The real ResNet-50 (batch 128), each measured without the profiler over N steps synced once (truth.json). H100:
# fp32 NCHW 153.4 ms/step; bf16 autocast 60.6 ms (60.5 % saved); bf16 autocast + channels_last 39.8 ms (74.0 %
# saved). H200 (tests/data/gpu/h200, a blind check: recorded after the model was fitted): 145.6, 55.3 (62.0 %) and
# 33.2 ms (77.2 %).
CONV = {"h100": H100_CONV, "h200": H200_CONV}


def _truth_saving(gpu: str, side: str) -> float:
    truth = json.loads((CONV[gpu].parent / "truth.json").read_text())["pairs"]["conv"]

    def ms(s: str) -> float:
        return sum(r["wall_ms_per_step_mean"] for r in truth[s].values()) / len(truth[s])

    return 100 * (1 - ms(side) / ms("slow"))


@pytest.mark.parametrize(("gpu", "side", "bf16", "both", "share", "measured"), [
    ("h100", "slow", 61.95, 66.25, 90.7, (60.5, 74.0)), ("h100", "slow_sync", 65.37, 71.5, 90.7, (60.5, 74.0)),
    ("h200", "slow", 68.71, 76.76, 90.65, (62.0, 77.2)), ("h200", "slow_sync", 68.63, 76.71, 90.67, (62.0, 77.2))])
def test_real_resnet50_bf16_and_channels_last(gpu, side, bf16, both, share, measured):
    assert _truth_saving(gpu, "bf16") == pytest.approx(measured[0], abs=0.05)
    assert _truth_saving(gpu, "fixed") == pytest.approx(measured[1], abs=0.05)
    m = analyze(CONV[gpu] / side, Options(jobs=1)).model
    (run,) = m["runs"]
    p = run["precision"]
    assert p["layout"] == "NCHW" and p["conv_share_pct"] == pytest.approx(share, abs=0.1)
    by = {w["scenario"]: w for w in run["whatif"]}
    assert by["bf16_matmul"]["saving_pct"] == pytest.approx(bf16, abs=0.1)
    assert by["bf16_channels_last"]["saving_pct"] == pytest.approx(both, abs=0.1)
    assert by["bf16_channels_last"]["saving_pct"] > by["bf16_matmul"]["saving_pct"]
    # within 10 points of the measured savings (H200: bf16 alone +6.7 and +6.6 points, with channels_last -0.5)
    assert abs(bf16 - measured[0]) < 10 and abs(both - measured[1]) < 10
    (f,) = [f for f in m["findings"] if f["kind"] == "fp32_matmul"]
    assert f["impact_pct"] == pytest.approx(both, abs=0.1) and f["main"]
    assert "channels_last" in f["recommendation"]
    assert any(e.startswith(f"bf16 alone (what-if bf16_matmul): {bf16:.1f}% saved; + channels_last: {both:.1f}%")
               for e in f["evidence"])


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_real_bf16_and_channels_last_sides(gpu):
    """The bf16 NCHW side is read as NCHW but has no fp32 math left to price; the fixed side is channels_last."""
    bf16 = analyze(CONV[gpu] / "bf16", Options(jobs=1)).model["runs"][0]
    assert bf16["precision"]["layout"] == "NCHW"
    assert not {"bf16_matmul", "bf16_channels_last"} & {w["scenario"] for w in bf16["whatif"]}
    fixed = analyze(CONV[gpu] / "fixed", Options(jobs=1)).model["runs"][0]
    assert fixed["precision"]["layout"] == "channels_last"
    assert fixed["precision"]["layout_us"].keys() == {"channels_last"}


@pytest.mark.parametrize(("gpu", "baseline", "scenario", "predicted", "measured", "why", "priced"), [
    ("h100", "fixed", "bf16_channels_last", 66.34, 69.9,
     "matrix math in fp32 here, bf16 in the baseline; activations NCHW here, channels_last in the baseline",
     "the baseline's matrix math (conv 19.76×, gemm 2.26× faster in bf16)"),
    ("h100", "bf16", "bf16_matmul", 61.85, 60.5, "matrix math in fp32 here, bf16 in the baseline",
     "the baseline's matrix math (conv 17.09×, gemm 1.82× faster in bf16)"),
    ("h200", "fixed", "bf16_channels_last", 78.16, 77.19,
     "matrix math in fp32 here, bf16 in the baseline; activations NCHW here, channels_last in the baseline",
     "the baseline's matrix math (conv 20.68×, gemm 2.90× faster in bf16)"),
    ("h200", "bf16", "bf16_matmul", 68.88, 61.48, "matrix math in fp32 here, bf16 in the baseline",
     "the baseline's matrix math (conv 17.71×, gemm 2.21× faster in bf16)")])
def test_real_comparison_checks_the_fix_the_baseline_made(gpu, baseline, scenario, predicted, measured, why, priced):
    """Against each fixed side the comparison checks the what-if of what that side changed (the measured saving is
    on both sides' step without the profiler as their traces estimate it: the fixed side's loop synced each step).
    The what-if is priced with the baseline's measured speed-up per kernel family (fp32 µs per rank and counted
    step here over bf16 there: on the H100 conv 97.37 ms / 4.93 ms = 19.76× against channels_last, / 5.70 ms =
    17.09× against NCHW bf16; within 1–1.5 × the H100's 14.8× bf16/fp32 peak ratio); before it the model's ratio/√2
    gave 66.25 and 61.95 %."""
    conv = CONV[gpu]
    m = analyze(conv / "slow", Options(baseline=conv / baseline, jobs=1)).model
    (chk,) = m["comparison"]["whatif_check"]
    assert (chk["scenario"], chk["why"]) == (scenario, why)
    assert chk["predicted_saving_pct"] == pytest.approx(predicted, abs=0.01)
    assert chk["priced_from"] == priced
    # the other precision switch is not the baseline's: the model prices it
    others = {"bf16_matmul", "bf16_channels_last"} - {scenario}
    other = next(w for w in m["runs"][0]["whatif"] if w["scenario"] in others)
    assert "priced_from" not in other
    assert chk["measured_saving_pct"] == pytest.approx(measured, abs=0.1)
