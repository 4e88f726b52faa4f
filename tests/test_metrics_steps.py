"""One definition of a profiler step (traceanalyze.metrics.steps), old-schema traces and profiling windows."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import SAMPLES, real
from tests.old_schema import to_2021
from tests.synth import cpu_job, kernel, write_trace, x
from traceanalyze.errors import TraceanalyzeError
from traceanalyze.metrics.steps import run_step_time_us, step_set
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.report import render_html

DATALOADER_RANK0 = SAMPLES / "dataloader_bound" / "rank0.1795307966715981597.pt.trace.json.gz"


def gpu_job(steps: dict[int, float], start: float = 1000.0, kernel_us: float = 1000.0) -> list[dict]:
    """A GPU rank: ``ProfilerStep#N`` of the given durations (µs), back to back; in each step one compute kernel of
    ``kernel_us`` launched 10 µs into the step."""
    ev, t, corr = [], start, 1
    for n, dur in steps.items():
        ev.append(x("user_annotation", f"ProfilerStep#{n}", t, dur))
        ev += kernel("void gemm_kernel", t + 20, kernel_us, stream=7, corr=corr, launch_ts=t + 10)
        corr += 1
        t += dur
    return ev


@pytest.fixture()
def two_gpu_ranks(tmp_path):
    """Rank 0 profiles steps 1-4, rank 1 steps 2-4 (it started its window later); step 4 is each window's last."""
    d = tmp_path / "job"
    write_trace(d / "rank0.json", 0, gpu_job({1: 10_000, 2: 10_000, 3: 12_000, 4: 30_000}), backend="nccl")
    write_trace(d / "rank1.json", 1, gpu_job({2: 11_000, 3: 9_000, 4: 30_000}, start=11_000), backend="nccl")
    return d


def test_steps_complete_on_every_rank_and_not_at_a_window_edge(two_gpu_ranks):
    a = analyze(two_gpu_ranks, Options(jobs=1))
    (run,) = a.model["runs"]
    # step 1 is missing on rank 1 and step 4 is the partial last step of both windows: steps 2 and 3 remain
    assert [(s["rank"], s["step"], s["step_time_us"]) for s in run["steps"]] == [
        (0, 2, 10_000.0), (0, 3, 12_000.0), (1, 2, 11_000.0), (1, 3, 9_000.0)]
    ranks = {r["rank"]: r for r in run["ranks"]}
    assert (ranks[0]["n_steps"], ranks[0]["step_time_us"]) == (2, 11_000.0)  # median of 10 and 12 ms
    assert (ranks[1]["n_steps"], ranks[1]["step_time_us"]) == (2, 10_000.0)  # median of 11 and 9 ms
    # the run: median over steps 2 and 3 of the slowest rank's duration, max(10, 11) and max(12, 9) ms
    assert run["step_time_us"] == 11_500.0
    # kernel columns count the kernels the breakdown counts: those launched before the last step
    assert (ranks[0]["n_kernels"], ranks[0]["kernel_compute_us"]) == (3, 3000.0)
    assert (ranks[1]["n_kernels"], ranks[1]["kernel_compute_us"]) == (2, 2000.0)
    assert ranks[0]["window_us"] == 21_000.0  # first kernel start (1020) to the last counted kernel end (22020)
    # the same steps for a user's own SQL and for other analyses (the replay)
    rows = a.con.execute("SELECT rank, step, window_edge, counted FROM profiler_steps(1) ORDER BY rank, step"
                         ).fetchall()
    assert rows == [(0, 1, False, False), (0, 2, False, True), (0, 3, False, True), (0, 4, True, False),
                    (1, 2, False, True), (1, 3, False, True), (1, 4, True, False)]
    steps = step_set(a.con, 1)
    assert [(s.rank, s.step, s.duration_us) for s in steps] == [(0, 2, 10_000.0), (0, 3, 12_000.0),
                                                                 (1, 2, 11_000.0), (1, 3, 9_000.0)]
    assert run_step_time_us(steps) == 11_500.0
    assert len(step_set(a.con, 1, counted_only=False)) == 7


def test_cpu_mode_leaves_the_last_step_out(tmp_path):
    d = tmp_path / "job"
    write_trace(d / "rank0.json", 0, cpu_job(0, 0.0))
    write_trace(d / "rank1.json", 1, cpu_job(1, 0.0))
    (run,) = analyze(d, Options(jobs=1)).model["runs"]
    assert sorted({s["step"] for s in run["steps"]}) == [1, 2]  # of 3 profiled
    r0 = run["ranks"][0]
    assert (r0["n_steps"], r0["window_us"], r0["step_time_us"]) == (2, 20_000.0, 10_000.0)
    assert r0["compute_us"] == 6000.0  # aten::mm of steps 1 and 2, 3 ms each


