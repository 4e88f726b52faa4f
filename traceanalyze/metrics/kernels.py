"""Kernels of no known class: the share of a run's kernel time the classification cannot vouch for (issue 40).

A kernel's class (``store.MACROS``' ``kernel_class``: communication, memory, compute) decides what the breakdown
counts as compute. Every kernel whose name the macro does not recognise as communication or memory is counted as
compute, so a communication library the macro does not know (DeepEP before issue 40: 46 % of an expert-parallel
rank's kernel time) silently reads as compute. *No class* is made concrete here: a kernel the macro calls compute
whose name matches no known compute family, neither matrix math (:func:`traceanalyze.matmath.kernel_family`) nor
:data:`KNOWN_COMPUTE` (PyTorch's own kernels, cub/thrust, Triton, cuDNN/cuBLAS/CUTLASS internals, attention, Apex
and TransformerEngine fused kernels, ...), searched case-insensitively in the name's head (the name before its
template arguments and parameters, so that an argument type such as ``at::Tensor`` does not vouch for it).

:func:`unclassified_kernels` gives the share of kernel time in names of no class and the heaviest such names;
:func:`unclassified_warning` turns it into a data-quality row when the share passes
:data:`UNCLASSIFIED_WARN_PCT`. The naming table is ``docs/kernel_names.md`` ("Communication kernels").
"""

from __future__ import annotations

import re

import duckdb

from traceanalyze import matmath

# Compute kernels of a known family, searched case-insensitively in the name's head (see the module docstring).
KNOWN_COMPUTE = (
    # PyTorch's own kernels (ATen, c10, its flash/mem-efficient attention, distributions, foreach/optimizers)
    r"at::|c10::|c10d::|pytorch|torch|caffe2|elementwise|reduce|softmax|norm|index|scatter|gather|sort|"
    r"copy|fill|cat|cumsum|cumprod|scan|embedding|dropout|multi_tensor|foreach|fused|topk|radix|bitonic|"
    r"unique|histogram|bucketize|nonzero|masked|where|arange|linspace|random|philox|distribution|cross_entropy|"
    r"nll_loss|loss|pool|upsample|interpolate|grid_sampler|im2col|col2im|unfold|pad|transpose|permute|"
    r"triu|tril|flip|roll|clamp|activation|gelu|relu|silu|swiglu|sigmoid|tanh|rope|rotary|"
    # libraries: cub/thrust, Triton, cuDNN, cuBLAS/cuBLASLt, CUTLASS, attention, AMD Tensile, Apex, TE, fbgemm
    r"cub::|thrust::|triton|cudnn|cublas|cutlass|flash|fmha|attention|cijk_|apex|transformer_engine|"
    r"fbgemm|bounds_check_indices|xformers|megablocks|quantize|amax|cast|compute_cuda_kernel|"
    # cuBLAS / cuBLASLt / cuDNN internals named without their library
    r"scal_kernel|axpy|dot_kernel|epilogue::|splitkreduce|gemmsn|gemmk|fft|winograd|nchw|nhwc|"
    # the memory engines (Memcpy/Memset rows are class memory; kernels that move memory on one device)
    r"memcpy|memset|dma"
)
_KNOWN = re.compile(KNOWN_COMPUTE)  # lower case: searched by matmath.search
_ANON = re.compile(r"\(anonymous namespace\)::")

# a run whose kernels of no class take more than this share of its kernel time gets a data-quality row
UNCLASSIFIED_WARN_PCT = 5.0
TOP_UNCLASSIFIED = 5
NAME_CHARS = 80  # names are cut to this length in the row (hostile input: kept as plain strings)


def name_head(name: str) -> str:
    """The name before its template arguments and parameters (``void a::b<int>(float*)`` -> ``void a::b``), with
    ``(anonymous namespace)::`` dropped."""
    n = _ANON.sub("", name or "")
    cut = min((i for i in (n.find("<"), n.find("(")) if i >= 0), default=len(n))
    return n[:cut]


def no_class(name: str) -> bool:
    """True for a compute kernel's name of no known family (module docstring): neither matrix math nor
    :data:`KNOWN_COMPUTE`."""
    if matmath.kernel_family(name) is not None:
        return False
    return not matmath.search(_KNOWN, *matmath.folded(name_head(name)))


def unclassified_kernels(con: duckdb.DuckDBPyConnection, run_id: int) -> list[dict]:
    """Per run (a list of one dict, empty when the run has no GPU kernels): ``run_id``, ``kernel_time_us`` (every
    kernel, memcpy and memset of the run's ranks), ``unclassified_us`` and ``unclassified_pct`` (kernels of no
    class: :func:`no_class` among those ``kernel_class`` calls compute), and ``top``: the :data:`TOP_UNCLASSIFIED`
    heaviest such names, each ``{"name", "time_us", "pct", "count"}`` (``pct`` of the run's kernel time), by time
    then name."""
    # the macro and the name patterns once per distinct (name, category), not per kernel
    rows = con.execute("""
        SELECT name, kernel_class(cat, name) AS klass, ns, n FROM (
            SELECT k.name, k.cat, sum(k.dur_ns) AS ns, count(*) AS n FROM kernels k JOIN files f USING (file_id)
            WHERE f.run_id = ? AND f.rank IS NOT NULL AND k.cat <> 'gpu_user_annotation' GROUP BY k.name, k.cat)
        """, [run_id]).fetchall()
    total = sum(int(ns or 0) for _, _, ns, _ in rows)
    if total <= 0:
        return []
    by_name: dict[str, list[int]] = {}
    for name, klass, ns, n in rows:
        if klass == "compute" and name is not None and no_class(str(name)):
            acc = by_name.setdefault(str(name), [0, 0])
            acc[0] += int(ns or 0)
            acc[1] += int(n)
    odd = sorted(((ns, name, n) for name, (ns, n) in by_name.items()), key=lambda r: (-r[0], r[1]))
    odd_ns = sum(r[0] for r in odd)
    top = [{"name": name, "time_us": ns / 1e3, "pct": 100.0 * ns / total, "count": n}
           for ns, name, n in odd[:TOP_UNCLASSIFIED]]
    return [{"run_id": run_id, "kernel_time_us": total / 1e3, "unclassified_us": odd_ns / 1e3,
             "unclassified_pct": 100.0 * odd_ns / total, "top": top}]


def short_name(name: str, chars: int = NAME_CHARS) -> str:
    """``name`` on one line, cut to ``chars`` characters with ``…`` where it is longer."""
    one = " ".join(str(name).split())
    return one if len(one) <= chars else one[:chars - 1] + "…"


def unclassified_warning(rows: list[dict], file: str | None = None,
                         threshold_pct: float = UNCLASSIFIED_WARN_PCT) -> list[dict]:
    """The data-quality rows (``{"file", "level", "message"}``, as the pipeline's warnings) for
    :func:`unclassified_kernels`' result: one per run whose kernels of no class take more than ``threshold_pct``
    of its kernel time, naming the heaviest; none otherwise. The names stay plain text (the report escapes)."""
    out = []
    for r in rows:
        if r["unclassified_pct"] <= threshold_pct:
            continue
        names = ", ".join(f"`{short_name(t['name'])}` {t['pct']:.1f} %" for t in r["top"])
        out.append({"file": file, "level": "warning",
                    "message": f"Kernels of no known class take {r['unclassified_pct']:.1f} % of kernel time, "
                               f"counted as compute: {names}; if they move data between GPUs (expert-parallel, "
                               "custom collectives), name them in an issue"})
    return out
