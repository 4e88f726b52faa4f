"""The precision what-ifs: ``tf32_matmul`` (TF32 tensor cores for fp32 matrix math), ``bf16_matmul`` (bf16
autocast) and ``bf16_channels_last`` (bf16 autocast and channels_last on a conv net with NCHW activations). On GPU
runs each re-times the kernels the switch changes by the GPU's peaks (:mod:`traceanalyze.replay.precision`: the
model, its constants and their sources); on CPU runs bf16 is an assumed speed-up of the fp32 matrix math."""

from __future__ import annotations

from traceanalyze.replay import graph as gr
from traceanalyze.replay import precision as model
from traceanalyze.replay.scenarios.base import MIN_SAVING_US, Arrays, Scenario, covered_us

# bf16 over fp32 matrix-math speed-up (low, mid, high). GPUs: bf16 tensor cores vs TF32 (2x) up to fp32 CUDA
# cores (8-16x on sm80/sm90 datasheets); CPUs without AMX: half the bytes moved, conversions eat part of it, up to
# CPU_BF16_SPEEDUP (the speed-up the precision rule of traceanalyze.diagnose assumes).
CPU_BF16_SPEEDUP = 2.0  # bf16 halves bytes moved; CPUs with AMX/AVX512-BF16 gain more
BF16_SPEEDUP_GPU = (2.0, 4.0, 8.0)
BF16_SPEEDUP_CPU = (1.25, 1.5, CPU_BF16_SPEEDUP)
CAST_SHARE = 0.1  # cast (aten::_to_copy) cost added, as a share of the matrix-math time saved
TF32_FIX, BF16_FIX, CHANNELS_LAST_FIX = model.Fix("tf32"), model.Fix("bf16"), model.Fix("bf16", channels_last=True)
NO_REWRITE = "no fp32 matrix math in the replayed steps that the precision model rewrites"


def _on_gpu(fix: model.Fix) -> tuple:
    """(rewrite, applies) of a switch the GPU model prices (:mod:`traceanalyze.replay.precision`); CPU runs: none."""

    def rewrite(g: gr.Graph, d, cg, tr, ctx: dict, bound: str = "mid") -> Arrays:
        return model.rewrite(g, d, ctx["prec"], fix, bound), cg, tr

    def applies(g: gr.Graph, ctx: dict) -> bool:
        return g.mode == "gpu" and bool(ctx.get("prec")) and model.applies(g, ctx["prec"], fix)

    return rewrite, applies


def _rw_bf16(g: gr.Graph, d, cg, tr, ctx: dict, bound: str = "mid") -> Arrays:
    """GPU runs: the model's re-timing; CPU runs: the fp32 matrix math ``ctx["bf16"]`` (low, mid, high speed-up, at
    ``bound``) faster, plus casts at :data:`CAST_SHARE` of the time saved."""
    if g.mode == "gpu" and ctx.get("prec"):
        return model.rewrite(g, d, ctx["prec"], BF16_FIX, bound), cg, tr
    r = ctx["bf16"][model.BOUNDS.index(bound)]
    mm = g.cover["matmul_fp32"]
    return d - mm * (1 - 1 / r) * (1 - CAST_SHARE), cg, tr


def _bf16_applies(g: gr.Graph, ctx: dict) -> bool:
    if ctx.get("native_bf16") is False:
        return False  # emulated bf16 is slower than fp32: no fix on this host (its left_out says why)
    if g.mode == "gpu":
        return bool(ctx.get("prec")) and model.applies(g, ctx["prec"], BF16_FIX)
    return covered_us(g, "matmul_fp32") >= MIN_SAVING_US


def _bf16_left_out(g: gr.Graph, ctx: dict) -> str | None:
    """bf16 on a CPU that has neither AMX nor AVX512-BF16 (``env_rank{r}.json`` ``cpu.native_bf16``), where oneDNN
    emulates bf16 and the matmuls run slower than in fp32: why the host rules it out, else None."""
    if ctx.get("native_bf16") is not False or float(g.cover["matmul_fp32"].sum()) < MIN_SAVING_US:
        return None
    return (f"the host CPU ({ctx.get('cpu_model') or 'model unknown'}) has neither AMX nor AVX512-BF16: bf16 "
            "matmuls would be emulated, slower than fp32, so bf16 autocast is no fix on this host")


def _bf16_why_not(g: gr.Graph, ctx: dict) -> str:
    if ctx.get("native_bf16") is False:
        return _bf16_left_out(g, ctx) or "no fp32 matrix math in the replayed steps"
    return NO_REWRITE


def _bf16_assumptions(ctx: dict, g: gr.Graph) -> str:
    if ctx.get("prec"):
        return model.assumptions(BF16_FIX, ctx["prec"])
    lo, mid, hi = ctx["bf16"]
    return (f"fp32 matrix math {mid:g}× faster in bf16 (range {lo:g}–{hi:g}× gives the range), plus casts at "
            f"{CAST_SHARE:.0%} of the time saved; no measured bf16 kernel of the same shape is used; collective "
            "bytes unchanged (DDP reduces fp32 gradients under autocast)")


def _channels_last_why_not(g: gr.Graph, ctx: dict) -> str:
    if g.mode != "gpu":
        return "channels_last is priced on GPU runs (cuDNN's NHWC tensor-core convolutions)"
    if BF16.applies(g, ctx):
        return model.channels_last_why_not(ctx["prec"])
    return NO_REWRITE


def _split_note(row: dict, alone: dict) -> str:
    """Which change carries the ``bf16_channels_last`` row's saving: bf16 alone (``alone``, its row, priced before
    it), and what channels_last adds, in points of the step."""
    return (f"; bf16 alone ({alone['scenario']}) {alone['saving_pct']:.1f} %, + channels_last "
            f"{row['saving_pct']:.1f} %: channels_last adds {row['saving_pct'] - alone['saving_pct']:.1f} points")


_tf32_rewrite, _tf32_applies = _on_gpu(TF32_FIX)
_cl_rewrite, _cl_applies = _on_gpu(CHANNELS_LAST_FIX)
TF32_MATMUL = Scenario(
    name="tf32_matmul", cause="precision: fp32 matrix math (TF32 off)", rewrite=_tf32_rewrite, applies=_tf32_applies,
    why_not=lambda g, ctx: "TF32 is a GPU feature" if g.mode != "gpu" else NO_REWRITE,
    assumptions=lambda ctx, g: model.assumptions(TF32_FIX, ctx["prec"]), precision=TF32_FIX,
    offered_first=("fp32_matmul",))
BF16 = Scenario(
    name="bf16_matmul", cause="precision: fp32 matrix math", rewrite=_rw_bf16, applies=_bf16_applies,
    why_not=_bf16_why_not, assumptions=_bf16_assumptions, kinds=("fp32_matmul", "autocast_missing"),
    precision=BF16_FIX, supersedes=(TF32_MATMUL.name,), left_out=_bf16_left_out)
BF16_CHANNELS_LAST = Scenario(
    name="bf16_channels_last", cause="precision: fp32 matrix math, NCHW activations (conv net)", rewrite=_cl_rewrite,
    applies=_cl_applies, why_not=_channels_last_why_not,
    assumptions=lambda ctx, g: model.assumptions(CHANNELS_LAST_FIX, ctx["prec"]), precision=CHANNELS_LAST_FIX,
    extends=BF16.name, split_note=_split_note, supersedes=(TF32_MATMUL.name, BF16.name))
SCENARIOS = (TF32_MATMUL, BF16, BF16_CHANNELS_LAST)
