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


def fmt_flop(x: Any) -> str:
    """A FLOP count readably, in decimal units with about 3 significant digits: ``1.87 TFLOP``, ``82.9 GFLOP``,
    ``512 FLOP``; "—" when unknown."""
    v = finite(x)
    if v is None:
        return "—"
    unit, scale = next(((u, s) for u, s in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6),
                                            ("kFLOP", 1e3)) if abs(v) >= s), ("FLOP", 1.0))
    x = v / scale
    return f"{x:,.{2 if abs(x) < 10 else 1 if abs(x) < 100 else 0}f} {unit}"


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


KERNEL_NAME_CHARS = NAME_CHARS  # the short kernel name's bound (characters)
_KERNEL_INPUT_CHARS = 4000  # a longer (hostile) name is read up to here only: the work stays linear and small
_OPEN, _CLOSE = "<([{", ">)]}"
# template arguments every instance of a kernel family carries alike: they tell no two rows apart
_NOISE_ARG = re.compile(r"^(?:array<char\*|Array<char\*|\w*OffsetCalculator<|\w*WithCast<|identity_decomposer_t$|"
                        r"vsmem_t$|VSMemHelper$|use_default$)")
# a plain type argument (``float``, ``unsigned int``, ``BFloat16 const*``): dropped beside a functor argument
_TYPE_ARG = re.compile(r"^(?:(?:unsigned|signed|long|short|const|volatile)\s+)*(?:float|double|int|long|bool|char|"
                       r"short|half|Half|BFloat16|Float8\w*|u?int\d+_t|size_t)(?:\s*(?:const|\*|&))*$")
# a value: a number (4, 2ul, 0x10), a bool, a cast value ((SortOrder)0)
_LITERAL = re.compile(r"^(?:-?(?:0x[0-9a-fA-F]+|\d+)[uUlL]*|true|false|\(.*)$")
_ENCLOSING = re.compile(r"([A-Za-z_]\w*)(?=(?:<|\(|::operator\(\)))")


def _depth_scan(s: str):
    """(index, character, depth before it) of each character of ``s``; depth counts ``<([{`` pairs (a ``>`` that
    closes nothing, as in ``operator->``, is read as text)."""
    depth = 0
    for i, ch in enumerate(s):
        if ch in _OPEN:
            yield i, ch, depth
            depth += 1
        elif ch in _CLOSE and depth > 0:
            depth -= 1
            yield i, ch, depth
        else:
            yield i, ch, depth


def _split_args(s: str) -> list[str]:
    """``s`` split at its top-level commas."""
    out, start = [], 0
    for i, ch, d in _depth_scan(s):
        if ch == "," and d == 0:
            out.append(s[start:i])
            start = i + 1
    out.append(s[start:])
    return [a.strip() for a in out if a.strip()]


def _first_top(s: str, chars: str) -> int:
    """Index of the first top-level character of ``chars`` in ``s`` (an opening bracket counts at its own
    level), or -1."""
    for i, ch, d in _depth_scan(s):
        if d == 0 and ch in chars:
            return i
    return -1


