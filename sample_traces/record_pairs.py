"""Record the paired samples: each slow scenario and its fixed twin, interleaved, three repetitions.

Usage, from the repository root, with the samples' Python (``torch==2.13.0``, see README.md)::

    python sample_traces/generate.py --pairs [NAME ...] [--out sample_traces]

For every pair, repetitions 1..3 each run the slow job and then its fixed twin (slow, fixed, slow, fixed,
slow, fixed), so that the shared machine's drifting load weighs on both sides alike. The jobs are the ones
of ``generate.py`` (same code: ``record``, ``interconnect``, ``compile_run``), each side one run folder like
every sample (traces, ``rank{r}.log``, ``scenario.json`` with a ``pair`` key). The traces of one repetition
are kept, the one with the median measured saving, in ``OUT/pairs/<pair>/slow/`` and ``fixed/``;
``OUT/pairs/<pair>/pair.json`` holds the step times of all three repetitions and the measured saving.

A run's step time here is the one traceanalyze reports (``traceanalyze/metrics/steps.py``): the median, over
the counted profiler steps (the profiled steps but the window's last one), of the longest rank's step time;
taken from the step times the ranks measured themselves (``scenario.json`` ``step_times_ms``). The measured
saving is ``100 * (1 - fixed / slow)`` on the medians over the repetitions.
"""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import generate as g

REPETITIONS = 3
NONE: dict = {"cause": None, "kind": None, "ranks": []}
STRAGGLER: dict = {"cause": "imbalance", "kind": "straggler", "ranks": [2]}
# ~2x the compute of one step of the 2-rank job on 2 idle cores (~55 ms per step).
STRAGGLER_SLEEP_MS = 100.0
# 8 samples per micro-batch x 10 ms = 80 ms of I/O wait per step (~1.5x the 2-rank step's compute).
SAMPLE_READ_MS = 10.0
# A host stall before backward of ~2.5x a step's compute (issue 30's case: 150 ms on a 2-rank job).
STALL_MS = 150.0
# Pure-Python work on rank 0 after opt.step() (its own logging, metrics or checkpoint bookkeeping), the same 150 ms
# as the stall (issue 37: a 2-rank gloo run whose rank 0 works 150 ms after the optimizer).
TAIL_MS = 150.0
LATE: dict = {"cause": "imbalance", "kind": "late_entry", "ranks": [0]}
# 4 MiB fp32 buffer: 0.17 s per round at the shaped 25 MB/s, a few ms unshaped.
LINK_PROBE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Side:
    """One side of a pair: its scenario.json description and expected finding, and how its job differs
    (``kw``: JobConfig fields; for the interconnect pair also ``qdisc``, for the compile pair ``cache``)."""

    description: str
    expected: dict
    kw: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Pair:
    """A slow scenario and its fixed twin, run as ``runner`` (``job``: generate.record, ``interconnect``:
    generate.interconnect, ``compile``: generate.compile_run) on ``world`` ranks."""

    whatif: str  # the what-if that should predict the fixed run from the slow one
    description: str
    world: int
    slow: Side
    fixed: Side
    runner: str = "job"


