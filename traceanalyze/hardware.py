"""The hardware tables in one place: GPU capabilities, peak TFLOPS, and link bandwidths.

- GPU capabilities: which fast math precisions a GPU has, so that advice names only what it supports. The one
  table of compute capabilities (:data:`GPU_CAPABILITY`) and what each capability offers (:func:`features`).
- Dense peak TFLOPS per GPU and math mode and HBM bandwidth (:data:`GPU_SPECS`, :func:`peak_tflops`,
  :func:`gpu_peaks`): the denominator of MFU and the ratios of the precision what-ifs.
- Links: what each ``nvidia-smi topo -m`` cell means (:data:`LINK_DESCRIPTIONS`), the GB/s a link class carries
  (:data:`EXPECTED_LINK_GBPS`, :func:`expected_link_gbps`) and what a GPU model's own links reach
  (:data:`GPU_LINK_GBPS`).

Capability sources: NVIDIA CUDA C++ Programming Guide, "Compute Capabilities" (tensor cores from sm70; bf16 and
TF32 tensor-core math from sm80, Ampere; FP8 tensor-core math from sm89, Ada, and sm90, Hopper, and later), and
NVIDIA's "CUDA GPUs - Compute Capability" list (developer.nvidia.com/cuda-gpus) for the names.

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


# --------------------------------------------------------------------------------------------------------
# Peak TFLOPS
# --------------------------------------------------------------------------------------------------------

# Dense peak TFLOPS per math mode and HBM GB/s, per GPU model (NVIDIA datasheets and architecture whitepapers, dense
# figures: the sparse "with sparsity" figures are twice these; PyTorch's ``torch/utils/_device_info`` style tables
# list the sparse ones). ``fp32`` is the CUDA-core rate, ``tf32``/``bf16``/``fp16``/``fp8`` the tensor-core rates
# with fp32 accumulation. Sources: V100 datasheet (SXM2: 15.7 / 125 TFLOPS, 900 GB/s); T4 datasheet (8.1 / 65,
# 320 GB/s); A100 datasheet (19.5 / TF32 156 / 312, 2,039 GB/s for 80 GB SXM); A10 datasheet (31.2 / 62.5 / 125,
# 600 GB/s); A40 datasheet (37.4 / 74.8 / 149.7, 696 GB/s); GA102 whitepaper, RTX 3090 (35.6 / 35.6 / 71 with fp32
# accumulate, 936 GB/s); L4 datasheet (30.3 / 60 / 121 / 242, 300 GB/s); L40S datasheet (91.6 / 183 / 362 / 733,
# 864 GB/s); AD102 whitepaper, RTX 4090 (82.6 / 82.6 / 165, 1,008 GB/s); H100 datasheet (SXM 67 / 495 / 989 /
# 1,979, 3,350 GB/s; PCIe 51 / 378 / 756 / 1,513, 2,000 GB/s); H200 datasheet (as H100 SXM, 4,800 GB/s); DGX B200
# datasheet per GPU (fp32 80, TF32 1,100, bf16 2,250, fp8 4,500 dense, 8,000 GB/s). Matched by substring of the
# device name, longest names first.
GPU_SPECS: list[tuple[str, dict[str, float]]] = [
    ("GB200", {"fp32": 80, "tf32": 1250, "bf16": 2500, "fp16": 2500, "fp8": 5000, "hbm_gbps": 8000}),
    ("B200", {"fp32": 80, "tf32": 1100, "bf16": 2250, "fp16": 2250, "fp8": 4500, "hbm_gbps": 8000}),
    ("H200", {"fp32": 67, "tf32": 495, "bf16": 989, "fp16": 989, "fp8": 1979, "hbm_gbps": 4800}),
    ("H100 PCIe", {"fp32": 51, "tf32": 378, "bf16": 756, "fp16": 756, "fp8": 1513, "hbm_gbps": 2000}),
    ("H100", {"fp32": 67, "tf32": 495, "bf16": 989, "fp16": 989, "fp8": 1979, "hbm_gbps": 3350}),
    ("H800", {"fp32": 67, "tf32": 495, "bf16": 989, "fp16": 989, "fp8": 1979, "hbm_gbps": 3350}),
    ("L40S", {"fp32": 91.6, "tf32": 183, "bf16": 362, "fp16": 362, "fp8": 733, "hbm_gbps": 864}),
    ("L4", {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242, "hbm_gbps": 300}),
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165, "fp16": 165, "fp8": 330, "hbm_gbps": 1008}),
    ("A100", {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "hbm_gbps": 2039}),
    ("A800", {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "hbm_gbps": 2039}),
    ("A40", {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7, "hbm_gbps": 696}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125, "hbm_gbps": 600}),
    ("RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71, "hbm_gbps": 936}),
    ("T4", {"fp32": 8.1, "fp16": 65, "hbm_gbps": 320}),
    ("V100", {"fp32": 15.7, "fp16": 125, "hbm_gbps": 900}),
]
# The GPU assumed for a compute capability when the name is missing or not listed (its assumption is stated).
SM_REFERENCE: dict[tuple[int, int], str] = {(7, 0): "V100", (7, 5): "T4", (8, 0): "A100", (8, 6): "A10",
                                            (8, 9): "L4", (9, 0): "H100", (10, 0): "B200"}
# Kept for callers that read the peaks as a list of (name, peaks).
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [(k, {d: v for d, v in p.items() if d != "hbm_gbps"})
                                                   for k, p in GPU_SPECS]


def _specs_of(name: str | None) -> tuple[str, dict[str, float]] | None:
    if not name:
        return None
    low = name.lower()
    for key, spec in GPU_SPECS:
        if key.lower() in low:
            return key, spec
    return None


def peak_tflops(gpu_model: str | None, dtype: str) -> float | None:
    """Dense peak TFLOPS of ``gpu_model`` for ``dtype`` (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``) from
    :data:`GPU_SPECS`; None when the GPU or that math mode is unknown."""
    hit = _specs_of(gpu_model)
    return hit[1].get(dtype) if hit else None


@dataclass
class Peaks:
    """The dense peaks a model of the GPU uses: TFLOPS per math mode (``fp32`` CUDA cores, ``tf32``, ``bf16``,
    ``fp16``, ``fp8``; absent when the GPU lacks it), HBM GB/s, the GPU whose datasheet they are (``reference``),
    and ``assumed``: a sentence when they were assumed rather than read for this GPU (unknown name), else ''."""

    tflops: dict[str, float]
    hbm_gbps: float
    reference: str
    assumed: str = ""

    def ratio(self, old: str, new: str) -> float | None:
        """Peak ``new`` over peak ``old`` (e.g. ``ratio("fp32", "bf16")`` = 14.8 on an H100); None when either is
        missing."""
        a, b = self.tflops.get(old), self.tflops.get(new)
        return b / a if a and b else None


def gpu_peaks(gpu: GpuInfo | None) -> Peaks:
    """The dense peaks of ``gpu`` (:data:`GPU_SPECS`): by its name; else the reference GPU of its compute capability
    (:data:`SM_REFERENCE`, the nearest lower capability); else an H100's, said in ``assumed``. Never raises."""
    gpu = gpu or GpuInfo()
    hit = _specs_of(gpu.name)
    if hit:
        return Peaks({k: v for k, v in hit[1].items() if k != "hbm_gbps"}, hit[1]["hbm_gbps"], hit[0])
    cc = gpu.capability
    ref = None
    if cc:
        lower = [k for k in SM_REFERENCE if k <= cc]
        ref = SM_REFERENCE[max(lower)] if lower else None
    why = (f"{gpu.label} is not in the peak table: assumed the dense peaks of an {ref} (same compute capability "
           "family)") if ref else f"{gpu.label} is not in the peak table: assumed the dense peaks of an H100 SXM"
    spec = _specs_of(ref or "H100")
    assert spec is not None
    return Peaks({k: v for k, v in spec[1].items() if k != "hbm_gbps"}, spec[1]["hbm_gbps"], spec[0], why)


# --------------------------------------------------------------------------------------------------------
# Links: nvidia-smi topo -m legend and expected bandwidth
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


# Per-direction GB/s a GPU's own links reach, by model (NVIDIA: NVLink 2/3/4 total 300/600/900 GB/s per GPU,
# half each way; PCIe Gen4 x16 ~24 GB/s in practice). Matched by substring of deviceProperties.name.
GPU_LINK_GBPS = [("H200", 450.0, "NVLink 4"), ("H100 PCIe", 24.0, "PCIe Gen4 x16"), ("H100", 450.0, "NVLink 4"),
                 ("A100-PCIE", 24.0, "PCIe Gen4 x16"), ("A100", 300.0, "NVLink 3"), ("V100-PCIE", 12.0, "PCIe Gen3"),
                 ("V100", 150.0, "NVLink 2"), ("A10", 24.0, "PCIe Gen4 x16"), ("L4", 24.0, "PCIe Gen4 x16"),
                 ("RTX", 24.0, "PCIe Gen4 x16")]
