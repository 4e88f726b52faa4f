"""Parsers for the files that sit next to the traces and are not traces.

Training logs (torchtune, torchtitan, litgpt, nanoGPT, Hugging Face Trainer, LLaMA-Factory), NCCL_DEBUG=INFO
output, ``nvidia-smi topo -m`` output and training configs (torchtune / LLaMA-Factory / litgpt YAML,
torchtitan TOML, Hugging Face ``TrainingArguments`` JSON) are turned into small dataclasses: per-step
numbers (:class:`LogStep`), named facts about the run (:class:`Fact`), NCCL transports (:class:`NcclInfo`)
and the GPU/NIC link matrix (:class:`Topology`).

Modules: :mod:`.model` (the dataclasses), :mod:`.read` (the bounded readers), :mod:`.text` (text logs: one
dispatcher over the line families of :mod:`.trainers`, :mod:`.hf` and :mod:`.nccl`), :mod:`.hf` (also the
LLaMA-Factory, ``trainer_state.json`` and step-time JSON files), :mod:`.configs`, :mod:`.topology`, :mod:`.env`,
:mod:`.steps` (capture's ``steps_rank{r}.json``, and :func:`measured_unprofiled_step`: the run's step time without
the profiler, from capture or the log).
What a file is (``training_log``, ``nccl_debug``, ``topology``, ``config``, ``env``, ``steps``) is decided by
:func:`traceanalyze.discover.sniff`; what a link class carries is in :mod:`traceanalyze.hardware`.

The line formats and their regexes are documented in ``FORMATS.md`` §9 (shared with the project); the
regexes here extend those and are tested against the real excerpts under ``shared/logs``.

Rules: parsing never raises on odd content (unknown lines are ignored; a malformed structured file gives
no facts and, where the result has one, a warning); a file that cannot be read raises
:class:`~traceanalyze.errors.InputError`. Text is decoded as UTF-8 with ``errors="replace"``; ``\\r`` (tqdm
redraws), ANSI colour codes and tqdm progress bars are stripped. Logs are streamed line by line, so memory
is bounded by the parsed steps, not by the file.

Standard :class:`Fact` keys (exact names): ``framework``, ``per_device_batch``,
``gradient_accumulation_steps``, ``global_batch``, ``world_size``, ``num_examples``,
``total_optimization_steps``, ``trainable_params``, ``precision`` (one of ``fp32``, ``bf16``, ``fp16``,
``fp8``, ``tf32``), ``compile`` (``true``/``false``), ``learning_rate``, ``seq_len``, ``model_name``,
``nccl_version``, ``compile_time_s``, ``recompiles``. Extra keys, emitted only when stated:
``first_step_s`` (torchtitan: seconds from "Training starts" to the first step line), ``data_parallel_size``
(torchtitan mesh/config), ``n_gpu`` (HF ``_n_gpu`` / LLaMA-Factory ``n_gpu``: GPUs per *process*, 1 under
DDP, so not a world size), ``train_runtime_s`` (HF end-of-training summary), ``cpu_offload`` (``true``/``false``:
parameters or optimizer state offloaded to host memory, from a config), ``host_ram_bytes`` (the host's physical
memory, bytes: a log's ``MemTotal:`` or ``free -h`` line, capture's env file), ``num_params`` (the model's parameter
count a log states, e.g. torchtitan's ``N total parameters``; trainable-only counts are ``trainable_params``).

Out-of-memory deaths (:class:`OomEvent` in :attr:`LogResult.ooms`, :mod:`.oom`): the CUDA out-of-memory message of
every PyTorch form, torchrun's record of a rank killed by SIGKILL, the kernel's OOM-killer line and a bare
``Killed``.

Two plain formats users write themselves are read for their step times (framework ``console`` / ``step_times``):
console lines such as ``[rank0] step 3 loss 2.31 time 637.9ms`` (``step N``, then ``time``/``step_time``/``dt``/
``elapsed`` and a value in ms or s; a ``[rankN]`` prefix gives the rank), and a step-time JSON such as an HF
callback writes: a list of ``{"step": 3, "step_time_ms": 637.9}`` records, or an object holding such a list or a
list of numbers under a ``step_times_ms`` / ``step_times_s`` / ``step_times`` key
(:func:`traceanalyze.names.is_step_times_json`).
"""

from __future__ import annotations

import importlib

# Each name's module, imported on first use (PEP 562): a run without sidecars imports only what it calls
# (:mod:`.sidecars`), not the parsers (yaml, ~100 patterns compiled on import, ~25 ms of a one-rank report)
_MODULE_OF = {
    "parse_config": "configs",
    "core_sharing": "env", "parse_env": "env",
    "MAX_STEP_TIMES": "hf", "parse_llamafactory_jsonl": "hf", "parse_step_times_json": "hf",
    "parse_trainer_state": "hf",
    "Fact": "model", "LogResult": "model", "LogStep": "model", "NcclChannel": "model", "NcclInfo": "model",
    "OomEvent": "model", "TopoLink": "model", "Topology": "model", "normalize_precision": "model",
    "DEFAULT_MAX_BYTES": "read", "MAX_LINE_BYTES": "read", "MAX_WHOLE_FILE_BYTES": "read",
    "CaptureSteps": "steps", "measured_unprofiled_step": "steps", "parse_capture_steps": "steps",
    "parse_text_log": "text",
    "parse_topology": "topology",
}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CaptureSteps",
    "DEFAULT_MAX_BYTES",
    "MAX_LINE_BYTES",
    "MAX_STEP_TIMES",
    "MAX_WHOLE_FILE_BYTES",
    "Fact",
    "LogResult",
    "LogStep",
    "NcclChannel",
    "NcclInfo",
    "OomEvent",
    "TopoLink",
    "Topology",
    "core_sharing",
    "measured_unprofiled_step",
    "normalize_precision",
    "parse_capture_steps",
    "parse_config",
    "parse_env",
    "parse_llamafactory_jsonl",
    "parse_step_times_json",
    "parse_text_log",
    "parse_topology",
    "parse_trainer_state",
]
