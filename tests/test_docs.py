"""The README leads and the manual in docs/ holds the rest: the README is short and holds CI's two commands
verbatim, every relative link and anchor in README.md and docs/*.md resolves, every docs page is linked from the
README, and the manual documents every CLI flag (docs/options.md), every exit status (docs/options.md) and every
finding kind (docs/findings.md)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from traceanalyze.cli import cli
from traceanalyze.findings import KINDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _outside_code(text: str) -> str:
    """The text without fenced code blocks (links inside them are examples, not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", _outside_code(_text(path)), re.MULTILINE)}


def test_readme_is_short_and_shows_report_first():
    lines = _text(README).splitlines()
    assert len(lines) <= 250
    assert any("traceanalyze report" in line for line in lines[:30])
    assert "![report](docs/report.png)" in _text(README)


def test_readme_holds_the_two_commands_ci_runs():
    ci = _text(ROOT / ".ci" / "run").splitlines()
    commands = [ci[i + 1].strip() for i, line in enumerate(ci) if "README command" in line and "echo" in line]
    assert len(commands) == 2
    readme = _text(README)
    for command in commands:
        assert command.replace("pip install -q ", "pip install ") in readme, command  # CI quiets pip


def test_every_relative_link_and_anchor_resolves():
    pages = [README, *sorted(DOCS.glob("*.md"))]
    for page in pages:
        for m in re.finditer(r"\]\(([^)\s]+)\)", _outside_code(_text(page))):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: {target}"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest), f"{page.name}: {target}"


def test_readme_links_every_docs_page():
    readme = _text(README)
    for page in sorted(DOCS.glob("*.md")):
        assert f"](docs/{page.name})" in readme, page.name


def test_docs_every_page_leads_with_a_command_or_an_example():
    for page in sorted(DOCS.glob("*.md")):
        if page.name in ("hta_reference.md", "kernel_names.md", "confidence.md", "replay.md"):
            continue  # reference pages written before the manual moved here
        first = [b for b in _text(page).split("\n\n") if b.strip()][1]  # the block after the title
        assert first.startswith(("```", "|")), page.name


def test_options_page_documents_every_flag():
    text = _text(DOCS / "options.md")
    assert "--debug" in text and "--version" in text
    for name, command in cli.commands.items():
        assert f"`{name}`" in text
        for param in command.params:
            if isinstance(param, click.Option):
                for opt in param.opts:
                    if opt.startswith("--") and opt != "--help":
                        assert opt in text, f"{name} {opt}"


def test_findings_page_documents_every_kind():
    text = _text(DOCS / "findings.md")
    for kind in KINDS:
        assert f"`{kind}`" in text, kind
