"""Render: the report model (a dict, see ``docs/schema.md``) into one self-contained HTML file and Markdown.

The HTML report is what an ML engineer attaches to a bug ticket, so it must open anywhere, offline, and be safe
to open: one file, inline CSS, inline SVG charts, **no** ``<script>``, and no URL that makes a network request
(no external stylesheet, font or image). Every string that comes from a trace (kernel and op names, file paths,
warning messages, finding text) goes through Jinja2's autoescape; ``|safe`` is never applied to model data.

Charts: the report page draws its charts (rank × step heatmaps, the median step's timeline, the per-rank
breakdown bars, step-time lines) as inline SVG from its templates, from plain coordinates that
:mod:`traceanalyze.charts` computes: no chart library, no script, every label autoescaped; the batch index draws
its two charts the same way. (pygal, used before, needed its scripts, links and tooltips stripped from every chart.)

Bounded output: per-step tables show at most :data:`MAX_STEP_ROWS` steps × :data:`MAX_STEP_COLS` ranks, per-rank
tables show the ranks findings name and the outliers first and fold the rest, the charts' bounds are in
:mod:`traceanalyze.charts` (heatmap cells group ranks beyond 128 rows, 32 timeline lanes, 12 bars, 16 lines), and
the file list shows up to :data:`MAX_FILE_ROWS` files; every cut is stated next to the table or chart. An 8-rank
run with 500 profiler steps (and a baseline of the same size) renders to about 240 kB.

The output is deterministic for a given model (stable chart ids), so two reports can be diffed.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterable
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from traceanalyze.replay.view import replay_markdown, replay_view

if TYPE_CHECKING:  # imported where used: the Markdown summary and the JSON output need no Jinja2
    import jinja2

MAX_STEP_ROWS = 40
MAX_STEP_COLS = 16
MAX_FILE_ROWS = 256
NAME_CHARS = 90
SLOW_STEP_FRAC = 0.05  # a rank's step is marked slow when it is this much above the step's median across ranks
OUTLIER_POINTS = 15.0  # a rank whose compute % or idle % is this many points off the run's median is flagged

CAUSES = ("interconnect", "precision", "imbalance", "config")
CAUSE_COLORS = {"interconnect": "#6741d9", "precision": "#0c8599", "imbalance": "#e8590c", "config": "#5c940d",
                "other": "#495057"}
CAUSE_LABELS = {"interconnect": "Interconnect", "precision": "Precision", "imbalance": "Imbalance",
                "config": "Configuration", "other": "Other"}
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}
LEVEL_ORDER = {"error": 0, "partial": 1, "warning": 2, "info": 3}
BREAKDOWN_COLORS = ("#3b6fb6", "#f0a73a", "#ced4da")  # compute, non-compute, idle

MODE_TEXT = {
    "gpu": "GPU mode: the breakdown comes from the GPU kernels in each trace. Compute is time with a compute "
           "kernel running; non-compute is time with only communication (NCCL) or memory-copy kernels running; "
           "idle is time with no kernel on the GPU.",
    "cpu": "CPU mode: these traces hold no GPU kernels (CPU-only or gloo training), so the breakdown comes from "
           "the training thread's operators. Compute is time in aten:: ops; non-compute is c10d::/gloo: "
           "communication not hidden under them; idle is time the training thread ran no op.",
}

DEFINITIONS = [
    ("Trace window", "From the first to the last kernel (GPU mode) or over the profiler steps (CPU mode), per "
                     "rank. When a trace holds two or more profiler steps, the last one is left out (it often "
                     "holds the profiler's own teardown), as Holistic Trace Analysis does."),
    ("Idle %", "Share of the window with no kernel running (CPU mode: no op on the training thread)."),
    ("Compute %", "Share of the window with at least one compute kernel (CPU mode: aten:: op) running."),
    ("Non-compute %", "Share of the window busy with only communication or memory kernels. "
                      "Idle + compute + non-compute = 100 %."),
    ("Comm/comp overlap %", "Share of communication time during which a compute kernel also runs. High is good: "
                            "the communication is hidden."),
    ("Exposed communication", "Communication time not hidden under compute. This is what communication costs "
                              "in step time."),
    ("Step time", "A rank's: the median duration of its counted ProfilerStep#N ranges (the last, partial step of "
                  "each profiling window and steps missing on some rank are left out). The run's: the median over "
                  "those steps of the slowest rank's duration."),
    ("Impact %", "Estimated share of step time that fixing a finding would win back; findings are ranked by it."),
]


# ---------------------------------------------------------------------------------------------------------
# Formatting (all tolerate None, NaN and non-numbers: they print an em dash).

def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def fmt_ms(us: Any) -> str:
    """Microseconds as milliseconds, 2 decimals (``123456.7`` → ``123.46``)."""
    v = _num(us)
    if v is None:
        return "—"
    ms = v / 1e3
    if ms != 0 and abs(ms) < 0.005:
        return "<0.01" if ms > 0 else "−<0.01"
    return f"{ms:,.2f}"


def fmt_signed_ms(us: Any) -> str:
    v = _num(us)
    if v is None:
        return "—"
    s = fmt_ms(abs(v))
    return ("+" if v > 0 else "−" if v < 0 else "") + s


def fmt_pct(x: Any, digits: int = 2) -> str:
    v = _num(x)
    return "—" if v is None else f"{v:.{digits}f}"


def fmt_int(x: Any) -> str:
    v = _num(x)
    return "—" if v is None else f"{int(round(v)):,}"


def fmt_float(x: Any, digits: int = 1) -> str:
    v = _num(x)
    return "—" if v is None else f"{v:,.{digits}f}"


def fmt_gbps(x: Any) -> str:
    """Bandwidth in GB/s: 3 significant digits below 10 (``0.125``), 1 decimal above."""
    v = _num(x)
    if v is None:
        return "—"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}"


def fmt_bytes(x: Any) -> str:
    v = _num(x)
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


def basename(p: Any) -> str:
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


def ranges(xs: Iterable[Any]) -> str:
    """[5, 6, 7, 9] → ``5–7, 9``; inclusive ``[first, last]`` spans ([[5, 7], [9, 9]], the JSON's
    ``missing_ranks``) give the same text."""
    xs = list(xs)
    if xs and all(isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) for v in x) for x in xs):
        return ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in sorted(xs))
    vals = sorted({int(x) for x in xs if isinstance(x, int) and not isinstance(x, bool)})
    if not vals:
        return ""
    out = []
    start = prev = vals[0]
    for x in vals[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}–{prev}" if prev > start else str(start))
        if x is not None:
            start = prev = x
    return ", ".join(out)


def _median(xs: Iterable[float]) -> float:
    """The median, as :func:`statistics.median` computes it (the mean of the two middle values for an even count),
    without importing :mod:`statistics` (and with it :mod:`fractions` and :mod:`decimal`)."""
    data = sorted(xs)
    n = len(data)
    if not n:
        raise ValueError("median of no values")
    i = n // 2
    return data[i] if n % 2 else (data[i - 1] + data[i]) / 2


# ---------------------------------------------------------------------------------------------------------
# Templates: one Jinja2 environment, made on first use, whose compiled templates are kept on disk.
#
# Compiling the report templates (lexing, parsing and generating Python, then ``compile``) costs more CPU than
# rendering them, on every process start. Jinja2's bytecode cache keeps the compiled code in a per-user cache
# folder, ``$XDG_CACHE_HOME/traceanalyze/jinja-<Jinja2 version>`` (``~/.cache/...`` when XDG_CACHE_HOME is unset
# or relative), made on demand. An entry is used only when its checksum matches the template source, so an
# edited template is compiled again; the key also covers the environment options below and the template's path,
# and Jinja2 rejects entries written by another Python version. The entries are code that is run, so a folder that
# is not ours or that others can write to is not used. When the folder cannot be made, read or written (read-only
# home, permissions, a full disk, a corrupt entry), templates are compiled as before: the cache never makes a
# report fail.

_FILTERS = {"ms": fmt_ms, "signed_ms": fmt_signed_ms, "pct": fmt_pct, "int": fmt_int, "num": fmt_float,
            "bytes": fmt_bytes, "gbps": fmt_gbps, "text": text, "basename": basename, "where": where,
            "short": short_name, "ranges": ranges}
_ENV_OPTIONS = {"trim_blocks": True, "lstrip_blocks": True}  # they change the compiled code: part of the cache key
_AUTOESCAPE = {"default": True, "default_for_string": True}
_env_made: jinja2.Environment | None = None


def _template_cache_dir() -> str | None:
    """The folder for compiled templates, or None when there is no home to put it in or no Jinja2 version."""
    import jinja2

    version = vars(jinja2).get("__version__")  # vars(): never a deprecation warning, should Jinja2 add one
    if not version:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("jinja2")
        except Exception:  # no metadata: without a version, compiled code could outlive a Jinja2 upgrade
            return None
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):  # the XDG spec: a relative path is ignored
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "traceanalyze", f"jinja-{version}")


def _bytecode_cache(directory: str) -> jinja2.BytecodeCache:
    from jinja2 import FileSystemBytecodeCache

    salt = repr((sorted(_ENV_OPTIONS.items()), sorted(_AUTOESCAPE.items())))

    class _SafeBytecodeCache(FileSystemBytecodeCache):
        """:class:`jinja2.FileSystemBytecodeCache` that makes its folder on the first write and never raises:
        an entry that cannot be read is compiled again, one that cannot be written is not kept."""

        def get_cache_key(self, name: str, filename: str | None = None) -> str:
            return super().get_cache_key(f"{name}|{salt}", filename)

        def _private(self) -> bool:
            """The folder is ours and only we can write to it: entries are code that gets run, so a folder others
            could write to (XDG_CACHE_HOME pointed at /tmp) is not used, as Jinja2's own default folder is not."""
            st = os.stat(self.directory)
            mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
            return mine and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022

        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            try:
                if self._private():
                    super().load_bytecode(bucket)
            except Exception:  # no folder yet, the path names a file, a truncated entry: compile instead
                bucket.reset()

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            try:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
                if self._private():
                    super().dump_bytecode(bucket)
            except Exception:  # read-only home, permissions, full disk: compiled again next time
                pass

    return _SafeBytecodeCache(directory, "%s.cache")


