"""GPU burn and bandwidth: analysis on the REAL 60 s H200 trace (tests/data/h200-1gpu/burn.json),
failing cases DERIVED from it (each test says which field it changes), and the node-side payloads
run for real here on the CPU (torch CPU, tiny sizes), once each: loop, timing, digests, JSON."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from inventory.loader import load_profile
from inventory.model import Node
from runners import burn, nvml
from runners.parsing import ParseError
from runners.transport import LocalTransport

DATA = Path(__file__).resolve().parent / "data" / "h200-1gpu"
TRACE = json.loads((DATA / "burn.json").read_text())
H200 = load_profile("h200-sxm-8gpu")
CPU_BURN = ("--device", "cpu", "--size", "64", "--window", "200", "--digest-every", "2",
            "--matmul-seconds", "0.5")


def node_with(python: str) -> LocalTransport:
    return LocalTransport(Node("here", "here", "local", python=python))


def run_of(data: dict) -> burn.BurnRun:
    return burn.parse_burn(json.dumps(data))


def eight_gpus(change=None) -> dict:
    """DERIVED: the real one-GPU trace copied onto eight GPUs; change(index, gpu) edits copies."""
    gpus = []
    for index in range(8):
        gpu = {"index": index, **copy.deepcopy(TRACE)}
        if change:
            change(index, gpu)
        gpus.append(gpu)
    return {"available": True, "dtype": "bfloat16", "size": 8192, "gpus": gpus}


def test_real_h200_trace_sustains_655_tflops_at_the_power_cap():
    analysis = burn.analyze(run_of(TRACE))
    gpu = analysis.gpus[0]
    assert gpu.sustained_tflops == pytest.approx(655.4) and gpu.peak_tflops == 749.4
    assert (gpu.max_temp_c, round(gpu.max_power_w, 1), gpu.median_sm_mhz) == (57, 694.7, 1440)
    assert gpu.reasons_seen == {"SW power cap": 61} and gpu.samples == 61
    assert analysis.problems == []  # SW power cap under full load is normal
    assert H200.references["gpu_burn_tflops"].admits(analysis.min_tflops)
    assert analysis.summary() == ("GPU 0: 655.4 TFLOP/s, max 57 C, 694.7 W, SM 1440 MHz, "
                                  "SW power cap x61")


def test_real_trace_has_no_pcie_reading_and_a_derived_one_is_summarized():
    """The recorded trace predates the PCIe fields: no reading, nothing said. DERIVED: the same
    trace with `pcie_gen`/`pcie_width` added to every sample as the payload now writes them,
    Gen5 x16 except one sample at Gen4: the lowest under load is what the note shows."""
    assert burn.analyze(run_of(TRACE)).gpus[0].pcie_gen_min is None
    trace = copy.deepcopy(TRACE)
    for number, sample in enumerate(trace["telemetry"]):
        sample.update(pcie_gen=4 if number == 30 else 5, pcie_width=16)
    gpu = burn.analyze(run_of(trace)).gpus[0]
    assert (gpu.pcie_gen_min, gpu.pcie_width_min) == (4, 16)
    assert "PCIe at least Gen4 x16 under load" in burn.analyze(run_of(trace)).summary()


def test_clocks_event_reasons_decode_with_nvml_bit_values():
    assert burn.decode_reasons(0x4) == ["SW power cap"]
    assert burn.decode_reasons(0x1 | 0x8 | 0x40 | 0x80) == [
        "GPU idle", "HW slowdown", "HW thermal slowdown", "HW power brake slowdown"]


def test_derived_thermal_and_power_brake_samples_fail_the_gpu():
    data = copy.deepcopy(TRACE)
    for sample in data["telemetry"][30:36]:  # DERIVED: bits 0x40 and 0x80 added to six samples
        sample["reasons"] = 0x4 | 0x40 | 0x80
    problems = burn.analyze(run_of(data)).problems
    first = data["telemetry"][30]
    assert problems == [
        f"GPU 0: clocks-event reason HW thermal slowdown (0x40) in 6 of 61 samples, first at "
        f"t={first['t']:g} s ({first['temp']} C, {first['power_mw'] / 1000:.1f} W)",
        f"GPU 0: clocks-event reason HW power brake slowdown (0x80) in 6 of 61 samples, first at "
        f"t={first['t']:g} s ({first['temp']} C, {first['power_mw'] / 1000:.1f} W)"]


def test_derived_slow_gpu_is_named_against_the_node_median():
    def slow_gpu_5(index, gpu):  # DERIVED: GPU 5's windows scaled to 80%
        if index == 5:
            gpu["gemm_tflops_windows"] = [w * 0.8 for w in gpu["gemm_tflops_windows"]]
    analysis = burn.analyze(run_of(eight_gpus(slow_gpu_5)))
    assert analysis.median_tflops == pytest.approx(655.4)
    assert analysis.min_tflops == pytest.approx(655.4 * 0.8)
    assert analysis.problems == ["GPU 5: 524.3 TFLOP/s sustained, 80% of the node median 655.4; "
                                 "expected >= 90%"]


def test_derived_digest_mismatch_fails_that_gpu_and_a_tie_fails_everyone():
    good = "a" * 32

    def digests(index, gpu):  # DERIVED: the trace has no digests; GPU 3 differs at window 8
        gpu["digests"] = [{"window": w, "digest": "b" * 32 if (index, w) == (3, 8) else good}
                          for w in range(0, 12, 4)]
    reference, problems = burn.digest_problems(run_of(eight_gpus(digests)).gpus)
    assert reference == good
    assert problems == ["GPU 3: result differs bit for bit from the reference in 1 of 3 checks "
                        "(windows 8): silent data corruption"]
    tie = {"available": True, "gpus": [
        {"index": 0, "gemm_tflops_windows": [1.0], "digests": [{"window": 0, "digest": good}]},
        {"index": 1, "gemm_tflops_windows": [1.0], "digests": [{"window": 0, "digest": "c" * 32}]}]}
    reference, problems = burn.digest_problems(run_of(tie).gpus)
    assert reference is None and problems[0].startswith("no majority result digest: 2 different")


@pytest.fixture(scope="module")
def cpu_burn() -> dict:
    """The real payload, run once on this machine's CPU through the harness's transport."""
    result = burn.run(node_with(sys.executable), seconds=1.5, extra=CPU_BURN)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_payload_runs_on_cpu_with_timing_digests_and_matmul_baseline(cpu_burn):
    pytest.importorskip("torch")
    run = run_of(cpu_burn)
    assert run.ok and run.dtype == "bfloat16" and run.size == 64
    gpu = run.gpus[0]
    assert gpu.burn_windows and gpu.matmul_windows and all(w > 0 for w in gpu.burn_windows)
    assert len(gpu.digests) >= 1 and [w for w, _ in gpu.digests] == list(range(0, 2 * len(gpu.digests), 2))
    analysis = burn.analyze(run)
    assert analysis.problems == []  # one device, the same bits every time, no NVML bits
    assert analysis.reference_digest == gpu.digests[0][1]
    assert analysis.min_burn_vs_matmul_pct is not None and analysis.min_burn_vs_matmul_pct > 0
    assert run.telemetry_error == "no NVML telemetry on the CPU device"


def test_derived_corrupted_digest_in_the_cpu_run_is_caught(cpu_burn):
    pytest.importorskip("torch")
    data = copy.deepcopy(cpu_burn)
    second = copy.deepcopy(data["gpus"][0])
    second["index"] = 1
    data["gpus"].append(second)
    third = copy.deepcopy(second)
    third["index"] = 2
    third["digests"][-1]["digest"] = "0" * 32  # DERIVED: one flipped result on a third "GPU"
    data["gpus"].append(third)
    problems = burn.analyze(run_of(data)).problems
    assert len(problems) == 1 and problems[0].startswith("GPU 2: result differs bit for bit")


def test_payloads_without_torch_say_so_and_exit_zero():
    """The machine's python3 has no torch: both payloads say so, so the suite can skip or fail."""
    for run, parse in ((lambda t: burn.run(t, seconds=1, extra=CPU_BURN), burn.parse_burn),
                       (burn.bandwidth, burn.parse_bandwidth)):
        result = run(node_with("python3"))
        assert result.exit_code == 0, result.stderr
        parsed = parse(result.stdout)
        assert not parsed.available and "torch is not installed" in parsed.reason


