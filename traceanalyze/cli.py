"""Command line: ``traceanalyze report``, ``traceanalyze sql``, ``traceanalyze batch``. A thin layer over
:mod:`traceanalyze.pipeline` (and :mod:`traceanalyze.batch`).

Every error a user can cause (missing folder, unreadable trace, locked database) is printed as one line and
exits with the status of the README's table (:mod:`traceanalyze.errors`: 1 input, 2 usage, 3 a refused write, 4
out of memory, 5 a bug); a Python traceback appears only with ``--debug``. ``report --fail-on high|medium`` and
``batch --fail-on-regression`` exit with 3 (:data:`EXIT_FINDING`) once everything is written, when a finding of
that severity or a regression exists, for CI. ``report`` prints the verdict and the top findings on stdout, one
line each (:func:`summary_lines`; ``-q`` silences it, and it is left out when the report itself goes to stdout).
Everything printed goes through
:func:`traceanalyze.safety.terminal` (control characters and bidi overrides shown as ``?``).
"""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import re
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from traceanalyze import options, pipeline
from traceanalyze.api import load
from traceanalyze.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_MEMORY,
    EXIT_WRITE,
    EnvironmentFailure,
    TraceanalyzeError,
    UsageError,
)
from traceanalyze.executors import on_thread
from traceanalyze.findings import DIED_KINDS
from traceanalyze.fmt import finite, fmt_float, ranges
from traceanalyze.ingest import block_pandas
from traceanalyze.limits import DEFAULT_MAX_EVENTS, REGRESSION_THRESHOLD
from traceanalyze.options import Options
from traceanalyze.report import render_html, render_markdown
from traceanalyze.report.assemble import to_json
from traceanalyze.report.paths import page_model
from traceanalyze.safety import atomic_write_text, check_outputs, terminal, terminal_block
from traceanalyze.store import checkpoint_meanwhile, open_untrusted, untrusted_error
from traceanalyze.version import __version__

if TYPE_CHECKING:
    import duckdb


def _slug(paths: tuple[str, ...], here: Path | None = None) -> str:
    """The default report name's part from the first input: its folder name (a file's stem).

    An ordinary name (ASCII letters, digits, ``_.-``, not starting with ``.`` or ``-``) is kept as it is:
    ``runA`` gives ``traceanalyze-runA.html``. So is it unless a report for a name that differs only in case is
    already in ``here`` (default: the current folder), where a case-insensitive file system would overwrite it. Any
    other name keeps its letters and digits (Unicode too, NFC), other characters become ``_``, and it gets ``-``
    plus 8 hex digits of the SHA-256 of the resolved path: ``rün``, ``run `` and ``run\u200b`` give distinct names,
    also on normalising file systems.
    """
    p = Path(paths[0]).resolve()
    name = p.name if p.is_dir() else p.stem.split(".")[0]
    if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) and len(name) <= 80 and not _case_twin(name, here):
        return name
    clean = "".join(c if c.isalnum() or c in "_.-" else "_" for c in unicodedata.normalize("NFC", name))
    clean = clean.lstrip(".-")[:80] or "report"
    return f"{clean}-{hashlib.sha256(str(p).encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def _case_twin(name: str, here: Path | None) -> bool:
    """Whether ``here`` holds a default report (``traceanalyze-<other>.html`` or ``.duckdb``) for a name that
    differs from ``name`` only in case."""
    try:
        entries = os.listdir(here or ".")
    except OSError:
        return False
    for e in entries:
        m = re.fullmatch(r"traceanalyze-(.+)\.(?:html|duckdb)", e)
        if m and m.group(1) != name and m.group(1).casefold() == name.casefold():
            return True
    return False


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


EXIT_FINDING = 3  # --fail-on / --fail-on-regression: the reports are written and a finding or regression exists
SUMMARY_FINDINGS = 5
_SEVERITIES = {"high": 0, "medium": 1, "low": 2}


def _say(msg: str) -> None:
    click.echo(terminal(msg), err=True)


