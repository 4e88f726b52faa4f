"""Discover: walk the inputs, classify each file, group trace files into runs, and find each trace's rank.

A *run* is the trace files of one job's ranks plus the logs and system files beside them. Trace files are
grouped by the folder they sit in. Logs, NCCL debug output, ``nvidia-smi topo -m`` output and configs
belong to the run in the same folder, or, when they sit above the trace folders, to every run below them.

A folder named like a profiler output folder (:data:`TRACE_SUBFOLDERS`: ``traces/``, ``profiler/``, ``tb/``,
``logs/``, ...) is part of the job folder above it: the run is named after the job folder, and when that folder
was walked too (it holds the logs), the run's path is the job folder, so its logs, configs and the other such
subfolders' logs belong to the same run (Hugging Face: logs in ``run/``, traces in ``run/traces/``). Two trace
folders of one job folder stay two runs.

Rank, in order: ``distributedInfo.rank`` in the trace header; a name such as ``rank3``, ``rank-3``,
``rank_3``, ``[rank3]``; else the worker name of ``tensorboard_trace_handler`` files
(``<worker>.<timestamp>.pt.trace.json[.gz]``): the files of one worker are one rank; a single worker is rank 0.
Several files of one rank are successive profiling windows of that rank (kineto writes one file per active
window) and are all kept.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from traceanalyze.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz")
CHAKRA_MARKERS = (".et.json", "_et.json", ".et.", "execution_trace")
SNIFF_BYTES = 64 << 10
_RANK_NAME = re.compile(r"(?:^|[^a-z])rank[-_:\s\[]*(\d+)(?P<after>[-_./]\d{1,2}[-_./]\d{1,2})?", re.IGNORECASE)
# Sane bounds on what a header or a file name says (README, Safety: one implausible header field costs one warning):
# rank < world size <= 2^20 (no job has a million ranks; larger values are corrupt or hostile, and a loop or a
# set over them would exhaust memory).
MAX_WORLD_SIZE = 1 << 20
# Subfolders a job writes its profiler traces or logs into (tensorboard_trace_handler, HF logging_dir, ...)
TRACE_SUBFOLDERS = frozenset({"traces", "trace", "profiler", "profile", "profiles", "profiling", "tb", "tensorboard",
                              "logs", "log", "torch_profiler", "pytorch_profiler", "kineto"})


@dataclass
class Sidecar:
    """A non-trace input: ``kind`` is training_log, nccl_debug, topology, config or env (capture facts)."""

    path: Path
    kind: str


@dataclass
class Run:
    """One job's inputs. ``traces`` are paths (empty for a log-only run); ranks are assigned after their headers
    are read."""

    name: str
    path: Path
    traces: list[Path] = field(default_factory=list)
    sidecars: list[Sidecar] = field(default_factory=list)


@dataclass
class Discovery:
    """Everything found under the inputs: the runs, and a note for each file skipped (path, reason).

    ``unreadable`` lists the skipped paths that are errors rather than notes: files that could not be read
    (permissions, I/O errors), broken symlinks, symlink loops, FIFOs and other non-regular files.
    """

    runs: list[Run]
    skipped: list[tuple[str, str]]
    unreadable: list[str] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (path, why) of files not ours, not warned about
    warned: list[str] = field(default_factory=list)  # skipped paths that are warnings (symlinks leading outside)


def _head(path: Path) -> bytes:
    """First bytes of a file, decompressed when gzip (bounded)."""
    import zlib

    with open(path, "rb") as fh:
        raw = fh.read(SNIFF_BYTES)
    if raw[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(wbits=31).decompress(raw, SNIFF_BYTES)
        except zlib.error:
            return b""
    return raw


def _is_own_output(head: bytes) -> bool:
    """A ``--json`` report (``{"tool": {"name": "traceanalyze", ...``) or an ``export`` file (first key
    ``traceanalyze_export``)."""
    start = head.lstrip()[:400]
    return start.startswith(b'{"traceanalyze_export"') or (
        b'"tool"' in start and re.search(rb'"name":\s*"traceanalyze"', start) is not None)


def classify(path: Path) -> tuple[str | None, str]:
    """Classify one file from its name and first 64 KiB.

    Returns ``(kind, note)``: kind is ``"trace"``, ``"chakra"``, ``"training_log"``, ``"nccl_debug"``,
    ``"topology"``, ``"config"``, ``"env"`` (capture facts) or None (not ours); note says why a file is skipped.
    Raises :class:`InputError` when the file cannot be read.
    """
    name = path.name.lower()
    try:
        head = _head(path)
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None
    if name.endswith(TRACE_SUFFIXES) or name.endswith(".json.gz"):
        if _is_own_output(head):
            return None, ""  # our JSON report or merged export written beside the traces: not an input
        if any(m in name for m in CHAKRA_MARKERS):
            return "chakra", "Chakra execution trace (not a Kineto trace); skipped"
        stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if b'"traceEvents"' in head or (stripped[:1] == b"[" and b'"ph"' in head[:4096]):
            return "trace", ""
        if b'"nodes"' in head and b'"schema"' in head:
            return "chakra", "Chakra execution trace (top-level nodes/schema); skipped"
        if not stripped:
            return "trace", ""  # empty or unreadable gzip: ingest reports the exact problem
        from traceanalyze import logs

        if logs.is_step_times_json(head):
            return "training_log", ""  # a user's step-time JSON (an HF callback): read for its step times
        if stripped[:1] in (b"{", b"[") and (len(head) < SNIFF_BYTES or b'"traceanalyze_capture"' in head[:4096]) \
                and b'"traceEvents"' not in head:
            pass  # small JSON that is not a trace (maybe a config), or capture's env file
        elif stripped[:1] in (b"{", b"["):
            return "trace", ""  # big JSON whose events start later than the sniffed bytes
    from traceanalyze import logs

    kind = logs.sniff(path, head)
    if kind:
        return kind, ""
    if name_is_trace_like(path):
        return "trace", ""  # named like a rank's trace (rank3.json): ingest says exactly what is wrong with it
    if name.endswith(TRACE_SUFFIXES):
        return None, "JSON that is neither a Kineto trace nor a known config; skipped"
    return None, ""


def discover(inputs: list[str | Path], *, follow_external_symlinks: bool = False) -> Discovery:
    """Find every trace and sidecar under ``inputs`` (folders are walked recursively, symlinked folders are
    not followed, so a symlink loop cannot hang the walk) and group them into runs. Files that cannot be read
    (broken symlinks, symlink loops, FIFOs, no permission) are skipped with a note and listed in ``unreadable``;
    FIFOs are never opened.

    A symlink inside an input folder whose target lies outside that folder (a file or a folder) is not followed:
    it is skipped with a note listed in ``warned`` (README, Safety: a folder copied from elsewhere must not read
    ``~/.ssh`` or ``/etc``). With ``follow_external_symlinks`` such files are read and such folders walked, each
    folder once. An input named directly is always read.

    Raises :class:`InputError` when an input path does not exist.
    """
    files: list[Path] = []
    skipped: list[tuple[str, str]] = []
    unreadable: list[str] = []
    warned: list[str] = []
    for inp in inputs:
        p = Path(inp)
        if not p.exists() and not p.is_symlink():
            raise InputError(p, "no such file or folder")
        if not p.is_dir():
            problem = _not_readable(p)
            if problem:
                skipped.append((str(p), f"{problem}; skipped"))
                unreadable.append(str(p))
            else:
                files.append(p)
            continue
        top_real = os.path.realpath(p)
        visited = {top_real}
        tops = [p]
        while tops:
            for root, dirs, names in os.walk(tops.pop(), followlinks=False):
                keep = []
                for d in sorted(x for x in dirs if not x.startswith(".")):
                    full = Path(root) / d
                    if not full.is_symlink():
                        keep.append(d)
                        continue
                    real = os.path.realpath(full)
                    if _inside(real, top_real) or not os.path.isdir(real):
                        continue  # a link within the folder (walked anyway), or a broken one: not followed
                    if not follow_external_symlinks:
                        skipped.append((str(full), _EXTERNAL.format(what="folder", target=real)))
                        warned.append(str(full))
                    elif real not in visited:  # followed on request, each folder once (no loop)
                        visited.add(real)
                        tops.append(full)
                dirs[:] = keep
                for n in sorted(names):
                    if n.startswith("."):
                        continue
                    f = Path(root) / n
                    problem = _not_readable(f)
                    if problem:
                        skipped.append((str(f), f"{problem}; skipped"))
                        unreadable.append(str(f))
                        continue
                    if not follow_external_symlinks and f.is_symlink() and not _inside(os.path.realpath(f),
                                                                                          top_real):
                        skipped.append((str(f), _EXTERNAL.format(what="file", target=os.path.realpath(f))))
                        warned.append(str(f))
                        continue
                    files.append(f)

    traces: dict[Path, list[Path]] = {}
    sidecars: list[Sidecar] = []
    ignored: list[tuple[str, str]] = []
    for f in files:
        if f.suffix.lower() in (".duckdb", ".html", ".md", ".wal", ".parquet", ".png", ".svg"):
            ignored.append((str(f), "a report, database or image (an output, not an input)"))
            continue  # our own outputs
        if f.name == "scenario.json":
            ignored.append((str(f), "a sample scenario description"))
            continue
        try:
            kind, note = classify(f)
        except InputError as exc:
            skipped.append((str(f), exc.problem))
            unreadable.append(str(f))
            continue
        if kind == "trace":
            traces.setdefault(f.parent, []).append(f)
        elif kind in ("training_log", "nccl_debug", "topology", "config", "env"):
            sidecars.append(Sidecar(f, kind))
        elif note:
            skipped.append((str(f), note))
        else:
            ignored.append((str(f), "not a Kineto trace, training log, NCCL output, topology or config"))

    runs = _trace_runs(traces, [Path(i) for i in inputs if Path(i).is_dir()])
    _name_runs(runs)
    # training logs first: a folder of logs without traces becomes a log-only run, and the topology or config
    # files above it then attach to it like to a trace run
    order = {"training_log": 0, "nccl_debug": 1, "topology": 2, "config": 3, "env": 4}
    trace_runs = list(runs)
    for sc in sorted(sidecars, key=lambda s: (order.get(s.kind, 9), str(s.path))):
        owners = [r for r in runs if _is_within(sc.path.parent, r.path)]
        if not owners:
            owners = [r for r in runs if _is_within(r.path, sc.path.parent)]
        if not owners and len(trace_runs) == 1 and sc.kind in ("topology", "config", "nccl_debug", "env"):
            owners = trace_runs  # e.g. a topology file kept elsewhere for a single run
        if not owners and sc.kind == "env":
            skipped.append((str(sc.path), "capture env file without traces beside it; skipped"))
            continue
        if not owners:  # logs without traces still tell a story: a log-only run per folder
            run = Run(name=sc.path.parent.name or str(sc.path.parent), path=sc.path.parent)
            runs.append(run)
            owners = [run]
        for r in owners:
            r.sidecars.append(sc)
    runs.sort(key=lambda r: str(r.path))
    _name_runs(runs)
    return Discovery(runs=runs, skipped=skipped, unreadable=unreadable, ignored=ignored, warned=warned)


_EXTERNAL = ("a symlink to a {what} outside the input folder ({target}); not followed: pass "
             "--follow-external-symlinks to read it")


def _inside(real: str, top_real: str) -> bool:
    """Whether the resolved path ``real`` is ``top_real`` or below it."""
    return real == top_real or real.startswith(top_real.rstrip(os.sep) + os.sep)


def _trace_runs(traces: dict[Path, list[Path]], roots: list[Path]) -> list[Run]:
    """One run per trace folder; a :data:`TRACE_SUBFOLDERS` folder is named after its job folder, and becomes that
    folder when the job folder was walked (it is, or is below, an input folder), holds no traces itself and has
    no second trace subfolder."""
    parents: dict[Path, list[Path]] = {}
    for folder in traces:
        if folder.name.lower() in TRACE_SUBFOLDERS and folder.parent != folder:
            parents.setdefault(folder.parent, []).append(folder)
    runs = []
    for folder in sorted(traces):
        name, path = folder.name or str(folder), folder
        job = folder.parent
        if folder.name.lower() in TRACE_SUBFOLDERS and job != folder and job.name:
            name = job.name
            if (len(parents.get(job, [])) == 1 and job not in traces
                    and any(_is_within(job, root) for root in roots)):
                path = job
        runs.append(Run(name=name, path=path, traces=sorted(traces[folder])))
    return runs


def name_is_trace_like(path: Path) -> bool:
    """A ``*.json[.gz]`` name that says rank or trace (``rank3.json``, ``host.pt.trace.json.gz``)."""
    name = path.name.lower()
    return name.endswith(TRACE_SUFFIXES) and (rank_from_name(path) is not None or ".trace." in name)


def _not_readable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file (broken symlink, symlink loop, FIFO, device, no permission); None
    when it is a regular file. Never opens it, so a FIFO cannot block the walk."""
    try:
        st = path.stat()
    except OSError as exc:
        if path.is_symlink():
            if exc.errno == errno.ELOOP:
                return "symlink loop"
            try:
                return f"broken symlink (its target {os.readlink(path)} does not exist)"
            except OSError:
                return "broken symlink"
        if exc.errno == errno.ENOENT:
            return None  # plainly missing: the caller says so
        return f"cannot read ({exc.strerror or exc})"
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        what = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        return f"not a regular file ({what})"
    if not os.access(path, os.R_OK):
        return "cannot read (permission denied)"
    return None


def _is_within(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def _name_runs(runs: list[Run]) -> None:
    """Give runs unique, readable names (the folder name, prefixed by parents where two share a name)."""
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.name] = seen.get(r.name, 0) + 1
    for r in runs:
        if seen[r.name] > 1:
            r.name = "/".join(r.path.parts[-2:])


def rank_from_name(path: Path | str) -> int | None:
    """Rank from a file name such as ``rank3.json``, ``trace_rank-3``, ``[rank3]``; None when absent or not
    plausible: a date or timestamp (``rank_20240501``, ``rank_2024-05-01``, ``rank1700000000``), that is a number
    of 8 digits or more, at least :data:`MAX_WORLD_SIZE`, or followed by ``-MM-DD``."""
    m = _RANK_NAME.search(Path(path).name)
    if not m or m.group("after") or len(m.group(1)) > 7:
        return None
    r = int(m.group(1))
    return r if r < MAX_WORLD_SIZE else None


def _plain_int(v: object) -> int | None:
    """An integer field as JSON gives it (a digit string too), else None; never builds a huge int from text."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 10:
        return int(v)
    return None


def rank_from_header(header: dict) -> int | None:
    """``distributedInfo.rank`` when it is an integer with 0 <= rank < world size <= 2^20 (the world size when the
    header gives a plausible one), else None (:func:`check_headers` says why)."""
    di = header.get("distributedInfo")
    if isinstance(di, dict):
        r = _plain_int(di.get("rank"))
        ws = world_size_from_header(header)
        if r is not None and 0 <= r < (ws or MAX_WORLD_SIZE):
            return r
    return None


def world_size_from_header(header: dict) -> int | None:
    """``distributedInfo.world_size`` when it is an integer from 1 to :data:`MAX_WORLD_SIZE`, else None."""
    di = header.get("distributedInfo")
    ws = _plain_int(di.get("world_size")) if isinstance(di, dict) else None
    return ws if ws is not None and 1 <= ws <= MAX_WORLD_SIZE else None


def _shown(v: object) -> str:
    t = repr(v)
    return t if len(t) <= 40 else f"{t[:20]}...({len(t)} characters)"


def check_headers(headers: dict[Path, dict]) -> tuple[dict[Path, dict], list[tuple[str, str]]]:
    """Keep the rank and world size of each trace header only when they are plausible: an integer world size from
    1 to 2^20, an integer rank with 0 <= rank < world size (README, Safety).

    Returns ``(headers, warnings)``: the headers with an implausible ``distributedInfo.rank`` or ``world_size``
    removed (the rank is then worked out from the file name or the worker, like a file without one), and one
    ``(file, message)`` per file that had any.
    """
    out: dict[Path, dict] = {}
    warnings: list[tuple[str, str]] = []
    for p, h in headers.items():
        di = h.get("distributedInfo") if isinstance(h, dict) else None
        if not isinstance(di, dict):
            out[p] = h
            continue
        bad: list[str] = []
        di = dict(di)
        if "world_size" in di and di["world_size"] is not None and world_size_from_header(h) is None:
            bad.append(f"distributedInfo.world_size {_shown(di.pop('world_size'))} (must be an integer from 1 to "
                       f"{MAX_WORLD_SIZE:,})")
        if "rank" in di and di["rank"] is not None and rank_from_header({**h, "distributedInfo": di}) is None:
            ws = world_size_from_header({"distributedInfo": di})
            bad.append(f"distributedInfo.rank {_shown(di.pop('rank'))} (must be an integer from 0 to "
                       f"{(ws or MAX_WORLD_SIZE) - 1:,}{', below the world size' if ws else ''})")
        out[p] = {**h, "distributedInfo": di} if bad else h
        if bad:
            warnings.append((str(p), f"implausible {' and '.join(bad)}: ignored; the rank is taken from the file "
                                     "name or the worker instead"))
    return out, warnings


# tensorboard_trace_handler names each profiling window's file <worker>.<time in ms (or ns)>.pt.trace.json[.gz]
_WINDOW_NAME = re.compile(r"^(?P<worker>.+?)\.(?P<ts>\d{10,})\.pt\.trace\.json(?:\.gz)?$", re.IGNORECASE)


def worker_name(path: Path | str) -> str:
    """The worker part of a ``tensorboard_trace_handler`` file name: ``worker0.1621401187223.pt.trace.json.gz`` →
    ``worker0``. Files of one worker that differ only in the timestamp are successive profiling windows of one
    rank. A name without a timestamp is returned whole."""
    name = Path(path).name
    m = _WINDOW_NAME.match(name)
    return m.group("worker") if m else name


def assign_ranks(paths: list[Path], headers: dict[Path, dict]) -> tuple[dict[Path, int], list[str]]:
    """Rank of each trace file of one run: ``distributedInfo.rank`` first, then the file name (``rank3``), then
    the worker name of ``tensorboard_trace_handler`` files (:func:`worker_name`): files of one worker are
    profiling windows of one rank; a single worker is rank 0.

    Returns ``(rank_by_path, warnings)``. Workers whose rank cannot be found get the lowest free rank and a
    warning that names their files. A rank in a file name is used only when it is plausible
    (:func:`rank_from_name`) and below the world size that a header gives.
    """
    ranks: dict[Path, int] = {}
    warnings: list[str] = []
    unknown: dict[str, list[Path]] = {}
    world = max((w for w in (world_size_from_header(headers.get(p, {})) for p in paths) if w), default=None)
    for p in paths:
        r = rank_from_header(headers.get(p, {}))
        if r is None:
            r = rank_from_name(p)
            if r is not None and world is not None and r >= world:
                warnings.append(f"{p}: rank {r} in the file name is not below the world size {world}; not used")
                r = None
        if r is None:
            unknown.setdefault(worker_name(p), []).append(p)
        else:
            ranks[p] = r
    if unknown:
        if len(unknown) == 1 and not ranks:
            for p in next(iter(unknown.values())):
                ranks[p] = 0
        else:
            free = (r for r in range(10**6) if r not in ranks.values())
            for worker in sorted(unknown):
                r = next(free)
                for p in unknown[worker]:
                    ranks[p] = r
                    warnings.append(f"{p}: no rank in distributedInfo or the file name; assumed rank {r}"
                                    + (f" (worker {worker})" if len(unknown[worker]) > 1 else ""))
    return ranks, warnings


def window_grouping(paths: list[Path], headers: dict[Path, dict]) -> str:
    """Why the files ``paths`` (two or more) were read as profiling windows of one rank, in words: the same
    ``distributedInfo.rank``, the same rank in the file names, or the same worker name differing only in the
    timestamp."""
    hr = {rank_from_header(headers.get(p, {})) for p in paths}
    if len(hr) == 1 and None not in hr:
        return f"the same distributedInfo.rank {hr.pop()} in their headers"
    nr = {rank_from_name(p) for p in paths}
    if len(nr) == 1 and None not in nr:
        return f"the same rank {nr.pop()} in their file names"
    workers = {worker_name(p) for p in paths}
    if len(workers) == 1:
        return f"the same worker name {workers.pop()!r}, differing only in the timestamp"
    return "one rank by header or file name"
