"""The record of one what-if scenario (:class:`Scenario`): what it removes, which findings it prices, its rewrite of
the graph and every rule of the replay, the diagnosis and the confidence that differs from one scenario to another.
Code outside a record reads these fields; it never compares a scenario's name to decide what to do."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from traceanalyze.replay import graph as gr
from traceanalyze.replay import precision as prec

ALL = "all"  # the row of every applicable fix together (traceanalyze.replay.whatif prices it after the others)
ALL_CAUSE = "every fix above together"
MIN_SAVING_US = 1.0  # a scenario whose rewrite changes less than this is left out (it does not apply)

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # task durations, chain gaps, collective transfers (µs)
# (graph, durations, chain gaps, transfers, ctx) -> the rewritten (durations, chain gaps, transfers); a precision
# rewrite takes ``bound`` too ("low"/"mid"/"high" saving: its range's ends and its point estimate)
Rewrite = Callable[..., Arrays]


@dataclass(frozen=True)
class Scenario:
    """One what-if: a fix of one cause, priced by replaying the graph it rewrites (or, with ``price``, by
    arithmetic on what the run's logs and configs state: a fix that changes what is trained, not the graph).

    ``ctx`` is the run's what-if context (:func:`traceanalyze.replay.whatif.replay_run`): ``link_gbps``,
    ``link_source``, ``bf16`` (speed-ups), ``native_bf16``, ``cpu_model``, ``core_sharing``, ``baseline`` (the
    measured figures of the baseline the run is compared with, :func:`traceanalyze.replay.frombase.baseline_figures`,
    or None), on GPU runs ``prec``
    (:func:`traceanalyze.replay.precision.context`) and ``opt`` (:func:`traceanalyze.replay.optimizer.context`),
    then ``applicable`` (the scenarios that apply), ``d0`` (the durations the rewrites start from), and the ranks a
    finding names under :attr:`ranks_ctx`.
    """

    name: str
    cause: str  # what it removes, in the report's cause vocabulary and words (the row's ``cause``)
    rewrite: Rewrite  # the graph's durations, gaps and transfers with the cause removed
    applies: Callable[[gr.Graph, dict], bool]  # whether the rewrite applies to the run's graph
    why_not: Callable[[gr.Graph, dict], str]  # why it does not (applies False), in words
    assumptions: Callable[[dict, gr.Graph], str]  # the row's ``assumptions``: the model and what it leaves out
    kinds: tuple[str, ...] = ()  # the finding kinds whose impact it prices (traceanalyze.diagnose.WHATIF_OF_KIND)
    rank_kinds: tuple[str, ...] = ()  # of ``kinds``: priced for the finding's own ranks (late pricer)
    ranks_ctx: str | None = None  # the ctx key that holds the ranks a finding names, for a rewrite of named ranks
    ranks_finding: str = ""  # that finding, in words
    also_fixes: tuple[str, ...] = ()  # finding kinds a fix of this cause removes with it (a comparison's check)
    changes_concurrency: bool = False  # it changes how many ranks compute at once (shared CPU cores: unreliable)
    collective_waits: bool = False  # what it removes is time waited inside collectives (a missing rank may be it)
    host_time: bool = False  # its saving is host time, of the order of the profiler's own estimated host cost
    one_step_caveat: str = ""  # why one counted step leaves its saving low confidence, when it does
    precision: prec.Fix | None = None  # a precision switch: its range, its MIN_PRECISION_PCT test, the dtypes
    extends: str | None = None  # the scenario it adds to: priced only where that one has a row, which this splits
    split_note: Callable[[dict, dict], str] | None = None  # (its row, the row it extends) -> the split, in words
    supersedes: tuple[str, ...] = ()  # scenarios it does all of and more: ``all`` combines the larger one only
    offered_first: tuple[str, ...] = ()  # finding kinds that offer this fix first (the smaller change)
    left_out: Callable[[gr.Graph, dict], str | None] | None = None  # why the host rules it out though the trace
    # supports it (the replay's ``left_out``), or None
    saving_bound: Callable[..., float] | None = None  # (g, arrs, d0, floor, est, steps) -> the most it can save, %
    # of the step: not replayed when that is within the step-to-step noise
    runs_ahead: bool = False  # replayed without the blocking waits, the host running ahead of the GPU
    starts: Callable[[gr.Graph, dict], np.ndarray | None] | None = None  # the pinned tasks' starts it moves (the
    # gaps it cuts then leave the edges into their tasks too)
    cuts_spans: bool = False  # the host time it removes also leaves the edges that span it (a synchronize's edge
    # from a kernel's end to the step's end holds the host's work after that kernel: traceanalyze.replay.whatif)
    skip_off_path: bool = True  # not replayed when it changes nothing on the base replay's critical paths
    # (ctx, g) -> what priced the row when a baseline's measured figure did (the row's ``priced_from``), else None
    priced_from: Callable[[dict, gr.Graph], str | None] | None = None
    price: Callable[[dict], dict | None] | None = None  # an arithmetic what-if, not replayed (it is in ARITHMETIC,
    # not REGISTRY): (the run's stated facts and measured step, :mod:`.batch`) -> what the fix changes, or None
    # when the facts do not say; its rule calls it, and ``rewrite``/``applies`` then only say it is not replayed


def less(base: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """``base − cut``, never below 0."""
    return np.clip(base - cut, 0.0, None)


def covered_us(g: gr.Graph, key: str) -> float:
    """µs of the graph's tasks and host gaps under the ranges of category ``key`` (``g.cover``, ``g.gap_cover``)."""
    return float(g.cover[key].sum() + g.gap_cover.get(key, np.zeros(1)).sum())
