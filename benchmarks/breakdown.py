#!/usr/bin/env python3
"""The cold report of the 8-rank scale set broken down into its parts, each against its own floor (issue 38).

    python benchmarks/breakdown.py [--traces /tmp/traceanalyze-bench/scale8] [--runs 3] [--hta-runs 3]

Nothing under ``traceanalyze/`` is changed: each run is ``traceanalyze report DIR -o OUT --db FRESH -q`` (the
command ``bench.py`` times) in a child process of this script that wraps the stages' functions at run time and
records, per call, the wall time and the process CPU time (user + sys of every thread of the process, from
``time.process_time``). Times are exclusive: a wrapped function's own time less that of the wrapped functions it
called, so the rows add up to the report's total. The parse workers (forked processes) record per rank: the parse
as a whole, and within it the gzip read and inflate (``_gzip_blocks``), the typed msgspec decode (``_EVENTS``), the
column building (``_Columns``), the Arrow IPC write (``_TableSink.write``) and the rest (scanning for event
boundaries, the header).

Each run is made twice, alternating: **in turn** (``stages.OVERLAP_MAX_ROWS`` set to -1 in the child: the
analyses, the memory rows and the replay run one after another, as the report already runs a run of more than
2 M rows, and the replay's tables are written after its what-ifs instead of on a thread beside them) so that each
part's process CPU is its own, and **as shipped** (no change), whose wall times show the
overlap. The figures are medians over ``--runs`` runs of each mode.

The floors, measured alone in one process after the runs (medians of 3):

* gzip: ``isal_zlib.decompress`` of each rank's whole file, in one call;
* decode: ``msgspec.json.decode`` of each rank's inflated bytes into the parser's own typed structs (a struct with
  ``traceEvents`` of the parser's event union), garbage collection off as in the workers, nothing else;
* insert: DuckDB's own append of the same Arrow columns (``parse_trace`` in memory, not timed) into the empty
  tables of a fresh database file, one thread, as the load does; the ``COMMIT`` timed apart;
* each SQL analysis: one DuckDB scan (aggregate) of the columns it reads, on the finished report database;
* the fixed cost: ``python -c pass``.

HTA 0.5.0's wall time is taken with ``bench.py``'s own command (``--hta-runs``; 0 leaves it out).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TRACES = Path(tempfile.gettempdir()) / "traceanalyze-bench" / "scale8"

# (label, module, attribute): the main process's parts; "Class.method" wraps a method. Order = the table's.
WRAPPED = [
    ("discover", "traceanalyze.pipeline", "_discover"),
    ("cache key (file identities)", "traceanalyze.pipeline", "_cache_key"),
    ("open database", "traceanalyze.store", "connect"),
    ("load: main process, other", "traceanalyze.stages", "load_traces"),
    ("load: insert", "traceanalyze.ingest.load", "_insert_part"),
    ("load: commit (files rows, COMMIT)", "traceanalyze.ingest.load", "_Batch.commit"),
    ("after load (forget, durations, reset)", "traceanalyze.ingest", "drop_impossible_durations"),
    ("after load (forget, durations, reset)", "traceanalyze.ingest", "forget_files"),
    ("after load (forget, durations, reset)", "traceanalyze.pipeline", "_reset_report"),
    ("place files", "traceanalyze.stages", "place_files"),
    ("steps materialized", "traceanalyze.store", "materialize_steps"),
    ("header facts, run mode", "traceanalyze.ingest.checks", "header_facts"),
    ("header facts, run mode", "traceanalyze.metrics", "run_mode"),
    ("logs and sidecars", "traceanalyze.stages", "read_logs"),
    ("metrics: steps and ranks", "traceanalyze.metrics", "compute_run_metrics"),
    ("metrics: steps and ranks", "traceanalyze.metrics", "save"),
    ("metrics: unclassified kernels", "traceanalyze.metrics.kernels", "unclassified_kernels"),
    ("metrics: top kernels", "traceanalyze.metrics", "top_kernels"),
    ("metrics: idle", "traceanalyze.metrics.idle", "idle_breakdown"),
    ("metrics: collectives", "traceanalyze.metrics.collectives", "match_collectives"),
    ("metrics: collectives", "traceanalyze.metrics.collectives", "analyze_collectives"),
    ("metrics: precision", "traceanalyze.metrics.precision", "analyze_precision"),
    ("metrics: compile, loader, launch", "traceanalyze.metrics.host", "compile_stats"),
    ("metrics: compile, loader, launch", "traceanalyze.metrics.host", "loader_stats"),
    ("metrics: compile, loader, launch", "traceanalyze.metrics.host", "launch_stats"),
    ("metrics: memory", "traceanalyze.metrics.memory", "memory_rows"),
    ("metrics: host view", "traceanalyze.metrics.host", "host_view"),
    ("metrics: op time, host gaps (where)", "traceanalyze.metrics.where", "op_time_per_step"),
    ("metrics: op time, host gaps (where)", "traceanalyze.metrics.where", "host_gaps"),
    ("metrics: cache flushes", "traceanalyze.metrics.allocator", "cache_flushes"),
    ("replay: other (model, picture, contexts)", "traceanalyze.replay.whatif", "replay_run"),
    ("replay: graph build", "traceanalyze.replay.graph", "build"),
    ("replay: collective skew", "traceanalyze.replay.skew", "collective_skew"),
    ("replay: base replay", "", ""),  # these four: wrap_replay
    ("replay: unprofiled base (the profiler's cost out)", "", ""),
    ("replay: what-if rewrites", "", ""),
    ("replay: what-if", "", ""),  # one row per scenario: "replay: what-if NAME"
    ("replay: graph tables written", "traceanalyze.replay.whatif", "_Writes._save"),
    ("replay: sim_result rows written", "traceanalyze.replay.whatif", "_Writes.__call__"),
    ("findings: rules", "traceanalyze.diagnose", "diagnose"),
    ("findings: late what-ifs priced", "traceanalyze.diagnose", "price_missing_whatifs"),
    ("findings: timeline", "traceanalyze.stages", "timeline"),
    ("report model, comparison", "traceanalyze.pipeline", "_compare"),
    ("report model, comparison", "traceanalyze.pipeline", "_report_model"),
    ("report cache (JSON model stored)", "traceanalyze.store", "store_report"),
    ("report cache (JSON model stored)", "traceanalyze.store", "forget_steps"),
    ("render: page model", "traceanalyze.cli", "page_model"),
    ("render: HTML", "traceanalyze.cli", "render_html"),
    ("render: HTML written", "traceanalyze.cli", "atomic_write_text"),
]
WORKER_PARTS = ("gzip read + inflate", "msgspec decode", "columns", "IPC write")

# one DuckDB scan (aggregate) of the columns each SQL analysis reads: its floor
K = "SELECT count(*), sum(ts_ns), sum(dur_ns), sum(stream), sum(device), max(name) FROM kernels"
C = "SELECT count(*), sum(ts_ns), sum(dur_ns), sum(tid), max(name) FROM cpu_ops"
FLOOR_SQL = {
    "steps materialized": [C],
    "metrics: steps and ranks": [K, C],
    "metrics: top kernels": ["SELECT name, sum(dur_ns), count(*) FROM kernels GROUP BY name"],
    "metrics: idle": [K],
    "metrics: collectives": ["SELECT count(*), sum(ts_ns), max(name) FROM comm_events"],
    "metrics: precision": [K, "SELECT count(*), max(name), max(input_types) FROM cpu_ops"],
    "metrics: compile, loader, launch": [C],
    "metrics: memory": ["SELECT count(*), sum(ts_ns), sum(bytes) FROM memory_events", C],
    "metrics: host view": [C],
    "metrics: op time, host gaps (where)": [C],
    "metrics: cache flushes": [C],
    "replay: graph build": [K.replace("max(name)", "sum(correlation), sum(external_id)"),
                            C.replace("max(name)", "sum(correlation), sum(external_id)")],
}


# ---------------------------------------------------------------------------------------------------------
# The child: one cold report, its functions wrapped

class Recorder:
    """Exclusive wall and process-CPU seconds per label: a call's time less that of the wrapped calls inside it
    (per thread)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.local = threading.local()

    def call(self, label: str, fn, args, kwargs):
        stack = self.local.__dict__.setdefault("stack", [])
        stack.append([0.0, 0.0])  # the children's wall, CPU
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            w, c = time.perf_counter() - w0, time.process_time() - c0
            cw, cc = stack.pop()
            self.add(label, w - cw, c - cc)
            if stack:
                stack[-1][0] += w
                stack[-1][1] += c

    def add(self, label: str, w: float, c: float) -> None:
        self.wall[label] += w
        self.cpu[label] += c
        self.calls[label] += 1