def test_bandwidth_payload_runs_on_cpu_and_slowest_gpu_is_judged():
    pytest.importorskip("torch")
    result = burn.bandwidth(node_with(sys.executable), extra=("--device", "cpu", "--copy-mib", "4",
                                                              "--pcie-mib", "4", "--iterations", "2"))
    assert result.exit_code == 0, result.stderr
    run = burn.parse_bandwidth(result.stdout)
    assert run.ok and all(run.slowest(k) > 0 for k in ("hbm_copy_tbps", "h2d_gbps", "d2h_gbps"))
    data = json.loads(result.stdout)  # DERIVED: a second GPU at half the H2D rate, a third without
    data["gpus"].append({**data["gpus"][0], "index": 1, "h2d_gbps": data["gpus"][0]["h2d_gbps"] / 2})
    assert burn.parse_bandwidth(json.dumps(data)).slowest("h2d_gbps") == data["gpus"][1]["h2d_gbps"]
    data["gpus"].append({"index": 2, "name": "cpu", "error": "RuntimeError: CUDA error: out of memory"})
    broken = burn.parse_bandwidth(json.dumps(data))
    assert not broken.ok and broken.slowest("d2h_gbps") is None


def test_another_tools_gpu_list_is_not_bandwidth_output():
    """The recorded H200's NVML facts have a `gpus` list too, with no figure in it."""
    with pytest.raises(ParseError, match="GPU entry 0 has neither an error nor hbm_copy_tbps"):
        burn.parse_bandwidth((DATA / "nvml.json").read_text())


