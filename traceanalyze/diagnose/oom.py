"""A run that died of memory (:func:`rule_died`): a CUDA out-of-memory error (``cuda_oom``) or ranks killed by SIGKILL
(``host_oom``), from the records the logs hold (:class:`traceanalyze.logs.OomEvent`); and the host-memory arithmetic
of a killed run (:func:`host_bytes`): what each rank holds in the host's RAM, times the ranks of a host, against the
host's RAM.

A died run's verdict says so first (:func:`died_verdict`); such a finding has cause ``config`` and ``impact_pct``
100 (the run produced nothing).
"""

from __future__ import annotations

import re

from traceanalyze.diagnose.evidence import RunEvidence
from traceanalyze.findings import DIED_KINDS, Finding
from traceanalyze.fmt import ranges

FRAGMENTED_PCT = 10.0  # reserved-but-unallocated memory at least this % of the GPU: fragmentation, expandable segments
MAX_LISTED = 8  # the deaths listed one by one in a finding's evidence
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}  # bytes a parameter of the checkpoint takes
# bytes a parameter's optimizer state takes on the host under CPU offload: fp32 master weights and AdamW's two moments
OFFLOAD_STATE_BYTES = 12
# parameters of the models a config names (their checkpoints' counts): (family pattern, size in the name, parameters)
KNOWN_MODELS = (
    (r"llama[-_ ]?3", 8, 8_030_261_248), (r"llama[-_ ]?3", 70, 70_553_706_496),
    (r"llama[-_ ]?3", 405, 405_853_388_800), (r"llama[-_ ]?2", 7, 6_738_415_616),
    (r"llama[-_ ]?2", 13, 13_015_864_320), (r"llama[-_ ]?2", 70, 68_976_648_192), (r"mistral", 7, 7_241_732_096),
    (r"qwen2", 72, 72_706_203_648), (r"qwen2", 7, 7_615_616_512),
)
_SIZE_TOKEN = re.compile(r"(?:^|[^a-z0-9.])(\d{1,4}(?:\.\d{1,2})?)b(?:$|[^a-z0-9])")


def gib(b: float) -> str:
    """A GPU memory figure as PyTorch prints it: ``3.50 GiB`` (``MiB`` below 1 GiB)."""
    return f"{b / (1 << 30):.2f} GiB" if b >= 1 << 30 else f"{b / (1 << 20):.2f} MiB"


def gb(b: float) -> str:
    """A host memory figure in decimal units, as RAM is sold: ``141 GB``, ``1.13 TB``."""
    return f"{b / 1e12:.2f} TB" if b >= 1e12 else f"{b / 1e9:.0f} GB"


def model_params(ev: RunEvidence) -> tuple[float, str] | None:
    """(parameters, where the count comes from): a log's ``num_params``, else the model a config or log names
    (``llama3_1_70b``: :data:`KNOWN_MODELS`, else the size in the name, ``70b`` = 70 × 10⁹); None when neither."""
    n = ev.fact("num_params")
    if isinstance(n, float) and n > 0:
        src = ev.facts["num_params"][0].source
        return n, f"{n / 1e9:.1f} B parameters ({src})"
    name = ev.fact("model_name")
    if not isinstance(name, str):
        return None
    low = name.lower()
    m = _SIZE_TOKEN.search(low.replace("_", "-"))
    if m is None:
        return None
    size = float(m.group(1))
    known = next((p for fam, s, p in KNOWN_MODELS if s == size and re.search(fam, low)), None)
    short = name[:64]
    if known is not None:
        return float(known), f"{known / 1e9:.1f} B parameters ({short})"
    return size * 1e9, f"about {size:g} B parameters (the size in the name {short})"


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ranges(ranks)


def cuda_advice(e) -> str:
    """What to change for one CUDA OOM record (:class:`~traceanalyze.logs.OomEvent`), from its figures: an allocation
    larger than the GPU is a size bug; reserved-but-unallocated memory of :data:`FRAGMENTED_PCT` % of the GPU or more
    is fragmentation (expandable segments); otherwise the memory is in use (activation checkpointing, a smaller
    micro-batch, sharding). The first clause, before ``; ``, is the short fix the verdict names."""
    cap, frag, tried = e.capacity_bytes, e.reserved_unallocated_bytes, e.tried_bytes
    if tried and cap and tried > cap:
        return (f"find the tensor of {gib(tried)}: the one allocation is larger than the whole GPU ({gib(cap)}), "
                "a shape or size bug rather than memory pressure; print the shapes that feed the failing op")
    if frag is not None and cap and 100 * frag / cap >= FRAGMENTED_PCT:
        return (f"set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; {gib(frag)} ({100 * frag / cap:.0f}% of the "
                "GPU) is reserved by PyTorch's caching allocator but unallocated: fragmentation, which expandable "
                "segments avoid; if it still fails, activation checkpointing or a smaller micro-batch")
    return ("activation checkpointing, a smaller micro-batch or sharding; the memory is allocated, not fragmented: "
            "recompute activations in the backward (activation checkpointing), halve the micro-batch (double the "
            "gradient accumulation to keep the batch), or shard parameters, gradients and optimizer state across "
            "the ranks (FSDP / ZeRO-3)")


