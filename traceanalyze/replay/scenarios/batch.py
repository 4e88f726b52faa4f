"""The batch what-if: ``ga_scaled``, gradient accumulation divided by the world size, so that a recipe moved from
one GPU to N ranks keeps its effective (global) batch. Arithmetic on what the logs and configs state, not a replay:
the fix changes what is trained (samples per optimizer step, optimizer steps per epoch) and how many micro-batches
an optimizer step holds, not any kernel.

The arithmetic (:func:`price_ga_scaled`), with its sources:

- effective batch = per-device batch × gradient accumulation × world size (the HF Trainer banner's "Total train
  batch size (w. parallel, distributed & accumulation)", ``transformers.Trainer._inner_training_loop``); the 1-GPU
  run of the same recipe trains per-device batch × gradient accumulation samples per optimizer step.
- the fix: gradient accumulation GA → max(1, GA / world size rounded half up); exact when the world size divides
  GA.
- optimizer steps per epoch = examples / effective batch (the banner's "Num update steps per epoch"; HF rounds the
  last partial step).
- the optimizer step's time, when a profiler step is one optimizer step (:mod:`traceanalyze.metrics.accumulation`):
  the gradient all-reduce and the optimizer run once per optimizer step (DDP skips the all-reduce on the
  accumulating micro-batches, ``no_sync``), the micro-batches GA times: micro-batch = (step − exposed
  communication − optimizer host time) / GA, and the fixed step = GA' × micro-batch + the same once-per-step part.
  When a profiler step is one micro-batch, an optimizer step is GA' of them. When the trace does not say which,
  no time is predicted. Without a trace, an HF log's ``train_runtime`` / total optimization steps is the optimizer
  step (the Trainer counts optimizer steps), communication and optimizer time unknown (counted as micro-batch
  time: the fixed step is then a lower bound).
"""

from __future__ import annotations

from traceanalyze.replay import graph as gr
from traceanalyze.replay.scenarios.base import Arrays, Scenario

NOT_REPLAYED = "an arithmetic what-if on the run's stated batch facts: it changes what is trained, not the graph"


def _not_replayed(g: gr.Graph, d, cg, tr, ctx: dict) -> Arrays:
    return d, cg, tr


def _ms(us: float) -> str:
    return f"{us / 1e3:,.1f} ms"


def _step_time(c: dict, ga: int, new: int) -> tuple[list[float] | None, str]:
    """([optimizer step µs now, with the fix], how) from the measured profiler step (``c``: :func:`price_ga_scaled`)."""
    step, what = c.get("step_us"), c.get("profiler_step")
    if not step or what is None:
        return None, ("what a profiler step holds is not known (no Optimizer.step# range in its counted steps, or "
                      "several): no optimizer-step time is predicted" if step else
                      "no measured step time (no trace with counted profiler steps): no optimizer-step time predicted")
    if what == "micro-batch":
        return [step * ga, step * new], (f"a profiler step here is one micro-batch ({_ms(step)}): an optimizer step "
                                         f"is {ga} of them now, {new} with the fix")
    fixed = min(step, (c.get("optimizer_us") or 0.0) + (c.get("comm_us") or 0.0))
    micro = (step - fixed) / ga
    if c.get("step_source"):  # a log's optimizer step: what is done once per optimizer step is not known
        return [step, new * micro], (f"an optimizer step takes {_ms(step)} ({c['step_source']}): per micro-batch "
                                     f"{_ms(step)} / {ga} = {_ms(micro)}, the all-reduce and optimizer counted in it "
                                     "(the step with the fix is a lower bound)")
    return [step, new * micro + fixed], (
        f"a profiler step here is one optimizer step ({c.get('per_step', 1):g} Optimizer.step# range per counted "
        f"profiler step): per micro-batch ({_ms(step)} − {_ms(c.get('comm_us') or 0.0)} exposed communication − "
        f"{_ms(c.get('optimizer_us') or 0.0)} optimizer, once per optimizer step) / {ga} = {_ms(micro)}")


