"""The guarantees of docs/safety.md on databases and outputs (issue 14: 1, 2, 3, 10, 13, 14), each checked on inputs
generated here, in a temporary folder: the refused file byte-identical, nothing written, the exit status of
docs/options.md's table, nothing rendered or printed raw.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import os
import random
import re
import string
import unicodedata
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from tests.test_report import synthetic_model
from tests.test_robustness import invoke, write_trace
from traceanalyze import batch, cli, safety, store
from traceanalyze.api import load
from traceanalyze.cli import _slug
from traceanalyze.errors import TraceanalyzeError, UsageError
from traceanalyze.report import render_markdown


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def two_ranks(tmp_path: Path, name: str = "run") -> Path:
    d = tmp_path / name
    d.mkdir(parents=True)
    for r in (0, 1):
        write_trace(d / f"rank{r}.json", r, 2)
    return d


def files_under(p: Path) -> set[str]:
    return {str(f.relative_to(p)) for f in p.rglob("*")} if p.exists() else set()


# ---- 1. only its own databases ------------------------------------------------------------------------------------

def _foreign(kind: str, path: Path, rnd: random.Random) -> str:
    """Write a database path that traceanalyze must refuse; return a phrase of the expected message."""
    if kind == "random_bytes":
        path.write_bytes(rnd.randbytes(rnd.randint(1, 20_000)))
        return "is not a DuckDB database"
    if kind == "text":
        path.write_text("".join(rnd.choices(string.printable, k=rnd.randint(0, 3000))))
        return "is not a DuckDB database"
    if kind == "foreign_duckdb":  # a user's own database, with random tables and rows (one of them named `files`)
        con = duckdb.connect(str(path))
        for i in range(rnd.randint(1, 4)):
            name = "files" if i == 0 else "".join(rnd.choices(string.ascii_lowercase, k=8))
            con.execute(f"CREATE TABLE {name} (k INTEGER, v VARCHAR)")
            con.execute(f"INSERT INTO {name} SELECT range, 'row ' || range FROM range({rnd.randint(0, 500)})")
        con.close()
        return "traceanalyze did not create"
    if kind == "other_tool_marker":  # the marker table of another tool
        con = duckdb.connect(str(path))
        con.execute(f"CREATE TABLE {store.MARKER_TABLE} (tool VARCHAR, schema_version INTEGER, role VARCHAR)")
        con.execute(f"INSERT INTO {store.MARKER_TABLE} VALUES ('othertool', 2, 'report')")
        con.close()
        return "traceanalyze did not create"
    if kind == "catalog":  # a batch catalog passed as --db
        batch.open_catalog(path).close()
        return "is a traceanalyze batch catalog, not a report database"
    raise AssertionError(kind)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", ["random_bytes", "text", "foreign_duckdb", "other_tool_marker", "catalog"])
def test_db_that_is_not_a_report_database_is_refused_and_left_byte_identical(tmp_path, kind, seed):
    d = two_ranks(tmp_path)
    db = tmp_path / "given.duckdb"
    phrase = _foreign(kind, db, random.Random(seed))
    before, listing = sha(db), files_under(tmp_path)
    code, out, err = invoke("report", str(d), "-o", str(tmp_path / "out" / "r.html"), "--db", str(db))
    assert code == 2 and phrase in err and err.count("\n") == 1 and err.startswith(f"traceanalyze: {db}: ")
    assert sha(db) == before and files_under(tmp_path) == listing  # no report, no .wal, no folder
    with pytest.raises(UsageError, match=phrase):  # the API and `export --db` go through the same check
        store.connect(db)
    code, _, err = invoke("export", str(d), "-o", str(tmp_path / "m.json"), "--db", str(db))
    assert code == 2 and phrase in err and sha(db) == before and files_under(tmp_path) == listing


@pytest.mark.parametrize("kind", ["random_bytes", "foreign_duckdb", "report_db"])
def test_catalog_that_is_not_a_batch_catalog_is_refused_and_left_byte_identical(tmp_path, kind):
    archive = tmp_path / "archive"
    archive.mkdir()
    two_ranks(archive, "job1")
    out = tmp_path / "out"
    out.mkdir()
    cat = out / "catalog.duckdb"
    if kind == "report_db":
        store.connect(cat).close()
        phrase = "is a traceanalyze report database, not a batch catalog"
    else:
        phrase = _foreign(kind, cat, random.Random(7))
    before = sha(cat)
    code, _, err = invoke("batch", str(archive), "-o", str(out), "-j", "1", "-q")
    assert code == 2 and phrase in err and sha(cat) == before and files_under(out) == {"catalog.duckdb"}


def test_own_databases_carry_the_marker_and_are_reused(tmp_path):
    d = two_ranks(tmp_path)
    db = tmp_path / "r.duckdb"
    assert invoke("report", str(d), "-o", str(tmp_path / "r.html"), "-q")[0] == 0
    assert store.db_marker(db) == ("traceanalyze", store.SCHEMA_VERSION, "report")
    assert invoke("report", str(d), "-o", str(tmp_path / "r.html"), "-q")[0] == 0  # its own: reused
    archive = tmp_path / "archive"
    archive.mkdir()
    two_ranks(archive, "job1")
    assert invoke("batch", str(archive), "-o", str(tmp_path / "b"), "-j", "1", "-q")[0] == 0
    assert store.db_marker(tmp_path / "b" / "catalog.duckdb") == ("traceanalyze", int(batch.CATALOG_VERSION),
                                                                   "catalog")
    assert store.db_marker(tmp_path / "b" / "runs" / "job1" / "report.duckdb")[2] == "report"
    # a report database as `export --db` cache: its own role, accepted
    assert invoke("export", str(d), "-o", str(tmp_path / "m.json"), "--db", str(db), "-q")[0] == 0


@pytest.mark.parametrize("old_version", [store.SCHEMA_VERSION, 1])
def test_unmarked_database_of_an_earlier_traceanalyze_is_migrated(tmp_path, old_version):
    """Databases written before the marker existed have the tool's own tables and meta.schema_version: they get
    the marker (and are rebuilt when the schema version is an older one), the report is the same."""
    d = two_ranks(tmp_path)
    db = tmp_path / "r.duckdb"
    assert invoke("report", str(d), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "a.json"))[0] == 0
    con = duckdb.connect(str(db))
    con.execute(f"DROP TABLE {store.MARKER_TABLE}")
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(old_version)])
    con.close()
    assert store.db_marker(db) == "legacy-report"
    code, _, err = invoke("report", str(d), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "b.json"))
    assert code == 0, err
    assert store.db_marker(db) == ("traceanalyze", store.SCHEMA_VERSION, "report")
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(store.SCHEMA_VERSION),)
    assert con.execute("SELECT count(*) FROM files").fetchone() == (2,)
    con.close()


# ---- 2. outputs never equal inputs ---------------------------------------------------------------------------------

def _alias(kind: str, target: Path, where: Path) -> Path:
    if kind == "same":
        return target
    alias = where / f"alias-{kind}.json"
    if kind == "symlink":
        alias.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, alias)
    elif kind == "dotdot":
        return target.parent / ".." / target.parent.name / target.name
    return alias


@pytest.mark.parametrize("alias", ["same", "symlink", "hardlink", "dotdot"])
@pytest.mark.parametrize("option", ["-o", "--json", "--md", "--db", "--export", "sidecar"])
def test_output_that_is_an_input_is_refused_before_anything_is_written(tmp_path, option, alias):
    d = two_ranks(tmp_path)
    (d / "train.log").write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    victim = d / ("train.log" if option == "sidecar" else "rank1.json")
    path = _alias(alias, victim, tmp_path)
    inputs = {p: sha(p) for p in d.iterdir()}
    listing = files_under(tmp_path)
    opt = "-o" if option == "sidecar" else option
    args = ["report", str(d), "-j", "1", opt, str(path)]
    if opt != "-o":
        args += ["-o", str(tmp_path / "out" / "r.html")]
    code, _, err = invoke(*args)
    assert code == 2 and "is an input" in err and "never writes over its inputs" in err, err
    assert {p: sha(p) for p in d.iterdir()} == inputs and files_under(tmp_path) == listing


@pytest.mark.parametrize("args", [
    ["--json", "{t}/x", "--md", "{t}/x"],
    ["-o", "{t}/r.html", "--json", "{t}/r.html"],
    ["-o", "{t}/r.duckdb"],  # the default database is the report's name with .duckdb: the same file
    ["-o", "{t}/r.html", "--db", "{t}/sub/../r.html"],
    ["-o", "{t}/r.html", "--export", "{t}/r.html"],
])
def test_two_outputs_on_one_path_are_refused(tmp_path, args):
    d = two_ranks(tmp_path)
    listing = files_under(tmp_path)
    (tmp_path / "sub").mkdir()
    code, _, err = invoke("report", str(d), "-j", "1", *[a.format(t=tmp_path) for a in args])
    assert code == 2 and ("is also the path of" in err or "is the same file as" in err), err
    assert files_under(tmp_path) == listing | {"sub"}


def test_export_and_batch_outputs_are_checked_too(tmp_path):
    d = two_ranks(tmp_path)
    before = sha(d / "rank0.json")
    code, _, err = invoke("export", str(d), "-o", str(d / "rank0.json"))
    assert code == 2 and "is an input" in err and sha(d / "rank0.json") == before
    assert invoke("report", str(d), "-o", str(tmp_path / "r.html"), "-q")[0] == 0
    db = tmp_path / "r.duckdb"
    before = sha(db)
    code, _, err = invoke("export", str(db), "-o", str(db))
    assert code == 2 and "is an input" in err and sha(db) == before
    code, _, err = invoke("batch", str(tmp_path), "-o", str(tmp_path))
    assert code == 2 and "is the archive itself" in err and not (tmp_path / "catalog.duckdb").exists()
    code, _, err = invoke("batch", str(d), "-o", str(tmp_path))  # removed runs' folders are deleted: not there
    assert code == 2 and "holds the archive" in err and not (tmp_path / "catalog.duckdb").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    d = two_ranks(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.html").write_text("previous report")
    real = Path.write_text

    def half_then_full_disk(self, data, *a, **kw):
        if self.parent == out and self.name.startswith(".r.html."):
            real(self, data[: len(data) // 2], *a, **kw)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data, *a, **kw)

    monkeypatch.setattr(Path, "write_text", half_then_full_disk)
    code, _, err = invoke("report", str(d), "-o", str(out / "r.html"), "-j", "1")
    assert code == 3 and "disk is full" in err and "writing the HTML report" in err and "internal" not in err
    assert (out / "r.html").read_text() == "previous report" and files_under(out) == {"r.html", "r.duckdb"}
    assert store.db_marker(out / "r.duckdb")[2] == "report"  # closed cleanly: reused by the next run


def test_a_failed_export_leaves_no_half_trace(tmp_path, monkeypatch):
    from traceanalyze import export

    d = two_ranks(tmp_path)
    real = export.json.dumps
    n = [0]

    class FailingJson:
        loads = staticmethod(export.json.loads)

        @staticmethod
        def dumps(*a, **kw):
            n[0] += 1
            if n[0] == 50:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*a, **kw)

    monkeypatch.setattr(export, "json", FailingJson)
    code, _, err = invoke("export", str(d), "-o", str(tmp_path / "m" / "merged.json.gz"))
    assert code == 3 and "disk is full" in err and "writing the merged trace" in err, err
    assert files_under(tmp_path / "m") == set()


# ---- 3. untrusted databases cannot reach the machine ---------------------------------------------------------------

READERS = ["read_text('{f}')", "read_blob('{f}')", "read_csv('{f}', header=false, columns={{'line': 'VARCHAR'}})"]


@pytest.mark.parametrize("reader", READERS)
def test_crafted_database_cannot_read_files(tmp_path, reader):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-1234\n")
    evil = tmp_path / "evil.duckdb"
    con = duckdb.connect(str(evil))
    src = reader.format(f=secret)
    con.execute(f"CREATE VIEW report_cache AS SELECT 'k' AS key, to_json({{'x': t}}) AS model FROM {src} t")
    con.execute(f"CREATE VIEW leak AS SELECT * FROM {src}")
    con.close()
    before = sha(evil)
    for query in ("SELECT * FROM leak", "SELECT * FROM report_cache", f"SELECT * FROM {src}"):
        code, out, err = invoke("sql", str(evil), query)
        assert code == 1 and "TOPSECRET" not in out + err
        assert "refused" in err and "opened without file access" in err, err
    code, out, err = invoke("export", str(evil), "-o", str(tmp_path / "x.json"))
    assert code == 1 and "refused" in err and "TOPSECRET" not in out + err and not (tmp_path / "x.json").exists()
    with pytest.raises(TraceanalyzeError, match="refused"):
        load(evil)
    assert sha(evil) == before


@pytest.mark.parametrize("query", [
    "COPY (SELECT 42) TO '{t}/written.csv'",
    "ATTACH '{t}/written.duckdb' AS x",
    "SET enable_external_access = true",
    "INSTALL httpfs",
    "CREATE TABLE t AS SELECT 1",
])
def test_sql_is_read_only_and_cannot_write_files(tmp_path, query):
    db = tmp_path / "plain.duckdb"
    duckdb.connect(str(db)).close()
    before = sha(db)
    code, out, err = invoke("sql", str(db), query.format(t=tmp_path))
    assert code == 1 and err.startswith("traceanalyze: ")
    assert sha(db) == before and files_under(tmp_path) == {"plain.duckdb"}


# ---- 10. nothing renders from the input in Markdown or on the terminal ---------------------------------------------

HOSTILE = ["[x](http://e)", "![i](u)", "<img src=x onerror=1>", "`code` ``two``", "a | b | c", "line1\nline2",
           "http://evil.example/a", "www.evil.example", "mail@evil.example", "@octocat #12 :smile: $x^2$",
           "<https://e>", "[ref]: http://e", "**bold** _em_ ~~del~~", "# heading", "- item", "&lt;b&gt; &amp;",
           "<!-- c -->", "\\[x](y)", "[x]\n(y)", "rank\u202e1\u2066\x1b[31m"]


def _md_parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _hostile_model(s: str) -> dict:
    m = copy.deepcopy(synthetic_model(n_steps=2))
    for run in m["runs"]:
        run["name"] = run["path"] = run["gpu_model"] = run["backend"] = run["mode"] = s
        run["nccl_version"] = run["cuda_runtime_version"] = s
        run["top_kernels"][0]["name"] = s
    for f in m.get("findings", []):
        f["title"] = f["recommendation"] = f["kind"] = f["severity"] = s
        f["evidence"] = [s, s]
    m["verdict"] = s
    m["warnings"] = [{"file": f"/tmp/{s}", "message": s, "level": "error", "run": s}]
    m["tool"] = {"name": s, "version": s}
    m["generated_at"] = s
    return m


def _rendered_tokens(md: str) -> list:
    """Every token, in document order (inline children after their parent)."""
    out = []

    def walk(tokens):
        for t in tokens:
            out.append(t)
            walk(t.children or [])

    walk(_md_parser().parse(md))
    return out


def _structure(md: str) -> list[str]:
    """The token types in order, runs of text collapsed: what renders, whatever the words."""
    types: list[str] = []
    for t in _rendered_tokens(md):
        if not (t.type == "text" and types and types[-1] == "text"):
            types.append(t.type)
    return types


def _gfm_triggers(md: str) -> list[str]:
    """What GitHub's autolink, mention and issue-reference extensions would turn into a link: an unescaped
    'scheme://', '@name' or 'a@b', '#12' or 'www.'."""
    import re

    return re.findall(r"(?<=[A-Za-z])(?<!\\):(?=//)|(?<!\\)@(?=[^\W_])|(?<!\\)#(?=\d)|(?i:www)(?<!\\)\.", md)


@pytest.mark.parametrize("s", HOSTILE)
def test_hostile_strings_render_as_text_in_markdown(s):
    plain = render_markdown(_hostile_model("plain"))
    md = render_markdown(_hostile_model(s))
    tokens = _rendered_tokens(md)
    assert not {t.type for t in tokens} & {"link_open", "image", "html_inline", "html_block", "code_inline"}
    assert _structure(md) == _structure(plain)  # the same headings, lists, tables, emphasis: none from the input
    assert _gfm_triggers(md) == _gfm_triggers(render_markdown(_hostile_model("plain")))
    # and the reader sees the name as it is (one line; control and bidi characters as U+FFFD)
    expect = safety._MD_CONTROL.sub("\ufffd", s.replace("\n", " "))
    text = "".join(t.content for t in tokens if t.type == "text")
    assert expect in text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("[]()!<>`*_~|#:@$&\\-+=.\n wh/ex\u202e\x1b")), max_size=40))
def test_generated_strings_render_as_text_in_markdown(s):
    from collections import Counter

    md = render_markdown(_hostile_model(s))
    # an empty or blank value may drop a line or an emphasis; no value adds markup of any kind
    assert not Counter(_structure(md)) - Counter(_structure(render_markdown(_hostile_model("plain"))))
    assert len(_gfm_triggers(md)) <= len(_gfm_triggers(render_markdown(_hostile_model("plain"))))
    assert not any(c in md for c in "\u202e\x1b")


def _rendered_text(md: str) -> list[str]:
    """The text a reader sees in each paragraph, list item, heading or table cell of ``md``."""
    return ["".join(c.content for c in t.children or [] if c.type in ("text", "softbreak"))
            for t in _md_parser().parse(md) if t.type == "inline"]


# what a ticket holds every day: nothing in these needs a backslash
ORDINARY = ["found: no finding", "traceanalyze 0.1.0, 2026-11-27T02:52:45+00:00", "ampere_sgemm_128x64_nn",
            "step 1.5 ms (p50); 3 of 8 ranks", "NCCL 2.21.5+cuda12.4", "a & b", "x > y", "see docs/options.md",
            "rank 3 (-12.5%)", "torch.set_float32_matmul_precision('high')", "node-1.cluster:29500"]
HOSTILE_MORE = HOSTILE + ["kernel*name*", "a|b", "<script>alert(1)</script>", "`x`", "first\nsecond",
                          "[x](javascript:alert(1))", "_em_ __strong__", "1. item", "+ x", "= setext", "> quote",
                          "&#60;b&#62;", "trailing\\", "C:\\Users\\x", "~~gone~~", "$x$", "http://e.x/a_b"]


@pytest.mark.parametrize("s", ORDINARY)
def test_markdown_escapes_nothing_in_ordinary_text(s):
    assert safety.md_text(s) == s
    assert _rendered_text(f"- {safety.md_text(s, line_start=True)}") == [s]


@pytest.mark.parametrize("s", ORDINARY + HOSTILE_MORE)
def test_markdown_text_renders_back_to_the_original(s):
    """Through a CommonMark renderer (markdown-it-py, GFM tables and strikethrough on), inside a line, as a list
    item's text and in a table cell, the reader sees the string itself (one line), and nothing else renders."""
    want = safety._MD_CONTROL.sub("\ufffd", s.replace("\n", " ")).strip()
    inline, start, cell = safety.md_text(s), safety.md_text(s, line_start=True), safety.md_text(s, cell=True)
    assert _rendered_text(f"**Verdict:** {inline} end") == [f"Verdict: {want} end"]
    assert _rendered_text(f"- {start}") == [want]
    assert _rendered_text(f"{start}") == [want]
    assert _rendered_text(f"| a | b |\n|---|---|\n| {cell} | x |") == ["a", "b", want, "x"]
    doc = f"**Verdict:** {inline}\n\n- {start}\n\n| a | b |\n|---|---|\n| {cell} | x |\n"
    types = {t.type for t in _rendered_tokens(doc)}
    assert not types & {"link_open", "image", "html_inline", "html_block", "code_inline", "em_open", "s_open",
                        "heading_open", "blockquote_open", "ordered_list_open"}
    assert _gfm_triggers(doc) == []


