"""Merged multi-rank Chrome/Perfetto trace (traceanalyze.export, `traceanalyze export`, `report --export`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import traceanalyze as ta
from tests.conftest import real, sample
from tests.synth import cpu_job, write_trace
from traceanalyze.cli import cli
from traceanalyze.export import FINDINGS_THREAD, FINDINGS_TID


def _load(p: Path) -> dict:
    with (gzip.open(p, "rt", encoding="utf-8") if p.name.endswith(".gz") else open(p, encoding="utf-8")) as fh:
        return json.load(fh)


def _ends(doc: dict, prefix: str) -> dict[int, list[float]]:
    """pid -> end times (µs) of the X events whose name starts with prefix, in start order (findings left out)."""
    out: dict[int, list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["name"].startswith(prefix) and e.get("cat") != "traceanalyze":
            out.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    return {p: [end for _, end in sorted(v)] for p, v in out.items()}


@pytest.fixture()
def skewed(tmp_path):
    """Two gloo ranks; rank 1's clock reads 5 ms ahead and it computes 4 ms longer per step (a straggler)."""
    d = tmp_path / "job"
    write_trace(d / "rank0.json", 0, cpu_job(0, 0.0))
    write_trace(d / "rank1.json", 1, cpu_job(1, 5000.0, slow=4000.0))
    return d


def test_one_process_per_rank_aligned_and_annotated(skewed, tmp_path):
    with ta.analyze(skewed, jobs=1) as a:
        res = a.export(tmp_path / "merged.json.gz")
        titles = {f["kind"]: f["title"] for f in a.model["findings"]}
    doc = _load(tmp_path / "merged.json.gz")
    assert res.ranks == [0, 1] and res.clock_offsets_us == {0: 0.0, 1: 5000.0}
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names[(0, FINDINGS_TID)] == FINDINGS_THREAD and names[(0, 1)] == "thread 1 (python)"
    # after subtracting rank 1's 5 ms offset the matched all_reduces end together
    ends = _ends(doc, "gloo:all_reduce")
    assert len(ends[0]) == len(ends[1]) == 3
    assert max(abs(a - b) for a, b in zip(ends[0], ends[1], strict=True)) < 1.0
    assert min(e["ts"] for e in doc["traceEvents"] if e["ph"] == "X") == 0.0
    marks = [e for e in doc["traceEvents"] if e.get("cat") == "traceanalyze"]
    strag = [e for e in marks if e["name"].startswith("straggler")]
    # the straggler's largest host gaps (no op on its step thread), not its whole steps: after its all_reduce
    # call until the step ends (7.17-10 ms of each 10 ms step), then the 0.1 ms before its first op, ...
    assert "straggler" in titles and all(e["pid"] == 1 for e in strag)
    assert all(e["args"]["finding"] == titles["straggler"] for e in strag)
    assert [(e["name"], e["ts"], e["dur"]) for e in strag[:2]] == [("straggler: host gap in step 1", 7170.0, 2830.0),
                                                                    ("straggler: host gap in step 2", 17170.0, 2830.0)]
    assert strag[0]["args"]["from_step_start_ms"] == 7.17 and strag[0]["args"]["host_gap_ms_per_step"] == 2.98
    assert len(strag) == 5 and max(e["dur"] for e in strag) < 10_000.0  # none spans a whole step
    exposed = [e for e in marks if e["name"] == "exposed communication"]
    assert {e["pid"] for e in exposed} == {0, 1}
    # rank 0 waits in the all_reduce from 3.15 ms to 9 ms of each step: nothing computes meanwhile
    assert sorted(e["dur"] for e in exposed if e["pid"] == 0) == [5850.0] * 3
    assert doc["otherData"]["clock_offsets_us"] == {"0": 0.0, "1": 5000.0}


def test_max_events_keeps_findings_and_reports_what_was_dropped(skewed, tmp_path):
    with ta.analyze(skewed, jobs=1) as a:
        res = a.export(tmp_path / "small.json", max_events=10)
    doc = _load(tmp_path / "small.json")
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == res.n_events == 10
    assert res.kept["findings"] == 10 and sum(res.dropped.values()) > 0  # 5 host gaps + 6 exposed: findings first
    assert doc["otherData"]["dropped"] == res.dropped


def test_cli_export_and_report_link(skewed, tmp_path):
    runner = CliRunner()
    out = tmp_path / "m.json"
    r = runner.invoke(cli, ["export", str(skewed), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert _load(out)["otherData"]["ranks"] == [0, 1]
    html = tmp_path / "rep" / "report.html"
    r = runner.invoke(cli, ["report", str(skewed), "-o", str(html), "--export", "merged.json.gz", "-q"])
    assert r.exit_code == 0, r.output
    assert (html.parent / "merged.json.gz").is_file()
    assert 'href="merged.json.gz"' in html.read_text()
    # from the database the report left, without the traces
    r = runner.invoke(cli, ["export", str(html.with_suffix(".duckdb")), "-o", str(tmp_path / "db.json")])
    assert r.exit_code == 0, r.output
    assert _load(tmp_path / "db.json")["otherData"]["ranks"] == [0, 1]
    r = runner.invoke(cli, ["export", str(skewed), "-o", str(out), "--run", "nope"])
    assert r.exit_code == 1 and "no run named 'nope'" in r.output


def test_gpu_trace_streams_and_kernels(tmp_path):
    src = real("hta/trace_filter")
    with ta.analyze(src, jobs=1) as a:
        res = a.export(tmp_path / "tf.json.gz")
        n_kernels = a.con.execute("SELECT count(*) FROM kernels WHERE cat <> 'gpu_user_annotation'").fetchone()[0]
    doc = _load(tmp_path / "tf.json.gz")
    assert res.kept["kernels"] == n_kernels and not res.dropped
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name" and e["pid"] == 0}
    assert {"GPU 0 stream 7", "GPU 0 stream 23", FINDINGS_THREAD} <= threads
    steps = [e for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    assert {e["pid"] for e in steps} == {0, 1}
    assert any(e["name"] == "exposed communication" for e in doc["traceEvents"])


def test_straggler_sample_alignment(tmp_path):
    """The recorded 4-rank gloo straggler run (one host, so true offsets are ~0): gloo ranks leave a ring
    all_reduce some ms apart (4 processes share 2 cores), so after alignment matched all_reduces end within a
    tenth of a step (median), no worse than on the raw clocks."""
    src = sample("straggler")
    with ta.analyze(src, jobs=1) as a:
        res = a.export(tmp_path / "s.json.gz")
        slow = [f for f in a.model["findings"] if f["kind"] == "straggler"]
    doc = _load(tmp_path / "s.json.gz")
    assert res.ranks == [0, 1, 2, 3]
    ends = _ends(doc, "gloo:all_reduce")
    n = min(len(v) for v in ends.values())
    spreads = sorted(max(v[i] for v in ends.values()) - min(v[i] for v in ends.values()) for i in range(n))
    raw = {r: [x + res.clock_offsets_us[r] for x in v] for r, v in ends.items()}
    raw_spreads = sorted(max(v[i] for v in raw.values()) - min(v[i] for v in raw.values()) for i in range(n))
    step_us = a.model["runs"][0]["step_time_us"]
    assert spreads[n // 2] < 0.1 * step_us
    assert spreads[n // 2] <= raw_spreads[n // 2] + 1000.0
    if slow:
        marks = [e for e in doc["traceEvents"] if e["name"].startswith("straggler")]
        assert marks and {e["pid"] for e in marks} == set(slow[0]["ranks"])
