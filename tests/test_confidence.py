"""Confidence levels (issue 31, item 1): the rule of traceanalyze.diagnose.confidence on report models built by hand
(each input alone), then on real runs end to end: the level at the top of the page, on each finding and what-if."""

from __future__ import annotations

import copy
import json
import statistics

import pytest
from click.testing import CliRunner

from tests.conftest import SAMPLES, shared
from traceanalyze.cli import cli
from traceanalyze.diagnose import confidence as conf
from traceanalyze.report.html import render_html
from traceanalyze.report.markdown import render_markdown


def _run(step_ms: list[float], ranks: int = 2, world: int | None = None, err: float = 0.5, source: str = "log",
         overhead: float = 2.0, whatif: list[dict] | None = None) -> dict:
    steps = [{"rank": r, "step": 2 + i, "step_time_us": t * 1000 * (1 - 0.01 * r)}
             for i, t in enumerate(step_ms) for r in range(ranks)]
    return {"name": "run", "role": "subject", "steps": steps, "ranks_found": list(range(ranks)),
            "world_size": world or ranks, "replay": {"error_pct": err},
            "profiler_overhead": {"source": source, "overhead_pct": overhead}, "whatif": whatif or []}


def _finding(kind: str = "straggler", cause: str = "imbalance", impact: float = 30.0) -> dict:
    return {"cause": cause, "kind": kind, "severity": "high", "impact_pct": impact, "run": "run", "main": True}


def _model(run: dict, findings: list[dict]) -> dict:
    return {"verdict": "Main cause: ...", "runs": [run], "findings": findings}


def test_basis_states_steps_ranks_noise_and_the_unprofiled_source():
    b = conf.basis(_run([100, 110, 90], ranks=2, world=16, source="estimate"))
    # the run's step is the longest rank's (rank 0 here); the noise is its sample σ over the mean
    assert b["steps"] == 3 and b["ranks_traced"] == 2 and b["world_size"] == 16 and b["partial"]
    assert b["step_noise_pct"] == round(100 * statistics.stdev([100, 110, 90]) / 100, 2) == 10.0
    assert b["unprofiled"] == "estimated"
    assert b["line"] == ("From 3 steps × 2 of 16 ranks (step time σ 10 % of the mean); step time without the "
                         "profiler: estimated")
    assert conf.basis(_run([100], source="capture"))["line"].startswith("From 1 step × 2 of 2 ranks; ")
    assert conf.basis(_run([100], source="capture"))["unprofiled"] == "measured"


def test_many_steady_steps_on_every_rank_give_high():
    # no_dataloader_wait: the input family (3.5 pp over 3 pairs, t 2.353); σ/mean 0.82 % over 4 steps: 0.41 pp
    m = _model(_run([100, 101, 99, 100], whatif=[{"scenario": "no_dataloader_wait", "saving_pct": 30.0}]),
               [_finding("dataloader", "config")])
    conf.assess(m)
    half = 2.353 * (3.5 ** 2 + (0.82 / 2) ** 2) ** 0.5  # 8.29
    assert m["findings"][0]["confidence"] == {"level": "high", "range_pct": [round(30 - half, 1), round(30 + half, 1)],
                                              "why": []} == {"level": "high", "range_pct": [21.7, 38.3], "why": []}
    assert m["verdict_confidence"]["level"] == "high"


@pytest.mark.parametrize("steps", [[100], [100, 100, 100]])
def test_one_step_or_a_partial_run_never_gives_high(steps):
    world = 2 if len(steps) == 1 else 16  # the one-step run is complete; the three-step one partial
    m = _model(_run(steps, world=world, whatif=[{"scenario": "no_straggler", "saving_pct": 30.0}]),
               [_finding(), _finding("fp32_matmul", "precision")])
    conf.assess(m)
    levels = {f["kind"]: f["confidence"]["level"] for f in m["findings"]}
    assert "high" not in levels.values() and m["verdict_confidence"]["level"] != "high"
    if world == 16:  # a wait inside collectives may be for a missing rank: low; other findings medium at most
        assert levels == {"straggler": "low", "fp32_matmul": "medium"}
        assert "2 of 16 ranks traced" in m["findings"][0]["confidence"]["why"][0]
    else:
        assert levels["straggler"] == "medium"
        assert "one profiled step" in m["findings"][0]["confidence"]["why"]


