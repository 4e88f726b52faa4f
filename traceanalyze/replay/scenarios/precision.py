"""The precision what-ifs: ``tf32_matmul`` (TF32 tensor cores for fp32 matrix math), ``bf16_matmul`` (bf16
autocast) and ``bf16_channels_last`` (bf16 autocast and channels_last on a conv net with NCHW activations). On GPU
runs each re-times the kernels the switch changes by the GPU's peaks (:mod:`traceanalyze.replay.precision`: the
model, its constants and their sources); on CPU runs bf16 is an assumed speed-up of the fp32 matrix math.

Compared with a baseline that made the switch (``ctx["baseline"]["matmath"]``:
:func:`traceanalyze.replay.frombase.matmath_figures`), the matrix math is priced with the baseline's measured
speed-up of each kernel family both runs have instead (:func:`from_baseline`): its point estimate is the measured
factor, its range runs from it to the model's point estimate. A factor under 1 (the switch made that math slower
there) or over the model's ratio × :data:`MEASURED_OVER_MODEL_MAX` (more than the datasheet allows: not the same
math, another model or batch) is left to the model, and the assumptions say why. On a CPU run whose host lacks AMX
and AVX512-BF16 (bf16 left out), a baseline on the same CPU model that measured bf16 faster lifts that: the
measurement shows the host runs that math faster in bf16 (:func:`host_proven`)."""

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
# a baseline's measured speed-up above the model's ratio (GPU: the datasheet peaks'; CPU: CPU_BF16_SPEEDUP) × this is
# read as not the same math (another model, batch or kernel choice): the model prices it. 1.5: the model's point
# estimate is ratio/√2 and its range reaches ratio; 1.5 × ratio leaves room for a fp32 baseline of poor kernels.
MEASURED_OVER_MODEL_MAX = 1.5


def model_ratio(ctx: dict, fix: model.Fix) -> float:
    """The model's speed-up ceiling of ``fix``'s matrix math: the GPU's peak ratio fp32 → the switch's dtype (GPU
    runs: ``ctx["prec"]``), or on CPU runs :data:`CPU_BF16_SPEEDUP`."""
    pc = ctx.get("prec")
    if pc:
        return pc["peaks"].ratio("fp32", pc[fix.mode] or "bf16") or 0.0
    return CPU_BF16_SPEEDUP


def from_baseline(ctx: dict, fix: model.Fix) -> tuple[dict[str, float], list[str], dict | None]:
    """(measured speed-up by kernel family within the bound, why each other family is left to the model, the
    baseline's figures or None) of the baseline the run is compared with (module docstring)."""
    fig = (ctx.get("baseline") or {}).get("matmath")
    if not fig or fig["mode"] != fix.mode or fig.get("channels_last", False) != fix.channels_last:
        return {}, [], None
    hi = model_ratio(ctx, fix) * MEASURED_OVER_MODEL_MAX
    ok, out = {}, []
    for fam, v in fig["families"].items():
        f = v["factor"]
        if 1.0 <= f <= hi:
            ok[fam] = f
            continue
        why = (f"slower in {fig['dtype']} there" if f < 1 else
               "more than the model allows: not the same math")
        out.append(f"{fam}: the baseline's {f:.2f}× is outside 1–{hi:.3g}× ({why}), so the model prices it")
    return ok, out, fig


def combined(ok: dict[str, float], fig: dict) -> float:
    """One speed-up over the families of ``ok``: their µs per step here over the baseline's (CPU runs: the fp32
    matrix math is one cover, not split by family)."""
    fams = [fig["families"][f] for f in ok]
    return sum(v["subject_us"] for v in fams) / sum(v["baseline_us"] for v in fams)


