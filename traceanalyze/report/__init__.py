"""Report: the report model (a dict, see ``docs/schema.md``) as one self-contained HTML file and as Markdown, and the
batch index page. It renders dicts: it never imports the stages that make them (metrics, replay, ingest, store).

The HTML report is what an ML engineer attaches to a bug ticket, so it must open anywhere, offline, and be safe
to open: one file, inline CSS, inline SVG charts, **no** ``<script>``, and no URL that makes a network request
(no external stylesheet, font or image). Every string that comes from a trace (kernel and op names, file paths,
warning messages, finding text) goes through Jinja2's autoescape; ``|safe`` is never applied to model data.

Charts: the report page draws its charts (rank × step heatmaps, the median step's timeline, the per-rank
breakdown bars, step-time lines) as inline SVG from its templates, from plain coordinates that
:mod:`traceanalyze.report.charts` computes: no chart library, no script, every label autoescaped; the batch index
draws its two charts the same way. (pygal, used before, needed its scripts, links and tooltips stripped from every
chart.) An 8-rank run with 500 profiler steps (and a baseline of the same size) renders to about 240 kB.

The output is deterministic for a given model (stable chart ids), so two reports can be diffed.

Modules: :mod:`.model` (the view model derived from the report dict), :mod:`.html` (the Jinja2 environment and
the HTML report), :mod:`.markdown` (the Markdown summary), :mod:`.charts` (chart coordinates), :mod:`.replay`
(the what-if replay's view and Markdown), :mod:`.batch_index` (the batch index page); templates in
``templates/``.
"""

from typing import Any

from traceanalyze.report.html import render_html
from traceanalyze.report.markdown import render_markdown

__all__ = ["render_batch_index", "render_html", "render_markdown"]


def __getattr__(name: str) -> Any:
    """``render_batch_index`` on first use: a report renders no batch index."""
    if name == "render_batch_index":
        from traceanalyze.report.batch_index import render_batch_index

        return render_batch_index
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