def test_hostile_folder_and_file_names_end_to_end(tmp_path):
    name = "[x](http:e) <img src=x onerror=1> `b` @me"
    d = two_ranks(tmp_path, name)
    (d / "rank2\u202e\x1b[2J.json").write_text("")  # an empty trace: an error line that names it
    code, out, err = invoke("report", str(d), "--format", "md", "-j", "1", "--db", str(tmp_path / "r.duckdb"))
    assert code == 0
    assert not {t.type for t in _rendered_tokens(out)} & {"link_open", "image", "html_inline", "html_block"}
    assert "[x](http:e)" in "".join(t.content for t in _rendered_tokens(out) if t.type == "text")
    assert not any(c in out + err for c in "\u202e\x1b")
    assert "rank2??[2J.json: empty file" in err


@given(st.text(max_size=30))
def test_terminal_text_holds_no_control_or_bidi_character(s):
    t = safety.terminal(s)
    assert len(t) == len(s)
    assert not any(unicodedata.category(c) == "Cc" or unicodedata.bidirectional(c) in
                   ("LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI") or c in "\u200e\u200f\u061c"
                   for c in t)


def test_sql_output_holds_no_control_or_bidi_character(tmp_path):
    db = tmp_path / "plain.duckdb"
    duckdb.connect(str(db)).close()
    q = "SELECT 'a' || chr(27) || '[2J' || chr(8238) || 'b' || chr(8294) AS v"
    for extra in ([], ["--csv"]):
        code, out, _ = invoke("sql", str(db), q, *extra)
        assert code == 0 and "a" in out and not any(c in out for c in "\x1b\u202e\u2066")


