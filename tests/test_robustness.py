"""Bad input, faults and safety: every broken input gets one line naming the file, nothing else is lost.

The corpus is made here, from the real traces in ../shared (skipped when absent), the committed samples and
synthetic traces. Each case is checked through :func:`traceanalyze.pipeline.analyze` (the warning's level and
exact message, the other ranks still analyzed) and through the CLI (exit status, the one line on stderr naming
the file, no traceback).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markupsafe import escape

from tests.conftest import REAL, VENDORED, real, sample
from traceanalyze.cli import cli
from traceanalyze.errors import InputError, TraceanalyzeError
from traceanalyze.ingest import load, parse
from traceanalyze.ingest.parse import GPU_CATS, parse_trace
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze, to_json
from traceanalyze.report import html as report_html
from traceanalyze.report import render_html, render_markdown

T0 = 1_700_000_000_000_000.0  # absolute epoch µs, as old-schema traces carry (comparable across files)
XSS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>')


# ---------------------------------------------------------------------------------------------------------
# Corpus builders

def kernel(i: int, name: str = "void gemm_kernel<float>(float*)", t0: float = T0, **kw) -> dict:
    e = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t0 + 100.0 * i, "dur": 40.0,
         "args": {"device": 0, "stream": 7, "External id": i, "correlation": 1000 + i}}
    e.update(kw)
    return e


def nccl(i: int, t0: float = T0) -> dict:
    return kernel(i, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", t0,
                  ts=t0 + 100.0 * i + 50, dur=30.0, tid=9, args={"device": 0, "stream": 9, "External id": 10_000 + i})


def op(i: int, name: str = "aten::mm", t0: float = T0) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 11, "tid": 12, "ts": t0 + 100.0 * i - 5, "dur": 20.0,
            "args": {"External id": i}}


def events(n: int = 20, t0: float = T0) -> list[dict]:
    return [e for i in range(n) for e in (op(i, t0=t0), kernel(i, t0=t0), nccl(i, t0=t0))]


def write_trace(path: Path, rank: int | None, world: int | None, evs: list[dict] | None = None, *,
                gz: bool | None = None, **header) -> Path:
    di = {} if rank is None else {"distributedInfo": {"rank": rank, "world_size": world, "backend": "nccl"}}
    data = json.dumps({"schemaVersion": 1, **di, **header, "traceEvents": events() if evs is None else evs}).encode()
    gz = str(path).endswith(".gz") if gz is None else gz
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def good_run(tmp_path: Path, world: int = 2, ranks=(0,)) -> Path:
    d = tmp_path / "run"
    d.mkdir(exist_ok=True)
    for r in ranks:
        write_trace(d / f"rank{r}.json", r, world)
    return d


def invoke(*args: str) -> tuple[int, str, str]:
    """Run the CLI in process; return (exit code, stdout, stderr)."""
    res = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"the CLI raised {res.exception!r}") from res.exception
    return res.exit_code, res.stdout, res.stderr


def report(folder: Path, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    code, out, err = invoke("report", str(folder), "-o", str(tmp_path / "out" / "r.html"), "-j", "1", *extra)
    assert "Traceback" not in out + err
    return code, out, err


def file_warnings(model: dict, path: Path) -> list[dict]:
    return [w for w in model["warnings"] if w["file"] == str(path)]


def ranks_of(model: dict) -> list[int]:
    return [r["rank"] for run in model["runs"] for r in run["ranks"]]


# ---------------------------------------------------------------------------------------------------------
# One broken file beside a good rank: the file is named once, the good rank is still analyzed.

def _fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


def _gz_corrupt(p: Path) -> Path:
    raw = bytearray(gzip.compress(json.dumps({"traceEvents": events(200)}).encode()))
    raw[12:40] = b"\xff" * 28  # inside the first deflate block header
    p.write_bytes(bytes(raw))
    return p


CASES = {
    # name: (file name, builder, level, exact message)
    "empty": ("rank1.json", lambda p: p.write_bytes(b""), "error", "empty file"),
    "not_json": ("rank1.json", lambda p: p.write_bytes(b"hello world\n"), "error",
                 "not JSON (does not start with '{' or '[')"),
    "json_not_trace": ("rank1.json", lambda p: p.write_text('{"loss": [1.0, 0.9]}'), "error",
                       "valid JSON but not a trace (no traceEvents array)"),
    "big_json_not_trace": ("rank1.json", lambda p: p.write_text(json.dumps({"a": "x" * 100_000})), "error",
                           "valid JSON but not a trace (no traceEvents array)"),
    "gzip_corrupt": ("rank1.json.gz", _gz_corrupt, "error", "corrupt gzip data (invalid code lengths set)"
                     if parse._inflate is zlib else "corrupt gzip data (invalid deflate block found)"),
    "gzip_cut_in_header": ("rank1.json.gz", lambda p: p.write_bytes(gzip.compress(b'{"traceEvents": []}')[:15]),
                           "error", "gzip stream ends before any event (truncated)"),
    "broken_symlink": ("rank1.json", lambda p: p.symlink_to(p.parent / "gone.json"), "error",
                       "broken symlink (its target {dir}/gone.json does not exist); skipped"),
    "symlink_loop": ("rank1.json", lambda p: p.symlink_to(p), "error", "symlink loop; skipped"),
    "fifo": ("rank1.json", _fifo, "error", "not a regular file (a FIFO); skipped"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_broken_file_is_named_and_the_other_rank_is_analyzed(tmp_path, case):
    name, build, level, message = CASES[case]
    d = good_run(tmp_path)
    bad = d / name
    build(bad)
    message = message.replace("{dir}", str(d))
    a = analyze(d, Options(jobs=1))
    assert [(w["level"], w["message"]) for w in file_warnings(a.model, bad)] == [(level, message)]
    assert ranks_of(a.model) == [0]
    assert a.model["runs"][0]["ranks"][0]["n_kernels"] == 40
    code, out, err = report(d, tmp_path)
    assert code == 0
    assert f"traceanalyze: {bad}: {message}\n" in err
    html = (tmp_path / "out" / "r.html").read_text()
    # in the report's data-quality section, paths shown from the input folder's name (--show-paths: in full)
    assert str(escape(message.replace(str(d), d.name))) in html


def test_unreadable_file_io_error(tmp_path):
    """A file whose read fails (root ignores chmod 000, so /proc/self/mem stands in: reading it gives EIO)."""
    try:
        with open("/proc/self/mem", "rb") as fh:
            fh.read(1)
        pytest.skip("/proc/self/mem is readable here")
    except OSError as exc:
        if exc.strerror != "Input/output error":
            pytest.skip(f"/proc/self/mem gives {exc.strerror}, not EIO")
    d = good_run(tmp_path)
    bad = d / "rank1.json"
    bad.symlink_to("/proc/self/mem")  # outside the folder: read only when asked (docs/safety.md)
    a = analyze(d, Options(jobs=1, follow_external_symlinks=True))
    assert [(w["level"], w["message"]) for w in file_warnings(a.model, bad)] == [
        ("error", "cannot read (Input/output error)")]
    assert ranks_of(a.model) == [0]
    code, _, err = report(d, tmp_path, "--follow-external-symlinks")
    assert code == 0 and f"traceanalyze: {bad}: cannot read (Input/output error)\n" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_permission(tmp_path):
    d = good_run(tmp_path)
    bad = write_trace(d / "rank1.json", 1, 2)
    bad.chmod(0)
    a = analyze(d, Options(jobs=1))
    assert [(w["level"], w["message"]) for w in file_warnings(a.model, bad)] == [
        ("error", "cannot read (permission denied); skipped")]
    code, _, err = report(d, tmp_path)
    assert code == 0 and f"traceanalyze: {bad}: cannot read (permission denied); skipped\n" in err


def test_folder_named_like_a_trace_is_walked_not_read(tmp_path):
    d = good_run(tmp_path)
    (d / "rank1.json").mkdir()
    a = analyze(d, Options(jobs=1))
    assert not [w for w in a.model["warnings"] if "rank1.json" in str(w["file"])]
    assert [w["message"] for w in a.model["warnings"]] == [
        f"1 of 2 ranks have no trace (ranks 1): copy every rank's trace file into {d} for a complete picture"]
    assert report(d, tmp_path)[0] == 0


def test_symlinked_folder_loop_and_explicit_broken_inputs(tmp_path):
    d = good_run(tmp_path)
    (d / "again").symlink_to(d)  # a folder loop: never followed
    a = analyze(d, Options(jobs=1))
    assert ranks_of(a.model) == [0] and len(a.model["runs"]) == 1
    # a broken symlink or FIFO named on the command line: skipped with its error; the other input still runs
    link = tmp_path / "rank1.json"
    link.symlink_to(tmp_path / "nowhere.json")
    fifo = _fifo(tmp_path / "rank2.json")
    code, _, err = invoke("report", str(d / "rank0.json"), str(link), str(fifo), "-o", str(tmp_path / "x.html"))
    assert code == 0 and "Traceback" not in err
    assert f"traceanalyze: {link}: broken symlink (its target {tmp_path}/nowhere.json does not exist); skipped\n" in err
    assert f"traceanalyze: {fifo}: not a regular file (a FIFO); skipped\n" in err


def test_nothing_readable_exits_1_naming_the_files(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.json").symlink_to(d / "gone.json")
    with pytest.raises(TraceanalyzeError) as exc:
        analyze(d, Options(jobs=1))
    msg = f"{d}: no readable trace or log; {d}/rank0.json: broken symlink (its target {d}/gone.json does not exist)"
    assert str(exc.value) == msg
    code, out, err = report(d, tmp_path)
    assert code == 1 and err == f"traceanalyze: {msg}\n"
    # every trace there but broken: the HTML still says why, the CLI names each file and exits 1
    (d / "rank0.json").unlink()
    (d / "rank0.json").write_bytes(b"")
    write_trace(d / "rank1.json", 1, 2)
    (d / "rank1.json").write_bytes((d / "rank1.json").read_bytes()[:40])
    code, _, err = report(d, tmp_path, "-q")
    assert code == 1
    assert err.splitlines() == [
        f"traceanalyze: {d}/rank0.json: empty file",
        f"traceanalyze: {d}/rank1.json: no traceEvents array (not a Kineto/Chrome trace)",
        "traceanalyze: nothing could be analyzed: every trace file was unreadable (see above)"]


def test_trace_without_events_is_a_warning_and_an_empty_rank(tmp_path):
    d = good_run(tmp_path)
    empty = write_trace(d / "rank1.json", 1, 2, [])
    a = analyze(d, Options(jobs=1))
    assert [(w["level"], w["message"]) for w in file_warnings(a.model, empty)] == [
        ("warning", "the trace holds no events")]
    assert ranks_of(a.model) == [0, 1]
    r1 = a.model["runs"][0]["ranks"][1]
    assert r1["n_kernels"] == 0 and r1["window_us"] == 0
    code, _, err = report(d, tmp_path)
    assert code == 0 and f"traceanalyze: {empty}: the trace holds no events\n" in err


def test_traces_without_gpu_events_are_read_in_cpu_mode(tmp_path):
    src = sample("straggler")  # gloo on CPU: no kernel at all
    a = analyze(src, Options(jobs=1))
    (run,) = a.model["runs"]
    assert run["mode"] == "cpu" and ranks_of(a.model) == [0, 1, 2, 3]
    assert all(r["n_kernels"] == 0 and r["window_us"] > 0 for r in run["ranks"])
    assert not [w for w in a.model["warnings"] if w["level"] in ("error", "partial")]
    # one rank with kernels, one with host ops only: both kept, the report says GPU mode and rank 1 is idle
    d = good_run(tmp_path)
    write_trace(d / "rank1.json", 1, 2, [op(i) for i in range(20)])
    a = analyze(d, Options(jobs=1))
    assert a.model["runs"][0]["mode"] == "gpu" and ranks_of(a.model) == [0, 1]
    assert a.model["runs"][0]["ranks"][1]["n_kernels"] == 0
    assert report(d, tmp_path)[0] == 0


def test_events_with_missing_or_wrong_fields_and_years_long_durations(tmp_path):
    """Missing ts/dur/args, wrong types, negative and NaN durations and CUPTI's durations of years."""
    d = good_run(tmp_path)
    clean = events()
    odd = [
        kernel(90, ts="soon"),                                        # non-numeric ts: dropped
        {k: v for k, v in kernel(91).items() if k != "ts"},          # no ts: dropped
        {k: v for k, v in kernel(92).items() if k != "dur"},         # no dur: dropped
        kernel(93, dur=-5.0),                                         # negative: dropped
        kernel(94, ts=1e300),                                         # out of range: dropped
        kernel(5, dur=3.2e13),                                        # a year: dropped, counted apart
        kernel(6, dur=9e15),                                          # 285 years: same
        {k: v for k, v in kernel(7).items() if k != "args"},         # no args: kept
        kernel(8, args="not an object"),                             # args of the wrong type: kept, args dropped
        kernel(9, name=["a", "list"], args={"External id": 97}),      # a list as name: kept, as text
    ]
    text = json.dumps({"distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": clean + odd})
    text = text[:-2] + ', {"ph": "X", "cat": "kernel", "name": "nan", "ts": 1.0, "dur": NaN}]}'  # not JSON
    bad = d / "rank1.json"
    bad.write_text(text)
    a = analyze(d, Options(jobs=1))
    msgs = [(w["level"], w["message"]) for w in file_warnings(a.model, bad)]
    assert msgs == [("warning", "1 malformed events skipped; 4 events skipped: missing, non-numeric, NaN or "
                                "out-of-range ts/dur; 1 event with a negative duration dropped; 2 events longer "
                                "than 1 day dropped (a known CUPTI timestamp fault: an end time never recorded)")]
    r0, r1 = a.model["runs"][0]["ranks"]
    assert r1["n_kernels"] == 40 + 3
    assert r1["window_us"] == r0["window_us"]  # the years-long kernels did not stretch the window
    names = a.con.execute("SELECT name FROM kernels k JOIN files f USING (file_id) WHERE f.rank = 1 "
                          "AND external_id = 97").fetchall()
    assert names == [("['a', 'list']",)]
    code, _, err = report(d, tmp_path)
    assert code == 0 and f"traceanalyze: {bad}: {msgs[0][1]}\n" in err


