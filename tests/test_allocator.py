"""The caching allocator's cache flushes (issue 41: a GPU near capacity, the allocator's retries priced), on the real
H100 traces of ``tests/data/gpu/h100/allocator`` (``benchmarks/record_allocator.py``): a GPT step that calls
``torch.cuda.empty_cache()`` after every step (``slow``) or every 4th (``every4``), the same job without it
(``fixed``), and a GPU filled to 97 % whose allocator no longer flushes (``near_full``). Each side's unprofiled
wall time is in ``truth.json``. The same three sides but ``near_full`` recorded on an H200
(``tests/data/gpu/h200/allocator``) are a blind check (recorded after the model was fitted)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from traceanalyze.metrics.allocator import cache_flushes
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.replay.scenarios import memory

DATA = Path(__file__).resolve().parent / "data" / "gpu" / "h100" / "allocator"
SETS = {"h100": DATA, "h200": DATA.parent.parent / "h200" / "allocator"}


def _truth_ms(side: str, gpu: str = "h100") -> float:
    return json.loads((SETS[gpu] / "truth.json").read_text())["sides"][side]["wall_ms_per_step_mean"]


def _analyze(data: Path, sides: tuple[str, ...]) -> dict:
    """Each side's report model and its cache-flush rows."""
    out = {}
    for side in sides:
        a = analyze(data / side, Options(jobs=1))
        run_id = a.con.execute("SELECT max(run_id) FROM runs").fetchone()[0]
        out[side] = (a.model["runs"][0], cache_flushes(a.con, run_id))
        a.con.close()
    return out


@pytest.fixture(scope="module")
def runs() -> dict:
    return _analyze(DATA, ("slow", "every4", "fixed", "near_full"))


@pytest.fixture(scope="module")
def runs_h200() -> dict:
    return _analyze(SETS["h200"], ("slow", "every4", "fixed"))


def _runs(request: pytest.FixtureRequest, gpu: str) -> dict:
    return request.getfixturevalue({"h100": "runs", "h200": "runs_h200"}[gpu])


def _finding(run: dict, kind: str) -> dict | None:
    return next((f for f in run["findings"] if f["kind"] == kind), None)


def _whatif(run: dict, scenario: str) -> dict | None:
    return next((w for w in run.get("whatif") or [] if w["scenario"] == scenario), None)


@pytest.mark.parametrize(("gpu", "us", "idle_us"), [("h100", 29054.833, 14169.804), ("h200", 20826.101, 15023.621)])
def test_the_allocator_calls_of_each_step_are_counted(request, gpu, us, idle_us):
    runs = _runs(request, gpu)
    (slow,), (every4,) = runs["slow"][1], runs["every4"][1]
    assert (slow.rank, slow.steps, slow.steps_with_frees) == (0, 7, 7)
    assert (round(slow.frees_per_step, 3), round(slow.mallocs_per_step, 3)) == (45.0, 44.0)
    assert slow.us_per_step == pytest.approx(us, abs=0.01)
    assert slow.gpu_idle_us_per_step == pytest.approx(idle_us, abs=0.01)
    assert (every4.steps, every4.steps_with_frees) == (7, 2)  # empty_cache() after every 4th step
    assert runs["fixed"][1] == [] and runs.get("near_full", (None, []))[1] == []
    assert runs["slow"][0]["ranks"][0]["cache_flush"]["frees_per_step"] == 45.0


# H100: 61.38 -> 48.08 ms, 21.7 % measured, the finding medium; H200: 61.12 -> 43.56 ms, 28.7 %, the finding high
@pytest.mark.parametrize(("gpu", "severity", "reserved", "measured", "predicted"), [
    ("h100", "medium", "89.0%", 21.67, 22.6), ("h200", "high", "93.8%", 28.72, 26.18)])
def test_empty_cache_every_step_is_found_and_priced_against_the_real_fix(request, gpu, severity, reserved, measured,
                                                                        predicted):
    run = _runs(request, gpu)["slow"][0]
    f = _finding(run, "memory_cache_flush")
    assert f["cause"] == "config" and f["severity"] == severity
    assert f["title"].startswith("GPU memory is freed and allocated again every step (torch.cuda.empty_cache() in "
                                 "the loop): 45 cudaFree per step on rank 0")
    assert any(f"{reserved}): room left" in e for e in f["evidence"])  # not near capacity: emptied on purpose
    assert "torch_empty_cache_steps" in f["recommendation"]
    w = _whatif(run, "no_cache_flush")
    assert 100 * (1 - _truth_ms("fixed", gpu) / _truth_ms("slow", gpu)) == pytest.approx(measured, abs=0.01)
    assert w["saving_pct"] == pytest.approx(predicted, abs=0.5)
    assert abs(w["saving_pct"] - measured) < 3.0
    assert f["impact_pct"] == round(w["saving_pct"], 1)


@pytest.mark.parametrize("gpu", ["h100", pytest.param("h200", marks=pytest.mark.xfail(strict=True, reason=(
    "known miss on the H200 (blind check): no_cache_flush predicts 15.28 % for every4 against 7.89 % measured "
    "(47.29 -> 43.56 ms), +7.4 points; the trace has 5.5 ms of GPU idle per step in the frees of 2 of 7 steps")))])
def test_every_fourth_step_is_named_and_priced_smaller(request, gpu):
    run = _runs(request, gpu)["every4"][0]
    f = _finding(run, "memory_cache_flush")
    assert "again in 2 of 7 steps" in f["title"] and f["severity"] == "low"
    measured = 100 * (1 - _truth_ms("fixed", gpu) / _truth_ms("every4", gpu))  # H100 51.42 -> 48.08 ms: 6.5 %
    assert abs(_whatif(run, "no_cache_flush")["saving_pct"] - measured) < 5.0


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_the_fixed_side_has_no_flush(request, gpu):
    run = _runs(request, gpu)["fixed"][0]
    assert _finding(run, "memory_cache_flush") is None and _whatif(run, "no_cache_flush") is None


def test_a_full_gpu_that_does_not_flush_costs_no_step_time(runs):
    f = _finding(runs["near_full"][0], "memory_near_capacity")
    assert f["impact_pct"] == 0.0 and "97% of GPU 0 reserved" in f["title"]
    assert any(e.startswith("no cudaFree in the counted steps") for e in f["evidence"])


def test_the_sync_edge_gives_up_the_frees_it_spans(monkeypatch):
    """Without the edge cut, the frees after the GPU drained stay inside the step-end synchronize's edge (the kernel's
    end to the step's end), and the what-if saves less than half as much."""
    without = dataclasses.replace(memory.NO_CACHE_FLUSH, cuts_spans=False)
    monkeypatch.setattr(memory, "NO_CACHE_FLUSH", without)
    from traceanalyze.replay import scenarios

    monkeypatch.setattr(scenarios, "_BY_NAME", {**scenarios._BY_NAME, without.name: without})
    a = analyze(DATA / "slow", Options(jobs=1))
    a.con.close()
    w = _whatif(a.model["runs"][0], "no_cache_flush")
    assert w is None or w["saving_pct"] < 11.0
