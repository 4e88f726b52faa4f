"""Out-of-memory deaths in a log (:class:`OomLines`): the CUDA out-of-memory message in each PyTorch form, torchrun's
record of a child killed by a signal, the kernel's OOM-killer line and a shell's bare ``Killed``; and the facts the
host-memory arithmetic reads: the host's RAM (``MemTotal:``, ``free -h``), the model's parameter count, and whether
the checkpoint was loading when a rank was killed.

The formats, with where each was seen, are in ``shared/logs/oom.txt``:

- PyTorch >= 2.2: ``Tried to allocate X. GPU 5 has a total capacity of C of which F is free. Including non-PyTorch
  memory, this process has U memory in use. Of the allocated memory A is allocated by PyTorch, and R is reserved by
  PyTorch but unallocated.``
- PyTorch 2.0-2.1: the same without the ``Including non-PyTorch memory`` sentence (2.1 spells ``capacty``).
- PyTorch <= 1.13: ``Tried to allocate X (GPU 2; C total capacity; A already allocated; F free; R reserved in total
  by PyTorch)``: reserved-but-unallocated is R - A.
- torchrun: ``failed (exitcode: -9) local_rank: 2 (pid: 7435)``, and its failure block (``host :``, ``rank : 10
  (local_rank: 2)``, ``exitcode : -9 (pid: 7435)``, ``traceback : Signal 9 (SIGKILL) received by PID 7435``).
- the kernel: ``Out of memory: Killed process 7435 (python) ... anon-rss:101234567kB``.
- a shell: ``Killed``.

Every size is bounded (:data:`~traceanalyze.limits.MAX_MEMORY_BYTES`), the records per file too
(:data:`~traceanalyze.limits.MAX_OOM_EVENTS`), a host name is cut to :data:`~traceanalyze.limits.MAX_HOST_NAME`
characters of ``[A-Za-z0-9._-]``.
"""

from __future__ import annotations

import re

from traceanalyze.limits import MAX_HOST_NAME, MAX_MEMORY_BYTES, MAX_OOM_EVENTS, MAX_PARAMS
from traceanalyze.logs.model import OomEvent, to_number
from traceanalyze.logs.state import LogState

_UNITS = {"b": 1, "bytes": 1, "kib": 1 << 10, "kb": 1 << 10, "mib": 1 << 20, "mb": 1 << 20, "gib": 1 << 30,
          "gb": 1 << 30, "tib": 1 << 40, "tb": 1 << 40}
# a printed size; read wider than PyTorch prints (a sign, 40 digits, an exponent) so that a figure out of range is
# seen and warned about (:func:`cuda_oom`) rather than silently not matched
_SIZE = r"(-?\d[\d,]{0,39}(?:\.\d{1,12})?(?:[eE][+-]?\d{1,4})?) ?(bytes|[KMGT]i?B|B)"
_CUDA_FIELDS = {
    "tried_bytes": re.compile(r"Tried to allocate " + _SIZE),
    "capacity_bytes": re.compile(_SIZE + r" total capacity|total capac(?:i)?ty of " + _SIZE),
    "free_bytes": re.compile(_SIZE + r" free[;)]|of which " + _SIZE + r" is free"),
    "in_use_bytes": re.compile(r"this process has " + _SIZE + r" memory in use"),
    "allocated_bytes": re.compile(_SIZE + r" already allocated|" + _SIZE + r" is allocated by PyTorch"),
    "reserved_unallocated_bytes": re.compile(_SIZE + r" is reserved by PyTorch but unallocated"),
}
# the parts of the GPU's memory a message states: none can exceed its total capacity
_PARTS_OF_GPU = ("free_bytes", "in_use_bytes", "allocated_bytes", "reserved_unallocated_bytes")
_RESERVED_TOTAL = re.compile(_SIZE + r" reserved in total by PyTorch")
_GPU = re.compile(r"\(GPU (\d{1,4});|\bGPU (\d{1,4}) has a total")
_TORCHRUN_FAILED = re.compile(r"failed \(exitcode: (-?\d{1,4})\) local_rank: (\d{1,7}) \(pid: (\d{1,10})\)")
_BLOCK_ENTRY = re.compile(r"^\[(\d{1,7})\]:$")
_BLOCK_FIELD = re.compile(r"^(host|rank|exitcode|traceback)\s*:\s*(.*)$")
_BLOCK_RANK = re.compile(r"^(\d{1,7})(?: \(local_rank: (\d{1,7})\))?")
_BLOCK_EXIT = re.compile(r"^(-?\d{1,4})(?: \(pid: (\d{1,10})\))?")
_SIGNAL = re.compile(r"Signal (\d{1,3}) \((SIG[A-Z]{2,8})\)")
_KERNEL = re.compile(r"Out of memory: Kill(?:ed)? process (\d{1,10}) \(([^)]{0,64})\)(?:.*?anon-rss:(\d{1,15})kB)?")
_SHELL_KILLED = re.compile(r"^(?:\S+: line \d+:\s+\d+\s+)?Killed(?:\s{2,}\S.*)?$")
_HOST_OK = re.compile(r"[^A-Za-z0-9._-]")
_MEMTOTAL = re.compile(r"^MemTotal:\s+(\d{1,15}) kB")
_FREE_MEM = re.compile(r"^Mem:\s+(\d{1,9}(?:\.\d{1,3})?)(Ti|Gi|T|G)\s")
_PARAMS = re.compile(
    r"([\d,]{4,24}) total param(?:eter)?s|\b(?:total|number of|num|model has)[ _]?(?:model )?param(?:eter)?s?"
    r"\s*[:=]?\s*([\d,]{1,24}(?:\.\d{1,4})?)\s*([KMBT])?\b", re.IGNORECASE)
