"""The what-if replay (the model's ``replay``, ``whatif`` and ``replay_picture`` of a run) in the HTML view model
(``templates/_whatif.html.j2``) and the Markdown summary."""

from __future__ import annotations

import math

from traceanalyze.fmt import finite
from traceanalyze.safety import md_text


def replay_view(run: dict) -> dict:
    """``replay``, ``whatif`` and ``picture`` of one run for the template: the model's dicts, rows that are not
    dicts dropped, picture segments kept only when their numbers are finite."""
    rp = run.get("replay") if isinstance(run.get("replay"), dict) else None
    if rp is not None:
        rp = dict(rp, left_out=_left_out(rp))
    wi = [dict(w, conf=_conf(w.get("confidence")), step_range=step_range(w)) for w in run.get("whatif") or []
          if isinstance(w, dict)]
    pic = run.get("replay_picture") if isinstance(run.get("replay_picture"), dict) else None
    if pic and finite(pic.get("span_us")):
        lanes = []
        for ln in pic.get("lanes") or []:
            if isinstance(ln, dict):
                segs = [s for s in ln.get("segments") or [] if isinstance(s, list) and len(s) == 5
                        and finite(s[0]) is not None and finite(s[1]) is not None]
                lanes.append(dict(ln, segments=segs))
        n = pic.get("n_ranks")
        pic = dict(pic, lanes=lanes, n_ranks=n if isinstance(n, int) and not isinstance(n, bool) else None,
                   ticks=time_ticks(float(pic["span_us"])),
                   lane_h=max(LANE_H, MIN_PLOT_H // max(1, len(lanes))))
    else:
        pic = None
    return {"replay": rp, "whatif": wi, "picture": pic}


LANE_H = 26  # px per rank lane (viewBox units) ...
MIN_PLOT_H = 120  # ... but the lanes together never less: one rank's lane is not a sliver


def time_ticks(span_us: float, target: int = 8) -> list[dict]:
    """Ticks of the lanes' time axis: ``{frac, label}`` (position as a share of ``span_us``, the time in ms), from
    0 at a step of 1, 2 or 5 × 10^k ms that gives about ``target`` ticks; ``[]`` for a span that is not positive."""
    if not (span_us > 0 and math.isfinite(span_us)):
        return []
    span_ms = span_us / 1e3
    raw = span_ms / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    digits = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    out, k = [], 0
    while k * step <= span_ms * (1 + 1e-9) and k <= 4 * target:
        out.append({"frac": round(k * step / span_ms, 5), "label": f"{k * step:,.{digits}f}"})
        k += 1
    return out


CONFIDENCE_LEVELS = ("high", "medium", "low")  # traceanalyze.diagnose.confidence.LEVELS
MAX_WHY = 6  # reasons shown for one confidence level


def confidence_view(c) -> dict | None:
    """A ``confidence`` dict of the model (a finding's, a what-if's or ``verdict_confidence``) for display:
    ``level`` (high / medium / low), ``why`` (up to :data:`MAX_WHY` strings), ``range`` ([low, high] % when both are
    finite, else None), ``line`` (str or None) and ``text`` ("medium: one profiled step; ..."); None when ``c``
    carries no valid level."""
    if not isinstance(c, dict) or c.get("level") not in CONFIDENCE_LEVELS:
        return None
    why = [str(w) for w in c["why"][:MAX_WHY]] if isinstance(c.get("why"), list) else []
    r = c.get("range_pct") if isinstance(c.get("range_pct"), list) else []
    rng = [finite(r[0]), finite(r[1])] if len(r) == 2 else None
    line = c.get("line")
    return {"level": c["level"], "why": why, "range": rng if rng and None not in rng else None,
            "line": str(line) if isinstance(line, str) else None,
            "text": c["level"] + (": " + "; ".join(why) if why else "")}


def step_range(w: dict) -> list[float] | None:
    """A what-if's predicted step range (µs) for display: the step before the fix less the ends of its saving's
    90 % range (``confidence.range_pct``, docs/confidence.md), so the step and the saving show one range; the
    precision model's own bounds (``range_us``) where no such range was stated; None when neither is."""
    c = w.get("confidence") if isinstance(w.get("confidence"), dict) else {}
    rng, pred, saving = c.get("range_pct"), finite(w.get("predicted_step_time_us")), finite(w.get("saving_us"))
    if (isinstance(rng, list) and len(rng) == 2 and all(finite(x) is not None for x in rng) and pred is not None
            and saving is not None):
        before = pred + saving
        return [before * (1 - rng[1] / 100), before * (1 - rng[0] / 100)]
    r = w.get("range_us")
    return r if isinstance(r, list) and len(r) == 2 and all(finite(x) is not None for x in r) else None


def _conf(c) -> dict:
    """A what-if's ``confidence`` for display: :func:`confidence_view`'s ``level`` (None when invalid) and ``why``,
    with the replay's ``replay_error_pct`` and ``collective_instances`` (finite numbers or None)."""
    view = confidence_view(c) or {"level": None, "why": []}
    c = c if isinstance(c, dict) else {}
    n = finite(c.get("collective_instances"))
    fid = c.get("replay_fidelity_pct", c.get("replay_error_pct"))
    return {"level": view["level"], "why": view["why"], "replay_error_pct": finite(fid),
            "replay_fidelity_pct": finite(fid), "range": view.get("range"),
            "collective_instances": int(n) if n is not None else None}


def _left_out(rp: dict) -> list[dict]:
    """The replay's ``left_out`` rows (what-ifs the host rules out), those that are dicts."""
    lo = rp.get("left_out")
    return [x for x in lo if isinstance(x, dict)] if isinstance(lo, list) else []


def _t(v) -> str:
    """Model text for Markdown, table cells included (``|`` escaped): :func:`traceanalyze.safety.md_text`."""
    return md_text(str(v), cell=True) or "—"


def _f(v, scale: float = 1e3) -> str:
    x = finite(v)
    return "—" if x is None else f"{x / scale:,.2f}"


def replay_markdown(run: dict) -> list[str]:
    """Markdown lines: the "Predicted step time if fixed" table and the replay's fidelity."""
    rp = run.get("replay") if isinstance(run.get("replay"), dict) else None
    if not rp:
        return []
    out = ["#### Predicted step time if fixed", ""]
    if not rp.get("reliable"):
        out += [f"**Unreliable:** the replay misses the measured step time by {_f(rp.get('error_pct'), 1)} %.", ""]
    rows = [w for w in run.get("whatif") or [] if isinstance(w, dict)]
    if rows:
        out += ["| cause | what-if | predicted step ms | saving ms | saving % | confidence |",
                "|---|---|--:|--:|--:|---|"]
        for w in rows:
            c = _conf(w.get("confidence"))
            rng = step_range(w)
            extra = f" ({_f(rng[0])}–{_f(rng[1])})" if rng else ""
            out.append(f"| {_t(w.get('cause'))} | {_t(w.get('scenario'))} | "
                       f"{_f(w.get('predicted_step_time_us'))}{extra} | {_f(w.get('saving_us'))} | "
                       f"{_f(w.get('saving_pct'), 1)} | {_t(c['level'] or '—')}"
                       + (f" ({_t('; '.join(c['why']))})" if c["why"] else "")
                       + (f"; saving {c['range'][0]:.1f}–{c['range'][1]:.1f} % (90 % range)" if c["range"]
                          else "")
                       + f"; replay fidelity {_f(c['replay_fidelity_pct'], 1)} % off the measured step (not a check "
                       f"of the prediction), {c['collective_instances'] or 0} collective instances |")
        for w in rows:
            if w.get("reliable") is False and w.get("unreliable_reason"):
                out += ["", f"Unreliable: {_t(w.get('scenario'))}: {_t(w.get('unreliable_reason'))}."]
    else:
        out.append("No what-if applies to this run.")
    for lo in _left_out(rp):
        out += ["", f"Left out: {_t(lo.get('scenario'))}: {_t(lo.get('why'))}."]
    out += ["", f"Replay fidelity: replayed {_f(rp.get('replayed_step_time_us'))} ms vs measured "
                f"{_f(rp.get('measured_step_time_us'))} ms ({_f(rp.get('error_pct'), 1)} % error)"
                + ("; partial (peers not in the folder)" if rp.get("partial") else "") + ".", ""]
    for u in rp.get("unmatched") or []:
        out.append(f"- unmatched: {_t(u)}")
    for m in rp.get("missing_edges") or []:
        out.append(f"- missing edges: {_t(m)}")
    ug = rp.get("unexplained_gaps") or {}
    if ug.get("streams"):
        st, th = ug["streams"], ug.get("threads") or {}
        out.append(f"- idle kept as measured, per step: GPU streams {_f(st.get('kept_us'))} of "
                   f"{_f(st.get('idle_us'))} ms ({_f(st.get('kept_pct'), 1)} %), host threads "
                   f"{_f(th.get('kept_us'))} of {_f(th.get('idle_us'))} ms ({_f(th.get('kept_pct'), 1)} %)")
    return out + ([""] if rp.get("unmatched") or rp.get("missing_edges") or ug.get("streams") else [])