def wrap(rec: Recorder, label: str, owner, attr: str) -> None:
    """Replace ``owner.attr`` (a function or method) by one that records its time under ``label``."""
    fn = getattr(owner, attr)

    def timed(*args, **kwargs):
        return rec.call(label, fn, args, kwargs)

    timed.__wrapped__ = fn
    setattr(owner, attr, timed)


def wrap_generator(rec: Recorder, label: str, owner, attr: str) -> None:
    """Replace the generator function ``owner.attr``: each step of the generator is timed under ``label``."""
    fn = getattr(owner, attr)

    def timed(*args, **kwargs):
        it = rec.call(label, fn, args, kwargs)
        while True:
            try:
                item = rec.call(label, next, (it,), {})
            except StopIteration:
                return
            yield item

    setattr(owner, attr, timed)


class TimedDecoder:
    """The parser's ``_EVENTS`` decoder, its ``decode`` timed."""

    def __init__(self, rec: Recorder, dec) -> None:
        self.rec, self.dec = rec, dec

    def decode(self, buf):
        return self.rec.call("msgspec decode", self.dec.decode, (buf,), {})

    def __getattr__(self, name: str):
        return getattr(self.dec, name)


def instrument_worker(out_dir: str) -> None:
    """The parse's parts, recorded per ``parse_trace`` call in the forked workers, written to ``out_dir``."""
    from traceanalyze.ingest import parse

    main_pid = os.getpid()
    wrk = Recorder()
    wrap_generator(wrk, "gzip read + inflate", parse, "_gzip_blocks")
    parse._EVENTS = TimedDecoder(wrk, parse._EVENTS)
    for m in ("add", "convert", "tables"):
        wrap(wrk, "columns", parse._Columns, m)
    wrap(wrk, "IPC write", parse._TableSink, "write")
    whole = parse.parse_trace

    def parse_trace(path, *args, **kwargs):
        if os.getpid() == main_pid:
            return whole(path, *args, **kwargs)
        wrk.wall.clear(), wrk.cpu.clear(), wrk.calls.clear()
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            return whole(path, *args, **kwargs)
        finally:
            rec = {"path": str(path), "wall": time.perf_counter() - w0, "cpu": time.process_time() - c0,
                   "parts": {k: [wrk.wall[k], wrk.cpu[k]] for k in wrk.wall}}
            with open(os.path.join(out_dir, f"w{os.getpid()}-{time.monotonic_ns()}.json"), "w") as fh:
                json.dump(rec, fh)

    parse.parse_trace = parse_trace