# ---------------------------------------------------------------------------------------------------------
# Truncation: the most common fault (a job killed mid-write)

def _serialized_with_offsets(evs: list[dict]) -> tuple[bytes, list[int], int]:
    """The trace text, the offset just past each event's closing brace, and the offset of the array's ``]``."""
    head = b'{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ['
    parts, ends, pos = [], [], len(head)
    for i, e in enumerate(evs):
        s = (b", " if i else b"") + json.dumps(e).encode()
        parts.append(s)
        pos += len(s)
        ends.append(pos)
    return head + b"".join(parts) + b'], "baseTimeNanoseconds": 0}', ends, pos


def test_json_truncated_at_many_points_keeps_exactly_the_complete_events(tmp_path):
    names = ['tricky "}{][" name', "back\\slash", "plain"]
    evs = [kernel(i, names[i % 3]) for i in range(40)]
    data, ends, close = _serialized_with_offsets(evs)
    start = data.index(b"[") + 1
    cuts = sorted(set(range(start, close, 7)) | {e + d for e in ends for d in (-1, 0, 1) if start <= e + d < close})
    p = tmp_path / "cut.json"
    for cut in cuts:
        p.write_bytes(data[:cut])
        info, t = parse_trace(p)
        n = sum(1 for e in ends if e <= cut)
        assert info.partial, cut
        assert t["kernels"].column("external_id").to_pylist() == list(range(n)), cut
        assert info.warnings == [f"truncated (JSON ends mid-array, as when a job is killed mid-write); "
                                 f"read {n} complete events"], cut
    p.write_bytes(data)
    info, t = parse_trace(p)
    assert not info.partial and t["kernels"].num_rows == 40


