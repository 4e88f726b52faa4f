"""Scale paths that must never change the result: byte-range splitting (guarantee 7), multi-member gzip
(guarantee 8), many files per transaction, and a parse worker that is reused for many ranks (no leak)."""

from __future__ import annotations

import gc
import gzip
import json
import os
import re
import subprocess
import sys
import tracemalloc

import pytest

from traceanalyze.ingest import load, parse
from traceanalyze.ingest.parse import parse_trace
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze


def _events(n: int) -> list[dict]:
    """Kernels, CPU ops and a collective, where every third op's args hold an array of objects that look like
    events themselves (``{"ph": "X", ...}``, separated by ``}, {``): a byte-range cut there decodes as an event."""
    out = []
    for i in range(n):
        out.append({"ph": "X", "cat": "kernel", "name": f"k{i % 7}", "pid": 0, "tid": 7, "ts": 10.0 * i, "dur": 4.5,
                    "args": {"External id": i, "correlation": i, "stream": 7, "device": 0}})
        args = {"External id": i, "Input type": ["float", "c10::BFloat16"], "Input Dims": [[4, i % 5], []]}
        if i % 3 == 0:
            args["Input"] = [{"ph": "X", "cat": "kernel", "name": "fake", "ts": 1, "dur": 1},
                             {"ph": "X", "cat": "cpu_op", "name": "fake", "ts": 2, "dur": 1, "args": {"x": [{}]}},
                             {"name": "}, {", "ts": 3}]
        out.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 5}", "pid": 1, "tid": 1, "ts": 10.0 * i + 1,
                    "dur": 2.0, "args": args})
        if i % 50 == 0:
            out.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0,
                        "tid": 8, "ts": 10.0 * i + 2, "dur": 3.0,
                        "args": {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                                 "Group size": 2, "dtype": "Float", "Process Group Ranks": "[0, 1]"}})
    return out


def _trace_bytes(n: int) -> bytes:
    head = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}}
    return (json.dumps(head)[:-1] + ', "traceEvents": [' + ",\n".join(json.dumps(e) for e in _events(n))
            + '], "baseTimeNanoseconds": 1700000000000000000}').encode()


def _rows(tables) -> dict[str, list]:
    return {n: sorted(map(tuple, (r.values() for r in t.to_pylist())), key=repr) for n, t in tables.items()}


def test_every_cut_point_either_proves_itself_or_is_refused(tmp_path):
    """Guarantee 7 at the parser: for every `}, {` in the file (event boundaries and the look-alikes inside args
    arrays), the two parts either both report a clean split and give exactly the unsplit rows, or the first part
    reports the split broken (the caller then parses the file whole)."""
    data = _trace_bytes(60)
    p = tmp_path / "t.json"
    p.write_bytes(data)
    _, whole = parse_trace(p)
    want = _rows(whole)
    cuts = [m.end() - 1 for m in re.finditer(rb"\}\s*,\s*\{", data)]
    clean = broken = 0
    for at in cuts:
        i1, t1 = parse_trace(p, byte_range=(0, at))
        i2, t2 = parse_trace(p, byte_range=(at, len(data)))
        if not i1.split_ok:
            broken += 1
            continue
        clean += 1
        got = _rows({n: __import__("pyarrow").concat_tables([t1[n], t2[n]]) for n in t1})
        assert got == want, at
        assert i1.base_time_ns == 0 and i2.base_time_ns == 1700000000000000000
    assert clean == 60 * 2 + 2 - 1  # each event boundary: 60 kernels, 60 ops, 2 collectives, minus the first
    assert broken == 20 * 2 + 20  # 2 look-alikes in each of the 20 args arrays, and the "}, {" in a name