def _new_env() -> jinja2.Environment:
    """A Jinja2 environment for the templates in ``traceanalyze/templates`` (autoescape on, custom filters),
    with the bytecode cache described above (its folder is read from the environment variables now)."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    directory = _template_cache_dir()
    env = Environment(loader=PackageLoader("traceanalyze", "templates"), autoescape=select_autoescape(**_AUTOESCAPE),
                      bytecode_cache=_bytecode_cache(directory) if directory else None, **_ENV_OPTIONS)
    env.filters.update(_FILTERS)
    return env


def _get_env() -> jinja2.Environment:
    global _env_made
    if _env_made is None:
        _env_made = _new_env()
    return _env_made


def __getattr__(name: str) -> Any:
    """``render._env`` (used by :mod:`traceanalyze.batch` and the tests) is made on first access."""
    if name == "_env":
        return _get_env()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------------------
# View model: everything the template shows, derived defensively from the report model.

def _list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else []


def _dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def _cause(f: dict) -> str:
    c = f.get("cause")
    return c if c in CAUSES else "other"


def _sorted_findings(model: dict) -> list[dict]:
    fs = [f for f in _list(model.get("findings")) if isinstance(f, dict)]

    def key(f: dict) -> tuple:
        imp = _num(f.get("impact_pct"))
        return (-(imp if imp is not None else -1.0), SEVERITY_ORDER.get(str(f.get("severity")), 3))

    out = []
    for f in sorted(fs, key=key):
        out.append({**f, "cause_key": _cause(f), "cause_label": CAUSE_LABELS[_cause(f)],
                    "severity_key": f.get("severity") if f.get("severity") in SEVERITY_ORDER else "low",
                    "evidence": [str(e) for e in _list(f.get("evidence"))],
                    "ranks_text": ranges(_list(f.get("ranks")))})
    return out


def _verdict(model: dict, findings: list[dict]) -> tuple[str, str]:
    """(verdict sentence, cause key for its colour)."""
    v = model.get("verdict")
    top = findings[0] if findings else None
    if isinstance(v, str) and v.strip():
        healthy = not findings or v.lower().startswith("no significant")
        return v.strip(), ("healthy" if healthy else top["cause_key"])
    if top is not None:
        return str(top.get("title") or "See the findings below."), top["cause_key"]
    return "No significant slowdown found: no diagnosis rule fired on these traces.", "healthy"


def _flags(run: dict, findings: list[dict]) -> dict[int, list[str]]:
    """Per rank, short labels that single it out: ranks named by imbalance findings, then outliers.

    An outlier is a rank whose compute % or idle % is more than ``OUTLIER_POINTS`` points (and more than three
    median absolute deviations) off the run's median; when more than a quarter of the ranks qualify, none is
    flagged (that is a spread, visible in the chart, not an odd rank).
    """
    ranks = [r for r in _list(run.get("ranks")) if isinstance(r, dict)]
    n = len(ranks)
    flags: dict[int, list[str]] = {}
    for f in findings:
        if f["cause_key"] != "imbalance" or (f.get("run") not in (None, run.get("name"))):
            continue
        named = [r for r in _list(f.get("ranks")) if isinstance(r, int)]
        if named and len(named) < max(n, 2):
            for r in named:
                flags.setdefault(r, []).append(str(f.get("kind") or "imbalance").replace("_", " "))
    if n >= 3:
        for key, label in (("compute_pct", "compute"), ("idle_pct", "idle")):
            vals = [_num(r.get(key)) for r in ranks]
            good = [v for v in vals if v is not None]
            if len(good) < 3:
                continue
            med = _median(good)
            mad = _median(abs(v - med) for v in good)
            limit = max(OUTLIER_POINTS, 3 * mad)
            out = [(r, v) for r, v in zip(ranks, vals, strict=True) if v is not None and abs(v - med) > limit]
            if len(out) > max(1, n // 4):
                continue  # a wide spread, not a few odd ranks: the chart shows it, a flag on each would be noise
            for r, v in out:
                lab = f"outlier: {label} {v:.1f} % (median {med:.1f} %)"
                flags.setdefault(r.get("rank"), [])
                if lab not in flags[r.get("rank")]:
                    flags[r.get("rank")].append(lab)
    return flags


def _run_view(run: dict, findings: list[dict], idx: int = 1) -> dict:
    ranks = sorted((r for r in _list(run.get("ranks")) if isinstance(r, dict)),
                   key=lambda r: r.get("rank") if isinstance(r.get("rank"), int) else 1 << 30)
    mode = run.get("mode") if run.get("mode") in MODE_TEXT else None
    flags = _flags(run, findings)
    rank_ids = [r.get("rank") for r in ranks if isinstance(r.get("rank"), int)]
    world = run.get("world_size")
    found = _list(run.get("ranks_found")) or rank_ids
    missing = _list(run.get("missing_ranks"))
    files = [f for f in _list(run.get("files")) if isinstance(f, dict)]
    n_cached = sum(1 for f in files if f.get("cached"))

    ranks_text = f"{len(found)} of {world}" if isinstance(world, int) else str(len(found))
    if missing:
        n_missing = run.get("n_missing_ranks") if isinstance(run.get("n_missing_ranks"), int) else len(missing)
        ranks_text += f" (no trace for rank{'s' if n_missing > 1 else ''} {ranges(missing)})"
    facts = [("Ranks with a trace", ranks_text), ("Mode", (mode or text(run.get("mode"))).upper())]
    if run.get("gpu_model") or mode == "gpu":
        gpu = text(run.get("gpu_model"))
        if isinstance(run.get("gpu_count"), int) and run.get("gpu_model"):
            gpu += f" × {run['gpu_count']} visible"
        facts.append(("GPU", gpu if run.get("gpu_model") else "not recorded in the trace"))
    facts.append(("Backend", text(run.get("backend"))))
    if run.get("nccl_version") or mode == "gpu":
        facts.append(("NCCL version", text(run.get("nccl_version"))))
    if run.get("cuda_runtime_version") or mode == "gpu":
        facts.append(("CUDA runtime", text(run.get("cuda_runtime_version"))))
    stat = str(run.get("step_stat") or "median")
    facts.append((f"Step time ({stat}{', compile step apart' if run.get('compile_step') else ''})",
                  f"{fmt_ms(run.get('step_time_us'))} ms"))
    cstep = _dict(run.get("compile_step"))
    if cstep:
        facts.append((f"Compile step (step {text(cstep.get('step'))})", f"{fmt_ms(cstep.get('step_time_us'))} ms, "
                      "holds torch.compile; left out of the step time"))
    log_st = _dict(run.get("log_step_time_ms"))
    if _num(log_st.get("median_ms")) is not None:
        facts.append(("Step time from logs", f"{fmt_float(log_st.get('median_ms'), 2)} ms (median of "
                      f"{fmt_int(log_st.get('n'))} logged steps after the first, steps {text(log_st.get('steps'))})"))
    facts.append(("Files read", f"{len(files)} trace file{'s' if len(files) != 1 else ''}"
                  + (f" ({n_cached} from cache)" if n_cached else "")))
    if _num(run.get("effective_batch")) is not None:
        facts.append(("Effective (global) batch", fmt_float(run.get("effective_batch"), 0)))
    link = _dict(run.get("link"))
    if link:
        gbps = (f"{fmt_float(link.get('expected_gbps'))} GB/s" if _num(link.get("expected_gbps")) is not None
                else "not known")
        facts.append(("Expected link bandwidth", gbps + (f" ({link['source']})" if link.get("source") else "")))

    # Per-step figures per rank (medians over the steady steps), the outliers first, the straggler's cells marked
    from traceanalyze import charts

    compile_step = cstep.get("step")
    all_steps = [s for s in _list(run.get("steps")) if isinstance(s, dict)]
    steady = [s for s in all_steps if s.get("step") != compile_step] or all_steps
    per_step = _per_step_medians(steady)
    stragglers = [r for f in findings if f.get("kind") == "straggler" and f.get("run") in (None, run.get("name"))
                  for r in _list(f.get("ranks")) if isinstance(r, int)]
    outl = charts.outliers(ranks, per_step)
    order = charts.rank_order(rank_ids, stragglers + [r for r in flags if isinstance(r, int)] + outl)
    head = len(dict.fromkeys(r for r in stragglers + list(flags) + outl if r in rank_ids))
    n_show = len(rank_ids) if len(rank_ids) <= charts.SHOWN_RANKS + 2 else max(charts.SHOWN_RANKS, min(head, 16))
    by_rank = {r.get("rank"): r for r in ranks}
    ordered = [by_rank[r] for r in order if r in by_rank] + [r for r in ranks if not isinstance(r.get("rank"), int)]

    # Per-step table: steps × ranks, bounded.
    by_step: dict[Any, dict[Any, Any]] = {}
    for s in _list(run.get("steps")):
        if isinstance(s, dict):
            by_step.setdefault(s.get("step"), {})[s.get("rank")] = s.get("step_time_us")
    step_ids = sorted(by_step, key=lambda x: x if isinstance(x, int) else 1 << 60)
    step_cols = (order if stragglers else rank_ids)[:MAX_STEP_COLS]
    step_rows = []
    for st in step_ids[:MAX_STEP_ROWS]:
        cells = [by_step[st].get(rk) for rk in step_cols]
        nums = [v for v in (_num(c) for c in by_step[st].values()) if v is not None]
        hi = max(nums) if nums else None
        med = _median(nums) if nums else None
        slow = hi is not None and med is not None and len(nums) > 1 and hi > med * (1 + SLOW_STEP_FRAC)
        marks = ([rk in stragglers for rk in step_cols] if stragglers else  # the straggler finding's rank
                 [slow and _num(c) == hi for c in cells])
        step_rows.append({"step": st, "cells": list(zip(cells, marks, strict=True)), "compile": st == compile_step,
                          "max": hi, "median": med, "spread_pct": (100 * (hi - min(nums)) / hi) if hi else None})
    step_note = []
    if len(step_ids) > MAX_STEP_ROWS:
        step_note.append(f"first {MAX_STEP_ROWS} of {len(step_ids)} steps shown")
    if len(rank_ids) > MAX_STEP_COLS:
        step_note.append(f"ranks {ranges(step_cols)} of {len(rank_ids)} shown as columns; max and median cover "
                         "all ranks")

    kernels = []
    for k in _list(run.get("top_kernels")):
        if isinstance(k, dict):
            kernels.append({**k, "name": "" if k.get("name") is None else str(k.get("name"))})
    extras = []
    for key, title in (("compile", "torch.compile"), ("log_facts", "Facts from the logs")):
        rows = _fact_rows(_dict(run.get(key)))
        if rows:
            extras.append({"title": title, "rows": rows})
    offsets = _dict(run.get("clock_offsets_us"))
    waits = _dict(run.get("collective_wait_us"))
    loader = _dict(_dict(run.get("dataloader")).get("share_pct"))
    rank_extra = {r.get("rank"): {"wait_us": waits.get(str(r.get("rank")), waits.get(r.get("rank"))),
                                  "loader_pct": loader.get(str(r.get("rank")), loader.get(r.get("rank")))}
                  for r in ranks}

    return {
        "name": text(run.get("name")), "path": run.get("path"), "role": run.get("role") or "subject",
        "mode": mode, "mode_text": MODE_TEXT.get(mode or "", "The trace mode could not be determined."),
        "facts": facts, "files": files[:MAX_FILE_ROWS], "files_more": max(0, len(files) - MAX_FILE_ROWS),
        "sidecars": [s for s in _list(run.get("sidecars")) if isinstance(s, dict)],
        "ranks": ranks, "flags": flags, "show_kernel_cols": mode != "cpu",
        "ranks_shown": ordered[:n_show], "ranks_folded": ordered[n_show:], "per_step": per_step,
        "outliers": outl, "stragglers": stragglers, "idx": idx,
        "bars": charts.rank_bars(ranks, order, flags),
        "bar_note": (f"{charts.MAX_BARS} of {len(ranks)} ranks drawn, the marked and outlying ones first; the heatmaps "
                     "show every rank" if len(ranks) > charts.MAX_BARS else ""),
        "lines": charts.step_lines(steady, stragglers + [r for r in flags if isinstance(r, int)]),
        "heat_step": charts.heatmap(all_steps, "step_time_us", "Step time (ms)", compile_step),
        "heat_comm": charts.heatmap(all_steps, "exposed_comm_us", "Exposed communication per step (ms)", compile_step),
        "timeline": charts.timeline(_dict(run.get("timeline"))),
        **dict(zip(("idle_shown", "idle_folded"), _idle_rows(run, order), strict=True)),
        "compile_step": cstep or None, "step_stat": stat,
        "step_cols": step_cols, "step_rows": step_rows, "step_note": "; ".join(step_note),
        "kernels": kernels, "kernels_title": "Top ops (CPU)" if mode == "cpu" else "Top GPU kernels",
        "dtype_mix": [d for d in _list(run.get("dtype_mix")) if isinstance(d, dict)],
        "windows": [dict(w, rank=r.get("rank")) for r in ranks for w in _list(r.get("windows")) if isinstance(w, dict)]
        if any(len(_list(r.get("windows"))) > 1 for r in ranks) else [],
        "file_grouping": run.get("file_grouping"),
        "collectives": [c for c in _list(run.get("collectives")) if isinstance(c, dict)],
        "idle_breakdown": [d for d in _list(run.get("idle_breakdown")) if isinstance(d, dict)],
        "precision_rows": _fact_rows(_dict(run.get("precision"))),
        "link": link, "clock_offsets": sorted(offsets.items(), key=lambda kv: str(kv[0]).zfill(8)),
        "extras": extras, "rank_extra": rank_extra, "has_wait": bool(waits), "has_loader": bool(loader),
        **replay_view(run),
        "step_time_us": run.get("step_time_us"),
        "mean_idle": _mean(r.get("idle_pct") for r in ranks),
        "mean_compute": _mean(r.get("compute_pct") for r in ranks),
        "mean_non_compute": _mean(r.get("non_compute_pct") for r in ranks),
        "world_size": world, "n_found": len(found),
    }


PER_STEP_KEYS = ("step_time_us", "compute_us", "exposed_comm_us", "idle_us", "comm_us")


def _per_step_medians(steps: list[dict]) -> dict[int, dict[str, float]]:
    """Per rank, the median over its steps of each figure of :data:`PER_STEP_KEYS` (µs), and ``n`` steps."""
    by: dict[int, list[dict]] = {}
    for s in steps:
        if isinstance(s.get("rank"), int):
            by.setdefault(s["rank"], []).append(s)
    out: dict[int, dict[str, float]] = {}
    for r, rows in by.items():
        d: dict[str, float] = {"n": len(rows)}
        for k in PER_STEP_KEYS:
            vals = [v for v in (_num(x.get(k)) for x in rows) if v is not None]
            if vals:
                d[k] = _median(vals)
        out[r] = d
    return out


def _idle_rows(run: dict, order: list[int]) -> tuple[list[dict], list[dict]]:
    """GPU idle per stream: each rank's busiest stream, the outliers first, shown; the other streams folded."""
    rows = [d for d in _list(run.get("idle_breakdown")) if isinstance(d, dict)]
    pos = {r: i for i, r in enumerate(order)}
    best: dict[Any, dict] = {}
    for d in rows:
        cur = best.get(d.get("rank"))
        if cur is None or (_num(d.get("n_kernels")) or 0) > (_num(cur.get("n_kernels")) or 0):
            best[d.get("rank")] = d
    main = sorted(best.values(), key=lambda d: pos.get(d.get("rank"), 1 << 30))
    from traceanalyze.charts import SHOWN_RANKS

    rest = [d for d in rows if not any(d is m for m in main)]
    return main[:SHOWN_RANKS], main[SHOWN_RANKS:] + rest


