"""Plain text formatting shared by several stages: numbers as display text, kernel names shortened, rank lists as
ranges.

Used by :mod:`traceanalyze.diagnose` (finding evidence), :mod:`traceanalyze.pipeline` (warnings, the JSON's
``missing_ranks``), :mod:`traceanalyze.cli` (the terminal summary) and :mod:`traceanalyze.report` (the HTML filters
and the Markdown summary). A leaf: it imports nothing of the project.

The number formatters tolerate None, NaN, infinities and non-numbers: they print an em dash.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import PurePath
from typing import Any

NAME_CHARS = 90  # a kernel/op name is cut at this many characters for display


# ---------------------------------------------------------------------------------------------------------
# Numbers

def finite(x: Any) -> float | None:
    """``x`` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def fmt_ms(us: Any) -> str:
    """Microseconds as milliseconds, 2 decimals (``123456.7`` → ``123.46``)."""
    v = finite(us)
    if v is None:
        return "—"
    ms = v / 1e3
    if ms != 0 and abs(ms) < 0.005:
        return "<0.01" if ms > 0 else "−<0.01"
    return f"{ms:,.2f}"


def fmt_signed_ms(us: Any) -> str:
    """Microseconds as milliseconds with a sign (``+1.50``, ``−0.25``, ``0.00``)."""
    v = finite(us)
    if v is None:
        return "—"
    s = fmt_ms(abs(v))
    return ("+" if v > 0 else "−" if v < 0 else "") + s


def fmt_pct(x: Any, digits: int = 2) -> str:
    """A percentage (already in %) with ``digits`` decimals, no sign."""
    v = finite(x)
    return "—" if v is None else f"{v:.{digits}f}"


def fmt_int(x: Any) -> str:
    """A count, rounded, with thousands separators."""
    v = finite(x)
    return "—" if v is None else f"{int(round(v)):,}"


def fmt_float(x: Any, digits: int = 1) -> str:
    """A number with ``digits`` decimals and thousands separators."""
    v = finite(x)
    return "—" if v is None else f"{v:,.{digits}f}"


def fmt_gbps(x: Any) -> str:
    """Bandwidth in GB/s: 3 significant digits below 10 (``0.125``), 1 decimal above."""
    v = finite(x)
    if v is None:
        return "—"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}"


def fmt_bytes(x: Any) -> str:
    """A byte count in B, KiB, MiB or GiB (``1536`` → ``1.5 KiB``)."""
    v = finite(x)
    if v is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1024
    return f"{v:,.1f} TiB"  # pragma: no cover


def text(x: Any) -> str:
    """Any model value as display text (None → em dash)."""
    if x is None or x == "":
        return "—"
    if isinstance(x, float):
        return fmt_float(x, 2)
    return str(x)


# ---------------------------------------------------------------------------------------------------------
# Paths and names

def basename(p: Any) -> str:
    """A file's name without its folders (None or empty → em dash)."""
    if not p:
        return "—"
    s = str(p)
    return PurePath(s).name or s


def where(p: Any) -> str:
    """A file as ``folder/name`` (its parent folder and name), so a skipped file says where it is."""
    if not p:
        return "—"
    parts = PurePath(str(p)).parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else str(p)


def short_name(name: Any, limit: int = NAME_CHARS) -> str:
    """A kernel/op name shortened for display: C++ template arguments and parameter lists folded to ``…``.

    ``void foo<c10::Half, float, 2ul>(at::Tensor, long)`` → ``foo<…>(…)``; the result is cut at ``limit``.
    """
    if name is None:
        return "—"
    s = str(name).strip()
    if len(s) > 40:
        s = re.sub(r"^void\s+", "", s).replace("(anonymous namespace)", "{anon}")
        s = _fold(s, "<", ">")
        s = _fold(s, "(", ")")
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return s


def _fold(s: str, open_: str, close: str) -> str:
    """Replace the content of every top-level ``open_ ... close`` group with an ellipsis."""
    out, depth = [], 0
    for ch in s:
        if ch == open_:
            if depth == 0:
                out.append(open_ + "…")
            depth += 1
        elif ch == close and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(close)
        elif depth == 0:
            out.append(ch)
    if depth > 0:
        out.append(close)
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------
# Ranks

def rank_spans(ranks: Iterable[int]) -> list[list[int]]:
    """Ranks, sorted, as inclusive ``[first, last]`` spans of consecutive ranks: [3, 4, 5, 9] → [[3, 5], [9, 9]].

    The JSON's ``missing_ranks``: bounded by the gaps, not by the ranks.
    """
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return spans


def ranges(xs: Iterable[Any]) -> str:
    """[5, 6, 7, 9] → ``5–7, 9``; inclusive ``[first, last]`` spans ([[5, 7], [9, 9]], the JSON's
    ``missing_ranks``) give the same text. Values that are not ints are left out."""
    xs = list(xs)
    if xs and all(isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) for v in x) for x in xs):
        return _spans_text(sorted(xs))
    return _spans_text(rank_spans({int(x) for x in xs if isinstance(x, int) and not isinstance(x, bool)}))


def _spans_text(spans: Iterable[list[int]]) -> str:
    return ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in spans)
