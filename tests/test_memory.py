"""Memory from the profiler's ``[memory]`` events (issue 41): the ``memory_events`` table, the per rank and device
metric (``runs[i].ranks[j].memory``), and the findings memory_growth, memory_near_capacity and memory_imbalance, on
the real H100 and H200 leaks (tests/data/gpu/h{100,200}/memory/leak), the recorded CPU sample
(sample_traces/memory_growth) and generated traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from tests.synth import gpu_job, mem, write_trace, x
from traceanalyze.diagnose import WHATIF_OF_KIND
from traceanalyze.ingest import parse
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.report.html import render_html
from traceanalyze.report.markdown import render_markdown

H100_LEAK = Path(__file__).resolve().parent / "data" / "gpu" / "h100" / "memory" / "leak"
H200_LEAK = H100_LEAK.parents[2] / "h200" / "memory" / "leak"  # the same step recorded on an H200
MIB, GIB = 1 << 20, 1 << 30


def _finding(run: dict, kind: str) -> dict:
    return next(f for f in run["findings"] if f["kind"] == kind)


def _memory(run: dict, rank: int, device: str) -> dict:
    r = next(r for r in run["ranks"] if r["rank"] == rank)
    return next(m for m in r["memory"] if m["device"] == device)


@pytest.mark.parametrize(("leak", "first_end", "peaks", "total", "top_bytes", "full"), [
    (H100_LEAK, 644_715_008, (1_675_617_280, 2 * GIB), 85_017_493_504, 4_336_183_808,
     "its 79.2 GiB are full in about 9,879 more steps"),
    # the H200: 2,340,421,632 bytes reserved; (150,109,880,320 - 2,340,421,632) / 8,388,608 = 17,615 steps
    (H200_LEAK, 644_976_640, (1_672_733_696, 2_340_421_632), 150_109_880_320, 4_304_464_384,
     "its 139.8 GiB are full in about 17,615 more steps")])
def test_real_leak_names_rank_0_and_8_mib_per_step(leak, first_end, peaks, total, top_bytes, full):
    """The H100 GPT step that keeps an 8 MiB fp32 tensor every step (truth_side.json: leak_bytes_per_step 8388608).
    GPU 0's allocated memory at the end of ProfilerStep#2..#6 is 644,715,008, 653,103,616, 661,492,224, 669,880,832
    and 678,269,440 bytes: each step 8,388,608 bytes (2,097,152 fp32 × 4 bytes = 8 MiB) above the one before, so
    the median increment is 8,388,608. Inside steps 2-5 (the last one left out), four 8 MiB blocks of aten::empty
    are never freed: 4 × 8,388,608 = 33,554,432 bytes."""
    truth = json.loads((leak / "truth_side.json").read_text())
    run = analyze(leak, Options(jobs=1)).model["runs"][0]
    gpu = _memory(run, 0, "GPU 0")
    assert [v for _, v in gpu["step_end_allocated"]] == [first_end + k * 8_388_608 for k in range(5)]
    assert gpu["growth_bytes_per_step"] == truth["leak_bytes_per_step"] == 8_388_608
    assert gpu["rising"] is True
    assert gpu["unfreed_ops"] == [{"op": "aten::empty", "count": 4, "bytes": 33_554_432, "largest_bytes": 8_388_608}]
    assert gpu["unfreed_steps"] == 4 and gpu["unfreed_bytes"] == 4 * 8_388_608
    # peaks in the window: 1,675,617,280 allocated (below torch's max_memory_allocated, 5,857,671,168, which counts
    # the steps before the profiler's window too), 2 GiB reserved, of the H100's 85,017,493,504 bytes
    assert (gpu["peak_allocated_bytes"], gpu["peak_reserved_bytes"]) == peaks
    assert gpu["peak_allocated_bytes"] < truth["max_memory_allocated"]
    assert gpu["total_bytes"] == total
    assert gpu["top_ops"][0] == {"op": "aten::empty_strided", "count": 820, "bytes": top_bytes,
                                 "largest_bytes": 262_144_000}
    cpu = _memory(run, 0, "CPU")
    assert cpu["growth_bytes_per_step"] == 0.0 and cpu["rising"] is False and cpu["peak_reserved_bytes"] is None
    f = _finding(run, "memory_growth")
    assert (f["cause"], f["severity"], f["ranks"], f["impact_pct"]) == ("config", "medium", [0], 0.0)
    assert f["title"] == ("Memory grows every step on rank 0: +8.0 MiB per step on GPU 0 (allocations of "
                          "aten::empty never freed)")
    # (85,017,493,504 - 2,147,483,648) / 8,388,608 = 9,879 steps to fill the GPU: above 1,000, so medium, not high
    assert full in " | ".join(f["evidence"])
    assert f["whatif_missing"].startswith("memory use does not set the step time")
    # its bytes do not depend on the step time's 43 % noise: high confidence, nothing to win back in step time
    assert f["confidence"] == {"level": "high", "range_pct": [0.0, 0.0], "why": []}
    assert not [g for g in run["findings"] if g["kind"] in ("memory_near_capacity", "memory_imbalance")]


def test_sample_memory_growth_names_rank_1_and_4_mib_per_step():
    """sample_traces/memory_growth: 2 gloo ranks recorded with profile_memory=True; rank 1 appends a fresh 4 MiB
    fp32 tensor (torch.full of 1,048,576 elements × 4 bytes = 4,194,304 bytes) to a list every step. Its CPU
    allocated memory at the ends of steps 2..5 is 4,202,500, 8,396,804, 12,591,108 and 16,785,412 bytes: +4,194,304
    each step. Rank 0 ends every step at 8,196 bytes (counted from the profiler's start): no growth."""
    truth = json.loads((SAMPLES / "memory_growth" / "scenario.json").read_text())
    model = analyze(SAMPLES / "memory_growth", Options(jobs=1)).model
    run = model["runs"][0]
    r1 = _memory(run, 1, "CPU")
    assert r1["step_end_allocated"] == [[2, 4_202_500], [3, 8_396_804], [4, 12_591_108], [5, 16_785_412]]
    assert r1["growth_bytes_per_step"] == truth["leak_bytes_per_step"] == 4_194_304
    assert r1["unfreed_ops"] == [{"op": "aten::empty", "count": 3, "bytes": 3 * 4_194_304, "largest_bytes": 4_194_304}]
    r0 = _memory(run, 0, "CPU")
    assert r0["step_end_allocated"] == [[2, 8_196], [3, 8_196], [4, 8_196], [5, 8_196]]
    assert r0["rising"] is False and r0["unfreed_ops"] == []
    f = _finding(run, "memory_growth")
    assert (f["ranks"], f["severity"]) == ([1], "medium")
    assert f["title"] == ("Memory grows every step on rank 1: +4.0 MiB per step on CPU (allocations of aten::empty "
                          "never freed)")
    # rank 1's peak (32.5 MiB) is 1.6× rank 0's (20.5 MiB), but that is the leak's: no imbalance finding besides
    assert not [g for g in run["findings"] if g["kind"] == "memory_imbalance"]
    # memory never is the main cause of a slowdown: the verdict names it after what slows the run
    assert model["verdict"].endswith(f"Also: {f['title']}.")


def _mem_job(folder: Path, peaks_gib: list[float], reserved_gib: list[float], total: int) -> dict:
    """4 NCCL ranks of :func:`gpu_job` (4 steps) with one allocation of ``peaks_gib[r]`` GiB inside each step's
    aten::linear, freed 50 µs later; reserved stays at ``reserved_gib[r]`` GiB; GPUs of ``total`` bytes."""
    for r, (peak, res) in enumerate(zip(peaks_gib, reserved_gib, strict=True)):
        ev = gpu_job(r, 4, steps=4)
        base, size, reserved = GIB // 2, int(peak * GIB) - GIB // 2, int(res * GIB)
        for e in [e for e in ev if e.get("name") == "aten::linear"]:
            addr = 0x7F00_0000_0000 + int(e["ts"])
            ev += [mem(e["ts"] + 5, size, base + size, reserved, addr), mem(e["ts"] + 55, -size, base, reserved, addr)]
        write_trace(folder / f"rank{r}.json", r, ev, world_size=4, backend="nccl",
                    device_properties=[{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": total}])
    return analyze(folder, Options(jobs=1)).model["runs"][0]


def test_generated_near_capacity_and_imbalance(tmp_path):
    """Rank 0 reserves 76 GiB of an 80 GiB GPU: 76 / 80 = 95 % ≥ 95 % (medium). Rank 3 peaks at 30 GiB allocated,
    3.0× the median rank's 10 GiB (the lower median of 10, 10, 10, 30); it reserves 32 GiB, 40 % of its GPU (below
    80 %): low. Memory at each step's end is back at 0.5 GiB: no growth."""
    run = _mem_job(tmp_path / "m", [10, 10, 10, 30], [76, 12, 12, 32], 80 * GIB)
    near = _finding(run, "memory_near_capacity")
    assert (near["cause"], near["severity"], near["ranks"]) == ("config", "medium", [0])
    assert near["title"] == "GPU memory is nearly full on rank 0: 95% of GPU 0 reserved at the peak"
    assert near["evidence"] == ["rank 0 GPU 0: peak reserved 76.0 GiB of 80.0 GiB (95.0%), peak allocated 10.0 GiB",
                                "no cudaFree in the counted steps: the allocator does not flush its cache yet, so the "
                                "step is not slowed by it (the next larger batch or sequence is)"]
    imb = _finding(run, "memory_imbalance")
    assert (imb["cause"], imb["severity"], imb["ranks"]) == ("config", "low", [3])
    assert imb["title"] == "Rank 3 uses 3.0× the memory of the median rank (30.0 GiB against 10.0 GiB)"
    assert not [f for f in run["findings"] if f["kind"] == "memory_growth"]
    m3 = _memory(run, 3, "GPU 0")
    assert m3["peak_allocated_bytes"] == 30 * GIB and m3["total_bytes"] == 80 * GIB
    assert m3["top_ops"] == [{"op": "aten::linear", "count": 4, "bytes": 4 * (30 * GIB - GIB // 2),
                              "largest_bytes": 30 * GIB - GIB // 2}]
    assert m3["growth_bytes_per_step"] == 0.0 and m3["unfreed_ops"] == []


def test_imbalance_is_medium_when_the_large_rank_is_nearly_full(tmp_path):
    """Rank 3 peaks at 30 GiB (3× the median) and reserves 26 GiB of a 32 GiB GPU: 81 % ≥ 80 %, so medium."""
    run = _mem_job(tmp_path / "m", [10, 10, 10, 30], [12, 12, 12, 26], 32 * GIB)
    assert _finding(run, "memory_imbalance")["severity"] == "medium"
    assert not [f for f in run["findings"] if f["kind"] == "memory_near_capacity"]  # 26 / 32 = 81 % < 95 %


def test_trace_without_memory_events_has_no_table_rows_and_no_memory_key(tmp_path):
    run = _mem_job(tmp_path / "m", [10, 10, 10, 10], [12, 12, 12, 12], 80 * GIB)
    assert all(r["memory"] for r in run["ranks"])  # with events: every rank has its rows
    write_trace(tmp_path / "plain" / "rank0.json", 0, gpu_job(0, 1, steps=3), world_size=1, backend="nccl")
    plain = analyze(tmp_path / "plain", Options(jobs=1)).model["runs"][0]
    assert ["memory" in r for r in plain["ranks"]] == [False]
    info, tables = parse.parse_trace(tmp_path / "plain" / "rank0.json")
    assert tables["memory_events"].num_rows == 0 and info.warnings == []


def test_hostile_memory_fields_cost_a_warning_not_the_file(tmp_path):
    """A [memory] event with a string ts, one with Bytes beyond 1 PiB and one with a list for Bytes are dropped
    (one warning); an address beyond int64 and a negative total become null; the good events stay."""
    ev = [x("cpu_op", "aten::empty", 100.0, 50.0),
          mem(110.0, 4096, 4096, 0, 1 << 40, device_type=0, device_id=-1),
          mem(120.0, 4096, 8192, 0, 1 << 70, device_type=0, device_id=-1),  # address beyond int64
          mem(130.0, -4096, -5, 0, 1 << 40, device_type=0, device_id=-1),  # negative total
          {**mem(140.0, 1, 1, 0, 1), "ts": "soon"},
          mem(150.0, 1 << 51, 1, 0, 2),
          {**mem(160.0, 1, 1, 0, 3), "args": {"Bytes": [1, 2], "Total Allocated": 1}}]
    path = write_trace(tmp_path / "rank0.json", 0, ev, world_size=1)
    info, tables = parse.parse_trace(path)
    rows = tables["memory_events"].to_pylist()
    assert [(r["ts_ns"] % 10**9, r["bytes"], r["addr"], r["total_allocated"]) for r in rows] == [
        (110_000, 4096, 1 << 40, 4096), (120_000, 4096, None, 8192), (130_000, -4096, 1 << 40, None)]
    assert "3 [memory] events dropped: a missing or out-of-range ts or Bytes" in info.warnings
    assert tables["cpu_ops"].num_rows == 1


def test_one_by_one_decoder_keeps_memory_args(tmp_path):
    """A run with a malformed event is decoded event by event: a [memory] event in it keeps its args."""
    good = json.dumps(mem(110.0, 4096, 4096, 0, 77, device_type=0, device_id=-1))
    body = '{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 100.0, "dur": 50.0}, ' \
           '{"ph": "X", "ts": NaN}, ' + good
    path = tmp_path / "rank0.json"
    path.write_text('{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [' + body + "]}")
    info, tables = parse.parse_trace(path)
    assert [(r["bytes"], r["addr"], r["device_type"]) for r in tables["memory_events"].to_pylist()] == [(4096, 77, 0)]
    assert info.skipped_events == 1


@pytest.mark.parametrize("kind", ["memory_growth", "memory_near_capacity", "memory_imbalance"])
def test_memory_kinds_have_no_whatif(kind):
    assert WHATIF_OF_KIND[kind][0] is None


def test_hostile_devices_and_threads_still_give_rows(tmp_path):
    """A GPU event without a Device Id, one of an unknown device type, and a thread id near 2^62: each gets a row
    (``GPU ?``, ``device 7:0``), and an allocation on the odd thread is inside no op there."""
    ev = [x("user_annotation", "ProfilerStep#1", 0.0, 1000.0), x("cpu_op", "aten::empty", 100.0, 50.0),
          x("user_annotation", "ProfilerStep#2", 1000.0, 1000.0)]
    gpu = mem(110.0, 4096, 4096, 8192, 10)
    del gpu["args"]["Device Id"]
    ev += [gpu, mem(120.0, 512, 512, 0, 11, device_type=7), mem(130.0, 64, 64, 0, 12, device_type=0, device_id=-1,
                                                                 tid=1 << 62)]
    write_trace(tmp_path / "t" / "rank0.json", 0, ev, world_size=1)
    run = analyze(tmp_path / "t", Options(jobs=1)).model["runs"][0]
    rows = {m["device"]: m for m in run["ranks"][0]["memory"]}
    assert sorted(rows) == ["CPU", "GPU ?", "device 7:0"]
    assert rows["GPU ?"]["top_ops"] == [{"op": "aten::empty", "count": 1, "bytes": 4096, "largest_bytes": 4096}]
    assert rows["CPU"]["top_ops"][0]["op"] == "(no op)"
    assert rows["GPU ?"]["total_bytes"] is None and rows["GPU ?"]["peak_reserved_bytes"] == 8192


def test_memory_table_in_markdown_and_html():
    """The sample's memory table: rank 1 (growing) first, its peak 34,124,300 bytes = 32.5 MiB, +4.0 MiB per step,
    12.0 MiB of aten::empty never freed inside steps 2-4; rank 0 peaks at 21,541,388 bytes = 20.5 MiB."""
    model = analyze(SAMPLES / "memory_growth", Options(jobs=1)).model
    md = render_markdown(model)
    assert ("| 1 | CPU | 32.5 MiB | — | — | 4.0 MiB (every step) | aten::empty 12.0 MiB |\n"
            "| 0 | CPU | 20.5 MiB | — | — | 0 B | — |") in md
    page = render_html(model)
    assert "<h3>Memory per rank and device</h3>" in page
    assert "step 2: 4.0 MiB → step 5: 16.0 MiB" in page and '<tr class="flagged"><td class="n">1</td>' in page


def test_allocations_take_the_innermost_running_op_and_stay_only_unfreed_inside_steps(tmp_path):
    """One CPU rank, steps 1-3 of 1,000 µs (step 3, the window's last, is left out of "not freed"). Thread 1:
    aten::long (60 µs) and aten::short (40 µs) start together inside outer; aten::empty at 300 µs; aten::mm from
    1,150 µs; aten::zeros in step 3. An allocation belongs to the op that started last at or before it on its thread
    (at one start the shorter, at its very ns too), if that op still runs: 1,000 B at 120 µs -> aten::short; 2,000 B
    at 300 µs -> aten::empty; 4,000 B at 950 µs (after outer's end at 900) and 8,000 B on thread 2 (no op) ->
    (no op). In step 2, 16,000 B under aten::mm are freed at the same ns (the free is the next event at the address),
    32,000 B are never freed: kept; 64,000 B in step 3 are never freed but not counted."""
    cpu = {"device_type": 0, "device_id": -1}
    ev = [x("user_annotation", f"ProfilerStep#{s}", (s - 1) * 1000.0, 1000.0) for s in (1, 2, 3)]
    ev += [x("cpu_op", "outer", 50.0, 850.0), x("cpu_op", "aten::long", 100.0, 60.0),
           x("cpu_op", "aten::short", 100.0, 40.0), x("cpu_op", "aten::empty", 300.0, 10.0),
           x("cpu_op", "aten::mm", 1150.0, 200.0), x("cpu_op", "aten::zeros", 2100.0, 50.0)]
    ev += [mem(120.0, 1000, 1000, 0, 1, **cpu), mem(130.0, -1000, 0, 0, 1, **cpu),
           mem(300.0, 2000, 2000, 0, 2, **cpu), mem(305.0, -2000, 0, 0, 2, **cpu),
           mem(950.0, 4000, 4000, 0, 3, **cpu), mem(960.0, -4000, 0, 0, 3, **cpu),
           mem(120.0, 8000, 8000, 0, 4, tid=2, **cpu), mem(125.0, -8000, 0, 0, 4, tid=2, **cpu),
           mem(1200.0, 16000, 16000, 0, 5, **cpu), mem(1200.0, -16000, 0, 0, 5, **cpu),
           mem(1300.0, 32000, 32000, 0, 6, **cpu), mem(2120.0, 64000, 96000, 0, 7, **cpu)]
    write_trace(tmp_path / "m" / "rank0.json", 0, ev, world_size=1)
    m = _memory(analyze(tmp_path / "m", Options(jobs=1)).model["runs"][0], 0, "CPU")
    assert m["top_ops"] == [{"op": "aten::zeros", "count": 1, "bytes": 64000, "largest_bytes": 64000},
                            {"op": "aten::mm", "count": 2, "bytes": 48000, "largest_bytes": 32000},
                            {"op": "(no op)", "count": 2, "bytes": 12000, "largest_bytes": 8000},
                            {"op": "aten::empty", "count": 1, "bytes": 2000, "largest_bytes": 2000},
                            {"op": "aten::short", "count": 1, "bytes": 1000, "largest_bytes": 1000}]
    assert m["unfreed_ops"] == [{"op": "aten::mm", "count": 1, "bytes": 32000, "largest_bytes": 32000}]
    assert (m["unfreed_bytes"], m["unfreed_steps"]) == (32000, 2)