def _mean(xs: Iterable[Any]) -> float | None:
    vals = [v for v in (_num(x) for x in xs) if v is not None]
    return sum(vals) / len(vals) if vals else None


def _fact_rows(d: dict) -> list[tuple[str, str]]:
    """A dict of facts as (label, text) rows: ``*_us`` keys shown in ms, ``*_pct`` in %, unknown (None) left out."""
    rows = []
    for k, v in d.items():
        if v is None or v == [] or v == {}:
            continue
        key = str(k)
        unit = ""
        if key.endswith("_us"):
            key, unit = key[:-3], "ms"
        elif key.endswith("_pct"):
            key, unit = key[:-4], "%"
        label = key.replace("_", " ").strip()
        label = label[:1].upper() + label[1:]
        rows.append((label + (f" ({unit})" if unit else ""), _scalar(v, unit)))
    return rows


def _scalar(v: Any, unit: str = "") -> str:
    """One fact as text; per-rank dicts (``{"0": x, "1": y}``) as ``rank 0: x · rank 1: y``."""
    if isinstance(v, (list, tuple)):
        uniq = list(dict.fromkeys(_scalar(x, unit) for x in v))  # the same fact from several logs: once
        s = ", ".join(uniq[:20]) + (f", … ({len(uniq)} values)" if len(uniq) > 20 else "")
        return s or "—"
    if isinstance(v, dict):
        per_rank = all(str(k).isdigit() for k in v)
        items = list(v.items())
        s = " · ".join(f"{'rank ' if per_rank else ''}{k}: {_scalar(x, unit)}" for k, x in items[:32])
        return s + (f" · … ({len(items)} entries)" if len(items) > 32 else "")
    if isinstance(v, bool):
        return "yes" if v else "no"
    if unit == "ms":
        return fmt_ms(v)
    if unit == "%":
        return fmt_pct(v, 1)
    if isinstance(v, float):
        return fmt_float(v, 3 if abs(v) < 1 else 2)
    s = text(v)
    return s if len(s) <= 300 else s[:299] + "…"


