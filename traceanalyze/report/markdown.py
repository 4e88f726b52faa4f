"""The Markdown summary for a bug ticket: verdict, top findings, comparison, run facts, per-rank table, what-if
replay, data-quality warnings. About 40 lines for an 8-rank run; long lists are cut with a note.

Every model string goes through :func:`traceanalyze.safety.md_text`: one line, inert for CommonMark and
GitHub/GitLab (no link, image, raw HTML, table break, emphasis, mention).
"""

from __future__ import annotations

from typing import Any

from traceanalyze.fmt import basename, finite, fmt_bytes, fmt_float, fmt_int, fmt_ms, fmt_pct, fmt_signed_ms, text
from traceanalyze.report import charts
from traceanalyze.report.model import (
    as_dict,
    as_list,
    comparison,
    confidence_view,
    mean,
    memory_view,
    mfu_text,
    partial_view,
    per_step_medians,
    sorted_findings,
    sorted_ranks,
    sorted_runs,
    steady_steps,
    verdict,
    warning_rows,
)
from traceanalyze.report.replay import replay_markdown
from traceanalyze.safety import md_text

MD_MAX_RANKS = 16
MD_MAX_FINDINGS = 5
MD_MAX_WARNINGS = 10


def _md(x: Any, line_start: bool = False) -> str:
    """Model text for Markdown, inside a line (``line_start``: at its start): one line, inert for CommonMark and
    GitHub/GitLab (no link, image, raw HTML, emphasis, mention; control and bidi characters as U+FFFD), escaped only
    where Markdown needs it: :func:`traceanalyze.safety.md_text`."""
    return md_text(text(x), line_start=line_start) or "—"  # a blank value would leave an empty line item


def _cell(x: Any) -> str:
    """Model text for a Markdown table cell: :func:`_md`, and ``|`` escaped (no table break)."""
    return md_text(text(x), cell=True) or "—"


def render_markdown(model: dict) -> str:
    """A short Markdown summary for a bug ticket: verdict, top findings, comparison, run facts, per-rank table,
    data-quality warnings. About 40 lines for an 8-rank run; long lists are cut with a note."""
    findings = sorted_findings(model)
    runs = sorted_runs(model)
    subjects = [_md(r.get("name")) for r in runs if r.get("role", "subject") == "subject"]
    out = [f"## traceanalyze: {', '.join(subjects) or 'report'}", "",
           f"**Verdict:** {_md(verdict(model, findings)[0])}", ""]
    part = partial_view(model.get("partial"))
    if part is not None:
        out += [f"**Partial:** {part['traced']} of {part['world']} ranks traced; {part['missing']} without a trace"
                + (f"; the missing ranks could explain the waits inside collectives behind: "
                   f"{_md(', '.join(part['could_explain']))}" if part["could_explain"] else "") + ".", ""]
    conf = confidence_view(model.get("verdict_confidence"))
    if conf is not None:
        out += [f"**Confidence:** {conf['level']}" + (f" · {_md(conf['line'])}" if conf["line"] else "")
                + (f" (not higher because: {_md('; '.join(conf['why']))})" if conf["why"] else ""), ""]
    out += _findings_md(findings)
    out += _comparison_md(comparison(model, findings))
    for run in runs:
        out += _run_md(run, findings)
    out += _data_quality_md(model, runs)
    return "\n".join(out).rstrip() + "\n"


