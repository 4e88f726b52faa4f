"""What one pass over a text log has gathered so far, shared by every line family of :mod:`.text`.

The result being built (steps, facts, warnings), how many lines pointed to each framework (``evidence``: the
framework of the file is the one most lines point to), the ranks named by ``[rankN]:`` prefixes, and the facts
already stated: each key and value is kept once, at its first line.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from traceanalyze.logs.model import Fact, LogResult, number_text
from traceanalyze.names import rank_from_name


class LogState:
    """State of one pass over a text log; see :func:`traceanalyze.logs.parse_text_log`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        self.file_rank = rank_from_name(path)
        self.result = LogResult(path=str(path))
        self.evidence: Counter[str] = Counter()
        self.prefix_ranks: set[int] = set()
        self._fact_seen: set[tuple[str, str]] = set()

    def fact(self, key: str, value: Any, lineno: int | None, num: float | None = None) -> None:
        """State a fact from line ``lineno`` (a number's text is :func:`number_text`), unless already known."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            num = float(value)
            value = number_text(num)
        value = str(value)
        if (key, value) in self._fact_seen:
            return
        self._fact_seen.add((key, value))
        src = f"{self.name}:{lineno}" if lineno else self.name
        self.result.facts.append(Fact(key, value, num, src))

    def add_fact(self, f: Fact) -> None:
        """Append a ready-made fact unless the same key and value are already known."""
        if (f.key, f.value) not in self._fact_seen:
            self._fact_seen.add((f.key, f.value))
            self.result.facts.append(f)

    def has_fact(self, key: str) -> bool:
        """Whether any value is known for ``key``."""
        return any(k == key for k, _ in self._fact_seen)
