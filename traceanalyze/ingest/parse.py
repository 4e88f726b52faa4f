"""Ingest: stream one Kineto trace file into columnar tables (Arrow), one pass, memory bounded by a chunk.

A Kineto trace is one JSON object whose ``traceEvents`` array holds every event (Chrome trace format; a bare
top-level array is accepted too). Files reach many GB, so the file is never decoded whole: a structural
scanner (NumPy, over blocks of decompressed bytes) finds where each top-level event ends, and every run of
complete events is decoded by ``msgspec`` into typed structs that keep only the fields the analyses need.
A file cut off mid-write (a killed job) yields every complete event before the cut and is marked partial.

:func:`parse_trace` is a pure function from one file to Arrow tables (in memory, or as Arrow IPC stream files)
plus a :class:`TraceFile` summary, so ranks can be parsed in parallel processes (or on any engine) and loaded into
DuckDB by :mod:`traceanalyze.ingest.load`. The tables' columns are the store's (:data:`TABLES`).

Timestamps become integer nanoseconds on the trace's own clock: ``ts_ns = round(ts_us * 1000) + base``, where
``base`` is ``baseTimeNanoseconds`` for new-schema traces (relative ``ts``) and 0 for old ones (absolute epoch
µs). Durations become ``dur_ns``.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Union

import msgspec
import numpy as np
import pyarrow as pa

from traceanalyze import store
from traceanalyze.errors import InputError
from traceanalyze.ingest import compute as pc
from traceanalyze.limits import (
    DEFAULT_MAX_DECOMPRESSED,
    MAX_ALLOC_BYTES,
    MAX_DEVICE_INDEX,
    MAX_DUR_US,
    MAX_EVENT_BYTES,
    MAX_TS_US,
)
from traceanalyze.safety import redact as _redact

try:  # ISA-L inflates gzip 2.4x faster than zlib (0.018 s against 0.044 s for a 47 MB trace)
    from isal import isal_zlib as _inflate
except ImportError:  # a platform without its wheel
    _inflate = zlib

BLOCK_BYTES = 1 << 19  # decompressed bytes per block: small blocks stay in cache and bound the decoded objects
SPAN_KEY = "traceanalyze_profiler_span_us"  # header key: µs of the trace's "Trace" event (the recording's span)

# Kineto category -> the table it goes to. Old (2021, PyTorch 1.8/1.9) traces use capitalised names: Kernel,
# Memcpy, Memset, Runtime, Operator (ProfilerStep#N is an Operator / cpu_op there) and DataLoader.
GPU_CATS = {
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy", "Memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset", "Memset": "gpu_memset",
    "gpu_user_annotation": "gpu_user_annotation",
}
CPU_CATS = {
    "cpu_op": "cpu_op", "Operator": "cpu_op",
    "DataLoader": "cpu_op",  # 2021 schema: enumerate(DataLoader)#...__next__ had a category of its own
    "user_annotation": "user_annotation",
    "cuda_runtime": "cuda_runtime", "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "python_function": None,  # Python stacks: large and not used by any analysis
}
# GPU-side waits and syncs (on by default since kineto PR #1247 only for some builds): their own table, cuda_syncs
SYNC_CATS = {"cuda_sync": "cuda_sync"}


# ---------------------------------------------------------------------------------------------------------
# Typed decode: only the fields the analyses use. Unknown keys are skipped by msgspec without building them.

class _Args(msgspec.Struct, gc=False):
    """An X or M event's args. The fields are in Kineto's order of the keys (kernels: External id, device,
    stream, correlation; memcpys: ... bytes; ops: Input Dims, Input type): msgspec looks a key up from the field
    after the last one found, so each of these is found at the first compare (a kernel's lookups were ~45
    compares more). The four fields that tell a collective (:meth:`_Columns._comm_table`) sit together, so that
    its test of every event reads one cache line of the struct."""

    external_id: Any = msgspec.field(name="External id", default=None)
    device: Any = None
    stream: Any = None
    correlation: Any = None
    nbytes: Any = msgspec.field(name="bytes", default=None)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=None)
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=None)
    collective: Any = msgspec.field(name="Collective name", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    in_size: Any = msgspec.field(name="In msg size", default=None)
    external_id_old: Any = msgspec.field(name="external id", default=None)
    kernel_backend: Any = None
    wait_on_stream: Any = None  # cuda_sync "Stream Wait Event"
    wait_on_corr: Any = msgspec.field(name="wait_on_cuda_event_record_corr_id", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    out_size: Any = msgspec.field(name="Out msg size", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    comm_dtype: Any = msgspec.field(name="dtype", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: msgspec.Raw = msgspec.field(name="Process Group Ranks", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)
    comms_id: Any = msgspec.field(name="Comms Id", default=None)
    name: Any = None  # metadata events: thread / process names


class _Fields(msgspec.Struct, gc=False):
    """The event fields the analyses read (besides ``ph``)."""

    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


class _Event(_Fields, gc=False):
    """One event of any phase, for the lenient one-by-one decoder."""

    ph: Any = None

    def __post_init__(self) -> None:
        _MARKS[0] += 1  # any phase may be M here (a rare path: counting them all costs nothing)


_MARKS = [0]  # metadata (M) events decoded so far in this process: a run without any is never searched for them


class _Tagged(_Fields, gc=False, tag_field="ph"):
    """Events decoded by their phase: complete (X) and metadata (M) events keep their fields; every other
    phase (flows, instants, counters: about 40 % of a trace's events) becomes an empty object, so msgspec
    parses it without building anything the analyses never read."""


class _XEvent(_Tagged, tag="X"):
    ph: ClassVar[str] = "X"


class _MEvent(_Tagged, tag="M"):
    ph: ClassVar[str] = "M"

    def __post_init__(self) -> None:
        _MARKS[0] += 1


class _MemArgs(msgspec.Struct, gc=False):
    """The args of an allocator ``[memory]`` instant (``profile_memory=True``); bytes, on one device."""

    total_allocated: Any = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Any = msgspec.field(name="Total Reserved", default=None)
    nbytes: Any = msgspec.field(name="Bytes", default=None)
    device_type: Any = msgspec.field(name="Device Type", default=None)
    device_id: Any = msgspec.field(name="Device Id", default=None)
    addr: Any = msgspec.field(name="Addr", default=None)


_INSTANTS = [0]  # instant events decoded so far in this process: a run without any is never searched for them


class _IEvent(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    """An instant event (``ph: "i"``). Only the allocator's ``[memory]`` ones are kept; a trace recorded without
    ``profile_memory`` has two instants in all, so it pays nothing for them."""

    ph: ClassVar[str] = "i"
    name: Any = None  # its cat is never read: left undecoded
    pid: Any = None
    tid: Any = None
    ts: Any = None
    args: _MemArgs | None = None

    def __post_init__(self) -> None:
        _INSTANTS[0] += 1


def _skip_type(phase: str) -> type:
    return msgspec.defstruct(f"_Skip{ord(phase)}", [], gc=False, tag_field="ph", tag=phase, namespace={"ph": phase})


# Chrome trace phases (B/E duration, i/I instant, C counter, b/n/e async, s/t/f flow, P sample, N/O/D object,
# R mark, V/v memory dump, c clock sync, ( ) context); an unknown phase falls back to the lenient decoder
_SKIPPED = tuple(_skip_type(p) for p in "BEICbnestfPONDRVvc()")
_EVENTS = msgspec.json.Decoder(list[Union[(_XEvent, _MEvent, _IEvent, *_SKIPPED)]])  # noqa: UP007 (built at run time)
_BAD_JSON = (msgspec.DecodeError, UnicodeDecodeError)  # msgspec raises the latter for invalid UTF-8 in a string
_EVENT = msgspec.json.Decoder(_Event)
_INSTANT = msgspec.json.Decoder(_IEvent)
_ANY = msgspec.json.Decoder()


# ---------------------------------------------------------------------------------------------------------
# Table layouts: the store's columns (traceanalyze.store.EVENT_COLUMNS, from its DDL; documented in docs/schema.md)
# as Arrow schemas. Every table also gets file_id (added on loading). Collective metadata lives in its own table:
# only a few rows in a thousand carry it, and every column of the big event tables costs insert time even when it
# is all nulls (9 such columns were a third of the load).

_ARROW_TYPES = {"VARCHAR": pa.string(), "BIGINT": pa.int64()}
TABLES = {t: pa.schema([(name, _ARROW_TYPES[typ]) for name, typ in cols]) for t, cols in store.EVENT_COLUMNS.items()}
KERNEL_SCHEMA, CPU_OP_SCHEMA, COMM_SCHEMA, THREAD_SCHEMA, SYNC_SCHEMA, MEMORY_SCHEMA = (
    TABLES[t] for t in ("kernels", "cpu_ops", "comm_events", "threads", "cuda_syncs", "memory_events"))


@dataclass
class TraceFile:
    """What one parse of one trace file found, besides its events.

    ``header`` is the top-level object without ``traceEvents`` (``distributedInfo``, ``deviceProperties``,
    ``baseTimeNanoseconds``, ...). ``counts`` maps table name to rows written. ``partial`` is True when the
    file ended early (truncated JSON or gzip); ``warnings`` are one-line messages for the data-quality section.
    """

    path: str
    header: dict = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    partial: bool = False
    skipped_events: int = 0
    warnings: list[str] = field(default_factory=list)
    base_time_ns: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # events the lenient decoder dropped, by reason
    scanned_bytes: int = 0  # bytes the structural scanner went through (linear in bytes_read)
    # a part of a split file (byte_range) that did not end exactly between two events of the events array: the
    # cut was inside an event, so the parts' rows are not the file's; the caller parses the file whole instead
    split_ok: bool = True


# ---------------------------------------------------------------------------------------------------------
# Reading bytes: plain or gzip, streaming, bounded.

def size_text(n: int) -> str:
    """Bytes for people: ``64 << 30`` → ``64 GiB``, ``1536 << 20`` → ``1.5 GiB``."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def _inflate_detail(exc: Exception) -> str:
    """zlib's "Error -3 while decompressing data: invalid code lengths set" or ISA-L's "Error -1 Invalid deflate
    block found" -> "invalid code lengths set" / "invalid deflate block found"."""
    text = re.sub(r"^Error -?\d+\s*(while decompressing data:?)?\s*", "", str(exc)).strip()
    return (text[:1].lower() + text[1:]) or str(exc)


_GZIP_MAGIC = b"\x1f\x8b"


def _open_blocks(path: Path, max_bytes: int, byte_range: tuple[int, int] | None = None):
    """Yield blocks of decompressed bytes; set ``state['truncated']`` if the compressed stream ends early.

    ``byte_range`` (plain files only) limits the blocks to bytes ``[start, end)`` of the file. ``state`` also
    gets ``error`` (a damaged gzip stream, or more than ``max_bytes``: then ``over_bound`` too) and ``trailing``
    (bytes after the gzip data that are not another member).
    """
    state = {"truncated": False, "error": None}

    def gen():
        with open(path, "rb") as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == _GZIP_MAGIC:
                yield from _gzip_blocks(fh, max_bytes, state)
            elif byte_range is not None:
                yield from _range_blocks(fh, *byte_range)
            else:
                yield from _plain_blocks(fh, max_bytes, state)

    return gen(), state


def _range_blocks(fh, start: int, end: int):
    """Blocks of bytes ``[start, end)`` of a plain file."""
    fh.seek(start)
    left = end - start
    while left > 0:
        raw = fh.read(min(BLOCK_BYTES, left))
        if not raw:
            break
        left -= len(raw)
        yield raw


def _plain_blocks(fh, max_bytes: int, state: dict):
    """Blocks of a plain file, up to ``max_bytes`` (beyond it: ``state['error']``, and no more blocks)."""
    total = 0
    while True:
        raw = fh.read(BLOCK_BYTES)
        if not raw:
            break
        total += len(raw)
        if total > max_bytes:
            _over_bound(state, f"larger than {size_text(max_bytes)}")
            return
        yield raw


def _over_bound(state: dict, what: str) -> None:
    """A file past the ``--max-decompressed`` bound: it fails (``what`` says how), with no half-read trace."""
    state["over_bound"] = True
    state["error"] = f"{what}; raise --max-decompressed if this is a real trace"


def _gzip_blocks(fh, max_bytes: int, state: dict):
    """Blocks of inflated bytes of a gzip file, every member, up to ``max_bytes`` in all.

    One inflater per gzip member: concatenated members (bgzip, appends, `cat a.gz b.gz`) are one file, read to the
    end. The library readers (gzip, isal.igzip) handle members too but buffer a read's output, so a truncated or
    damaged stream would lose the events just before the damage.
    """
    d = _inflate.decompressobj(wbits=31)
    raw = b""
    total = 0
    while True:
        if not raw:
            raw = fh.read(1 << 20)
        if not raw:
            if not d.eof:
                state["truncated"] = True
            return
        # one block out at a time: 1 MiB of gzip is ~16 MiB of trace JSON, and holding all of it before the first
        # yield was half of a parse's memory
        tail = raw
        while tail:
            try:
                out = d.decompress(tail, BLOCK_BYTES)
            except _inflate.error as exc:
                state["error"] = f"corrupt gzip data ({_inflate_detail(exc)})"
                return
            tail = d.unconsumed_tail
            total += len(out)
            if total > max_bytes:
                _over_bound(state, f"decompresses to more than {size_text(max_bytes)} (a gzip bomb?)")
                return
            if out:
                yield out
            if d.eof:
                break
        raw = b""
        if d.eof:
            raw = _next_member(fh, d.unused_data, state)
            if raw is None:
                return
            d = _inflate.decompressobj(wbits=31)  # the next member


def _next_member(fh, rest: bytes, state: dict) -> bytes | None:
    """After the end of a gzip member (``rest``: the bytes read past it): the bytes that start the next member, or
    None when the file ends here (zero padding, which some writers add, is skipped) or goes on with bytes that are
    not gzip (``state['trailing']``: ignored)."""
    while len(rest.lstrip(b"\0")) < 2:  # some writers pad the end with zeros
        more = fh.read(1 << 20)
        if not more:
            break
        rest = rest.lstrip(b"\0") + more
    rest = rest.lstrip(b"\0")
    if not rest:
        return None
    if rest[:2] != _GZIP_MAGIC:
        state["trailing"] = True  # not another member: bytes after the gzip data, ignored
        return None
    return rest


# ---------------------------------------------------------------------------------------------------------
# The structural scanner.

# byte -> 1 quote, 2 backslash, 3 open ({ [), 4 close (} ])
_LUT = np.zeros(256, dtype=np.int8)
_LUT[ord('"')] = 1
_LUT[ord("\\")] = 2
_LUT[ord("{")] = 3
_LUT[ord("[")] = 3
_LUT[ord("}")] = 4
_LUT[ord("]")] = 4
_TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')


class _Scanner:
    """Tracks JSON string/nesting state across blocks and finds the structural characters outside strings.

    Depth counts open ``{``/``[`` outside strings. Events are the elements at ``events_depth``: 2 for
    ``{"traceEvents": [ {...} ]}``, 1 for a bare ``[ {...} ]``. One table lookup and one ``nonzero`` per
    block find every quote, backslash and bracket; string state is the parity of unescaped quotes.
    """

    def __init__(self) -> None:
        self.in_string = False
        self.escape_next = False  # the previous block ended inside a string on an odd run of backslashes
        self.depth = 0
        self.events_depth: int | None = None
        self.array_closed = False

    def scan(self, buf: bytes, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Scan ``buf[start:]``; return (positions in buf, char codes, depth after) of brackets outside strings."""
        a = np.frombuffer(buf, dtype=np.uint8)[start:]
        m = _LUT[a]
        idx = np.flatnonzero(m)
        codes = m[idx]
        if self.escape_next or (codes == 2).any():
            codes = self._drop_escaped(idx, codes, len(a))
        isq = codes == 1
        qbefore = np.cumsum(isq) - isq  # quotes strictly before each entry
        br = codes >= 3
        outside = ((qbefore[br] + self.in_string) & 1) == 0
        pos = idx[br][outside]
        opens = codes[br][outside] == 3
        delta = np.where(opens, 1, -1)
        depth_after = self.depth + np.cumsum(delta)
        if depth_after.size:
            self.depth = int(depth_after[-1])
        if int(isq.sum()) & 1:
            self.in_string = not self.in_string
        chars = a[pos]
        return pos + start, chars, depth_after

    def _drop_escaped(self, idx: np.ndarray, codes: np.ndarray, n: int) -> np.ndarray:
        """Mark quotes escaped by a backslash (and the backslashes themselves) as plain characters.

        ``idx`` are positions of special bytes in a block of ``n`` bytes. A backslash escapes the next byte,
        whatever it is; only special bytes are listed, so a gap after a backslash means it escaped a plain one.
        """
        codes = codes.copy()
        escape = self.escape_next
        prev_pos = -1  # a pending escape from the last block applies to byte 0 of this one
        for j in range(codes.size):  # only reached for blocks that hold a backslash: rare in traces
            p = int(idx[j])
            if escape:
                escape = False
                if p == prev_pos + 1:
                    codes[j] = 0  # this byte is escaped
                    prev_pos = p
                    continue
            if codes[j] == 2:
                escape = True
                codes[j] = 0
            prev_pos = p
        # still pending only if the escaping backslash is the block's last byte
        self.escape_next = escape and prev_pos == n - 1
        return codes


# ---------------------------------------------------------------------------------------------------------
# Columns.

def _int_or_none(v: Any) -> int | None:
    if type(v) is float and math.isfinite(v):
        v = int(v)
    elif type(v) is str:
        m = re.search(r"-?\d{1,19}", v)  # "stream 7" in old traces
        v = int(m.group()) if m else None
    if type(v) is int and -(1 << 63) <= v < 1 << 63:  # what does not fit an int64 column is garbage
        return v
    return None


def _str_or_none(v: Any) -> str | None:
    if v is None:
        return None
    return v if type(v) is str else str(v)


def _raw_text(v: msgspec.Raw | None) -> str | None:
    if v is None:
        return None
    t = bytes(v).decode("utf-8", "replace")
    if t.startswith('"') and t.endswith('"'):  # "Process Group Ranks": "[0, 1]" is a JSON string
        try:
            return _ANY.decode(t)
        except _BAD_JSON:
            return t
    return t


def _us_to_ns(us: pa.Array) -> pa.Array:
    """µs (float64) -> int64 ns, exact for old traces' absolute epoch µs (~1.7e15): whole µs times 1000 in
    integers plus the rounded fraction (a plain ``us * 1000`` in float64 is off by up to 128 ns there)."""
    whole = pc.floor(us)
    frac_ns = pc.cast(pc.round(pc.multiply(pc.subtract(us, whole), 1000.0)), pa.int64())
    return pc.add(pc.multiply(pc.cast(whole, pa.int64()), 1000), frac_ns)


def _us_to_ns_np(us: np.ndarray) -> np.ndarray:
    """:func:`_us_to_ns` in NumPy, for finite µs: the same float64 steps (floor, the fraction times 1000 rounded
    half to even, whole µs times 1000 in integers), so the same ns."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _int64_np(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """An int64 Arrow array's values (0 where null) and validity, in NumPy, read from its buffers (no compute
    kernel; ``to_numpy`` would give float64, inexact beyond 2**53, where there are nulls)."""
    n = len(col)
    if col.null_count == 0:
        return col.to_numpy(), np.ones(n, dtype=bool)
    if col.null_count == n:
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    bitmap, data = col.buffers()[:2]
    valid = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")[col.offset:col.offset + n].view(bool)
    vals = np.frombuffer(data, np.int64)[col.offset:col.offset + n]
    return np.where(valid, vals, 0), valid


def _arr(values: list, typ: pa.DataType, oob: set[int] | None = None, first: int = 0) -> pa.Array:
    """Build an Arrow array; when a trace carries a wrong type somewhere, coerce item by item (None if hopeless).

    ``oob`` collects the positions of numbers out of range (an integer beyond int64, a float that is not finite,
    such as a 400-digit integer in a float column), plus ``first`` (the batch row of ``values[0]``): their events
    are dropped by the caller. Only the slow path
    (a value Arrow refused) looks, so the usual batch pays nothing for it.
    """
    if values and values[0] is None and values.count(None) == len(values):  # an arg no event of the batch has
        return pa.nulls(len(values), typ)
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        if pa.types.is_integer(typ):
            conv = _int_or_none
        elif pa.types.is_floating(typ):
            conv = _float_or_none
        else:
            conv = _str_or_none
        if oob is not None and not pa.types.is_string(typ):
            oob.update(first + i for i, v in enumerate(values) if _out_of_range(v))
        return pa.array([conv(v) for v in values], type=typ)


def _out_of_range(v: Any) -> bool:
    """A JSON number no column can hold: an integer beyond int64 or a float beyond float64 (``1e400``)."""
    if type(v) is int:
        return not -(1 << 63) <= v < 1 << 63
    return type(v) is float and math.isinf(v)


def _float_or_none(v: Any) -> float | None:
    if type(v) in (int, float):
        try:
            return float(v)
        except OverflowError:  # a 400-digit integer
            return None
    return None


class _Columns:
    """Turns decoded events into the Arrow tables, column by column (no per-event Python branching).

    Kept events wait in a list and are converted :data:`BATCH_ROWS` at a time, so the per-call cost of Arrow
    kernels is paid per batch, not per block of bytes. Odd types in a column (a string ``ts``, a list
    ``name``) are coerced item by item or become null; X events whose ts/dur are missing, non-numeric,
    negative or not finite are dropped and counted, and so are events longer than :data:`MAX_DUR_US` (1 day:
    a known CUPTI fault writes durations of years).
    """

    BATCH_ROWS = 1 << 12  # larger batches fall out of the CPU cache and get slower

    def __init__(self) -> None:
        self.parts: dict[str, list[pa.Table]] = {n: [] for n in TABLES}
        self.rows = 0
        self.bad_time = 0
        self.too_long = 0
        self.negative_dur = 0  # counted apart from bad_time: README, Safety (impossible durations)
        self.negative_ts = 0
        self.out_of_range = 0  # events dropped for a number no column can hold (README, Safety)
        self.span_us: float | None = None  # the profiler's recording span: its "Trace" event (PyTorch Profiler (0))
        self.pending: list = []  # X events of a kept category, not yet converted
        self.instants = _INSTANTS[0]  # instants decoded in this process before the events given to add()
        self.marks = _MARKS[0]  # the same for metadata events
        self.memory_dropped = 0  # [memory] events without a usable ts or Bytes (README, Safety)
        self.mem_pending: list = []  # [memory] instants, not yet converted (in batches, as the X events)

    def __len__(self) -> int:
        return self.rows + len(self.pending) + len(self.mem_pending)

    def add(self, events: list, typed: bool = False) -> None:
        """Take decoded events (any phase; only X and M events are kept). ``typed``: decoded by phase (``_EVENTS``),
        so an X event is an :class:`_XEvent` (the lenient decoder's :class:`_Event` holds its phase in ``ph``)."""
        # one pass: the "Trace" event (the recording's span, one per file) goes along and is taken out in convert()
        try:  # the type test costs less than reading the class attribute ph (~3 ms a 47 MB rank)
            x = ([e for e in events if type(e) is _XEvent and e.cat in _KEPT_OR_TRACE] if typed
                 else [e for e in events if e.ph == "X" and e.cat in _KEPT_OR_TRACE])
        except TypeError:  # an unhashable cat (a list) somewhere: such an event is no kernel or op
            x = [e for e in events if e.ph == "X" and type(e.cat) is str and e.cat in _KEPT_OR_TRACE]
        self.pending += x
        if len(self.pending) >= self.BATCH_ROWS:
            self.convert()
        if _MARKS[0] != self.marks:  # only runs that hold a metadata event are searched for them
            self.marks = _MARKS[0]
            m = [e for e in events if e.ph == "M"]
            if m:
                self._add_m(m)
        if _INSTANTS[0] != self.instants:  # only runs that hold an instant are searched for [memory] events
            self.instants = _INSTANTS[0]
            self.mem_pending += [e for e in events if type(e) is _IEvent and e.name == "[memory]"]  # type: 3x ph
            if len(self.mem_pending) >= self.BATCH_ROWS:
                self._add_memory()

    def _add_memory(self) -> None:
        """The allocator's ``[memory]`` instants into ``memory_events``. An event without a finite ts in range or
        without an integer ``Bytes`` of at most :data:`MAX_ALLOC_BYTES` is dropped and counted; a total out of
        [0, MAX_ALLOC_BYTES], a device beyond :data:`MAX_DEVICE_INDEX` or an address beyond int64 becomes null."""
        events, self.mem_pending = self.mem_pending, []
        if not events:
            return
        args = [e.args or _NO_MEM_ARGS for e in events]
        # the masks in NumPy: Arrow's kernels were ~32 calls a batch, half of this path's time (a 28k-event rank:
        # 19 -> ~10 ms); the columns are still built by _arr, which coerces odd values
        ts = _arr([e.ts for e in events], pa.float64()).to_numpy(zero_copy_only=False)  # null -> NaN
        nbytes_col = _arr([a.nbytes for a in args], pa.int64())
        nbytes, nbytes_ok = _int64_np(nbytes_col)
        # NaN compares False; np.abs wraps INT64_MIN as Arrow's abs does
        ok = (np.isfinite(ts) & (ts >= 0.0) & (ts <= MAX_TS_US) & nbytes_ok
              & (np.abs(nbytes) <= MAX_ALLOC_BYTES))

        def bounded(values: list, lo: int, hi: int) -> pa.Array:
            col, valid = _int64_np(_arr(values, pa.int64()))
            return pa.array(col, pa.int64(), mask=~(valid & (col >= lo) & (col <= hi)))

        cols = {
            "pid": _arr([e.pid for e in events], pa.int64()),
            "tid": _arr([e.tid for e in events], pa.int64()),
            "ts_ns": pa.array(_us_to_ns_np(np.where(ok, ts, 0.0))),
            "device_type": bounded([a.device_type for a in args], -1, MAX_DEVICE_INDEX),
            "device_id": bounded([a.device_id for a in args], -1, MAX_DEVICE_INDEX),
            "addr": _arr([a.addr for a in args], pa.int64()),
            "bytes": nbytes_col,
            "total_allocated": bounded([a.total_allocated for a in args], 0, MAX_ALLOC_BYTES),
            "total_reserved": bounded([a.total_reserved for a in args], 0, MAX_ALLOC_BYTES),
        }
        self.memory_dropped += len(events) - int(np.count_nonzero(ok))
        self._append("memory_events", cols, ok)

    def _add_span(self, events: list) -> None:
        """Kineto's span of the whole recording (its "Trace" X events): the bound on any event's duration."""
        for e in events:
            d = _float_or_none(e.dur)
            if d is not None and math.isfinite(d) and 0 < d <= MAX_DUR_US:
                self.span_us = max(self.span_us or 0.0, d)

    def _add_m(self, events: list) -> None:
        """The thread and process names of metadata events into ``threads``: a column at a time, by :func:`_arr`
        (which coerces odd values item by item as :func:`_int_or_none` / :func:`_str_or_none` do), not a
        conversion per value (~0.1 ms a small rank)."""
        m = [e for e in events if e.name in ("thread_name", "process_name", "process_labels") and e.args is not None]
        if m:
            cols = {"pid": _arr([e.pid for e in m], pa.int64()), "tid": _arr([e.tid for e in m], pa.int64()),
                    "kind": pa.array([e.name for e in m], pa.string()),
                    "label": _arr([e.args.name for e in m], pa.string())}
            self.parts["threads"].append(pa.table([cols[f] for f in THREAD_SCHEMA.names], schema=THREAD_SCHEMA))

    def convert(self) -> None:
        """Convert the pending events to Arrow tables."""
        self._add_memory()
        ev, self.pending = self.pending, []
        if not ev:
            return
        # kept categories only (add() filters them): a dict lookup per event gives each row's kind, and NumPy
        # lookups by that code give each row's table, where string arrays and set lookups in Arrow cost more
        try:
            code = np.array([_KIND_CODE[e.cat] for e in ev], dtype=np.int32)
        except KeyError:  # a "Trace" event: the span, no row
            self._add_span([e for e in ev if e.cat == "Trace"])
            ev = [e for e in ev if e.cat != "Trace"]
            if not ev:
                return
            code = np.array([_KIND_CODE[e.cat] for e in ev], dtype=np.int32)
        # the rows grouped by table (kernels, cuda_syncs, cpu_ops), each table's in their order: every table is
        # then a slice of the batch's columns (no filter), and a table's own columns are built for its rows only
        group = _TABLE_OF[code]
        perm = None
        if np.any(group[1:] < group[:-1]):
            perm = np.argsort(group, kind="stable")
            ev = [ev[i] for i in perm.tolist()]
            code, group = code[perm], group[perm]
        g_end, s_end = np.searchsorted(group, [1, 2]).tolist()  # kernels rows [0, g_end), syncs [g_end, s_end)
        n = len(ev)
        oob: set[int] = set()  # events holding a number out of range: dropped, counted apart
        ts = _arr([e.ts for e in ev], pa.float64(), oob).to_numpy(zero_copy_only=False)  # null -> NaN
        dur = _arr([e.dur for e in ev], pa.float64(), oob).to_numpy(zero_copy_only=False)
        ok, time_oob = self._valid_times(ev, ts, dur, oob)
        args = [e.args or _NO_ARGS for e in ev]
        base, gpu_cols, cpu_cols = _event_columns(ev, args, pc.take(_KIND_VALUES, pa.array(code)), ts, dur, ok,
                                                  g_end, s_end, oob)
        comm = self._comm_table(args, base, s_end, oob)
        sync_any = bool(ok[g_end:s_end].any())
        if sync_any:  # the awaited event of a Stream Wait Event: its stream and its record call
            sync_args = args[g_end:s_end]
            gpu_cols["wait_on_stream"] = (_arr([a.wait_on_stream for a in sync_args], pa.int64(), oob, g_end), g_end)
            gpu_cols["wait_on_corr"] = (_arr([a.wait_on_corr for a in sync_args], pa.int64(), oob, g_end), g_end)
        if oob:
            keep = np.ones(n, dtype=bool)
            keep[list(oob)] = False
            self.out_of_range += int(np.count_nonzero(ok & ~keep)) + time_oob
            ok = ok & keep
        if "bytes" in gpu_cols:
            self._append_rows("kernels", base, gpu_cols, ok, 0, g_end)
        if sync_any:
            self._append_rows("cuda_syncs", base, gpu_cols, ok, g_end, s_end)
        if cpu_cols:
            self._append_rows("cpu_ops", base, cpu_cols, ok, s_end, n)
        if comm is not None:
            t, has = comm
            rows = np.flatnonzero(ok & has.to_numpy(zero_copy_only=False))
            if perm is not None:  # back to the events' order
                rows = rows[np.argsort(perm[rows], kind="stable")]
            if len(rows):
                self.parts["comm_events"].append(pc.take(t, pa.array(rows)))

    def _valid_times(self, ev: list, ts: np.ndarray, dur: np.ndarray, oob: set[int]) -> tuple[np.ndarray, int]:
        """Which events have a usable time: ts and dur (µs, NaN where missing) finite, not negative, ts in range
        and dur at most :data:`MAX_DUR_US`. The others are counted by reason (``oob``, the positions of numbers out
        of range so far, are counted apart, as out of range). Returns the mask and the number of events out of
        range by their ts or dur."""
        n = len(ev)
        finite = np.isfinite(ts) & np.isfinite(dur)
        neg_dur = finite & (dur < 0.0)
        neg_ts = finite & ~neg_dur & (ts < 0.0)
        ok = finite & ~(neg_dur | neg_ts) & (ts <= MAX_TS_US)
        n_ok = int(np.count_nonzero(ok))
        n_neg_dur = int(np.count_nonzero(neg_dur))
        n_neg_ts = int(np.count_nonzero(neg_ts))
        self.negative_dur += n_neg_dur
        self.negative_ts += n_neg_ts
        if oob:  # counted once, as out of range, not also as bad ts/dur
            time_oob = sum(1 for i in oob if _out_of_range(ev[i].ts) or _out_of_range(ev[i].dur))
        else:
            time_oob = 0
        self.bad_time += n - n_ok - n_neg_dur - n_neg_ts - time_oob
        too_long = ok & (dur > MAX_DUR_US)
        n_long = int(np.count_nonzero(too_long))
        if n_long:  # a CUPTI fault: an end time never written gives durations of years
            self.too_long += n_long
            ok = ok & ~too_long
        return ok, time_oob

    def _append(self, table: str, cols: dict, mask: np.ndarray) -> None:
        """The rows of ``cols`` (a whole batch's columns) with ``mask`` into ``table``."""
        schema = TABLES[table]
        t = pa.table([cols[f] for f in schema.names], schema=schema)
        if not mask.all():  # the usual batch keeps every row: nothing to filter
            t = pc.filter(t, pa.array(mask))
        self.parts[table].append(t)
        self.rows += t.num_rows

    def _append_rows(self, table: str, base: dict, own: dict, ok: np.ndarray, lo: int, hi: int) -> None:
        """Rows ``lo:hi`` of the batch into ``table``, those with ``ok``: ``base`` holds columns of the whole
        batch, ``own`` ``(column, its first row)`` pairs of columns built for some rows only."""
        schema = TABLES[table]
        cols = []
        for f in schema.names:
            col, start = own.get(f) or (base[f], 0)
            cols.append(col.slice(lo - start, hi - lo))
        t = pa.table(cols, schema=schema)
        mask = ok[lo:hi]
        if not mask.all():  # rare: an event without a usable time or with a number out of range
            t = pc.filter(t, pa.array(mask))
        self.parts[table].append(t)
        self.rows += t.num_rows

    def _comm_table(self, args: list, base: dict, g_end: int, oob: set[int]) -> tuple[pa.Table, pa.Array] | None:
        """The collective metadata of a batch, unfiltered, and which rows carry any; None when none does. Rows
        before ``g_end`` are kernels, the others host calls."""
        # these four tell whether any event carries collective metadata: most batches hold none (one pass)
        if not [a for a in args if a.collective is not None or a.pg_name is not None or a.in_nelems is not None
                or a.in_size is not None]:
            return None
        raw = {f: [getattr(a, f) for a in args] for f in _COMM_ARGS}
        comm = {
            "collective": _arr(raw["collective"], pa.string()),
            "in_nelems": pc.coalesce(_arr(raw["in_nelems"], pa.int64(), oob), _arr(raw["in_size"], pa.int64(), oob)),
            "out_nelems": pc.coalesce(_arr(raw["out_nelems"], pa.int64(), oob),
                                      _arr(raw["out_size"], pa.int64(), oob)),
            "group_size": _arr(raw["group_size"], pa.int64(), oob),
            "comm_dtype": _arr(raw["comm_dtype"], pa.string()),
            "pg_name": _arr(raw["pg_name"], pa.string()),
            "pg_desc": _arr(raw["pg_desc"], pa.string()),
            "pg_ranks": pa.array([_raw_text(x) for x in raw["pg_ranks"]], pa.string()),
            "seq": _arr(raw["seq"], pa.int64(), oob),
            "comms_id": _arr(raw["comms_id"], pa.string()),
            "source": pc.if_else(pa.array(np.arange(len(args)) < g_end), "kernels", "cpu_ops"),
        }
        has = pc.or_(pc.or_(pc.is_valid(comm["collective"]), pc.is_valid(comm["pg_name"])),
                     pc.is_valid(comm["in_nelems"]))
        return pa.table([comm.get(f, base.get(f)) for f in COMM_SCHEMA.names], schema=COMM_SCHEMA), has

    def tables(self) -> dict[str, pa.Table]:
        """The rows converted so far, by table; a table without any is left out (most files have no collectives,
        syncs or memory events: an empty table apiece cost ~0.1 ms a small file, for a sink that skips them)."""
        self.convert()
        out = {n: pa.concat_tables(p) for n, p in self.parts.items() if p}
        self.parts = {n: [] for n in TABLES}
        self.rows = 0
        return out


def _event_columns(ev: list, args: list, kind: pa.Array, ts: np.ndarray, dur: np.ndarray, ok: np.ndarray,
                   g_end: int, s_end: int, oob: set[int]) -> tuple[dict[str, pa.Array], dict, dict]:
    """The columns of the kernels, cuda_syncs and cpu_ops tables for a batch of X events grouped by table
    (kernels rows ``[0, g_end)``, cuda_syncs ``[g_end, s_end)``, cpu_ops the rest), unfiltered (``ts_ns``/``dur_ns``
    are 0 where ``ok`` is false; ``ts``/``dur`` in µs). Returns the columns of every row, then the GPU-only and
    the CPU-only ones as ``(column, its first row)``, built for those rows only and only when one of them is
    kept."""
    pid = _arr([e.pid for e in ev], pa.int64(), oob)
    tid = _arr([e.tid for e in ev], pa.int64(), oob)
    base = {
        "cat": kind,
        "name": _arr([e.name for e in ev], pa.string()),
        "ts_ns": pa.array(_us_to_ns_np(np.where(ok, ts, 0.0))),
        "dur_ns": pa.array(np.rint(np.where(ok, dur, 0.0) * 1000.0).astype(np.int64)),  # rint: half to even
        "external_id": _coalesce(_arr([a.external_id for a in args], pa.int64(), oob),
                                 _arr([a.external_id_old for a in args], pa.int64(), oob)),
        "correlation": _arr([a.correlation for a in args], pa.int64(), oob),
        "pid": pid,
        "tid": tid,
    }
    gpu: dict[str, tuple[pa.Array, int]] = {}
    if ok[:s_end].any():
        dev = args[:s_end]
        gpu["device"] = (_coalesce(_arr([a.device for a in dev], pa.int64(), oob), pid.slice(0, s_end)), 0)
        gpu["stream"] = (_coalesce(_arr([a.stream for a in dev], pa.int64(), oob), tid.slice(0, s_end)), 0)
        if ok[:g_end].any():
            gpu["bytes"] = (_arr([a.nbytes for a in dev[:g_end]], pa.int64(), oob), 0)
    cpu: dict[str, tuple[pa.Array, int]] = {}
    if ok[s_end:].any():
        host = args[s_end:]
        cpu["input_types"] = (_raw_column([a.input_type for a in host]), s_end)
        cpu["input_dims"] = (_raw_column([a.input_dims for a in host]), s_end)
        cpu["kernel_backend"] = (_arr([a.kernel_backend for a in host], pa.string()), s_end)
    return base, gpu, cpu


def _coalesce(first: pa.Array, second: pa.Array) -> pa.Array:
    """``coalesce(first, second)``; ``first`` itself when either has no nulls to fill or nothing to fill them
    with (most batches: old-style ``external id`` and ``device``/``stream`` args are rare or always there)."""
    if first.null_count == 0 or second.null_count == len(second):
        return first
    return pc.coalesce(first, second)


_KIND_CODE = {c: i for i, c in enumerate([*GPU_CATS, *CPU_CATS, *SYNC_CATS])}  # Kineto category -> its code
# typed: a list whose type pyarrow infers imports dateutil (~1 ms) to look for its relativedelta
_KIND_VALUES = pa.array(list(GPU_CATS.values()) + [v or "" for v in CPU_CATS.values()] + list(SYNC_CATS.values()),
                        pa.string())
# by code: the table of its rows (0 kernels, 1 cuda_syncs, 2 cpu_ops), the order of a batch's rows in convert()
_TABLE_OF = np.array([0 if c in GPU_CATS else 1 if c in SYNC_CATS else 2 for c in _KIND_CODE], dtype=np.int8)
_KEPT_CATS = frozenset(c for c, v in {**GPU_CATS, **CPU_CATS, **SYNC_CATS}.items() if v)
_KEPT_OR_TRACE = _KEPT_CATS | {"Trace"}
_COMM_ARGS = ("collective", "in_nelems", "out_nelems", "in_size", "out_size", "group_size", "comm_dtype", "pg_name",
              "pg_desc", "pg_ranks", "seq", "comms_id")


_NO_ARGS = _Args()
_NO_MEM_ARGS = _MemArgs()


def _raw_column(raws: list[msgspec.Raw | None]) -> pa.Array:
    """Raw JSON values (``msgspec.Raw``, or None) as a string column; invalid UTF-8 is replaced.

    The values are joined into one new buffer, not handed to pyarrow one by one: pyarrow (26) keeps a reference to
    every buffer it was handed, which kept each decoded run alive for the life of the process (a leak of ~2.6 MB
    per small rank in a reused worker); and one join costs less than a ``bytes`` per value.
    """
    n = len(raws)
    nulls = raws.count(None)
    if nulls == n:  # traces recorded without record_shapes
        return pa.nulls(n, pa.string())
    filled = [b"" if r is None else r for r in raws] if nulls else raws
    data = b"".join(filled)
    if len(data) < 1 << 31:  # int32 offsets (always, but for a batch of giant values)
        lens = np.fromiter(map(len, filled), np.int64, n)
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lens, out=offsets[1:])
        valid = pa.py_buffer(np.packbits(lens > 0, bitorder="little")) if nulls else None  # a value is never b""
        arr = pa.Array.from_buffers(pa.string(), n, [valid, pa.py_buffer(offsets), pa.py_buffer(data)], nulls)
        try:
            arr.validate(full=True)  # UTF-8
            return arr
        except pa.ArrowInvalid:
            pass
    return pa.array([None if r is None else bytes(r).decode("utf-8", "replace") for r in raws], pa.string())


def header_base_ns(header: dict) -> int:
    """``baseTimeNanoseconds`` of a trace header when it is a plausible epoch time in ns, else 0."""
    b = header.get("baseTimeNanoseconds")
    if type(b) is int and 0 <= b < 1 << 62:
        return b
    if type(b) is float and math.isfinite(b) and 0 <= b < 4e18:
        return int(b)
    return 0


# ---------------------------------------------------------------------------------------------------------

def parse_trace(path: str | Path, out_dir: str | Path | None = None, *, key: str = "t",
                max_decompressed: int = DEFAULT_MAX_DECOMPRESSED, chunk_rows: int = 500_000,
                byte_range: tuple[int, int] | None = None, part: tuple[bool, bool] | None = None,
                hold_rows: int = 0) -> tuple[TraceFile, dict[str, pa.Table] | dict[str, str]]:
    """Parse one Kineto trace file (``.json`` or ``.json.gz``) in one streaming pass.

    Args:
        path: the trace file.
        out_dir: when given, every ``chunk_rows`` rows are written to Arrow IPC streams
            ``out_dir/{key}.{table}.arrow`` (memory bounded by a chunk, whatever the file's size; cheap to write and
            to read a chunk at a time). When None, the tables come back in memory.
        key: file-name prefix for the IPC streams.
        max_decompressed: bound in bytes on the decompressed size (guards against gzip bombs).
        chunk_rows: rows held before they are written out (or, in memory, concatenated).
        byte_range: ``(start, end)`` to parse one part of a large plain-JSON file (see :func:`split_points`): a
            part that starts after 0 begins at an event's ``{`` and has no header; one that ends before the end
            of the file stops before an event's ``{``, which is not a truncation.
        part: ``(starts at an event, ends before one)`` when ``path`` is one part file of a larger trace
            (:func:`inflate_parts`), with the same meaning as for a byte range.
        hold_rows: with ``out_dir``, a file of up to this many rows comes back as tables (of its tables with rows)
            instead of streams, for the caller to write into one stream with other small files.

    Returns:
        ``(TraceFile, tables)``: the summary and ``{"kernels", "cpu_ops", "comm_events", "threads"}``, as Arrow
        tables with the schemas in ``TABLES`` (``ts_ns``/``dur_ns`` in ns), or with ``out_dir`` as the paths of
        their IPC stream files.

    Raises:
        InputError: the file cannot be read, is not JSON, is not a trace (no ``traceEvents``), or holds no
            complete event. A file cut off after some complete events is *not* an error: it is returned
            with ``partial=True`` and a warning.
    """
    path = Path(path)
    info = TraceFile(path=str(path))
    if byte_range is not None:
        part = (byte_range[0] > 0, byte_range[1] < path.stat().st_size)
    try:
        blocks, state = _open_blocks(path, max_decompressed, byte_range)
        result = _parse_blocks(path, blocks, state, info, out_dir, key, chunk_rows, part, hold_rows)
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None
    return info, result


_EVENTS_KEY_OPEN = re.compile(rb'"traceEvents"\s*:\s*\[')

SPLIT_MIN_BYTES = 256 << 20  # plain-JSON traces at least this big are parsed in parts by several processes


_TAIL_BASE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d{1,19})\s*[,}]')