def summary_lines(model: dict, limit: int = SUMMARY_FINDINGS) -> list[str]:
    """The verdict and up to ``limit`` findings of high or medium severity, one line each (terminal-safe text is
    made by the caller): ``verdict: ...`` then ``[high] 53.3% imbalance/straggler: title (ranks 2)``."""
    out = [f"verdict: {model.get('verdict') or '—'}"]
    conf = model.get("verdict_confidence")
    if isinstance(conf, dict) and conf.get("level"):
        why = conf.get("why") or []
        out.append(f"confidence: {conf.get('level')}" + (f" · {conf['line']}" if conf.get("line") else "")
                   + (f" (not higher because: {'; '.join(str(w) for w in why[:6])})" if why else ""))
    top = [f for f in model.get("findings") or [] if f.get("severity") in ("high", "medium")]
    for f in top[:limit]:
        ranks = f.get("ranks") or []
        where = f" (rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)})" if 0 < len(ranks) <= 8 else ""
        level = (f.get("confidence") or {}).get("level") if isinstance(f.get("confidence"), dict) else None
        part = f" (part of {f['part_of']})" if f.get("part_of") else ""
        share = ("died" if f.get("kind") in DIED_KINDS else "what is trained" if f.get("effect")
                 else f"{float(f.get('impact_pct') or 0):.1f}%")
        out.append(f"[{f.get('severity')}] {share} {f.get('cause')}/{f.get('kind')}: "
                   f"{f.get('title')}{where}{part}" + (f" ({level} confidence)" if level else ""))
    if len(top) > limit:
        out.append(f"... {len(top) - limit} more finding(s) in the report")
    return out + comparison_lines(model)


def _signed(x) -> str:
    """A number with one decimal and its sign (``+4.2``, ``-3.6``), or ``—``."""
    v = finite(x)
    return "—" if v is None else f"{v:+.1f}"


def comparison_lines(model: dict) -> list[str]:
    """With a baseline: each what-if the baseline checks, ``what-if bf16_matmul: predicted 78.6% saved, measured
    82.2% (-3.6 points; step without the profiler, estimate/estimate)``, then ``next bottleneck (fixed): ...`` or
    that the faster run is healthy (``comparison.whatif_check``, ``comparison.next_bottleneck``)."""
    comp = model.get("comparison")
    if not isinstance(comp, dict):
        return []
    out = []
    k = comp.get("comparable")
    if isinstance(k, dict) and k.get("verdict"):  # whether the runs compare, and the step ratio (docs/comparisons.md)
        out.append(f"comparison: {k.get('verdict')} (comparability {fmt_float(k.get('score'), 2)})")
    if comp.get("whatif_check") == []:
        out.append("what-if check: none of this run's what-ifs has its cause fixed in the baseline")
    for w in comp.get("whatif_check") or []:
        if not isinstance(w, dict):
            continue
        src = w.get("basis_source") if isinstance(w.get("basis_source"), dict) else {}
        basis = ("step without the profiler" if w.get("basis") == "unprofiled" else "profiled step") + (
            f", {src.get('subject')}/{src.get('baseline')}" if src else "")
        out.append(f"what-if {w.get('scenario')}: predicted {fmt_float(w.get('predicted_saving_pct'), 1)}% saved, "
                   f"measured {fmt_float(w.get('measured_saving_pct'), 1)}% against the baseline "
                   f"({_signed(w.get('error_pp'))} points; {basis})")
    if "next_bottleneck" in comp:
        nb = comp.get("next_bottleneck")
        if isinstance(nb, dict):
            out.append(f"next bottleneck ({nb.get('run')}): [{nb.get('severity')}] {nb.get('cause')}/{nb.get('kind')}: "
                       f"{nb.get('title')}")
        else:
            out.append("next bottleneck: none, the faster run has no finding of medium or high severity")
    return out


def fails_on(model: dict, level: str | None) -> bool:
    """Whether a subject finding reaches ``level`` (high, or medium and above); False without a level."""
    if not level:
        return False
    return any(_SEVERITIES.get(f.get("severity"), 9) <= _SEVERITIES[level] for f in model.get("findings") or [])


