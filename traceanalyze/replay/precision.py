"""The precision what-ifs on GPU runs: ``tf32_matmul`` and ``bf16_matmul`` re-time each kernel the switch changes,
by its class (:data:`traceanalyze.replay.graph.PRECISION_CLASSES`), then the graph is replayed.

The model (a roofline per kernel class; ``shared/WHATIF.md`` §6 and §10):

- **Compute-bound matrix math** (GEMM, convolution, attention on CUDA cores in fp32) is re-timed by the ratio of the
  GPU's dense peaks, old math mode to new (:func:`traceanalyze.hardware.gpu_peaks`: fp32 CUDA cores → TF32 or
  bf16 tensor cores; on an H100/H200 495/67 = 7.4× and 989/67 = 14.8×). A kernel keeps the share of its peak that
  the trace shows it reaching only at best: on the same shape, tensor cores finish the math several times sooner
  and memory traffic takes a larger share, so the low end of the range assumes half the share (ratio / 2), the
  high end the whole share (ratio), and the point estimate their geometric mean (ratio / √2). No kernel is
  brought below :data:`MIN_KERNEL_US`.
- **Already TF32** matrix math gains bf16/TF32 (2× on sm80+) under ``bf16_matmul`` and nothing under ``tf32_matmul``.
- **Attention in fp32** (PyTorch's memory-efficient SDPA kernels ``fmha_cutlass*_f32``) has no TF32 path: unchanged
  by ``tf32_matmul`` (``torch.backends.cuda.matmul.allow_tf32`` does not reach SDPA), re-timed like GEMMs by
  ``bf16_matmul``.
- **Memory-bound kernels that autocast moves to bf16** (kernels of fp32 ops that are not on autocast's fp32 list and
  do not update fp32 state in place) move 2 bytes per element instead of 4 when every operand is bf16, and the same
  bytes when autocast keeps an operand fp32 (the residual stream, a norm's statistics): time × 0.5 at best, × 1.0 at
  worst, × 0.75 as the point estimate.
- **The casts autocast adds**: every fp32 input of a forward matrix op (``aten::linear``, ``conv*``, SDPA, ...:
  :data:`traceanalyze.matmath.AUTOCAST_LOWP_OPS`) read in fp32 and written in bf16 (6 bytes per element), and each
  weight gradient cast back (6 bytes per weight element), over the HBM bandwidth at :data:`COPY_EFFICIENCY`. The
  bytes come from the ops' ``Input Dims`` (``record_shapes=True``); without shapes the casts cost
  :data:`CAST_SHARE_NO_SHAPES` of the matrix-math time saved.

``tf32_matmul`` is ``torch.set_float32_matmul_precision("high")`` plus ``torch.backends.cudnn.allow_tf32 = True``;
it needs sm80 or later. ``bf16_matmul`` on sm70/sm75 is fp16 autocast with a GradScaler (no bf16 there).

``bf16_channels_last`` is the fix PyTorch's AMP and channels_last guides give conv nets: bf16 autocast plus
``model.to(memory_format=torch.channels_last)`` (and the inputs). It applies where convolutions are most of the
matrix math (:data:`CONV_SHARE_MIN`) and kernel names say the activations are NCHW
(:func:`traceanalyze.matmath.activation_layout`). Against ``bf16_matmul`` it changes what channels_last changes:

- **Convolutions**: the same bf16/fp32 peak ratio and casts as ``bf16_matmul``: cuDNN's bf16 tensor-core
  convolutions are NHWC implicit GEMMs in either layout (``…_nhwckrsc_nhwc_…``); NCHW only adds the transposes
  around them.
- **Layout transposes** (``nchwToNhwcKernel``, ``nhwcToNchwKernel``): removed. On channels_last tensors cuDNN reads
  and writes the activations in the layout its tensor-core kernels compute in (cuDNN Developer Guide, "Tensor
  Layouts": NHWC is the tensor-core layout; PyTorch's channels_last tutorial).
- **Memory-bound kernels that autocast moves** (batch norm, ReLU, pooling, the residual add): time ×
  :data:`CHANNELS_LAST_MEMORY_FACTORS` (0.5 as the point estimate: half the bytes). In a conv net every activation
  that these kernels read and write is a convolution's bf16 output or its gradient, so each moves 2 bytes per
  element instead of 4; the range's low end keeps ``bf16_matmul``'s 0.75 (an operand left fp32). In NCHW the bytes
  halve too, but bf16 batch norm leaves cuDNN (PyTorch ``_select_batch_norm_backend``: no cuDNN for bf16 inputs) for
  PyTorch's NCHW kernels, which on the H100 conv pair took 1.3× the fp32 cuDNN ones' time
  (``tests/data/gpu/h100``: 24.4 → 31.3 ms a step), against × 0.58 in channels_last (14.1 ms): ``bf16_matmul``
  keeps its 0.75 midpoint.
- **In-place elementwise kernels of the forward and backward** (``relu_``'s ``clamp_min_``, the residual ``add_``):
  the same × 0.5; outside the optimizer step an in-place op updates an activation, not fp32 state
  (``bf16_matmul`` leaves every in-place fp32 op unchanged, which keeps optimizers fp32).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import duckdb
import numpy as np

from traceanalyze import matmath
from traceanalyze.hardware import GpuInfo, Peaks, features, gpu_peaks
from traceanalyze.replay import graph as gr

MIN_KERNEL_US = 2.0  # no kernel re-timed below this: a launch's own latency on the GPU (a few µs)
MEMORY_FACTORS = (1.0, 0.75, 0.5)  # memory-bound kernels under autocast: time × factor (low, mid, high saving)
COPY_EFFICIENCY = 0.8  # share of the HBM peak a large cast kernel reaches (streaming copy)
CAST_SHARE_NO_SHAPES = 0.1  # casts as a share of the matrix-math time saved, when the trace has no Input Dims
BOUNDS = ("low", "mid", "high")  # the range's ends and the point estimate, by saving
DISTINCT_SHAPES_MAX = 100_000  # distinct (Input Dims, Input type) of forward matrix ops read for the casts
# bf16_channels_last: memory-bound kernels at bf16 bytes, time × factor (low, mid, high saving): half the bytes of
# fp32 at the point estimate and the high end; the low end is bf16_matmul's point estimate (an operand left fp32)
CHANNELS_LAST_MEMORY_FACTORS = (0.75, 0.5, 0.5)
CONV_SHARE_MIN = 50.0  # % of the fp32/TF32 matrix-math time in convolutions from which channels_last is offered
# the dtypes a run that made a switch shows as its main matrix-math dtype (bf16 autocast is fp16 before sm80)
MODE_DTYPES = {"tf32": ("tf32",), "bf16": ("bf16", "fp16")}


@dataclass(frozen=True)
class Fix:
    """A precision switch: the math ``mode`` fp32 matrix math goes to (``tf32``: TF32 tensor cores, fp32 tensors;
    ``bf16``: bf16 autocast, fp16 with a GradScaler before sm80), and whether channels_last comes with it (conv
    nets on NCHW activations)."""

    mode: str
    channels_last: bool = False

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The main matrix-math dtypes of a run that made this switch (:data:`MODE_DTYPES`)."""
        return MODE_DTYPES[self.mode]


