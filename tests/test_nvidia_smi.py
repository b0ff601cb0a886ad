"""nvidia-smi -q -x: the parser on a real H200 (DTD v13) and a real A100 (v12, MIG) document."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inventory.model import Expectations
from runners.nvidia_smi import nvlink_pair_problems, parse_nvidia_smi, parse_topo
from runners.parsing import ParseError

DATA = Path(__file__).resolve().parent / "data"
ROOT = DATA.parent.parent
H200_XML = DATA / "h200-1gpu" / "nvidia-smi-q.xml"
A100_XML = DATA / "nvidia-smi" / "telegraf_a100-sxm4-80GB-MIG_v12.xml"


def test_h200_v13():
    report = parse_nvidia_smi(H200_XML.read_text())
    assert (report.driver, report.cuda, report.attached_gpus, report.ok) == ("580.159.04", "13.0", 1, True)
    gpu = report.gpus[0]
    assert (gpu.name, gpu.uuid, gpu.serial) == ("NVIDIA H200", "GPU-c2e315c2-b0bf-7a06-fd03-a507261d4b6b",
                                                "1653924102168")
    assert (gpu.memory_total_mib, gpu.ecc_mode, gpu.pcie_gen_max, gpu.pcie_width_max) == (143771, "Enabled", 5, 16)
    assert (gpu.ecc_uncorrectable_volatile, gpu.remap_pending, gpu.remap_failure) == (0, False, False)
    assert (gpu.power_limit_w, gpu.power_limit_default_w) == (700.0, 700.0)


def test_a100_v12_with_mig():
    report = parse_nvidia_smi(A100_XML.read_text())
    gpu = report.gpus[0]
    assert (report.driver, gpu.name, gpu.memory_total_mib) == ("535.54.03", "NVIDIA A100-SXM4-80GB", 81920)
    assert (gpu.pcie_gen_max, gpu.mig_mode, gpu.remap_pending) == (4, "Enabled", None)
    assert gpu.ecc_uncorrectable_aggregate == 0 and report.ok


def test_derived_uncorrectable_count_is_summed_across_v13_counters():
    """Derived from the real H200 document: dram_uncorrectable (volatile) set to 3."""
    text = H200_XML.read_text().replace("<dram_uncorrectable>0</dram_uncorrectable>",
                                        "<dram_uncorrectable>3</dram_uncorrectable>", 1)
    assert parse_nvidia_smi(text).gpus[0].ecc_uncorrectable_volatile == 3


def test_document_without_gpus_is_not_ok():
    text = '<?xml version="1.0" ?><nvidia_smi_log><driver_version>1</driver_version></nvidia_smi_log>'
    assert not parse_nvidia_smi(text).ok


@pytest.mark.parametrize("text", ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
                                  "<?xml version='1.0'?><other/>", "<nvidia_smi_log><gpu>"])
def test_not_nvidia_smi_xml(text):
    with pytest.raises(ParseError):
        parse_nvidia_smi(text)


def test_cli():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "nvidia-smi", str(H200_XML)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and '"memory_total_mib": 143771' in done.stdout and '"ok": true' in done.stdout


TOPO_NV18 = DATA / "nvidia-smi" / "ml-engineering_topo-m_8xH100_excerpt.txt"
TOPO_PCIE = DATA / "nvidia-smi" / "deepep-issue397_topo-mp_8xH100_12xCX7.txt"
H200_SYSTEM = DATA / "h200-1gpu" / "system.txt"
HGX = Expectations(nvlink_links=18, gpu_count=8)


def test_topo_8x_h100_nv18_between_every_pair():
    topology = parse_topo(TOPO_NV18.read_text())
    assert topology.ok and topology.gpus == [f"GPU{i}" for i in range(8)]
    assert topology.links["GPU2"]["GPU7"] == "NV18"
    assert list(topology.numa_affinity.values()) == ["0"] * 4 + ["1"] * 4
    assert nvlink_pair_problems(topology, HGX) == []


def test_topo_pcie_only_matrix_with_nics_fails_every_pair():
    """`topo -mp` shows the PCIe path only: every one of the 28 GPU pairs lacks NV18."""
    topology = parse_topo(TOPO_PCIE.read_text())
    assert len(topology.devices) == 20 and topology.nic_names["NIC11"] == "mlx5_11"
    assert topology.links["NIC0"]["GPU0"] == "PIX"
    problems = nvlink_pair_problems(topology, HGX)
    assert len(problems) == 28 and problems[0] == "GPU0-GPU1: NODE, expected NV18"
    assert "GPU3-GPU4: SYS, expected NV18" in problems


def test_topo_real_h200_with_ansi_header_has_one_gpu():
    topology = parse_topo(H200_SYSTEM.read_text().split("== topo\n", 1)[1])
    assert topology.gpus == ["GPU0"] and topology.numa_affinity == {"GPU0": "0"}
    assert nvlink_pair_problems(topology, HGX) == ["1 GPU(s) in the topology matrix, expected 8"]
    assert nvlink_pair_problems(topology, Expectations(nvlink_links=18, gpu_count=1)) == []


def test_topo_parser_refuses_other_text():
    with pytest.raises(ParseError, match="not `nvidia-smi topo -m` output"):
        parse_topo(A100_XML.read_text())
