"""Errors the tool reports to users as one line, never as a traceback."""


class TraceanalyzeError(Exception):
    """Base of every error the tool reports as a one-line message."""


class InputError(TraceanalyzeError):
    """A file could not be read or is not what it claims; the message names the file and the problem."""

    def __init__(self, path, problem: str):
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)