def measured_note(ctx: dict, fix: model.Fix) -> str:
    """``; matrix math from baseline: ...`` for the assumptions of a switch priced from the baseline, with the
    families left to the model and why; "" without a baseline's figures. On CPU runs (no ``ctx["prec"]``) one
    factor over the families within the bound (:func:`combined`) re-times all the fp32 matrix math."""
    ok, out, fig = from_baseline(ctx, fix)
    if fig is None:
        return ""
    name = ctx["baseline"]["name"]
    if ok and not ctx.get("prec"):
        out = [o.replace("so the model prices it", "left out of the factor") for o in out]
        return (f"; matrix math from baseline: {combined(ok, fig):.2f}× faster in {fig['dtype']} ("
                + ", ".join(f"{f} {fig['families'][f]['subject_us'] / 1e3:.2f} ms here, "
                            f"{fig['families'][f]['baseline_us'] / 1e3:.2f} ms there" for f in ok)
                + f"; {name}: the kernel family's time per rank and counted step, mean), one factor for all the "
                "fp32 matrix math (a CPU run's matrix math is one cover, not split by family)"
                + "".join(f"; {o}" for o in out))
    parts = [f"{f} {x:.2f}× faster ({fig['families'][f]['subject_us'] / 1e3:.2f} ms here, "
             f"{fig['families'][f]['baseline_us'] / 1e3:.2f} ms there)" for f, x in ok.items()]
    text = (f"; matrix math from baseline: {', '.join(parts)} in {fig['dtype']} ({name}: the kernel family's time "
            f"per rank and counted step, mean), the fp32 matrix math of "
            f"{'that family' if len(ok) == 1 else 'those families'} re-timed by it, range from it to the model's "
            "point estimate" if ok else f"; matrix math not priced from baseline ({name})")
    return text + "".join(f"; {o}" for o in out)


def priced_from(ctx: dict, fix: model.Fix) -> str | None:
    """The what-if row's ``priced_from`` when the baseline's measured speed-up priced it, else None."""
    ok, _, fig = from_baseline(ctx, fix)
    if not ok:
        return None
    return ("the baseline's matrix math (" + ", ".join(f"{f} {x:.2f}×" for f, x in ok.items())
            + f" faster in {fig['dtype']})")


def host_proven(ctx: dict) -> bool:
    """A CPU host without AMX or AVX512-BF16 whose bf16 the baseline measured faster on the same CPU model
    (``env_rank{r}.json``): the measurement lifts the host's ``left_out``."""
    ok, _, _ = from_baseline(ctx, BF16_FIX)
    base_cpu = (ctx.get("baseline") or {}).get("cpu_model")
    return bool(ok) and base_cpu is not None and base_cpu == ctx.get("cpu_model")


def _on_gpu(fix: model.Fix) -> tuple:
    """(rewrite, applies) of a switch the GPU model prices (:mod:`traceanalyze.replay.precision`); CPU runs: none."""

    def rewrite(g: gr.Graph, d, cg, tr, ctx: dict, bound: str = "mid") -> Arrays:
        return model.rewrite(g, d, ctx["prec"], fix, bound, from_baseline(ctx, fix)[0] or None), cg, tr

    def applies(g: gr.Graph, ctx: dict) -> bool:
        return g.mode == "gpu" and bool(ctx.get("prec")) and model.applies(g, ctx["prec"], fix)

    return rewrite, applies


def _rw_bf16(g: gr.Graph, d, cg, tr, ctx: dict, bound: str = "mid") -> Arrays:
    """GPU runs: the model's re-timing; CPU runs: the fp32 matrix math ``ctx["bf16"]`` (low, mid, high speed-up, at
    ``bound``) faster, or the baseline's measured speed-up (:func:`combined`; the range from it to the model's
    mid), plus casts at :data:`CAST_SHARE` of the time saved."""
    ok, _, fig = from_baseline(ctx, BF16_FIX)
    if g.mode == "gpu" and ctx.get("prec"):
        return model.rewrite(g, d, ctx["prec"], BF16_FIX, bound, ok or None), cg, tr
    r = ctx["bf16"][model.BOUNDS.index(bound)]
    if ok:
        f, mid = combined(ok, fig), ctx["bf16"][1]
        r = {"low": min(f, mid), "mid": f, "high": max(f, mid)}[bound]
    mm = g.cover["matmul_fp32"]
    return d - mm * (1 - 1 / r) * (1 - CAST_SHARE), cg, tr


def _bf16_applies(g: gr.Graph, ctx: dict) -> bool:
    if ctx.get("native_bf16") is False and not host_proven(ctx):
        return False  # emulated bf16 is slower than fp32: no fix on this host (its left_out says why)
    if g.mode == "gpu":
        return bool(ctx.get("prec")) and model.applies(g, ctx["prec"], BF16_FIX)
    return covered_us(g, "matmul_fp32") >= MIN_SAVING_US


