"""One run through the stages, below :mod:`traceanalyze.pipeline`: its files placed as ranks and windows, the facts
their headers state, the metrics, the logs, the what-if replay on a thread of its own, the evidence the rules read
and the run's part of the report model (``docs/schema.md``, ``runs[i]``).

What overlaps with what: two pure-SQL analyses run on a second cursor beside the others (DuckDB works without the
GIL), the memory rows beside them from the start, the replay beside them all from :data:`EARLY_REPLAY_MIN_ROWS`,
and nothing at all from :data:`OVERLAP_MAX_ROWS` (memory). The pure dict-building is
:mod:`traceanalyze.report.assemble`'s; the sidecars are read by :mod:`traceanalyze.logs.sidecars`, the files
checked by :mod:`traceanalyze.ingest.checks`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from traceanalyze import ingest, store
from traceanalyze.discover import Run, assign_ranks, check_headers, window_grouping
from traceanalyze.executors import DaskExecutor
from traceanalyze.ingest import checks
from traceanalyze.options import Options
from traceanalyze.report import assemble

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from traceanalyze import diagnose, hardware
    from traceanalyze.ingest.load import Begun
    from traceanalyze.metrics.collectives import Calls
# diagnose, metrics (NumPy) and the log parsers are imported where used: a cached re-run needs none of them

OVERLAP_MAX_ROWS = 2_000_000  # kernels + CPU ops up to which two analyses run at once (see build_run)
# ... and from which the what-if replay starts before the step metrics (analyses): there its graph outlasts the
# analyses (8 ranks of 47 MB: -0.3 to -0.5 s; 4 ranks: -0.1 to -0.3 s), below it only contends with them (one
# 5 MB rank: +0.04 s; 2 ranks of 47 MB and 128 ranks of 1.8 MB: no change)
EARLY_REPLAY_MIN_ROWS = 400_000


def load_traces(con: duckdb.DuckDBPyConnection, paths: list[Path], options: Options,
                progress: Callable[[int], None] | None, known: dict, begun: Begun | None = None) -> list:
    """:func:`traceanalyze.ingest.load_traces` in local processes, or on a Dask cluster (``options.executor`` or
    ``options.scheduler``: the executor ``batch`` uses); ``known``: each file's identity, read for the cache key;
    ``begun``: the parse :func:`begun_parse` began."""
    bound = {"known": known, **_decompressed_bound(options)}
    jobs, db, scheduler = options.jobs, options.db, options.scheduler
    if options.executor == "local" and not scheduler:
        return ingest.load_traces(con, paths, jobs=jobs, progress=progress, begun=begun, **bound)
    import os

    ex = DaskExecutor(jobs or os.cpu_count() or 1, scheduler)
    # with a remote scheduler the workers write where they and this process both see: beside the database
    parts = Path(str(db) + ".parts") if scheduler and db is not None and str(db) != ":memory:" else None
    try:
        return ingest.load_traces(con, paths, jobs=jobs, progress=progress, executor=ex, parts_dir=parts, **bound)
    finally:
        ex.close()
        if parts is not None:
            import shutil

            shutil.rmtree(parts, ignore_errors=True)


@contextlib.contextmanager
def begun_parse(db, paths: list[Path], options: Options) -> Iterator[Begun | None]:
    """The parse of a database made now (``db``: nothing in it is cached), begun in local processes before it opens
    (:func:`traceanalyze.ingest.begin_parse`), for :func:`load_traces`; None where the files parse elsewhere
    (a Dask cluster), in this process (one file: its parse modules import while the database opens instead), or may
    be cached. Stopped on leaving the block unless loaded."""
    begun = None
    if len(paths) > 1 and options.executor == "local" and not options.scheduler and store.is_new(db):
        begun = ingest.begin_parse(paths, jobs=options.jobs, **_decompressed_bound(options))
    try:
        yield begun
    finally:
        if begun is not None:
            begun.close()


def _decompressed_bound(options: Options) -> dict:
    """``{"max_decompressed": bytes}`` when the options bound what a file may inflate to, else ``{}`` (the
    loader's default bound)."""
    return {} if options.max_decompressed_bytes is None else {"max_decompressed": options.max_decompressed_bytes}


def import_parse() -> None:
    """Import what the parse of a trace runs on (msgspec, NumPy, Arrow: ~0.12 s of CPU), e.g. while the database
    opens on a thread (:func:`traceanalyze.pipeline.analyze`)."""
    from traceanalyze.ingest import parse  # noqa: F401  (the import is the work)


def import_diagnose() -> None:
    """Import the rules (:mod:`traceanalyze.diagnose`: NumPy, ~40 ms of CPU), e.g. on a thread while the database
    is tidied after the load (:func:`traceanalyze.pipeline.analyze`; DuckDB frees the GIL meanwhile)."""
    from traceanalyze import diagnose  # noqa: F401  (the import is the work)


def build_run(con: duckdb.DuckDBPyConnection, run_id: int, run: Run, role: str, loaded: dict, options: Options,
              pending: list | None = None, baseline: diagnose.RunEvidence | None = None
              ) -> tuple[dict, list[dict], diagnose.RunEvidence]:
    """One run through the stages: its files placed as ranks and windows, the facts their headers state, the
    metrics, the what-if replay and the evidence the rules read; returns (run model, warnings, evidence).
    ``loaded``: path -> :class:`traceanalyze.ingest.LoadedFile`; ``pending``: receives the wait for the replay's
    tables instead of waiting here (call it before the database is complete); ``baseline``: the evidence of the
    run this one is compared with (``--baseline``, analyzed first): its measured figures price this run's what-ifs
    where it fixes their cause (:func:`analyses`)."""
    from traceanalyze import metrics

    warnings: list[dict] = []
    good, headers, ranks, by_rank, grouping = place_files(con, run_id, run, loaded, warnings)
    store.materialize_steps(con, run_id)  # the steps every metric reads, computed once
    facts, gpu = checks.header_facts(run, headers, by_rank, good, options.gpu, warnings)
    mode = metrics.run_mode(con, run_id)
    con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, run.name, str(run.path), role, facts["world_size"], facts["backend"], mode,
                 facts["gpu_model"], facts["gpu_count"], facts["nccl_version"], facts["cuda_runtime_version"]])
    a = analyses(con, run_id, run, mode, facts, good, options, warnings, gpu, baseline)
    # the evidence is gathered while the replay runs on; the run model waits for it
    ev, longest, compile_step_us = evidence(con, run_id, run, a, facts, gpu, bool(good))
    compile_kernels = None
    if good and ev.compile_step is not None:  # the kernel table is of the steady steps: the compile step folded apart
        a.top = metrics.top_kernels(con, run_id, skip_step=ev.compile_step)
        compile_kernels = metrics.step_kernels(con, run_id, ev.compile_step)
    model = run_model(run_id, run, role, a, ev, facts, by_rank, grouping, good, ranks, longest, compile_step_us)
    # the replay is done: its pricer is set; taken out of the list, so that dropping it frees the graph
    ev.price_whatif = a.pricer.pop() if a.pricer and a.step_rows else None
    if compile_kernels is not None and model.get("compile_step"):
        model["compile_step"].update(n_kernels=compile_kernels["n_kernels"], top_kernels=compile_kernels["top"],
                                     kernel_time_us=compile_kernels["kernel_time_us"])
    if pending is None:
        a.written()
    else:  # its tables are written while the run is diagnosed
        pending.append(a.written)
    for w in warnings:
        w.setdefault("run", run.name)
    return model, warnings, ev


