"""What the logs say, as data: the shapes every log parser returns, and the words they share.

Per-step numbers (:class:`LogStep`), named facts about the run (:class:`Fact`), NCCL transports
(:class:`NcclInfo`, :class:`NcclChannel`), one log file's result (:class:`LogResult`) and the GPU/NIC link matrix
(:class:`Topology`, :class:`TopoLink`); the precision names (:func:`normalize_precision`), the effective batch
(:func:`effective_batch`), and how a printed number is read (:func:`to_number`, :func:`to_int`) and written back
as a fact's text (:func:`number_text`).

The standard :class:`Fact` keys are listed in :mod:`traceanalyze.logs`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Fact:
    """One stated (or simply derived) fact about a run.

    ``key`` is one of the standard keys listed in :mod:`traceanalyze.logs`; ``value`` is the text form
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
class OomEvent:
    """One record that a process died of memory: a CUDA out-of-memory error, or a kill (SIGKILL / exit code -9).

    ``kind`` is ``"cuda"`` (the GPU's memory) or ``"host"`` (a kill, which on Linux is the kernel's OOM killer unless
    something else sent it); ``form`` where it came from: ``"torch>=2.2"``, ``"torch 2.0-2.1"``, ``"torch<=1.13"``
    (the three CUDA OOM messages), ``"torchrun"`` (its ``failed (exitcode: -9)`` line or failure block),
    ``"kernel"`` (``Out of memory: Killed process``) or ``"shell"`` (a bare ``Killed``). ``rank`` is the global
    rank (a ``[rankN]:`` prefix, the failure block, the file name), ``local_rank`` the rank on its host, ``gpu``
    the CUDA device index the message names. Sizes in bytes (None when not stated): ``tried_bytes`` the allocation
    that failed, ``capacity_bytes`` the GPU's total, ``free_bytes`` what was free, ``in_use_bytes`` what the
    process held including non-PyTorch memory (>= 2.2), ``allocated_bytes`` allocated by PyTorch,
    ``reserved_unallocated_bytes`` reserved by PyTorch's caching allocator but unallocated (<= 1.13: reserved less
    allocated), ``rss_bytes`` the killed process's resident anonymous memory (kernel line). ``exitcode`` as
    torchrun states it; ``signal`` e.g. ``"SIGKILL"``; ``host`` the host name (``[A-Za-z0-9._-]``, at most
    :data:`~traceanalyze.limits.MAX_HOST_NAME` characters); ``source`` ``"<file>:<line>"``; ``oom_killer`` True when
    the kernel's ``Out of memory: Killed process`` line names the process; ``phase`` ``"checkpoint_load"`` when the
    log's last sign of progress before a kill was a checkpoint starting to load (no training step since), else None.
    """

    kind: str
    form: str
    source: str
    rank: int | None = None
    local_rank: int | None = None
    gpu: int | None = None
    host: str | None = None
    pid: int | None = None
    exitcode: int | None = None
    signal: str | None = None
    tried_bytes: int | None = None
    capacity_bytes: int | None = None
    free_bytes: int | None = None
    in_use_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    rss_bytes: int | None = None
    oom_killer: bool = False
    phase: str | None = None


@dataclass(slots=True)
class LogResult:
    """Everything one log file says.

    ``framework`` is ``"torchtune"``, ``"torchtitan"``, ``"litgpt"``, ``"nanogpt"``, ``"hf_trainer"``,
    ``"llamafactory"`` or None; ``rank`` is the file's rank when the file belongs to one rank (single
    ``[rankN]:`` prefix, or a name such as ``rank3.log``), else None; ``ooms`` the out-of-memory errors and kills
    the log records (:class:`OomEvent`, in file order); ``warnings`` are notes on content that could not be used
    (never fatal); ``bad_values`` the figures a line stated out of any plausible range and left out (a warning each).
    """

    path: str
    framework: str | None = None
    rank: int | None = None
    steps: list[LogStep] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    nccl: NcclInfo | None = None
    ooms: list[OomEvent] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bad_values: list[str] = field(default_factory=list)

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


def to_number(text: Any) -> float | None:
    """Float from a printed number (``"1,234"``, ``"3.5"``, ``"nan"``); None when not a number."""
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    try:
        return float(str(text).replace(",", "").strip())
    except ValueError:
        return None


def to_int(text: Any) -> int | None:
    """Integer from a printed number (``"1,024"``, ``8.0``); None when not a whole finite number."""
    v = to_number(text)
    if v is None or v != v or v in (float("inf"), float("-inf")) or v != int(v):
        return None
    return int(v)


def number_text(v: float) -> str:
    """Text form of a number: integers without a decimal point."""
    if v == int(v) and abs(v) < 1e18:
        return str(int(v))
    return repr(float(v))
