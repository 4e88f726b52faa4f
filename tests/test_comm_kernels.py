"""Communication beyond NCCL (issue 40 item 2): DeepEP's expert-parallel kernels, NVSHMEM and the custom collectives
are communication (``store.MACROS``' ``kernel_class``); kernels of no known class that take a large share of kernel
time give a data-quality row (``metrics.kernels``)."""

from __future__ import annotations

import re

import duckdb
import pytest

from tests.comm_synth import COMBINE, DISPATCH, NOTIFY, write_ep_job
from tests.conftest import shared
from traceanalyze import store
from traceanalyze.metrics.kernels import no_class, short_name, unclassified_kernels, unclassified_warning
from traceanalyze.options import Options
from traceanalyze.pipeline import analyze

# The macro before issue 40: communication was NCCL/RCCL alone.
OLD_KERNEL_CLASS = """CREATE OR REPLACE MACRO old_kernel_class(cat, name) AS CASE
    WHEN regexp_matches(name, '^(void )?(nccl|rccl)') THEN 'communication'
    WHEN cat IN ('gpu_memcpy', 'gpu_memset') OR regexp_matches(name, '^(Memcpy|Memset|dma)') THEN 'memory'
    ELSE 'compute' END;"""
# Observed names the new patterns make communication (none: HTA's test traces hold no DeepEP or custom collective).
NEW_COMMUNICATION_HITS: set[str] = set()


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect()
    c.execute(store.MACROS.split("CREATE OR REPLACE MACRO cpu_op_class")[0] + OLD_KERNEL_CLASS)
    yield c
    c.close()


def _klass(con, name: str, cat: str = "kernel") -> str:
    return con.execute("SELECT kernel_class(?, ?)", [cat, name]).fetchone()[0]


def _observed_names() -> set[str]:
    path = shared("kernel_names_observed.txt")
    return {ln.rstrip("\n").split(" ", 1)[1] for ln in path.read_text(encoding="utf-8").splitlines()
            if ln.strip() and not ln.startswith("#")}


def test_observed_names_keep_their_class(con):
    """Every kernel name of HTA's real test traces keeps the class it had: the names classified communication are
    exactly those of NCCL/RCCL plus the listed new hits, and memory and compute are unchanged."""
    names = sorted(_observed_names())
    assert len(names) > 300
    got = {n: (k, o) for n, k, o in con.execute(
        "SELECT n, kernel_class('kernel', n), old_kernel_class('kernel', n) FROM (SELECT unnest(?) AS n)",
        [names]).fetchall()}
    comm = {n for n, (k, _) in got.items() if k == "communication"}
    nccl = {n for n in names if re.match(r"^(void )?(nccl|rccl)", n)}
    assert nccl and comm == nccl | NEW_COMMUNICATION_HITS
    assert {n for n, (k, o) in got.items() if k != o} == NEW_COMMUNICATION_HITS
    # and none of them is of no class: the known families cover every real name
    assert [n for n, (k, _) in got.items() if k == "compute" and no_class(n)] == []


