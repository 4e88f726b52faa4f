"""``env_rank{r}.json``, the process facts :mod:`traceanalyze.capture` writes beside its traces (:func:`parse_env`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traceanalyze.limits import MAX_MEMORY_BYTES
from traceanalyze.logs.model import Fact, to_number
from traceanalyze.logs.read import read_text
from traceanalyze.safety import env_allowed, redact_text

MAX_VALUE_CHARS = 256  # a version, a host or CPU name: longer is not one
MAX_CPUS = 1 << 16  # cores or threads of one host or process: more is not a count


def parse_env(path: Path, max_bytes: int | None = None) -> list[Fact]:
    """Facts from an ``env_rank{r}.json`` written by :mod:`traceanalyze.capture` (``capture.environment``).

    Keys: ``world_size``, ``nccl_version`` (standard keys); ``torch_version``, ``cuda_version``,
    ``python_version``, ``hostname``, ``backend``, ``gpu``, ``cpu_model``, ``cpu_isa``, ``cpu_native_bf16``
    (``true``/``false``: the CPU has AMX or AVX512-BF16; :func:`traceanalyze.capture.cpu_facts`), ``cpu_count``
    (``cpu.cpus``: logical cores of the host), ``cpu_cpus_allowed`` (``cpu.cpus_allowed``: cores the process may run
    on), ``cpu_threads`` (``cpu.threads``: torch's intra-op threads; these three numeric, whole numbers from 1 to
    :data:`MAX_CPUS`, else left out), ``host_ram_bytes`` (``cpu.mem_bytes``: the host's physical memory, bytes, up
    to :data:`~traceanalyze.limits.MAX_MEMORY_BYTES`) and ``env`` (one
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
    for key, field in (("cpu_count", "cpus"), ("cpu_cpus_allowed", "cpus_allowed"), ("cpu_threads", "threads")):
        n = _count(cpu.get(field))
        if n is not None:
            out.append(Fact(key, str(n), float(n), src))
    mem = cpu.get("mem_bytes")
    if isinstance(mem, int) and not isinstance(mem, bool) and 0 < mem <= MAX_MEMORY_BYTES:
        out.append(Fact("host_ram_bytes", str(mem), float(mem), src))
    if isinstance(cpu.get("native_bf16"), bool):
        add("cpu_native_bf16", "true" if cpu["native_bf16"] else "false")
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    for k, v in sorted((k, v) for k, v in env.items() if env_allowed(k)):
        if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK", "MASTER_PORT"):  # per-process noise
            add("env", redact_text(f"{k}={v}"))
    return out


def _n(k: int, what: str) -> str:
    return f"{k} {what}{'s' if k != 1 else ''}"


def _count(v: Any) -> int | None:
    """A count of cores or threads: a whole number from 1 to :data:`MAX_CPUS` (an int, or its decimal text), else
    None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and v.strip().isdigit() and len(v.strip()) <= 6:
        v = int(v.strip())
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and 1 <= v <= MAX_CPUS else None


def core_sharing(facts: dict[str, list[Fact]], world_size: int | None = None) -> dict | None:
    """Whether a CPU run's ranks share cores, from its ``env_rank{r}.json`` facts (:func:`parse_env`); None when no
    file states the host's core count (``cpu_count``).

    Per host (``hostname``; the files without one are one host): ranks on it = ``LOCAL_WORLD_SIZE`` when stated, else
    the env files of that host (``world_size`` when a single host's files state neither, as a bound from below:
    the files of that host otherwise); threads per rank = ``cpu_threads`` (``torch.get_num_threads()``), else
    ``OMP_NUM_THREADS``, else unknown; cores = ``cpu_count``, or ranks × ``cpu_cpus_allowed`` when each process is
    pinned to fewer. The ranks share cores when ranks × threads (ranks alone when threads are unknown) exceed the
    cores on some host. Returns ``{"shared": True | False | None (unknown), "host", "ranks_per_host",
    "threads_per_rank" (int | None), "threads_source", "cores", "why"}`` for the host that decides: the first
    shared one, else the first unknown one, else the first one."""
    per: dict[str, dict[str, Any]] = {}  # env file -> what it states
    for key in ("cpu_count", "cpu_cpus_allowed", "cpu_threads", "hostname", "env"):
        for f in facts.get(key) or []:
            d = per.setdefault(str(f.source).split(":")[0], {})
            if key == "env":
                name, _, val = str(f.value).partition("=")
                if name in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE") and _count(val) is not None:
                    d[name] = _count(val)
            elif key == "hostname":
                d.setdefault("hostname", str(f.value))
            elif f.num is not None:
                d.setdefault(key, int(f.num))
    files = [d for d in per.values() if d.get("cpu_count")]
    if not files:
        return None
    hosts: dict[str, list[dict]] = {}
    for d in files:
        hosts.setdefault(d.get("hostname", ""), []).append(d)
    out = []
    for host, fs in hosts.items():
        local = max((d["LOCAL_WORLD_SIZE"] for d in fs if d.get("LOCAL_WORLD_SIZE")), default=None)
        if local is None:
            ws = _count(world_size)
            local = max(len(fs), ws) if len(hosts) == 1 and ws else len(fs)
        threads = max((d["cpu_threads"] for d in fs if d.get("cpu_threads")), default=None)
        source = "cpu.threads"
        if threads is None:
            threads = max((d["OMP_NUM_THREADS"] for d in fs if d.get("OMP_NUM_THREADS")), default=None)
            source = "OMP_NUM_THREADS" if threads is not None else "unknown"
        cores = max(d["cpu_count"] for d in fs)
        allowed = min((d["cpu_cpus_allowed"] for d in fs if d.get("cpu_cpus_allowed")), default=None)
        if allowed is not None and allowed < cores:
            cores = min(cores, local * allowed)
        where = f" of host {host}" if host else ""
        if threads is not None:
            shared: bool | None = local * threads > cores
            what = f"{_n(local, 'rank')} × {_n(threads, 'thread')} ({source}) on {_n(cores, 'core')}{where}"
        else:
            shared = True if local > cores else None
            what = f"{_n(local, 'rank')} on {_n(cores, 'core')}{where}, threads per rank unknown"
        if shared:
            why = (f"{what}: the ranks share cores, so a fix that changes how many ranks compute at once (a straggler "
                   "or a wait removed) changes every op's duration, which a replay of measured durations cannot know")
        elif shared is None:
            why = (f"{what} (env_rank*.json states neither cpu.threads nor OMP_NUM_THREADS): whether the ranks "
                   "share cores is not known")
        else:
            why = f"{what}: each rank has cores of its own"
        out.append({"shared": shared, "host": host or None, "ranks_per_host": local, "threads_per_rank": threads,
                    "threads_source": source, "cores": cores, "why": why})
    return next((o for o in out if o["shared"]), next((o for o in out if o["shared"] is None), out[0]))
