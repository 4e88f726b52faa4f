"""Record the sample traces: real small distributed training jobs, one per slowdown users report.

Usage, from the repository root, with a Python that has ``torch==2.13.0`` (and ``transformers`` +
``accelerate`` for ``grad_accum``; see ``sample_traces/README.md``)::

    python sample_traces/generate.py [--only NAME ...] [--out sample_traces]
    python sample_traces/generate.py --pairs [NAME ...] [--out sample_traces]   # record_pairs.py

Each scenario runs 2-4 gloo processes on this machine (one process per rank, ``workload.py`` or
``hf_job.py``), and leaves in ``OUT/<scenario>/``: one Kineto trace per rank
(``rank{r}.<ns>.pt.trace.json.gz``), one log per rank (``rank{r}.log``) and ``scenario.json``, the
ground truth (what was done, the expected finding, measured step times, config, the exact command).
The interconnect pair runs each rank in its own network namespace joined by a veth pair (needs root).
``--pairs`` records the paired samples instead (``OUT/pairs/<pair>/{slow,fixed}``, see ``record_pairs.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # no sample_traces/__pycache__ (.gitignore whitelists sample_traces/**)
# Run as a script this module is __main__; record_pairs.py imports it as `generate` and must get this same
# module (one scenario registry, one inductor cache), not a second copy.
sys.modules.setdefault("generate", sys.modules[__name__])

from workload import JobConfig  # noqa: E402  (beside this file, not a package)

JOB_TIMEOUT_S = 600
Scenario = Callable[[Path], None]
SCENARIOS: dict[str, Scenario] = {}


class SkipScenario(Exception):
    """The scenario cannot run on this machine (reason in the message); its old output is kept."""


def scenario(fn: Scenario) -> Scenario:
    """Register ``fn`` under its name (without the ``scenario_`` prefix), in definition order."""
    SCENARIOS[fn.__name__.removeprefix("scenario_")] = fn
    return fn


def rel(path: Path) -> str:
    """``path`` relative to the repository root when it lies inside it (recorded paths stay portable)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reset_dir(d: Path) -> None:
    """Remove what an earlier run left in ``d`` (traces, logs, ground truth) and create it."""
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of every rank: one compute thread, unbuffered output, no hub access."""
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(extra or {})
    return env


@dataclasses.dataclass
class JobResult:
    """What one multi-process job produced: per-rank step times, the commands run, wall time."""

    step_times_ms: dict[str, list[float]]
    n_params: int
    commands: list[str]
    wall_s: float
    extra: dict


def wait_all(procs: list[subprocess.Popen], stderr_paths: list[Path], what: str) -> None:
    """Wait for every process (each started with ``start_new_session=True``). As soon as one fails, at
    the time limit, or on an interrupt, kill the process groups still running; raise on a failure with
    the tails of ``stderr_paths``."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    failed = ""
    try:
        while not failed and any(p.poll() is None for p in procs):
            time.sleep(0.2)
            failed = next((f"process {i} exited {p.returncode}" for i, p in enumerate(procs) if p.poll()), "")
            if time.monotonic() > deadline:
                failed = f"timed out after {JOB_TIMEOUT_S} s"
        failed = failed or next(
            (f"process {i} exited {p.returncode}" for i, p in enumerate(procs) if p.poll()), ""
        )
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if failed:
        tails = [
            f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-25:])
            for path in stderr_paths
            if path.exists()
        ]
        raise RuntimeError(f"{what}: {failed}\n" + "\n".join(tails))


