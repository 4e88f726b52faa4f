"""Who waited for whom (issue 30): arrival skew per collective instance (``collective_skew``), the straggler named
from one step, and the ★ / red rows on the rank that kept the others waiting, never on one that waited."""

from __future__ import annotations

import pytest

from tests.synth import all_to_all_job, write_trace
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze

# rank 5 arrives last; rank 0 waits longest (7.6 ms), rank 1 least (0.5 ms)
WAITS = [7600.0, 500.0, 3000.0, 4100.0, 2200.0, 0.0, 6000.0, 1500.0]


def _job(folder, waits, lead=None, **kw):
    for r in range(len(waits)):
        write_trace(folder / f"rank{r}.json", r, all_to_all_job(r, waits, lead_us=(lead or {}).get(r, 0.0), **kw),
                    world_size=len(waits), backend="nccl")
    a = analyze(folder, Options(jobs=1))
    return a, a.model["runs"][0]


def _step_table_marks(a) -> dict[int, bool]:
    """Rank -> whether its cell is marked (bold red) in the first row of the report's per-step table."""
    from traceanalyze.report.model import report_view

    rv = report_view(a.model)["runs"][0]
    return {rk: hi for rk, (_, hi) in zip(rv["step_cols"], rv["step_rows"][0]["cells"], strict=True)}


def test_late_rank_named_from_one_step(tmp_path):
    """8 ranks, one profiled step, one all-to-all (a bare ncclKernel_SendRecv under nccl:all_to_all): rank 5
    arrives 7.6 ms after the first, its own all-to-all takes 10 µs, the others wait 0.5–7.6 ms. The finding names
    rank 5 (cause imbalance), the verdict says imbalance, and the ★ and the red cells are on rank 5, not on rank 0
    (the one that waited most)."""
    from traceanalyze.report import render_html

    a, run = _job(tmp_path / "a2a", WAITS)
    # the SendRecv kernels are the all-to-all (named by their annotation), matched on all 8 ranks
    assert a.con.execute("SELECT DISTINCT collective, complete FROM sim_coll").fetchall() == [("all_to_all", True)]
    assert a.con.execute("SELECT count(*), count(DISTINCT instance_id), min(last_rank), max(last_rank), "
                         "sum(wait_us) FROM collective_skew").fetchone() == (8, 1, 5, 5, pytest.approx(24900.0))
    ranks = {r["rank"]: r for r in run["ranks"]}
    assert ranks[5]["kept_others_waiting_us"] == pytest.approx(24900.0) and ranks[5]["waited_for_others_us"] == 0.0
    assert ranks[0]["waited_for_others_us"] == pytest.approx(7600.0) and ranks[0]["kept_others_waiting_us"] == 0.0
    f = next(f for f in run["findings"] if f["kind"] == "straggler")
    assert (f["cause"], f["ranks"]) == ("imbalance", [5])
    # named because the others' median wait, 3.0 ms, is 13% of their 22.77 ms step; priced by the replay: rank 5
    # arriving with the next-to-last (rank 1, 0.5 ms earlier) saves 0.5 ms, the rest is a spread across ranks
    assert f["title"] == "Rank 5 arrives last at the all_to_all: the other ranks wait 13% of the step for it"
    w = next(w for w in run["whatif"] if w["scenario"] == "no_straggler")
    assert w["saving_us"] == pytest.approx(500.0, abs=1.0) and f["impact_pct"] == round(w["saving_pct"], 1)
    ev = " | ".join(f["evidence"])
    assert ("step 1, all_to_all (instance 0, 8 ranks): rank 5 arrives last, 7.6 ms after the first; the others wait "
            "a median of 3.0 ms (range 0.5 ms–7.6 ms, median 13% of their step); rank 5's own all_to_all takes 10 µs"
            ) in ev
    assert "where: the others reach it 19.7 ms into the step (86% of the median waiting rank's 22.8 ms step)" in ev
    assert "per op against the median rank (per step): ampere_bf16_s16816gemm_bf16_128x128_mm 22.6 ms" in ev
    assert ("the next-to-last, rank 1, arrives 0.5 ms before rank 5: rank 5 arriving with it would save 0.5 ms (2% of "
            "the step); the rest of the others' wait is a spread of arrivals across ranks") in ev
    assert len([g for g in run["findings"] if g["kind"] == "straggler"]) == 1
    pic = run["replay_picture"]
    assert [ln["rank"] for ln in pic["lanes"] if ln["critical"]] == [5]
    assert pic["kept_waiting_rank"] == 5 and pic["kept_waiting_us"] == pytest.approx(24900.0)
    html = render_html(a.model)
    assert "rank 5 ★" in html and "rank 0 ★" not in html
    assert [rk for rk, hi in _step_table_marks(a).items() if hi] == [5]


