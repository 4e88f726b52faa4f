"""Matrix math: which GPU kernels are GEMMs, convolutions or attention, and in which dtype they compute.

One classification, used by the dtype mix (:mod:`traceanalyze.metrics.precision`), the precision finding and the
precision what-ifs (:mod:`traceanalyze.replay.precision`) alike, so that what the report counts is what the what-if
rewrites. The naming table, with real kernel names for each row, is ``docs/kernel_names.md``.

- **Family** (:func:`kernel_family`): ``attention`` (flash, fmha, cuDNN SDPA, PyTorch's memory-efficient attention,
  the math fallback's kernels are GEMMs), ``conv`` (cuDNN engines such as ``dgrad_engine``/``wgrad_alg0_engine``,
  implicit-GEMM ``xmma`` fprop/dgrad/wgrad, CUTLASS and Triton convolutions, Winograd), ``gemm`` (cuBLAS, cuBLASLt
  ``nvjet``, CUTLASS, ``xmma``/``wgmma`` GEMMs, Triton matmul templates), else None. Checked in that order: an
  attention kernel's name often holds ``cutlass`` and a convolution's ``implicit_gemm``.
- **Dtype** (:func:`kernel_dtype`): from the name where it tells (``ffma``/``sgemm``/``<float``/``f32f32_f32f32``:
  fp32 on CUDA cores; ``tf32``/``s1688``: TF32 on tensor cores; ``bf16``/``f16``/``h16816``: 16-bit on tensor
  cores); otherwise the caller falls back to the launching op's ``Input type`` (:data:`TYPE_TO_DTYPE`).

A leaf: imports nothing of the project. The patterns are RE2-compatible so DuckDB's ``regexp_matches`` applies
them in SQL as Python's ``re`` does here.
"""

from __future__ import annotations

import functools
import re

# (family, pattern searched case-insensitively in the kernel name). First match wins.
FAMILY_PATTERNS: list[tuple[str, str]] = [
    ("attention", r"flash|fmha|attention|sdpa|_attn_|mha_fwd|mha_bwd"),
    ("conv", r"conv|dgrad|wgrad|fprop|winograd|implicit_gemm|scudnn|cudnn::cnn|implicit_convolve"),
    ("gemm", r"gemm|gemv|xmma|cutlass|cublas|nvjet|wgmma|triton_tem|matmul"),
]
# Kernels that match a family pattern but are not matrix math: elementwise, reductions, copies, collectives.
NOT_MATH = (r"elementwise_kernel|reduce_kernel|splitkreduce|memcpy|memset|nccl|_copy_kernel|softmax|layer_norm|"
            r"fbgemm_gpu|convert|triton_poi_|triton_red_|triton_per_|scal_kernel|globalkernel")

# (pattern, dtype, tensor cores). First match wins; order matters (``f32f32_tf32f32`` is TF32, not fp32).
KERNEL_DTYPE_RULES: list[tuple[str, str, bool | None]] = [
    (r"tf32|s1688gemm|s1684gemm|tensorop_s1688|s1688fprop|s1688dgrad|s1688wgrad", "tf32", True),
    (r"_ffma_|sgemm|scudnn|simt_sgemm|gemmsn_|gemmk1_kernel<float|gemv2t_kernel_val<int, int, float|<float|"
     r"f32f32_f32f32|cutlass[bf]_f32|_f32_aligned|fp32|float32", "fp32", False),
    (r"e4m3|e5m2|fp8", "fp8", True),
    (r"bf16|bfloat16|__nv_bfloat16|cutlass::bfloat16_t", "bf16", True),
    (r"fp16|h884|h1688|h16816|s884gemm|s16816gemm|hmma|half_t|f16f16|cutlass::half_t|hgemm|_f16_|wgmma_f16", "fp16",
     True),
    (r"d884|dmma|dgemm|<double", "fp64", None),
    (r"i16832|i8816|imma|igemm|int8", "int8", True),
]
# Activation layout from kernel names (docs/kernel_names.md, "Layout"). cuDNN's tensor-core convolutions compute in
# NHWC; on NCHW tensors cuDNN transposes every activation into and out of them (``nchwToNhwcKernel``,
# ``nhwcToNchwKernel``), and it names NCHW in the convolutions and batch norms it runs on NCHW tensors
# (``…_nchwkcrs_nchw_…``, ``reduce_wgrad_nchw_helper``, ``bn_fw_tr_1C11_kernel_NCHW``), as PyTorch does in its pooling
# (``max_pool_forward_nchw``). With ``channels_last`` tensors PyTorch runs its ``*_channels_last_kernel`` batch norms
# and ``*_nhwc<…>`` pooling, and no kernel names NCHW. (layout, pattern searched case-insensitively), first match wins.
LAYOUT_PATTERNS: list[tuple[str, str]] = [
    ("transpose", r"nchwtonhwc|nhwctonchw"),
    ("nchw", r"nchw"),
    ("channels_last", r"channels_last|_nhwc<"),
]
# The patterns are lower case and compiled without IGNORECASE: an ASCII name is searched lower-cased, the same
# matches ~6x faster on ~300-character kernel names (:func:`folded`)
_FAMILY = [(f, re.compile(p)) for f, p in FAMILY_PATTERNS]
_LAYOUT = [(lay, re.compile(p)) for lay, p in LAYOUT_PATTERNS]
_NOT_MATH = re.compile(NOT_MATH)
_DTYPE = [(re.compile(p), d, tc) for p, d, tc in KERNEL_DTYPE_RULES]
NAME_CACHE = 8192  # distinct kernel names remembered by the per-name functions (a run has hundreds)

