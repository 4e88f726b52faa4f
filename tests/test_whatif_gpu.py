"""GPU what-ifs: the precision what-ifs re-time fp32 convolutions by the GPU's peak ratios, and no what-if predicts a
step shorter than the busy time of the kernels it leaves (traceanalyze.replay.floors.step_floors), on generated traces
and on the real GPU-bound fp32 GPT (../shared/traces/gpu/h200/precision/slow)."""

from __future__ import annotations

import gzip
import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import shared
from tests.synth import x
from traceanalyze import matmath
from traceanalyze.hardware import GPU_SPECS, GpuInfo, gpu_peaks
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.replay import graph as gr
from traceanalyze.replay import precision

H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0}
FPROP = ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nchw_tilesize128x128x8_stage3_warpsize2x2x1_g1_"
         "ffma_aligna4_alignc4_execute_kernel_cudnn")
DGRAD = ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, float "
         "const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, int, int, "
         "int)")
WGRAD = ("void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, int, float*, "
         "float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)")
# (kernel, launching op, µs): one conv forward and its backward per step, 12 ms of fp32 convolution
CONV = ((FPROP, "aten::cudnn_convolution", 3000.0), (DGRAD, "aten::convolution_backward", 4000.0),
        (WGRAD, "aten::convolution_backward", 5000.0))
CONV_US = sum(d for _, _, d in CONV)
STEP_US = 13_000.0


def _write(path: Path, events: list[dict], props: list) -> None:
    doc = {"schemaVersion": 1, "deviceProperties": props,
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
           "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _conv_trace(path: Path, steps: int = 4, layer: tuple = CONV, step_us: float = STEP_US) -> None:
    """One H100 rank, ``steps`` profiler steps of ``step_us`` (13 ms): the host launches ``layer``'s kernels (the
    three fp32 cuDNN convolution kernels: ``Input type`` float, no ``Input Dims``) 50 µs apart, an ``aten::add_``
    inside ``Optimizer.step#SGD.step``; they run back to back on stream 7 from +100 µs, and a cudaDeviceSynchronize
    returns 5 µs after the last one; the GPU is busy 12 of the 13 ms."""
    ev, ext, t = [], 1, 1000.0
    for s in range(steps):
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, step_us))
        h, k = t + 20.0, t + 100.0
        for name, op, dur in layer:
            if op == "aten::add_":
                ev.append(x("user_annotation", "Optimizer.step#SGD.step", h - 5.0, 40.0))
            ev.append(x("cpu_op", op, h, 30.0, **{"External id": ext, "Input type": ["float", "float", ""]}))
            ev.append(x("cuda_runtime", "cudaLaunchKernel", h + 10, 8.0, correlation=ext))
            ev.append(x("kernel", name, k, dur, pid=0, tid=7, stream=7, correlation=ext, device=0,
                        **{"External id": ext}))
            ext, h, k = ext + 1, h + 50.0, k + dur
        ev.append(x("cuda_runtime", "cudaDeviceSynchronize", h, k + 5.0 - h))
        t += step_us
    _write(path, ev, [H100])