BENCH = Path(__file__).resolve().parent.parent / "bench" / "burn_vs_matmul.py"


def test_bench_without_cuda_exits_2_with_one_line():
    torch = pytest.importorskip("torch", reason="the bench needs torch to get as far as CUDA")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the bench would run for real")
    done = subprocess.run([sys.executable, str(BENCH), "--seconds", "30"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"burn_vs_matmul: no CUDA device (torch {torch.__version__}, torch.cuda.is_available() "
        "is False); run it on a GPU machine"]


def test_bench_on_cpu_runs_matmul_burn_matmul_and_prints_the_ratio(tmp_path):
    """The bench's own CPU mode (tiny GEMMs; figures meaningless): every step runs for real."""
    pytest.importorskip("torch", reason="the bench runs torch")
    done = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--seconds", "1",
                           "--size", "64", "--window", "20", "--min-ratio", "0",
                           "--json", str(tmp_path / "bench.json")],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:4]] == [
        "plain matmul (before)", "burn", "plain matmul (after)"]
    assert lines[-1].startswith("burn ") and " vs plain matmul " in lines[-1] and "%" in lines[-1]
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert figures["burn_tflops"] > 0 and figures["matmul_tflops"] > 0
    assert figures["ratio"] == pytest.approx(figures["burn_tflops"] / figures["matmul_tflops"])


# ---------------------------------------------------------------- bandwidth: per-GPU plausibility

NVML_DUMP = json.loads((DATA / "nvml.json").read_text())
PERF = json.loads((DATA / "perf.json").read_text())


def nvml_facts(gpus: int = 1, **changes) -> nvml.GpuFacts:
    """The REAL H200 NVML dump, its one GPU copied to `gpus` indices with `changes` applied to every
    copy (DERIVED where gpus > 1 or changes are given)."""
    data = copy.deepcopy(NVML_DUMP)
    data["gpus"] = [{**data["gpus"][0], "index": index, **changes} for index in range(gpus)]
    return nvml.parse_gpu_facts(json.dumps(data))


def bandwidth_run(*figures: tuple[float, float, float], **top) -> burn.BandwidthRun:
    """DERIVED: one GPU entry per (HBM TB/s, H2D GB/s, D2H GB/s) in the payload's output shape."""
    return burn.parse_bandwidth(json.dumps({"available": True, **top, "gpus": [
        {"index": index, "name": "NVIDIA H200", "bus_id": "", "error": None, "hbm_copy_tbps": hbm,
         "h2d_gbps": h2d, "d2h_gbps": d2h} for index, (hbm, h2d, d2h) in enumerate(figures)]}))


H200_FIGURES = (PERF["hbm_copy_tbps_rw"], PERF["h2d_pinned_gbps"], PERF["d2h_pinned_gbps"])


def test_hardware_ceilings_from_nvml_bound_the_recorded_h200_figures():
    """PCIe Gen5 x16 moves at most 63.0 GB/s a direction; H200 HBM3e at 3201 MHz x 6144 bit 4.92
    TB/s. The REAL figures (55.4, 55.3 GB/s, 4.25 TB/s) lie under them, as any honest copy must."""
    assert burn.pcie_ceiling_gbps(5, 16) == pytest.approx(63.02, abs=0.01)
    assert burn.pcie_ceiling_gbps(4, 16) == pytest.approx(31.51, abs=0.01)
    assert burn.pcie_ceiling_gbps(None, 16) is None and burn.hbm_ceiling_tbps(3201, None) is None
    assert burn.hbm_ceiling_tbps(3201, 6144) == pytest.approx(4.917, abs=0.001)
    facts = nvml_facts(memory_bus_width=6144)  # DERIVED: the bus width the real dump predates
    assert burn.bandwidth_problems(bandwidth_run(H200_FIGURES), tuple(burn.BANDWIDTH_FIGURES), facts) == []


