"""The GEMM/FFT payload run for real on this machine's CPU (torch, small shapes) and without torch,
its parser on that real output (and on copies derived from it, each saying what it changes),
`handover parse gemm-fft`, and the HPC suite's GEMM/FFT checks end to end: measured on cpu-only,
skipped without torch, failed where the profile expects GPUs. The CUDA path cannot run here."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from test_e2e import ROOT, results_of, run_dir_of, run_suites

from inventory.model import Node
from runners import gemm_fft
from runners.parsing import ParseError
from runners.transport import LocalTransport

pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")

NO_TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3: torch is not installed there
CPU_ONLY = ("bf16", "fp16", "tf32")


def local(python: str = sys.executable) -> LocalTransport:
    return LocalTransport(Node(name="localhost", address="localhost", transport="local", python=python))


@pytest.fixture(scope="module")
def cpu_run():
    """One real CPU run of the payload, shapes smaller than its CPU defaults to keep CI quick."""
    result = gemm_fft.run(local(), gemm_size=256, fft_shape=(4, 128, 128), timeout=120)
    assert result.ok, result.stderr[-2000:]
    return result


def test_cpu_run_measures_fp32_fp64_and_fft_and_says_why_not_the_rest(cpu_run):
    report = gemm_fft.parse_gemm_fft(cpu_run.stdout)
    assert report.ok and report.problems == []
    assert report.device == "cpu" and report.cuda is None and report.torch.startswith("2.")
    assert report.gemm_size == 256 and report.fft_shape == [4, 128, 128]
    [cpu] = report.devices
    assert cpu.label == "cpu" and cpu.index is None
    for dtype in CPU_ONLY:
        assert cpu.gemm_tflops[dtype] is None and cpu.not_measured[dtype] == "not measured on CPU"
        assert report.slowest(dtype) is None and cpu.problem(dtype) == ""
    for dtype in ("fp32", "fp64"):
        assert cpu.gemm_tflops[dtype] > 0 and cpu.gemm_error[dtype] <= gemm_fft.GEMM_ERROR_LIMITS[dtype]
        assert report.slowest(dtype) is cpu
    assert cpu.fft_c64_gflops > 0 and cpu.fft_error <= gemm_fft.FFT_ERROR_LIMIT
    assert report.slowest_fft() is cpu


def test_without_torch_the_payload_says_so_and_the_report_is_not_ok():
    result = gemm_fft.run(local(NO_TORCH_PYTHON), timeout=60)
    assert result.ok, result.stderr
    report = gemm_fft.parse_gemm_fft(result.stdout)
    assert report.torch is None and report.devices == [] and not report.ok
    assert "No module named 'torch'" in report.torch_error
    assert report.problems[0].startswith("torch cannot be imported")


def derived(cpu_run, change) -> gemm_fft.GemmFftReport:
    data = json.loads(cpu_run.stdout.strip().splitlines()[-1])
    change(data["devices"][0])
    return gemm_fft.parse_gemm_fft(json.dumps(data))


def test_a_wrong_gemm_or_fft_is_a_problem_named_by_device_and_precision(cpu_run):
    """Derived from the real CPU run: the fp32 error set to 0.5 (a wrong product), then the FFT's."""
    wrong_gemm = derived(cpu_run, lambda device: device["gemm_error"].update(fp32=0.5))
    assert not wrong_gemm.ok
    assert wrong_gemm.problems == ["cpu: fp32 GEMM relative error 0.5 against float64, expected <= 0.0001"]
    assert wrong_gemm.devices[0].problem("fp64") == ""
    wrong_fft = derived(cpu_run, lambda device: device.update(fft_error=0.5))
    assert not wrong_fft.ok and "FFT round-trip relative error 0.5" in wrong_fft.problems[0]


def test_a_figure_missing_without_a_reason_is_a_problem(cpu_run):
    """Derived from the real CPU run: bf16's 'not measured on CPU' reason removed."""
    report = derived(cpu_run, lambda device: device["not_measured"].pop("bf16"))
    assert report.problems == ["cpu: bf16 GEMM has no figure and no reason"]