@pytest.mark.parametrize(("spread", "level", "noisy"), [(0.02, "high", False), (0.15, "low", True),
                                                     (0.40, "low", True)])
def test_step_to_step_noise_caps_the_level(spread, level, noisy):
    # 15 %: the noise alone caps at medium, and its standard error (15 / √3 = 8.7 pp) widens the range past 40 points
    m = _model(_run([100 * (1 - spread), 100, 100 * (1 + spread)],
                    whatif=[{"scenario": "no_dataloader_wait", "saving_pct": 60.0}]),
               [_finding("dataloader", "config", impact=60.0)])
    conf.assess(m)
    assert m["findings"][0]["confidence"]["level"] == level
    assert (m["runs"][0]["confidence_basis"]["step_noise_pct"] > conf.NOISE_MEDIUM_PCT) == noisy


def test_replay_fidelity_model_range_and_an_estimated_base_cap_a_whatif():
    rows = [{"scenario": "bf16_matmul", "saving_pct": 50.0, "range_saving_pct": [45.0, 70.0]},
            {"scenario": "no_launch_overhead", "saving_pct": 40.0, "range_saving_pct": [10.0, 60.0]},
            {"scenario": "no_straggler", "saving_pct": 30.0, "reliable": False, "unreliable_reason": "shared cores"},
            {"scenario": "no_dataloader_wait", "saving_pct": 0.5}]
    run = _run([100, 105, 95], whatif=copy.deepcopy(rows))
    conf.assess(_model(run, []))
    got = {w["scenario"]: (w["confidence"]["level"], w["confidence"]["range_pct"]) for w in run["whatif"]}
    assert got == {"bf16_matmul": ("medium", [38.3, 72.6]),  # the precision range's sides with the family's error
                   "no_launch_overhead": ("low", [5.2, 66.6]),  # host: 2 pairs, so the pooled count and the larger σ
                   "no_straggler": ("low", [17.9, 42.1]),  # marked unreliable
                   "no_dataloader_wait": ("low", [0.0, 11.2])}  # a saving within the noise
    assert run["whatif"][2]["confidence"]["why"] == ["shared cores"]
    assert run["whatif"][1]["confidence"]["why"] == ["the saving's range spans 61 points"]
    for err, level in ((4.0, "high"), (8.0, "medium"), (20.0, "low")):
        r = _run([100, 100, 100], err=err, whatif=[{"scenario": "no_dataloader_wait", "saving_pct": 30.0}])
        conf.assess(_model(r, []))
        assert r["whatif"][0]["confidence"]["level"] == level
    # priced on an estimated step without the profiler: its fitted error (9.9 pp) joins the range when the
    # profiler's cost is large (which the 49-point range then makes low), else nothing changes
    for overhead, level, rng in ((36.0, "low", [5.3, 54.7]), (3.0, "high", [21.8, 38.2])):
        r = _run([100, 100, 100], source="estimate", overhead=overhead,
                 whatif=[{"scenario": "no_dataloader_wait", "saving_pct": 30.0}])
        conf.assess(_model(r, []))
        assert (r["whatif"][0]["confidence"]["level"], r["whatif"][0]["confidence"]["range_pct"]) == (level, rng)


def test_the_range_model_on_a_generated_run_with_exact_numbers():
    """saving ∓ √((t σ)² + precision side²), the kept idle added above: every source by hand."""
    w = {"scenario": "bf16_matmul", "saving_pct": 40.0, "range_saving_pct": [36.0, 43.0], "unexplained_gap_pct": 10.0}
    run = _run([100, 104, 96, 100], source="estimate", overhead=20.0)  # σ/mean 3.27 % over 4 steps
    b = conf.basis(run)
    src = conf.range_sources(w, b)
    assert b["step_noise_pct"] == 3.27 and src["noise_pp"] == pytest.approx(3.27 / 2)
    assert src["profiler_pp"] == 9.9  # an estimated step, the profiler at 20 % of it
    assert (src["model_pp"], src["pairs"]) == (4.63, 6) and conf.t90(6) == 1.943
    assert src["precision_pp"] == [4.0, 3.0] and src["kept_pp"] == pytest.approx(6.0)  # 10 % of the 60 % left
    ts = 1.943 * ((3.27 / 2) ** 2 + 9.9 ** 2 + 4.63 ** 2) ** 0.5  # 21.45
    lo, hi = 40 - (ts ** 2 + 4.0 ** 2) ** 0.5, 40 + (ts ** 2 + 3.0 ** 2) ** 0.5 + 6.0
    assert conf.saving_range(w, b) == [round(lo, 1), round(hi, 1)] == [18.2, 67.7]
    # a family of fewer than 3 pairs takes the pooled error and count (5.61 pp, 23 pairs: t 1.725), and no high
    assert conf.model_error("no_compile") == (5.61, 23) and conf.t90(23) == 1.725
    level, why = conf.whatif_confidence({"scenario": "no_compile", "saving_pct": 90.0}, conf.basis(_run([100] * 4)))
    assert level == "medium" and why == ["the model's error for this fix is measured on 1 pair (fewer than 3)"]


