"""A finding: one cause of slowness, in the report's vocabulary (``shared/DESIGN.md``, Causes).

A finding has a ``cause`` (the four the report attributes a slowdown to), a finer ``kind``, a ``severity``, the
``impact_pct`` that fixing it would win back (% of step time; from the what-if replay where one applies,
:func:`traceanalyze.diagnose.apply_to_findings`), the ranks it concerns, evidence and a recommendation; where no
what-if can price it, ``whatif_missing`` says why; a finding that is part of a larger one names its kind in
``part_of``. The kinds are a closed set: a rule that makes a finding of
another kind is a bug, caught when it is made.

A config fault that changes what is trained, not how long a step takes (gradient accumulation kept from a 1-GPU
run: a larger effective batch, fewer optimizer steps per epoch), has no share of step time: its ``impact_pct`` is
None and ``effect`` says, in words and numbers, what it changes. Such a finding of medium or high severity leads
the verdict (:data:`CONFIG_FAULT`) unless a step-time cause of medium or high severity does, and then follows it
in the same sentence (``traceanalyze.diagnose.verdict``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Cause = Literal["interconnect", "precision", "imbalance", "config"]
Severity = Literal["high", "medium", "low"]
Kind = Literal[
    # interconnect
    "slow_collectives", "topology",
    # precision
    "fp32_matmul", "autocast_missing",
    # imbalance
    "straggler", "late_entry", "idle_rank", "untraced_ranks",
    # config
    "gradient_accumulation", "compile_overhead", "recompiles", "dataloader", "launch_bound", "host_bound",
    "host_sync", "step_sync", "host_optimizer", "unexplained_idle", "cuda_oom", "host_oom",
    "memory_growth", "memory_near_capacity", "memory_imbalance", "memory_cache_flush",
]
CAUSES: tuple[str, ...] = get_args(Cause)
DIED_KINDS = ("cuda_oom", "host_oom")  # the run died (of memory): the report says so first, and no step time share
CONFIG_FAULT = "Config fault: "  # the verdict's start when a finding with an ``effect`` (what is trained) leads it
KINDS: tuple[str, ...] = get_args(Kind)
SEVERITIES: tuple[str, ...] = get_args(Severity)


@dataclass
class Finding:
    """One cause of slowness with its evidence.

    Raises:
        ValueError: ``cause``, ``kind`` or ``severity`` outside the report's vocabulary.
    """

    cause: Cause
    kind: Kind
    severity: Severity
    impact_pct: float | None  # % of the run's step time that fixing the cause wins back; None with ``effect``
    ranks: list[int]
    title: str
    evidence: list[str]
    recommendation: str
    run: str = ""
    assumption: str = ""  # what the impact rests on that the inputs do not state (shown in the verdict)
    whatif_missing: str | None = None  # why no what-if prices this finding (diagnose.WHATIF_OF_KIND); None: one does
    part_of: str | None = None  # the kind of a larger finding of its run that this one is part of (diagnose.PARTS)
    # what fixing it changes when that is not step time (what is trained), e.g. "2× the samples per optimizer step,
    # 1/2 the optimizer steps per epoch"; set, impact_pct is None
    effect: str | None = None

    def __post_init__(self) -> None:
        if self.cause not in CAUSES or self.kind not in KINDS or self.severity not in SEVERITIES:
            raise ValueError(f"finding outside the vocabulary: {self.cause}/{self.kind}/{self.severity}")