@pytest.mark.parametrize("text", [
    "", "Traceback (most recent call last):\n", '{"torch": "2.13.0"}\n',
    '{"torch": "2.13.0", "devices": [{"name": "cpu"}]}\n',
    (ROOT / "tests" / "data" / "nccl-tests" / "superbench_nccl_allreduce.log").read_text(),
])
def test_text_that_is_not_the_payloads_output_is_refused(text):
    with pytest.raises(ParseError):
        gemm_fft.parse_gemm_fft(text)


def test_handover_parse_gemm_fft(cpu_run, tmp_path):
    saved = tmp_path / "gemm_fft.stdout"
    saved.write_text(cpu_run.stdout)
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "gemm-fft", str(saved)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is True and data["devices"][0]["gemm_tflops"]["fp64"] > 0
    bad = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "gemm-fft",
                          str(ROOT / "tests" / "data" / "hpl" / "PROVENANCE.md")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2


def gemm_fft_checks(tmp_path, profile: str, python: str, sign_key) -> dict:  # noqa: F811
    """The suite's GEMM/FFT checks on this machine as a one-node local cluster."""
    inventory = tmp_path / "local.yaml"
    inventory.write_text(json.dumps({"cluster": "local", "profile": profile, "transport": "local",
                                     "python": python, "nodes": ["localhost"]}))
    run_suites(inventory, tmp_path / "out", sign_key, "-m", "hpc and quick", "-k", "gemm or fft")
    return {c["check"]: c for c in results_of(run_dir_of(tmp_path / "out", "local"))["checks"]}


def test_suite_on_a_cpu_node_judges_fp32_fp64_fft_skips_gpu_precisions(tmp_path, sign_key):  # noqa: F811
    checks = gemm_fft_checks(tmp_path, "cpu-only", sys.executable, sign_key)
    assert set(checks) == {"gemm_bf16", "gemm_fp16", "gemm_tf32", "gemm_fp32", "gemm_fp64", "fft"}
    for dtype in CPU_ONLY:
        check = checks[f"gemm_{dtype}"]
        assert check["outcome"] == "skipped" and "not measured on CPU" in check["message"]
    for name, metric, unit in [("gemm_fp32", "gemm_fp32_tflops", "TFLOP/s"),
                               ("gemm_fp64", "gemm_fp64_tflops", "TFLOP/s"),
                               ("fft", "fft_c64_gflops", "GFLOP/s")]:
        check = checks[name]
        assert check["outcome"] == "passed", check
        [row] = check["metrics"]
        assert row["name"] == metric and row["unit"] == unit and row["value"] > 0
        assert row["reference"] is None  # cpu-only sets no floor: a busy 2-core VM varies 30x
        assert ": cpu: " in check["message"]


def test_suite_judges_the_figure_against_the_profiles_band(tmp_path, sign_key):  # noqa: F811
    """cpu-only plus an fp64 reference no CPU reaches (1000 TFLOP/s): a performance failure
    that names the figure and the band; the other checks are unaffected."""
    profile = yaml.safe_load((ROOT / "inventory" / "profiles" / "cpu-only.yaml").read_text())
    profile["profile"] = "cpu-fp64-band"
    profile["references"]["gemm_fp64_tflops"] = {
        "check": "gemm_fp64", "value": 1000, "lower": -0.5, "upper": None, "unit": "TFLOP/s",
        "source": "test: a band no CPU reaches"}
    (tmp_path / "cpu-fp64-band.yaml").write_text(yaml.safe_dump(profile))
    checks = gemm_fft_checks(tmp_path, str(tmp_path / "cpu-fp64-band.yaml"), sys.executable, sign_key)
    fp64 = checks["gemm_fp64"]
    assert fp64["outcome"] == "failed" and fp64["kind"] == "performance"
    assert "gemm_fp64_tflops = " in fp64["message"] and "expected >= 500" in fp64["message"]
    assert checks["gemm_fp32"]["outcome"] == "passed" and checks["fft"]["outcome"] == "passed"