def target_dtype(gpu: GpuInfo, mode: str) -> str | None:
    """The math mode a switch to ``mode`` (:attr:`Fix.mode`) runs fp32 matrix math in on ``gpu``: ``tf32`` (sm80+,
    else None), ``bf16`` (sm80+ or unknown) or ``fp16`` (sm70/sm75 autocast with GradScaler); None when the GPU has
    no such mode (before sm70, or TF32 before sm80)."""
    cc = gpu.capability
    if mode == "tf32":
        return "tf32" if cc is None or features(cc).tf32 else None
    if cc is not None and not features(cc).tensor_cores:
        return None
    return "fp16" if cc is not None and not features(cc).bf16 else "bf16"


def cast_bytes(con: duckdb.DuckDBPyConnection, run_id: int) -> float | None:
    """Bytes the casts of bf16 autocast would move over the run's traced window: 6 per element of every fp32 tensor
    input of a forward matrix op (:data:`traceanalyze.matmath.AUTOCAST_LOWP_OPS`), plus 6 per element of its weight
    (the second input) for the gradient cast back. None when no such op records ``Input Dims``."""
    # each distinct shape once, with its count: shapes repeat over layers, steps and ranks (bounded: the first
    # DISTINCT_SHAPES_MAX, largest counts first)
    rows = con.execute("""
        SELECT c.input_dims, c.input_types, count(*) AS n FROM cpu_ops c JOIN files f USING (file_id)
        WHERE f.run_id = $1 AND c.cat = 'cpu_op' AND c.name IN (SELECT unnest($2)) AND c.input_dims IS NOT NULL
          AND (c.input_types LIKE '["float"%' OR c.input_types LIKE '[''float''%')
        GROUP BY ALL ORDER BY n DESC LIMIT $3""",
                       [run_id, list(matmath.AUTOCAST_LOWP_OPS), DISTINCT_SHAPES_MAX]).fetchall()
    total, seen = 0.0, False
    for dims_text, types_text, count in rows:
        try:
            dims, types = json.loads(dims_text), json.loads(types_text or "[]")
        except ValueError:
            continue
        if not isinstance(dims, list):
            continue
        for i, d in enumerate(dims[:8]):
            if not (isinstance(d, list) and d and all(isinstance(x, int) and 0 <= x < 1 << 40 for x in d)):
                continue
            if i < len(types) and types[i] != "float":
                continue
            n = float(math.prod(d))
            total += 6.0 * n * (2 if i == 1 else 1) * count
            seen = True
    return total if seen else None


