"""Readable tables and charts (issue 31, item 4): short distinct kernel names with the launching op, steady kernel
tables without the compile step (folded into a row of its own), and the replay lanes' time axis."""

from __future__ import annotations

import re

import pytest

from tests.conftest import shared
from traceanalyze.fmt import KERNEL_NAME_CHARS, short_kernel_name
from traceanalyze.metrics import step_kernels, top_kernels
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.report import render_html
from traceanalyze.report.replay import time_ticks

# Real names from the H200 traces (../shared/traces/gpu/h200: precision, launch, compile) -> their short names
REAL = {
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, "
    "at::native::FillFunctor<float>, std::array<char*, 1ul>)": "vectorized_elementwise_kernel<4, FillFunctor<float>>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, std::array<char*, 1ul> >(int, "
    "at::native::FillFunctor<int>, std::array<char*, 1ul>)": "vectorized_elementwise_kernel<4, FillFunctor<int>>",
    "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul> "
    ">(int, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul>)":
        "vectorized_elementwise_kernel<8, FillFunctor<BFloat16>>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, at::native::AUnaryFunctor<float, "
    "float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul>)":
        "vectorized_elementwise_kernel<4, AUnaryFunctor<MulFunctor<float>>>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
    "std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::"
    "{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)":
        "vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>",
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> "
    ">(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1}>(int, "
    "at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, "
    "at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1})":
        "elementwise_kernel<128, 2, gpu_kernel_impl_nocast<CUDAFunctor_add<float>>>",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
    "unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
    "unsigned int, float, 4, 4>)": "reduce_kernel<512, 1, ReduceOp<func_wrapper_t<sum_functor<float×3>>, 4, 4>>",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, true, false>(float*, float const*, int, "
    "int, int, bool const*, int, bool)": "softmax_warp_forward<float×3, 4, true, false>",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, float, float, true, "
    "true, false, false>(cublasLt::cublasSplitKParams<float>, float const*, float const*, float*, float*, float "
    "const*, float const*, float const*, float const*, float*, void*, long, float*, int*, float*, float*, float "
    "const*, float const*, float const*, float const*, float const*)":
        "splitKreduce_kernel<32, 16, int, float×4, false, float×3, true, true, false, false>",
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>(cutlass_80_simt_sgemm_64x64_8x5_nn_align1::"
    "Params)": "Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>",
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, "
    "true, 64, 64, 64, true, true>::Params)": "fmha_cutlassF_f32_aligned_64x64_rf_sm80",
    "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT": "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT",
    "triton_per_fused_gelu_gelu_backward_sum_view_8": "triton_per_fused_gelu_gelu_backward_sum_view_8",
    "aten::mm": "aten::mm",
    "autograd::engine::evaluate_function: AddmmBackward0": "autograd::engine::evaluate_function: AddmmBackward0",
}


def test_short_kernel_name_on_real_names() -> None:
    for name, short in REAL.items():
        assert short_kernel_name(name) == short, name
    # the sibling rows the issue names are told apart, and every name stays within the bound
    assert len(set(short_kernel_name(n) for n in REAL)) == len(REAL)
    assert short_kernel_name(None) == "—"


def test_short_kernel_name_bounded_on_hostile_names() -> None:
    deep = "void a<" * 3000 + "x"
    for bad in (deep, "<(" * 5000, ")))>>>a<b", "((((", "f<" + "int, " * 10000 + "int>", "x" * 10000,
                "{lambda()#1}" * 500):
        s = short_kernel_name(bad)
        assert isinstance(s, str) and len(s) <= KERNEL_NAME_CHARS
    assert short_kernel_name("void f<" + ", ".join(f"T{i}" for i in range(50)) + ">(int)").endswith("…")


def _run(path, db) -> tuple:
    a = analyze([path], Options(db=db))
    return a, a.model["runs"][0]


def test_compile_step_left_out_of_the_steady_tables(tmp_path) -> None:
    """sample_traces/compile_cold (2 gloo ranks, ProfilerStep#0 holds the whole compile): the top-ops table counts
    only the steady steps; the compile step's 27,286 ops are one folded row."""
    a, run = _run("sample_traces/compile_cold", tmp_path / "cc.duckdb")
    try:
        cstep = run["compile_step"]
        assert cstep["step"] == 0 and cstep["n_kernels"] == 27286
        assert cstep["kernel_time_us"] == pytest.approx(4320033.0, rel=1e-4)
        assert [k["name"] for k in cstep["top_kernels"]][:3] == ["aten::view", "aten::linear", "aten::t"]
        mm = next(k for k in run["top_kernels"] if k["name"] == "aten::mm")
        assert mm["count"] == 76  # 19 per rank and steady step; the compile step's aten::mm are not in it
        rid = run["run_id"]
        steady = top_kernels(a.con, rid, limit=100000, skip_step=0)
        whole = top_kernels(a.con, rid, limit=100000)
        # the steady table and the folded step add up to the whole trace: nothing counted twice, nothing lost
        assert sum(k["count"] for k in steady) + step_kernels(a.con, rid, 0)["n_kernels"] == \
            sum(k["count"] for k in whole)
        assert sum(k["count"] for k in steady) < 27286
        html = render_html(a.model)
    finally:
        a.con.close()
    assert "compile step (ProfilerStep#0): 27,286 ops, 4,320.03 ms, left out of the table above" in html
    table = html[html.index('<table class="kernels">'):]
    table = table[:table.index("compile-fold")]
    assert "aten::view" not in table  # the compile step's top op, not a steady one


def test_gpu_kernel_rows_carry_the_launching_op(tmp_path) -> None:
    """The H200 compile run: steady kernels with the op that launched them, short names, the full name as an
    escaped tooltip; the compile step's kernels folded apart."""
    a, run = _run(shared("traces/gpu/h200/compile/slow"), tmp_path / "gc.duckdb")
    try:
        top = run["top_kernels"]
        assert (top[0]["name"], top[0]["op"], top[0]["count"]) == \
            ("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT", "aten::mm", 95)
        adam = next(k for k in top if k.get("op") == "aten::_fused_adamw_")
        assert short_kernel_name(adam["name"]) == \
            "multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<…>, FusedAdamMathFunctor<…>>"
        assert run["compile_step"]["n_kernels"] == 12116
        assert run["compile_step"]["top_kernels"][0]["op"] == "aten::fill_"
        html = render_html(a.model)
    finally:
        a.con.close()
    assert "<th>Launched by</th>" in html
    assert ('title="void at::native::(anonymous namespace)::cunn_SoftMaxBackward&lt;4, float, float, float, '
            'at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue&gt;(float*, float const*, float const*, '
            'long)">cunn_SoftMaxBackward&lt;4, LogSoftMaxBackwardEpilogue&gt;</span>') in html
    assert "compile step (ProfilerStep#0): 12,116 kernels" in html
    # one rank: its lane is drawn 120 units high (the lanes' minimum), not a 26-unit sliver: 128 + axis 40
    assert '<svg class="whatif-lanes" viewBox="0 0 984 168"' in html


def test_time_ticks() -> None:
    assert [t["label"] for t in time_ticks(198_000)] == ["0", "50", "100", "150"]
    assert [t["label"] for t in time_ticks(1000)] == ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    assert [t["frac"] for t in time_ticks(1000)][-1] == 1.0
    assert time_ticks(0) == [] and time_ticks(float("nan")) == []


def test_replay_lanes_have_a_time_axis(tmp_path) -> None:
    """sample_traces/straggler: the lanes chart has an axis line, ticks labelled in ms and an "ms" label."""
    a, run = _run("sample_traces/straggler", tmp_path / "s.duckdb")
    try:
        html = render_html(a.model)
        span = run["replay_picture"]["span_us"]
    finally:
        a.con.close()
    svg = html[html.index('<svg class="whatif-lanes"'):]
    svg = svg[:svg.index("</svg>")]
    labels = re.findall(r'text-anchor="middle">([\d,.]+)</text>', svg)
    assert labels == [t["label"] for t in time_ticks(span)] and labels[:2] == ["0", "50"]
    assert svg.count('class="tick"') == len(labels) >= 3
    assert '>ms</text>' in svg and "time from the step's start (ms)" in svg