def _event_ends(data: bytes) -> list[tuple[int, dict]]:
    """(offset past the event, event) for each event of a real trace, by Python's own JSON decoder."""
    dec = json.JSONDecoder()
    text = data.decode()
    i = text.index("[", text.index('"traceEvents"')) + 1
    out = []
    while True:
        while text[i] in " \n\r\t,":
            i += 1
        if text[i] == "]":
            return out
        e, i = dec.raw_decode(text, i)
        out.append((len(text[:i].encode()), e))


def _gpu_rows(evs: list[dict]) -> int:
    return sum(1 for e in evs if e.get("ph") == "X" and e.get("cat") in GPU_CATS)


def test_real_trace_truncated_json_and_gzip(tmp_path):
    src = real("hta/trace_filter") / "sampled_rank-1.json.gz"
    data = gzip.decompress(src.read_bytes())
    ends = _event_ends(data)
    _, full = parse_trace(src)
    full_k = full["kernels"].select(["ts_ns", "dur_ns", "name"]).to_pylist()
    assert len(full_k) == _gpu_rows([e for _, e in ends])
    p = tmp_path / "cut.json"
    for frac in (0.05, 0.13, 0.31, 0.5, 0.62, 0.77, 0.9, 0.999):
        cut = int(len(data) * frac)
        p.write_bytes(data[:cut])
        info, t = parse_trace(p)
        complete = [e for end, e in ends if end <= cut]
        assert info.partial and info.warnings[-1].endswith(f"read {len(complete)} complete events")
        assert t["kernels"].select(["ts_ns", "dur_ns", "name"]).to_pylist() == full_k[: _gpu_rows(complete)]
    raw = src.read_bytes()
    pz = tmp_path / "cut.json.gz"
    seen = []
    for frac in (0.1, 0.4, 0.7, 0.95):
        pz.write_bytes(raw[: int(len(raw) * frac)])
        info, t = parse_trace(pz)
        rows = t["kernels"].select(["ts_ns", "dur_ns", "name"]).to_pylist()
        assert info.partial and "gzip stream ends early" in info.warnings[0]
        assert rows == full_k[: len(rows)]  # a prefix, never a made-up row
        seen.append(len(rows))
    assert seen == sorted(seen) and seen[-1] < len(full_k)


