"""Errors the tool reports to users as one line, never as a traceback.

Each carries the exit status of the command line (docs/options.md, Exit status): 1 for a problem with the inputs or the
analysis, 2 for a usage error, 3 when the environment refuses a write (disk full, permission, read-only folder),
4 when memory runs out.
"""

EXIT_OK = 0
EXIT_INPUT = 1  # nothing could be analyzed, an input is missing, the database is in use, a query failed
EXIT_USAGE = 2  # bad option or argument (click's own), an output that is an input, a database that is not ours
EXIT_WRITE = 3  # disk full, permission denied, read-only file system
EXIT_MEMORY = 4  # out of memory
EXIT_INTERNAL = 5  # a bug: rerun with --debug for the traceback
EXIT_INTERRUPTED = 130


class TraceanalyzeError(Exception):
    """Base of every error the tool reports as a one-line message."""

    exit_code = EXIT_INPUT


class InputError(TraceanalyzeError):
    """A file could not be read or is not what it claims; the message names the file and the problem."""

    def __init__(self, path, problem: str):
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)


class UsageError(TraceanalyzeError):
    """The command asks for something refused before any work: an output that is an input, two outputs on one
    path, a database that traceanalyze did not create or of the other role."""

    exit_code = EXIT_USAGE


class EnvironmentFailure(TraceanalyzeError):
    """The machine refused: a full disk, no permission, a read-only folder (exit 3) or no memory (exit 4).

    ``stage`` names what was being done; ``code`` is the ``errno`` when there is one.
    """

    def __init__(self, message: str, *, stage: str | None = None, code: int | None = None,
                 memory: bool = False) -> None:
        self.stage = stage
        self.code = code
        self.exit_code = EXIT_MEMORY if memory else EXIT_WRITE
        super().__init__(message)


def one_line(exc: BaseException) -> str:
    """An exception as one line for a catalog row or a result: a :class:`TraceanalyzeError`'s own first line, any
    other exception's type and first line (``OSError: ...``)."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return msg if isinstance(exc, TraceanalyzeError) else f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
