"""Text training logs, streamed line by line (:func:`parse_text_log`).

One small dispatcher (:class:`_TextLogParser`) strips a line's rank prefix and offers the line to each line family
in a fixed order: NCCL, torchtune step lines, torchtitan, litgpt/nanoGPT, HF Trainer dicts, the HF banner,
torch.compile, other torchtune lines, LLaMA-Factory, Lightning, out-of-memory deaths (:mod:`.oom`); a line no
family took as a step may be a plain console step line. The order decides which family a line belongs to, and the
order of steps and facts.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from traceanalyze.errors import InputError
from traceanalyze.logs.hf import (
    HfTrainerLines,
    LlamaFactoryLines,
    parse_llamafactory_jsonl,
    parse_step_times_json,
    parse_trainer_state,
)
from traceanalyze.logs.model import Fact, LogResult, LogStep
from traceanalyze.logs.nccl import NcclLines
from traceanalyze.logs.oom import OomLines
from traceanalyze.logs.read import iter_lines, open_binary
from traceanalyze.logs.state import LogState
from traceanalyze.logs.trainers import LitgptLines, TitanLines, TorchtuneLines
from traceanalyze.names import SNIFF_BYTES, is_step_times_json

_PREFIX_RE = re.compile(r"^(?:\d{1,5}: )?(?:\[rank(?P<rank>\d+)\]:)?(?:\[rank: (?P<lrank>\d+)\] )?")
# console step lines: "[rank0] step 3 loss 2.31 time 637.9ms", "step 12 | step_time: 0.64 s", "Step 5: dt=120ms"
_CONSOLE_STEP = re.compile(
    r"^\s*(?:\[rank\s*(?P<rank>\d+)\]:?\s*)?(?:.*?[\s|,])?step\s*[:#=]?\s*(?P<step>\d+)\b.*?"
    r"\b(?:step_time|step time|iter_time|time|dt|elapsed)\s*[:=]?\s*(?P<v>\d+(?:\.\d+)?)\s*(?P<u>ms|s|sec)\b",
    re.IGNORECASE)
_LIGHTNING_AMP = re.compile(r"Using (bfloat16|16bit|bf16|16) Automatic Mixed Precision")

_RECOMPILE = re.compile(r"Recompiling function (\S+)")
_RECOMPILE_LIMIT = re.compile(r"hit config\.(?:cache_size_limit|recompile_limit) \((\d+)\)")
_INDUCTOR_TIME = re.compile(r"FX codegen and compilation took ([\d.]+)s")
_COMPILING = re.compile(r"Compiling .*with torch\.compile")

#: A line family's handler: ``(line number, stripped line, rank) -> taken`` (True: no later family sees the line).
LineHandler = Callable[[int, str, int | None], bool]


class CompileLines:
    """torch.compile lines: ``Recompiling function``, ``hit config.cache_size_limit (N)`` (per rank),
    inductor's ``FX codegen and compilation took Xs`` (summed per rank) and ``Compiling ... with torch.compile``."""

    def __init__(self, log: LogState) -> None:
        self.log = log
        self.recompiles: Counter[int | None] = Counter()
        self.recompile_limit: dict[int | None, int] = {}
        self.inductor_s: dict[int | None, float] = defaultdict(float)
        self.inductor_line: int | None = None
        self.recompile_line: int | None = None

    @staticmethod
    def wants(s: str) -> bool:
        return "ompil" in s or "_limit (" in s

    def line(self, lineno: int, s: str, rank: int | None) -> bool:
        """One torch.compile line; never takes the line from the families after it."""
        if _RECOMPILE.search(s):
            self.recompiles[rank] += 1
            self.recompile_line = self.recompile_line or lineno
            return False
        m = _RECOMPILE_LIMIT.search(s)
        if m:
            self.recompile_limit[rank] = max(self.recompile_limit.get(rank, 0), int(m.group(1)))
            self.recompile_line = self.recompile_line or lineno
            return False
        m = _INDUCTOR_TIME.search(s)
        if m:
            self.inductor_s[rank] += float(m.group(1))
            self.inductor_line = self.inductor_line or lineno
            return False
        if _COMPILING.search(s):
            self.log.fact("compile", "true", lineno)
        return False

    def finish(self, titan: TitanLines) -> None:
        """``recompiles`` (worst rank); ``compile_time_s`` from inductor's times (worst rank), else from torchtitan's
        first step minus a steady step when compile is on (with ``first_step_s``)."""
        recompiles = {r: max(n, self.recompile_limit.get(r, 0)) for r, n in self.recompiles.items()}
        for r, n in self.recompile_limit.items():
            recompiles.setdefault(r, n)
        if recompiles:
            self.log.fact("recompiles", max(recompiles.values()), self.recompile_line)
        if self.inductor_s:
            self.log.fact("compile_time_s", round(max(self.inductor_s.values()), 3), self.inductor_line)
            return
        best = titan.first_step()
        if best is None:
            return
        first, compile_s, line1 = best
        self.log.fact("first_step_s", round(first, 3), line1)
        compiled = any(f.key == "compile" and f.value == "true" for f in self.log.result.facts)
        if compiled and compile_s == compile_s and compile_s > 0:
            self.log.fact("compile_time_s", round(compile_s, 3), line1)


