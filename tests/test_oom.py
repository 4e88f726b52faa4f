"""Runs that died of memory (issue 41): the CUDA out-of-memory message in each PyTorch form, torchrun's SIGKILL
records, the kernel's OOM-killer line and a bare ``Killed`` (traceanalyze.logs.oom); the ``cuda_oom`` / ``host_oom``
findings, the ``Run died`` verdict and the host-memory arithmetic (traceanalyze.diagnose.oom); a logs-only folder
reported end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import ROOT, shared
from traceanalyze.capture import cpu_facts
from traceanalyze.cli import cli
from traceanalyze.diagnose import RunEvidence, verdict
from traceanalyze.diagnose.oom import rule_died
from traceanalyze.discover import sniff
from traceanalyze.logs import Fact, parse_config, parse_env, parse_text_log

GIB, MIB = 1 << 30, 1 << 20
REAL_TORCH_211 = ROOT / "tests" / "data" / "gpu" / "h100" / "oom" / "cuda_oom.log"


def _section(n: int) -> str:
    """Section ``n`` (``# --- n.``) of ../shared/logs/oom.txt: its comment lines and its log lines."""
    text = shared("logs/oom.txt").read_text()
    parts = re.split(r"^# --- (\d+)\.", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))[str(n)]


def _log(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _evidence(ooms: list, facts: list[Fact] = (), world: int | None = None) -> RunEvidence:
    by: dict[str, list] = {}
    for f in facts:
        by.setdefault(f.key, []).append(f)
    return RunEvidence(name="run", mode="logs", world_size=world, gpu_model=None, ranks=[], steps=[],
                       step_time_us=None, facts=by, ooms=ooms)


def _approx(b: int | None, v: float, unit: int) -> bool:
    return b is not None and abs(b - v * unit) < 0.006 * unit


# --- the real formats (../shared/logs/oom.txt) -----------------------------------------------------------------


def test_torch_22_form_real(tmp_path: Path) -> None:
    (e,) = parse_text_log(_log(tmp_path, _section(1))).ooms
    assert (e.kind, e.form, e.rank, e.gpu) == ("cuda", "torch>=2.2", 5, 5)
    assert _approx(e.tried_bytes, 3.50, GIB) and _approx(e.capacity_bytes, 79.15, GIB)
    assert _approx(e.free_bytes, 2.10, GIB) and _approx(e.in_use_bytes, 77.03, GIB)
    assert _approx(e.allocated_bytes, 68.40, GIB) and _approx(e.reserved_unallocated_bytes, 7.91, GIB)
    (f,) = rule_died(_evidence([e]))
    assert (f.cause, f.kind, f.severity, f.impact_pct, f.ranks) == ("config", "cuda_oom", "high", 100.0, [5])
    # 7.91 of 79.15 GiB is 9.99 %: under the 10 % that makes it fragmentation
    assert verdict([f]) == ("Run died: CUDA out of memory on rank 5 (GPU 5): tried to allocate 3.50 GiB with 2.10 GiB "
                            "free of 79.15 GiB. Fix: activation checkpointing, a smaller micro-batch or sharding.")
    assert "7.91 GiB reserved but unallocated (10.0% of the GPU)" in f.evidence[0]


def test_torch_20_21_form_real(tmp_path: Path) -> None:
    (e,) = parse_text_log(_log(tmp_path, _section(2))).ooms
    assert (e.form, e.rank, e.gpu, e.in_use_bytes) == ("torch 2.0-2.1", None, 0, None)
    assert _approx(e.tried_bytes, 1.25, GIB) and _approx(e.capacity_bytes, 23.65, GIB)  # "capacty" (2.1)
    assert _approx(e.free_bytes, 310.0, MIB) and _approx(e.allocated_bytes, 20.02, GIB)
    assert _approx(e.reserved_unallocated_bytes, 2.61, GIB)
    (f,) = rule_died(_evidence([e]))
    # 2.61 of 23.65 GiB is 11 %: fragmentation
    assert verdict([f]) == ("Run died: CUDA out of memory on GPU 0: tried to allocate 1.25 GiB with "
                            "310.00 MiB free of 23.65 GiB. Fix: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")


def test_torch_113_form_real(tmp_path: Path) -> None:
    (e,) = parse_text_log(_log(tmp_path, _section(3), "rank2.log")).ooms
    assert (e.form, e.rank, e.gpu) == ("torch<=1.13", 2, 2)  # the rank from the file name
    assert _approx(e.tried_bytes, 512.0, MIB) and _approx(e.capacity_bytes, 15.78, GIB)
    assert _approx(e.allocated_bytes, 13.90, GIB) and _approx(e.free_bytes, 301.44, MIB)
    assert _approx(e.reserved_unallocated_bytes, 14.47 - 13.90, GIB)  # reserved in total less allocated


def test_torchrun_sigkill_real(tmp_path: Path) -> None:
    res = parse_text_log(_log(tmp_path, _section(4)))
    new, old = res.ooms
    assert (new.kind, new.form, new.host, new.rank, new.local_rank, new.pid) == (
        "host", "torchrun", "gpu-node-07", 10, 2, 7435)
    assert (new.exitcode, new.signal, new.phase, new.oom_killer) == (-9, "SIGKILL", "checkpoint_load", False)
    assert (old.local_rank, old.pid, old.host, old.rank) == (0, 20511, None, None)  # torchrun <= 2.0, no block
    (f,) = rule_died(_evidence([new]))
    assert f.kind == "host_oom" and f.ranks == [10]
    assert verdict([f]) == ("Run died: rank 10 on gpu-node-07 killed (SIGKILL) while the checkpoint loaded: host "
                            "memory. Fix: load the checkpoint once per host, not once per rank.")
    assert "cpu_ram_efficient_loading" in f.recommendation and "CPU offload, if turned on" in f.recommendation


def test_kernel_line_confirms_kill_across_files(tmp_path: Path) -> None:
    """The kernel's line (a dmesg beside the log) names torchrun's child by its pid: the kill is the OOM killer's."""
    (k,) = parse_text_log(_log(tmp_path, _section(5), "dmesg.txt")).ooms
    assert (k.form, k.pid, k.oom_killer) == ("kernel", 7435, True)
    assert k.rss_bytes == 101234567 * 1024
    line = _section(5).strip().splitlines()[-1]
    stamped = _log(tmp_path, f"[812345.678901] {line}\n", "kern.txt")  # with dmesg's clock
    assert sniff(stamped, stamped.read_bytes()) == "training_log"
    assert [(o.pid, o.oom_killer) for o in parse_text_log(stamped).ooms] == [(7435, True)]
    run = parse_text_log(_log(tmp_path, _section(4))).ooms
    (f,) = rule_died(_evidence([*run, k]))
    assert f.title == "rank 10 on gpu-node-07 killed by the kernel (SIGKILL) while the checkpoint loaded: host memory"
    assert f.evidence[0] == ("torchrun: exit code -9 (SIGKILL): rank 10, local rank 2, host gpu-node-07, pid 7435 "
                             "(train.log:6); the kernel's OOM killer: anon-rss 104 GB")


def test_bare_killed_real(tmp_path: Path) -> None:
    (e,) = parse_text_log(_log(tmp_path, _section(6))).ooms
    assert (e.kind, e.form, e.signal, e.phase) == ("host", "shell", "SIGKILL", None)
    assert verdict(rule_died(_evidence([e]))) == ("Run died: a process killed (SIGKILL): host memory. Fix: shrink what "
                                                  "each rank holds in host memory.")
    assert sniff(tmp_path / "train.log", (tmp_path / "train.log").read_bytes()) == "training_log"


def test_real_torch_211_message() -> None:
    """A real torch 2.11 message: an allocation of 1 PiB is larger than the GPU: a size bug, said so."""
    (e,) = parse_text_log(REAL_TORCH_211).ooms
    assert (e.form, e.gpu, e.tried_bytes, e.reserved_unallocated_bytes) == ("torch>=2.2", 0, 1 << 50, 0)
    assert _approx(e.capacity_bytes, 79.18, GIB) and _approx(e.free_bytes, 74.90, GIB)
    assert e.allocated_bytes == 1024 * MIB
    (f,) = rule_died(_evidence([e]))
    assert verdict([f]).endswith("Fix: find the tensor of 1048576.00 GiB: the one allocation is larger than the whole "
                                 "GPU (79.18 GiB), a shape or size bug rather than memory pressure.")


# --- generated messages, other numbers ------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "form", "frag"), [
    ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity "
     "of 139.80 GiB of which 12.00 MiB is free. Including non-PyTorch memory, this process has 139.78 GiB memory in "
     "use. Of the allocated memory 110.20 GiB is allocated by PyTorch, and 28.10 GiB is reserved by PyTorch but "
     "unallocated.", "torch>=2.2", 28.10 * GIB),
    ("[rank3]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total "
     "capacity of 139.80 GiB of which 12.00 MiB is free. Of the allocated memory 110.20 GiB is allocated by PyTorch, "
     "and 28.10 GiB is reserved by PyTorch but unallocated.", "torch 2.0-2.1", 28.10 * GIB),
    ("[rank3]: RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 3; 139.80 GiB total capacity; "
     "110.20 GiB already allocated; 12.00 MiB free; 138.30 GiB reserved in total by PyTorch)", "torch<=1.13",
     28.10 * GIB),
])
def test_generated_forms_fragmented(tmp_path: Path, line: str, form: str, frag: float) -> None:
    (e,) = parse_text_log(_log(tmp_path, "some output\n" + line + "\n" + line + "\n")).ooms  # printed twice: once
    assert (e.form, e.rank, e.gpu, e.tried_bytes) == (form, 3, 3, 20 * MIB)
    assert abs(e.reserved_unallocated_bytes - frag) < 0.01 * GIB
    (f,) = rule_died(_evidence([e]))
    assert f.recommendation.startswith("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; 28.10 GiB (20% of the "
                                       "GPU) is reserved")


