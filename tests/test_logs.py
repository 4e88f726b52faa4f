"""Tests for traceanalyze.logs: training logs, NCCL debug output, nvidia-smi topology and configs.

Fixtures under tests/fixtures/logs/ are short excerpts in the formats of the real logs in ../shared/logs
(formats/, configs/) and five folders reproducing the reported cases (cases/<case>/). Tests marked with the
shared logs read those real excerpts directly and skip when ../shared is absent.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from tests.conftest import shared
from traceanalyze import discover, hardware, logs, names
from traceanalyze.errors import InputError
from traceanalyze.logs import configs

FIX = Path(__file__).parent / "fixtures" / "logs"
FORMATS = FIX / "formats"
CONFIGS = FIX / "configs"
CASES = FIX / "cases"
SHARED_LOGS = Path(__file__).resolve().parents[2] / "shared" / "logs"
needs_toml = pytest.mark.skipif(configs.tomllib is None, reason="Python < 3.11 without tomli: TOML unsupported")


def _facts(items) -> dict[str, str]:
    """key -> value of the first fact per key (a LogResult or a list of facts)."""
    out: dict[str, str] = {}
    for f in getattr(items, "facts", items):
        out.setdefault(f.key, f.value)
    return out


def _sniff(path: Path) -> str | None:
    return discover.sniff(path, path.read_bytes()[: 64 << 10])


def _shared_sections(name: str, tmp_path: Path) -> list[Path]:
    """Each '# SOURCE' block of a shared excerpt file as its own file (one log per file, as in a run)."""
    src = SHARED_LOGS / name
    if not src.is_file():
        shared(f"logs/{name}")
    parts = re.split(r"^# SOURCE.*\n", src.read_text(), flags=re.M)[1:]
    out = []
    for i, part in enumerate(parts, 1):
        p = tmp_path / f"{Path(name).stem}_{i}.txt"
        p.write_text(part)
        out.append(p)
    return out


# ---------------------------------------------------------------------------------------------------------
# sniff
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "kind"),
    [
        ("formats/torchtune_lora_single_device.log", "training_log"),
        ("formats/titan_rank3.log", "training_log"),
        ("formats/titan_color.log", "training_log"),
        ("formats/litgpt_lora_current.txt", "training_log"),
        ("formats/litgpt_pretrain_old.txt", "training_log"),
        ("formats/nanogpt_train.log", "training_log"),
        ("formats/hf_trainer.log", "training_log"),
        ("formats/trainer_log.jsonl", "training_log"),
        ("formats/trainer_state.json", "training_log"),
        ("formats/compile_recompiles.log", "training_log"),
        ("formats/nccl_debug_ib.txt", "nccl_debug"),
        ("formats/topo_dgx_a100.txt", "topology"),
        ("configs/torchtune_lora_single_device.yaml", "config"),
        ("configs/llamafactory_llama3_lora_sft.yaml", "config"),
        ("configs/torchtitan_llama3_8b_old.toml", "config"),
        ("configs/torchtitan_llama3_8b_fp8.toml", "config"),
        ("configs/hf_training_args.json", "config"),
        ("configs/litgpt_hyperparameters.yaml", "config"),
        ("configs/docker-compose.yml", None),
        ("configs/kineto_small.json", None),
        # a torchrun log mixing NCCL INFO lines into a training log is a training log
        ("cases/slow_interconnect_8gpu/multi_8gpu/train.log", "training_log"),
        ("cases/pcie_4x3090/four_gpu/nccl_debug.log", "nccl_debug"),
        ("cases/pcie_4x3090/topo.txt", "topology"),
    ],
)
def test_sniff_fixtures(rel: str, kind: str | None) -> None:
    assert _sniff(FIX / rel) == kind


def test_sniff_inline_cases(tmp_path: Path) -> None:
    assert discover.sniff(Path("run/train.py"), b"gradient_accumulation_steps = 5 * 8\nbatch_size = 12\n") is None
    assert discover.sniff(Path("weird.log"), b"\x00\x01\x02binary") is None
    assert discover.sniff(Path("notes.txt"), b"nothing to see here\n") is None
    assert discover.sniff(Path("trace.json"), b'{"traceEvents": [], "batch_size": 1, "dtype": "bf16"}') is None
    assert discover.sniff(Path("et.json"), b'{"schema": "1.1.1-chakra.0.0.4", "nodes": [], "dtype": 1}') is None
    assert discover.sniff(Path("a.json"), b'{"foo": 1}') is None
    head = b"{'loss': 1.7319, 'grad_norm': 0.54, 'learning_rate': 2.7e-05, 'epoch': 1.42}\n"
    assert discover.sniff(Path("stdout"), head) == "training_log"
    # a gzipped head (callers normally gunzip; the raw bytes are accepted too)
    raw = (FORMATS / "torchtune_lora_single_device.log").read_bytes()
    assert discover.sniff(Path("train.log.gz"), gzip.compress(raw)) == "training_log"
    assert discover.sniff(Path("train.log.gz"), raw) == "training_log"


# ---------------------------------------------------------------------------------------------------------
# Text logs, one format each
# ---------------------------------------------------------------------------------------------------------


def test_torchtune_steps_and_resolved_config() -> None:
    r = logs.parse_text_log(FORMATS / "torchtune_lora_single_device.log")
    assert r.framework == "torchtune"
    assert r.rank is None
    assert [s.step for s in r.steps] == [1, 2, 3]
    s1 = r.steps[0]
    assert s1.loss == pytest.approx(1.6394591331481934)
    assert s1.lr == pytest.approx(2.9999999999999997e-06)
    assert s1.tokens_per_s == pytest.approx(812.4)
    assert s1.memory_gib == pytest.approx(10.5)  # peak_memory_reserved
    assert s1.grad_norm == pytest.approx(1.2031)
    assert r.steps[2].tokens_per_s == pytest.approx(3988.25)
    f = _facts(r)
    # from the YAML block torchtune prints after "with resolved config:"
    assert f["per_device_batch"] == "4"
    assert f["gradient_accumulation_steps"] == "2"
    assert f["seq_len"] == "2048"
    assert f["learning_rate"] == "0.0003"
    assert f["precision"] == "bf16"
    assert f["compile"] == "true"
    assert f["model_name"] == "lora_llama3_2_3b"
    assert r.fact("gradient_accumulation_steps").source == "torchtune_lora_single_device.log:14"
    assert r.fact("framework").value == "torchtune"
    assert r.nccl is None
    assert r.warnings == []


def test_torchtune_step_time_key(tmp_path: Path) -> None:
    p = tmp_path / "log_1723844072.txt"
    p.write_text("Step 7 | loss:0.5 lr:1e-05 step_time_ms:812.5 gpu_resources:13708965376 \n")
    (s,) = logs.parse_text_log(p).steps
    assert s.step == 7
    assert s.step_time_ms == 812.5
    assert s.memory_gib == pytest.approx(13708965376 / 2**30)


def test_torchtitan_old_format_rank_from_file_name() -> None:
    r = logs.parse_text_log(FORMATS / "titan_rank3.log")
    assert r.framework == "torchtitan"
    assert r.rank == 3
    assert [(s.rank, s.step, s.tokens_per_s, s.mfu_pct, s.memory_gib) for s in r.steps] == [
        (3, 1, 1228.0, 0.02, 9.53),
        (3, 2, 27306.0, 0.41, 9.54),
        (3, 10, 27299.0, 0.41, 9.54),
    ]
    assert r.steps[0].loss == pytest.approx(10.9746)
    assert r.steps[0].tflops is None
    f = _facts(r)
    assert f["world_size"] == "4"  # 2-D mesh [2, 2]
    assert f["data_parallel_size"] == "2"  # the 'dp' dimension
    assert f["model_name"] == "llama2 debugmodel"
    assert f["per_device_batch"] == "8"
    assert f["global_batch"] == "16"
    assert f["seq_len"] == "2048"
    assert f["total_optimization_steps"] == "10"
    assert f["first_step_s"] == "2"  # 17:50:04,500 -> 17:50:06,500
    assert "compile_time_s" not in f  # compile was not on


def test_torchtitan_ansi_codes_and_rank_prefix() -> None:
    r = logs.parse_text_log(FORMATS / "titan_color.log")
    assert r.rank == 0
    assert [(s.step, s.loss, s.grad_norm, s.tokens_per_s, s.tflops, s.mfu_pct) for s in r.steps] == [
        (14, 3.24405, 0.8319, 7282.0, 0.52, 0.17),
        (15, 3.1068, 0.8587, 7334.0, 0.53, 0.17),
    ]
    assert r.fact("first_step_s").num == pytest.approx(16.337)


def test_litgpt_current_format_derives_gas() -> None:
    r = logs.parse_text_log(FORMATS / "litgpt_lora_current.txt")
    assert r.framework == "litgpt"
    assert [(s.iter, s.step) for s in r.steps] == [(i, (i) // 4) for i in range(1, 9)]
    assert r.steps[0].step_time_ms == pytest.approx(391.45)
    assert r.steps[-1].loss == pytest.approx(1.792)
    assert r.steps[-1].epoch == 1.0
    f = _facts(r)
    assert f["gradient_accumulation_steps"] == "4"  # (8 - 4) iters per (2 - 1) step
    assert f["trainable_params"] == "4194304"


def test_litgpt_old_format_rank_prefix() -> None:
    r = logs.parse_text_log(FORMATS / "litgpt_pretrain_old.txt")
    assert r.rank == 0
    assert len(r.steps) == 6  # the "val loss" line is not a step
    assert (r.steps[1].iter, r.steps[1].step, r.steps[1].loss, r.steps[1].step_time_ms) == (2, 1, 10.9508, 765.52)
    assert all(s.rank == 0 for s in r.steps)
    assert r.fact("gradient_accumulation_steps").value == "2"


def test_nanogpt() -> None:
    r = logs.parse_text_log(FORMATS / "nanogpt_train.log")
    assert r.framework == "nanogpt"
    assert [(s.iter, s.loss, s.step_time_ms, s.mfu_pct) for s in r.steps] == [
        (0, 10.9854, 41210.35, None),  # mfu -100% means "not measured yet"
        (10, 9.5628, 2601.72, 34.97),
        (20, 8.9021, 2598.4, 35.01),
    ]


def test_hf_trainer_banner_dicts_tqdm_and_eval_banner() -> None:
    r = logs.parse_text_log(FORMATS / "hf_trainer.log")
    assert r.framework == "hf_trainer"
    f = _facts(r)
    assert f["num_examples"] == "12800"
    assert r.fact_values("num_examples") == ["12800"]  # the eval banner's "Num examples = 640" is not kept
    assert f["per_device_batch"] == "4"
    assert f["global_batch"] == "64"
    assert f["gradient_accumulation_steps"] == "4"
    assert f["world_size"] == "4"  # 64 / (4 × 4)
    assert f["total_optimization_steps"] == "200"
    assert f["trainable_params"] == "1235814400"
    assert f["train_runtime_s"] == "640.5"
    assert r.fact("global_batch").source == "hf_trainer.log:5"
    # three {'loss': ...} dicts; tqdm redraws (\r) and the eval dict do not count
    assert [s.step for s in r.steps] == [1, 2, 3]
    assert [s.loss for s in r.steps] == [2.3105, 1.9562, 1.8043]
    assert r.steps[0].lr == 1.9e-05
    assert r.steps[0].epoch == 0.05
    # the second dict holds tensor(...) (not a literal): numeric pairs are still read
    assert r.steps[1].grad_norm == 2.4375
    assert r.steps[1].tokens_per_s == 10542.5
    assert r.steps[1].memory_gib == 20.0


def test_llamafactory_jsonl() -> None:
    r = logs.parse_text_log(FORMATS / "trainer_log.jsonl")  # dispatches to parse_llamafactory_jsonl
    assert r.framework == "llamafactory"
    assert [(s.step, s.loss, s.lr, s.epoch) for s in r.steps] == [
        (10, 1.9112, 4.9e-05, 0.08),
        (20, 1.652, 4.6e-05, 0.17),
        (120, 1.2004, 0.0, 1.0),
    ]
    # elapsed 0:00:50 over 10 steps; then (92 - 50) s over 10 steps; then "1 day, 0:08:32" over 100 steps
    assert [s.step_time_ms for s in r.steps] == pytest.approx([5000.0, 4200.0, (86912 - 92) / 100 * 1000])
    assert r.fact("total_optimization_steps").value == "120"
    assert r.warnings == ["trainer_log.jsonl: 1 line(s) are not trainer_log JSON objects; skipped"]


def test_hf_trainer_state_json() -> None:
    r = logs.parse_text_log(FORMATS / "trainer_state.json")
    assert r.framework == "hf_trainer"
    assert [(s.step, s.loss, s.grad_norm) for s in r.steps] == [
        (10, 2.1043, 2.03125),
        (20, 1.7712, 1.4453125),
        (30, 1.6235, 1.21875),
    ]
    f = _facts(r)
    assert (f["per_device_batch"], f["total_optimization_steps"], f["train_runtime_s"]) == ("8", "30", "301.25")


def test_compile_recompiles_and_inductor_time() -> None:
    r = logs.parse_text_log(FORMATS / "compile_recompiles.log")
    f = _facts(r)
    assert f["recompiles"] == "3"
    assert r.fact("compile_time_s").num == pytest.approx(21.482 + 9.518 + 7.934 + 6.066)
    assert r.fact("compile_time_s").source == "compile_recompiles.log:2"


def test_recompile_limit_counts_as_recompiles_per_rank(tmp_path: Path) -> None:
    p = tmp_path / "torchrun.log"
    p.write_text(
        "[rank0]:W1121 23:19:30.000000 4632 torch/_dynamo/convert_frame.py:906] [0/8] "
        "torch._dynamo hit config.cache_size_limit (8)\n"
        "[rank1]:V1121 23:18:47.123000 4633 torch/_dynamo/guards.py:2791] [0/1] [__recompiles] "
        "Recompiling function forward in /work/model.py:40\n"
        "[rank1]:V1121 23:18:49.123000 4633 torch/_dynamo/guards.py:2791] [0/2] [__recompiles] "
        "Recompiling function forward in /work/model.py:40\n"
    )
    r = logs.parse_text_log(p)
    assert r.rank is None  # two ranks in one file
    assert r.fact("recompiles").value == "8"  # worst rank: rank 0 hit the limit of 8


def test_nccl_debug_output() -> None:
    r = logs.parse_text_log(FORMATS / "nccl_debug_ib.txt")
    assert r.framework is None
    assert r.steps == []
    n = r.nccl
    assert n is not None
    assert n.version == "2.21.5"
    assert r.fact("nccl_version").value == "2.21.5"
    assert n.networks == ["IB"]
    assert n.env == {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0,mlx5_1"}
    assert n.nranks == 4
    assert len(n.channels) == 7  # one repeated line is kept once; ring/tree lines are not channels
    assert n.transports() == {"NET": 4, "P2P": 3}
    first = n.channels[0]
    assert first == logs.NcclChannel("node-a", 21001, 0, 0, 3, 0, "receive", "NET", "NET/IB/0/GDRDMA")
    assert n.channels[1].detail == "P2P/CUMEM/read"
    assert n.channels[1].direction is None
    old = n.channels[-1]  # NCCL 2.9 form "Channel 05 : 8[101c0] -> 9[101d0]"
    assert (old.channel, old.src_rank, old.dst_rank, old.detail) == (5, 8, 9, "P2P/IPC/read")


def test_unreadable_files_raise_input_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.log"
    with pytest.raises(InputError, match="nope.log"):
        logs.parse_text_log(missing)
    with pytest.raises(InputError, match="is a folder"):
        logs.parse_text_log(tmp_path)
    with pytest.raises(InputError):
        logs.parse_topology(missing)
    with pytest.raises(InputError):
        logs.parse_config(tmp_path / "missing.yaml")
    with pytest.raises(InputError):
        logs.parse_llamafactory_jsonl(missing)


def test_odd_content_never_raises(tmp_path: Path) -> None:
    p = tmp_path / "garbage.log"
    p.write_bytes(
        b"\xff\xfe\x00garbage\nStep x | loss:abc\n{'loss': [1, 2}\n"
        b"[titan] 2026-99-99 99:99:99,000 - root - INFO - step: 1  loss: nan  memory: 1GiB(1%)  tps: 5\n"
        b"iter 1 step 0: loss abc\n\x1b[31m\r\r\n"
    )
    r = logs.parse_text_log(p)
    # the titan line without a parseable date still gives its numbers
    assert [(s.step, s.tokens_per_s) for s in r.steps] == [(1, 5.0)]
    assert r.steps[0].loss != r.steps[0].loss  # nan
    t = logs.parse_topology(p)
    assert t.links == []
    assert t.warnings == ["garbage.log: no nvidia-smi topo -m matrix found"]


def test_gzipped_log_and_truncated_gzip(tmp_path: Path) -> None:
    raw = (FORMATS / "titan_rank3.log").read_bytes()
    gz = tmp_path / "titan_rank3.log.gz"
    gz.write_bytes(gzip.compress(raw))
    r = logs.parse_text_log(gz)
    assert r.rank == 3
    assert [s.tokens_per_s for s in r.steps] == [1228.0, 27306.0, 27299.0]
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress(raw * 50)[:300])
    r2 = logs.parse_text_log(cut)
    assert r2.warnings and "stopped reading" in r2.warnings[0]


# ---------------------------------------------------------------------------------------------------------
# Topology
# ---------------------------------------------------------------------------------------------------------


def test_topology_dgx_space_aligned_with_nics() -> None:
    t = logs.parse_topology(FORMATS / "topo_dgx_a100.txt")
    assert t.devices == [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(4)]
    assert t.gpus == [f"GPU{i}" for i in range(8)]
    assert len(t.links) == 12 * 11  # every ordered pair of distinct devices
    assert t.link_between(0, 7) == "NV12"
    assert t.link_between(3, 3) is None
    assert t.link_between(0, 8) is None
    assert t.link("GPU0", "NIC0") == "PXB"
    assert t.link("NIC0", "GPU0") == "PXB"
    assert t.link("GPU2", "NIC0") == "NODE"
    assert t.link("GPU5", "NIC0") == "SYS"
    assert t.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}
    assert t.cpu_affinity["GPU0"] == "48-63,176-191"
    assert t.numa_affinity == {**{f"GPU{i}": "3" for i in range(4)}, **{f"GPU{i}": "1" for i in range(4, 8)}}
    assert t.gpu_numa_id["GPU7"] == "N/A"
    assert "NIC0" not in t.cpu_affinity


def test_link_legend_and_expected_bandwidth() -> None:
    assert set(hardware.LINK_DESCRIPTIONS) >= {"X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS"}
    assert "NUMA nodes" in hardware.LINK_DESCRIPTIONS["SYS"]
    assert hardware.EXPECTED_LINK_GBPS["PIX"] == 24.0
    assert hardware.PCIE_X16_GBPS == {3: 12.0, 4: 24.0, 5: 48.0}
    assert hardware.expected_link_gbps("NV12") == 300.0  # A100: 12 links × 25 GB/s per direction
    assert hardware.expected_link_gbps("NV18") == 450.0  # H100 SXM: 900 GB/s both directions
    assert hardware.expected_link_gbps("PIX", pcie_gen=3) == 12.0
    assert hardware.expected_link_gbps("PXB", pcie_gen=5) == 48.0
    assert hardware.expected_link_gbps("NODE") == 12.0
    assert hardware.expected_link_gbps("SYS", pcie_gen=5) == 6.0
    assert hardware.expected_link_gbps("X") is None
    with pytest.raises(ValueError):
        hardware.expected_link_gbps("PIX", pcie_gen=2)


# ---------------------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------------------


def test_config_torchtune_yaml() -> None:
    facts = logs.parse_config(CONFIGS / "torchtune_lora_single_device.yaml")
    assert _facts(facts) == {
        "per_device_batch": "2",
        "gradient_accumulation_steps": "8",
        "learning_rate": "0.0003",  # "3e-4" is a YAML string; read as a number
        "precision": "bf16",
        "compile": "false",
        "model_name": "lora_llama3_1_8b",
    }
    src = {f.key: f.source for f in facts}
    assert src["gradient_accumulation_steps"] == "torchtune_lora_single_device.yaml:32"
    assert src["learning_rate"] == "torchtune_lora_single_device.yaml:28"


def test_config_llamafactory_yaml() -> None:
    assert _facts(logs.parse_config(CONFIGS / "llamafactory_llama3_lora_sft.yaml")) == {
        "per_device_batch": "1",
        "gradient_accumulation_steps": "8",
        "seq_len": "2048",
        "learning_rate": "0.0001",
        "precision": "bf16",
        "model_name": "meta-llama/Meta-Llama-3-8B-Instruct",
    }


@needs_toml
def test_config_torchtitan_old_toml() -> None:
    assert _facts(logs.parse_config(CONFIGS / "torchtitan_llama3_8b_old.toml")) == {
        "per_device_batch": "1",
        "seq_len": "8192",
        "learning_rate": "0.0003",
        "compile": "true",  # [training] compile = true
        "model_name": "llama3 8B",
        "total_optimization_steps": "1000",
    }


@needs_toml
def test_config_torchtitan_fp8_toml_derives_gas() -> None:
    f = _facts(logs.parse_config(CONFIGS / "torchtitan_llama3_8b_fp8.toml"))
    assert f["precision"] == "fp8"  # converters = ["float8"] wins over mixed_precision_param
    assert f["compile"] == "false"  # [compile] enable = false
    assert f["data_parallel_size"] == "16"  # replicate 2 × shard 8
    assert f["global_batch"] == "64"
    assert f["per_device_batch"] == "2"
    assert f["gradient_accumulation_steps"] == "2"  # 64 / (2 × 16)


def test_config_hf_training_args_json() -> None:
    assert _facts(logs.parse_config(CONFIGS / "hf_training_args.json")) == {
        "per_device_batch": "16",
        "gradient_accumulation_steps": "2",
        "learning_rate": "2e-05",
        "precision": "tf32",  # bf16 and fp16 false, tf32 true
        "compile": "true",
        "world_size": "4",
        "n_gpu": "1",
    }


def test_config_litgpt_hyperparameters_derives_gas() -> None:
    f = _facts(logs.parse_config(CONFIGS / "litgpt_hyperparameters.yaml"))
    assert f["precision"] == "bf16"  # bf16-true
    assert f["world_size"] == "2"  # devices × num_nodes
    assert f["global_batch"] == "16"
    assert f["per_device_batch"] == "1"
    assert f["gradient_accumulation_steps"] == "8"  # 16 / (1 × 2), as litgpt derives it from devices
    assert f["seq_len"] == "512"
    assert f["learning_rate"] == "0.0002"
    assert f["model_name"] == "meta-llama/Llama-2-7b-hf"


def test_config_odd_content_gives_no_facts(tmp_path: Path) -> None:
    assert logs.parse_config(CONFIGS / "broken.yaml") == []
    assert logs.parse_config(CONFIGS / "docker-compose.yml") == []
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    assert logs.parse_config(lst) == []
    if configs.tomllib is not None:
        bad = tmp_path / "bad.toml"
        bad.write_text("[training\nbatch_size = \n")
        assert logs.parse_config(bad) == []
    hf = tmp_path / "args.json"
    hf.write_text('{"per_device_train_batch_size": 8, "bf16": false, "fp16": false}')
    assert _facts(logs.parse_config(hf)) == {"per_device_batch": "8", "precision": "fp32"}


def test_toml_without_a_toml_reader_is_a_clear_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(configs, "tomllib", None)
    with pytest.raises(InputError, match=r"torchtitan_llama3_8b_old\.toml: TOML configs need Python 3\.11\+"):
        logs.parse_config(CONFIGS / "torchtitan_llama3_8b_old.toml")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("torch.bfloat16", "bf16"),
        ("bf16-true", "bf16"),
        ("bfloat16", "bf16"),
        ("16-mixed", "fp16"),
        ("float16", "fp16"),
        ("fp32", "fp32"),
        ("torch.float32", "fp32"),
        ("32-true", "fp32"),
        ("tf32", "tf32"),
        ("float8_e4m3fn", "fp8"),
        ("int8", None),
        (True, None),
        (None, None),
    ],
)
def test_normalize_precision(value, expected) -> None:
    assert logs.normalize_precision(value) == expected


@pytest.mark.parametrize(
    ("name", "rank"),
    [("rank3.log", 3), ("train_rank-12.txt", 12), ("rank_0.out", 0), ("RANK7.log", 7), ("frank2.log", None)],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert names.rank_from_name(name) == rank


# ---------------------------------------------------------------------------------------------------------
# The five reported cases
# ---------------------------------------------------------------------------------------------------------


def test_case_slow_interconnect_8gpu() -> None:
    """LoRA fine-tune: ~100 ms/iter on one A10G, ~30 s/iter on 8 GPUs; NCCL went over NET/Socket."""
    case = CASES / "slow_interconnect_8gpu"
    one = logs.parse_text_log(case / "single_a10g" / "train.log")
    eight = logs.parse_text_log(case / "multi_8gpu" / "train.log")
    assert one.nccl is None
    assert [s.tokens_per_s for s in one.steps] == [9876.4, 10240.5, 10251.9]
    assert [s.tokens_per_s for s in eight.steps] == [33.87, 34.13, 34.09]
    # same job: per-device batch 2 × GAS 8 × 512 tokens = 8192 tokens per step
    for r in (one, eight):
        f = _facts(r)
        assert (f["per_device_batch"], f["gradient_accumulation_steps"], f["seq_len"]) == ("2", "8", "512")
        assert f["precision"] == "bf16"
    # 8192 tokens per step at 10,240 tok/s = 0.8 s per step = 100 ms per iteration (GAS 8)
    assert 8192 / one.steps[1].tokens_per_s / 8 == pytest.approx(0.1, rel=1e-3)
    assert 8192 / eight.steps[1].tokens_per_s / 8 == pytest.approx(30.0, rel=0.01)
    n = eight.nccl
    assert n is not None
    assert n.version == "2.21.5"
    assert n.nranks == 8
    assert n.networks == ["Socket"]
    assert n.env == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    assert n.transports() == {"NET": 32}  # 8 ranks × 2 channels × (send + receive)
    assert {c.detail for c in n.channels} == {"NET/Socket/0"}
    assert {c.host for c in n.channels} == {"ip-172-31-5-12"}  # one host, yet NET between ranks
    c = n.channels[0]
    assert (c.src_rank, c.dst_rank, c.direction, c.transport) == (7, 0, "receive", "NET")


def test_case_pcie_4x3090() -> None:
    """4 × RTX 3090 on PCIe: 2,434 tokens/s on one GPU vs 576 per GPU on four; NCCL over SHM."""
    case = CASES / "pcie_4x3090"
    topo = logs.parse_topology(case / "topo.txt")
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.link_between(0, 1) == "PIX"
    assert topo.link_between(0, 2) == "NODE"
    assert topo.link_between(2, 3) == "PIX"
    assert topo.link_between(1, 3) == "NODE"
    assert topo.numa_affinity == {f"GPU{i}": "0" for i in range(4)}
    assert hardware.expected_link_gbps(topo.link_between(0, 2)) == 12.0
    one = logs.parse_text_log(case / "single_gpu" / "train.log")
    four = logs.parse_text_log(case / "four_gpu" / "train.log")
    assert one.steps[1].tokens_per_s == 2434.2
    assert four.steps[1].tokens_per_s == 576.3
    assert _facts(one)["per_device_batch"] == _facts(four)["per_device_batch"] == "4"
    nccl = logs.parse_text_log(case / "four_gpu" / "nccl_debug.log")
    assert nccl.framework is None
    assert nccl.nccl.version == "2.20.5"
    assert nccl.nccl.transports() == {"SHM": 8}
    assert {c.detail for c in nccl.nccl.channels} == {"SHM/direct/direct"}
    assert sorted({(c.src_rank, c.dst_rank) for c in nccl.nccl.channels}) == [(0, 1), (1, 2), (2, 3), (3, 0)]


@needs_toml
def test_case_compile_idle_16gpu() -> None:
    """70B on 2 nodes × 8 H100: a 75-minute compile before step 1, and one rank (11) nearly idle."""
    case = CASES / "compile_idle_16gpu"
    cfg = _facts(logs.parse_config(case / "llama3_70b.toml"))
    assert cfg == {
        "per_device_batch": "1",
        "seq_len": "8192",
        "learning_rate": "0.00015",
        "precision": "bf16",
        "compile": "true",
        "model_name": "llama3 70B",
        "data_parallel_size": "16",
        "total_optimization_steps": "1000",
    }
    node0 = logs.parse_text_log(case / "node0" / "train.log")
    node1 = logs.parse_text_log(case / "node1" / "train.log")
    for r, ranks in ((node0, range(0, 8)), (node1, range(8, 16))):
        assert r.framework == "torchtitan"
        assert r.rank is None  # eight ranks per file
        assert {s.rank for s in r.steps} == set(ranks)
        f = _facts(r)
        assert f["world_size"] == "16"
        assert f["compile"] == "true"
        assert f["global_batch"] == "16"
        assert f["model_name"] == "llama3 70B"
        # step 1 came 4,509.6 s after "Training starts"; steady steps take 9.6 s
        assert r.fact("first_step_s").num == pytest.approx(4509.6)
        assert r.fact("compile_time_s").num == pytest.approx(4500.0)  # 75 minutes
        assert r.fact("compile_time_s").num / 60 == pytest.approx(75.0)
        first = [s for s in r.steps if s.step == 1]
        assert {s.tokens_per_s for s in first} == {2.0}
    step20 = {s.rank: s for s in node0.steps + node1.steps if s.step == 20}
    assert len(step20) == 16
    idle = min(step20.values(), key=lambda s: s.mfu_pct)
    assert (idle.rank, idle.mfu_pct, idle.tokens_per_s, idle.tflops) == (11, 0.41, 9.0, 4.05)
    assert {s.mfu_pct for r, s in step20.items() if r != 11} == {38.86}


def test_case_fp32_vs_bf16() -> None:
    """Single GPU run in fp32 vs the multi-GPU run in bf16: config and log say so."""
    case = CASES / "fp32_vs_bf16"
    single_cfg = _facts(logs.parse_config(case / "single_gpu" / "config.yaml"))
    multi_cfg = _facts(logs.parse_config(case / "multi_gpu" / "config.yaml"))
    assert single_cfg["precision"] == "fp32"
    assert multi_cfg["precision"] == "bf16"
    assert {k: v for k, v in single_cfg.items() if k != "precision"} == {
        k: v for k, v in multi_cfg.items() if k != "precision"
    }
    single = logs.parse_text_log(case / "single_gpu" / "train.log")
    multi = logs.parse_text_log(case / "multi_gpu" / "train.log")
    assert single.fact("precision").value == "fp32"
    assert single.fact("precision").source == "train.log:1"
    assert multi.fact("precision").value == "bf16"
    assert single.steps[1].tokens_per_s == 1522.91
    assert multi.steps[1].tokens_per_s == 6188.02


def test_case_grad_accum_8cards() -> None:
    """GAS 8 kept when moving from 1 to 8 cards: global batch 8× larger, loss 0.35 vs 0.0009."""
    case = CASES / "grad_accum_8cards"
    one = logs.parse_text_log(case / "one_card" / "train.log")
    eight = logs.parse_text_log(case / "eight_cards" / "train.log")
    f1, f8 = _facts(one), _facts(eight)
    assert one.framework == eight.framework == "llamafactory"
    assert (f1["per_device_batch"], f1["gradient_accumulation_steps"], f1["world_size"], f1["global_batch"]) == (
        "4",
        "8",
        "1",
        "32",
    )
    assert (f8["per_device_batch"], f8["gradient_accumulation_steps"], f8["world_size"], f8["global_batch"]) == (
        "4",
        "8",
        "8",
        "256",
    )
    assert one.fact("global_batch").num * 8 == eight.fact("global_batch").num
    assert 4 * 8 * 8 == eight.fact("global_batch").num  # per-device batch × accumulation × ranks (DESIGN.md)
    assert (f1["total_optimization_steps"], f8["total_optimization_steps"]) == ("313", "40")
    assert f1["precision"] == f8["precision"] == "bf16"
    assert one.steps[-1].loss == 0.0009
    assert eight.steps[-1].loss == 0.35
    assert len(one.steps) == 6 and len(eight.steps) == 4
    for cfg in ("one_card", "eight_cards"):
        c = _facts(logs.parse_config(case / cfg / "qwen_lora_sft.yaml"))
        assert (c["per_device_batch"], c["gradient_accumulation_steps"]) == ("4", "8")
    jl = logs.parse_text_log(case / "eight_cards" / "trainer_log.jsonl")
    assert [(s.step, s.loss) for s in jl.steps] == [(10, 1.6012), (20, 0.9925), (30, 0.5218), (40, 0.35)]
    assert jl.steps[1].step_time_ms == pytest.approx(15300.0)  # (5:04 - 2:31) over 10 steps


# ---------------------------------------------------------------------------------------------------------
# The real excerpts in ../shared/logs (skipped when ../shared is absent)
# ---------------------------------------------------------------------------------------------------------


def test_shared_torchtune(tmp_path: Path) -> None:
    s1, s2, s3 = (logs.parse_text_log(p) for p in _shared_sections("torchtune.txt", tmp_path))
    assert s1.fact("precision").value == "bf16"
    assert [round(s.tokens_per_s, 3) for s in s1.steps] == [57.829, 405.045, 655.937, 417.498]
    assert [s.step for s in s2.steps] == [0, 1, 2]
    assert s2.steps[0].memory_gib == pytest.approx(13708965376 / 2**30)
    assert (s3.steps[0].step, s3.steps[0].memory_gib, s3.steps[0].lr) == (5, 104.0546875, 1e-06)


def test_shared_torchtitan(tmp_path: Path) -> None:
    s1, s2, s3 = (logs.parse_text_log(p) for p in _shared_sections("torchtitan.txt", tmp_path))
    assert s1.rank == 0
    assert [(s.step, s.tokens_per_s, s.tflops, s.mfu_pct, s.grad_norm) for s in s1.steps] == [
        (14, 7282.0, 0.52, 0.17, 0.8319),
        (15, 7334.0, 0.53, 0.17, 0.8587),
    ]
    assert s2.rank is None
    assert [(s.step, s.tokens_per_s, s.memory_gib, s.mfu_pct) for s in s2.steps] == [
        (4, 10050.0, 66.91, 13.99),
        (5, 10007.0, 66.91, 13.93),
    ]
    assert [(s.step, s.tokens_per_s, s.grad_norm) for s in s3.steps] == [(200, 5856.0, None), (210, 5593.0, None)]


def test_shared_litgpt_gas(tmp_path: Path) -> None:
    s1, s2, s3 = (logs.parse_text_log(p) for p in _shared_sections("litgpt.txt", tmp_path))
    assert s1.fact("gradient_accumulation_steps").value == "2"
    assert s2.rank == 0
    assert s2.fact("gradient_accumulation_steps").value == "1"
    assert [(s.iter, s.step, s.step_time_ms) for s in s2.steps] == [(34, 35, 3372.2), (35, 36, 3369.29)]
    assert s3.fact("gradient_accumulation_steps").value == "8"  # iter 1760 / step 220
    assert [(s.iter, s.step) for s in s3.steps] == [(1760, 220), (1770, 221)]
    assert s3.steps[1].step_time_ms == 89.96  # "iter time: 89.96 ms" (space before ms)


def test_shared_hf_trainer_and_llamafactory(tmp_path: Path) -> None:
    secs = _shared_sections("hf_trainer_llamafactory.txt", tmp_path)
    banner1, banner2, dicts, liger, lf_jsonl, summary = secs
    f1 = _facts(logs.parse_text_log(banner1))
    assert (f1["per_device_batch"], f1["gradient_accumulation_steps"], f1["global_batch"]) == ("1", "8", "16")
    assert f1["world_size"] == "2"  # 16 / (1 × 8)
    assert (f1["num_examples"], f1["total_optimization_steps"], f1["trainable_params"]) == ("900", "560", "21176320")
    f2 = _facts(logs.parse_text_log(banner2))
    assert f2["world_size"] == "7"  # 224 / (8 × 4)
    assert f2["num_examples"] == "5498"
    d = logs.parse_text_log(dicts)
    assert [(s.step, s.loss, s.epoch) for s in d.steps] == [(1, 1.7319, 1.42), (2, 1.7129, 1.49)]
    (lg,) = logs.parse_text_log(liger).steps
    assert (lg.loss, lg.tokens_per_s, lg.memory_gib) == (75.1831, 18801.85, 47172.0 / 1024)
    jl = tmp_path / "trainer_log.jsonl"
    jl.write_text(lf_jsonl.read_text())
    (s,) = logs.parse_llamafactory_jsonl(jl).steps
    assert (s.step, s.loss) == (3200, 4.4671)
    assert s.step_time_ms == pytest.approx((5 * 3600 + 13 * 60 + 22) / 3200 * 1000)
    assert logs.parse_text_log(summary).fact("train_runtime_s").value == "2219"


def test_shared_unsloth_banner(tmp_path: Path) -> None:
    *_, unsloth = _shared_sections("nanogpt_gas_note.txt", tmp_path)
    f = _facts(logs.parse_text_log(unsloth))
    assert (f["world_size"], f["per_device_batch"], f["gradient_accumulation_steps"], f["global_batch"]) == (
        "1",
        "8",
        "4",
        "32",
    )
    assert (f["num_examples"], f["total_optimization_steps"]) == ("7473", "1000")


def test_shared_nccl_debug() -> None:
    src = SHARED_LOGS / "nccl_debug.txt"
    if not src.is_file():
        shared("logs/nccl_debug.txt")
    assert _sniff(src) == "nccl_debug"
    n = logs.parse_text_log(src).nccl
    assert [c.detail for c in n.channels] == [
        "P2P/IPC/read",
        "NET/Socket/3",
        "NET/IB/3/GDRDMA",
        "NET/IB/2/GDRDMA",
        "P2P/CUMEM",
        "SHM/direct/direct",
        "P2P/direct pointer/read",
        "NET/IB/3",
        "NET/IBext_v8/4",
        "P2P/IPC/read",
    ]
    sock = n.channels[1]
    assert (sock.host, sock.pid, sock.device, sock.channel, sock.src_rank, sock.dst_rank, sock.direction) == (
        "<cluster_name>",
        926,
        7,
        3,
        15,
        6,
        "send",
    )
    assert (n.channels[5].channel, n.channels[5].transport) == (7, "SHM")


def test_shared_topology(tmp_path: Path) -> None:
    phb, nv6, mixed = (logs.parse_topology(p) for p in _shared_sections("nvidia_smi_topo.txt", tmp_path))
    assert phb.link_between(0, 1) == "PHB"
    assert (phb.cpu_affinity["GPU1"], phb.numa_affinity["GPU1"], phb.gpu_numa_id["GPU1"]) == ("0-63", "0", "N/A")
    assert nv6.link_between(0, 15) == "NV6"
    assert nv6.link_between(1, 0) == "NV6"
    assert nv6.link_between(5, 0) == "NV6"  # mirrored: the paste has rows GPU0 and GPU1 only
    assert (nv6.link("GPU0", "mlx5_0"), nv6.link("GPU0", "mlx5_1"), nv6.link("GPU1", "mlx5_9")) == (
        "PIX",
        "PXB",
        "SYS",
    )
    assert nv6.cpu_affinity == {"GPU0": "0-23,48-71", "GPU1": "0-23,48-71"}
    assert [mixed.link_between(0, 1), mixed.link_between(1, 2), mixed.link_between(1, 3)] == ["SYS", "PHB", "NODE"]
    assert mixed.link_between(4, 3) == "PHB"
    assert mixed.numa_affinity["GPU0"] == "1"
    assert mixed.cpu_affinity["GPU0"] == "8-15,24-31"


def test_step_time_json_whose_key_is_past_4_kib_is_read_as_step_times(tmp_path):
    """discover calls a JSON a step-time file from its first 64 KiB (SNIFF_BYTES); the parser decides from as many
    bytes, so a file with a long header field before its step times is read as step times, not as a log."""
    p = tmp_path / "step_times.json"
    p.write_text(json.dumps({"note": "x" * 6000, "step_times_ms": [812.5, 790.0, 801.25]}))
    r = logs.parse_text_log(p)
    assert r.framework == "step_times"
    assert [(s.step, s.step_time_ms) for s in r.steps] == [(0, 812.5), (1, 790.0), (2, 801.25)]


def test_step_time_json_honours_max_decompressed(tmp_path):
    """--max-decompressed bounds a step-time JSON as it bounds every other file read whole."""
    p = tmp_path / "step_times.json"
    p.write_text(json.dumps([{"step": i, "step_time_ms": 800.0 + i} for i in range(2000)]))
    assert len(logs.parse_text_log(p).steps) == 2000
    with pytest.raises(InputError, match="step_times.json"):
        logs.parse_text_log(p, max_bytes=4096)


def test_hf_loss_dicts_of_several_ranks_are_numbered_per_rank(tmp_path):
    """A torchrun log where every rank prints the HF Trainer's loss dicts: each rank's steps count 1, 2, ...
    (one counter for the file gave rank 1 the steps 2 and 4)."""
    p = tmp_path / "train.log"
    p.write_text("".join(f"[rank{r}]:{{'loss': {1.5 - s / 10 - r / 100}, 'learning_rate': 1e-05, 'epoch': {s / 10}}}\n"
                         for s in range(1, 3) for r in range(2)))
    r = logs.parse_text_log(p)
    assert r.framework == "hf_trainer"
    assert sorted((s.rank, s.step, s.loss) for s in r.steps) == [(0, 1, 1.4), (0, 2, 1.3), (1, 1, 1.39),
                                                                  (1, 2, 1.29)]
