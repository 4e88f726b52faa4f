"""Every default bound, in one place: what one input may cost, and the defaults that options start from.

Inputs are hostile (docs/safety.md): every size, count and number read from a file is bounded, and each bound
is named here once, with its unit and why it is that size. Rule thresholds (what makes a finding) live with
their rules in :mod:`traceanalyze.diagnose`; the report's display caps live in :mod:`traceanalyze.report`.
This module imports nothing, so every layer may read it.
"""

from __future__ import annotations

# --- what one file may cost ------------------------------------------------------------------------------
DEFAULT_MAX_DECOMPRESSED = 64 << 30  # bytes one trace, log or config may inflate to (--max-decompressed; gzip bombs)
MAX_WHOLE_FILE_BYTES = 64 << 20  # bytes of a file read whole (a config, an env file, trainer_state.json)
MAX_LINE_BYTES = 1 << 20  # bytes of one log line; the rest of a longer line is skipped and counted
MAX_EVENT_BYTES = 64 << 20  # bytes of one trace event: a larger one is a corrupt file, not an event
MAX_STEP_TIMES = 1_000_000  # step records read from one step-time JSON
MAX_CAPTURE_STEPS = 100_000  # step times read from one list of capture's steps_rank{r}.json (it writes a few)
SNIFF_BYTES = 64 << 10  # bytes of a file's head read to tell what it is

# --- numbers read from a trace ---------------------------------------------------------------------------
MAX_DUR_US = 86_400e6  # µs: an event longer than 1 day is a CUPTI timestamp fault (durations of years)
MAX_TS_US = 4e15  # µs: |ts| beyond year ~2096 in epoch µs is garbage (and would overflow int64 ns)
MAX_COLLECTIVE_ELEMENTS = 1 << 40  # elements of one collective message (4 TiB of fp32): more is a corrupt count
MAX_ALLOC_BYTES = 1 << 50  # bytes of one allocation or allocator total ([memory] events): 1 PiB is no device's
MAX_DEVICE_INDEX = 1 << 16  # a [memory] event's Device Id / Device Type beyond this is garbage (set to null)
MAX_WORLD_SIZE = 1 << 20  # ranks: a distributedInfo.world_size above this is implausible (ignored, one warning)

# --- numbers read from a log -----------------------------------------------------------------------------
MAX_MEMORY_BYTES = 1 << 60  # bytes: a GPU or host memory figure above 1 EiB in an OOM message is garbage (dropped)
MAX_PARAMS = 1e14  # parameters: a model's parameter count above 100 T in a log is garbage (dropped)
MAX_OOM_EVENTS = 10_000  # out-of-memory and kill records kept from one log, and from all of a run's (a crash loop)
MAX_GRAD_ACCUM = 1 << 16  # micro-batches per optimizer step: more than 65,536 is no recipe's (dropped, one warning)
MAX_BATCH = 1 << 32  # samples in a per-device or global batch: above 4 G is garbage (dropped, one warning)
MAX_HOST_NAME = 64  # characters of a host name read from a torchrun failure block (longer: cut)

# --- defaults of options -----------------------------------------------------------------------------------
DEFAULT_MAX_EVENTS = 2_000_000  # events in a merged Perfetto trace (export --max-events)
REGRESSION_THRESHOLD = 1.2  # batch --threshold: step time above this × the group's median of earlier runs


def whole_in_bounds(v: object, bound: float) -> int | None:
    """``v`` as a whole number from 1 to ``bound``, else None (text, bool, nan, inf, 0, negative, fractional, or
    above ``bound``): a count read from a log or config (a gradient accumulation, a batch, a world size)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if v != v or v in (float("inf"), float("-inf")) or v < 1 or v > bound or v != int(v):
        return None
    return int(v)
