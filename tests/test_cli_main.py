"""``python -m traceanalyze`` is the same command line as the ``traceanalyze`` console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_python_m_traceanalyze_help_lists_the_commands():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "traceanalyze", "--help"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Usage: traceanalyze ")  # the console script's name, not __main__.py
    for command in ("report", "export", "sql", "batch"):
        assert f"  {command} " in r.stdout