def tail_base_time_ns(path: str | Path, header: dict) -> int:
    """``baseTimeNanoseconds`` of a plain-JSON trace read from its last 64 KiB (new kineto writes it after the
    events), else from ``header`` (the keys before the events); 0 when neither has it.

    Lets the parts of a split file be shifted to the trace's clock before the last part is parsed; the parse
    of the last part remains the reference (see :class:`traceanalyze.ingest.load._FileLoad`).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - (64 << 10)))
        tail = fh.read()
    found = list(_TAIL_BASE.finditer(tail))
    if found:
        return header_base_ns({"baseTimeNanoseconds": int(found[-1].group(1))})
    return header_base_ns(header)


def split_points(path: str | Path, n: int) -> list[int]:
    """Byte offsets at which ``n`` processes can each parse a part of one large plain-JSON trace.

    The first offset is 0; each other one is the ``{`` of an event near ``size * k / n``. A candidate boundary
    ``}, {`` is taken when the bytes up to the next candidate decode as one JSON object with a ``ph`` and a ``ts``,
    which a cut inside a string cannot give, but an array of objects in an event's ``args`` can: the parse of each
    part checks that it ends exactly between two events (``TraceFile.split_ok``), and a file whose split fails that
    check is parsed whole (guarantee 7). Returns ``[0]`` (do not split) for gzip files, files under
    :data:`SPLIT_MIN_BYTES`, files whose ``traceEvents`` key is not found early, or when no boundary is found.
    """
    path = Path(path)
    size = path.stat().st_size
    if n < 2 or size < SPLIT_MIN_BYTES:
        return [0]
    with open(path, "rb") as fh:
        head = fh.read(1 << 20)
        key_at = _EVENTS_KEY_OPEN.search(head)
        if head[:2] == b"\x1f\x8b" or key_at is None:
            return [0]
        sc = _Scanner()
        _, hchars, hdepth = sc.scan(head[: key_at.end()], 0)
        if not (hdepth.size and hdepth[-1] == 2 and hchars[-1] == 91 and not sc.in_string):
            return [0]
        points = [0]
        for k in range(1, n):
            at = _event_start_after(fh, size * k // n)
            if at is not None and at > points[-1] + (1 << 20):
                points.append(at)
    return points


def _event_start_after(fh, offset: int, window: int = 4 << 20) -> int | None:
    fh.seek(offset)
    data = fh.read(window)
    at = _event_start_in(data, len(data) < window)
    return None if at is None else offset + at


def _event_start_in(data: bytes, at_eof: bool) -> int | None:
    """Index in ``data`` (bytes from inside the events array) of the ``{`` of an event after a ``}, {``; None when
    no candidate passes. ``at_eof``: ``data`` runs to the end of the file."""
    cands = list(_BOUNDARY.finditer(data))
    for m, nxt in zip(cands, cands[1:], strict=False):
        # a likely boundary: an object with a phase up to the next candidate. Objects in an args array can look
        # like that too, so this is only a candidate: the parse of each part proves its end (TraceFile.split_ok)
        try:
            obj = _ANY.decode(data[m.end() - 1: nxt.start() + 1])
        except _BAD_JSON:
            continue
        if not (isinstance(obj, dict) and isinstance(obj.get("ph"), str) and isinstance(obj.get("ts"), (int, float))):
            continue
        # an object of an args array is followed by the closing brackets of its event: scanned from here as if
        # between two events, the depth falls below the events array's before the end of the file, and below the
        # file's own at its end
        sc = _Scanner()
        sc.depth = 2
        at = m.end() - 1
        _, _, depth = sc.scan(data[at: at + (256 << 10)], 0)
        near_eof = at_eof and at + (256 << 10) >= len(data)
        if depth.size and (depth.min() < 0 or (depth.min() < 2 and not near_eof)):
            continue
        return at
    return None


def gzip_json_size(path: str | Path) -> int:
    """What a ``.gz`` file says it inflates to: ISIZE of its last member (bytes mod 2^32, so exact for one member
    under 4 GiB), or ten times the compressed size when that is smaller than the file itself (a wrap-around).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - 4))
        isize = int.from_bytes(fh.read(4), "little")
    return isize if isize >= size else 10 * size


