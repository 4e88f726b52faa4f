"""The guarantees of docs/safety.md on inputs (issue 14: 4, 5, 6, 9, 11, 12), each checked on inputs generated here,
in a temporary folder: the warning row that names the file with its count, the rows that remain, nothing stored
or printed that should not be; and a fuzz test over header fields, numbers and nesting.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_robustness import T0, events, file_warnings, kernel, op, ranks_of, write_trace
from traceanalyze import discover, ingest, logs, names, safety
from traceanalyze.errors import InputError
from traceanalyze.ingest import parse
from traceanalyze.ingest.parse import parse_trace
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze, to_json


def levels(model: dict, path: Path) -> list[tuple[str, str]]:
    return [(w["level"], w["message"]) for w in file_warnings(model, path)]


def messages(model: dict) -> list[str]:
    return [w["message"] for w in model["warnings"]]


# ---- 4. one implausible header field costs one warning ---------------------------------------------------------

BAD_HEADERS = [  # (distributedInfo, what the warning says)
    ({"rank": 2**31, "world_size": 2}, "distributedInfo.rank 2147483648 (must be an integer from 0 to 1, below the "
                                       "world size)"),
    ({"rank": 2, "world_size": 2}, "distributedInfo.rank 2 (must be an integer from 0 to 1, below the world size)"),
    ({"rank": -1, "world_size": 2}, "distributedInfo.rank -1 (must be an integer from 0 to 1, below the world size)"),
    ({"rank": "9" * 400, "world_size": 2},
     f"distributedInfo.rank '{'9' * 19}...(402 characters) (must be an integer from 0 to 1, below the world size)"),
    ({"rank": 1, "world_size": 2**40}, "distributedInfo.world_size 1099511627776 (must be an integer from 1 to "
                                       "1,048,576)"),
    ({"rank": 1, "world_size": 0}, "distributedInfo.world_size 0 (must be an integer from 1 to 1,048,576)"),
    ({"rank": 1.5, "world_size": 2}, "distributedInfo.rank 1.5 (must be an integer from 0 to 1, below the world "
                                     "size)"),
    ({"rank": 2**63, "world_size": 2**63}, "distributedInfo.world_size 9223372036854775808 (must be an integer from 1 "
                                           "to 1,048,576) and distributedInfo.rank 9223372036854775808 (must be an "
                                           "integer from 0 to 1,048,575)"),
]


@pytest.mark.parametrize(("di", "why"), BAD_HEADERS)
def test_implausible_rank_or_world_size_is_one_warning_row_naming_the_file(tmp_path, di, why):
    d = tmp_path / "run"
    d.mkdir()
    write_trace(d / "rank0.json", 0, 2)
    bad = write_trace(d / "rank1.json", None, None, distributedInfo=di)
    a = analyze(d, Options(jobs=1))
    assert levels(a.model, bad) == [
        ("warning", f"implausible {why}: ignored; the rank is taken from the file name or the worker instead")]
    assert ranks_of(a.model) == [0, 1]  # the rank from the file name; the report goes on
    assert a.model["runs"][0]["world_size"] == 2


def test_implausible_rank_without_a_name_gets_the_lowest_free_rank(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write_trace(d / "rank0.json", 0, 4)
    bad = write_trace(d / "host-b.json", None, None, distributedInfo={"rank": 10**12, "world_size": 4})
    a = analyze(d, Options(jobs=1))
    assert levels(a.model, bad)[0] == (
        "warning", "implausible distributedInfo.rank 1000000000000 (must be an integer from 0 to 3, below the world "
                   "size): ignored; the rank is taken from the file name or the worker instead")
    assert ranks_of(a.model) == [0, 1]


def test_missing_ranks_are_a_count_and_ranges_never_enumerated(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    for r in range(3):
        write_trace(d / f"rank{r}.json", r, 1024, events(4))
    a = analyze(d, Options(jobs=1))
    assert [m for m in messages(a.model) if "have no trace" in m] == [
        f"1,021 of 1,024 ranks have no trace (ranks 3–1023): copy every rank's trace file into {d} for a complete "
        "picture"]
    run = a.model["runs"][0]
    assert (run["missing_ranks"], run["n_missing_ranks"]) == ([[3, 1023]], 1021)  # the JSON holds spans too


def test_the_largest_plausible_world_size_is_accepted(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write_trace(d / "rank5.json", 5, 1 << 20, events(4))
    a = analyze(d, Options(jobs=1))
    assert [m for m in messages(a.model) if "have no trace" in m] == [
        f"1,048,575 of 1,048,576 ranks have no trace (ranks 0–4, 6–1048575): copy every rank's trace file into {d} "
        "for a complete picture"]
    assert a.model["runs"][0]["missing_ranks"] == [[0, 4], [6, 1048575]]
    assert not [m for m in messages(a.model) if "implausible" in m]


@pytest.mark.parametrize(("name", "rank"), [
    ("rank3.json", 3), ("trace_rank-12.json.gz", 12), ("[rank7].json", 7), ("rank1048575.json", 1048575),
    ("rank1048576.json", None), ("rank_20240501.json", None), ("rank_2024-05-01.json", None),
    ("rank1700000000123.json", None), ("rank_17000000.json", None)])
def test_a_rank_comes_from_a_file_name_only_when_plausible(name, rank):
    assert names.rank_from_name(name) == rank


def test_a_file_name_rank_beyond_the_world_size_is_not_used(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write_trace(d / "rank0.json", 0, 4)
    late = write_trace(d / "rank7.json", None, None, distributedInfo={"world_size": 4})
    a = analyze(d, Options(jobs=1))
    assert ranks_of(a.model) == [0, 1]
    assert messages(a.model).count(f"{late}: rank 7 in the file name is not below the world size 4; not used") == 1


# ---- 5. parsing is linear and per event --------------------------------------------------------------------------

def test_one_event_with_a_60_mb_string_is_scanned_once(tmp_path):
    """The mechanism, not a time: each byte reaches the structural scanner at most twice (once while the long event
    lasts, once when it ends). Joining and rescanning the held bytes per block went through ~60x the file."""
    f = tmp_path / "rank0.json"
    big = 60 << 20
    evs = [op(i) for i in range(1000)]
    with open(f, "w") as fh:
        fh.write('{"traceEvents": [')
        fh.write(", ".join(json.dumps(e) for e in evs[:500]))
        fh.write(', {"ph": "X", "cat": "cpu_op", "name": "')
        fh.write("x" * big)
        fh.write(f'", "pid": 11, "tid": 12, "ts": {T0}, "dur": 1.0}}, ')
        fh.write(", ".join(json.dumps(e) for e in evs[500:]))
        fh.write("]}")
    info, tables = parse_trace(f)
    assert tables["cpu_ops"].num_rows == 1001
    assert max(len(n) for n in tables["cpu_ops"].column("name").to_pylist()) == big
    assert info.bytes_read == f.stat().st_size
    assert info.scanned_bytes <= 2 * info.bytes_read + 4 * parse.BLOCK_BYTES  # was ~60x before the fix
    assert not info.warnings and not info.partial


@pytest.mark.parametrize("seed", [1, 2])
def test_long_events_with_escapes_and_brackets_across_blocks_parse_exactly(tmp_path, seed):
    """The scanner state carried from block to block (string, escape, nesting) gives the rows json.loads gives,
    for a file read whole and for one cut inside the long event (partial: the events before it)."""
    import random

    rnd = random.Random(seed)
    pieces = ["\\", '"', "{", "}", "[", "]", "x" * 100, "}, {", '\\"', "\\\\"]
    long_name = "".join(rnd.choice(pieces) for _ in range(250_000))  # ~2.5 MB: several blocks
    assert len(long_name.encode()) > 4 * parse.BLOCK_BYTES
    evs = [op(i, name=f"op{i}") for i in range(50)]
    evs.insert(25, op(99, name=long_name))
    text = json.dumps({"traceEvents": evs})
    f = tmp_path / "rank0.json"
    f.write_text(text)
    info, tables = parse_trace(f)
    assert tables["cpu_ops"].column("name").to_pylist() == [e["name"] for e in evs]
    assert info.scanned_bytes <= 2 * info.bytes_read + 4 * parse.BLOCK_BYTES
    at = text.index(json.dumps(long_name)[:40])
    f.write_text(text[: at + len(json.dumps(long_name)) // 2])
    info, tables = parse_trace(f)
    assert (tables["cpu_ops"].num_rows, info.partial) == (25, True)
    assert info.warnings == ["truncated (JSON ends mid-array, as when a job is killed mid-write); read 25 complete "
                             "events"]


def _with_raw(path: Path, evs: list[dict], raws: list[str]) -> Path:
    """A trace whose events are ``evs`` plus the JSON texts ``raws`` (numbers json.dumps cannot write)."""
    body = ", ".join([json.dumps(e) for e in evs] + raws)
    path.write_text('{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [' + body + "]}")
    return path


KER = '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
OP = '{"ph": "X", "cat": "cpu_op", "name": "o", "pid": 11, "tid": 12, '
BIG = "1" + "0" * 400


@pytest.mark.parametrize("raw", [
    KER + '"ts": 1e400, "dur": 4.0}',
    KER + f'"ts": {T0}, "dur": {BIG}}}',
    OP + f'"ts": {T0}, "dur": 1.0, "args": {{"External id": {BIG}}}}}',
    OP.replace('"pid": 11', '"pid": -1' + "0" * 30) + f'"ts": {T0}, "dur": 1.0}}',
    KER + f'"ts": {T0}, "dur": 1.0, "args": {{"stream": 1e400}}}}',
])
def test_a_number_out_of_range_drops_that_event_and_counts_it(tmp_path, raw):
    f = _with_raw(tmp_path / "rank0.json", events(5), [raw, raw])
    info, tables = parse_trace(f)
    assert info.warnings == ["2 events holding a number out of range (an integer beyond 64 bits, a float beyond "
                             "float64 such as 1e400) dropped"]
    assert (tables["kernels"].num_rows, tables["cpu_ops"].num_rows, tables["comm_events"].num_rows) == (10, 5, 0)
    assert info.skipped_events == 2


@pytest.mark.parametrize("depth", [1500, 100_000])
def test_nesting_deeper_than_the_bound_drops_that_event_and_counts_it(tmp_path, depth):
    deep = KER + f'"ts": {T0}, "dur": 1.0, "args": {{"x": {"[" * depth}{"]" * depth}}}}}'
    f = _with_raw(tmp_path / "rank0.json", events(5), [deep])
    info, tables = parse_trace(f)
    assert info.warnings == ["1 event nested deeper than the JSON decoder's bound (about 1,000 levels) dropped"]
    assert (tables["kernels"].num_rows, tables["cpu_ops"].num_rows) == (10, 5)
    a = analyze(f, Options(jobs=1))  # through the pipeline: the file is analysed, one warning row
    assert levels(a.model, f) == [("warning", info.warnings[0])]
    assert ranks_of(a.model) == [0]


def test_deep_nesting_in_the_header_costs_the_header_not_the_file(tmp_path):
    f = tmp_path / "rank0.json"
    f.write_text('{"deep": ' + "[" * 5000 + "]" * 5000 + ', "traceEvents": ' + json.dumps(events(3)) + "}")
    info, tables = parse_trace(f)
    assert info.header == {} and tables["kernels"].num_rows == 6


# ---- 6. every file is size-bounded ---------------------------------------------------------------------------------

SIDECARS = {  # file name -> (its first bytes, which make discovery classify it, and the kind)
    "train.log.gz": (b"Step 1 | loss:2.5 lr:0.0001 tokens_per_second_per_gpu:1000\n", "training_log"),
    "nccl.log.gz": (b"host:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n", "nccl_debug"),
    "topo.txt.gz": (b"\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV12\t0-63\nGPU1\tNV12\t X \t0-63\n", "topology"),
    "config.yaml.gz": (b"gradient_accumulation_steps: 4\nper_device_train_batch_size: 8\n", "config"),
    "env_rank0.json.gz": (b'{"traceanalyze_capture": 1, "env": {"NCCL_IB_HCA": "mlx5"}' + b" " * 10, "env"),
    "steps_rank0.json.gz": (b'{"traceanalyze_capture": 1, "unprofiled_step_ms": [42.0]' + b" " * 10, "steps"),
}


@pytest.mark.parametrize("name", sorted(SIDECARS))
def test_a_sidecar_gzip_bomb_is_a_warning_row_never_a_memory_error(tmp_path, name):
    d = tmp_path / "run"
    d.mkdir()
    write_trace(d / "rank0.json", 0, 1)
    head, kind = SIDECARS[name]
    tail = b"}" if kind in ("env", "steps") else b""
    # 8 MiB inflated, a few KiB on disk: blanks in a file read whole, lines of 1,000 bytes in a line-read one
    pad = b" " * (8 << 20) if kind in ("env", "config", "steps") else (b"x" * 1000 + b"\n") * (8 << 10)
    bomb = d / name
    bomb.write_bytes(gzip.compress(head + pad + tail, compresslevel=9))
    assert bomb.stat().st_size < 64 << 10
    a = analyze(d, Options(jobs=1, max_decompressed_bytes=4 << 20))
    assert [s["kind"] for s in a.model["runs"][0]["sidecars"]] == [kind]
    assert levels(a.model, bomb) == [("warning", "decompresses to more than 4 MiB (a gzip bomb?); not read; raise "
                                                 "--max-decompressed if this is a real file")]
    assert ranks_of(a.model) == [0]


def test_a_file_read_whole_is_bounded_even_under_the_trace_bound(tmp_path):
    f = tmp_path / "config.yaml.gz"
    f.write_bytes(gzip.compress(b"gradient_accumulation_steps: 4\n" + b" " * (logs.MAX_WHOLE_FILE_BYTES + 10)))
    with pytest.raises(InputError) as exc:
        logs.parse_config(f)
    assert exc.value.problem == ("decompresses to more than 64 MiB (a gzip bomb?); not read: too big for a file that "
                                 "is read whole")


def test_a_line_longer_than_the_cap_is_cut_and_counted(tmp_path):
    f = tmp_path / "train.log"
    with open(f, "wb") as fh:
        fh.write(b"Step 1 | loss:2.5 lr:0.0001\n")
        fh.write(b"x" * (3 * logs.MAX_LINE_BYTES))  # one 3 MiB line
        fh.write(b"\nStep 2 | loss:2.4 lr:0.0001\n")
        fh.write(b"y" * (logs.MAX_LINE_BYTES + 1))  # the last line, no newline
    res = logs.parse_text_log(f)
    assert [s.step for s in res.steps] == [1, 2]
    assert res.warnings == ["train.log: 2 lines longer than 1 MiB cut there (first: line 2)"]


# ---- 9. impossible durations are flagged -------------------------------------------------------------------------

def _span_event(dur_us: float) -> dict:
    return {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
            "ts": T0 - 100, "dur": dur_us, "args": {"Op count": 0}}


def test_impossible_durations_are_dropped_with_a_counted_warning_row(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    evs = events(20) + [
        kernel(30, dur=3_600e6),  # one hour in a 10 ms recording: an end time never written
        op(31, name="aten::copy_") | {"dur": 50_000.0},  # 50 ms
        op(32) | {"dur": -5.0}, op(33) | {"dur": -1.0},
        kernel(34) | {"ts": -100.0},
        _span_event(10_000.0),
    ]
    f = write_trace(d / "rank0.json", 0, 1, evs)
    db = tmp_path / "r.duckdb"
    for run in range(2):  # parsed, then from the cache: the warning row stays
        a = analyze(d, Options(jobs=1, db=db))
        assert levels(a.model, f) == [("warning", "2 events with a negative duration dropped; 1 event with a negative "
                                                  "timestamp dropped; 2 kernels or ops longer than the rank's trace "
                                                  "span (0.01 s, the profiler's recording) dropped from the metrics "
                                                  "(1 GPU, 1 CPU): impossible durations")], run
        assert a.con.execute("SELECT count(*), max(dur_ns) FROM kernels").fetchone() == (40, 40_000)
        assert a.con.execute("SELECT count(*), max(dur_ns) FROM cpu_ops").fetchone() == (20, 20_000)
        assert a.con.execute("SELECT n_kernels, n_cpu_ops FROM files").fetchone() == (40, 20)
        a.con.close()


def test_a_header_cannot_set_the_trace_span(tmp_path):
    f = write_trace(tmp_path / "rank0.json", 0, 1, events(5), **{parse.SPAN_KEY: 0.001})
    a = analyze(f, Options(jobs=1))
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (10,)
    assert not levels(a.model, f)


# ---- 11. no secrets in reports -------------------------------------------------------------------------------------

SECRETS = ("hf_AbCdEfSECRET123", "AKIAEXAMPLESECRET", "wandb-sekrit-42", "p4ssw0rd!")


def test_credential_like_header_keys_are_never_stored_or_printed(tmp_path):
    header = {"metadata": {"env": {"HF_TOKEN": SECRETS[0], "PATH": "/usr/bin",
                                   "deep": [{"aws_secret_access_key": SECRETS[1]}, {"x": [{"Password": SECRETS[3]}]}]},
                           "cmd": f"python train.py --wandb_api_key={SECRETS[2]} --lr 1e-4"}}
    d = tmp_path / "run"
    d.mkdir()
    write_trace(d / "rank0.json", 0, 1, **header)
    a = analyze(d, Options(jobs=1, db=tmp_path / "r.duckdb"))
    stored = a.con.execute("SELECT header FROM files").fetchone()[0]
    h = json.loads(stored)
    assert h["metadata"]["env"] == {"HF_TOKEN": "[redacted]", "PATH": "/usr/bin", "deep": [
        {"aws_secret_access_key": "[redacted]"}, {"x": [{"Password": "[redacted]"}]}]}
    assert h["metadata"]["cmd"] == "python train.py --wandb_api_key=[redacted] --lr 1e-4"
    dump = "\n".join(str(r) for t in ("files", "warnings", "run_facts") for r in a.con.execute(f"SELECT * FROM {t}")
                     .fetchall()) + to_json(a.model)
    assert not [s for s in SECRETS if s in dump]


def test_env_sidecars_keep_only_captures_allow_list(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write_trace(d / "rank0.json", 0, 1)
    env = {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "eth0", "HF_TOKEN": SECRETS[0],
           "AWS_SECRET_ACCESS_KEY": SECRETS[1], "NCCL_IB_SECRET_KEY": SECRETS[2], "DB_PASSWORD": SECRETS[3],
           "HOME": "/home/alice", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}
    (d / "env_rank0.json").write_text(json.dumps({"traceanalyze_capture": 1, "rank": 0, "world_size": 1,
                                                  "env": env}))
    a = analyze(d, Options(jobs=1))
    assert a.con.execute("SELECT value FROM run_facts WHERE key = 'env' ORDER BY value").fetchall() == [
        ("NCCL_IB_HCA=mlx5_0",), ("NCCL_SOCKET_IFNAME=eth0",), ("TORCH_NCCL_TRACE_BUFFER_SIZE=0",)]
    text = to_json(a.model)
    assert not [s for s in (*SECRETS, "/home/alice", "/k.json") if s in text]


@pytest.mark.parametrize(("name", "allowed"), [
    ("NCCL_IB_HCA", True), ("MASTER_ADDR", True), ("NCCL_IB_SECRET_KEY", False), ("FI_TOKEN", False),
    ("UCX_PASSWORD", False), ("HF_TOKEN", False), ("HOME", False), ("nccl_credential_file", False)])
def test_capture_records_only_its_allow_list(name, allowed):
    assert safety.env_allowed(name) is allowed


def test_symlinks_leading_outside_the_folder_are_skipped_with_a_warning(tmp_path):
    outside = tmp_path / "elsewhere"
    (outside / "more").mkdir(parents=True)
    write_trace(outside / "rank1.json", 1, 3)
    write_trace(outside / "more" / "rank2.json", 2, 3)
    d = tmp_path / "run"
    d.mkdir()
    write_trace(d / "rank0.json", 0, 3)
    (d / "rank1.json").symlink_to(outside / "rank1.json")
    (d / "more").symlink_to(outside / "more", target_is_directory=True)
    (d / "loop").symlink_to(d, target_is_directory=True)  # inside: never followed, nothing said
    a = analyze(d, Options(jobs=1))
    assert ranks_of(a.model) == [0]
    real = Path(os.path.realpath(outside))
    assert levels(a.model, d / "rank1.json") == [(
        "warning", f"a symlink to a file outside the input folder ({real / 'rank1.json'}); not followed: pass "
                   "--follow-external-symlinks to read it")]
    assert levels(a.model, d / "more") == [(
        "warning", f"a symlink to a folder outside the input folder ({real / 'more'}); not followed: pass "
                   "--follow-external-symlinks to read it")]
    assert not levels(a.model, d / "loop")
    a = analyze(d, Options(jobs=1, follow_external_symlinks=True))
    assert sorted(ranks_of(a.model)) == [0, 1, 2]


# ---- 12. the cache is never stale ----------------------------------------------------------------------------------

def test_a_file_changed_with_size_and_mtime_kept_is_parsed_again(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    f = write_trace(d / "rank0.json", 0, 1, events(5))
    db = tmp_path / "r.duckdb"
    a = analyze(d, Options(jobs=1, db=db))
    assert a.con.execute("SELECT DISTINCT name FROM kernels WHERE name LIKE '%gemm%'").fetchall() == [
        ("void gemm_kernel<float>(float*)",)]
    a.con.close()
    st = f.stat()
    f.write_bytes(f.read_bytes().replace(b"gemm_kernel", b"gemv_kernel"))  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p or touch -r would
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    a = analyze(d, Options(jobs=1, db=db))
    assert not a.model.get("cached") and a.model["runs"][0]["files"][0]["cached"] is False
    assert a.con.execute("SELECT DISTINCT name FROM kernels WHERE name LIKE '%gem%'").fetchall() == [
        ("void gemv_kernel<float>(float*)",)]
    a.con.close()
    a = analyze(d, Options(jobs=1, db=db))  # unchanged now: the cache answers
    assert a.model.get("cached") is True


def test_a_big_file_changed_at_either_end_gets_another_fingerprint(tmp_path):
    f = tmp_path / "t.json"
    f.write_bytes(b"a" * (3 << 20))
    st = f.stat()
    before = ingest.fingerprint(f)
    for at in (0, (3 << 20) - 1):
        data = bytearray(f.read_bytes())
        data[at] = ord("b")
        f.write_bytes(bytes(data))
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert ingest.fingerprint(f) != before
        f.write_bytes(b"a" * (3 << 20))
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert ingest.fingerprint(f) == before


def test_rows_of_files_that_left_the_folder_are_deleted(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    for r in range(3):
        write_trace(d / f"rank{r}.json", r, 3, events(4))
    db = tmp_path / "r.duckdb"
    a = analyze(d, Options(jobs=1, db=db))
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (24,)
    a.con.close()
    (d / "rank2.json").unlink()
    a = analyze(d, Options(jobs=1, db=db))
    assert a.con.execute("SELECT count(*), list(path ORDER BY path) FROM files").fetchone() == (
        2, [str((d / f"rank{r}.json").resolve()) for r in (0, 1)])
    for t in ("kernels", "cpu_ops", "comm_events"):
        assert a.con.execute(f"SELECT count(*) FROM {t} WHERE file_id NOT IN (SELECT file_id FROM files)"
                             ).fetchone() == (0,)
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (16,)


# ---- fuzz: header fields, numbers and nesting ---------------------------------------------------------------------

_HUGE = st.one_of(st.integers(min_value=-(10**40), max_value=10**40), st.integers(min_value=2**31 - 2,
                                                                                   max_value=2**31 + 2))
_FIELD = st.one_of(st.none(), st.booleans(), _HUGE, st.integers(-3, 1 << 21), st.floats(allow_nan=True),
                   st.text(max_size=12), st.just("9" * 400), st.lists(st.integers(), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


_NAME = st.sampled_from(["rank{i}.json", "rank_2024-05-0{i}.json", "rank_2024050{i}.json", "worker{i}.json",
                         "host.{i}.pt.trace.json", "rank{i}000000.json", "rank{i}.json.gz"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_FIELD, _FIELD, _NAME), min_size=1, max_size=5))
def test_fuzz_header_rank_and_world_size(cases):
    paths = [Path(f"{i}") / name.format(i=i) for i, (_, _, name) in enumerate(cases)]
    fields = [(r, w) for r, w, _ in cases]
    headers = {p: {"distributedInfo": {"rank": r, "world_size": w}} for p, (r, w) in zip(paths, fields, strict=True)}
    clean, warnings = discover.check_headers(headers)
    ranks, _ = discover.assign_ranks(paths, clean)
    assert set(ranks) == set(paths)
    assert all(0 <= r < names.MAX_WORLD_SIZE for r in ranks.values())
    warned = {f for f, _ in warnings}
    for p, (_, w) in zip(paths, fields, strict=True):
        plausible_w = w is None or (isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 1 << 20) or (
            isinstance(w, str) and w.isascii() and w.isdigit() and len(w) <= 10 and 1 <= int(w) <= 1 << 20)
        if not plausible_w:
            assert str(p) in warned  # each implausible field is said, naming the file
        if discover.rank_from_header(clean[p]) is not None:
            assert ranks[p] == discover.rank_from_header(clean[p])
    assert len(warnings) == len(warned)  # one warning per file at most


_NUMBER = st.one_of(st.integers(), st.integers(min_value=10**18, max_value=10**500).map(str),
                    st.sampled_from(["1e400", "-1e400", "1e308", "-0.0", "4e15", "-5", "1" + "0" * 400]),
                    st.floats(allow_nan=False, allow_infinity=False).map(repr))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["ts", "dur", "pid", "External id", "stream", "In msg nelems"]), _NUMBER,
                          st.integers(1, 3000)), min_size=1, max_size=6))
def test_fuzz_numbers_and_nesting_cost_at_most_their_event(tmp_path_factory, cases):
    """Whatever the numbers and nesting in some events, the others are all kept, the file parses, and every dropped
    event is counted."""
    f = tmp_path_factory.mktemp("fuzz") / "rank0.json"
    good = events(4)
    raws = []
    for field, number, depth in cases:
        e = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": T0, "dur": 1.0,
             "args": {"Collective name": "allreduce", "x": "NEST"}}
        text = json.dumps(e).replace('"NEST"', "[" * depth + "]" * depth)
        key = f'"{field}": '
        if field in ("ts", "dur", "pid"):
            was = str(T0) if field == "ts" else "1.0" if field == "dur" else "0"
            text = text.replace(key + was, key + str(number))
        else:
            text = text.replace('"args": {', '"args": {' + key + str(number) + ", ")
        raws.append(text)
    _with_raw(f, good, raws)
    info, tables = parse_trace(f)
    n_good_kernels = sum(1 for e in good if e["cat"] == "kernel")
    assert tables["kernels"].num_rows >= n_good_kernels
    assert tables["cpu_ops"].num_rows == sum(1 for e in good if e["cat"] == "cpu_op")
    assert tables["kernels"].num_rows + info.skipped_events == n_good_kernels + len(raws)


def test_redact_walks_any_depth_without_recursion():
    deep: object = {"HF_TOKEN": "x"}
    for _ in range(5000):
        deep = [deep]
    out = safety.redact({"a": deep})
    for _ in range(5001):
        out = out[0] if isinstance(out, list) else out["a"]
    assert out == {"HF_TOKEN": "[redacted]"}


_HEADER_VALUE = st.recursive(_FIELD, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                             max_leaves=8)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_FIELD, _FIELD, _HEADER_VALUE, _HEADER_VALUE, _HEADER_VALUE)
def test_fuzz_header_fields_through_the_report(tmp_path_factory, rank, world, di_extra, props, base):
    """Whatever a header holds (rank, world size, distributedInfo, deviceProperties, baseTimeNanoseconds), the
    report is made: the good rank is analysed, every rank is plausible, the model is JSON."""
    d = tmp_path_factory.mktemp("fuzz") / "run"
    d.mkdir()
    write_trace(d / "rank0.json", 0, 2, events(3))
    di = {"rank": rank, "world_size": world, "extra": di_extra}
    bad = d / "rank1.json"
    bad.write_text(json.dumps({"distributedInfo": di, "deviceProperties": props, "baseTimeNanoseconds": base,
                               "traceEvents": events(3)}, default=str))
    a = analyze(d, Options(jobs=1))
    ranks = ranks_of(a.model)
    assert 0 in ranks and all(0 <= r < names.MAX_WORLD_SIZE for r in ranks)
    json.loads(to_json(a.model))
    a.con.close()
