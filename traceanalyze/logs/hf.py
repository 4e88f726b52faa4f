"""Hugging Face Trainer and LLaMA-Factory logs, and the step-time JSON a user's callback writes.

- Text lines (line families of :mod:`.text`): the HF Trainer banner (``Num examples = ..``, ``Total train batch
  size = ..``, ...), its ``{'loss': ...}`` dicts and ``{'train_runtime': ...}`` summary
  (:class:`HfTrainerLines`), and LLaMA-Factory's ``Process rank: ..., world size: ...`` and ``compute dtype``
  lines (:class:`LlamaFactoryLines`).
- Files: LLaMA-Factory's ``trainer_log.jsonl`` (:func:`parse_llamafactory_jsonl`), HF ``trainer_state.json``
  (:func:`parse_trainer_state`), and a user's step-time JSON (:func:`parse_step_times_json`): a list of
  ``{"step": 3, "step_time_ms": 637.9}`` records, or an object holding such a list or a list of numbers under a
  ``step_times_ms`` / ``step_times_s`` / ``step_times`` key (:func:`traceanalyze.names.is_step_times_json`).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from traceanalyze.limits import MAX_STEP_TIMES
from traceanalyze.logs.model import Fact, LogResult, LogStep, normalize_precision, number_text, to_int, to_number
from traceanalyze.logs.read import iter_lines, read_text
from traceanalyze.logs.state import LogState
from traceanalyze.names import STEP_TIMES_KEY, rank_from_name

_HF_DICT = re.compile(r"\{'loss': [^{}]*\}")
_HF_SUMMARY = re.compile(r"\{'train_runtime': [^{}]*\}")
_HF_NUM_PAIR = re.compile(r"'(\w+)': (?:tensor\(|np\.float\d+\()?'?([-+]?(?:\d[\d.]*(?:[eE][-+]?\d+)?|nan|inf))'?")
_HF_BANNER = (
    ("num_examples", re.compile(r"Num examples = ([\d,]+)")),
    ("per_device_batch", re.compile(r"batch size per device = ([\d,]+)", re.I)),
    ("global_batch", re.compile(r"Total (?:train )?batch size[^=]*= ([\d,]+)", re.I)),
    ("gradient_accumulation_steps", re.compile(r"Gradient Accumulation steps = ([\d,]+)", re.I)),
    ("total_optimization_steps", re.compile(r"Total (?:optimization )?steps = ([\d,]+)")),
    ("trainable_params", re.compile(r"Number of trainable parameters(?: =|:) ([\d,]+)")),
    ("world_size", re.compile(r"(?:Num GPUs used|Data Parallel GPUs) = (\d+)")),
)
_LF_PROCESS = re.compile(
    r"Process rank: (\d+), (?:world size: (?P<ws>\d+), )?device: [^,\s]+,?(?: n_gpu: (?P<ngpu>\d+))?"
)
_COMPUTE_DTYPE = re.compile(r"compute dtype: (?:torch\.)?(\w+)")


# --------------------------------------------------------------------------------------------------------
# Text lines
# --------------------------------------------------------------------------------------------------------


def _literal_dict(text: str) -> dict[str, Any]:
    """A printed Python dict; when it does not evaluate, its plain numeric pairs."""
    try:
        d = ast.literal_eval(text)
        if isinstance(d, dict):
            return d
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    # e.g. "'grad_norm': tensor(0.5)" or np.float64(...): keep the plain numeric pairs
    return {k: to_number(v) for k, v in _HF_NUM_PAIR.findall(text)}


class HfTrainerLines:
    """The HF Trainer's ``{'loss': ...}`` dicts (step = the dict's 1-based index among its rank's), its
    ``{'train_runtime': ...}`` summary, and the banner it prints before training (not the evaluation banner); the
    world size derived from the banner's batch sizes (:meth:`finish`)."""

    def __init__(self, log: LogState) -> None:
        self.log = log
        self.n_dicts: dict[int | None, int] = {}  # per rank: a log of several ranks numbers each one's steps
        self.in_eval_banner = False

    @staticmethod
    def wants_dict(s: str) -> bool:
        return "{'" in s

    def dict_line(self, lineno: int, s: str, rank: int | None) -> bool:
        """The loss dicts and training summary of one line; never takes the line from the families after it."""
        for text in _HF_DICT.findall(s):
            d = _literal_dict(text)
            if "loss" not in d:
                continue
            self.n_dicts[rank] = self.n_dicts.get(rank, 0) + 1
            mem_mb = to_number(d.get("step_peak_memory_reserved_MB"))
            self.log.result.steps.append(
                LogStep(
                    rank=rank,
                    step=self.n_dicts[rank],
                    loss=to_number(d.get("loss")),
                    lr=to_number(d.get("learning_rate")),
                    grad_norm=to_number(d.get("grad_norm")),
                    tokens_per_s=to_number(d.get("step_tokens_per_second")),
                    memory_gib=mem_mb / 1024 if mem_mb is not None else None,
                    epoch=to_number(d.get("epoch")),
                )
            )
            self.log.evidence["hf_trainer"] += 1
        for text in _HF_SUMMARY.findall(s):
            d = _literal_dict(text)
            v = to_number(d.get("train_runtime"))
            if v is not None:
                self.log.fact("train_runtime_s", v, lineno)
                self.log.evidence["hf_trainer"] += 1
        return False

    @staticmethod
    def wants_banner(s: str) -> bool:
        return " = " in s or "*****" in s or "trainable parameters" in s

    def banner_line(self, lineno: int, s: str, rank: int | None) -> bool:
        """One line of the training banner; never takes the line from the families after it."""
        if "Running Evaluation" in s or "Running Prediction" in s:
            self.in_eval_banner = True
            return False
        if "Running training" in s:
            self.in_eval_banner = False
        if self.in_eval_banner:
            return False
        for key, rx in _HF_BANNER:
            m = rx.search(s)
            if m:
                v = to_int(m.group(1))
                if v is not None:
                    self.log.fact(key, v, lineno)
                    self.log.evidence["hf_trainer"] += 1
        return False

    def finish(self) -> None:
        """HF banner: world_size = global_batch / (per_device_batch × GAS) when integral (FORMATS §9)."""
        log = self.log
        if log.has_fact("world_size"):
            return
        g = log.result.fact("global_batch")
        p = log.result.fact("per_device_batch")
        a = log.result.fact("gradient_accumulation_steps")
        if g and p and a and g.num and p.num and a.num:
            denom = p.num * a.num
            if g.num % denom == 0:
                log.add_fact(Fact("world_size", number_text(g.num // denom), float(g.num // denom), g.source))


class LlamaFactoryLines:
    """LLaMA-Factory: lines naming ``llamafactory``, ``Process rank: R, world size: W, device: .., n_gpu: N`` and
    ``compute dtype: ..``."""

    def __init__(self, log: LogState) -> None:
        self.log = log

    @staticmethod
    def wants(s: str) -> bool:
        return "llamafactory" in s or "Process rank:" in s

    def line(self, lineno: int, s: str, rank: int | None) -> bool:
        """One LLaMA-Factory line; never takes the line from the families after it."""
        if "llamafactory" in s:
            self.log.evidence["llamafactory"] += 1
        m = _LF_PROCESS.search(s)
        if m:
            if m.group("ws"):
                self.log.fact("world_size", int(m.group("ws")), lineno)
            if m.group("ngpu"):
                self.log.fact("n_gpu", int(m.group("ngpu")), lineno)
        md = _COMPUTE_DTYPE.search(s)
        if md and normalize_precision(md.group(1)):
            self.log.fact("precision", normalize_precision(md.group(1)), lineno)
        return False


# --------------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------------


def _hms_seconds(text: Any) -> float | None:
    """Seconds from ``"5:13:22"``, ``"1 day, 2:03:04"`` or a number; None when unreadable."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"\s*(?:(\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)\s*", text)
    if not m:
        return to_number(text)
    days = int(m.group(1) or 0)
    return days * 86400 + int(m.group(2)) * 3600 + int(m.group(3)) * 60 + float(m.group(4))


def parse_llamafactory_jsonl(path: Path, max_bytes: int | None = None) -> LogResult:
    """Parse LLaMA-Factory's ``trainer_log.jsonl`` (one JSON object per logging step).

    Keys used: ``current_steps`` -> step, ``total_steps`` -> fact ``total_optimization_steps``, ``loss``,
    ``learning_rate`` -> lr, ``epoch``, ``elapsed_time`` (``"H:MM:SS"``) -> ``step_time_ms`` =
    Δelapsed / Δsteps since the previous entry (the first entry: elapsed / current_steps).
    Lines that are not JSON objects are skipped with one warning. Raises :class:`InputError` when the file
    cannot be read.
    """
    path = Path(path)
    res = LogResult(path=str(path), framework="llamafactory", rank=rank_from_name(path))
    res.facts.append(Fact("framework", "llamafactory", None, path.name))
    prev: tuple[int, float] | None = None
    bad = 0
    total_seen = False
    for lineno, line in iter_lines(path, res.warnings, max_bytes):
        try:
            d = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(d, dict) or to_int(d.get("current_steps")) is None:
            bad += 1
            continue
        step = to_int(d["current_steps"])
        elapsed = _hms_seconds(d.get("elapsed_time"))
        st_ms = None
        if elapsed is not None:
            if prev is None and step > 0:
                st_ms = elapsed / step * 1000
            elif prev is not None and step > prev[0]:
                st_ms = (elapsed - prev[1]) / (step - prev[0]) * 1000
            prev = (step, elapsed)
        res.steps.append(
            LogStep(
                rank=res.rank,
                step=step,
                loss=to_number(d.get("loss")),
                lr=to_number(d.get("learning_rate")),
                epoch=to_number(d.get("epoch")),
                step_time_ms=st_ms,
            )
        )
        total = to_int(d.get("total_steps"))
        if total is not None and not total_seen:
            total_seen = True
            res.facts.append(Fact("total_optimization_steps", str(total), float(total), f"{path.name}:{lineno}"))
    if bad:
        res.warnings.append(f"{path.name}: {bad} line(s) are not trainer_log JSON objects; skipped")
    return res


def parse_trainer_state(path: Path, max_bytes: int | None = None) -> LogResult:
    """HF ``trainer_state.json``: ``log_history`` entries with ``loss`` become steps (``step`` as logged);
    ``train_batch_size`` -> per_device_batch, ``max_steps`` -> total_optimization_steps."""
    res = LogResult(path=str(path), framework="hf_trainer", rank=rank_from_name(path))
    try:
        data = json.loads(read_text(path, max_bytes))
    except (ValueError, RecursionError) as exc:
        res.warnings.append(f"{path.name}: not JSON ({exc})")
        res.framework = None
        return res
    if not isinstance(data, dict) or not isinstance(data.get("log_history"), list):
        res.warnings.append(f"{path.name}: no log_history list")
        res.framework = None
        return res
    res.facts.append(Fact("framework", "hf_trainer", None, path.name))
    for key, fkey in (("train_batch_size", "per_device_batch"), ("max_steps", "total_optimization_steps")):
        v = to_int(data.get(key))
        if v is not None and v > 0:
            res.facts.append(Fact(fkey, str(v), float(v), path.name))
    for e in data["log_history"]:
        if isinstance(e, dict) and "loss" in e and to_int(e.get("step")) is not None:
            res.steps.append(
                LogStep(
                    rank=res.rank,
                    step=to_int(e["step"]),
                    loss=to_number(e.get("loss")),
                    lr=to_number(e.get("learning_rate")),
                    grad_norm=to_number(e.get("grad_norm")),
                    epoch=to_number(e.get("epoch")),
                )
            )
        elif isinstance(e, dict) and to_number(e.get("train_runtime")) is not None:
            v = to_number(e["train_runtime"])
            res.facts.append(Fact("train_runtime_s", number_text(v), v, path.name))
    return res


def _unit_ms(key: str) -> float:
    """Milliseconds per unit of a step-time key: ``_s``/``_sec`` seconds, otherwise (``_ms`` or none) ms."""
    k = key.lower()
    return 1000.0 if k.endswith(("_s", "_sec")) or k in ("time_s",) else 1.0


def parse_step_times_json(path: Path, max_bytes: int | None = None) -> LogResult:
    """A user's step-time JSON (module docstring) as :class:`LogStep` rows with ``step_time_ms``; framework
    ``step_times``. A record needs a number under a step-time key; ``step`` defaults to its position. At most
    :data:`MAX_STEP_TIMES` records, and at most ``max_bytes`` (``--max-decompressed``) read. Raises
    :class:`InputError` when the file cannot be read or is over that bound."""
    path = Path(path)
    res = LogResult(path=str(path), framework="step_times", rank=rank_from_name(path))
    try:
        data = json.loads(read_text(path, max_bytes))
    except ValueError as exc:
        res.warnings.append(f"{path.name}: not JSON ({exc})")
        return res
    rank = res.rank
    if isinstance(data, dict):
        r = to_int(data.get("rank"))
        rank = r if r is not None else rank
        lists = [(k, v) for k, v in data.items() if isinstance(v, list) and STEP_TIMES_KEY.fullmatch(f'"{k}":')]
        recs = next((v for k, v in data.items() if isinstance(v, list) and v and isinstance(v[0], dict)), None)
        if lists:
            key, vals = lists[0]
            first = to_int(data.get("first_step")) or 0
            data = [{"step": first + i, key: v} for i, v in enumerate(vals)]
        elif recs is not None:
            data = recs
    if not isinstance(data, list):
        res.warnings.append(f"{path.name}: no list of step times")
        return res
    for i, e in enumerate(data[:MAX_STEP_TIMES]):
        if not isinstance(e, dict):
            continue
        key = next((k for k in e if STEP_TIMES_KEY.fullmatch(f'"{k}":') and to_number(e[k]) is not None), None)
        if key is None:
            continue
        step = to_int(e.get("step", e.get("global_step", e.get("iteration", i))))
        ms = to_number(e[key]) * _unit_ms(key)
        if step is None or not ms == ms or ms < 0:
            continue
        res.steps.append(LogStep(rank=to_int(e.get("rank")) if to_int(e.get("rank")) is not None else rank, step=step,
                                 loss=to_number(e.get("loss")), step_time_ms=ms))
    if res.steps:
        res.facts.append(Fact("framework", "step_times", None, path.name))
    else:
        res.warnings.append(f"{path.name}: no step-time records")
    return res
