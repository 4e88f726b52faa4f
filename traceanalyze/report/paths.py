"""No absolute path on the page unless asked (``--show-paths``, :attr:`traceanalyze.options.Options.show_paths`).

A report goes into tickets and chats: the folders above the inputs (``/home/<user>/...``, a cluster's mount points)
are nobody's business there. :func:`page_model` gives the model the HTML, Markdown and JSON reports render: every
path under an input folder shown from that folder's name (``/scratch/u/runs/runA/rank0.json`` as
``runA/rank0.json``), any other path in a path field by its file name. The report model itself (the API's
``model``, the report cache, the terminal's lines) keeps the absolute paths.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path, PurePath
from typing import Any


def _roots(model: dict, inputs: Iterable[str | Path]) -> list[str]:
    """The folders paths are shown from: the inputs given (a file's folder) and every run's folder, as given and
    resolved, the outer ones first (a run folder inside an input folder keeps the input's name in front)."""
    out = set()
    for p in list(inputs) + [r.get("path") for r in model.get("runs") or [] if isinstance(r, dict)]:
        if not isinstance(p, (str, PurePath)) or not str(p):
            continue
        for q in {Path(p).absolute(), Path(p).resolve()}:
            q = q.parent if q.is_file() else q
            if q.name and q.parent != q:  # never "/" itself
                out.add(str(q))
    return sorted(out, key=lambda s: (len(s), s))


def _shorten(s: str, subs: list[tuple[re.Pattern, str]]) -> str:
    for pat, repl in subs:
        if pat.search(s):
            s = pat.sub(repl, s)
    return s


_PATH_FIELDS = {"path", "file", "files"}  # keys whose values are paths: shown by name when under no input
_LEAVES = frozenset({int, float, bool, type(None)})  # exact types page_model returns unchanged (no subclass)


def page_model(model: dict, inputs: Iterable[str | Path] = (), show_paths: bool = False) -> dict:
    """The model the pages render: ``model`` itself with ``show_paths``, else a copy with every absolute path under
    an input folder (``inputs``, or a run's ``path``) shown from the folder's name and any other absolute path in a
    path field (``path``, ``file``, ``files``) by its file name."""
    if show_paths:
        return model
    roots = _roots(model, inputs)
    # outer roots first; each replacement keeps the root's own name, so an inner root no longer matches after it
    subs = [(re.compile(r"(?<![\w.-])" + re.escape(r) + r"(?=/|$|[^\w.-])"), Path(r).name) for r in roots]

    def fix(v: Any, key: str | None) -> Any:
        if isinstance(v, str):
            s = _shorten(v, subs)
            return PurePath(s).name if key in _PATH_FIELDS and s.startswith("/") else s
        # numbers and None (most of a model's leaves) kept as they are without a call each: ~3x faster at 256 ranks
        if isinstance(v, dict):
            return {k: x if type(x) in _LEAVES else fix(x, k) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [x if type(x) in _LEAVES else fix(x, key) for x in v]
        return v

    return fix(model, None)
