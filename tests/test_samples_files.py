"""Facts of the recorded sample runs in ``sample_traces/`` (see sample_traces/README.md).

Reads the committed files with the standard library only (no torch, no project code), so it checks the
ground truth itself: each folder holds what its scenario.json says, and the slowdown each scenario was
made to show is really in the recorded trace or log.
"""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
SCENARIOS = [
    "healthy",
    "straggler",
    "precision_fp32",
    "precision_bf16",
    "compile_cold",
    "compile_warm",
    "grad_accum",
    "slow_interconnect",
    "fast_interconnect",
    "dataloader_bound",
    "memory_growth",
]
REQUIRED_KEYS = {
    "scenario",
    "description",
    "expected",
    "world_size",
    "backend",
    "torch_version",
    "python_version",
    "step_times_ms",
    "config",
    "generated_by",
    "command",
}
CAUSES = {"interconnect", "precision", "imbalance", "config", None}
TRACE_NAME = re.compile(r"^rank(\d+)\.\d+\.pt\.trace\.json\.gz$")
# torchtune-style step line, FORMATS.md section 9.
STEP_LINE = re.compile(r"^Step (?P<step>\d+) \| (?P<kv>(?:[A-Za-z_][\w/.-]*:\S+\s*)+)$")


def run_dirs() -> list[Path]:
    """Every folder with a scenario.json (grad_accum has one at the top and one per sub-run). Deliberately
    includes the paired samples' run folders ``pairs/<pair>/{slow,fixed}``: they are recorded by the same
    generate.py and must pass the same checks (tests/test_replay_pairs.py checks their pair.json)."""
    return sorted(p.parent for p in SAMPLES.rglob("scenario.json"))


def trace_dirs() -> list[Path]:
    """Run folders that hold traces themselves (all but the grad_accum umbrella)."""
    return [d for d in run_dirs() if traces(d)]


def traces(d: Path) -> list[Path]:
    """The trace files directly in ``d``, sorted by name (rank0, rank1, ...)."""
    return sorted(d.glob("*.pt.trace.json.gz"))


@cache
def scenario(d: Path) -> dict:
    """The parsed scenario.json of run folder ``d``."""
    return json.loads((d / "scenario.json").read_text())


@cache
def trace(path: Path) -> dict:
    """The parsed Kineto trace at ``path``."""
    with gzip.open(path, "rt") as f:
        return json.load(f)


def rank_traces(name: str) -> dict[int, dict]:
    """Scenario ``name``'s traces by the rank in their file name."""
    return {int(TRACE_NAME.match(p.name).group(1)): trace(p) for p in traces(SAMPLES / name)}


def profiler_steps(t: dict) -> list[dict]:
    """The ``ProfilerStep#N`` user annotations, in time order."""
    ev = t["traceEvents"]
    steps = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    return sorted(steps, key=lambda e: e["ts"])


def in_step(e: dict, step: dict) -> bool:
    """Whether event ``e`` starts inside profiler step ``step``."""
    return step["ts"] <= e["ts"] < step["ts"] + step["dur"]


def top_level_aten_ms(t: dict) -> list[float]:
    """Per profiler step, ms of ``aten::*`` ops on the training (main) thread, counting each op
    only where no enclosing aten op is already counted (so nested calls are not summed twice)."""
    steps = profiler_steps(t)
    tid = steps[0]["tid"]
    ops = sorted(
        (e for e in t["traceEvents"] if e.get("cat") == "cpu_op" and e.get("tid") == tid),
        key=lambda e: (e["ts"], -e["dur"]),
    )
    out = []
    for s in steps:
        total, end = 0.0, float("-inf")
        for e in ops:
            if in_step(e, s) and e["name"].startswith("aten::") and e["ts"] >= end:
                total += e["dur"]
                end = e["ts"] + e["dur"]
        out.append(total / 1000)
    return out


def named_ms_per_step(t: dict, pred: object) -> list[float]:
    """Per profiler step, ms of events whose name satisfies ``pred`` (any thread)."""
    ev = [e for e in t["traceEvents"] if e.get("ph") == "X" and pred(e["name"])]
    return [sum(e["dur"] for e in ev if in_step(e, s)) / 1000 for s in profiler_steps(t)]


