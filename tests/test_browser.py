"""The rendered report in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright.

Opens the straggler sample's report from a file:// URL with the network left on and checks that the page logs
no console error, requests nothing but itself, and shows the verdict and the per-rank chart (an inline SVG).
Saves the top of the page to ``docs/report.png`` (the README shows it). Skipped when Playwright's Python
package or a Chromium binary is missing; Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, sample
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.report import render_html

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--headless", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
SCREENSHOT = ROOT / "docs" / "report.png"


def _chromium() -> str:
    for c in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if c and Path(c).exists():
            return c
    pytest.skip("no chromium binary (apt-get install chromium)")


def test_report_opens_offline_without_errors(tmp_path, monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    exe = _chromium()
    sample("straggler")
    monkeypatch.chdir(ROOT)  # a relative input: the page (and so the screenshot) holds no machine path
    a = analyze("sample_traces/straggler", Options(jobs=1))
    a.model["generated_at"] = "2026-11-22T00:00:00+00:00"  # a stable screenshot
    page_path = tmp_path / "report.html"
    page_path.write_text(render_html(a.model), encoding="utf-8")
    url = page_path.as_uri()

    console_errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        except Exception as exc:  # a chromium that cannot start here (missing libraries): not the report's fault
            pytest.skip(f"chromium did not start: {str(exc).splitlines()[0]}")
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: console_errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url, wait_until="load")
            page.wait_for_load_state("networkidle")

            verdict = page.locator("#verdict")
            assert verdict.is_visible()
            assert "rank 2" in verdict.inner_text().lower()  # the straggler sample's verdict names the slow rank
            chart = page.locator("svg[id^='ta-breakdown']").first
            assert chart.is_visible()
            box = chart.bounding_box()
            assert box and box["width"] > 300 and box["height"] > 100
            assert page.locator("svg[id^='ta-breakdown'] rect").count() >= 4  # bars for the 4 ranks
            assert page.locator("script").count() == 0
            # the top of the report down to the per-rank chart: verdict, findings, run facts, breakdown
            png = page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": 1280,
                                                        "height": box["y"] + box["height"] + 58})
        finally:
            browser.close()
    assert console_errors == []
    assert requests == [url]  # the file itself, nothing else: no font, stylesheet, image or script
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    if not SCREENSHOT.exists() or SCREENSHOT.read_bytes() != png:
        SCREENSHOT.write_bytes(png)


def test_committed_reports_show_confidence_on_top_and_a_time_axis(tmp_path):
    """The example pages in reports/ (issue 31's screenshot check): in a 1280 x 900 window, the verdict's confidence
    level and what it rests on are visible without scrolling; every replay lanes chart has a time axis in ms with at
    least two labelled ticks, and its lanes are not slivers."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    exe = _chromium()
    pages = sorted((ROOT / "reports").glob("*.html"))
    assert len(pages) >= 10
    with sync_api.sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        except Exception as exc:
            pytest.skip(f"chromium did not start: {str(exc).splitlines()[0]}")
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            n_axes = 0
            for p in pages:
                page.goto(p.as_uri(), wait_until="load")
                conf = page.locator("#confidence")
                assert conf.is_visible(), p.name
                box = conf.bounding_box()
                assert box and box["y"] + box["height"] <= 900, p.name  # on the first screen
                text = conf.inner_text()
                # the badge is upper-cased by the stylesheet
                assert text.split("·")[0].strip().lower() in ("confidence: high", "confidence: medium",
                                                              "confidence: low"), text
                assert " ranks" in text or " rank;" in text or " rank " in text, text  # "From N steps × k of N ranks"
                for svg in page.locator("svg.whatif-lanes").all():
                    n_axes += 1
                    labels = [(t or "").strip() for t in svg.locator("g.time-axis text").all_text_contents()]
                    ticks = sum(x.replace(".", "", 1).isdigit() for x in labels)
                    assert "ms" in labels and ticks >= 2, (p.name, labels)
                    b = svg.bounding_box()
                    assert b and b["height"] >= 80, p.name  # a 1-rank chart is not a sliver
                if p.name == "straggler.html":
                    png = page.screenshot(clip={"x": 0, "y": 0, "width": 1280, "height": box["y"] + box["height"] + 8})
                    (tmp_path / "top.png").write_bytes(png)
                    assert png[:8] == b"\x89PNG\r\n\x1a\n"
            assert n_axes >= 5
        finally:
            browser.close()