def test_bf16_and_tf32_whatifs_move_fp32_convolutions(tmp_path):
    _conv_trace(tmp_path / "rank0.pt.trace.json")
    a = analyze(tmp_path, Options(jobs=1))
    (run,) = a.model["runs"]
    con = a.con
    assert (run["gpu_model"], run["gpu_capability"]) == ("NVIDIA H100 80GB HBM3", "sm90")
    # every convolution kernel is fp32 matrix math on CUDA cores, by its name; steps 0-2 counted
    assert [(m["label"], m["time_us"], m["pct"]) for m in run["dtype_mix"]] == [
        ("fp32 on CUDA cores", 3 * CONV_US, 100.0)]
    assert {matmath.kernel_family(n) for n, _, _ in CONV} == {"conv"}
    by = {w["scenario"]: w for w in run["whatif"]}
    assert {"tf32_matmul", "bf16_matmul"} <= set(by)

    # the model, from the peak table and the precision module's constants: each fp32 kernel at ratio/√2 of its
    # time (point estimate), bf16 adding back casts at CAST_SHARE_NO_SHAPES of the saved time (no Input Dims)
    spec = dict(GPU_SPECS)["H100"]
    peaks = gpu_peaks(GpuInfo("NVIDIA H100 80GB HBM3", (9, 0)))
    assert peaks.reference == "H100" and not peaks.assumed
    eff_bf16 = spec["bf16"] / spec["fp32"] / math.sqrt(2)
    eff_tf32 = spec["tf32"] / spec["fp32"] / math.sqrt(2)
    assert eff_bf16 == pytest.approx(peaks.ratio("fp32", "bf16") / math.sqrt(2))
    saved_bf16 = CONV_US * (1 - 1 / eff_bf16) * (1 - precision.CAST_SHARE_NO_SHAPES)
    saved_tf32 = CONV_US * (1 - 1 / eff_tf32)
    assert saved_bf16 == pytest.approx(CONV_US * (1 - math.sqrt(2) * 67 / 989) * 0.9)
    po = run["profiler_overhead"]
    u = po["unprofiled_step_time_us"]
    assert po["profiled_step_time_us"] == STEP_US and u <= STEP_US
    for sc, saved in (("bf16_matmul", saved_bf16), ("tf32_matmul", saved_tf32)):
        w = by[sc]
        assert w["saving_us"] == pytest.approx(saved, abs=0.01), sc
        assert w["predicted_step_time_us"] == pytest.approx(u - saved, abs=0.01), sc
        assert w["saving_pct"] == pytest.approx(100 * saved / u, abs=0.01), sc
        assert w["reliable"] and "clamped" not in w["assumptions"]
        lo, hi = w["range_us"]
        assert lo < w["predicted_step_time_us"] < hi
    assert "14.8×" in by["bf16_matmul"]["assumptions"] and "7.4×" in by["tf32_matmul"]["assumptions"]
    assert "casts at 10% of the time saved (no Input Dims)" in by["bf16_matmul"]["assumptions"]

    # the sim tables: the conv kernels are graph tasks at their measured times; each step's replay under the
    # rewrite is the predicted step (the GPU-bound step shrinks by the kernels' saving)
    kernels = con.execute("SELECT name, dur_us FROM sim_task WHERE kind = 'kernel' AND step = 1 "
                          "ORDER BY start_us").fetchall()
    assert kernels == [(n, d) for n, _, d in CONV]
    rows = con.execute("SELECT scenario, step, measured_us, replayed_us FROM sim_result WHERE scenario IN "
                       "('replay', 'bf16_matmul', 'tf32_matmul') ORDER BY 1, 2").fetchall()
    for sc, _step, measured, replayed in rows:
        assert measured == STEP_US
        want = {"replay": STEP_US, "bf16_matmul": u - saved_bf16, "tf32_matmul": u - saved_tf32}[sc]
        assert replayed == pytest.approx(want, abs=0.01), sc

    # the rewrite itself: every conv kernel is class matmul_fp32 and re-timed by the model
    run_id = con.execute("SELECT run_id FROM runs WHERE role = 'subject'").fetchone()[0]
    g = gr.build(con, run_id, "gpu", 1)
    kern = g.kind == gr.K_KERNEL
    assert {gr.PRECISION_CLASSES[c] for c in g.prec_class[kern]} == {"matmul_fp32"}
    pc = precision.context(con, g, GpuInfo("NVIDIA H100 80GB HBM3", (9, 0)))
    assert pc["bf16"] == "bf16" and pc["tf32"] == "tf32" and pc["cast_frac"] is None
    d = g.dur
    bf = precision.rewrite(g, d, pc, precision.Fix("bf16"))
    tf = precision.rewrite(g, d, pc, precision.Fix("tf32"))
    new = d[kern] / eff_bf16
    assert bf[kern] == pytest.approx(new + (d[kern] - new) * precision.CAST_SHARE_NO_SHAPES)
    assert tf[kern] == pytest.approx(d[kern] / eff_tf32)
    assert (bf[~kern] == d[~kern]).all() and (tf[~kern] == d[~kern]).all()

    # a precision finding, priced by the bf16 what-if: no "healthy" verdict
    f = {f["kind"]: f for f in run["findings"]}
    assert f["fp32_matmul"]["impact_pct"] == round(by["bf16_matmul"]["saving_pct"], 1)
    assert f["fp32_matmul"]["severity"] in ("high", "medium")
    assert not a.model["verdict"].startswith("No significant slowdown found")


