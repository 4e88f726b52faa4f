"""Training configs: torchtune / LLaMA-Factory / litgpt YAML, torchtitan TOML and Hugging Face
``TrainingArguments`` JSON, read as :class:`~traceanalyze.logs.model.Fact` rows (:func:`parse_config`).

:func:`config_facts` maps a loaded config to facts; torchtune's resolved config printed in a log is read by it too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from traceanalyze.errors import InputError
from traceanalyze.logs.model import Fact, normalize_precision, number_text, to_int, to_number
from traceanalyze.logs.read import read_text

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - exercised on 3.10 only
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]


def _get(data: dict[str, Any], dotted: str) -> Any:
    cur: Any = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _line_of(lines: list[str], dotted: str) -> int | None:
    """1-based line where a (dotted) key is written: each part is searched after the previous one, as a
    YAML ``key:``, TOML ``key =`` / ``[section]``, or JSON ``"key":``."""
    start = 0
    found = None
    for part in dotted.split("."):
        rx = re.compile(
            rf"^\s*(?:\[{re.escape(part)}\]\s*$|{re.escape(part)}\s*[:=]|\"{re.escape(part)}\"\s*:)"
            rf"|[{{,]\s*\"{re.escape(part)}\"\s*:"
        )
        for i in range(start, len(lines)):
            if rx.search(lines[i]):
                found = i
                start = i + 1
                break
        else:
            return None
    return None if found is None else found + 1


def _truthy(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return v.strip().lower() in ("true", "yes", "1")
    if isinstance(v, int):
        return bool(v)
    return None


class _ConfigFacts:
    """The facts of one loaded config, each key stated once (the first that is set), with the line it is on."""

    def __init__(self, data: dict[str, Any], lines: list[str], name: str, line_offset: int) -> None:
        self.data = data
        self.lines = lines
        self.name = name
        self.line_offset = line_offset
        self.facts: list[Fact] = []
        self.seen: set[str] = set()

    def get(self, dotted: str) -> Any:
        return _get(self.data, dotted)

    def add(self, key: str, value: Any, dotted: str | None) -> None:
        """State ``key`` (unless stated already, or ``value`` is None), sourced at the line of ``dotted``."""
        if key in self.seen or value is None:
            return
        num = None
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            num = float(value)
            text = number_text(num)
        else:
            text = str(value)
        ln = _line_of(self.lines, dotted) if dotted else None
        self.seen.add(key)
        self.facts.append(Fact(key, text, num, f"{self.name}:{ln + self.line_offset}" if ln else self.name))

    def first(self, *keys: str) -> tuple[Any, str | None]:
        """The first of ``keys`` that is set: (value, key), or (None, None)."""
        for k in keys:
            v = self.get(k)
            if v is not None:
                return v, k
        return None, None

    def pos_int(self, *keys: str) -> tuple[int | None, str | None]:
        """The first of ``keys`` that holds a positive integer: (value, key), or (None, None)."""
        for k in keys:
            v = self.get(k)
            if isinstance(v, bool):
                continue
            iv = to_int(v)
            if iv is not None and iv > 0:
                return iv, k
        return None, None


def _precision(cfg: _ConfigFacts) -> tuple[str | None, str | None]:
    """(precision, key): float8 converters, else a dtype key, else ``pure_bf16``, else the HF bf16/fp16/tf32 flags."""
    conv = cfg.get("model.converters")
    if (isinstance(conv, list) and any("float8" in str(c) for c in conv)) or _truthy(
        cfg.get("float8.enable_float8_linear")
    ):
        return "fp8", "model.converters" if conv else "float8.enable_float8_linear"
    for key in ("dtype", "training.mixed_precision_param", "precision", "mixed_precision"):
        val = cfg.get(key)
        if normalize_precision(val):
            return normalize_precision(val), key
    if _truthy(cfg.get("pure_bf16")):
        return "bf16", "pure_bf16"
    if any(isinstance(cfg.get(k), bool) for k in ("bf16", "fp16")):
        if cfg.get("bf16") is True:
            return "bf16", "bf16"
        if cfg.get("fp16") is True:
            return "fp16", "fp16"
        # both stated false: the Trainer runs fp32 (TF32 matmuls when tf32 is on)
        return ("tf32", "tf32") if cfg.get("tf32") is True else ("fp32", "bf16")
    return None, None


def _compile(cfg: _ConfigFacts) -> tuple[bool | None, str | None]:
    """(compile on, key): ``compile`` (bool, or a table with ``enable``/``components``), ``training.compile``,
    ``torch_compile``."""
    comp, kc = None, None
    c = cfg.data.get("compile")
    if isinstance(c, dict):
        if "enable" in c:
            comp, kc = _truthy(c.get("enable")), "compile.enable"
        elif "components" in c:
            comp, kc = bool(c.get("components")), "compile.components"
    elif _truthy(c) is not None:
        comp, kc = _truthy(c), "compile"
    if comp is None:
        for key in ("training.compile", "torch_compile"):
            if _truthy(cfg.get(key)) is not None:
                return _truthy(cfg.get(key)), key
    return comp, kc


def _model_name(cfg: _ConfigFacts) -> tuple[Any, str | None]:
    """(model name, key): ``model_name_or_path`` | ``model_name`` | ``model.name`` (+ ``model.flavor``) | the last
    part of ``model._component_`` | the last two folders of ``checkpoint_dir``."""
    mname, km = cfg.first("model_name_or_path", "model_name", "model.name")
    if km == "model.name" and isinstance(cfg.get("model.flavor"), str):
        mname = f"{mname} {cfg.get('model.flavor')}"
    if mname is None:
        comp_name = cfg.get("model._component_")
        if isinstance(comp_name, str):
            mname, km = comp_name.rsplit(".", 1)[-1], "model._component_"
    if mname is None:
        ckpt = cfg.get("checkpoint_dir")
        if isinstance(ckpt, str) and ckpt.strip("/"):
            mname, km = "/".join(ckpt.strip("/").split("/")[-2:]), "checkpoint_dir"
    return mname, km


_OFFLOAD_KEYS = ("fsdp_cpu_offload", "cpu_offload", "fsdp_offload_params", "fsdp_config.fsdp_offload_params",
                 "fsdp_config.offload_params", "parallelism.fsdp_cpu_offload", "training.enable_cpu_offload")
_OFFLOAD_DEVICE_KEYS = ("zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device")


def _cpu_offload(cfg: _ConfigFacts) -> tuple[bool | None, str | None]:
    """(parameters or optimizer state offloaded to the host's memory?, key): a boolean of :data:`_OFFLOAD_KEYS`, a
    DeepSpeed ``offload_*.device`` of ``cpu``, or HF ``fsdp`` options holding ``offload``."""
    for key in _OFFLOAD_KEYS:
        if _truthy(cfg.get(key)) is not None:
            return _truthy(cfg.get(key)), key
    for key in _OFFLOAD_DEVICE_KEYS:
        dev = cfg.get(key)
        if isinstance(dev, str):
            return dev.strip().lower() == "cpu", key
    fsdp = cfg.get("fsdp")
    if isinstance(fsdp, str) and "offload" in fsdp:
        return True, "fsdp"
    return None, None


def _job_size(cfg: _ConfigFacts) -> tuple[int | None, str | None, int | None]:
    """State world_size, n_gpu, data_parallel_size and total_optimization_steps; return (world size, its key,
    data-parallel size)."""
    ws, kw = cfg.pos_int("world_size")
    devices = cfg.get("devices")
    if ws is None and to_int(devices) is not None and not isinstance(devices, bool) and to_int(devices) > 0:
        nodes = to_int(cfg.get("num_nodes")) or 1
        ws, kw = to_int(devices) * nodes, "devices"
    cfg.add("world_size", ws, kw)
    ngpu, k = cfg.pos_int("_n_gpu")
    cfg.add("n_gpu", ngpu, k)
    rep, _ = cfg.pos_int("parallelism.data_parallel_replicate_degree")
    shard = to_int(cfg.get("parallelism.data_parallel_shard_degree"))
    dp, kdp = None, None
    if shard is not None and shard > 0:
        dp, kdp = shard * (rep or 1), "parallelism.data_parallel_shard_degree"
    else:
        dp, kdp = cfg.pos_int("training.data_parallel_degree")
    cfg.add("data_parallel_size", dp, kdp)
    steps, k = cfg.pos_int("max_steps", "training.steps")
    cfg.add("total_optimization_steps", steps, k)
    return ws, kw, dp


def config_facts(data: dict[str, Any], lines: list[str], name: str, line_offset: int = 0) -> list[Fact]:
    """Map a loaded config (torchtune / LLaMA-Factory / litgpt YAML, torchtitan TOML, HF JSON) to facts, sourced
    ``<name>:<line>`` (the line in ``lines`` plus ``line_offset``); the keys read are listed in :func:`parse_config`.
    """
    cfg = _ConfigFacts(data, lines, name, line_offset)
    pdb, k = cfg.pos_int("per_device_train_batch_size", "training.local_batch_size", "training.batch_size",
                         "train.micro_batch_size", "batch_size", "micro_batch_size")  # fmt: skip
    cfg.add("per_device_batch", pdb, k)
    gas_keys = ("gradient_accumulation_steps", "training.gradient_accumulation_steps")
    gas, k = cfg.pos_int(*gas_keys)
    if gas is None and (bad := cfg.first(*gas_keys))[0] is not None and not isinstance(bad[0], (dict, list)):
        # stated but not a positive whole number (0, -4, nan): kept as text, for check_batch_facts to warn about
        cfg.add("gradient_accumulation_steps", str(bad[0])[:40], bad[1])
    cfg.add("gradient_accumulation_steps", gas, k)
    gb, kgb = cfg.pos_int("training.global_batch_size", "train.global_batch_size", "global_batch_size")
    cfg.add("global_batch", gb, kgb)
    v, k = cfg.pos_int("max_seq_len", "tokenizer.max_seq_len", "cutoff_len", "training.seq_len",
                       "train.max_seq_length", "max_seq_length", "seq_len", "block_size")  # fmt: skip
    cfg.add("seq_len", v, k)
    lr, k = cfg.first("learning_rate", "optimizer.lr", "optimizer.init_args.lr", "train.learning_rate", "lr")
    cfg.add("learning_rate", to_number(lr) if not isinstance(lr, bool) else None, k)
    cfg.add("precision", *_precision(cfg))
    cfg.add("compile", *_compile(cfg))
    cfg.add("cpu_offload", *_cpu_offload(cfg))
    mname, km = _model_name(cfg)
    if isinstance(mname, str):
        cfg.add("model_name", mname, km)
    ws, kw, dp = _job_size(cfg)
    # derived: GAS = global / (per-device × data-parallel size) when integral (torchtitan, litgpt)
    if gas is None and gb and pdb:
        dps = dp or (ws if kw == "devices" else None)
        if dps and gb % (pdb * dps) == 0:
            cfg.add("gradient_accumulation_steps", gb // (pdb * dps), kgb)
    return cfg.facts


def parse_config(path: Path, max_bytes: int | None = None) -> list[Fact]:
    """Facts from a training config file, by suffix: ``.yaml``/``.yml`` (torchtune recipe, LLaMA-Factory,
    litgpt ``hyperparameters.yaml``), ``.toml`` (torchtitan job config), ``.json`` (HF ``TrainingArguments``).

    Keys read (first present wins): per_device_batch <- ``per_device_train_batch_size`` |
    ``training.local_batch_size`` | ``training.batch_size`` | ``train.micro_batch_size`` | ``batch_size``;
    gradient_accumulation_steps <- ``gradient_accumulation_steps`` (else derived as global /
    (per-device × data-parallel size) when integral); global_batch <- ``training.global_batch_size`` (> 0) |
    ``train.global_batch_size``; seq_len <- ``max_seq_len`` | ``tokenizer.max_seq_len`` | ``cutoff_len`` |
    ``training.seq_len`` | ``train.max_seq_length``; learning_rate <- ``learning_rate`` | ``optimizer.lr``;
    precision <- float8 converters (fp8) | ``dtype`` | ``training.mixed_precision_param`` | ``precision`` |
    ``pure_bf16`` | HF ``bf16``/``fp16``/``tf32`` flags (both flags stated false -> fp32, or tf32);
    compile <- ``compile`` (bool) | ``compile.enable`` | ``training.compile`` | ``torch_compile``;
    cpu_offload (``true``/``false``) <- ``fsdp_cpu_offload`` | ``cpu_offload`` | accelerate ``fsdp_offload_params`` |
    DeepSpeed ``zero_optimization.offload_optimizer.device`` / ``offload_param.device`` (``cpu``) | HF ``fsdp``
    options holding ``offload``;
    model_name <- ``model_name_or_path`` | ``model.name`` + ``model.flavor`` | ``model._component_``;
    world_size <- ``world_size`` | litgpt ``devices`` × ``num_nodes``; n_gpu <- ``_n_gpu``;
    data_parallel_size <- torchtitan ``parallelism.data_parallel_shard_degree`` (> 0) ×
    ``data_parallel_replicate_degree``; total_optimization_steps <- ``max_steps`` (> 0) | ``training.steps``.

    Content that does not parse, or is not a mapping, gives ``[]``. Raises :class:`InputError` when the
    file cannot be read, or for a TOML file when neither ``tomllib`` (Python 3.11+) nor ``tomli`` is
    installed.
    """
    path = Path(path)
    text = read_text(path, max_bytes)  # bounded: docs/safety.md
    suffix = Path(path.name.lower().removesuffix(".gz")).suffix
    data: Any
    try:
        if suffix == ".toml":
            if tomllib is None:
                raise InputError(path, "TOML configs need Python 3.11+ (tomllib) or the tomli package")
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, RecursionError):  # odd content: no facts, never a crash
        return []
    if not isinstance(data, dict):
        return []
    return config_facts(data, text.splitlines(), path.name)
