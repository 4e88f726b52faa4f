"""The bounded readers every log parser reads through (docs/safety.md: every file is size-bounded).

What a log, config, env, NCCL or topology file (or its .gz) may inflate to is bounded like a trace
(``--max-decompressed``, default :data:`DEFAULT_MAX_BYTES`); a file read whole (config, env, trainer_state.json) at
most :data:`MAX_WHOLE_FILE_BYTES`, and a line at most :data:`MAX_LINE_BYTES` (the rest of a longer line is skipped,
counted). Text is decoded as UTF-8 with ``errors="replace"``; :func:`iter_lines` strips ``\\r`` (tqdm redraws),
ANSI colour codes and tqdm progress bars, and streams, so memory is bounded by what the parser keeps, not by the
file. A file that cannot be read, or is over its bound, raises :class:`~traceanalyze.errors.InputError`.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from traceanalyze.errors import InputError
from traceanalyze.limits import DEFAULT_MAX_DECOMPRESSED, MAX_LINE_BYTES, MAX_WHOLE_FILE_BYTES

DEFAULT_MAX_BYTES = DEFAULT_MAX_DECOMPRESSED  # what a log may inflate to: as a trace

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_TQDM_RE = re.compile(r"\s*\d{1,3}%\|[^|]*\|\s*\d+/\d+\s*\[[^\]]*\]")


def open_binary(path: Path):
    """Open a file for binary reading, transparently gunzipping ``*.gz``; raise InputError when unreadable."""
    try:
        if path.is_dir():
            raise InputError(path, "is a folder, not a file")
        with open(path, "rb") as probe:
            magic = probe.read(2)
        return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")
    except InputError:
        raise
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None


def _over_bound(path: Path, bound: int, gz: bool, option: bool = True) -> InputError:
    what = (f"decompresses to more than {_size_text(bound)} (a gzip bomb?)" if gz
            else f"larger than {_size_text(bound)}")
    return InputError(path, f"{what}; not read" + ("; raise --max-decompressed if this is a real file" if option else
                                                   ": too big for a file that is read whole"))


def _size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def _is_gzip(fh) -> bool:
    return isinstance(fh, gzip.GzipFile)


def read_text(path: Path, max_bytes: int | None = None) -> str:
    """Whole file as text (configs and other small files), at most ``min(max_bytes, MAX_WHOLE_FILE_BYTES)``
    decompressed bytes; raise InputError when unreadable or larger (a gzip bomb is never inflated in full)."""
    bound = min(max_bytes or DEFAULT_MAX_BYTES, MAX_WHOLE_FILE_BYTES)
    fh = open_binary(path)
    try:
        with fh:
            data = fh.read(bound + 1)
            if len(data) > bound:
                raise _over_bound(path, bound, _is_gzip(fh), bound < MAX_WHOLE_FILE_BYTES)
            return data.decode("utf-8", errors="replace")
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(path, f"cannot read ({exc})") from None


def _lines(fh, path: Path, bound: int, long_lines: list[int]) -> Iterator[bytes]:
    """The file's lines, each at most :data:`MAX_LINE_BYTES` (the rest of a longer one is skipped and its number
    appended to ``long_lines``); raise InputError past ``bound`` decompressed bytes."""
    total = 0
    n = 0
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        n += 1
        total += len(raw)
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            long_lines.append(n)
            while True:  # skip to the end of the line, a bounded block at a time
                rest = fh.readline(MAX_LINE_BYTES)
                total += len(rest)
                if total > bound:
                    raise _over_bound(path, bound, _is_gzip(fh))
                if not rest or rest.endswith(b"\n"):
                    break
            raw = raw[:MAX_LINE_BYTES]
        if total > bound:
            raise _over_bound(path, bound, _is_gzip(fh))
        yield raw


def iter_lines(path: Path, warnings: list[str], max_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, cleaned text)`` per physical line, split further at ``\\r`` (tqdm redraws);
    ANSI codes and tqdm bars removed. A truncated gzip ends the stream with a warning. A line longer than
    :data:`MAX_LINE_BYTES` is cut there (one warning counts them); past ``max_bytes`` decompressed bytes (default
    :data:`DEFAULT_MAX_BYTES`) the file raises InputError."""
    fh = open_binary(path)
    long_lines: list[int] = []
    with fh:
        lineno = 0
        try:
            for raw in _lines(fh, path, max_bytes or DEFAULT_MAX_BYTES, long_lines):
                lineno += 1
                text = raw.decode("utf-8", errors="replace").rstrip("\n")
                if "\x1b" in text:
                    text = _ANSI_RE.sub("", text)
                for seg in text.split("\r") if "\r" in text else (text,):
                    if "%|" in seg:
                        seg = _TQDM_RE.sub("", seg)
                    if seg.strip():
                        yield lineno, seg
        except (OSError, EOFError, zlib.error) as exc:
            warnings.append(f"{path.name}: stopped reading at line {lineno}: {exc}")
    if long_lines:
        warnings.append(f"{path.name}: {len(long_lines):,} line{'s' if len(long_lines) != 1 else ''} longer than "
                        f"{_size_text(MAX_LINE_BYTES)} cut there (first: line {long_lines[0]:,})")