def test_old_schema_windows_of_one_worker(tmp_path):
    """A 2021-schema trace (Operator/DataLoader categories, ProfilerStep as cpu_op, absolute ts, no rank in the
    header) of one worker profiled in two windows, named as tensorboard_trace_handler names them."""
    d = tmp_path / "resnet"
    to_2021(DATALOADER_RANK0, d / "worker0.1621401187223.pt.trace.json.gz")
    to_2021(DATALOADER_RANK0, d / "worker0.1621401197223.pt.trace.json.gz", shift_us=10e6, step_offset=10)
    a = analyze(d, Options(jobs=1))
    (run,) = a.model["runs"]
    assert run["ranks_found"] == [0]  # one rank in two windows, not ranks 0 and 1
    assert run["file_grouping"] == ("2 trace files read as 1 rank; rank 0: 2 profiling windows (the same worker "
                                    "name 'worker0', differing only in the timestamp)")
    (info,) = [w for w in a.model["warnings"] if "profiling windows" in w["message"]]
    assert "worker0.1621401187223.pt.trace.json.gz, worker0.1621401197223.pt.trace.json.gz" in info["message"]
    # steps 2-4 profiled per window; the last of each is partial: 2, 3 and 12, 13 are counted
    assert [(s["step"], s["step_time_us"]) for s in run["steps"]] == [
        (2, 140224.206), (3, 142634.656), (12, 140224.206), (13, 142634.656)]
    (r,) = run["ranks"]
    assert (r["n_files"], r["n_steps"], r["step_time_us"]) == (2, 4, 141429.431)
    assert run["step_time_us"] == pytest.approx(141429.431, abs=1e-6)
    assert [(w["window"], w["steps"], w["n_steps"], round(w["idle_pct"], 3)) for w in r["windows"]] == [
        (0, "2–3", 2, 68.004), (1, "12–13", 2, 68.004)]
    # the data loader (category DataLoader in this schema) inside the counted steps of both windows
    assert run["dataloader"] == {"loader_us": {0: 369223.51}, "share_pct": {0: 65.27}}
    (f,) = [f for f in run["findings"] if f["kind"] == "dataloader"]
    assert f["impact_pct"] > 50
    # the same figures as the new-schema original (one window): the rewrite changes no number
    new = tmp_path / "new"
    new.mkdir()
    shutil.copy(DATALOADER_RANK0, new / DATALOADER_RANK0.name)
    (orig,) = analyze(new, Options(jobs=1)).model["runs"]
    assert orig["step_time_us"] == run["step_time_us"]
    assert orig["dataloader"]["share_pct"] == run["dataloader"]["share_pct"]
    assert orig["dataloader"]["loader_us"][0] * 2 == pytest.approx(run["dataloader"]["loader_us"][0], abs=1e-6)
    assert orig["ranks"][0]["idle_pct"] == r["idle_pct"]


def test_windows_grouped_by_header_rank(tmp_path):
    d = tmp_path / "job"
    write_trace(d / "a.json", 0, gpu_job({1: 10_000, 2: 10_000, 3: 10_000}), world_size=1)
    write_trace(d / "b.json", 0, gpu_job({7: 20_000, 8: 20_000, 9: 20_000}, start=1e6), world_size=1)
    a = analyze(d, Options(jobs=1))
    (run,) = a.model["runs"]
    assert run["ranks_found"] == [0]
    assert run["file_grouping"].endswith("rank 0: 2 profiling windows (the same distributedInfo.rank 0 in their "
                                         "headers)")
    (r,) = run["ranks"]
    # windows differ: each is reported; the step statistics combine steps 1, 2, 7, 8
    assert [(w["steps"], w["step_time_us"]) for w in r["windows"]] == [("1–2", 10_000.0), ("7–8", 20_000.0)]
    assert (r["n_steps"], r["step_time_us"], run["step_time_us"]) == (4, 15_000.0, 15_000.0)
    diff = {"file": None, "level": "info", "run": "job",
            "message": "rank 0: its profiling windows differ (median step time 20.00 ms in b.json vs 10.00 ms in "
                       "a.json); see the profiling-windows table, the other figures combine them"}
    assert diff in a.model["warnings"]
    page = render_html(a.model)  # the HTML shows the per-window table
    assert "Profiling windows" in page and "7–8" in page


