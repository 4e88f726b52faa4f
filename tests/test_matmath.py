"""The one matrix-math classification (traceanalyze.matmath): family and dtype of real kernel names, per family
(docs/kernel_names.md), and the SQL versions agreeing with the Python ones on every observed name."""

from __future__ import annotations

import re

import duckdb
import pytest

from tests.conftest import shared
from traceanalyze import matmath
from traceanalyze.matmath import (
    FAMILY_PATTERNS,
    KERNEL_DTYPE_RULES,
    LAYOUT_PATTERNS,
    activation_layout,
    dtype_sql,
    family_sql,
    kernel_dtype,
    kernel_family,
    op_dtype,
)
from traceanalyze.metrics.kernels import KNOWN_COMPUTE, name_head, no_class

# (kernel name, family, (dtype, tensor cores)). Real names: ../shared/kernel_names_observed.txt (HTA's test traces)
# and the H200 traces under ../shared/traces/gpu/h200, unless said otherwise.
GEMM = [
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_"
     "kernel__5x_cublas", "gemm", ("fp32", False)),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_128x256_8x4_nt_align1"
     "::Params)", "gemm", ("fp32", False)),
    ("ampere_sgemm_32x32_sliced1x4_tn", "gemm", ("fp32", False)),
    ("volta_sgemm_64x64_nt", "gemm", ("fp32", False)),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 2, 2, false, false, cublasGemvParams<"
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensor",
     "gemm", ("fp32", False)),
    ("void sgemm_largek_lds64<true, false, 5, 5, 4, 4, 4, 34>(float*, float const*, float const*, int, int, int, "
     "int, int, int, float const*, float const*, float, float, int, int, int*, int*)", "gemm", ("fp32", False)),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_"
     "cublas", "gemm", ("tf32", True)),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_256x64"
     "_16x4_nn_align4::Params)", "gemm", ("tf32", True)),
    # cuBLASLt's Hopper kernels do not name their dtype: the launching op's Input type decides
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "gemm", (None, None)),
    ("nvjet_sm90_tst_64x128_64x8_2x1_v_bz_NTN", "gemm", (None, None)),
    # not observed here: the common bf16/fp16 cuBLAS names
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "gemm", ("bf16", True)),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "gemm", ("fp16", True)),
]
CONV = [
    # cuDNN's classic fp32 engines (CUDA cores)
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, float "
     "const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, int, int, int)",
     "conv", ("fp32", False)),
    ("void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, int, float*, float "
     "const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)", "conv", ("fp32", False)),
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "conv", ("fp32", False)),
    ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "conv", ("fp32", False)),
    # implicit-GEMM xmma fprop / dgrad / wgrad: fp32 (ffma) and TF32 variants
    ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nchw_tilesize128x128x8_stage3_warpsize2x2x1_g1_ffma_"
     "aligna4_alignc4_execute_kernel_cudnn", "conv", ("fp32", False)),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1"
     "_g1_tensor16x8x8_alignc4_execute_kernel_cudnn", "conv", ("tf32", True)),
    ("sm80_xmma_dgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_warpsize2x2x1_g1_"
     "tensor16x8x8_execute_kernel_cudnn_infer", "conv", ("tf32", True)),
    ("sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_warpsize2x2x1"
     "_g1_tensor16x8x8_execute_split_k_kernel_cudnn_train", "conv", ("tf32", True)),
    # CUTLASS convolutions inside cuDNN
    ("void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_128x128_16x4_nhwc_unity_stride_"
     "align4>(cutlass_tensorop_s1688dgrad_optimized_tf32_128x128_16x4_nhwc_unity_stride_align4::Params)",
     "conv", ("tf32", True)),
    ("void cutlass_cudnn_train::Kernel<cutlass_tensorop_s1688wgrad_optimized_tf32_256x64_16x4_nhwc_align4>("
     "cutlass_tensorop_s1688wgrad_optimized_tf32_256x64_16x4_nhwc_align4::Params)", "conv", ("tf32", True)),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemm"
     "MultistageINS_4gemm9GemmShapeILi128ELi128ELi32EEENS4_52Conv2dWgradOutputGradientTileAccessIterat",
     "conv", (None, None)),
    # Winograd
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradData"
     "Params<float, float>)", "conv", ("fp32", False)),
    ("cudnn_infer_volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "conv", ("fp32", False)),
]
ATTENTION = [
    # PyTorch's memory-efficient SDPA (fmha, CUTLASS): fp32 on CUDA cores
    ("fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm80, "
     "float, true, false, false, 64, 64, 64, false>::Params)", "attention", ("fp32", False)),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, "
     "true, 64, 64, 64, true, true>::Params)", "attention", ("fp32", False)),
    # FlashAttention-2 as PyTorch builds it (name format of the pytorch_flash kernels; not in the observed lists)
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
     "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, "
     "false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)", "attention", ("bf16", True)),
    # cuDNN SDPA (the bf16 GPT on the H200: the name says f16 for both 16-bit types)
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
     "attention", ("fp16", True)),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
     "attention", ("fp16", True)),
]
NOT_MATH = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, "
    "3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_"
    "cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(flo",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
    "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, u",
    # cuBLAS's split-K reduction: part of a GEMM's work, but a memory-bound reduction
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, true, false>(cublasLt::cublas"
    "SplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*, float cons",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, true, false>(float*, float const*, int, "
    "int, int, bool const*, int, bool)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, "
    "float const*, float const*, float*, float",
    "triton_poi_fused__to_copy_1",
    "triton_per_fused_gelu_gelu_backward_sum_view_8",
    "",
]


def _ids(rows):
    return [r[0][:48] for r in rows]


@pytest.mark.parametrize(("name", "family", "dtype"), GEMM, ids=_ids(GEMM))
def test_gemm_kernels(name, family, dtype):
    assert kernel_family(name) == family
    assert kernel_dtype(name) == dtype


@pytest.mark.parametrize(("name", "family", "dtype"), CONV, ids=_ids(CONV))
def test_conv_kernels(name, family, dtype):
    """Convolutions before GEMMs: an implicit-GEMM convolution's name holds ``gemm``, a CUTLASS one ``cutlass``."""
    assert kernel_family(name) == family
    assert kernel_dtype(name) == dtype


@pytest.mark.parametrize(("name", "family", "dtype"), ATTENTION, ids=_ids(ATTENTION))
def test_attention_kernels(name, family, dtype):
    """Attention before convolutions and GEMMs: fmha and flash kernels are CUTLASS templates."""
    assert kernel_family(name) == family
    assert kernel_dtype(name) == dtype


@pytest.mark.parametrize("name", NOT_MATH, ids=[n[:48] for n in NOT_MATH])
def test_not_matrix_math(name):
    assert kernel_family(name) is None


def test_op_dtype_is_the_fallback():
    """A kernel whose name does not tell its dtype takes its launching op's first known ``Input type``."""
    assert op_dtype(["float", "float", ""]) == "fp32"
    assert op_dtype(["", "c10::BFloat16"]) == "bf16"
    assert op_dtype(["c10::Half"]) == "fp16"
    assert op_dtype(["long int", "Scalar"]) is None
    assert op_dtype([]) is None


def _sql(con: duckdb.DuckDBPyConnection, name: str) -> tuple[int, int]:
    return con.execute(f"SELECT {family_sql('$1')}, {dtype_sql('$1')}", [name]).fetchone()


FAMILY_CODE = {None: 0, "gemm": 1, "conv": 2, "attention": 3}
DTYPE_CODE = {None: 0, "fp32": 1, "tf32": 2, "fp8": 3, "bf16": 3, "fp16": 3, "int8": 3, "fp64": 4}


def _agree(con, name: str) -> bool:
    return _sql(con, name) == (FAMILY_CODE[kernel_family(name)], DTYPE_CODE[kernel_dtype(name)[0]])


def test_sql_agrees_with_python_on_the_table():
    con = duckdb.connect()
    names = [r[0] for r in GEMM + CONV + ATTENTION] + NOT_MATH
    assert [n for n in names if not _agree(con, n)] == []


def test_sql_agrees_with_python_on_every_observed_name():
    """Every kernel name observed in real traces (``count name`` lines; ``#`` lines are comments): DuckDB's RE2
    applies the patterns as Python's ``re`` does."""
    path = shared("kernel_names_observed.txt")
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        count, _, name = line.partition(" ")
        assert count.isdigit(), line
        names.append(name)
    assert len(names) > 500
    con = duckdb.connect()
    assert [n for n in names if not _agree(con, n)] == []
    # the observed names cover every family and the fp32 / TF32 name rules
    fams = {kernel_family(n) for n in names}
    assert {"gemm", "conv"} <= fams
    assert {"fp32", "tf32"} <= {kernel_dtype(n)[0] for n in names}


# Names a looser pattern would misread:
# ``gemm`` matches ``fbgemm_gpu`` (FBGEMM's permute/bucketize/FP8-quantize kernels, observed in HTA's traces) and
# ``conv`` matches ``convert`` (cuDNN SDPA's ``convert_dq_to_16bits``, observed in the bf16 GPT on the H200) and
# inductor's pointwise epilogues named after the ``convolution`` they follow.
MISREAD = [
    "void fbgemm_gpu::(anonymous namespace)::_FP8rowwise_to_float_cuda_kernel<float>(unsigned char const*, int, int, "
    "float*, bool)",
    "void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",
    "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int, unsigned int, unsigned int, "
    "unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigne",
    "triton_poi_fused_convolution_relu_0",
]


@pytest.mark.parametrize("name", MISREAD, ids=[n[:48] for n in MISREAD])
def test_misread_names_are_not_matrix_math(name):
    assert kernel_family(name) is None


def _observed() -> list[str]:
    lines = shared("kernel_names_observed.txt").read_text(encoding="utf-8").splitlines()
    return [ln.partition(" ")[2] for ln in lines if ln.strip() and not ln.startswith("#")]


def _ignorecase(rules: list[tuple], name: str):
    """The first rule whose pattern (its first item) IGNORECASE finds in ``name``: what the per-name functions did
    before they searched lower-cased names."""
    return next((r for r in rules if re.search(r[0], name, re.IGNORECASE)), None)


# non-ASCII names keep IGNORECASE's folding: the Kelvin sign is a k, the long s an s, the dotted capital I no i
ODD_NAMES = ["void \u212aernel_gemm_bf16", "\u017fgemm_kernel", "flash_fwd_\u0130", "CONV_\u00e9_NCHW", "\u0130conv"]


def test_lower_cased_search_is_ignorecase():
    """The patterns searched in lower-cased ASCII names (and with IGNORECASE in the others) find what IGNORECASE
    finds: every observed name, the tables' names in upper case and non-ASCII names."""
    names = _observed() + [r[0].upper() for r in GEMM + CONV + ATTENTION] + ODD_NAMES
    patterns = [p for _, p in FAMILY_PATTERNS + LAYOUT_PATTERNS] + [r[0] for r in KERNEL_DTYPE_RULES]
    assert all(p == p.lower() for p in [*patterns, matmath.NOT_MATH, KNOWN_COMPUTE])
    fam = [(p, f) for f, p in FAMILY_PATTERNS]
    lay = [(p, lay) for lay, p in LAYOUT_PATTERNS]
    for n in names:
        want_fam = None if _ignorecase([(matmath.NOT_MATH,)], n) else (_ignorecase(fam, n) or (None, None))[1]
        want_dt = (_ignorecase(KERNEL_DTYPE_RULES, n) or (None, None, None))[1:]
        assert (kernel_family(n), kernel_dtype(n), activation_layout(n)) == (
            want_fam, want_dt, (_ignorecase(lay, n) or (None, None))[1]), n
        assert no_class(n) == (want_fam is None and not re.search(KNOWN_COMPUTE, name_head(n), re.IGNORECASE)), n
    assert kernel_family("\u212aernel_gemm_bf16") == "gemm" and kernel_dtype("\u017fgemm_kernel") == ("fp32", False)
    assert kernel_family("flash_fwd_\u0130") == "attention"
