"""Parsers for the files that sit next to the traces and are not traces.

Training logs (torchtune, torchtitan, litgpt, nanoGPT, Hugging Face Trainer, LLaMA-Factory), NCCL_DEBUG=INFO
output, ``nvidia-smi topo -m`` output and training configs (torchtune / LLaMA-Factory / litgpt YAML,
torchtitan TOML, Hugging Face ``TrainingArguments`` JSON) are turned into small dataclasses: per-step
numbers (:class:`LogStep`), named facts about the run (:class:`Fact`), NCCL transports (:class:`NcclInfo`)
and the GPU/NIC link matrix (:class:`Topology`).

The line formats and their regexes are documented in ``FORMATS.md`` §9 (shared with the project); the
regexes here extend those and are tested against the real excerpts under ``shared/logs``.

Rules: parsing never raises on odd content (unknown lines are ignored; a malformed structured file gives
no facts and, where the result has one, a warning); a file that cannot be read raises
:class:`~traceanalyze.errors.InputError`. Text is decoded as UTF-8 with ``errors="replace"``; ``\\r`` (tqdm
redraws), ANSI colour codes and tqdm progress bars are stripped. Logs are streamed line by line, so memory
is bounded by the parsed steps, not by the file.

Standard :class:`Fact` keys (exact names): ``framework``, ``per_device_batch``,
``gradient_accumulation_steps``, ``global_batch``, ``world_size``, ``num_examples``,
``total_optimization_steps``, ``trainable_params``, ``precision`` (one of ``fp32``, ``bf16``, ``fp16``,
``fp8``, ``tf32``), ``compile`` (``true``/``false``), ``learning_rate``, ``seq_len``, ``model_name``,
``nccl_version``, ``compile_time_s``, ``recompiles``. Extra keys, emitted only when stated:
``first_step_s`` (torchtitan: seconds from "Training starts" to the first step line), ``data_parallel_size``
(torchtitan mesh/config), ``n_gpu`` (HF ``_n_gpu`` / LLaMA-Factory ``n_gpu``: GPUs per *process*, 1 under
DDP, so not a world size), ``train_runtime_s`` (HF end-of-training summary).

Two plain formats users write themselves are read for their step times (framework ``console`` / ``step_times``):
console lines such as ``[rank0] step 3 loss 2.31 time 637.9ms`` (``step N``, then ``time``/``step_time``/``dt``/
``elapsed`` and a value in ms or s; a ``[rankN]`` prefix gives the rank), and a step-time JSON such as an HF
callback writes: a list of ``{"step": 3, "step_time_ms": 637.9}`` records, or an object holding such a list or a
list of numbers under a ``step_times_ms`` / ``step_times_s`` / ``step_times`` key (:func:`is_step_times_json`).
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from traceanalyze.discover import rank_from_name  # one rule for trace and log file names
from traceanalyze.errors import InputError

# Every file is size-bounded (README, Safety): what a log, config, env, NCCL or topology file (or its .gz) may
# inflate to is bounded like a trace (--max-decompressed); a file read whole (config, env, trainer_state.json) at
# most MAX_WHOLE_FILE_BYTES, and a line at most MAX_LINE_BYTES (the rest of a longer line is skipped, counted).
DEFAULT_MAX_BYTES = 64 << 30  # as ingest.DEFAULT_MAX_DECOMPRESSED (not imported: ingest pulls in NumPy and Arrow)
MAX_WHOLE_FILE_BYTES = 64 << 20
MAX_LINE_BYTES = 1 << 20

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - exercised on 3.10 only
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

__all__ = [
    "EXPECTED_LINK_GBPS",
    "LINK_DESCRIPTIONS",
    "NVLINK_GBPS_PER_LINK",
    "PCIE_X16_GBPS",
    "Fact",
    "LogResult",
    "LogStep",
    "NcclChannel",
    "NcclInfo",
    "TopoLink",
    "Topology",
    "effective_batch",
    "expected_link_gbps",
    "normalize_precision",
    "parse_config",
    "parse_env",
    "parse_llamafactory_jsonl",
    "parse_text_log",
    "parse_topology",
    "rank_from_name",
    "sniff",
]

# --------------------------------------------------------------------------------------------------------
# Data classes
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fact:
    """One stated (or simply derived) fact about a run.

    ``key`` is one of the standard keys listed in the module docstring; ``value`` is the text form
    (``"8"``, ``"bf16"``, ``"true"``); ``num`` the number when the fact is numeric, else None;
    ``source`` is ``"<file name>:<line number>"`` (or just the file name when no line applies).
    """

    key: str
    value: str
    num: float | None
    source: str


@dataclass(slots=True)
class LogStep:
    """Numbers one log line states about one training step.

    Units: ``loss`` as printed; ``lr`` learning rate; ``tokens_per_s`` tokens per second *per GPU* as the
    framework prints it (torchtune ``tokens_per_second_per_gpu``, torchtitan ``tps``/``wps``);
    ``tflops`` achieved TFLOPS per GPU; ``mfu_pct`` model FLOPs utilisation in percent (0-100);
    ``step_time_ms`` milliseconds per step (litgpt/nanoGPT: per *iteration*, i.e. micro-batch);
    ``memory_gib`` peak reserved GPU memory in GiB; ``epoch`` fractional epoch.
    ``step`` is the optimizer step (HF dict lines: the 1-based index of the dict in the file; LLaMA-Factory
    ``current_steps``); ``iter`` the micro-batch iteration where the log has one (litgpt, nanoGPT).
    ``rank`` is the global rank from a ``[rankN]:`` prefix or the file name, else None.
    """

    rank: int | None
    step: int
    iter: int | None = None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu_pct: float | None = None
    step_time_ms: float | None = None
    memory_gib: float | None = None
    epoch: float | None = None


@dataclass(frozen=True, slots=True)
class NcclChannel:
    """One NCCL_DEBUG=INFO channel connection line.

    ``device`` is the CUDA device in ``[N]`` after the pid/tid; ``src_rank``/``dst_rank`` are NCCL ranks;
    ``direction`` is ``"send"``/``"receive"`` when printed (NET connections), else None; ``transport`` is
    ``P2P``, ``SHM``, ``NET`` or ``COLLNET``; ``detail`` the full transport string, e.g. ``"P2P/IPC/read"``,
    ``"NET/Socket/3"``, ``"SHM/direct/direct"``.
    """

    host: str
    pid: int
    device: int
    channel: int
    src_rank: int
    dst_rank: int
    direction: str | None
    transport: str
    detail: str


@dataclass(slots=True)
class NcclInfo:
    """What NCCL_DEBUG=INFO output says: version, channel transports, networks, ``NCCL_*`` env settings,
    and ``nranks``, the largest communicator size in ``comm 0x.. rank R nranks N`` lines (the default
    process group's, i.e. the world size, unless only sub-groups were logged)."""

    version: str | None = None
    nranks: int | None = None
    channels: list[NcclChannel] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def transports(self) -> Counter[str]:
        """Count of channel lines per transport (``P2P``, ``SHM``, ``NET``, ``COLLNET``)."""
        return Counter(c.transport for c in self.channels)


@dataclass(slots=True)
class LogResult:
    """Everything one log file says.

    ``framework`` is ``"torchtune"``, ``"torchtitan"``, ``"litgpt"``, ``"nanogpt"``, ``"hf_trainer"``,
    ``"llamafactory"`` or None; ``rank`` is the file's rank when the file belongs to one rank (single
    ``[rankN]:`` prefix, or a name such as ``rank3.log``), else None; ``warnings`` are notes on content that
    could not be used (never fatal).
    """

    path: str
    framework: str | None = None
    rank: int | None = None
    steps: list[LogStep] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    nccl: NcclInfo | None = None
    warnings: list[str] = field(default_factory=list)

    def fact(self, key: str) -> Fact | None:
        """First fact with this key, or None."""
        return next((f for f in self.facts if f.key == key), None)

    def fact_values(self, key: str) -> list[str]:
        """Every distinct value stated for ``key``, in file order."""
        return [f.value for f in self.facts if f.key == key]


@dataclass(frozen=True, slots=True)
class TopoLink:
    """Link class between two devices of ``nvidia-smi topo -m`` (``a`` row, ``b`` column), e.g. ``PIX``."""

    a: str
    b: str
    link: str


@dataclass(slots=True)
class Topology:
    """The ``nvidia-smi topo -m`` matrix.

    ``devices`` is the header's column order (``GPU0``.., ``NIC0``/``mlx5_0``..); ``links`` holds every
    ordered pair of distinct devices (the matrix is symmetric, so a pair missing its mirror row, as in a
    truncated paste, is mirrored); ``cpu_affinity``/``numa_affinity``/``gpu_numa_id`` map a GPU name to the
    text of that column (``"0-23,48-71"``, ``"0"``, ``"N/A"``); ``nic_names`` maps ``NIC0`` to ``mlx5_0``
    from the "NIC Legend".
    """

    devices: list[str] = field(default_factory=list)
    links: list[TopoLink] = field(default_factory=list)
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    gpu_numa_id: dict[str, str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    _index: dict[tuple[str, str], str] = field(default_factory=dict, repr=False, compare=False)

    def link(self, a: str, b: str) -> str | None:
        """Link code between devices named ``a`` and ``b`` (``"NV12"``, ``"PIX"``, ...); None if unknown
        or ``a == b``."""
        if len(self._index) != len(self.links):
            self._index = {(lk.a, lk.b): lk.link for lk in self.links}
        return self._index.get((a, b))

    def link_between(self, gpu_a: int, gpu_b: int) -> str | None:
        """Link code between GPU indices ``gpu_a`` and ``gpu_b`` (``nvidia-smi`` numbering); None when
        either GPU is not in the matrix or ``gpu_a == gpu_b``."""
        return self.link(f"GPU{gpu_a}", f"GPU{gpu_b}")

    @property
    def gpus(self) -> list[str]:
        """GPU names in column order."""
        return [d for d in self.devices if d.startswith("GPU")]


# --------------------------------------------------------------------------------------------------------
# Link legend and expected bandwidth
# --------------------------------------------------------------------------------------------------------

#: Meaning of each ``nvidia-smi topo -m`` cell, from the legend nvidia-smi prints under the matrix.
LINK_DESCRIPTIONS: dict[str, str] = {
    "X": "Self",
    "NV#": "Connection traversing a bonded set of # NVLinks",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "SOC": "Older nvidia-smi name for SYS (connection crossing the CPU socket interconnect)",
}

#: NVLink, GB/s per link and direction. NVIDIA: NVLink 2 (V100) 6 links = 300 GB/s, NVLink 3 (A100)
#: 12 links = 600 GB/s, NVLink 4 (H100/H200 SXM) 18 links = 900 GB/s, each total of both directions, i.e.
#: 25 GB/s per link per direction. NCCL's own model (``src/graph/topo.h``) is more conservative: 20 GB/s
#: per link for sm80, 20.6 for sm90, 12 for sm86 (RTX 30xx NVLink bridge).
NVLINK_GBPS_PER_LINK = 25.0

#: PCIe x16, GB/s per direction achievable in practice, by generation (spec 15.8 / 31.5 / 63 GB/s raw).
#: NCCL ``src/graph/topo.h`` models a Gen3 x16 link as 12 GB/s (``PCI_BW``).
PCIE_X16_GBPS: dict[int, float] = {3: 12.0, 4: 24.0, 5: 48.0}

#: Rough expected bandwidth per ``nvidia-smi topo -m`` link class, GB/s **per direction**, for a PCIe Gen4
#: x16 system (scale with :data:`PCIE_X16_GBPS` for other generations; :func:`expected_link_gbps` does).
#:
#: - ``NV`` is *per NVLink*; ``NV#`` means # links, so multiply (``NV12`` -> 300).
#: - ``PIX``/``PXB``: GPU peer-to-peer through PCIe switches, full PCIe x16 (PCIe spec; NCCL topo.h).
#: - ``PHB``/``NODE``: the path crosses the CPU's host bridge(s). NCCL often disables P2P across it
#:   (``NCCL_P2P_LEVEL``; GeForce cards have P2P off), then traffic is staged through host memory (SHM
#:   transport): two PCIe copies, about half of PCIe x16.
#: - ``SYS``: also crosses the socket interconnect (QPI/UPI/xGMI); NCCL topo.h models it at 6 (Broadwell
#:   QPI, ``BDW_QPI_BW``) to 10 (Skylake UPI, ``SKL_QPI_BW``) GB/s; the lower figure is used.
EXPECTED_LINK_GBPS: dict[str, float] = {
    "NV": NVLINK_GBPS_PER_LINK,
    "PIX": PCIE_X16_GBPS[4],
    "PXB": PCIE_X16_GBPS[4],
    "PHB": PCIE_X16_GBPS[4] / 2,
    "NODE": PCIE_X16_GBPS[4] / 2,
    "SYS": 6.0,
    "SOC": 6.0,
}


def expected_link_gbps(link: str, pcie_gen: int = 4) -> float | None:
    """Rough expected GB/s per direction for a link code (``"NV4"``, ``"PIX"``, ``"SYS"``...).

    ``NV#`` gives # × :data:`NVLINK_GBPS_PER_LINK`; PCIe classes scale the Gen4 figure of
    :data:`EXPECTED_LINK_GBPS` to ``pcie_gen`` (3, 4 or 5); ``SYS`` is not scaled (bound by the socket
    link). Returns None for ``X`` or an unknown code. Raises ValueError for an unknown PCIe generation.
    """
    if pcie_gen not in PCIE_X16_GBPS:
        raise ValueError(f"unknown PCIe generation {pcie_gen}; known: {sorted(PCIE_X16_GBPS)}")
    code = link.strip().upper()
    m = re.fullmatch(r"NV(\d+)", code)
    if m:
        return int(m.group(1)) * NVLINK_GBPS_PER_LINK
    if code in ("SYS", "SOC"):
        return EXPECTED_LINK_GBPS[code]
    if code in EXPECTED_LINK_GBPS and code != "NV":
        return EXPECTED_LINK_GBPS[code] * PCIE_X16_GBPS[pcie_gen] / PCIE_X16_GBPS[4]
    return None


# --------------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------------

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_TQDM_RE = re.compile(r"\s*\d{1,3}%\|[^|]*\|\s*\d+/\d+\s*\[[^\]]*\]")
_PREFIX_RE = re.compile(r"^(?:\d{1,5}: )?(?:\[rank(?P<rank>\d+)\]:)?(?:\[rank: (?P<lrank>\d+)\] )?")

_PRECISIONS = {
    "bf16": "bf16", "bfloat16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16", "bf16_mixed": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "16": "fp16", "16-mixed": "fp16", "16-true": "fp16",
    "16bit": "fp16", "f16": "fp16", "amp": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "32": "fp32", "32-true": "fp32", "f32": "fp32",
    "full": "fp32", "32bit": "fp32",
    "tf32": "tf32",
    "fp8": "fp8", "float8": "fp8",
}  # fmt: skip


def normalize_precision(value: Any) -> str | None:
    """Map a stated dtype/precision (``torch.bfloat16``, ``bf16-true``, ``float32``, ``16-mixed``...) to
    ``"fp32"``, ``"bf16"``, ``"fp16"``, ``"fp8"`` or ``"tf32"``; None when it is none of them."""
    if value is None or isinstance(value, bool):
        return None
    v = str(value).strip().strip("'\"").lower()
    v = v.removeprefix("torch.")
    if v in _PRECISIONS:
        return _PRECISIONS[v]
    if v.startswith(("float8", "fp8", "e4m3", "e5m2")):
        return "fp8"
    return None


def effective_batch(per_device_batch: int, gradient_accumulation_steps: int, data_parallel_size: int) -> int:
    """Effective (global) batch in samples per optimizer step.

    DESIGN.md: effective (global) batch = per-device micro-batch × gradient accumulation steps ×
    data-parallel world size. (Tensor/pipeline/context-parallel ranks share one sample, so only the
    data-parallel size counts.) Raises ValueError when any argument is not a positive integer.
    """
    for name, v in (
        ("per_device_batch", per_device_batch),
        ("gradient_accumulation_steps", gradient_accumulation_steps),
        ("data_parallel_size", data_parallel_size),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return per_device_batch * gradient_accumulation_steps * data_parallel_size


def _num(text: Any) -> float | None:
    """Float from a printed number (``"1,234"``, ``"3.5"``, ``"nan"``); None when not a number."""
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    try:
        return float(str(text).replace(",", "").strip())
    except ValueError:
        return None


def _int(text: Any) -> int | None:
    v = _num(text)
    if v is None or v != v or v in (float("inf"), float("-inf")) or v != int(v):
        return None
    return int(v)


def _fmt(v: float) -> str:
    """Text form of a number: integers without a decimal point."""
    if v == int(v) and abs(v) < 1e18:
        return str(int(v))
    return repr(float(v))


def _open_binary(path: Path):
    """Open a file for binary reading, transparently gunzipping ``*.gz``; raise InputError when unreadable."""
    try:
        if path.is_dir():
            raise InputError(path, "is a folder, not a file")
        with open(path, "rb") as probe:
            magic = probe.read(2)
        return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")
    except InputError:
        raise
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None


def _over_bound(path: Path, bound: int, gz: bool, option: bool = True) -> InputError:
    what = (f"decompresses to more than {_size_text(bound)} (a gzip bomb?)" if gz
            else f"larger than {_size_text(bound)}")
    return InputError(path, f"{what}; not read" + ("; raise --max-decompressed if this is a real file" if option else
                                                   ": too big for a file that is read whole"))


def _size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def _is_gzip(fh) -> bool:
    return isinstance(fh, gzip.GzipFile)


def _read_text(path: Path, max_bytes: int | None = None) -> str:
    """Whole file as text (configs and other small files), at most ``min(max_bytes, MAX_WHOLE_FILE_BYTES)``
    decompressed bytes; raise InputError when unreadable or larger (a gzip bomb is never inflated in full)."""
    bound = min(max_bytes or DEFAULT_MAX_BYTES, MAX_WHOLE_FILE_BYTES)
    fh = _open_binary(path)
    try:
        with fh:
            data = fh.read(bound + 1)
            if len(data) > bound:
                raise _over_bound(path, bound, _is_gzip(fh), bound < MAX_WHOLE_FILE_BYTES)
            return data.decode("utf-8", errors="replace")
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(path, f"cannot read ({exc})") from None


def _lines(fh, path: Path, bound: int, long_lines: list[int]) -> Iterator[bytes]:
    """The file's lines, each at most :data:`MAX_LINE_BYTES` (the rest of a longer one is skipped and its number
    appended to ``long_lines``); raise InputError past ``bound`` decompressed bytes."""
    total = 0
    n = 0
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        n += 1
        total += len(raw)
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            long_lines.append(n)
            while True:  # skip to the end of the line, a bounded block at a time
                rest = fh.readline(MAX_LINE_BYTES)
                total += len(rest)
                if total > bound:
                    raise _over_bound(path, bound, _is_gzip(fh))
                if not rest or rest.endswith(b"\n"):
                    break
            raw = raw[:MAX_LINE_BYTES]
        if total > bound:
            raise _over_bound(path, bound, _is_gzip(fh))
        yield raw


def _iter_lines(path: Path, warnings: list[str], max_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, cleaned text)`` per physical line, split further at ``\\r`` (tqdm redraws);
    ANSI codes and tqdm bars removed. A truncated gzip ends the stream with a warning. A line longer than
    :data:`MAX_LINE_BYTES` is cut there (one warning counts them); past ``max_bytes`` decompressed bytes (default
    :data:`DEFAULT_MAX_BYTES`) the file raises InputError."""
    fh = _open_binary(path)
    long_lines: list[int] = []
    with fh:
        lineno = 0
        try:
            for raw in _lines(fh, path, max_bytes or DEFAULT_MAX_BYTES, long_lines):
                lineno += 1
                text = raw.decode("utf-8", errors="replace").rstrip("\n")
                if "\x1b" in text:
                    text = _ANSI_RE.sub("", text)
                for seg in text.split("\r") if "\r" in text else (text,):
                    if "%|" in seg:
                        seg = _TQDM_RE.sub("", seg)
                    if seg.strip():
                        yield lineno, seg
        except (OSError, EOFError, zlib.error) as exc:
            warnings.append(f"{path.name}: stopped reading at line {lineno}: {exc}")
    if long_lines:
        warnings.append(f"{path.name}: {len(long_lines):,} line{'s' if len(long_lines) != 1 else ''} longer than "
                        f"{_size_text(MAX_LINE_BYTES)} cut there (first: line {long_lines[0]:,})")


# --------------------------------------------------------------------------------------------------------
# sniff
# --------------------------------------------------------------------------------------------------------

# console step lines: "[rank0] step 3 loss 2.31 time 637.9ms", "step 12 | step_time: 0.64 s", "Step 5: dt=120ms"
_CONSOLE_STEP = re.compile(
    r"^\s*(?:\[rank\s*(?P<rank>\d+)\]:?\s*)?(?:.*?[\s|,])?step\s*[:#=]?\s*(?P<step>\d+)\b.*?"
    r"\b(?:step_time|step time|iter_time|time|dt|elapsed)\s*[:=]?\s*(?P<v>\d+(?:\.\d+)?)\s*(?P<u>ms|s|sec)\b",
    re.IGNORECASE)
_STEP_TIMES_KEY = re.compile(r'"(?P<k>step_?times?(?:_ms|_s|_sec)?|iter(?:ation)?_?times?(?:_ms|_s)?|'
                             r'(?:step_)?duration(?:_ms|_s)?|time_ms|time_s)"\s*:', re.IGNORECASE)
_TRAINING_MARKERS = re.compile(
    r"^\s*(?:\[rank\s*\d+\]:?\s*)?(?:.*?[\s|,])?step\s*[:#=]?\s*\d+\b.*?"
    r"\b(?:step_time|step time|iter_time|time|dt|elapsed)\s*[:=]?\s*\d+(?:\.\d+)?\s*(?:ms|s|sec)\b"  # console
    r"|^Step \d+ \| [A-Za-z_]"  # torchtune
    r"|\[titan\]|- INFO - step:\s*\d+\s+loss:|Training starts at step"  # torchtitan
    r"|^(?:\[rank: \d+\] )?iter \d+(?: \|)? step \d+:|^Epoch \d+ \| iter \d+ step \d+ \|"  # litgpt
    r"|^iter \d+: loss [\d.]+, time"  # nanoGPT
    r"|\{'loss': |Total train batch size|Gradient Accumulation steps =|\*\*\*\*\* Running training"  # HF
    r"|llamafactory\.|torchtune\.|\"current_steps\":|Unsloth"
    r"|Recompiling function|FX codegen and compilation took|hit config\.(?:cache_size|recompile)_limit",
    re.MULTILINE | re.IGNORECASE,
)
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
    """Classify a non-trace file from its name and first bytes (the caller reads up to 64 KiB, gunzipped).

    Returns ``"training_log"`` (also for a torchrun log that mixes NCCL INFO lines in, for LLaMA-Factory
    ``trainer_log.jsonl`` and HF ``trainer_state.json``), ``"nccl_debug"`` (NCCL_DEBUG output alone),
    ``"topology"`` (``nvidia-smi topo -m``), ``"config"`` (YAML/TOML/JSON whose keys look like a training
    config; JSON holding ``traceEvents`` or a Chakra ``nodes``/``schema`` pair is never a config), ``"env"``
    (``env_rank{r}.json`` written by :mod:`traceanalyze.capture`), or None (not ours). Never raises.
    """
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, 64 << 10)
        except zlib.error:
            return None
    suffix = Path(name).suffix
    if suffix in _NOT_OURS_SUFFIXES or b"\x00" in head[:8192]:
        return None
    text = head.decode("utf-8", errors="replace")
    if suffix == ".json":
        if '"traceEvents"' in text or ('"nodes"' in text and '"schema"' in text):
            return None
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


def is_step_times_json(head: bytes) -> bool:
    """Whether the first bytes of a JSON file look like a user's step-time file (module docstring): a step-time key
    and no ``traceEvents``. Never raises."""
    text = head[:SNIFF_HEAD].decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    return (text[:1] in ("{", "[") and '"traceEvents"' not in text and '"log_history"' not in text
            and _STEP_TIMES_KEY.search(text) is not None)


SNIFF_HEAD = 64 << 10
MAX_STEP_TIMES = 1_000_000  # step records read from one step-time JSON


def _unit_ms(key: str) -> float:
    """Milliseconds per unit of a step-time key: ``_s``/``_sec`` seconds, otherwise (``_ms`` or none) ms."""
    k = key.lower()
    return 1000.0 if k.endswith(("_s", "_sec")) or k in ("time_s",) else 1.0


def parse_step_times_json(path: Path) -> LogResult:
    """A user's step-time JSON (module docstring) as :class:`LogStep` rows with ``step_time_ms``; framework
    ``step_times``. A record needs a number under a step-time key; ``step`` defaults to its position. At most
    :data:`MAX_STEP_TIMES` records. Raises :class:`InputError` when the file cannot be read."""
    path = Path(path)
    res = LogResult(path=str(path), framework="step_times", rank=rank_from_name(path))
    try:
        data = json.loads(_read_text(path))
    except ValueError as exc:
        res.warnings.append(f"{path.name}: not JSON ({exc})")
        return res
    rank = res.rank
    if isinstance(data, dict):
        r = _int(data.get("rank"))
        rank = r if r is not None else rank
        lists = [(k, v) for k, v in data.items() if isinstance(v, list) and _STEP_TIMES_KEY.fullmatch(f'"{k}":')]
        recs = next((v for k, v in data.items() if isinstance(v, list) and v and isinstance(v[0], dict)), None)
        if lists:
            key, vals = lists[0]
            first = _int(data.get("first_step")) or 0
            data = [{"step": first + i, key: v} for i, v in enumerate(vals)]
        elif recs is not None:
            data = recs
    if not isinstance(data, list):
        res.warnings.append(f"{path.name}: no list of step times")
        return res
    for i, e in enumerate(data[:MAX_STEP_TIMES]):
        if not isinstance(e, dict):
            continue
        key = next((k for k in e if _STEP_TIMES_KEY.fullmatch(f'"{k}":') and _num(e[k]) is not None), None)
        if key is None:
            continue
        step = _int(e.get("step", e.get("global_step", e.get("iteration", i))))
        ms = _num(e[key]) * _unit_ms(key)
        if step is None or not ms == ms or ms < 0:
            continue
        res.steps.append(LogStep(rank=_int(e.get("rank")) if _int(e.get("rank")) is not None else rank, step=step,
                                 loss=_num(e.get("loss")), step_time_ms=ms))
    if res.steps:
        res.facts.append(Fact("framework", "step_times", None, path.name))
    else:
        res.warnings.append(f"{path.name}: no step-time records")
    return res


# --------------------------------------------------------------------------------------------------------
# Text logs: line regexes (FORMATS.md §9)
# --------------------------------------------------------------------------------------------------------

_TT_STEP = re.compile(r"^Step (?P<step>\d+) \| (?P<kv>(?:[A-Za-z_][\w/.-]*:\S+\s*)+)$")
_TT_KV = re.compile(r"(?P<k>[A-Za-z_][\w/.-]*):(?P<v>\S+)")
_TT_PRECISION = re.compile(r"Model is initialized with precision (?:torch\.)?(\w+)")
_RESOLVED_CONFIG = re.compile(r"with resolved config:\s*$")
_YAML_KEY_LINE = re.compile(r"^[A-Za-z_][\w.-]*:(?:\s|$)")

_TITAN_HDR = re.compile(r"^(?:\[titan\] )?(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+) - \S+ - [A-Z]+ - (?P<msg>.*)$")
_TITAN_STEP = re.compile(
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)(?:\s+grad_norm:\s*(?P<grad_norm>\S+))?"
    r"\s+memory:\s*(?P<mem_gib>[\d.]+)GiB\((?P<mem_pct>[\d.]+)%\)\s+(?:tps|wps):\s*(?P<tps>[\d,]+)"
    r"(?:\s+tflops:\s*(?P<tflops>[\d.]+))?(?:\s+mfu:\s*(?P<mfu>[\d.]+)%)?"
)
_TITAN_START = re.compile(r"Training starts at step (?P<step>\d+)")
_TITAN_START_FIELDS = {
    "per_device_batch": re.compile(r"local batch size (\d+)"),
    "global_batch": re.compile(r"global batch size (\d+)"),
    "gradient_accumulation_steps": re.compile(r"gradient accumulation steps (\d+)"),
    "seq_len": re.compile(r"sequence length (\d+)"),
    "total_optimization_steps": re.compile(r"total steps (\d+)"),
}
_TITAN_BUILD = re.compile(r"Building (\S+) (\S+) with ")
_TITAN_MESH = re.compile(r"Building \d+-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")

_LIT_OLD = re.compile(
    r"^iter (?P<iter>\d+)(?: \|)? step (?P<step>\d+): (?:loss (?P<loss>[\d.]+), )?"
    r"iter time: (?P<ms>[\d.]+) ?ms(?P<opt> \(optimizer\.step\))?"
)
_LIT_NEW = re.compile(
    r"^Epoch (?P<epoch>\d+) \| iter (?P<iter>\d+) step (?P<step>\d+) \| loss train: (?P<loss>[\d.]+), "
    r"val: (?P<val>\S+) \| iter time: (?P<ms>[\d.]+) ms(?P<opt> \(step\))?"
)
_NANOGPT = re.compile(r"^iter (?P<iter>\d+): loss (?P<loss>[\d.]+), time (?P<ms>[\d.]+)ms(?:, mfu (?P<mfu>-?[\d.]+)%)?")
_LIGHTNING_AMP = re.compile(r"Using (bfloat16|16bit|bf16|16) Automatic Mixed Precision")

_HF_DICT = re.compile(r"\{'loss': [^{}]*\}")
_HF_SUMMARY = re.compile(r"\{'train_runtime': [^{}]*\}")
_HF_NUM_PAIR = re.compile(r"'(\w+)': (?:tensor\(|np\.float\d+\()?'?([-+]?(?:\d[\d.]*(?:[eE][-+]?\d+)?|nan|inf))'?")
_HF_BANNER = (
    ("num_examples", re.compile(r"Num examples = ([\d,]+)")),
    ("per_device_batch", re.compile(r"batch size per device = ([\d,]+)", re.I)),
    ("global_batch", re.compile(r"Total (?:train )?batch size[^=]*= ([\d,]+)", re.I)),
    ("gradient_accumulation_steps", re.compile(r"Gradient Accumulation steps = ([\d,]+)", re.I)),
    ("total_optimization_steps", re.compile(r"Total (?:optimization )?steps = ([\d,]+)")),
    ("trainable_params", re.compile(r"Number of trainable parameters(?: =|:) ([\d,]+)")),
    ("world_size", re.compile(r"(?:Num GPUs used|Data Parallel GPUs) = (\d+)")),
)
_LF_PROCESS = re.compile(
    r"Process rank: (\d+), (?:world size: (?P<ws>\d+), )?device: [^,\s]+,?(?: n_gpu: (?P<ngpu>\d+))?"
)
_COMPUTE_DTYPE = re.compile(r"compute dtype: (?:torch\.)?(\w+)")

_NCCL_CHANNEL = re.compile(
    r"^(?P<host>[^:\s]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO "
    r"Channel (?P<ch>\d+)(?:/(?P<sub>\d+))? : "
    r"(?P<src>\d+)\[(?P<srcdev>[0-9a-f]+)\] -> (?P<dst>\d+)\[(?P<dstdev>[0-9a-f]+)\] "
    r"(?:\[(?P<dir>send|receive)\] )?via (?P<transport>P2P|SHM|NET|COLLNET)/(?P<detail>.+?)\s*$"
)
_NCCL_VERSION = re.compile(r"NCCL version[: ]+(\d+\.\d+(?:\.\d+)?)")
_NCCL_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_NCCL_ENV = re.compile(r"NCCL INFO (NCCL_\w+) set by environment to (.*?)\.?\s*$")
_NCCL_COMM = re.compile(r"NCCL INFO comm 0x[0-9a-fA-F]+ rank \d+ n[Rr]anks (\d+)")

_RECOMPILE = re.compile(r"Recompiling function (\S+)")
_RECOMPILE_LIMIT = re.compile(r"hit config\.(?:cache_size_limit|recompile_limit) \((\d+)\)")
_INDUCTOR_TIME = re.compile(r"FX codegen and compilation took ([\d.]+)s")
_COMPILING = re.compile(r"Compiling .*with torch\.compile")


def _parse_ts(text: str) -> datetime | None:
    """``2026-05-18 16:04:46,338`` (Python logging's asctime) -> datetime; None when malformed."""
    try:
        frac = text[20:26]
        return datetime(
            int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]), int(text[14:16]),
            int(text[17:19]), int(frac.ljust(6, "0")) if frac else 0,
        )  # fmt: skip
    except ValueError:
        return None


class _TextLogParser:
    """State of one pass over a text log; see :func:`parse_text_log`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        self.file_rank = rank_from_name(path)
        self.result = LogResult(path=str(path))
        self.evidence: Counter[str] = Counter()
        self.prefix_ranks: set[int] = set()
        self._fact_seen: set[tuple[str, str]] = set()
        self.nccl = NcclInfo()
        self.nccl_seen = False
        self._chan_seen: set[NcclChannel] = set()
        self.hf_index = 0
        self.in_eval_banner = False
        # torchtitan timing per rank, timestamps kept as text and parsed in finish():
        # "Training starts" (ts, step, line); first step line (step, ts, line); the last two step lines
        self.titan_start: dict[int | None, tuple[str, int, int]] = {}
        self.titan_first: dict[int | None, tuple[int, str, int]] = {}
        self.titan_last: dict[int | None, list[tuple[int, str]]] = defaultdict(list)
        # compile evidence per rank
        self.recompiles: Counter[int | None] = Counter()
        self.recompile_limit: dict[int | None, int] = {}
        self.inductor_s: dict[int | None, float] = defaultdict(float)
        self.inductor_line: int | None = None
        self.recompile_line: int | None = None
        # litgpt optimizer-step lines (iter, step) for GAS
        self.lit_opt: list[tuple[int, int, int]] = []
        # torchtune resolved config block; blocks already parsed (a restarted job prints it again)
        self.cfg_block: list[str] | None = None
        self.cfg_start = 0
        self.cfg_seen: set[int] = set()

    # -- facts --------------------------------------------------------------------------------------
    def fact(self, key: str, value: Any, lineno: int | None, num: float | None = None) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            num = float(value)
            value = _fmt(num)
        value = str(value)
        if (key, value) in self._fact_seen:
            return
        self._fact_seen.add((key, value))
        src = f"{self.name}:{lineno}" if lineno else self.name
        self.result.facts.append(Fact(key, value, num, src))

    def add_fact(self, f: Fact) -> None:
        """Append a ready-made fact unless the same key and value are already known."""
        if (f.key, f.value) not in self._fact_seen:
            self._fact_seen.add((f.key, f.value))
            self.result.facts.append(f)

    def has_fact(self, key: str) -> bool:
        return any(k == key for k, _ in self._fact_seen)

    # -- lines --------------------------------------------------------------------------------------
    def feed(self, lineno: int, line: str) -> None:
        n_steps = len(self.result.steps)
        m = _PREFIX_RE.match(line)
        rank = self.file_rank
        if m.end():
            r = m.group("rank") or m.group("lrank")
            if r is not None:
                rank = int(r)
                self.prefix_ranks.add(rank)
            line = line[m.end() :]
        if self.cfg_block is not None:
            if self._config_line(line) and len(self.cfg_block) < 5000:
                self.cfg_block.append(line)
                return
            self._flush_config_block()
        s = line.strip()
        if not s:
            return
        if "NCCL" in s:
            self._nccl(lineno, s)
        if s.startswith("Step "):
            self._torchtune_step(lineno, s, rank)
            return
        if "step:" in s and ("loss:" in s or "Training" in s) or "Training starts" in s or " - INFO - " in s:
            if self._titan(lineno, s, rank):
                return
        if "iter " in s:
            self._litgpt(lineno, s, rank)
        if "{'" in s:
            self._hf_dicts(lineno, s, rank)
        if " = " in s or "*****" in s or "trainable parameters" in s:
            self._banner(lineno, s)
        if "ompil" in s or "_limit (" in s:
            self._compile(lineno, s, rank)
        if "torchtune" in s:
            self.evidence["torchtune"] += 1
            if _RESOLVED_CONFIG.search(s):
                self.cfg_block = []
                self.cfg_start = lineno + 1
        if "initialized with precision" in s:
            mp = _TT_PRECISION.search(s)
            if mp and normalize_precision(mp.group(1)):
                self.fact("precision", normalize_precision(mp.group(1)), lineno)
        if "llamafactory" in s or "Process rank:" in s:
            self._llamafactory(lineno, s)
        if "Automatic Mixed Precision" in s:
            ma = _LIGHTNING_AMP.search(s)
            if ma:
                self.fact("precision", "bf16" if "b" in ma.group(1) else "fp16", lineno)
        if n_steps == len(self.result.steps) and "tep" in s and not s.startswith("#"):  # not a comment
            self._console_step(line, rank)

    def _console_step(self, line: str, rank: int | None) -> None:
        """A plain console step line (module docstring), when no framework's format took the line."""
        m = _CONSOLE_STEP.match(line)
        if not m:
            return
        ms = float(m.group("v")) * (1.0 if m.group("u").lower() == "ms" else 1000.0)
        r = int(m.group("rank")) if m.group("rank") else rank
        if r is not None and m.group("rank"):
            self.prefix_ranks.add(r)
        self.evidence["console"] += 1
        self.result.steps.append(LogStep(rank=r, step=int(m.group("step")), step_time_ms=ms))

    # torchtune ------------------------------------------------------------------------------------
    def _torchtune_step(self, lineno: int, s: str, rank: int | None) -> None:
        m = _TT_STEP.match(s)
        if not m:
            return
        kv = {mm.group("k"): mm.group("v") for mm in _TT_KV.finditer(m.group("kv"))}
        mem = None
        for k in ("peak_memory_reserved", "peak_memory_alloc", "peak_memory_active"):
            if k in kv:
                mem = _num(kv[k])
                break
        if mem is None and "gpu_resources" in kv:
            b = _num(kv["gpu_resources"])
            mem = b / 2**30 if b is not None else None
        st = LogStep(
            rank=rank,
            step=int(m.group("step")),
            loss=_num(kv.get("loss")),
            lr=_num(kv.get("lr")),
            grad_norm=_num(kv.get("grad_norm")),
            tokens_per_s=_num(kv.get("tokens_per_second_per_gpu", kv.get("tokens_per_second"))),
            step_time_ms=_num(kv.get("step_time_ms")),
            memory_gib=mem,
        )
        self.result.steps.append(st)
        self.evidence["torchtune"] += 1

    def _config_line(self, line: str) -> bool:
        """True while a line still belongs to the YAML block torchtune prints after 'resolved config:'."""
        if not line.strip():
            return True
        if line.startswith((" ", "\t", "- ")):
            return True
        return bool(_YAML_KEY_LINE.match(line)) and not line.startswith(("INFO:", "DEBUG:", "WARNING:", "ERROR:"))

    def _flush_config_block(self) -> None:
        block, self.cfg_block = self.cfg_block or [], None
        key = hash(tuple(block))
        if not block or key in self.cfg_seen:
            return
        self.cfg_seen.add(key)
        try:
            data = yaml.safe_load("\n".join(block))
        except yaml.YAMLError as exc:
            self.result.warnings.append(f"{self.name}:{self.cfg_start}: resolved config is not YAML ({exc})")
            return
        if isinstance(data, dict):
            for f in _config_facts(data, block, self.name, self.cfg_start - 1):
                self.add_fact(f)

    # torchtitan -----------------------------------------------------------------------------------
    def _titan(self, lineno: int, s: str, rank: int | None) -> bool:
        hdr = _TITAN_HDR.match(s)
        msg = hdr.group("msg") if hdr else s
        ts = hdr.group("ts") if hdr else None
        if s.startswith("[titan]"):
            self.evidence["torchtitan"] += 1
        m = _TITAN_STEP.search(msg)
        if m:
            step = int(m.group("step"))
            self.result.steps.append(
                LogStep(
                    rank=rank,
                    step=step,
                    loss=_num(m.group("loss")),
                    grad_norm=_num(m.group("grad_norm")),
                    tokens_per_s=_num(m.group("tps")),
                    tflops=_num(m.group("tflops")),
                    mfu_pct=_num(m.group("mfu")),
                    memory_gib=_num(m.group("mem_gib")),
                )
            )
            self.evidence["torchtitan"] += 1
            if ts is not None:
                self.titan_first.setdefault(rank, (step, ts, lineno))
                last = self.titan_last[rank]
                last.append((step, ts))
                if len(last) > 2:
                    del last[0]
            return True
        if not hdr:
            return False
        ms = _TITAN_START.search(msg)
        if ms:
            if ts is not None and rank not in self.titan_start:
                self.titan_start[rank] = (ts, int(ms.group("step")), lineno)
            for key, rx in _TITAN_START_FIELDS.items():
                mf = rx.search(msg)
                if mf:
                    self.fact(key, int(mf.group(1)), lineno)
            return True
        mb = _TITAN_BUILD.search(msg)
        if mb and "device mesh" not in msg:
            self.fact("model_name", f"{mb.group(1)} {mb.group(2)}", lineno)
            return True
        mm = _TITAN_MESH.search(msg)
        if mm:
            names = [n.strip().strip("'\"") for n in mm.group(1).split(",") if n.strip()]
            dims = [_int(d) for d in mm.group(2).split(",") if d.strip()]
            if dims and all(d is not None for d in dims) and len(names) == len(dims):
                world = 1
                dp = 1
                for n, d in zip(names, dims, strict=True):
                    world *= d
                    if n.startswith("dp"):
                        dp *= d
                self.fact("world_size", world, lineno)
                self.fact("data_parallel_size", dp, lineno)
            return True
        return False

    # litgpt / nanoGPT -----------------------------------------------------------------------------
    def _litgpt(self, lineno: int, s: str, rank: int | None) -> None:
        m = _LIT_OLD.match(s)
        epoch = None
        if not m:
            m = _LIT_NEW.match(s)
            if m:
                epoch = float(m.group("epoch"))
        if m:
            it, step = int(m.group("iter")), int(m.group("step"))
            self.result.steps.append(
                LogStep(
                    rank=rank,
                    step=step,
                    iter=it,
                    loss=_num(m.group("loss")),
                    step_time_ms=_num(m.group("ms")),
                    epoch=epoch,
                )
            )
            if m.group("opt"):
                self.lit_opt.append((it, step, lineno))
            self.evidence["litgpt"] += 1
            return
        m = _NANOGPT.match(s)
        if m:
            mfu = _num(m.group("mfu"))
            it = int(m.group("iter"))
            self.result.steps.append(
                LogStep(
                    rank=rank,
                    step=it,
                    iter=it,
                    loss=_num(m.group("loss")),
                    step_time_ms=_num(m.group("ms")),
                    mfu_pct=mfu if mfu is not None and mfu >= 0 else None,
                )
            )
            self.evidence["nanogpt"] += 1

    # HF Trainer -----------------------------------------------------------------------------------
    @staticmethod
    def _literal_dict(text: str) -> dict[str, Any]:
        try:
            d = ast.literal_eval(text)
            if isinstance(d, dict):
                return d
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
        # e.g. "'grad_norm': tensor(0.5)" or np.float64(...): keep the plain numeric pairs
        return {k: _num(v) for k, v in _HF_NUM_PAIR.findall(text)}

    def _hf_dicts(self, lineno: int, s: str, rank: int | None) -> None:
        for text in _HF_DICT.findall(s):
            d = self._literal_dict(text)
            if "loss" not in d:
                continue
            self.hf_index += 1
            mem_mb = _num(d.get("step_peak_memory_reserved_MB"))
            self.result.steps.append(
                LogStep(
                    rank=rank,
                    step=self.hf_index,
                    loss=_num(d.get("loss")),
                    lr=_num(d.get("learning_rate")),
                    grad_norm=_num(d.get("grad_norm")),
                    tokens_per_s=_num(d.get("step_tokens_per_second")),
                    memory_gib=mem_mb / 1024 if mem_mb is not None else None,
                    epoch=_num(d.get("epoch")),
                )
            )
            self.evidence["hf_trainer"] += 1
        for text in _HF_SUMMARY.findall(s):
            d = self._literal_dict(text)
            v = _num(d.get("train_runtime"))
            if v is not None:
                self.fact("train_runtime_s", v, lineno)
                self.evidence["hf_trainer"] += 1

    def _banner(self, lineno: int, s: str) -> None:
        if "Running Evaluation" in s or "Running Prediction" in s:
            self.in_eval_banner = True
            return
        if "Running training" in s:
            self.in_eval_banner = False
        if self.in_eval_banner:
            return
        for key, rx in _HF_BANNER:
            m = rx.search(s)
            if m:
                v = _int(m.group(1))
                if v is not None:
                    self.fact(key, v, lineno)
                    self.evidence["hf_trainer"] += 1

    def _llamafactory(self, lineno: int, s: str) -> None:
        if "llamafactory" in s:
            self.evidence["llamafactory"] += 1
        m = _LF_PROCESS.search(s)
        if m:
            if m.group("ws"):
                self.fact("world_size", int(m.group("ws")), lineno)
            if m.group("ngpu"):
                self.fact("n_gpu", int(m.group("ngpu")), lineno)
        md = _COMPUTE_DTYPE.search(s)
        if md and normalize_precision(md.group(1)):
            self.fact("precision", normalize_precision(md.group(1)), lineno)

    # NCCL -----------------------------------------------------------------------------------------
    def _nccl(self, lineno: int, s: str) -> None:
        if "NCCL INFO" in s or "NCCL WARN" in s:
            self.nccl_seen = True
        m = _NCCL_CHANNEL.match(s)
        if m:
            transport = m.group("transport")
            ch = NcclChannel(
                host=m.group("host"),
                pid=int(m.group("pid")),
                device=int(m.group("dev")),
                channel=int(m.group("ch")),
                src_rank=int(m.group("src")),
                dst_rank=int(m.group("dst")),
                direction=m.group("dir"),
                transport=transport,
                detail=f"{transport}/{m.group('detail')}",
            )
            if ch not in self._chan_seen:
                self._chan_seen.add(ch)
                self.nccl.channels.append(ch)
            return
        m = _NCCL_VERSION.search(s)
        if m:
            self.nccl_seen = True
            if self.nccl.version is None:
                self.nccl.version = m.group(1)
            self.fact("nccl_version", m.group(1), lineno)
            return
        m = _NCCL_NETWORK.search(s)
        if m:
            if m.group(1) not in self.nccl.networks:
                self.nccl.networks.append(m.group(1))
            return
        m = _NCCL_ENV.search(s)
        if m:
            self.nccl.env.setdefault(m.group(1), m.group(2))
            return
        m = _NCCL_COMM.search(s)
        if m:
            self.nccl.nranks = max(self.nccl.nranks or 0, int(m.group(1)))

    # torch.compile ---------------------------------------------------------------------------------
    def _compile(self, lineno: int, s: str, rank: int | None) -> None:
        if _RECOMPILE.search(s):
            self.recompiles[rank] += 1
            self.recompile_line = self.recompile_line or lineno
            return
        m = _RECOMPILE_LIMIT.search(s)
        if m:
            self.recompile_limit[rank] = max(self.recompile_limit.get(rank, 0), int(m.group(1)))
            self.recompile_line = self.recompile_line or lineno
            return
        m = _INDUCTOR_TIME.search(s)
        if m:
            self.inductor_s[rank] += float(m.group(1))
            self.inductor_line = self.inductor_line or lineno
            return
        if _COMPILING.search(s):
            self.fact("compile", "true", lineno)

    # end -------------------------------------------------------------------------------------------
    def finish(self) -> LogResult:
        if self.cfg_block is not None:
            self._flush_config_block()
        res = self.result
        if len(self.prefix_ranks) == 1:
            res.rank = next(iter(self.prefix_ranks))
        elif not self.prefix_ranks:
            res.rank = self.file_rank
        self._derive_world_size()
        self._derive_litgpt_gas()
        self._compile_facts()
        if self.evidence:
            fw = self.evidence.most_common(1)[0][0]
            if self.evidence["llamafactory"] and self.evidence["hf_trainer"]:
                fw = "llamafactory"
            res.framework = fw
            res.facts.insert(0, Fact("framework", fw, None, self.name))
        if self.nccl_seen or self.nccl.channels:
            res.nccl = self.nccl
        return res

    def _derive_world_size(self) -> None:
        """HF banner: world_size = global_batch / (per_device_batch × GAS) when integral (FORMATS §9)."""
        if self.has_fact("world_size"):
            return
        g = self.result.fact("global_batch")
        p = self.result.fact("per_device_batch")
        a = self.result.fact("gradient_accumulation_steps")
        if g and p and a and g.num and p.num and a.num:
            denom = p.num * a.num
            if g.num % denom == 0:
                self.add_fact(Fact("world_size", _fmt(g.num // denom), float(g.num // denom), g.source))

    def _derive_litgpt_gas(self) -> None:
        """litgpt: GAS = micro-batch iterations per optimizer step, from the ``(optimizer.step)`` lines."""
        if self.has_fact("gradient_accumulation_steps") or not self.lit_opt:
            return
        cands: Counter[int] = Counter()
        for (i0, s0, _), (i1, s1, _) in zip(self.lit_opt, self.lit_opt[1:], strict=False):
            if s1 > s0 and (i1 - i0) % (s1 - s0) == 0 and i1 > i0:
                cands[(i1 - i0) // (s1 - s0)] += 1
        if not cands:
            for it, st, _ in self.lit_opt:
                if st > 0 and it % st == 0:
                    cands[it // st] += 1
        if cands:
            self.fact("gradient_accumulation_steps", cands.most_common(1)[0][0], self.lit_opt[0][2])

    def _compile_facts(self) -> None:
        recompiles = {r: max(n, self.recompile_limit.get(r, 0)) for r, n in self.recompiles.items()}
        for r, n in self.recompile_limit.items():
            recompiles.setdefault(r, n)
        if recompiles:
            self.fact("recompiles", max(recompiles.values()), self.recompile_line)
        if self.inductor_s:
            self.fact("compile_time_s", round(max(self.inductor_s.values()), 3), self.inductor_line)
            return
        # torchtitan: first logged step time minus one steady-state step, per rank; worst rank wins
        best: tuple[float, float, int] | None = None  # (first_step_s, compile_s, line)
        for rank, (s1, ts1, line1) in self.titan_first.items():
            start = self.titan_start.get(rank) or self.titan_start.get(None)
            t1 = _parse_ts(ts1)
            t0 = _parse_ts(start[0]) if start else None
            if start is None or t0 is None or t1 is None:
                continue
            start_step = start[1]
            first = (t1 - t0).total_seconds()
            steady = None
            last = self.titan_last[rank]
            if len(last) == 2:
                (sa, tsa), (sb, tsb) = last
                ta, tb = _parse_ts(tsa), _parse_ts(tsb)
                if sb > sa and ta is not None and tb is not None:
                    steady = (tb - ta).total_seconds() / (sb - sa)
            compile_s = first - (s1 - start_step + 1) * steady if steady is not None else None
            if best is None or first > best[0]:
                best = (first, compile_s if compile_s is not None else float("nan"), line1)
        if best is None:
            return
        first, compile_s, line1 = best
        self.fact("first_step_s", round(first, 3), line1)
        compiled = any(f.key == "compile" and f.value == "true" for f in self.result.facts)
        if compiled and compile_s == compile_s and compile_s > 0:
            self.fact("compile_time_s", round(compile_s, 3), line1)


def parse_text_log(path: Path, max_bytes: int | None = None) -> LogResult:
    """Parse a training log (and any NCCL_DEBUG=INFO lines in it) in one streamed pass; this is also the
    parser for files :func:`sniff` calls ``"nccl_debug"`` (``framework`` None, ``nccl`` set).

    Recognises torchtune ``Step N | k:v``, torchtitan ``step: .. loss: .. memory: ..GiB(..%) tps: ..``
    (with or without ``[titan]``/``[rankN]:`` prefixes), litgpt ``iter N step M: ...`` (old) and
    ``Epoch E | iter N step M | ...`` (current), nanoGPT ``iter N: loss X, time Yms, mfu Z%``, the HF
    Trainer banner and ``{'loss': ...}`` dicts, LLaMA-Factory ``Process rank: ..., world size: ...``, NCCL
    INFO lines, and torch.compile lines (``Recompiling function``, ``hit config.cache_size_limit``,
    inductor's ``FX codegen and compilation took Xs``, ``Compiling ... with torch.compile``). A LLaMA-Factory
    ``trainer_log.jsonl`` or HF ``trainer_state.json`` is dispatched to its own parser.

    ``compile_time_s``: the sum of inductor's "FX codegen and compilation took" seconds (per rank, worst
    rank); without those, for torchtitan logs with compile on, first-step time (from "Training starts at
    step" to the first step line) minus one steady-state step (from the last two step lines' timestamps).

    ``max_bytes`` bounds what the file may inflate to (default :data:`DEFAULT_MAX_BYTES`; README, Safety).

    Raises :class:`InputError` when the file cannot be read or is over the bound; odd content never raises.
    """
    path = Path(path)
    fh = _open_binary(path)
    try:
        with fh:
            start = fh.read(4096)
    except (EOFError, zlib.error):
        start = b""  # truncated gzip: the line reader below keeps what it can and warns
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc})") from None
    lead = start.lstrip()
    name = path.name.lower().removesuffix(".gz")
    if lead[:1] in (b"{", b"[") and name.endswith(".json") and is_step_times_json(start):
        return parse_step_times_json(path)
    if lead[:1] == b"{":
        if name.endswith(".jsonl") or b'"current_steps"' in start.split(b"\n", 1)[0]:
            return parse_llamafactory_jsonl(path, max_bytes)
        if name.endswith(".json"):
            return _parse_trainer_state(path, max_bytes)
    p = _TextLogParser(path)
    for lineno, line in _iter_lines(path, p.result.warnings, max_bytes):
        p.feed(lineno, line)
    return p.finish()


def _hms_seconds(text: Any) -> float | None:
    """Seconds from ``"5:13:22"``, ``"1 day, 2:03:04"`` or a number; None when unreadable."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"\s*(?:(\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)\s*", text)
    if not m:
        return _num(text)
    days = int(m.group(1) or 0)
    return days * 86400 + int(m.group(2)) * 3600 + int(m.group(3)) * 60 + float(m.group(4))


def parse_llamafactory_jsonl(path: Path, max_bytes: int | None = None) -> LogResult:
    """Parse LLaMA-Factory's ``trainer_log.jsonl`` (one JSON object per logging step).

    Keys used: ``current_steps`` -> step, ``total_steps`` -> fact ``total_optimization_steps``, ``loss``,
    ``learning_rate`` -> lr, ``epoch``, ``elapsed_time`` (``"H:MM:SS"``) -> ``step_time_ms`` =
    Δelapsed / Δsteps since the previous entry (the first entry: elapsed / current_steps).
    Lines that are not JSON objects are skipped with one warning. Raises :class:`InputError` when the file
    cannot be read.
    """
    path = Path(path)
    res = LogResult(path=str(path), framework="llamafactory", rank=rank_from_name(path))
    res.facts.append(Fact("framework", "llamafactory", None, path.name))
    prev: tuple[int, float] | None = None
    bad = 0
    total_seen = False
    for lineno, line in _iter_lines(path, res.warnings, max_bytes):
        try:
            d = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(d, dict) or _int(d.get("current_steps")) is None:
            bad += 1
            continue
        step = _int(d["current_steps"])
        elapsed = _hms_seconds(d.get("elapsed_time"))
        st_ms = None
        if elapsed is not None:
            if prev is None and step > 0:
                st_ms = elapsed / step * 1000
            elif prev is not None and step > prev[0]:
                st_ms = (elapsed - prev[1]) / (step - prev[0]) * 1000
            prev = (step, elapsed)
        res.steps.append(
            LogStep(
                rank=res.rank,
                step=step,
                loss=_num(d.get("loss")),
                lr=_num(d.get("learning_rate")),
                epoch=_num(d.get("epoch")),
                step_time_ms=st_ms,
            )
        )
        total = _int(d.get("total_steps"))
        if total is not None and not total_seen:
            total_seen = True
            res.facts.append(Fact("total_optimization_steps", str(total), float(total), f"{path.name}:{lineno}"))
    if bad:
        res.warnings.append(f"{path.name}: {bad} line(s) are not trainer_log JSON objects; skipped")
    return res


def _parse_trainer_state(path: Path, max_bytes: int | None = None) -> LogResult:
    """HF ``trainer_state.json``: ``log_history`` entries with ``loss`` become steps (``step`` as logged);
    ``train_batch_size`` -> per_device_batch, ``max_steps`` -> total_optimization_steps."""
    res = LogResult(path=str(path), framework="hf_trainer", rank=rank_from_name(path))
    try:
        data = json.loads(_read_text(path, max_bytes))
    except (ValueError, RecursionError) as exc:
        res.warnings.append(f"{path.name}: not JSON ({exc})")
        res.framework = None
        return res
    if not isinstance(data, dict) or not isinstance(data.get("log_history"), list):
        res.warnings.append(f"{path.name}: no log_history list")
        res.framework = None
        return res
    res.facts.append(Fact("framework", "hf_trainer", None, path.name))
    for key, fkey in (("train_batch_size", "per_device_batch"), ("max_steps", "total_optimization_steps")):
        v = _int(data.get(key))
        if v is not None and v > 0:
            res.facts.append(Fact(fkey, str(v), float(v), path.name))
    for e in data["log_history"]:
        if isinstance(e, dict) and "loss" in e and _int(e.get("step")) is not None:
            res.steps.append(
                LogStep(
                    rank=res.rank,
                    step=_int(e["step"]),
                    loss=_num(e.get("loss")),
                    lr=_num(e.get("learning_rate")),
                    grad_norm=_num(e.get("grad_norm")),
                    epoch=_num(e.get("epoch")),
                )
            )
        elif isinstance(e, dict) and _num(e.get("train_runtime")) is not None:
            v = _num(e["train_runtime"])
            res.facts.append(Fact("train_runtime_s", _fmt(v), v, path.name))
    return res


# --------------------------------------------------------------------------------------------------------
# nvidia-smi topo -m
# --------------------------------------------------------------------------------------------------------

_DEVICE_RE = re.compile(r"^(?:GPU\d+|NIC\d+|mlx5_\d+)$")
_LINK_RE = re.compile(r"^(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_HEADER_TOKEN = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|\S+")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")


def parse_topology(path: Path, max_bytes: int | None = None) -> Topology:
    """Parse ``nvidia-smi topo -m`` output (tab- or space-separated).

    The header row gives the column order (``GPU0``.., ``NIC0``/``mlx5_0``.., then ``CPU Affinity``,
    ``NUMA Affinity``, ``GPU NUMA ID`` when present); rows ``GPUn``/``NICn``/``mlx5_n`` give one cell per
    device (``X``, ``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``; ``SOC`` in old drivers), then the
    affinity columns. The Legend is skipped, except ``NIC Legend`` lines (``NIC0: mlx5_0``). A second header
    row starts a new matrix whose rows overwrite earlier ones. Odd content gives an empty topology with a
    warning. Raises :class:`InputError` when the file cannot be read.
    """
    path = Path(path)
    topo = Topology()
    columns: list[str] = []
    trailing: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    for _, line in _iter_lines(path, topo.warnings, max_bytes):
        tokens = line.split()
        if not tokens:
            continue
        m = _NIC_LEGEND.match(line)
        if m:
            topo.nic_names[m.group(1)] = m.group(2)
            continue
        if _DEVICE_RE.match(tokens[0]) and len(tokens) > 1 and (_DEVICE_RE.match(tokens[1]) or tokens[1] == "CPU"):
            header = _HEADER_TOKEN.findall(line)
            columns = [t for t in header if _DEVICE_RE.match(t)]
            trailing = [t for t in header if not _DEVICE_RE.match(t)]
            for c in columns:
                if c not in topo.devices:
                    topo.devices.append(c)
            continue
        if not columns or not _DEVICE_RE.match(tokens[0]) or len(tokens) < 2 or not _LINK_RE.match(tokens[1]):
            continue
        row = tokens[0]
        vals = tokens[1:]
        n = 0
        for col, v in zip(columns, vals, strict=False):
            if not _LINK_RE.match(v):
                break
            n += 1
            if col != row:
                cells[(row, col)] = v
        rest = vals[n:] if n == len(columns) else []
        for col_name, v in zip(trailing, rest, strict=False):
            if col_name == "CPU Affinity":
                topo.cpu_affinity[row] = v
            elif col_name == "NUMA Affinity":
                topo.numa_affinity[row] = v
            elif col_name == "GPU NUMA ID":
                topo.gpu_numa_id[row] = v
    for (a, b), v in list(cells.items()):
        cells.setdefault((b, a), v)
    order = {d: i for i, d in enumerate(topo.devices)}
    big = len(order)
    for (a, b), v in sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], big), order.get(kv[0][1], big))):
        topo.links.append(TopoLink(a, b, v))
    if not topo.links:
        topo.warnings.append(f"{path.name}: no nvidia-smi topo -m matrix found")
    return topo


# --------------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------------


def _get(data: dict[str, Any], dotted: str) -> Any:
    cur: Any = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _line_of(lines: list[str], dotted: str) -> int | None:
    """1-based line where a (dotted) key is written: each part is searched after the previous one, as a
    YAML ``key:``, TOML ``key =`` / ``[section]``, or JSON ``"key":``."""
    start = 0
    found = None
    for part in dotted.split("."):
        rx = re.compile(
            rf"^\s*(?:\[{re.escape(part)}\]\s*$|{re.escape(part)}\s*[:=]|\"{re.escape(part)}\"\s*:)"
            rf"|[{{,]\s*\"{re.escape(part)}\"\s*:"
        )
        for i in range(start, len(lines)):
            if rx.search(lines[i]):
                found = i
                start = i + 1
                break
        else:
            return None
    return None if found is None else found + 1


def _truthy(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return v.strip().lower() in ("true", "yes", "1")
    if isinstance(v, int):
        return bool(v)
    return None


def _config_facts(data: dict[str, Any], lines: list[str], name: str, line_offset: int = 0) -> list[Fact]:
    """Map a loaded config (torchtune / LLaMA-Factory / litgpt YAML, torchtitan TOML, HF JSON) to facts."""
    facts: list[Fact] = []
    seen: set[str] = set()

    def add(key: str, value: Any, dotted: str | None) -> None:
        if key in seen or value is None:
            return
        num = None
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            num = float(value)
            text = _fmt(num)
        else:
            text = str(value)
        ln = _line_of(lines, dotted) if dotted else None
        seen.add(key)
        facts.append(Fact(key, text, num, f"{name}:{ln + line_offset}" if ln else name))

    def first(*keys: str) -> tuple[Any, str | None]:
        for k in keys:
            v = _get(data, k)
            if v is not None:
                return v, k
        return None, None

    def pos_int(*keys: str) -> tuple[int | None, str | None]:
        for k in keys:
            v = _get(data, k)
            if isinstance(v, bool):
                continue
            iv = _int(v)
            if iv is not None and iv > 0:
                return iv, k
        return None, None

    pdb, k = pos_int("per_device_train_batch_size", "training.local_batch_size", "training.batch_size",
                     "train.micro_batch_size", "batch_size", "micro_batch_size")  # fmt: skip
    add("per_device_batch", pdb, k)
    gas, k = pos_int("gradient_accumulation_steps", "training.gradient_accumulation_steps")
    add("gradient_accumulation_steps", gas, k)
    gb, kgb = pos_int("training.global_batch_size", "train.global_batch_size", "global_batch_size")
    add("global_batch", gb, kgb)
    v, k = pos_int("max_seq_len", "tokenizer.max_seq_len", "cutoff_len", "training.seq_len",
                   "train.max_seq_length", "max_seq_length", "seq_len", "block_size")  # fmt: skip
    add("seq_len", v, k)
    lr, k = first("learning_rate", "optimizer.lr", "optimizer.init_args.lr", "train.learning_rate", "lr")
    add("learning_rate", _num(lr) if not isinstance(lr, bool) else None, k)

    # precision
    prec, kp = None, None
    conv = _get(data, "model.converters")
    if (isinstance(conv, list) and any("float8" in str(c) for c in conv)) or _truthy(
        _get(data, "float8.enable_float8_linear")
    ):
        prec, kp = "fp8", "model.converters" if conv else "float8.enable_float8_linear"
    if prec is None:
        for key in ("dtype", "training.mixed_precision_param", "precision", "mixed_precision"):
            val = _get(data, key)
            if normalize_precision(val):
                prec, kp = normalize_precision(val), key
                break
    if prec is None and _truthy(_get(data, "pure_bf16")):
        prec, kp = "bf16", "pure_bf16"
    if prec is None and any(isinstance(_get(data, k), bool) for k in ("bf16", "fp16")):
        if _get(data, "bf16") is True:
            prec, kp = "bf16", "bf16"
        elif _get(data, "fp16") is True:
            prec, kp = "fp16", "fp16"
        else:  # both stated false: the Trainer runs fp32 (TF32 matmuls when tf32 is on)
            prec, kp = ("tf32", "tf32") if _get(data, "tf32") is True else ("fp32", "bf16")
    add("precision", prec, kp)

    # compile
    comp, kc = None, None
    c = data.get("compile")
    if isinstance(c, dict):
        if "enable" in c:
            comp, kc = _truthy(c.get("enable")), "compile.enable"
        elif "components" in c:
            comp, kc = bool(c.get("components")), "compile.components"
    elif _truthy(c) is not None:
        comp, kc = _truthy(c), "compile"
    if comp is None:
        for key in ("training.compile", "torch_compile"):
            if _truthy(_get(data, key)) is not None:
                comp, kc = _truthy(_get(data, key)), key
                break
    add("compile", comp, kc)

    # model name
    mname, km = first("model_name_or_path", "model_name", "model.name")
    if km == "model.name" and isinstance(_get(data, "model.flavor"), str):
        mname = f"{mname} {_get(data, 'model.flavor')}"
    if mname is None:
        comp_name = _get(data, "model._component_")
        if isinstance(comp_name, str):
            mname, km = comp_name.rsplit(".", 1)[-1], "model._component_"
    if mname is None:
        ckpt = _get(data, "checkpoint_dir")
        if isinstance(ckpt, str) and ckpt.strip("/"):
            mname, km = "/".join(ckpt.strip("/").split("/")[-2:]), "checkpoint_dir"
    if isinstance(mname, str):
        add("model_name", mname, km)

    # sizes of the job
    ws, kw = pos_int("world_size")
    devices = _get(data, "devices")
    if ws is None and _int(devices) is not None and not isinstance(devices, bool) and _int(devices) > 0:
        nodes = _int(_get(data, "num_nodes")) or 1
        ws, kw = _int(devices) * nodes, "devices"
    add("world_size", ws, kw)
    ngpu, k = pos_int("_n_gpu")
    add("n_gpu", ngpu, k)
    rep, _ = pos_int("parallelism.data_parallel_replicate_degree")
    shard = _int(_get(data, "parallelism.data_parallel_shard_degree"))
    dp, kdp = None, None
    if shard is not None and shard > 0:
        dp, kdp = shard * (rep or 1), "parallelism.data_parallel_shard_degree"
    else:
        dp, kdp = pos_int("training.data_parallel_degree")
    add("data_parallel_size", dp, kdp)
    steps, k = pos_int("max_steps", "training.steps")
    add("total_optimization_steps", steps, k)

    # derived: GAS = global / (per-device × data-parallel size) when integral (torchtitan, litgpt)
    if gas is None and gb and pdb:
        dps = dp or (ws if kw == "devices" else None)
        if dps and gb % (pdb * dps) == 0:
            add("gradient_accumulation_steps", gb // (pdb * dps), kgb)
    return facts


def parse_config(path: Path, max_bytes: int | None = None) -> list[Fact]:
    """Facts from a training config file, by suffix: ``.yaml``/``.yml`` (torchtune recipe, LLaMA-Factory,
    litgpt ``hyperparameters.yaml``), ``.toml`` (torchtitan job config), ``.json`` (HF ``TrainingArguments``).

    Keys read (first present wins): per_device_batch <- ``per_device_train_batch_size`` |
    ``training.local_batch_size`` | ``training.batch_size`` | ``train.micro_batch_size`` | ``batch_size``;
    gradient_accumulation_steps <- ``gradient_accumulation_steps`` (else derived as global /
    (per-device × data-parallel size) when integral); global_batch <- ``training.global_batch_size`` (> 0) |
    ``train.global_batch_size``; seq_len <- ``max_seq_len`` | ``tokenizer.max_seq_len`` | ``cutoff_len`` |
    ``training.seq_len`` | ``train.max_seq_length``; learning_rate <- ``learning_rate`` | ``optimizer.lr``;
    precision <- float8 converters (fp8) | ``dtype`` | ``training.mixed_precision_param`` | ``precision`` |
    ``pure_bf16`` | HF ``bf16``/``fp16``/``tf32`` flags (both flags stated false -> fp32, or tf32);
    compile <- ``compile`` (bool) | ``compile.enable`` | ``training.compile`` | ``torch_compile``;
    model_name <- ``model_name_or_path`` | ``model.name`` + ``model.flavor`` | ``model._component_``;
    world_size <- ``world_size`` | litgpt ``devices`` × ``num_nodes``; n_gpu <- ``_n_gpu``;
    data_parallel_size <- torchtitan ``parallelism.data_parallel_shard_degree`` (> 0) ×
    ``data_parallel_replicate_degree``; total_optimization_steps <- ``max_steps`` (> 0) | ``training.steps``.

    Content that does not parse, or is not a mapping, gives ``[]``. Raises :class:`InputError` when the
    file cannot be read, or for a TOML file when neither ``tomllib`` (Python 3.11+) nor ``tomli`` is
    installed.
    """
    path = Path(path)
    text = _read_text(path, max_bytes)  # bounded: README, Safety
    suffix = Path(path.name.lower().removesuffix(".gz")).suffix
    data: Any
    try:
        if suffix == ".toml":
            if tomllib is None:
                raise InputError(path, "TOML configs need Python 3.11+ (tomllib) or the tomli package")
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, RecursionError):  # odd content: no facts, never a crash
        return []
    if not isinstance(data, dict):
        return []
    return _config_facts(data, text.splitlines(), path.name)


def parse_env(path: Path, max_bytes: int | None = None) -> list[Fact]:
    """Facts from an ``env_rank{r}.json`` written by :mod:`traceanalyze.capture` (``capture.environment``).

    Keys: ``world_size``, ``nccl_version`` (standard keys); ``torch_version``, ``cuda_version``,
    ``python_version``, ``hostname``, ``backend``, ``gpu`` and ``env`` (one fact per communication variable,
    ``NAME=value``, e.g. ``NCCL_P2P_DISABLE=1``). Only the variables ``capture`` records are kept
    (:func:`traceanalyze.capture.env_allowed`): anything else in the file, and any name that looks like a
    credential, is never stored or printed. Content that does not parse gives ``[]``. Raises
    :class:`InputError` when the file cannot be read.
    """
    from traceanalyze.capture import env_allowed
    from traceanalyze.safety import redact_text

    path = Path(path)
    text = _read_text(path, max_bytes)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return []
    if not isinstance(data, dict):
        return []
    src = path.name
    out: list[Fact] = []

    def add(key: str, v: Any) -> None:
        if v is None or v == "" or isinstance(v, (dict, list)):
            return
        out.append(Fact(key, str(v), _num(v) if key == "world_size" else None, src))

    add("world_size", data.get("world_size"))
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    add("nccl_version", versions.get("nccl"))
    for k in ("torch", "cuda", "python"):
        add(f"{k}_version", versions.get(k))
    add("hostname", data.get("hostname"))
    add("backend", data.get("backend"))
    for g in data.get("gpus") or []:
        add("gpu", g)
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    for k, v in sorted((k, v) for k, v in env.items() if env_allowed(k)):
        if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK", "MASTER_PORT"):  # per-process noise
            add("env", redact_text(f"{k}={v}"))
    return out