@pytest.mark.parametrize("profile, python, outcome, why", [
    ("cpu-only", NO_TORCH_PYTHON, "skipped", "No module named 'torch'"),
    ("h200-sxm-8gpu", NO_TORCH_PYTHON, "failed", "needs GEMM and FFT measured on its GPUs"),
    ("h200-sxm-8gpu", sys.executable, "failed", "sees no CUDA device, but profile h200-sxm-8gpu expects 8"),
])
def test_suite_without_torch_or_cuda(profile, python, outcome, why, tmp_path, sign_key):  # noqa: F811
    checks = gemm_fft_checks(tmp_path, profile, python, sign_key)
    assert len(checks) == 6
    for check in checks.values():
        assert check["outcome"] == outcome and why in check["message"], check
        if outcome == "failed":
            assert check["kind"] == "expectation"


def test_the_slowest_device_is_judged_and_every_device_named(cpu_run):
    """Derived from the real CPU run: its device entry twice, as indices 0 and 1, the second's
    fp32 figure halved (the shape of a two-GPU report; no GPU output is made up here)."""
    data = json.loads(cpu_run.stdout.strip().splitlines()[-1])
    first, second = dict(data["devices"][0], index=0), json.loads(json.dumps(data["devices"][0]))
    second.update(index=1, gemm_tflops={**second["gemm_tflops"], "fp32": first["gemm_tflops"]["fp32"] / 2})
    data["devices"] = [first, second]
    report = gemm_fft.parse_gemm_fft(json.dumps(data))
    slowest = report.slowest("fp32")
    assert slowest.index == 1 and slowest.label == "GPU 1 (cpu)"
    note = gemm_fft.per_device(report, slowest, lambda device: device.gemm_tflops["fp32"], "TFLOP/s", 4)
    assert note.startswith("slowest GPU 1 (cpu): ") and "; all: GPU 0 (cpu) " in note


def test_a_device_that_fails_is_its_own_entry_and_the_payload_still_reports():
    """A device whose measurement raises (here a negative GEMM size, refused by torch as CUDA
    refuses a bad GPU's work) gets the error in its entry: the payload prints its JSON, exits 0,
    and the parser names that device once."""
    result = gemm_fft.run(local(), gemm_size=-1, fft_shape=(2, 16, 16), timeout=120)
    assert result.ok, result.stderr[-2000:]
    report = gemm_fft.parse_gemm_fft(result.stdout)
    [cpu] = report.devices
    assert cpu.error.startswith("RuntimeError") and not report.ok
    assert report.problems == [f"cpu: {cpu.error}"]
    assert cpu.problem("fp32") == cpu.fft_problem() == f"cpu: {cpu.error}"


def test_derived_failing_gpu_is_named_by_bus_id_and_the_other_is_judged(cpu_run):
    """Derived from the real CPU run: its entry as GPU 0 with a bus id, and GPU 1 with a CUDA
    error instead of figures (the payload's shape for a GPU that failed)."""
    data = json.loads(cpu_run.stdout.strip().splitlines()[-1])
    data["devices"] = [dict(data["devices"][0], index=0, name="NVIDIA H200", bus_id="00000000:19:00.0"),
                       {"index": 1, "name": "", "bus_id": "", "gemm_tflops": {}, "gemm_error": {},
                        "not_measured": {}, "error": "AcceleratorError: CUDA error: unspecified launch failure"}]
    report = gemm_fft.parse_gemm_fft(json.dumps(data))
    assert report.devices[0].label == "GPU 0 (NVIDIA H200, 00000000:19:00.0)"
    assert report.problems == ["GPU 1: AcceleratorError: CUDA error: unspecified launch failure"]
    assert report.slowest("fp32") is report.devices[0]
