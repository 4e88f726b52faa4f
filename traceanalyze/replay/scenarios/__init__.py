"""The what-if scenarios: one :class:`~.base.Scenario` record each, one module per family, like AMD TraceLens's one
class per op family with its formula beside its source.

========================  ==================================================================================
module                    scenarios
========================  ==================================================================================
:mod:`.ranks`             ``no_straggler``, ``aligned_step_starts``, ``ideal_interconnect``
:mod:`.precision`         ``tf32_matmul``, ``bf16_matmul``, ``bf16_channels_last``
:mod:`.input`             ``no_dataloader_wait``
:mod:`.compile`           ``no_compile``
:mod:`.host`              ``fused_optimizer``, ``no_launch_overhead``, ``no_host_sync``
:mod:`.memory`            ``no_cache_flush``
:mod:`.batch`             ``ga_scaled`` (arithmetic, not replayed: :data:`ARITHMETIC`)
========================  ==================================================================================

:data:`REGISTRY` lists them in the order the replay prices them (:func:`traceanalyze.replay.whatif.replay_run`),
then ``all`` (:data:`~.base.ALL`: every applicable one together) follows. The replay's pricing loop, the findings'
impacts (:mod:`traceanalyze.diagnose`: ``WHATIF_OF_KIND`` is built from each record's ``kinds``), the comparison of
two runs and the confidence levels read the records' fields; no code outside a record compares a scenario's name.
:data:`ARITHMETIC` lists the records priced by arithmetic on the run's stated facts (their ``price``), not by the
replay: a fix that changes what is trained; the rule of their ``kinds`` calls ``price`` and the replay never sees
them. :func:`by_name` and :func:`for_kind` find both.

To add a scenario: write one record in its family's module (or a new module, added to :data:`REGISTRY` in the
order it is priced): its ``name``, ``cause``, ``rewrite`` of the graph's durations, gaps and transfers
(``(g, d, cg, tr, ctx) -> (d, cg, tr)``), ``applies``, ``why_not`` and ``assumptions``, the finding ``kinds`` it
prices, and the fields of :class:`~.base.Scenario` that set how it is priced and read (each field's comment says
what it changes). Then its tests: the rewrite on a generated or sample trace (``tests/synth.py``,
``sample_traces/``), and ``tests/test_scenarios.py``, which checks every record's fields and that the name appears
nowhere else in the package but in its record.
"""

from __future__ import annotations

from traceanalyze.replay.scenarios import batch, compile, host, input, memory, precision, ranks
from traceanalyze.replay.scenarios.base import ALL, ALL_CAUSE, MIN_SAVING_US, Arrays, Scenario

REGISTRY: tuple[Scenario, ...] = (*ranks.SCENARIOS, *precision.SCENARIOS, *input.SCENARIOS, *compile.SCENARIOS,
                                  *host.SCENARIOS, *memory.SCENARIOS)
ARITHMETIC: tuple[Scenario, ...] = batch.SCENARIOS  # priced by arithmetic (``price``), never replayed
_BY_NAME = {s.name: s for s in (*REGISTRY, *ARITHMETIC)}
_BY_KIND = {k: s for s in (*REGISTRY, *ARITHMETIC) for k in s.kinds}


def by_name(name: str | None) -> Scenario | None:
    """The record of scenario ``name``; None for ``all`` or a name no record has (a row read from a report)."""
    return _BY_NAME.get(name or "")


def for_kind(kind: str) -> Scenario | None:
    """The scenario that prices findings of ``kind`` (its ``kinds``), or None."""
    return _BY_KIND.get(kind)


__all__ = ["ALL", "ARITHMETIC", "ALL_CAUSE", "MIN_SAVING_US", "REGISTRY", "Arrays", "Scenario", "by_name", "for_kind"]