def wrap_replay(rec: Recorder) -> None:
    """The replay's parts: the base replay (``simulate.replay`` called by ``replay_run`` itself), the unprofiled
    base, each what-if's rewrite, and each what-if's replay under its scenario's name (``_Pricer.predict``, its
    ``simulate.replay`` inside it)."""
    from traceanalyze.replay import simulate, whatif

    cur = {"sc": None, "inside": 0}
    sim, rewritten, predict, unprofiled = (simulate.replay, whatif._rewritten, whatif._Pricer.predict,
                                           whatif._Pricer.unprofiled)

    def replay(*a, **k):
        if cur["inside"]:  # a what-if's or the unprofiled base's own replay: counted there
            return sim(*a, **k)
        return rec.call("replay: base replay", sim, a, k)

    def inside(label: str, fn):
        def timed(*a, **k):
            cur["inside"] += 1
            try:
                return rec.call(label if label else f"replay: what-if {cur['sc']}", fn, a, k)
            finally:
                cur["inside"] -= 1
        return timed

    def rewrite(pr, sc, *a, **k):
        cur["sc"] = sc
        return rec.call("replay: what-if rewrites", rewritten, (pr, sc, *a), k)

    simulate.replay, whatif._rewritten = replay, rewrite
    whatif._Pricer.predict = inside("", predict)
    whatif._Pricer.unprofiled = inside("replay: unprofiled base (the profiler's cost out)", unprofiled)