COMMUNICATION = [
    # DeepEP, normal (intranode / internode) and low-latency kernels, with and without their namespace
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 const*)",
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int const*, int*, int, int, int, bool const*)",
    "deep_ep::intranode::cached_notify_dispatch<8>(int const*, int, void**, int**, int, int)",
    "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*, int*)",
    "void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int**, int)",
    "void deep_ep::intranode::barrier<8>(int**, int)",
    "void deep_ep::internode::cached_notify<8, 256>(int, int, int, int, int, int, int, void*)",
    "void deep_ep::internode::notify_dispatch<true, 8>(int const*, int*, int, int const*, int*)",
    "void deep_ep::internode::dispatch<true, 4, false, 8, 6>(int4*, float*, long*, float*, void*)",
    "void deep_ep::internode::combine<true, 4, 8, 6, 4, 8>(int4*, float*, bool const*, int4 const*)",
    "void deep_ep::internode_ll::dispatch<true, 3, 10, 7168>(void*, float*, int*, long*, int*)",
    "void deep_ep::internode_ll::combine<3, 10, 7168, 9>(void*, void*, int*, void const*)",
    "void deep_ep::internode_ll::clean_low_latency_buffer<32>(int*, int, int*, int)",
    "void dispatch<8, 768, 8192>(int4*, float*, int*)", "combine<__nv_bfloat16, 8, 768>(__nv_bfloat16*)",
    "notify_dispatch", "cached_notify", "cached_notify_dispatch<8>(int const*, int)", "cached_notify_combine",
    "void clean_low_latency_buffer<32>(int*, int, int*, int)",
    # NVSHMEM
    "nvshmemi_transfer_rma_nbi_kernel", "void nvshmemx_barrier_all_on_stream_kernel(int)",
    # vLLM / SGLang custom all-reduce
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
    "__nv_bfloat16*, int, int)",
    "void sglang::cross_device_reduce_2stage<half, 4>(sglang::RankData*, sglang::RankSignals)",
    # PyTorch symmetric memory and its NVSHMEM ops
    "void (anonymous namespace)::one_shot_all_reduce_kernel<float, 16, 8>(float**, unsigned long, float*)",
    "void c10d::symmetric_memory::(anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(x)",
    "void (anonymous namespace)::multimem_all_reduce_kernel<16>(c10::BFloat16*, unsigned long)",
    "void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*, unsigned long)",
    "void (anonymous namespace)::multimem_one_shot_all_reduce_kernel<float, 16>(float*, float*)",
    "c10d::nvshmem_extension::allToAllV(void*, void*, long*, unsigned long, nvshmem_team_t)",
    "c10d::nvshmem_extension::exchangeSplitAndOffset(long*, nvshmem_team_t)",
    # TransformerEngine / Megatron userbuffers
    "void userbuffers_fp16_sum_inplace_gpu_rr_rs<2>(int, int, int, int, int, int, int, void**, int, unsigned long)",
    "void userbuffers_fp16_sum_inplace_gpu_rw_ag<2>(int, int, int, int, int, int, int, void**, int, unsigned long)",
    "kuserbuffers_pullsend(int, int, int*, int*)",
    # NCCL / RCCL as before
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "void ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "rcclGenericKernel",
]
NOT_COMMUNICATION = [
    # FSDP2's copies and Triton's fused all-gather copies are compute
    "void at::native::(anonymous namespace)::all_gather_copy_in_kernel<c10::BFloat16>(x)", "all_gather_copy_in",
    "void at::native::split_with_sizes_copy_out_contiguous_no_cast_kernel<c10::BFloat16>(x)",
    "void at::native::(anonymous namespace)::chunk_cat_cuda_kernel<float, float>(x)",
    "triton_poi_fused_all_gather_into_tensor_copy_0", "triton_poi_fused__to_copy_all_reduce_1",
    # names that merely contain dispatch / combine / notify
    "void at::native::dispatch<float>(float*)", "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)",
    "void deep_ep::internode::get_dispatch_layout<256, 32, 8>(long const*)", "dispatch_tokens_kernel",
    "triton_red_fused_combine_0", "moe_combine_kernel<float>(float*)", "void my::combined<int>(int)",
    "cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<dispatch_policy>>",
]


@pytest.mark.parametrize("name", COMMUNICATION)
def test_communication_kernels(con, name):
    assert _klass(con, name) == "communication"


@pytest.mark.parametrize("name", NOT_COMMUNICATION)
def test_lookalikes_are_not_communication(con, name):
    assert _klass(con, name) == "compute"


def test_memory_is_unchanged(con):
    assert _klass(con, "Memcpy DtoD (Device -> Device)", "gpu_memcpy") == "memory"
    assert _klass(con, "Memset (Device)", "gpu_memset") == "memory"


def _analyze(folder):
    a = analyze(folder, Options(jobs=1))
    return a, a.model["runs"][0]


def test_deepep_job_counts_as_communication(tmp_path):
    """A 2-rank expert-parallel job whose only communication is DeepEP's notify_dispatch, dispatch and a
    namespace-less combine: the breakdown counts them as communication (3 counted steps x (50 + 2000 + 1500) µs
    plus the waits for the later rank), partly hidden under the shared-expert GEMM on another stream. The replay
    pairs them across ranks by their per-step order (no record of a call: no Comms Id, no Seq) as complete
    rendezvous and reproduces the measured step exactly; nothing is left of no class."""
    a, run = _analyze(write_ep_job(tmp_path / "ep"))
    for r in run["ranks"]:
        assert r["comm_us"] == pytest.approx(11_550.0)
        assert r["non_compute_pct"] > 5.0
        assert 0.0 < r["comm_comp_overlap_pct"] < 100.0
        assert 0.0 < r["exposed_comm_us"] < r["comm_us"]
        assert r["exposed_comm_us"] == pytest.approx(r["comm_us"] * (1 - r["comm_comp_overlap_pct"] / 100), rel=1e-4)
    assert a.con.execute("SELECT DISTINCT name FROM kernels WHERE kernel_class(cat, name) = 'communication' "
                         "ORDER BY name").fetchall() == [(COMBINE,), (DISPATCH,), (NOTIFY,)]
    rp = run["replay"]
    assert rp["error_pct"] == 0.0 and rp["unmatched"] == [] and not rp["partial"]
    assert rp["measured_step_time_us"] == rp["replayed_step_time_us"]
    # 4 steps x 3 kernels, each one instance of both ranks' kernels, all complete
    assert a.con.execute("SELECT count(DISTINCT instance_id), count(*), min(matched_by), bool_and(complete) "
                         "FROM sim_coll").fetchone() == (12, 24, "per-step ordinal", True)
    (u,) = unclassified_kernels(a.con, 1)
    assert u["unclassified_us"] == 0.0 and u["top"] == [] and unclassified_warning([u]) == []
    a.con.close()


