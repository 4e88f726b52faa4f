"""Where a rank's time goes inside its steps: per-op time per step, the largest host gaps, and the timeline of the
median step (one lane per rank, compute / communication / idle).

These feed the straggler finding (which ops and which gaps make a rank slow, :mod:`traceanalyze.diagnose`), the
Perfetto markers of :mod:`traceanalyze.export` (the gap ranges, not the whole step) and the report's timeline
picture (:mod:`traceanalyze.report`, ``templates/_timeline.html.j2``). All read the counted profiler steps of
:mod:`.steps`; times are on each rank's own clock.

* **Op time per step** (µs): GPU mode, the counted kernels of each rank by name; CPU mode, the ``cpu_op`` rows
  inside the rank's counted steps on the step's thread (ops nest, so a parent and its child both count), each
  summed and divided by the rank's number of counted steps.
* **Host gaps**: stretches of a counted step, on the thread that runs the profiler step, covered by no CPU op,
  annotation or runtime call (``ProfilerStep#N`` itself aside): time the host did nothing the profiler labelled
  (a sleep, I/O, a lock, Python outside ``record_function``). Largest first.
* **Timeline of the median step**: the step number whose run-wide duration (the slowest rank's) is the median
  (the one nearest it when the count is even); per rank, that step from its own start, cut into segments of
  compute (a compute kernel, CPU: an ``aten::`` op), communication (only NCCL kernels, CPU: only ``c10d::`` /
  ``gloo:`` / ``nccl:`` ops) and idle, in that precedence, as the temporal breakdown counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np

from traceanalyze.metrics._sql import counted_kernels_sql

MAX_TIMELINE_LANES = 32  # lanes drawn; beyond, the outliers first, then evenly spread ranks
MIN_SEGMENT_FRAC = 0.002  # segments shorter than this share of the lane's step merge into their neighbour


@dataclass
class HostGap:
    """One gap on a rank's step thread: absolute ns on the rank's clock, and µs from its step's start."""

    rank: int
    step: int
    start_ns: int
    end_ns: int
    step_start_ns: int

    @property
    def dur_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1e3

    @property
    def offset_us(self) -> float:
        return (self.start_ns - self.step_start_ns) / 1e3


def _counted_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, int]:
    return dict(con.execute("SELECT rank, count(*) FROM profiler_steps(?) WHERE counted GROUP BY rank",
                            [run_id]).fetchall())


def op_time_per_step(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, limit: int = 40
                     ) -> dict[int, dict[str, float]]:
    """Per rank, µs per counted step of each of the run's ``limit`` busiest ops (GPU: kernels, CPU: ``cpu_op``
    rows on the step thread). Ranks without counted steps are left out."""
    n_steps = _counted_steps(con, run_id)
    if not n_steps:
        return {}
    if mode == "gpu":
        # the kernels narrowed before their launches are looked up, and every launch read once (few=False):
        # looking up each kernel's correlation held ~850 MB in DuckDB at 1,024 ranks
        counted = counted_kernels_sql("$1", "k.cat = 'kernel'", few=False)
        sql = (f"SELECT f.rank, k.name, sum(k.dur_ns) / 1e3 AS us FROM ({counted}) k "
               "JOIN files f USING (file_id) GROUP BY ALL")
    else:
        sql = """SELECT s.rank, c.name, sum(least(c.ts_ns + c.dur_ns, s.end_ns) - c.ts_ns) / 1e3 AS us
                 FROM profiler_steps($1) s JOIN cpu_ops c ON c.file_id = s.file_id AND c.pid = s.pid
                   AND c.tid = s.tid AND c.ts_ns >= s.start_ns AND c.ts_ns < s.end_ns
                 WHERE s.counted AND c.cat = 'cpu_op' GROUP BY ALL"""
    rows = con.execute(f"""WITH t AS ({sql}),
        top AS (SELECT name FROM t GROUP BY name ORDER BY sum(us) DESC, name LIMIT $2)
        SELECT rank, name, us FROM t WHERE name IN (SELECT name FROM top)""", [run_id, limit]).fetchall()
    out: dict[int, dict[str, float]] = {r: {} for r in n_steps}
    for rank, name, us in rows:
        if rank in n_steps and name is not None:
            out[rank][str(name)] = float(us) / n_steps[rank]
    return out


