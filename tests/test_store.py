"""The store as a parse cache: re-runs reuse it, changed files and old schemas are parsed again, locks are clear."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import real
from tests.test_discover import tiny_trace
from traceanalyze.errors import TraceanalyzeError
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.store import SCHEMA_VERSION, checkpoint_meanwhile, connect


def test_rerun_reuses_the_database_without_parsing(tmp_path, monkeypatch):
    src = real("hta/trace_filter")
    db = tmp_path / "cache.duckdb"
    first = analyze(src, Options(db=db, jobs=1))
    idle = [r["idle_pct"] for r in first.model["runs"][0]["ranks"]]
    first.con.close()
    from traceanalyze.ingest import parse

    def boom(*a, **k):
        raise AssertionError("parsed again")

    monkeypatch.setattr(parse, "parse_trace", boom)
    second = analyze(src, Options(db=db, jobs=1))
    assert all(f["cached"] for f in second.model["runs"][0]["files"])
    assert [r["idle_pct"] for r in second.model["runs"][0]["ranks"]] == idle
    n, = second.con.execute("SELECT count(*) FROM kernels").fetchone()
    assert n == 1204 + 1154  # not loaded twice
    second.con.close()


def test_changed_file_is_parsed_again(tmp_path):
    shutil.copy(real("hta/trace_filter") / "sampled_rank-0.json.gz", tmp_path / "r0.json.gz")
    db = tmp_path / "c.duckdb"
    analyze(tmp_path, Options(db=db, jobs=1)).con.close()
    tiny_trace(tmp_path / "r0.json.gz", 0, 2)
    a = analyze(tmp_path, Options(db=db, jobs=1))
    assert not a.model["runs"][0]["files"][0]["cached"]
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (2,)


def test_database_of_an_older_schema_is_rebuilt(tmp_path):
    shutil.copy(real("hta/trace_filter") / "sampled_rank-0.json.gz", tmp_path / "r0.json.gz")
    db = tmp_path / "c.duckdb"
    analyze(tmp_path, Options(db=db, jobs=1)).con.close()
    con = connect(db)  # pretend a version-1 database: event tables with the collective columns, a cached file
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.execute("ALTER TABLE kernels ADD COLUMN collective VARCHAR")
    con.close()
    a = analyze(tmp_path, Options(db=db, jobs=1))
    assert not a.model["runs"][0]["files"][0]["cached"]  # parsed again into the new tables
    assert a.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    assert "collective" not in [r[0] for r in a.con.execute("DESCRIBE kernels").fetchall()]
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (1204,)
    a.con.close()


def test_parallel_parse_gives_the_same_numbers():
    src = real("hta/trace_filter")
    one = analyze(src, Options(jobs=1)).model["runs"][0]["ranks"]
    two = analyze(src, Options(jobs=2)).model["runs"][0]["ranks"]
    assert [r["idle_pct"] for r in one] == [r["idle_pct"] for r in two]


def test_locked_database_gives_a_clear_error(tmp_path):
    import subprocess
    import sys

    db = tmp_path / "busy.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(db)!r}); "
                               "print('ok', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        with pytest.raises(TraceanalyzeError, match="in use by another traceanalyze run"):
            connect(db)
    finally:
        holder.kill()


def test_cached_report_is_reused_only_for_the_same_inputs_and_options(tmp_path):
    src = real("hta/trace_filter")
    db = tmp_path / "m.duckdb"
    analyze(src, Options(db=db, jobs=1)).con.close()
    again = analyze(src, Options(db=db, jobs=1))
    assert again.model.get("cached") is True  # same files, same options: the stored model
    again.con.close()
    other = analyze(src, Options(db=db, jobs=1, link_bw_gbps=12.0))  # an option changed: recomputed, files still cached
    assert "cached" not in other.model
    assert other.model["runs"][0]["link"] == {"expected_gbps": 12.0, "source": "--link-bw"}
    assert all(f["cached"] for f in other.model["runs"][0]["files"])


def test_connect_skips_the_ddl_only_while_the_schema_is_in_place(tmp_path, monkeypatch):
    import duckdb

    from traceanalyze import store

    db = tmp_path / "s.duckdb"
    connect(db).close()
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE findings")  # a table dropped by hand is seen, and made again
    con.close()
    connect(db).close()
    con = duckdb.connect(str(db))
    assert con.execute("SELECT count(*) FROM findings").fetchone() == (0,)
    con.close()
    ran = []
    real_drop = store._drop_if_old
    monkeypatch.setattr(store, "_drop_if_old", lambda c: ran.append(1) or real_drop(c))
    connect(db).close()
    assert ran == []  # in place: one query, no DDL
    monkeypatch.setattr(store, "_SCHEMA_STAMP", "schema changed")  # another DDL (no version bump): it runs
    connect(db).close()
    assert ran == [1]


def test_cached_rerun_of_the_command_line_opens_the_database_once(tmp_path, monkeypatch):
    import duckdb

    from tests.test_robustness import invoke

    d = tmp_path / "run"
    d.mkdir()
    tiny_trace(d / "rank0.json", 0)
    args = ("report", str(d), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json"), "-q")
    assert invoke(*args)[0] == 0
    opened = []
    real_connect = duckdb.connect
    monkeypatch.setattr(duckdb, "connect", lambda *a, **k: opened.append(k.get("read_only")) or real_connect(*a, **k))
    assert invoke(*args)[0] == 0
    assert opened == [True] and json.loads((tmp_path / "r.json").read_text())["cached"] is True
    (tmp_path / "r.json").unlink()
    opened.clear()
    tiny_trace(d / "rank1.json", 1)  # a miss: read-only first, then as before (checked read-only, then written)
    assert invoke(*args)[0] == 0
    assert opened == [True, True, None] and not json.loads((tmp_path / "r.json").read_text()).get("cached")


def test_a_new_database_opens_on_a_thread_and_an_old_one_in_turn(tmp_path, monkeypatch):
    import threading

    from traceanalyze import store
    from traceanalyze.executors import on_thread

    db = tmp_path / "n.duckdb"
    assert store.is_new(None) and store.is_new(":memory:") and store.is_new(db)
    (tmp_path / "w.duckdb.wal").write_bytes(b"")  # a write-ahead log alone is replayed: not new
    assert not store.is_new(tmp_path / "w.duckdb")
    where = []
    real_connect = store.connect
    monkeypatch.setattr(store, "connect", lambda p: where.append(threading.current_thread().name) or real_connect(p))
    r = analyze(tiny_trace_dir(tmp_path), Options(db=db))
    r.con.close()
    assert not store.is_new(db) and len(where) == 1 and where[0].startswith("traceanalyze-open")
    where.clear()
    (tmp_path / "run" / "rank0.json").touch()  # a miss on an existing database: opened here, checked first
    analyze(tmp_path / "run", Options(db=db)).con.close()
    assert where == [threading.current_thread().name]
    with pytest.raises(ZeroDivisionError):  # the wait raises what the thread raised
        on_thread(lambda x: 1 / x, 0)()


def tiny_trace_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    tiny_trace(d / "rank0.json", 0)
    return d


def test_checkpoint_meanwhile_moves_the_write_ahead_log_into_the_file(tmp_path):
    db = tmp_path / "r.duckdb"
    con = connect(db)
    con.execute("SET checkpoint_threshold = '1GB'")  # no automatic checkpoint: the rows stay in the log
    con.execute("INSERT INTO warnings SELECT NULL, 'f', 'message ' || i::VARCHAR FROM range(20000) t(i)")
    wal = tmp_path / "r.duckdb.wal"
    assert wal.exists() and wal.stat().st_size > 100_000
    wait = checkpoint_meanwhile(con)
    wait()
    assert not wal.exists() or wal.stat().st_size == 0
    assert con.execute("SELECT count(*) FROM warnings").fetchone()[0] == 20000
    con.close()



def test_close_meanwhile_checkpoints_then_closes_the_database(tmp_path):
    """The report command's database: its log moved into the file and the connection closed on a thread; the file
    then opens again with every row."""
    import duckdb

    from traceanalyze.cli import _close_meanwhile

    db = tmp_path / "r.duckdb"
    con = connect(db)
    con.execute("SET checkpoint_threshold = '1GB'")
    con.execute("INSERT INTO warnings SELECT NULL, 'f', 'message ' || i::VARCHAR FROM range(20000) t(i)")
    wal = tmp_path / "r.duckdb.wal"
    assert wal.exists() and wal.stat().st_size > 100_000
    _close_meanwhile(con)()
    assert not wal.exists()
    with pytest.raises(duckdb.ConnectionException):
        con.execute("SELECT 1")
    again = duckdb.connect(str(db), read_only=True)
    assert again.execute("SELECT count(*) FROM warnings").fetchone()[0] == 20000
    again.close()

def test_transaction_commits_the_block_or_rolls_it_back(tmp_path):
    import duckdb

    from traceanalyze import store

    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    con.execute("CREATE TABLE t (x INTEGER)")
    with store.transaction(con):
        con.execute("INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)")
    with pytest.raises(duckdb.Error):
        with store.transaction(con):  # the second statement fails: the first is undone too
            con.execute("INSERT INTO t VALUES (3); INSERT INTO nowhere VALUES (4)")
    assert con.execute("SELECT list(x ORDER BY x) FROM t").fetchone() == ([1, 2],)
    con.execute("INSERT INTO t VALUES (5)")  # no transaction left open: autocommit again
    assert con.execute("SELECT count(*) FROM t").fetchone() == (3,)
    con.close()