def inflate_parts(path: str | Path, out_dir: str | Path, key: str, part_bytes: int, max_bytes: int, state: dict):
    """Inflate a ``.gz`` trace (every member) into plain-JSON part files of about ``part_bytes``, cut before an
    event, for parsing in parallel like the byte ranges of a plain file (:func:`split_points`).

    Yields each part file's path as it is complete: the first holds the header, each later one starts at an
    event's ``{``. ISA-L inflates one stream at ~1 GB/s, a small share of the parse; rapidgzip's parallel inflate
    was slower on 2 cores (121 MB/s with 2 threads against ISA-L's 428 MB/s, same file, same load). Memory is a
    block plus the search window. When it ends, ``state`` holds ``clean`` (False when the stream was truncated,
    damaged, over ``max_bytes`` or followed by other bytes: the caller parses such a file whole, which reports it).
    """
    blocks, st = _open_blocks(Path(path), max_bytes)
    k = 0
    name = str(Path(out_dir) / f"{key}.part{k}.json")
    fh = open(name, "wb")
    size = 0
    pending = b""
    try:
        for blk in blocks:
            if size + len(pending) < part_bytes:
                fh.write(blk)
                size += len(blk)
                continue
            pending += blk
            if len(pending) < 1 << 20:  # a window to check the candidate in
                continue
            at = _event_start_in(pending, False)
            if at is None:
                fh.write(pending)
                size += len(pending)
                pending = b""
                continue
            fh.write(pending[:at])
            fh.close()
            yield name
            k += 1
            name = str(Path(out_dir) / f"{key}.part{k}.json")
            fh = open(name, "wb")
            fh.write(pending[at:])
            size, pending = len(pending) - at, b""
        fh.write(pending)
        fh.close()
        yield name
    finally:
        fh.close()
    state["clean"] = not (st["error"] or st["truncated"] or st.get("trailing"))