def test_click_usage_errors_quote_paths_without_control_or_bidi_characters(tmp_path):
    bad = tmp_path / "no\u202edb\x1b[2J.duckdb"
    code, out, err = invoke("sql", str(bad), "SELECT 1")
    assert code == 2 and "does not exist" in err and not any(c in out + err for c in "\x1b\u202e")
    code, out, _ = invoke("--help")
    assert code == 0 and "Usage:" in out


# ---- 13. environment failures --------------------------------------------------------------------------------------

def test_out_of_memory_names_the_stage_and_what_to_try(tmp_path, monkeypatch):
    from traceanalyze import stages

    d = two_ranks(tmp_path)

    def no_memory(*a, **kw):
        raise MemoryError

    monkeypatch.setattr(stages, "build_run", no_memory)
    code, _, err = invoke("report", str(d), "-o", str(tmp_path / "r.html"))
    assert code == 4
    assert err == ("traceanalyze: out of memory while reading and analyzing the traces; try fewer parse processes "
                   "(-j 1), a lower --max-decompressed, or a machine with more memory; files loaded so far stay "
                   "in the database\n")


def test_duckdb_disk_full_names_the_stage(tmp_path, monkeypatch):
    from traceanalyze import stages

    d = two_ranks(tmp_path)

    def full(*a, **kw):
        raise duckdb.IOException('Could not write file "r.duckdb.wal": No space left on device')

    monkeypatch.setattr(stages, "build_run", full)
    code, _, err = invoke("report", str(d), "-o", str(tmp_path / "r.html"))
    assert code == 3 and "while reading and analyzing the traces" in err and "the disk is full" in err


