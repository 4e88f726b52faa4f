"""The paired samples in ``sample_traces/pairs/`` (issue 16, item 6): per pair a slow run, its fixed twin and
``pair.json`` with the step times of three interleaved repetitions (see sample_traces/README.md).

Checks that every pair.json is complete and agrees with its two run folders (standard library only), and that
``traceanalyze report`` reads each folder: the slow run's step time is the one pair.json gives for the kept
repetition, it finds the cause the slow run was made with (medium or high, on the right ranks), and the fixed twin
has no such finding and nothing high.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import SAMPLES
from traceanalyze.cli import cli

PAIRS = SAMPLES / "pairs"
# pair folder -> the what-if (issue 16's scenario names) that predicts its fixed twin from its slow run
WHATIF = {
    "straggler_compute": "no_straggler",
    "straggler_sleep": "no_straggler",
    "straggler_compute_2": "no_straggler",
    "host_stall": "no_straggler",
    "late_entry": "aligned_step_starts",
    "late_entry_1step": "aligned_step_starts",
    "slow_interconnect": "ideal_interconnect",
    "precision": "bf16_matmul",
    "dataloader": "no_dataloader_wait",
    "compile": "no_compile",
}
ALLOWED = {"no_straggler", "aligned_step_starts", "ideal_interconnect", "bf16_matmul", "no_dataloader_wait",
           "no_compile"}
# the job settings that differ between the slow run and its twin (the interconnect pair differs in the qdisc on
# the link, not in the job config; the compile pair's twin runs eager)
KNOBS = {
    "straggler_compute": {"straggler_rank", "straggler_extra_forwards"},
    "straggler_sleep": {"straggler_rank", "straggler_sleep_ms"},
    "straggler_compute_2": {"straggler_rank", "straggler_extra_forwards"},
    "host_stall": {"straggler_rank", "straggler_stall_ms"},
    "late_entry": {"straggler_rank", "straggler_tail_ms"},
    "late_entry_1step": {"straggler_rank", "straggler_tail_ms"},
    "slow_interconnect": set(),
    "precision": {"dtype"},
    "dataloader": {"num_workers"},
    "compile": {"compile"},
}
PAIR_KEYS = {"scenario", "slow", "fixed", "link_bw_GBps", "repetitions", "measured_saving_pct", "description",
             "command"}
TRACE_NAME = re.compile(r"^rank(\d+)\.\d+\.pt\.trace\.json\.gz$")


def _pair(name: str) -> dict:
    path = PAIRS / name / "pair.json"
    if not path.exists():
        pytest.skip(f"pair {name} not recorded")
    return json.loads(path.read_text())


def _truth(name: str, role: str) -> dict:
    return json.loads((PAIRS / name / role / "scenario.json").read_text())


def _run_step_ms(truth: dict) -> float:
    """The run's step time (traceanalyze/metrics/steps.py) from the ranks' own step times: median over the
    counted steps (the profiled ones but the window's last, unless it is the only one) of the longest rank."""
    counted = truth["profiled_steps"][:-1] or truth["profiled_steps"]
    return round(statistics.median(max(t[s] for t in truth["step_times_ms"].values()) for s in counted), 1)


def test_every_pair_was_recorded():
    if not PAIRS.exists():
        pytest.skip("no sample_traces/pairs")
    assert sorted(p.name for p in PAIRS.iterdir()) == sorted(WHATIF)
    assert not (PAIRS / "scenario.json").exists()  # not a run folder itself (reports/render.py skips it)


@pytest.mark.parametrize("name", sorted(WHATIF))
def test_pair_json_is_complete(name):
    doc = _pair(name)
    assert PAIR_KEYS <= doc.keys()
    assert doc["scenario"] == WHATIF[name] and doc["scenario"] in ALLOWED
    assert (doc["slow"], doc["fixed"]) == ("slow", "fixed")
    assert sorted(p.name for p in (PAIRS / name).iterdir()) == ["fixed", "pair.json", "slow"]
    assert doc["command"].startswith("python sample_traces/generate.py --pairs")
    reps = doc["repetitions"]
    assert len(reps) == 3
    assert all(r["slow_step_time_ms"] > 0 and r["fixed_step_time_ms"] > 0 for r in reps)
    for r in reps:
        assert r["saving_pct"] == round(100 * (1 - r["fixed_step_time_ms"] / r["slow_step_time_ms"]), 1)
    slow = statistics.median(r["slow_step_time_ms"] for r in reps)
    fixed = statistics.median(r["fixed_step_time_ms"] for r in reps)
    assert (doc["median_slow_step_time_ms"], doc["median_fixed_step_time_ms"]) == (slow, fixed)
    assert doc["measured_saving_pct"] == round(100 * (1 - fixed / slow), 1)
    # the kept traces are the repetition with the median saving
    assert doc["kept_repetition"] - 1 == sorted(range(3), key=lambda i: reps[i]["saving_pct"])[1]
    assert doc["host"]["cpus"] >= 1 and isinstance(doc["host"]["native_bf16"], bool)


def test_bf16_is_no_fix_on_a_cpu_without_native_bf16():
    doc = _pair("precision")
    if doc["host"]["native_bf16"]:
        pytest.skip("recorded on a CPU with native bf16 matmuls")
    # emulated bf16 matmuls (no AMX, no AVX512-BF16) are slower than fp32: the "fix" slows every repetition down
    assert doc["host"]["torch_cpu_capability"] in ("AVX2", "AVX512")
    assert all(r["fixed_step_time_ms"] > 2 * r["slow_step_time_ms"] for r in doc["repetitions"])
    # the runs carry what capture.environment says of the CPU, which the report reads
    for role in ("slow", "fixed"):
        for r in range(doc["world_size"]):
            env = json.loads((PAIRS / "precision" / role / f"env_rank{r}.json").read_text())
            assert env["cpu"]["native_bf16"] is False and env["cpu"]["isa"] == doc["host"]["torch_cpu_capability"]


@pytest.mark.parametrize("name", sorted(WHATIF))
def test_link_bw_is_the_fixed_twins_measured_bandwidth(name):
    doc = _pair(name)
    if doc["scenario"] != "ideal_interconnect":
        assert doc["link_bw_GBps"] is None
        return
    reps = doc["repetitions"]
    assert doc["link_bw_GBps"] == round(statistics.median(r["fixed_link_busbw_GBps"] for r in reps), 4)
    # the shaped link: tbf 200 Mbit/s = 0.025 GB/s, which gloo's all-reduce cannot exceed; unshaped it is far faster
    assert all(0 < r["slow_link_busbw_GBps"] <= 0.025 for r in reps)
    assert doc["link_bw_GBps"] > 10 * 0.025
    fixed, slow = _truth(name, "fixed"), _truth(name, "slow")
    assert "tbf rate 200mbit" in slow["link"]["qdisc"] and fixed["link"]["qdisc"].startswith("none")
    assert set(fixed["link_probe"]) == {"0", "1"}


@pytest.mark.parametrize("role", ["slow", "fixed"])
@pytest.mark.parametrize("name", sorted(WHATIF))
def test_run_folders_agree_with_pair_json(name, role):
    doc = _pair(name)
    truth = _truth(name, role)
    d = PAIRS / name / role
    assert truth["scenario"] == f"pairs/{name}/{role}"
    assert truth["world_size"] == doc["world_size"]
    assert truth["pair"] == {"name": name, "role": role, "repetition": doc["kept_repetition"], "repetitions": 3,
                             "run_step_time_ms": _run_step_ms(truth)}
    assert _run_step_ms(truth) == doc["repetitions"][doc["kept_repetition"] - 1][f"{role}_step_time_ms"]
    assert (truth["expected"]["cause"] is None) == (role == "fixed")
    files = sorted(d.glob("*.pt.trace.json.gz"))
    assert sorted(int(TRACE_NAME.match(p.name)[1]) for p in files) == list(range(doc["world_size"]))
    assert sorted(p.name for p in d.glob("rank*.log")) == [f"rank{r}.log" for r in range(doc["world_size"])]
    for p in files:
        with gzip.open(p, "rt") as f:
            info = json.load(f)["distributedInfo"]
        assert (info["rank"], info["world_size"]) == (int(TRACE_NAME.match(p.name)[1]), doc["world_size"])


@pytest.mark.parametrize("name", sorted(WHATIF))
def test_slow_and_fixed_differ_only_in_the_fix(name):
    _pair(name)
    slow, fixed = _truth(name, "slow")["config"], _truth(name, "fixed")["config"]
    assert slow.keys() == fixed.keys()
    assert {k for k in slow if slow[k] != fixed[k]} == KNOBS[name]


def _report(path: Path, tmp: Path) -> dict:
    out = tmp / path.parent.name / path.name
    out.mkdir(parents=True)
    r = CliRunner().invoke(cli, ["report", str(path), "-q", "-j", "1", "-o", str(out / "r.html"),
                                 "--json", str(out / "r.json"), "--db", str(out / "r.duckdb")])
    assert r.exit_code == 0, r.output
    return json.loads((out / "r.json").read_text())


@pytest.mark.parametrize("name", sorted(WHATIF))
def test_report_finds_the_cause_on_the_slow_run_only(name, tmp_path):
    doc = _pair(name)
    kept = doc["repetitions"][doc["kept_repetition"] - 1]
    for role in ("slow", "fixed"):
        m = _report(PAIRS / name / role, tmp_path)
        (run,) = m["runs"]
        assert run["world_size"] == doc["world_size"]
        # traceanalyze's run step time (the ProfilerStep ranges) is the ranks' own measurement of the same steps
        # (the replay's measured step time: a compile run's step time proper leaves the compile step out)
        assert run["replay"]["measured_step_time_us"] / 1e3 == pytest.approx(kept[f"{role}_step_time_ms"], rel=0.01)
        found = {(f["cause"], f["kind"]): f for f in m["findings"]}
        if role == "slow":
            # the cause the slow run was made with is found (its rank among the findings is the replay's job)
            exp = _truth(name, role)["expected"]
            cause = found[exp["cause"], exp["kind"]]
            assert cause["ranks"] == exp["ranks"]
            if name == "precision" and doc["host"]["native_bf16"] is False:
                # env_rank{r}.json says the CPU has no native bf16: the fix would slow it down, so no ticket
                assert (cause["severity"], cause["impact_pct"]) == ("low", 0.0)
                assert any("neither AMX nor AVX512-BF16" in e for e in cause["evidence"])
            else:
                assert cause["severity"] in ("medium", "high")
        else:  # the fixed twin: no such finding, and nothing high
            assert (exp["cause"], exp["kind"]) not in found, m["findings"]
            assert not [f for f in m["findings"] if f["severity"] == "high"], m["findings"]
