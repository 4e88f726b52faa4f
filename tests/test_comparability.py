"""``--baseline`` comparisons (issue 40, items 1-3): the baseline's measured busbw prices the subject's
``ideal_interconnect`` (``link from baseline``), the step ratio by the logs' step times where both runs log them,
and the comparability score: a self-comparison is ``not comparable: same run``, different world sizes compare with
a caveat. On generated gloo jobs whose all-reduce takes a given time (``_link_job``)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from tests.synth import write_trace, x
from traceanalyze.cli import cli
from traceanalyze.diagnose import RunEvidence
from traceanalyze.diagnose.compare import comparability, kernel_overlap, step_noise_pct, step_ratio
from traceanalyze.replay.scenarios.ranks import comparable_busbw, link_from_baseline

GRAD_BYTES = 4 * 1024 * 1024  # one fp32 all-reduce of 1,048,576 elements per step


def _link_job(rank: int, transfer_us: float, steps: int = 4, compute_us: float = 3000.0) -> list[dict]:
    """A gloo rank: per step ``aten::mm`` for ``compute_us`` then one 4 MiB ``gloo:all_reduce`` of ``transfer_us``
    that starts and ends together on every rank (no wait: all of it is transfer)."""
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}]
    t = 1000.0
    for s in range(1, steps + 1):
        step = 100 + compute_us + 50 + transfer_us + 100
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, step))
        ev.append(x("cpu_op", "aten::mm", t + 100, compute_us,
                    **{"Input type": ["float", "float"], "Input Dims": [[256, 256], [256, 256]]}))
        start = t + 100 + compute_us + 50
        ev.append(x("cpu_op", "c10d::allreduce_", start, 20.0))
        ev.append(x("user_annotation", "gloo:all_reduce", start, transfer_us, tid=2,
                    **{"Input type": ["float"], "Input Dims": [[GRAD_BYTES // 4]]}))
        t += step
    return ev


def _write(folder, transfer_us: float, world: int = 2):
    for r in range(world):
        write_trace(folder / f"rank{r}.json", r, _link_job(r, transfer_us), world_size=world)
    return folder


def _report(tmp_path, subject, baseline, name: str) -> dict:
    res = CliRunner().invoke(cli, ["report", str(subject), "--baseline", str(baseline), "-q",
                                   "-o", str(tmp_path / f"{name}.html"), "--json", str(tmp_path / f"{name}.json"),
                                   "--db", str(tmp_path / f"{name}.duckdb")])
    assert res.exit_code == 0, res.output
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_the_baseline_busbw_prices_ideal_interconnect(tmp_path) -> None:
    """Throttled link (40 ms per 4 MiB all-reduce) against a fast one (4 ms), no link stated (alone: "the link's
    expected bandwidth is unknown"): the what-if is priced at the baseline's busbw (4,194,304 B / 4 ms = 1.05 GB/s;
    2 ranks: bus factor 2(n−1)/n = 1) and predicts the baseline's step."""
    slow, fast = _write(tmp_path / "slow", 40_000.0), _write(tmp_path / "fast", 4_000.0)
    model = _report(tmp_path, slow, fast, "pair")
    subject = next(r for r in model["runs"] if r["role"] == "subject")
    link = subject["link"]
    assert link["from_baseline"] is True and link["stated_gbps"] is None
    assert link["expected_gbps"] == pytest.approx(GRAD_BYTES / 4_000e-6 / 1e9, rel=0.01)  # 1.05 GB/s
    assert link["source"].startswith("link from baseline: 1.05 GB/s busbw, median of 4 comparable collective "
                                     "calls of fast")
    w = next(w for w in subject["whatif"] if w["scenario"] == "ideal_interconnect")
    assert "link from baseline: 1.05 GB/s busbw" in w["assumptions"]
    base_step = next(r for r in model["runs"] if r["role"] == "baseline")["step_time_us"]
    assert subject["step_time_us"] == pytest.approx(43_250.0, rel=0.01)
    assert base_step == pytest.approx(7_250.0, rel=0.01)
    # the replay with the faster transfers predicts the baseline's measured step, within 2 %
    assert w["predicted_step_time_us"] == pytest.approx(base_step, rel=0.02)
    (check,) = model["comparison"]["whatif_check"]
    assert check["priced_from"] == f"the baseline's busbw ({link['expected_gbps']:g} GB/s)"
    assert check["predicted_step_us"] == pytest.approx(w["predicted_step_time_us"])
    assert check["error_pp"] == pytest.approx(0.0, abs=2.0)
    comp = model["comparison"]["comparable"]
    assert comp["status"] == "comparable" and comp["why"] == [] and comp["caveats"] == []
    assert comp["parts"]["kernel_overlap"]["jaccard"] == 1.0 and comp["parts"]["world_size"]["score"] == 1.0
    assert comp["ratio"]["basis"] == "profiled" and comp["ratio"]["value"] == pytest.approx(43_250 / 7_250, rel=0.01)
    assert comp["verdict"].startswith("slow's step is 5.97× the baseline's (fast): 5.97× by profiled steps")
    html = (tmp_path / "pair.html").read_text()
    assert "priced from the baseline&#39;s busbw" in html and "comparability 1.00" in html


