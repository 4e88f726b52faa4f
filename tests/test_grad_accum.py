"""Gradient accumulation kept from one GPU (issue 40): a config fault that changes what is trained, named by the
verdict without a baseline, priced by the arithmetic what-if ``ga_scaled``; hostile batch values are warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import sample
from traceanalyze.diagnose.verdict import verdict
from traceanalyze.findings import Finding
from traceanalyze.limits import MAX_GRAD_ACCUM
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.replay.scenarios import ARITHMETIC, REGISTRY, by_name, for_kind
from traceanalyze.replay.scenarios.batch import GA_SCALED, price_ga_scaled


def hf_log(folder: Path, ga: str | None, per_device: int = 2, total: int | None = 32, examples: int = 256,
           steps: int = 8, runtime_s: float = 4.0) -> Path:
    """An HF Trainer log (``transformers.Trainer`` banner, loss dicts, summary) in ``folder/train.log``; ``ga``
    None leaves the Gradient Accumulation line out, ``total`` None the total batch line."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["[INFO|trainer.py:2405] >> ***** Running training *****",
             f"[INFO|trainer.py:2406] >>   Num examples = {examples:,}",
             "[INFO|trainer.py:2407] >>   Num Epochs = 1",
             f"[INFO|trainer.py:2408] >>   Instantaneous batch size per device = {per_device}"]
    if total is not None:
        lines.append(f"[INFO|trainer.py:2411] >>   Total train batch size (w. parallel, distributed & accumulation) "
                     f"= {total}")
    if ga is not None:
        lines.append(f"[INFO|trainer.py:2412] >>   Gradient Accumulation steps = {ga}")
    lines.append(f"[INFO|trainer.py:2413] >>   Total optimization steps = {steps}")
    lines += [f"{{'loss': {2.0 - 0.1 * i:.3f}, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': {i / steps:.3f}}}"
              for i in range(1, steps + 1)]
    lines.append(f"{{'train_runtime': {runtime_s}, 'train_samples_per_second': 64.0, 'train_steps_per_second': "
                 f"{steps / runtime_s:.3f}, 'train_loss': 1.6, 'epoch': 1.0}}")
    p = folder / "train.log"
    p.write_text("\n".join(lines) + "\n")
    return p


def _ga(model: dict) -> list[dict]:
    return [f for f in model["findings"] if f["kind"] == "gradient_accumulation"]


def test_ga_8_on_2_ranks_is_a_medium_config_fault_in_the_verdict_without_a_baseline(tmp_path):
    hf_log(tmp_path / "two", "8")  # 2 per device × GA 8 × 2 ranks = 32 (the banner's total)
    m = analyze(tmp_path / "two", Options(jobs=1)).model
    (f,) = _ga(m)
    assert (f["severity"], f["impact_pct"], f.get("main")) == ("medium", None, True)
    assert f["title"] == "Effective batch 32 is 2× a 1-GPU run's 16: gradient accumulation 8 kept on 2 ranks"
    assert f["effect"].startswith("2× the samples per optimizer step and 1/2 of the optimizer steps per epoch")
    assert m["verdict"].startswith("Config fault: effective batch 32 is 2× a 1-GPU run's 16: gradient accumulation 8 "
                                   "kept on 2 ranks (if this recipe came from a 1-GPU run")
    assert "divide gradient_accumulation_steps by 2 (8 → 4)" in m["verdict"]
    assert "No significant slowdown" not in m["verdict"]
    # how sure: the stated facts, capped at medium by the assumption that the recipe came from one GPU
    assert m["verdict_confidence"]["level"] == "medium"
    assert f["confidence"] == {"level": "medium", "range_pct": None,
                               "why": ["if this recipe came from a 1-GPU run: no baseline or config says so"]}
    # the arithmetic: GA 8 → 4, 32 → 16 samples per optimizer step, 8 → 16 steps per epoch; the log's optimizer
    # step (4.0 s / 8 steps = 500 ms) split into 8 micro-batches of 62.5 ms, 4 of them with the fix
    ev = f["evidence"]
    assert ev[1] == ("what-if ga_scaled (arithmetic): gradient accumulation 8 → 4 (8 / 2 ranks, rounded half up, at "
                     "least 1): samples per optimizer step 32 → 16")
    assert "optimizer steps per epoch: about 8 → 16 (256 examples / effective batch)" in ev
    assert any("500.0 ms (the log's train_runtime 4.0 s / 8 optimizer steps): per micro-batch 500.0 ms / 8 = 62.5 ms"
               in e for e in ev)
    assert any(e.startswith("optimizer step 500.0 ms → at least 250.0 ms") for e in ev)