def test_cuda_oom_rank_from_torchrun_block(tmp_path: Path) -> None:
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 6 has a total capacity of "
           "79.15 GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process has 78.10 GiB memory in "
           "use. Of the allocated memory 76.00 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but "
           "unallocated.\n"
           "Failures:\n  <NO_OTHER_FAILURES>\nRoot Cause (first observed failure):\n[0]:\n"
           "  time      : 2026-11-27_10:00:00\n  host      : node-a\n  rank      : 6 (local_rank: 6)\n"
           "  exitcode  : 1 (pid: 999)\n  error_file: <N/A>\n"
           "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
           "============================================================\n")
    (e,) = parse_text_log(_log(tmp_path, log)).ooms
    assert (e.rank, e.gpu) == (6, 6)
    (f,) = rule_died(_evidence([e]))
    assert verdict([f]) == ("Run died: CUDA out of memory on rank 6 (GPU 6): tried to allocate 2.00 GiB with 1.00 GiB "
                            "free of 79.15 GiB. Fix: activation checkpointing, a smaller micro-batch or sharding.")


def test_hostile_numbers_and_host(tmp_path: Path) -> None:
    """A size beyond 1 EiB is dropped, a host name keeps only [A-Za-z0-9._-]."""
    log = ("CUDA out of memory. Tried to allocate 999999999999999 TiB (GPU 1; 80.00 GiB total capacity; 1.00 GiB "
           "already allocated; 0 bytes free; 2.00 GiB reserved in total by PyTorch)\n"
           "Failures:\n[1]:\n  host      : <script>x</script>\n  rank      : 1 (local_rank: 1)\n"
           "  exitcode  : -9 (pid: 12)\n  traceback : Signal 9 (SIGKILL) received by PID 12\n====\n")
    cuda, kill = parse_text_log(_log(tmp_path, log)).ooms
    assert cuda.tried_bytes is None and cuda.free_bytes == 0 and cuda.reserved_unallocated_bytes == GIB
    assert kill.host == "scriptxscript" and kill.rank == 1