def test_tb_plugin_old_schema_trace_shows_its_step():
    a = analyze(real("kineto/tb_plugin_test"), Options(jobs=1))
    (run,) = a.model["runs"]
    # ProfilerStep#2 is an Operator (cpu_op) there: one step, kept (a window of one step has no partial edge)
    assert [(s["step"], s["step_time_us"]) for s in run["steps"]] == [(2, 13410.0)]
    assert run["step_time_us"] == 13410.0 and run["ranks"][0]["n_steps"] == 1
    # enumerate(DataLoader)#...__next__ (725 µs) inside that step
    assert run["dataloader"] == {"loader_us": {0: 725.0}, "share_pct": {0: 5.41}}
    assert (run["gpu_capability"], run["gpu_source"]) == ("sm70", "trace computeProperties")


def test_nothing_to_analyse_names_each_file_and_why(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "garbage.json").write_text(json.dumps({"hello": "world"}))
    (d / "notes.txt").write_text("nothing here\n")
    with pytest.raises(TraceanalyzeError) as exc:
        analyze(d, Options(jobs=1))
    assert str(exc.value) == (
        f"{d}: no Kineto trace or training log found (looked for *.json and *.json.gz with a traceEvents array, "
        f"and for logs, NCCL output, topology and configs); skipped {d}/garbage.json: JSON that is neither a Kineto "
        f"trace nor a known config; {d}/notes.txt: not a Kineto trace, training log, NCCL output, topology or config")


def test_the_steps_computed_once_are_the_stored_macros_rows(two_gpu_ranks):
    """store.materialize_steps: the TEMP macro the stages read gives the stored macro's rows, on the connection and
    on a cursor; once the report is made (forget_steps) the caller's connection reads the stored macro live."""
    from traceanalyze import store

    a = analyze(two_gpu_ranks, Options(jobs=1))
    cols = "rank, \"window\", step, start_ns, end_ns, pid, tid, window_edge, counted"
    live = a.con.execute(f"SELECT {cols} FROM profiler_steps(1) ORDER BY rank, step").fetchall()
    assert [(r[0], r[2], r[7], r[8]) for r in live] == [
        (0, 1, False, False), (0, 2, False, True), (0, 3, False, True), (0, 4, True, False),
        (1, 2, False, True), (1, 3, False, True), (1, 4, True, False)]
    assert a.con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchone()[0] == 0
    store.materialize_steps(a.con, 1)
    assert a.con.execute(f"SELECT {cols} FROM profiler_steps(1) ORDER BY rank, step").fetchall() == live
    assert a.con.execute("SELECT count(*) FROM profiler_steps(2)").fetchone()[0] == 0  # a run not computed
    cur = store.steps_cursor(a.con)
    assert cur.execute(f"SELECT {cols} FROM profiler_steps(1) ORDER BY rank, step").fetchall() == live
    cur.close()
    # a change after the report: the TEMP rows would be stale, the stored macro is read again once forgotten
    a.con.execute("UPDATE files SET run_id = NULL WHERE rank = 1")
    assert a.con.execute("SELECT count(*) FROM profiler_steps(1)").fetchone()[0] == 7
    store.forget_steps(a.con)
    assert a.con.execute("SELECT count(*) FROM profiler_steps(1)").fetchone()[0] == 4


def test_clipped_lengths_is_the_union_clipped_to_each_window():
    """One union and two binary searches per window give |∪ clip(intervals, lo, hi)| as clipping per window does:
    exact values on hand-made intervals (overlapping, nested, touching, empty, outside every window), then the
    reference on random ones."""
    import numpy as np

    from traceanalyze.metrics.breakdown import clip, clipped_lengths, length

    s = np.array([0, 5, 20, 22, 40, 60, 70], np.int64)
    e = np.array([10, 12, 30, 25, 40, 65, 90], np.int64)  # [0,12) [20,30) [60,65) [70,90); [40,40) empty
    lo = np.array([0, 8, 11, 31, 40, 62, 95], np.int64)
    hi = np.array([100, 21, 12, 59, 41, 75, 99], np.int64)
    assert clipped_lengths(s, e, lo, hi).tolist() == [47, 5, 1, 0, 0, 8, 0]
    rng = np.random.default_rng(7)
    for _ in range(200):
        a = rng.integers(0, 1000, 30)
        b = a + rng.integers(-5, 80, 30)
        w0 = rng.integers(-50, 1000, 6)
        w1 = w0 + rng.integers(0, 300, 6)
        want = [length(*clip(a, b, int(x), int(y))) for x, y in zip(w0, w1, strict=True)]
        assert clipped_lengths(a, b, w0, w1).tolist() == want
