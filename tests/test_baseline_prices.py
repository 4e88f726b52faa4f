"""``--baseline`` prices the subject's what-ifs with the baseline's measured figures where the baseline fixes their
cause (issue 40 item 1; :mod:`traceanalyze.replay.frombase`): its bf16 matrix-math time prices ``bf16_matmul``, its
loader wait is the wait ``no_dataloader_wait`` keeps. On generated 2-rank gloo jobs whose steps are a loader wait,
one ``aten::mm`` and one all-reduce (``_job``)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from tests.synth import write_trace, x
from traceanalyze.cli import cli
from traceanalyze.replay.scenarios.precision import BF16, BF16_FIX, from_baseline, host_proven

STEP_PARTS_US = 100 + 50 + 50 + 1000 + 100  # step edges, the gaps, the all-reduce (µs): the step less loader and mm


def _job(rank: int, mm_us: float, loader_us: float, dtype: str = "float", steps: int = 4) -> list[dict]:
    """A gloo rank: per step the DataLoader's ``__next__`` for ``loader_us``, ``aten::mm`` in ``dtype`` for
    ``mm_us``, then a 4 MiB all-reduce of 1 ms on every rank at once."""
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}]
    t = 1000.0
    for s in range(1, steps + 1):
        step = STEP_PARTS_US + loader_us + mm_us
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, step))
        ev.append(x("cpu_op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 100, loader_us))
        mm = t + 100 + loader_us + 50
        ev.append(x("cpu_op", "aten::mm", mm, mm_us,
                    **{"Input type": [dtype, dtype], "Input Dims": [[256, 256], [256, 256]]}))
        start = mm + mm_us + 50
        ev.append(x("cpu_op", "c10d::allreduce_", start, 20.0))
        ev.append(x("user_annotation", "gloo:all_reduce", start, 1000.0, tid=2,
                    **{"Input type": ["float"], "Input Dims": [[1 << 20]]}))
        t += step
    return ev


def _report(tmp_path, subject: dict, baseline: dict) -> dict:
    for name, kw in (("subject", subject), ("baseline", baseline)):
        for r in range(2):
            write_trace(tmp_path / name / f"rank{r}.json", r, _job(r, **kw))
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "subject"), "--baseline", str(tmp_path / "baseline"),
                                   "-q", "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json"),
                                   "--db", str(tmp_path / "r.duckdb")])
    assert res.exit_code == 0, res.output
    return json.loads((tmp_path / "r.json").read_text())


def _row(model: dict, scenario: str) -> dict:
    subject = next(r for r in model["runs"] if r["role"] == "subject")
    return next(w for w in subject["whatif"] if w["scenario"] == scenario)


def test_a_bf16_baseline_prices_bf16_matmul_from_its_measured_gemm_time(tmp_path) -> None:
    """fp32 ``aten::mm`` of 6 ms a step against the baseline's bf16 one of 2.5 ms: 6 / 2.5 = 2.40× (within 1 to
    1.5 × the CPU model's 2×), not the model's 1.5×. The rewrite takes the mm's time × (1 − 1/2.4), less casts at
    10 % of that: 6000 × (1 − 1/2.4) × 0.9 = 3,150 µs of the 7,300 µs step."""
    model = _report(tmp_path, {"mm_us": 6000.0, "loader_us": 0.0}, {"mm_us": 2500.0, "loader_us": 0.0,
                                                                      "dtype": "c10::BFloat16"})
    w = _row(model, "bf16_matmul")
    assert w["priced_from"] == "the baseline's matrix math (gemm 2.40× faster in bf16)"
    assert w["assumptions"].startswith("fp32 matrix math 2.40× faster in bf16 (range 1.50–2.40×: from the "
                                       "baseline's measured speed-up to the model's 1.5×)")
    assert ("matrix math from baseline: 2.40× faster in bf16 (gemm 6.00 ms here, 2.50 ms there; baseline: the "
            "kernel family's time per rank and counted step, mean)") in w["assumptions"]
    step = STEP_PARTS_US + 6000.0
    assert w["predicted_step_time_us"] == pytest.approx(step - 3150.0, abs=5.0)
    (chk,) = model["comparison"]["whatif_check"]
    assert chk["scenario"] == "bf16_matmul" and chk["priced_from"] == w["priced_from"]
    assert chk["predicted_step_us"] == w["predicted_step_time_us"]
    assert chk["baseline_step_us"] == pytest.approx(STEP_PARTS_US + 2500.0, abs=1.0)


def test_a_faster_loader_baseline_keeps_its_wait(tmp_path) -> None:
    """A loader wait of 2 ms a step against the baseline's 0.2 ms: ``no_dataloader_wait`` keeps 0.2 ms (10 %),
    so it saves 1.8 ms, not 2 ms, and predicts the baseline's step."""
    model = _report(tmp_path, {"mm_us": 3000.0, "loader_us": 2000.0}, {"mm_us": 3000.0, "loader_us": 200.0})
    w = _row(model, "no_dataloader_wait")
    assert w["priced_from"] == "the baseline's loader wait (0.20 ms per step)"
    assert w["assumptions"] == ("loader wait from baseline: 0.20 ms per step kept, the baseline's (baseline; "
                                "2.00 ms here; data-loader time per rank and counted step, mean): host time under "
                                "DataLoader ranges cut by 90% (launch order kept)")
    assert w["saving_us"] == pytest.approx(1800.0, abs=5.0)
    (chk,) = model["comparison"]["whatif_check"]
    assert chk["scenario"] == "no_dataloader_wait" and chk["priced_from"] == w["priced_from"]
    assert chk["predicted_step_us"] == pytest.approx(chk["baseline_step_us"], abs=5.0)
    assert chk["error_pp"] == pytest.approx(0.0, abs=0.1)


