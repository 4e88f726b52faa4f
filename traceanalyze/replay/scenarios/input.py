"""The input what-if: ``no_dataloader_wait``, the host time under the DataLoader's ranges gone (workers that
prefetch the next batch while the step runs). Compared with a baseline that waits less for its loader
(``ctx["baseline"]["loader"]``: :func:`traceanalyze.replay.frombase.loader_figures`), the wait is cut to the
baseline's measured wait per step instead of to none: the fix the baseline shows, not a perfect one."""

from __future__ import annotations

from traceanalyze.replay import graph as gr
from traceanalyze.replay.scenarios.base import MIN_SAVING_US, Arrays, Scenario, covered_us, less


def kept_share(ctx: dict) -> float:
    """The share of the run's data-loader wait the fix keeps: the baseline's wait per rank and counted step over
    this run's (under 1: :func:`traceanalyze.replay.frombase.loader_figures`), else 0 (the wait gone)."""
    ld = (ctx.get("baseline") or {}).get("loader")
    return ld["baseline_us"] / ld["subject_us"] if ld else 0.0


def _rw_dataloader(g: gr.Graph, d, cg, tr, ctx: dict) -> Arrays:
    cut = 1.0 - kept_share(ctx)  # every DataLoader range and gap shortened alike
    return less(d, g.cover["dataloader"] * cut), less(cg, g.gap_cover["dataloader"] * cut), tr


def _assumptions(ctx: dict, g: gr.Graph) -> str:
    ld = (ctx.get("baseline") or {}).get("loader")
    if not ld:
        return "host time under DataLoader ranges removed (workers prefetch; launch order kept)"
    return (f"loader wait from baseline: {ld['baseline_us'] / 1e3:.2f} ms per step kept, the baseline's "
            f"({ctx['baseline']['name']}; {ld['subject_us'] / 1e3:.2f} ms here; data-loader time per rank and "
            f"counted step, mean): host time under DataLoader ranges cut by {1 - kept_share(ctx):.0%} "
            "(launch order kept)")


def _priced_from(ctx: dict, g: gr.Graph) -> str | None:
    ld = (ctx.get("baseline") or {}).get("loader")
    return f"the baseline's loader wait ({ld['baseline_us'] / 1e3:.2f} ms per step)" if ld else None


NO_DATALOADER_WAIT = Scenario(
    name="no_dataloader_wait", cause="config: data-loader wait", rewrite=_rw_dataloader,
    applies=lambda g, ctx: covered_us(g, "dataloader") >= MIN_SAVING_US,
    why_not=lambda g, ctx: "no host time under DataLoader ranges in the replayed steps",
    assumptions=_assumptions, kinds=("dataloader",), priced_from=_priced_from)
SCENARIOS = (NO_DATALOADER_WAIT,)
