"""The confidence levels earn their names (issue 40 item 3): over every pair with a measured saving (the H200 pairs of
../shared and our H100 pairs, their traces replayed on this CPU; the recorded CPU pairs; the sample twins), the
measured saving falls inside the stated range on at least 9 of 10 pairs rated high and 7 of 10 rated medium
(``benchmarks/whatif.py --calibration``, the table in docs/confidence.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import shared
from traceanalyze.diagnose import confidence as conf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import whatif as bench  # noqa: E402

BARS = {"high": 0.9, "medium": 0.7}  # share of a level's pairs whose measured saving is inside the range


@pytest.fixture(scope="module")
def items() -> list[dict]:
    shared("traces/gpu/h200")  # skipped without ../shared, failed under CI
    return bench.calibration_pairs()


def test_every_set_of_pairs_is_there(items):
    sets = {it["set"] for it in items}
    assert sets == {"h200", "h100", "cpu"}
    assert len(items) == 24 and sum(it["row"] is None for it in items) == 1  # bf16 left out on this CPU host


@pytest.mark.parametrize("blind", [False, True])
def test_each_level_holds_the_truth_as_often_as_its_name_says(items, blind):
    table = {c["level"]: c for c in bench.calibration(items, blind)}
    for level, bar in BARS.items():
        c = table[level]
        assert c["inside"] >= bar * c["pairs"], (level, c["inside"], c["pairs"], blind)
    assert sum(c["pairs"] for c in table.values()) == 23
    assert all(c["mean_width_pp"] is None or c["mean_width_pp"] < 50 for c in table.values())  # not all-saying


def test_the_shipped_family_errors_are_the_refit(items):
    fams, pooled = bench.family_errors(items)
    assert pooled == conf.POOLED_ERROR_PP
    assert {f: v[0] for f, v in fams.items()} == {f: v[0] for f, v in conf.FAMILY_ERROR_PP.items()}
    assert {f: len(v[1]) for f, v in fams.items()} == {f: len(v[1]) for f, v in conf.FAMILY_ERROR_PP.items()}


def test_the_h200_pairs_fall_inside_their_ranges_blind():
    """Our H200 pairs (tests/data/gpu/h200, ``gpu_pairs.py``'s ``h200ours``) are not among the pairs the families are
    fitted on: a blind check of the stated ranges. All 7 hold their measured saving: 5 medium (conv bf16 68.7 and
    68.6 % against 62.0; bf16 + channels_last 76.8 against 77.2; no_cache_flush 26.2 against 28.7 and 15.3 against
    7.9), 2 low (the loader 13.4 against 30.0; fused AdamW 33.7 against 34.2)."""
    import gpu_pairs as gp

    root, prs, _ = gp.BLIND_SETS["h200ours"]
    assert "h200ours" not in gp.SETS  # so bench.calibration_pairs leaves it out of the refit
    gp.CUR, items = root, []
    for p, a, b, sc, _cause in prs:
        run = gp.model_of(root / p / a)["runs"][0]
        items.append({"measured": 100 * (1 - gp.wall_ms(p, b) / gp.wall_ms(p, a)), "basis": run["confidence_basis"],
                      "row": next(x for x in run["whatif"] if x["scenario"] == sc), "scenario": sc})
    table = {c["level"]: (c["pairs"], c["inside"], c["mean_error_pp"]) for c in bench.calibration(items)}
    assert table == {"high": (0, 0, None), "medium": (5, 5, 4.7), "low": (2, 2, 8.6)}