def price_ga_scaled(c: dict) -> dict | None:
    """What ``ga_scaled`` changes. ``c``: ``ga`` (gradient accumulation), ``ws`` (world size), optionally ``pdb``
    (per-device batch), ``global_batch``, ``seq_len`` (tokens per sample), ``num_examples``, ``step_us`` (the
    trace's step, µs), ``profiler_step`` / ``per_step`` / ``optimizer_us`` (:mod:`traceanalyze.metrics.accumulation`),
    ``comm_us`` (exposed communication per step, µs); without a trace, ``step_us`` an optimizer step a log states
    with ``step_source`` saying where from. None unless GA > 1 and the world size > 1.

    Returns ``{scenario, cause, gradient_accumulation_steps: [now, fixed], effective_batch: [now, fixed] | None,
    samples_ratio (now / fixed), tokens_per_optimizer_step, optimizer_steps_per_epoch, optimizer_step_us: [now,
    fixed] | None, time_per_sample_ratio (fixed / now) | None, assumptions, lines}`` (``lines``: the arithmetic in
    words, for the finding's evidence)."""
    ga, ws = c.get("ga"), c.get("ws")
    if not ga or not ws or ga <= 1 or ws <= 1:
        return None
    new = max(1, int(ga / ws + 0.5))  # half up
    eff = c.get("global_batch") or (c["pdb"] * ga * ws if c.get("pdb") else None)
    effs = [eff, eff * new / ga] if eff else None
    ratio = ga / new
    row: dict = {"scenario": GA_SCALED.name, "cause": GA_SCALED.cause, "gradient_accumulation_steps": [ga, new],
                 "effective_batch": effs, "samples_ratio": ratio, "tokens_per_optimizer_step": None,
                 "optimizer_steps_per_epoch": None, "optimizer_step_us": None, "time_per_sample_ratio": None}
    lines = [f"what-if {GA_SCALED.name} (arithmetic): gradient accumulation {ga} → {new} ({ga} / {ws} ranks, "
             "rounded half up, at least 1)" + (f": samples per optimizer step {effs[0]:,.0f} → {effs[1]:,.0f}"
                                              if effs else "")
             + ("" if ga % ws == 0 else f"; {ws} does not divide {ga}: the batch is {ratio:g}× smaller, not {ws}×")]
    if effs and c.get("seq_len"):
        row["tokens_per_optimizer_step"] = [effs[0] * c["seq_len"], effs[1] * c["seq_len"]]
        lines.append(f"tokens per optimizer step (at most, sequences of {c['seq_len']:,} tokens): "
                     f"{effs[0] * c['seq_len']:,.0f} → {effs[1] * c['seq_len']:,.0f}")
    if effs and c.get("num_examples"):
        per = [c["num_examples"] / effs[0], c["num_examples"] / effs[1]]
        row["optimizer_steps_per_epoch"] = per
        lines.append(f"optimizer steps per epoch: about {per[0]:,.0f} → {per[1]:,.0f} ({c['num_examples']:,} "
                     "examples / effective batch)")
    times, how = _step_time(c, ga, new)
    lines.append(how)
    if times is not None and c.get("step_source"):
        row["optimizer_step_us"] = times
        lines.append(f"optimizer step {_ms(times[0])} → at least {_ms(times[1])}; time per sample as now, but for the "
                     f"once-per-step all-reduce and optimizer, which come {ratio:g}× as often: the fix is not a "
                     "speed-up, it restores what is trained")
    elif times is not None:
        row["optimizer_step_us"] = times
        row["time_per_sample_ratio"] = times[1] * ratio / times[0] if times[0] else None
        lines.append(f"optimizer step {_ms(times[0])} → {_ms(times[1])}; time per sample ×"
                     f"{row['time_per_sample_ratio']:.2f} (the once-per-step all-reduce and optimizer come {ratio:g}× "
                     "as often): the fix is not a speed-up, it restores what is trained")
    row["assumptions"] = GA_SCALED.assumptions(c, None)
    row["lines"] = lines
    return row


GA_SCALED = Scenario(
    name="ga_scaled", cause="config: gradient accumulation kept from one GPU", rewrite=_not_replayed,
    applies=lambda g, ctx: False, why_not=lambda g, ctx: NOT_REPLAYED,
    assumptions=lambda ctx, g: (
        "the recipe came from a 1-GPU run with the same per-device batch (no baseline says so); gradient "
        "accumulation divided by the world size, rounded, at least 1; micro-batches take the same time (the "
        "all-reduce and optimizer run once per optimizer step, DDP no_sync); the learning rate and schedule left as "
        "they are"),
    kinds=("gradient_accumulation",), price=price_ga_scaled)
SCENARIOS = (GA_SCALED,)
