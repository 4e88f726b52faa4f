"""Deaths in the database and the batch (issue 41 leftovers): each out-of-memory death or kill a log records is a
``run_deaths`` row of the report database, with the log's figures; a figure out of range is a warning and NULL, not
a row with nonsense; the batch catalog and its index flag a run that died ("CUDA OOM on rank 5", "host OOM: 8 ranks
SIGKILLed"), and such a run is never a regression by step time."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from tests.conftest import SAMPLES, shared
from tests.test_batch import _copy_run
from tests.test_oom import torchtune_70b_log
from traceanalyze import batch, store
from traceanalyze.batch import died_summary
from traceanalyze.logs import parse_text_log
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.report import render_batch_index

GIB = 1 << 30


def _section(n: int) -> str:
    text = shared("logs/oom.txt").read_text()
    parts = re.split(r"^# --- (\d+)\.", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))[str(n)]


def _deaths(tmp_path: Path, log: str) -> tuple[list[dict], list[dict]]:
    """Report a logs-only folder holding ``log`` into a database; its ``run_deaths`` rows and the warnings."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "train.log").write_text(log)
    a = analyze([run], Options(db=tmp_path / "r.duckdb", jobs=1))
    try:
        rel = a.con.execute("SELECT * EXCLUDE (run_id) FROM run_deaths ORDER BY file, line")
        cols = [d[0] for d in rel.description]
        rows = [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]
    finally:
        a.con.close()
    return rows, a.model["warnings"]


def test_cuda_oom_log_is_a_run_deaths_row_with_its_figures(tmp_path: Path) -> None:
    (row,), _ = _deaths(tmp_path, _section(1))  # the PyTorch >= 2.2 message of rank 5
    assert row == {
        "kind": "cuda_oom", "form": "torch>=2.2", "rank": 5, "local_rank": None, "host": None, "gpu": 5, "pid": None,
        "tried_bytes": 3_758_096_384,            # 3.50 GiB
        "free_bytes": 2_254_857_830,             # 2.10 GiB
        "capacity_bytes": 84_986_665_369,        # 79.15 GiB
        "in_use_bytes": 82_710_332_702,          # 77.03 GiB
        "allocated_bytes": 73_443_940_761,       # 68.40 GiB
        "reserved_unallocated_bytes": 8_493_297_827,  # 7.91 GiB
        "rss_bytes": None, "signal": None, "exit_code": None, "phase": None,
        "file": str(tmp_path / "run" / "train.log"), "line": row["line"]}
    log_line = (tmp_path / "run" / "train.log").read_text().splitlines()[row["line"] - 1]
    assert "CUDA out of memory. Tried to allocate 3.50 GiB" in log_line
    # the log fixed and the run reported again into the same database: the death is gone with it
    rows, _ = _deaths(tmp_path, "Step 1 | loss:7.7 step_time_ms:100.0\nStep 2 | loss:7.6 step_time_ms:101.0\n")
    assert rows == []


def test_torchrun_kills_while_the_checkpoint_loads_are_rows_of_killed(tmp_path: Path) -> None:
    rows, _ = _deaths(tmp_path, torchtune_70b_log())
    assert len(rows) == 8
    assert sorted(r["rank"] for r in rows) == list(range(8))
    assert {(r["kind"], r["form"], r["signal"], r["exit_code"], r["host"], r["phase"]) for r in rows} == {
        ("killed", "torchrun", "SIGKILL", -9, "gpu-b-02", "checkpoint_load")}
    assert sorted(r["pid"] for r in rows) == list(range(5530, 5538))