PAIRS: dict[str, Pair] = {
    "straggler_compute": Pair(
        "no_straggler",
        "4 gloo ranks on 2 cores; slow: rank 2 alone runs 6 extra torch.no_grad() forward passes before "
        "backward every step (as the straggler sample); fixed: the same job without them.",
        4,
        Side(
            "4 gloo ranks; rank 2 alone runs 6 extra forward passes under torch.no_grad() before backward "
            "every step, so the other ranks wait for it in the gradient all-reduce (gloo:all_reduce). The "
            "slow run of the straggler_compute pair.",
            STRAGGLER,
            {"straggler_rank": 2, "straggler_extra_forwards": 6},
        ),
        Side("4 gloo ranks, balanced (no extra forward passes). The fixed twin of the straggler_compute pair.",
             NONE),
    ),
    "straggler_sleep": Pair(
        "no_straggler",
        f"2 gloo ranks on 2 cores, one compute thread each (one core per rank: a sleeping rank frees no core "
        f"that the other could use); slow: rank 1 sleeps {STRAGGLER_SLEEP_MS:g} ms (time.sleep, host idle, no "
        "profiler range) at the start of every step, about 2x a step's compute; fixed: the same job without it.",
        2,
        Side(
            f"2 gloo ranks; rank 1 sleeps {STRAGGLER_SLEEP_MS:g} ms (time.sleep: the host idles, in no "
            "profiler range) at the start of every step, so rank 0 waits for it in the gradient all-reduce. "
            "The slow run of the straggler_sleep pair.",
            {"cause": "imbalance", "kind": "straggler", "ranks": [1]},
            {"straggler_rank": 1, "straggler_sleep_ms": STRAGGLER_SLEEP_MS},
        ),
        Side("2 gloo ranks, balanced (nobody sleeps). The fixed twin of the straggler_sleep pair.", NONE),
    ),
    "straggler_compute_2": Pair(
        "no_straggler",
        "2 gloo ranks on 2 cores, one compute thread each; slow: rank 1 alone runs 3 extra torch.no_grad() "
        "forward passes before backward every step (about 2x its compute); fixed: the same job without them.",
        2,
        Side(
            "2 gloo ranks; rank 1 alone runs 3 extra forward passes under torch.no_grad() before backward every "
            "step, so rank 0 waits for it in the gradient all-reduce. The slow run of the straggler_compute_2 "
            "pair.",
            {"cause": "imbalance", "kind": "straggler", "ranks": [1]},
            {"straggler_rank": 1, "straggler_extra_forwards": 3},
        ),
        Side("2 gloo ranks, balanced (no extra forward passes). The fixed twin of the straggler_compute_2 pair.",
             NONE),
    ),
    "host_stall": Pair(
        "no_straggler",
        f"2 gloo ranks on 2 cores, one compute thread each; slow: rank 1 sleeps {STALL_MS:g} ms between forward "
        "and backward (time.sleep, host idle, no profiler range) every step; fixed: the same job without it. "
        "(With 2 threads per rank the ranks share the cores and the step times vary 2x from run to run on this "
        "VM, too noisy to check a prediction.)",
        2,
        Side(
            f"2 gloo ranks; rank 1 sleeps {STALL_MS:g} ms before backward every step, so rank 0 "
            "waits for it in the gradient all-reduce. The slow run of the host_stall pair.",
            {"cause": "imbalance", "kind": "straggler", "ranks": [1]},
            {"straggler_rank": 1, "straggler_stall_ms": STALL_MS},
        ),
        Side("2 gloo ranks, balanced (nobody stalls). The fixed twin of the host_stall pair.", NONE),
    ),
    "late_entry": Pair(
        "aligned_step_starts",
        f"2 gloo ranks on 2 cores, one compute thread each, 4 profiled steps (schedule wait=1, warmup=1, active=4); "
        f"slow: rank 0 does {TAIL_MS:g} ms of pure-Python work after opt.step() every step (its own logging or "
        "checkpoint bookkeeping: no torch op, no profiler range, a host gap at the end of its step), so it enters "
        "each next step that much after rank 1, which waits for it in the first gradient all-reduce; fixed: the "
        "same job without it.",
        2,
        Side(
            f"2 gloo ranks; rank 0 works {TAIL_MS:g} ms (pure Python, no profiler range) after opt.step() every "
            "step, so it starts every next step late and rank 1 waits for it in the gradient all-reduce; 4 "
            "profiled steps. The slow run of the late_entry pair.",
            LATE,
            {"straggler_rank": 0, "straggler_tail_ms": TAIL_MS, "profile_active": 4},
        ),
        Side("2 gloo ranks, balanced (no work after the optimizer step), 4 profiled steps. The fixed twin of the "
             "late_entry pair.", NONE, {"profile_active": 4}),
    ),
    "late_entry_1step": Pair(
        "aligned_step_starts",
        f"The late_entry job with one profiled step (schedule wait=1, warmup=1, active=1): slow: rank 0 does "
        f"{TAIL_MS:g} ms of pure-Python work after opt.step() every step, so it enters the traced step late (the "
        "step before is not traced) and rank 1 waits for it; fixed: the same job without it.",
        2,
        Side(
            f"2 gloo ranks; rank 0 works {TAIL_MS:g} ms (pure Python, no profiler range) after opt.step() every "
            "step; one profiled step, which rank 0 enters late. The slow run of the late_entry_1step pair.",
            LATE,
            {"straggler_rank": 0, "straggler_tail_ms": TAIL_MS, "profile_active": 1},
        ),
        Side("2 gloo ranks, balanced, one profiled step. The fixed twin of the late_entry_1step pair.", NONE,
             {"profile_active": 1}),
    ),
    "slow_interconnect": Pair(
        "ideal_interconnect",
        "2 gloo ranks in two network namespaces joined by a veth pair (as the slow_interconnect sample); slow: "
        "both ends shaped with tc tbf to 200 Mbit/s; fixed: unshaped. Each rank first times a 4 MiB gloo "
        "all-reduce (# link probe in its log); link_bw_GBps is the fixed twin's bus bandwidth from it.",
        2,
        Side(
            "2 gloo ranks, each in its own network namespace, joined by a veth pair shaped to 200 Mbit/s "
            "(tc tbf on both ends); the ~14 MB fp32 gradient all-reduce per step dominates the step time. "
            "The slow run of the slow_interconnect pair.",
            {"cause": "interconnect", "kind": "slow_collectives", "ranks": [0, 1]},
            {"qdisc": g.SLOW_QDISC, "link_probe_bytes": LINK_PROBE_BYTES},
        ),
        Side(
            "The same namespaced job with the veth pair unshaped (no qdisc). The fixed twin of the "
            "slow_interconnect pair.",
            NONE,
            {"qdisc": None, "link_probe_bytes": LINK_PROBE_BYTES},
        ),
        runner="interconnect",
    ),
    "precision": Pair(
        "bf16_matmul",
        "2 gloo ranks (d_model 384, as the precision samples); slow: every matmul fp32; fixed: the forward under "
        "torch.autocast('cpu', dtype=torch.bfloat16). On a CPU without native bf16 matmul instructions "
        "(host.native_bf16 false: AVX2 only) the bf16 matmuls are emulated and the 'fix' makes the step slower.",
        2,
        Side(
            "2 gloo ranks, all matmuls in fp32 (no autocast). The slow run of the precision pair.",
            {"cause": "precision", "kind": "fp32_matmul", "ranks": [0, 1]},
            {"dtype": "float32", **g.PRECISION_KW},
        ),
        Side(
            "2 gloo ranks, forward under torch.autocast('cpu', dtype=torch.bfloat16): aten::mm/addmm get "
            "c10::BFloat16 inputs; parameters and the gradient all-reduce stay fp32. The fixed twin of the "
            "precision pair.",
            NONE,
            {"dtype": "bfloat16", **g.PRECISION_KW},
        ),
    ),
    "dataloader": Pair(
        "no_dataloader_wait",
        f"2 gloo ranks; Dataset.__getitem__ waits {SAMPLE_READ_MS:g} ms per sample (time.sleep: a read from "
        "slow storage, CPU idle), 8 samples per step; slow: DataLoader(num_workers=0); fixed: num_workers=2, "
        "whose worker processes overlap the reads with the training step. (The dataloader_bound sample's "
        "CPU-bound tokenizer has no fixed twin on this machine: its 2 ranks keep both cores busy, so workers "
        "only move the same CPU work elsewhere.)",
        2,
        Side(
            f"2 gloo ranks; DataLoader(num_workers=0) whose Dataset.__getitem__ waits {SAMPLE_READ_MS:g} ms "
            "per sample (a slow storage read), so the training thread spends most of each step in "
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__. The slow run of the dataloader pair.",
            {"cause": "config", "kind": "dataloader", "ranks": [0, 1]},
            {"sample_read_ms": SAMPLE_READ_MS, "num_workers": 0},
        ),
        Side(
            "The same job with DataLoader(num_workers=2): two worker processes per rank read ahead "
            "(prefetch_factor 2). The fixed twin of the dataloader pair.",
            NONE,
            {"sample_read_ms": SAMPLE_READ_MS, "num_workers": 2},
        ),
    ),
    "compile": Pair(
        "no_compile",
        "2 gloo ranks, torch.compile(DDP(model)) profiled from step 0 (as the compile samples); slow: an empty "
        "TORCHINDUCTOR_CACHE_DIR (cold); fixed: the same job in eager mode (no torch.compile), the run that "
        "the no_compile what-if predicts. (A warm-cache twin is not compile-free: dynamo and AOTAutograd still "
        "trace, so its step 0 still takes seconds; see the compile_warm sample.)",
        2,
        Side(
            "2 gloo ranks, torch.compile(DDP(model)) with an empty TORCHINDUCTOR_CACHE_DIR, profiled from "
            "the first step: ProfilerStep#0 holds the whole dynamo + AOTAutograd + inductor compile. The "
            "slow run of the compile pair.",
            {"cause": "config", "kind": "compile_overhead", "ranks": [0, 1]},
            {"cache": "empty at start (fresh temporary directory)"},
        ),
        Side(
            "The same job in eager mode (no torch.compile), profiled from the first step like the slow run. "
            "The fixed twin of the compile pair.",
            NONE,
            {"cache": "not used: eager mode", "compile": False},
        ),
        runner="compile",
    ),
}


