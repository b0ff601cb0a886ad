"""GPU node configuration: the payload runs for real here, and the evaluations are tested on facts.

Which facts are real and which derived:
- REAL: the gpu_config payload's output on this VM (no GPU, no cpufreq, no IOMMU, no lspci,
  kernel.numa_balancing 0), taken once per module; and from the H200 machine
  (tests/data/h200-1gpu/system.txt) its `nvidia-smi -q` text (Fabric State N/A: one GPU, no
  NVSwitch), its driver 580.159.04 and CUDA driver 13000 (nvml.json's cuda_driver).
- DERIVED: copies of this VM's real output with named fields changed (a governor, a module list,
  device NUMA nodes, cmdline and IOMMU devices, the Fabric Manager state); each test says which.
- COMPOSED: the lspci ACS lines below follow pciutils' ACSCtl format (lib/ls-ecaps.c, as printed
  by lspci 3.x: "\\t\\tACSCtl:\\tSrcValid+ TransBlk- ..."); no lspci output was recorded.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from inventory.loader import load_profile
from inventory.model import Expectations, Node
from runners import gpu_config
from runners.transport import LocalTransport

DATA = Path(__file__).resolve().parent / "data" / "h200-1gpu"
SYSTEM_TXT = (DATA / "system.txt").read_text()
H200_SMI_Q = SYSTEM_TXT.split("== nvidia-smi -q\n", 1)[1].split("== query\n", 1)[0]
H200 = load_profile("h200-sxm-8gpu").expect
CPU_ONLY = load_profile("cpu-only").expect

ACS_COMPOSED = """0000:15:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
\tCapabilities: [1a0 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-

0000:16:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
\tCapabilities: [1a0 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+
\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
"""


@pytest.fixture(scope="module")
def real_here() -> dict:
    """This VM's real payload output, as JSON."""
    result = gpu_config.probe(LocalTransport(Node("here", "here", "local", python="python3")))
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def derived(real: dict, **changes) -> gpu_config.ConfigFacts:
    """This VM's real facts with the named fields changed: derived, not recorded output."""
    return gpu_config.parse_config_facts(json.dumps({**real, **changes}))


EVALUATIONS = [gpu_config.fabric_manager, gpu_config.peermem, gpu_config.pcie_acs, gpu_config.iommu,
               gpu_config.cpu_governor, gpu_config.numa_balancing, gpu_config.device_numa,
               gpu_config.versions, gpu_config.container_toolkit]


def test_real_facts_here_skip_every_check_on_cpu_only(real_here):
    facts = gpu_config.parse_config_facts(json.dumps(real_here))
    assert facts.gpus == [] and facts.cpu_governors == {} and facts.numa_balancing == "0"
    for evaluate in EVALUATIONS:
        finding = evaluate(facts, CPU_ONLY, "cpu-only")
        assert finding.skip and "profile cpu-only does not ask for" in finding.skip
        assert finding.problems == []


def test_real_facts_here_fail_what_the_h200_profile_requires(real_here):
    facts = gpu_config.parse_config_facts(json.dumps(real_here))
    assert gpu_config.cpu_governor(facts, H200, "h200").problems == [
        "no CPU frequency governor (no /sys/devices/system/cpu/cpu*/cpufreq), expected performance"]
    assert gpu_config.numa_balancing(facts, H200, "h200").problems == []  # really 0 here
    assert gpu_config.iommu(facts, H200, "h200").problems == []  # really no IOMMU here: off
    assert gpu_config.device_numa(facts, H200, "h200").problems == [
        "0 GPU(s) found, the profile places 8"]
    fabric = gpu_config.fabric_manager(facts, H200, "h200").problems
    assert fabric[0].startswith("nvidia-fabricmanager is unknown (")
    assert fabric[0].endswith("expected active")
    assert gpu_config.peermem(facts, H200, "h200").problems  # this kernel has no modules
    assert gpu_config.pcie_acs(facts, H200, "h200").problems == [
        "cannot read PCIe ACS (lspci not found in PATH), expected ACS disabled on every bridge"]


def test_real_h200_fabric_state_is_not_applicable_without_nvswitch():
    states = gpu_config.parse_fabric_states(H200_SMI_Q)
    assert states == [gpu_config.FabricState("00000000:00:06.0", "N/A", "N/A")]


def test_h200_fabric_state_fails_an_nvswitch_profile_and_completed_passes(real_here):
    facts = derived(real_here, fabricmanager="active", nvidia_smi_q=H200_SMI_Q)  # state: real
    assert gpu_config.fabric_manager(facts, H200, "h200").problems == [
        "GPU 00000000:00:06.0: fabric state N/A, expected Completed"]
    completed = H200_SMI_Q.replace("        State                                          : N/A",
                                   "        State                                          : Completed") \
        .replace("        Status                                         : N/A",
                 "        Status                                         : Success")
    finding = gpu_config.fabric_manager(derived(real_here, fabricmanager="active",
                                                nvidia_smi_q=completed), H200, "h200")
    assert finding.problems == [] and "1 GPU fabric state(s)" in finding.note
    inactive = derived(real_here, fabricmanager="inactive", nvidia_smi_q=completed)
    assert gpu_config.fabric_manager(inactive, H200, "h200").problems == [
        "nvidia-fabricmanager is inactive, expected active"]


def test_peermem_module_named(real_here):
    assert gpu_config.peermem(derived(real_here, modules=["nvidia", "nvidia_peermem"]), H200, "h").problems == []
    assert gpu_config.peermem(derived(real_here, modules=["nvidia", "mlx5_ib"]), H200, "h").problems == [
        "nvidia_peermem is not loaded (not in /proc/modules), expected loaded for GPUDirect RDMA "
        "(modprobe nvidia_peermem)"]


def test_acs_enabled_bridge_is_named_with_its_flags(real_here):
    ports, denied = gpu_config.parse_acs(ACS_COMPOSED)
    assert [p.enabled for p in ports] == [("SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"), ()]
    assert not denied
    assert gpu_config.pcie_acs(derived(real_here, lspci_vvv=ACS_COMPOSED), H200, "h").problems == [
        "0000:15:00.0 (PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 "
        "[Normal decode])): ACS enabled (SrcValid ReqRedir CmpltRedir UpstreamFwd), expected disabled"]
    denied_text = "0000:15:00.0 PCI bridge: Broadcom\n\tCapabilities: <access denied>\n"
    assert "could not read PCIe capabilities" in gpu_config.pcie_acs(
        derived(real_here, lspci_vvv=denied_text), H200, "h").problems[0]


def test_iommu_modes_from_cmdline_and_sysfs(real_here):
    passthrough = derived(real_here, kernel_cmdline="ro intel_iommu=on iommu=pt", iommu_devices=["dmar0"])
    assert gpu_config.iommu_mode(passthrough)[0] == "passthrough"
    translated = derived(real_here, kernel_cmdline="ro intel_iommu=on", iommu_devices=["dmar0"],
                         iommu_group_types=["DMA-FQ"])
    assert gpu_config.iommu(translated, H200, "h").problems == [
        "IOMMU mode is translated (cmdline intel_iommu=on; 1 IOMMU(s) in /sys/class/iommu; "
        "group types DMA-FQ), expected off or passthrough"]


def test_governor_and_numa_balancing_name_expected_and_found(real_here):
    facts = derived(real_here, cpu_governors={"cpu0": "performance", "cpu1": "powersave"},
                    numa_balancing="1")
    assert gpu_config.cpu_governor(facts, H200, "h").problems == [
        "1 CPU(s) use powersave (e.g. cpu1), expected performance"]
    assert gpu_config.numa_balancing(facts, H200, "h").problems == [
        "NUMA balancing is on (kernel.numa_balancing = 1), expected off"]


def test_device_numa_placement_from_the_topology(real_here):
    """NUMA nodes as `nvidia-smi topo -m` shows them on 8x H100 (0,0,0,0,1,1,1,1); GPU 6 moved."""
    gpus = [{"bus_id": f"0000:{bus:02x}:00.0", "numa_node": 0 if i < 4 else 1}
            for i, bus in enumerate((0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb))]
    assert gpu_config.device_numa(derived(real_here, gpus=gpus), H200, "h").problems == []
    gpus[6] = {**gpus[6], "numa_node": 0}
    nics = [{"name": f"mlx5_{i}", "numa_node": 0} for i in (10, 2)]
    expect = replace(H200, nic_numa_nodes=(0, 1))
    assert gpu_config.device_numa(derived(real_here, gpus=gpus, infiniband=nics), expect, "h").problems == [
        "GPU 0000:ba:00.0 on NUMA node 0, expected 1", "NIC mlx5_10 on NUMA node 0, expected 1"]


def test_versions_pinned_on_the_real_h200_versions(real_here):
    facts = derived(real_here, nvidia_driver="580.159.04", cuda_driver=13000)  # system.txt, nvml.json
    assert "Driver Version                                         : 580.159.04" in SYSTEM_TXT
    assert gpu_config.cuda_version(13000) == "13.0" and gpu_config.cuda_version(12080) == "12.8"
    pins = Expectations(driver_version=r"^580\.", cuda_version=r"^13\.0$")
    assert gpu_config.versions(facts, pins, "h").problems == []
    wrong = Expectations(driver_version=r"^570\.", ofed_version=r"^MLNX_OFED_LINUX-24\.")
    assert gpu_config.versions(facts, wrong, "h").problems == [
        "NVIDIA driver is 580.159.04, expected a match for '^570\\\\.'",
        "OFED/DOCA unknown (ofed_info not found in PATH), expected a match for "
        "'^MLNX_OFED_LINUX-24\\\\.'"]


def test_container_toolkit_present_or_named_missing(real_here):
    expect = Expectations(container_toolkit=True)
    assert "expected installed because customers run containers" in \
        gpu_config.container_toolkit(derived(real_here), expect, "h").problems[0]
    present = derived(real_here, container_toolkit={"tools": {"nvidia-ctk": "/usr/bin/nvidia-ctk"},
                                                    "version": "NVIDIA Container Toolkit CLI version 1.17.8\n"})
    finding = gpu_config.container_toolkit(present, expect, "h")
    assert finding.problems == [] and "1.17.8" in finding.note
