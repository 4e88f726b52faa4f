"""Shared fixtures: locations of the real traces (vendored under tests/data/third_party, else in ../shared, skipped
when absent) and the committed samples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REAL = SHARED / "traces" / "real"
VENDORED = ROOT / "tests" / "data" / "third_party"  # small third-party real traces, same sub-paths as REAL
SAMPLES = ROOT / "sample_traces"


# The reason of a skip for a missing ../shared, counted in the run's summary. Counted from the skip reports, not in
# a module list: the tests import this file as ``tests.conftest`` while pytest loads it as ``conftest``, two
# module objects.
_SHARED_SKIP_NOTE = "(a fresh clone has no ../shared)"


def shared(rel: str) -> Path:
    """Path of a file or folder under ../shared (real traces, real logs).

    Where it is absent, the test is skipped in a user's clone (which has no ../shared) and counted in the
    summary; under CI (``CI`` set), which always has ../shared, the test fails with what is missing instead.
    """
    p = SHARED / rel
    if not p.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{p} is missing under CI: the H200 and real-log tests need ../shared beside the "
                        "checkout", pytrace=False)
        pytest.skip(f"{p} not present {_SHARED_SKIP_NOTE}")
    return p


def real(rel: str) -> Path:
    """Path of a real trace folder: the vendored copy under tests/data/third_party/<rel> (byte-identical, with its
    SOURCE.md and LICENSE) where there is one, else ../shared/traces/real/<rel> (:func:`shared`)."""
    p = VENDORED / rel
    if p.exists():
        return p
    return shared(f"traces/real/{rel}")


def pytest_terminal_summary(terminalreporter) -> None:
    """Say it when tests were skipped for a missing ../shared: what only ../shared holds was then not checked."""
    n = sum(_SHARED_SKIP_NOTE in str(getattr(r, "longrepr", "")) for r in terminalreporter.stats.get("skipped", []))
    if n:
        terminalreporter.write_line(f"{n} test(s) skipped: ../shared is absent, so the H200 traces, the real logs and "
                                    "kernel_names_observed.txt were not checked (clone shared/ beside the checkout)",
                                    yellow=True)


def sample(name: str) -> Path:
    """Path of a committed sample scenario; skips the test when it has not been generated."""
    p = SAMPLES / name
    if not (p / "scenario.json").exists():
        pytest.skip(f"sample scenario {name} not generated")
    return p