def total_ms(t: dict, name: str) -> float:
    """ms of all complete events named exactly ``name``."""
    return sum(e["dur"] for e in t["traceEvents"] if e.get("ph") == "X" and e["name"] == name) / 1000


def mean(xs: list[float]) -> float:
    """Arithmetic mean."""
    return sum(xs) / len(xs)


# ------------------------------------------------------------------------------------------- layout


def test_every_scenario_was_recorded() -> None:
    top = {d.name for d in run_dirs() if d.parent == SAMPLES}
    assert top == set(SCENARIOS)
    assert {d.name for d in run_dirs() if d.parent.name == "grad_accum"} == {"1proc", "2proc"}


@pytest.mark.parametrize("d", run_dirs(), ids=lambda d: str(d.relative_to(SAMPLES)))
def test_scenario_json_is_complete(d: Path) -> None:
    s = scenario(d)
    assert REQUIRED_KEYS <= s.keys()
    assert s["scenario"] == str(d.relative_to(SAMPLES))
    assert s["backend"] == "gloo"
    assert s["generated_by"] == "sample_traces/generate.py"
    assert s["torch_version"].startswith("2.13.0")
    assert s["command"].startswith("python sample_traces/generate.py")
    exp = s["expected"]
    assert exp["cause"] in CAUSES and isinstance(exp["ranks"], list)
    assert (exp["cause"] is None) == (exp["kind"] is None)
    assert set(exp["ranks"]) <= set(range(s["world_size"]))
    assert sorted(s["step_times_ms"], key=int) == [str(r) for r in range(s["world_size"])]
    for times in s["step_times_ms"].values():
        assert times and all(t > 0 for t in times)


@pytest.mark.parametrize("d", trace_dirs(), ids=lambda d: str(d.relative_to(SAMPLES)))
def test_one_trace_and_one_log_per_rank(d: Path) -> None:
    ws = scenario(d)["world_size"]
    files = traces(d)
    assert len(files) == ws
    assert sorted(int(TRACE_NAME.match(p.name).group(1)) for p in files) == list(range(ws))
    assert sorted(p.name for p in d.glob("rank*.log")) == [f"rank{r}.log" for r in range(ws)]


@pytest.mark.parametrize("d", trace_dirs(), ids=lambda d: str(d.relative_to(SAMPLES)))
def test_distributed_info_matches_rank_and_world_size(d: Path) -> None:
    s = scenario(d)
    for p in traces(d):
        t = trace(p)
        if s.get("distributed", True):
            di = t["distributedInfo"]
            assert di["rank"] == int(TRACE_NAME.match(p.name).group(1))
            assert di["world_size"] == s["world_size"]
            assert di["backend"] == "gloo"
        else:  # the 1-process HF baseline is a plain, non-distributed run
            assert "distributedInfo" not in t


@pytest.mark.parametrize("d", trace_dirs(), ids=lambda d: str(d.relative_to(SAMPLES)))
def test_profiler_steps_are_the_recorded_ones(d: Path) -> None:
    want = [f"ProfilerStep#{n}" for n in scenario(d).get("profiled_steps", [2, 3, 4])]
    for p in traces(d):
        steps = profiler_steps(trace(p))
        assert [e["name"] for e in steps] == want
        assert len({e["tid"] for e in steps}) == 1


@pytest.mark.parametrize("d", trace_dirs(), ids=lambda d: str(d.relative_to(SAMPLES)))
def test_step_logs_match_measured_step_times(d: Path) -> None:
    s = scenario(d)
    if s["config"].get("framework") == "transformers.Trainer":
        pytest.skip("HF Trainer logs have no step-time field; see test_grad_accum_*")
    for r, times in s["step_times_ms"].items():
        lines = [m for line in (d / f"rank{r}.log").read_text().splitlines() if (m := STEP_LINE.match(line))]
        assert [int(m["step"]) for m in lines] == list(range(s["config"]["steps"]))
        logged = [float(dict(kv.split(":", 1) for kv in m["kv"].split())["step_time_ms"]) for m in lines]
        assert logged == pytest.approx(times, abs=0.051)


def test_samples_stay_small() -> None:
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 25 * 2**20
    for p in SAMPLES.rglob("*.pt.trace.json.gz"):
        assert p.stat().st_size < 5 * 2**20, p