def place_files(con: duckdb.DuckDBPyConnection, run_id: int, run: Run, loaded: dict,
                warnings: list[dict]) -> tuple[list, dict, dict, dict, list[str]]:
    """The run's readable files as ranks and profiling windows (stored in ``files``); returns (good files,
    headers, rank of each path, files by rank, how files became ranks for the data-quality section)."""
    good = []
    # one query for the run's files, not one per file (2.4 s of the cross-rank work at 1,024 ranks)
    ids = [loaded[p].file_id for p in run.traces if loaded[p].file_id is not None]
    rows = {fid: (status, message, header) for fid, status, message, header in con.execute(
        "SELECT file_id, status, message, header FROM files WHERE file_id IN (SELECT unnest(?))", [ids]).fetchall()}
    for p in run.traces:
        lf = loaded[p]
        if lf.error or lf.file_id is None:
            warnings.append({"file": str(p), "message": lf.error or "not loaded", "level": "error"})
            continue
        status, message, _ = rows[lf.file_id]
        if status == "error":
            warnings.append({"file": str(p), "message": message, "level": "error"})
            continue
        if message:
            warnings.append({"file": str(p), "message": message,
                             "level": "partial" if status == "partial" else "warning"})
        good.append(lf)
    headers = {lf.path: store.header_dict(rows[lf.file_id][2]) for lf in good}
    headers, header_warnings = check_headers(headers)  # an implausible rank or world size: one warning per file
    warnings.extend({"file": f, "message": m, "level": "warning"} for f, m in header_warnings)
    ranks, rank_warnings = assign_ranks([lf.path for lf in good], headers)
    warnings.extend({"file": None, "message": m, "level": "warning"} for m in rank_warnings)
    by_rank: dict[int, list] = {}
    for lf in good:
        by_rank.setdefault(ranks[lf.path], []).append(lf)
    dropped = checks.check_files(con, run, by_rank, headers, warnings)
    good = [lf for lf in good if lf.path not in dropped]
    # a rank's windows are ordered by their first CPU op; only ranks with several files need that scan
    multi = [lf.file_id for lfs in by_rank.values() if len(lfs) > 1 for lf in lfs]
    starts = dict(con.execute("SELECT file_id, min(ts_ns) FROM cpu_ops WHERE file_id IN (SELECT unnest(?)) "
                              "GROUP BY file_id", [multi]).fetchall()) if multi else {}
    grouping: list[str] = []  # how files became ranks and windows, for the data-quality section
    placed: list[list[int]] = [[], [], []]  # file_id, rank, window: one UPDATE for the run
    for r, lfs in sorted(by_rank.items()):
        lfs.sort(key=lambda lf: (starts.get(lf.file_id) or 0, str(lf.path)))
        for w, lf in enumerate(lfs):
            for col, v in zip(placed, (lf.file_id, r, w), strict=True):
                col.append(v)
        if len(lfs) > 1:
            why = window_grouping([lf.path for lf in lfs], headers)
            warnings.append({"file": None, "level": "info",
                             "message": f"rank {r}: {len(lfs)} trace files read as {len(lfs)} successive profiling "
                                        f"windows of that rank ({why}); in time order: "
                                        f"{', '.join(lf.path.name for lf in lfs)}. Each window is analysed; the "
                                        "step statistics combine the steps of all windows"})
            grouping.append(f"rank {r}: {len(lfs)} profiling windows ({why})")
    if placed[0]:
        con.execute("UPDATE files SET run_id = ?, rank = p.rank, \"window\" = p.w FROM (SELECT unnest(?) AS fid, "
                    "unnest(?) AS rank, unnest(?) AS w) p WHERE files.file_id = p.fid", [run_id, *placed])
    if by_rank:
        n_files = sum(len(lfs) for lfs in by_rank.values())
        grouping.insert(0, f"{n_files} trace file{'s' if n_files != 1 else ''} read as {len(by_rank)} "
                           f"rank{'s' if len(by_rank) != 1 else ''}")
    return good, headers, ranks, by_rank, grouping