def _comparison(model: dict, findings: list[dict]) -> dict | None:
    c = _dict(model.get("comparison"))
    if not c:
        return None
    by_title = {str(f.get("title")): f for f in findings}
    parts = []
    for p in _list(c.get("parts")):
        if not isinstance(p, dict):
            continue
        if all(not _num(p.get(k)) for k in ("subject_us", "baseline_us", "delta_us")) and not p.get("finding"):
            continue  # an empty part (0 vs 0) only adds noise
        f = by_title.get(str(p.get("finding"))) if p.get("finding") else None
        parts.append({**p, "cause_key": f["cause_key"] if f else None})
    delta = _num(c.get("delta_us"))
    if delta is None:
        s, b = _num(c.get("subject_step_us")), _num(c.get("baseline_step_us"))
        delta = s - b if s is not None and b is not None else None
    total = sum(v for v in (_num(p.get("delta_us")) for p in parts) if v is not None)
    if delta is not None and parts and abs(delta - total) > max(1.0, 0.005 * abs(delta)):
        parts.append({"part": "not attributed", "subject_us": None, "baseline_us": None,
                      "delta_us": delta - total, "finding": None, "cause_key": None, "residual": True})
    biggest = max((abs(_num(p.get("delta_us")) or 0.0) for p in parts), default=0.0) or 1.0
    for p in parts:
        d = _num(p.get("delta_us")) or 0.0
        p["bar_pct"] = round(100 * abs(d) / biggest, 1)
        p["bar_dir"] = "slower" if d > 0 else "faster"
        p["share_pct"] = 100 * d / delta if delta else None
    ratio = None
    s, b = _num(c.get("subject_step_us")), _num(c.get("baseline_step_us"))
    if s and b:
        ratio = s / b
    return {**c, "parts": parts, "delta_us": delta, "ratio": ratio,
            "config_diffs": [d for d in _list(c.get("config_diffs")) if isinstance(d, dict)]}


