"""Step times without the profiler: capture's timer and ``steps_rank{r}.json`` (written in-process with torch, when
installed; the timer with a fake clock anywhere), discovery of the sidecar, its bounded reader, and the choice of
the run's unprofiled step time (capture, else the log). Hostile sidecars each cost a warning row naming the file
(docs/safety.md), never the report.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

import traceanalyze as ta
from tests.synth import cpu_job, write_trace
from traceanalyze import capture, logs
from traceanalyze.discover import classify, discover
from traceanalyze.errors import InputError
from traceanalyze.limits import MAX_CAPTURE_STEPS
from traceanalyze.logs import sidecars
from traceanalyze.logs.model import LogStep
from traceanalyze.logs.steps import CaptureSteps, measured_unprofiled_step, parse_capture_steps


def sidecar(unprofiled, rank=0, **kw) -> dict:
    return {"traceanalyze_capture": 1, "rank": rank, "unprofiled_step_ms": unprofiled, **kw}


def run_folder(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    write_trace(d / "rank0.json", 0, cpu_job(0, 0.0))
    write_trace(d / "rank1.json", 1, cpu_job(1, 0.0))
    return d


@pytest.fixture
def sides(monkeypatch):
    """What ``logs.sidecars.read_sidecars`` returned, per call (the side dict the replay stage reads)."""
    got: list[dict] = []
    real = sidecars.read_sidecars

    def spy(*a, **kw):
        got.append(real(*a, **kw))
        return got[-1]

    monkeypatch.setattr(sidecars, "read_sidecars", spy)
    return got


# ---- capture's timer ---------------------------------------------------------------------------------------------


class FakeLoop:
    """A loop of ``StepTimer`` calls on a fake clock: step k lasts 10 + k ms; sync calls noted with the step."""

    def __init__(self, timer_kw: dict, synced: bool = True):
        self.t = 0.0
        self.syncs: list[int] = []
        self.timer = capture.StepTimer(**timer_kw, sync=self.sync, clock=lambda: self.t)
        self.synced = synced

    def sync(self) -> bool:
        self.syncs.append(self.timer.step)
        return self.synced

    def run(self, n: int) -> None:
        self.timer.begin()
        for k in range(n):
            self.t += (10 + k) / 1e3
            self.timer.end_step()
            self.t += 1.0  # the profiler's own work in prof.step(): in no step
            self.timer.next_step()


def test_step_timer_times_unprofiled_steps_with_sync_and_profiled_ones_without():
    loop = FakeLoop({"wait": 3, "warmup": 1, "active": 2, "after": 2})
    loop.run(12)
    tm = loop.timer
    assert tm.first_ms == pytest.approx(10.0)  # the loop's first step, kept apart
    assert [k for k, _ in tm.unprofiled] == [1, 2, 6, 7]  # wait steps but the first, then 2 after the window
    assert [ms for _, ms in tm.unprofiled] == pytest.approx([11, 12, 16, 17])
    assert [k for k, _ in tm.profiled] == [4, 5]  # the active steps; warmup step 3 is not timed
    assert [ms for _, ms in tm.profiled] == pytest.approx([14, 15])
    # synchronize only at the ends of steps without the profiler: never inside the recorded window
    assert sorted(set(loop.syncs)) == [0, 1, 2, 6, 7] and tm.synced and tm.done
    rec = capture.steps_record(tm, 3, {"record_shapes": True, "with_stack": False, "profile_memory": False})
    assert rec["rank"] == 3 and rec["unprofiled_step_ms"] == pytest.approx([11, 12, 16, 17])
    assert rec["unprofiled_steps"] == [1, 2, 6, 7] and rec["profiled_steps"] == [4, 5]
    assert rec["timing"] == "cuda_synchronize" and rec["schedule"]["after"] == 2
    assert json.loads(json.dumps(rec)) == rec


def test_step_timer_without_cuda_and_without_a_wait_step():
    loop = FakeLoop({"wait": 0, "warmup": 1, "active": 1, "after": 1}, synced=False)
    loop.run(2)  # the loop ends before the step after the window
    tm = loop.timer
    assert tm.first_ms is None and tm.unprofiled == [] and [k for k, _ in tm.profiled] == [1] and not tm.done
    assert capture.steps_record(tm, 0, {})["timing"] == "perf_counter"


def test_profile_writes_the_steps_sidecar(tmp_path):
    torch = pytest.importorskip("torch")
    out = tmp_path / "traces"
    x = torch.randn(64, 64)
    with capture.profile(out, wait=3, warmup=1, active=2, time_after=2, rank=0, world_size=1, topology=False) as prof:
        real_step = type(prof).step
        for _ in range(12):
            (x @ x).sum()
            prof.step()
            if _ == 7:
                assert (out / "steps_rank0.json").exists()  # written once the steps after the window ran
                assert "step" not in vars(prof) and type(prof).step is real_step  # the profiler's own step again
    rec = json.loads((out / "steps_rank0.json").read_text())
    assert rec["traceanalyze_capture"] == 1 and rec["rank"] == 0 and rec["timing"] == "perf_counter"
    assert rec["unprofiled_steps"] == [1, 2, 6, 7] and rec["profiled_steps"] == [4, 5]
    assert all(v > 0 for v in rec["unprofiled_step_ms"] + rec["profiled_step_ms"])
    assert rec["profiler"] == {"record_shapes": True, "with_stack": False, "profile_memory": False}
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".json")) == ["env_rank0.json", "steps_rank0.json"]
    kinds = {s.path.name: s.kind for r in discover([out]).runs for s in r.sidecars}
    assert kinds == {"env_rank0.json": "env", "steps_rank0.json": "steps"}


def test_profile_writes_what_it_timed_when_the_loop_ends_early(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "t"
    with capture.profile(out, wait=2, warmup=1, active=1, rank=2, topology=False, write_env=False) as prof:
        for _ in range(3):  # the loop stops inside the window: no trace, the wait step still timed
            prof.step()
    rec = json.loads((out / "steps_rank2.json").read_text())
    assert rec["unprofiled_steps"] == [1] and rec["profiled_steps"] == [] and rec["first_step_ms"] > 0


# ---- discovery ---------------------------------------------------------------------------------------------------


def test_discover_attaches_the_steps_sidecar_to_its_run(tmp_path):
    d = run_folder(tmp_path)
    (d / "steps_rank0.json").write_text(json.dumps(sidecar([40.0, 42.0])))
    (d / "steps_rank1.json.gz").write_bytes(gzip.compress(json.dumps(sidecar([44.0], rank=1)).encode()))
    (d / "renamed.json").write_text(json.dumps(sidecar([41.0])))  # a capture file by its key
    # an env file whose variable holds the key as text stays an env file
    env = {"traceanalyze_capture": 1, "env": {"NCCL_X": '"unprofiled_step_ms":'}}
    (d / "env_rank0.json").write_text(json.dumps(env))
    (d / "steps_rank9.json").write_text("garbage")  # named so: the reader says what is wrong
    disc = discover([d])
    assert len(disc.runs) == 1 and len(disc.runs[0].traces) == 2 and not disc.skipped
    kinds = {s.path.name: s.kind for s in disc.runs[0].sidecars}
    assert kinds == {"steps_rank0.json": "steps", "steps_rank1.json.gz": "steps", "renamed.json": "steps",
                     "env_rank0.json": "env", "steps_rank9.json": "steps"}
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "steps_rank0.json").write_text(json.dumps(sidecar([40.0])))
    disc = discover([alone])
    assert disc.runs == [] and "step-time file without traces" in disc.skipped[0][1]


def test_a_big_steps_sidecar_is_no_trace(tmp_path):
    f = tmp_path / "steps_rank0.json"
    f.write_text(json.dumps(sidecar([1.0] * 30_000)).replace('"traceanalyze_capture": 1, ', " " * 70_000))
    assert classify(f) == ("steps", "")


# ---- the reader --------------------------------------------------------------------------------------------------


def test_reader_returns_microseconds_and_the_rank(tmp_path):
    f = tmp_path / "steps_rank1.json"
    f.write_text(json.dumps(sidecar([42.5, 44.0], rank=1, profiled_step_ms=[68.0, 70.0], timing="cuda_synchronize",
                                    profiler={"record_shapes": True, "with_stack": "yes"})))
    cs = parse_capture_steps(f)
    assert (cs.rank, cs.unprofiled_us, cs.profiled_us) == (1, [42_500.0, 44_000.0], [68_000.0, 70_000.0])
    assert cs.timing == "cuda_synchronize" and cs.profiler == {"record_shapes": True} and cs.warnings == []


HOSTILE = {  # name -> (content, warnings)
    "nan": ('{"rank": 1, "unprofiled_step_ms": [40.0, NaN, 42.0]}',
            ["unprofiled_step_ms: 1 of 3 values dropped (1 NaN); 2 kept"]),
    "negative": (sidecar([40.0, -3.0, 0, 42.0], rank=1),
                 ["unprofiled_step_ms: 2 of 4 values dropped (2 zero or negative); 2 kept"]),
    "infinite": ('{"unprofiled_step_ms": [40.0, Infinity, -Infinity, 1e400, 42.0]}',
                 ["unprofiled_step_ms: 3 of 5 values dropped (3 infinite); 2 kept"]),
    "absurd": (sidecar([40.0, 86_400_001.0, 10**25, 42.0], rank=1),
               ["unprofiled_step_ms: 2 of 4 values dropped (2 longer than a day); 2 kept"]),
    "huge_int": ('{"unprofiled_step_ms": [40.0, ' + "9" * 5000 + ", -" + "9" * 5000 + ", 42.0]}",
                 ["unprofiled_step_ms: 2 of 4 values dropped (1 longer than a day, 1 zero or negative); 2 kept"]),
    "wrong_types": (sidecar([40.0, "41", None, True, [1.0], {"ms": 1.0}, 42.0], rank="0", profiled_step_ms="x"),
                    ["implausible rank (must be an integer from 0 to 1,048,575); taken from the file name",
                     "unprofiled_step_ms: 5 of 7 values dropped (5 not a number); 2 kept",
                     "no profiled_step_ms list (not a list); no step times read"]),
    "nested_junk": (sidecar([40.0, [[[[[[1.0]]]]]], {"a": {"b": [1, 2]}}, 42.0], rank=[0]),
                    ["implausible rank (must be an integer from 0 to 1,048,575); taken from the file name",
                     "unprofiled_step_ms: 2 of 4 values dropped (2 not a number); 2 kept"]),
    "too_long": (sidecar([41.0] * (MAX_CAPTURE_STEPS + 5), rank=1),
                 [f"unprofiled_step_ms: {MAX_CAPTURE_STEPS + 5:,} values, more than {MAX_CAPTURE_STEPS:,}; only the "
                  f"first {MAX_CAPTURE_STEPS:,} read"]),
    "deep": ('{"unprofiled_step_ms": ' + "[" * 100_000 + "]" * 100_000 + "}",
             ["nested deeper than the JSON decoder's bound; no step times read"]),
    "not_json": ("{unprofiled_step_ms: [1", ["not JSON; no step times read"]),
    "not_object": ("[40.0, 42.0]", ["not a JSON object; no step times read"]),
    "no_list": (sidecar({"0": 40.0}, rank=1), ["no unprofiled_step_ms list (not a list); no step times read"]),
}
KEPT = {"nan": 2, "negative": 2, "infinite": 2, "absurd": 2, "huge_int": 2, "wrong_types": 2, "nested_junk": 2,
        "too_long": MAX_CAPTURE_STEPS}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_steps_sidecar_is_a_warning_row_and_keeps_valid_values(tmp_path, case, sides):
    content, expected = HOSTILE[case]
    d = run_folder(tmp_path)
    bad = d / "steps_rank1.json"
    bad.write_text(content if isinstance(content, str) else json.dumps(content))
    cs = parse_capture_steps(bad)
    assert cs.warnings == expected
    assert len(cs.unprofiled_us) == KEPT.get(case, 0) and cs.rank == 1
    assert all(math.isfinite(v) and 0 < v <= 86_400e6 for v in cs.unprofiled_us)
    with ta.analyze(d, jobs=1) as a:
        rows = [(w["level"], w["message"]) for w in a.model["warnings"] if w["file"] == str(bad)]
        assert rows == [("warning", m) for m in expected]
        assert [r["rank"] for r in a.model["runs"][0]["ranks"]] == [0, 1]
    unp = sides[-1]["unprofiled"]
    if case in KEPT:
        assert unp["source"] == "capture" and unp["step_time_us"] == pytest.approx(41_000.0)
    else:
        assert unp is None


def test_a_steps_sidecar_over_64_mib_is_a_warning_row(tmp_path, sides):
    d = run_folder(tmp_path)
    big = d / "steps_rank0.json"
    with open(big, "wb") as fh:
        fh.write(b'{"traceanalyze_capture": 1, "unprofiled_step_ms": [1.0')
        fh.truncate((64 << 20) + 10)  # sparse: 64 MiB of zero bytes after the head
    with pytest.raises(InputError, match="larger than 64 MiB"):
        parse_capture_steps(big)
    bomb = d / "steps_rank1.json.gz"
    bomb.write_bytes(gzip.compress(json.dumps(sidecar([40.0], rank=1)).encode()[:-1] + b" " * (65 << 20) + b"}"))
    assert bomb.stat().st_size < 1 << 20
    with ta.analyze(d, jobs=1) as a:
        rows = {w["file"]: (w["level"], w["message"]) for w in a.model["warnings"] if "steps_rank" in w["file"]}
        assert rows == {
            str(big): ("warning", "larger than 64 MiB; not read: too big for a file that is read whole"),
            str(bomb): ("warning", "decompresses to more than 64 MiB (a gzip bomb?); not read: too big for a file "
                                   "that is read whole")}
        assert [r["rank"] for r in a.model["runs"][0]["ranks"]] == [0, 1]
    assert sides[-1]["unprofiled"] is None and sides[-1]["capture_steps"] == []


# ---- the choice: capture, else the log ---------------------------------------------------------------------------


def log(rank, steps_ms: dict) -> list[LogStep]:
    return [LogStep(rank=rank, step=s, step_time_ms=ms) for s, ms in steps_ms.items()]


def test_capture_is_the_median_over_ranks_of_each_ranks_median():
    caps = [CaptureSteps("a", 0, [40e3, 41e3, 90e3], [70e3]), CaptureSteps("b", 1, [44e3, 46e3], [66e3, 68e3]),
            CaptureSteps("c", 0, [42e3]), CaptureSteps("d", None, [50e3], timing="perf_counter")]
    got = measured_unprofiled_step({"capture_steps": caps, "log_steps": log(0, {1: 9.0, 2: 9.0, 3: 9.0, 4: 9.0})})
    # rank 0: median(40, 41, 90, 42) = 41.5; rank 1: 45; the file without a rank: 50
    assert got == {"step_time_us": 45_000.0, "source": "capture", "n_steps": 7, "n_ranks": 3,
                   "profiled_step_time_us": 68_500.0, "timing": "perf_counter", "profiler": {}}


def test_the_log_when_its_steps_cover_the_run():
    steps = log(0, {1: 900.0, 2: 45.0, 3: 46.0, 4: 47.0, 5: 44.0, 6: 48.0, 7: 69.0}) + \
        log(1, {1: 800.0, 2: 50.0, 3: 50.0, 4: 51.0})
    side = {"capture_steps": [CaptureSteps("x", 0, [])], "log_steps": steps}
    got = measured_unprofiled_step(side)
    assert got == {"step_time_us": pytest.approx((46_500.0 + 50_000.0) / 2), "source": "log", "n_steps": 9,
                   "n_ranks": 2, "steps": "2–7"}
    assert measured_unprofiled_step(side, n_profiled_steps=2)["source"] == "log"  # 6 > 2 × 2
    assert measured_unprofiled_step(side, n_profiled_steps=3) is None  # half the logged steps may be profiled ones
    assert measured_unprofiled_step({"log_steps": log(0, {1: 900.0, 2: 45.0, 3: 46.0})}) is None  # too few
    bad = log(0, {1: 9.0, 2: float("nan"), 3: -1.0, 4: float("inf"), 5: 1e12})
    assert measured_unprofiled_step({"log_steps": bad}) is None and measured_unprofiled_step({}) is None


def test_pipeline_stores_the_unprofiled_step_in_side(tmp_path, sides):
    d = run_folder(tmp_path)
    (d / "train.log").write_text("".join(f"[rank0] step {i} loss 2.0 time {40 + i}.0ms\n" for i in range(1, 12)))
    with ta.analyze(d, jobs=1):
        pass
    assert sides[-1]["unprofiled"] == {"step_time_us": 46_500.0, "source": "log", "n_steps": 10, "n_ranks": 1,
                                       "steps": "2–11"}
    (d / "steps_rank0.json").write_text(json.dumps(sidecar([30.0, 31.0, 32.0], profiled_step_ms=[50.0])))
    (d / "steps_rank1.json").write_text(json.dumps(sidecar([34.0], rank=1)))
    with ta.analyze(d, jobs=1) as a:
        assert not [w for w in a.model["warnings"] if "steps_rank" in w["file"]]
        assert sorted(s["kind"] for s in a.model["runs"][0]["sidecars"]) == ["steps", "steps", "training_log"]
    assert sides[-1]["unprofiled"]["source"] == "capture"
    assert sides[-1]["unprofiled"]["step_time_us"] == pytest.approx(32_500.0)
    assert [cs.rank for cs in sides[-1]["capture_steps"]] == [0, 1]


def test_a_log_of_the_profiled_window_only_is_not_taken(tmp_path, sides):
    d = tmp_path / "run"
    write_trace(d / "rank0.json", 0, cpu_job(0, 0.0, steps=6))
    write_trace(d / "rank1.json", 1, cpu_job(1, 0.0, steps=6))
    (d / "train.log").write_text("".join(f"[rank0] step {i} loss 2.0 time 60.0ms\n" for i in range(1, 7)))
    with ta.analyze(d, jobs=1):
        pass
    assert sides[-1]["unprofiled"] is None  # 5 steady logged steps, not more than twice the profiled ones


def test_parse_functions_are_exported():
    assert logs.parse_capture_steps is parse_capture_steps and logs.measured_unprofiled_step is measured_unprofiled_step
