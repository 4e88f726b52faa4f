"""``env_rank{r}.json``, the process facts :mod:`traceanalyze.capture` writes beside its traces (:func:`parse_env`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traceanalyze.logs.model import Fact, to_number
from traceanalyze.logs.read import read_text
from traceanalyze.safety import env_allowed, redact_text

MAX_VALUE_CHARS = 256  # a version, a host or CPU name: longer is not one


def parse_env(path: Path, max_bytes: int | None = None) -> list[Fact]:
    """Facts from an ``env_rank{r}.json`` written by :mod:`traceanalyze.capture` (``capture.environment``).

    Keys: ``world_size``, ``nccl_version`` (standard keys); ``torch_version``, ``cuda_version``,
    ``python_version``, ``hostname``, ``backend``, ``gpu``, ``cpu_model``, ``cpu_isa``, ``cpu_native_bf16``
    (``true``/``false``: the CPU has AMX or AVX512-BF16; :func:`traceanalyze.capture.cpu_facts`) and ``env`` (one
    fact per communication variable, ``NAME=value``, e.g. ``NCCL_P2P_DISABLE=1``). Text values are cut at
    :data:`MAX_VALUE_CHARS`. Only the variables ``capture`` records are kept
    (:func:`traceanalyze.safety.env_allowed`): anything else in the file, and any name that looks like a
    credential, is never stored or printed. Content that does not parse gives ``[]``. Raises
    :class:`InputError` when the file cannot be read.
    """
    path = Path(path)
    text = read_text(path, max_bytes)
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
        out.append(Fact(key, str(v)[:MAX_VALUE_CHARS], to_number(v) if key == "world_size" else None, src))

    add("world_size", data.get("world_size"))
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    add("nccl_version", versions.get("nccl"))
    for k in ("torch", "cuda", "python"):
        add(f"{k}_version", versions.get(k))
    add("hostname", data.get("hostname"))
    add("backend", data.get("backend"))
    for g in (data.get("gpus") if isinstance(data.get("gpus"), list) else [])[:64]:
        add("gpu", g)
    cpu = data.get("cpu") if isinstance(data.get("cpu"), dict) else {}
    add("cpu_model", cpu.get("model"))
    add("cpu_isa", cpu.get("isa"))
    if isinstance(cpu.get("native_bf16"), bool):
        add("cpu_native_bf16", "true" if cpu["native_bf16"] else "false")
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    for k, v in sorted((k, v) for k, v in env.items() if env_allowed(k)):
        if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK", "MASTER_PORT"):  # per-process noise
            add("env", redact_text(f"{k}={v}"))
    return out