_PARAM_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
_CKPT_LOAD = re.compile(r"loading (?:the )?(?:checkpoint|model|weights|pretrained|state dict)|checkpoint shards|"
                        r"load_checkpoint|load_state_dict", re.IGNORECASE)
MAX_BAD_NOTES = 10  # warnings kept per log about out-of-range figures (a crash loop repeats its message)
SIGNALS = {9: "SIGKILL"}  # signal number -> name, of the signals that mean a kill for memory


def size_bytes(num: str, unit: str) -> int | None:
    """Bytes from a printed size (``"3.50"``, ``"GiB"``); None when over :data:`MAX_MEMORY_BYTES` or unknown."""
    v = to_number(num)
    scale = _UNITS.get(unit.lower())
    if v is None or scale is None or not 0 <= v * scale <= MAX_MEMORY_BYTES:
        return None
    return int(v * scale)


def _size_of(m: re.Match[str] | None, bad: list[str] | None = None) -> int | None:
    """The size a field regex matched (the first of its alternatives that took part); one out of range is None and
    its text (``"-5 GiB"``) is added to ``bad``."""
    if m is None:
        return None
    groups = [g for g in m.groups()]
    for i in range(0, len(groups) - 1, 2):
        if groups[i] is not None:
            b = size_bytes(groups[i], groups[i + 1])
            if b is None and bad is not None:
                bad.append(f"{groups[i][:24]} {groups[i + 1]}")
            return b
    return None


def host_name(text: str) -> str | None:
    """A host name as the report may show it: ``[A-Za-z0-9._-]`` only, at most :data:`MAX_HOST_NAME` characters."""
    h = _HOST_OK.sub("", text.strip())[:MAX_HOST_NAME]
    return h or None


