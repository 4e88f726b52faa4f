"""Capture helper (traceanalyze.capture): a real 2-process gloo job on CPU recorded with it, then analyzed.

The job test needs torch (``pip install torch==2.13.0``) and skips without it; the others run anywhere.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

import traceanalyze as ta
from tests.conftest import ROOT
from tests.synth import cpu_job, write_trace
from traceanalyze import capture
from traceanalyze.discover import discover


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Run tests/capture_job.py once: 2 gloo ranks, 10 steps, capture.profile(wait=1, warmup=1, active=3)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("capture") / "traces"
    env = {**os.environ, "NCCL_DEBUG": "INFO", "PYTHONPATH": str(ROOT)}
    env.pop("NCCL_DEBUG_FILE", None)
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "capture_job.py"), str(out)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_capture_writes_ranked_traces_and_env(job):
    names = sorted(p.name for p in job.iterdir())
    traces = [n for n in names if n.endswith(".pt.trace.json.gz")]
    assert [n.split(".")[0] for n in traces] == ["rank0", "rank1"]
    assert "env_rank0.json" in names and "env_rank1.json" in names
    env = json.loads((job / "env_rank1.json").read_text())
    assert env["rank"] == 1 and env["world_size"] == 2 and env["backend"] == "gloo"
    assert env["versions"]["torch"].startswith("2.13.0") and env["versions"]["python"]
    # prepare_env ran before the process group: NCCL's lines would go beside the traces
    assert env["env"]["NCCL_DEBUG_FILE"] == str(job.resolve() / "nccl_rank1_%h_%p.log")
    with gzip.open(job / traces[0], "rt") as fh:
        head = json.load(fh)
    assert head["distributedInfo"]["rank"] == 0 and head["record_shapes"] == 1
    # the steps without the profiler: the 5 after the window (the wait step is the loop's first, kept apart)
    steps = json.loads((job / "steps_rank1.json").read_text())
    assert steps["rank"] == 1 and steps["unprofiled_steps"] == [5, 6, 7, 8, 9] and steps["profiled_steps"] == [2, 3, 4]
    assert all(ms > 0 for ms in steps["unprofiled_step_ms"] + steps["profiled_step_ms"])
    assert steps["first_step_ms"] > 0 and steps["timing"] == "perf_counter"
    assert steps["profiler"] == {"record_shapes": True, "with_stack": False, "profile_memory": False}


def test_analyze_capture_output(job, tmp_path):
    with ta.analyze(job, jobs=1) as a:
        run = a.model["runs"][0]
        assert run["mode"] == "cpu" and run["world_size"] == 2 and run["backend"] == "gloo"
        assert run["ranks_found"] == [0, 1]
        assert not [w for w in a.warnings if w.get("level") in ("error", "partial")]
        assert sorted(s["kind"] for s in run["sidecars"]) == ["env", "env", "steps", "steps"]
        # the scheduled window: wait 1 + warmup 1, then 3 active steps (ProfilerStep#2..#4) on each rank; the last
        # is the window's edge (partial), not counted (store.STEP_MACROS)
        assert {r["rank"]: r["n_steps"] for r in run["ranks"]} == {0: 2, 1: 2}
        assert sorted({s["step"] for s in run["steps"]}) == [2, 3]
        assert a.con.execute("SELECT list(DISTINCT step ORDER BY step) FROM profiler_steps(?)",
                             [run["run_id"]]).fetchone()[0] == [2, 3, 4]
        mm = a.con.execute("""SELECT f.rank, c.input_types FROM cpu_ops c JOIN files f USING (file_id)
                              WHERE c.name = 'aten::mm' GROUP BY ALL""").fetchall()
        assert {r for r, _ in mm} == {0, 1} and all(json.loads(t)[:2] == ["float", "float"] for _, t in mm)
        assert run["log_facts"]["torch_version"][0].startswith("2.13.0")
        assert "NCCL_DEBUG=INFO" in run["log_facts"]["env"]
        res = a.export(tmp_path / "merged.json.gz")
    assert res.ranks == [0, 1] and res.n_events > 0


def test_capture_step_times_reach_the_pipeline(job, monkeypatch):
    from traceanalyze.logs import sidecars

    sides: list[dict] = []
    real = sidecars.read_sidecars
    monkeypatch.setattr(sidecars, "read_sidecars", lambda *a, **kw: sides.append(real(*a, **kw)) or sides[-1])
    with ta.analyze(job, jobs=1) as a:
        assert not [w for w in a.warnings if "steps_rank" in w["file"]]
    unp = sides[-1]["unprofiled"]
    assert (unp["source"], unp["n_ranks"], unp["n_steps"], unp["timing"]) == ("capture", 2, 10, "perf_counter")
    assert unp["step_time_us"] > 0 and unp["profiled_step_time_us"] > 0


def test_prepare_env(tmp_path, monkeypatch):
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    monkeypatch.setenv("RANK", "3")
    assert capture.prepare_env(tmp_path / "t") == {} and "NCCL_DEBUG_FILE" not in os.environ
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    got = capture.prepare_env(tmp_path / "t")
    assert got == {"NCCL_DEBUG_FILE": str((tmp_path / "t").resolve() / "nccl_rank3_%h_%p.log")}
    assert os.environ["NCCL_DEBUG_FILE"] == got["NCCL_DEBUG_FILE"]
    monkeypatch.setenv("NCCL_DEBUG_FILE", "/elsewhere/nccl.log")  # the user's own choice is kept
    assert capture.prepare_env(tmp_path / "t") == {} and os.environ["NCCL_DEBUG_FILE"] == "/elsewhere/nccl.log"


def test_capture_sidecars_are_read_not_mistaken_for_traces(tmp_path):
    d = tmp_path / "run"
    write_trace(d / "rank0.json", 0, cpu_job(0, 0.0))
    write_trace(d / "rank1.json", 1, cpu_job(1, 0.0))
    env = {"traceanalyze_capture": 1, "rank": 0, "world_size": 2, "backend": "gloo", "hostname": "node7",
           "versions": {"python": "3.11.7", "torch": "2.13.0", "cuda": "12.4", "nccl": "2.21.5", "cudnn": None},
           "gpus": ["NVIDIA H100 80GB HBM3"], "env": {"NCCL_P2P_DISABLE": "1", "RANK": "0"}}
    (d / "env_rank0.json").write_text(json.dumps(env))
    (d / "nccl_rank0_node7_123.log").write_text(
        "node7:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n")
    (d / "topo.txt").write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-7\nGPU1\tSYS\t X \t0-7\n")
    disc = discover([d])
    assert len(disc.runs) == 1 and len(disc.runs[0].traces) == 2 and not disc.skipped
    kinds = {s.path.name: s.kind for s in disc.runs[0].sidecars}
    assert kinds == {"env_rank0.json": "env", "nccl_rank0_node7_123.log": "nccl_debug", "topo.txt": "topology"}
    with ta.analyze(d, jobs=1) as a:
        facts = a.model["runs"][0]["log_facts"]
        assert facts["nccl_version"] == ["2.21.5"] and facts["env"] == ["NCCL_P2P_DISABLE=1"]
        assert facts["gpu"] == ["NVIDIA H100 80GB HBM3"] and facts["hostname"] == ["node7"]
    # an env file alone is not a run
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "env_rank0.json").write_text(json.dumps(env))
    disc = discover([alone])
    assert disc.runs == [] and "without traces" in disc.skipped[0][1]


def test_analyzer_never_imports_torch(tmp_path):
    write_trace(tmp_path / "rank0.json", 0, cpu_job(0, 0.0))
    write_trace(tmp_path / "rank1.json", 1, cpu_job(1, 0.0))
    code = ("import sys, traceanalyze as ta, traceanalyze.capture, traceanalyze.cli, traceanalyze.export; "
            f"a = ta.analyze({str(tmp_path)!r}, jobs=1); a.to_html({str(tmp_path / 'r.html')!r}); "
            f"a.export({str(tmp_path / 'm.json')!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_profile_without_torch_is_an_import_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError), capture.profile(tmp_path):
        pass


@pytest.mark.parametrize(("flags", "native"), [("fpu avx2 avx512f avx512bw", False), ("avx512f avx512_bf16", True),
                                               ("avx2 amx_tile amx_bf16", True)])
def test_cpu_facts_read_native_bf16_from_cpuinfo(tmp_path, flags, native):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Test CPU @ 2.80GHz\nflags\t\t: {flags}\n\nprocessor\t: 1\n"
                    "model name\t: other\nflags\t\t: avx512_bf16\n")
    facts = capture.cpu_facts(info)
    assert (facts["model"], facts["native_bf16"]) == ("Test CPU @ 2.80GHz", native)
    assert capture.cpu_facts(tmp_path / "absent")["native_bf16"] is None  # unknown, never a guess


def test_env_cpu_facts_are_bounded_and_leave_bf16_out_of_a_cpu_run(tmp_path):
    d = tmp_path / "run"
    write_trace(d / "rank0.json", 0, cpu_job(0, 0.0))
    write_trace(d / "rank1.json", 1, cpu_job(1, 0.0))
    env = {"traceanalyze_capture": 1, "rank": 0, "world_size": 2, "versions": {},
           "cpu": {"model": "<b>Xeon</b>" + "x" * 5000, "isa": "AVX512", "native_bf16": False}}
    (d / "env_rank0.json").write_text(json.dumps(env))
    with ta.analyze(d, jobs=1) as a:
        run = a.model["runs"][0]
        facts = run["log_facts"]
        assert facts["cpu_native_bf16"] == ["false"] and facts["cpu_isa"] == ["AVX512"]
        assert len(facts["cpu_model"][0]) == 256
        # emulated bf16 is no fix: the what-if is left out, and the report says why
        assert "bf16_matmul" not in {w["scenario"] for w in run["whatif"]}
        (lo,) = run["replay"]["left_out"]
        assert lo["scenario"] == "bf16_matmul" and "neither AMX nor AVX512-BF16" in lo["why"]
        (prec,) = [f for f in run["findings"] if f["kind"] == "fp32_matmul"]
        assert (prec["severity"], prec["impact_pct"]) == ("low", 0.0)
        html = a.to_html(tmp_path / "r.html").read_text()
        assert "<b>Xeon" not in html and "&lt;b&gt;Xeon" in html and "Left out:" in html
    # the same run without the env file: the host is unknown, native bf16 assumed
    (d / "env_rank0.json").unlink()
    with ta.analyze(d, jobs=1) as a:
        run = a.model["runs"][0]
        assert "bf16_matmul" in {w["scenario"] for w in run["whatif"]} and run["replay"]["left_out"] == []