# ---------------------------------------------------------------------------------------- scenarios


def aten_ops_per_step(t: dict) -> float:
    """Mean number of ``aten::*`` cpu_ops per profiler step (any thread)."""
    steps = profiler_steps(t)
    ops = [e for e in t["traceEvents"] if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")]
    return mean([sum(1 for e in ops if in_step(e, s)) for s in steps])


# Compute times below are wall times of ops on 2 shared cores (4 ranks), so they carry noise; the
# op counts are exact. Thresholds leave room for that noise on a regenerated set.


def test_healthy_ranks_do_the_same_compute() -> None:
    ts = rank_traces("healthy")
    assert len(ts) == 4
    counts = {r: aten_ops_per_step(t) for r, t in ts.items()}
    assert len(set(counts.values())) == 1, counts
    per_rank = {r: mean(top_level_aten_ms(t)) for r, t in ts.items()}
    assert max(per_rank.values()) < 1.6 * min(per_rank.values()), per_rank


def test_straggler_rank_computes_more_and_the_others_wait() -> None:
    ts = rank_traces("straggler")
    assert scenario(SAMPLES / "straggler")["expected"]["ranks"] == [2]
    counts = {r: aten_ops_per_step(t) for r, t in ts.items()}
    assert counts[2] > 1.3 * max(v for r, v in counts.items() if r != 2), counts
    compute = {r: mean(top_level_aten_ms(t)) for r, t in ts.items()}
    assert compute[2] > 1.5 * max(v for r, v in compute.items() if r != 2), compute
    wait = {r: mean(named_ms_per_step(t, lambda n: n == "gloo:all_reduce")) for r, t in ts.items()}
    assert wait[2] < min(v for r, v in wait.items() if r != 2), wait


def gemm_input_types(name: str) -> set[str]:
    """First-input dtypes of the GEMM cpu_ops (aten::mm/addmm/linear) in scenario ``name``'s traces."""
    found = set()
    for t in rank_traces(name).values():
        for e in t["traceEvents"]:
            if e.get("cat") == "cpu_op" and e["name"] in ("aten::mm", "aten::addmm", "aten::linear"):
                found.update(x for x in e["args"]["Input type"] if x not in ("", "Scalar"))
    return found


def test_precision_bf16_matmuls_are_bfloat16_and_fp32_ones_are_not() -> None:
    assert "c10::BFloat16" in gemm_input_types("precision_bf16")
    fp32 = gemm_input_types("precision_fp32")
    assert "float" in fp32 and not any("BFloat16" in x or "Half" in x for x in fp32)


def test_precision_bf16_keeps_fp32_params_and_gradient_all_reduce() -> None:
    # Autocast casts weights per op (aten::_to_copy); parameters, gradients and their all-reduce stay fp32.
    for t in rank_traces("precision_bf16").values():
        ev = t["traceEvents"]
        assert any(e["name"] == "aten::_to_copy" and "15" in e["args"].get("Concrete Inputs", []) for e in ev)
        reduce_types = {x for e in ev if e["name"] == "gloo:all_reduce" for x in e["args"]["Input type"]}
        assert reduce_types == {"float"}


def test_compile_cold_holds_the_compile_and_warm_far_less_of_it() -> None:
    cold, warm = rank_traces("compile_cold"), rank_traces("compile_warm")
    for r in (0, 1):
        names = {e["name"] for e in cold[r]["traceEvents"]}
        assert {"entire_frame_compile", "backend_compile", "inductor_compile"} <= names
        assert "Torch-Compiled Region: 0/0" in names
        assert any(n.startswith("Torch-Compiled Region") for n in (e["name"] for e in warm[r]["traceEvents"]))
        # The warm cache skips inductor's codegen and C++ compile; dynamo and AOTAutograd still trace.
        cold_compile = total_ms(cold[r], "entire_frame_compile")
        assert cold_compile > 5000
        assert total_ms(warm[r], "inductor_compile") < 0.3 * total_ms(cold[r], "inductor_compile")
        assert total_ms(warm[r], "entire_frame_compile") < 0.5 * cold_compile
        first, *rest = (e["dur"] / 1000 for e in profiler_steps(cold[r]))
        assert first > 20 * max(rest)  # ProfilerStep#0 holds the compile
        assert profiler_steps(warm[r])[0]["dur"] < 0.5 * profiler_steps(cold[r])[0]["dur"]
    for r, c in scenario(SAMPLES / "compile_warm")["compile_counters"].items():
        assert c["inductor"].get("fxgraph_cache_hit", 0) > 0, r
        assert (
            scenario(SAMPLES / "compile_cold")["compile_counters"][r]["inductor"].get("fxgraph_cache_miss", 0)
            > 0
        )


def banner_value(log: Path, label: str) -> int:
    """An integer from the HF Trainer ``***** Running training *****`` banner in ``log``."""
    m = re.search(re.escape(label) + r" = (?P<v>[\d,]+)", log.read_text())
    assert m, f"{label!r} not in {log}"
    return int(m["v"].replace(",", ""))


def test_grad_accum_2proc_banner_doubles_the_total_train_batch() -> None:
    label = "Total train batch size (w. parallel, distributed & accumulation)"
    one = banner_value(SAMPLES / "grad_accum/1proc/rank0.log", label)
    two = banner_value(SAMPLES / "grad_accum/2proc/rank0.log", label)
    assert two == 2 * one
    for sub in ("1proc", "2proc"):
        log = SAMPLES / f"grad_accum/{sub}/rank0.log"
        assert banner_value(log, "Gradient Accumulation steps") == 8
        assert "***** Running training *****" in log.read_text()
    top = scenario(SAMPLES / "grad_accum")
    assert top["effective_batch"] == {"1proc": one, "2proc": two}
    assert top["expected"]["kind"] == "gradient_accumulation"


def test_grad_accum_logs_one_loss_dict_per_optimizer_step() -> None:
    for sub in ("1proc", "2proc"):
        text = (SAMPLES / f"grad_accum/{sub}/rank0.log").read_text()
        losses = re.findall(r"\{'loss': [^{}]*\}", text)
        assert len(losses) == scenario(SAMPLES / f"grad_accum/{sub}")["config"]["max_steps"]


def test_grad_accum_2proc_all_reduces_only_on_the_last_micro_batch() -> None:
    # 8 DDP forwards per optimizer step, but the gradient all-reduce runs once per step (no_sync()
    # for the first 7 micro-batches): the per-step count of c10d::allreduce_ calls stays far below 8.
    for t in rank_traces("grad_accum/2proc").values():
        forwards, allreduces = [], []
        for s in profiler_steps(t):
            names = [e.get("name") for e in t["traceEvents"] if e.get("ph") == "X" and in_step(e, s)]
            forwards.append(names.count("DistributedDataParallel.forward"))
            allreduces.append(names.count("c10d::allreduce_"))
        assert forwards == [8, 8, 8]
        assert 1 <= min(allreduces) and max(allreduces) <= 2, allreduces


def test_slow_interconnect_all_reduce_dominates() -> None:
    def allreduce(name: str) -> float:
        return mean(
            [mean(named_ms_per_step(t, lambda n: n == "gloo:all_reduce")) for t in rank_traces(name).values()]
        )

    slow, fast = allreduce("slow_interconnect"), allreduce("fast_interconnect")
    assert slow > 5 * fast, (slow, fast)
    step = {
        n: mean([mean(v[2:]) for v in scenario(SAMPLES / n)["step_times_ms"].values()])
        for n in ("slow_interconnect", "fast_interconnect")
    }
    assert step["slow_interconnect"] > 3 * step["fast_interconnect"], step
    assert "tbf rate 200mbit" in scenario(SAMPLES / "slow_interconnect")["link"]["qdisc"]


def test_dataloader_bound_step_is_mostly_data_loading() -> None:
    def loading_share(name: str) -> float:
        shares = []
        for t in rank_traces(name).values():
            dl = named_ms_per_step(t, lambda n: n.startswith("enumerate(DataLoader)"))
            shares += [a / (s["dur"] / 1000) for a, s in zip(dl, profiler_steps(t), strict=True)]
        return mean(shares)

    assert loading_share("dataloader_bound") > 0.5
    assert loading_share("healthy") < 0.1
    for t in rank_traces("dataloader_bound").values():
        assert mean(named_ms_per_step(t, lambda n: n.startswith("enumerate(DataLoader)"))) > 1.5 * mean(
            top_level_aten_ms(t)
        )
