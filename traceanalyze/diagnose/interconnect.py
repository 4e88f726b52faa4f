"""Interconnect rules: exposed communication (slow collectives, a slow topology) and ranks missing from the
traces that the traced ranks wait for."""

from __future__ import annotations

import statistics

from traceanalyze import hardware
from traceanalyze.diagnose.evidence import RunEvidence, ms_text, per_step, severity, step_us, wait_per_step
from traceanalyze.findings import Finding
from traceanalyze.fmt import ranges

MIN_EXPOSED_COMM_PCT = 10.0  # exposed transfer share of step worth a finding
MIN_UNTRACED_WAIT_PCT = 10.0  # share of the step the traced ranks wait for untraced ones worth an inconclusive verdict
# On a partial run (fewer traced ranks than the world size) a collective's time may be waiting for an untraced rank:
# only a transfer that runs at this share of the link's expected bandwidth or more is transfer, not waiting
PARTIAL_PROVEN_BUSBW_FRAC = 0.5


def rule_exposed_communication(ev: RunEvidence) -> list[Finding]:
    """Interconnect: communication transfer time not hidden under compute is a large share of the step."""
    if not ev.ranks or ev.mode == "logs":
        return []
    rows = []
    for r in ev.ranks:
        exposed = per_step(ev, r, "exposed_comm_us") or 0.0
        step = step_us(ev, r) if ev.steps else r["window_us"]
        n_steps = max(1, r.get("n_steps") or 1)
        wait = (ev.coll.wait_us.get(r["rank"], 0.0) / n_steps) if ev.coll and ev.coll.matched and ev.steps else 0.0
        if not ev.steps and ev.coll and ev.coll.matched:
            wait = ev.coll.wait_us.get(r["rank"], 0.0)
        transfer = max(0.0, exposed - wait)
        rows.append((r["rank"], exposed, transfer, step))
    shares = [100 * t / s for _, _, t, s in rows if s > 0]
    if not shares:
        return []
    share = statistics.median(shares)
    if share < MIN_EXPOSED_COMM_PCT:
        return []
    exposed_med = statistics.median(e for _, e, _, _ in rows)
    step_med = statistics.median(s for _, _, _, s in rows)
    evidence = [f"exposed communication {ms_text(exposed_med)} of {ms_text(step_med)} per step "
                f"(median over {len(rows)} rank(s)); transfer not explained by waiting for a slower rank: "
                f"{share:.1f}% of the step"]
    overlaps = [r["comm_comp_overlap_pct"] for r in ev.ranks]
    evidence.append(f"comm/compute overlap {statistics.median(overlaps):.1f}% "
                    "(share of communication time hidden under compute)")
    if ev.coll and not ev.coll.matched:
        evidence.append("only one rank's trace: waiting for peers cannot be separated from transfer, so this is an "
                        "upper bound")
    elif ev.world_size and ev.world_size > len(ev.ranks):
        evidence.append(f"{len(ev.ranks)} of {ev.world_size} ranks traced: waiting for the untraced ranks cannot be "
                        "separated from transfer, so this is an upper bound")
    expected = ev.link.get("expected_gbps")
    kind = "slow_collectives"
    if ev.coll and ev.coll.busbw_gbps is not None:
        s = f"measured busbw {ev.coll.busbw_gbps:.3g} GB/s over {ev.coll.total_bytes / 1e6:,.1f} MB of collectives"
        if expected:
            s += f"; expected {expected:g} GB/s ({ev.link.get('source')}): {100 * ev.coll.busbw_gbps / expected:.0f}%"
        evidence.append(s)
        for c in (ev.coll.summaries or [])[:3]:
            if c.size_bytes:
                evidence.append(f"{c.collective} of {c.size_bytes / 1e6:,.2f} MB × {c.count}: transfer "
                                f"{ms_text(c.transfer_us)}, busbw {c.busbw_gbps or 0:.3g} GB/s, "
                                f"wait {ms_text(c.wait_us)}")
    transport = transport_note(ev)
    if transport:
        evidence.append(transport)
    topo_pairs = slow_topology_pairs(ev)
    if topo_pairs:
        kind = "topology"
        evidence.append("GPU links: " + ", ".join(f"{a}–{b} {lk}" for a, b, lk in topo_pairs[:4]))
    rec = interconnect_recommendation(ev, topo_pairs)
    impact = round(share, 1)
    title = f"Communication is exposed: {share:.0f}% of the step waits on collectives' transfer"
    sev = severity(impact)
    if ev.world_size and ev.world_size > len(ev.ranks):  # partial: the wait may be for ranks not in the traces
        proof = _partial_proof(ev)
        evidence.append(proof[1])
        if not proof[0]:
            title = (f"Inconclusive: {share:.0f}% of the step is exposed communication, either collectives' "
                     "transfer or waiting for ranks not in these traces")
            sev = "low"
            rec = "trace every rank of the job in one profiling window to tell transfer from waiting; then: " + rec
    return [Finding("interconnect", kind, sev, impact, [r for r, *_ in rows], title, evidence, rec)]


