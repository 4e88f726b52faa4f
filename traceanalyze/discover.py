"""Discover: walk the inputs, say what every file is, group trace files into runs, and find each trace's rank.

What a file is (:func:`classify`), from its name and first :data:`~traceanalyze.names.SNIFF_BYTES`: a Kineto trace,
a Chakra execution trace (skipped), our own output (ignored), or, by :func:`sniff`, a training log (also a user's
step-time JSON), NCCL debug output, ``nvidia-smi topo -m`` output, a training config, a capture env file or
capture's step times (``steps_rank{r}.json``); the log parsers (:mod:`traceanalyze.logs`) then read each by its kind.

A *run* is the trace files of one job's ranks plus the logs and system files beside them. Trace files are
grouped by the folder they sit in. Logs, NCCL debug output, ``nvidia-smi topo -m`` output and configs
belong to the run in the same folder, or, when they sit above the trace folders, to every run below them.

A folder named like a profiler output folder (:data:`TRACE_SUBFOLDERS`: ``traces/``, ``profiler/``, ``tb/``,
``logs/``, ...) is part of the job folder above it: the run is named after the job folder, and when that folder
was walked too (it holds the logs), the run's path is the job folder, so its logs, configs and the other such
subfolders' logs belong to the same run (Hugging Face: logs in ``run/``, traces in ``run/traces/``). Two trace
folders of one job folder stay two runs.

Rank, in order: ``distributedInfo.rank`` in the trace header; a name such as ``rank3``, ``rank-3``,
``rank_3``, ``[rank3]`` (:func:`traceanalyze.names.rank_from_name`, shared with the log parsers); else the worker
name of ``tensorboard_trace_handler`` files (``<worker>.<timestamp>.pt.trace.json[.gz]``): the files of one worker
are one rank; a single worker is rank 0. Several files of one rank are successive profiling windows of that rank
(kineto writes one file per active window) and are all kept.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from traceanalyze.errors import InputError
from traceanalyze.names import (
    MAX_WORLD_SIZE,
    SNIFF_BYTES,
    STEPS_SIDECAR_NAME,
    UNPROFILED_KEY,
    is_step_times_json,
    rank_from_name,
    worker_name,
)

TRACE_SUFFIXES = (".json", ".json.gz")
CHAKRA_MARKERS = (".et.json", "_et.json", ".et.", "execution_trace")
# Subfolders a job writes its profiler traces or logs into (tensorboard_trace_handler, HF logging_dir, ...)
TRACE_SUBFOLDERS = frozenset({"traces", "trace", "profiler", "profile", "profiles", "profiling", "tb", "tensorboard",
                              "logs", "log", "torch_profiler", "pytorch_profiler", "kineto"})


@dataclass
class Sidecar:
    """A non-trace input: ``kind`` is training_log, nccl_debug, topology, config, env (capture facts) or steps
    (capture's step times without the profiler)."""

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


# --------------------------------------------------------------------------------------------------------
# What a file that is not a trace is (sniff)
# --------------------------------------------------------------------------------------------------------

_TRAINING_MARKERS = re.compile(
    r"^\s*(?:\[rank\s*\d+\]:?\s*)?(?:.*?[\s|,])?step\s*[:#=]?\s*\d+\b.*?"
    r"\b(?:step_time|step time|iter_time|time|dt|elapsed)\s*[:=]?\s*\d+(?:\.\d+)?\s*(?:ms|s|sec)\b"  # console
    r"|^Step \d+ \| [A-Za-z_]"  # torchtune
    r"|\[titan\]|- INFO - step:\s*\d+\s+loss:|Training starts at step"  # torchtitan
    r"|^(?:\[rank: \d+\] )?iter \d+(?: \|)? step \d+:|^Epoch \d+ \| iter \d+ step \d+ \|"  # litgpt
    r"|^iter \d+: loss [\d.]+, time"  # nanoGPT
    r"|\{'loss': |Total train batch size|Gradient Accumulation steps =|\*\*\*\*\* Running training"  # HF
    r"|llamafactory\.|torchtune\.|\"current_steps\":|Unsloth"
    r"|Recompiling function|FX codegen and compilation took|hit config\.(?:cache_size|recompile)_limit"
    r"|CUDA out of memory\. Tried to allocate|failed \(exitcode: -?\d+\) local_rank:|Out of memory: Kill"  # deaths
    r"|(?-i:^Killed$)",
    re.MULTILINE | re.IGNORECASE,
)
_UNPROFILED = re.compile(rf'(?<!\\)"{UNPROFILED_KEY}"\s*:')  # the key itself, not inside a string value
_NCCL_MARKER = re.compile(r"NCCL INFO|NCCL WARN")
_TOPO_MARKER = re.compile(
    r"^\s*GPU0\s.*(?:CPU Affinity|GPU1|NIC0|mlx5_0)"
    r"|^GPU\d+\s+(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)\s"
    r"|Connection traversing a bonded set of # NVLinks",
    re.MULTILINE,
)
_CONFIG_STRONG = (
    "gradient_accumulation_steps", "per_device_train_batch_size", "local_batch_size", "global_batch_size",
    "mixed_precision_param", "data_parallel_shard_degree", "data_parallel_replicate_degree", "cutoff_len",
    "torch_compile", "finetuning_type", "micro_batch_size", "max_seq_len",
)  # fmt: skip
_CONFIG_WEAK = (
    "batch_size", "dtype", "bf16", "fp16", "compile", "seq_len", "learning_rate", "lr", "model_name_or_path",
    "num_train_epochs", "epochs", "max_steps_per_epoch", "precision", "devices", "flavor",
)  # fmt: skip
_NOT_OURS_SUFFIXES = (
    ".py", ".sh", ".c", ".cc", ".cpp", ".h", ".cu", ".md", ".rst", ".html", ".htm", ".css", ".js", ".ipynb",
    ".csv", ".parquet", ".duckdb", ".png", ".jpg", ".svg", ".pdf", ".pt", ".pth", ".bin", ".safetensors",
    ".whl", ".zip", ".tar",
)  # fmt: skip


def _config_key_hits(text: str, style: str) -> set[str]:
    """Config-looking keys found in text; style ``yaml`` (``key:``), ``toml`` (``key =``), ``json``."""
    keys = _CONFIG_STRONG + _CONFIG_WEAK
    alt = "|".join(sorted(keys, key=len, reverse=True))
    if style == "json":
        pat = rf"\"({alt})\"\s*:"
    elif style == "toml":
        pat = rf"^\s*({alt})\s*="
    else:
        pat = rf"^\s*({alt})\s*:"
    return {m.group(1) for m in re.finditer(pat, text, re.MULTILINE)}


def _looks_like_config(text: str, style: str) -> bool:
    hits = _config_key_hits(text, style)
    if style == "toml" and re.search(r"^\[(training|parallelism|compile|model|optimizer)\]", text, re.M):
        hits.add("section")
    return bool(hits & set(_CONFIG_STRONG)) or len(hits) >= 2


def sniff(path: Path, head: bytes) -> str | None:
    """Classify a non-trace file from its name and first bytes (the caller reads up to :data:`SNIFF_BYTES`, gunzipped).

    Returns ``"training_log"`` (also for a torchrun log that mixes NCCL INFO lines in, for LLaMA-Factory
    ``trainer_log.jsonl`` and HF ``trainer_state.json``), ``"nccl_debug"`` (NCCL_DEBUG output alone),
    ``"topology"`` (``nvidia-smi topo -m``), ``"config"`` (YAML/TOML/JSON whose keys look like a training
    config; JSON holding ``traceEvents`` or a Chakra ``nodes``/``schema`` pair is never a config), ``"env"``
    (``env_rank{r}.json`` written by :mod:`traceanalyze.capture`), ``"steps"`` (its ``steps_rank{r}.json``: named
    so, or a capture file holding :data:`~traceanalyze.names.UNPROFILED_KEY`), or None (not ours). Never raises.
    """
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return None
    suffix = Path(name).suffix
    if suffix in _NOT_OURS_SUFFIXES or b"\x00" in head[:8192]:
        return None
    text = head.decode("utf-8", errors="replace")
    if suffix == ".json":
        if '"traceEvents"' in text or ('"nodes"' in text and '"schema"' in text):
            return None
        if STEPS_SIDECAR_NAME.fullmatch(name) or ('"traceanalyze_capture"' in text and _UNPROFILED.search(text)):
            return "steps"
        if is_step_times_json(head):
            return "training_log"
        if '"traceanalyze_capture"' in text or re.fullmatch(r"env_rank\d+\.json", name):
            return "env"
        if '"log_history"' in text:
            return "training_log"
        return "config" if _looks_like_config(text, "json") else None
    if suffix == ".jsonl":
        return "training_log" if '"current_steps"' in text else None
    if suffix in (".yaml", ".yml"):
        return "config" if _looks_like_config(text, "yaml") else None
    if suffix == ".toml":
        return "config" if _looks_like_config(text, "toml") else None
    if _TRAINING_MARKERS.search(text):
        return "training_log"
    if _TOPO_MARKER.search(text):
        return "topology"
    if _NCCL_MARKER.search(text):
        return "nccl_debug"
    return None


def classify(path: Path) -> tuple[str | None, str]:
    """Classify one file from its name and first 64 KiB.

    Returns ``(kind, note)``: kind is ``"trace"``, ``"chakra"``, ``"training_log"``, ``"nccl_debug"``,
    ``"topology"``, ``"config"``, ``"env"`` (capture facts), ``"steps"`` (capture's step times) or None (not ours);
    note says why a file is skipped.
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
        if STEPS_SIDECAR_NAME.fullmatch(name) and b'"traceEvents"' not in head:
            return "steps", ""  # capture's step times, whatever they hold (the reader says what is wrong)
        if any(m in name for m in CHAKRA_MARKERS):
            return "chakra", "Chakra execution trace (not a Kineto trace); skipped"
        stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if b'"traceEvents"' in head or (stripped[:1] == b"[" and b'"ph"' in head[:4096]):
            return "trace", ""
        if b'"nodes"' in head and b'"schema"' in head:
            return "chakra", "Chakra execution trace (top-level nodes/schema); skipped"
        if not stripped:
            return "trace", ""  # empty or unreadable gzip: ingest reports the exact problem
        if is_step_times_json(head):
            return "training_log", ""  # a user's step-time JSON (an HF callback): read for its step times
        if stripped[:1] in (b"{", b"[") and (len(head) < SNIFF_BYTES or b'"traceanalyze_capture"' in head[:4096]) \
                and b'"traceEvents"' not in head:
            pass  # small JSON that is not a trace (maybe a config), or capture's env file
        elif stripped[:1] in (b"{", b"["):
            return "trace", ""  # big JSON whose events start later than the sniffed bytes
    kind = sniff(path, head)
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
    it is skipped with a note listed in ``warned`` (docs/safety.md: a folder copied from elsewhere must not read
    ``~/.ssh`` or ``/etc``). With ``follow_external_symlinks`` such files are read and such folders walked, each
    folder once. An input named directly is always read.

    Raises :class:`InputError` when an input path does not exist.
    """
    walk = _walk_inputs(inputs, follow_external_symlinks)
    traces, sidecars, ignored = _classify_files(walk)
    runs = _trace_runs(traces, [Path(i) for i in inputs if Path(i).is_dir()])
    _name_runs(runs)
    _attach_sidecars(runs, sidecars, walk.skipped)
    runs.sort(key=lambda r: str(r.path))
    _name_runs(runs)
    return Discovery(runs=runs, skipped=walk.skipped, unreadable=walk.unreadable, ignored=ignored, warned=walk.warned)


@dataclass
class _Walk:
    """What walking the inputs found: the files to classify, and the notes on what was skipped (see
    :class:`Discovery`)."""

    follow_external_symlinks: bool
    files: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)

    def cannot_read(self, path: Path, problem: str) -> None:
        self.skipped.append((str(path), problem))
        self.unreadable.append(str(path))

    def external(self, path: Path, what: str, target: str) -> None:
        self.skipped.append((str(path), _EXTERNAL.format(what=what, target=target)))
        self.warned.append(str(path))