@dataclass
class RunAnalyses:
    """What the metrics, the sidecars and the replay of one run gave (:func:`analyses`)."""

    mode: str
    rank_rows: list
    step_rows: list
    side: dict
    coll: Any
    link: dict
    prec: Any
    comp: Any
    loader: Any
    launch: Any
    idle_rows: list
    top: list
    replay: Callable[[], tuple]  # waits for the replay: (replay, whatif, picture) models
    written: Callable[[], None]  # waits for the replay's tables (write_replay)
    n_rows: int = 0  # kernels and CPU ops of the run (what decides whether analyses overlap)
    pricer: list = field(default_factory=list)  # the replay's pricer of one more what-if, once it is done
    memory_rows: Callable[[], list] | None = None  # waits for the memory rows (memory_beside); None without any


def read_logs(con: duckdb.DuckDBPyConnection, run_id: int, run: Run, facts: dict, options: Options,
              warnings: list[dict]) -> tuple[dict, dict]:
    """The run's sidecars read and stored (:func:`traceanalyze.logs.sidecars.read_sidecars`, bounded by
    ``--max-decompressed``), the log's step time kept only when it ran without the profiler, and the expected link;
    returns (side, link)."""
    from traceanalyze.logs import sidecars  # the log parsers compile ~100 patterns on import

    side = sidecars.read_sidecars(con, run_id, run, warnings, options.max_decompressed_bytes)
    sidecars.log_covers_run(con, run_id, side)
    return side, sidecars.expected_link(facts, side, options.link_bw_gbps)