def cuda_oom(s: str, source: str, rank: int | None, problems: list[str] | None = None) -> OomEvent:
    """The CUDA out-of-memory message on line ``s`` (any PyTorch form, module docstring) as an :class:`OomEvent`.

    A size that is negative or over :data:`MAX_MEMORY_BYTES`, or a part of the GPU (free, in use, allocated,
    reserved) larger than the capacity the message states, is left out (None) with one line in ``problems``."""
    ev = OomEvent(kind="cuda", source=source, rank=rank,
                  form="torch>=2.2" if "Including non-PyTorch memory" in s else
                  "torch<=1.13" if "total capacity;" in s else "torch 2.0-2.1")
    bad: list[str] = []
    for key, rx in _CUDA_FIELDS.items():
        setattr(ev, key, _size_of(rx.search(s), bad))
    m = _GPU.search(s)
    if m:
        ev.gpu = int(m.group(1) or m.group(2))
    if ev.reserved_unallocated_bytes is None and ev.allocated_bytes is not None:
        reserved = _size_of(_RESERVED_TOTAL.search(s), bad)
        if reserved is not None:
            ev.reserved_unallocated_bytes = max(0, reserved - ev.allocated_bytes)
    if ev.capacity_bytes is not None:
        for key in _PARTS_OF_GPU:
            v = getattr(ev, key)
            if v is not None and v > ev.capacity_bytes:
                bad.append(f"{key.removesuffix('_bytes').replace('_', ' ')} {v:,} bytes > capacity "
                           f"{ev.capacity_bytes:,} bytes")
                setattr(ev, key, None)
    if bad and problems is not None:
        problems.append(f"{source}: CUDA out-of-memory message with a figure out of range ({'; '.join(bad[:4])}): "
                        f"left out (sizes are read from 0 to {MAX_MEMORY_BYTES:,} bytes)")
    return ev