_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_TAIL_WINDOW = 1 << 16


class _EventStream:
    """Phase two of a parse: cut the bytes after the events array's ``[`` into runs of complete events.

    Fast path: the last ``}, {`` in a block's final 64 KiB is taken as the boundary between two events and
    the run before it is decoded at once. A cut that falls inside a string or a nested object cannot decode
    (the run would hold an open string or bracket), so a successful decode proves the cut; a failed one falls
    back to the structural scanner for that block. The scanner also finds the array's closing ``]``.

    An event longer than a block (a 60 MB string) is held as a list of blocks while a scanner carries its
    string/nesting state from block to block, so each byte is scanned once until the event ends: the work stays
    linear in the bytes (README, Safety), where joining and rescanning the held bytes per block was quadratic.
    """

    def __init__(self, events_depth: int, decode) -> None:
        self.ed = events_depth
        # decode(parts, strict) -> bool: decode the concatenated parts as complete events (False: the cut
        # was not a boundary, only with strict)
        self.decode = decode
        self.rest = b""  # bytes held back: they start at an event's '{' (or whitespace before it)
        self.closed = False
        self.tail = b""
        self.long: list[bytes] = []  # the blocks of an event longer than a block, while it lasts
        self.long_sc: _Scanner | None = None  # the scanner's state at the end of self.long
        self.long_bytes = 0
        self.scanned = 0  # bytes given to the structural scanner (the linear-work test reads it)

    def feed(self, blk: bytes, path) -> None:
        if self.closed:
            self.tail += blk
            return
        if self.long_sc is not None:  # inside an event longer than a block: scan only the new bytes
            self.scanned += len(blk)
            _, chars, depth = self.long_sc.scan(blk, 0)
            ends = ((chars == 125) & (depth == self.ed)).any() or (depth == self.ed - 1).any()
            self.long.append(blk)
            self.long_bytes += len(blk)
            if not ends:
                if self.long_bytes > MAX_EVENT_BYTES:
                    raise InputError(path, f"an event larger than {MAX_EVENT_BYTES >> 20} MiB; the file is corrupt")
                return
            data = b"".join(self.long)  # the event ended: one scan of the whole, as for any block
            self.long, self.long_sc, self.long_bytes = [], None, 0
            self._scan(data, path)
            return
        if len(blk) > _TAIL_WINDOW:  # usual case: look for the cut in the new block, copy it only once
            last = None
            for m in _BOUNDARY.finditer(blk, len(blk) - _TAIL_WINDOW):
                last = m
            if last is not None and self.decode([self.rest, memoryview(blk)[: last.start() + 1]], True):
                self.rest = blk[last.end() - 1:]
                return
        data = self.rest + blk if self.rest else blk
        last = None
        for m in _BOUNDARY.finditer(data, max(0, len(data) - _TAIL_WINDOW)):
            last = m
        if last is not None and self.decode([memoryview(data)[: last.start() + 1]], True):
            self.rest = data[last.end() - 1:]
            return
        self._scan(data, path)

    def _scan(self, data: bytes, path) -> None:
        sc = _Scanner()
        sc.depth = self.ed  # data starts between two events: inside the array, outside any string
        self.scanned += len(data)
        pos, chars, depth = sc.scan(data, 0)
        close = np.flatnonzero(depth == self.ed - 1)
        limit = int(close[0]) if close.size else len(pos)
        ends = np.flatnonzero((chars[:limit] == 125) & (depth[:limit] == self.ed))
        if close.size:
            self.decode([data[: int(pos[close[0]])]], False)
            self.closed = True
            self.tail = data[int(pos[close[0]]) + 1:]
            self.rest = b""
            return
        if ends.size:
            cut = int(pos[ends[-1]]) + 1
            self.decode([data[:cut]], False)
            self.rest = data[cut:].lstrip(b", \t\r\n")
        else:
            if len(data) > MAX_EVENT_BYTES:
                raise InputError(path, f"an event larger than {MAX_EVENT_BYTES >> 20} MiB; the file is corrupt")
            # no event ends here: hold the bytes and go on scanning from this state, block by block
            self.rest = b""
            self.long, self.long_sc, self.long_bytes = [data], sc, len(data)

    def finish(self, path) -> None:
        """At end of input: decode what is complete in the remainder (a cut-off file ends mid-array)."""
        if self.long:
            data = b"".join(self.long)  # a file cut off inside a long event: nothing more is complete
            self.long, self.long_sc, self.long_bytes = [], None, 0
            if not self.closed and data.strip():
                self.rest = data
                return
        if not self.closed and self.rest.strip():
            self._scan(self.rest, path)
            if self.long:  # the remainder holds no complete event: it stays the (incomplete) rest
                self.rest = b"".join(self.long)
                self.long, self.long_sc, self.long_bytes = [], None, 0


