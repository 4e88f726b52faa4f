"""The what-if scenarios' records (traceanalyze.replay.scenarios): each scenario lives in its record, the registry
holds them in the order the replay prices them, and every record's fields agree with the rest of the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import sample
from traceanalyze import diagnose
from traceanalyze.diagnose.compare import CHECK_KINDS
from traceanalyze.diagnose.verdict import OFFERED_FIRST, UNPRICED_KINDS, WIDER_SCENARIO
from traceanalyze.findings import CAUSES, KINDS
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze
from traceanalyze.replay import whatif
from traceanalyze.replay.scenarios import ALL, ARITHMETIC, REGISTRY, Scenario, by_name, for_kind

PACKAGE = Path(__file__).resolve().parents[1] / "traceanalyze"
# the order the replay priced the scenarios in before they were records (replay.whatif.SCENARIOS, issue 39)
PRICED_ORDER = ("no_straggler", "aligned_step_starts", "ideal_interconnect", "tf32_matmul", "bf16_matmul",
                "bf16_channels_last", "no_dataloader_wait", "no_compile", "fused_optimizer", "no_launch_overhead",
                "no_host_sync", "no_cache_flush")  # no_cache_flush added after the records (issue 41)
MAX_DEFINITIONS = 3  # its record, the finding-kind map, one more


def _definitions_naming(names: set[str]) -> dict[str, list[str]]:
    """Per name: the top-level definitions and assignments of the package's modules whose syntax tree holds a string
    constant equal to it (``module:line``)."""
    out: dict[str, list[str]] = {n: [] for n in names}
    for p in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"), str(p))
        for node in tree.body:
            found = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            for n in found & names:
                out[n].append(f"{p.relative_to(PACKAGE.parent)}:{node.lineno}")
    return out


def test_each_scenario_is_named_in_at_most_three_definitions():
    found = _definitions_naming({s.name for s in (*REGISTRY, *ARITHMETIC)})
    assert {n: where for n, where in found.items() if len(where) > MAX_DEFINITIONS} == {}
    assert all(where for where in found.values())  # each one has its record


def test_the_registry_is_in_the_priced_order():
    assert tuple(s.name for s in REGISTRY) == PRICED_ORDER
    assert whatif.SCENARIOS == (*PRICED_ORDER, ALL)
    assert set(whatif.CAUSES) == set(whatif.SCENARIOS)
    assert len({s.name for s in REGISTRY}) == len(REGISTRY) and by_name(ALL) is None
    assert all(by_name(s.name) is s for s in REGISTRY)


def test_a_run_prices_its_scenarios_in_the_registry_order():
    model = analyze(sample("straggler"), Options(jobs=1)).model
    rows = [w["scenario"] for w in model["runs"][0]["whatif"]]
    priced = [s for s in rows if s != ALL]
    assert len(priced) >= 2 and rows[-1] == ALL
    assert priced == sorted(priced, key=PRICED_ORDER.index)


def test_every_record_is_consistent():
    names = [s.name for s in REGISTRY]
    for i, s in enumerate(REGISTRY):
        assert isinstance(s, Scenario) and s.name != ALL
        assert s.cause.split(":")[0] in CAUSES, s.name
        assert all(callable(f) for f in (s.rewrite, s.applies, s.why_not, s.assumptions)), s.name
        assert set(s.kinds) <= set(KINDS) and set(s.also_fixes) <= set(KINDS), s.name
        assert set(s.offered_first) <= set(KINDS), s.name
        assert set(s.rank_kinds) <= set(s.kinds), s.name
        assert bool(s.rank_kinds) == bool(s.ranks_ctx) == bool(s.ranks_finding), s.name
        # what it supersedes and extends is priced before it (the split note reads that row)
        assert all(o in names[:i] for o in s.supersedes), s.name
        assert (s.extends is None or s.extends in names[:i]) and (s.split_note is None) == (s.extends is None)
        assert s.precision is None or s.precision.dtypes, s.name
        assert s.left_out is None or callable(s.left_out)
        assert s.saving_bound is None or callable(s.saving_bound)
        assert s.starts is None or callable(s.starts)
    for s in ARITHMETIC:  # priced by arithmetic on the stated facts: a price, never replayed, a name of its own
        assert callable(s.price) and s.name not in names and set(s.kinds) <= set(KINDS), s.name
        assert s.cause.split(":")[0] in CAUSES and not s.rank_kinds and not s.extends, s.name
    assert all(s.price is None for s in REGISTRY)
    kinds = [k for s in (*REGISTRY, *ARITHMETIC) for k in s.kinds]
    assert len(kinds) == len(set(kinds))  # one scenario prices a kind
    assert all(for_kind(k).name == diagnose.WHATIF_OF_KIND[k][0] for k in kinds)
    assert all(for_kind(k).name == diagnose.KIND_TO_SCENARIO[k] for s in REGISTRY for k in s.kinds)


def test_the_finding_kind_map_comes_from_the_records():
    assert set(diagnose.WHATIF_OF_KIND) == set(KINDS)
    assert not set(UNPRICED_KINDS) & {k for s in REGISTRY for k in s.kinds}
    for s in REGISTRY:
        for k in s.kinds:
            assert diagnose.WHATIF_OF_KIND[k] == (s.name, "ranks" if k in s.rank_kinds else "")
        if s.kinds:
            assert set(CHECK_KINDS[s.name]) == set(s.kinds) | set(s.also_fixes)
    assert WIDER_SCENARIO == {"bf16_matmul": "bf16_channels_last"}
    assert OFFERED_FIRST == {"fp32_matmul": "tf32_matmul"}
    assert diagnose.WHATIF_OF_KIND["straggler"] == ("no_straggler", "ranks")
    assert diagnose.WHATIF_OF_KIND["late_entry"] == ("aligned_step_starts", "ranks")


@pytest.mark.parametrize(("field", "expected"), [
    ("changes_concurrency", {"no_straggler", "aligned_step_starts", "ideal_interconnect"}),
    ("collective_waits", {"no_straggler", "aligned_step_starts", "ideal_interconnect"}),
    ("host_time", {"no_launch_overhead", "fused_optimizer", "no_host_sync"}),
    ("precision", {"tf32_matmul", "bf16_matmul", "bf16_channels_last"}),
    ("runs_ahead", {"no_host_sync"}),
    ("saving_bound", {"no_host_sync"}),
    ("starts", {"aligned_step_starts"}),
    ("left_out", {"bf16_matmul"}),
    ("one_step_caveat", {"aligned_step_starts"}),
    ("cuts_spans", {"no_cache_flush"}),
])
def test_the_fields_the_code_branches_on_are_where_they_were(field, expected):
    """Each field the pricing, the diagnosis and the confidence read is set on the scenarios the code named before
    the records (the same behaviour)."""
    assert {s.name for s in REGISTRY if getattr(s, field)} == expected


def test_precision_switches_and_what_they_supersede():
    tf32, bf16, cl = (by_name(n) for n in ("tf32_matmul", "bf16_matmul", "bf16_channels_last"))
    assert (tf32.precision.mode, bf16.precision.mode, cl.precision.mode) == ("tf32", "bf16", "bf16")
    assert cl.precision.channels_last and not bf16.precision.channels_last
    assert bf16.precision.dtypes == ("bf16", "fp16") and tf32.precision.dtypes == ("tf32",)
    assert bf16.supersedes == ("tf32_matmul",) and cl.supersedes == ("tf32_matmul", "bf16_matmul")
    assert [s.name for s in REGISTRY if not s.skip_off_path] == ["no_host_sync"]