def analyses(con: duckdb.DuckDBPyConnection, run_id: int, run: Run, mode: str, facts: dict, good: list,
             options: Options, warnings: list[dict], gpu: hardware.GpuInfo | None = None,
             baseline: diagnose.RunEvidence | None = None) -> RunAnalyses:
    """Every metric of one run, its logs and its what-if replay; the pure-SQL ones and the replay overlap. With a
    ``baseline`` (and no ``--link-bw``), the replay's link is the baseline's measured busbw where it is the higher
    (:func:`traceanalyze.replay.scenarios.ranks.link_from_baseline`): the replay then waits for the collectives."""
    from concurrent.futures import ThreadPoolExecutor

    from traceanalyze import metrics
    from traceanalyze.metrics import idle, kernels
    from traceanalyze.metrics.collectives import CollectiveSummary, analyze_collectives, match_collectives
    from traceanalyze.metrics.host import compile_stats, launch_stats, loader_stats
    from traceanalyze.metrics.precision import analyze_precision

    # two pure-SQL analyses run on a second connection meanwhile: DuckDB works without the GIL, so they overlap
    # with the Python parts of the others (-0.08 s on 8 ranks). Both then hold their working memory at once, so
    # a run of many events computes them in turn instead.
    n_rows = con.execute("SELECT coalesce(sum(n_kernels + n_cpu_ops), 0) FROM files WHERE run_id = ?",
                         [run_id]).fetchone()[0]
    # the memory rows read only the events, the CPU ops and the steps: started first, beside the metrics
    memory_rows = memory_beside(con, run_id, n_rows) if good else None
    bg = ThreadPoolExecutor(max_workers=1) if n_rows <= OVERLAP_MAX_ROWS else None
    cur = store.steps_cursor(con)  # idle and top kernels read the steps computed once, not the live macro
    idle_result = deferred(bg, idle.idle_breakdown, cur, run_id) if good and mode == "gpu" else None
    top_result = deferred(bg, metrics.top_kernels, cur, run_id) if good else None
    if bg is not None:
        bg.shutdown(wait=False)
    side_warnings: list[dict] = []  # added after the step metrics' own, in the order they always came
    rp, matched = None, None
    beside = n_rows <= OVERLAP_MAX_ROWS  # the what-if replay (NumPy and DuckDB, mostly without the GIL) overlaps
    from_base = baseline is not None and baseline.coll is not None and not options.link_bw_gbps
    if good and beside and n_rows >= EARLY_REPLAY_MIN_ROWS and baseline is None:
        # ... with every analysis below: it needs the clock offsets, the expected link and the host CPU, not the
        # step metrics (its result is kept only if the run has steps, as before)
        side, link = read_logs(con, run_id, run, facts, options, side_warnings)
        matched = match_collectives(con, run_id, mode, groups=mode == "gpu")  # the graph's calls too
        rp = ReplayRun(con, run_id, mode, facts["world_size"], matched.clock_offsets_us, link, side, beside=True,
                       gpu=gpu, calls=matched.calls)
    rank_rows, step_rows = metrics.compute_run_metrics(con, run_id)
    metrics.save(con, rank_rows, step_rows)
    warnings.extend(assemble.window_differences(rank_rows))
    if good and mode == "gpu":  # kernels of no known class weighing > 5 % of kernel time: a data-quality row
        warnings.extend(kernels.unclassified_warning(kernels.unclassified_kernels(con, run_id), str(run.path)))
    if rp is None:
        side, link = read_logs(con, run_id, run, facts, options, side_warnings)
    warnings.extend(side_warnings)
    if not good:
        mode = "logs"
        warnings.append({"file": str(run.path), "level": "warning",
                         "message": "no trace found: no Kineto trace (*.json, *.json.gz with a traceEvents array) "
                                    "for this run; the report shows what its logs say"})
    steps_by_rank: dict[int, list[tuple[int, int, int]]] = {}
    for st in step_rows:
        steps_by_rank.setdefault(st.rank, []).append((st.step, st.start_ns, st.start_ns + int(st.step_time_us * 1e3)))
    matched = match_collectives(con, run_id, mode, groups=mode == "gpu") if good and matched is None else matched
    coll = analyze_collectives(con, run_id, mode, facts["world_size"], steps_by_rank, matched) if good else None
    if from_base and coll is not None:
        from traceanalyze.replay.scenarios.ranks import link_from_baseline

        link = link_from_baseline(link, coll.summaries, baseline.name, baseline.coll.summaries)
    # with a baseline: the precision and loader figures first, for the what-ifs the baseline prices
    prec, loader, figures = before_replay(con, run_id, mode, facts, options, gpu, baseline) if good else (None,) * 3
    if rp is None and good and step_rows:  # ... with the analyses below, or in turn for a big run
        rp = ReplayRun(con, run_id, mode, facts["world_size"], coll.clock_offsets_us if coll else None, link, side,
                       beside=beside, gpu=gpu, baseline=figures, calls=matched.calls if matched else None)
    replay, written = rp.finish(bool(step_rows), warnings) if rp is not None else (lambda: ({}, [], {}), lambda: None)
    prec = prec or (analyze_precision(con, run_id, mode, facts["gpu_model"], options.peak_tflops,
                                      gpu.capability if gpu else None) if good else None)
    comp = compile_stats(con, run_id) if good else None
    loader = loader_stats(con, run_id) if good and loader is None else loader
    launch = launch_stats(con, run_id) if good and mode == "gpu" else None
    idle_rows, top = (idle_result() if idle_result else []), (top_result() if top_result else [])
    cur.close()
    idle.save(con, idle_rows)
    if coll is not None:
        cols = list(CollectiveSummary.__dataclass_fields__)
        store.insert_rows(con, "collective_calls", ["run_id", *cols],
                          [[run_id, *(getattr(c, f) for f in cols)] for c in coll.summaries])
    return RunAnalyses(mode, rank_rows, step_rows, side, coll, link, prec, comp, loader, launch, idle_rows, top,
                       replay, written, n_rows, rp.pricer if rp is not None else [], memory_rows)


