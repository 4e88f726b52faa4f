"""The line families of PyTorch-native trainers: torchtune, torchtitan, litgpt and nanoGPT (FORMATS.md §9).

Each family is a small class over the shared :class:`~traceanalyze.logs.state.LogState`: ``wants`` tells from a
cheap test whether a line may be its, ``line`` reads it (True when no later family may see the line) and
``finish`` states what only the whole file tells.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from datetime import datetime

import yaml

from traceanalyze.logs.configs import config_facts
from traceanalyze.logs.model import LogStep, normalize_precision, to_int, to_number
from traceanalyze.logs.state import LogState

_TT_STEP = re.compile(r"^Step (?P<step>\d+) \| (?P<kv>(?:[A-Za-z_][\w/.-]*:\S+\s*)+)$")
_TT_KV = re.compile(r"(?P<k>[A-Za-z_][\w/.-]*):(?P<v>\S+)")
_TT_PRECISION = re.compile(r"Model is initialized with precision (?:torch\.)?(\w+)")
_RESOLVED_CONFIG = re.compile(r"with resolved config:\s*$")
_YAML_KEY_LINE = re.compile(r"^[A-Za-z_][\w.-]*:(?:\s|$)")
MAX_CONFIG_BLOCK_LINES = 5000  # lines of one resolved-config block kept

_TITAN_HDR = re.compile(r"^(?:\[titan\] )?(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+) - \S+ - [A-Z]+ - (?P<msg>.*)$")
_TITAN_STEP = re.compile(
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)(?:\s+grad_norm:\s*(?P<grad_norm>\S+))?"
    r"\s+memory:\s*(?P<mem_gib>[\d.]+)GiB\((?P<mem_pct>[\d.]+)%\)\s+(?:tps|wps):\s*(?P<tps>[\d,]+)"
    r"(?:\s+tflops:\s*(?P<tflops>[\d.]+))?(?:\s+mfu:\s*(?P<mfu>[\d.]+)%)?"
)
_TITAN_START = re.compile(r"Training starts at step (?P<step>\d+)")
_TITAN_START_FIELDS = {
    "per_device_batch": re.compile(r"local batch size (\d+)"),
    "global_batch": re.compile(r"global batch size (\d+)"),
    "gradient_accumulation_steps": re.compile(r"gradient accumulation steps (\d+)"),
    "seq_len": re.compile(r"sequence length (\d+)"),
    "total_optimization_steps": re.compile(r"total steps (\d+)"),
}
_TITAN_BUILD = re.compile(r"Building (\S+) (\S+) with ")
_TITAN_MESH = re.compile(r"Building \d+-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")

_LIT_OLD = re.compile(
    r"^iter (?P<iter>\d+)(?: \|)? step (?P<step>\d+): (?:loss (?P<loss>[\d.]+), )?"
    r"iter time: (?P<ms>[\d.]+) ?ms(?P<opt> \(optimizer\.step\))?"
)
_LIT_NEW = re.compile(
    r"^Epoch (?P<epoch>\d+) \| iter (?P<iter>\d+) step (?P<step>\d+) \| loss train: (?P<loss>[\d.]+), "
    r"val: (?P<val>\S+) \| iter time: (?P<ms>[\d.]+) ms(?P<opt> \(step\))?"
)
_NANOGPT = re.compile(r"^iter (?P<iter>\d+): loss (?P<loss>[\d.]+), time (?P<ms>[\d.]+)ms(?:, mfu (?P<mfu>-?[\d.]+)%)?")


# --------------------------------------------------------------------------------------------------------
# torchtune
# --------------------------------------------------------------------------------------------------------


class TorchtuneLines:
    """torchtune: ``Step N | k:v ...`` lines, the precision line, and the YAML block printed after ``with resolved
    config:`` (read as a config; a restarted job prints it again, read once)."""

    def __init__(self, log: LogState) -> None:
        self.log = log
        self.cfg_block: list[str] | None = None
        self.cfg_start = 0
        self.cfg_seen: set[int] = set()

    @staticmethod
    def wants_step(s: str) -> bool:
        return s.startswith("Step ")

    def step_line(self, lineno: int, s: str, rank: int | None) -> bool:
        """A ``Step N | k:v ...`` line; the line is always taken."""
        m = _TT_STEP.match(s)
        if not m:
            return True
        kv = {mm.group("k"): mm.group("v") for mm in _TT_KV.finditer(m.group("kv"))}
        mem = None
        for k in ("peak_memory_reserved", "peak_memory_alloc", "peak_memory_active"):
            if k in kv:
                mem = to_number(kv[k])
                break
        if mem is None and "gpu_resources" in kv:
            b = to_number(kv["gpu_resources"])
            mem = b / 2**30 if b is not None else None
        st = LogStep(
            rank=rank,
            step=int(m.group("step")),
            loss=to_number(kv.get("loss")),
            lr=to_number(kv.get("lr")),
            grad_norm=to_number(kv.get("grad_norm")),
            tokens_per_s=to_number(kv.get("tokens_per_second_per_gpu", kv.get("tokens_per_second"))),
            step_time_ms=to_number(kv.get("step_time_ms")),
            memory_gib=mem,
        )
        self.log.result.steps.append(st)
        self.log.evidence["torchtune"] += 1
        return True

    @staticmethod
    def wants_text(s: str) -> bool:
        return "torchtune" in s or "initialized with precision" in s

    def text_line(self, lineno: int, s: str, rank: int | None) -> bool:
        """A line naming torchtune (opens the resolved config block) or the model's precision."""
        if "torchtune" in s:
            self.log.evidence["torchtune"] += 1
            if _RESOLVED_CONFIG.search(s):
                self.cfg_block = []
                self.cfg_start = lineno + 1
        if "initialized with precision" in s:
            mp = _TT_PRECISION.search(s)
            if mp and normalize_precision(mp.group(1)):
                self.log.fact("precision", normalize_precision(mp.group(1)), lineno)
        return False

    def config_block_takes(self, line: str) -> bool:
        """Whether ``line`` (rank prefix removed, not stripped) belongs to an open resolved config block and is
        kept there; a line that ends the block reads the block as a config and is then offered to every family."""
        if self.cfg_block is None:
            return False
        if self._config_line(line) and len(self.cfg_block) < MAX_CONFIG_BLOCK_LINES:
            self.cfg_block.append(line)
            return True
        self.flush_config_block()
        return False

    @staticmethod
    def _config_line(line: str) -> bool:
        """True while a line still belongs to the YAML block torchtune prints after 'resolved config:'."""
        if not line.strip():
            return True
        if line.startswith((" ", "\t", "- ")):
            return True
        return bool(_YAML_KEY_LINE.match(line)) and not line.startswith(("INFO:", "DEBUG:", "WARNING:", "ERROR:"))

    def flush_config_block(self) -> None:
        """Read the open resolved config block (if any) as a config: its facts, once per distinct block."""
        block, self.cfg_block = self.cfg_block or [], None
        key = hash(tuple(block))
        if not block or key in self.cfg_seen:
            return
        self.cfg_seen.add(key)
        try:
            data = yaml.safe_load("\n".join(block))
        except yaml.YAMLError as exc:
            self.log.result.warnings.append(f"{self.log.name}:{self.cfg_start}: resolved config is not YAML ({exc})")
            return
        if isinstance(data, dict):
            for f in config_facts(data, block, self.log.name, self.cfg_start - 1):
                self.log.add_fact(f)

    def finish(self) -> None:
        if self.cfg_block is not None:
            self.flush_config_block()


