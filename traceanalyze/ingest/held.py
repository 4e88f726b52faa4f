"""The parsed rows a load holds for its next ``INSERT``, per table, read a chunk at a time from the parsers' Arrow IPC
streams (:class:`HeldRows`, used by :mod:`.load`).

Each ``INSERT`` costs DuckDB ~2-4 ms whatever its rows (256 ranks: 8 of 832 ``threads`` rows each, 16 ms). So
while the parse goes on, the load inserts a table's held rows only once they fill a row group, and keeps a table
with fewer for a later ``INSERT`` of the transaction, or its last one, which takes all. The rows and their order in
each table are the same.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator

from traceanalyze.ingest.workers import GroupShare

Item = tuple[int, int, dict, dict | None]  # (file_id, base_time_ns, table -> stream file, table -> rows or None)


class HeldRows:
    """The rows of one transaction's files not inserted yet, table by table, in file order.

    Each table's rows are read from its streams in order: a file's own stream, or the next
    :attr:`GroupShare.rows` rows of its group's stream (whose batches each hold one file's rows). A stream holds
    one table's rows; it is closed and deleted once its rows are read.
    """

    def __init__(self) -> None:
        self.queue: dict[str, deque[tuple[int, int, str, int | None]]] = {}  # table -> (fid, shift, stream, rows)
        self.refs: Counter[str] = Counter()  # stream -> files with rows of it still held
        self.held: Counter[str] = Counter()  # table -> rows held (as the parsers counted them)

    def add(self, items: list[Item]) -> None:
        """Hold the rows of ``items``: ``(file_id, base_time_ns, table -> stream, table -> rows)``."""
        for fid, shift, files, counts in items:
            for t, stream in files.items():
                want = files.rows[t] if isinstance(files, GroupShare) else None
                self.queue.setdefault(t, deque()).append((fid, shift, stream, want))
                self.refs[stream] += 1
                self.held[t] += (counts or {}).get(t, 0) if want is None else want

    def due(self, t: str, least: int) -> bool:
        """Table ``t`` has rows held, at least ``least`` of them: they go in the next ``INSERT``."""
        return bool(self.queue.get(t)) and self.held[t] >= least

    def empty(self) -> bool:
        """No rows are held."""
        return not self.refs

    def total(self) -> int:
        """The rows held, all tables (as the parsers counted them)."""
        return sum(self.held.values())

    def take(self, t: str) -> Iterator[tuple[int, int, object]]:
        """``(file_id, base_time_ns, record batch)`` of all the held rows of table ``t``, in order, read a chunk at a
        time; batches without rows are left out. Each stream is deleted once read."""
        import pyarrow as pa

        queue = self.queue.pop(t, deque())
        self.held.pop(t, None)
        readers: dict[str, tuple] = {}  # a group's stream -> (file, reader), open while its files are read
        try:
            for fid, shift, stream, want in queue:
                if stream not in readers:
                    fh = _open_stream(stream)
                    readers[stream] = (fh, pa.ipc.open_stream(fh))
                reader = readers[stream][1]
                while want is None or want > 0:
                    try:
                        b = reader.read_next_batch()
                    except StopIteration:
                        break
                    if b.num_rows:
                        if want is not None:
                            want -= b.num_rows
                        yield fid, shift, b
                self.refs[stream] -= 1
                if self.refs[stream] <= 0:
                    del self.refs[stream]
                    readers.pop(stream)[0].close()
                    _unlink(stream)
        finally:
            for fh, _ in readers.values():
                fh.close()

    def close(self) -> None:
        """Drop what is held: every held stream is deleted."""
        for stream in self.refs:
            _unlink(stream)
        self.__init__()


MAP_STREAM_MAX_BYTES = 32 << 20  # streams up to this size are read as memory maps (see _open_stream)


def _open_stream(path: str):
    """``path`` mapped into memory where a mapped file can be deleted while open (POSIX) and it is at most
    :data:`MAP_STREAM_MAX_BYTES`: the batches read are views of the page cache, not copies in fresh pages (the
    256-rank sweep set's streams: ~100k page faults fewer). A bigger stream (a part of a big file) is read as a
    file, a batch at a time: mapped, every page read stays mapped until the stream is closed (a 570 MB trace, its
    streams all mapped: the largest process's max RSS 494-522 MB, against 479-496 MB)."""
    import os

    import pyarrow as pa

    if os.name == "posix" and os.path.getsize(path) <= MAP_STREAM_MAX_BYTES:
        return pa.memory_map(path)
    return pa.OSFile(path)


def _unlink(path: str) -> None:
    import os

    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