def before_replay(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, facts: dict, options: Options,
                  gpu: hardware.GpuInfo | None, baseline: diagnose.RunEvidence | None) -> tuple:
    """(precision mix, loader stats, the baseline's figures) of a run compared with ``baseline`` (``--baseline``),
    before its replay: the baseline's measured matrix-math speed-up and loader wait price its what-ifs
    (:func:`traceanalyze.replay.frombase.baseline_figures`); (None, None, None) without a baseline."""
    if baseline is None:
        return None, None, None
    from traceanalyze.metrics.host import loader_stats
    from traceanalyze.metrics.precision import analyze_precision
    from traceanalyze.replay.frombase import baseline_figures

    prec = analyze_precision(con, run_id, mode, facts["gpu_model"], options.peak_tflops,
                             gpu.capability if gpu else None)
    loader = loader_stats(con, run_id)
    cpu = next((f.value for f in (baseline.facts or {}).get("cpu_model") or []), None)
    return prec, loader, baseline_figures(baseline.name, prec, loader, baseline.prec, baseline.loader, cpu)


class ReplayRun:
    """One run's what-if replay (:func:`replay`) on a cursor of its own: ``beside`` the analyses, on a thread
    started now (its graph built on one thread: the analyses use the other CPU), else in turn, when
    :meth:`finish` is called (its graph built on every CPU). ``side``: the run's sidecars (the host CPU and the
    step without the profiler they state); ``baseline``: the compared baseline's measured figures
    (:func:`before_replay`)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world: int | None,
                 offsets: dict | None, link: dict, side: dict, beside: bool,
                 gpu: hardware.GpuInfo | None = None, baseline: dict | None = None, calls: Calls | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from traceanalyze.logs import sidecars

        cpu, unprofiled = sidecars.cpu_host(side["facts"], mode, world), side.get("unprofiled")
        self.cur = store.steps_cursor(con)  # the replay reads the steps several times
        self.writes: list[Callable[[], None]] = []  # the sim_* tables: written after the replay, on its thread
        self.warnings: list[dict] = []  # the replay's, added to the run's once it is kept and written
        self.pricer: list = []  # the replay's pricer of one more what-if (whatif.replay_run), once it is done
        self.pool = ThreadPoolExecutor(max_workers=1) if beside else None
        self.result = deferred(self.pool, replay, self.cur, run_id, mode, world, offsets, link, cpu, self.warnings,
                               self.writes, 1 if beside else None, gpu, unprofiled, self.pricer, baseline, calls)

    def finish(self, keep: bool, warnings: list[dict]) -> tuple[Callable[[], tuple], Callable[[], None]]:
        """(wait for the replay's models, wait for its tables): with ``keep`` False (a run without steps: no
        replay, as always) the models are empty and nothing is written once it ends. In turn, both are done
        here."""
        if not keep:  # after the replay, on its thread: what it leaves to write is dropped
            deferred(self.pool, discard_writes, self.writes)
        written = deferred(self.pool, write_replay, self.cur, self.writes, self.warnings)
        if self.pool is not None:
            self.pool.shutdown(wait=False)
        replay = self.result if keep else (lambda: ({}, [], {}))

        def done() -> None:
            written()
            if keep:
                warnings.extend(self.warnings)

        if self.pool is None:  # in turn: replayed, written and freed before the next stage
            models = replay()
            done()
            return (lambda: models), (lambda: None)
        return replay, done


def evidence(con: duckdb.DuckDBPyConnection, run_id: int, run: Run, a: RunAnalyses, facts: dict,
             gpu: hardware.GpuInfo | None, good: bool) -> tuple[diagnose.RunEvidence, dict, float | None]:
    """What the rules read about the run (:class:`diagnose.RunEvidence`); returns (evidence, longest rank's µs
    per counted step without the compile step, the compile step's µs)."""
    from traceanalyze import diagnose
    from traceanalyze.metrics import accumulation, allocator, host, steps, where

    mode, rank_rows, step_rows, side, coll, link = a.mode, a.rank_rows, a.step_rows, a.side, a.coll, a.link
    prec, comp, loader, launch, idle_rows = a.prec, a.comp, a.loader, a.launch, a.idle_rows
    ranks_model = [assemble.rank_model(r) for r in rank_rows]
    steps_model = [asdict(s) for s in step_rows]
    # the run's step time: median over the counted steps of the longest rank's duration (metrics.steps)
    # ... the compile step (torch.compile in the first step) shown apart: it is no steady step (diagnose)
    compile_step = diagnose.compile_step_of(steps_model, comp)
    longest = steps.longest_per_step((st.step, st.step_time_us) for st in step_rows)
    compile_step_us = longest.pop(compile_step, None)
    step_time = steps.median(longest.values())
    world = facts["world_size"]
    if not good:  # log-only: what the logs say, else NCCL's communicator size, else the ranks that logged
        ws_fact = side["facts"].get("world_size")
        log_ranks = {st.rank for st in side["log_steps"] if st.rank is not None}
        if ws_fact and ws_fact[0].num:
            world = int(ws_fact[0].num)
        elif side["nccl"] is not None and getattr(side["nccl"], "nranks", None):
            world = int(side["nccl"].nranks)
        elif log_ranks:
            world = max(log_ranks) + 1
    ev = diagnose.RunEvidence(
        name=run.name, mode=mode, world_size=world, gpu_model=facts["gpu_model"], ranks=ranks_model,
        steps=steps_model, step_time_us=step_time, coll=coll, prec=prec, compile=comp, loader=loader,
        launch=launch, facts=side["facts"], log_steps=side["log_steps"], nccl=side["nccl"],
        topology=side["topology"], link=link, idle=[r.model() for r in idle_rows], gpu=gpu, compile_step=compile_step)
    view = None
    if good and mode == "gpu":  # blocking calls, the optimizer, the top CPU ops of the steady steps: on a cursor
        # and thread of their own, beside the two analyses below (DuckDB works without the GIL)
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=1) if a.n_rows <= OVERLAP_MAX_ROWS else None  # big: in turn (memory)
        cur = store.steps_cursor(con)  # its three queries read the steps
        view = deferred(pool, host.host_view, cur, run_id, compile_step)
        if pool is not None:
            pool.shutdown(wait=False)
    if good and steps_model:
        ev.where_source = lambda: (where.op_time_per_step(con, run_id, mode), *where.host_gaps(con, run_id))
        if side["facts"].get("gradient_accumulation_steps"):  # what a profiler step is: micro-batch or optimizer step
            ev.accumulation = accumulation.optimizer_steps(con, run_id)
    if view is not None:
        ev.host = view()
        cur.close()
    if good and mode == "gpu":
        ev.cache_flush = allocator.cache_flushes(con, run_id, compile_step)
        assemble.add_cache_flush(ranks_model, ev.cache_flush)
    ev.unprofiled = side.get("unprofiled")  # the step without the profiler, measured (capture or log)
    ev.ooms = side.get("ooms") or []
    if a.memory_rows is not None:  # before the rules read the ranks
        assemble.add_memory(ranks_model, a.memory_rows())
    return ev, longest, compile_step_us