def _matching(s: str, i: int) -> int:
    """Index of the bracket closing the one at ``i`` (``len(s)`` when it never closes)."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in _OPEN:
            depth += 1
        elif s[j] in _CLOSE:
            depth -= 1
            if depth == 0:
                return j
    return len(s)


def _last_component(s: str) -> str:
    """``a::b<x::y>::c`` → ``c`` for a top-level qualified name, keeping a component that carries template
    arguments: ``policy_hub<…>::Policy1000`` stays whole after its namespaces."""
    parts, start = [], 0
    for i, ch, d in _depth_scan(s):
        if d == 0 and ch == ":" and s[i:i + 2] == "::":
            parts.append(s[start:i])
            start = i + 2
    parts.append(s[start:])
    parts = [p for p in parts if p and p != ":"]
    if not parts:
        return s
    keep = len(parts) - 1
    while keep > 0 and "<" in parts[keep - 1]:  # a templated class owns the next component: keep them together
        keep -= 1
    return "::".join(parts[keep:])


def _simplify(a: str, depth: int, max_depth: int) -> str:
    """One template argument (or the kernel itself) shortened: namespaces dropped, parameter lists dropped, a lambda
    named by its enclosing function, noise arguments left out, plain types left out beside a functor, and template
    arguments deeper than ``max_depth`` folded to ``…``."""
    a = a.strip().replace("(anonymous namespace)::", "")
    if "{lambda" in a and _first_top(a, "{") >= 0:  # a lambda's type: the function that defines it says what it does
        m = next((m for m in _ENCLOSING.finditer(a) if m.group(1) not in ("operator", "lambda", "const")), None)
        if m is not None:
            start = m.start(1)
            while start >= 2 and a[start - 2:start] == "::":  # back to the qualified name's start
                k = start - 2
                while k > 0 and (a[k - 1].isalnum() or a[k - 1] == "_"):
                    k -= 1
                start = k
            name = a[start:]
            lt = _first_top(name, "<(")
            name = name[:_matching(name, lt) + 1] if lt >= 0 and name[lt] == "<" else name[:lt] if lt >= 0 else name
            if name != a:
                return _simplify(name, depth, max_depth)
    if a.startswith("("):  # a cast value, (at::native::ADAM_MODE)1
        end = _matching(a, 0)
        return f"({_last_component(a[1:end])}){a[end + 1:].strip()}"
    p = _first_top(a, "(")
    if p > 0:
        a = a[:p]  # a parameter list
    lt = _first_top(a, "<")
    if lt < 0:
        return _last_component(a)
    gt = _matching(a, lt)
    base, inner, rest = a[:lt], a[lt + 1:gt], a[gt + 1:]
    rest = re.sub(r"^(::\w+)?.*$", r"\1", rest.strip())  # ::Policy1000 kept; ::Params, const&, * not
    if depth + 1 > max_depth:
        return f"{_last_component(base)}<…>{rest}"
    args = [_simplify(x, depth + 1, max_depth) for x in _split_args(inner)]
    args = [x for x in args if not _NOISE_ARG.match(x)]
    if any(_LITERAL.match(x) is None and not _TYPE_ARG.match(x) for x in args):  # a functor beside plain types
        args = [x for x in args if not _TYPE_ARG.match(x)] or args
    runs: list[list] = []  # a run of one argument repeated 3 times or more is written once: float×4
    for x in args:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    args = [x for r in runs for x in ([f"{r[0]}×{r[1]}"] if r[1] >= 3 else [r[0]] * r[1])]
    return f"{_last_component(base)}<{', '.join(args)}>{rest}"


def short_kernel_name(name: Any, limit: int = KERNEL_NAME_CHARS) -> str:
    """A short name that tells a kernel apart from its siblings, at most ``limit`` characters.

    The kernel's own name without namespaces, return type or parameter list, with its template arguments made
    short: each argument's namespaces dropped, a lambda named by the function that defines it, arguments every
    instance carries alike (``std::array<char*, 3ul>``, offset calculators) left out, an argument repeated three
    times or more written once (``float×4``), and plain types left out beside a functor
    (``AUnaryFunctor<float, float, float, MulFunctor<float>>`` → ``AUnaryFunctor<MulFunctor<float>>``). Nested
    template arguments are folded to ``…`` from the deepest level up until the name fits; then it is cut.

    ``void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(
    int, at::native::FillFunctor<float>, std::array<char*, 1ul>)`` →
    ``vectorized_elementwise_kernel<4, FillFunctor<float>>``.
    A name without template arguments or parameters (``aten::mm``, ``nvjet_sm90_tst_…``, ``triton_poi_fused_…``) is
    kept as it is, cut at ``limit``. None → ``—``.
    """
    if name is None:
        return "—"
    s = str(name).strip()
    if "<" in s or "(" in s:
        raw = s[:_KERNEL_INPUT_CHARS]
        raw = re.sub(r"^void\s+", "", raw)
        raw = raw.replace("(anonymous namespace)::", "")
        for max_depth in (6, 4, 3, 2, 1):
            out = _simplify(raw, 0, max_depth)
            if len(out) <= limit:
                break
        s = out or s
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return s


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