def run_ranks(
    cfg: JobConfig,
    world: int,
    *,
    master_addr: str = "127.0.0.1",
    port: int | None = None,
    rank_prefix: Callable[[int], list[str]] = lambda r: [],
    rank_env: Callable[[int], dict[str, str]] = lambda r: {},
    env: dict[str, str] | None = None,
) -> JobResult:
    """Run ``workload.py`` as ``world`` processes (rank r's argv is ``rank_prefix(r) + python ...``),
    stdout of rank r into ``cfg.out_dir/rank{r}.log``; return the step times the ranks measured."""
    out = Path(cfg.out_dir)
    port = port or free_port()
    busy = busy_check()
    with tempfile.TemporaryDirectory(prefix="ta_job_") as tmp_s:
        tmp = Path(tmp_s)
        cfg_path = tmp / "config.json"
        cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
        procs, stderr_paths, commands = [], [], []
        for r in range(world):
            dist_env = {
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(port),
                **rank_env(r),
            }
            argv = [
                *rank_prefix(r),
                sys.executable,
                rel(HERE / "workload.py"),
                "--config",
                str(cfg_path),
                "--result-dir",
                str(tmp),
            ]
            shown = {**{k: v for k, v in (env or {}).items() if k.startswith("TORCHINDUCTOR")}, **dist_env}
            commands.append(show_command(shown, argv, tmp))
            stderr_paths.append(tmp / f"rank{r}.stderr")
            with open(out / f"rank{r}.log", "w") as log, open(stderr_paths[-1], "w") as err:
                procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=REPO,
                        env=base_env({**(env or {}), **dist_env}),
                        stdout=log,
                        stderr=err,
                        start_new_session=True,
                    )
                )
        t0 = time.monotonic()
        wait_all(procs, stderr_paths, f"scenario {cfg.scenario}")
        wall = time.monotonic() - t0
        results = [json.loads((tmp / f"result_rank{r}.json").read_text()) for r in range(world)]
    return JobResult(
        step_times_ms={str(r["rank"]): r["step_times_ms"] for r in results},
        n_params=results[0]["n_params"],
        commands=commands,
        wall_s=round(wall, 1),
        extra={"cpu_busy_before": busy},
    )


def busy_check(seconds: float = 1.0) -> float | None:
    """Share of all cores (0..1) busy during ``seconds`` before a job, from /proc/stat (None where
    unreadable); warns when other work is running, since it shares the 2 cores with the ranks."""

    def snapshot() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = snapshot()
        time.sleep(seconds)
        total1, idle1 = snapshot()
    except (OSError, ValueError, IndexError):
        return None
    busy = round(1 - (idle1 - idle0) / max(1, total1 - total0), 2)
    if busy > 0.2:
        print(
            f"   warning: {busy:.0%} of the CPU was busy before the job: other processes share the "
            "cores, so the recorded step times will carry their noise",
            flush=True,
        )
    return busy


def show_command(env: dict[str, str], argv: list[str], tmp: Path) -> str:
    """``argv`` as a shell line with its ``env`` settings in front, ``python`` for this interpreter
    and ``TMP`` for the job's temporary directory (which holds config.json and the step-time files)."""
    line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    line += " " + shlex.join(["python" if a == sys.executable else a for a in argv])
    return line.replace(str(tmp), "TMP")


def trace_files(d: Path) -> list[Path]:
    """The Kineto traces in ``d`` (``*.pt.trace.json.gz``), sorted by name."""
    return sorted(d.glob("*.pt.trace.json.gz"))


def check_traces(d: Path, world: int) -> None:
    """Fail loudly unless ``d`` holds exactly one trace per rank."""
    found = trace_files(d)
    if len(found) != world:
        raise RuntimeError(f"{d}: expected {world} traces, found {[p.name for p in found]}")


def steady_ms(result: JobResult, first: int = 2) -> dict[str, float]:
    """Per rank, the median step time over steps ``first``.. (skips warm-up and compile steps; the
    median also ignores the step after the profiled window, which waits for peers writing traces)."""
    return {r: round(statistics.median(t[first:]), 1) for r, t in result.step_times_ms.items()}