# --- the 70B case: 8 local ranks SIGKILLed while the checkpoint loads -------------------------------------------------


def torchtune_70b_log(n: int = 8, host: str = "gpu-b-02", offload: bool = True) -> str:
    """A torchtune-style log of a 70B full fine-tune whose ``n`` local ranks are killed while the checkpoint loads."""
    head = ("W1127 10:02:11.000000 5521 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable "
            "for each process to be 1 in default\n"
            "MemTotal:       750000000 kB\n"
            "INFO:torchtune.utils._logging:Running FullFinetuneRecipeDistributed with resolved config:\n\n"
            "batch_size: 2\ncheckpointer:\n  _component_: torchtune.training.FullModelHFCheckpointer\n"
            "  checkpoint_dir: /models/Meta-Llama-3.1-70B-Instruct/\ndevice: cuda\ndtype: bf16\n"
            f"fsdp_cpu_offload: {'true' if offload else 'false'}\ngradient_accumulation_steps: 8\n"
            "model:\n  _component_: torchtune.models.llama3_1.llama3_1_70b\n"
            "optimizer:\n  _component_: torch.optim.AdamW\n  lr: 2.0e-05\n\n"
            "INFO:torchtune.utils._logging:Loading checkpoint from /models/Meta-Llama-3.1-70B-Instruct/ ...\n")
    pids = [5530 + r for r in range(n)]
    fail = (f"E1127 10:09:40.100000 5521 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
            f"local_rank: 0 (pid: {pids[0]}) of binary: /usr/bin/python3\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 60 + "\n"
            "recipes/full_finetune_distributed.py FAILED\n" + "-" * 60 + "\nFailures:\n")

    def entry(i: int, r: int) -> str:
        return (f"[{i}]:\n  time      : 2026-11-27_10:09:40\n  host      : {host}\n"
                f"  rank      : {r} (local_rank: {r})\n"
                f"  exitcode  : -9 (pid: {pids[r]})\n  error_file: <N/A>\n"
                f"  traceback : Signal 9 (SIGKILL) received by PID {pids[r]}\n")

    fail += "".join(entry(r, r) for r in range(1, n))
    fail += "-" * 60 + "\nRoot Cause (first observed failure):\n" + entry(0, 0) + "=" * 60 + "\n"
    return head + fail