def test_truncated_rank_through_pipeline_and_cli(tmp_path):
    src = real("hta/trace_filter")
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(src / "sampled_rank-0.json.gz", d)
    data = gzip.decompress((src / "sampled_rank-1.json.gz").read_bytes())
    cut = d / "sampled_rank-1.json"
    cut.write_bytes(data[: len(data) // 2])
    n = sum(1 for end, _ in _event_ends(data) if end <= len(data) // 2)
    msg = f"truncated (JSON ends mid-array, as when a job is killed mid-write); read {n} complete events"
    a = analyze(d, Options(jobs=1))
    assert [(w["level"], w["message"]) for w in file_warnings(a.model, cut)] == [("partial", msg)]
    assert ranks_of(a.model) == [0, 1]
    code, _, err = report(d, tmp_path)
    assert code == 0 and f"traceanalyze: {cut}: {msg}\n" in err


# ---------------------------------------------------------------------------------------------------------
# Files that do not belong together

def test_copy_of_a_rank_is_read_once(tmp_path):
    d = good_run(tmp_path, ranks=(0, 1))
    single = analyze(d, Options(jobs=1)).model["runs"][0]["ranks"][0]
    shutil.copy(d / "rank0.json", d / "rank0_copy.json")
    a = analyze(d, Options(jobs=1))
    msg = f"a copy of {d}/rank0.json (rank 0, the same events); read once"
    assert [(w["level"], w["message"]) for w in file_warnings(a.model, d / "rank0_copy.json")] == [("warning", msg)]
    r0 = a.model["runs"][0]["ranks"][0]
    assert (r0["n_files"], r0["window_us"], r0["n_kernels"]) == (1, single["window_us"], single["n_kernels"])
    code, _, err = report(d, tmp_path)
    assert code == 0 and f"traceanalyze: {d}/rank0_copy.json: {msg}\n" in err


def test_two_different_files_of_one_rank_at_the_same_time(tmp_path):
    d = good_run(tmp_path, ranks=(0, 1))
    write_trace(d / "rank0_other.json", 0, 2, events(30))
    a = analyze(d, Options(jobs=1))
    msg = (f"rank 0 again, at the same time as {d}/rank0.json: not a second profiling window; left out (two runs "
           "in one folder? put each run's traces in its own folder)")
    assert [w["message"] for w in file_warnings(a.model, d / "rank0_other.json")] == [msg]
    assert a.model["runs"][0]["ranks"][0]["n_kernels"] == 40  # rank0.json only
    # two windows of one rank, apart in time, are still two windows
    (d / "rank0_other.json").unlink()
    write_trace(d / "rank0_later.json", 0, 2, events(t0=T0 + 60e6))
    a = analyze(d, Options(jobs=1))
    assert a.model["runs"][0]["ranks"][0]["n_files"] == 2
    assert not [w for w in a.model["warnings"] if w["level"] != "info"]


def test_missing_ranks_through_the_cli(tmp_path):
    d = good_run(tmp_path, world=8, ranks=range(5))
    code, _, err = report(d, tmp_path)
    assert code == 0
    assert err.splitlines()[0] == (f"traceanalyze: 3 of 8 ranks have no trace (ranks 5–7): copy every rank's trace "
                                   f"file into {d} for a complete picture")


def test_folder_mixing_world_sizes(tmp_path):
    d = good_run(tmp_path, world=8, ranks=(0, 1))
    write_trace(d / "rank2.json", 2, 4)
    write_trace(d / "rank3.json", 3, 4)
    a = analyze(d, Options(jobs=1))
    msg = (f"{d} mixes runs (world_size 4 in rank2.json, rank3.json; world_size 8 in rank0.json, rank1.json): put "
           "each run's traces in its own folder")
    assert [w for w in a.model["warnings"] if "mixes runs" in w["message"]] == [
        {"file": None, "message": msg, "level": "warning", "run": "run"}]
    assert ranks_of(a.model) == [0, 1, 2, 3]
    code, _, err = report(d, tmp_path)
    assert code == 0 and f"traceanalyze: {msg}\n" in err


def test_folder_mixing_runs_a_day_apart(tmp_path):
    d = good_run(tmp_path, ranks=(0,))
    write_trace(d / "rank1.json", 1, 2, events(t0=T0 + 86_400e6))
    a = analyze(d, Options(jobs=1))
    msg = (f"{d} seems to mix runs: rank1.json start 24.0 h after rank0.json (the ranks of one job start within "
           "seconds); put each run's traces in its own folder")
    assert [w["message"] for w in a.model["warnings"] if "mix runs" in w["message"]] == [msg]
    code, _, err = report(d, tmp_path)
    assert code == 0 and f"traceanalyze: {msg}\n" in err


def test_real_and_sample_runs_are_not_called_mixed():
    for src in (real("hta/trace_filter"), sample("straggler")):
        a = analyze(src, Options(jobs=1))
        assert not [w for w in a.model["warnings"] if "mix" in w["message"] or "copy of" in w["message"]]


# ---------------------------------------------------------------------------------------------------------
# Hostile strings and the gzip bomb

def test_hostile_names_are_escaped_and_bounded(tmp_path):
    d = good_run(tmp_path)
    huge = "x" * 100_000
    names = [*XSS, "nul\x00bell\x07esc\x1b[31mred\x7f", huge, "quote ' \" & amp"]
    evs = [kernel(i, names[i % len(names)]) for i in range(40)] + [op(i, names[i % len(names)]) for i in range(40)]
    write_trace(d / "rank1.json", 1, 2, evs, extra={"<b>": "</style><script>x</script>"})
    a = analyze(d, Options(jobs=1))
    assert {k["name"] for k in a.model["runs"][0]["top_kernels"]} >= {XSS[0], XSS[1]}  # the model keeps them raw
    doc = render_html(a.model)
    for s in XSS:
        assert s not in doc
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in doc
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in doc
    assert not re.search(r"<(script|img|iframe|object|embed)\b", doc, re.I)
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", doc)
    assert "nul\ufffdbell\ufffdesc\ufffd[31mred\ufffd" in doc
    assert len(doc) < 1_000_000  # a 100 kB name is shown cut, its full text at most in a title or two
    md = render_markdown(a.model)
    assert "<script>" not in md and not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", md)
    assert json.loads(to_json(a.model))["runs"][0]["top_kernels"]  # JSON stays valid
    code, _, err = report(d, tmp_path, "--md", str(tmp_path / "out" / "r.md"))
    # the summary line, after one data-quality line: the hostile names are kernels of no known class, each shown
    # on that one line, with no control character reaching the terminal
    assert code == 0 and err.count("\n") == 2 and "Kernels of no known class take" in err.splitlines()[0]
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", err)
    # a file name that holds a newline and an escape still gives one line
    weird = d / "rank1\n\x1b[2J.json"
    weird.write_bytes(b"")
    code, _, err = report(d, tmp_path)
    assert code == 0 and f"traceanalyze: {d}/rank1?\x1b[2J.json: empty file\n".replace("\x1b", "?") in err


def test_gzip_bomb_is_bounded_with_a_clear_message(tmp_path):
    d = good_run(tmp_path)
    bomb = d / "rank1.json.gz"
    one = json.dumps(kernel(0)).encode()
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        fh.write(b'{"distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": [')
        for _ in range(40):
            fh.write((one + b", ") * 1000)
        fh.write(one + b"]}")
    assert bomb.stat().st_size < 100_000  # ~8 MiB of JSON
    msg = "decompresses to more than 1 MiB (a gzip bomb?); raise --max-decompressed if this is a real trace"
    a = analyze(d, Options(jobs=1, max_decompressed_bytes=1 << 20))
    assert [(w["level"], w["message"]) for w in file_warnings(a.model, bomb)] == [("error", msg)]
    assert ranks_of(a.model) == [0]
    code, _, err = report(d, tmp_path, "--max-decompressed", "1M")
    assert code == 0 and f"traceanalyze: {bomb}: {msg}\n" in err
    code, _, err = report(d, tmp_path, "--max-decompressed", "16M")  # raised: the file is read
    assert code == 0 and str(bomb) not in err
    code, out, _ = invoke("report", "--help")
    assert "--max-decompressed SIZE" in out and "[default: 64G]" in out
    code, _, err = invoke("report", str(d), "--max-decompressed", "lots")
    assert code == 2 and "'lots' is not a size such as 512M or 64G" in err


def test_whitespace_bomb_stops_at_the_event_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(parse, "MAX_EVENT_BYTES", 1 << 20)
    p = tmp_path / "rank1.json.gz"
    with gzip.open(p, "wb") as fh:
        fh.write(b'{"traceEvents": [{"ph": "X", ' + b" " * (4 << 20))
    with pytest.raises(InputError, match=r"an event larger than 1 MiB; the file is corrupt"):
        parse_trace(p)


# ---------------------------------------------------------------------------------------------------------
# Property: a mutated trace parses or raises InputError, never anything else

# an allocator [memory] instant (profile_memory=True), mutated with the rest
_MEMORY_EVENT = {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10.5,
                 "args": {"Total Reserved": 2097152, "Total Allocated": 4096, "Bytes": 4096, "Device Id": 0,
                          "Device Type": 1, "Addr": 139961378537472}}


def _fuzz_base() -> bytes:
    rel = Path("hta", "trace_filter", "sampled_rank-0.json.gz")
    src = VENDORED / rel if (VENDORED / rel).exists() else REAL / rel
    if src.exists():  # the header and the first events of a real trace, closed again
        text = gzip.decompress(src.read_bytes()).decode()
        i = text.index("[", text.index('"traceEvents"')) + 1
        dec = json.JSONDecoder()
        evs = []
        while len(evs) < 12:
            while text[i] in " \n\r\t,":
                i += 1
            e, i = dec.raw_decode(text, i)
            evs.append(e)
        header = json.loads(text[: text.index('"traceEvents"')].rstrip().rstrip(",") + "}")
        return json.dumps({**header, "traceEvents": evs + [_MEMORY_EVENT]}, indent=1).encode()
    return json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2},
                       "traceEvents": events(3) + [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 7,
                                                    "args": {"name": "stream 7"}}, _MEMORY_EVENT],
                       "baseTimeNanoseconds": 1_700_000_000_000_000_000}, indent=1).encode()