def context(con: duckdb.DuckDBPyConnection, g: gr.Graph, gpu: GpuInfo | None) -> dict:
    """What the precision rewrites need for run ``g``: the GPU's peaks (:class:`~traceanalyze.hardware.Peaks`), the
    target math modes, and the casts' µs per µs of fp32 matrix math (``cast_frac``, None without shapes)."""
    gpu = gpu or GpuInfo()
    peaks = gpu_peaks(gpu)
    mm = np.isin(g.prec_class, (gr.P_MM_FP32, gr.P_ATTN_FP32, gr.P_MM_TF32)) if g.prec_class is not None else None
    mm_us = float(g.dur[mm].sum()) if mm is not None else 0.0
    cb = cast_bytes(con, g.run_id) if mm_us > 0 else None
    cast_us = cb / (peaks.hbm_gbps * 1e3 * COPY_EFFICIENCY) if cb else None  # GB/s × 1e3 = bytes per µs
    return {"gpu": gpu, "peaks": peaks, "tf32": target_dtype(gpu, "tf32"), "bf16": target_dtype(gpu, "bf16"),
            "cast_frac": (cast_us / mm_us) if cast_us and mm_us else None, "cast_us": cast_us,
            "layout": layout(g, mm) if mm is not None else None}


def layout(g: gr.Graph, mm: np.ndarray) -> dict:
    """The activations' layout as run ``g``'s kernel names say it (:func:`traceanalyze.matmath.activation_layout`),
    over all its kernels: ``conv_share_pct`` (% of the fp32/TF32 matrix math, ``mm``, in convolution kernels),
    ``nchw_us`` (kernels that run on NCHW tensors), ``transpose_us`` (cuDNN's layout transposes),
    ``channels_last_us`` (PyTorch's channels-last kernels), ``transposes`` (the transposes' name codes) and
    ``nchw_conv_net``: convolutions are at least :data:`CONV_SHARE_MIN` % of that math and the NCHW kernels and
    transposes take longer than the channels-last ones (a switch with channels_last applies)."""
    names = g.name.to_pylist() if hasattr(g.name, "to_pylist") else list(g.name)
    lay = [matmath.activation_layout(n or "") for n in names]
    conv = np.array([matmath.kernel_family(n or "") == "conv" for n in names] + [False], bool)
    code = np.clip(g.name_code, 0, len(names))
    kern = g.kind == gr.K_KERNEL
    us = {k: float(g.dur[kern & np.isin(code, [i for i, x in enumerate(lay) if x == k])].sum())
          for k in ("nchw", "transpose", "channels_last")}
    mm_us = float(g.dur[mm].sum())
    share = 100 * float(g.dur[mm & conv[code]].sum()) / mm_us if mm_us > 0 else 0.0
    return {"conv_share_pct": share, "nchw_us": us["nchw"], "transpose_us": us["transpose"],
            "channels_last_us": us["channels_last"],
            "transposes": np.array([i for i, x in enumerate(lay) if x == "transpose"], np.int64),
            "nchw_conv_net": share >= CONV_SHARE_MIN and us["nchw"] + us["transpose"] > us["channels_last"]}


