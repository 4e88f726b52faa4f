"""Shared fixtures: locations of the real traces in ../shared (skipped when absent) and the committed samples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REAL = SHARED / "traces" / "real"
SAMPLES = ROOT / "sample_traces"


_SHARED_SKIPS: list[str] = []  # tests skipped for a missing ../shared, named in the run's summary


def shared(rel: str) -> Path:
    """Path of a file or folder under ../shared (real traces, real logs).

    Where it is absent, the test is skipped in a user's clone (which has no ../shared) and counted in the
    summary; under CI (``CI`` set), which always has ../shared, the test fails with what is missing instead.
    """
    p = SHARED / rel
    if not p.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{p} is missing under CI: the HTA-agreement and real-log tests need ../shared beside the "
                        "checkout", pytrace=False)
        _SHARED_SKIPS.append(rel)
        pytest.skip(f"{p} not present (a fresh clone has no ../shared)")
    return p


def real(rel: str) -> Path:
    """Path of a real trace folder under ../shared/traces/real (:func:`shared`)."""
    return shared(f"traces/real/{rel}")


def pytest_terminal_summary(terminalreporter) -> None:
    """Say it when tests were skipped for a missing ../shared: the HTA agreement was then not checked."""
    if _SHARED_SKIPS:
        terminalreporter.write_line(f"{len(_SHARED_SKIPS)} test(s) skipped: ../shared is absent, so the agreement "
                                    "with HTA and the real-log checks did not run (clone shared/ beside the checkout)",
                                    yellow=True)


def sample(name: str) -> Path:
    """Path of a committed sample scenario; skips the test when it has not been generated."""
    p = SAMPLES / name
    if not (p / "scenario.json").exists():
        pytest.skip(f"sample scenario {name} not generated")
    return p