FUZZ_BASE = _fuzz_base()
VALUES = [b"null", b"true", b"-1", b"1e308", b"-1e999", b"18446744073709551616", b'"x"', b"[]", b"{}",
          b"[1, [2]]", b'"\\u0000\\ud800"', b"NaN", b"1.5", b'{"a": {"b": []}}']
_VALUE = re.compile(rb'(?<=: )(-?[0-9.eE+]+|"(?:[^"\\]|\\.)*"|\[[^\[\]]*\]|null|true|false)')


@st.composite
def mutated_trace(draw) -> tuple[bytes, bool]:
    data = bytearray(FUZZ_BASE)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "truncate", "delete", "duplicate", "swap_value"]))
        if kind == "flip":
            data[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[i:]
        elif kind == "delete":
            del data[i: i + draw(st.integers(1, 8))]
        elif kind == "duplicate":
            data[i:i] = data[i: i + draw(st.integers(1, 32))]
        else:
            values = list(_VALUE.finditer(bytes(data)))
            if values:
                m = values[draw(st.integers(0, len(values) - 1))]
                data[m.start(): m.end()] = draw(st.sampled_from(VALUES))
    return bytes(data), draw(st.booleans())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(case=mutated_trace())
def test_mutated_trace_parses_or_raises_input_error(tmp_path, case):
    data, gz = case
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(data) if gz else data)
    try:
        info, tables = parse_trace(p)
    except InputError as exc:
        assert str(exc).startswith(str(p)) and "\n" not in str(exc)
        return
    assert set(tables) == {"kernels", "cpu_ops", "comm_events", "threads", "cuda_syncs", "memory_events"}
    assert info.partial in (True, False)