def _bf16_left_out(g: gr.Graph, ctx: dict) -> str | None:
    """bf16 on a CPU that has neither AMX nor AVX512-BF16 (``env_rank{r}.json`` ``cpu.native_bf16``), where oneDNN
    emulates bf16 and the matmuls run slower than in fp32: why the host rules it out, else None."""
    if ctx.get("native_bf16") is not False or float(g.cover["matmul_fp32"].sum()) < MIN_SAVING_US:
        return None
    if host_proven(ctx):  # the baseline measured bf16 faster on this CPU model: the measurement wins
        return None
    ok, _, fig = from_baseline(ctx, BF16_FIX)
    base_cpu = ctx["baseline"].get("cpu_model") if fig else None
    said = (f"; the baseline ({ctx['baseline']['name']}) measured bf16 speed-ups of " + ", ".join(
        f"{f} {v['factor']:.2f}×" for f, v in fig["families"].items())
        + (f" on another CPU ({base_cpu or 'model unknown'}), which does not speak for this host" if ok
           else " (under 1: slower, as this host's CPU predicts)")) if fig else ""
    return (f"the host CPU ({ctx.get('cpu_model') or 'model unknown'}) has neither AMX nor AVX512-BF16: bf16 "
            "matmuls would be emulated, slower than fp32, so bf16 autocast is no fix on this host" + said)


def _bf16_why_not(g: gr.Graph, ctx: dict) -> str:
    if ctx.get("native_bf16") is False and not host_proven(ctx):
        return _bf16_left_out(g, ctx) or "no fp32 matrix math in the replayed steps"
    return NO_REWRITE


def _bf16_assumptions(ctx: dict, g: gr.Graph) -> str:
    if ctx.get("prec"):
        return model.assumptions(BF16_FIX, ctx["prec"]) + measured_note(ctx, BF16_FIX)
    ok, _, fig = from_baseline(ctx, BF16_FIX)
    lo, mid, hi = ctx["bf16"]
    if ok:
        f = combined(ok, fig)
        proven = (f"; the host CPU ({ctx.get('cpu_model')}) has neither AMX nor AVX512-BF16, but the baseline "
                  "measured bf16 faster on the same CPU model" if ctx.get("native_bf16") is False else "")
        return (f"fp32 matrix math {f:.2f}× faster in bf16 (range {min(f, mid):.2f}–{max(f, mid):.2f}×: from the "
                f"baseline's measured speed-up to the model's {mid:g}×), plus casts at {CAST_SHARE:.0%} of the time "
                f"saved; collective bytes unchanged (DDP reduces fp32 gradients under autocast)"
                + measured_note(ctx, BF16_FIX) + proven)
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
    assumptions=lambda ctx, g: model.assumptions(TF32_FIX, ctx["prec"]) + measured_note(ctx, TF32_FIX),
    priced_from=lambda ctx, g: priced_from(ctx, TF32_FIX), precision=TF32_FIX,
    offered_first=("fp32_matmul",))
BF16 = Scenario(
    name="bf16_matmul", cause="precision: fp32 matrix math", rewrite=_rw_bf16, applies=_bf16_applies,
    why_not=_bf16_why_not, assumptions=_bf16_assumptions, kinds=("fp32_matmul", "autocast_missing"),
    precision=BF16_FIX, supersedes=(TF32_MATMUL.name,), left_out=_bf16_left_out,
    priced_from=lambda ctx, g: priced_from(ctx, BF16_FIX))
BF16_CHANNELS_LAST = Scenario(
    name="bf16_channels_last", cause="precision: fp32 matrix math, NCHW activations (conv net)", rewrite=_cl_rewrite,
    applies=_cl_applies, why_not=_channels_last_why_not,
    assumptions=lambda ctx, g: (model.assumptions(CHANNELS_LAST_FIX, ctx["prec"])
                                + measured_note(ctx, CHANNELS_LAST_FIX)),
    priced_from=lambda ctx, g: priced_from(ctx, CHANNELS_LAST_FIX), precision=CHANNELS_LAST_FIX,
    extends=BF16.name, split_note=_split_note, supersedes=(TF32_MATMUL.name, BF16.name))
SCENARIOS = (TF32_MATMUL, BF16, BF16_CHANNELS_LAST)
