"""Issue 40 (item 1): the ``fused_optimizer`` what-if (traceanalyze.replay.optimizer). An optimizer that loops over
its parameters (``foreach=False``) is re-timed as PyTorch's fused one: its per-parameter launches become the
``multi_tensor_apply`` launches of the fused kernel, its kernels the time their bytes take at HBM bandwidth. On a
generated AdamW step whose arithmetic is worked out here, and on the real H100 pair (tests/data/gpu/h100/optimizer:
``AdamW(foreach=False)`` 36.0 ms a step, ``fused=True`` 25.7 ms, 28.6 % saved; truth.json), and the same pair
recorded on an H200 (tests/data/gpu/h200/optimizer, a blind check: 34.1 ms, fused 22.4 ms, 34.2 % saved)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.synth import x
from tests.test_whatif_gpu import H100, _write
from traceanalyze.hardware import GpuInfo, gpu_peaks
from traceanalyze.metrics.steps import median
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.replay import graph as gr
from traceanalyze.replay import optimizer, simulate

H100_OPT = Path(__file__).resolve().parent / "data" / "gpu" / "h100" / "optimizer"
H200_OPT = H100_OPT.parents[1] / "h200" / "optimizer"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float> >"
# torch.optim.AdamW(foreach=False), _single_tensor_adamw: per parameter, the ops that launch a kernel (the step
# counter's add_ is a CPU tensor's) and how many Input Dims entries each records (record_shapes): param.mul_(1 - lr
# wd), exp_avg.lerp_(grad), exp_avg_sq.mul_(beta2).addcmul_(grad, grad), denom = exp_avg_sq.sqrt() / bc2, .add_(eps),
# param.addcdiv_(exp_avg, denom)
ADAMW_OPS = (("aten::mul_", 2), ("aten::lerp_", 3), ("aten::mul_", 2), ("aten::addcmul_", 4), ("aten::sqrt", 1),
             ("aten::div", 2), ("aten::add_", 3), ("aten::addcdiv_", 4))
WEIGHT, BIAS = [1024, 1024], [1024]  # 40 parameters: 20 weights and their 20 biases, interleaved
STEP_US = 7000.0


def _adamw_job(path: Path, steps: int = 5) -> None:
    """One H100 rank, ``steps`` profiler steps of 7 ms: a 100 µs GEMM, then ``Optimizer.step#AdamW.step`` from
    +150 µs: 200 µs before its first op (``_init_group``), then 40 parameters × the 8 ops of ADAMW_OPS, one every
    20 µs, each a 10 µs op whose cudaLaunchKernel (5 µs) starts 2 µs in; each kernel starts 3 µs after its launch
    call and takes 5 µs (a weight's) or 2 µs (a bias's); the range ends 111 µs after the last launch call, the step
    261 µs after it (the GPU idle: no sync)."""
    ev, ext, t = [], 1, 1000.0
    for s in range(steps):
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, STEP_US))
        ev.append(x("cpu_op", "aten::linear", t + 10, 20.0, **{"External id": ext, "Input type": ["c10::BFloat16"],
                                                                 "Input Dims": [[64, 1024], [1024, 1024], [1024]]}))
        ev.append(x("cuda_runtime", "cudaLaunchKernel", t + 12, 5.0, correlation=ext, **{"External id": ext}))
        ev.append(x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", t + 20, 100.0, pid=0, tid=7, stream=7,
                    correlation=ext, device=0, **{"External id": ext}))
        ext += 1
        ev.append(x("user_annotation", "Optimizer.step#AdamW.step", t + 150, 6700.0))
        j = 0
        for p in range(40):
            dims = WEIGHT if p % 2 == 0 else BIAS
            for op, shapes in ADAMW_OPS:
                h = t + 350 + 20 * j
                ev.append(x("cpu_op", op, h, 10.0, **{"External id": ext, "Input type": ["float"] * shapes,
                                                      "Input Dims": [dims] + [[]] * (shapes - 1)}))
                ev.append(x("cuda_runtime", "cudaLaunchKernel", h + 2, 5.0, correlation=ext, **{"External id": ext}))
                ev.append(x("kernel", ELEMENTWISE, h + 10, 5.0 if dims is WEIGHT else 2.0, pid=0, tid=7, stream=7,
                            correlation=ext, device=0, **{"External id": ext}))
                ext, j = ext + 1, j + 1
        t += STEP_US
    _write(path, ev, [H100])


def test_multi_tensor_apply_launches_as_pytorch_chunks_them():
    # MultiTensorApply.cuh, 4 KB kernel arguments: a launch holds at most 36 tensors at depth 4 (110 at depth 1) and
    # 320 blocks of 65,536 elements; a tensor whose chunks do not fit carries over
    assert optimizer.fused_launches([1024 * 1024, 1024] * 20, 4) == 2  # 36 tensors (306 blocks), then 4 (34)
    assert optimizer.fused_launches([1] * 80, 4) == 3  # ⌈80 / 36⌉
    assert optimizer.fused_launches([1] * 101, 1) == 1 and optimizer.fused_launches([1] * 162, 1) == 2
    assert optimizer.fused_launches([65_536 * 400], 4) == 2  # 400 chunks: 320 blocks, then 80
    assert optimizer.fused_launches([0, 0], 4) == 0


def test_a_foreach_false_adamw_step_is_priced_as_the_fused_kernel(tmp_path):
    _adamw_job(tmp_path / "rank0.pt.trace.json")
    a = analyze(tmp_path, Options(jobs=1))
    (run,) = a.model["runs"]
    w = next(w for w in run["whatif"] if w["scenario"] == "fused_optimizer")
    assert w["cause"] == "config: an optimizer that launches kernels per parameter (foreach=False)"
    # the host: the loop after the first launch call goes, launch calls 2-320 and the 15 µs gaps before them, each
    # gap less the profiler's cost of its events (an op 2.0 µs, its shapes 0.5 each, the call 4.0; 6 + 21 × 0.5
    # = 58.5 µs a parameter, 7 µs of it the first mul_'s): 319 × (15 + 5) − (40 × 58.5 − 7) = 4,047 µs; the first
    # launch call becomes 3 at the median launch call, 5 µs (2 multi_tensor_apply launches for the 40 tensors, 1
    # for their step counters): 4,047 + 5 − 15 = 4,037 µs saved of each step, which is the host's (no sync)
    assert w["saving_us"] == pytest.approx(319 * (15 + 5) - (40 * (8 * 6 + 21 * 0.5) - 7) + 5 - 3 * 5)
    assert w["saving_us"] == pytest.approx(4037.0)
    u = run["profiler_overhead"]["unprofiled_step_time_us"]
    assert w["predicted_step_time_us"] == pytest.approx(u - 4037.0, abs=0.01)
    assert w["saving_pct"] == pytest.approx(100 * 4037.0 / u, abs=0.01)
    assert w["reliable"] and "clamped" not in w["assumptions"]
    elements = 20 * 1024 * 1024 + 20 * 1024
    assert elements == 20_992_000
    assert w["assumptions"].startswith("fused AdamW (fused=True): the per-parameter loop under Optimizer.step (320 "
                                       "kernels per step, launched one by one) becomes 3 launch(es) per step at the "
                                       "run's median launch call (5.0 µs): 40 parameter tensors")
    # the GPU: 28 bytes per element (AdamW reads param, grad, exp_avg, exp_avg_sq and writes three of them) at 80 %
    # of the H100's 3,350 GB/s: 20,992,000 × 28 / 2,680,000 = 219.3 µs for the 1,120 µs of per-parameter kernels
    fused_us = elements * 28 / (3350e3 * 0.8)
    assert fused_us == pytest.approx(219.32, abs=0.01)
    assert "scaled together to 0.219 ms: 21.0 M elements × 28 bytes (4 tensors read, 3 written, 4 bytes per " \
           "element) at 80% of 3,350 GB/s (H100)" in w["assumptions"]

    run_id = run["run_id"]
    g = gr.build(a.con, run_id, "gpu", 1)
    oc = optimizer.context(a.con, g, gpu_peaks(GpuInfo(H100["name"], (9, 0))))
    assert (oc["applies"], oc["optimizer"], oc["tensors"], oc["elements"], oc["launches_fused"]) == (
        True, "AdamW", 40, elements, 3)
    assert oc["kernels_per_step"] == 320 and oc["fused_us"] == pytest.approx(fused_us)
    d, cg = optimizer.rewrite(g, g.chain_dur, g.chain_gap, oc)
    k = oc["kernels"]
    in_step = g.step[k] == 1
    assert g.chain_dur[k][in_step].sum() == pytest.approx(20 * 8 * 5.0 + 20 * 8 * 2.0)  # 1,120 µs measured
    assert d[k][in_step].sum() == pytest.approx(fused_us)
    gemm = np.flatnonzero((g.kind == gr.K_KERNEL) & ~np.isin(np.arange(g.start.size), k))
    assert (d[gemm] == g.chain_dur[gemm]).all()  # the forward's kernel unchanged

    # the finding takes its impact from the what-if
    (f,) = [f for f in a.model["findings"] if f["kind"] == "host_optimizer"]
    assert f["impact_pct"] == round(w["saving_pct"], 1) and "whatif_missing" not in f


def test_the_fused_model_prices_only_a_per_parameter_loop(tmp_path):
    # a fused (multi-tensor) optimizer kernel already: no fused_optimizer row, the replay says why
    _adamw_job(tmp_path / "a" / "rank0.pt.trace.json", steps=3)
    doc = json.loads((tmp_path / "a" / "rank0.pt.trace.json").read_text())
    for e in doc["traceEvents"]:
        if e["name"] == ELEMENTWISE:
            e["name"] = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<>"
    (tmp_path / "a" / "rank0.pt.trace.json").write_text(json.dumps(doc))
    a = analyze(tmp_path / "a", Options(jobs=1))
    g = gr.build(a.con, a.model["runs"][0]["run_id"], "gpu", 1)
    assert optimizer.per_parameter(a.con, g) == {"applies": False, "why": "the optimizer already launches "
                                                 "multi-tensor or fused kernels (foreach or fused)"}
    assert "fused_optimizer" not in {w["scenario"] for w in a.model["runs"][0]["whatif"]}


def _truth_saving(side: str, opt: Path = H100_OPT) -> float:
    """1 − fixed / slow on the mean of the repetitions' unprofiled wall time per step (truth.json), %."""
    pairs = json.loads((opt.parent / "truth.json").read_text())["pairs"]["optimizer"]

    def ms(s: str) -> float:
        return sum(r["wall_ms_per_step_mean"] for r in pairs[s].values()) / len(pairs[s])
    return 100 * (1 - ms(side) / ms("slow"))