# ---------------------------------------------------------------------------------------------------------
# Safety of the HTML: a real pipeline run over hostile names

def test_real_run_with_hostile_names_renders_escaped_and_offline(tmp_path):
    src = real("hta/trace_filter")
    d = tmp_path / "run"
    d.mkdir()
    for f in sorted(src.glob("*.json.gz")):
        t = json.loads(gzip.decompress(f.read_bytes()))
        top = max((e for e in t["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e.get("dur", 0))["name"]
        for e in t["traceEvents"]:
            if e.get("name") == top:
                e["name"] = XSS[0] + " " + top
            elif e.get("cat") == "cpu_op" and e.get("name") == "aten::mm":
                e["name"] = XSS[1]
        (d / f.name).write_bytes(gzip.compress(json.dumps(t).encode()))
    out = tmp_path / "r.html"
    code, _, err = invoke("report", str(d), "-o", str(out), "-j", "1", "-q")
    assert code == 0 and "Traceback" not in err
    doc = out.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in doc
    for s in XSS:
        assert s not in doc
    assert not re.search(r"<(script|img|iframe|link|object|embed)\b", doc, re.I)
    assert not re.search(r"\son[a-z]+\s*=\s*[\"']", doc, re.I)  # no event-handler attribute
    urls = set(re.findall(r"(?:https?|ftp|file|data):[^\s\"'<>)]*", doc, re.I))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    assert not re.search(r"url\(|@import|src=", doc.split("<body", 1)[1].replace("src=x", ""), re.I)


def test_templates_never_mark_trace_data_safe():
    tdir = Path(report_html.__file__).parent / "templates"
    for t in tdir.glob("*.j2"):
        body = t.read_text()
        assert "|safe" not in body.replace(" ", "") and "autoescape false" not in body, t.name
    assert report_html.environment().autoescape("report.html.j2") is True


# ---------------------------------------------------------------------------------------------------------
# The database: interrupted ingest, hard kill mid-transaction, two runs at once

def _four_ranks(tmp_path: Path) -> Path:
    return good_run(tmp_path, world=4, ranks=range(4))


@pytest.mark.parametrize("per_transaction, raise_at", [(1, 3), (2, 2)])
def test_interrupted_ingest_leaves_a_usable_database_and_the_rerun_reuses_it(tmp_path, monkeypatch, per_transaction,
                                                                             raise_at):
    d = _four_ranks(tmp_path)
    db = tmp_path / "r.duckdb"
    real_insert = load._insert_part
    calls = []
    monkeypatch.setattr(load, "TRANSACTION_FILES", per_transaction)

    def third_raises(*args, **kw):  # inside the third file's (or second pair's) open transaction
        calls.append(args[1])
        if len(calls) == raise_at:
            raise KeyboardInterrupt
        return real_insert(*args, **kw)

    monkeypatch.setattr(load, "_insert_part", third_raises)
    with pytest.raises(KeyboardInterrupt):
        analyze(d, Options(db=db, jobs=1))
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*), min(status), max(status) FROM files").fetchone() == (2, "ok", "ok")
        assert con.execute("SELECT count(*) FROM kernels").fetchone() == (80,)
    monkeypatch.setattr(load, "_insert_part", real_insert)
    a = analyze(d, Options(db=db, jobs=1))
    assert [f["cached"] for f in a.model["runs"][0]["files"]] == [True, True, False, False]
    assert ranks_of(a.model) == [0, 1, 2, 3]
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (160,)
    a.con.close()


def test_interrupt_after_some_inserts_of_a_transaction_stores_none_of_its_files(tmp_path, monkeypatch):
    """Four files share a transaction whose events are inserted file by file (INSERT_ROWS 1): an interrupt at the
    third insert rolls back the two already inserted, and the re-run parses all four."""
    d = _four_ranks(tmp_path)
    db = tmp_path / "r.duckdb"
    real_insert = load._insert_part
    calls = []
    monkeypatch.setattr(load, "TRANSACTION_FILES", 4)
    monkeypatch.setattr(load, "INSERT_ROWS", 1)
    monkeypatch.setattr(load, "INSERT_TABLE_ROWS", 1)  # each table's rows go at once

    def third_raises(*args, **kw):
        calls.append(len(args[1]))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_insert(*args, **kw)

    monkeypatch.setattr(load, "_insert_part", third_raises)
    with pytest.raises(KeyboardInterrupt):
        analyze(d, Options(db=db, jobs=1))
    assert calls == [1, 1, 1]  # one file an insert, inside one transaction
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT (SELECT count(*) FROM files), (SELECT count(*) FROM kernels)").fetchone() == (0, 0)
    monkeypatch.setattr(load, "_insert_part", real_insert)
    a = analyze(d, Options(db=db, jobs=1))
    assert [f["cached"] for f in a.model["runs"][0]["files"]] == [False] * 4
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (160,)
    a.con.close()


def test_interrupted_cli_run_says_so_in_one_line(tmp_path, monkeypatch):
    d = _four_ranks(tmp_path)
    real_insert = load._insert_part
    n = [0]
    monkeypatch.setattr(load, "TRANSACTION_FILES", 1)

    def second_raises(*args, **kw):
        n[0] += 1
        if n[0] == 2:
            raise KeyboardInterrupt
        return real_insert(*args, **kw)

    monkeypatch.setattr(load, "_insert_part", second_raises)
    code, _, err = report(d, tmp_path)
    assert code == 130 and err == "traceanalyze: interrupted; files loaded so far stay in the database\n"
    monkeypatch.setattr(load, "_insert_part", real_insert)
    code, _, err = report(d, tmp_path)
    assert code == 0 and "wrote" in err


KILLER = """
import os, signal, sys
from traceanalyze.ingest import load
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
orig, n = load._insert_part, [0]
def dying(con, *args, **kw):
    n[0] += 1
    if n[0] == 3:  # die inside the third file's transaction, rows half written
        con.execute("INSERT INTO files (file_id, path, status) VALUES (99, 'half-written', 'ok')")
        con.execute("INSERT INTO kernels (file_id, name) VALUES (99, 'half')")
        os.kill(os.getpid(), signal.SIGKILL)
    return orig(con, *args, **kw)
load._insert_part = dying
load.TRANSACTION_FILES = 1  # a transaction per file, so that the third is the one killed
analyze(sys.argv[1], Options(db=sys.argv[2], jobs=1))
"""


def test_killed_mid_transaction_leaves_a_usable_database(tmp_path):
    d = _four_ranks(tmp_path)
    db = tmp_path / "r.duckdb"
    proc = subprocess.run([sys.executable, "-c", KILLER, str(d), str(db)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM files WHERE path = 'half-written'").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM kernels WHERE name = 'half'").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM files WHERE status = 'ok'").fetchone() == (2,)
    code, _, err = invoke("report", str(d), "--db", str(db), "-o", str(tmp_path / "r.html"), "-j", "1")
    assert code == 0 and "Traceback" not in err
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM files").fetchone() == (4,)
        assert con.execute("SELECT count(*) FROM kernels").fetchone() == (160,)


def test_second_concurrent_report_on_one_database_says_in_use(tmp_path):
    d = _four_ranks(tmp_path)
    db = tmp_path / "busy.duckdb"
    assert report(d, tmp_path, "--db", str(db))[0] == 0
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(db)!r}); "
                               "print('ok', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        code, _, err = report(d, tmp_path, "--db", str(db))
        assert code == 1
        assert err == (f"traceanalyze: {db}: the database is in use by another traceanalyze run; wait for it to "
                       "finish or pass a different --db\n")
    finally:
        holder.kill()
        holder.wait()
    code, _, _ = report(d, tmp_path, "--db", str(db))  # untouched: usable once the other run is done
    assert code == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM files").fetchone() == (4,)


@pytest.mark.parametrize("nelems", [2**62, -5, 2**40 + 1])
def test_corrupt_collective_element_count_is_unknown_not_wrapped(tmp_path, nelems):
    """An "In msg nelems" no message has (2^62 elements: ×4 bytes wraps int64 negative) is an unknown size:
    the collective keeps its time, but has no bytes and no busbw, never negative or absurd ones."""
    from tests.synth import kernel, write_trace, x
    from traceanalyze.metrics.collectives import collective_calls

    for r in (0, 1):
        ev = [x("user_annotation", "ProfilerStep#0", 0.0, 1000.0)]
        for i, n in enumerate((nelems, 1024)):
            k = kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100.0 + 300 * i, 200.0, 20, 10 + i, 90.0 + 300 * i)
            k[0]["args"].update({"Collective name": "allreduce", "In msg nelems": n, "Out msg nelems": n,
                                 "Group size": 2, "dtype": "Float"})
            ev += k
        write_trace(tmp_path / f"rank{r}.pt.trace.json", r, ev, backend="nccl")
    a = analyze(tmp_path, Options(jobs=1))
    calls = collective_calls(a.con, 1, "gpu")
    assert calls.nelems.tolist() == [0, 1024, 0, 1024]
    assert calls.has_bytes.tolist() == [False, True, False, True]
    assert calls.nbytes.tolist() == [0, 4096, 0, 4096]
    # the report's table: the corrupt one without a size or bandwidth, the good one with its own
    assert [(c["size_bytes"], c["busbw_gbps"], c["transfer_us"]) for c in a.model["runs"][0]["collectives"]] == [
        (None, None, 200.0), (4096, 0.0205, 200.0)]