# --------------------------------------------------------------------------------------------------------
# torchtitan
# --------------------------------------------------------------------------------------------------------


def _parse_ts(text: str) -> datetime | None:
    """``2026-05-18 16:04:46,338`` (Python logging's asctime) -> datetime; None when malformed."""
    try:
        frac = text[20:26]
        return datetime(
            int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]), int(text[14:16]),
            int(text[17:19]), int(frac.ljust(6, "0")) if frac else 0,
        )  # fmt: skip
    except ValueError:
        return None


class TitanLines:
    """torchtitan: ``step: .. loss: .. memory: ..GiB(..%) tps: ..`` lines (with or without ``[titan]``/``[rankN]:``
    prefixes), "Training starts at step" (batch sizes, steps), the model and the device mesh; and, per rank, the
    timestamps that give the first step's time (:meth:`first_step`)."""

    def __init__(self, log: LogState) -> None:
        self.log = log
        # timestamps per rank, kept as text and parsed in first_step(): "Training starts" (ts, step, line);
        # first step line (step, ts, line); the last two step lines
        self.start: dict[int | None, tuple[str, int, int]] = {}
        self.first: dict[int | None, tuple[int, str, int]] = {}
        self.last: dict[int | None, list[tuple[int, str]]] = defaultdict(list)

    @staticmethod
    def wants(s: str) -> bool:
        return "step:" in s and ("loss:" in s or "Training" in s) or "Training starts" in s or " - INFO - " in s

    def line(self, lineno: int, s: str, rank: int | None) -> bool:
        """A torchtitan line; True when it was one (step, start, model or mesh line)."""
        hdr = _TITAN_HDR.match(s)
        msg = hdr.group("msg") if hdr else s
        ts = hdr.group("ts") if hdr else None
        if s.startswith("[titan]"):
            self.log.evidence["torchtitan"] += 1
        m = _TITAN_STEP.search(msg)
        if m:
            self._step(m, lineno, ts, rank)
            return True
        if not hdr:
            return False
        ms = _TITAN_START.search(msg)
        if ms:
            if ts is not None and rank not in self.start:
                self.start[rank] = (ts, int(ms.group("step")), lineno)
            for key, rx in _TITAN_START_FIELDS.items():
                mf = rx.search(msg)
                if mf:
                    self.log.fact(key, int(mf.group(1)), lineno)
            return True
        mb = _TITAN_BUILD.search(msg)
        if mb and "device mesh" not in msg:
            self.log.fact("model_name", f"{mb.group(1)} {mb.group(2)}", lineno)
            return True
        mm = _TITAN_MESH.search(msg)
        if mm:
            self._mesh(mm, lineno)
            return True
        return False

    def _step(self, m: re.Match[str], lineno: int, ts: str | None, rank: int | None) -> None:
        step = int(m.group("step"))
        self.log.result.steps.append(
            LogStep(
                rank=rank,
                step=step,
                loss=to_number(m.group("loss")),
                grad_norm=to_number(m.group("grad_norm")),
                tokens_per_s=to_number(m.group("tps")),
                tflops=to_number(m.group("tflops")),
                mfu_pct=to_number(m.group("mfu")),
                memory_gib=to_number(m.group("mem_gib")),
            )
        )
        self.log.evidence["torchtitan"] += 1
        if ts is not None:
            self.first.setdefault(rank, (step, ts, lineno))
            last = self.last[rank]
            last.append((step, ts))
            if len(last) > 2:
                del last[0]

    def _mesh(self, mm: re.Match[str], lineno: int) -> None:
        """``Building N-D device mesh with [names], [sizes]``: world size, and data-parallel size (``dp*`` dims)."""
        names = [n.strip().strip("'\"") for n in mm.group(1).split(",") if n.strip()]
        dims = [to_int(d) for d in mm.group(2).split(",") if d.strip()]
        if dims and all(d is not None for d in dims) and len(names) == len(dims):
            world = 1
            dp = 1
            for n, d in zip(names, dims, strict=True):
                world *= d
                if n.startswith("dp"):
                    dp *= d
            self.log.fact("world_size", world, lineno)
            self.log.fact("data_parallel_size", dp, lineno)

    def first_step(self) -> tuple[float, float, int] | None:
        """``(first_step_s, compile_s, line)`` of the slowest rank: seconds from "Training starts at step" to the
        first step line, and that minus one steady-state step per step in between (the steady step from the last
        two step lines; ``compile_s`` NaN without them); None without both timestamps on any rank."""
        best: tuple[float, float, int] | None = None  # (first_step_s, compile_s, line)
        for rank, (s1, ts1, line1) in self.first.items():
            start = self.start.get(rank) or self.start.get(None)
            t1 = _parse_ts(ts1)
            t0 = _parse_ts(start[0]) if start else None
            if start is None or t0 is None or t1 is None:
                continue
            start_step = start[1]
            first = (t1 - t0).total_seconds()
            steady = self._steady_step_s(rank)
            compile_s = first - (s1 - start_step + 1) * steady if steady is not None else None
            if best is None or first > best[0]:
                best = (first, compile_s if compile_s is not None else float("nan"), line1)
        return best

    def _steady_step_s(self, rank: int | None) -> float | None:
        """Seconds per step between the last two step lines of ``rank``; None without two timed ones."""
        last = self.last[rank]
        if len(last) == 2:
            (sa, tsa), (sb, tsb) = last
            ta, tb = _parse_ts(tsa), _parse_ts(tsb)
            if sb > sa and ta is not None and tb is not None:
                return (tb - ta).total_seconds() / (sb - sa)
        return None


