"""Command line: ``traceanalyze report``, ``traceanalyze sql``, ``traceanalyze batch``. A thin layer over
:mod:`traceanalyze.pipeline` (and :mod:`traceanalyze.batch`).

Every error a user can cause (missing folder, unreadable trace, locked database) is printed as one line
and exits with status 1; a Python traceback appears only with ``--debug``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from traceanalyze import __version__
from traceanalyze.errors import TraceanalyzeError


def _slug(paths: tuple[str, ...]) -> str:
    p = Path(paths[0]).resolve()
    name = p.name if p.is_dir() else p.stem.split(".")[0]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "report"


class _Progress:
    """tqdm bar over bytes of trace files; off when stderr is not a terminal or with --quiet."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None

    def total(self, n: int) -> None:
        if self.enabled and n > 0:
            from tqdm import tqdm

            self.bar = tqdm(total=n, unit="B", unit_scale=True, desc="ingest", file=sys.stderr, leave=False)

    def step(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _line(msg: str) -> str:
    """One terminal line: newlines and control characters (from file or kernel names) shown as ``?``."""
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", "?", msg)


class _Size(click.ParamType):
    """A byte size: ``1048576``, ``512M``, ``64G``, ``1T`` (powers of 1024; a trailing ``B``/``iB`` is allowed)."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(value), re.IGNORECASE)
        if not m or float(m.group(1)) <= 0:
            self.fail(f"{value!r} is not a size such as 512M or 64G", param, ctx)
        return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="traceanalyze")
@click.option("--debug", is_flag=True, help="Show Python tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Explain why a distributed PyTorch training run was slow, from its profiler traces and logs."""
    ctx.obj = {"debug": debug}


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="HTML report to write "
              "(default: ./traceanalyze-<folder>.html).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the report as JSON.")
@click.option("--md", "md_path", type=click.Path(dir_okay=False), help="Also write a Markdown summary.")
@click.option("--format", "fmt", type=click.Choice(["html", "json", "md"]), default="html", show_default=True,
              help="Format of -o (json/md print to stdout when -o is not given).")
@click.option("--db", type=click.Path(dir_okay=False), help="DuckDB file to write and reuse as a parse cache "
              "(default: next to the report, .duckdb).")
@click.option("--baseline", multiple=True, type=click.Path(), help="Traces of a run to compare against.")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), help="Parallel parse processes (default: CPUs).")
@click.option("--link-bw", type=click.FloatRange(min=0, min_open=True), metavar="GB/s",
              help="Expected per-direction link bandwidth between ranks, to judge busbw against.")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), metavar="TFLOPS",
              help="Dense peak of one GPU for the main matmul dtype, for MFU.")
@click.option("--gpu", metavar="NAME|smXY", help="The GPU, when the trace's deviceProperties do not say: a name "
              "(V100, A100, H100, ...) or a compute capability (sm70, sm80, 9.0); precision advice depends on it.")
@click.option("--max-decompressed", type=_Size(), default="64G", show_default=True, metavar="SIZE",
              help="Bound on what one trace may inflate to (a gzip bomb is an error naming the file): 512M, 64G, ...")
@click.option("--export", "export_path", type=click.Path(dir_okay=False), metavar="FILE.json[.gz]",
              help="Also write a merged, clock-aligned trace of every rank (Perfetto) beside the HTML and link it.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary.")
