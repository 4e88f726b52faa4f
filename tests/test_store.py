"""The store as a parse cache: re-runs reuse it, changed files and old schemas are parsed again, locks are clear."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import real
from tests.test_discover import tiny_trace
from traceanalyze.errors import TraceanalyzeError
from traceanalyze.pipeline import analyze
from traceanalyze.store import SCHEMA_VERSION, connect


def test_rerun_reuses_the_database_without_parsing(tmp_path, monkeypatch):
    src = real("hta/trace_filter")
    db = tmp_path / "cache.duckdb"
    first = analyze(src, db=db, jobs=1)
    idle = [r["idle_pct"] for r in first.model["runs"][0]["ranks"]]
    first.con.close()
    from traceanalyze.ingest import parse

    def boom(*a, **k):
        raise AssertionError("parsed again")

    monkeypatch.setattr(parse, "parse_trace", boom)
    second = analyze(src, db=db, jobs=1)
    assert all(f["cached"] for f in second.model["runs"][0]["files"])
    assert [r["idle_pct"] for r in second.model["runs"][0]["ranks"]] == idle
    n, = second.con.execute("SELECT count(*) FROM kernels").fetchone()
    assert n == 1204 + 1154  # not loaded twice
    second.con.close()


def test_changed_file_is_parsed_again(tmp_path):
    shutil.copy(real("hta/trace_filter") / "sampled_rank-0.json.gz", tmp_path / "r0.json.gz")
    db = tmp_path / "c.duckdb"
    analyze(tmp_path, db=db, jobs=1).con.close()
    tiny_trace(tmp_path / "r0.json.gz", 0, 2)
    a = analyze(tmp_path, db=db, jobs=1)
    assert not a.model["runs"][0]["files"][0]["cached"]
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (2,)


def test_database_of_an_older_schema_is_rebuilt(tmp_path):
    shutil.copy(real("hta/trace_filter") / "sampled_rank-0.json.gz", tmp_path / "r0.json.gz")
    db = tmp_path / "c.duckdb"
    analyze(tmp_path, db=db, jobs=1).con.close()
    con = connect(db)  # pretend a version-1 database: event tables with the collective columns, a cached file
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.execute("ALTER TABLE kernels ADD COLUMN collective VARCHAR")
    con.close()
    a = analyze(tmp_path, db=db, jobs=1)
    assert not a.model["runs"][0]["files"][0]["cached"]  # parsed again into the new tables
    assert a.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    assert "collective" not in [r[0] for r in a.con.execute("DESCRIBE kernels").fetchall()]
    assert a.con.execute("SELECT count(*) FROM kernels").fetchone() == (1204,)
    a.con.close()


def test_parallel_parse_gives_the_same_numbers():
    src = real("hta/trace_filter")
    one = analyze(src, jobs=1).model["runs"][0]["ranks"]
    two = analyze(src, jobs=2).model["runs"][0]["ranks"]
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
    analyze(src, db=db, jobs=1).con.close()
    again = analyze(src, db=db, jobs=1)
    assert again.model.get("cached") is True  # same files, same options: the stored model
    again.con.close()
    other = analyze(src, db=db, jobs=1, link_bw_gbps=12.0)  # an option changed: recomputed, files still cached
    assert "cached" not in other.model
    assert other.model["runs"][0]["link"] == {"expected_gbps": 12.0, "source": "--link-bw"}
    assert all(f["cached"] for f in other.model["runs"][0]["files"])
