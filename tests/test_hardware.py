"""GPU-aware advice (traceanalyze.hardware) and readable dtype-mix labels."""

from __future__ import annotations

import json

import pytest

from tests.synth import x
from traceanalyze import hardware
from traceanalyze.hardware import GpuInfo
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze

V100 = {"id": 0, "name": "Tesla V100-SXM2-16GB", "computeMajor": 7, "computeMinor": 0}
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0}


def test_capability_table_and_option():
    assert hardware.capability_of("Tesla V100-DGXS-32GB") == (7, 0)
    assert hardware.capability_of("NVIDIA A100-SXM4-80GB") == (8, 0)
    assert hardware.capability_of("NVIDIA A10G") == (8, 6)
    assert hardware.capability_of("NVIDIA L4") == (8, 9)
    assert hardware.capability_of("Some Future GPU") is None
    assert hardware.parse_gpu_option("sm70") == GpuInfo(None, (7, 0), "--gpu")
    assert hardware.parse_gpu_option("sm_90").capability == (9, 0)
    assert hardware.parse_gpu_option("8.0").capability == (8, 0)
    assert hardware.parse_gpu_option("A100") == GpuInfo("A100", (8, 0), "--gpu")
    # new schema computeMajor/Minor, 2021 schema major/minor
    assert hardware.from_properties([H100]) == GpuInfo("NVIDIA H100 80GB HBM3", (9, 0), "trace deviceProperties")
    assert hardware.from_properties([{"name": "Tesla V100-DGXS-32GB", "major": 7, "minor": 0}]).sm == "sm70"
    assert hardware.from_properties([]) is None
    # the trace wins; --gpu fills in where the trace has no capability
    assert hardware.resolve(hardware.from_properties([V100]), "sm90").sm == "sm70"
    assert hardware.resolve(None, "sm90").sm == "sm90"
    assert hardware.resolve(None, None) == GpuInfo()


def test_advice_names_only_what_the_gpu_supports():
    v100 = hardware.precision_advice(GpuInfo("V100", (7, 0)))
    assert "torch.float16" in v100 and "GradScaler" in v100 and "bfloat16" not in v100 and "FP8" not in v100
    assert "no bf16 or TF32" in v100
    a100 = hardware.precision_advice(GpuInfo("A100", (8, 0)))
    assert "bfloat16" in a100 and "allow_tf32" in a100 and "GradScaler" not in a100 and "FP8" not in a100
    h100 = hardware.precision_advice(GpuInfo("H100", (9, 0)))
    assert "bfloat16" in h100 and "allow_tf32" in h100 and "FP8" in h100
    assert "FP8" in hardware.precision_advice(GpuInfo(None, (8, 9)))
    unknown = hardware.precision_advice(GpuInfo())
    assert unknown.startswith("the GPU is not known") and "--gpu" in unknown
    assert "bfloat16" in unknown and "GradScaler" in unknown  # both options
    assert "no tensor cores" in hardware.precision_advice(GpuInfo("P100", (6, 0)))
    assert hardware.grad_compression_hook(GpuInfo(None, (7, 0))) == "fp16_compress_hook"
    assert hardware.grad_compression_hook(GpuInfo(None, (8, 0))) == "bf16_compress_hook"


def _fp32_gpu_trace(path, props: list) -> None:
    """One GPU rank whose matrix math is fp32: a CUDA-core sgemm (named) and an nvjet kernel whose launching
    aten::mm has float inputs (tensor-core use unknown), 3 ms + 1 ms per step over three steps."""
    ev, t, ext = [], 1000.0, 1
    for s in (1, 2, 3):
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, 10_000))
        for name, dur in (("volta_sgemm_128x64_nn", 3000.0), ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 1000.0)):
            ev.append(x("cpu_op", "aten::mm", t + 10, 20, **{"External id": ext, "Input type": ["float", "float"],
                                                            "Input Dims": [[64, 64], [64, 64]]}))
            ev.append(x("cuda_runtime", "cudaLaunchKernel", t + 15, 5, correlation=ext))
            ev.append(x("kernel", name, t + 100 + (0 if dur == 3000.0 else 3100), dur, pid=0, tid=7, stream=7,
                        correlation=ext, device=0, **{"External id": ext}))
            ext += 1
        t += 10_000
    doc = {"schemaVersion": 1, "deviceProperties": props, "distributedInfo": {"rank": 0, "world_size": 1},
           "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": ev}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(("props", "gpu", "want", "not_want"), [
    ([V100], None, "torch.amp.GradScaler", "bfloat16"),
    ([H100], None, "FP8", "GradScaler"),
    ([], "sm80", "bfloat16", "FP8"),
    ([], None, "the GPU is not known", None),
])
def test_precision_finding_follows_the_gpu(tmp_path, props, gpu, want, not_want):
    _fp32_gpu_trace(tmp_path / "run" / "rank0.json", props)
    a = analyze(tmp_path / "run", Options(jobs=1, gpu=gpu))
    (run,) = a.model["runs"]
    (f,) = [f for f in run["findings"] if f["kind"] == "fp32_matmul"]
    assert want in f["recommendation"]
    if not_want:
        assert not_want not in f["recommendation"]
    # dtype mix: each (dtype, tensor cores) once, with a label that tells them apart; steps 1 and 2 counted
    if props == [V100]:  # sm70 has no TF32: fp32 matmuls whose name does not tell run on CUDA cores too
        assert [(m["label"], m["time_us"], m["pct"]) for m in run["dtype_mix"]] == [
            ("fp32 on CUDA cores", 8000.0, 100.0)]
        return
    assert [(m["label"], m["time_us"], m["pct"]) for m in run["dtype_mix"]] == [
        ("fp32 on CUDA cores", 6000.0, 75.0), ("fp32, tensor cores unknown (TF32 when allowed)", 2000.0, 25.0)]
    assert ("dtype mix: fp32 on CUDA cores 75%, fp32, tensor cores unknown (TF32 when allowed) 25% "
            "(from kernel names, launching op Input type)") in f["evidence"]


def test_gpu_option_is_ignored_when_the_trace_says(tmp_path):
    _fp32_gpu_trace(tmp_path / "run" / "rank0.json", [V100])
    a = analyze(tmp_path / "run", Options(jobs=1, gpu="H100"))
    (run,) = a.model["runs"]
    assert (run["gpu_capability"], run["gpu_source"]) == ("sm70", "trace deviceProperties")
    assert any(w["message"] == "--gpu H100 ignored: the trace's deviceProperties say Tesla V100-SXM2-16GB (sm70)"
               for w in a.model["warnings"])


def test_cli_gpu_option(tmp_path):
    from click.testing import CliRunner

    from traceanalyze.cli import cli

    _fp32_gpu_trace(tmp_path / "run" / "rank0.json", [])
    out = tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "run"), "--gpu", "V100", "--json", str(out), "-q",
                                 "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    (run,) = json.loads(out.read_text())["runs"]
    assert (run["gpu_capability"], run["gpu_source"]) == ("sm70", "--gpu")
    (f,) = [f for f in run["findings"] if f["kind"] == "fp32_matmul"]
    assert "GradScaler" in f["recommendation"] and "bfloat16" not in f["recommendation"]