def _rewritten_step_us(a, run_id: int, gpu: str) -> float:
    """The median of counted steps 4-6 replayed with the fused rewrite on the profiled graph (µs)."""
    g = gr.build(a.con, run_id, "gpu", 1)
    oc = optimizer.context(a.con, g, gpu_peaks(GpuInfo(gpu, (9, 0))))
    d, cg = optimizer.rewrite(g, g.chain_dur, g.chain_gap, oc)
    t = simulate.replay(g, d, cg, g.inst_transfer).step_times(g)
    return median(v for (_, s), v in t.items() if s in (4, 5, 6))


def _fused_kernels_per_step(con) -> tuple:
    """(multi_tensor_apply kernels, their µs) per step of the 4 traced steps."""
    return con.execute("""
        SELECT count(*) / 4, sum(k.dur_ns) / 4e3 FROM kernels k JOIN cpu_ops c
          ON c.file_id = k.file_id AND c.correlation = k.correlation AND c.cat = 'cuda_runtime'
        WHERE k.name LIKE '%multi_tensor_apply_kernel%'""").fetchone()


def test_real_h100_foreach_false_adamw_against_fused():
    # 1 − 25.72 / 36.03 and 1 − 28.30 / 36.03 (the README's 21.4 % is of the rounded 28.3 and 36.0 ms)
    assert round(_truth_saving("fixed"), 1) == 28.6 and round(_truth_saving("foreach"), 2) == 21.46
    a = analyze(H100_OPT / "slow", Options(jobs=1))
    (run,) = a.model["runs"]
    w = next(w for w in run["whatif"] if w["scenario"] == "fused_optimizer")
    # predicted 42.3 % against the 28.6 % measured (fused=True: 36.0 → 25.7 ms a step, truth.json): +13.7 points.
    # The model itself holds on the profiled steps: the slow side's replay with the rewrite gives 33.4 ms against
    # the fused side's profiled 32.6 ms, its 5 launches are the fused side's 5 kernels and its 0.607 ms of kernels
    # their 0.614 ms. The miss is the step without the profiler: the loop's 1,509 ops and 807 launch calls per step
    # lose 8.6 ms of profiler cost (2.0 µs an op, 4.0 a call, 0.5 a shape), 23.2 → 14.6 ms, where the pair implies
    # 10.5-11.4 ms; and the slow side drifts (its unprofiled steps 26.3, 40.0 and 39.6 ms; walls 28.9-43.7 ms)
    assert round(w["saving_pct"], 1) == 42.3
    assert "(808 kernels per step, launched one by one) becomes 5 launch(es) per step at the run's median launch " \
           "call (7.3 µs): 101 parameter tensors" in w["assumptions"]
    assert "0.607 ms: 58.1 M elements × 28 bytes" in w["assumptions"]
    (f,) = [f for f in a.model["findings"] if f["kind"] == "host_optimizer"]
    assert (f["impact_pct"], f["part_of"]) == (42.3, "launch_bound")  # inside CUDA graphs' 67.2 %
    p = optimizer.params(a.con, run["run_id"])
    assert (p["optimizer"], p["tensors"], sum(p["numels"])) == ("AdamW", 101, 58_119_168)
    assert optimizer.fused_launches(p["numels"], 4) == 4  # the fused side's 320 + 160 + 168 + 304 blocks
    # the rewrite on the profiled graph: the median counted step replays at 33.4 ms, the fused side's profiled steps
    # take 32.6 ms (median of 32.5, 31.5, 36.6 ms, steps 4-6)
    assert _rewritten_step_us(a, run["run_id"], "NVIDIA H100 80GB HBM3") == pytest.approx(33_409, abs=1)

    fixed = analyze(H100_OPT / "fixed", Options(jobs=1))
    assert "fused_optimizer" not in {w["scenario"] for w in fixed.model["runs"][0]["whatif"]}
    # the fused side's multi_tensor_apply kernels per step: the step counters' add, then 4 of _fused_adamw_
    per_step = _fused_kernels_per_step(fixed.con)
    assert per_step[0] == 5 and per_step[1] == pytest.approx(613.9, abs=0.5)


