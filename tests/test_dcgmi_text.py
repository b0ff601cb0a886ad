"""dcgmi diag's text table (without -j), DCGM 3.x and 4.x layouts: real tables from public
repositories and issues, and 4.x failing cases DERIVED from NVIDIA's published example
(tests/data/dcgmi/PROVENANCE.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runners import dcgmi

DATA = Path(__file__).resolve().parent / "data" / "dcgmi"
ROOT = DATA.parent.parent.parent


def table(name: str) -> dcgmi.DcgmiDiag:
    return dcgmi.parse_dcgmi((DATA / name).read_text())


def test_3x_test_level_fail_all_with_its_warnings():
    """REAL (NVIDIA/nccl-tests#264, DCGM 3.3.8, 8x H100): GPU Memory "Fail - All", a Warning
    row per GPU wrapped over seven lines; an Info row under Persistence Mode is not a test."""
    diag = table("nccl-tests-issue264_dcgmi-diag-r3_DCGM-3.3.8_8xH100_gpu-memory-fail-all.txt")
    assert diag.version == "3.3.8" and not diag.ok and diag.runtime_error is None
    assert [t.name for t in diag.tests] == [
        "Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "Persistence Mode",
        "Environment Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom", "PCIe",
        "GPU Memory", "Memory Bandwidth", "EUD Test"]
    memory = diag.tests[10]
    assert (memory.category, memory.gpus, memory.status) == ("Hardware", "", "Fail")
    assert len(memory.warnings) == 8 and memory.warnings[7].startswith("GPU 7 Error using CUDA API cuInit")
    assert memory.warnings[0].endswith("Unable to initialize CUDA library: 'system not yet initialized'. . "
                                       "Please check if a CUDA sample program can be run successfully on "
                                       "this host. Refer to https://github.com/nvidia/cuda-samples")
    assert diag.tests[9].status == "Skip" and diag.tests[4].warnings == []


def test_3x_per_gpu_split_status_fails_on_the_one_gpu():
    """REAL excerpt (stas00/ml-engineering, a faulty node's `-r 2`): "Pass - GPUs: 1, ..., 7"
    then "Fail - GPU: 0" and its thermal Warning; the paste ends mid-row."""
    diag = table("ml-engineering-debug-md_dcgmi-r2-excerpt_gpu-memory-pass-gpus-1-7_fail-gpu-0.txt")
    assert [(t.name, t.gpus, t.status) for t in diag.tests] == [
        ("GPU Memory", "1,2,3,4,5,6,7", "Pass"), ("GPU Memory", "0", "Fail")]
    assert diag.tests[1].warnings == [
        "GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test for GPU 0 "
        "Verify that the cooling on this machine is functional, including external, thermal material "
        "interface, fans, and any other components."]
    assert not diag.ok


def test_3x_error_row_without_a_test_above_it_fails():
    """REAL excerpt (stas00/ml-engineering): a Deployment Error row naming GPU 3."""
    diag = table("ml-engineering-debug-md_dcgmi-excerpt_deployment-error-row.txt")
    [error] = diag.tests
    assert (error.name, error.category, error.gpus, error.status) == ("Error", "Deployment", "3", "Fail")
    assert error.warnings == ["GPU 3 has uncorrectable memory errors and row remappings are pending"]
    assert not diag.ok


def test_3x_two_tables_the_last_one_counts_and_skips_pass():
    """REAL (gnosia93/slurm-on-aws, DCGM 3.3.9, 2 GPUs): the same table printed twice; every
    test after Deployment skipped (Skip passes, as in the JSON)."""
    diag = table("slurm-on-aws_dcgmi-diag-r3_DCGM-3.3.9_2GPU_two-tables_hardware-skipped.txt")
    assert diag.version == "3.3.9" and len(diag.tests) == 15 and diag.ok
    assert {t.status for t in diag.tests[9:]} == {"Skip"}


def test_4x_layout_with_a_line_per_gpu():
    """NVIDIA's published `dcgmi diag -r 3` example (DCGM 4.0.0, 4 GPUs, DCGM user guide)."""
    diag = table("nvidia-dcgm-docs_dcgmi-diag-r3_DCGM-4.0.0_4GPU_PASS.txt")
    assert diag.version == "4.0.0" and diag.ok
    assert [(t.name, t.gpus) for t in diag.tests[:5]] == [("software", ""), ("software", "0"),
                                                          ("software", "1"), ("software", "2"),
                                                          ("software", "3")]
    assert {t.category for t in diag.tests} == {"Deployment", "Hardware", "Integration", "Stress"}
    assert len(diag.tests) == 7 * 5


def test_4x_test_level_fail_fails_even_when_every_gpu_line_says_pass():
    """DERIVED from NVIDIA's example: the memory test's own status set to Fail, its four GPU
    lines left at Pass."""
    diag = table("derived_nvidia-dcgm-docs_DCGM-4.0.0_memory-test-Fail_every-GPU-line-Pass.txt")
    memory = [t for t in diag.tests if t.name == "memory"]
    assert [(t.gpus, t.status) for t in memory] == [("", "Fail"), ("0", "Pass"), ("1", "Pass"),
                                                    ("2", "Pass"), ("3", "Pass")]
    assert not diag.ok


def test_cli_reads_the_table():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "dcgmi",
                           str(DATA / "nccl-tests-issue264_dcgmi-diag-r3_DCGM-3.3.8_8xH100_gpu-memory-fail-all.txt")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout)
    assert parsed["ok"] is False and parsed["version"] == "3.3.8"
    assert {"name": "GPU Memory", "category": "Hardware", "gpus": "", "status": "Fail"}.items() <= \
        parsed["tests"][10].items()