def _stage(ctx: click.Context, what: str) -> None:
    """Record what the command is doing, for the message of an environment failure (full disk, no memory)."""
    ctx.obj["stage"] = what


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


class _Checked(click.ParamType):
    """A value converted by click's ``base`` type, then validated by :func:`traceanalyze.options.check` as the
    :class:`Options` field ``field``: the message a user sees for a bad value is the one the Python API raises."""

    def __init__(self, field: str, base: click.ParamType, name: str) -> None:
        self.field, self.base, self.name = field, base, name

    def convert(self, value, param, ctx):
        value = self.base.convert(value, param, ctx)
        try:
            return options.check(self.field, value)
        except UsageError as exc:
            self.fail(f"{exc}.", param, ctx)


# Each Options field and the ``report`` options that set it: tests/test_options.py fails when a field has none
OPTION_FLAGS: dict[str, tuple[str, ...]] = {
    "baseline": ("--baseline",),
    "db": ("--db",),
    "outputs": ("--output", "--json", "--md", "--export"),
    "jobs": ("--jobs",),
    "link_bw_gbps": ("--link-bw",),
    "peak_tflops": ("--peak-tflops",),
    "max_decompressed_bytes": ("--max-decompressed",),
    "gpu": ("--gpu",),
    "follow_external_symlinks": ("--follow-external-symlinks",),
    "executor": ("--executor",),
    "scheduler": ("--scheduler",),
    "read_only_hit": ("--export",),  # without --export a cached report is read with a read-only connection
    "show_paths": ("--show-paths",),
}