def test_one_late_rank_leads_the_verdict(tmp_path):
    """The other seven ranks arrive within 1 ms of each other and wait 6.6–7.6 ms for rank 5: arriving with them,
    rank 5 would save 6.6 ms of a 22.8 ms step. The finding names rank 5 from the one step, it leads the verdict,
    and the ★ is on rank 5."""
    waits = [7600.0, 6600.0, 7000.0, 7100.0, 6800.0, 0.0, 7400.0, 6900.0]
    a, run = _job(tmp_path / "late", waits)
    f = run["findings"][0]
    assert (f["kind"], f["cause"], f["ranks"], f["severity"]) == ("straggler", "imbalance", [5], "high")
    assert f["impact_pct"] == pytest.approx(100 * 6600.0 / 22770.0, abs=0.2)
    assert a.model["verdict"].startswith("Main cause: imbalance (straggler): Rank 5 ")
    # the work rule names rank 5 as well: one finding, which carries the arrival evidence
    assert [g["kind"] for g in run["findings"]].count("straggler") == 1
    assert any(e.startswith("step 1, all_to_all (instance 0, 8 ranks): rank 5 arrives last, 7.6 ms after the first")
               for e in f["evidence"])
    assert [ln["rank"] for ln in run["replay_picture"]["lanes"] if ln["critical"]] == [5]


def test_a_rank_that_only_waits_is_never_marked(tmp_path):
    """Rank 0 starts its step 4 ms early and waits 3 ms in the all-to-all: its step is the longest and it waits
    most, yet it kept nobody waiting. Nothing marks it: no finding, no ★ (that goes to rank 5, the last to arrive),
    no red cell (the others' wait for rank 5, 0.6 ms each, is under 5 % of the step: no cell is red)."""
    waits = [3000.0, 200.0, 300.0, 250.0, 100.0, 0.0, 150.0, 350.0]
    a, run = _job(tmp_path / "wait", waits, lead={0: 4000.0})
    steps = {s["rank"]: s["step_time_us"] for s in run["steps"]}
    ranks = {r["rank"]: r for r in run["ranks"]}
    assert max(steps, key=steps.get) == 0  # the premise: rank 0's step is the longest and it waits most
    assert max(ranks, key=lambda r: ranks[r]["waited_for_others_us"]) == 0
    assert ranks[0]["kept_others_waiting_us"] == 0.0
    assert ranks[5]["kept_others_waiting_us"] == pytest.approx(sum(waits))
    assert not [f for f in run["findings"] if f["cause"] == "imbalance"]
    assert [ln["rank"] for ln in run["replay_picture"]["lanes"] if ln["critical"]] == [5]
    assert not any(_step_table_marks(a).values())


def test_collective_skew_exact_values_two_ranks(tmp_path):
    """2 ranks, rank 1's clock 3 ms ahead: on the aligned clocks rank 0 arrives at 5,060 µs (60 µs of launch, then
    a 5 ms GEMM) and rank 1 at 6,260 µs, last; rank 0 waits 1,200 µs, its all-reduce lasting 1,210 µs."""
    waits = [1200.0, 0.0]
    for r in range(2):
        write_trace(tmp_path / "two" / f"rank{r}.json", r, all_to_all_job(r, waits, compute_us=5000.0),
                    world_size=2, backend="nccl", base_ns=1_700_000_000_000_000_000 + r * 3_000_000)
    a = analyze(tmp_path / "two", Options(jobs=1))
    rows = a.con.execute("SELECT instance_id, step, collective, rank, n_ranks, arrival_us, step_offset_us, wait_us, "
                         "dur_us, transfer_us, is_last, last_rank FROM collective_skew ORDER BY rank").fetchall()
    assert rows == [(0, 1, "all_to_all", 0, 2, pytest.approx(5060.0), pytest.approx(5060.0), pytest.approx(1200.0),
                     pytest.approx(1210.0), pytest.approx(10.0), False, 1),
                    (0, 1, "all_to_all", 1, 2, pytest.approx(6260.0), pytest.approx(6260.0), 0.0,
                     pytest.approx(10.0), pytest.approx(10.0), True, 1)]
    ranks = {r["rank"]: r for r in a.model["runs"][0]["ranks"]}
    assert (ranks[0]["waited_for_others_us"], ranks[0]["kept_others_waiting_us"]) == (1200.0, 0.0)
    assert (ranks[1]["waited_for_others_us"], ranks[1]["kept_others_waiting_us"]) == (0.0, 1200.0)
