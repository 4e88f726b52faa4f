"""``benchmarks/bench.py --fixed-cost``'s floor: the third-party modules a cold report imports, those its process holds
at its end beyond a bare interpreter's (issue 38: what of the fixed cost traceanalyze's own code cannot take off); and
the CPUs the scale guard's cores-busy column is read against."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench  # noqa: E402


def test_the_fixed_costs_floor_is_the_reports_own_third_party_imports(tmp_path):
    db = tmp_path / "r.duckdb"
    cmd = bench.traceanalyze_cmd(ROOT / "sample_traces" / "straggler", tmp_path / "r.html", db)
    deps = bench.dependency_modules(cmd, db)
    roots = {m.split(".")[0] for m in deps}
    # the store, the arrays, the parse and the command line: each a dependency every cold report imports
    assert {"duckdb", "numpy", "pyarrow", "msgspec", "click", "jinja2"} <= roots
    assert not roots & {"traceanalyze", "json", "os", "re"}  # neither the project nor the standard library
    assert "pandas" not in roots  # the command line blocks it (pyarrow would import it on its first array)
    assert len(deps) == len(set(deps)) > 50  # each module once, submodules included
    # the list imports alone, in a fresh interpreter, without traceanalyze
    code = bench.IMPORT_ALL + "\nprint(sorted({m.split('.')[0] for m in sys.modules} & {'duckdb', 'traceanalyze'}))"
    out = subprocess.run([sys.executable, "-c", code, *deps], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['duckdb']"


def test_the_scale_guards_cores_are_those_this_process_may_run_on():
    n = bench.usable_cpus()
    assert 1 <= n <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert n == len(os.sched_getaffinity(0))
