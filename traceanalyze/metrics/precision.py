"""Precision: the dtype mix of matrix-math time (GEMM, convolution, attention) and the tensor-core share.

GPU mode: each GEMM/conv/attention kernel's math dtype is read from its name (the table in
``shared/FORMATS.md`` §8, first match wins: ``*_sgemm_*`` / ``*_ffma_*`` are fp32 on CUDA cores, ``*tf32*`` /
``s1688gemm`` are TF32 on tensor cores, ``bf16``/``fp16``/``h884``/``s16816`` are half types on tensor cores, ...).
Names that do not tell (``nvjet_*``, Triton, cuBLAS generic) fall back to the launching op's ``Input type``
(kernel ``External id`` == cpu_op ``External id``).

GPU mode also reads the activations' layout from kernel names (:func:`traceanalyze.matmath.activation_layout`:
NCHW convolutions, batch norms and pooling, cuDNN's NCHW↔NHWC transposes, PyTorch's channels-last kernels) and the
convolutions' share of matrix-math time: the precision finding advises channels_last with bf16 on a conv net on
NCHW activations.

CPU mode: the training thread's leaf matrix ops (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``,
``_scaled_dot_product_*attention*``, ``*_convolution``) by their first ``Input type``; there are no tensor cores.

Both modes count the work of the counted profiler steps only (:mod:`.steps`: GPU kernels launched before a
window's last, partial step; CPU ops inside counted steps), as the breakdown does, so shares compare.

Achieved TFLOPS: 2·M·N·K per ``aten::mm``/``addmm``/``bmm`` from ``Input Dims``, over the time of the kernels
it launched (GPU) or of the op (CPU); MFU = achieved / the GPU's dense peak for that dtype (NVIDIA datasheets;
torchtitan ``get_peak_flops``), or ``--peak-tflops``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import duckdb

from traceanalyze import matmath
from traceanalyze.hardware import peak_tflops
from traceanalyze.metrics._sql import counted_kernels_sql, counted_op_sql
from traceanalyze.metrics.breakdown import kernel_classes

# The one matrix-math classification (families and name dtypes): traceanalyze.matmath, docs/kernel_names.md.
CPU_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation",
                "aten::mkldnn_convolution", "aten::cudnn_convolution", "aten::_convolution_mode")
# Dtype names: the ``Input type`` of an op (c10 names, lower-cased) -> math dtype; any spelling (records, NCCL
# kernel names, c10) -> bytes per element.
TYPE_TO_DTYPE = matmath.TYPE_TO_DTYPE
DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "int": 4, "int32": 4, "i32": 4, "u32": 4, "uint32": 4,
    "bfloat16": 2, "c10::bfloat16": 2, "bf16": 2, "__nv_bfloat16": 2, "half": 2, "c10::half": 2, "f16": 2,
    "float16": 2, "double": 8, "float64": 8, "f64": 8, "long": 8, "long int": 8, "int64": 8, "i64": 8,
    "u64": 8, "int8": 1, "int8_t": 1, "i8": 1, "u8": 1, "uint8": 1, "unsigned char": 1, "char": 1, "byte": 1,
    "bool": 1, "f8e4m3": 1, "f8e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

kernel_dtype = matmath.kernel_dtype

_DTYPE_NAMES = {"tf32": "TF32", "fp8": "FP8", "unknown": "dtype unknown"}


def mix_label(dtype: str, tensor_core: bool | None, mode: str = "gpu",
              capability: tuple[int, int] | None = None) -> str:
    """Readable name of one dtype-mix row, unique per (dtype, tensor cores): ``bf16 on tensor cores``, ``fp32 on
    CUDA cores``, ``fp32, tensor cores unknown (TF32 when allowed)`` (on sm80 or later or an unknown GPU; on an
    older GPU, which has no TF32, ``fp32 on CUDA cores``); on CPU just the dtype."""
    name = _DTYPE_NAMES.get(dtype, dtype)
    if mode != "gpu" or dtype == "unknown":
        return name
    if tensor_core is True:
        return f"{name} on tensor cores"
    if tensor_core is False:
        return f"{name} on CUDA cores"
    if dtype == "fp32":
        if capability is not None and capability < (8, 0):
            return f"{name} on CUDA cores"
        return "fp32, tensor cores unknown (TF32 when allowed)"
    return f"{name}, tensor cores unknown"


def _op_dtype(types_json: str | None) -> str | None:
    """Math dtype (:data:`TYPE_TO_DTYPE`: ``fp32``, ``bf16``, ...) of an op from its ``Input type`` JSON: the first
    input of a known type; None when none is."""
    return matmath.op_dtype(input_types(types_json))


def record_json(text: str | None) -> Any:
    """A JSON column of a cpu_op (``input_types``, ``input_dims``) read back; None when absent or not JSON."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def input_types(types_json: str | None) -> list:
    """A cpu_op's ``Input type`` list from its JSON text (``'["float", "c10::BFloat16"]'``); [] when absent, not
    JSON or not a list. Items are as recorded (strings, or ``""`` for a non-tensor argument)."""
    t = record_json(types_json)
    return t if isinstance(t, list) else []


