"""NVML GPU facts: the payload runs for real here (no NVML), and the evaluations are tested on the
real H200 dump (tests/data/h200-1gpu/nvml.json) and on DERIVED copies with one field changed."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from inventory.loader import load_profile
from inventory.model import Node
from runners import nvml, payloads
from runners.transport import LocalTransport

DATA = Path(__file__).resolve().parent / "data" / "h200-1gpu"
H200 = json.loads((DATA / "nvml.json").read_text())
# The h200-sxm-8gpu profile for one GPU and no NVLink peers: what the recorded machine is.
ONE_H200 = replace(load_profile("h200-sxm-8gpu").expect, gpu_count=1, nvlink_links=0)


def facts(data=H200) -> nvml.GpuFacts:
    return nvml.parse_gpu_facts(json.dumps(data))


def derived(change) -> nvml.GpuFacts:
    """A copy of the real H200 dump with change(gpu_dict) applied: derived, not real output."""
    data = copy.deepcopy(H200)
    change(data["gpus"][0])
    return facts(data)


def test_real_h200_dump_parses():
    found = facts()
    assert found.available and found.driver == "580.159.04" and found.cuda_driver == 13000
    gpu = found.gpus[0]
    assert (gpu.name, gpu.memory_total_mib, gpu.bus_id) == ("NVIDIA H200", 143771, "00000000:00:06.0")
    assert (gpu.ecc_current, gpu.uncorrectable_volatile, gpu.remap_pending) == (True, 0, False)
    assert (gpu.pcie_gen_max, gpu.pcie_width_max, gpu.persistence, gpu.mig_current) == (5, 16, True, False)
    assert gpu.retired_pending is None  # NotSupported on Hopper: row remapping instead
    assert gpu.nvlink_active is None  # NotSupported: no NVLink peers on this machine
    assert gpu.compute_mode == "Default"


def test_real_h200_passes_every_evaluation_for_its_profile():
    found = facts()
    assert nvml.inventory_problems(found, ONE_H200) == []
    assert nvml.ecc_problems(found, ONE_H200) == ([], [])
    assert nvml.pcie_problems(found, ONE_H200) == ([], [
        "running link read at idle on 1 GPU(s), where it may read low "
        "(the probe ran no load (no `pcie_load` in its output))"])
    assert nvml.nvlink_problems(found, ONE_H200) == []
    assert nvml.mode_problems(found, ONE_H200) == []


def test_derived_missing_gpu_fails_the_count():
    data = copy.deepcopy(H200)
    data["gpus"] = []
    assert nvml.inventory_problems(facts(data), ONE_H200) == ["0 GPU(s) found, expected 1"]
    assert nvml.inventory_problems(facts(), load_profile("h200-sxm-8gpu").expect) == [
        "1 GPU(s) found, expected 8"]


def test_derived_wrong_model_is_named():
    found = derived(lambda gpu: gpu.update(name="NVIDIA H100 80GB HBM3"))
    assert nvml.inventory_problems(found, ONE_H200) == [
        "GPU 0 (00000000:00:06.0) is 'NVIDIA H100 80GB HBM3', expected a match for '^NVIDIA H200'"]


@pytest.mark.parametrize("field, scope", [("ecc_dbe_volatile", "volatile"), ("ecc_dbe_aggregate", "aggregate")])
def test_derived_uncorrectable_ecc_fails(field, scope):
    problems, _ = nvml.ecc_problems(derived(lambda gpu: gpu.update({field: 2})), ONE_H200)
    assert problems == [f"GPU 0 (00000000:00:06.0): 2 uncorrectable ECC error(s) ({scope})"]


def test_derived_pending_and_failed_row_remap_fail():
    problems, _ = nvml.ecc_problems(derived(lambda gpu: gpu.update(remapped_rows="(0, 1, 1, 1)")),
                                    ONE_H200)
    assert any("row remap is pending" in p for p in problems)
    assert any("row remapping failed" in p for p in problems)


def test_derived_ecc_off_and_many_correctable():
    found = derived(lambda gpu: gpu.update(ecc_mode=[0, 0], ecc_sbe_aggregate=5000))
    problems, warnings = nvml.ecc_problems(found, ONE_H200)
    assert problems == ["GPU 0 (00000000:00:06.0): ECC is disabled, expected enabled"]
    assert warnings == ["GPU 0 (00000000:00:06.0): 5000 correctable ECC errors (aggregate), "
                        "above the profile's 1000"]


def test_derived_link_at_gen3_fails_and_idle_downtraining_is_a_note():
    problems, _ = nvml.pcie_problems(derived(lambda gpu: gpu.update(pcie_gen_max=3, pcie_gen_cur=3)),
                                     ONE_H200)
    assert problems == ["GPU 0 (00000000:00:06.0): PCIe link at most Gen3, expected Gen5"]
    problems, notes = nvml.pcie_problems(derived(lambda gpu: gpu.update(pcie_gen_cur=1)), ONE_H200)
    assert problems == [] and notes[1:] == ["GPU 0 (00000000:00:06.0): Gen1 at idle (idle links train down)"]
    assert notes[0].startswith("running link read at idle on 1 GPU(s), where it may read low")
    problems, _ = nvml.pcie_problems(derived(lambda gpu: gpu.update(pcie_width_cur=8)), ONE_H200)
    assert problems == ["GPU 0 (00000000:00:06.0): PCIe link running x8 of x16 at idle"]


def under_load(gen, width, idle_gen=1):
    """DERIVED: the real H200 dump (no load reading in it) as the payload now writes it, with
    `pcie_load` and per-GPU `pcie_gen_load`/`pcie_width_load` added and the idle generation set
    to `idle_gen` (links train down at idle)."""
    data = copy.deepcopy(H200)
    data["pcie_load"] = {"seconds": 2.0, "error": None}
    data["gpus"][0].update(pcie_gen_cur=idle_gen, pcie_gen_load=gen, pcie_width_load=width)
    return facts(data)


def test_derived_under_load_reading_is_judged_instead_of_the_idle_one():
    problems, notes = nvml.pcie_problems(under_load(5, 16), ONE_H200)
    assert problems == [] and notes == ["running link read under load"]
    assert nvml.running_link(under_load(5, 16).gpus[0]) == (5, 16)


@pytest.mark.parametrize("gen, width, problem", [
    (4, 16, "PCIe link running Gen4 of Gen5 under load"),
    (5, 8, "PCIe link running x8 of x16 under load")])
def test_derived_link_below_its_maximum_under_load_fails(gen, width, problem):
    problems, notes = nvml.pcie_problems(under_load(gen, width), ONE_H200)
    assert problems == [f"GPU 0 (00000000:00:06.0): {problem}"]
    assert notes == ["running link read under load"]


def test_derived_load_that_could_not_run_says_why():
    data = copy.deepcopy(H200)
    data["pcie_load"] = {"seconds": 0, "error": "torch is not installed for /usr/bin/python3"}
    _, notes = nvml.pcie_problems(facts(data), ONE_H200)
    assert notes == ["running link read at idle on 1 GPU(s), where it may read low "
                     "(torch is not installed for /usr/bin/python3)"]


def test_nvlink_expected_by_the_8gpu_profile_fails_on_a_gpu_without_links():
    expect = replace(ONE_H200, nvlink_links=18)
    assert nvml.nvlink_problems(facts(), expect) == [
        "GPU 0 (00000000:00:06.0): 0 active NVLink(s), expected 18"]
    links = [{"link": i, "state": 1} for i in range(18)]
    assert nvml.nvlink_problems(derived(lambda gpu: gpu.update(nvlink=links)), expect) == []


def test_derived_modes_and_power_limit_fail():
    found = derived(lambda gpu: gpu.update(persistence=0, mig_mode=[1, 1], compute_mode=3,
                                           power_limit_mw=500000))
    problems = nvml.mode_problems(found, ONE_H200)
    assert problems == [
        "GPU 0 (00000000:00:06.0): persistence mode is disabled, expected enabled",
        "GPU 0 (00000000:00:06.0): MIG mode is enabled, expected disabled",
        "GPU 0 (00000000:00:06.0): compute mode is Exclusive_Process, expected Default",
        "GPU 0 (00000000:00:06.0): enforced power limit 500 W differs from the default 700 W"]


def test_firmware_set_is_what_uniformity_compares():
    assert nvml.firmware_set(facts()) == {"driver": "580.159.04", "VBIOS": "96.00.A5.00.1A",
                                          "InfoROM": "G520.0282.02.02"}


def test_payload_runs_here_and_says_nvml_is_unavailable():
    """The node's python3 has no pynvml on this machine: the payload says so and exits 0."""
    node = Node("here", "here", "local", python="python3")
    result = nvml.probe(LocalTransport(node))
    assert result.exit_code == 0, result.stderr
    found = nvml.parse_gpu_facts(result.stdout)
    assert not found.available and found.gpus == []
    assert "NVML unavailable" in found.reason


