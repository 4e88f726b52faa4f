"""Facts of every recorded sample run, computed by the tool's own ingest and metrics (not by re-reading JSON)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SAMPLES, sample
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze

SCENARIOS = ["healthy", "straggler", "precision_fp32", "precision_bf16", "compile_cold", "compile_warm",
             "dataloader_bound", "slow_interconnect", "fast_interconnect", "memory_growth"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_rank_and_profiler_step_is_read(name):
    path = sample(name)
    truth = json.loads((path / "scenario.json").read_text())
    a = analyze(path, Options(jobs=1))
    (run,) = a.model["runs"]
    assert run["mode"] == "cpu" and run["backend"] == "gloo"
    assert run["world_size"] == truth["world_size"]
    assert run["ranks_found"] == list(range(truth["world_size"]))
    assert not run["missing_ranks"]
    steps = sorted({s["step"] for s in run["steps"]})
    # every profiled step is counted but the last of the window, which holds the profiler's teardown
    assert steps == truth["profiled_steps"][:-1]
    # the trace's step times agree with what the job itself measured (same steps, within scheduling noise)
    for r in run["ranks"]:
        job = [truth["step_times_ms"][str(r["rank"])][s] for s in steps]
        assert r["step_time_us"] / 1e3 == pytest.approx(sum(job) / len(job), rel=0.35)


def test_bf16_run_has_bf16_matmuls_and_fp32_run_has_none():
    bf16 = analyze(sample("precision_bf16"), Options(jobs=1)).model["runs"][0]
    fp32 = analyze(sample("precision_fp32"), Options(jobs=1)).model["runs"][0]
    mix16 = {m["dtype"]: m["pct"] for m in bf16["dtype_mix"]}
    mix32 = {m["dtype"]: m["pct"] for m in fp32["dtype_mix"]}
    assert mix16.get("bf16", 0) > 90  # aten::mm / addmm under autocast take c10::BFloat16 inputs
    assert mix32 == {"fp32": 100.0}
    assert bf16["precision"]["main_dtype"] == "bf16" and fp32["precision"]["fp32_share_pct"] == 100.0


def test_cold_compile_holds_the_compile_ranges_and_the_warm_one_far_less():
    cold = analyze(sample("compile_cold"), Options(jobs=1))
    warm = analyze(sample("compile_warm"), Options(jobs=1))
    names = {n for (n,) in cold.con.execute("SELECT DISTINCT name FROM cpu_ops").fetchall()}
    assert {"entire_frame_compile", "backend_compile", "inductor_compile"} <= names
    c, w = cold.model["runs"][0]["compile"], warm.model["runs"][0]["compile"]
    assert c["frames"] >= 1 and c["compiled_regions"] >= 1
    assert max(c["compile_us"].values()) > 3 * max(w["compile_us"].values())
    assert c["first_step_us"] > 50 * c["steady_step_us"]


def test_dataloader_time_is_measured_per_rank():
    run = analyze(sample("dataloader_bound"), Options(jobs=1)).model["runs"][0]
    healthy = analyze(sample("healthy"), Options(jobs=1)).model["runs"][0]
    assert min(run["dataloader"]["share_pct"].values()) > 30
    assert healthy["dataloader"] is None or max(healthy["dataloader"]["share_pct"].values()) < 10


def test_grad_accum_runs_and_trainer_banner():
    path = sample("grad_accum")
    m = analyze(path, Options(jobs=1)).model
    runs = {r["name"]: r for r in m["runs"]}
    assert runs["1proc"]["world_size"] == 1 and runs["2proc"]["world_size"] == 2
    assert runs["2proc"]["log_facts"]["gradient_accumulation_steps"] == ["8"]
    assert runs["1proc"]["log_facts"]["global_batch"] == ["16"] and runs["2proc"]["log_facts"]["global_batch"] == ["32"]


def test_samples_stay_small():
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 25 * 2**20