def test_without_a_faster_baseline_the_stated_link_stays(tmp_path) -> None:
    """The baseline's busbw replaces the link only where it is the higher: the reverse pair keeps the stated one."""
    rows = [SimpleNamespace(collective="all_reduce", size_bytes=GRAD_BYTES, count=3, busbw_gbps=g) for g in (0.1, 1.0)]
    assert comparable_busbw([rows[0]], [rows[1]]) == (0.1, 1.0, 3)
    stated = {"expected_gbps": 25.0, "source": "NCCL NET/IB"}
    assert link_from_baseline(stated, [rows[1]], "slow", [rows[0]]) is stated
    other = SimpleNamespace(collective="all_gather", size_bytes=GRAD_BYTES, count=3, busbw_gbps=9.0)
    assert comparable_busbw([rows[0]], [other]) is None  # no collective both call alike
    got = link_from_baseline(stated, [rows[0]], "fast", [rows[1]])
    assert got["expected_gbps"] == 1.0 and got["stated_gbps"] == 25.0 and got["stated_source"] == "NCCL NET/IB"


def test_a_self_comparison_is_not_comparable(tmp_path) -> None:
    """The subject's own folder as its baseline, and a copy of it: ``not comparable: same run``, no what-if check,
    no finding from the comparison, never a regression."""
    slow = _write(tmp_path / "slow", 40_000.0)
    for name, base in (("self", slow), ("copy", _write(tmp_path / "copy", 40_000.0))):
        model = _report(tmp_path, slow, base, name)
        comp = model["comparison"]
        assert comp["comparable"]["status"] == "same run" and comp["comparable"]["score"] == 0.0
        assert comp["comparable"]["verdict"].startswith("not comparable: same run")
        assert "whatif_check" not in comp and comp["delta_us"] == 0.0
        assert all(p["finding"] is None for p in comp["parts"])
    assert [r["role"] for r in model["runs"]] == ["subject", "baseline"]  # the copy is analyzed as a baseline


def test_different_world_sizes_compare_with_a_caveat(tmp_path) -> None:
    """2 ranks against a 4-rank baseline: comparable with a caveat (the tool's scaling findings compare such runs);
    the world-size part scores 0.5 and the caveat says why."""
    model = _report(tmp_path, _write(tmp_path / "two", 40_000.0), _write(tmp_path / "four", 4_000.0, world=4), "ws")
    comp = model["comparison"]["comparable"]
    assert comp["status"] == "comparable" and comp["score"] == 0.5
    assert comp["parts"]["world_size"] == {"subject": 2, "baseline": 4, "score": 0.5}
    assert comp["caveats"][0].startswith("world sizes differ (2 vs 4 ranks)")


def _ev(name: str, steps: list[float], gpu: str | None = None, log_ms: list[float] = ()) -> RunEvidence:
    ev = RunEvidence(name=name, mode="cpu", world_size=2, gpu_model=gpu, ranks=[],
                     steps=[{"rank": r, "step": i, "start_ns": i, "step_time_us": us} for r in (0, 1)
                            for i, us in enumerate(steps)], step_time_us=sorted(steps)[len(steps) // 2])
    ev.log_steps = [SimpleNamespace(step=i, step_time_ms=ms) for i, ms in enumerate(log_ms)]
    return ev


def test_the_noise_floor_and_the_gates() -> None:
    """A step 1 % longer with 2.4 % step noise over 4 steps each is no difference (floor max(2 %, 2 × √(2.449²/4 +
    2.425²/4)) = 3.45 %); different GPUs are
    not comparable; the logs' step times give the ratio where both runs log them."""
    run = {"top_kernels": [{"name": "aten::mm", "klass": "compute", "total_us": 1.0}]}
    base = _ev("b", [1000.0, 1030.0, 1000.0, 970.0])
    subj = _ev("s", [1010.0, 1040.0, 1010.0, 980.0])
    assert step_noise_pct(base)[0] == pytest.approx(2.449, abs=0.001)  # sample stdev 24.49 / mean 1000
    c = comparability(run, run, subj, base)
    assert c["status"] == "no difference" and c["noise_floor_pct"] == pytest.approx(3.45, abs=0.01)
    c = comparability(run, run, _ev("s", [2000.0] * 4, gpu="NVIDIA H100"), _ev("b", [1000.0] * 4, gpu="NVIDIA A100"))
    assert c["status"] == "not comparable" and c["why"] == ["different GPUs (NVIDIA H100 vs NVIDIA A100)"]
    r = step_ratio(_ev("s", [2740.0] * 3, log_ms=[9.0, 3.6, 3.6]), _ev("b", [1000.0] * 3, log_ms=[5.0, 1.0, 1.0]))
    assert r["basis"] == "log" and r["value"] == 3.6 and r["profiled"] == 2.74
    assert r["sentence"] == "3.6× by the logs' step times (median of 2 logged steps each, all ranks); 2.74× by " \
                            "profiled steps"
    other = {"top_kernels": [{"name": "aten::conv2d", "klass": "compute", "total_us": 1.0}]}
    assert kernel_overlap(run["top_kernels"], other["top_kernels"]) == 0.0
    c = comparability(run, other, _ev("s", [2000.0] * 4), _ev("b", [1000.0] * 4))
    assert c["status"] == "not comparable" and "they ran other work" in c["why"][0]
