"""Diagnose: rules that turn a run's metrics and its logs into ranked *findings*.

A finding has ``cause`` ∈ {interconnect, precision, imbalance, config}, a finer ``kind``, a ``severity``
(high / medium / low), ``impact_pct`` (the estimated share of step time that fixing it would win back),
``ranks``, a one-line ``title``, ``evidence`` (the numbers behind it) and a ``recommendation``. Findings are
ranked by impact. Severity follows impact: ≥ 25 % high, ≥ 10 % medium, else low; a healthy run gets no
high-severity finding. Two exceptions say what they are in their evidence: a CPU precision estimate whose gain per
step is below :data:`CPU_PRECISION_TICKET_PCT` or within the run's own step-to-step noise is low (not worth a
ticket on this evidence; a straggler within that noise too), and a GPU idle above
:data:`IDLE_EXPLAIN_PCT` that no finding explains gets a medium ``unexplained_idle`` finding (never "healthy").

:func:`verdict` turns the ranked findings into the report's first sentence: "Inconclusive: ..." when the profiled
window holds only the torch.compile step, or the traced ranks wait in collectives for ranks whose traces are missing
(unless a blocking host call explains the wait), "Main cause: ..." for the top finding of high or
medium severity (with the assumption it rests on, when it has one; the headline is the finding whose fix saves
most, and a finding that is part of it, ``part_of``, is named inside it), "Not healthy: ..." when none reaches
medium while the ranks wait 10 % of their step or more at collectives for the same rank(s), else "No significant
slowdown found"; a run
with fewer traced ranks than its world size puts "Partial: k of N ranks traced" (and the findings the missing ranks
could explain) before it.

Each rule is a plain function ``rule(ev: RunEvidence) -> list[Finding]``; :data:`RULES` lists them. The
thresholds are module constants so they read as configuration, beside their rules.

One module per cause, like HTA's one analyzer per concern: :mod:`.interconnect` (exposed communication,
topology, untraced ranks), :mod:`.precision`, :mod:`.imbalance` (straggler, late entry, idle rank), :mod:`.config`
(compile, data loader, launch- and host-bound, effective batch), :mod:`.oom` (a run that died of memory: CUDA out of
memory, ranks killed by SIGKILL, the host-memory arithmetic; its verdict, ``Run died: ...``, comes first);
:mod:`.evidence` holds :class:`RunEvidence`,
:func:`severity` and what several rules share; :mod:`.verdict` runs the rules, ranks and prices the findings and
writes the verdict; :mod:`.compare` explains the difference between two runs.
"""

from __future__ import annotations

from traceanalyze.diagnose.compare import (
    comparability,
    compare,
    effective_batch_of,
    explains,
    next_bottleneck,
    throughput_per_rank,
    whatif_check,
)
from traceanalyze.diagnose.confidence import assess as assess_confidence
from traceanalyze.diagnose.config import rule_compile, rule_dataloader, rule_effective_batch_single, rule_launch_bound
from traceanalyze.diagnose.evidence import HIGH, MEDIUM, RunEvidence, compile_step_of, severity, step_stat
from traceanalyze.diagnose.imbalance import rule_idle_rank, rule_late_entry, rule_straggler
from traceanalyze.diagnose.interconnect import rule_exposed_communication, rule_untraced_ranks
from traceanalyze.diagnose.precision import rule_precision
from traceanalyze.diagnose.verdict import (
                                           KIND_TO_SCENARIO,
                                           RULES,
                                           WHATIF_OF_KIND,
                                           apply_to_findings,
                                           diagnose,
                                           drop_profiler_only,
                                           partial_run,
                                           partial_text,
                                           price_missing_whatifs,
                                           rank_findings,
                                           to_dicts,
                                           unexplained_idle,
                                           verdict,
)
from traceanalyze.findings import Finding

__all__ = ["HIGH", "KIND_TO_SCENARIO", "MEDIUM", "RULES", "Finding", "RunEvidence", "apply_to_findings", "compare",
           "comparability", "drop_profiler_only", "next_bottleneck", "whatif_check",
           "compile_step_of", "diagnose", "effective_batch_of", "explains", "rank_findings", "rule_compile",
           "rule_dataloader", "rule_effective_batch_single", "rule_exposed_communication", "rule_idle_rank",
           "rule_late_entry", "rule_launch_bound", "rule_precision", "rule_straggler", "rule_untraced_ranks",
           "severity", "step_stat",
           "throughput_per_rank", "to_dicts", "unexplained_idle", "verdict", "WHATIF_OF_KIND", "partial_run",
           "partial_text", "price_missing_whatifs", "assess_confidence"]