def memory_beside(con: duckdb.DuckDBPyConnection, run_id: int, n_rows: int) -> Callable[[], list] | None:
    """Each rank's memory per device (:func:`traceanalyze.metrics.memory.memory_rows`), computed on a cursor and
    thread of its own beside the other evidence (in turn for a big run, as the analyses); the returned callable
    waits for the rows. None for a run whose traces hold no ``[memory]`` events (one indexed query). Started as
    the analyses start (:func:`analyses`), waited for in :func:`evidence`."""
    from concurrent.futures import ThreadPoolExecutor

    from traceanalyze.metrics import memory

    if not memory.has_memory(con, run_id):
        return None
    pool = ThreadPoolExecutor(max_workers=1) if n_rows <= OVERLAP_MAX_ROWS else None
    cur = store.steps_cursor(con)  # it reads the steps twice: those computed once (store.materialize_steps)
    rows = deferred(pool, memory.memory_rows, cur, run_id)
    if pool is not None:
        pool.shutdown(wait=False)

    def done() -> list:
        try:
            return rows()
        finally:
            cur.close()

    return done


def run_model(run_id: int, run: Run, role: str, a: RunAnalyses, ev: diagnose.RunEvidence, facts: dict,
              by_rank: dict, grouping: list, good: list, ranks: dict, longest: dict,
              compile_step_us: float | None) -> dict:
    """The run's part of the report model (``docs/schema.md``, ``runs[i]``); waits for the replay's models."""
    from traceanalyze import diagnose
    from traceanalyze.logs import sidecars
    from traceanalyze.metrics import mfu

    coll, prec, comp, loader, side, link, top = a.coll, a.prec, a.comp, a.loader, a.side, a.link, a.top
    replay_model, whatif, picture = a.replay()
    add_skew(ev, (replay_model or {}).pop("collective_skew", None))
    mode, world, ranks_model, steps_model, step_time, compile_step = ev.mode, ev.world_size, ev.ranks, ev.steps, \
        ev.step_time_us, ev.compile_step
    model = {
        "run_id": run_id,
        "name": run.name,
        "path": str(run.path),
        "role": role,
        "mode": mode,
        **facts,
        "world_size": world,
        "ranks_found": sorted(by_rank),
        "file_grouping": "; ".join(grouping) if len(grouping) > 1 else None,
        "files": [{"path": str(lf.path), "rank": ranks[lf.path], "cached": lf.cached} for lf in good],
        "sidecars": [{"path": str(s.path), "kind": s.kind} for s in run.sidecars],
        "ranks": ranks_model,
        "steps": steps_model,
        "top_kernels": top,
        "step_time_us": step_time,
        "step_stat": diagnose.step_stat(len(longest)),
        "compile_step": ({"step": compile_step, "step_time_us": compile_step_us} if compile_step is not None
                         else None),
        "link": link,
        "clock_offsets_us": coll.clock_offsets_us if coll else {},
        "collectives": [asdict(c) for c in coll.summaries] if coll else [],
        "idle_breakdown": [dict(m) for m in ev.idle],  # the evidence's rows (idle_rows' models), copied
        "collective_wait_us": coll.wait_us if coll else {},
        "dtype_mix": prec.mix if prec else [],
        "precision": ({k: v for k, v in asdict(prec).items() if k not in ("mix", "family_us_per_step")}
                      if prec else None),
        "compile": asdict(comp) if comp and (comp.compile_us or comp.compiled_regions) else None,
        "dataloader": ({k: v for k, v in asdict(loader).items() if k != "n_steps"}
                       if loader and loader.loader_us else None),
        "host": ev.host.model() if ev.host is not None else None,
        "log_facts": {k: [f.value for f in v] for k, v in side["facts"].items()},
        "log_steps": len(side["log_steps"]),
        "log_step_time_ms": sidecars.log_step_time(side["log_steps"]),
        "deaths": [asdict(o) for o in side.get("ooms") or []],
        "profiler_overhead": (replay_model or {}).pop("profiler_overhead", None),
        "replay": replay_model or None,
        "whatif": whatif,
        "replay_picture": picture or None,
    }
    model["effective_batch"] = diagnose.effective_batch_of(ev)
    model["mfu_pct"], model["mfu"] = mfu.mfu(prec, ev.gpu, model)
    return model