def _findings_md(findings: list[dict]) -> list[str]:
    """The top :data:`MD_MAX_FINDINGS` findings, each with up to 3 evidence lines and its fix."""
    if not findings:
        return []
    out = ["### Findings (ranked by impact)"]
    for i, f in enumerate(findings[:MD_MAX_FINDINGS], start=1):
        n_named = len(as_list(f.get("ranks")))
        ranks_txt = f", rank{'s' if n_named > 1 else ''} {f['ranks_text']}" if f["ranks_text"] else ""
        impact = ("the run died" if f.get("died") else "changes what is trained, not step time" if f.get("effect")
                  else f"impact {fmt_pct(f.get('impact_pct'), 1)} % of step time"
                  if finite(f.get("impact_pct")) is not None else "impact not estimated")
        out.append(f"{i}. **{_md(f.get('title'))}**: {f['cause_key']}/{_md(f.get('kind'))}, "
                   f"{_md(f.get('severity'))} severity, {impact}{ranks_txt}"
                   + (f", {f['conf']['level']} confidence" if f.get("conf") else "")
                   + (f", part of {_md(f.get('part_of'))}" if f.get("part_of") else ""))
        if f.get("effect"):
            out.append(f"   - **What it changes:** {_md(f.get('effect'))}")
        for e in f["evidence"][:3]:
            out.append(f"   - {_md(e, True)}")  # a list item's text starts a line
        if f.get("recommendation"):
            out.append(f"   - **Fix:** {_md(f.get('recommendation'))}")
        if f.get("whatif_missing"):
            out.append(f"   - No what-if: {_md(f.get('whatif_missing'))}")
    if len(findings) > MD_MAX_FINDINGS:
        out.append(f"- … {len(findings) - MD_MAX_FINDINGS} more finding(s) in the HTML report")
    out.append("")
    return out


def _comparison_md(comp: dict | None) -> list[str]:
    """The subject vs baseline step time, its parts and the config differences (:func:`model.comparison`)."""
    if not comp:
        return []
    out = [f"### {_md(comp.get('subject'))} vs {_md(comp.get('baseline'))}: step time "
           f"{fmt_ms(comp.get('subject_step_us'))} ms vs {fmt_ms(comp.get('baseline_step_us'))} ms "
           f"({fmt_signed_ms(comp.get('delta_us'))} ms)"]
    k = comp.get("comparable") if isinstance(comp.get("comparable"), dict) else None
    if k:  # whether the runs compare, and the step ratio it states
        out += [f"{_md(k.get('verdict'))} (comparability {fmt_float(k.get('score'), 2)})", ""]
    out += ["| part | subject ms | baseline ms | Δ ms | finding |", "|---|--:|--:|--:|---|"]
    for p in comp["parts"]:
        out.append(f"| {_cell(p.get('part'))} | {fmt_ms(p.get('subject_us'))} | {fmt_ms(p.get('baseline_us'))} "
                   f"| {fmt_signed_ms(p.get('delta_us'))} | {_cell(p.get('finding')) if p.get('finding') else ''} |")
    k = comp.get("compile") if isinstance(comp.get("compile"), dict) else None
    if k:
        pays = (f"{fmt_float(k.get('saving_ms_per_step'), 2)} ms saved per step: pays back after "
                f"{fmt_int(k.get('break_even_steps'))} steps" if k.get("break_even_steps") else "never pays back")
        out += ["", f"torch.compile: {fmt_float(k.get('compile_s'), 1)} s once in {_md(k.get('compiled'))}; "
                    f"steady step {fmt_float(k.get('compiled_step_ms'), 1)} vs "
                    f"{fmt_float(k.get('eager_step_ms'), 1)} ms eager "
                    f"({_md(k.get('source'))}): {pays}"]
    out += _whatif_check_md(comp)
    diffs = comp["config_diffs"][:8]
    if diffs:
        out += ["", "Config differences: " + "; ".join(
            f"{_md(d.get('key'))}: {_md(d.get('subject'))} vs {_md(d.get('baseline'))}" for d in diffs)]
    out.append("")
    return out


