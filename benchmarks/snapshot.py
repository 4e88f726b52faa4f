#!/usr/bin/env python3
"""Snapshot every output of traceanalyze on every sample and real trace folder, and compare two snapshots.

    python benchmarks/snapshot.py take /tmp/snap-before          # on the old code
    python benchmarks/snapshot.py take /tmp/snap-after           # on the new code
    python benchmarks/snapshot.py compare /tmp/snap-before /tmp/snap-after

A refactor that must not change behaviour (issue 17) is proven with it: ``compare`` prints one line per output
that differs and exits 1 when any does. Each case writes the HTML report, the JSON, the Markdown and the
DuckDB database; the database is snapshotted as its schema (tables, columns, types) and every table's rows in
one total order (``ORDER BY ALL``), as text. The only field normalised is ``generated_at`` (the wall-clock
time of the run), in all three reports and the cached report model; the report cache's key (a hash of the
input paths) is left out. Every command runs with ``PYTHONHASHSEED=0``, since some orders follow Python's set
order. Every case runs on copies of the samples in a work folder (``--work``, default ``/tmp/ta-snap-0``),
whose path is replaced by ``<work>`` in every output; give two snapshots that run at once work folders of the
same length (``/tmp/ta-snap-1``, ``/tmp/ta-snap-2``), since names are cut to a width.

Cases:
- every ``sample_traces/<scenario>/`` folder, and the slow and fixed run of every ``sample_traces/pairs/<pair>/``;
- the comparisons of ``reports/render.py`` (``--baseline``);
- the generated GPU jobs of ``reports/render.py`` (2 of 8, 8 and 64 ranks, from ``tests/synth.py``);
- every folder of ``../shared/traces/real/<project>/<case>/`` where ``../shared`` is present;
- every side of the shared H200 pairs (``../shared/traces/gpu/h200/<pair>/<side>/``) and of our H100 pairs
  (``tests/data/gpu/h100/<pair>/<side>/``);
- the merged Perfetto trace of ``export`` for the straggler sample.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
REAL = ROOT.parent / "shared" / "traces" / "real"
H200 = ROOT.parent / "shared" / "traces" / "gpu" / "h200"  # the shared GPU pairs' sides
H100 = ROOT / "tests" / "data" / "gpu" / "h100"  # our own GPU pairs' sides
WORK = Path("/tmp/ta-snap-0")  # --work: the paths of the copied samples are replaced by <work> in every output
sys.path.insert(0, str(ROOT))
# this checkout's package, whatever is installed; one hash seed, since set order decides some output orders
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}

# generated_at as the JSON, the HTML subtitle/footer and the Markdown footer write it
# (the Markdown escapes its colons)
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d\\?:\d\d\\?:\d\d(?:[+-]\d\d\\?:\d\d|Z)")
# the report cache's key hashes the input paths, which hold the work folder
_HASHED_PATHS = {"report_cache": "key"}


def _norm(text: str) -> str:
    return text.replace(str(WORK), "<work>")


def cases() -> list[tuple[str, list[str]]]:
    """``(name, report arguments)`` of every case, in a fixed order (the samples copied into the work folder)."""
    global SAMPLES
    shutil.copytree(SAMPLES, WORK / "samples")
    SAMPLES = WORK / "samples"
    for f in SAMPLES.rglob("*"):  # one fixed mtime (a checkout's own differs): the files table holds it
        os.utime(f, (1_700_000_000, 1_700_000_000))
    out: list[tuple[str, list[str]]] = []
    for d in sorted(SAMPLES.iterdir()):
        if (d / "scenario.json").exists():
            out.append((d.name, [str(d)]))
    for pair in sorted((SAMPLES / "pairs").iterdir()) if (SAMPLES / "pairs").is_dir() else []:
        for side in ("slow", "fixed"):
            if (pair / side).is_dir():
                out.append((f"pair_{pair.name}_{side}", [str(pair / side)]))
    from reports.render import PAIRS

    for name, (subject, baseline) in PAIRS.items():
        out.append((name, [str(SAMPLES / subject), "--baseline", str(SAMPLES / baseline)]))
    from reports.render import GPU_JOBS, gpu_job

    for name in GPU_JOBS:
        folder = gpu_job(name, WORK / "gpu")
        for f in folder.iterdir():  # generated now: one fixed mtime, as the samples
            os.utime(f, (1_700_000_000, 1_700_000_000))
        out.append((name, [str(folder)]))
    if REAL.is_dir():
        for d in sorted(p for p in REAL.glob("*/*") if p.is_dir()):
            out.append((f"real_{d.parent.name}_{d.name}", [str(d)]))
    for gpu, root in (("h200", H200), ("h100", H100)):
        if not root.is_dir():
            continue
        copy = WORK / gpu  # copied, as the samples: the checkout's path and file times are in the outputs
        shutil.copytree(root, copy)
        for f in copy.rglob("*"):
            os.utime(f, (1_700_000_000, 1_700_000_000))
        for d in sorted(p for p in copy.glob("*/*") if p.is_dir() and any(p.glob("*.json*"))):
            out.append((f"{gpu}_{d.parent.name}_{d.name}", [str(d)]))  # each side: a folder holding a trace
    return out


def dump_db(db: Path, out: Path) -> None:
    """Write the schema and every table's rows of ``db`` as text to ``out``."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    lines: list[str] = []
    tables = con.execute("SELECT table_name, table_type FROM information_schema.tables "
                         "WHERE table_schema = 'main' ORDER BY table_name").fetchall()
    for name, kind in tables:
        cols = con.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = "
                           "'main' AND table_name = ? ORDER BY ordinal_position", [name]).fetchall()
        lines.append(f"## {kind} {name} ({', '.join(f'{c} {t}' for c, t in cols)})")
        hashed = _HASHED_PATHS.get(name)
        cols_sql = f'* EXCLUDE ("{hashed}")' if hashed else "*"
        rows = con.execute(f'SELECT {cols_sql} FROM "{name}" ORDER BY ALL').fetchall()
        lines.append(f"rows: {len(rows)}")
        lines.extend(repr(r) for r in rows)
    con.close()
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def take(dest: Path) -> int:
    """Run every case into ``dest``; returns the number of cases."""
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "out").mkdir(parents=True)
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    for name, args in cases():
        o = WORK / "out" / name
        cmd = [sys.executable, "-m", "traceanalyze.cli", "report", *args, "-o", f"{o}.html", "--json",
               f"{o}.json", "--md", f"{o}.md", "--db", f"{o}.duckdb", "-q"]
        subprocess.run(cmd, check=True, cwd=ROOT, env=ENV)
        for ext in (".html", ".json", ".md"):
            text = Path(f"{o}{ext}").read_text(encoding="utf-8")
            (dest / f"{name}{ext}").write_text(_norm(_STAMP.sub("<generated_at>", text)), encoding="utf-8")
        dump_db(Path(f"{o}.duckdb"), dest / f"{name}.db.txt")
        db_text = (dest / f"{name}.db.txt").read_text("utf-8")
        (dest / f"{name}.db.txt").write_text(_norm(_STAMP.sub("<generated_at>", db_text)), "utf-8")
        print(f"ok {name}", flush=True)
        n += 1
    merged = WORK / "out" / "straggler_export.json"
    subprocess.run([sys.executable, "-m", "traceanalyze.cli", "export", str(SAMPLES / "straggler"), "-o", str(merged),
                    "--db", str(WORK / "out" / "export.duckdb"), "-q"], check=True, cwd=ROOT, env=ENV)
    # the merged trace's events in one canonical order: export writes them in the order DuckDB's parallel scans
    # return them, which differs between two runs of the same code
    trace = json.loads(merged.read_text("utf-8"))
    trace["traceEvents"].sort(key=lambda e: json.dumps(e, sort_keys=True))
    (dest / "straggler_export.json").write_text(_norm(json.dumps(trace, indent=0, sort_keys=True)), "utf-8")
    return n + 1


def compare(a: Path, b: Path) -> int:
    """Print each file that differs between snapshots ``a`` and ``b`` (with the first lines of its diff)."""
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    bad = 0
    for name in names:
        pa, pb = a / name, b / name
        if not pa.exists() or not pb.exists():
            print(f"only in {'b' if not pa.exists() else 'a'}: {name}")
            bad += 1
        elif pa.read_bytes() != pb.read_bytes():
            bad += 1
            diff = difflib.unified_diff(pa.read_text().splitlines(), pb.read_text().splitlines(), lineterm="", n=0)
            print(f"DIFFERS: {name}")
            for line in list(diff)[2:12]:
                print("   ", line[:200])
    print(f"{len(names) - bad} of {len(names)} outputs byte-identical")
    return 1 if bad else 0


def main() -> None:
    global WORK
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("take", help="write a snapshot of every case into DEST")
    t.add_argument("dest", type=Path)
    t.add_argument("--work", type=Path, default=Path("/tmp/ta-snap-0"),
                   help="scratch folder (default %(default)s)")
    c = sub.add_parser("compare", help="compare two snapshots; exit 1 when any output differs")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "take":
        WORK = args.work
        print(f"{take(args.dest)} cases written to {args.dest}")
    else:
        sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