def resolve(module: str, attr: str):
    """(the object that holds ``attr``'s last part, that part) of ``module.attr``; ``attr`` may be Class.method."""
    import importlib

    owner = importlib.import_module(module)
    *cls, name = attr.split(".")
    for c in cls:
        owner = getattr(owner, c)
    return owner, name


def child(args) -> None:
    """One cold report, in this process, its parts recorded; writes the figures as JSON to ``args.child_out``."""
    w0, c0 = time.perf_counter(), time.process_time()
    from traceanalyze import cli  # the CLI's own imports: the fixed cost

    w1, c1 = time.perf_counter(), time.process_time()
    from traceanalyze import diagnose, metrics, stages  # noqa: F401 (lazily imported by the report: timed here)
    from traceanalyze.ingest import load, parse  # noqa: F401
    from traceanalyze.replay import whatif  # noqa: F401

    w2, c2 = time.perf_counter(), time.process_time()
    if args.in_turn:
        stages.OVERLAP_MAX_ROWS = -1  # every analysis, the memory rows and the replay one after another
        # the graph's tables written when the replay is done, not on their own thread beside it: process CPU
        # would count that thread again in each part that runs meanwhile (256 ranks: ~0.4 s more "replay: other")
        whatif._Writes.start_beside = lambda self: None
    rec = Recorder()
    for label, module, attr in WRAPPED:
        if module:
            wrap(rec, label, *resolve(module, attr))
    wrap_replay(rec)
    wdir = tempfile.mkdtemp(prefix="breakdown-w")
    instrument_worker(wdir)
    work = Path(tempfile.mkdtemp(prefix="breakdown-r"))
    sys.argv = ["traceanalyze", "report", str(args.traces), "-o", str(work / "report.html"), "--db",
                str(args.db or work / "cold.duckdb"), "-q"]
    w3 = time.perf_counter()
    try:
        cli.main()
    except SystemExit as exc:
        if exc.code:
            raise
    w4 = time.perf_counter()
    t = os.times()
    workers = [json.loads(p.read_text()) for p in Path(wdir).iterdir()]
    out = {"import cli": [w1 - w0, c1 - c0], "lazy imports (parse, metrics, replay, diagnose)": [w2 - w1, c2 - c1],
           "report": [w4 - w3, None], "total": [w4 - w0, t.user + t.system],
           "workers_cpu": t.children_user + t.children_system,
           "parts": {k: [rec.wall[k], rec.cpu[k], rec.calls[k]] for k in rec.wall}, "workers": workers}
    Path(args.child_out).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------------------
# The floors, measured alone

def cpu_wall(fn, *args) -> tuple[float, float, object]:
    """(wall s, process CPU s, result) of ``fn(*args)``."""
    w, c = time.perf_counter(), time.process_time()
    r = fn(*args)
    return time.perf_counter() - w, time.process_time() - c, r


