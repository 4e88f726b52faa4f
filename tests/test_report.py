"""Render: the HTML report and the Markdown summary, built from real traces and a synthetic model with findings."""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markupsafe import escape

from tests.conftest import real
from traceanalyze import fmt
from traceanalyze.pipeline import analyze
from traceanalyze.report import charts, render_html, render_markdown
from traceanalyze.report import html as report_html
from traceanalyze.report import model as report_model

REPO = Path(__file__).resolve().parents[1]
STRAGGLER = REPO / "sample_traces" / "straggler"

XSS = '<script>alert(1)</script> "quotes" & amp'
URL_RE = re.compile(r"(?:https?|ftp|file)://[^\s\"'<>)]*", re.I)
W3_NS = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}


# ---------------------------------------------------------------------------------------------------------
# Fixtures

@pytest.fixture(scope="module")
def trace_filter_model() -> dict:
    a = analyze(real("hta/trace_filter"))
    a.con.close()
    return a.model


@pytest.fixture(scope="module")
def straggler_model() -> dict:
    if not STRAGGLER.is_dir():
        pytest.skip(f"{STRAGGLER} not present")
    a = analyze(STRAGGLER)
    a.con.close()
    return a.model


def _rank(rank: int, idle: float, compute: float, step_us: float) -> dict:
    window = 1_000_000.0
    non = 100.0 - idle - compute
    return {"rank": rank, "mode": "gpu", "n_files": 1, "window_us": window, "busy_us": window * (1 - idle / 100),
            "idle_us": window * idle / 100, "compute_us": window * compute / 100, "non_compute_us": window * non / 100,
            "idle_pct": idle, "compute_pct": compute, "non_compute_pct": non, "comm_us": 300_000.0,
            "comm_comp_overlap_pct": 40.0, "exposed_comm_us": window * non / 100, "kernel_compute_us": 700_000.0,
            "kernel_comm_us": 300_000.0, "kernel_memory_us": 1_000.0, "n_kernels": 1234, "n_steps": 5,
            "step_time_us": step_us, "files": [f"/data/run/rank{rank}.json.gz"]}


LONG_KERNEL = ("void at::native::(anonymous namespace)::cutlass_kernel<" + ", ".join(
    f"cutlass::gemm::GemmShape<{i}, 128, 32>" for i in range(60)) + ">(Params const&, float*, long)")


