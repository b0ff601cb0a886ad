"""dcgmi diag -j: NVIDIA's real-output fixture (3.x shape, leading warning line, null tests), a
failing case DERIVED from it, and the run step on this machine, where dcgmi is not installed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inventory.model import Node
from runners import dcgmi
from runners.parsing import ParseError
from runners.transport import LocalTransport

DATA = Path(__file__).resolve().parent / "data" / "dcgmi"
REAL = (DATA / "dcgm-repo_nvvs-json_DCGM-3.1.0_8GPU_PASS_with-leading-warning-line.txt").read_text()
ROOT = DATA.parent.parent.parent


def test_real_output_with_leading_warning_and_null_tests():
    diag = dcgmi.parse_dcgmi(REAL)
    assert diag.version == "3.1.0" and diag.ok and diag.runtime_error is None
    assert len(diag.tests) == 9 + 8
    assert diag.tests[0] == dcgmi.DiagResult("Denylist", "Deployment", "0,1,2,3,4,5,6,7", "PASS")
    assert diag.tests[-1].gpus == "7"


def test_derived_failing_result_is_not_ok_and_keeps_its_warning():
    """Derived: the first result's status set to Fail with a warning; not real dcgmi output."""
    start = REAL.index("{")
    data = json.loads(REAL[start:])
    result = data["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]
    result.update(status="Fail", warnings=[{"warning": "GPU 3 is denylisted", "error_id": 28}])
    diag = dcgmi.parse_dcgmi(json.dumps(data))
    assert not diag.ok
    assert diag.tests[0].warnings == ["GPU 3 is denylisted (error 28)"]


def test_4x_shape_with_runtime_error_is_not_ok():
    """Shape from NVIDIA/DCGM dcgm_diag_schema.json (4.x); a minimal document, not real output."""
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
        {"name": "software", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}]}]}],
        "runtime_error": "Couldn't find the nvvs binary"}, "metadata": {"version": "4.2.3"}}
    diag = dcgmi.parse_dcgmi(json.dumps(doc))
    assert diag.version == "4.2.3" and diag.tests[0].gpus == "0" and not diag.ok


def test_4x_test_that_failed_as_a_whole_fails_though_every_gpu_passed():
    """Shape from NVIDIA/DCGM dcgm_diag_schema.json (4.x, `test_summary`); not real output. The
    table parser reads the same case from the derived table in tests/data/dcgmi."""
    results = [{"entity_group": "GPU", "entity_id": gpu, "status": "Pass"} for gpu in range(4)]
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": results, "test_summary": {"status": "Fail", "info": []}}]}]},
        "metadata": {"version": "4.2.3"}}
    diag = dcgmi.parse_dcgmi(json.dumps(doc))
    assert [(t.gpus, t.status) for t in diag.tests] == [("", "Fail"), ("0", "Pass"), ("1", "Pass"),
                                                        ("2", "Pass"), ("3", "Pass")]
    assert not diag.ok
    doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["test_summary"]["status"] = "Pass"
    assert dcgmi.parse_dcgmi(json.dumps(doc)).ok


def _iterations(first: dict, second: dict, overall: str) -> str:
    """`dcgmi diag --iterations 2 -j`'s wrapper (tool-formats.md section 7) around two runs."""
    return json.dumps({"iterations": [first, second], "Overall Result": overall})


def test_iterations_count_every_run_and_dcgmis_overall_result():
    """Derived from the real fixture: two runs, the first with a failing Denylist result."""
    passing = json.loads(REAL[REAL.index("{"):])
    failing = json.loads(REAL[REAL.index("{"):])
    failing["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["status"] = "Fail"
    diag = dcgmi.parse_dcgmi(_iterations(failing, passing, "Fail"))
    assert not diag.ok and len(diag.tests) == 2 * (9 + 8) and diag.version == "3.1.0"
    assert [t.name for t in diag.tests if t.status == "Fail"] == ["Denylist (iteration 1)"]
    assert dcgmi.parse_dcgmi(_iterations(passing, passing, "Pass")).ok
    assert not dcgmi.parse_dcgmi(_iterations(passing, passing, "Fail")).ok


@pytest.mark.parametrize("text", ["Error: unable to connect to host engine", "{\"other\": 1}"])
def test_not_dcgmi_output(text):
    with pytest.raises(ParseError):
        dcgmi.parse_dcgmi(text)


def test_exit_226_means_the_diagnostic_ran_and_found_a_failure():
    assert 226 in dcgmi.RAN_AND_FOUND_FAILURES
    assert "found a failure" in dcgmi.EXIT_MEANINGS[226]
    assert dcgmi.diag_argv(3) == ["dcgmi", "diag", "-r", "3", "-j"]


def test_run_step_here_reports_dcgmi_missing():
    result = dcgmi.diag(LocalTransport(Node("here", "here", "local")), level=1)
    assert dcgmi.dcgmi_missing(result), (result.exit_code, result.stderr)


def test_cli():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "dcgmi",
                           str(DATA / "dcgm-repo_nvvs-json_DCGM-3.1.0_8GPU_PASS_with-leading-warning-line.txt")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and '"status": "PASS"' in done.stdout and '"ok": true' in done.stdout