# --- the floor: no what-if predicts a step shorter than the kernels it leaves ---------------------------------

SGEMM = "volta_sgemm_128x64_nn"  # fp32 GEMM on CUDA cores, by its name
NVJET = "nvjet_sm90_tst_64x128_64x8_2x1_v_bz_NTN"  # a GEMM whose dtype comes from its op (float: fp32)
ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
               "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
KERNELS = ((SGEMM, "aten::mm"), (NVJET, "aten::mm"), (ELEMENTWISE, "aten::add"))
UNTOUCHED = ("no_launch_overhead", "no_dataloader_wait", "no_compile", "no_straggler", "ideal_interconnect")

_kernel = st.tuples(st.sampled_from(range(len(KERNELS))), st.floats(3.0, 3000.0), st.floats(0.0, 400.0),
                    st.sampled_from((7, 7, 20)), st.floats(3.0, 60.0))
_step = st.tuples(st.lists(_kernel, min_size=1, max_size=5), st.floats(0.0, 3000.0), st.booleans(),
                  st.floats(5.0, 800.0))


def _gen_trace(path: Path, steps: list) -> dict[int, list[tuple[int, str, float]]]:
    """One H100 rank from ``steps``: per step (kernels, data-loader µs, synchronize at the end, tail µs), each
    kernel (kind, µs, host gap before its launch, stream, launch latency). The host waits in a DataLoader range,
    then per kernel: its op and a cudaLaunchKernel after the gap; the kernel starts after the latency and its
    stream's previous kernel. The step ends ``tail`` µs after the last launch, or after a cudaDeviceSynchronize
    that returns once every kernel is done. Returns step -> [(stream, kernel name, µs)] by launch."""
    ev, ext, t, out = [], 1, 1000.0, {}
    free = {7: 0.0, 20: 0.0}
    for s, (kernels, dl, sync, tail) in enumerate(steps):
        body, h = [], t + 10.0
        if dl > 0:
            body.append(x("cpu_op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", h, dl))
            h += dl + 5.0
        for kind, dur, gap, stream, lat in kernels:
            name, op = KERNELS[kind]
            h += gap
            body.append(x("cpu_op", op, h, 20.0, **{"External id": ext, "Input type": ["float", "float"]}))
            body.append(x("cuda_runtime", "cudaLaunchKernel", h + 5.0, 6.0, correlation=ext))
            k = max(h + 5.0 + lat, free[stream])
            body.append(x("kernel", name, k, dur, pid=0, tid=stream, stream=stream, correlation=ext, device=0,
                          **{"External id": ext}))
            free[stream] = k + dur + 1.0
            out.setdefault(s, []).append((stream, name, dur))
            ext, h = ext + 1, h + 25.0
        if sync:
            done = max(h, *free.values()) + 3.0
            body.append(x("cuda_runtime", "cudaDeviceSynchronize", h, done - h))
            h = done
        end = h + tail
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, end - t))
        ev += body
        t = end + 1.0
    _write(path, ev, [H100])
    return out


def _busy_floor(kernels: list[tuple[int, str, float]], scenario: str) -> float:
    """A lower bound of the busiest stream's kernel time in a step after ``scenario``'s rewrite: measured for the
    what-ifs that leave kernels alone; for the precision ones every fp32 GEMM at most ratio/√2 faster (H100 peaks)
    and, under bf16, every other kernel at most MEMORY_FACTORS[1] of its time."""
    peaks = gpu_peaks(GpuInfo(H100["name"], (9, 0)))
    busy: dict[int, float] = {}
    for stream, name, dur in kernels:
        if scenario in UNTOUCHED:
            d = dur
        elif matmath.kernel_family(name):
            d = dur * math.sqrt(2) / peaks.ratio("fp32", "tf32" if scenario == "tf32_matmul" else "bf16")
        else:
            d = dur * (1.0 if scenario == "tf32_matmul" else precision.MEMORY_FACTORS[1])
        busy[stream] = busy.get(stream, 0.0) + d
    return max(busy.values())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_step, min_size=3, max_size=5))