def add_skew(ev: diagnose.RunEvidence, sk: Any) -> None:
    """Who waited for whom (``sk``: :class:`traceanalyze.replay.skew.Skew`, or None without a replay) into the
    evidence (``ev.skew``) and each rank of the run model: ``waited_for_others_us`` and ``kept_others_waiting_us``
    (µs summed over the run's complete collective instances; None when no instance is complete)."""
    ev.skew = sk if sk is not None and sk.n else None
    for r in ev.ranks:
        has = ev.skew is not None
        r["waited_for_others_us"] = round(sk.waited_for_others_us.get(r["rank"], 0.0), 3) if has else None
        r["kept_others_waiting_us"] = round(sk.kept_others_waiting_us.get(r["rank"], 0.0), 3) if has else None


def timeline(con: duckdb.DuckDBPyConnection, run_id: int, run_model: dict, ev: diagnose.RunEvidence,
             findings: list) -> dict | None:
    """The median step's timeline (:func:`traceanalyze.metrics.where.timeline_model`): the ranks findings name
    first, the straggler's (or late rank's) largest host gaps in that step marked."""
    from traceanalyze.metrics import where

    named = [r for f in findings if f.severity != "low" and f.cause == "imbalance" and len(f.ranks) < len(ev.ranks)
             for r in f.ranks]
    st = where.median_step(run_model["steps"])
    marked: dict[int, list[dict]] = {}
    for f in findings:
        if f.kind in ("straggler", "late_entry") and st is not None:
            gaps, _ = where.host_gaps(con, run_id, f.ranks, top=3, step=st)
            for g in gaps.get(f.ranks[0], []):
                if g.dur_us >= 0.01 * (ev.step_time_us or 0.0):  # the gaps one can see at this scale
                    marked.setdefault(g.rank, []).append({"start_us": g.offset_us, "dur_us": g.dur_us,
                                                          "label": "host gap", "cause": f.cause})
    return where.timeline_model(con, run_id, run_model["mode"], run_model["steps"], marked, named)