def test_payload_with_pynvml_but_no_driver_reports_library_not_found():
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed in this interpreter")
    done = subprocess.run([sys.executable, "-"], input=payloads.load("gpu_facts"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data == {"available": False, "error": "NVMLError_LibraryNotFound",
                    "reason": "NVML cannot start: NVML Shared Library Not Found"}


def test_uniformity_names_the_odd_node_out():
    """DERIVED: three nodes with the real H200's facts, node3's VBIOS changed."""
    from suites.checks import odd_ones_out
    sets = {"node1": nvml.firmware_set(facts()), "node2": nvml.firmware_set(facts()),
            "node3": nvml.firmware_set(derived(lambda gpu: gpu.update(vbios="96.00.99.00.01")))}
    assert odd_ones_out("VBIOS", {n: s["VBIOS"] for n, s in sets.items()}) == (
        "VBIOS: node3 has '96.00.99.00.01', while 2 node(s) have '96.00.A5.00.1A'")
    assert odd_ones_out("driver", {n: s["driver"] for n, s in sets.items()}) == ""


def test_derived_gpus_of_one_node_on_different_firmware_are_named():
    """DERIVED: the real H200 copied as GPU 1 with another InfoROM image."""
    data = copy.deepcopy(H200)
    data["gpus"].append({**copy.deepcopy(H200["gpus"][0]), "index": 1, "inforom_image": "G520.0282.02.01"})
    assert nvml.mixed_firmware_problems(facts(data)) == [
        "GPUs on different InfoROM versions: G520.0282.02.01 on GPU(s) 1; G520.0282.02.02 on GPU(s) 0"]
    assert nvml.mixed_firmware_problems(facts()) == []


def test_derived_pcie_replays_are_a_warning_not_a_failure():
    problems, notes = nvml.pcie_problems(derived(lambda gpu: gpu.update(pcie_replay=12)), ONE_H200)
    assert problems == []
    assert notes[-1] == ("WARNING: GPU 0 (00000000:00:06.0): PCIe replay counter at 12 "
                         "(link-level retries: a marginal link, riser or slot)")


def test_not_supported_page_retirement_and_correctable_errors_do_not_fail():
    """Real H200: retired_pending is NotSupported (Hopper remaps rows); DERIVED: 5000 correctable
    errors with the profile's limit of 1000 warn without failing."""
    assert nvml.ecc_problems(facts(), ONE_H200) == ([], [])
    problems, warnings = nvml.ecc_problems(derived(lambda gpu: gpu.update(ecc_sbe_aggregate=5000)), ONE_H200)
    assert problems == [] and len(warnings) == 1


def test_derived_uncorrectable_errors_repaired_by_row_remapping_are_a_warning():
    """NVIDIA's memory error management: an uncorrectable error's row is remapped at the next reset,
    and the RMA criterion is a remap failure. DERIVED: 2 lifetime uncorrectable errors with 2 rows
    remapped for them, nothing pending, no failure: a warning; the same with a pending remap, with
    a failed one, or with no row remapped for them (not repaired that way) still fails."""
    repaired = derived(lambda gpu: gpu.update(ecc_dbe_aggregate=2, remapped_rows="(0, 2, 0, 0)"))
    problems, warnings = nvml.ecc_problems(repaired, ONE_H200)
    assert problems == [] and warnings == [
        "GPU 0 (00000000:00:06.0): 2 uncorrectable ECC error(s) in its lifetime (aggregate), 2 row(s) "
        "remapped for them, no remap pending, no remap failure: repaired in hardware (NVIDIA GPU Memory "
        "Error Management)"]
    for rows in ("(0, 2, 1, 0)", "(0, 2, 0, 1)", "(0, 0, 0, 0)"):
        changed = derived(lambda gpu, rows=rows: gpu.update(ecc_dbe_aggregate=2, remapped_rows=rows))
        problems, _ = nvml.ecc_problems(changed, ONE_H200)
        assert problems[0] == "GPU 0 (00000000:00:06.0): 2 uncorrectable ECC error(s) (aggregate)", rows
    unknown = derived(lambda gpu: gpu.update(ecc_dbe_aggregate=2, remapped_rows={"error": "NVMLError_NotSupported",
                                                                                  "msg": "Not Supported"}))
    assert nvml.ecc_problems(unknown, ONE_H200)[0] == [
        "GPU 0 (00000000:00:06.0): 2 uncorrectable ECC error(s) (aggregate); NVML gives no row-remapping state"]


# A stand-in for pynvml where NVML cannot run (no GPU, no driver here): the REAL nvidia-ml-py module
# with its errors, constants and signatures, on a node of two GPUs whose GPU 1 has fallen off the
# bus (NVML_ERROR_GPU_IS_LOST from nvmlDeviceGetHandleByIndex, as NVML answers for a lost GPU) and
# whose GPU 0 answers every getter with NotSupported. Only what NVML would say is changed.
STAND_IN = '''
import importlib.util
import sys
spec = importlib.util.spec_from_file_location("real_pynvml", {path!r})
real = sys.modules["real_pynvml"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)
globals().update({{name: value for name, value in vars(real).items() if not name.startswith("__")}})


def not_supported(*args):
    raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)


for name in dir(real):
    if name.startswith(("nvmlDeviceGet", "nvmlSystemGet")):
        globals()[name] = not_supported


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 2


def nvmlDeviceGetHandleByIndex(index):
    if index == 1:
        raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
    return "gpu0"
'''


def test_a_lost_gpu_is_named_and_the_others_keep_their_facts(tmp_path):
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed in this interpreter")
    (tmp_path / "pynvml.py").write_text(STAND_IN.format(path=pynvml.__file__))
    done = subprocess.run([sys.executable, "-"], input=payloads.load("gpu_facts"), capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["count"] == 2 and data["gpus"][1] == {"index": 1, "error": "NVMLError_GpuIsLost",
                                                      "msg": "GPU is lost"}
    assert data["gpus"][0]["name"] == {"error": "NVMLError_NotSupported", "msg": "Not Supported"}
    found = nvml.parse_gpu_facts(done.stdout)
    assert [gpu.index for gpu in found.reachable] == [0]
    two = replace(ONE_H200, gpu_model=None, gpu_count=2)
    assert nvml.inventory_problems(found, two) == [
        "GPU 1: NVML cannot reach it (NVMLError_GpuIsLost: GPU is lost): fallen off the bus (Xid 79)"]
    assert not any("GPU 1" in problem for problem in nvml.ecc_problems(found, two)[0] + nvml.mode_problems(found, two))