class OomLines:
    """The out-of-memory family of :mod:`.text`: CUDA OOM messages, kills (torchrun, kernel, shell), the host's RAM,
    the parameter count and checkpoint loading; never takes a line from the families after it."""

    def __init__(self, log: LogState) -> None:
        self.log = log
        self.by_pid: dict[int, OomEvent] = {}
        self.block: dict[str, str] | None = None  # the torchrun failure entry being read
        self.block_line = 0
        self.in_failures = False
        self.loading_at: int | None = None  # steps parsed when the checkpoint last started loading
        self.exit_ranks: list[int] = []  # ranks of failure entries that exited with an error (no signal)
        self._seen: set[tuple] = set()

    def wants(self, s: str) -> bool:
        return (self.in_failures or "emory" in s or "Killed" in s or "exitcode" in s or "Failures:" in s
                or "Root Cause" in s or "heckpoint" in s or "oading" in s or "aram" in s or s.startswith("Mem"))

    def line(self, lineno: int, s: str, rank: int | None) -> bool:
        """One line: a record of a death, a fact, or a field of torchrun's failure block."""
        if self.in_failures and self._block_line(lineno, s):
            return False
        if "Failures:" in s or "Root Cause" in s:
            self.in_failures = True
            return False
        if "CUDA out of memory" in s:
            bad = self.log.result.bad_values
            self._add(cuda_oom(s, self._src(lineno), rank, bad if len(bad) < MAX_BAD_NOTES else None))
            return False
        m = _TORCHRUN_FAILED.search(s)
        if m:
            self._kill(lineno, int(m.group(1)), None, int(m.group(2)), int(m.group(3)), None)
            return False
        m = _KERNEL.search(s)
        if m:
            self._kernel(lineno, m)
            return False
        if _SHELL_KILLED.match(s):
            self._add(OomEvent(kind="host", form="shell", source=self._src(lineno), rank=rank, signal="SIGKILL"))
            return False
        self._facts(lineno, s)
        return False

    def _src(self, lineno: int) -> str:
        return f"{self.log.name}:{lineno}"

    def _add(self, ev: OomEvent) -> None:
        """Keep one record (the same death printed twice is kept once), at most :data:`MAX_OOM_EVENTS`."""
        key = (ev.kind, ev.form, ev.rank, ev.gpu, ev.pid, ev.tried_bytes)
        if key in self._seen or len(self.log.result.ooms) >= MAX_OOM_EVENTS:
            return
        self._seen.add(key)
        if ev.kind == "host" and self.loading_at is not None and self.loading_at == len(self.log.result.steps):
            ev.phase = "checkpoint_load"
        self.log.result.ooms.append(ev)
        if ev.pid is not None:
            self.by_pid.setdefault(ev.pid, ev)

    def _kill(self, lineno: int, code: int, rank: int | None, local: int | None, pid: int | None,
              host: str | None) -> None:
        """A child torchrun saw die: a kill when its exit code is minus a signal of :data:`SIGNALS`."""
        sig = SIGNALS.get(-code)
        if sig is None:
            if rank is not None and code > 0:
                self.exit_ranks.append(rank)
            return
        old = self.by_pid.get(pid) if pid is not None else None
        if old is not None:  # the failure block after torchrun's own line: the same child, more said
            old.rank = old.rank if rank is None else rank
            old.local_rank = old.local_rank if local is None else local
            old.host = old.host or host
            old.exitcode = code
            old.signal = sig
            return
        self._add(OomEvent(kind="host", form="torchrun", source=self._src(lineno), rank=rank, local_rank=local,
                           pid=pid, host=host, exitcode=code, signal=sig))

    def _kernel(self, lineno: int, m: re.Match[str]) -> None:
        """The kernel's OOM-killer line: confirms the kill of a child torchrun reported, or records one."""
        pid = int(m.group(1))
        rss = size_bytes(m.group(3), "KiB") if m.group(3) else None
        old = self.by_pid.get(pid)
        if old is not None:
            old.oom_killer = True
            old.rss_bytes = old.rss_bytes or rss
            return
        self._add(OomEvent(kind="host", form="kernel", source=self._src(lineno), pid=pid, signal="SIGKILL",
                           rss_bytes=rss, oom_killer=True))

    def _block_line(self, lineno: int, s: str) -> bool:
        """A line of torchrun's failure block (entries ``[N]:`` of ``host``/``rank``/``exitcode``/``traceback``);
        False when the block has ended (the line is then read as any other)."""
        if _BLOCK_ENTRY.match(s):
            self._flush()
            self.block, self.block_line = {}, lineno
            return True
        m = _BLOCK_FIELD.match(s)
        if m and self.block is not None:
            self.block[m.group(1)] = m.group(2)
            if m.group(1) == "traceback":
                self._flush()
            return True
        if s.startswith(("---", "===", "time", "error_file", "<NO_OTHER", "Root Cause")):
            if s.startswith("==="):
                self._flush()
                self.in_failures = False
            return True
        self._flush()
        self.in_failures = False
        return False

    def _flush(self) -> None:
        """Record the failure entry read so far (a kill when its exit code or traceback names a signal)."""
        b, self.block = self.block, None
        if not b:
            return
        mr = _BLOCK_RANK.match(b.get("rank", ""))
        me = _BLOCK_EXIT.match(b.get("exitcode", ""))
        ms = _SIGNAL.search(b.get("traceback", ""))
        code = int(me.group(1)) if me else (-int(ms.group(1)) if ms else None)
        if code is None:
            return
        self._kill(self.block_line, code, int(mr.group(1)) if mr else None,
                   int(mr.group(2)) if mr and mr.group(2) else None,
                   int(me.group(2)) if me and me.group(2) else None, host_name(b.get("host", "")))

    def _facts(self, lineno: int, s: str) -> None:
        """``host_ram_bytes`` (``MemTotal:``, ``free -h``), ``num_params``, and the start of a checkpoint load."""
        m = _MEMTOTAL.match(s)
        if m:
            b = size_bytes(m.group(1), "KiB")
            if b:
                self.log.fact("host_ram_bytes", b, lineno)
            return
        m = _FREE_MEM.match(s)
        if m:
            b = size_bytes(m.group(1), m.group(2) + "B")
            if b:
                self.log.fact("host_ram_bytes", b, lineno)
            return
        m = _PARAMS.search(s)
        if m and "trainable" not in s.lower():
            v = to_number(m.group(1) or m.group(2))
            if v is not None:
                v *= _PARAM_SCALE.get((m.group(3) or "").upper(), 1.0)
                if 1e6 <= v <= MAX_PARAMS:
                    self.log.fact("num_params", round(v), lineno)
            return
        if _CKPT_LOAD.search(s):
            self.loading_at = len(self.log.result.steps)

    def finish(self) -> None:
        """Close a failure block the file ended in; give a CUDA OOM without a rank the rank torchrun's failure block
        names, when it names exactly one that exited with an error."""
        self._flush()
        if len(set(self.exit_ranks)) == 1:
            for ev in self.log.result.ooms:
                if ev.kind == "cuda" and ev.rank is None:
                    ev.rank = self.exit_ranks[0]
