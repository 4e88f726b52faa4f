"""discover: which file is what, runs, ranks and profiling windows, on generated traces."""

from __future__ import annotations

import gzip
import json

import pytest

from traceanalyze.discover import assign_ranks, discover
from traceanalyze.names import rank_from_name
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze


def tiny_trace(path, rank=None, world=None, t0=0.0):
    di = {} if rank is None else {"distributedInfo": {"rank": rank, "world_size": world}}
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t0 + 10, "dur": 5, "args": {}},
          {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 9, "ts": t0 + 12, "dur": 10,
           "args": {}}]
    data = json.dumps({"schemaVersion": 1, **di, "traceEvents": ev}).encode()
    path.write_bytes(gzip.compress(data) if str(path).endswith(".gz") else data)


@pytest.mark.parametrize("name, rank", [("rank3.json", 3), ("trace_rank-12.pt.trace.json.gz", 12),
                                        ("worker_rank_7.json", 7), ("[rank5]trace.json", 5),
                                        ("host_4632.1795.pt.trace.json.gz", None), ("franky0.json", None)])
def test_rank_from_name(name, rank, tmp_path):
    assert rank_from_name(tmp_path / name) == rank


def test_header_rank_wins_and_single_unranked_file_is_rank_0(tmp_path):
    a, b = tmp_path / "rank0.json", tmp_path / "x.json"
    ranks, warnings = assign_ranks([a], {a: {"distributedInfo": {"rank": 6}}})
    assert ranks == {a: 6} and warnings == []
    ranks, _ = assign_ranks([b], {b: {}})
    assert ranks == {b: 0}


def test_discover_groups_runs_and_skips_chakra(tmp_path):
    (tmp_path / "run_a").mkdir()
    (tmp_path / "run_b").mkdir()
    tiny_trace(tmp_path / "run_a" / "rank0.json", 0, 2)
    tiny_trace(tmp_path / "run_a" / "rank1.json.gz", 1, 2)
    tiny_trace(tmp_path / "run_b" / "only.json")
    (tmp_path / "run_a" / "rank0.et.json").write_text('{"schema": "1.0", "nodes": []}')
    (tmp_path / "run_a" / "notes.json").write_text('{"hello": "world"}')
    d = discover([tmp_path])
    assert [r.name for r in d.runs] == ["run_a", "run_b"]
    assert [p.name for p in d.runs[0].traces] == ["rank0.json", "rank1.json.gz"]
    skipped = dict(d.skipped)
    assert "Chakra" in skipped[str(tmp_path / "run_a" / "rank0.et.json")]


def test_symlink_loop_does_not_hang(tmp_path):
    tiny_trace(tmp_path / "rank0.json", 0, 1)
    (tmp_path / "loop").symlink_to(tmp_path)
    d = discover([tmp_path])
    assert len(d.runs) == 1 and len(d.runs[0].traces) == 1


def test_two_windows_of_one_rank_are_kept(tmp_path):
    tiny_trace(tmp_path / "a.json", 0, 1, t0=0)
    tiny_trace(tmp_path / "b.json", 0, 1, t0=1000)
    a = analyze(tmp_path, Options(jobs=1))
    (run,) = a.model["runs"]
    (r,) = run["ranks"]
    assert r["n_files"] == 2
    assert r["window_us"] == pytest.approx(2 * 12)  # each window: 10 → 22 µs
    rows = a.con.execute('SELECT "window", path FROM files ORDER BY "window"').fetchall()
    assert [w for w, _ in rows] == [0, 1] and rows[0][1].endswith("a.json")


def test_missing_ranks_are_reported_with_advice(tmp_path):
    for r in range(5):
        tiny_trace(tmp_path / f"rank{r}.json", r, 8)
    a = analyze(tmp_path, Options(jobs=1))
    (msg,) = [w["message"] for w in a.model["warnings"] if "no trace" in w["message"]]
    assert msg.startswith("3 of 8 ranks have no trace (ranks 5–7)") and "copy every rank's trace" in msg
    run = a.model["runs"][0]
    assert (run["missing_ranks"], run["n_missing_ranks"]) == ([[5, 7]], 3)  # spans, never the ranks one by one


def test_own_outputs_beside_the_traces_are_not_read_back(tmp_path):
    from traceanalyze.export import export_trace

    for r in range(2):
        tiny_trace(tmp_path / f"rank{r}.json", r, 2)
    first = analyze(tmp_path, Options(jobs=1))
    from traceanalyze.pipeline import to_json

    (tmp_path / "report.json").write_text(to_json(first.model))  # a --json report written into the folder
    export_trace(first.con, tmp_path / "merged.json.gz")
    again = analyze(tmp_path, Options(jobs=1)).model
    (run,) = again["runs"]
    assert [f["path"].rsplit("/", 1)[-1] for f in run["files"]] == ["rank0.json", "rank1.json"]
    assert run["sidecars"] == [] and not [w for w in again["warnings"] if w.get("level") == "error"]
