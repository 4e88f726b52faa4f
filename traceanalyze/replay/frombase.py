"""The baseline's measured figures that price a subject's what-ifs (``--baseline``, the baseline analyzed first:
:func:`traceanalyze.pipeline.run_pipeline`): where the baseline fixes a cause, the subject's what-if of that cause is
priced with what the baseline measured instead of the model's constant. The link (its busbw) is
:func:`traceanalyze.replay.scenarios.ranks.link_from_baseline`; this module gathers the other two:

- **matrix math** (:func:`matmath_figures`): the subject runs its matrix math in fp32 and the baseline in bf16/fp16
  (``bf16_matmul``, ``bf16_channels_last``) or TF32 (``tf32_matmul``). Per kernel family (``gemm``, ``conv``,
  ``attention``) that both runs have, the measured speed-up is the subject's matrix-math µs of that family per rank
  and counted step over the baseline's (:attr:`traceanalyze.metrics.precision.PrecisionMix.family_us_per_step`),
  counted only where the subject runs the family mostly in fp32 and the baseline mostly in the switch's dtypes
  (:data:`MAIN_SHARE_MIN`). The same model and batch are assumed (a comparison's premise, ``docs/comparisons.md``);
  the precision scenarios (:mod:`traceanalyze.replay.scenarios.precision`) bound the factor and fall back to the
  model outside the bound.
- **data-loader wait** (:func:`loader_figures`): the baseline's loader µs per rank and counted step
  (:meth:`traceanalyze.metrics.host.LoaderStats.wait_us_per_step`) when under half the subject's:
  ``no_dataloader_wait`` keeps that wait instead of none.
"""

from __future__ import annotations

from traceanalyze.replay.precision import MODE_DTYPES

MAIN_SHARE_MIN = 0.5  # a family counts when this share of its time is fp32 here and in the switch's dtypes there
# the baseline fixes the loader wait when it waits less than this share of the subject's: the share at which the
# comparison calls a finding's cost changed (traceanalyze.diagnose.compare.CHANGED_COST_SHARE); above it the two
# waits differ by run-to-run noise, not by a fix (0.37 against 0.44 ms a step on the interconnect sample pair)
LOADER_FIXED_SHARE = 0.5


def _family_share(fam: dict[str, float], dtypes: tuple[str, ...]) -> tuple[float, float]:
    """(µs of the family in ``dtypes``, its µs in all dtypes)."""
    return sum(v for dt, v in fam.items() if dt in dtypes), sum(fam.values())


def matmath_figures(subject_prec, baseline_prec) -> dict | None:
    """The baseline's measured matrix-math speed-up over the subject's, or None when the runs' main dtypes are not
    fp32 (subject) and bf16/fp16/tf32 (baseline) or no family is comparable. ``*_prec``:
    :class:`traceanalyze.metrics.precision.PrecisionMix`.

    Returns ``{"mode": "bf16" | "tf32", "dtype", "channels_last", "families": {family: {"factor", "subject_us",
    "baseline_us"}}}``:
    µs per rank and counted step (the family's time in every dtype), ``factor`` = subject / baseline.
    """
    if subject_prec is None or baseline_prec is None or subject_prec.main_dtype != "fp32":
        return None
    mode = next((m for m, dts in MODE_DTYPES.items() if baseline_prec.main_dtype in dts), None)
    if mode is None:
        return None
    fams = {}
    for fam, s in sorted((subject_prec.family_us_per_step or {}).items()):
        b = (baseline_prec.family_us_per_step or {}).get(fam) or {}
        s_fp32, s_all = _family_share(s, ("fp32",))
        b_new, b_all = _family_share(b, MODE_DTYPES[mode])
        if s_all <= 0 or b_all <= 0 or s_fp32 < MAIN_SHARE_MIN * s_all or b_new < MAIN_SHARE_MIN * b_all:
            continue
        fams[fam] = {"factor": s_all / b_all, "subject_us": s_all, "baseline_us": b_all}
    if not fams:
        return None
    # the layout switch too where the kernel names say NCHW here and channels_last there (as the comparison's
    # check decides: traceanalyze.diagnose.compare): its speed-up prices bf16_channels_last, not bf16_matmul
    cl = (subject_prec.layout, baseline_prec.layout) == ("NCHW", "channels_last")
    return {"mode": mode, "dtype": baseline_prec.main_dtype, "channels_last": cl, "families": fams}


def loader_figures(subject_loader, baseline_loader) -> dict | None:
    """``{"subject_us", "baseline_us"}`` (data-loader µs per rank and counted step) when the baseline waits less
    than :data:`LOADER_FIXED_SHARE` of the subject's wait, else None (either unmeasured, or the baseline does not
    fix the wait). ``*_loader``:
    :class:`traceanalyze.metrics.host.LoaderStats`; a baseline with no loader range in its steps is not read as
    a zero wait (the ranges may be unrecorded)."""
    s = subject_loader.wait_us_per_step() if subject_loader is not None else None
    b = baseline_loader.wait_us_per_step() if baseline_loader is not None else None
    if not s or b is None or b >= LOADER_FIXED_SHARE * s:
        return None
    return {"subject_us": s, "baseline_us": b}


def baseline_figures(name: str, subject_prec, subject_loader, baseline_prec, baseline_loader,
                     baseline_cpu_model: str | None) -> dict | None:
    """What the baseline ``name`` measured that prices the subject's what-ifs (``ctx["baseline"]`` of
    :func:`traceanalyze.replay.whatif.replay_run`): ``{"name", "cpu_model", "matmath": matmath_figures(...),
    "loader": loader_figures(...)}``, None when neither applies. ``baseline_cpu_model``: the baseline host's CPU
    (``env_rank{r}.json``), which decides whether its bf16 speed-up speaks for the subject's host."""
    mm, ld = matmath_figures(subject_prec, baseline_prec), loader_figures(subject_loader, baseline_loader)
    if mm is None and ld is None:
        return None
    return {"name": name, "cpu_model": baseline_cpu_model, "matmath": mm, "loader": ld}