class LightningLines:
    """Lightning's ``Using bfloat16 Automatic Mixed Precision``: the precision."""

    def __init__(self, log: LogState) -> None:
        self.log = log

    @staticmethod
    def wants(s: str) -> bool:
        return "Automatic Mixed Precision" in s

    def line(self, lineno: int, s: str, rank: int | None) -> bool:
        """One Lightning precision line; never takes the line from the families after it."""
        ma = _LIGHTNING_AMP.search(s)
        if ma:
            self.log.fact("precision", "bf16" if "b" in ma.group(1) else "fp16", lineno)
        return False


def _console_step(log: LogState, line: str, rank: int | None) -> None:
    """A plain console step line (:mod:`traceanalyze.logs`), when no framework's format took the line."""
    m = _CONSOLE_STEP.match(line)
    if not m:
        return
    ms = float(m.group("v")) * (1.0 if m.group("u").lower() == "ms" else 1000.0)
    r = int(m.group("rank")) if m.group("rank") else rank
    if r is not None and m.group("rank"):
        log.prefix_ranks.add(r)
    log.evidence["console"] += 1
    log.result.steps.append(LogStep(rank=r, step=int(m.group("step")), step_time_ms=ms))


class _TextLogParser:
    """One pass over a text log: the dispatcher over the line families (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.log = log = LogState(path)
        self.torchtune = TorchtuneLines(log)
        self.titan = TitanLines(log)
        self.litgpt = LitgptLines(log)
        self.hf = HfTrainerLines(log)
        self.llamafactory = LlamaFactoryLines(log)
        self.nccl = NcclLines(log)
        self.compile = CompileLines(log)
        self.lightning = LightningLines(log)
        self.oom = OomLines(log)
        # (does the stripped line interest the family?, its handler), in the order the families see a line
        self.families: tuple[tuple[Callable[[str], bool], LineHandler], ...] = (
            (NcclLines.wants, self.nccl.line),
            (TorchtuneLines.wants_step, self.torchtune.step_line),
            (TitanLines.wants, self.titan.line),
            (LitgptLines.wants, self.litgpt.line),
            (HfTrainerLines.wants_dict, self.hf.dict_line),
            (HfTrainerLines.wants_banner, self.hf.banner_line),
            (CompileLines.wants, self.compile.line),
            (TorchtuneLines.wants_text, self.torchtune.text_line),
            (LlamaFactoryLines.wants, self.llamafactory.line),
            (LightningLines.wants, self.lightning.line),
            (self.oom.wants, self.oom.line),
        )

    def _strip_prefix(self, line: str) -> tuple[int | None, str]:
        """The line's rank (``[rankN]:`` / ``[rank: N]`` prefix, else the file name's) and the line without it."""
        m = _PREFIX_RE.match(line)
        rank = self.log.file_rank
        if m.end():
            r = m.group("rank") or m.group("lrank")
            if r is not None:
                rank = int(r)
                self.log.prefix_ranks.add(rank)
            line = line[m.end() :]
        return rank, line

    def feed(self, lineno: int, line: str) -> None:
        """Offer one cleaned line (:func:`~traceanalyze.logs.read.iter_lines`) to the families, in order."""
        n_steps = len(self.log.result.steps)
        rank, line = self._strip_prefix(line)
        if self.torchtune.config_block_takes(line):
            return
        s = line.strip()
        if not s:
            return
        for wants, handle in self.families:
            if wants(s) and handle(lineno, s, rank):
                return
        if n_steps == len(self.log.result.steps) and "tep" in s and not s.startswith("#"):  # not a comment
            _console_step(self.log, line, rank)

    def finish(self) -> LogResult:
        """The result: what only the whole file tells (the file's rank, derived facts, the framework first)."""
        self.torchtune.finish()
        self.oom.finish()
        log = self.log
        res = log.result
        if len(log.prefix_ranks) == 1:
            res.rank = next(iter(log.prefix_ranks))
        elif not log.prefix_ranks:
            res.rank = log.file_rank
        self.hf.finish()
        self.litgpt.finish()
        self.compile.finish(self.titan)
        if log.evidence:
            fw = log.evidence.most_common(1)[0][0]
            if log.evidence["llamafactory"] and log.evidence["hf_trainer"]:
                fw = "llamafactory"
            res.framework = fw
            res.facts.insert(0, Fact("framework", fw, None, log.name))
        nccl = self.nccl.finish()
        if nccl is not None:
            res.nccl = nccl
        return res


def parse_text_log(path: Path, max_bytes: int | None = None) -> LogResult:
    """Parse a training log (and any NCCL_DEBUG=INFO lines in it) in one streamed pass; this is also the
    parser for files :func:`traceanalyze.discover.sniff` calls ``"nccl_debug"`` (``framework`` None, ``nccl`` set).

    Recognises torchtune ``Step N | k:v``, torchtitan ``step: .. loss: .. memory: ..GiB(..%) tps: ..``
    (with or without ``[titan]``/``[rankN]:`` prefixes), litgpt ``iter N step M: ...`` (old) and
    ``Epoch E | iter N step M | ...`` (current), nanoGPT ``iter N: loss X, time Yms, mfu Z%``, the HF
    Trainer banner and ``{'loss': ...}`` dicts, LLaMA-Factory ``Process rank: ..., world size: ...``, NCCL
    INFO lines, and torch.compile lines (``Recompiling function``, ``hit config.cache_size_limit``,
    inductor's ``FX codegen and compilation took Xs``, ``Compiling ... with torch.compile``). A LLaMA-Factory
    ``trainer_log.jsonl`` or HF ``trainer_state.json`` is dispatched to its own parser.

    ``compile_time_s``: the sum of inductor's "FX codegen and compilation took" seconds (per rank, worst
    rank); without those, for torchtitan logs with compile on, first-step time (from "Training starts at
    step" to the first step line) minus one steady-state step (from the last two step lines' timestamps).

    ``max_bytes`` bounds what the file may inflate to (default :data:`DEFAULT_MAX_BYTES`; docs/safety.md).

    Raises :class:`InputError` when the file cannot be read or is over the bound; odd content never raises.
    """
    path = Path(path)
    fh = open_binary(path)
    try:
        with fh:
            start = fh.read(SNIFF_BYTES)  # what discover read to call it a step-time JSON
    except (EOFError, zlib.error):
        start = b""  # truncated gzip: the line reader below keeps what it can and warns
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc})") from None
    lead = start.lstrip()
    name = path.name.lower().removesuffix(".gz")
    if lead[:1] in (b"{", b"[") and name.endswith(".json") and is_step_times_json(start):
        return parse_step_times_json(path, max_bytes)
    if lead[:1] == b"{":
        if name.endswith(".jsonl") or b'"current_steps"' in start.split(b"\n", 1)[0]:
            return parse_llamafactory_jsonl(path, max_bytes)
        if name.endswith(".json"):
            return parse_trainer_state(path, max_bytes)
    p = _TextLogParser(path)
    for lineno, line in iter_lines(path, p.log.result.warnings, max_bytes):
        p.feed(lineno, line)
    return p.finish()