def _warnings(model: dict) -> list[dict]:
    ws = []
    for w in _list(model.get("warnings")):
        if not isinstance(w, dict):
            continue
        level = w.get("level") if w.get("level") in LEVEL_ORDER else "warning"
        ws.append({"level": level, "file": w.get("file"), "message": text(w.get("message")), "run": w.get("run")})
    return sorted(ws, key=lambda w: LEVEL_ORDER[w["level"]])


def _view(model: dict) -> dict:
    findings = _sorted_findings(model)
    verdict, verdict_cause = _verdict(model, findings)
    runs = [r for r in _list(model.get("runs")) if isinstance(r, dict)]
    runs.sort(key=lambda r: 0 if r.get("role", "subject") == "subject" else 1)
    run_views = [_run_view(r, findings, i) for i, r in enumerate(runs, start=1)]
    warnings = _warnings(model)
    n_files = sum(len(rv["files"]) + rv["files_more"] for rv in run_views)
    n_bad = sum(1 for w in warnings if w["level"] in ("error", "partial"))
    counts = {lvl: sum(1 for w in warnings if w["level"] == lvl) for lvl in LEVEL_ORDER}
    tool = _dict(model.get("tool"))
    subjects = [rv["name"] for rv in run_views if rv["role"] == "subject"] or [rv["name"] for rv in run_views]
    return {
        "title": "traceanalyze report: " + (", ".join(subjects) if subjects else "no run"),
        "verdict": verdict, "verdict_cause": verdict_cause, "findings": findings,
        "multi_run": len(run_views) > 1, "runs": run_views, "comparison": _comparison(model, findings),
        "warnings": warnings, "n_files": n_files, "n_bad": n_bad, "level_counts": counts,
        "tool_name": text(tool.get("name") or "traceanalyze"), "tool_version": text(tool.get("version")),
        "generated_at": text(model.get("generated_at")),
        "export_path": text(model["export_path"]) if model.get("export_path") else None,
        "cause_colors": CAUSE_COLORS, "cause_labels": CAUSE_LABELS, "breakdown_colors": BREAKDOWN_COLORS,
        "definitions": DEFINITIONS,
        "causes_present": sorted({f["cause_key"] for f in findings}, key=lambda c: list(CAUSE_COLORS).index(c)),
    }