def _whatif_check_md(comp: dict) -> list[str]:
    """The subject's what-ifs the baseline checks (predicted against measured saving) and the faster run's next
    bottleneck (``comparison.whatif_check``, ``comparison.next_bottleneck``)."""
    out: list[str] = []
    checks = comp.get("whatif_check") or []
    if checks:
        out += ["", "What-if check (predicted against measured saving):", "",
                "| what-if | predicted % | measured % | error (points) | step time used | why |",
                "|---|--:|--:|--:|---|---|"]
        for w in checks:
            err = finite(w.get("error_pp"))
            src = w.get("basis_source") if isinstance(w.get("basis_source"), dict) else {}
            used = ("without the profiler" if w.get("basis") == "unprofiled" else "profiled") + (
                f" ({_cell(src.get('subject'))} / {_cell(src.get('baseline'))})" if src else "")
            out.append(f"| {_cell(w.get('scenario'))} | {fmt_float(w.get('predicted_saving_pct'), 1)} "
                       f"| {fmt_float(w.get('measured_saving_pct'), 1)} "
                       f"| {'—' if err is None else f'{err:+.1f}'} | {used}: {fmt_ms(w.get('subject_step_us'))} → "
                       f"{fmt_ms(w.get('baseline_step_us'))} ms | {_cell(w.get('why'))} |")
    elif comp.get("has_check"):
        out += ["", "What-if check: none of the subject's what-ifs has its cause fixed in the baseline."]
    if comp.get("has_check"):
        nb = comp.get("next_bottleneck")
        out += ["", f"Next bottleneck ({_md(nb.get('run'))}, the faster run): [{_md(nb.get('severity'))}] "
                    f"{_md(nb.get('cause'))}/{_md(nb.get('kind'))}: {_md(nb.get('title'))}" if nb else
                "Next bottleneck: none, the faster run has no finding of medium or high severity."]
    return out


def _run_facts_md(run: dict, ranks: list[dict]) -> str:
    """One line: ranks, mode, GPU, backend, versions, step time, compile step."""
    found = as_list(run.get("ranks_found")) or [r.get("rank") for r in ranks]
    ws = run.get("world_size")
    facts = [f"{len(found)} of {ws} ranks" if isinstance(ws, int) else f"{len(found)} ranks",
             f"{_md(run.get('mode'))} mode"]
    for label, key in (("GPU", "gpu_model"), ("backend", "backend"), ("NCCL", "nccl_version"),
                       ("CUDA", "cuda_runtime_version")):
        if run.get(key):
            facts.append(f"{label} {_md(run.get(key))}")
    facts.append(f"step time {fmt_ms(run.get('step_time_us'))} ms ({_md(run.get('step_stat') or 'median')})")
    cstep = as_dict(run.get("compile_step"))
    if cstep:
        facts.append(f"compile step {_md(cstep.get('step'))}: {fmt_ms(cstep.get('step_time_us'))} ms, apart")
    line = ", ".join(facts)
    mfu = mfu_text(run)
    return line + (f"; MFU {_md(mfu)}" if mfu else "")


def _run_md(run: dict, findings: list[dict]) -> list[str]:
    """One run: its facts, then (the subject) the per-rank table and the what-if replay, or (a baseline) the mean
    breakdown over its ranks."""
    ranks = sorted_ranks(run)
    role = " (baseline)" if run.get("role") == "baseline" and "baseline" not in str(run.get("name")) else ""
    out = [f"### Run {_md(run.get('name'))}{role}", _run_facts_md(run, ranks), ""]
    if run.get("role") == "baseline" and ranks:  # the comparison above covers it; keep the ticket short
        return out + [f"Mean over ranks: idle {fmt_pct(mean(r.get('idle_pct') for r in ranks))} %, compute "
                      f"{fmt_pct(mean(r.get('compute_pct') for r in ranks))} %, non-compute "
                      f"{fmt_pct(mean(r.get('non_compute_pct') for r in ranks))} %.", ""]
    if not ranks:
        return out + ["No rank could be read.", ""]
    return out + _rank_table_md(run, ranks, findings) + _memory_md(run) + replay_markdown(run)


def _memory_md(run: dict) -> list[str]:
    """The memory table (:func:`~traceanalyze.report.model.memory_view`), at most :data:`MD_MAX_RANKS` rows."""
    mv = memory_view(run)
    if mv is None:
        return []
    out = ["| rank | device | peak allocated | peak reserved | device memory | growth per step | not freed in steps |",
           "|--:|:--|--:|--:|--:|--:|:--|"]
    for d in mv["rows"][:MD_MAX_RANKS]:
        un = d["unfreed_op"]
        out.append(f"| {_cell(d['rank'])} | {_cell(d['device'])} | {fmt_bytes(d['peak_allocated_bytes'])} | "
                   f"{fmt_bytes(d['peak_reserved_bytes'])} | {fmt_bytes(d['total_bytes'])} | "
                   f"{fmt_bytes(d['growth_bytes_per_step'])}{' (every step)' if d['rising'] else ''} | "
                   f"{_cell(un['op']) + ' ' + fmt_bytes(un['bytes']) if un else '—'} |")
    more = len(mv["rows"]) - MD_MAX_RANKS + mv["more"]
    if more > 0:
        out.append(f"| … | {more} more rows in the JSON report | | | | | |")
    return out + ["", "Memory from the allocator's [memory] events: growth per step is the median increase of the "
                  "memory allocated at each profiler step's end; on the CPU the counts start with the profiler.", ""]