def _eff(ratio: float | None, bound: str, measured: float | None = None) -> float | None:
    """The speed-up a kernel is re-timed by at ``bound``: the peak ratio's (module docstring), or with a
    ``measured`` speed-up (a baseline's, :mod:`traceanalyze.replay.frombase`) that figure as the point estimate and
    the range from it to the model's point estimate (ratio/√2)."""
    model = None if ratio is None else {"low": ratio / 2.0, "mid": ratio / math.sqrt(2.0), "high": ratio}[bound]
    if measured is None:
        return model if ratio is not None and ratio > 1.0 else None
    mid = ratio / math.sqrt(2.0) if ratio else measured
    return {"low": min(measured, mid), "mid": measured, "high": max(measured, mid)}[bound]


def _retime(d: np.ndarray, sel: np.ndarray, eff: float | None) -> None:
    """``d[sel]`` divided by ``eff`` (:func:`_eff`), in place, never below :data:`MIN_KERNEL_US` (or the kernel's
    own time when shorter)."""
    if eff is None or not sel.any():
        return
    eff = max(eff, 1.0)
    old = d[sel]
    d[sel] = np.maximum(old / eff, np.minimum(old, MIN_KERNEL_US))


def task_families(g: gr.Graph) -> np.ndarray:
    """Per task: the kernel family of its name (:func:`traceanalyze.matmath.kernel_family`: ``gemm``, ``conv``,
    ``attention``), ``""`` for any other task."""
    names = g.name.to_pylist() if hasattr(g.name, "to_pylist") else list(g.name)
    fam = np.array([matmath.kernel_family(n or "") or "" for n in names] + [""], object)
    return fam[np.clip(g.name_code, 0, len(names))]


def rewrite(g: gr.Graph, d: np.ndarray, pc: dict, fix: Fix, bound: str = "mid",
            speedup: dict[str, float] | None = None) -> np.ndarray:
    """Task durations after the switch ``fix`` at ``bound`` (``low``/``mid``/``high`` saving): a copy of ``d`` with
    the precision classes re-timed (module docstring). ``pc``: :func:`context`. ``speedup``: {kernel family:
    measured speed-up} (a baseline's, bounded by :mod:`traceanalyze.replay.scenarios.precision`): the fp32
    matrix-math kernels of those families re-timed by it instead of the peak ratio (:func:`_eff`)."""
    d = d.copy()
    cls = g.prec_class
    if cls is None:
        return d
    peaks: Peaks = pc["peaks"]
    new = pc[fix.mode]
    if new is None:
        return d
    mm, attn, tf = cls == gr.P_MM_FP32, cls == gr.P_ATTN_FP32, cls == gr.P_MM_TF32
    autocast = fix.mode == "bf16"
    before = d.copy() if autocast else None
    ratio = peaks.ratio("fp32", new)
    done = np.zeros(d.size, bool)
    if speedup:
        fam, fp32 = task_families(g), (mm | attn) if autocast else mm
        for f, x in speedup.items():
            sel = fp32 & (fam == f)
            _retime(d, sel, _eff(ratio, bound, x))
            done |= sel
    _retime(d, mm & ~done, _eff(ratio, bound))
    if autocast:
        _retime(d, attn & ~done, _eff(ratio, bound))
        _retime(d, tf, _eff(peaks.ratio("tf32", new), bound))
        mem = cls == gr.P_MEM
        if fix.channels_last:
            mem |= activation_in_place(g)
            d[mem] = d[mem] * CHANNELS_LAST_MEMORY_FACTORS[BOUNDS.index(bound)]
            d[np.isin(g.name_code, pc["layout"]["transposes"]) & (g.kind == gr.K_KERNEL)] = 0.0
        else:
            d[mem] = d[mem] * MEMORY_FACTORS[BOUNDS.index(bound)]
        sel = mm | attn | tf
        if pc.get("cast_frac"):
            d[sel] += before[sel] * pc["cast_frac"]
        else:
            d[sel] += (before[sel] - d[sel]) * CAST_SHARE_NO_SHAPES
    return d


def activation_in_place(g: gr.Graph) -> np.ndarray:
    """Per task: a kernel of an in-place fp32 op (``relu_``, ``add_``; not on autocast's fp32 list:
    :data:`traceanalyze.replay.graph.P_MEM_IN_PLACE`) launched outside the optimizer step (its launch call is not
    under an ``Optimizer.step`` range), which updates an activation or its gradient, not fp32 state."""
    out = g.prec_class == gr.P_MEM_IN_PLACE
    if not out.any():
        return out
    launch = g.dep_type == gr.DEP_TYPES.index("launch")
    src, dst = g.dep_src[launch], g.dep_dst[launch]
    under = np.zeros(g.start.size, bool)
    under[dst] = g.cover["optimizer"][src] > 0
    return out & ~under