def test_the_report_never_says_zero_percent_of_step_time_for_it(tmp_path):
    hf_log(tmp_path / "two", "8")
    from traceanalyze.report.markdown import render_markdown

    md = render_markdown(analyze(tmp_path / "two", Options(jobs=1)).model)
    line = next(x for x in md.splitlines() if "config/gradient_accumulation" in x)
    assert "changes what is trained, not step time" in line and "% of step time" not in line
    assert "**What it changes:** 2× the samples per optimizer step" in md


def test_one_rank_with_ga_8_has_no_such_finding(tmp_path):
    hf_log(tmp_path / "one", "8", total=16)  # 2 × 8 × 1 rank
    m = analyze(tmp_path / "one", Options(jobs=1)).model
    assert _ga(m) == [] and not m["verdict"].startswith("Config fault")


def test_ga_below_the_world_size_is_low_and_leaves_the_verdict_alone(tmp_path):
    hf_log(tmp_path / "eight", "2", total=32)  # 2 × 2 × 8 ranks: a small GA on many ranks, a multi-GPU recipe
    m = analyze(tmp_path / "eight", Options(jobs=1)).model
    (f,) = _ga(m)
    assert (f["severity"], f["impact_pct"]) == ("low", None)
    assert not m["verdict"].startswith("Config fault")
    assert "gradient accumulation 2 → 1" in f["evidence"][1]


@pytest.mark.parametrize(("stated", "shown"), [("0", "'0'"), ("1" + "0" * 30, "'1e+30'")])
def test_a_hostile_ga_in_a_log_banner_is_a_warning(tmp_path, stated, shown):
    hf_log(tmp_path / "run", stated)
    m = analyze(tmp_path / "run", Options(jobs=1)).model
    assert _ga(m) == []
    (w,) = [w for w in m["warnings"] if "gradient_accumulation_steps" in w["message"]]
    assert w["level"] == "warning"
    assert w["message"] == (f"train.log:6: gradient_accumulation_steps = {shown} is not a whole number from 1 to "
                            f"{MAX_GRAD_ACCUM:,}; ignored")


@pytest.mark.parametrize(("stated", "shown"), [("-4", "'-4'"), (".nan", "'nan'"), ("1.0e+30", "'1e+30'"),
                                                ("2.5", "'2.5'")])
def test_a_hostile_ga_in_a_config_is_a_warning(tmp_path, stated, shown):
    hf_log(tmp_path / "run", None, total=None)
    (tmp_path / "run" / "config.yaml").write_text(f"per_device_train_batch_size: 2\ngradient_accumulation_steps: "
                                                  f"{stated}\nworld_size: 2\n")
    m = analyze(tmp_path / "run", Options(jobs=1)).model
    assert _ga(m) == []
    (w,) = [w for w in m["warnings"] if "gradient_accumulation_steps" in w["message"]]
    assert (w["level"], w["message"]) == ("warning", f"config.yaml:2: gradient_accumulation_steps = {shown} is not a "
                                                     f"whole number from 1 to {MAX_GRAD_ACCUM:,}; ignored")


def test_ga_scaled_is_an_arithmetic_record_the_replay_never_sees():
    assert ARITHMETIC == (GA_SCALED,) and GA_SCALED not in REGISTRY
    assert by_name("ga_scaled") is GA_SCALED and for_kind("gradient_accumulation") is GA_SCALED
    assert GA_SCALED.kinds == ("gradient_accumulation",) and GA_SCALED.cause.startswith("config: ")
    assert not GA_SCALED.applies(None, {}) and "arithmetic" in GA_SCALED.why_not(None, {})
    assert "1-GPU run" in GA_SCALED.assumptions({}, None)


