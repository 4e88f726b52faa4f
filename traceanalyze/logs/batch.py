"""The batch facts a run's logs and configs state, checked before any rule reads them (:func:`check_batch_facts`).

Inputs are hostile (``docs/safety.md``): a gradient accumulation of 0, -4, ``nan`` or 1e30, or a batch of 1e30
samples, is no recipe's; such a value is dropped with one warning naming it and where it was stated, and the
rules see the run as if it were not stated."""

from __future__ import annotations

from traceanalyze.limits import MAX_BATCH, MAX_GRAD_ACCUM, whole_in_bounds

BATCH_BOUNDS = {"gradient_accumulation_steps": MAX_GRAD_ACCUM, "per_device_batch": MAX_BATCH,
                "global_batch": MAX_BATCH}  # fact key -> the largest whole number it may be (at least 1)


def check_batch_facts(facts: dict[str, list]) -> list[str]:
    """Drop, in place, every batch fact of :data:`BATCH_BOUNDS` that is not a whole number from 1 to its bound;
    return one warning per dropped value (``facts``: key -> [:class:`~traceanalyze.logs.model.Fact`])."""
    warnings = []
    for key, bound in BATCH_BOUNDS.items():
        kept = []
        for f in facts.get(key) or []:
            if whole_in_bounds(f.num, bound) is not None:
                kept.append(f)
            else:
                warnings.append(f"{f.source}: {key} = {f.value[:40]!r} is not a whole number from 1 to {bound:,}; "
                                "ignored")
        if key in facts:
            if kept:
                facts[key] = kept
            else:
                del facts[key]
    return warnings
