"""Streaming ingest on generated and real traces: both schemas, truncation, odd JSON, block boundaries."""

from __future__ import annotations

import gzip
import json
import os
import pathlib

import pytest

from tests.conftest import real
from traceanalyze import store
from traceanalyze.errors import InputError
from traceanalyze.ingest import cache, load, parse
from traceanalyze.ingest.parse import parse_trace
from traceanalyze.options import Options


def _kernel(i: int, name: str = "void gemm_kernel<float>(float*)") -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 1000.5 + 10 * i, "dur": 4.25,
            "args": {"External id": i, "device": 0, "stream": 7, "correlation": 100 + i}}


def _op(i: int, name: str = "aten::mm") -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 11, "tid": 12, "ts": 990.0 + 10 * i, "dur": 3.0,
            "args": {"External id": i, "Input type": ["c10::BFloat16", "c10::BFloat16"],
                     "Input Dims": [[64, 32], [32, 16]]}}


def _trace(events: list[dict], **header) -> dict:
    return {"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 4}, **header, "traceEvents": events}


def _write(tmp_path, obj, name="t.json", gz=False) -> str:
    data = json.dumps(obj, indent=1).encode() if not isinstance(obj, bytes) else obj
    p = tmp_path / (name + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(data) if gz else data)
    return str(p)


def test_columns_units_and_header(tmp_path):
    path = _write(tmp_path, _trace([_kernel(0), _op(0)], baseTimeNanoseconds=5_000_000_000), gz=True)
    info, t = parse_trace(path)
    assert info.header["distributedInfo"] == {"rank": 3, "world_size": 4}
    assert info.base_time_ns == 5_000_000_000
    k = t["kernels"].to_pylist()[0]
    assert (k["ts_ns"], k["dur_ns"], k["stream"], k["correlation"], k["external_id"]) == (1_000_500, 4_250, 7, 100, 0)
    c = t["cpu_ops"].to_pylist()[0]
    assert json.loads(c["input_types"]) == ["c10::BFloat16", "c10::BFloat16"]
    assert json.loads(c["input_dims"]) == [[64, 32], [32, 16]]
    assert not info.partial and info.warnings == []


def test_header_after_events_is_read(tmp_path):
    # new kineto writes baseTimeNanoseconds after traceEvents
    text = '{"schemaVersion": 1, "traceEvents": [' + json.dumps(_kernel(0)) + '], "baseTimeNanoseconds": 7000}'
    info, t = parse_trace(_write(tmp_path, text.encode()))
    assert info.base_time_ns == 7000 and t["kernels"].num_rows == 1


def test_bare_array_form(tmp_path):
    info, t = parse_trace(_write(tmp_path, json.dumps([_kernel(0), _kernel(1)]).encode()))
    assert t["kernels"].num_rows == 2 and info.header == {}


def test_strings_with_brackets_quotes_and_escapes(tmp_path, monkeypatch):
    names = ['void f<{lambda(int)#1}>()', 'say "hi" [x]', 'back\\slash\\', 'tab\t}{][', "\\\"}"]
    events = [_kernel(i, n) for i, n in enumerate(names * 50)]
    monkeypatch.setattr(parse, "BLOCK_BYTES", 97)  # force many block boundaries inside strings and escapes
    info, t = parse_trace(_write(tmp_path, _trace(events), gz=True))
    assert t["kernels"].column("name").to_pylist() == names * 50
    assert not info.partial


@pytest.mark.parametrize("cut", [0.2, 0.5, 0.77, 0.99])
def test_truncated_json_reads_complete_events(tmp_path, cut):
    events = [_kernel(i) for i in range(200)]
    data = json.dumps(_trace(events), indent=1).encode()
    data = data[: int(len(data) * cut)]
    info, t = parse_trace(_write(tmp_path, data))
    n = t["kernels"].num_rows
    assert 0 < n < 200
    assert t["kernels"].column("external_id").to_pylist() == list(range(n))  # exactly the complete prefix
    assert info.partial and "truncated" in info.warnings[0]


def test_truncated_gzip_reads_what_it_can(tmp_path):
    events = [_kernel(i) for i in range(5000)]
    raw = gzip.compress(json.dumps(_trace(events)).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    info, t = parse_trace(p)
    assert 0 < t["kernels"].num_rows < 5000 and info.partial
    assert "gzip stream ends early" in info.warnings[0]


@pytest.mark.parametrize("content, problem", [
    (b"", "empty file"),
    (b"hello", "not JSON"),
    (b'{"a": 1, "b": [1, 2]}', "not a trace"),
    (b'{"schemaVersion": 1, "traceEvents": [', "no events"),
])
def test_broken_files_raise_input_error_naming_the_file(tmp_path, content, problem):
    p = _write(tmp_path, content, name="bad.json")
    if problem == "no events":
        info, t = parse_trace(p)  # the array opened and was cut before any event: partial, empty
        assert info.partial and t["kernels"].num_rows == 0
        return
    with pytest.raises(InputError) as exc:
        parse_trace(p)
    assert str(exc.value).startswith(p) and problem in str(exc.value)


def test_wrong_types_and_bad_times_are_skipped_not_fatal(tmp_path):
    events = [_kernel(0), dict(_kernel(1), ts="soon"), dict(_kernel(2), dur=-5), dict(_kernel(3), dur=float("nan")),
              dict(_kernel(4), args={"External id": "x7", "stream": [1]}), {"ph": "X"}, 5, _kernel(5)]
    text = json.dumps(_trace(events)).replace("NaN", "NaN")
    info, t = parse_trace(_write(tmp_path, text.encode()))
    ext = t["kernels"].column("external_id").to_pylist()
    assert ext[0] == 0 and ext[-1] == 5 and 7 in ext  # "x7" coerced to 7
    assert t["kernels"].num_rows == 3
    assert info.skipped_events >= 3


def test_gzip_bomb_is_bounded(tmp_path):
    p = tmp_path / "bomb.json.gz"
    with gzip.open(p, "wb") as fh:
        fh.write(b'{"traceEvents": [' + b" " * (20 << 20))
    with pytest.raises(InputError, match="decompresses to more than"):
        parse_trace(p, max_decompressed=8 << 20)


def test_gzip_is_inflated_one_block_at_a_time(tmp_path):
    import tracemalloc

    # ~40 MiB of JSON in ~1.5 MiB of gzip: one compressed read inflates to far more than a block
    events = [_kernel(i) for i in range(160_000)]
    p = tmp_path / "dense.json.gz"
    p.write_bytes(gzip.compress(json.dumps(_trace(events)).encode(), compresslevel=9))
    blocks, state = parse._open_blocks(p, 1 << 40)
    tracemalloc.start()
    sizes = [len(b) for b in blocks]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert sum(sizes) > 30 << 20 and max(sizes) <= parse.BLOCK_BYTES and not state["error"]
    assert peak < 8 << 20  # a compressed read and a few blocks; holding a read's whole output was ~27 MiB here


def test_corrupt_gzip_keeps_the_events_before_the_damage(tmp_path):
    events = [_kernel(i) for i in range(40_000)]
    raw = bytearray(gzip.compress(json.dumps(_trace(events)).encode()))
    at = len(raw) * 3 // 4
    raw[at:at + 64] = b"\xff" * 64
    p = tmp_path / "damaged.json.gz"
    p.write_bytes(bytes(raw))
    info, t = parse_trace(p)
    assert info.partial and any("corrupt gzip data" in w for w in info.warnings)
    assert 20_000 < t["kernels"].num_rows < 40_000  # read up to the damage, within the same compressed read too


def test_real_old_and_new_schema_counts():
    info, t = parse_trace(real("kineto/tb_plugin_test") / "gpu_metrics_input.json")
    cats = t["kernels"].column("cat").to_pylist()
    assert cats.count("kernel") == 30 and cats.count("gpu_memcpy") == 2
    assert set(t["kernels"].column("stream").to_pylist()) == {7}  # from "stream 7" / args.stream
    info, t = parse_trace(real("hta/df_index_resolver") / "df_index_resolver.json.gz")
    cats = t["kernels"].column("cat").to_pylist()
    assert cats.count("kernel") == 19370 and cats.count("gpu_memcpy") == 2040 and cats.count("gpu_memset") == 880
    assert info.header["distributedInfo"]["rank"] == 1


def _plain_copy(tmp_path, monkeypatch, n_parts: int | None = None):
    """(gzip source, plain copy, its bytes) of a real trace, with files from 1 MiB up split into byte ranges, in
    ``n_parts`` of them when given."""
    src = real("hta/nccl_parser_config") / "nccl_data.json.gz"
    plain = tmp_path / "split" / "nccl_data.json"
    plain.parent.mkdir()
    data = gzip.decompress(src.read_bytes())
    plain.write_bytes(data)
    monkeypatch.setattr(parse, "SPLIT_MIN_BYTES", 1 << 20)
    if n_parts:
        monkeypatch.setattr(load, "PART_BYTES", -(-len(data) // n_parts))
    return src, plain, data


@pytest.mark.parametrize("case", ["3 ranges, 3 jobs", "7 ranges, 2 jobs", "4 ranges, 1 job", "tail base misread"])
def test_large_plain_file_split_in_byte_ranges_gives_the_same_rows(tmp_path, monkeypatch, case):
    from traceanalyze.pipeline import analyze

    src, plain, data = _plain_copy(tmp_path, monkeypatch)
    points = parse.split_points(plain, 3)
    assert len(points) == 3 and points[0] == 0
    assert all(data[p:p + 1] == b"{" for p in points[1:])  # each part starts at an event
    jobs = 3
    if case == "7 ranges, 2 jobs":  # parts loaded one by one while later ones are parsed
        monkeypatch.setattr(load, "PART_BYTES", -(-len(data) // 7))
        jobs = 2
    inserts = []
    if case == "4 ranges, 1 job":  # parsed in turn in this process, still committed range by range
        monkeypatch.setattr(load, "PART_BYTES", -(-len(data) // 4))
        jobs = 1
        real_insert = load._insert_part
        monkeypatch.setattr(load, "_insert_part", lambda *a, **k: inserts.append(1) or real_insert(*a, **k))
    if case == "tail base misread":  # the shift applied to early parts is corrected once the last part is read
        monkeypatch.setattr(parse, "tail_base_time_ns", lambda path, header: 0)
    whole = analyze(src, Options(jobs=1))
    inserts.clear()
    parts = analyze(plain.parent, Options(jobs=jobs))
    if case == "4 ranges, 1 job":
        assert len(inserts) == 4
    q = "SELECT count(*), sum(ts_ns), sum(dur_ns), count(DISTINCT name) FROM {}"
    for t in ("kernels", "cpu_ops", "comm_events"):
        assert parts.con.execute(q.format(t)).fetchall() == whole.con.execute(q.format(t)).fetchall()
    assert parts.con.execute("SELECT count(*) FROM comm_events").fetchone()[0] > 0
    hdr = parts.con.execute("SELECT base_time_ns, status FROM files").fetchall()
    assert hdr == [(1711964646000000000, "ok")]  # baseTimeNanoseconds comes after the events: read by the last part
    a, b = parts.model["runs"][0]["ranks"][0], whole.model["runs"][0]["ranks"][0]
    assert (a["idle_pct"], a["comm_comp_overlap_pct"]) == (b["idle_pct"], b["comm_comp_overlap_pct"])


def test_ipc_output_streams_the_same_rows_in_chunks(tmp_path):
    import pyarrow as pa

    src = real("hta/nccl_parser_config") / "nccl_data.json.gz"
    info_mem, mem = parse_trace(src)
    info, files = parse_trace(src, tmp_path, key="k", chunk_rows=1000)
    # a stream per table that has rows; none for the empty ones (this trace holds no cuda_sync rows)
    assert set(files) == {n for n, t in mem.items() if t.num_rows} and mem["cuda_syncs"].num_rows == 0
    assert info.counts == {n: t.num_rows for n, t in mem.items()}
    for name, f in files.items():
        batches = list(pa.ipc.open_stream(pa.OSFile(f)))
        assert pa.Table.from_batches(batches, mem[name].schema).equals(mem[name]), name
        if mem[name].num_rows > 2000:
            assert len(batches) >= 2  # written chunk by chunk, not held whole


def test_interrupted_split_file_is_marked_loading_and_loaded_whole_next_time(tmp_path, monkeypatch):
    from traceanalyze.pipeline import analyze

    src, plain, _ = _plain_copy(tmp_path, monkeypatch, n_parts=5)
    real_insert, calls = load._insert_part, []

    def third_raises(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_insert(*args, **kw)

    db = tmp_path / "s.duckdb"
    monkeypatch.setattr(load, "_insert_part", third_raises)
    with pytest.raises(KeyboardInterrupt):
        analyze(plain.parent, Options(db=db, jobs=2))
    monkeypatch.setattr(load, "_insert_part", real_insert)
    con = store.connect(db)
    assert con.execute("SELECT status FROM files").fetchall() == [("loading",)]
    assert 0 < con.execute("SELECT count(*) FROM kernels").fetchone()[0]  # the first two parts are in
    con.close()
    a = analyze(plain.parent, Options(db=db, jobs=2))
    whole = analyze(src, Options(jobs=1))
    assert not a.model["runs"][0]["files"][0]["cached"]
    q = "SELECT count(*), sum(ts_ns), sum(dur_ns) FROM {}"
    for t in ("kernels", "cpu_ops", "comm_events"):
        assert a.con.execute(q.format(t)).fetchall() == whole.con.execute(q.format(t)).fetchall()
    assert a.con.execute("SELECT status FROM files").fetchall() == [("ok",)]


def test_split_file_with_a_failed_part_is_one_error_and_leaves_no_rows(tmp_path, monkeypatch):
    from traceanalyze.pipeline import analyze

    src, plain, _ = _plain_copy(tmp_path, monkeypatch, n_parts=4)
    monkeypatch.setattr(load, "_parse_one", _third_part_fails)
    a = analyze(plain.parent, Options(db=tmp_path / "e.duckdb", jobs=2))
    assert a.con.execute("SELECT status, message FROM files").fetchall() == [
        ("error", "an event larger than 64 MiB; the file is corrupt")]
    for t in ("kernels", "cpu_ops", "comm_events"):
        assert a.con.execute(f"SELECT count(*) FROM {t}").fetchone() == (0,), t
    a.con.close()


_REAL_PARSE_ONE = load._parse_one


def _third_part_fails(args):  # module level: the parse pool pickles it by name
    if args[2].endswith("p2"):
        return args[0], None, None, "an event larger than 64 MiB; the file is corrupt"
    return _REAL_PARSE_ONE(args)


def test_load_uses_the_system_allocator_and_puts_the_default_back(tmp_path, monkeypatch):
    import pyarrow as pa

    from traceanalyze.pipeline import analyze

    seen = []
    real_insert = load._insert_part

    def insert(con, items, **kw):  # whole files come as a list of (file_id, base, tables, rows), one per file
        seen.extend((pa.default_memory_pool().backend_name, sorted(tables)) for _, _, tables, _ in items)
        return real_insert(con, items, **kw)

    monkeypatch.setattr(load, "_insert_part", insert)
    before = pa.default_memory_pool().backend_name
    folder = _write(tmp_path, _trace([_kernel(i) for i in range(50)] + [_op(i) for i in range(50)]))
    a = analyze(folder, Options(jobs=1))
    # IPC streams, even in-process; one per table with rows (the trace has no metadata, collective or sync rows)
    assert seen == [("system", ["cpu_ops", "kernels"])]
    assert pa.default_memory_pool().backend_name == before
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 50


def test_compute_calls_match_pyarrow_compute():
    """traceanalyze.ingest.compute calls Arrow's functions as pyarrow.compute's wrappers do: the same arrays."""
    import pyarrow as pa
    import pyarrow.compute as pac

    from traceanalyze.ingest import compute as pc

    f = pa.array([1.25, -0.5, None, 2.5e6, float("nan")])
    b = pa.array([True, None, False, True, True])
    s = pa.array(["kernel", "cpu_op", None, "gpu_memcpy", "x"])
    keys = pa.array(["kernel", "gpu_memcpy"])
    cases = [
        ("floor", (f,)), ("round", (pc.multiply(f, 1000.0),)), ("add", (f, 3)), ("subtract", (f, f)),
        ("multiply", (f, 1000.0)), ("and_", (b, b)), ("or_", (b, pa.array([False] * 5))), ("invert", (b,)),
        ("is_finite", (f,)), ("is_valid", (s,)), ("less", (f, 0.0)), ("less_equal", (f, 1.25)),
        ("greater", (f, 0.0)), ("coalesce", (f, pa.array([0.0] * 5))), ("if_else", (b, "kernels", "cpu_ops")),
        ("sum", (b,)), ("any", (b,)), ("fill_null", (b, False)), ("index_in", (s, keys)), ("is_in", (s, keys)),
        ("take", (keys, pa.array([1, 0, None]))), ("cast", (pa.array([1.0, None, 3.0]), pa.int64())),
        ("cast", (pa.array([b"a", None], pa.binary()), pa.string())),
    ]
    for name, args in cases:
        ours, theirs = getattr(pc, name)(*args), getattr(pac, name)(*args)
        assert ours.type == theirs.type and repr(ours.as_py() if isinstance(ours, pa.Scalar) else ours.to_pylist()
                                                 ) == repr(theirs.as_py() if isinstance(theirs, pa.Scalar)
                                                           else theirs.to_pylist()), name
    t = pa.table({"a": f, "s": s})
    assert repr(pc.filter(t, b).to_pylist()) == repr(t.filter(b).to_pylist())
    assert repr(pc.filter(f, b).to_pylist()) == repr(f.filter(b).to_pylist())
    with pytest.raises(pa.ArrowInvalid):  # a safe cast, as pyarrow.compute.cast's default
        pc.cast(pa.array([1.5]), pa.int64())


def test_parsing_never_imports_pyarrow_compute(tmp_path):
    """pyarrow.compute builds a wrapper per Arrow function on import (~40 ms of each parsing process); pandas, which
    imports it, is blocked by the command line."""
    import subprocess
    import sys
    from pathlib import Path

    path = _write(tmp_path, _trace([_kernel(i) for i in range(3)] + [_op(i) for i in range(3)]), gz=True)
    code = ("import sys; from pathlib import Path; from traceanalyze import ingest, store; ingest.block_pandas(); "
            f"con = store.connect(None); [f] = ingest.load_traces(con, [Path({path!r})], jobs=1); "
            "assert f.error is None and con.execute('SELECT count(*) FROM kernels').fetchone()[0] == 3; "
            "print('pyarrow.compute' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.split() == ["False"]


def test_each_trace_is_read_for_its_fingerprint_once_per_report(tmp_path, monkeypatch):
    """The report's cache key and the parse cache share each trace's fingerprint: two traces, two reads, and the
    files rows carry the fingerprints the key was made from."""
    from traceanalyze.pipeline import analyze

    folder = tmp_path / "run"
    folder.mkdir()
    for r in range(2):
        (folder / f"rank{r}.json").write_text(json.dumps(_trace([_kernel(i) for i in range(5)])))
    real, reads = cache.fingerprint, []

    def counted(path):
        reads.append(path.name)
        return real(path)

    monkeypatch.setattr(cache, "fingerprint", counted)
    a = analyze(folder, Options(jobs=1))
    assert sorted(reads) == ["rank0.json", "rank1.json"]
    stored = dict(a.con.execute("SELECT path, fingerprint FROM files").fetchall())
    assert stored == {str((folder / n).resolve()): real(folder / n) for n in ("rank0.json", "rank1.json")}


def test_trace_span_and_metadata_events_among_kept_events(tmp_path):
    """The "Trace" span event rides with the kept X events into a batch and is taken out there (no row); metadata
    events are found by their count, in whichever run they decode."""
    meta = [{"ph": "M", "name": "thread_name", "pid": 11, "tid": 12, "args": {"name": "python main"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
            "ts": 900.0, "dur": 2500.0, "args": {"Op count": 0}}
    events = [*(_op(i) for i in range(3)), span, meta[0], *(_kernel(i) for i in range(2)), meta[1]]
    info, t = parse_trace(_write(tmp_path, _trace(events)))
    assert info.header[parse.SPAN_KEY] == 2500.0
    assert (t["cpu_ops"].num_rows, t["kernels"].num_rows) == (3, 2)
    assert "Trace" not in t["cpu_ops"].column("cat").to_pylist() + t["kernels"].column("cat").to_pylist()
    assert sorted(t["threads"].to_pylist(), key=lambda r: r["kind"]) == [
        {"pid": 0, "tid": 0, "kind": "process_name", "label": "GPU 0"},
        {"pid": 11, "tid": 12, "kind": "thread_name", "label": "python main"}]
    assert info.skipped_events == 0 and info.warnings == []


def test_numpy_ns_conversion_matches_arrow():
    """ts_ns of the kept events (NumPy) equals the Arrow steps the memory events use, on epoch µs (old traces)
    and on halves of a ns, which round to even."""
    us = [1.7e15 + 0.1235, 1_700_000_000_123_456.75, 0.0005, 0.0015, 0.0025, 1000.5, 3.9999995, 4e15]
    arrow = parse._us_to_ns(parse.pa.array(us, parse.pa.float64())).to_pylist()
    assert parse._us_to_ns_np(parse.np.array(us)).tolist() == arrow
    assert arrow[3:5] == [2, 2]  # 1.5 ns and 2.5 ns: half to even


def test_int64_np_reads_values_and_validity_exactly():
    """The [memory] path's int64 columns in NumPy: nulls read as 0 and invalid, values beyond 2**53 exact (no
    float64 detour), a slice's offset honoured; all-null and null-free arrays too."""
    pa, np = parse.pa, parse.np
    big = (1 << 62) + 1
    col = pa.array([None, big, -(1 << 63), None, 7, 8, 9, None, 10], pa.int64())
    vals, valid = parse._int64_np(col)
    assert vals.tolist() == [0, big, -(1 << 63), 0, 7, 8, 9, 0, 10]
    assert valid.tolist() == [False, True, True, False, True, True, True, False, True]
    vals, valid = parse._int64_np(col.slice(3, 5))
    assert vals.tolist() == [0, 7, 8, 9, 0] and valid.tolist() == [False, True, True, True, False]
    vals, valid = parse._int64_np(pa.nulls(3, pa.int64()))
    assert vals.tolist() == [0, 0, 0] and not valid.any()
    vals, valid = parse._int64_np(pa.array(np.array([1, big]), pa.int64()))
    assert vals.tolist() == [1, big] and valid.all()


@pytest.mark.parametrize("jobs", [1, 2])
def test_small_files_parsed_in_groups_load_the_rows_of_one_by_one(tmp_path, monkeypatch, jobs):
    """Small files parsed several to a task (one stream per table and task) give the same rows, each under its own
    file_id and shifted by its own baseTimeNanoseconds, as one file a task; a file that fails in a group is an
    error with no rows, and one over GROUP_HOLD_ROWS rows writes streams of its own."""
    from traceanalyze.ingest import workers
    from traceanalyze.pipeline import analyze

    folder = tmp_path / "run"
    folder.mkdir()
    for r in range(12):
        n = 40 if r == 7 else 3 + r  # rank 7: over the hold bound below
        ev = [_kernel(i) for i in range(n)] + [_op(i) for i in range(r % 3)]
        (folder / f"rank{r:02}.json").write_text(json.dumps(_trace(ev, baseTimeNanoseconds=10**15 * (r + 1))))
    (folder / "rank05.json").write_text('{"schemaVersion": 1}')  # no traceEvents: an error
    monkeypatch.setattr(workers, "GROUP_HOLD_ROWS", 30)
    monkeypatch.setattr(load, "INSERT_ROWS", 20)  # inserts between groups, in the open transaction
    monkeypatch.setattr(load, "GROUP_FILES", 1)
    one = analyze(folder, Options(jobs=jobs))
    tasks = []
    real_items = load._work_items
    monkeypatch.setattr(load, "_work_items", lambda *a: (tasks.append(t) or t for t in real_items(*a)))
    monkeypatch.setattr(load, "GROUP_FILES", 16)
    monkeypatch.setattr(load, "GROUP_TASKS_PER_CPU", 1)
    grouped = analyze(folder, Options(jobs=jobs))
    assert [len(t[0]) for t in tasks] == [12 // jobs] * jobs  # the files of a task in order: the rows too
    for t in ("files", "kernels", "cpu_ops", "comm_events", "threads"):
        q = f"SELECT * EXCLUDE (file_id), file_id FROM {t} ORDER BY ALL" if t != "files" else \
            "SELECT * EXCLUDE (mtime_ns) FROM files ORDER BY file_id"
        assert grouped.con.execute(q).fetchall() == one.con.execute(q).fetchall(), t
    per_file = grouped.con.execute("SELECT f.path, f.status, count(k.file_id), min(k.ts_ns) FROM files f "
                                   "LEFT JOIN kernels k USING (file_id) GROUP BY ALL ORDER BY f.path").fetchall()
    assert [(s, n) for _, s, n, _ in per_file] == [
        ("ok", 3 + r) if r not in (5, 7) else ("error", 0) if r == 5 else ("ok", 40) for r in range(12)]
    assert per_file[11][3] == 12 * 10**15 + 1_000_500  # its own base, plus ts 1000.5 us
    assert not list(tmp_path.glob("**/*.arrow"))


def test_a_batch_of_mixed_events_keeps_each_tables_order_and_the_collectives_in_event_order(tmp_path):
    """Kernels, host ops and stream waits interleaved in one batch (the parser groups a batch's rows by table):
    each table keeps its events' order, the collectives come in event order across both sources, and a dropped
    event (a negative dur) or an out-of-range device on a kernel drops only that row."""
    sync = {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 9, "ts": 5.0, "dur": 1.0,
            "args": {"stream": 9, "wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 55}}
    ev = []
    for i in range(6):
        k, o = _kernel(i), _op(i)
        if i % 2:  # collectives on both sides, alternating
            k["args"]["Collective name"] = f"k{i}"
            o["args"]["Collective name"] = f"o{i}"
        ev += [o, k, {**sync, "ts": 5.0 + i}]
    ev[3]["dur"] = -1.0  # op 1: dropped
    ev[7]["args"]["device"] = 1 << 70  # kernel 2: out of range, dropped
    info, t = parse_trace(_write(tmp_path, json.dumps(_trace(ev)).encode()))  # compact: the raw dims as written
    assert t["kernels"].column("external_id").to_pylist() == [0, 1, 3, 4, 5]
    assert t["cpu_ops"].column("external_id").to_pylist() == [0, 2, 3, 4, 5]
    assert t["cuda_syncs"].column("ts_ns").to_pylist() == [5000 + 1000 * i for i in range(6)]
    assert t["cuda_syncs"].column("wait_on_corr").to_pylist() == [55] * 6
    assert t["cpu_ops"].column("input_dims").to_pylist() == ["[[64, 32], [32, 16]]"] * 5
    assert t["comm_events"].column("collective").to_pylist() == ["k1", "o3", "k3", "o5", "k5"]
    assert t["comm_events"].column("source").to_pylist() == ["kernels", "cpu_ops", "kernels", "cpu_ops", "kernels"]
    assert (info.dropped.get("out_of_range"), info.skipped_events) == (1, 2)


def test_the_last_small_files_go_fewer_to_a_task_when_there_are_many_tasks():
    """256 small files on 2 processes: 16 files a task, but the last 32 four to a task (the processes finish
    together); on one process, or with few tasks to each, every task is a full one."""
    todo = [(pathlib.Path(f"r{i:03}.json"), (f"r{i:03}.json", 1000, 0)) for i in range(256)]

    def sizes(n_files: int, n_cpu: int) -> list[int]:
        plan = load._Plan(keys={})
        return [len(t[0]) for t in load._work_items(todo[:n_files], "/tmp", 1 << 30, n_cpu, plan)]

    assert sizes(256, 2) == [16] * 14 + [4] * 8
    assert sizes(256, 1) == [16] * 16
    assert sizes(64, 2) == [4] * 14 + [1] * 8  # 4 a task (8 tasks a process), the last 8 files alone


def test_a_held_file_of_several_batches_is_one_record_batch_in_its_groups_stream(tmp_path, monkeypatch):
    """A small file converted in several batches is written to its group's stream as one record batch per table
    (the insert pays per batch), its rows in order, and the next file's rows in batches of their own."""
    import pyarrow as pa

    from traceanalyze.ingest import workers

    monkeypatch.setattr(parse._Columns, "BATCH_ROWS", 4)
    a = _write(tmp_path, json.dumps(_trace([_kernel(i) for i in range(10)])).encode(), "a.json")
    b = _write(tmp_path, json.dumps(_trace([_kernel(i) for i in range(3)])).encode(), "b.json")
    out = workers.parse_group(([a, b], str(tmp_path), "g", 1 << 30))
    assert [r[2].rows["kernels"] for r in out] == [10, 3]
    with pa.ipc.open_stream(out[0][2]["kernels"]) as reader:
        batches = list(reader)
    assert [x.num_rows for x in batches] == [10, 3]
    assert batches[0].column("external_id").to_pylist() == list(range(10))


@pytest.mark.skipif(os.name != "posix", reason="a mapped file is deleted while open on POSIX only")
@pytest.mark.parametrize("mapped", [True, False])
def test_held_rows_are_read_from_a_memory_map_and_their_stream_deleted(tmp_path, monkeypatch, mapped):
    """The loader reads a group's stream as a memory map: its batches are views of the page cache (nothing allocated
    for them), and they stay readable after the stream is deleted. A stream over MAP_STREAM_MAX_BYTES is read as a
    file, its batches copied out of it."""
    import pyarrow as pa

    from traceanalyze.ingest import held, workers

    if not mapped:
        monkeypatch.setattr(held, "MAP_STREAM_MAX_BYTES", 0)
    a = _write(tmp_path, json.dumps(_trace([_kernel(i) for i in range(10)])).encode(), "a.json")
    b = _write(tmp_path, json.dumps(_trace([_kernel(i) for i in range(3)])).encode(), "b.json")
    out = workers.parse_group(([a, b], str(tmp_path), "g", 1 << 30))
    rows = held.HeldRows()
    rows.add([(fid, 0, tables, None) for fid, (_, _, tables, _) in enumerate(out)])
    stream = out[0][2]["kernels"]
    allocated = pa.total_allocated_bytes()
    batches = list(rows.take("kernels"))
    assert (pa.total_allocated_bytes() == allocated) is mapped
    assert not os.path.exists(stream) and rows.empty()
    assert [(fid, bt.column("external_id").to_pylist()) for fid, _, bt in batches] == [(0, list(range(10))),
                                                                                      (1, [0, 1, 2])]


def test_a_failed_group_task_fails_each_of_its_files_in_task_order():
    """An executor's task that failed (a worker killed): every file of a group task is an error, in task order."""
    from traceanalyze.ingest import workers

    done = [((1, (["b.json", "c.json"], "/tmp", "g1", 0)), None, "KilledWorker: gone"),
            ((0, ("a.json", "/tmp", "f0p0", 0, None)), ("a.json", None, None, "bad"), None)]
    assert list(workers.in_order(done)) == [
        ("a.json", None, None, "bad"),
        [("b.json", None, None, "could not be parsed (KilledWorker: gone)"),
         ("c.json", None, None, "could not be parsed (KilledWorker: gone)")]]


def test_a_table_with_few_rows_held_waits_for_a_later_insert(tmp_path, monkeypatch):
    """Files inserted one by one (INSERT_ROWS 1): a table goes in once INSERT_TABLE_ROWS of its rows are held, else
    at a later INSERT or the commit; each table's rows, and their order, are those of inserting every table each
    time."""
    from traceanalyze.ingest import held
    from traceanalyze.pipeline import analyze

    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in range(4):
        ev = [_kernel(i) for i in range(30)] + [_op(i) for i in range(5)]
        (folder / f"rank{r}.json").write_text(json.dumps(_trace(ev, baseTimeNanoseconds=10**15 * (r + 1))))
    monkeypatch.setattr(load, "INSERT_ROWS", 1)
    takes = []
    real_take = held.HeldRows.take

    def take(self, t):
        n = 0
        for fid, shift, b in real_take(self, t):
            n += b.num_rows
            yield fid, shift, b
        takes.append((t, n))

    monkeypatch.setattr(held.HeldRows, "take", take)
    monkeypatch.setattr(load, "INSERT_TABLE_ROWS", 60)
    few = analyze(folder, Options(jobs=1, db=tmp_path / "few.duckdb"))
    # kernels: 30 a file, in after every second file; cpu_ops: 5 a file, all at the commit
    assert takes == [("kernels", 60), ("kernels", 60), ("cpu_ops", 20)]
    takes.clear()
    monkeypatch.setattr(load, "INSERT_TABLE_ROWS", 1)
    each = analyze(folder, Options(jobs=1, db=tmp_path / "each.duckdb"))
    assert takes == [("kernels", 30), ("cpu_ops", 5)] * 4
    for t in ("kernels", "cpu_ops"):
        q = f"SELECT * FROM {t} ORDER BY rowid"
        assert few.con.execute(q).fetchall() == each.con.execute(q).fetchall(), t
    assert few.con.execute("SELECT count(*), count(DISTINCT file_id) FROM kernels").fetchone() == (120, 4)


def test_a_parse_begun_before_the_database_opens_loads_the_same_rows_and_stops_when_a_file_changed(tmp_path):
    """:func:`load.begin_parse` (a new database's files parsed while it opens) loads the rows :func:`load_traces`
    would; a file rewritten meanwhile (another size) is not taken from it: the begun parse is stopped, its folder
    removed, and every file parsed again, the rewritten one with its new events."""
    paths = []
    for r in range(3):
        paths.append(pathlib.Path(_write(tmp_path, _trace([_kernel(i) for i in range(4 + r)] + [_op(0)]),
                                         name=f"rank{r}.json")))

    def rows(con):
        return con.execute("SELECT f.path, count(k.file_id) FROM files f LEFT JOIN kernels k USING (file_id) "
                           "GROUP BY ALL ORDER BY 1").fetchall()

    ref = store.connect(None)
    load.load_traces(ref, paths, jobs=1)
    begun = load.begin_parse(paths, jobs=2)
    assert begun is not None and [p for p, _ in begun.todo] == paths
    con = store.connect(None)
    got = load.load_traces(con, paths, jobs=2, begun=begun)
    assert begun.taken and [f.error for f in got] == [None] * 3
    assert rows(con) == rows(ref) and [n for _, n in rows(con)] == [4, 5, 6]
    assert not pathlib.Path(begun.tmp).exists()

    begun = load.begin_parse(paths, jobs=2)
    paths[1].write_text(json.dumps(_trace([_kernel(i) for i in range(9)])))  # rewritten: 9 kernels
    con = store.connect(None)
    load.load_traces(con, paths, jobs=2, begun=begun)
    assert [n for _, n in rows(con)] == [4, 9, 6] and not pathlib.Path(begun.tmp).exists()
    assert load.begin_parse(paths, jobs=1) is None  # one core: nothing begun (parsed as it loads)