def applies(g: gr.Graph, pc: dict, fix: Fix) -> bool:
    """Whether the switch ``fix`` changes any kernel of ``g`` on this GPU; with channels_last only on a conv net
    with NCHW activations (:func:`layout`: ``nchw_conv_net``)."""
    if g.prec_class is None or pc[fix.mode] is None:
        return False
    if fix.channels_last and not (pc.get("layout") or {}).get("nchw_conv_net"):
        return False
    classes = (gr.P_MM_FP32,) if fix.mode == "tf32" else (gr.P_MM_FP32, gr.P_ATTN_FP32, gr.P_MM_TF32)
    return bool(np.isin(g.prec_class, classes).any())


def channels_last_why_not(pc: dict) -> str:
    """Why channels_last does not apply to a run whose fp32 matrix math bf16 autocast rewrites, in words (``pc``:
    :func:`context`)."""
    lay = pc.get("layout") or {}
    if lay.get("conv_share_pct", 0.0) < CONV_SHARE_MIN:
        return (f"convolutions are {lay.get('conv_share_pct', 0.0):.0f} % of the fp32 matrix math, under the "
                f"{CONV_SHARE_MIN:g} % of a conv net")
    return "no kernel name says the activations are NCHW (channels_last already, or the names do not tell)"


def assumptions(fix: Fix, pc: dict) -> str:
    """The model's assumptions for the switch ``fix``, with the peaks it used and where they come from."""
    peaks: Peaks = pc["peaks"]
    new = pc[fix.mode]
    r = peaks.ratio("fp32", new or "bf16")
    src = f"dense datasheet peaks of an {peaks.reference}" + (f" ({peaks.assumed})" if peaks.assumed else "")
    if fix.mode == "tf32":
        return (f"fp32 GEMMs and convolutions on CUDA cores re-timed by the TF32/fp32 peak ratio "
                f"{r or 0:.1f}× ({src}); range {(r or 0) / 2:.1f}–{r or 0:.1f}×, point estimate at ratio/√2; "
                "fp32 attention (SDPA) and every other kernel unchanged; no kernel below "
                f"{MIN_KERNEL_US:g} µs")
    casts = (f"casts {pc['cast_us'] / 1e3:.2f} ms over the window (6 bytes per fp32 input element of each forward "
             f"matrix op, weight gradients cast back, at {COPY_EFFICIENCY:.0%} of {peaks.hbm_gbps:,.0f} GB/s)"
             if pc.get("cast_us") else f"casts at {CAST_SHARE_NO_SHAPES:.0%} of the time saved (no Input Dims)")
    math_ = (f"fp32 matrix math (GEMM, convolution, attention) re-timed by the {new}/fp32 peak ratio {r or 0:.1f}× "
             f"({src}; TF32 kernels by {new}/TF32), range ratio/2 to ratio, point estimate ratio/√2")
    if fix.channels_last:
        lay = pc["layout"]
        lo, mid, _ = CHANNELS_LAST_MEMORY_FACTORS
        return (f"bf16 autocast + channels_last (convolutions {lay['conv_share_pct']:.0f} % of the fp32 matrix "
                f"math; kernels on NCHW tensors {lay['nchw_us'] / 1e3:.2f} ms and layout transposes "
                f"{lay['transpose_us'] / 1e3:.2f} ms over the window, by name): {math_}, the convolutions as NHWC "
                f"tensor-core kernels; the layout transposes removed; memory-bound kernels that autocast moves and "
                f"in-place ones outside the optimizer (ReLU, residual add) at bf16 bytes, × {mid:g} (range {lo:g}–"
                f"{mid:g}); {casts}; collective bytes unchanged")
    return (f"{math_}; memory-bound "
            f"kernels that autocast moves × {MEMORY_FACTORS[1]:g} (range {MEMORY_FACTORS[0]:g}–"
            f"{MEMORY_FACTORS[2]:g}); {casts}; collective bytes unchanged (DDP reduces fp32 gradients)")