class _SafeGroup(click.Group):
    """click's group, but click's own error messages (which quote the paths given) go through
    :func:`terminal_block` too: a bad path with an ANSI escape or a bidi override prints as ``?``."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            import io

            buf = io.StringIO()
            exc.show(file=buf)
            click.echo(terminal_block(buf.getvalue()), err=True, nl=False)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_SafeGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("-j", "--jobs", type=_Checked("jobs", click.INT, "integer range"),
              help=f"Parallel parse processes (default: CPUs), 1 to {options.MAX_JOBS}.")
@click.option("--link-bw", type=_Checked("link_bw_gbps", click.FLOAT, "float"), metavar="GB/s",
              help="Expected per-direction link bandwidth between ranks, to judge busbw against.")
@click.option("--peak-tflops", type=_Checked("peak_tflops", click.FLOAT, "float"), metavar="TFLOPS",
              help="Dense peak of one GPU for the main matmul dtype, for MFU.")
@click.option("--gpu", metavar="NAME|smXY", help="The GPU, when the trace's deviceProperties do not say: a name "
              "(V100, A100, H100, ...) or a compute capability (sm70, sm80, 9.0); precision advice depends on it.")
@click.option("--max-decompressed", type=_Size(), default="64G", show_default=True, metavar="SIZE",
              help="Bound on what one trace, log or config may inflate to (a gzip bomb is a warning naming the file): "
                   "512M, 64G, ...")
@click.option("--export", "export_path", type=click.Path(dir_okay=False), metavar="FILE.json[.gz]",
              help="Also write a merged, clock-aligned trace of every rank (Perfetto) beside the HTML and link it.")
@click.option("--follow-external-symlinks", is_flag=True,
              help="Read files and folders that symlinks in the input folders point to outside them (skipped with "
                   "a warning by default).")
@click.option("--show-paths", is_flag=True, help="Show absolute paths in the reports (default: each path from its "
              "input folder's name; the terminal shows them in full).")
@click.option("--fail-on", type=click.Choice(["high", "medium"]), help="Exit with status 3 (after writing the "
              "reports) when a finding of this severity or higher exists: for CI.")
@click.option("--executor", type=click.Choice(["local", "dask"]), default="local", show_default=True,
              help="Where the per-rank parse runs: local processes, or a Dask cluster (a local one of --jobs "
              "workers, or --scheduler's).")
@click.option("--scheduler", metavar="tcp://HOST:8786", help="Dask scheduler of a running cluster (implies "
              "--executor dask; workers must see the traces and the --db folder at the same paths).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary.")
@click.pass_context
def report(ctx: click.Context, paths: tuple[str, ...], output: str | None, json_path: str | None,
           md_path: str | None, fmt: str, db: str | None, baseline: tuple[str, ...], jobs: int | None,
           link_bw: float | None, peak_tflops: float | None, gpu: str | None, max_decompressed: int,
           export_path: str | None, follow_external_symlinks: bool, show_paths: bool, fail_on: str | None,
           executor: str, scheduler: str | None, quiet: bool) -> None:
    """Analyze the traces under PATHS and write one self-contained HTML report.

    \b
    Example:
        traceanalyze report ./traces
        traceanalyze report ./traces -o slow.html --json slow.json
        traceanalyze report ./8gpu --baseline ./1gpu
        traceanalyze report ./traces --export merged.json.gz
        traceanalyze report ./traces --fail-on high     # CI: exit 3 on a high-severity finding
    """
    def run() -> None:
        _stage(ctx, "checking the output paths")
        slug = _slug(paths)
        out = Path(output) if output else None
        if out is None and fmt == "html":
            out = Path(f"traceanalyze-{slug}.html")
        db_path = Path(db) if db else (out.with_suffix(".duckdb") if out is not None
                                       else Path(f"traceanalyze-{slug}.duckdb"))
        outputs: list[tuple[str, Path | None]] = [("-o", out), ("--json", Path(json_path) if json_path else None),
                                                  ("--md", Path(md_path) if md_path else None), ("--db", db_path)]
        if export_path and fmt == "html" and out is not None:
            from traceanalyze.export import export_target

            outputs.append(("--export", export_target(out, export_path)))
        opts = Options(baseline=baseline, db=db_path, outputs=tuple(outputs), jobs=jobs, link_bw_gbps=link_bw,
                       peak_tflops=peak_tflops, max_decompressed_bytes=max_decompressed, gpu=gpu,
                       follow_external_symlinks=follow_external_symlinks, executor=executor, scheduler=scheduler,
                       read_only_hit=not export_path,  # the export reads the database with file access
                       show_paths=show_paths)
        prog = _Progress(enabled=not quiet and sys.stderr.isatty())
        _stage(ctx, "reading and analyzing the traces")
        try:
            a = pipeline.analyze(list(paths), opts, progress=prog)
        finally:
            prog.close()
        # the database's last writes reach its file, and it closes, while the report renders (the export reads it)
        closed = _close_meanwhile(a.con) if not a.cached and not export_path else None
        try:
            _write_report(ctx, a, out, fmt, (json_path, md_path, export_path), paths + baseline, show_paths)
        finally:  # closed also after a failed write: the database stays whole and reusable
            if closed is not None:
                closed()
            else:
                a.con.close()
        model = a.model
        for w in model["warnings"]:  # errors even with --quiet; partial files and warnings without it
            if w.get("level") == "error" or (not quiet and w.get("level") in ("partial", "warning")):
                _say(f"traceanalyze: {w['file']}: {w['message']}" if w["file"] else f"traceanalyze: {w['message']}")
        if not quiet:
            n_ranks = sum(len(r["ranks"]) for r in model["runs"])
            if out is not None and fmt == "html" or (out is not None and fmt != "html"):
                _say(f"wrote {out} ({len(model['runs'])} run(s), {n_ranks} rank(s)); database {db_path}")
        if not any(r["ranks"] or r["log_steps"] or r["log_facts"] or r.get("deaths") for r in model["runs"]):
            raise TraceanalyzeError("nothing could be analyzed: every trace file was unreadable (see above)")
        if not quiet and out is not None:  # the report itself on stdout: no summary mixed into it
            for line in summary_lines(model):
                click.echo(terminal(line))
        if fails_on(model, fail_on):
            ctx.obj["exit"] = EXIT_FINDING

    _guard(ctx, run)
    if ctx.obj.get("exit"):
        sys.exit(ctx.obj["exit"])


def _close_meanwhile(con: duckdb.DuckDBPyConnection) -> Callable[[], None]:
    """Start the database's ``CHECKPOINT`` (:func:`traceanalyze.store.checkpoint_meanwhile`) and then its ``close``
    on a thread, while the report renders: DuckDB frees the GIL in both. The close is hidden where the rendering
    outlasts the checkpoint (256 ranks of the sweep set: ~0.03 s); not for one 5 MB rank, whose checkpoint (~25 ms)
    already outlasts it. Returns the wait, which raises what ``close`` raised."""
    def finish() -> None:
        checkpoint_meanwhile(con)()
        con.close()

    return on_thread(finish, name="traceanalyze-close")


def _write_report(ctx: click.Context, a, out: Path | None, fmt: str, extra: tuple[str | None, ...],
                  inputs: tuple[str, ...], show_paths: bool) -> None:
    """Write the outputs of ``report``, each to a temporary file renamed into place, recording the stage; ``extra``:
    the ``--json``, ``--md`` and ``--export`` paths; paths on the page shown from ``inputs`` unless
    ``show_paths`` (:func:`traceanalyze.report.paths.page_model`)."""
    json_path, md_path, export_path = extra
    model = page_model(a.model, inputs, show_paths)
    if fmt == "json":
        _stage(ctx, f"writing the JSON report {out or '(stdout)'}")
        text = to_json(model)
        _write_or_print(out, text)
    elif fmt == "md":
        _stage(ctx, f"writing the Markdown report {out or '(stdout)'}")
        _write_or_print(out, render_markdown(model))
    else:
        assert out is not None
        if export_path:
            from traceanalyze.export import export_beside

            _stage(ctx, f"writing the merged trace {export_path}")
            model["export_path"], _ = export_beside(a.con, out, export_path)
        _stage(ctx, f"writing the HTML report {out}")
        atomic_write_text(out, render_html(model))
    if json_path:
        _stage(ctx, f"writing the JSON report {json_path}")
        atomic_write_text(json_path, to_json(model))
    if md_path:
        _stage(ctx, f"writing the Markdown report {md_path}")
        atomic_write_text(md_path, render_markdown(model))


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Trace to write: .json, or .json.gz for gzip.")
@click.option("--db", type=click.Path(dir_okay=False), help="DuckDB file to use as a parse cache (default: in "
              "memory). A PATH ending in .duckdb is read as an existing report database instead of traces.")
@click.option("--run", "run_name", help="Run to export (default: the first subject run).")
@click.option("--max-events", type=click.IntRange(min=1), default=DEFAULT_MAX_EVENTS, show_default=True,
              help="Bound on events written: findings and annotations first, then kernels, then top-level ops.")
@click.option("-j", "--jobs", type=_Checked("jobs", click.INT, "integer range"),
              help=f"Parallel parse processes (default: CPUs), 1 to {options.MAX_JOBS}.")
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

        _stage(ctx, "checking the output paths")
        if len(paths) == 1 and paths[0].endswith(".duckdb") and Path(paths[0]).is_file():
            check_outputs([("-o", output)], [paths[0]])
            _stage(ctx, f"reading the report database {paths[0]}")
            rep = load(paths[0])
            con = rep.con
        else:
            _stage(ctx, "reading and analyzing the traces")
            con = pipeline.analyze(list(paths), Options(db=db, jobs=jobs, outputs=(("-o", output),))).con
        try:
            _stage(ctx, f"writing the merged trace {output}")
            res = export_trace(con, output, run=run_name, max_events=max_events)
        finally:
            con.close()
        if not quiet:
            note = f"; left out {sum(res.dropped.values())} events over --max-events" if res.dropped else ""
            _say(f"wrote {res.path} (run {res.run}, ranks {', '.join(map(str, res.ranks))}, "
                 f"{res.n_events} events{note})")

    _guard(ctx, run)


def _write_or_print(out: Path | None, text: str) -> None:
    if out is None:
        click.echo(text)  # JSON escapes control characters; Markdown values went through safety.md_text
    else:
        atomic_write_text(out, text)


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
        # the database may come from anyone: read-only, no file access, no extensions (docs/safety.md)
        con = open_untrusted(db)
        try:
            try:
                rel = con.sql(query)
                if rel is None:
                    return
                if as_csv:
                    import csv
                    import io

                    buf = io.StringIO()
                    w = csv.writer(buf)
                    w.writerow(rel.columns)
                    w.writerows(rel.fetchall())
                    click.echo(terminal_block(buf.getvalue()), nl=False)
                else:
                    import contextlib
                    import io

                    buf = io.StringIO()
                    with contextlib.redirect_stdout(buf):
                        rel.show(max_width=10_000, max_rows=10_000)
                    click.echo(terminal_block(buf.getvalue()), nl=False)
            except duckdb.Error as exc:
                raise untrusted_error(db, exc) from None
        finally:
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
@click.option("--threshold", type=click.FloatRange(min=1, min_open=True), default=REGRESSION_THRESHOLD,
              show_default=True,
              help="Flag a run whose step time exceeds this × the median of its group's earlier runs.")
@click.option("--force", is_flag=True, help="Analyze every run again, changed or not.")
@click.option("--link-bw", type=click.FloatRange(min=0, min_open=True), metavar="GB/s",
              help="Expected per-direction link bandwidth between ranks, to judge busbw against.")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), metavar="TFLOPS",
              help="Dense peak of one GPU for the main matmul dtype, for MFU.")
@click.option("--show-paths", is_flag=True, help="Show absolute paths in the runs' reports (default: each path from "
              "its run folder's name).")
@click.option("--fail-on-regression", is_flag=True, help="Exit with status 3 (after writing the catalog and the "
              "index) when a run is flagged as a regression: for CI.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary.")
@click.pass_context
def batch(ctx: click.Context, archive: str, outdir: str, jobs: int | None, executor: str, scheduler: str | None,
          threshold: float, force: bool, link_bw: float | None, peak_tflops: float | None, show_paths: bool,
          fail_on_regression: bool, quiet: bool) -> None:
    """Analyze every run under ARCHIVE; keep a catalog of them and an index page that flags regressions.

    Re-running on the same OUTPUT analyzes only new or changed runs; runs gone from ARCHIVE drop out.

    \b
    Example:
        traceanalyze batch /archive/traces -o /reports/archive
        traceanalyze sql /reports/archive/catalog.duckdb "SELECT run_id, step_time_us, top_cause FROM runs"
    """

    def run() -> None:
        _stage(ctx, "analyzing the runs")
        bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(unit="run", desc="batch", file=sys.stderr, leave=False)
        try:
            from traceanalyze.batch import run_batch  # not needed by report: 4 ms of imports

            res = run_batch(archive, outdir, jobs=jobs, executor=executor, scheduler=scheduler, threshold=threshold,
                            force=force, link_bw_gbps=link_bw, peak_tflops=peak_tflops, show_paths=show_paths,
                            on_run=(lambda _row: bar.update(1)) if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        if not quiet:
            for r in res.runs:
                if r["status"] == "error" and r["run_id"] in res.analyzed:
                    _say(f"traceanalyze: {r['run_id']}: {r['error']}")
            rate = (f" in {res.seconds:.1f} s ({res.runs_per_s:.2f} runs/s, {res.mb_per_s:.1f} MB/s of traces)"
                    if res.analyzed else f" in {res.seconds:.1f} s")
            _say(f"{len(res.runs)} run(s): {len(res.analyzed)} analyzed, {len(res.unchanged)} unchanged, "
                 f"{len(res.removed)} removed, {len(res.errors)} error(s), {len(res.regressions)} "
                 f"regression(s){rate}; index {res.index}, catalog {res.catalog}")
        if res.runs and all(r["status"] == "error" for r in res.runs):
            raise TraceanalyzeError("nothing could be analyzed: every run failed (see index.html)")
        if fail_on_regression and res.regressions:
            if not quiet:
                _say(f"traceanalyze: {len(res.regressions)} regression(s): {', '.join(res.regressions[:10])}")
            ctx.obj["exit"] = EXIT_FINDING

    _guard(ctx, run)
    if ctx.obj.get("exit"):
        sys.exit(ctx.obj["exit"])


_ADVICE = {
    errno.ENOSPC: "the disk is full; free space, or write the outputs (-o, --db) to another disk",
    errno.EDQUOT: "the disk quota is exhausted; free space, or write the outputs (-o, --db) to another disk",
    errno.EACCES: "permission denied; write the outputs (-o, --db) to a folder you can write to",
    errno.EPERM: "permission denied; write the outputs (-o, --db) to a folder you can write to",
    errno.EROFS: "the file system is read-only; write the outputs (-o, --db) to a folder you can write to",
}
_MEMORY_ADVICE = ("try fewer parse processes (-j 1), a lower --max-decompressed, or a machine with more memory; "
                  "files loaded so far stay in the database")


def _environment(exc: BaseException, stage: str) -> tuple[str, int] | None:
    """(message, exit status) for a failure of the machine rather than of the input, else None."""
    import duckdb

    if isinstance(exc, (MemoryError, duckdb.OutOfMemoryException)):
        return f"out of memory while {stage}; {_MEMORY_ADVICE}", EXIT_MEMORY
    if isinstance(exc, OSError) and exc.errno in _ADVICE:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"cannot go on while {stage}{where}: {_ADVICE[exc.errno]}", EXIT_WRITE
    if isinstance(exc, duckdb.Error):
        low = str(exc).lower()
        for needle, code in (("no space left", errno.ENOSPC), ("read-only file system", errno.EROFS),
                             ("permission denied", errno.EACCES)):
            if needle in low:
                return f"cannot go on while {stage}: {_ADVICE[code]}", EXIT_WRITE
        if "out of memory" in low or "could not allocate" in low:
            return f"out of memory while {stage}; {_MEMORY_ADVICE}", EXIT_MEMORY
    return None


def _guard(ctx: click.Context, fn) -> None:
    """Run ``fn``; errors become one line on stderr and the exit status of :mod:`traceanalyze.errors`."""
    if ctx.obj.get("debug"):
        fn()
        return
    try:
        fn()
    except EnvironmentFailure as exc:
        stage = f" (while {exc.stage})" if exc.stage else ""
        _say(f"traceanalyze: {exc}{stage}")
        sys.exit(exc.exit_code)
    except TraceanalyzeError as exc:
        _say(f"traceanalyze: {exc}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _say("traceanalyze: interrupted; files loaded so far stay in the database")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # MemoryError and OSError included: _environment sorts them out
        env = _environment(exc, ctx.obj.get("stage") or "running")
        if env is not None:
            _say(f"traceanalyze: {env[0]}")
            sys.exit(env[1])
        if isinstance(exc, OSError):
            _say(f"traceanalyze: {exc.filename or ''}: {exc.strerror or exc}")
            sys.exit(1)
        # a bug: still one line, and how to see more
        _say(f"traceanalyze: internal error ({type(exc).__name__}: {exc}); rerun with --debug for the traceback "
             "and report it")
        sys.exit(EXIT_INTERNAL)


def one_blas_thread() -> None:
    """One OpenBLAS thread, unless the caller's environment says otherwise. NumPy's wheels start OpenBLAS's thread
    pool at ``import numpy`` (one per core), whose threads spin, and traceanalyze does no linear algebra: a report
    of one 5 MB rank spends ~0.04 s of CPU less (~0.08 s of wall time on 2 cores). Must run before NumPy is
    imported; the parse workers inherit it."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def exit_unwalked() -> None:
    """The process ends next: every object alive now is frozen out of the collector's reach (``gc.freeze``), so the
    interpreter's shutdown collections do not walk the imported modules' objects again (~0.03 s of CPU of a report of
    one 5 MB rank). Finalizers of what is left at exit are not guaranteed by Python anyway; every output and the
    database are closed before."""
    gc.freeze()


def main() -> None:
    """Console-script entry point."""
    block_pandas()
    one_blas_thread()
    try:
        cli(prog_name="traceanalyze")
    finally:
        exit_unwalked()


if __name__ == "__main__":
    main()
