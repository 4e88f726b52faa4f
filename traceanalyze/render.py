"""Render: the report model (a dict, see docs/schema.md) into one self-contained HTML file and Markdown."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, select_autoescape

_env = Environment(loader=PackageLoader("traceanalyze", "templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))


def html(model: dict) -> str:
    """The HTML report: one file, inline CSS and SVG, no scripts or network requests."""
    return _env.get_template("report.html.j2").render(m=model)


def markdown(model: dict) -> str:
    """A short Markdown summary for a bug ticket."""
    lines = ["# traceanalyze report", ""]
    for run in model["runs"]:
        lines.append(f"## {run['name']} ({run['mode']}, world size {run['world_size']})")
        lines.append("| rank | idle % | compute % | non-compute % | overlap % |")
        lines.append("|---|---|---|---|---|")
        for r in run["ranks"]:
            lines.append(f"| {r['rank']} | {r['idle_pct']:.2f} | {r['compute_pct']:.2f} | "
                         f"{r['non_compute_pct']:.2f} | {r['comm_comp_overlap_pct']:.2f} |")
    return "\n".join(lines) + "\n"
