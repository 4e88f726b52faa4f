"""Record traces for traceanalyze from inside a training loop (needs torch: ``pip install 'traceanalyze[torch]'``).

Usage, on every rank::

    from traceanalyze import capture

    capture.prepare_env("traces/")             # before init_process_group: routes NCCL_DEBUG output to files
    dist.init_process_group("nccl")
    with capture.profile("traces/", wait=1, warmup=1, active=3) as prof:
        for step, batch in enumerate(loader):
            train_step(batch)
            prof.step()

:func:`profile` wraps ``torch.profiler.profile`` with a short schedule (``wait`` skipped steps, ``warmup``
steps, ``active`` recorded steps, once), ``record_shapes=True`` (dtypes and shapes of each op, for the
precision analysis) and CUDA activity when a GPU is present, and writes into ``out_dir``:

- ``rank{r}.<time>.pt.trace.json.gz``: the Kineto trace of rank ``r`` (``worker_name=f"rank{r}"``, gzip);
- ``env_rank{r}.json``: what the report can use about the process: rank, world size, hostname, versions
  (python, torch, CUDA, NCCL, cuDNN), GPU names, the backend, and the environment variables that change
  communication (``NCCL_*``, ``TORCH_NCCL_*``, ``CUDA_VISIBLE_DEVICES``, ``MASTER_ADDR``/``MASTER_PORT``,
  ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ...). traceanalyze reads it as facts about the run;
- ``steps_rank{r}.json``: the step time without the profiler (the profiler slows host-bound steps: recording
  each op costs µs). The steps of the schedule that run without it (the ``wait`` steps but the loop's first, and
  up to ``time_after`` steps after the recorded window) are timed from one ``prof.step()`` to the next, each
  between two ``torch.cuda.synchronize()`` calls when the process uses CUDA, and the recorded steps by the host
  clock alone (no synchronize the trace would show); :class:`StepTimer`, :func:`steps_record`;
- ``topo.txt``: ``nvidia-smi topo -m`` output, written by rank 0 when ``nvidia-smi`` exists;
- ``nccl_rank{r}_<host>_<pid>.log``: NCCL's debug lines, when ``NCCL_DEBUG=INFO`` is set and
  :func:`prepare_env` ran before the process group was created (NCCL reads ``NCCL_DEBUG_FILE`` once, when it
  initializes; otherwise it prints to stderr, and the torchrun log holding it can be copied beside the traces).

Only this module imports torch, and only inside its functions: importing ``traceanalyze`` (or this module)
never does, and the analyzer itself never needs torch.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from traceanalyze.names import UNPROFILED_KEY
from traceanalyze.safety import env_allowed  # the allow-list of environment variables (docs/safety.md)

ENV_MARKER = "traceanalyze_capture"  # top-level key that tells discovery this JSON is an env file
STEPS_FILE = "steps_rank{rank}.json"  # the step-time sidecar (traceanalyze.names.STEPS_SIDECAR_NAME)


def prepare_env(out_dir: str | os.PathLike, rank: int | None = None) -> dict[str, str]:
    """Route NCCL's debug output into ``out_dir``: call it before ``torch.distributed.init_process_group``.

    When ``NCCL_DEBUG`` is set and ``NCCL_DEBUG_FILE`` is not, sets ``NCCL_DEBUG_FILE`` to
    ``<out_dir>/nccl_rank{rank}_%h_%p.log`` (NCCL expands ``%h`` to the host name and ``%p`` to the pid;
    ``rank`` defaults to the ``RANK`` environment variable, and is left out of the name when unknown).
    Without ``NCCL_DEBUG`` nothing is set: turn it on with ``NCCL_DEBUG=INFO`` (``NCCL_DEBUG_SUBSYS=INIT,GRAPH``
    keeps it short).

    Returns:
        The variables it set (empty when none).

    Raises:
        OSError: ``out_dir`` cannot be created.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if rank is None and os.environ.get("RANK", "").isdigit():
        rank = int(os.environ["RANK"])
    set_: dict[str, str] = {}
    if os.environ.get("NCCL_DEBUG") and not os.environ.get("NCCL_DEBUG_FILE"):
        name = f"nccl_rank{rank}_%h_%p.log" if rank is not None else "nccl_%h_%p.log"
        os.environ["NCCL_DEBUG_FILE"] = set_["NCCL_DEBUG_FILE"] = str(out.resolve() / name)
    return set_


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int | None, str | None]:
    backend = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
            backend = str(dist.get_backend())
    except Exception:  # a half-initialized process group must not stop training
        pass
    if rank is None:
        rank = int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() else 0
    if world_size is None and os.environ.get("WORLD_SIZE", "").isdigit():
        world_size = int(os.environ["WORLD_SIZE"])
    return rank, world_size, backend


