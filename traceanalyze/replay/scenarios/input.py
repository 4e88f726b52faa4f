"""The input what-if: ``no_dataloader_wait``, the host time under the DataLoader's ranges gone (workers that
prefetch the next batch while the step runs)."""

from __future__ import annotations

from traceanalyze.replay import graph as gr
from traceanalyze.replay.scenarios.base import MIN_SAVING_US, Arrays, Scenario, covered_us, less


def _rw_dataloader(g: gr.Graph, d, cg, tr, ctx: dict) -> Arrays:
    return less(d, g.cover["dataloader"]), less(cg, g.gap_cover["dataloader"]), tr


NO_DATALOADER_WAIT = Scenario(
    name="no_dataloader_wait", cause="config: data-loader wait", rewrite=_rw_dataloader,
    applies=lambda g, ctx: covered_us(g, "dataloader") >= MIN_SAVING_US,
    why_not=lambda g, ctx: "no host time under DataLoader ranges in the replayed steps",
    assumptions=lambda ctx, g: "host time under DataLoader ranges removed (workers prefetch; launch order kept)",
    kinds=("dataloader",))
SCENARIOS = (NO_DATALOADER_WAIT,)