def test_hostile_values_do_not_break_the_rule():
    run = _run([100, 100, 100], whatif=[{"scenario": "x", "saving_pct": "NaN", "range_saving_pct": ["a", None]},
                                        "not a row"])
    run["steps"].append({"rank": 0, "step": "x", "step_time_us": float("nan")})
    run["world_size"] = "16"
    m = _model(run, [{"kind": 3, "impact_pct": None, "run": "run"}])
    conf.assess(m)
    assert run["whatif"][0]["confidence"] == {  # a scenario no pair measures: not high
        "level": "medium", "range_pct": None, "why": ["no recorded pair measures the model's error for this fix"]}
    assert m["findings"][0]["confidence"]["level"] == "medium"
    assert run["confidence_basis"]["steps"] == 3 and run["confidence_basis"]["world_size"] == 2


def _report(path, tmp_path) -> dict:
    r = CliRunner().invoke(cli, ["report", str(path), "-q", "-j", "1", "-o", str(tmp_path / "r.html"),
                                 "--json", str(tmp_path / "r.json"), "--db", str(tmp_path / "r.duckdb")])
    assert r.exit_code == 0, r.output
    return json.loads((tmp_path / "r.json").read_text())


def test_real_cpu_pair_the_page_and_the_summary_show_the_level_at_the_top(tmp_path):
    m = _report(SAMPLES / "pairs" / "straggler_sleep" / "slow", tmp_path)
    vc = m["verdict_confidence"]
    # the ranks family's error (5.96 pp over 9 pairs, t 1.833) with the noise's 6.01 / √2: 27 points wide, medium
    why = ["the saving's range spans 27 points"]
    assert vc["level"] == "medium" and vc["why"] == why
    assert vc["line"] == ("From 2 steps × 2 of 2 ranks (step time σ 6.01 % of the mean); step time without the "
                          "profiler: from the log")
    (w,) = [w for w in m["runs"][0]["whatif"] if w["scenario"] == "no_straggler"]
    assert w["confidence"]["level"] == "medium" and w["confidence"]["range_pct"] == [51.6, 78.4]
    assert w["confidence"]["replay_fidelity_pct"] == w["confidence"]["replay_error_pct"] == m["runs"][0]["replay"][
        "error_pct"]
    html = render_html(m)
    top = html[html.index('id="verdict"'):html.index('id="findings"')]
    assert 'id="confidence"' in top and "badge conf-medium" in top and "From 2 steps × 2 of 2 ranks" in top
    assert "medium confidence</span>" in html  # the main finding's card
    assert "saving 51.6–78.4 % (90 % range)" in html and "replay fidelity" in html and "replay error" not in html
    md = render_markdown(m)
    assert "**Confidence:** medium · From 2 steps × 2 of 2 ranks" in md
    assert "saving 51.6–78.4 % (90 % range); replay fidelity" in md


def test_real_gpu_run_priced_on_an_estimated_step_is_medium(tmp_path):
    m = _report(shared("traces/gpu/h200/launch/slow"), tmp_path)
    (w,) = [w for w in m["runs"][0]["whatif"] if w["scenario"] == "no_launch_overhead"]
    assert m["runs"][0]["confidence_basis"]["unprofiled"] == "estimated"
    assert w["confidence"]["level"] == "medium"
    assert any(y.startswith("priced on an estimated step without the profiler") for y in w["confidence"]["why"])


def test_the_compile_step_is_not_step_to_step_noise():
    run = _run([24000, 100, 102, 98])  # step 2 holds torch.compile: 240x the others
    run["compile_step"] = {"step": 2, "step_time_us": 24000 * 1000}
    b = conf.basis(run)
    assert b["steps"] == 3 and b["step_noise_pct"] == 2.0