def write_ground_truth(
    out: Path,
    name: str,
    description: str,
    expected: dict,
    world: int,
    result: JobResult,
    config: dict,
    **extra: object,
) -> None:
    """Write ``out/scenario.json``: the ground truth a test or a reader checks the analyzer against."""
    import torch  # only here, so that ``--help`` works without torch

    doc = {
        "scenario": name,
        "description": description,
        "expected": expected,
        "world_size": world,
        "backend": "gloo",
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "processor": cpu_model(),
            "cpu_busy_before_job": result.extra.get("cpu_busy_before"),
        },
        "step_times_ms": result.step_times_ms,
        "median_step_time_ms_from_step2": steady_ms(result),
        "profiled_steps": extra.pop("profiled_steps", [2, 3, 4]),
        "config": config,
        "n_params": result.n_params,
        "job_wall_s": result.wall_s,
        "generated_by": "sample_traces/generate.py",
        "command": shlex.join(["python", rel(Path(sys.argv[0])), *sys.argv[1:]]),
        "rank_commands": result.commands,
        **extra,
    }
    (out / "scenario.json").write_text(dumps_compact(doc))


def dumps_compact(doc: dict) -> str:
    """Indented JSON, but each list of plain numbers/strings on one line (step-time lists stay short)."""
    text = json.dumps(doc, indent=2)
    return (
        re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]", text)
        + "\n"
    )


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('' when unknown)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def job_config(name: str, out: Path, **kw: object) -> JobConfig:
    """A JobConfig for scenario ``name`` writing into ``out`` (relative to the repo when inside it)."""
    return JobConfig(scenario=name, out_dir=rel(out), **kw)


def public_config(cfg: JobConfig) -> dict:
    """The config as recorded in scenario.json (without the output path)."""
    d = dataclasses.asdict(cfg)
    d.pop("out_dir")
    d.pop("scenario")
    d["model"] = (
        "TinyLM (workload.py): token+position embedding, n_layers pre-LN attention/MLP blocks, LM head"
    )
    d["optimizer"] = "AdamW"
    d["parallelism"] = "DistributedDataParallel (gloo)"
    return d


def record(
    name: str,
    out_root: Path,
    world: int,
    description: str,
    expected: dict,
    *,
    run_kw: dict | None = None,
    truth: Callable[[Path, JobResult], dict] | None = None,
    **cfg_kw: object,
) -> None:
    """Record scenario ``name``: a fresh ``out_root/name``, the ``world``-rank job (``run_ranks`` with
    ``run_kw``), a check for one trace per rank, and scenario.json with the extra keys ``truth`` gives."""
    out = out_root / name
    reset_dir(out)
    cfg = job_config(name, out, **cfg_kw)
    result = run_ranks(cfg, world, **(run_kw or {}))
    check_traces(out, world)
    extra = truth(out, result) if truth else {}
    start = cfg.profile_wait + cfg.profile_warmup  # the steps the profiler's schedule records
    extra.setdefault("profiled_steps", list(range(start, start + cfg.profile_active)))
    write_ground_truth(out, name, description, expected, world, result, public_config(cfg), **extra)


# ----------------------------------------------------------------------------------------- scenarios


@scenario
def scenario_healthy(out_root: Path) -> None:
    """4 balanced ranks: the reference run, which should get no finding."""
    record(
        "healthy",
        out_root,
        4,
        "4 gloo ranks (2 CPU cores), balanced DDP training of a small transformer LM; nothing wrong.",
        {"cause": None, "kind": None, "ranks": []},
    )


@scenario
def scenario_straggler(out_root: Path) -> None:
    """Rank 2 runs 6 extra no-grad forward passes before backward every step (~3x its compute)."""
    record(
        "straggler",
        out_root,
        4,
        "4 gloo ranks; rank 2 alone runs 6 extra forward passes of the model under torch.no_grad() "
        "before backward every step (like an evaluation/metrics pass only one rank does; about 3x its "
        "compute), so the other ranks wait for it in the gradient all-reduce (gloo:all_reduce).",
        {"cause": "imbalance", "kind": "straggler", "ranks": [2]},
        straggler_rank=2,
        straggler_extra_forwards=6,
    )


PRECISION_KW: dict = {"d_model": 384, "n_heads": 6, "micro_batch": 16, "seq_len": 32}