def _ctx(factor: float, native: bool | None = None, cpu: str | None = "Xeon", base_cpu: str | None = "Xeon") -> dict:
    fams = {"gemm": {"factor": factor, "subject_us": 6000.0, "baseline_us": 6000.0 / factor}}
    return {"bf16": (1.25, 1.5, 2.0), "native_bf16": native, "cpu_model": cpu,
            "baseline": {"name": "b", "cpu_model": base_cpu, "matmath": {"mode": "bf16", "dtype": "bf16",
                                                                      "channels_last": False, "families": fams}}}


def test_a_factor_out_of_bound_falls_back_to_the_model() -> None:
    """1 ≤ factor ≤ 2 (CPU model) × 1.5 = 3: 0.4× (bf16 slower there) and 6× (not the same math) are left to the
    model, and the assumptions say why."""
    assert from_baseline(_ctx(2.9), BF16_FIX)[0] == {"gemm": 2.9}
    for f, why in ((0.4, "slower in bf16 there"), (6.0, "more than the model allows: not the same math")):
        ok, out, _ = from_baseline(_ctx(f), BF16_FIX)
        assert ok == {} and out == [f"gemm: the baseline's {f:.2f}× is outside 1–3× ({why}), so the model prices it"]
        assert BF16.assumptions(_ctx(f), None).startswith("fp32 matrix math 1.5× faster in bf16 (range 1.25–2×")
        assert BF16.priced_from(_ctx(f), None) is None


def test_a_baseline_on_the_same_cpu_lifts_the_no_amx_left_out() -> None:
    """A host without AMX or AVX512-BF16 leaves bf16 out; a baseline on the same CPU model that measured bf16 2.4×
    faster proves the host runs it fast: the what-if applies. Another CPU model, or a slower bf16, proves nothing."""
    g = SimpleNamespace(mode="cpu", cover={"matmul_fp32": np.array([6000.0])}, gap_cover={})
    assert host_proven(_ctx(2.4, native=False)) and BF16.left_out(g, _ctx(2.4, native=False)) is None
    assert BF16.applies(g, _ctx(2.4, native=False))
    other = _ctx(2.4, native=False, base_cpu="EPYC")
    assert not host_proven(other) and not BF16.applies(g, other)
    assert BF16.left_out(g, other).endswith("no fix on this host; the baseline (b) measured bf16 speed-ups of "
                                            "gemm 2.40× on another CPU (EPYC), which does not speak for this host")
    slower = _ctx(0.4, native=False)
    assert not host_proven(slower) and BF16.left_out(g, slower).endswith("gemm 0.40× (under 1: slower, as this "
                                                                         "host's CPU predicts)")


def test_a_noise_sized_loader_difference_is_no_fix() -> None:
    """The baseline fixes the wait only under half the subject's (the check's changed-cost share): 0.37 against
    0.44 ms a step (the interconnect sample pair) is left to the model; 0.2 against 2 ms keeps 0.2 ms."""
    from traceanalyze.metrics.host import LoaderStats
    from traceanalyze.replay.frombase import loader_figures

    def stats(us: float) -> LoaderStats:
        return LoaderStats(loader_us={0: 4 * us}, n_steps={0: 4})

    assert loader_figures(stats(440.0), stats(370.0)) is None
    assert loader_figures(stats(2000.0), stats(200.0)) == {"subject_us": 2000.0, "baseline_us": 200.0}
    assert loader_figures(stats(2000.0), LoaderStats()) is None  # no loader range there: not a zero wait