def host_gaps(con: duckdb.DuckDBPyConnection, run_id: int, ranks: list[int] | None = None, top: int = 3,
              min_us: float = 0.0, step: int | None = None) -> tuple[dict[int, list[HostGap]], dict[int, float]]:
    """The ``top`` largest host gaps of each rank's counted steps (module docstring), and each rank's total gap
    time per counted step (µs). ``ranks`` narrows the ranks looked at, ``step`` the steps (then the total is that
    step's); gaps under ``min_us`` are left out. Ties: the earlier gap, then the lower step, first.

    The ops stream from DuckDB in order and each batch's gaps are summed and only its ``top`` largest per step
    kept (:class:`_GapScan`): a window function over them held ~0.8 GB on a 1.9 GB trace, this ~0.2 GB."""
    where = "" if ranks is None else f"AND s.rank IN ({', '.join(str(int(r)) for r in ranks) or 'NULL'})"
    if step is not None:
        where += f" AND s.step = {int(step)}"
    steps_sql = f"""SELECT row_number() OVER (ORDER BY file_id, step, start_ns) - 1 AS k, file_id, rank, step,
                           start_ns, end_ns, pid, tid FROM profiler_steps($1) s WHERE counted {where}"""
    st = con.execute(steps_sql + " ORDER BY k", [run_id]).fetchnumpy()
    if not st["k"].size:
        return {}, {}
    s0, s1 = np.asarray(st["start_ns"], np.int64), np.asarray(st["end_ns"], np.int64)
    scan = _GapScan(s1 - s0, top)
    reader = con.sql(f"""WITH s AS ({steps_sql})
        SELECT s.k::INTEGER AS k, greatest(c.ts_ns, s.start_ns) - s.start_ns AS a,
               least(c.ts_ns + c.dur_ns, s.end_ns) - s.start_ns AS b
        FROM s JOIN cpu_ops c ON c.file_id = s.file_id AND c.pid = s.pid AND c.tid = s.tid
          AND c.ts_ns < s.end_ns AND c.ts_ns + c.dur_ns > s.start_ns
        WHERE c.cat IN ('cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver')
          AND NOT starts_with(c.name, 'ProfilerStep#')
        ORDER BY k, a, b""", params=[run_id]).to_arrow_reader(1 << 17)
    for batch in reader:
        scan.add(*(batch.column(c).to_numpy(zero_copy_only=False) for c in ("k", "a", "b")))
    gk, gs, ge, total = scan.finish()
    rank = np.asarray(st["rank"], np.int64)
    steps_of = np.asarray(st["step"], np.int64)
    ranks_of, inv = np.unique(rank, return_inverse=True)
    by_rank = np.bincount(inv, weights=total, minlength=ranks_of.size)
    # a rank's counted steps are its rows of ``st`` (all of them when ``step`` is None): no second query
    n_steps = np.bincount(inv, minlength=ranks_of.size).tolist() if step is None else [1] * ranks_of.size
    per_step = {r: float(t) / 1e3 / max(1, n)
                for r, t, n in zip(ranks_of.tolist(), by_rank.tolist(), n_steps, strict=True) if t > 0}
    gs, ge = gs + s0[gk], ge + s0[gk]  # ns on the rank's clock
    gr = rank[gk]
    gaps: dict[int, list[HostGap]] = {}
    o = np.lexsort((steps_of[gk], gs, -(ge - gs), gr))  # per rank: longest first, then earliest
    taken: dict[int, int] = {}
    for i in o.tolist():
        r = int(gr[i])
        if taken.get(r, 0) < top:
            taken[r] = taken.get(r, 0) + 1
            if (ge[i] - gs[i]) / 1e3 >= min_us:
                gaps.setdefault(r, []).append(HostGap(r, int(steps_of[gk[i]]), int(gs[i]), int(ge[i]),
                                                      int(s0[gk[i]])))
    return gaps, per_step