def environment(rank: int | None = None, world_size: int | None = None) -> dict[str, Any]:
    """What :func:`profile` writes to ``env_rank{r}.json``: a JSON-ready dict.

    Keys: ``traceanalyze_capture`` (format version, 1), ``rank``, ``world_size``, ``backend``, ``hostname``,
    ``pid``, ``time`` (UTC, ISO 8601), ``versions`` (``python``, ``torch``, ``cuda``, ``nccl``, ``cudnn``;
    None where absent), ``gpus`` (device names), ``env`` (the variables named in
    :data:`traceanalyze.safety.ENV_PREFIXES` / :data:`~traceanalyze.safety.ENV_NAMES` that are set, never one named
    like a credential: :func:`traceanalyze.safety.env_allowed`), ``cpu`` (:func:`cpu_facts`). Never raises for a
    missing GPU or NCCL.
    """
    import torch

    rank, world_size, backend = _rank_world(rank, world_size)
    versions: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                                "cuda": getattr(torch.version, "cuda", None), "nccl": None, "cudnn": None}
    gpus: list[str] = []
    try:
        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            v = torch.cuda.nccl.version()
            versions["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
            versions["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # CPU builds, broken drivers: versions stay None
        pass
    env = {k: v for k, v in sorted(os.environ.items()) if env_allowed(k)}
    return {ENV_MARKER: 1, "rank": rank, "world_size": world_size, "backend": backend,
            "hostname": socket.gethostname(), "pid": os.getpid(),
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "versions": versions, "gpus": gpus, "env": env, "cpu": cpu_facts()}


NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 flags for bf16 dot products / tiles in hardware


def cpu_facts(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> dict[str, Any]:
    """The host CPU as the precision what-if needs it: ``model`` (name), ``cpus`` (logical cores), ``cpus_allowed``
    (cores this process may run on, ``os.sched_getaffinity``; None where unsupported), ``threads`` (torch's
    intra-op threads in this process, ``torch.get_num_threads()``; None without torch: with ``cpus_allowed`` and
    the world size it tells whether ranks share cores), ``isa``
    (torch's CPU capability, e.g. ``AVX2``, ``AVX512``) and ``native_bf16`` (True when ``cpuinfo`` lists
    one of :data:`NATIVE_BF16_FLAGS`; False when it lists flags but none of them; None when it cannot be read,
    e.g. not Linux; ``isa`` None without torch) and ``mem_bytes`` (the host's physical memory in bytes, from
    ``sysconf``; None where unsupported: the host-memory arithmetic of a killed run compares with it). Without
    native bf16, oneDNN emulates bf16 matmuls and they run slower than fp32 (2-30x, by CPU), so bf16 autocast is no
    fix on that host. Never raises.
    """
    model: str | None = None
    flags: set[str] | None = None
    try:
        for line in Path(cpuinfo).read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = val.strip()
            elif key.strip() == "flags" and flags is None:
                flags = set(val.split())
    except OSError:
        pass
    model = model or platform.processor() or None
    try:
        import torch

        isa = torch.backends.cpu.get_cpu_capability()
        threads: int | None = torch.get_num_threads()
    except Exception:  # no torch, or an old one without it
        isa, threads = None, None
    try:
        allowed: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        allowed = None
    try:
        mem: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # not POSIX, or the name is unknown
        mem = None
    return {"model": model, "cpus": os.cpu_count(), "cpus_allowed": allowed, "threads": threads, "isa": isa,
            "mem_bytes": mem, "native_bf16": None if flags is None else bool(flags.intersection(NATIVE_BF16_FLAGS))}


def write_topology(out_dir: str | os.PathLike, timeout_s: float = 20.0) -> Path | None:
    """Write ``nvidia-smi topo -m`` output to ``<out_dir>/topo.txt``; None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0 or not res.stdout.strip():
        return None
    p = Path(out_dir) / "topo.txt"
    p.write_text(res.stdout, encoding="utf-8")
    return p


@contextlib.contextmanager
def profile(out_dir: str | os.PathLike, *, wait: int = 1, warmup: int = 1, active: int = 3,
            record_shapes: bool = True, profile_memory: bool = False, with_stack: bool = False,
            rank: int | None = None, world_size: int | None = None, cuda: bool | None = None,
            write_env: bool = True, topology: bool = True, cuda_sync_events: bool = True,
            time_after: int = 5) -> Iterator[Any]:
    """Profile a short window of a training loop on this rank; yields the ``torch.profiler.profile`` object.

    Call ``prof.step()`` once per training step. Steps ``wait`` are skipped, ``warmup`` are traced but
    discarded, then ``active`` steps are recorded (one window) and the trace is written when the window ends.

    Args:
        out_dir: folder for every rank's files (shared or per host; created when missing).
        wait, warmup, active: the ``torch.profiler.schedule`` (``repeat=1``).
        record_shapes: record op input shapes and dtypes (needed for the precision findings).
        profile_memory, with_stack: passed to ``torch.profiler.profile`` (both make traces bigger).
        rank, world_size: default to ``torch.distributed`` when initialized, else ``RANK``/``WORLD_SIZE``, else
            rank 0.
        cuda: record CUDA activity (default: when ``torch.cuda.is_available()``).
        write_env: write ``env_rank{r}.json``. topology: rank 0 writes ``topo.txt`` when nvidia-smi exists.
        cuda_sync_events: with CUDA, also record Kineto's ``cuda_sync`` rows (a stream waiting on another's event),
            which give the what-if replay its cross-stream edges; ignored by a torch without the option.
        time_after: steps timed without the profiler after the recorded window (0: none), for
            ``steps_rank{r}.json``, written once they ran, else when the block ends; ``prof.step`` is then the
            profiler's own again. The ``wait`` steps but the loop's first are timed too (a larger ``wait`` gives
            more of them).

    Raises:
        ImportError: torch is not installed. OSError: ``out_dir`` cannot be created or written.
    """
    import torch
    from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    r, ws, _ = _rank_world(rank, world_size)
    if os.environ.get("NCCL_DEBUG") and not os.environ.get("NCCL_DEBUG_FILE"):
        print(f"traceanalyze.capture: NCCL_DEBUG is set but NCCL_DEBUG_FILE is not; call "
              f"capture.prepare_env({str(out)!r}) before init_process_group to keep NCCL's lines beside the "
              "traces", file=sys.stderr)
    if write_env:
        (out / f"env_rank{r}.json").write_text(json.dumps(environment(r, ws), indent=1, default=str),
                                               encoding="utf-8")
    if topology and r == 0:
        write_topology(out)
    activities = [ProfilerActivity.CPU]
    extra: dict[str, Any] = {}
    if cuda if cuda is not None else torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
        if cuda_sync_events:
            try:
                from torch._C._profiler import _ExperimentalConfig

                extra["experimental_config"] = _ExperimentalConfig(enable_cuda_sync_events=True)
            except (ImportError, TypeError):  # an older torch: no cuda_sync rows, the report says so
                pass
    prof = torch.profiler.profile(
        activities=activities, record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(out), worker_name=f"rank{r}", use_gzip=True), **extra)
    flags = {"record_shapes": record_shapes, "with_stack": with_stack, "profile_memory": profile_memory}
    with prof:
        finish = _time_steps(prof, StepTimer(wait, warmup, active, time_after, sync=_cuda_sync),
                             out / STEPS_FILE.format(rank=r), r, flags)
        try:
            yield prof
        finally:
            finish()


def _time_steps(prof: Any, timer: StepTimer, path: Path, rank: int, flags: dict[str, bool]) -> Callable[[], None]:
    """Time the steps of the started profiler ``prof`` (its ``step`` wrapped) and write ``path`` once ``timer`` is
    done (``prof.step`` is then the profiler's own again); returns what writes it at the block's end, if not yet."""
    written = False

    def write() -> None:
        nonlocal written
        if written:
            return
        written = True
        try:
            path.write_text(json.dumps(steps_record(timer, rank, flags), indent=1), encoding="utf-8")
        except (OSError, TypeError, ValueError) as exc:  # never the training's end
            print(f"traceanalyze.capture: could not write the step times ({exc})", file=sys.stderr)

    real_step = prof.step

    def step() -> None:  # prof.step, timed: the step that ends now, then the profiler's own step
        timer.end_step()
        real_step()
        timer.next_step()
        if timer.done:
            write()
            with contextlib.suppress(AttributeError):
                del prof.step  # the profiler's own step again: nothing left to time

    prof.step = step
    timer.begin()
    return write


def _cuda_sync() -> bool:
    """``torch.cuda.synchronize()`` when this process already uses CUDA (never creates a CUDA context on a CPU
    job); whether it did."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        return True
    return False


class StepTimer:
    """Times the steps of a ``torch.profiler.schedule(wait, warmup, active, repeat=1)`` loop (no torch needed).

    Step ``k`` (0-based) runs from the return of the ``k``-th ``prof.step()`` call (the block's start for step 0)
    to the ``k+1``-th call: :meth:`begin` at the start, :meth:`end_step` before each call, :meth:`next_step`
    after it, so the profiler's own work in the call (starting, stopping, writing the trace) is in no step.
    Steps ``1 .. wait-1`` and the ``after`` steps past the window run without the profiler (*unprofiled*): ``sync``
    (a callable returning whether it synchronized) runs at both ends of each, so the GPU's queue is in its time.
    The loop's first step (warm-up, compile) is kept apart; ``warmup`` steps are not timed; ``active`` steps are
    timed by ``clock`` alone (a synchronize would show in the trace). :attr:`done` once the ``after`` steps ran.
    """

    def __init__(self, wait: int, warmup: int, active: int, after: int,
                 sync: Callable[[], bool] | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.wait, self.warmup, self.active, self.after = max(wait, 0), max(warmup, 0), max(active, 0), max(after, 0)
        self.window_end = self.wait + self.warmup + self.active  # first step after the recorded window
        self.sync, self.clock = sync, clock
        self.step = 0  # the step that runs now
        self.synced = False  # whether any time was taken after a CUDA synchronize
        self.first_ms: float | None = None
        self.unprofiled: list[tuple[int, float]] = []  # (step, ms)
        self.profiled: list[tuple[int, float]] = []
        self._start: float | None = None

    def phase(self, k: int) -> str:
        """``wait``, ``warmup``, ``active``, ``after`` (timed past the window) or ``done`` (not timed)."""
        if k < self.wait:
            return "wait"
        if k < self.wait + self.warmup:
            return "warmup"
        if k < self.window_end:
            return "active"
        return "after" if k < self.window_end + self.after else "done"

    @property
    def done(self) -> bool:
        return self.step >= self.window_end + self.after

    def _now(self, k: int) -> float:
        if self.sync is not None and self.phase(k) in ("wait", "after"):
            self.synced = self.sync() or self.synced
        return self.clock()

    def begin(self) -> None:
        self.step = 0
        self._start = self._now(0) if self.phase(0) != "warmup" else None

    def end_step(self) -> None:
        k, start, self._start = self.step, self._start, None
        if start is None:
            return
        ms = (self._now(k) - start) * 1e3
        if k == 0:
            self.first_ms = ms
        elif self.phase(k) in ("wait", "after"):
            self.unprofiled.append((k, ms))
        elif self.phase(k) == "active":
            self.profiled.append((k, ms))

    def next_step(self) -> None:
        self.step += 1
        self._start = self._now(self.step) if self.phase(self.step) in ("wait", "active", "after") else None


def steps_record(timer: StepTimer, rank: int, profiler: dict[str, bool]) -> dict[str, Any]:
    """What :func:`profile` writes to ``steps_rank{r}.json`` (docs/schema.md, "Input files"): a JSON-ready dict."""
    return {ENV_MARKER: 1, "rank": rank, UNPROFILED_KEY: [round(ms, 4) for _, ms in timer.unprofiled],
            "unprofiled_steps": [k for k, _ in timer.unprofiled],
            "profiled_step_ms": [round(ms, 4) for _, ms in timer.profiled],
            "profiled_steps": [k for k, _ in timer.profiled],
            "first_step_ms": None if timer.first_ms is None else round(timer.first_ms, 4),
            "schedule": {"wait": timer.wait, "warmup": timer.warmup, "active": timer.active, "after": timer.after},
            "timing": "cuda_synchronize" if timer.synced else "perf_counter", "profiler": dict(profiler)}