def test_heavy_unclassified_kernels_give_a_data_quality_row(tmp_path):
    """The same job with dispatch and combine from an unknown library: compute to the breakdown, and more than 5 %
    of kernel time of no class, so one warning row names them, heaviest first, their names plain and cut to 80
    characters. Renaming only the 50 µs notify kernel stays under the threshold: no row."""
    long_name = "void moe_a2a::exchange_send<8, 768>(" + ", ".join(["int4*"] * 30) + ")"
    heavy = (NOTIFY, "void <script>x</script>::recv<8>(int)", long_name)
    a, run = _analyze(write_ep_job(tmp_path / "heavy", names=heavy))
    (u,) = unclassified_kernels(a.con, 1)
    # dispatch (2000 µs a step) before combine (1500 µs plus the waits)
    assert [t["name"] for t in u["top"]] == [heavy[1], heavy[2]]
    assert [t["count"] for t in u["top"]] == [8, 8]  # 4 steps on 2 ranks
    assert u["unclassified_pct"] == pytest.approx(sum(t["pct"] for t in u["top"]))
    assert u["unclassified_pct"] == pytest.approx(100 * u["unclassified_us"] / u["kernel_time_us"])
    assert u["unclassified_pct"] > 5.0
    (w,) = unclassified_warning([u], "/runs/ep")
    assert w["file"] == "/runs/ep" and w["level"] == "warning"
    assert w["message"].startswith(f"Kernels of no known class take {u['unclassified_pct']:.1f} % of kernel time, "
                                   "counted as compute: `")
    assert "`void <script>x</script>::recv<8>(int)`" in w["message"]  # plain text: the report escapes
    assert f"`{short_name(long_name)}` {[t for t in u['top'] if t['name'] == long_name][0]['pct']:.1f} %" in w[
        "message"]
    assert len(short_name(long_name)) == 80 and short_name(long_name).endswith("…")
    assert w["message"].endswith("if they move data between GPUs (expert-parallel, custom collectives), name them "
                                 "in an issue")
    # the breakdown counts the notify kernels alone as communication (3 counted steps of 50 µs plus the waits)
    assert [r["comm_us"] for r in run["ranks"]] == [1050.0, 150.0]
    a.con.close()

    light = ("void moe_a2a::notify<8>(int)", DISPATCH, COMBINE)
    a, _ = _analyze(write_ep_job(tmp_path / "light", names=light))
    (u,) = unclassified_kernels(a.con, 1)
    assert [t["name"] for t in u["top"]] == [light[0]] and 0.0 < u["unclassified_pct"] < 5.0
    assert unclassified_warning([u]) == []
    a.con.close()


def test_no_kernels_no_rows(tmp_path):
    from tests.synth import cpu_job, write_trace

    for r in (0, 1):
        write_trace(tmp_path / "cpu" / f"rank{r}.json", r, cpu_job(r, 0.0))
    a, _ = _analyze(tmp_path / "cpu")
    assert unclassified_kernels(a.con, 1) == [] and unclassified_warning([]) == []
    a.con.close()


def test_call_less_kernels_leave_nccl_matched_by_comms_id(tmp_path):
    """NCCL all-reduces with "Comms Id" beside a DeepEP kernel without any record: the all-reduces stay matched by
    their Comms Id (4 instances, all complete) and the DeepEP kernels pair by their per-step order (2 more)."""
    from tests.comm_synth import mixed_rank
    from tests.synth import write_trace

    for r in (0, 1):
        write_trace(tmp_path / "mixed" / f"rank{r}.pt.trace.json", r, mixed_rank(r), backend="nccl")
    a, run = _analyze(tmp_path / "mixed")
    assert run["replay"]["unmatched"] == []
    assert a.con.execute("SELECT count(DISTINCT instance_id) FILTER (complete), count(DISTINCT instance_id) FILTER "
                         "(matched_by = 'Comms Id') FROM sim_coll").fetchone() == (6, 4)
    a.con.close()