_END_BITS = 41  # an end in ns from its step's start below 2^41 (36 min): (step << 41) + end sorts by step first
_END_MASK = (1 << _END_BITS) - 1


class _GapScan:
    """The gaps of steps ``0..len(dur)-1`` from their intervals [a, b) (ns from the step start), fed in batches
    ordered by (step, a, b): a gap before each interval that starts after every earlier one of its step ended, one
    after the step's last end, and the whole step when it has none. Keeps each step's total gap time and, of
    each batch, only the ``top`` largest gaps per step (the largest per rank are among them)."""

    def __init__(self, dur: np.ndarray, top: int) -> None:
        self.dur, self.top = dur, max(1, top)
        self.total = np.zeros(dur.size)
        self.last_end = np.zeros(dur.size, np.int64)
        self.seen = np.zeros(dur.size, bool)
        self.state = -1  # (step << 41) + latest end so far
        self.cand: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, k: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        if not k.size:
            return
        k = k.astype(np.int64)
        run = np.maximum(np.maximum.accumulate((k << _END_BITS) + np.clip(b, 0, _END_MASK)), self.state)
        prev = np.empty_like(run)
        prev[0], prev[1:] = self.state, run[:-1]
        prev_end = np.where((prev >> _END_BITS) == k, prev & _END_MASK, 0)
        g = a > prev_end
        self._keep(k[g], prev_end[g], a[g])
        last = np.flatnonzero(np.r_[k[1:] != k[:-1], True])
        self.last_end[k[last]] = run[last] & _END_MASK
        self.seen[k[last]] = True
        self.state = int(run[-1])

    def _keep(self, gk: np.ndarray, gs: np.ndarray, ge: np.ndarray) -> None:
        if not gk.size:
            return
        self.total += np.bincount(gk, weights=(ge - gs).astype(np.float64), minlength=self.dur.size)
        o = np.lexsort((gs, -(ge - gs), gk))
        gk, gs, ge = gk[o], gs[o], ge[o]
        start = np.flatnonzero(np.r_[True, gk[1:] != gk[:-1]])
        pos = np.arange(gk.size) - np.repeat(start, np.diff(np.r_[start, gk.size]))
        m = pos < self.top
        self.cand.append((gk[m], gs[m], ge[m]))

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(step, start, end) of the kept gaps and every step's total gap time (ns)."""
        idx = np.arange(self.dur.size)
        tail = self.seen & (self.last_end < self.dur)
        self._keep(idx[tail], self.last_end[tail], self.dur[tail])
        empty = ~self.seen
        self._keep(idx[empty], np.zeros(int(empty.sum()), np.int64), self.dur[empty])
        if not self.cand:
            z = np.zeros(0, np.int64)
            return z, z, z, self.total
        return (*(np.concatenate([c[i] for c in self.cand]) for i in range(3)), self.total)