def _cuda_line(e) -> str:
    """One CUDA OOM record as evidence: where, then every figure it states."""
    who = ", ".join(x for x in (f"rank {e.rank}" if e.rank is not None else "", f"GPU {e.gpu}"
                                if e.gpu is not None else "") if x) or "a process"
    parts = []
    if e.tried_bytes is not None:
        parts.append(f"tried to allocate {gib(e.tried_bytes)}")
    if e.capacity_bytes is not None:
        parts.append(f"{gib(e.capacity_bytes)} total" + (f", {gib(e.free_bytes)} free" if e.free_bytes is not None
                                                          else ""))
    if e.in_use_bytes is not None:
        parts.append(f"{gib(e.in_use_bytes)} in use by the process (non-PyTorch memory included)")
    if e.allocated_bytes is not None:
        parts.append(f"{gib(e.allocated_bytes)} allocated by PyTorch")
    if e.reserved_unallocated_bytes is not None:
        pct = (f" ({100 * e.reserved_unallocated_bytes / e.capacity_bytes:.1f}% of the GPU)" if e.capacity_bytes
               else "")
        parts.append(f"{gib(e.reserved_unallocated_bytes)} reserved but unallocated{pct}")
    return f"CUDA out of memory on {who} ({e.form}, {e.source}): " + "; ".join(parts)


def _cuda_finding(ev: RunEvidence, cuda: list, after: list) -> Finding:
    """The ``cuda_oom`` finding of a run's CUDA OOM records; ``after``: kills that likely followed it (evidence)."""
    e = cuda[0]
    ranks = sorted({c.rank for c in cuda if c.rank is not None})
    gpu = f"GPU {e.gpu}" if e.gpu is not None and len(ranks) <= 1 else ""
    where = f"{_ranks_text(ranks)}{f' ({gpu})' if gpu else ''}" if ranks else gpu or "a GPU"
    title = f"CUDA out of memory on {where}"
    if e.tried_bytes is not None and e.free_bytes is not None and e.capacity_bytes is not None:
        title += (f": tried to allocate {gib(e.tried_bytes)} with {gib(e.free_bytes)} free of "
                  f"{gib(e.capacity_bytes)}")
    evidence = [_cuda_line(c) for c in cuda[:MAX_LISTED]]
    if len(cuda) > MAX_LISTED:
        evidence.append(f"… and {len(cuda) - MAX_LISTED} more CUDA out-of-memory records")
    if after:
        evidence.append(f"then {len(after)} process(es) killed (SIGKILL) with no kernel OOM-killer line and no "
                        "checkpoint loading: most likely torchrun stopping the other ranks after the failure ("
                        + ", ".join(k.source for k in after[:4]) + ")")
    return Finding("config", "cuda_oom", "high", 100.0, ranks, title, evidence, cuda_advice(e))