def test_read_only_output_folder_is_refused_before_work(tmp_path, monkeypatch):
    d = two_ranks(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
    else:  # root writes anywhere: the check is what is tested
        real = os.access
        monkeypatch.setattr(safety.os, "access", lambda p, m: False if Path(p) == ro else real(p, m))
    try:
        code, _, err = invoke("report", str(d), "-o", str(ro / "sub" / "r.html"))
    finally:
        ro.chmod(0o755)
    assert code == 3 and f"the folder {ro} is read-only or not yours" in err
    assert "while checking the output paths" in err and files_under(ro) == set()


@pytest.mark.parametrize("err_no", [errno.EACCES, errno.EROFS, errno.EDQUOT])
def test_write_refused_by_the_system_gets_exit_3(tmp_path, monkeypatch, err_no):
    d = two_ranks(tmp_path)

    def refuse(*a, **kw):
        raise OSError(err_no, os.strerror(err_no), str(tmp_path / "r.html"))

    monkeypatch.setattr(safety.tempfile, "mkstemp", refuse)
    code, _, err = invoke("report", str(d), "-o", str(tmp_path / "r.html"))
    assert code == 3 and "while writing the HTML report" in err and "Traceback" not in err
    assert "internal error" not in err


def test_a_bug_is_exit_5(tmp_path, monkeypatch):
    d = two_ranks(tmp_path)

    def bug(model):
        raise ValueError("boom")

    monkeypatch.setattr(cli, "render_html", bug)
    code, _, err = invoke("report", str(d), "-o", str(tmp_path / "r.html"))
    assert code == 5 and "internal error (ValueError: boom)" in err


# ---- 14. default report names never collide ------------------------------------------------------------------------

LOOKALIKES = ["run", "RUN", "Run", "r\u00fcn", "ru\u0308n", "run ", "run\u200b", "\u0440un", "run_", "r n", "r_n",
              "run.", ".run", "-run", "r\u202eun", "run-1234abcd", "\u00e9t\u00e9", "e\u0301te\u0301"]


def test_default_report_names_are_distinct_for_look_alike_folders(tmp_path):
    slugs = {}
    for name in LOOKALIKES:
        p = tmp_path / name
        p.mkdir()
        slugs[name] = _slug((str(p),), here=tmp_path)
    assert len(set(slugs.values())) == len(LOOKALIKES), slugs
    # ordinary names (ASCII letters, digits, "_.-") stay as they are; case twins meet only on case-insensitive
    # file systems, where the report already there adds the hash (below)
    for plain in ("run", "RUN", "Run", "run_", "r_n", "run.", "run-1234abcd"):
        assert slugs[plain] == plain
    others = {s for n, s in slugs.items() if not re.fullmatch(r"[A-Za-z0-9_.-]+", n) or n[0] in ".-"}
    assert all(re.search(r"-[0-9a-f]{8}$", s) for s in others), others
    folded = {unicodedata.normalize("NFC", s).casefold() for s in others}
    assert len(folded) == len(others)  # distinct even on case-insensitive, normalising file systems
    assert slugs["r\u00fcn"].startswith("r\u00fcn-")  # Unicode kept
    for s in slugs.values():
        assert safety.terminal(s) == s and "/" not in s and not s.startswith((".", "-")) and s.isprintable()


def test_default_report_name_is_plain_unless_a_case_twin_is_there(tmp_path):
    (tmp_path / "runA").mkdir()
    assert _slug((str(tmp_path / "runA"),), here=tmp_path) == "runA"
    (tmp_path / "traceanalyze-runA.html").write_text("")
    assert _slug((str(tmp_path / "runA"),), here=tmp_path) == "runA"  # its own report: written over, as before
    (tmp_path / "RUNA").mkdir()
    assert re.fullmatch(r"RUNA-[0-9a-f]{8}", _slug((str(tmp_path / "RUNA"),), here=tmp_path))


def test_default_report_files_do_not_overwrite_each_other(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i, name in enumerate(("run", "RUN", "run\u200b")):
        assert invoke("report", str(two_ranks(tmp_path / "in" / str(i), name)), "-q")[0] == 0
    reports = sorted(p.name for p in tmp_path.glob("traceanalyze-*.html"))
    assert len(reports) == 3 and "traceanalyze-run.html" in reports


def test_api_outputs_are_checked_against_the_report_inputs(tmp_path):
    from traceanalyze.api import analyze

    d = two_ranks(tmp_path)
    (d / "train.log").write_text("step 1 loss 2.0\n")
    before = {p.name: sha(p) for p in d.iterdir()}
    with analyze(d, db=tmp_path / "r.duckdb", jobs=1) as rep:
        for write in (rep.to_json, rep.to_markdown, rep.to_html, rep.export):
            with pytest.raises(UsageError, match="is an input"):
                write(d / "rank0.json")
        with pytest.raises(UsageError, match="is an input"):
            rep.to_html(tmp_path / "r.duckdb")
        assert rep.to_html(tmp_path / "r.html") == tmp_path / "r.html"
    assert {p.name: sha(p) for p in d.iterdir()} == before
    with pytest.raises(UsageError, match="is an input"):
        analyze(d, db=d / "rank1.json", jobs=1)
    assert {p.name: sha(p) for p in d.iterdir()} == before


def test_batch_run_folders_are_distinct_for_look_alike_run_names(tmp_path):
    archive = tmp_path / "archive"
    names = ["run", "RUN", "r\u00fcn", "r n", "run\u200b"]
    for name in names:
        two_ranks(archive / name, "job")  # run ids "run/job", "RUN/job", ...
    res = batch.run_batch(archive, tmp_path / "out", jobs=1)
    slugs = [r["slug"] for r in res.runs]
    assert len(res.runs) == len(names) and len({s.casefold() for s in slugs}) == len(names), slugs
    assert all(r["status"] == "ok" for r in res.runs)


def test_own_outputs_inside_the_input_folder_are_replaced_on_a_rerun(tmp_path):
    d = two_ranks(tmp_path)
    args = ["report", str(d), "-j", "1", "-o", str(d / "r.html"), "--json", str(d / "r.json"), "--md",
            str(d / "r.md"), "--export", "m.json.gz"]
    assert invoke(*args)[0] == 0
    first = {p.name for p in d.iterdir()}
    assert first == {"rank0.json", "rank1.json", "r.html", "r.json", "r.md", "r.duckdb", "m.json.gz"}
    assert all(safety.is_own_output(d / n, store.is_own_db) for n in first - {"rank0.json", "rank1.json"})
    assert not safety.is_own_output(d / "rank0.json", store.is_own_db)
    code, _, err = invoke(*args)
    assert code == 0, err
    assert {p.name for p in d.iterdir()} == first