def _walk_inputs(inputs: list[str | Path], follow_external_symlinks: bool) -> _Walk:
    """Every readable file named or below ``inputs``, in order; raises InputError for an input that does not
    exist."""
    walk = _Walk(follow_external_symlinks)
    for inp in inputs:
        p = Path(inp)
        if not p.exists() and not p.is_symlink():
            raise InputError(p, "no such file or folder")
        if not p.is_dir():
            problem = _not_readable(p)
            if problem:
                walk.cannot_read(p, f"{problem}; skipped")
            else:
                walk.files.append(p)
            continue
        _walk_folder(p, walk)
    return walk


def _walk_folder(top: Path, walk: _Walk) -> None:
    """The files below ``top`` (sorted, hidden ones left out); a symlinked folder inside ``top`` is walked anyway,
    one outside it only when following external symlinks (each folder once, so a loop cannot hang the walk)."""
    top_real = os.path.realpath(top)
    visited = {top_real}
    tops = [top]
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
                if not walk.follow_external_symlinks:
                    walk.external(full, "folder", real)
                elif real not in visited:  # followed on request, each folder once (no loop)
                    visited.add(real)
                    tops.append(full)
            dirs[:] = keep
            _take_files(Path(root), names, top_real, walk)


def _take_files(root: Path, names: list[str], top_real: str, walk: _Walk) -> None:
    """The readable, non-hidden files ``names`` of folder ``root``; a symlink leading outside ``top_real`` only when
    following external symlinks."""
    for n in sorted(names):
        if n.startswith("."):
            continue
        f = root / n
        problem = _not_readable(f)
        if problem:
            walk.cannot_read(f, f"{problem}; skipped")
            continue
        if not walk.follow_external_symlinks and f.is_symlink() and not _inside(os.path.realpath(f), top_real):
            walk.external(f, "file", os.path.realpath(f))
            continue
        walk.files.append(f)