@pytest.mark.parametrize("figure, what", [
    ("Tried to allocate -3.50 GiB", "-3.50 GiB"),
    ("Tried to allocate 99999999999999999999999 GiB", "99999999999999999999999 GiB"),
    ("Tried to allocate 1e30 GiB", "1e30 GiB"),
])
def test_hostile_figure_is_a_warning_and_null(tmp_path: Path, figure: str, what: str) -> None:
    log = (f"[rank3]: torch.OutOfMemoryError: CUDA out of memory. {figure}. GPU 3 has a total capacity of 79.15 GiB "
           "of which 2.10 GiB is free. Of the allocated memory 68.40 GiB is allocated by PyTorch, and 7.91 GiB is "
           "reserved by PyTorch but unallocated.\n")
    (row,), warnings = _deaths(tmp_path, log)
    assert (row["kind"], row["rank"], row["tried_bytes"]) == ("cuda_oom", 3, None)
    assert row["capacity_bytes"] == 84_986_665_369 and row["free_bytes"] == 2_254_857_830
    (w,) = [w for w in warnings if "out of range" in w["message"]]
    assert w["level"] == "warning" and w["message"].startswith("train.log:1: CUDA out-of-memory message with a "
                                                               f"figure out of range ({what})")


def test_free_beyond_the_capacity_is_left_out(tmp_path: Path) -> None:
    log = ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 16.00 GiB total capacity; 1.00 GiB already "
           "allocated; 900.00 GiB free; 3.00 GiB reserved in total by PyTorch)\n")
    p = tmp_path / "x.log"
    p.write_text(log)
    res = parse_text_log(p)
    (e,) = res.ooms
    assert (e.tried_bytes, e.capacity_bytes, e.free_bytes, e.reserved_unallocated_bytes) == (
        2 * GIB, 16 * GIB, None, 2 * GIB)
    assert res.bad_values == [f"x.log:1: CUDA out-of-memory message with a figure out of range (free {900 * GIB:,} "
                              f"bytes > capacity {16 * GIB:,} bytes): left out (sizes are read from 0 to "
                              f"{1 << 60:,} bytes)"]


def test_a_crash_loop_warns_a_bounded_number_of_times(tmp_path: Path) -> None:
    log = "".join(f"[rank{r}]: CUDA out of memory. Tried to allocate -1 GiB (GPU 0; 16.00 GiB total capacity; "
                  "1.00 GiB already allocated; 1.00 GiB free; 3.00 GiB reserved in total by PyTorch)\n"
                  for r in range(50))
    p = tmp_path / "x.log"
    p.write_text(log)
    res = parse_text_log(p)
    assert len(res.ooms) == 50 and len(res.bad_values) == 10


def test_died_summary() -> None:
    cuda = {"kind": "cuda_oom", "ranks": [6]}
    host = {"kind": "host_oom", "ranks": list(range(8))}
    assert died_summary([{"kind": "nccl", "ranks": [1]}], []) == {"died": None, "died_kind": None,
                                                                  "died_ranks": None}
    assert died_summary([cuda], []) == {"died": "CUDA OOM on rank 6", "died_kind": "cuda_oom", "died_ranks": "[6]"}
    assert died_summary([host], [])["died"] == "host OOM: 8 ranks SIGKILLed"
    assert died_summary([{"kind": "cuda_oom", "ranks": [0, 1, 2, 5]}], [])["died"] == "CUDA OOM on ranks 0–2, 5"
    assert died_summary([{"kind": "host_oom", "ranks": []}], [{"kind": "host"}])["died"] == (
        "host OOM: 1 process SIGKILLed")
    both = died_summary([cuda, {"kind": "host_oom", "ranks": [3]}], [])
    assert both == {"died": "CUDA OOM on rank 6; host OOM: rank 3 SIGKILLed", "died_kind": "cuda_oom",
                    "died_ranks": "[3, 6]"}