# ---------------------------------------------------------------------------------------------------------
# Public API

def html(model: dict) -> str:
    """The HTML report: one file, inline CSS and SVG, no scripts or network requests.

    Args:
        model: the report model from :func:`traceanalyze.pipeline.analyze` (``Analysis.model``); optional keys
            (``verdict``, ``findings``, ``comparison``, ``dtype_mix``, ``collectives``, ...) are shown when present.

    Returns:
        The complete HTML document as text.
    """
    return _CONTROL.sub("\ufffd", _get_env().get_template("report.html.j2").render(v=_view(model)))


# C0/C1 control characters but tab, newline and carriage return: trace names can hold them (a NUL, an ANSI escape);
# in HTML they are parse errors, so they become U+FFFD (what a browser would show for a NUL) in both outputs.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _md(x: Any) -> str:
    """Model text for Markdown: one line, inert for CommonMark and GitHub/GitLab (no link, image, raw HTML, table
    break, emphasis, mention; control and bidi characters as U+FFFD): :func:`traceanalyze.safety.md_text`."""
    from traceanalyze.safety import md_text

    return md_text(text(x)) or "—"  # a blank value would leave an empty line item (a setext underline)


MD_MAX_RANKS = 16
MD_MAX_FINDINGS = 5
MD_MAX_WARNINGS = 10


