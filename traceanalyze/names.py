"""Name rules that two sibling stages share: :mod:`traceanalyze.discover` (what every file is) and
:mod:`traceanalyze.logs` (what a log says) both apply them, and neither may import the other.

- the rank in a file name (``rank3.json``, ``trace_rank-3``, ``[rank3]``: :func:`rank_from_name`), bounded by
  :data:`MAX_WORLD_SIZE`;
- the worker of a ``tensorboard_trace_handler`` file name (:func:`worker_name`);
- the key names of a user's step-time JSON (:data:`STEP_TIMES_KEY`, :func:`is_step_times_json`): discover calls
  such a file a training log, and the log parser picks its reader by the same rule;
- the name and key of capture's step-time sidecar (:data:`STEPS_SIDECAR_NAME`, :data:`UNPROFILED_KEY`):
  :mod:`traceanalyze.capture` writes it, discover calls it a ``steps`` sidecar, :mod:`traceanalyze.logs.steps`
  reads it.

A leaf: imports nothing of the project.
"""

from __future__ import annotations

import re
from pathlib import Path

from traceanalyze.limits import MAX_WORLD_SIZE, SNIFF_BYTES

# Sane bounds on what a header or a file name says (docs/safety.md: one implausible header field costs one warning):
# rank < world size <= 2^20 (no job has a million ranks; larger values are corrupt or hostile, and a loop or a
# set over them would exhaust memory).

_RANK_NAME = re.compile(r"(?:^|[^a-z])rank[-_:\s\[]*(\d+)(?P<after>[-_./]\d{1,2}[-_./]\d{1,2})?", re.IGNORECASE)
# tensorboard_trace_handler names each profiling window's file <worker>.<time in ms (or ns)>.pt.trace.json[.gz]
_WINDOW_NAME = re.compile(r"^(?P<worker>.+?)\.(?P<ts>\d{10,})\.pt\.trace\.json(?:\.gz)?$", re.IGNORECASE)

#: A step-time key of a step-time JSON, quoted and followed by its colon (``"step_time_ms":``): ``step_times``,
#: ``step_time_ms``, ``iter_time_s``, ``duration_ms``, ``time_ms``, ... (no suffix or ``_ms``: milliseconds;
#: ``_s``/``_sec``: seconds).
STEP_TIMES_KEY = re.compile(r'"(?P<k>step_?times?(?:_ms|_s|_sec)?|iter(?:ation)?_?times?(?:_ms|_s)?|'
                            r'(?:step_)?duration(?:_ms|_s)?|time_ms|time_s)"\s*:', re.IGNORECASE)

#: Capture's step-time sidecar, ``steps_rank{r}.json`` (``.gz`` accepted): steps timed without the profiler.
STEPS_SIDECAR_NAME = re.compile(r"steps_rank\d+\.json(?:\.gz)?", re.IGNORECASE)
#: Its list of the steps timed without the profiler, in ms (a key no step-time JSON uses: :data:`STEP_TIMES_KEY`).
UNPROFILED_KEY = "unprofiled_step_ms"


def rank_from_name(path: Path | str) -> int | None:
    """Rank from a file name such as ``rank3.json``, ``trace_rank-3``, ``[rank3]``; None when absent or not
    plausible: a date or timestamp (``rank_20240501``, ``rank_2024-05-01``, ``rank1700000000``), that is a number
    of 8 digits or more, at least :data:`MAX_WORLD_SIZE`, or followed by ``-MM-DD``."""
    m = _RANK_NAME.search(Path(path).name)
    if not m or m.group("after") or len(m.group(1)) > 7:
        return None
    r = int(m.group(1))
    return r if r < MAX_WORLD_SIZE else None


def worker_name(path: Path | str) -> str:
    """The worker part of a ``tensorboard_trace_handler`` file name: ``worker0.1621401187223.pt.trace.json.gz`` →
    ``worker0``. Files of one worker that differ only in the timestamp are successive profiling windows of one
    rank. A name without a timestamp is returned whole."""
    name = Path(path).name
    m = _WINDOW_NAME.match(name)
    return m.group("worker") if m else name


def is_step_times_json(head: bytes) -> bool:
    """Whether the first bytes of a JSON file look like a user's step-time file (a list of ``{"step": 3,
    "step_time_ms": 637.9}`` records, or an object holding such a list or a list of numbers under a step-time key):
    a :data:`STEP_TIMES_KEY` in the first :data:`SNIFF_BYTES`, and no ``traceEvents`` or ``log_history``. Never
    raises."""
    text = head[:SNIFF_BYTES].decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    return (text[:1] in ("{", "[") and '"traceEvents"' not in text and '"log_history"' not in text
            and STEP_TIMES_KEY.search(text) is not None)
