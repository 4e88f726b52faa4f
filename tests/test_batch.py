"""traceanalyze batch on an archive built from the sample scenarios: dated copies of the scenario folders
(``archive/2026-11-0N/<name>/``, each copy's trace clock moved to its folder's day), a time series of
fast_interconnect runs whose last copy is really the slow_interconnect run (a regression to flag and explain),
and one broken run (a trace that is garbage after its first bytes)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tests.conftest import SAMPLES
from traceanalyze import batch
from traceanalyze.cli import cli

# (day, sample scenario, folder name in the archive)
PLAN = [(1, "healthy", "healthy"), (1, "fast_interconnect", "fast_interconnect"),
        (2, "straggler", "straggler"), (2, "fast_interconnect", "fast_interconnect"),
        (3, "precision_fp32", "precision_fp32"), (3, "fast_interconnect", "fast_interconnect"),
        (4, "precision_bf16", "precision_bf16"), (4, "dataloader_bound", "dataloader_bound"),
        (5, "slow_interconnect", "fast_interconnect"), (5, "compile_warm", "compile_warm")]
BROKEN = "2026-11-06/broken"
SLOW = "2026-11-05/fast_interconnect"
DAY_NS = 86_400 * 10**9


def _copy_run(src: Path, dst: Path, day: int) -> None:
    """Copy a scenario folder, moving its traces' clock (``baseTimeNanoseconds``, the same shift for every
    rank) so that the run took place on 2026-11-<day>, at its original time of day."""
    dst.mkdir(parents=True)
    texts = {}
    first = None
    for t in sorted(src.glob("*.json.gz")):
        txt = gzip.decompress(t.read_bytes()).decode()
        base = int(re.search(r'"baseTimeNanoseconds":\s*(\d+)', txt).group(1))
        start = base + int(min(float(x) for x in re.findall(r'"ts":\s*([\d.]+)', txt)) * 1000)
        first = start if first is None else min(first, start)
        texts[t.name] = (txt, base)
    target = int(dt.datetime(2026, 11, day, tzinfo=dt.timezone.utc).timestamp()) * 10**9
    shift = target - first // DAY_NS * DAY_NS
    for name, (txt, base) in texts.items():
        txt = re.sub(r'("baseTimeNanoseconds":\s*)\d+', rf"\g<1>{base + shift}", txt, count=1)
        (dst / name).write_bytes(gzip.compress(txt.encode(), compresslevel=1))
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".json.gz"):
            shutil.copy2(f, dst / f.name)


def _expected(run_id: str) -> dict:
    day, name = run_id.split("/")
    src = next(s for d, s, n in PLAN if n == name and f"2026-11-0{d}" == day)
    return json.loads((SAMPLES / src / "scenario.json").read_text())["expected"]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    for _, src, _ in PLAN:
        if not (SAMPLES / src / "scenario.json").exists() or not list((SAMPLES / src).glob("*.json.gz")):
            pytest.skip(f"sample scenario {src} not generated")
    root = tmp_path_factory.mktemp("batch") / "archive"
    for day, src, name in PLAN:
        _copy_run(SAMPLES / src, root / f"2026-11-0{day}" / name, day)
    broken = root / BROKEN
    broken.mkdir(parents=True)
    (broken / "rank0.pt.trace.json").write_bytes(b'{"traceEvents": [{"ph": "X", "name": \x00\x01garbage')
    return root


@pytest.fixture(scope="module")
def first(archive, tmp_path_factory):
    out = tmp_path_factory.mktemp("batch_out") / "out"
    res = batch.run_batch(archive, out, jobs=2)
    return out, res


def _rows(out: Path) -> dict[str, dict]:
    con = duckdb.connect(str(out / "catalog.duckdb"), read_only=True)
    try:
        rel = con.execute("SELECT * FROM runs")
        cols = [d[0] for d in rel.description]
        return {r[0]: dict(zip(cols, r, strict=True)) for r in rel.fetchall()}
    finally:
        con.close()


def test_catalog_has_a_row_per_run_with_its_top_cause(archive, first):
    out, res = first
    rows = _rows(out)
    assert len(rows) == len(PLAN) + 1 == len(res.runs) == len(res.analyzed)
    assert res.unchanged == [] and res.removed == []
    for run_id, r in rows.items():
        if run_id == BROKEN:
            continue
        assert r["status"] == "ok", (run_id, r["error"])
        day = int(run_id.split("/")[0][-2:])
        assert (r["date"].date(), r["date_source"]) == (dt.date(2026, 11, day), "trace")
        assert r["group_key"] == f"{run_id.split('/')[1]} / {r['world_size']} ranks"
        assert r["step_time_us"] > 0 and r["mode"] == "cpu"
        findings = json.loads(r["findings"])
        assert len(findings) == r["n_findings"]
        exp = _expected(run_id)
        if exp["cause"] is not None:
            assert (r["top_cause"], r["top_kind"]) == (exp["cause"], exp["kind"]), run_id
            assert findings[0]["cause"] == exp["cause"]
    con = duckdb.connect(str(out / "catalog.duckdb"), read_only=True)
    ranks = dict(con.execute("SELECT run_id, count(*) FROM rank_metrics GROUP BY ALL").fetchall())
    top = dict(con.execute("SELECT run_id, cause FROM findings WHERE pos = 1").fetchall())
    con.close()
    assert ranks == {k: r["world_size"] for k, r in rows.items() if k != BROKEN and r["world_size"]}
    assert ranks["2026-11-01/healthy"] == 4 and ranks["2026-11-03/precision_fp32"] == 2
    assert top["2026-11-04/dataloader_bound"] == "config"


def test_index_links_every_report(first):
    out, res = first
    page = (out / "index.html").read_text()
    links = set(re.findall(r'href="([^"#][^"]*)"', page))
    rows = _rows(out)
    for r in rows.values():
        if r["status"] != "error":
            assert r["report_html"] in links
            assert (out / r["report_html"]).is_file() and (out / r["report_json"]).is_file()
    assert all((out / link).is_file() for link in links)
    assert "<script" not in page.lower()
    assert set(re.findall(r"https?://[^\s\"'<>)]*", page)) <= {"http://www.w3.org/2000/svg"}
    assert page.count("<svg") >= 2  # top causes + the fast_interconnect group's step time over time
    for key in ("step", "impact", "cause", "group", "status"):  # orderings without script
        assert f'href="#by-{key}"' in page and f"--o-{key}:" in page


def test_broken_run_is_listed_with_its_error(first):
    out, res = first
    r = _rows(out)[BROKEN]
    assert r["status"] == "error" and "truncated" in r["error"]
    assert res.errors == [BROKEN]
    page = (out / "index.html").read_text()
    assert BROKEN in page and "nothing could be analyzed" in page


def test_regression_flagged_and_explained_by_interconnect(first):
    out, res = first
    assert res.regressions == [SLOW] and res.explained == [SLOW]
    r = _rows(out)[SLOW]
    assert r["regression"] and r["regression_ratio"] > 1.2
    assert r["regression_reference"] in {"2026-11-01/fast_interconnect", "2026-11-02/fast_interconnect",
                                         "2026-11-03/fast_interconnect"}
    assert (r["regression_cause"], r["regression_kind"]) == ("interconnect", "slow_collectives")
    assert r["regression_part"] == "exposed communication" and r["regression_delta_us"] > 0
    assert (out / r["regression_report"]).is_file()
    comparison = json.loads((out / r["regression_report"]).with_suffix(".json").read_text())["comparison"]
    assert comparison["delta_us"] == r["regression_delta_us"]
    page = (out / "index.html").read_text()
    assert f'href="{r["regression_report"]}"' in page


def test_incremental_rerun_add_change_remove(archive, first, tmp_path):
    out0, res0 = first
    arch, out = tmp_path / "archive", tmp_path / "out"
    shutil.copytree(archive, arch)  # copies keep mtimes; keys use paths inside the archive
    shutil.copytree(out0, out)
    res = batch.run_batch(arch, out, jobs=2)
    assert res.analyzed == [] and res.explained == [] and len(res.unchanged) == len(res0.runs)
    assert res.regressions == [SLOW]

    _copy_run(SAMPLES / "precision_bf16", arch / "2026-11-07" / "precision_bf16", 7)
    res = batch.run_batch(arch, out, jobs=2)
    assert res.analyzed == ["2026-11-07/precision_bf16"] and res.explained == []
    assert len(_rows(out)) == len(res0.runs) + 1

    trace = next((arch / "2026-11-04" / "dataloader_bound").glob("*.json.gz"))
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))
    res = batch.run_batch(arch, out, jobs=2)
    assert res.analyzed == ["2026-11-04/dataloader_bound"]

    slug = _rows(out)["2026-11-02/straggler"]["slug"]
    shutil.rmtree(arch / "2026-11-02" / "straggler")
    res = batch.run_batch(arch, out, jobs=2)
    assert res.analyzed == [] and res.removed == ["2026-11-02/straggler"]
    rows = _rows(out)
    assert "2026-11-02/straggler" not in rows and len(rows) == len(res0.runs)
    assert not (out / "runs" / slug).exists()
    assert "2026-11-02/straggler" not in (out / "index.html").read_text()
    con = duckdb.connect(str(out / "catalog.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM rank_metrics WHERE run_id = '2026-11-02/straggler'").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM batches").fetchone() == (5,)
    con.close()


def _summary(rows: dict[str, dict]) -> set[tuple]:
    return {(k, r["status"], r["top_cause"], r["top_kind"], round(r["step_time_us"] or 0), r["world_size"],
             r["regression"], r["regression_cause"]) for k, r in rows.items()}


def test_dask_executor_gives_the_same_catalog(archive, first, tmp_path):
    pytest.importorskip("dask.distributed")
    out0, _ = first
    res = batch.run_batch(archive, tmp_path / "out", jobs=2, executor="dask", dask_processes=False)
    assert sorted(res.analyzed) == sorted(_rows(out0)) and res.regressions == [SLOW]
    assert _summary(_rows(tmp_path / "out")) == _summary(_rows(out0))


def test_dask_scheduler_address(tmp_path):
    dd = pytest.importorskip("dask.distributed")
    src = SAMPLES / "precision_bf16"
    if not list(src.glob("*.json.gz")):
        pytest.skip("sample scenario precision_bf16 not generated")
    shutil.copytree(src, tmp_path / "a" / "2026-11-01" / "precision_bf16")
    with dd.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        res = batch.run_batch(tmp_path / "a", tmp_path / "out", scheduler=cluster.scheduler_address)
    assert res.analyzed == ["2026-11-01/precision_bf16"] and res.errors == []
    assert (tmp_path / "out" / res.runs[0]["report_html"]).is_file()


def test_cli_batch_rerun_is_incremental(archive, first):
    out, _ = first
    r = CliRunner().invoke(cli, ["batch", str(archive), "-o", str(out), "-j", "2"])
    assert r.exit_code == 0, r.output
    assert f"{len(PLAN) + 1} run(s): 0 analyzed, {len(PLAN) + 1} unchanged" in r.output
    q = CliRunner().invoke(cli, ["sql", str(out / "catalog.duckdb"),
                                 "SELECT run_id FROM runs WHERE regression", "--csv"])
    assert q.exit_code == 0 and SLOW in q.output


def test_a_failing_analysis_does_not_stop_the_batch(tmp_path, monkeypatch):
    from traceanalyze import pipeline

    for name in ("precision_bf16", "dataloader_bound"):
        if not list((SAMPLES / name).glob("*.json.gz")):
            pytest.skip(f"sample scenario {name} not generated")
        shutil.copytree(SAMPLES / name, tmp_path / "a" / name)
    real = pipeline.analyze

    def flaky(inputs, options=None, **kw):
        if any("dataloader_bound" in str(p) for p in inputs):
            raise RuntimeError("boom")
        return real(inputs, options, **kw)

    monkeypatch.setattr(pipeline, "analyze", flaky)
    res = batch.run_batch(tmp_path / "a", tmp_path / "out", jobs=1)  # jobs=1: analyzed in this process
    rows = _rows(tmp_path / "out")
    assert rows["dataloader_bound"]["status"] == "error" and rows["dataloader_bound"]["error"] == "RuntimeError: boom"
    assert rows["precision_bf16"]["status"] == "ok" and res.errors == ["dataloader_bound"]
    assert "RuntimeError: boom" in (tmp_path / "out" / "index.html").read_text()


def test_empty_archive_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(cli, ["batch", str(tmp_path / "empty"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 1 and "no run found" in r.output


@pytest.mark.parametrize("run_id, name", [("2026-11-01/healthy", "healthy"), ("llama/2026-11-01/traces", "llama"),
                                          ("exp/run_0003", "exp"), ("llama8b-2026-11-01", "llama8b"),
                                          ("a1b2c3d4e5f6", "a1b2c3d4e5f6")])
def test_group_name_from_folders(run_id, name):
    assert batch._folder_group_name(run_id) == name


def test_fail_on_regression_exit_status(archive, first, tmp_path):
    out0, _ = first
    out = tmp_path / "out"
    shutil.copytree(out0, out)  # every run unchanged: nothing is analyzed again
    r = CliRunner().invoke(cli, ["batch", str(archive), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["batch", str(archive), "-o", str(out), "--fail-on-regression"])
    assert r.exit_code == 3, r.output
    assert f"traceanalyze: 1 regression(s): {SLOW}" in r.output
    assert (out / "index.html").is_file()


def test_index_opens_on_the_run_table_with_the_step_without_the_profiler():
    import datetime as dt

    from traceanalyze.report import render_batch_index

    base = {"status": "ok", "date": dt.datetime(2026, 11, 2, 10, 0), "group_key": "gpt·8", "world_size": 8,
            "mode": "gpu", "top_cause": None}
    rows = [{**base, "run_id": "a", "step_time_us": 120_000.0, "step_time_unprofiled_us": 100_000.0,
             "step_time_unprofiled_source": "estimate"},
            {**base, "run_id": "b", "step_time_us": 90_000.0, "date": dt.datetime(2026, 11, 1)}]
    page = render_batch_index(rows, archive="/archive", threshold=1.2)
    body = page[page.index("<body>"):]
    # the run table comes first; no empty regression section above it, one line says there is none
    assert body.index('<section id="runs">') < body.index('<section id="causes">') < body.index('<section id="groups">')
    assert '<section id="regressions">' not in body and "No regression: no run is more than 1.2× slower" in body
    assert "step without profiler (ms)" in body
    assert '>100.00</td>' in body and "120.00 ms" in body  # the report's figure shown, the profiled one in its title
    assert '>90.00 <span class="muted">†</span></td>' in body  # only the profiled step known: marked