@click.pass_context
def report(ctx: click.Context, paths: tuple[str, ...], output: str | None, json_path: str | None,
           md_path: str | None, fmt: str, db: str | None, baseline: tuple[str, ...], jobs: int | None,
           link_bw: float | None, peak_tflops: float | None, gpu: str | None, max_decompressed: int,
           export_path: str | None,
           quiet: bool) -> None:
    """Analyze the traces under PATHS and write one self-contained HTML report.

    \b
    Example:
        traceanalyze report ./traces
        traceanalyze report ./traces -o slow.html --json slow.json
        traceanalyze report ./8gpu --baseline ./1gpu
        traceanalyze report ./traces --export merged.json.gz
    """
    from traceanalyze import render
    from traceanalyze.pipeline import analyze, to_json

    def run() -> None:
        slug = _slug(paths)
        out = Path(output) if output else None
        if out is None and fmt == "html":
            out = Path(f"traceanalyze-{slug}.html")
        db_path = Path(db) if db else (out.with_suffix(".duckdb") if out is not None
                                       else Path(f"traceanalyze-{slug}.duckdb"))
        db_path.parent.mkdir(parents=True, exist_ok=True)
        prog = _Progress(enabled=not quiet and sys.stderr.isatty())
        try:
            a = analyze(list(paths), db=db_path, baseline=list(baseline) or None, jobs=jobs,
                        progress=prog.step, on_total=prog.total, link_bw_gbps=link_bw, peak_tflops=peak_tflops,
                        max_decompressed=max_decompressed, gpu=gpu)
        finally:
            prog.close()
        model = a.model
        if fmt == "json":
            text = to_json(model)
            _write_or_print(out, text)
        elif fmt == "md":
            _write_or_print(out, render.markdown(model))
        else:
            assert out is not None
            out.parent.mkdir(parents=True, exist_ok=True)
            if export_path:
                from traceanalyze.export import export_beside

                model["export_path"], _ = export_beside(a.con, out, export_path)
            out.write_text(render.html(model), encoding="utf-8")
        if json_path:
            Path(json_path).write_text(to_json(model), encoding="utf-8")
        if md_path:
            Path(md_path).write_text(render.markdown(model), encoding="utf-8")
        a.con.close()
        for w in model["warnings"]:  # errors even with --quiet; partial files and warnings without it
            if w.get("level") == "error" or (not quiet and w.get("level") in ("partial", "warning")):
                click.echo(_line(f"traceanalyze: {w['file']}: {w['message']}" if w["file"]
                                 else f"traceanalyze: {w['message']}"), err=True)
        if not quiet:
            n_ranks = sum(len(r["ranks"]) for r in model["runs"])
            if out is not None and fmt == "html" or (out is not None and fmt != "html"):
                click.echo(f"wrote {out} ({len(model['runs'])} run(s), {n_ranks} rank(s)); database {db_path}",
                           err=True)
        if not any(r["ranks"] or r["log_steps"] or r["log_facts"] for r in model["runs"]):
            raise TraceanalyzeError("nothing could be analyzed: every trace file was unreadable (see above)")

    _guard(ctx, run)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Trace to write: .json, or .json.gz for gzip.")
@click.option("--db", type=click.Path(dir_okay=False), help="DuckDB file to use as a parse cache (default: in "
              "memory). A PATH ending in .duckdb is read as an existing report database instead of traces.")
@click.option("--run", "run_name", help="Run to export (default: the first subject run).")
@click.option("--max-events", type=click.IntRange(min=1), default=2_000_000, show_default=True,
              help="Bound on events written: findings and annotations first, then kernels, then top-level ops.")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), help="Parallel parse processes (default: CPUs).")
@click.option("-q", "--quiet", is_flag=True, help="No summary line.")
@click.pass_context
def export(ctx: click.Context, paths: tuple[str, ...], output: str, db: str | None, run_name: str | None,
           max_events: int, jobs: int | None, quiet: bool) -> None:
    """Write one Chrome/Perfetto trace of every rank of a run: one process per rank, clocks aligned on the
    collectives, and the findings as ranges on a "traceanalyze findings" track.

    \b
    Example:
        traceanalyze export ./traces -o merged.json.gz      # open in https://ui.perfetto.dev
        traceanalyze export report.duckdb -o merged.json.gz
    """

    def run() -> None:
        from traceanalyze.export import export_trace

        if len(paths) == 1 and paths[0].endswith(".duckdb") and Path(paths[0]).is_file():
            from traceanalyze.api import load

            rep = load(paths[0])
            con = rep.con
        else:
            from traceanalyze.pipeline import analyze

            con = analyze(list(paths), db=db, jobs=jobs).con
        try:
            res = export_trace(con, output, run=run_name, max_events=max_events)
        finally:
            con.close()
        if not quiet:
            note = f"; left out {sum(res.dropped.values())} events over --max-events" if res.dropped else ""
            click.echo(f"wrote {res.path} (run {res.run}, ranks {', '.join(map(str, res.ranks))}, "
                       f"{res.n_events} events{note})", err=True)

    _guard(ctx, run)


def _write_or_print(out: Path | None, text: str) -> None:
    if out is None:
        click.echo(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")


@cli.command()
@click.argument("db", type=click.Path(exists=True, dir_okay=False))
@click.argument("query")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@click.pass_context
def sql(ctx: click.Context, db: str, query: str, as_csv: bool) -> None:
    """Run a SQL QUERY against a report database (read-only) and print the result.

    \b
    Example:
        traceanalyze sql traceanalyze-traces.duckdb "SELECT rank, idle_pct FROM rank_metrics"
    """
    import duckdb

    def run() -> None:
        try:
            con = duckdb.connect(db, read_only=True)
        except duckdb.Error as exc:
            raise TraceanalyzeError(f"{db}: cannot open ({str(exc).splitlines()[0]})") from None
        try:
            rel = con.sql(query)
        except duckdb.Error as exc:
            raise TraceanalyzeError(f"query failed: {str(exc).splitlines()[0]}") from None
        if rel is None:
            return
        if as_csv:
            import csv

            w = csv.writer(sys.stdout)
            w.writerow(rel.columns)
            w.writerows(rel.fetchall())
        else:
            rel.show(max_width=10_000, max_rows=10_000)
        con.close()

    _guard(ctx, run)


@cli.command()
@click.argument("archive", type=click.Path())
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), required=True,
              help="Output folder: catalog.duckdb, index.html and runs/<run>/ reports (reused on a re-run).")