@pytest.fixture(scope="module")
def died_batch(tmp_path_factory) -> Path:
    """Three runs of one group: fast_interconnect on days 1 and 2, then the slow_interconnect run on day 3 (2× the
    step time) whose rank 5 logged a CUDA OOM, and a logs-only run whose 8 ranks were SIGKILLed."""
    root = tmp_path_factory.mktemp("died")
    archive = root / "archive"
    _copy_run(SAMPLES / "fast_interconnect", archive / "2026-11-01" / "fast_interconnect", 1)
    _copy_run(SAMPLES / "fast_interconnect", archive / "2026-11-02" / "fast_interconnect", 2)
    slow = archive / "2026-11-03" / "fast_interconnect"
    _copy_run(SAMPLES / "slow_interconnect", slow, 3)
    (slow / "oom.log").write_text(_section(1))
    (archive / "70b").mkdir()
    (archive / "70b" / "train.log").write_text(torchtune_70b_log())
    out = root / "out"
    batch.run_batch(archive, out, jobs=1)
    return out


def test_batch_catalog_and_index_flag_the_runs_that_died(died_batch: Path) -> None:
    con = duckdb.connect(str(died_batch / "catalog.duckdb"), read_only=True)
    try:
        rows = {r[0]: r[1:] for r in con.execute(
            "SELECT run_id, status, died, died_kind, died_ranks, regression FROM runs").fetchall()}
        steps = dict(con.execute("SELECT run_id, step_time_us FROM runs WHERE step_time_us > 0").fetchall())
        assert con.execute("SELECT value FROM meta WHERE key = 'catalog_version'").fetchone() == ("3",)
    finally:
        con.close()
    assert rows == {
        "2026-11-01/fast_interconnect": ("ok", None, None, None, False),
        "2026-11-02/fast_interconnect": ("ok", None, None, None, False),
        # 2× slower than its group: a regression, were it not dead
        "2026-11-03/fast_interconnect": ("ok", "CUDA OOM on rank 5", "cuda_oom", "[5]", False),
        "70b": ("ok", "host OOM: 8 ranks SIGKILLed", "host_oom", "[0, 1, 2, 3, 4, 5, 6, 7]", False),
    }
    # the run that died is more than the threshold slower than its group's earlier runs: flagged, had it finished
    slow, fast = steps.pop("2026-11-03/fast_interconnect"), list(steps.values())
    assert len(fast) == 2 and slow > batch.REGRESSION_THRESHOLD * max(fast)
    html = (died_batch / "index.html").read_text()
    assert '<div class="v" id="n-died">2</div>' in html
    assert html.count('<span class="badge sev-high" title="cuda_oom">died</span> CUDA OOM on rank 5') == 1
    assert html.count('<span class="badge sev-high" title="host_oom">died</span> host OOM: 8 ranks SIGKILLed') == 1
    assert 'href="#by-died">died</a>' in html and "#by-died:target ~ table.runs tbody tr { order: var(--o-died); }" \
        in html
    assert 'id="regressions"' not in html


def test_index_orders_the_runs_that_died_first() -> None:
    rows = [{"run_id": rid, "status": "ok", "date": None, "died": died, "died_kind": kind, "step_time_us": 1e5}
            for rid, died, kind in (("a", None, None), ("b", "host OOM: rank 1 SIGKILLed", "host_oom"),
                                    ("c", "CUDA OOM on rank 0", "cuda_oom"))]
    html = render_batch_index(rows, archive="arch", threshold=1.5)
    styles = re.findall(r'<tr class="[^"]*" style="[^"]*--o-died:(\d+)[^"]*">\s*<td[^>]*>[^<]*</td>\s*'
                        r"<td>([a-c])</td>", html)
    # CUDA before host, then the runs that did not die
    assert {rid: int(pos) for pos, rid in styles} == {"c": 0, "b": 1, "a": 2}
    assert '<tr class="st-ok died"' in html and '<div class="v" id="n-died">2</div>' in html


def test_older_catalog_is_rebuilt(tmp_path: Path) -> None:
    db = tmp_path / "catalog.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('catalog_version', '2')")
    con.execute("CREATE TABLE runs (run_id VARCHAR)")
    store.create_catalog(con)
    cols = {r[0] for r in con.execute("DESCRIBE runs").fetchall()}
    con.close()
    assert {"died", "died_kind", "died_ranks"} <= cols