def _parse_blocks(path, blocks, state, info: TraceFile, out_dir, key, chunk_rows, part=None, hold_rows=0):
    """Parse one file's (or part's) blocks of bytes into the tables; fill ``info``.

    Returns the IPC stream files (table name -> path) when ``out_dir`` is given, else the tables (see
    :class:`_TableSink` for ``hold_rows``). ``part`` is ``(starts at an event, ends before one)`` for a part of a
    split file (see :func:`parse_trace`).
    """
    cols = _Columns()
    sink = _TableSink(out_dir, key, hold_rows)
    decode = _RunDecoder(info, cols, sink, chunk_rows)
    mid_start, cut_end = part or (False, False)
    try:
        stream = _read_events(path, blocks, info, decode, mid_start)
    except InputError:
        sink.close()
        raise
    _check_end(path, state, stream, info, decode.n_events, sink, cut_end, part)
    cols.convert()  # the last batch, so that its dropped events are counted below
    _note_dropped(info, cols)
    info.scanned_bytes = stream.scanned
    _finish_header(info, cols.span_us)
    decode.flush(final=True)
    sink.close()
    info.counts = sink.counts
    return sink.result()


class _TableSink:
    """Where a parse's rows go: one Arrow IPC stream per table that has rows in ``out_dir``
    (``{key}.{table}.arrow``, written chunk by chunk), or, without ``out_dir``, tables kept in memory. Counts the
    rows per table.

    ``hold_rows``: with ``out_dir``, a file of up to this many rows is kept in memory and comes back as tables (of
    its tables with rows), which the caller writes into a stream shared by many small files; a bigger one goes to
    its own streams from the chunk that passes the bound on, its memory bounded as without it."""

    def __init__(self, out_dir, key: str, hold_rows: int = 0) -> None:
        self.out_dir, self.key, self.hold_rows = out_dir, key, hold_rows
        self.held = 0  # rows kept in memory while under hold_rows
        self.writers: dict[str, pa.ipc.RecordBatchStreamWriter] = {}  # table name -> IPC stream in out_dir
        self.files: dict[str, str] = {}
        self.mem: dict[str, list[pa.Table]] = {n: [] for n in TABLES}
        self.counts: dict[str, int] = dict.fromkeys(TABLES, 0)

    def write(self, tables: dict[str, pa.Table]) -> None:
        if self.held >= 0 and self.out_dir is not None:  # still holding (or never did, hold_rows 0)
            self.held += sum(t.num_rows for t in tables.values())
            if self.held <= self.hold_rows:
                for name, tbl in tables.items():
                    self.counts[name] += tbl.num_rows
                    self.mem[name].append(tbl)
                return
            held, self.held = self.mem, -1  # over the bound: what was held goes to the streams first
            self.mem = {n: [] for n in TABLES}
            for name, ts in held.items():
                for tbl in ts:
                    self.counts[name] -= tbl.num_rows
                    self.write({name: tbl})
        for name, tbl in tables.items():
            self.counts[name] += tbl.num_rows
            if self.out_dir is None:
                self.mem[name].append(tbl)
                continue
            if not tbl.num_rows:  # no stream for a table without rows (most files hold no collectives or syncs)
                continue
            w = self.writers.get(name)
            if w is None:
                f = str(Path(self.out_dir) / f"{self.key}.{name}.arrow")
                w = self.writers[name] = pa.ipc.new_stream(f, TABLES[name])
                self.files[name] = f
            # one record batch a write, not one per 4,096-event convert (a few hundred rows of a table each): the
            # loading process's insert pays per batch (~0.3 ms each, ~15 % of a 47 MB rank's insert)
            w.write_table(tbl.combine_chunks())

    def close(self) -> None:
        for w in self.writers.values():
            w.close()

    def result(self) -> dict[str, str] | dict[str, pa.Table]:
        if self.out_dir is not None and self.held > 0:  # held in memory (hold_rows): the tables with rows
            return {n: pa.concat_tables(ts) for n, ts in self.mem.items() if any(t.num_rows for t in ts)}
        if self.out_dir is not None:
            return self.files
        return {n: pa.concat_tables(ts) if ts else TABLES[n].empty_table() for n, ts in self.mem.items()}