def fresh_inductor_cache() -> None:
    """Drop generate.py's inductor cache directory, so the next compile run starts from an empty one."""
    old = g._inductor_cache.pop("dir", None)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def record_side(spec: Pair, side: Side, out: Path, name: str) -> None:
    """Record one side of ``spec`` into ``out/name`` (``name`` is also its scenario name) with generate.py."""
    kw = dict(side.kw)
    if spec.runner == "interconnect":
        g.interconnect(out, name, kw.pop("qdisc"), side.description, side.expected, **kw)
    elif spec.runner == "compile":
        g.compile_run(out, name, side.description, side.expected, kw.pop("cache"), **kw)
    else:
        g.record(name, out, spec.world, side.description, side.expected, **kw)


# ------------------------------------------------------------------------------------------- recording


def run_step_time_ms(truth: dict) -> float:
    """The run's step time in ms from a run folder's ``scenario.json`` (``truth``), as traceanalyze defines
    it (traceanalyze/metrics/steps.py): the median, over the counted steps (``profiled_steps`` but the
    window's last, unless it is the only one), of the longest of the ranks' measured times of that step."""
    counted = truth["profiled_steps"][:-1] or truth["profiled_steps"]  # a window of one step counts it
    times = truth["step_times_ms"].values()
    return round(statistics.median(max(t[s] for t in times) for s in counted), 1)


