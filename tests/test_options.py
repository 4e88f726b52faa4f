"""One :class:`~traceanalyze.options.Options` reaches the pipeline from every entry point.

The command line, the Python API and the batch each build the Options that :func:`traceanalyze.pipeline.analyze`
receives (captured here by a stand-in). A new field that one entry point forgets fails here: every field needs a
``report`` option (``cli.OPTION_FLAGS``), every report-affecting field an API keyword, and the values given must
arrive unchanged.
"""

from __future__ import annotations

import dataclasses
import inspect
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyze import api, batch, cli, options, pipeline
from traceanalyze.errors import UsageError
from traceanalyze.options import Options

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
FIELDS = {f.name for f in dataclasses.fields(Options)}
REPORT_FIELDS = {f.name for f in dataclasses.fields(Options) if f.metadata.get("report")}


class Stop(Exception):
    """Raised by the stand-in once it has the Options: nothing is analysed."""


@pytest.fixture
def captured(monkeypatch) -> list[Options]:
    got: list[Options] = []

    def stand_in(inputs, opts=None, *, progress=None):
        got.append(opts)
        raise Stop

    monkeypatch.setattr(pipeline, "analyze", stand_in)
    return got


def test_every_field_has_a_report_option():
    assert set(cli.OPTION_FLAGS) == FIELDS
    declared = {o for p in cli.report.params for o in p.opts}
    missing = sorted(f for flags in cli.OPTION_FLAGS.values() for f in flags if f not in declared)
    assert missing == []


def test_the_command_line_builds_the_options(tmp_path, captured):
    r = CliRunner().invoke(cli.cli, [
        "--debug", "report", str(tmp_path), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json"),
        "--db", str(tmp_path / "r.duckdb"), "--baseline", str(tmp_path / "base"), "-j", "3", "--link-bw", "12.5",
        "--peak-tflops", "989", "--gpu", "H100", "--max-decompressed", "512M", "--follow-external-symlinks",
        "--executor", "dask", "--scheduler", "tcp://h:8786", "-q"])
    assert isinstance(r.exception, Stop), r.output
    got = captured[0]
    assert got == Options(baseline=(str(tmp_path / "base"),), db=tmp_path / "r.duckdb",
                          outputs=(("-o", tmp_path / "r.html"), ("--json", tmp_path / "r.json"), ("--md", None),
                                   ("--db", tmp_path / "r.duckdb")),
                          jobs=3, link_bw_gbps=12.5, peak_tflops=989.0, max_decompressed_bytes=512 << 20, gpu="H100",
                          follow_external_symlinks=True, executor="dask", scheduler="tcp://h:8786", read_only_hit=True)


def test_the_python_api_builds_the_options(tmp_path, captured):
    given = {"baseline": ("b",), "db": tmp_path / "r.duckdb", "jobs": 2, "link_bw_gbps": 3.0, "peak_tflops": 4.0,
             "gpu": "sm80", "follow_external_symlinks": True, "max_decompressed_bytes": 1 << 20}
    with pytest.raises(Stop):
        api.analyze("traces/", **given)
    assert dataclasses.asdict(captured[0]) == dataclasses.asdict(Options(**given))
    # every option that changes the report can be given in Python too
    assert REPORT_FIELDS <= set(inspect.signature(api.analyze).parameters)


def test_the_batch_builds_the_options(tmp_path, captured):
    shutil.copytree(SAMPLES / "straggler", tmp_path / "a" / "straggler")
    batch.run_batch(tmp_path / "a", tmp_path / "out", jobs=1, link_bw_gbps=7.0, peak_tflops=8.0)
    got = captured[0]
    assert (got.jobs, got.link_bw_gbps, got.peak_tflops, got.db) == (
        1, 7.0, 8.0, tmp_path / "out" / "runs" / "straggler" / "report.duckdb")
    assert set(batch.BATCH_OPTIONS) <= REPORT_FIELDS


@pytest.mark.parametrize("field, value, message", [
    ("jobs", 0, "0 is not in the range 1<=x<=256"),
    ("link_bw_gbps", 0.0, "0.0 is not in the range x>0"),
    ("peak_tflops", -1.0, "-1.0 is not in the range x>0"),
    ("max_decompressed_bytes", 0, "0 is not a size such as 512M or 64G"),
    ("executor", "ray", "unknown executor 'ray' (local or dask)"),
])
def test_a_bad_value_is_refused_once_with_the_same_words_everywhere(field, value, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Options(**{field: value})
    with pytest.raises(UsageError):
        options.check(field, value)


def test_the_command_line_shows_the_options_message():
    r = CliRunner().invoke(cli.cli, ["report", "x", "-j", "0"])
    assert r.exit_code == 2 and "Invalid value for '-j' / '--jobs': 0 is not in the range 1<=x<=256." in r.output
    r = CliRunner().invoke(cli.cli, ["report", "x", "--link-bw", "0"])
    assert r.exit_code == 2 and "Invalid value for '--link-bw': 0.0 is not in the range x>0." in r.output


def test_the_cache_key_follows_the_report_options_only():
    base = Options()
    assert Options(jobs=4, executor="dask", db="x.duckdb").report_key() == base.report_key()
    for field, value in [("link_bw_gbps", 1.0), ("peak_tflops", 2.0), ("max_decompressed_bytes", 3),
                         ("gpu", "V100"), ("follow_external_symlinks", True)]:
        assert Options(**{field: value}).report_key() != base.report_key(), field
    assert Options(baseline="b").baseline == ("b",) and Options(baseline=["a", "b"]).baseline == ("a", "b")