@scenario
def scenario_precision_fp32(out_root: Path) -> None:
    """The 2-rank job with every matmul in fp32."""
    record(
        "precision_fp32",
        out_root,
        2,
        "2 gloo ranks, all matmuls in fp32 (no autocast); compare with precision_bf16, the same job under "
        "torch.autocast('cpu', dtype=torch.bfloat16).",
        {"cause": "precision", "kind": "fp32_matmul", "ranks": [0, 1]},
        dtype="float32",
        **PRECISION_KW,
    )


@scenario
def scenario_precision_bf16(out_root: Path) -> None:
    """The same 2-rank job under bf16 autocast (the fix for precision_fp32)."""
    record(
        "precision_bf16",
        out_root,
        2,
        "2 gloo ranks, forward under torch.autocast('cpu', dtype=torch.bfloat16): aten::mm/addmm get "
        "c10::BFloat16 inputs; parameters and the gradient all-reduce stay fp32. The fix for "
        "precision_fp32.",
        {"cause": None, "kind": None, "ranks": []},
        dtype="bfloat16",
        **PRECISION_KW,
    )


COMPILE_KW: dict = {"compile": True, "steps": 6, "profile_wait": 0, "profile_warmup": 0, "profile_active": 3}
_inductor_cache: dict[str, Path] = {}


def inductor_cache_dir() -> Path:
    """One fresh, empty TORCHINDUCTOR_CACHE_DIR per generate.py invocation (shared by cold and warm)."""
    if "dir" not in _inductor_cache:
        _inductor_cache["dir"] = Path(tempfile.mkdtemp(prefix="ta_inductor_cache_"))
    return _inductor_cache["dir"]


def compile_env(cache: Path) -> dict[str, str]:
    """Inductor settings for the compile scenarios: the given cache dir, one compile thread (2 cores)."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def log_json(log: Path, prefix: str) -> dict:
    """The JSON object of the first ``# <prefix> {...}`` line workload.py printed into ``log`` ({} if none)."""
    head = f"# {prefix} "
    for line in log.read_text().splitlines():
        if line.startswith(head):
            return json.loads(line.removeprefix(head))
    return {}


def compile_counters(log: Path) -> dict:
    """The ``# compile counters {...}`` line workload.py prints at the end of a compiled run
    (torch._dynamo.utils.counters: FX graph / AOTAutograd cache hits, misses, bypasses)."""
    return log_json(log, "compile counters")


def compile_run(out_root: Path, name: str, description: str, expected: dict, cache_note: str,
                **cfg_kw: object) -> None:
    """Record the 2-rank compiled job with the shared inductor cache, profiled from step 0 (``cfg_kw``
    overrides :data:`COMPILE_KW`, e.g. ``compile=False`` for the eager twin of the compile pair)."""
    record(
        name,
        out_root,
        2,
        description,
        expected,
        run_kw={"env": compile_env(inductor_cache_dir())},
        truth=lambda out, result: {
            "profiled_steps": [0, 1, 2],
            "compile_counters": {r: compile_counters(out / f"rank{r}.log") for r in result.step_times_ms},
            "inductor_cache": cache_note,
        },
        **{**COMPILE_KW, **cfg_kw},
    )


@scenario
def scenario_compile_cold(out_root: Path) -> None:
    """torch.compile with an empty inductor cache, profiled from the first step."""
    cache = inductor_cache_dir()
    if any(cache.iterdir()):
        raise RuntimeError(f"inductor cache {cache} is not empty; compile_cold must run before compile_warm")
    compile_run(
        out_root,
        "compile_cold",
        "2 gloo ranks, torch.compile(DDP(model)) with an empty TORCHINDUCTOR_CACHE_DIR (fresh temp dir), "
        "profiled from the first step (schedule wait=0, warmup=0, active=3): ProfilerStep#0 holds the "
        "whole dynamo + AOTAutograd + inductor compile (entire_frame_compile, backend_compile, "
        "inductor_compile, entire_backward_compile ranges); later steps take ~0.1 s.",
        {"cause": "config", "kind": "compile_overhead", "ranks": [0, 1]},
        "empty at start (fresh temporary directory)",
    )


