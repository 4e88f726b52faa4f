"""The compile what-if: ``no_compile``, the host time under torch.compile's (dynamo/inductor) ranges gone, as on a
run whose compiled graphs are cached."""

from __future__ import annotations

from traceanalyze.replay import graph as gr
from traceanalyze.replay.scenarios.base import MIN_SAVING_US, Arrays, Scenario, covered_us, less


def _rw_compile(g: gr.Graph, d, cg, tr, ctx: dict) -> Arrays:
    return less(d, g.cover["compile"]), less(cg, g.gap_cover["compile"]), tr


NO_COMPILE = Scenario(
    name="no_compile", cause="config: torch.compile time", rewrite=_rw_compile,
    applies=lambda g, ctx: covered_us(g, "compile") >= MIN_SAVING_US,
    why_not=lambda g, ctx: "no host time under torch.compile (dynamo/inductor) ranges in the replayed steps",
    assumptions=lambda ctx, g: "host time under dynamo/inductor compile ranges removed (a warm cache still traces "
                               "frames)",
    kinds=("compile_overhead", "recompiles"))
SCENARIOS = (NO_COMPILE,)