# --------------------------------------------------------------------------------------------------------
# litgpt and nanoGPT
# --------------------------------------------------------------------------------------------------------


class LitgptLines:
    """litgpt ``iter N step M: ...`` (old) and ``Epoch E | iter N step M | ...`` (current) lines, and nanoGPT
    ``iter N: loss X, time Yms, mfu Z%``; the gradient accumulation steps from litgpt's optimizer-step lines."""

    def __init__(self, log: LogState) -> None:
        self.log = log
        self.opt_steps: list[tuple[int, int, int]] = []  # (iter, step, line) of the optimizer-step lines

    @staticmethod
    def wants(s: str) -> bool:
        return "iter " in s

    def line(self, lineno: int, s: str, rank: int | None) -> bool:
        """A litgpt or nanoGPT iteration line; never takes the line from the families after it."""
        m = _LIT_OLD.match(s)
        epoch = None
        if not m:
            m = _LIT_NEW.match(s)
            if m:
                epoch = float(m.group("epoch"))
        if m:
            it, step = int(m.group("iter")), int(m.group("step"))
            self._iteration(m, rank, step, it, epoch=epoch)
            if m.group("opt"):
                self.opt_steps.append((it, step, lineno))
            self.log.evidence["litgpt"] += 1
            return False
        m = _NANOGPT.match(s)
        if m:
            mfu = to_number(m.group("mfu"))
            it = int(m.group("iter"))
            self._iteration(m, rank, it, it, mfu_pct=mfu if mfu is not None and mfu >= 0 else None)
            self.log.evidence["nanogpt"] += 1
        return False

    def _iteration(self, m: re.Match[str], rank: int | None, step: int, it: int, **extra: float | None) -> None:
        """The step of an iteration line: its loss and iteration time (ms), and ``extra`` fields."""
        self.log.result.steps.append(LogStep(rank=rank, step=step, iter=it, loss=to_number(m.group("loss")),
                                             step_time_ms=to_number(m.group("ms")), **extra))

    def finish(self) -> None:
        """litgpt: GAS = micro-batch iterations per optimizer step, from the ``(optimizer.step)`` lines."""
        if self.log.has_fact("gradient_accumulation_steps") or not self.opt_steps:
            return
        cands: Counter[int] = Counter()
        for (i0, s0, _), (i1, s1, _) in zip(self.opt_steps, self.opt_steps[1:], strict=False):
            if s1 > s0 and (i1 - i0) % (s1 - s0) == 0 and i1 > i0:
                cands[(i1 - i0) // (s1 - s0)] += 1
        if not cands:
            for it, st, _ in self.opt_steps:
                if st > 0 and it % st == 0:
                    cands[it // st] += 1
        if cands:
            self.log.fact("gradient_accumulation_steps", cands.most_common(1)[0][0], self.opt_steps[0][2])