def probe_busbw(truth: dict) -> float | None:
    """Median over the ranks of the bus bandwidth (GB/s) their ``# link probe`` measured, or None."""
    bw = [p["busbw_GBps"] for p in truth.get("link_probe", {}).values() if p]
    return round(statistics.median(bw), 4) if bw else None


def host_info() -> dict:
    """The recording host's CPU: model, cores, torch's CPU capability (its vector ISA) and whether the CPU
    has native bf16 matmul instructions (``traceanalyze.capture.cpu_facts``: avx512_bf16 / amx_bf16 flags);
    without them bf16 matmuls are emulated and run many times slower than fp32, so bf16 autocast is no fix
    there."""
    from traceanalyze.capture import cpu_facts  # imports torch, like generate.write_ground_truth

    cpu = cpu_facts()
    return {"processor": g.cpu_model(), "cpus": cpu["cpus"], "torch_cpu_capability": cpu["isa"],
            "native_bf16": bool(cpu["native_bf16"])}


def saving_pct(slow_ms: float, fixed_ms: float) -> float:
    """Measured saving of the fix, in %: 100 * (1 - fixed / slow)."""
    return round(100 * (1 - fixed_ms / slow_ms), 1)


def tag(run_dir: Path, pair_name: str, role: str, rep: int) -> dict:
    """Add ``pair`` (name, role, repetition) to the run's scenario.json; return the updated truth."""
    path = run_dir / "scenario.json"
    truth = json.loads(path.read_text())
    truth["pair"] = {"name": pair_name, "role": role, "repetition": rep, "repetitions": REPETITIONS,
                     "run_step_time_ms": run_step_time_ms(truth)}
    path.write_text(g.dumps_compact(truth))
    return truth