class _RunDecoder:
    """Decodes runs of complete events (the ``decode`` of :class:`_EventStream`) into ``cols``, and writes the
    rows out every ``chunk_rows`` rows. Counts the events decoded."""

    def __init__(self, info: TraceFile, cols: _Columns, sink: _TableSink, chunk_rows: int) -> None:
        self.info, self.cols, self.sink, self.chunk_rows = info, cols, sink, chunk_rows
        self.n_events = 0

    def __call__(self, parts: list, strict: bool) -> bool:
        """Decode the concatenated ``parts`` as complete events. With ``strict``, a run that does not decode is
        refused (False: the cut was not between two events); without, its events are decoded one by one."""
        doc = b"".join([b"[", *parts, b"]"])  # the one copy of these bytes
        head = doc[1:65].lstrip()
        if head.startswith(b","):  # a run that starts after a comma: rare, copy again without it
            doc = b"[" + doc[1:].lstrip().lstrip(b",")
        elif head == b"]":
            return True
        body = memoryview(doc)[1:-1]
        typed = True
        try:
            events = _EVENTS.decode(doc)
        except (msgspec.ValidationError, RecursionError):  # odd types, a number out of range, deep nesting
            if strict:  # msgspec stops at the odd type, before it has seen the whole run: the cut is not proven
                return False
            events, typed = _decode_one_by_one(bytes(body), self.info), False  # keep what can be kept, one by one
        except _BAD_JSON:
            if strict:
                return False
            events, typed = _decode_one_by_one(bytes(body), self.info), False
        self.n_events += len(events)
        self.cols.add(events, typed)
        self.flush()
        return True

    def flush(self, final: bool = False) -> None:
        """Write the rows held out, once there are ``chunk_rows`` of them (all of them when ``final``)."""
        if not final and len(self.cols) < self.chunk_rows:
            return
        self.sink.write(self.cols.tables())