def test_real_h100_comparison_checks_the_fused_optimizer():
    """Against the fused side the comparison checks fused_optimizer: the host_optimizer finding is gone there (the
    launch-bound one stays, 61 % of the step: not checked). Measured on both sides' unprofiled steps as captured
    (39.58 → 27.50 ms: 30.5 %)."""
    m = analyze(H100_OPT / "slow", Options(baseline=H100_OPT / "fixed", jobs=1)).model
    (chk,) = m["comparison"]["whatif_check"]
    assert (chk["scenario"], chk["why"]) == ("fused_optimizer", "host_optimizer finding here, none in the baseline")
    assert (chk["basis"], chk["basis_source"]) == ("unprofiled", {"subject": "capture", "baseline": "capture"})
    assert chk["predicted_saving_pct"] == pytest.approx(42.34, abs=0.01)
    assert chk["measured_saving_pct"] == pytest.approx(100 * (1 - 27_502.0 / 39_581.9), abs=0.01)


def test_real_h200_foreach_false_adamw_against_fused():
    """The H200 pair (three repetitions: slow 36.49, 32.49, 33.31 ms a step; fused 23.05, 22.85, 21.39 ms): predicted
    33.66 % against 34.22 % measured. The rewrite on the profiled graph replays the median counted step at 43.3 ms
    where the fused side's profiled step takes 32.9 ms (benchmarks/gpu_pairs.py): the saving holds on the step
    without the profiler, not on the profiled one as on the H100."""
    assert round(_truth_saving("fixed", H200_OPT), 2) == 34.22 and round(_truth_saving("foreach", H200_OPT), 2) == 27.70
    a = analyze(H200_OPT / "slow", Options(jobs=1))
    (run,) = a.model["runs"]
    w = next(w for w in run["whatif"] if w["scenario"] == "fused_optimizer")
    assert w["saving_pct"] == pytest.approx(33.66, abs=0.01)
    assert "(808 kernels per step, launched one by one) becomes 5 launch(es) per step at the run's median launch " \
           "call (7.4 µs): 101 parameter tensors" in w["assumptions"]
    # 58,119,168 × 28 bytes at 80 % of the H200's 4,800 GB/s: 423.8 µs
    assert "0.424 ms: 58.1 M elements × 28 bytes (4 tensors read, 3 written, 4 bytes per element) at 80% of " \
           "4,800 GB/s (H200)" in w["assumptions"]
    (f,) = [f for f in a.model["findings"] if f["kind"] == "host_optimizer"]
    assert (f["impact_pct"], f["part_of"], f["severity"]) == (33.7, "launch_bound", "high")  # inside 77.7 %
    p = optimizer.params(a.con, run["run_id"])
    assert (p["optimizer"], p["tensors"], sum(p["numels"])) == ("AdamW", 101, 58_119_168)
    assert _rewritten_step_us(a, run["run_id"], "NVIDIA H200") == pytest.approx(43_313, abs=1)

    fixed = analyze(H200_OPT / "fixed", Options(jobs=1))
    assert "fused_optimizer" not in {w["scenario"] for w in fixed.model["runs"][0]["whatif"]}
    assert not [f for f in fixed.model["findings"] if f["kind"] == "host_optimizer"]
    per_step = _fused_kernels_per_step(fixed.con)
    assert per_step[0] == 5 and per_step[1] == pytest.approx(465.6, abs=0.5)


@pytest.mark.xfail(strict=True, reason=(
    "known miss on the H200 (blind check): against the fused side the comparison checks no_launch_overhead, not "
    "fused_optimizer: the fused side's launch_bound finding (57.4 %, 18.9 ms a step) costs under half the slow "
    "side's (77.7 %, 50.9 ms), so the CUDA-graph what-if is checked (77.73 % predicted against 43.67 % measured on "
    "the captured unprofiled steps) and fused_optimizer, part of it, is dropped"))
def test_real_h200_comparison_checks_the_fused_optimizer():
    m = analyze(H200_OPT / "slow", Options(baseline=H200_OPT / "fixed", jobs=1)).model
    (chk,) = m["comparison"]["whatif_check"]
    assert (chk["scenario"], chk["why"]) == ("fused_optimizer", "host_optimizer finding here, none in the baseline")