def record_pair(name: str, out: Path) -> dict:
    """Record pair ``name`` (REPETITIONS x slow then fixed) into ``out/pairs/name``; return its pair.json."""
    spec = PAIRS[name]
    root = out / "pairs" / name
    stash = Path(tempfile.mkdtemp(prefix=f"ta_pair_{name}_"))
    reps: list[dict] = []
    try:
        for rep in range(1, REPETITIONS + 1):
            if spec.runner == "compile":
                fresh_inductor_cache()  # each cold run starts empty; its warm twin reuses what it filled
            row: dict = {}
            for role, side in (("slow", spec.slow), ("fixed", spec.fixed)):
                print(f"   repetition {rep}/{REPETITIONS}: {role}", flush=True)
                record_side(spec, side, out, f"pairs/{name}/{role}")
                truth = tag(root / role, name, role, rep)
                (stash / f"rep{rep}").mkdir(exist_ok=True)
                shutil.move(root / role, stash / f"rep{rep}" / role)
                row[f"{role}_step_time_ms"] = truth["pair"]["run_step_time_ms"]
                row[f"{role}_cpu_busy_before_job"] = truth["host"]["cpu_busy_before_job"]
                if "link_probe" in truth:
                    row[f"{role}_link_busbw_GBps"] = probe_busbw(truth)
            row["saving_pct"] = saving_pct(row["slow_step_time_ms"], row["fixed_step_time_ms"])
            print(f"   repetition {rep}: slow {row['slow_step_time_ms']} ms, fixed {row['fixed_step_time_ms']} "
                  f"ms, saving {row['saving_pct']} %", flush=True)
            reps.append(row)
        # keep the traces of the repetition with the median saving
        kept = sorted(range(REPETITIONS), key=lambda i: reps[i]["saving_pct"])[REPETITIONS // 2]
        g.reset_dir(root)
        for role in ("slow", "fixed"):
            shutil.move(stash / f"rep{kept + 1}" / role, root / role)
    finally:
        shutil.rmtree(stash, ignore_errors=True)
        if spec.runner == "compile":
            fresh_inductor_cache()
    slow_ms = statistics.median(r["slow_step_time_ms"] for r in reps)
    fixed_ms = statistics.median(r["fixed_step_time_ms"] for r in reps)
    fixed_bw = [r["fixed_link_busbw_GBps"] for r in reps if r.get("fixed_link_busbw_GBps")]
    doc = {
        "pair": name,
        "scenario": spec.whatif,
        "slow": "slow",
        "fixed": "fixed",
        "link_bw_GBps": round(statistics.median(fixed_bw), 4) if fixed_bw else None,
        "repetitions": reps,
        "median_slow_step_time_ms": slow_ms,
        "median_fixed_step_time_ms": fixed_ms,
        "measured_saving_pct": saving_pct(slow_ms, fixed_ms),
        "kept_repetition": kept + 1,
        "world_size": spec.world,
        "host": host_info(),
        "step_time": "the run's step time (traceanalyze/metrics/steps.py): median over the counted profiler "
        "steps of the longest rank's step, from the step times the ranks measured (scenario.json)",
        "order": "interleaved: " + ", ".join(["slow, fixed"] * REPETITIONS),
        "description": spec.description,
        "generated_by": "sample_traces/record_pairs.py",
        "command": shlex.join(["python", g.rel(Path(sys.argv[0])), *sys.argv[1:]]),
    }
    (root / "pair.json").write_text(g.dumps_compact(doc))
    return doc


def main(names: list[str], out: Path) -> int:
    """Record the named pairs (all when ``names`` is empty); print a summary; 1 if any failed."""
    unknown = sorted(set(names) - set(PAIRS))
    if unknown:
        print(f"unknown pair(s) {unknown}; choose from: {', '.join(PAIRS)}", file=sys.stderr)
        return 2
    status: dict[str, str] = {}
    for name in [n for n in PAIRS if not names or n in names]:
        print(f"== pair {name}", flush=True)
        t0 = time.monotonic()
        try:
            doc = record_pair(name, out)
            status[name] = (f"ok ({time.monotonic() - t0:.0f} s): slow {doc['median_slow_step_time_ms']} ms, "
                            f"fixed {doc['median_fixed_step_time_ms']} ms, saving {doc['measured_saving_pct']} %")
        except g.SkipScenario as e:
            status[name] = f"SKIPPED: {e}"
        except Exception as e:  # noqa: BLE001  (report every pair, then fail)
            status[name] = f"FAILED: {e}"
        print(f"   {status[name]}", flush=True)
    print("\nsummary:")
    for name, s in status.items():
        print(f"  {name:18s} {s}")
    return 1 if any(s.startswith("FAILED") for s in status.values()) else 0