def markdown(model: dict) -> str:
    """A short Markdown summary for a bug ticket: verdict, top findings, comparison, run facts, per-rank table,
    data-quality warnings. About 40 lines for an 8-rank run; long lists are cut with a note."""
    v = _view_md(model)
    return "\n".join(v).rstrip() + "\n"


def _view_md(model: dict) -> list[str]:
    findings = _sorted_findings(model)
    verdict, _ = _verdict(model, findings)
    runs = [r for r in _list(model.get("runs")) if isinstance(r, dict)]
    runs.sort(key=lambda r: 0 if r.get("role", "subject") == "subject" else 1)
    subjects = [_md(r.get("name")) for r in runs if r.get("role", "subject") == "subject"]
    out = [f"## traceanalyze: {', '.join(subjects) or 'report'}", "", f"**Verdict:** {_md(verdict)}", ""]

    if findings:
        out.append("### Findings (ranked by impact)")
        for i, f in enumerate(findings[:MD_MAX_FINDINGS], start=1):
            n_named = len(_list(f.get("ranks")))
            ranks_txt = f", rank{'s' if n_named > 1 else ''} {f['ranks_text']}" if f["ranks_text"] else ""
            impact = (f"impact {fmt_pct(f.get('impact_pct'), 1)} % of step time"
                      if _num(f.get("impact_pct")) is not None else "impact not estimated")
            out.append(f"{i}. **{_md(f.get('title'))}**: {f['cause_key']}/{_md(f.get('kind'))}, "
                       f"{_md(f.get('severity'))} severity, {impact}{ranks_txt}")
            for e in f["evidence"][:3]:
                out.append(f"   - {_md(e)}")
            if f.get("recommendation"):
                out.append(f"   - **Fix:** {_md(f.get('recommendation'))}")
        if len(findings) > MD_MAX_FINDINGS:
            out.append(f"- … {len(findings) - MD_MAX_FINDINGS} more finding(s) in the HTML report")
        out.append("")

    comp = _comparison(model, findings)
    if comp:
        out.append(f"### {_md(comp.get('subject'))} vs {_md(comp.get('baseline'))}: step time "
                   f"{fmt_ms(comp.get('subject_step_us'))} ms vs {fmt_ms(comp.get('baseline_step_us'))} ms "
                   f"({fmt_signed_ms(comp.get('delta_us'))} ms)")
        out += ["| part | subject ms | baseline ms | Δ ms | finding |", "|---|--:|--:|--:|---|"]
        for p in comp["parts"]:
            out.append(f"| {_md(p.get('part'))} | {fmt_ms(p.get('subject_us'))} | {fmt_ms(p.get('baseline_us'))} "
                       f"| {fmt_signed_ms(p.get('delta_us'))} | {_md(p.get('finding')) if p.get('finding') else ''} |")
        diffs = comp["config_diffs"][:8]
        if diffs:
            out += ["", "Config differences: " + "; ".join(
                f"{_md(d.get('key'))}: {_md(d.get('subject'))} vs {_md(d.get('baseline'))}" for d in diffs)]
        out.append("")

    for run in runs:
        rv_ranks = sorted((r for r in _list(run.get("ranks")) if isinstance(r, dict)),
                          key=lambda r: r.get("rank") if isinstance(r.get("rank"), int) else 1 << 30)
        found = _list(run.get("ranks_found")) or [r.get("rank") for r in rv_ranks]
        ws = run.get("world_size")
        facts = [f"{len(found)} of {ws} ranks" if isinstance(ws, int) else f"{len(found)} ranks",
                 f"{_md(run.get('mode'))} mode"]
        for label, key in (("GPU", "gpu_model"), ("backend", "backend"), ("NCCL", "nccl_version"),
                           ("CUDA", "cuda_runtime_version")):
            if run.get(key):
                facts.append(f"{label} {_md(run.get(key))}")
        facts.append(f"step time {fmt_ms(run.get('step_time_us'))} ms ({_md(run.get('step_stat') or 'median')})")
        cstep = _dict(run.get("compile_step"))
        if cstep:
            facts.append(f"compile step {_md(cstep.get('step'))}: {fmt_ms(cstep.get('step_time_us'))} ms, apart")
        role = " (baseline)" if run.get("role") == "baseline" and "baseline" not in str(run.get("name")) else ""
        out += [f"### Run {_md(run.get('name'))}{role}", ", ".join(facts), ""]
        if run.get("role") == "baseline" and rv_ranks:  # the comparison above covers it; keep the ticket short
            out += [f"Mean over ranks: idle {fmt_pct(_mean(r.get('idle_pct') for r in rv_ranks))} %, compute "
                    f"{fmt_pct(_mean(r.get('compute_pct') for r in rv_ranks))} %, non-compute "
                    f"{fmt_pct(_mean(r.get('non_compute_pct') for r in rv_ranks))} %.", ""]
            continue
        if not rv_ranks:
            out += ["No rank could be read.", ""]
            continue
        csn = _dict(run.get("compile_step")).get("step")
        steps = [s for s in _list(run.get("steps")) if isinstance(s, dict)]
        per = _per_step_medians([s for s in steps if s.get("step") != csn] or steps)
        from traceanalyze import charts

        named = [r for f in findings if f.get("cause") == "imbalance" and f.get("run") in (None, run.get("name"))
                 and len(_list(f.get("ranks"))) < len(rv_ranks) for r in _list(f.get("ranks"))]
        ids = [r.get("rank") for r in rv_ranks if isinstance(r.get("rank"), int)]
        pos = {r: i for i, r in enumerate(charts.rank_order(ids, named + charts.outliers(rv_ranks, per)))}
        rv_ranks = sorted(rv_ranks, key=lambda r: pos.get(r.get("rank"), 1 << 30))  # outliers first
        out += ["| rank | idle % | compute % | non-compute % | overlap % | exposed comm ms/step | step ms |",
                "|--:|--:|--:|--:|--:|--:|--:|"]
        for r in rv_ranks[:MD_MAX_RANKS]:
            ps = per.get(r.get("rank")) or {}
            out.append(f"| {_md(r.get('rank'))} | {fmt_pct(r.get('idle_pct'))} | {fmt_pct(r.get('compute_pct'))} | "
                       f"{fmt_pct(r.get('non_compute_pct'))} | {fmt_pct(r.get('comm_comp_overlap_pct'))} | "
                       f"{fmt_ms(ps.get('exposed_comm_us', r.get('exposed_comm_us')))} | "
                       f"{fmt_ms(ps.get('step_time_us', r.get('step_time_us')))} |")
        if len(rv_ranks) > MD_MAX_RANKS:
            out.append(f"| … | {len(rv_ranks) - MD_MAX_RANKS} more ranks in the HTML report | | | | | |")
        out += ["", "Idle, compute, non-compute and overlap: % of each rank's trace window; exposed communication "
                "and step time: median per counted step. Ranks a finding names and outliers first."]
        out.append("")
        out += replay_markdown(run)

    warnings = _warnings(model)
    n_files = sum(len(_list(r.get("files"))) for r in runs)
    out.append("### Data quality")
    for run in runs:
        if run.get("file_grouping"):
            out.append(f"{_md(run.get('name')) + ': ' if len(runs) > 1 else ''}{_md(run.get('file_grouping'))}.")
    if not any(w["level"] in ("error", "partial") for w in warnings):
        out.append(f"All {n_files} trace file{'s' if n_files != 1 else ''} read completely.")
    for w in warnings[:MD_MAX_WARNINGS]:
        where = f"{_md(basename(w['file']))}: " if w["file"] else ""
        out.append(f"- {w['level']}: {where}{_md(w['message'])}")
    if len(warnings) > MD_MAX_WARNINGS:
        out.append(f"- … {len(warnings) - MD_MAX_WARNINGS} more in the HTML report")
    tool = _dict(model.get("tool"))
    out += ["", f"_{_md(tool.get('name') or 'traceanalyze')} {_md(tool.get('version'))}, "
                f"{_md(model.get('generated_at'))}_"]
    return out