def dtype_bytes(dtype: str | None) -> int | None:
    """Bytes per element of a dtype name as a record or kernel name spells it (:data:`DTYPE_BYTES`:
    ``c10::BFloat16``, ``bf16``, ``float``, ...); None when unknown."""
    if not dtype:
        return None
    return DTYPE_BYTES.get(dtype.strip().lower())


def first_input_bytes(types_json: str | None) -> int | None:
    """Bytes per element of an op's first input, from its ``Input type`` JSON; None when unknown."""
    t = input_types(types_json)
    if t and isinstance(t[0], str):
        return dtype_bytes(t[0])
    return None


def gemm_flops(op: str, dims_json: str | None) -> float | None:
    """FLOPs of one ``aten::mm`` ([[M,K],[K,N]]), ``addmm`` ([[N],[M,K],[K,N]]) or ``bmm`` ([[B,M,K],[B,K,N]])
    call: 2·(B·)M·N·K. None when the shapes are missing or do not fit."""
    d = record_json(dims_json)
    if d is None:
        return None
    try:
        if op in ("aten::mm",):
            (m, k), (_, n) = d[0], d[1]
            return 2.0 * m * n * k
        if op in ("aten::addmm", "aten::_addmm_activation"):
            (m, k), (_, n) = d[1], d[2]
            return 2.0 * m * n * k
        if op in ("aten::bmm",):
            (b, m, k), (_, _, n) = d[0], d[1]
            return 2.0 * b * m * n * k
        if op == "aten::baddbmm":
            (b, m, k), (_, _, n) = d[1], d[2]
            return 2.0 * b * m * n * k
    except (TypeError, ValueError, IndexError):
        return None
    return None


@dataclass
class PrecisionMix:
    """Matrix-math time by dtype (µs, %), the fp32-without-tensor-cores share, and achieved TFLOPS."""

    mode: str
    gemm_time_us: float = 0.0
    mix: list[dict] = field(default_factory=list)  # {dtype, tensor_core, label, time_us, pct}
    fp32_share_pct: float = 0.0  # fp32 math on CUDA cores (or plain fp32 on CPU)
    tensor_core_share_pct: float | None = None
    achieved_tflops: float | None = None
    main_dtype: str | None = None
    peak_tflops: float | None = None
    matmul_efficiency_pct: float | None = None  # GEMM time efficiency: achieved / the main dtype's peak
    peak_source: str | None = None
    source: str = ""  # how dtypes were read
    model_flops_per_step: float | None = None  # per rank and counted step (model_flops), FLOPs
    model_flops_ops: int = 0  # matrix ops whose shapes gave FLOPs
    conv_share_pct: float = 0.0  # GPU: % of matrix-math time in convolution kernels
    layout: str | None = None  # GPU: the activations' layout the kernel names say: "NCHW", "channels_last" or None
    layout_us: dict = field(default_factory=dict)  # GPU: µs of counted kernels by the layout their names say
    # matrix-math µs per rank and counted step by kernel family (gemm, conv, attention) and dtype: the time a
    # baseline's measured speed-up is read from (traceanalyze.replay.frombase); not in the JSON
    family_us_per_step: dict = field(default_factory=dict)


