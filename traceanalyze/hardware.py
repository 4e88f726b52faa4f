"""GPU capabilities: which fast math precisions a GPU has, so that advice names only what it supports.

The one table of compute capabilities (:data:`GPU_CAPABILITY`) and what each capability offers
(:func:`features`). Sources: NVIDIA CUDA C++ Programming Guide, "Compute Capabilities" (tensor cores from
sm70; bf16 and TF32 tensor-core math from sm80, Ampere; FP8 tensor-core math from sm89, Ada, and sm90, Hopper,
and later), and NVIDIA's "CUDA GPUs - Compute Capability" list (developer.nvidia.com/cuda-gpus) for the names.

The GPU of a run comes from the trace's ``deviceProperties`` (``computeMajor``/``computeMinor``, or
``major``/``minor`` in the 2021 schema's ``computeProperties``) and its ``name``; when the trace has none, from the
``--gpu`` option (a name such as ``V100`` or ``H100``, or a capability such as ``sm70``, ``sm_90``, ``8.0``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Device-name substring -> compute capability (major, minor). First match wins: longer names first.
GPU_CAPABILITY: list[tuple[str, tuple[int, int]]] = [
    ("GB200", (10, 0)), ("B200", (10, 0)), ("B100", (10, 0)),
    ("GH200", (9, 0)), ("H200", (9, 0)), ("H100", (9, 0)), ("H800", (9, 0)), ("H20", (9, 0)),
    ("L40S", (8, 9)), ("L40", (8, 9)), ("L4", (8, 9)), ("RTX 6000 Ada", (8, 9)), ("RTX 4090", (8, 9)),
    ("RTX 4080", (8, 9)),
    ("A100", (8, 0)), ("A800", (8, 0)), ("A30", (8, 0)),
    ("A10G", (8, 6)), ("A10", (8, 6)), ("A40", (8, 6)), ("A6000", (8, 6)), ("RTX 3090", (8, 6)),
    ("RTX 3080", (8, 6)), ("A2", (8, 6)),
    ("T4", (7, 5)), ("RTX 2080", (7, 5)), ("Quadro RTX", (7, 5)),
    ("V100", (7, 0)), ("TITAN V", (7, 0)),
    ("P100", (6, 0)), ("P40", (6, 1)), ("P4", (6, 1)), ("K80", (3, 7)),
]
_SM = re.compile(r"^\s*(?:sm[_ ]?)?(\d{1,2})\.?(\d)\s*$", re.IGNORECASE)


@dataclass
class GpuInfo:
    """The run's GPU as far as it is known: ``name`` (None when unknown), ``capability`` (major, minor) or None,
    and ``source`` (where it was read: ``trace deviceProperties``, ``--gpu``, ...)."""

    name: str | None = None
    capability: tuple[int, int] | None = None
    source: str = "unknown"

    @property
    def sm(self) -> str | None:
        """``sm70``, ``sm90``, ... or None."""
        return f"sm{self.capability[0]}{self.capability[1]}" if self.capability else None

    @property
    def label(self) -> str:
        """``Tesla V100-SXM2-16GB (sm70)``, ``sm80``, or ``unknown GPU``."""
        if self.name and self.sm:
            return f"{self.name} ({self.sm})"
        return self.name or self.sm or "unknown GPU"


def capability_of(name: str | None) -> tuple[int, int] | None:
    """Compute capability of a device name from :data:`GPU_CAPABILITY` (substring, case-insensitive); None when
    not listed."""
    if not name:
        return None
    low = name.lower()
    for key, cc in GPU_CAPABILITY:
        if key.lower() in low:
            return cc
    return None


def parse_gpu_option(text: str) -> GpuInfo:
    """``--gpu`` value → :class:`GpuInfo`: ``sm70``, ``sm_90``, ``8.0``, ``89`` are capabilities; anything else is a
    device name looked up in :data:`GPU_CAPABILITY` (capability None when not listed)."""
    m = _SM.match(text)
    if m:
        return GpuInfo(None, (int(m.group(1)), int(m.group(2))), "--gpu")
    return GpuInfo(text.strip()[:100], capability_of(text), "--gpu")


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 else None


def from_properties(props, key: str = "deviceProperties") -> GpuInfo | None:
    """The first device of a trace header's ``deviceProperties`` (``computeProperties`` in the 2021 schema: pass
    its ``key``) list, or None."""
    if not isinstance(props, list):
        return None
    for p in props:
        if not isinstance(p, dict):
            continue
        name = p.get("name") if isinstance(p.get("name"), str) else None
        major = _int(p.get("computeMajor", p.get("major")))
        minor = _int(p.get("computeMinor", p.get("minor")))
        cc = (major, minor) if major is not None and minor is not None else capability_of(name)
        if name or cc:
            return GpuInfo(name[:100] if name else None, cc, f"trace {key}")
    return None


def resolve(trace_gpu: GpuInfo | None, option: str | None) -> GpuInfo:
    """The run's GPU: the trace's when it gives a capability, else ``--gpu``, else what the trace names, else
    unknown."""
    if trace_gpu is not None and trace_gpu.capability:
        return trace_gpu
    if option:
        return parse_gpu_option(option)
    return trace_gpu or GpuInfo()


@dataclass
class Features:
    """Fast math a capability offers (tensor cores for fp16 from sm70; bf16 and TF32 from sm80; FP8 from sm89)."""

    tensor_cores: bool
    bf16: bool
    tf32: bool
    fp8: bool


def features(cc: tuple[int, int]) -> Features:
    """What compute capability ``cc`` supports (module docstring for the source)."""
    return Features(tensor_cores=cc >= (7, 0), bf16=cc >= (8, 0), tf32=cc >= (8, 0), fp8=cc >= (8, 9))


def half_dtype(gpu: GpuInfo) -> str:
    """The 16-bit dtype to advise: ``bf16`` on sm80 or later, ``fp16`` before, ``bf16`` when unknown."""
    return "fp16" if gpu.capability and not features(gpu.capability).bf16 else "bf16"


_BF16 = ("bf16 autocast (torch.autocast('cuda', dtype=torch.bfloat16), or bf16: true / --bf16 in the trainer "
         "config)")
_TF32 = ("TF32 for what stays fp32 (torch.backends.cuda.matmul.allow_tf32 = True, or "
         "torch.set_float32_matmul_precision('high'))")
_FP16 = ("fp16 autocast with a gradient scaler (torch.autocast('cuda', dtype=torch.float16) and "
         "torch.amp.GradScaler('cuda'), or fp16: true / --fp16 in the trainer config)")
_FP8 = "FP8 training (Transformer Engine, or torchao float8) is worth trying for the large GEMMs"


def precision_advice(gpu: GpuInfo) -> str:
    """What to enable for fp32 matrix math on ``gpu``: sm80+ bf16 autocast and TF32 (sm89/sm90+: and FP8);
    sm70/sm75 fp16 autocast with GradScaler (no bf16, no TF32); before sm70 no tensor cores; unknown: says so
    and gives both options."""
    if gpu.capability is None:
        return (f"the GPU is not known (no deviceProperties in the trace; pass --gpu): on sm80 or later (A100, "
                f"H100, L4, ...) enable {_BF16} and {_TF32}; on a V100 or T4 (sm70/sm75, no bf16) enable {_FP16}")
    f = features(gpu.capability)
    if f.bf16:
        out = f"enable {_BF16}, and {_TF32}"
        if f.fp8:
            out += f"; on this {gpu.sm} GPU {_FP8}"
        return out
    if f.tensor_cores:
        return f"enable {_FP16}; this {gpu.sm} GPU has no bf16 or TF32 tensor cores"
    return (f"this {gpu.sm} GPU has no tensor cores: fp16 ({_FP16}) halves memory traffic, but large matmul "
            "speedups need a GPU of sm70 or later")


def grad_compression_hook(gpu: GpuInfo) -> str:
    """The DDP gradient compression hook to name: ``bf16_compress_hook`` on sm80+, ``fp16_compress_hook`` on older
    GPUs, both when unknown."""
    if gpu.capability is None:
        return "fp16_compress_hook, or bf16_compress_hook on sm80+"
    return "bf16_compress_hook" if features(gpu.capability).bf16 else "fp16_compress_hook"
