"""No absolute path on the page unless asked (``--show-paths``): HTML, Markdown and JSON show each path from its
input folder's name; the report model, the cache and the terminal keep them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.test_robustness import invoke, write_trace
from traceanalyze import api, batch
from traceanalyze.report.paths import page_model

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


def _run(tmp_path: Path) -> Path:
    d = tmp_path / "deep" / "runA"
    d.mkdir(parents=True)
    for r in (0, 1):
        write_trace(d / f"rank{r}.json", r, 2)
    (d / "notes.json").write_text("{}")  # a warning row that names a file
    return d


def _outputs(tmp_path: Path, *extra: str) -> dict[str, str]:
    d = _run(tmp_path)
    out = tmp_path / "out"
    code, _, err = invoke("report", str(d), "-o", str(out / "r.html"), "--json", str(out / "r.json"), "--md",
                          str(out / "r.md"), "-j", "1", *extra)
    assert code == 0, err
    return {ext: (out / f"r.{ext}").read_text(encoding="utf-8") for ext in ("html", "json", "md")}


def test_reports_hold_no_absolute_path_by_default(tmp_path):
    pages = _outputs(tmp_path)
    for ext, text in pages.items():
        assert str(tmp_path) not in text, ext
    model = json.loads(pages["json"])
    run = model["runs"][0]
    assert run["path"] == "runA"
    assert sorted(f["path"] for f in run["files"]) == ["runA/rank0.json", "runA/rank1.json"]
    assert [w["file"] for w in model["warnings"] if w.get("file")] == ["runA/notes.json"]
    assert 'title="runA/rank0.json"' in pages["html"]


def test_show_paths_keeps_them(tmp_path):
    pages = _outputs(tmp_path, "--show-paths")
    model = json.loads(pages["json"])
    assert model["runs"][0]["path"] == str((tmp_path / "deep" / "runA").resolve())
    assert str(tmp_path) in pages["html"] and str(tmp_path) in pages["json"]


def test_the_api_and_the_batch_hide_them_too(tmp_path):
    d = _run(tmp_path)
    with api.analyze(d, jobs=1) as rep:
        assert str(tmp_path) in rep.model["runs"][0]["path"]  # the model keeps them (output checks use them)
        for text in (rep.to_json(), rep.to_markdown(), rep.to_html(tmp_path / "a.html").read_text("utf-8")):
            assert str(tmp_path) not in text
    with api.analyze(d, jobs=1, show_paths=True) as rep:
        assert str(tmp_path) in rep.to_json()
    archive = tmp_path / "archive"
    shutil.copytree(SAMPLES / "straggler", archive / "straggler")
    batch.run_batch(archive, tmp_path / "b", jobs=1)
    page = (tmp_path / "b" / "runs" / "straggler" / "report.json").read_text("utf-8")
    assert str(tmp_path) not in page and json.loads(page)["runs"][0]["path"] == "straggler"


def test_page_model_shows_paths_from_the_outer_input():
    m = {"runs": [{"path": "/x/job/runA", "files": [{"path": "/x/job/runA/r0.json"}]}],
         "warnings": [{"file": "/elsewhere/cfg.yaml", "message": "read /x/job/runA/r0.json: bad"},
                      {"file": "/x/jobs/other.json", "message": "m"}]}
    page = page_model(m, ["/x/job"])
    assert page["runs"][0] == {"path": "job/runA", "files": [{"path": "job/runA/r0.json"}]}
    assert page["warnings"][0] == {"file": "cfg.yaml", "message": "read job/runA/r0.json: bad"}
    assert page["warnings"][1]["file"] == "other.json"  # /x/jobs is not under /x/job
    assert m["runs"][0]["path"] == "/x/job/runA"  # a copy
    assert page_model(m, ["/x/job"], show_paths=True) is m