def median_step(steps: list[dict]) -> int | None:
    """The step number whose run-wide duration (the slowest rank's) is the median: the lower middle one for an
    even count. ``steps`` are the report model's step rows (``step``, ``step_time_us``)."""
    longest: dict[int, float] = {}
    for s in steps:
        if isinstance(s.get("step"), int) and s.get("step_time_us") is not None:
            longest[s["step"]] = max(longest.get(s["step"], 0.0), float(s["step_time_us"]))
    if not longest:
        return None
    order = sorted(longest, key=lambda k: (longest[k], k))
    return order[(len(order) - 1) // 2]


def step_timeline(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, step: int,
                  ranks: list[int] | None = None) -> list[dict]:
    """Per rank, the segments of one profiler step (module docstring).

    Returns ``[{"rank", "step", "start_ns", "dur_us", "segments": [{"kind": compute|communication|idle,
    "start_us", "dur_us"}]}]``, segments from the rank's step start, in order, covering the step; adjacent
    segments of one kind are merged and ones shorter than :data:`MIN_SEGMENT_FRAC` of the step fold into the
    previous segment. ``ranks`` narrows the lanes (default: every rank with that step).
    """
    shown = ", ".join(str(int(r)) for r in ranks or []) or "NULL"
    where = "" if ranks is None else f"AND rank IN ({shown})"
    lanes = con.execute(f"""SELECT rank, file_id, start_ns, end_ns, pid, tid FROM profiler_steps(?)
                            WHERE step = ? {where} ORDER BY rank""", [run_id, step]).fetchall()
    if not lanes:
        return []
    bounds = {r: (f, a, b, p, t) for r, f, a, b, p, t in lanes}
    where = "" if ranks is None else f"AND s.rank IN ({shown})"  # the events of the lanes shown, not every rank's
    if mode == "gpu":
        sql = f"""SELECT f.rank, CASE kernel_class(k.cat, k.name) WHEN 'compute' THEN 1 ELSE 2 END AS cls,
                        k.ts_ns AS a, k.ts_ns + k.dur_ns AS b
                 FROM kernels k JOIN files f USING (file_id)
                 JOIN (SELECT file_id, rank, start_ns, end_ns FROM profiler_steps($1) s WHERE step = $2 {where}) s
                   ON s.file_id = k.file_id AND k.ts_ns < s.end_ns AND k.ts_ns + k.dur_ns > s.start_ns
                 WHERE k.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')"""
    else:
        sql = f"""SELECT s.rank, CASE cpu_op_class(c.cat, c.name) WHEN 'compute' THEN 1 ELSE 2 END AS cls,
                        c.ts_ns AS a, c.ts_ns + c.dur_ns AS b
                 FROM profiler_steps($1) s JOIN cpu_ops c ON c.file_id = s.file_id
                   AND c.ts_ns < s.end_ns AND c.ts_ns + c.dur_ns > s.start_ns
                 WHERE s.step = $2 {where} AND cpu_op_class(c.cat, c.name) IN ('compute', 'communication')
                   AND (c.tid = s.tid OR cpu_op_class(c.cat, c.name) = 'communication')"""
    rows = con.execute(sql + " ORDER BY 1, 3", [run_id, step]).fetchnumpy()
    rk = np.asarray(rows["rank"], np.int64)
    cls, a_all, b_all = (np.asarray(rows[c], np.int64) for c in ("cls", "a", "b"))
    out = []
    for rank, (_f, s0, s1, _p, _t) in sorted(bounds.items()):
        dur = max(1, s1 - s0)
        lo, hi = np.searchsorted(rk, rank), np.searchsorted(rk, rank, side="right")
        segs = _segments(cls[lo:hi], a_all[lo:hi], b_all[lo:hi], s0, s1)
        out.append({"rank": int(rank), "step": int(step), "start_ns": int(s0), "dur_us": dur / 1e3,
                    "segments": [{"kind": k, "start_us": (a - s0) / 1e3, "dur_us": (b - a) / 1e3}
                                 for k, a, b in segs]})
    return out


_KINDS = {0: "idle", 1: "compute", 2: "communication"}


def _segments(cls: np.ndarray, a: np.ndarray, b: np.ndarray, s0: int, s1: int) -> list[tuple[str, int, int]]:
    """Cut [s0, s1) by the intervals (class ``cls``, start ``a``, end ``b``): compute over communication over idle.

    The cut points split the step into elementary slices, each of the best class covering it; a slice shorter than
    :data:`MIN_SEGMENT_FRAC` of the step joins the segment before it, and a segment shorter than that takes the
    kind of the next long slice. Slices tile the step, so only each run of one kind's first long slice can change
    the segments: those (at most 1 / MIN_SEGMENT_FRAC) are walked, the rest is NumPy."""
    a_c, b_c = np.clip(a, s0, s1), np.clip(b, s0, s1)
    p = np.unique(np.concatenate([[s0, s1], a_c, b_c]).astype(np.int64))
    level = np.zeros(p.size - 1, dtype=np.int8)
    i, j = np.searchsorted(p, a_c), np.searchsorted(p, b_c)
    for c in (2, 1):  # compute over communication
        m = (cls == c) & (j > i)
        cover = np.bincount(i[m], minlength=p.size) - np.bincount(j[m], minlength=p.size)
        level[np.cumsum(cover)[:-1] > 0] = c
    if not level.size:
        return []
    min_ns = MIN_SEGMENT_FRAC * (s1 - s0)
    # runs of one kind; the first slice of each run that is not short
    start = np.flatnonzero(np.r_[True, level[1:] != level[:-1]])
    long_idx = np.where(np.diff(p) >= min_ns, np.arange(level.size), level.size)
    first_long = np.minimum.reduceat(long_idx, start)
    ends = np.r_[start[1:], level.size]
    merged = [[_KINDS[int(level[0])], int(p[0]), int(p[1])]]
    for r in np.flatnonzero((first_long < ends) & (np.arange(start.size) > 0)).tolist():
        kind, at = _KINDS[int(level[start[r]])], int(p[first_long[r]])
        last = merged[-1]
        if last[0] == kind:
            continue
        if at - last[1] < min_ns:
            last[0] = kind  # a short segment takes the next long slice's kind
        else:
            last[2] = at
            merged.append([kind, at, at])
    merged[-1][2] = int(p[-1])
    out: list[list] = []
    for seg in merged:  # folding can leave neighbours of one kind
        if out and out[-1][0] == seg[0]:
            out[-1][2] = seg[2]
        else:
            out.append(seg)
    return [(k, a, b) for k, a, b in out]


def lanes_to_show(rank_ids: list[int], outliers: list[int], limit: int = MAX_TIMELINE_LANES) -> list[int]:
    """At most ``limit`` ranks: the outliers first (in their order), then ranks spread evenly over the rest."""
    chosen = list(dict.fromkeys(r for r in outliers if r in rank_ids))[:limit]  # a rank named twice counts once
    rest = [r for r in rank_ids if r not in chosen]
    room = limit - len(chosen)
    if room > 0 and rest:
        if len(rest) <= room:
            chosen += rest
        else:
            chosen += [rest[round(i * (len(rest) - 1) / max(1, room - 1))] for i in range(room)]
    return sorted(set(chosen), key=lambda r: (r not in outliers, r))


def timeline_model(con: duckdb.DuckDBPyConnection, run_id: int, mode: str, steps: list[dict],
                   marked: dict[int, list[dict]] | None = None, outliers: list[int] | None = None) -> dict | None:
    """The report model's ``timeline``: the median step (:func:`median_step`) of at most :data:`MAX_TIMELINE_LANES`
    ranks (:func:`lanes_to_show`), as ``{"step", "n_ranks", "lanes": step_timeline(...), "markers": [{"rank",
    "start_us", "dur_us", "label", "cause"}]}``; ``marked`` gives findings' ranges per rank (µs from that rank's
    step start, for this step only). None without profiler steps."""
    st = median_step(steps)
    if st is None:
        return None
    rank_ids = sorted({s["rank"] for s in steps if s.get("step") == st})
    show = lanes_to_show(rank_ids, outliers or [])
    lanes = step_timeline(con, run_id, mode, st, show)
    order = {r: i for i, r in enumerate(show)}
    lanes.sort(key=lambda ln: order.get(ln["rank"], 1 << 30))
    markers = [dict(m, rank=r) for r, ms in (marked or {}).items() if r in order for m in ms]
    return {"step": st, "n_ranks": len(rank_ids), "lanes": lanes, "markers": markers}