def med3(fn, *args, n: int = 3) -> tuple[float, float]:
    """Median (wall, CPU) of ``n`` calls of ``fn(*args)``."""
    runs = [cpu_wall(fn, *args)[:2] for _ in range(n)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def floors_parse(files: list[Path]) -> dict[str, list[float]]:
    """Per rank, summed: the one-call inflate and the typed msgspec decode of the whole file's bytes."""
    import msgspec

    from traceanalyze.ingest import parse

    try:
        from isal import isal_zlib as z
    except ImportError:
        import zlib as z
    doc = msgspec.json.Decoder(msgspec.defstruct("Trace", [("traceEvents", parse._EVENTS.type)]))
    out = {"gzip": [0.0, 0.0], "decode": [0.0, 0.0]}
    for f in files:
        raw = f.read_bytes()
        w, c = med3(z.decompress, raw, 31)
        out["gzip"][0] += w
        out["gzip"][1] += c
        data = z.decompress(raw, 31)
        del raw
        gc.disable()  # as in the workers (load._parse_one)
        try:
            w, c = med3(doc.decode, data)
        finally:
            gc.enable()
        out["decode"][0] += w
        out["decode"][1] += c
    return out


def floors_insert(files: list[Path], n: int = 3) -> dict[str, list[float]]:
    """DuckDB's append of each rank's Arrow columns into the empty tables of a fresh database (one transaction,
    one thread), then the COMMIT; medians of ``n`` fresh databases. The tables are parsed once, not timed."""
    import duckdb

    from traceanalyze import store
    from traceanalyze.ingest import parse

    tables = [parse.parse_trace(f)[1] for f in files]
    runs = []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as tmp:
            con = duckdb.connect(os.path.join(tmp, "f.duckdb"))
            con.execute(store.DDL)
            con.execute("SET threads = 1")
            con.execute("BEGIN TRANSACTION")
            ins = [0.0, 0.0]
            for fid, tbs in enumerate(tables, 1):
                for t, arrow in tbs.items():
                    cols = ", ".join(f'"{c}"' for c in arrow.schema.names)
                    con.register("_arrow", arrow)  # a view of the table in memory: not timed
                    w, c, _ = cpu_wall(con.execute, f"INSERT INTO {t} (file_id, {cols}) SELECT {fid}, {cols} "
                                                    "FROM _arrow")
                    con.unregister("_arrow")
                    ins[0] += w
                    ins[1] += c
            w, c, _ = cpu_wall(con.execute, "COMMIT")
            runs.append((ins, [w, c]))
            con.close()
    return {"insert": [statistics.median(r[0][i] for r in runs) for i in (0, 1)],
            "commit": [statistics.median(r[1][i] for r in runs) for i in (0, 1)]}


def floors_sql(db: Path) -> dict[str, list[float]]:
    """Per SQL analysis: its scans (:data:`FLOOR_SQL`) on the finished report database, medians of 3."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for label, queries in FLOOR_SQL.items():
        tot = [0.0, 0.0]
        for q in queries:
            w, c = med3(lambda q=q: con.execute(q).fetchall())
            tot[0] += w
            tot[1] += c
        out[label] = tot
    con.close()
    return out


def python_start(n: int) -> list[float]:
    """Median (wall, CPU) of ``python -c pass`` (user + sys of the child)."""
    runs = []
    for _ in range(n):
        w0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        _, _, ru = os.wait4(proc.pid, 0)
        runs.append((time.perf_counter() - w0, ru.ru_utime + ru.ru_stime))
    return [statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)]


def floors_child(args) -> None:
    files = sorted(f for f in args.traces.iterdir() if f.name.endswith((".json", ".json.gz")))
    out = {**floors_parse(files), **floors_insert(files), "sql": floors_sql(args.db),
           "python": python_start(5)}
    Path(args.child_out).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------------------
# The parent: runs, medians, the table

def run_child(traces: Path, mode: list[str], db: Path | None = None) -> dict:
    """This script in a fresh process (``--child``/``--floors``), from the temp folder; its JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = Path(fh.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--traces", str(traces), "--child-out", str(out), *mode]
    if db is not None:
        cmd += ["--db", str(db)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as bench.py (BENCH_ENV)
    subprocess.run(cmd, check=True, cwd=tempfile.gettempdir(), env=env, stdout=subprocess.DEVNULL)
    try:
        return json.loads(out.read_text())
    finally:
        out.unlink()


def worker_rows(runs: list[dict]) -> dict[str, list[float]]:
    """Per worker part, the median over runs of its (wall, CPU) summed over the ranks; 'whole' and 'other' too."""
    per_run = []
    for r in runs:
        tot: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for w in r["workers"]:
            tot["whole"][0] += w["wall"]
            tot["whole"][1] += w["cpu"]
            for k in WORKER_PARTS:
                part = w["parts"].get(k, [0.0, 0.0])
                tot[k][0] += part[0]
                tot[k][1] += part[1]
        tot["other"] = [tot["whole"][i] - sum(tot[k][i] for k in WORKER_PARTS) for i in (0, 1)]
        per_run.append(tot)
    return {k: [statistics.median(t[k][i] for t in per_run) for i in (0, 1)] for k in per_run[0]}


def med(runs: list[dict], label: str, i: int) -> float:
    return statistics.median(r["parts"].get(label, [0.0, 0.0])[i] for r in runs)


def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def distance(part: float, floor: float | None) -> str:
    if floor is None:
        return "no floor measured"
    return f"{part / floor:.1f}× (+{part - floor:.3f} s)" if floor > 0 else "floor 0"


def main_rows(turn: list[dict], ship: list[dict], fl: dict) -> list[tuple]:
    """(part, CPU in turn, wall in turn, wall as shipped, floor CPU, how the floor was measured) of the main
    process's wrapped parts, in :data:`WRAPPED` order."""
    how = {"load: insert": ("insert", "DuckDB append of the same Arrow columns, 1 thread, alone"),
           "load: commit (files rows, COMMIT)": ("commit", "the COMMIT of that append, alone")}
    rows, order = [], list(dict.fromkeys(label for label, _, _ in WRAPPED))
    extra = sorted({k for r in turn + ship for k in r["parts"]} - set(order))  # one row per what-if scenario
    at = order.index("replay: what-if")
    order[at:at + 1] = extra
    for label in order:
        floor, what = None, "no floor measured"
        if label in how:
            floor, what = fl[how[label][0]][1], how[label][1]
        elif label in fl["sql"]:
            floor, what = fl["sql"][label][1], "one DuckDB scan of the columns it reads: " + " + ".join(
                q.split(" FROM ")[1] for q in FLOOR_SQL[label])
        rows.append((label, med(turn, label, 1), med(turn, label, 0), med(ship, label, 0), floor, what))
    return rows


GROUPS = [("fixed: python start, imports, open database", ("python start", "import cli", "lazy imports",
                                                            "discover", "cache key", "open database")),
          ("parse workers (CPU of the forked processes)", ("parse workers: whole",)),
          ("load, main process: insert, commit, the rest", ("load:", "after load")),
          ("placing files, steps, facts, logs", ("place files", "steps materialized", "header facts", "logs")),
          ("metrics (SQL analyses)", ("metrics:",)),
          ("replay: graph, base, what-ifs, its tables", ("replay:",)),
          ("findings, model, report cache", ("findings:", "report model", "report cache")),
          ("render", ("render:",))]


def print_groups(rows: list[tuple]) -> None:
    """The parts summed into groups: CPU in turn, wall as shipped (the main process's), and the floors that were
    measured (the parts without one count at 0 in the floor column: a lower bound)."""
    print("\n| group | CPU, in turn (s) | wall, as shipped (s) | floors measured (CPU, s) |\n|---|--:|--:|--:|")
    tc = tf = 0.0
    for name, prefixes in GROUPS:
        mine = [r for r in rows if r[0].startswith(prefixes)]
        cpu, wall = sum(r[1] for r in mine), sum(r[3] or 0.0 for r in mine)
        floor = sum(r[4] or 0.0 for r in mine)
        tc, tf = tc + cpu, tf + floor
        print(f"| {name} | {cpu:.2f} | {wall:.2f} | {floor:.2f} |")
    print(f"| sum | {tc:.2f} | | {tf:.2f} |")
    print(f"\nthe floors measured sum to {tf:.2f} s CPU: on 2 cores at least {tf / 2:.2f} s wall")


def print_table(turn: list[dict], ship: list[dict], fl: dict, hta: float | None, n_runs: int) -> None:
    m = statistics.median
    wk = worker_rows(turn)
    py = fl["python"]
    print(f"\n{n_runs} runs of each mode, medians; CPU = user + sys (all threads); times exclusive (s)\n")
    print("| part | CPU, in turn | wall, in turn | wall, as shipped | floor (CPU) | floor measured as | distance "
          "(CPU) |\n|---|--:|--:|--:|--:|---|---|")
    rows = [("python start", py[1], py[0], py[0], py[1], "`python -c pass`")]
    for lab in ("import cli", "lazy imports (parse, metrics, replay, diagnose)"):
        rows.append((lab, m(r[lab][1] for r in turn), m(r[lab][0] for r in turn), m(r[lab][0] for r in ship), None,
                     "no floor measured"))
    floors = {"msgspec decode": (fl["decode"][1], "`msgspec.json.decode` of the inflated file into the same "
                                 "typed structs, alone"),
              "gzip read + inflate": (fl["gzip"][1], "one-call ISA-L inflate of the whole file, alone")}
    for k in ("whole", *WORKER_PARTS, "other"):
        f, what = floors.get(k, (None, "no floor measured"))
        if k == "whole":
            f, what = fl["decode"][1] + fl["gzip"][1], "inflate + decode floors"
        rows.append((f"parse workers: {k} (8 ranks summed)", wk[k][1], wk[k][0], None, f, what))
    rows += main_rows(turn, ship, fl)
    for part, cpu, wall, shipped, floor, what in rows:
        print(f"| {part} | {fmt(cpu)} | {fmt(wall)} | {fmt(shipped)} | {fmt(floor)} | {what} | "
              f"{distance(cpu, floor) if floor is not None else 'no floor measured'} |")
    n = len({w["path"] for w in turn[0]["workers"]}) or 1
    print(f"\nper rank ({n} ranks): the worker {wk['whole'][1] / n:.3f} s CPU, of which decode "
          f"{wk['msgspec decode'][1] / n:.3f} s (floor {fl['decode'][1] / n:.3f} s), gzip "
          f"{wk['gzip read + inflate'][1] / n:.3f} s (floor {fl['gzip'][1] / n:.3f} s), neither decode nor gzip "
          f"{(wk['whole'][1] - wk['msgspec decode'][1] - wk['gzip read + inflate'][1]) / n:.3f} s (columns "
          f"{wk['columns'][1] / n:.3f}, IPC write {wk['IPC write'][1] / n:.3f}, other {wk['other'][1] / n:.3f})")
    print_groups(rows)
    tot_t, tot_s = m(r["total"][0] for r in turn), m(r["total"][0] for r in ship)
    cpu_t = m(r["total"][1] + r["workers_cpu"] for r in turn)
    cpu_s = m(r["total"][1] + r["workers_cpu"] for r in ship)
    named = sum(r[2] for r in rows[1:] if not r[0].startswith("parse workers"))
    print(f"\nwhole report process (after python start): in turn {tot_t:.2f} s wall, {cpu_t:.2f} s CPU with the "
          f"workers; as shipped {tot_s:.2f} s wall, {cpu_s:.2f} s CPU; the main process's named parts "
          f"{named:.2f} s wall in turn (the rest, {tot_t - named:.2f} s, is unwrapped: the CLI, closing, "
          "waiting on the workers' first results)")
    print(f"with python start: {tot_s + py[0]:.2f} s wall as shipped")
    if hta:
        print(f"HTA 0.5.0 (bench.py's command, same session): {hta:.2f} s wall -> {hta / (tot_s + py[0]):.1f}× "
              f"as shipped; 10× needs {hta / 10:.2f} s wall")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hta-runs", type=int, default=3, help="HTA runs with bench.py's command (0: none)")
    ap.add_argument("--hta-python", default=sys.executable)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--in-turn", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--floors", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.floors:
        return floors_child(args)
    traces = args.traces.resolve()
    turn, ship, hta = [], [], []
    sys.path.insert(0, str(HERE))
    import bench

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "kept.duckdb"
        for i in range(args.runs):
            turn.append(run_child(traces, ["--child", "--in-turn"]))
            ship.append(run_child(traces, ["--child"], db if i == args.runs - 1 else None))
            if i < args.hta_runs:
                hta.append(bench.run_timed([args.hta_python, "-c", bench.HTA_SCRIPT, str(traces)]))
            print(f"run {i + 1}: in turn {turn[-1]['total'][0]:.2f} s, as shipped {ship[-1]['total'][0]:.2f} s"
                  + (f", HTA {hta[-1]:.2f} s" if i < args.hta_runs else "") + f", {bench.load()}", flush=True)
        fl = run_child(traces, ["--floors"], db)
    print_table(turn, ship, fl, statistics.median(hta) if hta else None, args.runs)


if __name__ == "__main__":
    main()