@scenario
def scenario_compile_warm(out_root: Path) -> None:
    """The same compiled job again, with the inductor cache compile_cold left behind."""
    cache = inductor_cache_dir()
    warmed_by = "the compile_cold run of the same generate.py invocation"
    if not any(cache.iterdir()):
        # Run alone (--only compile_warm): warm the cache with an unrecorded run of the same job first.
        scratch = Path(tempfile.mkdtemp(prefix="ta_warmup_"))
        try:
            run_ranks(job_config("compile_warm", scratch, **COMPILE_KW), 2, env=compile_env(cache))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        warmed_by = "an unrecorded run of the same job just before (compile_cold was not run)"
    compile_run(
        out_root,
        "compile_warm",
        "The compile_cold job again in new processes with the now-warm TORCHINDUCTOR_CACHE_DIR: the "
        "inductor FX graph cache hits (see compile_counters), so inductor codegen and C++ compilation "
        "are skipped. Dynamo still traces the frame and AOTAutograd still traces the joint graph (its "
        "cache is bypassed on this CPU-only torch build, which has no triton), so ProfilerStep#0 still "
        "takes a few seconds, about a quarter of compile_cold's; profiled from the first step like it.",
        {"cause": None, "kind": None, "ranks": []},
        f"warm, filled by {warmed_by}",
    )


DATALOADER_ROUNDS = 80


@scenario
def scenario_dataloader_bound(out_root: Path) -> None:
    """An expensive pure-Python per-sample transform in a num_workers=0 DataLoader."""
    record(
        "dataloader_bound",
        out_root,
        2,
        "2 gloo ranks; DataLoader(num_workers=0) whose Dataset.__getitem__ runs a slow pure-Python "
        "byte-pair tokenizer on each sample (about 2x the step's compute), so the training thread "
        "spends most of each step in enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__.",
        {"cause": "config", "kind": "dataloader", "ranks": [0, 1]},
        tokenizer_rounds=DATALOADER_ROUNDS,
        tokenizer_text_chars=512,
    )


MEMORY_LEAK_BYTES = 4 << 20  # per step, on rank 1 of memory_growth


@scenario
def scenario_memory_growth(out_root: Path) -> None:
    """Rank 1 keeps a fresh 4 MiB fp32 tensor alive every step; recorded with profile_memory=True."""
    record(
        "memory_growth",
        out_root,
        2,
        "2 gloo ranks, recorded with profile_memory=True; after the optimizer step, rank 1 alone appends a "
        "new 4 MiB fp32 tensor (torch.full) to a list it never clears, so its allocated memory at the end "
        "of every step is 4 MiB higher than at the one before (it would end in an out-of-memory error).",
        {"cause": "config", "kind": "memory_growth", "ranks": [1]},
        truth=lambda out, result: {"leak_rank": 1, "leak_bytes_per_step": MEMORY_LEAK_BYTES},
        profile_memory=True,
        leak_rank=1,
        leak_bytes_per_step=MEMORY_LEAK_BYTES,
        profile_active=4,
    )


# ------------------------------------------------------------------------------- interconnect (netns)