def test_a_gpu_timed_on_another_gpus_stream_fails_as_a_sanity_error_not_only_the_slowest():
    """DERIVED: eight GPUs, GPU 0 at the real H200 figures, GPUs 1-7 at what events on GPU 0's
    stream give them (launch times: hundreds of TB/s and GB/s). The slowest GPU alone looks fine;
    every other GPU is named as above its hardware's peak."""
    absurd = (412.0, 3100.0, 2900.0)
    run = bandwidth_run(H200_FIGURES, *[absurd] * 7)
    assert run.slowest("hbm_copy_tbps") == PERF["hbm_copy_tbps_rw"]  # what was judged before
    facts = nvml_facts(8, memory_bus_width=6144)
    problems = burn.bandwidth_problems(run, ("hbm_copy_tbps",), facts)
    assert len(problems) == 7 and problems[0] == (
        "GPU 1: HBM copy 412.00 TB/s is above its hardware's peak 4.92 TB/s: "
        "the timing saw no copy (or a bad clock)")
    pcie = burn.bandwidth_problems(run, ("h2d_gbps", "d2h_gbps"), nvml_facts(8))  # the REAL dump's link
    assert len(pcie) == 14 and "pinned H2D 3100.00 GB/s is above its hardware's peak 63.02 GB/s" in pcie[0]


def test_without_nvml_bounds_the_profiles_upper_bound_and_missing_figures_still_fail():
    """The REAL dump has no memory bus width: the HBM figure is bounded by the profile's upper bound
    where it sets one. A figure of zero, infinity or none, or a GPU's error, is named too."""
    run = bandwidth_run(H200_FIGURES, (50.0, 55.0, 55.0), (float("inf"), 0.0, 55.0))
    facts = nvml_facts(3)
    assert burn.bandwidth_problems(run, ("hbm_copy_tbps",), facts) == [
        "GPU 2: no HBM copy figure (inf)"]
    assert burn.bandwidth_problems(run, ("hbm_copy_tbps",), facts, {"hbm_copy_tbps": 5.0})[0] == (
        "GPU 1: HBM copy 50.00 TB/s is above the profile's upper bound 5.00 TB/s: "
        "the timing saw no copy (or a bad clock)")
    assert burn.bandwidth_problems(run, ("h2d_gbps",), facts) == [
        "GPU 2: no pinned H2D figure (0.0)"]


def test_per_gpu_note_shows_a_missing_figure_instead_of_a_type_error():
    run = bandwidth_run(H200_FIGURES, (None, None, None))
    assert run.per_gpu(("hbm_copy_tbps",), 2) == "0: 4.25, 1: -"
    assert run.per_gpu(("h2d_gbps", "d2h_gbps"), 1) == "0: 55.4/55.3, 1: -/-"
    assert run.slowest("hbm_copy_tbps") is None  # the reference then fails as "no measurement"
    named = burn.parse_bandwidth(json.dumps({"available": True, "gpus": [
        {"index": 0, "bus_id": "00000000:19:00.0", "hbm_copy_tbps": 4.25, "error": None}]}))
    assert named.per_gpu(("hbm_copy_tbps",), 2) == "GPU 0 (00000000:19:00.0): 4.25"  # DERIVED bus id


def test_gpus_nvml_lists_but_cuda_hides_are_named_with_what_hides_them():
    """DERIVED: NVML lists two GPUs (the real one copied), the payload measured one."""
    facts = nvml_facts(2)
    assert burn.unmeasured_gpus([(0, "")], facts, "GPU burn", "0") == [
        "NVML lists 2 GPU(s), the GPU burn ran on 1: GPU 1 (00000000:00:06.0) not measured "
        "(CUDA_VISIBLE_DEVICES='0' on the node)"]
    mig = nvml_facts(2, mig_mode=[1, 1])
    assert burn.unmeasured_gpus([(0, "")], mig, "GPU burn", None)[0].endswith(
        "(MIG mode on GPU 0 (00000000:00:06.0), GPU 1 (00000000:00:06.0))")
    assert burn.unmeasured_gpus([(0, ""), (1, "")], facts, "GPU burn", None) == []


def test_bandwidth_payload_on_cpu_says_what_cuda_saw():
    pytest.importorskip("torch")
    result = burn.bandwidth(node_with(sys.executable), extra=("--device", "cpu", "--copy-mib", "1",
                                                              "--pcie-mib", "1", "--iterations", "1"))
    data = json.loads(result.stdout)
    assert "cuda_visible_devices" in data and data["gpus"][0]["bus_id"] == ""
    assert burn.parse_bandwidth(result.stdout).gpus[0].label == "GPU 0"


def test_burn_setup_error_is_that_devices_entry_and_the_payload_still_reports():
    """A device whose setup raises (here a negative size: torch refuses the allocation, as CUDA
    refuses a bad GPU's) gets the error in its own entry; the payload prints its JSON and exits 0."""
    pytest.importorskip("torch")
    result = burn.run(node_with(sys.executable), seconds=0.5,
                      extra=("--device", "cpu", "--size", "-1", "--matmul-seconds", "0.1"))
    assert result.exit_code == 0, result.stderr
    run = burn.parse_burn(result.stdout)
    assert not run.ok and run.gpus[0].error.startswith("setup: RuntimeError")
    assert run.gpus[0].burn_windows == [] and burn.analyze(run).problems[0].startswith("GPU 0: setup: ")