def host_bytes(ev: RunEvidence, ranks_per_host: int) -> tuple[list[str], str | None]:
    """The host-memory arithmetic of a killed run: (its lines of evidence, the sum in short, e.g.
    ``8 × 141 GB bf16 ≈ 1.13 TB > 768 GB``, None when the model's size is unknown). The host's RAM comes from a log
    or capture's env file (``host_ram_bytes``); without it the sum has no comparison. Each rank holds parameters ×
    dtype bytes (the precision stated, bf16 assumed otherwise) when every rank loads the checkpoint; with CPU offload
    (``cpu_offload`` true) the host also holds the fp32 master weights and AdamW's two moments
    (:data:`OFFLOAD_STATE_BYTES` a parameter), sharded over the world size, of which this host holds its ranks'
    share."""
    ram = ev.fact("host_ram_bytes")
    ram = ram if isinstance(ram, float) and ram > 0 else None
    ram_src = ev.facts["host_ram_bytes"][0].source if ram is not None else ""
    mp = model_params(ev)
    if mp is None:
        return ([f"host RAM {gb(ram)} ({ram_src}); the model's size is not stated (no parameter count or known "
                 "model name), so what the ranks load is not known"] if ram else []), None
    params, what = mp
    prec = ev.fact("precision")
    dtype = prec if isinstance(prec, str) and prec in DTYPE_BYTES else None
    nbytes = DTYPE_BYTES.get(dtype or "bf16", 2)
    per_rank = params * nbytes
    need = ranks_per_host * per_rank
    label = dtype or "bf16 assumed"
    line = (f"each rank loads the whole checkpoint: {what} × {nbytes} bytes ({label}) = {gb(per_rank)} per rank; "
            f"{ranks_per_host} × {gb(per_rank)} {label} ≈ {gb(need)}")
    if ram is not None:
        line += f" {'>' if need > ram else '≤'} {gb(ram)} host RAM ({ram_src})"
    lines = [line]
    short = f"{ranks_per_host} × {gb(per_rank)} {label} ≈ {gb(need)}" + (
        f" {'>' if need > ram else '≤'} {gb(ram)}" if ram is not None else "")
    if ev.fact("cpu_offload") == "true":
        world = ev.world_size if ev.world_size and ev.world_size >= ranks_per_host else ranks_per_host
        state = params * OFFLOAD_STATE_BYTES / world * ranks_per_host
        shards = params * nbytes / world * ranks_per_host
        src = ev.facts["cpu_offload"][0].source
        lines.append(f"CPU offload ({src}) keeps the optimizer on the host too: {OFFLOAD_STATE_BYTES} bytes a "
                     f"parameter (fp32 master weights and AdamW's two moments) × {params / 1e9:.1f} B ÷ {world} "
                     f"ranks × {ranks_per_host} on this host ≈ {gb(state)}, plus the {label} parameter shards "
                     f"({gb(shards)}): {gb(state + shards)} while training"
                     + (f" {'>' if state + shards > ram else '≤'} {gb(ram)}" if ram is not None else ""))
    return lines, short


def ranks_per_host(ev: RunEvidence, killed: int, local_ranks: list[int]) -> tuple[int, str]:
    """(ranks on the killed ranks' host, how it is known): ``LOCAL_WORLD_SIZE`` where an env file states it, else the
    ranks killed there, or more where a local rank says so (local rank 5 killed: at least 6 ranks on the host)."""
    for f in ev.facts.get("env") or []:
        name, _, val = str(f.value).partition("=")
        if name == "LOCAL_WORLD_SIZE" and val.isdigit() and 0 < int(val) <= 1 << 12:
            return int(val), f"LOCAL_WORLD_SIZE, {f.source}"
    by_local = max(local_ranks, default=-1) + 1
    if by_local > killed:
        return by_local, f"at least: local rank {by_local - 1} was killed"
    return killed, "the ranks killed there"


def _host_finding(ev: RunEvidence, kills: list) -> Finding:
    by_host: dict[str | None, list] = {}
    for k in kills:
        by_host.setdefault(k.host, []).append(k)
    host, hk = max(by_host.items(), key=lambda kv: len(kv[1]))
    killed = {(k.rank, k.local_rank, k.pid) for k in hk}
    per_host, how = ranks_per_host(ev, len(killed), [k.local_rank for k in hk if k.local_rank is not None])
    ranks = sorted({k.rank for k in kills if k.rank is not None})
    loading = any(k.phase == "checkpoint_load" for k in kills)
    math_lines, short = host_bytes(ev, per_host)
    by_kernel = any(k.oom_killer for k in kills) or (short is not None and " > " in short)
    n = len(killed)
    one = hk[0]
    who = (f"{n} ranks" if n > 1 else f"rank {one.rank}" if one.rank is not None else
           f"local rank {one.local_rank}" if one.local_rank is not None else "a process") + (
        f" on {host}" if host else "")
    others = [h for h in by_host if h is not None and h != host]
    if others:
        who += f" (and {len(kills) - len(hk)} more on {len(others)} other host{'s' if len(others) > 1 else ''})"
    title = (f"{who} killed {'by the kernel ' if by_kernel else ''}(SIGKILL)"
             f"{' while the checkpoint loaded' if loading else ''}: host memory")
    if short is not None:
        title += f" ({short})"
    evidence = [_kill_line(k) for k in kills[:MAX_LISTED]]
    if len(kills) > MAX_LISTED:
        evidence.append(f"… and {len(kills) - MAX_LISTED} more kills")
    if loading:
        src = next(k.source for k in kills if k.phase == "checkpoint_load")
        evidence.append(f"before the kill ({src}) the log's last progress was a checkpoint starting to load; no "
                        "training step followed")
    if not any(k.oom_killer for k in kills):
        evidence.append("no kernel line (dmesg: 'Out of memory: Killed process') names the process: "
                        + ("the sum below exceeds the host's RAM, which is when the kernel's OOM killer acts"
                           if by_kernel else "a SIGKILL can also come from the scheduler (a cgroup memory limit, "
                           "a preemption)"))
    if math_lines:
        evidence.append(f"ranks on the host: {per_host} ({how})")
    evidence += math_lines
    return Finding("config", "host_oom", "high", 100.0, ranks, title, evidence,
                   host_advice(loading, ev.fact("cpu_offload") == "true"))