NETNS = ("ta_r0", "ta_r1")
VETH = ("ta_v0", "ta_v1")
ADDRS = ("10.231.0.1", "10.231.0.2")
SLOW_QDISC = ["tbf", "rate", "200mbit", "burst", "32kbit", "latency", "50ms"]
INTERCONNECT_KW: dict = {"d_model": 256, "n_heads": 8, "vocab": 4096, "micro_batch": 4, "seq_len": 64}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a network set-up command, echoing it."""
    print("  $", shlex.join(argv), flush=True)
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def teardown_netns() -> None:
    """Delete the namespaces (which deletes the veth ends inside them) and any stray veth; never fails."""
    for ns in NETNS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "link", "del", VETH[0]], capture_output=True)


@contextmanager
def veth_namespaces(qdisc: list[str] | None) -> Iterator[list[str]]:
    """Two network namespaces ta_r0/ta_r1 joined by a veth pair, addresses only inside them, optional
    egress qdisc on both ends; yields the set-up commands. Always torn down. Raises SkipScenario when
    namespaces cannot be made (not root, no ``ip``, EPERM)."""
    if os.geteuid() != 0:
        raise SkipScenario("network namespaces need root (ip netns add); not root here")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise SkipScenario("`ip`/`tc` not found (apt-get install iproute2)")
    teardown_netns()
    steps: list[list[str]] = [
        ["ip", "netns", "add", NETNS[0]],
        ["ip", "netns", "add", NETNS[1]],
        ["ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1]],
    ]
    for ns, dev, addr in zip(NETNS, VETH, ADDRS, strict=True):
        steps += [
            ["ip", "link", "set", dev, "netns", ns],
            ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", dev],
            ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
            ["ip", "netns", "exec", ns, "ip", "link", "set", dev, "up"],
        ]
        if qdisc:
            steps.append(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *qdisc])
    try:
        first = sh(*steps[0], check=False)
        if first.returncode != 0:
            raise SkipScenario(f"cannot create a network namespace: {first.stderr.strip()}")
        for argv in steps[1:]:
            sh(*argv)
        yield [shlex.join(a) for a in steps]
    finally:
        teardown_netns()


def interconnect(
    out_root: Path, name: str, qdisc: list[str] | None, description: str, expected: dict, **cfg_kw: object
) -> None:
    """Record the 2-rank job with rank r inside namespace ta_r{r}, talking over the veth pair only;
    ``cfg_kw`` overrides the job config (``link_probe_bytes`` adds each rank's ``link_probe`` to the truth)."""
    link = {
        "type": "veth pair between two network namespaces",
        "namespaces": list(NETNS),
        "interfaces": list(VETH),
        "addresses": list(ADDRS),
        "qdisc": " ".join(qdisc) if qdisc else "none (veth default, memory-speed)",
    }
    with veth_namespaces(qdisc) as setup:
        record(
            name,
            out_root,
            2,
            description,
            expected,
            run_kw={
                "master_addr": ADDRS[0],
                "port": 29500,
                "rank_prefix": lambda r: ["ip", "netns", "exec", NETNS[r]],
                "rank_env": lambda r: {"GLOO_SOCKET_IFNAME": VETH[r]},
            },
            truth=lambda out, result: {
                "link": link,
                "network_setup": setup,
                "grad_bytes_per_step": 4 * result.n_params,
                **link_probes(out, result),
            },
            **{**INTERCONNECT_KW, **cfg_kw},
        )


def link_probes(out: Path, result: JobResult) -> dict:
    """``{"link_probe": {rank: probe}}`` from the ``# link probe`` lines of the ranks' logs, or {} without."""
    probes = {r: log_json(out / f"rank{r}.log", "link probe") for r in result.step_times_ms}
    return {"link_probe": probes} if any(probes.values()) else {}


@scenario
def scenario_slow_interconnect(out_root: Path) -> None:
    """Gradient all-reduce over a 200 Mbit/s link (tbf on both veth ends)."""
    interconnect(
        out_root,
        "slow_interconnect",
        SLOW_QDISC,
        "2 gloo ranks, each in its own network namespace, joined by a veth pair shaped to 200 Mbit/s "
        "(tc tbf on both ends); the ~15 MB fp32 gradient all-reduce per step dominates the step time.",
        {"cause": "interconnect", "kind": "slow_collectives", "ranks": [0, 1]},
    )


@scenario
def scenario_fast_interconnect(out_root: Path) -> None:
    """The same namespaced job with an unshaped veth pair (the baseline for slow_interconnect)."""
    interconnect(
        out_root,
        "fast_interconnect",
        None,
        "The slow_interconnect job with the veth pair unshaped (no qdisc): the same all-reduce takes a "
        "small share of the step. Baseline for slow_interconnect.",
        {"cause": None, "kind": None, "ranks": []},
    )


# ------------------------------------------------------------------------------ grad_accum (HF Trainer)

HF_KW: dict = {"per_device": 2, "grad_accum": 8, "max_steps": 8, "seq_len": 64}


def run_hf(out: Path, world: int) -> JobResult:
    """Run hf_job.py on ``world`` processes (plain python for 1, torch.distributed.run for more)."""
    reset_dir(out)
    busy = busy_check()
    with tempfile.TemporaryDirectory(prefix="ta_hf_job_") as tmp_s:
        tmp = Path(tmp_s)
        job = [
            rel(HERE / "hf_job.py"),
            "--out",
            rel(out),
            "--result-dir",
            str(tmp),
            "--per-device",
            str(HF_KW["per_device"]),
            "--grad-accum",
            str(HF_KW["grad_accum"]),
            "--max-steps",
            str(HF_KW["max_steps"]),
            "--seq-len",
            str(HF_KW["seq_len"]),
        ]
        if world == 1:
            argv = [sys.executable, *job]
        else:
            argv = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                str(world),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(free_port()),
                *job,
            ]
        launcher_log = tmp / "launcher.log"
        t0 = time.monotonic()
        with open(launcher_log, "w") as log:
            proc = subprocess.Popen(
                argv, cwd=REPO, env=base_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            wait_all(
                [proc],
                [launcher_log, *(out / f"rank{r}.log" for r in range(world))],
                f"grad_accum {world}proc",
            )
        wall = time.monotonic() - t0
        results = [json.loads((tmp / f"result_rank{r}.json").read_text()) for r in range(world)]
    command = show_command({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}, argv, tmp)
    return JobResult(
        step_times_ms={str(r["rank"]): r["step_times_ms"] for r in results},
        n_params=results[0]["n_params"],
        commands=[command],
        wall_s=round(wall, 1),
        extra={"model": results[0]["model"], "cpu_busy_before": busy},
    )


def hf_config(world: int, model: dict) -> dict:
    """The recorded Trainer configuration of one grad_accum run."""
    per, ga = HF_KW["per_device"], HF_KW["grad_accum"]
    return {
        "framework": "transformers.Trainer",
        "transformers_version": pkg_version("transformers"),
        "accelerate_version": pkg_version("accelerate"),
        "model": "GPT2LMHeadModel from GPT2Config (random init, no download)",
        **model,
        "per_device_train_batch_size": per,
        "gradient_accumulation_steps": ga,
        "max_steps": HF_KW["max_steps"],
        "seq_len": HF_KW["seq_len"],
        "micro_batch": per,
        "grad_accum": ga,
        "dtype": "float32",
        "compile": False,
        "world_size": world,
        "effective_batch": per * ga * world,
        "ddp_backend": "gloo" if world > 1 else None,
        "optimizer": "AdamW (Trainer default), linear LR decay",
        "learning_rate": 5e-4,
        "logging_steps": 1,
        "use_cpu": True,
        "report_to": [],
    }


def pkg_version(name: str) -> str:
    """Installed version of a distribution, or 'missing'."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


@scenario
def scenario_grad_accum(out_root: Path) -> None:
    """HF Trainer, GA 8, on 1 process (baseline) and on 2 processes (subject): effective batch doubles."""
    try:
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise SkipScenario(f"needs transformers and accelerate ({e})") from e
    name = "grad_accum"
    root = out_root / name
    reset_dir(root)
    runs: dict[str, dict] = {}
    results: dict[int, JobResult] = {}
    for world in (1, 2):
        sub = f"{world}proc"
        result = run_hf(root / sub, world)
        check_traces(root / sub, world)
        results[world] = result
        cfg = hf_config(world, result.extra["model"])
        role = "baseline" if world == 1 else "subject"
        desc = (
            f"HF transformers.Trainer, tiny GPT-2, per_device_train_batch_size={HF_KW['per_device']}, "
            f"gradient_accumulation_steps={HF_KW['grad_accum']}, {world} process(es): effective batch "
            f"{cfg['effective_batch']}. The {role} of grad_accum."
            + (
                " Not distributed: its trace has no distributedInfo (rank 0 by its file name)."
                if world == 1
                else " torch.distributed.run, DDP over gloo."
            )
        )
        expected = (
            {"cause": None, "kind": None, "ranks": []}
            if world == 1
            else {"cause": "config", "kind": "gradient_accumulation", "ranks": [0, 1]}
        )
        write_ground_truth(
            root / sub, f"{name}/{sub}", desc, expected, world, result, cfg, role=role, distributed=world > 1
        )
        runs[sub] = {
            "role": role,
            "world_size": world,
            "effective_batch": cfg["effective_batch"],
            "step_times_ms": result.step_times_ms,
            "command": result.commands[0],
        }
    subject = results[2]
    cfg2 = hf_config(2, subject.extra["model"])
    write_ground_truth(
        root,
        name,
        "The LLaMA-Factory mistake: the same HF Trainer recipe (per-device batch 2, "
        "gradient_accumulation_steps=8) moved from 1 process (1proc/, baseline) to 2 processes (2proc/, "
        "subject) without lowering gradient_accumulation_steps, so the effective (global) batch doubles "
        "from 16 to 32 (banner 'Total train batch size (w. parallel, distributed & accumulation)'). Both "
        "runs take max_steps=8 optimizer steps, but each 2-process step consumes twice the samples and "
        "is slower (gloo all-reduce, two processes on two cores), and an epoch has half the optimizer "
        "steps, so loss curve and LR schedule no longer match the 1-process run.",
        {"cause": "config", "kind": "gradient_accumulation", "ranks": [0, 1]},
        2,
        subject,
        cfg2,
        runs=runs,
        subject="2proc",
        baseline="1proc",
        effective_batch={
            "1proc": HF_KW["per_device"] * HF_KW["grad_accum"],
            "2proc": HF_KW["per_device"] * HF_KW["grad_accum"] * 2,
        },
    )


# ------------------------------------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    """Run the chosen scenarios (all by default) in order; print a summary; exit 1 if any failed."""
    ap = argparse.ArgumentParser(description="Record the sample traces (see sample_traces/README.md).")
    ap.add_argument(
        "--only",
        nargs="+",
        choices=list(SCENARIOS),
        metavar="NAME",
        help=f"scenarios to run, from: {', '.join(SCENARIOS)}",
    )
    ap.add_argument("--out", type=Path, default=HERE, help="output root (default: sample_traces/)")
    ap.add_argument(
        "--pairs",
        nargs="*",
        metavar="NAME",
        help="record the paired samples (slow run and fixed twin, interleaved, 3 repetitions) into "
        "OUT/pairs/ instead of the scenarios: all, or the named pairs (see record_pairs.py)",
    )
    args = ap.parse_args(argv)
    if args.pairs is not None:
        import record_pairs  # beside this file; imports this module back

        return record_pairs.main(args.pairs, args.out)
    names = [n for n in SCENARIOS if not args.only or n in args.only]
    status: dict[str, str] = {}
    t_all = time.monotonic()
    try:
        for name in names:
            print(f"== {name}", flush=True)
            t0 = time.monotonic()
            try:
                SCENARIOS[name](args.out)
                status[name] = f"ok ({time.monotonic() - t0:.0f} s)"
            except SkipScenario as e:
                status[name] = f"SKIPPED: {e}"
            except Exception as e:  # noqa: BLE001  (report every scenario, then fail)
                status[name] = f"FAILED: {e}"
            print(f"   {status[name]}", flush=True)
    finally:
        if "dir" in _inductor_cache:
            shutil.rmtree(_inductor_cache["dir"], ignore_errors=True)
    print(f"\nsummary ({time.monotonic() - t_all:.0f} s):")
    for name, s in status.items():
        print(f"  {name:18s} {s}")
    return 1 if any(s.startswith("FAILED") for s in status.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