def _classify_files(walk: _Walk) -> tuple[dict[Path, list[Path]], list[Sidecar], list[tuple[str, str]]]:
    """``(trace files by folder, sidecars, ignored)`` of the walked files (:func:`classify`); a file skipped with a
    note, or unreadable, is added to ``walk``."""
    traces: dict[Path, list[Path]] = {}
    sidecars: list[Sidecar] = []
    ignored: list[tuple[str, str]] = []
    for f in walk.files:
        if f.suffix.lower() in (".duckdb", ".html", ".md", ".wal", ".parquet", ".png", ".svg"):
            ignored.append((str(f), "a report, database or image (an output, not an input)"))
            continue  # our own outputs
        if f.name == "scenario.json":
            ignored.append((str(f), "a sample scenario description"))
            continue
        try:
            kind, note = classify(f)
        except InputError as exc:
            walk.cannot_read(f, exc.problem)
            continue
        if kind == "trace":
            traces.setdefault(f.parent, []).append(f)
        elif kind in ("training_log", "nccl_debug", "topology", "config", "env", "steps"):
            sidecars.append(Sidecar(f, kind))
        elif note:
            walk.skipped.append((str(f), note))
        else:
            ignored.append((str(f), "not a Kineto trace, training log, NCCL output, topology or config"))
    return traces, sidecars, ignored