def _partial_proof(ev: RunEvidence) -> tuple[bool, str]:
    """(whether the transfer itself shows the communication is transfer, why): on a partial run only a measured busbw
    of :data:`PARTIAL_PROVEN_BUSBW_FRAC` of the link's expected bandwidth or more does (the collectives then run at
    the link's speed, so their time is transfer); a lower one may be waiting for an untraced rank, or a slow link."""
    traced = f"{len(ev.ranks)} of {ev.world_size} ranks traced"
    expected = ev.link.get("expected_gbps")
    busbw = ev.coll.busbw_gbps if ev.coll else None
    if not expected or busbw is None:
        what = "the link's expected bandwidth is unknown" if not expected else "no collective states its size"
        return False, (f"inconclusive: {traced}, so the collectives' time may be waiting for the missing ranks; "
                       f"{what}, so the transfer cannot show it is transfer")
    pct = 100 * busbw / expected
    if busbw >= PARTIAL_PROVEN_BUSBW_FRAC * expected:
        return True, (f"{traced}, but busbw {busbw:.3g} GB/s is {pct:.0f}% of the expected {expected:g} GB/s: the "
                      "collectives run at the link's speed, so their time is transfer, not waiting")
    return False, (f"inconclusive: {traced}; busbw {busbw:.3g} GB/s is {pct:.0f}% of the expected {expected:g} GB/s, "
                   "which waiting for the missing ranks and a slow link both explain (at "
                   f"{100 * PARTIAL_PROVEN_BUSBW_FRAC:.0f}% or more it would be transfer)")


def transport_note(ev: RunEvidence) -> str | None:
    n = ev.nccl
    if n is None or not getattr(n, "channels", None):
        return None
    counts = n.transports()
    details = sorted({c.detail for c in n.channels})
    return (f"NCCL {n.version or ''} transports: " + ", ".join(f"{t} ×{k}" for t, k in counts.most_common())
            + f" ({', '.join(details[:3])})")


def slow_topology_pairs(ev: RunEvidence) -> list[tuple[str, str, str]]:
    t = ev.topology
    if t is None:
        return []
    gpus = t.gpus
    if ev.world_size and ev.world_size <= len(gpus):
        gpus = gpus[: ev.world_size]
    out = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            lk = t.link(a, b)
            if lk and not lk.startswith("NV"):
                out.append((a, b, lk))
    return out


def interconnect_recommendation(ev: RunEvidence, topo_pairs) -> str:
    if topo_pairs:
        t = ev.topology
        pix = [(a, b) for a, b, lk in topo_pairs if lk in ("PIX", "PXB")]
        far = [(a, b, lk) for a, b, lk in topo_pairs if lk in ("NODE", "SYS", "PHB")]
        parts = []
        if pix:
            a, b = pix[0]
            parts.append(f"pair {a} with {b}, which share a PCIe switch ({t.link(a, b)}): run 2-GPU jobs on them "
                         f"(CUDA_VISIBLE_DEVICES={a[3:]},{b[3:]})")
        if far:
            a, b, lk = far[0]
            parts.append(f"avoid splitting the job across {a} and {b} ({lk}: traffic crosses the CPU)")
        parts.append("use NVLink-connected GPUs for data parallelism, or cut communication: larger DDP buckets, "
                     "gradient accumulation with no_sync(), FSDP/ZeRO only where memory needs it")
        return "; ".join(parts)
    n = ev.nccl
    if n is not None and any(c.transport == "NET" and "Socket" in c.detail for c in getattr(n, "channels", [])):
        return ("NCCL is moving data over TCP sockets (NET/Socket): use InfiniBand/RoCE (check NCCL_IB_DISABLE, "
                "NCCL_IB_HCA, NCCL_NET_GDR_LEVEL) or keep the job on one NVLink node; overlap the all-reduce with "
                "backward (DDP buckets) and accumulate gradients with no_sync()")
    if ev.mode == "cpu":
        return ("the gradient all-reduce is bound by the network between ranks: put ranks on a faster link, "
                "reduce what is sent (bf16 gradients via a DDP comm hook, fewer/larger buckets), and accumulate "
                "gradients locally with no_sync() so fewer all-reduces run")
    return ("check the link between GPUs (nvidia-smi topo -m, NCCL_DEBUG=INFO for the transport), overlap "
            "communication with compute (DDP bucket_cap_mb, FSDP prefetch), and reduce its volume (gradient "
            f"compression: DDP {hardware.grad_compression_hook(ev.gpu)}, gradient accumulation with no_sync())")