def _rank_table_md(run: dict, ranks: list[dict], findings: list[dict]) -> list[str]:
    """The per-rank table, the ranks an imbalance finding names and the outliers first, at most
    :data:`MD_MAX_RANKS` rows; per-step figures are medians over the steady steps."""
    per = per_step_medians(steady_steps(run))
    named = [r for f in findings if f.get("cause") == "imbalance" and f.get("run") in (None, run.get("name"))
             and len(as_list(f.get("ranks"))) < len(ranks) for r in as_list(f.get("ranks"))]
    ids = [r.get("rank") for r in ranks if isinstance(r.get("rank"), int)]
    pos = {r: i for i, r in enumerate(charts.rank_order(ids, named + charts.outliers(ranks, per)))}
    ranks = sorted(ranks, key=lambda r: pos.get(r.get("rank"), 1 << 30))  # outliers first
    out = ["| rank | idle % | compute % | non-compute % | overlap % | exposed comm ms/step | step ms |",
           "|--:|--:|--:|--:|--:|--:|--:|"]
    for r in ranks[:MD_MAX_RANKS]:
        ps = per.get(r.get("rank")) or {}
        out.append(f"| {_cell(r.get('rank'))} | {fmt_pct(r.get('idle_pct'))} | {fmt_pct(r.get('compute_pct'))} | "
                   f"{fmt_pct(r.get('non_compute_pct'))} | {fmt_pct(r.get('comm_comp_overlap_pct'))} | "
                   f"{fmt_ms(ps.get('exposed_comm_us', r.get('exposed_comm_us')))} | "
                   f"{fmt_ms(ps.get('step_time_us', r.get('step_time_us')))} |")
    if len(ranks) > MD_MAX_RANKS:
        out.append(f"| … | {len(ranks) - MD_MAX_RANKS} more ranks in the HTML report | | | | | |")
    out += ["", "Idle, compute, non-compute and overlap: % of each rank's trace window; exposed communication "
            "and step time: median per counted step. Ranks a finding names and outliers first.", ""]
    return out


def _data_quality_md(model: dict, runs: list[dict]) -> list[str]:
    """How the files were grouped, whether every file was read, up to :data:`MD_MAX_WARNINGS` warnings, and the
    tool's footer line."""
    warnings = warning_rows(model)
    n_files = sum(len(as_list(r.get("files"))) for r in runs)
    out = ["### Data quality"]
    for run in runs:
        if run.get("file_grouping"):
            out.append(f"{_md(run.get('name'), True) + ': ' if len(runs) > 1 else ''}"
                       f"{_md(run.get('file_grouping'), len(runs) == 1)}.")
    if not any(w["level"] in ("error", "partial") for w in warnings):
        out.append(f"All {n_files} trace file{'s' if n_files != 1 else ''} read completely.")
    for w in warnings[:MD_MAX_WARNINGS]:
        where = f"{_md(basename(w['file']))}: " if w["file"] else ""
        out.append(f"- {w['level']}: {where}{_md(w['message'])}")
    if len(warnings) > MD_MAX_WARNINGS:
        out.append(f"- … {len(warnings) - MD_MAX_WARNINGS} more in the HTML report")
    tool = as_dict(model.get("tool"))
    out += ["", f"_{_md(tool.get('name') or 'traceanalyze')} {_md(tool.get('version'))}, "
                f"{_md(model.get('generated_at'))}_"]
    return out