@click.option("-j", "--jobs", type=click.IntRange(1, 1024), help="Runs analyzed at once (default: CPUs); "
              "with --executor dask, the local cluster's worker processes.")
@click.option("--executor", type=click.Choice(["local", "dask"]), default="local", show_default=True,
              help="local: processes on this machine; dask: a Dask cluster (pip install 'traceanalyze[dask]').")
@click.option("--scheduler", metavar="tcp://HOST:8786", help="Dask scheduler of a running cluster (implies "
              "--executor dask; workers must see ARCHIVE and OUTPUT at the same paths).")
@click.option("--threshold", type=click.FloatRange(min=1, min_open=True), default=1.2, show_default=True,
              help="Flag a run whose step time exceeds this × the median of its group's earlier runs.")
@click.option("--force", is_flag=True, help="Analyze every run again, changed or not.")
@click.option("--link-bw", type=click.FloatRange(min=0, min_open=True), metavar="GB/s",
              help="Expected per-direction link bandwidth between ranks, to judge busbw against.")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), metavar="TFLOPS",
              help="Dense peak of one GPU for the main matmul dtype, for MFU.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary.")
@click.pass_context
def batch(ctx: click.Context, archive: str, outdir: str, jobs: int | None, executor: str, scheduler: str | None,
          threshold: float, force: bool, link_bw: float | None, peak_tflops: float | None, quiet: bool) -> None:
    """Analyze every run under ARCHIVE; keep a catalog of them and an index page that flags regressions.

    Re-running on the same OUTPUT analyzes only new or changed runs; runs gone from ARCHIVE drop out.

    \b
    Example:
        traceanalyze batch /archive/traces -o /reports/archive
        traceanalyze sql /reports/archive/catalog.duckdb "SELECT run_id, step_time_us, top_cause FROM runs"
    """
    from traceanalyze.batch import run_batch

    def run() -> None:
        bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(unit="run", desc="batch", file=sys.stderr, leave=False)
        try:
            res = run_batch(archive, outdir, jobs=jobs, executor=executor, scheduler=scheduler, threshold=threshold,
                            force=force, link_bw_gbps=link_bw, peak_tflops=peak_tflops,
                            on_run=(lambda _row: bar.update(1)) if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        if not quiet:
            for r in res.runs:
                if r["status"] == "error" and r["run_id"] in res.analyzed:
                    click.echo(f"traceanalyze: {r['run_id']}: {r['error']}", err=True)
            rate = (f" in {res.seconds:.1f} s ({res.runs_per_s:.2f} runs/s, {res.mb_per_s:.1f} MB/s of traces)"
                    if res.analyzed else f" in {res.seconds:.1f} s")
            click.echo(f"{len(res.runs)} run(s): {len(res.analyzed)} analyzed, {len(res.unchanged)} unchanged, "
                       f"{len(res.removed)} removed, {len(res.errors)} error(s), {len(res.regressions)} "
                       f"regression(s){rate}; index {res.index}, catalog {res.catalog}", err=True)
        if res.runs and all(r["status"] == "error" for r in res.runs):
            raise TraceanalyzeError("nothing could be analyzed: every run failed (see index.html)")

    _guard(ctx, run)


def _guard(ctx: click.Context, fn) -> None:
    """Run ``fn``; project errors and I/O errors become one line on stderr and exit status 1."""
    if ctx.obj.get("debug"):
        fn()
        return
    try:
        fn()
    except TraceanalyzeError as exc:
        click.echo(_line(f"traceanalyze: {exc}"), err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("traceanalyze: interrupted; files loaded so far stay in the database", err=True)
        sys.exit(130)
    except OSError as exc:
        click.echo(f"traceanalyze: {exc.filename or ''}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    except Exception as exc:  # a bug: still one line, and how to see more
        click.echo(f"traceanalyze: internal error ({type(exc).__name__}: {exc}); rerun with --debug for the "
                   "traceback and report it", err=True)
        sys.exit(2)


def main() -> None:
    """Console-script entry point."""
    from traceanalyze.store import block_pandas

    block_pandas()
    cli(prog_name="traceanalyze")


if __name__ == "__main__":
    main()
