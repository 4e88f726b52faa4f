"""Issue 30, items 3-5: honest partial runs ("Partial: k of N ranks traced", an interconnect finding that waits for
untraced ranks could explain is inconclusive), a what-if for every finding that maps to a scenario (or
``whatif_missing`` with the reason), and what-ifs that change concurrency flagged unreliable when CPU ranks share
cores."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import sample
from tests.synth import write_gpu_job, write_trace, x
from traceanalyze import diagnose
from traceanalyze.findings import KINDS
from traceanalyze.logs import Fact, core_sharing
from traceanalyze.metrics.collectives import CollectiveAnalysis
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.replay.whatif import SCENARIOS
from traceanalyze.report import render_html, render_markdown


def _finding(model: dict, kind: str) -> dict:
    return next(f for f in model["findings"] if f["kind"] == kind)


def _whatif(run: dict, scenario: str) -> dict:
    return next(w for w in run["whatif"] if w["scenario"] == scenario)


# -- 3. partial runs ----------------------------------------------------------------------------------------

def test_one_of_16_ranks_is_a_partial_verdict_and_the_interconnect_finding_is_inconclusive(tmp_path):
    # 16 NCCL ranks, rank 5 idles 30 ms on the host each step; only rank 0's trace is in the folder: its all_reduce
    # waits for rank 5, which reads as exposed communication
    write_gpu_job(tmp_path, 16, 6, straggler=5)
    for r in range(1, 16):
        (tmp_path / f"rank{r}.json").unlink()
    m = analyze(tmp_path, Options(jobs=1)).model
    assert m["verdict"] == ("Partial: 1 of 16 ranks traced (the missing ranks could explain the waits inside "
                            "collectives: slow collectives). Inconclusive: 36% of the step is exposed communication, "
                            "either collectives' transfer or waiting for ranks not in these traces; no other finding "
                            "reaches medium severity.")
    assert m["partial"] == {"run": tmp_path.name, "traced_ranks": 1, "world_size": 16,
                            "could_explain": ["slow_collectives"]}
    assert m["runs"][0]["partial"] == {"traced_ranks": 1, "world_size": 16, "could_explain": ["slow_collectives"]}
    f = _finding(m, "slow_collectives")
    assert (f["severity"], f["impact_pct"]) == ("low", 35.8)
    assert f["evidence"][-1] == ("inconclusive: 1 of 16 ranks traced, so the collectives' time may be waiting for the "
                                 "missing ranks; the link's expected bandwidth is unknown, so the transfer cannot show "
                                 "it is transfer")
    # no link known: no ideal_interconnect what-if, and the card says why
    assert f["whatif_missing"] == "the link's expected bandwidth is unknown (pass --link-bw GB/s)"
    page = render_html(m)
    assert 'id="partial"' in page and "<b>Partial:</b> 1 of 16 ranks traced: 15 ranks have no trace here." in page
    assert "<b>No what-if:</b> the link&#39;s expected bandwidth is unknown (pass --link-bw GB/s)" in page
    md = render_markdown(m)
    assert ("**Partial:** 1 of 16 ranks traced; 15 without a trace; the missing ranks could explain the waits inside "
            "collectives behind: slow collectives.") in md


def test_a_complete_run_has_no_partial(tmp_path):
    write_gpu_job(tmp_path, 2, 6, straggler=1)
    m = analyze(tmp_path, Options(jobs=1)).model
    assert m["partial"] is None and m["runs"][0]["partial"] is None
    assert not m["verdict"].startswith("Partial")
    assert 'id="partial"' not in render_html(m)


def _ev(busbw: float | None, expected: float | None) -> diagnose.RunEvidence:
    """One traced rank of 16, 40 % of its window exposed communication, all_reduce busbw ``busbw`` GB/s."""
    rank = {"rank": 0, "exposed_comm_us": 4000.0, "window_us": 10_000.0, "n_steps": 1, "comm_comp_overlap_pct": 0.0,
            "idle_pct": 10.0}
    coll = CollectiveAnalysis(mode="gpu", matched=False, total_bytes=10**9, busbw_gbps=busbw)
    return diagnose.RunEvidence(name="r", mode="gpu", world_size=16, gpu_model=None, ranks=[rank], steps=[],
                                step_time_us=10_000.0, coll=coll, link={"expected_gbps": expected, "source": "test"})


def test_a_transfer_at_the_links_speed_proves_the_interconnect_finding_on_a_partial_run():
    proven = diagnose.rule_exposed_communication(_ev(busbw=150.0, expected=240.0))[0]
    assert (proven.severity, proven.impact_pct) == ("high", 40.0)
    assert proven.title.startswith("Communication is exposed: 40%")
    assert proven.evidence[-1] == ("1 of 16 ranks traced, but busbw 150 GB/s is 62% of the expected 240 GB/s: the "
                                   "collectives run at the link's speed, so their time is transfer, not waiting")
    slow = diagnose.rule_exposed_communication(_ev(busbw=20.0, expected=240.0))[0]
    assert (slow.severity, slow.impact_pct) == ("low", 40.0)
    assert slow.title.startswith("Inconclusive: 40% of the step is exposed communication")
    assert "busbw 20 GB/s is 8% of the expected 240 GB/s, which waiting for the missing ranks and a slow link " \
           "both explain" in slow.evidence[-1]
    # the verdict names it, after the partial prefix
    slow.run = "r"
    assert diagnose.verdict([slow], [_ev(20.0, 240.0)]).startswith(
        "Partial: 1 of 16 ranks traced (the missing ranks could explain the waits inside collectives: slow "
        "collectives). Inconclusive: 40% of the step")


# -- 4. a what-if for every finding ---------------------------------------------------------------------------

def test_every_finding_kind_has_a_scenario_or_a_reason():
    assert set(diagnose.WHATIF_OF_KIND) == set(KINDS)
    for kind, (sc, how) in diagnose.WHATIF_OF_KIND.items():
        if sc is None:
            assert how, kind
        elif how == "arithmetic":  # priced by its rule from the stated facts, never replayed (no whatif row)
            assert sc not in SCENARIOS and kind not in diagnose.KIND_TO_SCENARIO, kind
        else:
            assert sc in SCENARIOS and how in ("", "ranks"), kind
    assert diagnose.KIND_TO_SCENARIO["straggler"] == "no_straggler"
    assert "gradient_accumulation" not in diagnose.KIND_TO_SCENARIO
    assert diagnose.WHATIF_OF_KIND["gradient_accumulation"] == ("ga_scaled", "arithmetic")


def _compute_straggler(folder: Path, ratio: float = 1.6, steps: int = 5) -> Path:
    """2 gloo ranks; rank 1 computes ``ratio`` × rank 0's 20 ms each step (a larger batch), then both all-reduce:
    rank 0 waits for it; steps start and end together on both ranks."""
    comp = {0: 20_000.0, 1: 20_000.0 * ratio}
    for rank in (0, 1):
        ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}}]
        t = 1000.0
        for s in range(1, steps + 1):
            arrive = t + 100 + comp[rank] + 50
            end = t + 100 + max(comp.values()) + 50 + 2000.0  # 2 ms transfer once both arrived
            step_end = end + 2500.0
            ev.append(x("user_annotation", f"ProfilerStep#{s}", t, step_end - t))
            ev.append(x("cpu_op", "aten::mm", t + 100, comp[rank], **{"Input type": ["float", "float"],
                                                                      "Input Dims": [[256, 256], [256, 256]]}))
            ev.append(x("cpu_op", "c10d::allreduce_", arrive, 20.0))
            ev.append(x("user_annotation", "gloo:all_reduce", arrive, end - arrive, tid=2,
                        **{"Input type": ["float"], "Input Dims": [[1 << 20]]}))
            ev.append(x("cpu_op", "aten::add_", end + 200, 1000.0))
            t = step_end
        write_trace(folder / f"rank{rank}.json", rank, ev, world_size=2)
    return folder


def test_a_compute_straggler_gets_its_no_straggler_whatif(tmp_path):
    # rank 1 works 1.6x: the straggler rule names it (excess 19.6% of the median rank's work), but its host time is
    # only 22% over the 2-rank median, under the replay's own 25% test: no_straggler is priced for the finding
    m = analyze(_compute_straggler(tmp_path), Options(jobs=1)).model
    run = m["runs"][0]
    f = _finding(m, "straggler")
    assert f["ranks"] == [1] and "whatif_missing" not in f
    w = _whatif(run, "no_straggler")
    assert w["assumptions"].startswith("straggler rank(s) 1 (named by the straggler finding)")
    assert w["reliable"] is True and "unreliable_reason" not in w
    assert w["saving_pct"] > 10
    assert f["impact_pct"] == round(w["saving_pct"], 1)  # the finding is priced by it
    assert any("impact from the what-if replay (no_straggler)" in e for e in f["evidence"])


def test_a_finding_without_a_scenario_says_why_on_its_card():
    m = analyze(sample("pairs/straggler_sleep/slow"), Options(jobs=1)).model
    f = _finding(m, "fp32_matmul")  # the host has no native bf16: the bf16 what-if is left out
    assert f["whatif_missing"].startswith("the host CPU (Intel(R) Xeon(R) Processor @ 2.80GHz) has neither AMX nor "
                                          "AVX512-BF16")
    assert "whatif_missing" not in _finding(m, "straggler")
    assert "<b>No what-if:</b> the host CPU (Intel(R) Xeon(R) Processor @ 2.80GHz) has neither AMX" in render_html(m)


def test_price_missing_whatifs_uses_the_table_and_the_pricer():
    def f(kind: str, ranks: list[int]) -> diagnose.Finding:
        return diagnose.Finding("config" if kind != "straggler" else "imbalance", kind, "medium", 12.0, ranks, "t",
                                [], "r")

    asked = []

    def price(scenario, ranks=None):
        asked.append((scenario, ranks))
        if scenario == "no_straggler":
            return {"scenario": scenario, "saving_pct": 20.0}, "", [[1, scenario, 0, 1, 10.0, 8.0]]
        return None, "nothing to remove", []

    whatifs = [{"scenario": "no_compile"}, {"scenario": "all"}]
    fs = [f("straggler", [3]), f("dataloader", [0]), f("gradient_accumulation", []), f("compile_overhead", [0])]
    rows = diagnose.price_missing_whatifs(fs, whatifs, price)
    assert asked == [("no_straggler", [3]), ("no_dataloader_wait", None)]
    assert [w["scenario"] for w in whatifs] == ["no_compile", "no_straggler", "all"]
    assert rows == [[1, "no_straggler", 0, 1, 10.0, 8.0]]
    assert [x.whatif_missing for x in fs] == [None, "nothing to remove",
                                              "its what-if (ga_scaled) is arithmetic on the run's stated batch, not "
                                              "a replay: its figures are in the run's own gradient accumulation "
                                              "finding", None]
    assert "whatif_missing" not in diagnose.to_dicts(fs)[0]
    fresh = [f("launch_bound", [0])]
    diagnose.price_missing_whatifs(fresh, [], None)
    assert fresh[0].whatif_missing == "the run has no what-if replay (no counted profiler step)"


# -- 5. shared cores ------------------------------------------------------------------------------------------

def test_what_ifs_that_change_concurrency_are_unreliable_when_ranks_share_cores():
    # 4 gloo ranks x 1 thread (OMP_NUM_THREADS=1) on 2 cores
    m = analyze(sample("pairs/straggler_compute/slow"), Options(jobs=1)).model
    run = m["runs"][0]
    why = ("4 ranks × 1 thread (OMP_NUM_THREADS) on 2 cores of host vm: the ranks share cores, so a fix that changes "
           "how many ranks compute at once (a straggler or a wait removed) changes every op's duration, which a "
           "replay of measured durations cannot know")
    assert run["replay"]["core_sharing"] == {"shared": True, "host": "vm", "ranks_per_host": 4, "threads_per_rank": 1,
                                             "threads_source": "OMP_NUM_THREADS", "cores": 2, "why": why}
    w = _whatif(run, "no_straggler")
    assert (w["reliable"], w["unreliable_reason"]) == (False, why)
    # no "all": no_dataloader_wait saves 0.41 %, within the 5.43 % step-to-step noise, so it would be no_straggler
    assert [w["scenario"] for w in run["whatif"]] == ["no_straggler", "no_dataloader_wait"]
    assert _whatif(run, "no_dataloader_wait")["reliable"] is True  # no change of concurrency
    # the straggler finding keeps its rule's estimate: the replay's figure is not reliable here
    assert not any("impact from the what-if replay (no_straggler)" in e for e in _finding(m, "straggler")["evidence"])
    page = render_html(m)
    assert "⚠ unreliable" in page and "4 ranks × 1 thread (OMP_NUM_THREADS) on 2 cores of host vm" in page
    assert ("Unreliable: no_straggler: 4 ranks × 1 thread (OMP_NUM_THREADS) on 2 cores of host vm: the ranks "
            "share cores") in render_markdown(m)  # nothing here needs a Markdown escape


def test_one_thread_per_core_keeps_the_straggler_whatif_reliable():
    # 2 ranks x 1 thread on 2 cores
    run = analyze(sample("pairs/straggler_sleep/slow"), Options(jobs=1)).model["runs"][0]
    assert run["replay"]["core_sharing"]["shared"] is False
    w = _whatif(run, "no_straggler")
    assert w["reliable"] is True and "unreliable_reason" not in w


def _facts(*files: dict) -> dict[str, list[Fact]]:
    out: dict[str, list[Fact]] = {}
    for i, d in enumerate(files):
        for k, v in d.items():
            num = float(v) if k.startswith("cpu_") else None
            out.setdefault(k, []).append(Fact(k, str(v), num, f"env_rank{i}.json"))
    return out


def test_core_sharing_from_the_env_files():
    # threads unknown: 2 ranks on 8 cores cannot be judged; 4 ranks on 2 cores share whatever their threads
    unknown = core_sharing(_facts({"cpu_count": 8}, {"cpu_count": 8}), 2)
    assert unknown["shared"] is None and unknown["threads_per_rank"] is None
    assert unknown["why"].startswith("2 ranks on 8 cores, threads per rank unknown")
    assert core_sharing(_facts(*[{"cpu_count": 2}] * 4), 4)["shared"] is True
    # torch's threads (cpu.threads) first: 2 ranks x 2 threads on 2 cores share
    two = core_sharing(_facts(*[{"cpu_count": 2, "cpu_threads": 2, "env": "OMP_NUM_THREADS=1"}] * 2), 2)
    assert (two["shared"], two["threads_per_rank"], two["threads_source"]) == (True, 2, "cpu.threads")
    # each rank pinned to 4 of 64 cores, 4 threads: its own cores
    pinned = core_sharing(_facts(*[{"cpu_count": 64, "cpu_cpus_allowed": 4, "cpu_threads": 4}] * 2), 2)
    assert (pinned["shared"], pinned["cores"]) == (False, 8)
    # two hosts of 2 ranks x 1 thread on 2 cores: none shares
    hosts = [{"cpu_count": 2, "cpu_threads": 1, "hostname": h} for h in ("a", "a", "b", "b")]
    assert core_sharing(_facts(*hosts), 4)["shared"] is False
    assert core_sharing({}, 4) is None


def test_gpu_runs_ignore_core_sharing(tmp_path):
    write_gpu_job(tmp_path, 2, 6, straggler=1)
    (tmp_path / "env_rank0.json").write_text('{"traceanalyze_capture": 1, "rank": 0, "world_size": 2, '
                                             '"cpu": {"cpus": 1, "threads": 8}}')
    run = analyze(tmp_path, Options(jobs=1)).model["runs"][0]
    assert "core_sharing" not in run["replay"]
    assert all(w["reliable"] and "unreliable_reason" not in w for w in run["whatif"])


def test_a_skipped_replay_is_the_reason_on_every_finding_that_maps_to_a_scenario(tmp_path, monkeypatch):
    import traceanalyze.replay.whatif as whatif

    def boom(*a, **k):
        raise ValueError("a graph the replay cannot handle")

    monkeypatch.setattr(whatif, "replay_run", boom)
    m = analyze(_compute_straggler(tmp_path), Options(jobs=1)).model
    assert m["runs"][0]["whatif"] == []
    f = _finding(m, "straggler")
    assert f["whatif_missing"] == "the replay was skipped: a graph the replay cannot handle"
