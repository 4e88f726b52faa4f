"""What-if replay (issue 16): the graph tables, the replay's fidelity on every sample and real trace, and each
what-if against its fixed twin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import real, sample
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import whatif as bench  # noqa: E402


def _run(folder, **kw):
    a = analyze(folder, Options(jobs=1, **kw))
    return a, a.model["runs"][0]


def test_graph_tables_straggler():
    a, run = _run(sample("straggler"))
    con = a.con
    assert con.execute("SELECT count(*) FROM sim_task").fetchone()[0] == 2892
    assert dict(con.execute("SELECT edge_type, count(*) FROM sim_edge GROUP BY 1").fetchall()) == {
        "collective": 72, "collective_wait": 22, "host_order": 2880, "launch": 24}
    # 6 gloo all-reduces (2 buckets x 3 steps) on 4 ranks, matched by the per-step order, all complete
    assert con.execute("SELECT count(DISTINCT instance_id), count(*), min(matched_by), bool_and(complete) "
                       "FROM sim_coll").fetchone() == (6, 24, "per-step ordinal", True)
    assert con.execute("SELECT count(*) FROM sim_gap").fetchone()[0] == 2880
    assert dict(con.execute("SELECT scenario, count(*) FROM sim_result GROUP BY 1").fetchall()) == {
        "replay": 12, "no_straggler": 12, "bf16_matmul": 12, "no_dataloader_wait": 12, "all": 12}
    rp = run["replay"]
    assert rp["measured_step_time_us"] == pytest.approx(196846.247, abs=1e-3)
    assert rp["error_pct"] == pytest.approx(2.77, abs=0.01)
    assert rp["collective_instances"] == 6 and not rp["partial"] and rp["reliable"]
    assert [r["rank"] for r in rp["ranks"]] == [0, 1, 2, 3]
    # JSON contract
    # savings are of the step without the profiler (here the training log's step time)
    po = run["profiler_overhead"]
    assert po["source"] == "log" and po["profiled_step_time_us"] == pytest.approx(196846.247, abs=1e-3)
    u = po["unprofiled_step_time_us"]
    for w in run["whatif"]:
        assert set(w) >= {"scenario", "cause", "predicted_step_time_us", "saving_pct", "assumptions"}
        assert w["saving_pct"] == pytest.approx(100 * (u - w["predicted_step_time_us"]) / u, abs=0.01)
    assert [w["scenario"] for w in run["whatif"]] == ["no_straggler", "bf16_matmul", "no_dataloader_wait", "all"]


def test_findings_take_the_replayed_impact():
    _, run = _run(sample("straggler"))
    by = {w["scenario"]: w["saving_pct"] for w in run["whatif"]}
    f = {x["kind"]: x for x in run["findings"]}
    assert f["straggler"]["impact_pct"] == round(by["no_straggler"], 1)
    assert f["fp32_matmul"]["impact_pct"] == round(by["bf16_matmul"], 1)
    assert [x["kind"] for x in run["findings"]] == ["straggler", "fp32_matmul"]  # ranked by the replayed impact


SAMPLE_RUNS = ["healthy", "straggler", "slow_interconnect", "fast_interconnect", "precision_fp32", "precision_bf16",
               "compile_cold", "compile_warm", "dataloader_bound", "grad_accum/2proc"]


@pytest.mark.parametrize("name", SAMPLE_RUNS)
def test_replay_error_on_samples(name):
    _, run = _run(sample(name))
    rp = run["replay"]
    assert rp["error_pct"] <= 5.0, rp
    assert rp["converged"]
    assert rp["collective_instances"] >= 6  # every gloo all-reduce of the counted window matched on both ranks


@pytest.mark.parametrize("rel", ["hta/df_index_resolver", "hta/nccl_parser_config", "hta/trace_filter",
                                 "hta/triton_example", "kineto/tb_plugin_test", "tracelens/h100"])
def test_replay_error_on_real_traces(rel):
    _, run = _run(real(rel))
    if run["step_time_us"] is None:  # triton_example: its one op outlasts the profiler's recording and is dropped
        assert run["replay"] is None
        return
    assert run["replay"]["error_pct"] <= 10.0


def test_partial_set_keeps_measured_durations():
    _, run = _run(real("hta/trace_filter"))
    rp = run["replay"]
    assert rp["partial"] is True
    assert rp["collective_instances"] == 0
    assert rp["unmatched"] == ["10 of 10 collective instances kept their measured duration: 10 whose peers are "
                               "not all in the folder"]
    assert any("Stream Wait Event" in m for m in rp["missing_edges"])


def test_markdown_and_html_carry_the_table(tmp_path):
    from traceanalyze.report import render_markdown as markdown

    a, run = _run(sample("straggler"))
    md = markdown(a.model)
    assert "#### Predicted step time if fixed" in md
    assert "| imbalance: straggler ranks | no_straggler |" in md


@pytest.mark.parametrize("pair", bench.pairs(), ids=lambda p: p[4]["pair"])
def test_whatif_against_its_fixed_twin(pair):
    scenario, slow, fixed, bw, manifest = pair
    if not (slow.exists() and fixed.exists()):
        pytest.skip(f"{slow} / {fixed} not present")
    p = bench.pair_prediction(scenario, slow, fixed, bw, manifest.get("measured_saving_pct"))
    host = manifest.get("host") or {}
    if scenario == "bf16_matmul" and host.get("native_bf16") is False:
        # emulated bf16 is slower than fp32: the report leaves the what-if out, and the twin is indeed slower
        assert p["left_out"] and "neither AMX nor AVX512-BF16" in p["left_out"], p
        assert p["predicted_pct"] == 0.0 and p["measured_pct"] < -50, p
        return
    assert p["left_out"] is None, p
    assert p["error_points"] <= 10.0, p


def test_pair_manifest_is_read(tmp_path, monkeypatch):
    root = tmp_path / "sample_traces"
    (root / "pairs" / "link").mkdir(parents=True)
    (root / "pairs" / "link" / "pair.json").write_text(json.dumps(
        {"scenario": "ideal_interconnect", "slow": "s", "fixed": "f", "link_bw_GBps": 1.5}))
    monkeypatch.setattr(bench, "SAMPLES", root)
    ((sc, slow, fixed, bw, manifest),) = bench.pairs()
    assert (sc, slow, fixed, bw) == ("ideal_interconnect", root / "pairs" / "link" / "s", root / "pairs" / "link" / "f",
                                     1.5)
    assert manifest["pair"] == "link"
    assert bench.left_out("bf16_matmul", {"replay": {"left_out": [{"scenario": "bf16_matmul", "why": "w"}]}}) == "w"
    assert bench.left_out("bf16_matmul", {"replay": {}}) is None


def _gpu_rank(rank: int, host_delay: float) -> list[dict]:
    """One GPU rank, 3 steps of 3800 µs: a compute kernel (2000 µs, stream 7), an NCCL all-reduce (stream 20)
    launched after ``host_delay`` µs of host time, then cudaDeviceSynchronize; the all-reduce ends 500 µs after the
    last rank launched it (rank 1 is 3000 µs late)."""
    from tests.synth import kernel, x

    ev, corr = [], 100 * rank
    for s in range(3):
        t = 1000.0 + 4000.0 * s
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, 3800.0))
        ev += kernel("sgemm_128x64", t + 110, 2000.0, 7, corr + 1, t + 100)
        launch = t + 200 + host_delay
        ev += kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", launch + 10, t + 3710 - (launch + 10), 20,
                     corr + 2, launch)
        ev.append(x("cuda_runtime", "cudaDeviceSynchronize", launch + 20, t + 3715 - (launch + 20)))
        corr += 10
    return ev


def test_generated_gpu_pair_graph_replay_and_straggler(tmp_path):
    from tests.synth import write_trace

    for r, delay in ((0, 0.0), (1, 3000.0)):
        write_trace(tmp_path / f"rank{r}.pt.trace.json", r, _gpu_rank(r, delay), backend="nccl")
    a, run = _run(tmp_path)
    con = a.con
    # per rank: 3 steps x (2 launches + 1 sync) host calls, 3 x 2 kernels, 3 x 2 step markers
    assert con.execute("SELECT kind, count(*) FROM sim_task GROUP BY 1 ORDER BY 1").fetchall() == [
        ("collective", 6), ("host", 18), ("kernel", 6), ("step_begin", 6), ("step_end", 6)]
    # launches: 12; each sync waits for both streams of its rank (12 edges)
    assert dict(con.execute("SELECT edge_type, count(*) FROM sim_dep GROUP BY 1").fetchall()) == {
        "launch": 12, "gpu_cpu_sync": 12}
    assert con.execute("SELECT count(DISTINCT instance_id), bool_and(complete), min(transfer_us), max(transfer_us) "
                       "FROM sim_coll").fetchone() == (3, True, 500.0, 500.0)
    rp = run["replay"]
    assert (rp["measured_step_time_us"], rp["replayed_step_time_us"], rp["error_pct"]) == (3800.0, 3800.0, 0.0)
    (w,) = [w for w in run["whatif"] if w["scenario"] == "no_straggler"]
    # rank 1's 3000 µs host gap goes to rank 0's 95 µs: both launch the all-reduce at +200 µs, it ends at +710,
    # the sync then waits for the compute kernel (ends +2110) and returns at +2115: step 2200 µs profiled; without
    # the profiler's host cost (4 events a step; on its path 1 op at 2.0 µs with record_shapes and 2 runtime calls at
    # 4.0 µs) the step is 10.0 µs shorter
    po = run["profiler_overhead"]
    assert (po["source"], po["events_per_step"], po["profiled_step_time_us"]) == ("estimate", 4.0, 3800.0)
    assert po["unprofiled_step_time_us"] == pytest.approx(3800.0 - 10.0, abs=0.01)
    assert w["profiled_predicted_step_time_us"] == pytest.approx(2200.0 + 4.0, abs=0.01)
    assert w["predicted_step_time_us"] == pytest.approx(2200.0 - 6.0, abs=0.01)
    assert w["saving_pct"] == pytest.approx(42.11, abs=0.01)


def test_replay_is_cached_with_the_report(tmp_path):
    db = tmp_path / "r.duckdb"
    first = analyze(sample("straggler"), Options(db=db, jobs=1))
    first.con.close()
    again = analyze(sample("straggler"), Options(db=db, jobs=1))
    assert again.model.get("cached") is True
    assert again.model["runs"][0]["replay"] == first.model["runs"][0]["replay"]
    assert again.model["runs"][0]["whatif"] == first.model["runs"][0]["whatif"]


def _graphs_equal(a, b) -> list[str]:
    """Fields of two graphs that differ (task names compared as strings, not codes)."""
    import numpy as np

    bad = []
    for k, v in vars(a).items():
        w = getattr(b, k)
        if k == "name":
            ok = v.take(a.name_code).equals(w.take(b.name_code))
        elif isinstance(v, np.ndarray):
            ok = v.dtype == w.dtype and np.array_equal(v, w)
        elif isinstance(v, dict):
            ok = v.keys() == w.keys() and all(np.array_equal(v[x], w[x]) for x in v)
        else:
            ok = v == w
        if not ok:
            bad.append(k)
    return bad


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_graph_built_rank_by_rank_is_the_graph_built_at_once(tmp_path, kind, monkeypatch):
    """graph.build reads the ranks in chunks of at most max_chunk_events events (bounded memory at 1,024 ranks);
    a chunk per rank gives the same tasks, edges, steps, categories and collective instances as one chunk, and so
    do chunks built on two threads at once (each on its own cursor), and an even split over two threads. The
    categories a chunk calls all zero (joined unread) are all zero."""
    from tests.synth import write_trace
    from traceanalyze.replay import graph as gr
    from traceanalyze.replay.graph import builder, labels, source

    zeros: list[dict[str, set[str]]] = []

    def checked(*args):
        out = labels.categories(*args)
        for i, k in enumerate(("cover", "gap_cover")):
            assert not any(out[i][cat].any() for cat in out[3][k])
        zeros.append(out[3])
        return out

    monkeypatch.setattr(builder, "categories", checked)

    if kind == "gpu":
        for r, delay in ((0, 0.0), (1, 3000.0), (2, 10.0)):
            write_trace(tmp_path / f"rank{r}.pt.trace.json", r, _gpu_rank(r, delay), backend="nccl")
        a, run = _run(tmp_path)
    else:
        a, run = _run(sample("straggler"))
    run_id, mode, world = a.con.execute("SELECT run_id, mode, world_size FROM runs WHERE role = 'subject'").fetchone()
    assert mode == kind
    whole = gr.build(a.con, run_id, mode, world, threads=1)
    by_rank = gr.build(a.con, run_id, mode, world, max_chunk_events=1, threads=1)
    threaded = gr.build(a.con, run_id, mode, world, max_chunk_events=1, threads=2)
    halves = gr.build(a.con, run_id, mode, world, threads=2)
    rc = source.run_clock(a.con, run_id, mode, world, None)
    assert len(builder._rank_chunks(a.con, rc, 1)) == len(whole.ranks)
    assert len(builder._rank_chunks(a.con, rc, 10**9)) == 1
    # two threads: the ranks split in two chunks, whatever the bound (the first closed at half the run's events)
    assert [len(c) for c in builder._rank_chunks(a.con, rc, 10**9, 2)] == {"gpu": [2, 1], "cpu": [3, 1]}[kind]
    assert whole.start.size == {"gpu": 63, "cpu": 2892}[kind]  # 3 x 21 tasks; the straggler sample
    assert whole.n_instances == {"gpu": 3, "cpu": 6}[kind]
    # the profiler's events, counted per chunk as each one's tasks are ordered: the same counts (CPU runs: none)
    assert whole.prof_events.sum(axis=1).tolist() == {"gpu": [9, 27, 0, 0], "cpu": [0, 0, 0, 0]}[kind]
    assert _graphs_equal(whole, by_rank) == []
    assert _graphs_equal(whole, threaded) == []
    assert _graphs_equal(whole, halves) == []
    # GPU runs: no range of any kind, fp32 GEMMs (a kernel's cover); CPU runs: the dataloader, optimizer and fp32
    # matrix-math ranges of the straggler sample are not zero
    assert zeros[0] == {"gpu": {"cover": {*labels.CATEGORIES} - {"matmul_fp32"},
                                "gap_cover": {*labels.CATEGORIES} - {"launch"}},
                        "cpu": {"cover": {"compile", "allocator", "launch"},
                                "gap_cover": {"compile", "allocator"}}}[kind]


def _event_wait_rank(rows: str, early_wait: bool = False) -> list[dict]:
    """One GPU rank, 3 steps of 4800 µs: an fp32 GEMM on stream 7 (3000 µs), a cudaEventRecord after it, a
    cudaStreamWaitEvent on stream 20, then an elementwise kernel on stream 20 launched at +50 µs that runs only
    when the GEMM's event completes (+3105 µs), and a cudaDeviceSynchronize. ``rows``: Kineto's cuda_sync "Stream
    Wait Event" rows name the awaited stream and record call (``"old"``: Kineto before 2025), only the waiting stream
    (``"new"``: -1 for both, as torch 2.11 writes them), or are absent (``"none"``). ``early_wait``: the step
    starts with a short kernel on stream 7 that stream 20 is made to wait for too (an earlier record and wait with
    no launch on stream 20 between: cuDNN's pool of side streams), which the elementwise kernel does not wait for
    in time."""
    from tests.synth import kernel, x

    ev, corr = [], 100
    for s in range(3):
        t = 1000.0 + 5000.0 * s
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t, 4800.0))
        if early_wait:  # correlations 1-3 of the step; the GEMM's from 4
            ev += kernel("vectorized_elementwise_kernel", t + 8, 40.0, 7, corr + 1, t + 2)
            ev.append(x("cuda_runtime", "cudaEventRecord", t + 4, 1.0, correlation=corr + 2))
            ev.append(x("cuda_runtime", "cudaStreamWaitEvent", t + 6, 1.0, correlation=corr + 3))
            if rows != "none":
                ev.append(x("cuda_sync", "Stream Wait Event", t + 7, 0.0, pid=0, tid=20, correlation=corr + 3,
                            device=0, stream=20, wait_on_stream=-1, wait_on_cuda_event_record_corr_id=-1))
            corr += 3
        ev.append(x("cpu_op", "aten::mm", t + 10, 60.0, **{"External id": corr + 1, "Input type": ["float", "float"]}))
        gemm = kernel("volta_sgemm_128x64_nn", t + 100, 3000.0, 7, corr + 1, t + 20)
        gemm[0]["args"]["External id"] = corr + 1
        ev += gemm
        ev.append(x("cuda_runtime", "cudaEventRecord", t + 30, 2.0, correlation=corr + 2))
        ev.append(x("cuda_runtime", "cudaStreamWaitEvent", t + 40, 2.0, correlation=corr + 3))
        if rows != "none":
            ev.append(x("cuda_sync", "Stream Wait Event", t + 41, 0.0, pid=0, tid=20, correlation=corr + 3, device=0,
                        stream=20, wait_on_stream=7 if rows == "old" else -1,
                        wait_on_cuda_event_record_corr_id=corr + 2 if rows == "old" else -1))
        ev += kernel("elementwise_kernel", t + 3105, 500.0, 20, corr + 4, t + 50)
        ev.append(x("cuda_runtime", "cudaDeviceSynchronize", t + 60, 3550.0))
        corr += 10 - (3 if early_wait else 0)
    return ev


@pytest.mark.parametrize("rows", ["old", "new", "none"])
def test_cross_stream_event_wait_edges(tmp_path, rows):
    """A stream's wait on another's event becomes an event_wait edge (the GEMM before the record -> the first kernel
    launched on the waiting stream after the wait), so a faster GEMM moves the waiting kernel and the step end: the
    bf16 what-if saves 3000 µs x (1 - 1/4) x (1 - 10 % casts) = 2025 µs of 4800. The edge is the same whatever
    Kineto wrote: the cuda_sync row's awaited stream and record (older Kineto), the row's waiting stream alone
    (-1 for the rest, torch 2.11), or no row (the host's cudaEventRecord / cudaStreamWaitEvent calls alone)."""
    from tests.synth import write_trace

    write_trace(tmp_path / "w" / "rank0.pt.trace.json", 0, _event_wait_rank(rows), world_size=1, backend="nccl")
    a, run = _run(tmp_path / "w")
    want = {"old": [("Stream Wait Event", 20, 7, -1)] * 3, "new": [("Stream Wait Event", 20, -1, -1)] * 3,
            "none": []}[rows]
    assert a.con.execute("""SELECT name, stream, wait_on_stream,
        CASE WHEN wait_on_corr < 0 THEN wait_on_corr ELSE wait_on_corr - correlation END FROM cuda_syncs
        ORDER BY ts_ns""").fetchall() == want
    assert a.con.execute("SELECT count(*) FROM kernels WHERE cat = 'cuda_sync'").fetchone()[0] == 0
    edges = a.con.execute("""SELECT s.name, d.name, e.from_end, e.offset_us FROM sim_dep e
        JOIN sim_task s ON s.task_id = e.src JOIN sim_task d ON d.task_id = e.dst
        WHERE e.edge_type = 'event_wait' ORDER BY e.dst""").fetchall()
    assert edges == [("volta_sgemm_128x64_nn", "elementwise_kernel", True, 5.0)] * 3
    assert run["replay"]["error_pct"] == 0.0 and run["replay"]["missing_edges"] == []
    (w,) = [w for w in run["whatif"] if w["scenario"] == "bf16_matmul"]
    # an unknown GPU: an H100's dense peaks, said so; 3000 µs of fp32 GEMM at 989/67 TFLOPS / √2 (the point
    # estimate) plus casts at 10 % of the time saved (no Input Dims); the profiler's host cost out (the step's 2 ops
    # at 2.0 µs with record_shapes and 1 runtime call at 4.0 µs on the critical host path)
    saved = 3000.0 * (1 - 2 ** 0.5 * 67 / 989) * 0.9
    assert w["predicted_step_time_us"] == pytest.approx(4800.0 - 8.0 - saved, abs=1.0)
    assert "assumed the dense peaks of an H100 SXM" in w["assumptions"]
    lo, hi = w["range_saving_pct"]
    assert lo < w["saving_pct"] < hi


@pytest.mark.parametrize("rows", ["new", "none"])
def test_only_the_last_awaited_task_holds_a_stream_back(tmp_path, rows):
    """Stream 20 is made to wait twice before its next launch: for a 40 µs kernel at the step's start, then for the
    GEMM. Only the GEMM, which ended last, held the elementwise kernel back: the early kernel's edge (from the
    cuda_sync rows; without them a launch stands for the last wait before it) carries no latency. Were it to
    carry its measured 3057 µs, the GEMM's time would stay as a fixed delay and the bf16 what-if would save
    nothing; it moves the kernel as in the one-wait trace."""
    from tests.synth import write_trace

    write_trace(tmp_path / "w" / "rank0.pt.trace.json", 0, _event_wait_rank(rows, early_wait=True), world_size=1,
                backend="nccl")
    a, run = _run(tmp_path / "w")
    edges = a.con.execute("""SELECT s.name, d.name, e.offset_us FROM sim_dep e
        JOIN sim_task s ON s.task_id = e.src JOIN sim_task d ON d.task_id = e.dst
        WHERE e.edge_type = 'event_wait' ORDER BY e.dst, s.name""").fetchall()
    # without rows a launch stands for the last wait before it alone: the early wait leaves no edge at all
    early = [("vectorized_elementwise_kernel", "elementwise_kernel", 0.0)] if rows == "new" else []
    assert edges == (early + [("volta_sgemm_128x64_nn", "elementwise_kernel", 5.0)]) * 3
    assert run["replay"]["error_pct"] == 0.0
    (w,) = [w for w in run["whatif"] if w["scenario"] == "bf16_matmul"]
    assert w["saving_pct"] == pytest.approx(100 * (3000.0 * (1 - 2 ** 0.5 * 67 / 989) * 0.9) / 4788, abs=1.0)


def _two_allreduce_rank(rank: int, with_comms_id: bool) -> list[dict]:
    """One GPU rank, 2 steps, two all-reduces per step (1024 then 4096 elements) on one process group; rank 1's
    profiler step 0 starts after its first all-reduce was launched, so that call lies in no step there.
    ``with_comms_id``: each call carries kineto's "Comms Id" (the same on both ranks for one instance)."""
    from tests.synth import kernel, x

    ev, corr = [], 100
    for s in range(2):
        t = 1000.0 + 4000.0 * s
        late = 950.0 if (rank, s) == (1, 0) else 0.0
        ev.append(x("user_annotation", f"ProfilerStep#{s}", t + late, 3000.0 - late))
        for i, n in enumerate((1024, 4096)):
            k = kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 100 + 1000 * i, 800.0, 20, corr + i,
                       t + 50 + 1000 * i)
            k[0]["args"].update({"Collective name": "allreduce", "In msg nelems": n, "Out msg nelems": n,
                                 "Group size": 2, "dtype": "Float", "Process Group Name": "0",
                                 "Process Group Ranks": "[0, 1]"})
            if with_comms_id:
                k[0]["args"]["Comms Id"] = f"0:{s}:{n}"
            ev += k
        corr += 10
    return ev


def test_collectives_are_matched_by_comms_id_first(tmp_path):
    """With "Comms Id" on every call, instances are its values: every call pairs with its peer although rank 1's
    first call lies in no profiler step. Without it (no Seq either), the per-step order pairs rank 0's 1024-element
    call with rank 1's 4096-element one: those instances are incomplete and keep their measured durations."""
    from tests.synth import write_trace

    for cid in (True, False):
        for r in (0, 1):
            write_trace(tmp_path / str(cid) / f"rank{r}.pt.trace.json", r, _two_allreduce_rank(r, cid),
                        backend="nccl")
    a, run = _run(tmp_path / "True")
    assert a.con.execute("SELECT count(DISTINCT comms_id) FROM comm_events").fetchone()[0] == 4
    assert a.con.execute("SELECT count(DISTINCT instance_id), min(matched_by), bool_and(complete), "
                         "count(DISTINCT (instance_id, bytes)) FROM sim_coll").fetchone() == (4, "Comms Id", True, 4)
    assert run["replay"]["collective_instances"] == 4 and run["replay"]["unmatched"] == []
    a, run = _run(tmp_path / "False")
    # step 0: rank 0's 1024 with rank 1's 4096 (sizes differ), rank 0's 4096 alone, rank 1's 1024 in no step
    # alone; step 1 pairs right
    assert a.con.execute("SELECT count(DISTINCT instance_id), min(matched_by), count(DISTINCT instance_id) FILTER "
                         "(complete) FROM sim_coll").fetchone() == (5, "per-step ordinal", 2)
    assert run["replay"]["collective_instances"] == 2
    assert run["replay"]["unmatched"][0].startswith("3 of 5 collective instances kept their measured duration")


def test_picture_draws_at_most_32_lanes(tmp_path):
    """The replayed picture of a 40-rank job draws 32 lanes (the slowest rank, the fastest, then ranks spread
    evenly), as the measured timeline does, and the HTML says how many of the ranks it shows."""
    from tests.synth import write_gpu_job
    from traceanalyze.report import render_html

    a, run = _run(write_gpu_job(tmp_path / "job", 40, steps=4, straggler=17))
    pic = run["replay_picture"]
    ranks = [ln["rank"] for ln in pic["lanes"]]
    assert (len(ranks), pic["n_ranks"]) == (32, 40)
    assert ranks == sorted(set(ranks)) and pic["slowest_rank"] in ranks
    assert [ln["critical"] for ln in pic["lanes"]].count(True) == 1
    assert {0, 39} <= set(ranks)  # the spread reaches both ends
    assert ("(replayed: 32 of 40 ranks shown: the one that kept the others waiting, the slowest, the fastest and "
            "ranks spread evenly, in rank order)") in render_html(a.model)


@pytest.mark.parametrize("job", ["gpu40", "straggler"])
def test_waves_replay_to_the_bit_as_resource_by_resource(tmp_path, monkeypatch, job):
    """A pass over waves (the k-th resource of every rank at once) gives the same starts, ends, passes and
    binding predecessors as a pass over one resource at a time, on a 40-rank NCCL job and on gloo ranks."""
    import numpy as np

    from tests.synth import write_gpu_job
    from traceanalyze.replay import graph as gr
    from traceanalyze.replay import simulate as sim

    folder = write_gpu_job(tmp_path / "job", 40, steps=4, straggler=17) if job == "gpu40" else sample("straggler")
    a, run = _run(folder)
    g = gr.build(a.con, 1, "gpu" if job == "gpu40" else "cpu", 40 if job == "gpu40" else None)
    out = {}
    for label, at_least in (("one by one", 10**9), ("waves", 1)):
        monkeypatch.setattr(sim, "WAVE_MIN_RESOURCES", at_least)
        plan = sim.layout_of(g)
        assert (plan.waves is None) == (label == "one by one")
        out[label] = sim.replay(g, keep_binding=True)
    one, waves = out["one by one"], out["waves"]
    assert np.array_equal(one.start, waves.start) and np.array_equal(one.end, waves.end)
    assert np.array_equal(one.binding, waves.binding) and one.passes == waves.passes
    assert one.converged and np.isfinite(one.start).all()


def test_a_rewrite_replays_on_the_base_layout_to_the_bit(tmp_path):
    """The structural plan of the base graph (simulate.layout_of), reused for a rewrite of its durations, gaps and
    edge offsets (as the what-ifs do), gives the same starts, ends, passes and binding as planning again; a graph
    with other edges does not take it."""
    import dataclasses

    import numpy as np

    from tests.synth import write_gpu_job
    from traceanalyze.replay import graph as gr
    from traceanalyze.replay import simulate as sim

    a, _ = _run(write_gpu_job(tmp_path / "job", 40, steps=4, straggler=17))
    g = gr.build(a.con, 1, "gpu", 40)
    lay = sim.layout_of(g)
    assert lay.waves is not None and lay.ct.size
    cut = dataclasses.replace(g, dep_off=g.dep_off * 0.5)
    args = (g.chain_dur * 0.9, g.chain_gap * 0.5, g.inst_transfer * 2)
    reused, fresh = sim.replay(cut, *args, keep_binding=True, layout=lay), sim.replay(cut, *args, keep_binding=True)
    assert lay.fits(cut) and reused.passes == fresh.passes and reused.converged
    for x in ("start", "end", "binding"):
        assert np.array_equal(getattr(reused, x), getattr(fresh, x))
    assert not np.array_equal(reused.end, sim.replay(g, layout=lay).end)  # the rewrite moved the times
    assert not lay.fits(dataclasses.replace(g, dep_src=g.dep_src.copy()))


@pytest.mark.parametrize("job", ["df_index_resolver", "gpu40"])
def test_slabs_replay_to_the_bit_in_fewer_passes(tmp_path, monkeypatch, job):
    """A pass slab by slab (each resource cut where a task waits for a resource visited after its own) gives the
    same starts, ends and binding predecessors as one pass over whole resources, in fewer passes: the real HTA
    trace's host waits on its streams 10 times in a row (12 passes in one slab, 2 in slabs); the 40-rank NCCL job
    (over waves, resource by resource) in no more passes."""
    import numpy as np

    from tests.synth import write_gpu_job
    from traceanalyze.replay import graph as gr
    from traceanalyze.replay import simulate as sim

    folder = real("hta/df_index_resolver") if job == "df_index_resolver" else \
        write_gpu_job(tmp_path / "job", 40, steps=4, straggler=17)
    a, _ = _run(folder)
    g = gr.build(a.con, 1, "gpu", None if job == "df_index_resolver" else 40)
    monkeypatch.setattr(sim, "PART_TASKS", 1)
    out = {}
    for waves in ((10**9,) if job == "df_index_resolver" else (10**9, 1)):
        monkeypatch.setattr(sim, "WAVE_MIN_RESOURCES", waves)
        for label, min_tasks in (("one slab", 10**12), ("slabs", 0)):
            monkeypatch.setattr(sim, "SLABS_MIN_TASKS", min_tasks)
            plan = sim.layout_of(g)
            assert (len(plan.slab_end) > 1) == (label == "slabs")
            out[waves, label] = sim.replay(g, keep_binding=True)
        one, slabs = out[waves, "one slab"], out[waves, "slabs"]
        assert np.array_equal(one.start, slabs.start) and np.array_equal(one.end, slabs.end)
        assert np.array_equal(one.binding, slabs.binding) and slabs.converged
        assert slabs.passes <= one.passes
    if job == "df_index_resolver":
        assert (out[10**9, "one slab"].passes, out[10**9, "slabs"].passes) == (12, 2)


@pytest.mark.parametrize("job", ["df_index_resolver", "gpu40"])
def test_any_slabs_replay_to_the_bit(tmp_path, monkeypatch, job):
    """The fixed point does not depend on where the resources are cut nor on the order the slabs are visited in, as
    long as each resource's parts come in order: every part cut again at a random task, in random slabs (5 seeds),
    gives the one-slab times to the bit, resource by resource and in waves."""
    import numpy as np

    from tests.synth import write_gpu_job
    from traceanalyze.replay import graph as gr
    from traceanalyze.replay import simulate as sim

    folder = real("hta/df_index_resolver") if job == "df_index_resolver" else \
        write_gpu_job(tmp_path / "job", 40, steps=4, straggler=17)
    a, _ = _run(folder)
    g = gr.build(a.con, 1, "gpu", None if job == "df_index_resolver" else 40)
    monkeypatch.setattr(sim, "SLABS_MIN_TASKS", 10**12)
    one = sim.replay(g)
    slabs = sim._slabs

    def random_slabs(g, segs, udst, ct, max_cuts):
        subs, slab_of = slabs(g, segs, udst, ct, max_cuts)
        rows, out = [], []
        for (lo, hi, *_, res), k in zip(subs.tolist(), slab_of.tolist(), strict=True):
            cuts = [lo, *sorted(rng.integers(lo, hi, 2).tolist()), hi]
            for j, (x, y) in enumerate(zip(cuts, cuts[1:], strict=False)):
                if y > x:
                    rows.append([x, y, *np.searchsorted(udst, [x, y]), *np.searchsorted(ct, [x, y]), res])
                    out.append(3 * k + j + int(rng.integers(0, 2)) * (j == 2))
        return np.array(rows, np.int64), np.array(out, np.int64)

    monkeypatch.setattr(sim, "_slabs", random_slabs)
    for waves in ((10**9,) if job == "df_index_resolver" else (10**9, 1)):
        monkeypatch.setattr(sim, "WAVE_MIN_RESOURCES", waves)
        for seed in range(5):
            rng = np.random.default_rng(seed)
            sim._LAST_ORDER[0] = ()  # the pass order is kept per graph structure: cut again for each seed
            rp = sim.replay(g)
            assert np.array_equal(rp.start, one.start) and np.array_equal(rp.end, one.end) and rp.converged


def test_graph_tables_written_beside_the_whatifs_or_discarded():
    """With ``defer`` the graph's tables are written on a thread of their own while the what-ifs replay: the same
    rows once the deferred write has run; a run kept without its replay (``stages.discard_writes``) leaves none
    of them."""
    from traceanalyze import stages
    from traceanalyze.replay import whatif

    a, run = _run(sample("straggler"))
    tables = ("sim_task", "sim_dep", "sim_coll", "collective_skew")

    def counts():
        return [a.con.execute(f"SELECT count(*) FROM {t} WHERE run_id = 1").fetchone()[0] for t in tables]

    written = counts()
    assert written[0] == run["replay"]["tasks"] and written[1] == run["replay"]["edges"] and min(written) > 0
    writes: list = []
    whatif.replay_run(a.con, 1, "cpu", None, defer=writes)
    stages.discard_writes(writes)
    assert counts() == [0, 0, 0, 0] and writes == []
    whatif.replay_run(a.con, 1, "cpu", None, defer=writes)
    for w in writes:
        w()
    assert counts() == written


def test_profiler_events_counted_by_time_parts_of_a_big_file(monkeypatch):
    """A file with more CPU ops than a batch has its profiler events counted by ranges of time (approximate
    quantiles): the same counts per host task as in one batch, on the real HTA trace (one file, 100,000+ events)."""
    import numpy as np

    from traceanalyze.replay import graph as gr
    from traceanalyze.replay.graph import events

    a, _ = _run(real("hta/df_index_resolver"))
    whole = gr.build(a.con, 1, "gpu", None).prof_events
    monkeypatch.setattr(events, "PROFILER_EVENTS_BATCH", 7_000)  # read where the events are counted
    parts = events._time_parts(a.con, 1, 15)
    assert len(parts) == 15 and parts[0][0] is None and parts[-1][1] is None
    cut = gr.build(a.con, 1, "gpu", None).prof_events
    assert np.array_equal(whole, cut) and whole.sum(axis=1).tolist() == [58695, 42373, 9, 0]


def test_waves_take_the_latest_of_several_edges_into_one_task(tmp_path, monkeypatch):
    """A task with two incoming edges (here an edge doubled, 1 s later) starts after the later one in a
    wave pass as in the pass over one resource at a time; the doubled edge moves the replay."""
    import dataclasses

    import numpy as np

    from tests.synth import write_gpu_job
    from traceanalyze.replay import graph as gr
    from traceanalyze.replay import simulate as sim

    a, _ = _run(write_gpu_job(tmp_path / "job", 40, steps=4, straggler=17))
    g = gr.build(a.con, 1, "gpu", 40)
    k = int(g.dep_dst.size // 2)
    o = np.argsort(np.append(g.dep_dst, g.dep_dst[k]), kind="stable")
    g2 = dataclasses.replace(g, dep_src=np.append(g.dep_src, g.dep_src[k])[o],
                             dep_dst=np.append(g.dep_dst, g.dep_dst[k])[o],
                             dep_type=np.append(g.dep_type, g.dep_type[k])[o],
                             dep_end=np.append(g.dep_end, g.dep_end[k])[o],
                             dep_off=np.append(g.dep_off, g.dep_off[k] + 1e6)[o])
    out = {}
    for label, at_least in (("one by one", 10**9), ("waves", 1)):
        monkeypatch.setattr(sim, "WAVE_MIN_RESOURCES", at_least)
        out[label] = sim.replay(g2)
    assert np.array_equal(out["one by one"].start, out["waves"].start)
    assert np.array_equal(out["one by one"].end, out["waves"].end)
    dst = int(g.dep_dst[k])
    assert out["waves"].start[dst] > sim.replay(g).start[dst]


def test_running_maximum_per_slice_equal_rows_and_ragged_rows():
    """The running maximum restarted at each slice, for equal slices back to back (accumulated in place) and for
    ragged ones (gathered), is the one a loop over the slices computes."""
    import numpy as np

    from traceanalyze.replay import simulate as sim

    rng = np.random.default_rng(7)
    x = rng.normal(size=40)
    # slices: 4 of length 5 back to back (0..20), then lengths 3, 4, 2 (20..29), then single tasks
    starts, lengths = np.array([0, 5, 10, 15, 20, 23, 27]), np.array([5, 5, 5, 5, 3, 4, 2])
    buckets = [(starts[:4], lengths[:4], 5), (starts[4:], lengths[4:], 4)]
    want = x.copy()
    for s0, n in zip(starts, lengths, strict=True):
        want[s0:s0 + n] = np.maximum.accumulate(x[s0:s0 + n])
    got = sim._seg_cummax(x, buckets)
    assert np.array_equal(got, want)
    assert got[0] == x[0] and got[4] == x[0:5].max() and got[30] == x[30]
    # in place (the wave pass's own array): the same, with the ragged bucket's padding read after the equal rows
    # were written
    buckets.reverse()
    y = x.copy()
    assert sim._seg_cummax(y, buckets, in_place=True) is y and np.array_equal(y, want)


def _model_without_time(a) -> dict:
    m = dict(a.model)
    m.pop("generated_at")
    return m


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_replay_started_before_the_step_metrics_gives_the_same_report(tmp_path, monkeypatch, kind):
    """From EARLY_REPLAY_MIN_ROWS kernels and CPU ops the replay starts before the step metrics, on clock offsets
    from match_collectives; the report model (its replay, what-ifs and warnings) and the sim_* tables are the
    same as when it starts after them. A run without profiler steps still gets no replay and no sim_* rows."""
    from tests.synth import write_trace
    from traceanalyze import stages

    if kind == "gpu":
        for r, delay in ((0, 0.0), (1, 3000.0), (2, 10.0)):
            write_trace(tmp_path / f"rank{r}.pt.trace.json", r, _gpu_rank(r, delay), backend="nccl", world_size=3)
        folder = tmp_path
    else:
        folder = sample("straggler")
    tables = ("SELECT (SELECT count(*) FROM sim_task), (SELECT sum(start_us) FROM sim_task), (SELECT count(*) "
              "FROM sim_dep), (SELECT count(*) FROM sim_coll), (SELECT sum(replayed_us) FROM sim_result)")
    monkeypatch.setattr(stages, "EARLY_REPLAY_MIN_ROWS", 10**12)
    late = analyze(folder, Options(jobs=1))
    monkeypatch.setattr(stages, "EARLY_REPLAY_MIN_ROWS", 0)
    early = analyze(folder, Options(jobs=1))
    assert late.model["runs"][0]["replay"]["reliable"] is not None
    assert _model_without_time(early) == _model_without_time(late)
    n_tasks = {"gpu": 63, "cpu": 2892}[kind]
    assert early.con.execute(tables).fetchone() == late.con.execute(tables).fetchone()
    assert early.con.execute(tables).fetchone()[0] == n_tasks

    flat = tmp_path / "nosteps"
    flat.mkdir()
    for r in (0, 1):
        write_trace(flat / f"rank{r}.pt.trace.json", r,
                    [e for e in _gpu_rank(r, 0.0) if not str(e.get("name", "")).startswith("ProfilerStep")],
                    backend="nccl")
    stepless = analyze(flat, Options(jobs=1))
    assert stepless.model["runs"][0]["steps"] == []
    assert not stepless.model["runs"][0].get("replay")
    assert stepless.con.execute(tables).fetchone()[0] == 0


def test_graph_sort_helpers_match_the_sorts_they_replace():
    """The graph build's run-coded ``unique_rows`` and one-key ``_task_order`` give what ``np.unique(axis=0)`` and
    the four-key lexsort give, ties (a step's end and the next one's begin marker at one start) included."""
    import numpy as np

    from traceanalyze.replay.graph.source import dense_codes, unique_rows
    from traceanalyze.replay.graph.tasks import _task_order

    fid = np.array([3, 3, 3, 1, 1, 3, 2, 2])
    tid = np.array([7, 7, 5, 9, 9, 7, 5, 5])
    uniq, inv = unique_rows(fid, tid)
    assert uniq.tolist() == [[1, 9], [2, 5], [3, 5], [3, 7]]
    assert inv.tolist() == [3, 3, 2, 0, 0, 3, 1, 1]
    assert dense_codes(fid, tid).tolist() == inv.tolist()
    assert unique_rows(fid[:0], tid[:0])[0].shape == (0, 2)
    res = np.array([1, 0, 1, 1, 0, 1, 1])
    rel = np.array([50, 20, 10, 50, 20, 50, 50])
    kind_order = np.array([2, 2, 2, 0, 1, 2, 1])  # 0 end marker, 1 begin marker, 2 a task
    neg_dur = -np.array([3, 0, 4, 0, 0, 9, 0])
    order = _task_order(res, rel, kind_order, neg_dur)
    assert order.tolist() == [4, 1, 2, 3, 6, 5, 0] == np.lexsort((neg_dur, kind_order, rel, res)).tolist()



def test_streams_visited_in_forward_order():
    """Each rank's streams are visited in an order where the edges between them run forward (no_host_sync's anchors
    from the busiest stream, visited after the others in resource order), the host threads and a rank whose stream
    edges form a cycle left as they were; an order already forward is kept."""
    from types import SimpleNamespace

    import numpy as np

    from traceanalyze.replay.passorder import forward_order

    # resources 0-3 rank 0 (host, streams 1, 2, 3), 4-6 rank 1 (host, streams 5, 6); one task each
    res = np.arange(7)
    rank = np.array([0, 0, 0, 0, 1, 1, 1])
    stream = np.array([False, True, True, True, False, True, True])
    order = [0, 4, 1, 2, 3, 5, 6]  # hosts first, then the streams in resource order
    # rank 0: 3 -> 1 and 3 -> 2 (back), 0 -> 3 (a launch); rank 1: 6 -> 5 and 5 -> 6 (a cycle)
    src, dst = np.array([3, 3, 0, 6, 5]), np.array([1, 2, 3, 5, 6])
    g = SimpleNamespace(res=res, rank=rank, dep_src=src, dep_dst=dst)
    assert forward_order(g, res, order, stream) == [0, 4, 3, 1, 2, 5, 6]
    fwd = SimpleNamespace(res=res, rank=rank, dep_src=np.array([1, 1]), dep_dst=np.array([2, 3]))
    assert forward_order(fwd, res, order, stream) == order


def test_build_reads_files_by_range_and_list():
    """The build's file filter (``in_files``) keeps exactly the listed ids, an empty list none; a result without
    strings comes whole (``fetch_arrow``), NULL read as 0, its arrays read only."""
    import duckdb

    from traceanalyze.replay.graph import source

    con = duckdb.connect()
    con.execute("CREATE TABLE c AS SELECT i AS file_id, CASE WHEN i = 4 THEN NULL ELSE 10 * i END AS v "
                "FROM range(8) t(i)")
    for fids, want in (([1, 4, 6], [1, 4, 6]), ([5], [5]), ([], [])):
        got = source.fetch_arrow(con, f"SELECT file_id, v FROM c WHERE {source.in_files('file_id', fids, '$1')} "
                                      "ORDER BY file_id", [fids])
        assert got["file_id"].tolist() == want
        assert got["v"].tolist() == [0 if f == 4 else 10 * f for f in want]
        assert not got["v"].flags.writeable or not want


def test_launching_ops_grouped_and_names_read_as_hashes(monkeypatch):
    """``_by_op`` sorts the fp32 ops by (file, External id) and ORs the codes of one id, as the GROUP BY it
    replaces did; a query's names read as hashes (``fetch_arrow(hash_names=True)``) give the codes and sorted names
    the strings give, and two names of one hash fall back to the strings."""
    import duckdb
    import numpy as np

    from traceanalyze.replay.graph import source
    from traceanalyze.replay.graph.tasks import _by_op, _or_runs

    fid, ext, code = _by_op(np.array([2, 1, 2, 1, 2]), np.array([5, 9, 5, 3, 4]), np.array([1, 3, 4, 1, 1]))
    assert (fid.tolist(), ext.tolist(), code.tolist()) == ([1, 1, 2, 2], [3, 9, 4, 5], [1, 3, 1, 5])
    # the same ops as one (file, External id) key, as _launching_op_codes sorts them where the ids fit
    key = np.array([2, 1, 2, 1, 2]) * 10 + np.array([5, 9, 5, 3, 4])
    o = np.argsort(key, kind="stable")
    key, code = _or_runs(np.array([1, 3, 4, 1, 1])[o], key[o])
    assert (key.tolist(), code.tolist()) == ([13, 19, 24, 25], [1, 3, 1, 5])
    con = duckdb.connect()
    con.execute("CREATE TABLE k AS SELECT * FROM (VALUES (1, 'b'), (2, 'a'), (3, NULL), (4, 'b'), (5, 'c')) t(x, name)")
    sql = "SELECT x, name FROM k WHERE x > $1"
    strings = source.fetch_arrow(con, sql, [1])
    hashed = source.fetch_arrow(con, sql, [1], hash_names=True)
    assert strings["name"][0].tolist() == hashed["name"][0].tolist() == [0, 3, 1, 2]
    assert strings["name"][1].to_pylist() == hashed["name"][1].to_pylist() == ["a", "b", "c", None]
    assert hashed["x"].tolist() == [2, 3, 4, 5]
    monkeypatch.setattr(source, "_hashed_names", lambda *a: None)  # a collision: the strings are read
    assert source.fetch_arrow(con, sql, [1], hash_names=True)["name"][0].tolist() == [0, 3, 1, 2]


@pytest.mark.parametrize("min_tasks", [10**12, 0])
def test_parts_whose_inputs_did_not_change_are_skipped_to_the_bit(monkeypatch, min_tasks):
    """Without waves, a pass skips a resource part none of whose inputs changed since its last visit: the real HTA
    trace (host waits on its streams 10 times in a row), in one slab and in slabs, gives the same starts, ends and
    binding as a pass that takes every part to read every other part (revisited whenever anything changed), in
    fewer part visits."""
    import numpy as np

    from traceanalyze.replay import graph as gr
    from traceanalyze.replay import simulate as sim

    a, _ = _run(real("hta/df_index_resolver"))
    g = gr.build(a.con, 1, "gpu", None)
    monkeypatch.setattr(sim, "SLABS_MIN_TASKS", min_tasks)
    lay = sim.layout_of(g)
    assert lay.waves is None and len(lay.segs) > 1
    every = sim.layout_of(g)
    k = len(every.segs)
    every.seg_deps = [(list(range(k)), True)] * k
    visits = []
    seg_pass = sim._seg_pass

    def counted(p, *args):  # each visit (and each gather that changed the ready times) takes a stamp
        before = p.track.stamp
        seg_pass(p, *args)
        visits.append(p.track.stamp - before)

    monkeypatch.setattr(sim, "_seg_pass", counted)
    skipped = sim.replay(g, keep_binding=True, layout=lay)
    n_skipped, visits[:] = sum(visits), []
    full = sim.replay(g, keep_binding=True, layout=every)
    assert np.array_equal(skipped.start, full.start) and np.array_equal(skipped.end, full.end)
    assert np.array_equal(skipped.binding, full.binding) and skipped.passes == full.passes and skipped.converged
    assert n_skipped < sum(visits)


def test_small_unique_is_numpy_unique():
    """:func:`~traceanalyze.replay.graph.small_unique` gives ``np.unique``'s keys and inverse, dtypes included,
    over a table (keys in a narrow range) and by the sort it falls back to (a wide range, no keys)."""
    import numpy as np

    from traceanalyze.replay.graph import small_unique

    rng = np.random.default_rng(3)
    for x in (rng.integers(0, 40, 1000), rng.integers(0, 10**12, 50), np.array([7, 7, 0]), np.zeros(0, np.int64)):
        keys, inv = small_unique(x.astype(np.int64))
        want_k, want_i = np.unique(x.astype(np.int64), return_inverse=True)
        assert keys.dtype == want_k.dtype and inv.dtype == want_i.dtype
        assert keys.tolist() == want_k.tolist() and inv.tolist() == want_i.reshape(-1).tolist()
    assert [k.tolist() for k in small_unique(np.array([5, 2, 5, 9], np.int64))] == [[2, 5, 9], [1, 0, 1, 2]]


def test_counted_pairs_mask_by_table_and_for_huge_step_numbers():
    """``gaps._in_pairs`` marks the tasks of the given (rank, step) pairs, outside steps never: by a table over
    rank × step, and by ``isin`` where a step number from a file (``ProfilerStep#2000000000``) would make that table
    2 GB a rank (2 TB for 1,024 ranks)."""
    from types import SimpleNamespace

    import numpy as np

    from traceanalyze.replay.gaps import _in_pairs

    g = SimpleNamespace(rank=np.array([0, 0, 1, 1, 1, 2]), step=np.array([3, -1, 3, 4, 5, 4]))
    assert _in_pairs(g, {(0, 3), (1, 4), (2, 9)}).tolist() == [True, False, False, True, False, False]
    huge = SimpleNamespace(rank=np.array([0, 0, 1, 1, 1, 1023]), step=np.array([3, -1, 3, 2_000_000_000, 5, 4]))
    assert _in_pairs(huge, {(1, 2_000_000_000), (0, 3), (1023, 4)}).tolist() == [True, False, False, True, False, True]
