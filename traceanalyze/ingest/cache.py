"""The parse cache: a file is parsed again only when its resolved path, size, mtime or content fingerprint
(:func:`fingerprint`) differ from its ``files`` row (:func:`cached_files`); rows of files no longer among the inputs
are deleted (:func:`forget_files`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from traceanalyze import store

if TYPE_CHECKING:
    from traceanalyze.ingest.parse import TraceFile

CacheKey = tuple[str, int, int]  # a file's cache key: resolved path, size, mtime (ns)


@dataclass
class LoadedFile:
    """One trace file's place in the store after :func:`load_traces`."""

    path: Path
    file_id: int | None
    cached: bool
    info: TraceFile | None
    error: str | None


def stat_key(path: Path) -> CacheKey:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


FINGERPRINT_BLOCK = 64 << 10  # bytes hashed at each end of a file
FINGERPRINT_WHOLE = 1 << 20  # files up to this size are hashed whole


def file_identity(path: Path) -> tuple[CacheKey, str]:
    """A file's parse-cache key (resolved path, size in bytes, mtime in ns) and :func:`fingerprint` (SHA-256 hex),
    read once per run: the report's cache key and the load both use them (1,024 ranks: 0.15 s of reading and
    hashing done twice before). Raises OSError when the file cannot be read."""
    return stat_key(path), fingerprint(path)


def fingerprint(path: Path) -> str:
    """A content fingerprint of one file: SHA-256 over its size, mtime (ns) and bytes: the whole file up to
    :data:`FINGERPRINT_WHOLE`, else its first and last :data:`FINGERPRINT_BLOCK` (64 KiB each). A file rewritten
    with the same size and mtime restored (``cp -p``, ``touch -r``, a clock step) still differs at either end: a
    trace's header and its final events and metadata. Raises OSError when the file cannot be read."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        h.update(f"{st.st_size} {st.st_mtime_ns}|".encode())
        if st.st_size <= FINGERPRINT_WHOLE:  # read(size + 1), not read(WHOLE + 1): that allocates 1 MiB per file
            h.update(fh.read(st.st_size + 1))
        else:
            h.update(fh.read(FINGERPRINT_BLOCK))
            fh.seek(-FINGERPRINT_BLOCK, os.SEEK_END)
            h.update(fh.read(FINGERPRINT_BLOCK))
    return h.hexdigest()


def forget_files(con: duckdb.DuckDBPyConnection, keep: Iterable[Path]) -> int:
    """Delete the ``files`` rows, and their events, of every file that is not in ``keep`` (the trace files of
    this report): files that left the folder (or another folder's, in a shared ``--db``) are never reused, and
    their rows no longer travel with the database. Returns the number of files forgotten."""
    kept = []
    for p in keep:
        try:
            kept.append(str(Path(p).resolve()))
        except OSError:
            continue
    gone = [r[0] for r in con.execute("SELECT file_id FROM files WHERE path NOT IN (SELECT unnest(?::VARCHAR[]))",
                                      [kept]).fetchall()]
    if gone:
        con.execute("BEGIN TRANSACTION")
        try:
            for t in (*store.EVENT_TABLES, "files"):
                con.execute(f"DELETE FROM {t} WHERE file_id IN (SELECT unnest(?::INTEGER[]))", [gone])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return len(gone)


def cached_files(con: duckdb.DuckDBPyConnection, paths: list[Path], progress: Callable[[int], None] | None,
                  known: dict[Path, tuple[CacheKey, str]] | None = None,
                  ) -> tuple[dict[Path, LoadedFile], list[tuple[Path, CacheKey]], dict[str, str], dict[Path, Path]]:
    """Look every path up in the parse cache. ``known``: the cache key and fingerprint of paths already read in
    this run (:func:`file_identity`), taken as they are instead of reading the files again.

    Returns ``(done, todo, prints, alias)``: the files that need no parse (cached, or unreadable: an error), the
    ``(path, key)`` of those to parse, each resolved path's content fingerprint (stored once the file is loaded),
    and the paths that name a file given already under another name (a link: parsed and stored once).
    """
    done: dict[Path, LoadedFile] = {}
    todo: list[tuple[Path, CacheKey]] = []
    prints: dict[str, str] = {}  # resolved path -> content fingerprint, stored once the file is loaded
    first: dict[str, Path] = {}  # resolved path -> the first of the given paths that names it
    alias: dict[Path, Path] = {}
    # every stored file at once: a query per path was 0.6 s of main-process time at 1,024 ranks
    stored = {(path, size, mtime, fp): (file_id, status) for path, size, mtime, fp, file_id, status in con.execute(
        "SELECT path, size_bytes, mtime_ns, fingerprint, file_id, status FROM files").fetchall()}
    for p in paths:
        try:
            key, prints_p = (known or {}).get(p) or (stat_key(p), fingerprint(p))
            prints[key[0]] = prints_p
        except OSError as exc:
            done[p] = LoadedFile(p, None, False, None, f"cannot read ({exc.strerror or exc})")
            continue
        if first.setdefault(key[0], p) != p:  # one file under two names (a link): parsed and stored once
            alias[p] = first[key[0]]
            continue
        row = stored.get((*key, prints[key[0]]))
        if row is not None and row[1] in ("ok", "partial"):
            done[p] = LoadedFile(p, row[0], True, None, None)
            if progress:
                progress(key[1])
        else:
            todo.append((p, key))
    return done, todo, prints, alias