def host_advice(loading: bool, offload: bool) -> str:
    """What to change for ranks killed for host memory: while the checkpoint loaded, load it once per host; else
    shrink what each rank holds on the host. The first clause, before ``; ``, is the short fix the verdict names."""
    load = ("load the checkpoint on rank 0 only, or on the meta device, and broadcast or shard it: FSDP "
            "sync_module_states=True with the other ranks' model on the meta device, accelerate's "
            "fsdp_cpu_ram_efficient_loading (cpu_ram_efficient_loading), torchtune's distributed recipes (rank 0 "
            "loads the state dict, the others take their shards), or stream it shard by shard (safetensors, "
            "torch.load(mmap=True))")
    off = ("CPU offload costs host memory too (fp32 master weights and optimizer state): turn it off where the GPUs "
           "can hold the sharded state, or use a host with more RAM or fewer ranks per host" if offload else
           "CPU offload, if turned on, would add its fp32 master weights and optimizer state to the host's load")
    if loading:
        return f"load the checkpoint once per host, not once per rank; {load}; {off}"
    return ("shrink what each rank holds in host memory; the usual holders: each rank's own copy of the checkpoint "
            f"({load}), DataLoader workers (each holds a copy of the dataset object: fewer num_workers, memory-mapped "
            f"data), pinned-memory buffers; {off}")


def _kill_line(k) -> str:
    who = ", ".join(x for x in (f"rank {k.rank}" if k.rank is not None else "",
                                f"local rank {k.local_rank}" if k.local_rank is not None else "",
                                f"host {k.host}" if k.host else "", f"pid {k.pid}" if k.pid is not None else "") if x)
    what = {"torchrun": f"torchrun: exit code {k.exitcode} ({k.signal})", "kernel": "the kernel's OOM killer",
            "shell": "the shell: Killed"}.get(k.form, k.form)
    rss = f"; the kernel's OOM killer: anon-rss {gb(k.rss_bytes)}" if k.rss_bytes else (
        "; the kernel's OOM killer named it" if k.oom_killer and k.form != "kernel" else "")
    return f"{what}{': ' + who if who else ''} ({k.source}){rss}"


def merge_kernel_lines(ooms: list) -> list:
    """The records of a run's logs with each kernel OOM-killer line of one file folded into the kill of another file
    that has its pid (a ``dmesg`` beside the training log); returns the records left."""
    kills = {o.pid: o for o in ooms if o.kind == "host" and o.form == "torchrun" and o.pid is not None}
    out = []
    for o in ooms:
        k = kills.get(o.pid) if o.form == "kernel" else None
        if k is not None:
            k.oom_killer = True
            k.rss_bytes = k.rss_bytes or o.rss_bytes
            continue
        out.append(o)
    return out


def rule_died(ev: RunEvidence) -> list[Finding]:
    """Config, high, impact 100 %: the logs record a CUDA out-of-memory error (``cuda_oom``: the figures and advice
    of :func:`cuda_advice`) or ranks killed by SIGKILL (``host_oom``: which ranks on which host, whether the
    checkpoint was loading, and :func:`host_bytes`). Beside a CUDA OOM, a kill that neither the kernel's OOM killer
    names nor a checkpoint load precedes is most likely torchrun stopping the other ranks (SIGTERM, then SIGKILL):
    evidence of the CUDA OOM, not a host-memory death of its own."""
    ooms = merge_kernel_lines(list(ev.ooms))
    out = []
    cuda = [o for o in ooms if o.kind == "cuda"]
    kills = [o for o in ooms if o.kind == "host"]
    after = [k for k in kills if not k.oom_killer and k.phase != "checkpoint_load"] if cuda else []
    if cuda:
        out.append(_cuda_finding(ev, cuda, after))
    kills = [k for k in kills if k not in after]
    if kills:
        out.append(_host_finding(ev, kills))
    return out


def died_verdict(findings: list[Finding]) -> str | None:
    """``Run died: <title>. Fix: <the short fix>.`` for the first finding of :data:`DIED_KINDS` (``Also: <title>.``
    for a second one: a CUDA OOM and a host kill), else None."""
    died = [g for g in findings if g.kind in DIED_KINDS]
    if not died:
        return None
    f = died[0]
    also = f" Also: {died[1].title}." if len(died) > 1 else ""
    return f"Run died: {f.title}. Fix: {f.recommendation.split('; ')[0]}.{also}"