def _attach_sidecars(runs: list[Run], sidecars: list[Sidecar], skipped: list[tuple[str, str]]) -> None:
    """Give each sidecar to the runs in or below its folder, else to the run above it, else (topology, config,
    NCCL, env or steps) to the only trace run; a training log with no run becomes a log-only run of its folder
    (appended to ``runs``), an env or steps file with no run is skipped."""
    # training logs first: a folder of logs without traces becomes a log-only run, and the topology or config
    # files above it then attach to it like to a trace run
    order = {"training_log": 0, "nccl_debug": 1, "topology": 2, "config": 3, "env": 4, "steps": 5}
    trace_runs = list(runs)
    for sc in sorted(sidecars, key=lambda s: (order.get(s.kind, 9), str(s.path))):
        owners = [r for r in runs if _is_within(sc.path.parent, r.path)]
        if not owners:
            owners = [r for r in runs if _is_within(r.path, sc.path.parent)]
        if not owners and len(trace_runs) == 1 and sc.kind in ("topology", "config", "nccl_debug", "env", "steps"):
            owners = trace_runs  # e.g. a topology file kept elsewhere for a single run
        if not owners and sc.kind in ("env", "steps"):
            what = "env" if sc.kind == "env" else "step-time"
            skipped.append((str(sc.path), f"capture {what} file without traces beside it; skipped"))
            continue
        if not owners:  # logs without traces still tell a story: a log-only run per folder
            run = Run(name=sc.path.parent.name or str(sc.path.parent), path=sc.path.parent)
            runs.append(run)
            owners = [run]
        for r in owners:
            r.sidecars.append(sc)


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
    1 to 2^20, an integer rank with 0 <= rank < world size (docs/safety.md).

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
