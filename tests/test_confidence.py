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
    m = _model(_run([100, 101, 99, 100], whatif=[{"scenario": "no_straggler", "saving_pct": 30.0}]), [_finding()])
    conf.assess(m)
    assert m["findings"][0]["confidence"] == {"level": "high", "range_pct": [29.2, 30.8], "why": []}
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


@pytest.mark.parametrize(("spread", "level"), [(0.02, "high"), (0.15, "medium"), (0.40, "low")])
def test_step_to_step_noise_caps_the_level(spread, level):
    m = _model(_run([100 * (1 - spread), 100, 100 * (1 + spread)],
                    whatif=[{"scenario": "no_straggler", "saving_pct": 60.0}]), [_finding(impact=60.0)])
    conf.assess(m)
    assert m["findings"][0]["confidence"]["level"] == level


def test_replay_fidelity_model_range_and_an_estimated_base_cap_a_whatif():
    rows = [{"scenario": "bf16_matmul", "saving_pct": 50.0, "range_saving_pct": [45.0, 70.0]},
            {"scenario": "no_launch_overhead", "saving_pct": 40.0, "range_saving_pct": [10.0, 60.0]},
            {"scenario": "no_straggler", "saving_pct": 30.0, "reliable": False, "unreliable_reason": "shared cores"},
            {"scenario": "no_dataloader_wait", "saving_pct": 0.5}]
    run = _run([100, 105, 95], whatif=copy.deepcopy(rows))
    conf.assess(_model(run, []))
    got = {w["scenario"]: (w["confidence"]["level"], w["confidence"]["range_pct"]) for w in run["whatif"]}
    assert got == {"bf16_matmul": ("medium", [45.0, 70.0]),  # a 25-point range
                   "no_launch_overhead": ("low", [10.0, 60.0]),  # a 50-point range
                   "no_straggler": ("low", [25.0, 35.0]),  # marked unreliable; ± the 5 % noise
                   "no_dataloader_wait": ("low", [0.0, 5.5])}  # a saving within the noise
    assert run["whatif"][2]["confidence"]["why"] == ["shared cores"]
    for err, level in ((4.0, "high"), (8.0, "medium"), (20.0, "low")):
        r = _run([100, 100, 100], err=err, whatif=[{"scenario": "no_straggler", "saving_pct": 30.0}])
        conf.assess(_model(r, []))
        assert r["whatif"][0]["confidence"]["level"] == level
    # priced on an estimated step without the profiler: medium when the profiler's cost is large, else no cap
    for overhead, level in ((36.0, "medium"), (3.0, "high")):
        r = _run([100, 100, 100], source="estimate", overhead=overhead,
                 whatif=[{"scenario": "no_launch_overhead", "saving_pct": 30.0}])
        conf.assess(_model(r, []))
        assert r["whatif"][0]["confidence"]["level"] == level


def test_a_finding_takes_its_whatifs_level_and_range_and_an_unpriced_one_is_medium():
    run = _run([100, 100, 100], whatif=[{"scenario": "bf16_matmul", "saving_pct": 50.0,
                                        "range_saving_pct": [45.0, 70.0]}])
    m = _model(run, [_finding("fp32_matmul", "precision", 50.0), _finding("host_sync", "config", 20.0)])
    conf.assess(m)
    assert m["findings"][0]["confidence"] == {"level": "medium", "range_pct": [45.0, 70.0],
                                              "why": ["the model's range spans 25 points"]}
    assert m["findings"][1]["confidence"]["level"] == "medium"
    assert m["findings"][1]["confidence"]["range_pct"] == [20.0, 20.0]  # no noise: the point


def test_hostile_values_do_not_break_the_rule():
    run = _run([100, 100, 100], whatif=[{"scenario": "x", "saving_pct": "NaN", "range_saving_pct": ["a", None]},
                                        "not a row"])
    run["steps"].append({"rank": 0, "step": "x", "step_time_us": float("nan")})
    run["world_size"] = "16"
    m = _model(run, [{"kind": 3, "impact_pct": None, "run": "run"}])
    conf.assess(m)
    assert run["whatif"][0]["confidence"]["level"] == "high" and run["whatif"][0]["confidence"]["range_pct"] is None
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
    assert vc["level"] == "high" and vc["why"] == []
    assert vc["line"] == ("From 2 steps × 2 of 2 ranks (step time σ 6.01 % of the mean); step time without the "
                          "profiler: from the log")
    (w,) = [w for w in m["runs"][0]["whatif"] if w["scenario"] == "no_straggler"]
    assert w["confidence"]["level"] == "high" and w["confidence"]["range_pct"] == [59.0, 71.0]
    html = render_html(m)
    top = html[html.index('id="verdict"'):html.index('id="findings"')]
    assert 'id="confidence"' in top and "badge conf-high" in top and "From 2 steps × 2 of 2 ranks" in top
    assert "high confidence</span>" in html  # the main finding's card
    md = render_markdown(m)
    assert "**Confidence:** high · From 2 steps × 2 of 2 ranks" in md


def test_real_gpu_run_priced_on_an_estimated_step_is_medium(tmp_path):
    m = _report(shared("traces/gpu/h200/launch/slow"), tmp_path)
    (w,) = [w for w in m["runs"][0]["whatif"] if w["scenario"] == "no_launch_overhead"]
    assert m["runs"][0]["confidence_basis"]["unprofiled"] == "estimated"
    assert w["confidence"]["level"] == "medium"
    assert w["confidence"]["why"][0].startswith("priced on an estimated step without the profiler")


def test_the_compile_step_is_not_step_to_step_noise():
    run = _run([24000, 100, 102, 98])  # step 2 holds torch.compile: 240x the others
    run["compile_step"] = {"step": 2, "step_time_us": 24000 * 1000}
    b = conf.basis(run)
    assert b["steps"] == 3 and b["step_noise_pct"] == 2.0
