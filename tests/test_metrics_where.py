"""traceanalyze.metrics.where: the host gaps of each step, found in batches (:class:`where._GapScan`), against a
plain reference on generated intervals; and through a report, on a generated straggler whose gaps are known."""

from __future__ import annotations

import random

import numpy as np

from traceanalyze.metrics import where


def _reference(steps: list[list[tuple[int, int]]], dur: list[int]) -> list[tuple[int, int, int]]:
    """Every gap (step, start, end): walk each step's intervals by (start, end), tracking the latest end."""
    out = []
    for k, ivs in enumerate(steps):
        end = 0
        for a, b in sorted(ivs):
            if a > end:
                out.append((k, end, a))
            end = max(end, b)
        if end < dur[k]:
            out.append((k, end, dur[k]))
    return out


def test_gap_scan_matches_the_reference_whatever_the_batches():
    rng = random.Random(7)
    dur = [rng.randint(1_000, 50_000) for _ in range(40)]
    steps = []
    for k, d in enumerate(dur):
        n = 0 if k % 9 == 4 else rng.randint(1, 60)  # some steps have no op at all: the whole step is a gap
        ivs = []
        for _ in range(n):
            a = rng.randint(0, d - 1)
            ivs.append((a, min(d, a + rng.randint(1, d // 4))))  # nested and overlapping ops
        steps.append(ivs)
    ref = _reference(steps, dur)
    rows = sorted((k, a, b) for k, ivs in enumerate(steps) for a, b in ivs)
    arr = np.array(rows, np.int64)
    for cut in (1, 7, 100, len(rows)):  # batch sizes: a step's ops split over batches
        scan = where._GapScan(np.array(dur, np.int64), top=3)
        for i in range(0, len(rows), cut):
            chunk = arr[i:i + cut]
            scan.add(chunk[:, 0].astype(np.int32), chunk[:, 1], chunk[:, 2])
        gk, gs, ge, total = scan.finish()
        want_total = np.zeros(len(dur))
        for k, a, b in ref:
            want_total[k] += b - a
        assert total.tolist() == want_total.tolist()
        for k in range(len(dur)):  # each step's 3 largest gaps (longest first, then earliest) are kept
            mine = sorted(((a, b) for kk, a, b in ref if kk == k), key=lambda g: (g[0] - g[1], g[0]))[:3]
            kept = sorted(((int(a), int(b)) for kk, a, b in zip(gk, gs, ge, strict=True) if kk == k),
                          key=lambda g: (g[0] - g[1], g[0]))[:3]
            assert kept == mine, (cut, k)
    assert sum(1 for k, _a, _b in ref if not steps[k]) == 4  # the empty steps 4, 13, 22, 31


def test_host_gaps_of_a_generated_straggler(tmp_path):
    """Rank 1 of the generated NCCL job idles 30 ms on the host before its forward in every step (every rank first
    idles 300 µs, tests/synth.gpu_job): its largest gaps are those, from each counted step's start, and its gap
    time per step is 30 ms more than the others' (620 µs: 300 at the start, 300 + 20 at the end, per step)."""
    import traceanalyze as ta
    from tests.synth import gpu_job, write_trace

    for r in range(4):
        write_trace(tmp_path / f"rank{r}.json", r, gpu_job(r, 4, straggler=1, gap_us=30_000.0), backend="nccl")
    with ta.analyze(tmp_path, jobs=1) as a:
        gaps, per_step = where.host_gaps(a.con, 1, top=3)
        assert sorted(gaps) == [0, 1, 2, 3]
        assert [(g.step, g.dur_us, g.offset_us) for g in gaps[1]] == [(0, 30_300.0, 0.0), (1, 30_300.0, 0.0),
                                                                       (2, 30_300.0, 0.0)]
        assert [(g.step, g.dur_us, g.offset_us) for g in gaps[0]] == [(0, 300.0, 0.0), (0, 300.0, 118_000.0),
                                                                       (1, 300.0, 0.0)]
        assert per_step == {0: 620.0, 1: 30_620.0, 2: 620.0, 3: 620.0}
        one, _ = where.host_gaps(a.con, 1, ranks=[1], top=1, step=gaps[1][0].step)
        assert list(one) == [1] and one[1] == gaps[1][:1]


def _segments_reference(ivs: list[tuple[int, int, int]], s0: int, s1: int) -> list[tuple[str, int, int]]:
    """The timeline's rule, slice by slice: each elementary slice takes the best class covering it (compute over
    communication over idle); a slice shorter than MIN_SEGMENT_FRAC of the step joins the segment before it, a
    segment shorter than that takes the next slice's kind; neighbours of one kind merge."""
    p = sorted({s0, s1, *(min(max(x, s0), s1) for _c, a, b in ivs for x in (a, b))})
    merged: list[list] = []
    min_ns = where.MIN_SEGMENT_FRAC * (s1 - s0)
    for lo, hi in zip(p[:-1], p[1:], strict=True):
        best = max((c for c, a, b in ivs if a <= lo and b >= hi), key=lambda c: {1: 2, 2: 1}[c], default=0)
        kind = where._KINDS[best]
        if merged and (merged[-1][0] == kind or hi - lo < min_ns):
            merged[-1][2] = hi
        elif merged and merged[-1][2] - merged[-1][1] < min_ns:
            merged[-1][0], merged[-1][2] = kind, hi
        else:
            merged.append([kind, lo, hi])
    out: list[list] = []
    for seg in merged:
        if out and out[-1][0] == seg[0]:
            out[-1][2] = seg[2]
        else:
            out.append(seg)
    return [tuple(x) for x in out]


def test_timeline_segments_match_the_slice_by_slice_rule():
    rng = random.Random(3)
    for case in range(300):
        s0, s1 = 10_000, 10_000 + rng.choice([1_000, 50_000, 2_000_000])
        ivs = []
        for _ in range(rng.randint(0, 80)):
            a = rng.randint(s0 - 500, s1)
            ivs.append((rng.choice([1, 2]), a, a + rng.choice([1, 3, 40, 900, 20_000])))
        cls, a, b = (np.array([iv[i] for iv in ivs], np.int64) for i in range(3))
        assert where._segments(cls, a, b, s0, s1) == _segments_reference(ivs, s0, s1), case


def test_lanes_to_show_counts_a_rank_named_twice_once():
    """Findings can name the same rank; it takes one lane, and the room left goes to ranks spread evenly."""
    from traceanalyze.metrics.where import lanes_to_show

    show = lanes_to_show(list(range(40)), [17, 17, 3], limit=8)
    assert show == [3, 17, 0, 8, 16, 24, 32, 39]  # 8 lanes (a list that kept 17 twice left room for 5 more only)