def _read_events(path, blocks, info: TraceFile, decode: _RunDecoder, mid_start: bool) -> _EventStream | None:
    """Read the blocks: the header until the events array opens (decoded into ``info.header``), then every event
    through an :class:`_EventStream`, which is returned (None when no events array was found).

    ``mid_start``: a later part of a split file, which starts at an event, inside the events array.

    Raises:
        InputError: not JSON, or JSON without a ``traceEvents`` array in its first :data:`MAX_EVENT_BYTES`.
    """
    stream = _EventStream(2, decode) if mid_start else None
    sc = _Scanner()
    buf = b""  # the header, until the events array opens
    first = True
    for blk in blocks:
        info.bytes_read += len(blk)
        if stream is not None:
            stream.feed(blk, path)
            continue
        if first:
            first = False
            if blk[:3] == b"\xef\xbb\xbf":
                blk = blk[3:]
            if blk.lstrip()[:1] not in (b"{", b"["):
                raise InputError(path, "not JSON (does not start with '{' or '[')")
        start = len(buf)
        buf += blk
        stream = _open_events(path, buf, start, sc, info, decode)
        if stream is not None:
            buf = b""  # the header is decoded: let its bytes go
    if stream is not None:
        stream.finish(path)
    return stream


def _open_events(path, buf: bytes, start: int, sc: _Scanner, info: TraceFile, decode: _RunDecoder
                 ) -> _EventStream | None:
    """Look for the opening of the events array in the header bytes read so far (``buf``, of which
    ``buf[start:]`` is new). When found, decode the header and return the event stream, fed with the bytes after
    the ``[``; else None (read on)."""
    key_at = _EVENTS_KEY_OPEN.search(buf)
    if key_at is not None and start == 0:
        # usual layout: the key comes early; scan only the header before it, not the whole block
        sc_head = _Scanner()
        hpos, hchars, hdepth = sc_head.scan(buf[: key_at.end()], 0)
        if hdepth.size and hdepth[-1] == 2 and hchars[-1] == 91 and not sc_head.in_string:
            sc.events_depth = 2
            info.header = _decode_header(path, buf[: int(hpos[-1])])
            stream = _EventStream(2, decode)
            stream.feed(buf[key_at.end():], path)
            return stream
    pos, chars, depth = sc.scan(buf, start)
    opened = _find_events_array(buf, pos, chars, depth) if pos.size else None
    if opened is None:
        if sc.depth <= 0 and (depth <= 0).any():
            raise InputError(path, "valid JSON but not a trace (no traceEvents array)")
        if len(buf) > MAX_EVENT_BYTES:
            raise InputError(path, f"no traceEvents array in the first {MAX_EVENT_BYTES >> 20} MiB")
        return None
    idx, sc.events_depth = opened
    info.header = _decode_header(path, buf[: pos[idx]])
    stream = _EventStream(sc.events_depth, decode)
    stream.feed(buf[int(pos[idx]) + 1:], path)
    return stream