def test_ga_scaled_prices_an_optimizer_step_profiler_step():
    # a profiler step of one optimizer step: 100 ms = 8 micro-batches + 10 ms exposed all-reduce + 2 ms optimizer
    row = price_ga_scaled({"ga": 8, "ws": 2, "pdb": 4, "seq_len": 512, "num_examples": 6400, "step_us": 100_000.0,
                           "profiler_step": "optimizer step", "per_step": 1.0, "optimizer_us": 2_000.0,
                           "comm_us": 10_000.0})
    assert row["gradient_accumulation_steps"] == [8, 4] and row["effective_batch"] == [64, 32]
    assert row["samples_ratio"] == 2.0
    assert row["tokens_per_optimizer_step"] == [32_768, 16_384]
    assert row["optimizer_steps_per_epoch"] == [100.0, 200.0]
    # micro-batch (100 − 12) / 8 = 11 ms; with the fix 4 × 11 + 12 = 56 ms; per sample 56 × 2 / 100 = 1.12×
    assert row["optimizer_step_us"] == pytest.approx([100_000.0, 56_000.0])
    assert row["time_per_sample_ratio"] == pytest.approx(1.12)


def test_ga_scaled_prices_a_micro_batch_profiler_step_and_says_when_it_cannot():
    micro = price_ga_scaled({"ga": 8, "ws": 4, "global_batch": 64, "step_us": 11_000.0,
                             "profiler_step": "micro-batch"})
    assert micro["optimizer_step_us"] == [88_000.0, 22_000.0] and micro["effective_batch"] == [64, 16]
    unknown = price_ga_scaled({"ga": 8, "ws": 2, "step_us": 90_000.0, "profiler_step": None})
    assert unknown["optimizer_step_us"] is None and unknown["effective_batch"] is None
    assert any("what a profiler step holds is not known" in x for x in unknown["lines"])
    # GA not divisible by the world size: rounded half up, the batch shrinks by GA / GA', not the world size
    odd = price_ga_scaled({"ga": 10, "ws": 4, "pdb": 1})
    assert odd["gradient_accumulation_steps"] == [10, 3] and odd["samples_ratio"] == pytest.approx(10 / 3)
    assert price_ga_scaled({"ga": 8, "ws": 1}) is None and price_ga_scaled({"ga": 1, "ws": 8}) is None


def test_the_sample_trace_holds_one_optimizer_step_per_profiler_step():
    # sample_traces/hf_job.py calls prof.step() in on_step_end: one Optimizer.step#AdamW.step per ProfilerStep
    m = analyze(sample("grad_accum") / "2proc", Options(jobs=1)).model
    (f,) = _ga(m)
    assert m["verdict"].startswith("Config fault: effective batch 32 is 2× a 1-GPU run's 16")
    assert any(e.startswith("a profiler step here is one optimizer step (1 Optimizer.step# range per counted "
                            "profiler step)") for e in f["evidence"])


def _f(kind: str, severity: str, impact: float | None, effect: str | None = None) -> Finding:
    return Finding("config", kind, severity, impact, [0], f"title {kind}", [], "fix it; or else", run="r",
                   assumption="if so" if effect else "", effect=effect)


def test_a_significant_time_cause_stays_main_and_the_fault_follows_it():
    fs = [_f("dataloader", "high", 40.0), _f("gradient_accumulation", "medium", None, "2× the samples")]
    v = verdict(fs)
    assert v.startswith("Main cause: config (dataloader): title dataloader — fixing it saves about 40% of step time.")
    assert v.endswith(" Also a config fault: title gradient_accumulation (if so): fix it. It changes what is trained, "
                      "not the step time: 2× the samples.")
    # a low fault leaves the verdict alone
    assert "config fault" not in verdict([_f("gradient_accumulation", "low", None, "2× the samples")]).lower()