def test_70b_host_oom_arithmetic(tmp_path: Path) -> None:
    res = parse_text_log(_log(tmp_path, torchtune_70b_log()))
    assert len(res.ooms) == 8 and {o.local_rank for o in res.ooms} == set(range(8))
    assert {o.host for o in res.ooms} == {"gpu-b-02"} and all(o.phase == "checkpoint_load" for o in res.ooms)
    facts = {f.key: f.value for f in res.facts}
    assert (facts["model_name"], facts["precision"], facts["cpu_offload"]) == ("llama3_1_70b", "bf16", "true")
    assert facts["host_ram_bytes"] == str(768 * 10**9)
    (f,) = rule_died(_evidence(res.ooms, res.facts))
    assert (f.kind, f.cause, f.ranks) == ("host_oom", "config", list(range(8)))
    assert f.title == ("8 ranks on gpu-b-02 killed by the kernel (SIGKILL) while the checkpoint loaded: host memory "
                       "(8 × 141 GB bf16 ≈ 1.13 TB > 768 GB)")
    assert ("each rank loads the whole checkpoint: 70.6 B parameters (llama3_1_70b) × 2 bytes (bf16) = 141 GB per "
            "rank; 8 × 141 GB bf16 ≈ 1.13 TB > 768 GB host RAM (train.log:2)") in f.evidence
    offload = next(e for e in f.evidence if e.startswith("CPU offload"))
    assert "12 bytes a parameter" in offload and "≈ 847 GB, plus the bf16 parameter shards (141 GB): 988 GB" in offload
    assert "sync_module_states" in f.recommendation and "cpu_ram_efficient_loading" in f.recommendation
    assert verdict([f]).startswith("Run died: 8 ranks on gpu-b-02 killed by the kernel (SIGKILL) while the checkpoint "
                                   "loaded: host memory (8 × 141 GB bf16 ≈ 1.13 TB > 768 GB). Fix: load the checkpoint "
                                   "once per host")