def test_no_whatif_below_the_kernel_busy_time(tmp_path_factory, steps):
    """Per counted step a prediction is never below min(its kernel floor, the measured step) (``step_floors``, capped
    at the step's estimate); the run's prediction is the median over steps, and the median is monotone."""
    folder = tmp_path_factory.mktemp("gen")
    per_step = _gen_trace(folder / "rank0.pt.trace.json", steps)
    a = analyze(folder, Options(jobs=1))
    (run,) = a.model["runs"]
    measured = {r["step"]: r["step_time_us"] for r in run["steps"]}
    assert measured, "no counted step"
    for w in run["whatif"]:
        # "all" holds the bf16 rewrite whenever it applies, its row shown or not (a host-bound step saves < 1 µs)
        sc = "bf16_matmul" if w["scenario"] == "all" else w["scenario"]
        floor = statistics.median(min(_busy_floor(per_step[s], sc), m) for s, m in measured.items())
        assert w["predicted_step_time_us"] >= floor - 1e-3 - 1e-6 * floor, (w["scenario"], floor, w)


def _kernel_busy_per_step(trace: Path) -> dict[str, float]:
    """Per ProfilerStep: the busiest stream's kernel µs, each kernel in the step its launch falls in."""
    with gzip.open(trace, "rt", encoding="utf-8") as fh:
        ev = json.load(fh)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev
                   if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#"))
    launch = {e["args"]["correlation"]: e["ts"] for e in ev
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    busy: dict[tuple[str, int], float] = {}
    for e in ev:
        if e.get("cat") != "kernel":
            continue
        at = launch.get(e["args"].get("correlation"))
        step = next((n for b, end, n in steps if at is not None and b <= at < end), None)
        if step is not None:
            key = (step, e["args"].get("stream"))
            busy[key] = busy.get(key, 0.0) + e["dur"]
    out: dict[str, float] = {}
    for (step, _), b in busy.items():
        out[step] = max(out.get(step, 0.0), b)
    return out


def test_gpu_bound_real_trace_whatifs_stay_above_the_kernels():
    """The fp32 GPT on an H200 (TF32 off, 217.6 ms a step unprofiled): one stream busy ~216.6 ms of each step. No
    what-if that leaves the kernels predicts less; the precision ones no less than their re-timed kernels; and
    CUDA graphs save next to nothing on a GPU-bound step."""
    folder = shared("traces/gpu/h200/precision/slow")
    (trace,) = folder.glob("*.pt.trace.json.gz")
    busy = _kernel_busy_per_step(trace)
    assert len(busy) == 4
    per_step = sum(busy.values()) / len(busy)
    assert 210_000 < per_step < 218_000
    a = analyze(folder, Options(jobs=1))
    (run,) = a.model["runs"]
    counted = [busy[f"ProfilerStep#{r['step']}"] for r in run["steps"]]
    floor = statistics.median(counted)
    by = {w["scenario"]: w for w in run["whatif"]}
    assert {"tf32_matmul", "bf16_matmul"} <= set(by)
    for sc, w in by.items():
        if sc in UNTOUCHED:
            assert w["predicted_step_time_us"] >= floor - 1e-3, (sc, floor)
    if "no_launch_overhead" in by:
        assert by["no_launch_overhead"]["saving_pct"] < 5.0
    # the precision what-ifs: the kernels that are not matrix math keep at least MEMORY_FACTORS[1] (bf16) or all
    # (TF32) of their time, the matrix math at least 1/(ratio/√2) of it
    peaks = gpu_peaks(GpuInfo("NVIDIA H200", (9, 0)))
    total_mm, total_other = _split_kernel_time(trace)
    n = len(busy)
    for sc, new, keep in (("tf32_matmul", "tf32", 1.0), ("bf16_matmul", "bf16", precision.MEMORY_FACTORS[1])):
        low = (total_mm * math.sqrt(2) / peaks.ratio("fp32", new) + total_other * keep) / n
        assert by[sc]["predicted_step_time_us"] >= low * 0.98, (sc, low)
        assert by[sc]["predicted_step_time_us"] < floor


def _split_kernel_time(trace: Path) -> tuple[float, float]:
    """(matrix-math kernel µs, other kernel µs) of the whole trace."""
    with gzip.open(trace, "rt", encoding="utf-8") as fh:
        ev = json.load(fh)["traceEvents"]
    mm = other = 0.0
    for e in ev:
        if e.get("cat") == "kernel":
            if matmath.kernel_family(e["name"]):
                mm += e["dur"]
            else:
                other += e["dur"]
    return mm, other


# ---------------------------------------------------------------------------------------------------------
# The real H200 pairs (issue 29): the step without the profiler, TF32 offered first, profiler-only findings


def _h200(side: str) -> dict:
    return analyze(shared(f"traces/gpu/h200/{side}"), Options(jobs=1)).model


def test_h200_precision_offers_tf32_first_and_prices_both_precisions():
    m = _h200("precision/slow")
    run = m["runs"][0]
    w = {x["scenario"]: x for x in run["whatif"]}
    # measured without the profiler: 217.6 ms slow, 33.8 ms bf16, 69.8 ms TF32 (README of the pairs)
    assert w["bf16_matmul"]["saving_pct"] == pytest.approx(78.3, abs=0.1)
    assert w["tf32_matmul"]["saving_pct"] == pytest.approx(65.7, abs=0.1)
    lo, hi = w["bf16_matmul"]["range_saving_pct"]
    assert lo < 78.3 < hi and hi < 84.5 + 5
    assert "dense datasheet peaks of an H200" in w["tf32_matmul"]["assumptions"]
    # a GPT: no convolution, no NCHW kernel, so no channels_last
    assert "bf16_channels_last" not in w
    assert (run["precision"]["conv_share_pct"], run["precision"]["layout"]) == (0.0, None)
    (f,) = [f for f in m["findings"] if f["kind"] == "fp32_matmul"]
    assert f["severity"] == "high" and f["impact_pct"] == pytest.approx(78.4, abs=0.1)
    assert f["recommendation"].startswith("first, one line: torch.set_float32_matmul_precision('high') and "
                                          "torch.backends.cudnn.allow_tf32 = True")
    assert any(e.startswith("TF32 alone (what-if tf32_matmul)") for e in f["evidence"])
    # a GPU-bound step: the profiler's host cost hides behind the GPU
    po = run["profiler_overhead"]
    assert po["source"] == "estimate" and po["overhead_pct"] < 1.0


def test_h200_host_bound_step_without_the_profiler():
    # the launch pair's slow side: 69.8 ms profiled, 44.3 ms measured without the profiler
    po = _h200("launch/slow")["runs"][0]["profiler_overhead"]
    assert po["profiled_step_time_us"] == pytest.approx(69805.0, abs=1.0)
    assert po["unprofiled_step_time_us"] == pytest.approx(44300.0, rel=0.05)
    assert po["profiler"]["record_shapes"] and po["events_per_step"] == 6794.0


def test_h200_idle_that_only_the_profiler_causes_is_left_out_and_said():
    # one CUDA graph per step: CUPTI slows its enqueue to 13.8 ms a step; without the profiler 6.9 ms, GPU-bound
    m = _h200("launch/fixed")
    run = m["runs"][0]
    assert run["profiler_overhead"]["unprofiled_step_time_us"] == pytest.approx(6930.0, rel=0.10)
    assert not [f for f in m["findings"] if f["kind"] == "unexplained_idle"]
    (d,) = run["profiler_overhead"]["dropped_findings"]
    assert d["kind"] == "unexplained_idle" and "exists only under the profiler" in d["why"]
    assert any("finding left out (unexplained_idle" in w["message"] for w in m["warnings"])