def synthetic_model(n_ranks: int = 8, n_steps: int = 6) -> dict:
    """A GPU run with every optional key: findings (unsorted), verdict, comparison, dtype mix, collectives, ..."""
    ranks = [_rank(r, 10.0 + r * 0.37, 55.0 - r * 0.21, 400_000.0 + r * 100) for r in range(n_ranks)]
    ranks[3] = _rank(3, 2.0, 88.0, 401_000.0)  # the straggler: busy computing while the others wait
    steps = [{"run_id": 1, "rank": r, "step": s, "start_ns": 10**15 + s * 4 * 10**8,
              "step_time_us": 400_000.0 + 1000 * s + (90_000.0 if (r == 3 and s == 2) else 0.0),
              "compute_us": 200_000.0, "comm_us": 100_000.0, "exposed_comm_us": 60_000.0, "idle_us": 40_000.0}
             for r in range(n_ranks) for s in range(n_steps)]
    kernels = [{"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                "klass": "communication", "count": 80, "total_us": 2.4e6, "mean_us": 30_000.0, "pct": 40.0},
               {"name": LONG_KERNEL, "klass": "compute", "count": 400, "total_us": 1.2e6, "mean_us": 3000.0,
                "pct": 20.0},
               {"name": "Memcpy HtoD (Pinned -> Device)", "klass": "memory", "count": 8, "total_us": 1e4,
                "mean_us": 1250.0, "pct": 0.2}]
    run = {"run_id": 1, "name": "slow8", "path": "/data/run", "role": "subject", "mode": "gpu",
           "world_size": n_ranks, "backend": "nccl", "gpu_model": "NVIDIA A100-SXM4-80GB", "gpu_count": 8,
           "nccl_version": "2.21.5", "cuda_runtime_version": "12040", "missing_ranks": [],
           "ranks_found": list(range(n_ranks)),
           "files": [{"path": f"/data/run/rank{r}.json.gz", "rank": r, "cached": r % 2 == 0} for r in range(n_ranks)],
           "sidecars": [{"path": "/data/run/topo.txt", "kind": "nvidia_smi_topo"}],
           "ranks": ranks, "steps": steps, "top_kernels": kernels, "step_time_us": 400_500.0,
           "dtype_mix": [{"dtype": "fp32", "tensor_core": False, "time_us": 9e5, "pct": 75.0},
                         {"dtype": "bf16", "tensor_core": True, "time_us": 3e5, "pct": 25.0},
                         {"dtype": "unknown", "tensor_core": None, "time_us": None, "pct": None}],
           "collectives": [{"collective": "all_reduce", "size_bytes": 104857600, "count": 80, "transfer_us": 1.5e6,
                            "wait_us": 9e5, "algbw_gbps": 5.6, "busbw_gbps": 9.8}],
           "link": {"expected_gbps": 600.0, "source": "NVLink 3 (A100), NVIDIA"},
           "clock_offsets_us": {"0": 0.0, "1": 12.5},
           "collective_wait_us": {str(r): (0.0 if r == 3 else 150_000.0) for r in range(n_ranks)},
           "dataloader": {"loader_us": {"0": 10.0}, "share_pct": {str(r): 0.5 for r in range(n_ranks)}},
           "precision": {"main_dtype": "fp32", "fp32_share_pct": 75.0, "mfu_pct": None, "gemm_time_us": 1.2e6},
           "effective_batch": 256.0,
           "compile": {"frames": 3, "recompiles": 1, "compile_us": 4.5e6},
           "log_facts": {"global_batch": 256, "grad_accum": 8, "flags": ["--bf16", "--compile"]}}
    baseline = copy.deepcopy(run)
    baseline.update(name="fast8", role="baseline", path="/data/fast", step_time_us=300_000.0)
    findings = [
        {"cause": "precision", "kind": "fp32_matmul", "severity": "medium", "impact_pct": 12.5, "ranks": [],
         "title": "75 % of GEMM time runs in fp32 without tensor cores",
         "evidence": ["fp32 SIMT kernels: 900.0 ms of 1200.0 ms GEMM time"],
         "recommendation": "Enable bf16 autocast.", "run": "slow8"},
        {"cause": "interconnect", "kind": "slow_collectives", "severity": "high", "impact_pct": 31.0,
         "ranks": list(range(n_ranks)), "title": "Exposed all_reduce costs 31 % of step time",
         "evidence": ["busbw 9.8 GB/s vs 600 GB/s expected (NVLink 3)", "exposed communication 124 ms per step"],
         "recommendation": "Check NCCL_P2P_DISABLE and the topology.", "run": "slow8"},
        {"cause": "imbalance", "kind": "straggler", "severity": "high", "impact_pct": 18.0, "ranks": [3],
         "title": "Rank 3 is a straggler", "evidence": ["rank 3 compute 88 % vs median 54 %"],
         "recommendation": "Balance the data shards.", "run": "slow8"},
        {"cause": "config", "kind": "compile_overhead", "severity": "low", "impact_pct": None, "ranks": None,
         "title": "torch.compile recompiled once", "evidence": None, "recommendation": None, "run": "slow8"},
    ]
    comparison = {"subject": "slow8", "baseline": "fast8", "subject_step_us": 400_500.0, "baseline_step_us": 300_000.0,
                  "delta_us": 100_500.0,
                  "parts": [{"part": "exposed communication", "subject_us": 124_000.0, "baseline_us": 40_000.0,
                             "delta_us": 84_000.0, "finding": "Exposed all_reduce costs 31 % of step time"},
                            {"part": "compute", "subject_us": 220_000.0, "baseline_us": 210_000.0,
                             "delta_us": 10_000.0, "finding": None},
                            {"part": "idle", "subject_us": 56_500.0, "baseline_us": 50_000.0, "delta_us": 6_500.0,
                             "finding": None}],
                  "config_diffs": [{"key": "gradient_accumulation_steps", "subject": 1, "baseline": 8}]}
    return {"tool": {"name": "traceanalyze", "version": "9.9.9"}, "generated_at": "2025-01-02T03:04:05+00:00",
            "verdict": "Exposed all_reduce communication is the main cause (31 % of step time).",
            "runs": [run, baseline], "findings": findings, "comparison": comparison,
            "warnings": [{"file": "/data/run/rank7.json.gz", "message": "truncated JSON: read 812 of 1024 events",
                          "level": "partial", "run": "slow8"},
                         {"file": "/data/run/rank9.json", "message": "not a Kineto trace", "level": "error",
                          "run": "slow8"},
                         {"file": None, "message": "rank 2 has 2 trace files", "level": "info", "run": "slow8"}]}


class _Sections(HTMLParser):
    """Text per top-level <section id=...> (and the header), to check what appears where."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("section", "header", "footer"):
            self.stack.append(dict(attrs).get("id") or tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("section", "header", "footer") and self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack:
            self.text.setdefault(self.stack[-1], []).append(data)


def sections(doc: str) -> dict[str, str]:
    p = _Sections()
    p.feed(doc)
    return {k: " ".join(" ".join(v).split()) for k, v in p.text.items()}


def assert_self_contained(doc: str) -> None:
    assert not re.search(r"<script", doc, re.I)
    assert not re.search(r"<link\b|<img\b|<iframe\b|<object\b|<embed\b|@import|url\(", doc, re.I)
    assert not re.search(r"\son[a-z]+\s*=", doc, re.I), "no inline event handlers"
    assert set(URL_RE.findall(doc)) <= W3_NS, set(URL_RE.findall(doc)) - W3_NS
    assert "href" not in doc


# ---------------------------------------------------------------------------------------------------------
# Real traces

def test_trace_filter_html_has_hta_figures(trace_filter_model: dict) -> None:
    doc = render_html(trace_filter_model)
    assert_self_contained(doc)
    s = sections(doc)
    run = s["run-1"]
    # HTA 0.5.0 temporal breakdown and overlap for these two ranks (shared/traces/README.md).
    for fig in ("53.56", "17.71", "54.72", "22.57", "11.81", "20.05"):
        assert fig in run, fig
    assert "2 of 128" in run and "2–127" in run
    assert "GPU mode" in run
    # step time of rank 0: its one counted step, ProfilerStep#551 (607,312 µs; #552 is the window's partial last)
    assert "607.31" in run
    # top kernel: the SendRecv NCCL kernel, shortened, full name in the title attribute
    assert "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t" in run
    long_name = next(k["name"] for k in trace_filter_model["runs"][0]["top_kernels"] if len(k["name"]) > 1000)
    assert f'title="{escape(long_name)}"' in doc
    # the missing-ranks warning is in the data-quality section, and no file is reported unread
    dq = s["data-quality"]
    assert "126 of 128 ranks have no trace" in dq
    assert "All 2 files read completely" in dq
    # stacked bar chart: one bar label per rank, three series
    svg = re.search(r'<svg id="ta-breakdown-1".*?</svg>', doc, re.S).group(0)
    assert "rank 0" in svg and "rank 1" in svg
    assert svg.count('class="bar"') == 6


def test_trace_filter_markdown(trace_filter_model: dict) -> None:
    md = render_markdown(trace_filter_model)
    row0 = next(line for line in md.splitlines() if line.startswith("| 0 |"))
    assert [c.strip() for c in row0.strip("|").split("|")] == ["0", "53.56", "17.71", "28.73", "11.81", "172.26",
                                                                 "607.31"]
    assert "| 1 | 54.72 | 22.57 |" in md
    assert "2 of 128 ranks" in md and "gpu mode" in md and "backend nccl" in md
    assert "126 of 128 ranks have no trace" in md
    assert len(md.splitlines()) < 60


def test_straggler_sample(straggler_model: dict) -> None:
    doc = render_html(straggler_model)
    assert_self_contained(doc)
    run = sections(doc)["run-1"]
    for r in straggler_model["runs"][0]["ranks"]:
        assert f"{r['idle_pct']:.2f}" in run
    assert "CPU mode" in run and "Top ops (CPU)" in run
    # rank 2 computes while the others wait: it is singled out in the chart and the table
    assert re.search(r"rank 2 ◀ (straggler|outlier)", doc)
    assert not re.search(r"rank [013] ◀", doc)
    assert re.search(r'<tr class="flagged">\s*<td class="n"><b>2</b>', doc)
    r2 = next(r for r in straggler_model["runs"][0]["ranks"] if r["rank"] == 2)
    assert f"<title>rank 2: compute {r2['compute_pct']:.2f} %</title>" in doc  # hover text without script
    assert render_html(straggler_model) == doc  # reproducible: no random chart ids or timestamps of its own
    assert "aten::mm" in run and "gloo:all_reduce" in run
    assert "Kernel columns are left out" in run
    findings = straggler_model.get("findings") or []
    if findings:  # diagnosis present: its findings are shown in impact order, each once
        text = sections(doc)["findings"]
        impacts = sorted(findings, key=lambda f: -(f.get("impact_pct") or 0))
        pos = [text.index(" ".join(str(f["title"]).split())) for f in impacts]
        assert pos == sorted(pos)
    md = render_markdown(straggler_model)
    for r in straggler_model["runs"][0]["ranks"]:
        assert (f"| {r['rank']} | {r['idle_pct']:.2f} | {r['compute_pct']:.2f} | {r['non_compute_pct']:.2f} | "
                f"{r['comm_comp_overlap_pct']:.2f} |") in md
    assert "All 4 trace files read completely." in md


# ---------------------------------------------------------------------------------------------------------
# Synthetic model: findings, comparison, optional tables

def test_findings_ranked_by_impact_with_cause_and_evidence() -> None:
    doc = render_html(synthetic_model())
    assert_self_contained(doc)
    s = sections(doc)
    assert "Exposed all_reduce communication is the main cause" in s["top"]
    f = s["findings"]
    order = [f.index(t) for t in ("Exposed all_reduce costs 31 %", "Rank 3 is a straggler",
                                  "75 % of GEMM time runs in fp32", "torch.compile recompiled once")]
    assert order == sorted(order)
    assert "31.0 %" in f and "18.0 %" in f and "12.5 %" in f
    assert "busbw 9.8 GB/s vs 600 GB/s expected (NVLink 3)" in f
    assert "Check NCCL_P2P_DISABLE and the topology." in f
    # cause colours: the card class matches the finding's cause, and the same class colours the comparison bar
    assert re.search(r'class="finding cause-interconnect" id="finding-1"', doc)
    assert re.search(r'class="finding cause-imbalance" id="finding-2"', doc)
    assert 'class="dbar slower cause-interconnect"' in doc
    # the straggler named by the finding is marked
    assert "rank 3 ◀ straggler" in doc


def test_comparison_parts_sum_to_delta() -> None:
    model = synthetic_model()
    comp = sections(render_html(model))["comparison"]
    assert "slow8 vs fast8" in comp
    assert "+100.50 ms" in comp and "+84.00" in comp and "+6.50" in comp
    assert "gradient_accumulation_steps" in comp
    # parts that leave a remainder get an explicit "not attributed" row so the table still sums to the delta
    model["comparison"]["parts"].pop()
    comp = sections(render_html(model))["comparison"]
    assert "not attributed" in comp and "+6.50" in comp
    md = render_markdown(model)
    assert "slow8 vs fast8" in md and "| not attributed |" in md


def test_optional_tables_rendered() -> None:
    run = sections(render_html(synthetic_model()))["run-1"]
    assert "NVIDIA A100-SXM4-80GB" in run and "2.21.5" in run and "12040" in run
    assert "8 of 8" in run and "4 from cache" in run
    assert "Math precision" in run and "fp32" in run and "75.0" in run
    assert "all_reduce" in run and "100.0 MiB" in run and "9.8" in run and "600.0 GB/s" in run
    assert "Recompiles" in run and "--bf16, --compile" in run
    assert "Compile (ms) 4,500.00" in run  # *_us facts are shown in ms
    assert "Collective wait (ms)" in run and "Data loader (% of window)" in run
    assert "Main dtype fp32" in run and "Fp32 share (%) 75.0" in run
    assert "Matrix-math kernel time, all counted steps and ranks (ms) 1,200.00" in run
    assert "Mfu" not in run  # unknown facts are left out
    assert "Effective (global) batch 256" in run


def test_warnings_in_data_quality_section() -> None:
    dq = sections(render_html(synthetic_model()))["data-quality"]
    assert "1 file could not be read, 1 read only in part" in dq
    assert "rank9.json" in dq and "not a Kineto trace" in dq
    assert "rank7.json.gz" in dq and "truncated JSON: read 812 of 1024 events" in dq
    assert dq.index("not a Kineto trace") < dq.index("truncated JSON") < dq.index("rank 2 has 2 trace files")
    md = render_markdown(synthetic_model())
    assert "- error: rank9.json: not a Kineto trace" in md
    assert "- partial: rank7.json.gz: truncated JSON" in md


def test_healthy_model_says_so() -> None:
    model = synthetic_model()
    model.update(findings=[], verdict="No significant slowdown found")
    model.pop("comparison")
    doc = render_html(model)
    s = sections(doc)
    assert "No significant slowdown found" in s["top"]
    assert "No significant slowdown found." in s["findings"]
    assert "comparison" not in s
    assert 'class="verdict healthy"' in doc


# ---------------------------------------------------------------------------------------------------------
# Safety and size

def _inject(model: dict) -> dict:
    m = copy.deepcopy(model)
    for run in m["runs"]:
        run["top_kernels"][0]["name"] = XSS
        run["name"] = XSS
        run["path"] = f"/tmp/{XSS}"
        run["files"][0]["path"] = f"/tmp/{XSS}.json"
        run["gpu_model"] = XSS
        run["ranks"][0]["rank"] = XSS  # even a non-integer rank is text, not markup
        if run.get("collectives"):
            run["collectives"][0]["collective"] = XSS
    for f in m.get("findings", []):
        f["title"] = f["recommendation"] = XSS
        f["evidence"] = [XSS]
    m["verdict"] = XSS
    m["warnings"].append({"file": f"/tmp/{XSS}", "message": XSS, "level": "error", "run": XSS})
    if m.get("comparison"):
        m["comparison"]["parts"][0]["part"] = XSS
        m["comparison"]["config_diffs"][0]["subject"] = XSS
    return m


def test_trace_strings_are_escaped_everywhere() -> None:
    doc = render_html(_inject(synthetic_model()))
    assert "<script" not in doc
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in doc
    assert "&#34;quotes&#34; &amp; amp" in doc or "&quot;quotes&quot; &amp; amp" in doc
    assert_self_contained(doc)
    md = render_markdown(_inject(synthetic_model()))
    assert "<script" not in md and "&lt;script>alert(1)&lt;/script>" in md  # "<" as "&lt;": no raw HTML


def test_chart_labels_escaped(straggler_model: dict) -> None:
    m = copy.deepcopy(straggler_model)
    m["runs"][0]["ranks"][1]["rank"] = XSS
    for s in m["runs"][0]["steps"]:
        if s["rank"] == 1:
            s["rank"] = XSS
    doc = render_html(m)
    assert "<script" not in doc
    svgs = re.findall(r"<svg.*?</svg>", doc, re.S)
    assert any("rank &lt;script&gt;alert(1)&lt;/script&gt;" in s for s in svgs)


def test_real_kernel_name_escaped(trace_filter_model: dict) -> None:
    m = copy.deepcopy(trace_filter_model)
    m["runs"][0]["top_kernels"][1]["name"] = "void k<" + XSS + ">(" + "x" * 2000 + ")"
    doc = render_html(m)
    assert "<script" not in doc
    assert "&lt;script&gt;" in doc  # in the title attribute with the full name
    assert_self_contained(doc)


def test_eight_rank_report_is_small_and_bounded() -> None:
    model = synthetic_model(n_ranks=8, n_steps=500)
    model["runs"][0]["top_kernels"] = [{**model["runs"][0]["top_kernels"][1], "name": LONG_KERNEL + str(i)}
                                       for i in range(50)]
    doc = render_html(model)
    assert len(doc.encode()) < 2_000_000
    assert_self_contained(doc)
    run = sections(doc)["run-1"]
    assert f"first {report_model.MAX_STEP_ROWS} of 500 steps shown" in run
    md = render_markdown(model)
    assert len(md.splitlines()) < 60


def test_many_ranks_bounded() -> None:
    doc = render_html(synthetic_model(n_ranks=200, n_steps=3))
    run = sections(doc)["run-1"]
    assert f"{charts.MAX_BARS} of 200 ranks drawn, the marked and outlying ones first" in run
    assert "max and median cover all ranks" in run
    assert "199" in run  # the table lists every rank
    assert len(render_markdown(synthetic_model(n_ranks=200, n_steps=3)).splitlines()) < 80


def test_missing_and_null_optional_keys() -> None:
    bare = {"runs": [{"name": "r", "ranks": [{"rank": 0, "idle_pct": None}], "steps": None, "top_kernels": None,
                      "world_size": None, "mode": None, "files": None}], "warnings": None}
    for model in (bare, {}, {"runs": None, "findings": None, "comparison": None, "verdict": None}):
        doc = render_html(model)
        assert doc.startswith("<!doctype html>") and doc.rstrip().endswith("</html>")
        assert_self_contained(doc)
        assert "## traceanalyze" in render_markdown(model)
    model = synthetic_model()
    for k in ("impact_pct", "severity", "cause", "evidence", "ranks"):
        model["findings"][0][k] = None
    model["comparison"]["parts"][0].update(subject_us=None, delta_us=None)
    model["runs"][0]["ranks"][0] = {"rank": 0}
    assert "Rank 3 is a straggler" in render_html(model)


def test_short_name() -> None:
    assert fmt.short_name("aten::mm") == "aten::mm"
    s = fmt.short_name(LONG_KERNEL)
    assert s == "at::native::{anon}::cutlass_kernel<…>(…)"
    assert len(fmt.short_name("x" * 5000)) == fmt.NAME_CHARS
    assert fmt.ranges([2, 3, 4, 7, 9, 10]) == "2–4, 7, 9–10"
    assert fmt.fmt_ms(615120.0) == "615.12" and fmt.fmt_ms(None) == "—" and fmt.fmt_ms(float("nan")) == "—"


# ---------------------------------------------------------------------------------------------------------
# Compiled templates kept on disk (Jinja2 bytecode cache)

def _fresh_env(monkeypatch: pytest.MonkeyPatch, cache_home: Path | str) -> object:
    """What a new process gets: an environment whose cache folder comes from XDG_CACHE_HOME, used by html()."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    env = report_html._new_env()
    monkeypatch.setattr(report_html, "_env_made", env)
    return env


def _no_compile(*_a: object, **_k: object) -> None:
    raise AssertionError("template compiled although the cache holds it")


def test_compiled_templates_cached_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jinja2

    model = synthetic_model()
    _fresh_env(monkeypatch, tmp_path / "xdg")
    folder = tmp_path / "xdg" / "traceanalyze" / f"jinja-{jinja2.__version__}"
    assert not folder.exists()  # made on demand
    expected = render_html(model)
    entries = sorted(folder.glob("*.cache"))
    assert len(entries) == 7  # report.html.j2, the macros and chart partials it imports, _whatif.html.j2 and the CSS
    assert all(e.stat().st_size > 0 for e in entries) and not list(folder.glob("*.tmp"))
    assert report_html.environment() is report_html._env_made  # what the batch index uses is the same environment

    # A second process: the code is loaded from the folder, nothing is compiled, the HTML is the same.
    env = _fresh_env(monkeypatch, tmp_path / "xdg")
    env.compile = _no_compile
    assert render_html(model) == expected
    assert sorted(folder.glob("*.cache")) == entries

    # A damaged entry is compiled again and replaced, without an error.
    for e in entries:
        e.write_bytes(e.read_bytes()[:40])
    _fresh_env(monkeypatch, tmp_path / "xdg")
    assert render_html(model) == expected
    env = _fresh_env(monkeypatch, tmp_path / "xdg")
    env.compile = _no_compile
    assert render_html(model) == expected


@pytest.mark.parametrize("where", ["file", "read-only"])
def test_unusable_template_cache_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    model = synthetic_model()
    _fresh_env(monkeypatch, tmp_path / "ok")
    expected = render_html(model)
    if where == "file":  # XDG_CACHE_HOME names a file: the folder can be neither made nor read
        home = tmp_path / "not-a-folder"
        home.write_text("x")
    else:  # a read-only cache home (as root, the mode is not enforced; the report must come out either way)
        home = tmp_path / "ro"
        home.mkdir()
        home.chmod(0o500)
    try:
        for _ in range(2):
            _fresh_env(monkeypatch, home)
            assert render_html(model) == expected
    finally:
        if where == "read-only":
            home.chmod(0o700)
    if where == "file":
        assert home.read_text() == "x"


def test_template_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jinja2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert report_html._template_cache_dir() == str(tmp_path / "xdg" / "traceanalyze" / f"jinja-{jinja2.__version__}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset in ("", "relative/cache"):  # unset or relative: ~/.cache, as the XDG spec says
        monkeypatch.setenv("XDG_CACHE_HOME", unset)
        assert report_html._template_cache_dir() == str(tmp_path / "home" / ".cache" / "traceanalyze"
                                                   / f"jinja-{jinja2.__version__}")


def test_template_cache_others_can_write_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = synthetic_model()
    _fresh_env(monkeypatch, tmp_path / "xdg")
    expected = render_html(model)
    folder = Path(report_html._template_cache_dir() or "")
    entries = {e: e.read_bytes() for e in folder.glob("*.cache")}
    assert len(entries) == 7  # with the what-if partial
    folder.chmod(0o777)  # e.g. XDG_CACHE_HOME=/tmp: another user could plant code there
    try:
        env = _fresh_env(monkeypatch, tmp_path / "xdg")
        compiled: list[str] = []
        real_compile = env.compile

        def counting_compile(source: str, name: str | None = None, *a: object, **k: object) -> object:
            compiled.append(str(name))
            return real_compile(source, name, *a, **k)

        env.compile = counting_compile
        for e in entries:
            e.write_bytes(b"planted")
        assert render_html(model) == expected
        assert sorted(compiled) == ["_charts.html.j2", "_heatmap.html.j2", "_timeline.html.j2", "_whatif.html.j2",
                                    "macros.html.j2", "report.css", "report.html.j2"]
        assert all(e.read_bytes() == b"planted" for e in entries)  # nor is anything written there
    finally:
        folder.chmod(0o700)