def analyze_precision(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, gpu_model: str | None = None,
                      peak_override: float | None = None,
                      capability: tuple[int, int] | None = None) -> PrecisionMix:
    """Dtype mix of matrix math for one run (definitions in the module docstring); ``capability``: the GPU's compute
    capability when known (the labels offer TF32 only from sm80)."""
    res = PrecisionMix(mode=mode)
    acc: dict[tuple[str, bool | None], float] = {}
    flops = 0.0
    flop_time_ns = 0.0
    fam: dict[tuple[str, str], float] = {}  # (family, dtype) -> ns
    if mode == "gpu":
        fr = _gpu_mix(con, run_id, capability, res, acc, fam)
    else:
        rows = con.execute(f"""
            SELECT c.name, c.input_types, c.input_dims, c.dur_ns
            FROM cpu_ops c JOIN files f USING (file_id)
            WHERE f.run_id = $1 AND c.cat = 'cpu_op'
              AND (c.name IN {CPU_GEMM_OPS!r} OR (c.name LIKE 'aten::_scaled_dot_product%attention%'))
              AND {counted_op_sql("c", "$1")}""", [run_id]).fetchall()
        for name, types, _dims, dur in rows:
            dt = _op_dtype(types) or "unknown"
            acc[(dt, False)] = acc.get((dt, False), 0.0) + dur
            key = (cpu_op_family(name), dt)
            fam[key] = fam.get(key, 0.0) + dur
        res.source = "Input type of aten matrix ops on the training thread"
        fr = [(n, d, t, dur) for n, t, d, dur in rows]
    for op, dims, _types, dur in fr:
        f = gemm_flops(op, dims)
        if f and dur:
            flops += f
            flop_time_ns += dur
    total = sum(acc.values())
    res.gemm_time_us = total / 1e3
    if total <= 0:
        return res
    for (dt, tc), t in sorted(acc.items(), key=lambda kv: -kv[1]):  # one row per (dtype, tensor cores)
        res.mix.append({"dtype": dt, "tensor_core": tc, "label": mix_label(dt, tc, mode, capability),
                        "time_us": round(t / 1e3, 3), "pct": round(100 * t / total, 2)})
    res.main_dtype = res.mix[0]["dtype"]
    res.fp32_share_pct = round(100 * sum(t for (dt, tc), t in acc.items() if dt == "fp32" and not tc) / total, 2)
    if mode == "gpu":
        res.tensor_core_share_pct = round(100 * sum(t for (_, tc), t in acc.items() if tc) / total, 2)
    if flop_time_ns > 0:
        res.achieved_tflops = round(flops / (flop_time_ns / 1e9) / 1e12, 4)
        peak = peak_override or peak_tflops(gpu_model, res.main_dtype or "bf16")
        if peak and mode == "gpu":
            res.peak_tflops = peak
            res.peak_source = "--peak-tflops" if peak_override else f"{gpu_model} datasheet ({res.main_dtype})"
            res.matmul_efficiency_pct = round(100 * res.achieved_tflops / peak, 2)
    res.model_flops_per_step, res.model_flops_ops = model_flops(con, run_id)
    res.family_us_per_step = per_rank_step(con, run_id, fam)
    return res


def cpu_op_family(name: str) -> str:
    """The kernel family (:func:`traceanalyze.matmath.kernel_family`'s words) of a CPU matrix op of
    :data:`CPU_GEMM_OPS` or SDPA: ``conv``, ``attention`` or ``gemm``."""
    return "conv" if "convolution" in name else "attention" if "scaled_dot_product" in name else "gemm"