def test_split_file_with_args_arrays_gives_the_unsplit_rows(tmp_path, monkeypatch):
    """Guarantee 7 end to end: a plain file split into many byte ranges, including cuts forced inside args arrays,
    gives row for row the rows of the same file parsed whole."""
    data = _trace_bytes(12000)
    plain = tmp_path / "split" / "rank0.json"
    plain.parent.mkdir()
    plain.write_bytes(data)
    one = tmp_path / "whole" / "rank0.json"
    one.parent.mkdir()
    one.write_bytes(data)
    whole = analyze(one, Options(jobs=1))
    monkeypatch.setattr(parse, "SPLIT_MIN_BYTES", 1 << 16)
    monkeypatch.setattr(load, "PART_BYTES", len(data) // 5 + 1)
    wholes = []
    real_whole = load._FileLoad._parse_whole
    monkeypatch.setattr(load._FileLoad, "_parse_whole", lambda self: wholes.append(1) or real_whole(self))
    q = "SELECT * EXCLUDE (file_id) FROM {} ORDER BY ALL"
    good = analyze(plain.parent, Options(jobs=2))  # split at the points split_points finds
    assert len(parse.split_points(plain, 5)) == 5 and wholes == []
    bad_points = [0] + [m.start() + 3 for m in re.finditer(rb'\}, \{"ph": "X", "cat": "cpu_op", "name": "fake"', data)
                        ][::1000]
    monkeypatch.setattr(parse, "split_points", lambda path, n: bad_points)
    forced = analyze(plain.parent, Options(jobs=2))  # cut inside args arrays: detected, parsed whole
    assert wholes == [1]
    for t in ("kernels", "cpu_ops", "comm_events", "threads"):
        want = whole.con.execute(q.format(t)).fetchall()
        assert good.con.execute(q.format(t)).fetchall() == want, t
        assert forced.con.execute(q.format(t)).fetchall() == want, t
    assert whole.con.execute("SELECT count(*) FROM cpu_ops").fetchone() == (12000,)
    fq = "SELECT status, message, base_time_ns, n_kernels, n_cpu_ops FROM files"
    assert good.con.execute(fq).fetchall() == forced.con.execute(fq).fetchall() == whole.con.execute(fq).fetchall()
    assert len(bad_points) > 3


def _gzip_members(data: bytes, cuts: list[int]) -> bytes:
    return b"".join(gzip.compress(data[a:b]) for a, b in zip(cuts, cuts[1:], strict=False))


@pytest.mark.parametrize("layout", ["empty first member", "cut mid-event", "one member per 4 KiB", "bgzip EOF member",
                                    "zero padding"])
def test_multi_member_gzip_is_read_to_the_end(tmp_path, layout):
    """Guarantee 8: concatenated gzip members give the same rows as the single-member file."""
    data = _trace_bytes(2000)
    single = tmp_path / "one.json.gz"
    single.write_bytes(gzip.compress(data))
    n = len(data)
    raw = {"empty first member": _gzip_members(data, [0, 0, n]),
           "cut mid-event": _gzip_members(data, [0, 17, n // 3, n // 2 + 5, n - 2, n]),
           "one member per 4 KiB": _gzip_members(data, [*range(0, n, 4096), n]),
           "bgzip EOF member": _gzip_members(data, [0, n // 2, n]) + gzip.compress(b""),
           "zero padding": _gzip_members(data, [0, n // 2, n]) + b"\0" * 5000}[layout]
    multi = tmp_path / "multi.json.gz"
    multi.write_bytes(raw)
    i1, t1 = parse_trace(single)
    i2, t2 = parse_trace(multi)
    assert _rows(t2) == _rows(t1)
    assert t2["cpu_ops"].num_rows == 2000 and t2["comm_events"].num_rows == 40
    assert (i2.partial, i2.warnings, i2.bytes_read, i2.base_time_ns) == (False, [], n, 1700000000000000000)


def test_multi_member_gzip_keeps_its_bounds(tmp_path):
    """Across members: the bomb bound counts every member's bytes; a cut in a later member keeps the events of
    the earlier ones and of that member up to the cut; bytes after the last member that are not gzip are named."""
    data = _trace_bytes(2000)
    n = len(data)
    p = tmp_path / "m.json.gz"
    p.write_bytes(_gzip_members(data, [0, n // 2, n]))
    with pytest.raises(parse.InputError, match="decompresses to more than"):
        parse_trace(p, max_decompressed=n - 100)
    raw = _gzip_members(data, [0, n // 2, n])
    p.write_bytes(raw[: len(raw) - 3000])
    info, t = parse_trace(p)
    assert info.partial and "gzip stream ends early" in info.warnings[0]
    assert 1000 < t["cpu_ops"].num_rows < 2000
    p.write_bytes(raw + b"not gzip")
    info, t = parse_trace(p)
    assert t["cpu_ops"].num_rows == 2000 and not info.partial
    assert info.warnings == ["bytes after the end of the gzip data are not gzip; ignored"]


def test_a_reused_worker_does_not_keep_parsed_files(tmp_path):
    """The same file parsed 200 times in one process (as a parse worker reused for 200 ranks): memory stays
    flat. pyarrow kept a reference to every memoryview it built an array from, which held each parsed run of
    bytes (~18 MB per parse of this file before the fix)."""
    p = tmp_path / "rank0.json"
    p.write_bytes(_trace_bytes(400))
    out = tmp_path / "ipc"
    out.mkdir()
    # only what the parser allocated: threads that earlier tests left running (a Dask event loop) allocate too
    ours = [tracemalloc.Filter(True, "*/traceanalyze/*", all_frames=True)]

    def held() -> int:
        gc.collect()
        return sum(t.size for t in tracemalloc.take_snapshot().filter_traces(ours).traces)

    tracemalloc.start(3)  # deep enough to reach a traceanalyze frame from inside numpy or the stdlib
    try:
        for i in range(200):
            parse_trace(p, out, key="k", chunk_rows=load.WORKER_CHUNK_ROWS)
            if i == 19:
                after_20 = held()
        after_200 = held()
    finally:
        tracemalloc.stop()
    assert after_200 - after_20 < 256 << 10  # 180 more parses of 0.3 MB of JSON each leave nothing behind


def test_many_files_share_a_transaction_and_give_the_same_rows(tmp_path, monkeypatch):
    """Files loaded 64 to a transaction hold the same rows, ids and file rows as files loaded one by one."""
    d = tmp_path / "run"
    d.mkdir()
    for r in range(5):
        ev = _events(30)
        for e in ev:
            e["ts"] += 1000 * r
        head = {"distributedInfo": {"rank": r, "world_size": 5}, "baseTimeNanoseconds": 10**18 + r}
        (d / f"rank{r}.json").write_text(json.dumps({**head, "traceEvents": ev}))
    calls, commits = [], []
    real_insert, real_commit = load._insert_part, load._Batch.commit
    monkeypatch.setattr(load, "_insert_part",
                        lambda con, *a, **kw: calls.append(len(a[0])) or real_insert(con, *a, **kw))
    monkeypatch.setattr(load._Batch, "commit", lambda self: commits.append(len(self.rows)) or real_commit(self))
    batched = analyze(d, Options(jobs=2))
    # one transaction; its files inserted in one INSERT or more (whenever the next parse was not done yet)
    assert [n for n in commits if n] == [5] and sum(calls) == 5
    monkeypatch.setattr(load, "TRANSACTION_FILES", 1)
    calls.clear()
    commits.clear()
    single = analyze(d, Options(jobs=2))
    assert calls == [1] * 5 and [n for n in commits if n] == [1] * 5
    for t in ("files", "kernels", "cpu_ops", "comm_events", "threads"):
        q = f"SELECT * FROM {t} ORDER BY ALL"
        assert batched.con.execute(q).fetchall() == single.con.execute(q).fetchall(), t
    first_ts = batched.con.execute("SELECT min(ts_ns) FROM kernels WHERE file_id = 5").fetchone()
    assert first_ts == (10**18 + 4 + 4_000_000,)  # rank 4: its own baseTimeNanoseconds, added on the way in


def _gz_split_setup(tmp_path, monkeypatch, raw: bytes, n_json: int):
    d = tmp_path / "gz"
    d.mkdir()
    (d / "rank0.json.gz").write_bytes(raw)
    monkeypatch.setattr(parse, "SPLIT_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(load, "PART_BYTES", n_json // 5)
    parts, wholes = [], []
    real_inflate, real_whole = parse.inflate_parts, load._FileLoad._parse_whole

    def inflate(*a, **k):
        for name in real_inflate(*a, **k):
            parts.append(name)
            yield name

    monkeypatch.setattr(parse, "inflate_parts", inflate)
    monkeypatch.setattr(load._FileLoad, "_parse_whole", lambda self: wholes.append(1) or real_whole(self))
    return d, parts, wholes


def test_big_gzip_is_inflated_into_parts_parsed_in_parallel_with_the_same_rows(tmp_path, monkeypatch):
    """A .gz over the split size (two members here) is inflated into part files cut before events and parsed by
    two processes: the same rows and file row as the single process parse of the .gz."""
    data = _trace_bytes(12000)
    n = len(data)
    single = tmp_path / "one" / "rank0.json.gz"
    single.parent.mkdir()
    single.write_bytes(gzip.compress(data))
    want = analyze(single.parent, Options(jobs=1))
    d, parts, wholes = _gz_split_setup(tmp_path, monkeypatch, _gzip_members(data, [0, n // 3, n]), n)
    got = analyze(d, Options(jobs=2))
    assert len(parts) >= 4 and wholes == []
    q = "SELECT * EXCLUDE (file_id) FROM {} ORDER BY ALL"
    for t in ("kernels", "cpu_ops", "comm_events", "threads"):
        assert got.con.execute(q.format(t)).fetchall() == want.con.execute(q.format(t)).fetchall(), t
    fq = "SELECT status, message, bytes_read, base_time_ns, n_kernels, n_cpu_ops FROM files"
    assert got.con.execute(fq).fetchall() == want.con.execute(fq).fetchall() == [
        ("ok", None, n, 1700000000000000000, 12240, 12000)]


def test_damaged_big_gzip_is_parsed_whole_and_says_so_as_before(tmp_path, monkeypatch):
    """A truncated .gz that would be split: its parts are dropped and the file parsed whole, with the same rows
    and the same truncation warning as without splitting."""
    data = _trace_bytes(12000)
    raw = gzip.compress(data)[:-20000]
    plain = tmp_path / "one" / "rank0.json.gz"
    plain.parent.mkdir()
    plain.write_bytes(raw)
    want = analyze(plain.parent, Options(jobs=1))
    d, parts, wholes = _gz_split_setup(tmp_path, monkeypatch, raw, len(data))
    got = analyze(d, Options(jobs=2))
    assert len(parts) >= 3 and wholes == [1]
    q = "SELECT * EXCLUDE (file_id) FROM {} ORDER BY ALL"
    for t in ("kernels", "cpu_ops"):
        assert got.con.execute(q.format(t)).fetchall() == want.con.execute(q.format(t)).fetchall(), t
    fq = "SELECT status, message FROM files"
    assert got.con.execute(fq).fetchall() == want.con.execute(fq).fetchall()
    assert got.con.execute(fq).fetchone()[0] == "partial"


def _ranks_dir(tmp_path, n: int):
    d = tmp_path / "run"
    d.mkdir()
    for r in range(n):
        head = {"distributedInfo": {"rank": r, "world_size": n, "backend": "nccl"}, "baseTimeNanoseconds": 10**18}
        (d / f"rank{r}.json").write_text(json.dumps({**head, "traceEvents": _events(40 + 10 * r)}))
    return d


def test_report_on_a_dask_cluster_gives_the_local_report(tmp_path):
    """`report --executor dask --scheduler ADDRESS`: the per-rank parse runs on a 2-worker Dask cluster (the
    executor of `batch`), the workers write beside the database, and the report's rows and model are those of the
    local run; the workers' folder is removed after."""
    dd = pytest.importorskip("dask.distributed")
    from click.testing import CliRunner

    from traceanalyze.cli import cli

    d = _ranks_dir(tmp_path, 4)
    local = tmp_path / "local.json"
    r = CliRunner().invoke(cli, ["report", str(d), "--format", "json", "-o", str(local), "--db",
                                 str(tmp_path / "local.duckdb"), "-q", "-j", "2"])
    assert r.exit_code == 0, r.output
    db = tmp_path / "dask.duckdb"
    with dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        r = CliRunner().invoke(cli, ["report", str(d), "--format", "json", "-o", str(tmp_path / "dask.json"), "--db",
                                     str(db), "-q", "--executor", "dask", "--scheduler", cluster.scheduler_address])
        assert r.exit_code == 0, r.output
        n_workers = len(cluster.workers)
        ran = set(cluster.scheduler.task_prefixes)  # in this process: the scheduler of a LocalCluster
    assert n_workers == 2 and "parse_task" in ran and not (tmp_path / "dask.duckdb.parts").exists()
    a, b = json.loads(local.read_text()), json.loads((tmp_path / "dask.json").read_text())
    for m in (a, b):
        m.pop("generated_at")
    assert a == b and [x["rank"] for x in b["runs"][0]["ranks"]] == [0, 1, 2, 3]
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con, duckdb.connect(str(tmp_path / "local.duckdb"),
                                                                       read_only=True) as ref:
        for t in ("files", "kernels", "cpu_ops", "comm_events"):
            q = f"SELECT * EXCLUDE (file_id) FROM {t} ORDER BY ALL"
            assert con.execute(q).fetchall() == ref.execute(q).fetchall(), t
        assert con.execute("SELECT count(*) FROM cpu_ops").fetchone() == (4 * 40 + 60,)


_HOLES = r"""
import sys
import numpy as np
from traceanalyze.executors import map_large_blocks

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

if sys.argv[1] == "on":
    assert map_large_blocks()
warm = np.ones(3 << 17)  # 3 MiB, mapped; freeing it makes glibc raise its threshold (unless map_large_blocks)
del warm
arrays = [np.ones(3 << 17) for _ in range(32)]  # 96 MiB, touched
before = rss_mb()
del arrays[::2]  # every other one freed: holes in the heap, or mappings given back
print(before - rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_arrays_freed_after_map_large_blocks_go_back_to_the_system():
    # glibc's defaults: a MALLOC_*_ variable (Dask's nanny sets MALLOC_TRIM_THRESHOLD_ in this process's
    # environment) turns its threshold adjustment off, as map_large_blocks does
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    freed = {m: float(subprocess.run([sys.executable, "-c", _HOLES, m], capture_output=True, text=True, env=env,
                                     check=True).stdout) for m in ("on", "off")}
    assert freed["on"] >= 44  # 16 arrays of 3 MiB
    assert freed["off"] < 8  # glibc's default: holes in the heap, still counted


_REUSE = r"""
import numpy as np
from traceanalyze.executors import map_large_blocks, reuse_freed_blocks

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

def freed_mb():
    arrays = [np.ones(3 << 17) for _ in range(32)]  # 96 MiB, touched
    before = rss_mb()
    del arrays[::2]  # every other one freed
    return before - rss_mb()

assert map_large_blocks()
with reuse_freed_blocks():
    kept = freed_mb()
    before = rss_mb()
    again = [np.ones(3 << 17) for _ in range(16)]  # 48 MiB more
    grew = rss_mb() - before
    del again
print(kept, grew, freed_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_reuse_freed_blocks_keeps_freed_arrays_in_the_heap_then_puts_map_large_blocks_back():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    kept, grew, freed = map(float, subprocess.run([sys.executable, "-c", _REUSE], capture_output=True, text=True,
                                                  env=env, check=True).stdout.split())
    assert kept < 8  # inside: 16 arrays of 3 MiB freed, their pages kept for the next arrays...
    assert grew < 8  # ... which take them, with no new pages
    assert freed >= 44  # after: each large array a mapping of its own again, given back when freed


_KEEP = r"""
import resource, sys

def churn():  # what a parse worker does file after file: large blocks of bytes made, filled and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        blocks = [b"x" * (4 << 20) for _ in range(4)]  # 16 MiB, touched
        del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

if sys.argv[1] == "worker":
    from traceanalyze.ingest.workers import worker_init

    worker_init(False, keep_heap=True)  # a load of small files
churn()  # the first file: the heap grows to what it needs
print(churn())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_parse_worker_reuses_the_pages_its_last_file_freed():
    """worker_init of a load of small files (executors.keep_freed_blocks): the next file's blocks take the pages the
    last one freed, where by glibc's defaults each 16 MiB of blocks is trimmed from the heap and faulted in again
    (4,096 pages)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}

    def faults(role: str) -> int:
        return int(subprocess.run([sys.executable, "-c", _KEEP, role], capture_output=True, text=True, env=env,
                                  check=True).stdout)

    assert faults("plain") >= 8 * 4096 * 0.9  # each round's 16 MiB faulted in again
    assert faults("worker") < 1000  # the pages kept: a few for Python's own objects


def test_drop_cached_blocks_lets_duckdb_evict_its_reads_and_puts_the_limit_back(tmp_path):
    import duckdb

    from traceanalyze.executors import CACHE_HEADROOM_BYTES, drop_cached_blocks

    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    con.execute("CREATE TABLE t AS SELECT hash(range) AS i, md5(range::VARCHAR) AS s FROM range(3000000)")
    con.execute("CHECKPOINT")
    con.execute("SET memory_limit = '2GiB'")  # a caller's own limit is put back
    total = con.execute("SELECT sum(i), sum(length(s)) FROM t").fetchone()

    def cached() -> int:
        return con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() "
                           "WHERE tag = 'BASE_TABLE'").fetchone()[0]

    assert cached() > 2 * CACHE_HEADROOM_BYTES
    assert drop_cached_blocks(con)
    assert cached() <= CACHE_HEADROOM_BYTES
    assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "2.0 GiB"
    assert con.execute("SELECT sum(i), sum(length(s)) FROM t").fetchone() == total  # read again from the file
    assert not drop_cached_blocks(duckdb.connect())  # in memory: its blocks would only go to temporary files
