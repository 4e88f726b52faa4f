"""Shared fixtures: locations of the real traces in ../shared (skipped when absent) and the committed samples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REAL = SHARED / "traces" / "real"
SAMPLES = ROOT / "sample_traces"


def real(rel: str) -> Path:
    """Path of a real trace folder under ../shared/traces/real; skips the test when it is absent."""
    p = REAL / rel
    if not p.exists():
        if os.environ.get("CI"):  # CI has ../shared: a missing folder there is a failure, not a skip
            pytest.fail(f"{p} not present under CI")
        pytest.skip(f"{p} not present (a fresh clone has no ../shared)")
    return p


def sample(name: str) -> Path:
    """Path of a committed sample scenario; skips the test when it has not been generated."""
    p = SAMPLES / name
    if not (p / "scenario.json").exists():
        pytest.skip(f"sample scenario {name} not generated")
    return p