def per_rank_step(con: duckdb.DuckDBPyConnection, run_id: int, fam: dict[tuple[str, str], float]) -> dict:
    """``{family: {dtype: µs}}``: the ns of ``fam`` (summed over the counted steps of every rank) per rank and
    counted step (the mean over the counted (rank, step) pairs of :func:`profiler_steps`); {} without one."""
    if not fam:
        return {}
    n = con.execute("SELECT count(*) FROM profiler_steps(?) WHERE counted", [run_id]).fetchone()[0]
    out: dict[str, dict[str, float]] = {}
    for (f, dt), ns in sorted(fam.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if n and f:
            out.setdefault(f, {})[dt] = round(ns / 1e3 / n, 3)
    return out


def _gpu_mix(con: duckdb.DuckDBPyConnection, run_id: int, capability: tuple[int, int] | None, res: PrecisionMix,
             acc: dict[tuple[str, bool | None], float], fam: dict[tuple[str, str], float]) -> list:
    """GPU mode of :func:`analyze_precision`: each counted matrix-math kernel's time (ns) added to ``acc`` by (dtype,
    tensor cores), ``res.source``, the convolutions' share and the activations' layout set
    (:func:`_set_layout`); returns the (op, Input Dims, Input type, ns) rows of the GEMM ops that give FLOPs."""
    # matrix-math kernels and the kernels that name a layout, picked by name first so only their rows are joined
    # to the launching ops
    names = kernel_classes(con, run_id)
    gemm = {name for name, klass in names.items() if klass == "compute" and matmath.kernel_family(name)}
    laid = {name for name in names if matmath.activation_layout(name)}
    rows = con.execute(f"""
        SELECT k.name, sum(k.dur_ns), any_value(o.input_types), any_value(o.name)
        FROM ({counted_kernels_sql("$1", "k.cat = 'kernel' AND k.name IN (SELECT unnest($2))")}) k
        LEFT JOIN cpu_ops o ON o.file_id = k.file_id AND o.external_id = k.external_id AND o.cat = 'cpu_op'
        GROUP BY k.name""", [run_id, sorted(gemm | laid)]).fetchall()
    from_op = conv = 0.0
    layout: dict[str, float] = {}
    for name, dur, types, _op in rows:
        if name in laid:
            lay = matmath.activation_layout(name)
            layout[lay] = layout.get(lay, 0.0) + dur
        if name not in gemm:
            continue
        conv += dur if matmath.kernel_family(name) == "conv" else 0.0
        dt, tc = kernel_dtype(name)
        if dt is None:
            dt = _op_dtype(types) or "unknown"
            tc = None if dt in ("unknown", "fp32") else True
            if dt == "fp32":  # fp32 inputs may still run as TF32 when allowed (sm80+); the name does not say
                tc = False if capability is not None and capability < (8, 0) else None
            from_op += dur
        acc[(dt, tc)] = acc.get((dt, tc), 0.0) + dur
        key = (matmath.kernel_family(name), dt)
        fam[key] = fam.get(key, 0.0) + dur
    res.source = "kernel names" + (", launching op Input type" if from_op else "")
    _set_layout(res, conv, sum(acc.values()), layout)
    # the GEMM ops first (few), so that only the kernels of their external ids are looked up in the launches:
    # every kernel's would be (a quarter of the precision analysis on 8 ranks)
    gemm_ops = """SELECT o.file_id, o.external_id, o.name, o.input_dims, o.input_types
        FROM cpu_ops o JOIN files f USING (file_id) WHERE f.run_id = $1 AND o.cat = 'cpu_op'
          AND o.name IN ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm')"""
    few = ("k.external_id IS NOT NULL AND k.cat <> 'gpu_user_annotation' "
           "AND k.external_id IN (SELECT external_id FROM g)")
    return con.execute(f"""
        WITH g AS ({gemm_ops})
        SELECT o.name, o.input_dims, o.input_types, sum(k.dur_ns)
        FROM g o JOIN ({counted_kernels_sql("$1", few)}) k ON k.file_id = o.file_id AND k.external_id = o.external_id
        GROUP BY o.file_id, o.external_id, o.name, o.input_dims, o.input_types""", [run_id]).fetchall()


def _set_layout(res: PrecisionMix, conv_ns: float, total_ns: float, layout_ns: dict[str, float]) -> None:
    """``res.conv_share_pct`` (% of matrix-math time in convolution kernels), ``res.layout_us`` (µs of the counted
    kernels whose names say a layout, by :func:`traceanalyze.matmath.activation_layout`) and ``res.layout``:
    ``NCHW`` when the kernels that run on NCHW tensors or transpose them take longer than PyTorch's channels-last
    kernels, ``channels_last`` when only those name a layout, else None (the names do not tell)."""
    res.conv_share_pct = round(100 * conv_ns / total_ns, 2) if total_ns > 0 else 0.0
    res.layout_us = {k: round(v / 1e3, 3) for k, v in sorted(layout_ns.items())}
    nchw = layout_ns.get("nchw", 0.0) + layout_ns.get("transpose", 0.0)
    cl = layout_ns.get("channels_last", 0.0)
    res.layout = "NCHW" if nchw > cl else "channels_last" if cl > 0 else None


# Leaf matrix ops whose Input Dims give the model's FLOPs (forward and backward as the trace records them: linear
# and matmul run one of the GEMM leaves, so only the leaves count)
GEMM_LEAVES = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation")
SDPA_FORWARD = ("aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention",
                "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward",
                "aten::_efficient_attention_forward")
SDPA_BACKWARD = ("aten::_scaled_dot_product_efficient_attention_backward",
                 "aten::_scaled_dot_product_flash_attention_backward",
                 "aten::_scaled_dot_product_cudnn_attention_backward", "aten::_flash_attention_backward",
                 "aten::_efficient_attention_backward")
CONV_FORWARD = ("aten::cudnn_convolution", "aten::mkldnn_convolution", "aten::miopen_convolution",
                "aten::_slow_conv2d_forward", "aten::slow_conv3d_forward")
CONV_BACKWARD = ("aten::convolution_backward",)
FLOP_OPS = GEMM_LEAVES + SDPA_FORWARD + SDPA_BACKWARD + CONV_FORWARD + CONV_BACKWARD
DISTINCT_SHAPES_MAX = 100_000  # distinct (op, Input Dims) read for the model FLOPs, the most frequent first


def _dims(d, i: int) -> list[int] | None:
    x = d[i] if isinstance(d, list) and len(d) > i else None
    return x if isinstance(x, list) and x and all(isinstance(v, int) and 0 <= v < 1 << 40 for v in x) else None


def op_flops(op: str, dims_json: str | None) -> float | None:
    """FLOPs of one recorded matrix op from its ``Input Dims``; None when the shapes are missing or do not fit.

    - GEMMs: 2·(B·)M·N·K (:func:`gemm_flops`).
    - Attention (SDPA forward): q [B,H,Sq,D], k [B,H,Sk,D]: 4·B·H·Sq·Sk·D (QKᵀ and PV; a causal mask's skipped half
      counted, as PyTorch's flop counter does); backward 2.5× its forward (five GEMMs against two: FlashAttention-2,
      Dao 2023), from q and k after the output gradient.
    - Convolution: input [N,C,H,W…], weight [K,C/g,R,S…]: 2·N·K·(C/g)·R·S·P·Q; forward with P·Q = H·W (stride and
      padding are not recorded: exact for a stride-1 "same" convolution, an upper bound otherwise); backward
      (``convolution_backward``: grad_out [N,K,P,Q…] first) 2× that, from the output gradient's own P·Q."""
    if op in GEMM_LEAVES:
        return gemm_flops("aten::addmm" if op == "aten::_addmm_activation" else op, dims_json)
    d = record_json(dims_json)
    if op in SDPA_FORWARD or op in SDPA_BACKWARD:
        off = 1 if op in SDPA_BACKWARD else 0
        q, k = _dims(d, off), _dims(d, off + 1)
        if not (q and k and len(q) == 4 and len(k) == 4):
            return None
        f = 4.0 * q[0] * q[1] * q[2] * k[2] * q[3]
        return f * 2.5 if off else f
    if op in CONV_FORWARD or op in CONV_BACKWARD:
        back = op in CONV_BACKWARD
        x, w = (_dims(d, 1), _dims(d, 2)) if back else (_dims(d, 0), _dims(d, 1))
        out = _dims(d, 0) if back else None
        if not (x and w and len(x) == len(w) and len(x) >= 3):
            return None
        spatial = out[2:] if out and len(out) == len(x) else x[2:]
        f = 2.0 * x[0] * w[0] * w[1] * math.prod(w[2:]) * math.prod(spatial)
        return 2 * f if back else f
    return None


def model_flops(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[float | None, int]:
    """(model FLOPs per rank and counted step, ops that gave FLOPs): every leaf matrix op (:data:`FLOP_OPS`, on any
    thread: backward runs on autograd's) that starts inside a counted profiler step of its file, summed with
    :func:`op_flops`, over the counted (rank, step) pairs. (None, 0) without shapes (``record_shapes`` off) or
    steps."""
    # each distinct (op, shapes) once with its count: shapes repeat over layers, steps and ranks (bounded: the
    # DISTINCT_SHAPES_MAX most frequent)
    rows = con.execute("""
        WITH st AS (SELECT file_id, rank, step, start_ns, end_ns FROM profiler_steps($1) WHERE counted)
        SELECT c.name, c.input_dims, count(*) AS n, any_value((SELECT count(*) FROM st)) FROM cpu_ops c
        JOIN st ON st.file_id = c.file_id AND c.ts_ns >= st.start_ns AND c.ts_ns < st.end_ns
        WHERE c.cat = 'cpu_op' AND c.name IN (SELECT unnest($2)) AND c.input_dims IS NOT NULL
        GROUP BY c.name, c.input_dims ORDER BY n DESC LIMIT $3""",
                       [run_id, list(FLOP_OPS), DISTINCT_SHAPES_MAX]).fetchall()
    total, n_ops, n_steps = 0.0, 0, 0
    for name, dims, count, steps in rows:
        n_steps = steps
        f = op_flops(name, dims)
        if f:
            total += f * count
            n_ops += count
    return (total / n_steps if n_steps and n_ops else None), n_ops