def test_host_arithmetic_from_param_count_and_unknown_ram(tmp_path: Path) -> None:
    """A parameter count a log states wins over the name; without the host's RAM the sum has no comparison."""
    log = torchtune_70b_log(4, offload=False).replace("MemTotal:       750000000 kB\n",
                                                       "Model llama3 13B size: 13,015,864,320 total parameters\n")
    res = parse_text_log(_log(tmp_path, log))
    (f,) = rule_died(_evidence(res.ooms, res.facts))
    assert f.title.endswith("host memory (4 × 26 GB bf16 ≈ 104 GB)")
    assert not any(e.startswith("CPU offload") for e in f.evidence)


def test_offload_config_keys(tmp_path: Path) -> None:
    p = tmp_path / "accelerate.yaml"
    p.write_text("fsdp_config:\n  fsdp_offload_params: true\n")
    assert [(f.key, f.value) for f in parse_config(p) if f.key == "cpu_offload"] == [("cpu_offload", "true")]
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"zero_optimization": {"offload_optimizer": {"device": "none"}}}))
    assert [(f.key, f.value) for f in parse_config(p) if f.key == "cpu_offload"] == [("cpu_offload", "false")]


# --- a logs-only folder, end to end -----------------------------------------------------------------------------------


def test_logs_only_folder_reports_died_verdict(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(torchtune_70b_log())
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["report", str(run), "-o", str(out / "r.html"), "--json", str(out / "r.json"),
                                   "--md", str(out / "r.md"), "-j", "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "[high] died config/host_oom: 8 ranks on gpu-b-02 killed by the kernel (SIGKILL)" in res.output
    model = json.loads((out / "r.json").read_text())
    assert model["verdict"].startswith("Run died: 8 ranks on gpu-b-02 killed by the kernel (SIGKILL) while the "
                                       "checkpoint loaded: host memory (8 × 141 GB bf16 ≈ 1.13 TB > 768 GB)")
    (run_model,) = model["runs"]
    assert run_model["mode"] == "logs" and len(run_model["deaths"]) == 8
    assert run_model["deaths"][0]["signal"] == "SIGKILL" and run_model["deaths"][0]["host"] == "gpu-b-02"
    assert [f["kind"] for f in model["findings"]] == ["host_oom"] and model["findings"][0]["main"] is True
    # the log states the death: high, whatever the missing trace caps for a slowdown
    assert model["findings"][0]["confidence"] == {"level": "high", "range_pct": None, "why": []}
    assert model["verdict_confidence"]["level"] == "high"
    assert any(w["message"].startswith("no trace found") for w in model["warnings"])
    html = (out / "r.html").read_text()
    assert "Run died: 8 ranks on gpu-b-02 killed by the kernel (SIGKILL)" in html and "no trace found" in html
    assert "No trace found: this run is reported from its logs" in html and ">LOGS<" in html
    assert "<small>the run died</small>" in html and "100.0 %" not in html
    assert "No significant slowdown" not in html
    md = (out / "r.md").read_text()
    assert "config/host_oom, high severity, the run died, ranks 0–7" in md


def test_host_ram_from_env_file_and_local_world_size(tmp_path: Path) -> None:
    """capture's env file states the host's RAM (cpu.mem_bytes) and LOCAL_WORLD_SIZE: the arithmetic uses both; the
    one rank torchrun's block names (local rank 2) is not the host's rank count."""
    env = tmp_path / "env_rank0.json"
    env.write_text(json.dumps({"traceanalyze_capture": 1, "hostname": "gpu-node-07", "env": {"LOCAL_WORLD_SIZE": "8"},
                               "cpu": {"mem_bytes": 2 * 10**12}}))
    facts = parse_env(env)
    assert [(f.key, f.num) for f in facts if f.key == "host_ram_bytes"] == [("host_ram_bytes", 2e12)]
    log = _section(4).split("# Older torchrun")[0]
    ooms = parse_text_log(_log(tmp_path, log)).ooms
    named = [Fact("model_name", "meta-llama/Llama-2-13b-hf", None, "cfg.yaml:1"),
             Fact("precision", "fp32", None, "cfg.yaml:2")]
    (f,) = rule_died(_evidence(ooms, [*facts, *named]))
    assert "ranks on the host: 8 (LOCAL_WORLD_SIZE, env_rank0.json)" in f.evidence
    assert f.title == ("rank 10 on gpu-node-07 killed (SIGKILL) while the checkpoint loaded: host memory "
                       "(8 × 52 GB fp32 ≈ 417 GB ≤ 2.00 TB)")
    (g,) = rule_died(_evidence(ooms, named))
    assert "ranks on the host: 3 (at least: local rank 2 was killed)" in g.evidence


def test_capture_records_host_memory() -> None:
    mem = cpu_facts()["mem_bytes"]
    assert mem is None or mem > 1 << 28  # sysconf's physical pages × page size where it has them (Linux: always)


def test_kills_after_a_cuda_oom_are_its_evidence(tmp_path: Path) -> None:
    """torchrun stops the other ranks after one fails (SIGTERM, then SIGKILL): without the kernel's line or a
    checkpoint load, those kills are part of the CUDA OOM; a kill the kernel names is a death of its own."""
    oom = ("[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU {r} has a total "
           "capacity of 94.99 GiB of which 3.00 GiB is free. Including non-PyTorch memory, this process has 91.90 GiB "
           "memory in use. Of the allocated memory 90.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by "
           "PyTorch but unallocated.\n")
    kills = "".join(f"E1127 api.py:869] failed (exitcode: -9) local_rank: {r} (pid: {100 + r}) of binary: python\n"
                    for r in (4, 5))
    res = parse_text_log(_log(tmp_path, "".join(oom.format(r=r) for r in range(4)) + kills))
    (f,) = rule_died(_evidence(res.ooms))
    assert f.kind == "cuda_oom" and f.ranks == [0, 1, 2, 3]
    assert f.title == "CUDA out of memory on ranks 0–3: tried to allocate 4.00 GiB with 3.00 GiB free of 94.99 GiB"
    assert f.evidence[-1].startswith("then 2 process(es) killed (SIGKILL) with no kernel OOM-killer line")
    dmesg = parse_text_log(_log(tmp_path, "Out of memory: Killed process 105 (python) anon-rss:900000000kB\n",
                                "dmesg.txt")).ooms
    cuda, host = rule_died(_evidence([*res.ooms, *dmesg]))
    assert host.kind == "host_oom" and host.title == "local rank 5 killed by the kernel (SIGKILL): host memory"
    assert verdict([cuda, host]).endswith("Also: local rank 5 killed by the kernel (SIGKILL): host memory.")


def test_kills_on_several_hosts(tmp_path: Path) -> None:
    """Each node's torchrun log: the title names the host with the most kills and counts the others."""
    a = parse_text_log(_log(tmp_path, torchtune_70b_log(8, "gpu-b-02"), "node0.log")).ooms
    b = parse_text_log(_log(tmp_path, torchtune_70b_log(2, "gpu-b-03"), "node1.log")).ooms
    (f,) = rule_died(_evidence([*a, *b]))
    assert f.title == ("8 ranks on gpu-b-02 (and 2 more on 1 other host) killed (SIGKILL) while the checkpoint "
                       "loaded: host memory")
