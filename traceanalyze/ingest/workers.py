"""Parse workers: the tasks that parse trace files (:mod:`.parse`) for :mod:`.load`, in worker processes, on an
executor (Dask) or in the loading process, each writing its rows to Arrow IPC streams that the loader reads.

A task is one file or byte range (:func:`parse_one`) or several small whole files (:func:`parse_group`).
:mod:`.parse` (NumPy, PyArrow, msgspec) is imported only inside the tasks.
"""

from __future__ import annotations

import gc
import importlib.abc
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from traceanalyze.errors import InputError
from traceanalyze.executors import keep_freed_blocks

if TYPE_CHECKING:
    from traceanalyze.ingest.parse import TraceFile

WORKER_CHUNK_ROWS = 1 << 15  # rows a parse worker holds before writing them out (one record batch a table)
GROUP_HOLD_ROWS = 1 << 16  # a file of a group with more rows than this writes streams of its own (memory bound)

class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pandas":
            raise ImportError("pandas is not imported by the traceanalyze command line")
        return None


def block_pandas() -> None:
    """Make ``import pandas`` fail in this process unless it is already imported.

    pyarrow imports pandas, when installed, on its first array conversion: 0.2 s and ~50 MB in the main process
    and in each parse worker. The command line never builds a DataFrame, so it calls this first; the Python
    API does not (users' pandas must keep working).
    """
    if "pandas" not in sys.modules and not pandas_blocked():
        sys.meta_path.insert(0, _NoPandas())


def pandas_blocked() -> bool:
    return any(isinstance(f, _NoPandas) for f in sys.meta_path)


def worker_init(no_pandas: bool, keep_heap: bool = False) -> None:
    """A parse process's set-up: ``import pandas`` blocked as in the parent (``no_pandas``), Arrow on the system
    allocator, and, with ``keep_heap`` (a load of small files only), the heap's freed pages kept for the next file
    (:func:`traceanalyze.executors.keep_freed_blocks`)."""
    if no_pandas:  # as in the parent; matters where workers start fresh (spawn, forkserver) instead of forking
        block_pandas()
    import pyarrow as pa

    # mimalloc (pyarrow's default) keeps what a parse freed: ~35 MB more per worker, for no speed we can measure
    pa.set_memory_pool(pa.system_memory_pool())
    if keep_heap:  # not for a big file's parts (128 MB ranges): a 570 MB trace's largest process +20-40 MB max RSS
        keep_freed_blocks()  # the C heap (Arrow's columns too) reused file after file, not faulted in again


def parse_one(args: tuple) -> tuple[str, TraceFile | None, dict | None, str | None]:
    """Parse one file or one byte range of it, in a worker or here; return (path, summary, tables, error).

    ``tables`` maps table name to an Arrow IPC stream in ``out_dir``, written chunk by chunk, which DuckDB then
    reads a chunk at a time: memory bounded on both sides whatever the file's size, and cheaper than pickling
    the columns through a pipe. In this process too (one file, ``-j 1``) it is ~40 MB less than building the
    file's tables in memory, at the same speed.
    """
    return parse_held(args, 0)


def parse_held(args: tuple, hold_rows: int) -> tuple[str, TraceFile | None, dict | None, str | None]:
    """:func:`parse_one`, a file of up to ``hold_rows`` rows coming back as tables (see :func:`parse_group`)."""
    from traceanalyze.ingest import parse  # NumPy, PyArrow, msgspec: only where files are parsed

    path, out_dir, key, max_decompressed, byte_range = args[:5]
    part = args[5] if len(args) > 5 else None  # a part file inflated from a .gz (see _work_items)
    gc.disable()  # millions of short-lived objects; collection passes only cost time here
    try:
        info, tables = parse.parse_trace(path, out_dir, key=key, max_decompressed=max_decompressed,
                                         byte_range=byte_range, chunk_rows=WORKER_CHUNK_ROWS, part=part,
                                         hold_rows=hold_rows)
        return path, info, tables, None
    except InputError as exc:
        return path, None, None, exc.problem
    except MemoryError:
        return path, None, None, "ran out of memory while parsing"
    except Exception as exc:  # a bug or an unforeseen input must not stop the other ranks
        return path, None, None, f"could not be parsed ({type(exc).__name__}: {exc})"
    finally:
        gc.enable()


class GroupShare(dict):
    """A file's tables in the streams of its group (table name -> stream file), and ``rows``: its rows in each
    (table name -> rows), which it holds one after the other file's there (see :func:`parse_group`)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, int] = {}


def parse_group(args: tuple) -> list[tuple]:
    """Parse several small whole files in one task: ``(paths, out_dir, key, max_decompressed)`` -> one
    :func:`parse_one` result per file, in order.

    A pool task and an IPC stream per file and table cost ~1 ms of CPU in this process and the loading one: more
    than parsing a rank of a few thousand rows. A file of up to :data:`GROUP_HOLD_ROWS` rows is parsed in memory
    and, once parsed whole, its tables are appended to the group's one stream per table (``tables`` is then a
    :class:`GroupShare`): a file that fails writes nothing there. A bigger one keeps streams of its own.
    """
    import pyarrow as pa

    from traceanalyze.ingest import parse

    paths, out_dir, key, max_decompressed = args
    out: list[tuple] = []
    writers: dict[str, pa.ipc.RecordBatchStreamWriter] = {}
    share: dict[str, str] = {}
    try:
        for j, path in enumerate(paths):
            path, info, tables, err = parse_held((path, out_dir, f"{key}f{j}", max_decompressed, None),
                                                  GROUP_HOLD_ROWS)
            if tables and not isinstance(next(iter(tables.values())), str):  # held: into the shared streams
                mine = GroupShare()
                for t, tbl in tables.items():
                    if t not in writers:
                        share[t] = str(Path(out_dir) / f"{key}.{t}.arrow")
                        writers[t] = pa.ipc.new_stream(share[t], parse.TABLES[t])
                    # one batch a file (no batch holds rows of two files): DuckDB's insert pays per batch
                    writers[t].write_table(tbl.combine_chunks())
                    mine[t], mine.rows[t] = share[t], tbl.num_rows
                tables = mine
            out.append((path, info, tables, err))
    finally:
        for w in writers.values():
            w.close()
    return out


def parse_task(task: tuple[int, tuple]) -> tuple | list[tuple]:
    """:func:`parse_one` (or :func:`parse_group`) of an ``(index, task)`` pair, for executors that return
    results as they finish."""
    return parse_group(task[1]) if is_group(task[1]) else parse_one(task[1])


def is_group(task: tuple) -> bool:
    return isinstance(task[0], list)


def in_order(results):
    """``(task, result, error)`` of ``(index, task)`` pairs as an executor finishes them -> the results in task
    order, so that the parts of a file arrive together; only results that wait for an earlier one are held."""
    held: dict[int, tuple | list[tuple]] = {}
    nxt = 0
    for task, res, err in results:
        if res is None:
            paths = task[1][0] if is_group(task[1]) else [task[1][0]]
            fail = [(p, None, None, f"could not be parsed ({err})") for p in paths]
            res = fail if is_group(task[1]) else fail[0]
        held[task[0]] = res
        while nxt in held:
            yield held.pop(nxt)
            nxt += 1
