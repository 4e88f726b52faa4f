"""Issue 19: verdicts users can trust. One section per class of wrong verdict the issue reproduced, each on
generated traces (tests/synth.py) or the committed samples, with the expected verdict text and numbers; the real
traces that showed classes 1 and 4 are checked too where ../shared is present."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import real, sample
from tests.synth import kernel, write_gpu_job, write_trace, x
from traceanalyze import diagnose
from traceanalyze.cli import cli
from traceanalyze.discover import classify, discover
from traceanalyze.findings import Finding
from traceanalyze.fmt import fmt_ms
from traceanalyze.logs import parse_text_log
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.report import charts, render_html


def _finding(model: dict, kind: str) -> dict:
    return next(f for f in model["findings"] if f["kind"] == kind)


# -- 1. false "healthy" on real GPU traces ------------------------------------------------------------------

def test_partial_traces_waiting_for_untraced_ranks_are_inconclusive(tmp_path):
    # 8 NCCL ranks, rank 6 idles 30 ms on the host each step; only ranks 0-3 are in the folder
    write_gpu_job(tmp_path, 8, 6, straggler=6)
    for r in range(4, 8):
        (tmp_path / f"rank{r}.json").unlink()
    m = analyze(tmp_path, Options(jobs=1)).model
    assert m["verdict"] == ("Partial: 4 of 8 ranks traced (the missing ranks could explain the waits inside "
                            "collectives: untraced ranks, slow collectives). Inconclusive: 35% of each step is exposed "
                            "communication with ranks not in these traces, where waiting for them cannot be told from "
                            "transfer. The GPU is idle 1%.")
    f = m["findings"][0]
    assert (f["kind"], f["severity"], f["impact_pct"]) == ("untraced_ranks", "high", 35.4)
    assert f["evidence"][0] == "4 of 8 ranks traced (ranks 0–3); 4 have no trace here"
    comm = _finding(m, "slow_collectives")
    assert "4 of 8 ranks traced: waiting for the untraced ranks cannot be separated from transfer" in " ".join(
        comm["evidence"])


def test_real_two_of_128_ranks_is_inconclusive_not_healthy():
    m = analyze(real("hta/trace_filter"), Options(jobs=1)).model
    assert m["verdict"] == ("Partial: 2 of 128 ranks traced (the missing ranks could explain the waits inside "
                            "collectives: untraced ranks). Inconclusive: 17% of each step waits in collectives for "
                            "ranks not in these traces. The GPU is idle 54%.")
    f = m["findings"][0]
    # the ten ncclKernel_SendRecv kernels are 4 all_to_all, 4 all_reduce and 2 _all_gather_base (their nccl:*
    # annotations, issue 30): matched per operation, not as one send_recv sequence
    assert (f["kind"], f["severity"], f["impact_pct"]) == ("untraced_ranks", "medium", 17.4)
    assert f["evidence"][1] == ("collective wait per step: rank 0 114.3 ms (19% of its step), rank 1 97.2 ms (16% of "
                                "its step)")


def _host_bound_trace(folder: Path) -> Path:
    """One GPU, 60 tiny kernels a 4.4 ms step, each launched 70 µs after the previous (the host is the pace)."""
    ev, corr, t = [], 1, 1000.0
    for s in range(4):
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, 4400.0))
        h = t + 50
        for _ in range(60):
            ev.append(x("cpu_op", "aten::add", h, 8.0))
            ev += kernel("vectorized_elementwise_kernel", h + 10, 5.0, 7, corr, h + 2)
            corr += 1
            h += 70.0
        t += 4400.0
    return write_trace(folder / "rank0.json", 0, ev, world_size=1, backend="nccl")


def test_host_bound_step_with_few_kernels_is_found_from_the_idle_breakdown(tmp_path):
    _host_bound_trace(tmp_path)
    m = analyze(tmp_path, Options(jobs=1)).model
    # one percentage in the verdict, what the fix saves; the title keeps its own measures
    assert m["verdict"] == "Main cause: config (launch bound): Launch-bound — fixing it saves about 93% of step time."
    f = m["findings"][0]
    # no_launch_overhead replay: 60 kernels of 5 µs in a 4.4 ms step, priced on the step without the profiler's
    # host cost (issue 29)
    assert f["impact_pct"] == 92.6
    assert f["evidence"][1] == ("60 kernels per step, 13.6 per ms of step, median 5.0 µs each; launch calls take "
                                "0.1 ms per step on the host")


OURS = Path(__file__).resolve().parent / "data" / "gpu"  # our GPU pairs (benchmarks/record_gpu.py)


@pytest.mark.parametrize(("gpu", "waits", "severity", "predicted", "measured"), [
    ("h100", 33, "high", 35.38, 29.97),
    pytest.param("h200", 28, "medium", 13.39, 29.95, marks=pytest.mark.xfail(strict=True, reason=(
        "known miss on the H200 (blind check): no_dataloader_wait predicts 13.39 % against 29.95 % measured "
        "(30.39 -> 21.29 ms, the mean of 3 repetitions: slow 30.24, 27.02, 33.91 ms), -16.6 points, past the 15-point "
        "target (benchmarks/gpu_pairs.py); the finding's title says 28 % of each step waits for the DataLoader")))])
def test_real_loader_pair_names_the_dataloader(gpu, waits, severity, predicted, measured):
    """The loader pair (2 workers against 12 with pinned memory, each sample a sort of 100k floats): the slow side's
    main finding is the DataLoader, the fixed side has none, and the what-if is within 15 points of the saving."""
    truth = json.loads((OURS / gpu / "truth.json").read_text())["pairs"]["loader"]
    ms = {s: sum(r["wall_ms_per_step_mean"] for r in reps.values()) / len(reps) for s, reps in truth.items()}
    assert 100 * (1 - ms["fixed"] / ms["slow"]) == pytest.approx(measured, abs=0.01)
    m = analyze(OURS / gpu / "loader" / "slow", Options(jobs=1)).model
    (f,) = [f for f in m["findings"] if f["kind"] == "dataloader"]
    assert f["main"] and f["severity"] == severity
    assert f["title"] == f"The input pipeline is the bottleneck: {waits}% of each step waits for the DataLoader"
    w = next(w for w in m["runs"][0]["whatif"] if w["scenario"] == "no_dataloader_wait")
    assert w["saving_pct"] == pytest.approx(predicted, abs=0.01) and f["impact_pct"] == round(predicted, 1)
    assert analyze(OURS / gpu / "loader" / "fixed", Options(jobs=1)).model["findings"] == []
    assert abs(w["saving_pct"] - measured) <= 15


def test_real_h100_step_is_launch_bound():
    m = analyze(real("tracelens/h100"), Options(jobs=1)).model
    f = m["findings"][0]
    # impact from the what-if replay (no_launch_overhead), not the rule's estimate: the host time between launches
    # includes the other runtime calls (22 cudaDeviceGetAttribute, 16 cudaFuncSetAttribute, ...), which CUDA graphs
    # remove too; the GPU is busy 0.31 ms of the 4.43 ms step. The saving is of the step without the profiler's own
    # host cost (611 recorded ops and calls a step with record_shapes, with_stack and profile_memory, issue 29),
    # 1.58 ms against 4.4 ms profiled: 59.1 % of it, not 76.7 % of the profiled step
    assert (f["kind"], f["impact_pct"]) == ("launch_bound", 59.1)
    assert m["runs"][0]["profiler_overhead"]["unprofiled_step_time_us"] == pytest.approx(1577.329, abs=0.1)
    assert f["evidence"][1:] == ["60 kernels per step, 13.6 per ms of step, median 4.6 µs each; launch calls take "
                                 "0.3 ms per step on the host",
                                 "matrix-math efficiency 4.1% (40.6 TFLOPS of 989 while GEMMs run)",
                                 "impact from the what-if replay (no_launch_overhead): predicted step time 0.64 ms, "
                                 "59.1% saved"]


def test_gpu_idle_above_half_is_never_healthy_without_a_finding():
    ev = diagnose.RunEvidence(name="r", mode="gpu", world_size=1, gpu_model=None, step_time_us=1000.0, steps=[],
                              ranks=[{"rank": 0, "idle_pct": 61.0, "window_us": 1000.0}],
                              idle=[{"rank": 0, "stream": 7, "n_kernels": 9, "host_wait_pct": 20.0}])
    fs = diagnose.diagnose(ev)
    assert [(f.kind, f.severity, f.impact_pct) for f in fs] == [("unexplained_idle", "medium", 11.0)]
    assert diagnose.verdict(fs) == ("Not healthy: the GPU is idle 61% of the time and no rule explains it; see the GPU "
                                    "idle breakdown and the timeline.")


# -- 2. a Hugging Face layout is one run ---------------------------------------------------------------------

def _hf_job(root: Path) -> Path:
    job = root / "my-job"
    src = sample("grad_accum") / "2proc"
    for p in src.glob("*.log"):
        (job / "logs").mkdir(parents=True, exist_ok=True)
        shutil.copy(p, job / "logs" / p.name)
    (job / "traces").mkdir(parents=True)
    for p in src.glob("*.gz"):
        shutil.copy(p, job / "traces" / p.name)
    return job


def test_logs_and_traces_subfolders_are_one_run_named_after_the_job(tmp_path):
    job = _hf_job(tmp_path)
    (run,) = discover([job]).runs
    # rank0.log holds the Trainer banner; rank1.log only warnings (not a training log)
    assert (run.name, run.path, len(run.traces), [s.path.name for s in run.sidecars]) == ("my-job", job, 2,
                                                                                          ["rank0.log"])
    (rm,) = analyze(job, Options(jobs=1)).model["runs"]
    assert (rm["name"], rm["mode"], rm["world_size"], len(rm["ranks"])) == ("my-job", "cpu", 2, 2)
    assert rm["log_facts"]["gradient_accumulation_steps"] == ["8"] and rm["log_facts"]["per_device_batch"] == ["2"]
    from traceanalyze.batch import find_runs

    (spec,) = find_runs(tmp_path)
    assert spec["run_id"] == "my-job" and spec["n_files"] == 3


# -- 3. precision advice fits the device --------------------------------------------------------------------

def test_cpu_precision_advice_and_main_cause_only_when_worth_a_ticket():
    fp32 = analyze(sample("precision_fp32"), Options(jobs=1)).model
    f = _finding(fp32, "fp32_matmul")
    assert (f["severity"], f["impact_pct"]) == ("medium", 20.4)  # impact from the bf16_matmul replay
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in f["recommendation"] and "cuda" not in f["recommendation"]
    healthy = analyze(sample("healthy"), Options(jobs=1)).model
    assert healthy["verdict"] == "No significant slowdown found: no finding reaches medium severity."
    h = _finding(healthy, "fp32_matmul")
    assert (h["severity"], h["impact_pct"]) == ("low", 12.5)  # the replay's price; the rule keeps it low
    # the predicted step is of the job without the profiler: the training log's step time (110.7 ms) less 12.5 %
    assert h["evidence"][-1] == ("impact from the what-if replay (bf16_matmul): predicted step time 96.82 ms, "
                                 "12.5% saved (model range 7.5–18.8%)")
    assert h["evidence"][-2] == ("estimated gain 30.9 ms per step is within 2 standard deviations of this run's step "
                                 "times (σ 22.3 ms over 8 rank-steps): not worth a ticket on this evidence; measure it "
                                 "with one bf16 run")
    two = analyze(sample("grad_accum") / "2proc", Options(jobs=1)).model
    t = _finding(two, "fp32_matmul")
    assert (t["severity"], t["impact_pct"]) == ("low", 6.5)  # the bf16_matmul replay
    assert not two["verdict"].startswith("Main cause: precision")


# -- 4. one unit per table ----------------------------------------------------------------------------------

def test_compile_step_is_apart_and_its_cost_is_per_cold_start_without_a_stated_job_length():
    m = analyze(sample("compile_cold"), Options(jobs=1)).model
    (run,) = m["runs"]
    assert run["step_time_us"] == 62894.588 and run["step_stat"] == "1 step"  # step 1, not the mean with step 0
    cs = run["compile_step"]
    assert {k: cs[k] for k in ("step", "step_time_us", "n_kernels", "kernel_time_us")} == {
        "step": 0, "step_time_us": 24055272.136, "n_kernels": 27286, "kernel_time_us": 4320034.547}
    assert len(cs["top_kernels"]) == 5  # its own folded row, apart from the steady tables
    # no invented job length: the cost of one cold start (the compile step above the steady step), medium at most
    assert m["verdict"] == ("Main cause: config (compile overhead): torch.compile took 24.0 s once (a cold start), the "
                            "time of 394 steady steps (a one-time cost per cold start: no log or config states the "
                            "number of steps).")
    f = m["findings"][0]
    assert (f["kind"], f["severity"]) == ("compile_overhead", "medium")
    assert "1,000" not in " ".join(f["evidence"]) and "TORCHINDUCTOR_CACHE_DIR" in f["recommendation"]
    doc = render_html(m)
    assert "Step time <small>(1 step)</small>" in doc and "Compile step <small>(step 0, apart)</small>" in doc
    assert "24,055.27" in doc and "Median step time" not in doc


def test_per_rank_table_is_per_step_and_window_totals_are_apart():
    m = analyze(sample("straggler"), Options(jobs=1)).model
    (run,) = m["runs"]
    r0 = [s for s in run["steps"] if s["rank"] == 0]
    per_step = sorted(s["exposed_comm_us"] for s in r0)
    median = (per_step[0] + per_step[1]) / 2
    total = next(r for r in run["ranks"] if r["rank"] == 0)["exposed_comm_us"]
    assert total > 1.5 * median  # the trace window holds more than the counted steps
    doc = render_html(m)
    per_rank = doc.split("<h3>Per-rank metrics per step</h3>")[1].split("Trace-window totals")[0]
    assert fmt_ms(median) in per_rank and fmt_ms(total) not in per_rank
    totals = doc.split("Trace-window totals per rank")[1].split("</details>")[0]
    assert "summed over the whole trace window, not per step" in totals and fmt_ms(total) in totals
    assert "Step time <small>(mean of 2 steps)</small>" in doc


# -- 5. comparison attributes a delta only to a finding that can explain it --------------------------------

def test_comparison_does_not_blame_a_cause_both_runs_share():
    m = analyze(sample("straggler"), Options(baseline=sample("healthy"), jobs=1)).model
    parts = {p["part"]: p for p in m["comparison"]["parts"]}
    assert parts["compute"]["delta_us"] == -10661.5 and parts["compute"]["finding"] is None  # both runs are fp32
    assert parts["exposed communication"]["finding"].startswith("Rank 2 is a straggler")
    s = diagnose.RunEvidence("s", "cpu", 2, None, [], [], 200_000.0)
    b = diagnose.RunEvidence("b", "cpu", 2, None, [], [], 160_000.0)
    from traceanalyze.metrics.precision import PrecisionMix

    s.prec = PrecisionMix(mode="cpu", gemm_time_us=1.0, fp32_share_pct=100.0)
    b.prec = PrecisionMix(mode="cpu", gemm_time_us=1.0, fp32_share_pct=100.0)
    f = diagnose.Finding("precision", "fp32_matmul", "medium", 20.0, [0, 1], "fp32", [], "")
    assert not diagnose.explains(f, 38_000.0, s, b, [])  # +38 ms of compute, both runs fp32
    b.prec = PrecisionMix(mode="cpu", gemm_time_us=1.0, fp32_share_pct=0.0)
    assert diagnose.explains(f, 38_000.0, s, b, [])  # the baseline runs bf16: the cause differs
    assert not diagnose.explains(f, -51_000.0, s, b, [])  # a faster part is no slowdown to explain


def test_step_table_highlights_follow_the_straggler_finding():
    m = analyze(sample("straggler"), Options(jobs=1)).model
    doc = render_html(m)
    table = doc.split('<table class="steps">')[1].split("</table>")[0]
    head = table.split("</thead>")[0]
    cols = [c.split(" (ms)")[0] for c in head.split('<th class="n">Rank ')[1:]]
    assert cols[0] == "2"  # the straggler's column first
    for row in table.split("</thead>")[1].split("<tr")[1:]:
        cells = row.split("<td ")[2:2 + len(cols)]
        assert ['class="n hi"' in c for c in cells] == [rk == "2" for rk in cols]
    assert "the straggler finding's rank (rank 2)" in doc


# -- 6. the straggler finding says where --------------------------------------------------------------------

def test_straggler_evidence_names_ops_and_host_gaps(tmp_path):
    write_gpu_job(tmp_path / "g8", 8, 6, straggler=5)
    with pytest.MonkeyPatch.context():
        from traceanalyze import api

        with api.analyze(tmp_path / "g8", jobs=1) as a:
            res = a.export(tmp_path / "m.json.gz")
            f = _finding(a.model, "straggler")
    assert f["evidence"][1] == ("host gaps (no op, annotation or runtime call on the step thread): 30.6 ms per step on "
                                "rank 5 vs a median of 0.6 ms")
    assert f["evidence"][2].startswith("largest host gaps on rank 5: step 0 +0.0–30.3 ms (30.3 ms); step 1 ")
    assert f["recommendation"].startswith("rank 5's extra time is idle host time, not work")
    doc = json.loads(gzip.open(res.path).read())
    marks = [e for e in doc["traceEvents"] if e["name"].startswith("straggler")]
    assert {e["pid"] for e in marks} == {5} and all(e["dur"] == 30300.0 for e in marks[:3])
    strag = _finding(analyze(sample("straggler"), Options(jobs=1)).model, "straggler")
    assert strag["evidence"][1].startswith("per op against the median rank (per step): aten::linear 78.3 ms vs "
                                           "13.3 ms (+65.0 ms)")
    assert strag["recommendation"].startswith("rank 2 does more work: the ops listed")


# -- 7. signals for CI and terminals ------------------------------------------------------------------------

def test_report_prints_the_verdict_and_fails_on_severity(tmp_path):
    job = write_gpu_job(tmp_path / "g4", 4, 5, straggler=1)
    run = CliRunner()
    r = run.invoke(cli, ["report", str(job), "-o", str(tmp_path / "a.html")])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == ("verdict: Main cause: imbalance (straggler): Rank 1 is a straggler — fixing it saves about 25% "
                        "of step time.")
    # the ranks family's error (5.96 pp over 9 pairs: t 1.833) makes a 22-point range (docs/confidence.md)
    assert lines[1] == ("confidence: medium · From 4 steps × 4 of 4 ranks (step time σ 0.32 % of the mean); step time "
                        "without the profiler: estimated (not higher because: the saving's range spans 22 points)")
    assert lines[2] == ("[medium] 25.0% imbalance/straggler: Rank 1 is a straggler: the other ranks wait 25% of the "
                        "step for it (rank 1) (medium confidence)")
    r = run.invoke(cli, ["report", str(job), "-o", str(tmp_path / "b.html"), "-q", "--fail-on", "high"])
    assert (r.exit_code, r.stdout) == (0, "")  # the straggler is medium (25.0 % by the replay), not high
    r = run.invoke(cli, ["report", str(job), "-o", str(tmp_path / "b.html"), "-q", "--fail-on", "medium"])
    assert (r.exit_code, r.stdout) == (3, "")
    assert (tmp_path / "b.html").is_file()  # written before the exit status
    healthy = write_gpu_job(tmp_path / "ok", 4, 5, transfer_us=2000.0)
    r = run.invoke(cli, ["report", str(healthy), "-o", str(tmp_path / "c.html"), "-q", "--fail-on", "medium"])
    assert r.exit_code == 0, r.output
    r = run.invoke(cli, ["report", str(job), "--format", "json", "-q"])
    assert r.exit_code == 0 and json.loads(r.stdout)["verdict"].startswith("Main cause")  # no summary mixed in


def test_docs_list_every_exit_status():
    text = (Path(__file__).parents[1] / "docs" / "options.md").read_text(encoding="utf-8")
    table = text.split("## Exit status")[1].split("\n## ")[0]
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 4 |", "| 5 |", "| 130 |"):
        assert code in table
    assert "--fail-on high\\|medium" in table and "--fail-on-regression" in table


# -- 8. a page that reads at a glance -----------------------------------------------------------------------

def test_64_rank_page_is_short_with_heatmaps_timeline_and_outliers_first(tmp_path):
    write_gpu_job(tmp_path, 64, 8, straggler=37)
    m = analyze(tmp_path, Options(jobs=1)).model
    tl = m["runs"][0]["timeline"]
    assert (tl["step"], tl["n_ranks"], len(tl["lanes"])) == (5, 64, 32)
    assert tl["lanes"][0]["rank"] == 37 and tl["markers"][0]["rank"] == 37
    assert round(tl["markers"][0]["dur_us"]) == 30300
    kinds = [s["kind"] for s in tl["lanes"][0]["segments"]]
    assert kinds[:2] == ["idle", "compute"]
    doc = render_html(m)
    # timeline, 2 heatmaps, breakdown bars, step lines, the replayed median step: none grows with the ranks
    assert doc.count("<svg") == 6
    assert 'id="ta-heat-step-1"' in doc and 'id="ta-heat-comm-1"' in doc and 'id="ta-timeline-1"' in doc
    shown = doc.split("<h3>Per-rank metrics per step</h3>")[1].split("<details>")[0]
    assert shown.count("<tr") == 1 + 8 and "<b>37</b>" in shown.split("</thead>")[1].split("</tr>")[0]
    assert "56 more ranks (no outlier among them)" in doc
    assert len(doc.encode()) < 400_000


def test_heatmap_of_1000_ranks_keeps_the_outlier_visible():
    steps = [{"rank": r, "step": s, "step_time_us": 100_000.0 + (50_000.0 if r == 613 else r % 3)}
             for r in range(1000) for s in range(4)]
    h = charts.heatmap(steps, "step_time_us", "Step time (ms)")
    assert len({c["y"] for c in h["cells"]}) == 125 and h["grouped"] == "1000 ranks in 125 rows"
    hot = [c for c in h["cells"] if c["fill"] == h["hi_color"]]
    assert len(hot) == 4 and all("farthest: rank 613" in c["title"] for c in hot)


# -- 9. quiet data quality ----------------------------------------------------------------------------------

def test_step_time_json_and_console_lines_are_read_and_listed_as_used(tmp_path):
    for r in range(2):
        shutil.copy(next(sample("straggler").glob(f"rank{r}.*.gz")), tmp_path)
    big = tmp_path / "step_times_rank0.json"  # larger than the 64 KiB sniffed: once read as a broken trace
    big.write_text(json.dumps([{"step": i, "step_time_ms": 640.0 + i % 3} for i in range(5000)]))
    (tmp_path / "console.log").write_text("starting\n[rank0] step 3 loss 2.31 time 637.9ms\n"
                                          "[rank1] step 3 loss 2.30 time 640.1ms\n[rank0] step 4 loss 2.2 time 0.65s\n")
    (tmp_path / "notes.txt").write_text("what we tried\n")  # not ours: listed with its folder, at info level
    assert classify(big) == ("training_log", "")
    steps = parse_text_log(tmp_path / "console.log").steps
    assert [(s.rank, s.step, s.step_time_ms) for s in steps] == [(0, 3, 637.9), (1, 3, 640.1), (0, 4, 650.0)]
    m = analyze(tmp_path, Options(jobs=1)).model
    used = {Path(w["file"]).name: (w["level"], w["message"]) for w in m["warnings"] if w["file"]}
    assert used["step_times_rank0.json"] == ("info", "used: a step-time JSON with 5000 step time(s), median 641.0 ms "
                                                     "(the run's step time from logs)")
    assert used["console.log"] == ("info", "used: console step lines with 3 step time(s), median 640.1 ms (the run's "
                                           "step time from logs)")
    assert not [w for w in m["warnings"] if w["level"] == "error"]
    assert used["notes.txt"] == ("info", "not a Kineto trace, training log, NCCL output, topology or config; skipped")
    assert f"<td class=\"mono\" title=\"{tmp_path / 'notes.txt'}\">{tmp_path.name}/notes.txt</td>" in render_html(m)
    assert m["runs"][0]["log_step_time_ms"] == {"median_ms": 641.0, "n": 5002, "steps": "0–4999"}
    assert "Step time from logs" in render_html(m)


def test_steps_of_groups_the_steps_by_rank_and_follows_a_new_list():
    """``RunEvidence.steps_of``: a rank's steps in their order, none for a rank without steps, and the grouping
    made again when ``steps`` is replaced or grows."""
    steps = [{"rank": r, "step": s, "step_time_us": 100.0 * (r + 1) + s} for s in (1, 2, 3) for r in (0, 1)]
    ev = diagnose.RunEvidence("r", "gpu", 2, None, [], steps, 150.0)
    assert [s["step"] for s in ev.steps_of(1)] == [1, 2, 3]
    assert [s["step_time_us"] for s in ev.steps_of(0)] == [101.0, 102.0, 103.0]
    assert ev.steps_of(5) == []
    ev.steps.append({"rank": 5, "step": 4, "step_time_us": 7.0})
    assert ev.steps_of(5) == [{"rank": 5, "step": 4, "step_time_us": 7.0}]
    ev.steps = steps[:2]
    assert [s["step"] for s in ev.steps_of(1)] == [1]


def test_each_verdict_sentence_carries_one_percentage():
    import re

    from traceanalyze.diagnose.verdict import headline

    assert headline("Rank 1 is a straggler: the other ranks wait 28% of the step for it") == "Rank 1 is a straggler"
    assert headline("The host waits for the GPU in cudaDeviceSynchronize every step: the GPU idles while the next "
                    "step is launched (16% of the step)") == ("The host waits for the GPU in cudaDeviceSynchronize "
                                                               "every step")
    assert headline("The optimizer step takes 37% of the step on the host, one kernel per parameter") == \
        "The optimizer step, one kernel per parameter"
    assert headline("Effective batch grew 2× against the baseline") == "Effective batch grew 2× against the baseline"
    whole = Finding("config", "launch_bound", "high", 60.0, [0], "Launch-bound: GPU idle 83% between tiny kernels, "
                    "100% of it waiting for the host", [], "", run="r")
    part = Finding("config", "host_optimizer", "medium", 28.0, [0], "The optimizer step takes 37% of the step on the "
                   "host, one kernel per parameter", [], "", run="r", part_of="launch_bound")
    v = diagnose.verdict([whole, part])
    assert v == ("Main cause: config (launch bound): Launch-bound — fixing it saves about 60% of step time. Part of "
                 "it: the optimizer step, one kernel per parameter; a fused optimizer alone saves about 28%.")
    assert all(len(re.findall(r"\d%", s)) == 1 for s in v.split(". "))