def replay(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, world: int | None, offsets: dict | None,
           link: dict, cpu: tuple, warnings: list[dict], writes: list, build_threads: int | None = None,
           gpu: hardware.GpuInfo | None = None, unprofiled: dict | None = None, pricer: list | None = None,
           baseline: dict | None = None, calls: Calls | None = None) -> tuple:
    """The what-if replay of one run (traceanalyze.replay); a failure costs a warning, not the report. ``offsets``:
    rank -> clock offset (µs, :func:`.metrics.collectives.match_collectives`); ``cpu``:
    :func:`traceanalyze.logs.sidecars.cpu_host`; ``writes`` receives the writing of its tables
    (:func:`write_replay`); ``build_threads``: threads building its graph (:func:`traceanalyze.replay.graph.build`);
    ``pricer`` receives the pricer of one more what-if for a
    finding (:func:`traceanalyze.diagnose.price_missing_whatifs`), one that says why on a failure; ``baseline``:
    the compared baseline's measured figures (:func:`traceanalyze.replay.frombase.baseline_figures`); ``calls``: the
    run's collective calls, when the analyses have them (:func:`traceanalyze.replay.graph.build`)."""
    from traceanalyze.replay.whatif import replay_run

    try:
        return replay_run(con, run_id, mode, world, offsets, link.get("expected_gbps"), link.get("source", ""),
                          cpu_native_bf16=cpu[0], cpu_model=cpu[1], defer=writes, build_threads=build_threads,
                          gpu=gpu, unprofiled_measured=unprofiled, core_sharing=cpu[2],
                          pricer=pricer, baseline=baseline, calls=calls)
    except (ValueError, IndexError, KeyError, duckdb.Error) as exc:  # a graph the replay cannot handle
        warnings.append({"file": None, "level": "warning", "message": f"what-if replay skipped: {exc}"})
        if pricer is not None:
            why = f"the replay was skipped: {exc}"[:300]
            pricer[:] = [lambda scenario, ranks=None: (None, why, [])]
        return {}, [], {}


def write_replay(cur, writes: list, warnings: list[dict]) -> None:
    """Write the replay's tables (``writes``, from :func:`replay`) on its cursor, then close it; a failure costs a
    warning."""
    try:
        for w in writes:
            w()
    except (ValueError, IndexError, KeyError, duckdb.Error) as exc:
        warnings.append({"file": None, "level": "warning", "message": f"what-if replay tables not written: {exc}"})
    finally:
        writes.clear()  # the graph goes with them
        cur.close()


def discard_writes(writes: list) -> None:
    """Drop the replay's writes (a run kept without its replay): each one's ``discard`` (what it started writing
    is waited for and deleted), then the list."""
    for w in writes:
        discard = getattr(w, "discard", None)
        if discard is not None:
            discard()
    writes.clear()


def deferred(pool: ThreadPoolExecutor | None, fn: Callable, *args) -> Callable[[], Any]:
    """``fn(*args)`` started now on ``pool`` (the returned callable waits for its result), or, without a pool,
    run when the returned callable is called: in turn, at the point where the result is needed."""
    if pool is None:
        return lambda: fn(*args)
    return pool.submit(fn, *args).result