def rule_untraced_ranks(ev: RunEvidence) -> list[Finding]:
    """Imbalance, inconclusive: the traces hold only some of the job's ranks and every traced rank waits in its
    collectives for peers a large share of each step, so the rank that holds the job back is among the missing
    ones. The exposed-communication rule takes that wait out of transfer time, so without this rule the wait
    would vanish from the report. Impact = the median traced rank's wait per step / its step time.

    When the traced ranks arrive together and all wait for a missing rank, their wait looks like transfer (the
    shortest duration across the traced ranks): then exposed communication of :data:`MIN_EXPOSED_COMM_PCT` % of
    the step or more is inconclusive too, as waiting for untraced ranks and transfer cannot be told apart."""
    traced = {r["rank"] for r in ev.ranks}
    if ev.mode == "logs" or not ev.world_size or ev.world_size <= len(traced) or len(traced) < 2:
        return []
    waits = wait_per_step(ev, window=True)
    if not waits:
        return []
    shares = {r["rank"]: 100 * waits.get(r["rank"], 0.0) / s for r in ev.ranks if (s := step_us(ev, r)) > 0}
    if not shares:
        return []
    share = statistics.median(shares.values())
    exposed = statistics.median(100 * (per_step(ev, r, "exposed_comm_us") or 0.0) / s
                                for r in ev.ranks if (s := step_us(ev, r)) > 0)
    # a traced rank that hardly waits is the straggler among the traced ones: rule_straggler's case, not this one
    waits_all = share >= MIN_UNTRACED_WAIT_PCT and min(shares.values()) >= MIN_UNTRACED_WAIT_PCT / 2
    if not waits_all and (exposed < MIN_EXPOSED_COMM_PCT or share >= MIN_UNTRACED_WAIT_PCT):
        return []
    idle = statistics.median(r["idle_pct"] for r in ev.ranks)
    missing = ev.world_size - len(traced)
    evidence = [f"{len(traced)} of {ev.world_size} ranks traced (ranks {ranges(sorted(traced))}); {missing} "
                "have no trace here",
                "collective wait per step: " + ", ".join(f"rank {r} {ms_text(waits[r])} ({shares[r]:.0f}% of its step)"
                                                         for r in sorted(shares)[:8]),
                f"every traced rank waits: the rank they wait for is not in these traces; "
                f"{'GPU' if ev.mode == 'gpu' else 'training thread'} idle {idle:.0f}% (median over traced ranks)"]
    if waits_all:
        impact = round(share, 1)
        title = f"Inconclusive: {share:.0f}% of each step waits in collectives for ranks not in these traces"
    else:
        impact = round(exposed, 1)
        title = (f"Inconclusive: {exposed:.0f}% of each step is exposed communication with ranks not in these "
                 "traces, where waiting for them cannot be told from transfer")
        evidence[2] = (f"the traced ranks arrive together at their collectives (each waits {max(shares.values()):.0f}% "
                       "of its step at most for another traced rank): a rank they all wait for would look like "
                       "transfer; exposed communication is "
                       f"{exposed:.0f}% of the step (median over traced ranks)")
    return [Finding("imbalance", "untraced_ranks", severity(impact), impact, sorted(traced), title, evidence,
                    "trace every rank of the job (or the ranks that arrive last at the collectives) in one profiling "
                    "window: the slow rank, its cause, and whether the rest is transfer can only be told with "
                    "its trace; until then treat the other findings as partial")]