# The ``Input type`` of an op (c10 names, lower-cased) -> math dtype.
TYPE_TO_DTYPE = {"float": "fp32", "c10::bfloat16": "bf16", "c10::half": "fp16", "double": "fp64",
                 "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "signed char": "int8"}

# Ops whose forward autocast runs in lower precision (PyTorch "CUDA Ops that can autocast to float16/bfloat16"):
# their fp32 inputs are cast first. Only forward entry points: backward runs what they recorded.
AUTOCAST_LOWP_OPS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                     "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_transpose1d",
                     "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::scaled_dot_product_attention",
                     "aten::_scaled_dot_product_efficient_attention", "aten::prelu", "aten::addbmm",
                     "aten::chain_matmul", "aten::linalg_vecdot")
# Ops that autocast keeps in fp32 (PyTorch "CUDA Ops that can autocast to float32"), and the norms whose
# statistics stay fp32: their kernels move the same bytes after the switch.
AUTOCAST_FP32_OPS = ("aten::layer_norm", "aten::native_layer_norm", "aten::native_layer_norm_backward",
                     "aten::group_norm", "aten::native_group_norm", "aten::softmax", "aten::_softmax",
                     "aten::log_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
                     "aten::_log_softmax_backward_data", "aten::cross_entropy_loss", "aten::nll_loss",
                     "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::nll_loss2d_forward", "aten::mse_loss",
                     "aten::binary_cross_entropy_with_logits", "aten::norm", "aten::linalg_vector_norm",
                     "aten::cumsum", "aten::cumprod", "aten::exp", "aten::log", "aten::pow", "aten::rsqrt",
                     "aten::sum", "aten::prod", "aten::mean", "aten::renorm", "aten::dist", "aten::cosine_similarity",
                     "aten::rms_norm", "aten::_fused_rms_norm")


def folded(name: str) -> tuple[str, int]:
    """(``name`` to search, regex flags) for a lower-case pattern searched case-insensitively: an ASCII name
    lower-cased with no flags (the same matches as IGNORECASE, whose per-character folding is slow), any other
    name as it is with IGNORECASE (its folding of non-ASCII letters, such as the Kelvin sign, kept)."""
    return (name.lower(), 0) if name.isascii() else (name, re.IGNORECASE)


def search(pat: re.Pattern, name: str, flags: int) -> re.Match | None:
    """``pat`` searched in a name from :func:`folded` with its ``flags`` (``re`` caches the flagged pattern)."""
    return (re.compile(pat.pattern, flags) if flags else pat).search(name)


@functools.lru_cache(maxsize=NAME_CACHE)  # the metrics and the replay ask for each distinct name several times
def kernel_family(name: str) -> str | None:
    """``gemm``, ``conv`` or ``attention`` for a matrix-math kernel name, None for anything else (elementwise,
    reductions, copies, collectives)."""
    if not name:
        return None
    text, flags = folded(name)
    if search(_NOT_MATH, text, flags):
        return None
    for fam, pat in _FAMILY:
        if search(pat, text, flags):
            return fam
    return None


@functools.lru_cache(maxsize=NAME_CACHE)
def kernel_dtype(name: str) -> tuple[str | None, bool | None]:
    """(math dtype, uses tensor cores) from a kernel name by :data:`KERNEL_DTYPE_RULES`; (None, None) when the
    name does not tell (``nvjet_*``, Triton, cuBLAS generic names)."""
    text, flags = folded(name or "")
    for pat, dt, tc in _DTYPE:
        if search(pat, text, flags):
            return dt, tc
    return None, None


@functools.lru_cache(maxsize=NAME_CACHE)
def activation_layout(name: str) -> str | None:
    """What a kernel name says of the activations' memory layout (:data:`LAYOUT_PATTERNS`): ``transpose`` (cuDNN's
    NCHW↔NHWC layout transposes), ``nchw`` (a kernel that runs on NCHW tensors), ``channels_last`` (PyTorch's
    channels-last kernels), None when the name does not tell (most kernels: an NHWC convolution runs in both)."""
    text, flags = folded(name or "")
    for lay, pat in _LAYOUT:
        if search(pat, text, flags):
            return lay
    return None


def op_dtype(types: list) -> str | None:
    """Math dtype (``fp32``, ``bf16``, ...) of an op from its ``Input type`` list: the first input of a known type;
    None when none is."""
    for x in types:
        if isinstance(x, str) and x.lower() in TYPE_TO_DTYPE:
            return TYPE_TO_DTYPE[x.lower()]
    return None


def family_sql(col: str) -> str:
    """A DuckDB expression giving the family code of kernel name column ``col``: 1 gemm, 2 conv, 3 attention,
    0 none (:func:`kernel_family` in SQL)."""
    code = {"gemm": 1, "conv": 2, "attention": 3}
    whens = " ".join(f"WHEN regexp_matches({col}, '(?i){p}') THEN {code[f]}" for f, p in FAMILY_PATTERNS)
    return f"CASE WHEN regexp_matches({col}, '(?i){NOT_MATH}') THEN 0 {whens} ELSE 0 END"


def dtype_sql(col: str) -> str:
    """A DuckDB expression giving the name's math-mode code: 1 fp32 on CUDA cores, 2 TF32, 3 a 16-bit or narrower
    type, 4 fp64, 0 the name does not tell (:func:`kernel_dtype` in SQL)."""
    code = {"fp32": 1, "tf32": 2, "fp8": 3, "bf16": 3, "fp16": 3, "int8": 3, "fp64": 4}
    whens = " ".join(f"WHEN regexp_matches({col}, '(?i){p}') THEN {code[d]}" for p, d, _ in KERNEL_DTYPE_RULES)
    return f"CASE {whens} ELSE 0 END"