def _check_end(path, state: dict, stream: _EventStream | None, info: TraceFile, n_events: int, sink: _TableSink,
               cut_end: bool, part) -> None:
    """How the input ended: a read error or no events array is an :class:`InputError` (the file fails); an early
    end after some events makes it partial, with a warning; the keys after the events array join the header."""
    if state["error"]:
        if stream is None or n_events == 0 or state.get("over_bound"):  # over the bound: no half-read trace
            sink.close()
            raise InputError(path, state["error"])
        info.partial = True
        info.warnings.append(f"{state['error']}; read {n_events} events before it")
    if state.get("trailing"):
        info.warnings.append("bytes after the end of the gzip data are not gzip; ignored")
    if stream is None:
        if state["truncated"]:
            raise InputError(path, "gzip stream ends before any event (truncated)")
        if info.bytes_read == 0:
            raise InputError(path, "empty file")
        raise InputError(path, "no traceEvents array (not a Kineto/Chrome trace)")
    if cut_end:
        # this part ends where the next begins: exactly between two events, or the split point was inside an
        # event (an array of objects in its args) and the next part started from a wrong state. Part 0 starts
        # from the file's true start, so by induction all parts ending cleanly proves the split exact.
        if stream is None or stream.closed or stream.rest.strip(b", \t\r\n"):
            info.split_ok = False
    elif not stream.closed and not state["error"]:
        info.partial = True
        why = "gzip stream ends early" if state["truncated"] else "JSON ends mid-array"
        info.warnings.append(f"truncated ({why}, as when a job is killed mid-write); "
                             f"read {n_events} complete events")
    elif stream.tail.strip() and stream.ed == 2:
        _merge_tail(path, stream.tail, info)
    if n_events == 0 and not info.partial and part is None:
        info.warnings.append("the trace holds no events")


def _note_dropped(info: TraceFile, cols: _Columns) -> None:
    """The events dropped while decoding and converting: counted in ``info.skipped_events``, one warning per
    reason and file (not per chunk)."""
    if cols.out_of_range:  # one count for the class, whichever decoder met the number
        info.skipped_events += cols.out_of_range
        info.dropped["out_of_range"] = info.dropped.get("out_of_range", 0) + cols.out_of_range
    for why, n in info.dropped.items():  # one line per reason and file, not per chunk
        info.warnings.append(_DROPPED[why].format(n=n, s="s" if n != 1 else ""))
    if cols.bad_time:
        info.skipped_events += cols.bad_time
        info.warnings.append(f"{cols.bad_time} events skipped: missing, non-numeric, NaN or out-of-range ts/dur")
    for n, what in ((cols.negative_dur, "a negative duration"), (cols.negative_ts, "a negative timestamp")):
        if n:
            info.skipped_events += n
            info.warnings.append(f"{n} event{'s' if n != 1 else ''} with {what} dropped")
    if cols.memory_dropped:
        info.skipped_events += cols.memory_dropped
        info.warnings.append(f"{cols.memory_dropped} [memory] events dropped: a missing or out-of-range ts or Bytes")
    if cols.too_long:
        info.skipped_events += cols.too_long
        info.warnings.append(f"{cols.too_long} events longer than 1 day dropped (a known CUPTI timestamp fault: "
                             "an end time never recorded)")


def _finish_header(info: TraceFile, span_us: float | None) -> None:
    """The header as stored: the recording's span under :data:`SPAN_KEY` (only ours: a file cannot set it),
    secrets redacted, and ``info.base_time_ns`` read from it."""
    info.header.pop(SPAN_KEY, None)  # only ours: a file cannot set it
    if span_us is not None:  # kept with the header (stored as is): checks.drop_impossible_durations reads it
        info.header[SPAN_KEY] = span_us
    info.header = _redact(info.header)  # before anything is stored (README, Safety: no secrets in reports)
    info.base_time_ns = header_base_ns(info.header)


def _find_events_array(buf: bytes, pos, chars, depth) -> tuple[int, int] | None:
    """Index (into pos) of the ``[`` that opens the events array, and the depth of the events inside it."""
    if chars.size and chars[0] == 91 and depth[0] == 1 and not buf[: pos[0]].strip():
        return 0, 1  # bare array form
    opens = np.flatnonzero((chars == 91) & (depth == 2))
    for i in opens:
        if _TRACE_EVENTS_KEY.search(buf[max(0, int(pos[i]) - 64): int(pos[i])]):
            # must be a key of the top-level object: depth before the '[' is 1
            return int(i), 2
    return None


def _decode_header(path: Path, header_bytes: bytes) -> dict:
    if not header_bytes.strip() or header_bytes.strip() == b"":
        return {}
    text = _TRACE_EVENTS_KEY.sub(b"", header_bytes).rstrip().rstrip(b",")
    try:
        h = _ANY.decode(text + b"}")
        return h if isinstance(h, dict) else {}
    except (*_BAD_JSON, RecursionError):  # a header nested beyond the decoder's bound is no header
        return {}


def _merge_tail(path: Path, tail: bytes, info: TraceFile) -> None:
    """Decode the keys after the events array (``baseTimeNanoseconds`` often lives there)."""
    text = tail.strip()
    if text.startswith(b","):
        text = text[1:]
    try:
        extra = _ANY.decode(b"{" + text)
    except (*_BAD_JSON, RecursionError):
        info.warnings.append("the header fields after traceEvents are damaged; ignored")
        return
    if isinstance(extra, dict):
        info.header.update(extra)


def _split_events(body: bytes) -> list[bytes]:
    """Cut ``{...},{...}`` into one byte string per top-level object (using the same scanner).

    Elements that are not objects (a bare ``5``) are left out; an object cut short at the end is kept, to fail
    its own decode.
    """
    sc = _Scanner()
    pos, chars, depth = sc.scan(body, 0)
    starts = pos[(depth == 1) & (chars == 123)].tolist()
    ends = pos[(depth == 0) & (chars == 125)].tolist()
    return [body[s: e + 1] for s, e in zip(starts, ends + [len(body) - 1] * (len(starts) - len(ends)), strict=True)]


def _decode_one_by_one(body: bytes, info: TraceFile) -> list[_Event]:
    """Slow path for a chunk with a malformed event: decode each event alone and skip the bad ones.

    An event with a wrong-typed ``args`` keeps its other fields; one that is not valid JSON (``NaN``, a cut
    string) or not an object is dropped and counted, and so, each with its own count, is one that holds a number
    out of range (``1e400``) or nests deeper than the decoder's bound (Python's recursion limit, about 1,000
    levels): one such event costs itself, never the file (README, Safety).
    """
    out: list[_Event] = []
    bad = deep = oob = 0
    for raw in _split_events(body):
        if b'"[memory]"' in raw:  # an allocator instant keeps its own args (the lenient _Event has none of them)
            try:
                out.append(_INSTANT.decode(raw))
                continue
            except (*_BAD_JSON, msgspec.ValidationError, RecursionError):
                pass  # decoded below, as any event
        try:
            out.append(_EVENT.decode(raw))
            continue
        except RecursionError:
            deep += 1
            continue
        except msgspec.ValidationError as exc:
            if "out of range" in str(exc):
                oob += 1
                continue
        except _BAD_JSON:
            bad += 1
            continue
        try:
            ev = _ANY.decode(raw)
        except RecursionError:
            deep += 1
            continue
        except _BAD_JSON as exc:
            if "out of range" in str(exc):
                oob += 1
            else:
                bad += 1
            continue
        if not isinstance(ev, dict):
            bad += 1
            continue
        args = ev.pop("args", None)
        if isinstance(args, dict):  # keep the event, drop only the malformed args
            ev["args"] = {k: v for k, v in args.items() if isinstance(v, (int, float, str))}
        try:
            out.append(_EVENT.decode(msgspec.json.encode(ev)))
        except (*_BAD_JSON, msgspec.ValidationError):
            bad += 1
    for why, n in (("malformed", bad), ("deep", deep), ("out_of_range", oob)):
        if n:
            info.skipped_events += n
            info.dropped[why] = info.dropped.get(why, 0) + n
    return out


_DROPPED = {"malformed": "{n} malformed events skipped",
            "deep": "{n} event{s} nested deeper than the JSON decoder's bound (about 1,000 levels) dropped",
            "out_of_range": "{n} event{s} holding a number out of range (an integer beyond 64 bits, a float "
                            "beyond float64 such as 1e400) dropped"}


__all__ = ["TraceFile", "parse_trace", "split_points", "inflate_parts", "TABLES"]
