"""Python API (traceanalyze.analyze / load / Report): DataFrames with real values, outputs, notebook display."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import traceanalyze as ta
from tests.conftest import ROOT, real, sample
from tests.synth import cpu_job, write_trace
from traceanalyze.errors import TraceanalyzeError

pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def tf():
    a = ta.analyze(real("hta/trace_filter"), jobs=1)
    yield a
    a.close()


def test_ranks_frame_matches_hta(tf):
    df = tf.ranks
    assert list(df.columns[:4]) == ["run", "role", "rank", "mode"]
    r0 = df[df["rank"] == 0].iloc[0]
    assert r0["run"] == "trace_filter" and r0["mode"] == "gpu"
    assert r0["idle_pct"] == pytest.approx(53.56, abs=0.01)
    assert r0["compute_pct"] == pytest.approx(17.71, abs=0.01)
    assert df[df["rank"] == 1].iloc[0]["comm_comp_overlap_pct"] == pytest.approx(20.05, abs=0.01)


def test_other_frames(tf):
    steps = tf.steps
    assert {"run", "rank", "step", "step_time_us", "compute_us", "exposed_comm_us"} <= set(steps.columns)
    assert set(steps["rank"]) == {0, 1}
    k = tf.kernels
    assert list(k.columns) == ["run", "name", "klass", "count", "total_us", "mean_us", "pct"]
    assert k.iloc[0]["name"].startswith("ncclKernel_SendRecv") and k.iloc[0]["klass"] == "communication"
    c = tf.collectives
    # the SendRecv kernels named by their nccl:* annotations (issue 30): 4 all_to_all, 2 all_gather, 4 all_reduce
    assert [(r.collective, r.count) for r in c.itertuples()] == [("all_to_all", 4), ("all_gather", 2),
                                                                  ("all_reduce", 4)]
    idle = tf.idle
    s23 = idle[(idle["rank"] == 0) & (idle["stream"] == 23)].iloc[0]
    assert s23["host_wait_us"] == pytest.approx(596037.0, abs=0.5)
    f = tf.findings
    assert list(f.columns) == ["run", "cause", "kind", "severity", "impact_pct", "ranks", "title", "evidence",
                               "recommendation"]
    assert len(f) == len(tf.model["findings"])  # trace_filter (2 of 128 ranks) has none
    assert tf.runs.iloc[0]["mode"] == "gpu"


def test_findings_frame_on_the_straggler_sample():
    with ta.analyze(sample("straggler"), jobs=1) as a:
        f = a.findings
    top = f.iloc[0]
    assert (top["cause"], top["kind"], top["ranks"]) == ("imbalance", "straggler", [2])
    assert isinstance(top["evidence"], list) and top["impact_pct"] > 25


def test_sql(tf):
    df = tf.sql("SELECT f.rank, count(*) AS n FROM kernels k JOIN files f USING (file_id) GROUP BY 1 ORDER BY 1")
    assert list(df["rank"]) == [0, 1] and df["n"].sum() == 2358
    assert tf.sql("SELECT ? AS x", [3]).iloc[0]["x"] == 3
    with pytest.raises(TraceanalyzeError, match="query failed"):
        tf.sql("SELECT * FROM no_such_table")


def test_outputs(tf, tmp_path):
    model = json.loads(tf.to_json(tmp_path / "r.json"))
    assert model["runs"][0]["name"] == "trace_filter"
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == tf.verdict
    md = tf.to_markdown(tmp_path / "r.md")
    assert md.startswith("#") and (tmp_path / "r.md").read_text() == md
    p = tf.to_html(tmp_path / "out" / "r.html", export="r.json.gz")
    html = p.read_text()
    assert "<html" in html and 'href="r.json.gz"' in html and (tmp_path / "out" / "r.json.gz").is_file()
    assert "trace_filter" in repr(tf)


def test_repr_html_escapes(tf):
    h = tf._repr_html_()
    assert "Verdict" in h and "53.56" in h and "<table>" in h
    evil = ta.Report(tf.con, {**tf.model, "verdict": "<script>alert(1)</script>",
                              "findings": [{"title": "<img src=x onerror=alert(1)>", "ranks": [0], "impact_pct": 5.0,
                                            "severity": "high", "cause": "<b>"}]})
    h = evil._repr_html_()
    assert "<script>" not in h and "<img" not in h and "&lt;script&gt;" in h and "&lt;b&gt;" in h


def test_straggler_sample_max_compute():
    with ta.analyze(sample("straggler"), jobs=1) as a:
        df = a.ranks
        slow = int(df.loc[df["compute_us"].idxmax(), "rank"])
        assert slow == 2
        f = a.findings
        assert "straggler" in set(f["kind"])
        assert f[f["kind"] == "straggler"].iloc[0]["ranks"] == [2]


def test_load_reopens_a_database(tmp_path):
    write_trace(tmp_path / "job" / "rank0.json", 0, cpu_job(0, 0.0))
    write_trace(tmp_path / "job" / "rank1.json", 1, cpu_job(1, 0.0, slow=4000.0))
    db = tmp_path / "r.duckdb"
    with ta.analyze(tmp_path / "job", db=db, jobs=1) as a:
        before = a.ranks
    with ta.load(db) as b:
        after = b.ranks
        assert b.verdict and b.model["runs"][0]["name"] == "job"
    assert before.equals(after)
    with pytest.raises(TraceanalyzeError, match="no such database"):
        ta.load(tmp_path / "missing.duckdb")


def test_errors():
    with pytest.raises(TraceanalyzeError, match="no such file or folder"):
        ta.analyze("/nonexistent/traces")


def test_without_pandas(tf, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"traceanalyze\[pandas\]"):
        _ = tf.ranks
    assert tf.to_json()  # everything but DataFrames still works


def test_import_stays_light():
    code = ("import sys, traceanalyze; heavy = [m for m in ('duckdb', 'pandas', 'numpy', 'torch', 'traceanalyze.api') "
            "if m in sys.modules]; print(heavy); assert hasattr(traceanalyze, 'analyze'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.splitlines() == ["[]", "False"]


CLI_PANDAS = """
import sys
from traceanalyze.cli import main
sys.argv = ["traceanalyze", "report", sys.argv[1], "-o", sys.argv[2], "-q"]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print("pandas" in sys.modules)
"""


def test_command_line_never_imports_pandas_but_the_api_still_can(tmp_path):
    pytest.importorskip("pandas")
    out = subprocess.run([sys.executable, "-c", CLI_PANDAS, str(sample("straggler")), str(tmp_path / "r.html")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # pyarrow would import it (0.2 s, ~50 MB) on its first array
    assert (tmp_path / "r.html").stat().st_size > 10_000
    r = ta.analyze(sample("straggler"), jobs=1)  # the API in this process: DataFrames still work
    assert list(r.ranks["rank"]) == [0, 1, 2, 3]
