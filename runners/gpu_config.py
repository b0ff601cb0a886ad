"""GPU node configuration: probe (the gpu_config payload), parse, and pure evaluations.

Each evaluation takes the parsed facts, the profile's Expectations and the profile's name,
and returns a Finding: a skip reason when the profile does not ask for the setting, otherwise
the problems found, each naming the device, the expected and the found value (the suite adds
the node). A setting the profile asks for that cannot be read is a problem, not a skip.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from inventory.model import Expectations
from runners import payloads
from runners.parsing import ParseError, json_object
from runners.transport import Result, Transport

PROBE_TIMEOUT_S = 120  # nvidia-smi -q on 8 GPUs without persistence mode can take a while
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")  # the driver's module; the old MLNX_OFED one
CONTAINER_TOOLS = ("nvidia-ctk", "nvidia-container-cli", "nvidia-container-runtime")
# ACS controls that, when set, redirect or block peer-to-peer TLPs through the root complex.
ACS_CONTROLS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl",
                "DirectTrans")


@dataclass(frozen=True)
class FabricState:
    bus_id: str
    state: str  # nvidia-smi -q: N/A, Not Started, In Progress, Completed
    status: str  # Success, or the failure nvidia-smi names


@dataclass(frozen=True)
class AcsPort:
    address: str
    description: str
    enabled: tuple[str, ...]  # ACS controls set (the '+' flags of ACSCtl)


@dataclass(frozen=True)
class PciDevice:
    name: str  # PCI address for GPUs, device name (mlx5_0) for NICs
    numa_node: Optional[int]
    firmware: Optional[str] = None


@dataclass(frozen=True)
class ConfigFacts:
    hostname: str
    kernel_cmdline: str
    modules: Optional[list[str]]  # None: /proc/modules unreadable
    fabricmanager: Optional[str]  # systemctl is-active's word, None when it could not say
    fabric_states: Optional[list[FabricState]]  # None: no nvidia-smi
    acs_ports: Optional[list[AcsPort]]  # None: no lspci
    acs_unreadable: bool  # lspci could not read capabilities (not root)
    iommu_devices: Optional[list[str]]
    iommu_group_types: list[str]
    cpu_governors: dict[str, Optional[str]]
    numa_balancing: Optional[str]
    gpus: list[PciDevice]
    nics: list[PciDevice]
    nvidia_driver: Optional[str]
    cuda_driver: Optional[int]
    vbios: dict[str, str]
    ofed: Optional[str]
    container_tools: dict[str, Optional[str]]
    container_toolkit_version: Optional[str]
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    skip: Optional[str] = None
    problems: list[str] = field(default_factory=list)
    note: str = ""


def probe(transport: Transport) -> Result:
    """Root (through sudo where the inventory allows it) so lspci can read ACS capabilities."""
    return transport.run_script(payloads.load("gpu_config"), timeout=PROBE_TIMEOUT_S, root=True)


# ---------------------------------------------------------------- parsers (pure)


def parse_fabric_states(text: str) -> list[FabricState]:
    """Per GPU, the State and Status of the Fabric block of `nvidia-smi -q` text."""
    states: list[FabricState] = []
    found: dict[str, str] = {}
    bus_id, in_fabric = "", False
    for line in text.splitlines():
        gpu = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", line)
        if gpu:
            bus_id, in_fabric, found = gpu.group(1), False, {}
            continue
        stripped = line.strip()
        if stripped == "Fabric":
            in_fabric, found = True, {}
            continue
        if in_fabric:
            key, sep, value = stripped.partition(":")
            if sep and key.strip() in ("State", "Status"):
                found[key.strip()] = value.strip()
                if len(found) == 2:
                    states.append(FabricState(bus_id, found["State"], found["Status"]))
                    in_fabric = False
    return states


def parse_acs(text: str) -> tuple[list[AcsPort], bool]:
    """(ports with an ACS capability and the controls they have set, capabilities unreadable)."""
    ports, address, description = [], "", ""
    denied = False
    for line in text.splitlines():
        header = re.match(r"^([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]|[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])"
                          r"\s+(.*)$", line)
        if header:
            address, description = header.group(1), header.group(2).strip()
            continue
        if "Capabilities: <access denied>" in line:
            denied = True
        control = re.match(r"^\s+ACSCtl:\s*(.*)$", line)
        if control:
            flags = re.findall(r"(\w+)([+-])", control.group(1))
            ports.append(AcsPort(address, description,
                                 tuple(name for name, sign in flags if sign == "+")))
    return ports, denied


def parse_ofed(text: str) -> Optional[str]:
    """`ofed_info -s`: 'MLNX_OFED_LINUX-23.10-1.1.9.0:' or DOCA's 'OFED-internal-24.04-0.6.6:'."""
    for line in text.splitlines():
        line = line.strip().rstrip(":")
        if line:
            return line
    return None


def _int_or_none(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_config_facts(text: str) -> ConfigFacts:
    data = json_object(text, "GPU configuration facts")
    if not isinstance(data, dict) or "kernel_cmdline" not in data or "gpus" not in data:
        raise ParseError("GPU configuration facts lack kernel_cmdline and gpus")
    lspci = data.get("lspci_vvv")
    acs_ports, denied = parse_acs(lspci) if lspci else (None, False)
    smi = data.get("nvidia_smi_q")
    toolkit = data.get("container_toolkit") or {}
    version = toolkit.get("version")
    return ConfigFacts(
        hostname=str(data.get("hostname", "")),
        kernel_cmdline=data.get("kernel_cmdline") or "",
        modules=data.get("modules"),
        fabricmanager=data.get("fabricmanager"),
        fabric_states=parse_fabric_states(smi) if smi else None,
        acs_ports=acs_ports,
        acs_unreadable=denied,
        iommu_devices=data.get("iommu_devices"),
        iommu_group_types=[t for t in data.get("iommu_group_types") or [] if t],
        cpu_governors=dict(data.get("cpu_governors") or {}),
        numa_balancing=data.get("numa_balancing"),
        gpus=[PciDevice(g["bus_id"], _int_or_none(g.get("numa_node"))) for g in data["gpus"]],
        nics=[PciDevice(n["name"], _int_or_none(n.get("numa_node")), n.get("fw_ver"))
              for n in data.get("infiniband") or []],
        nvidia_driver=data.get("nvidia_driver"),
        cuda_driver=_int_or_none(data.get("cuda_driver")),
        vbios=dict(data.get("vbios") or {}),
        ofed=parse_ofed(data["ofed_info"]) if data.get("ofed_info") else None,
        container_tools=dict(toolkit.get("tools") or {}),
        container_toolkit_version=version.strip().splitlines()[0] if version else None,
        errors=dict(data.get("errors") or {}),
    )


# ---------------------------------------------------------------- evaluations (pure)


def _not_asked(profile: str, key: str, what: str) -> Finding:
    return Finding(skip=f"profile {profile} does not ask for {what} (no `{key}` in expect)")


def _why(facts: ConfigFacts, key: str, default: str) -> str:
    return facts.errors.get(key, default)


def fabric_manager(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    """On NVSwitch systems: the Fabric Manager service active, every GPU's fabric Completed."""
    if not expect.nvswitch:
        return _not_asked(profile, "nvswitch", "an NVSwitch fabric")
    problems = []
    if facts.fabricmanager != "active":
        found = facts.fabricmanager or f"unknown ({_why(facts, 'fabricmanager', 'no answer')})"
        problems.append(f"nvidia-fabricmanager is {found}, expected active")
    if facts.fabric_states is None:
        problems.append(f"no GPU fabric state: {_why(facts, 'nvidia-smi', 'nvidia-smi -q gave nothing')}")
    elif not facts.fabric_states:
        problems.append("nvidia-smi -q shows no GPU with a Fabric block, expected fabric state Completed")
    for gpu in facts.fabric_states or []:
        if gpu.state != "Completed":
            problems.append(f"GPU {gpu.bus_id}: fabric state {gpu.state}, expected Completed")
        elif gpu.status != "Success":
            problems.append(f"GPU {gpu.bus_id}: fabric status {gpu.status}, expected Success")
    count = len(facts.fabric_states or [])
    return Finding(problems=problems, note=f"fabricmanager {facts.fabricmanager}; {count} GPU fabric state(s)")


def peermem(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    """GPUDirect RDMA needs the nvidia_peermem module (nv_peer_mem with older MLNX_OFED)."""
    if not expect.gpudirect_rdma:
        return _not_asked(profile, "gpudirect_rdma", "GPUDirect RDMA")
    if facts.modules is None:
        return Finding(problems=["/proc/modules is unreadable, expected nvidia_peermem loaded"])
    loaded = [name for name in PEERMEM_MODULES if name in facts.modules]
    if not loaded:
        return Finding(problems=["nvidia_peermem is not loaded (not in /proc/modules), expected "
                                 "loaded for GPUDirect RDMA (modprobe nvidia_peermem)"])
    return Finding(note=f"{loaded[0]} loaded")


def pcie_acs(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    """ACS redirects GPU<->NIC peer traffic through the root complex: every ACSCtl flag off."""
    if not expect.pcie_acs_disabled:
        return _not_asked(profile, "pcie_acs_disabled", "PCIe ACS to be disabled")
    if facts.acs_ports is None:
        return Finding(problems=[f"cannot read PCIe ACS ({_why(facts, 'lspci', 'no lspci output')}), "
                                 "expected ACS disabled on every bridge"])
    if facts.acs_unreadable:
        return Finding(problems=["lspci -vvv could not read PCIe capabilities (run as root or with "
                                 "sudo: true), expected ACS disabled on every bridge"])
    problems = [f"{port.address} ({port.description}): ACS enabled ({' '.join(port.enabled)}), "
                "expected disabled" for port in facts.acs_ports if port.enabled]
    return Finding(problems=problems, note=f"{len(facts.acs_ports)} port(s) with ACS checked")


def iommu_mode(facts: ConfigFacts) -> tuple[str, str]:
    """(mode, evidence): off, passthrough (iommu=pt, identity domains) or translated (DMA)."""
    tokens = [t for t in facts.kernel_cmdline.split() if "iommu" in t]
    evidence = f"cmdline {' '.join(tokens) or '(no iommu option)'}; " \
               f"{len(facts.iommu_devices or [])} IOMMU(s) in /sys/class/iommu"
    if facts.iommu_group_types:
        evidence += f"; group types {','.join(facts.iommu_group_types)}"
    if not facts.iommu_devices and not facts.iommu_group_types:
        return "off", evidence
    if facts.iommu_group_types and set(facts.iommu_group_types) == {"identity"}:
        return "passthrough", evidence
    if "iommu=pt" in tokens or "iommu.passthrough=1" in tokens:
        return "passthrough", evidence
    return "translated", evidence


def iommu(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    allowed = expect.iommu_modes
    if not allowed:
        return _not_asked(profile, "iommu_modes", "an IOMMU mode")
    found, evidence = iommu_mode(facts)
    if found not in allowed:
        return Finding(problems=[f"IOMMU mode is {found} ({evidence}), expected {' or '.join(allowed)}"])
    return Finding(note=f"IOMMU {found} ({evidence})")


def cpu_governor(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    want = expect.cpu_governor
    if want is None:
        return _not_asked(profile, "cpu_governor", "a CPU frequency governor")
    if not facts.cpu_governors:
        return Finding(problems=["no CPU frequency governor (no /sys/devices/system/cpu/cpu*/cpufreq), "
                                 f"expected {want}"])
    by_governor = defaultdict(list)
    for cpu, governor in facts.cpu_governors.items():
        by_governor[governor or "unreadable"].append(cpu)
    problems = [f"{len(cpus)} CPU(s) use {governor} (e.g. {cpus[0]}), expected {want}"
                for governor, cpus in sorted(by_governor.items()) if governor != want]
    return Finding(problems=problems, note=f"{len(facts.cpu_governors)} CPU(s): "
                   + ", ".join(f"{g} x{len(c)}" for g, c in sorted(by_governor.items())))


def numa_balancing(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    want = expect.numa_balancing
    if want is None:
        return _not_asked(profile, "numa_balancing", "a NUMA balancing setting")
    wanted = "on" if want else "off"
    if facts.numa_balancing is None:
        return Finding(problems=[f"/proc/sys/kernel/numa_balancing is unreadable, expected {wanted}"])
    found = "off" if facts.numa_balancing.strip() == "0" else "on"
    if found != wanted:
        return Finding(problems=[f"NUMA balancing is {found} (kernel.numa_balancing = "
                                 f"{facts.numa_balancing}), expected {wanted}"])
    return Finding(note=f"NUMA balancing {found}")


def _natural(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def device_numa(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    """GPUs in PCI address order and NICs in name order (mlx5_0, mlx5_1, ...) on their NUMA nodes."""
    plans = [("GPU", expect.gpu_numa_nodes, sorted(facts.gpus, key=lambda d: d.name)),
             ("NIC", expect.nic_numa_nodes, sorted(facts.nics, key=lambda d: _natural(d.name)))]
    if all(want is None for _, want, _ in plans):
        return _not_asked(profile, "gpu_numa_nodes/nic_numa_nodes", "a device NUMA placement")
    problems, seen = [], []
    for kind, want, devices in plans:
        if want is None:
            continue
        if len(devices) != len(want):
            problems.append(f"{len(devices)} {kind}(s) found, the profile places {len(want)}")
        for device, node in zip(devices, want, strict=False):
            if device.numa_node != node:
                problems.append(f"{kind} {device.name} on NUMA node {device.numa_node}, expected {node}")
        seen.append(f"{kind}s on " + (",".join(str(d.numa_node) for d in devices) or "none"))
    return Finding(problems=problems, note="; ".join(seen))


def cuda_version(driver: Optional[int]) -> Optional[str]:
    """cuDriverGetVersion's 13000 as '13.0', 12080 as '12.8'."""
    return None if driver is None else f"{driver // 1000}.{driver % 1000 // 10}"


def versions(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    """Driver, CUDA, OFED/DOCA, NIC firmware and VBIOS as the profile pins them (regexes)."""
    found: dict[str, list[tuple[str, Optional[str], str]]] = {
        "driver_version": [("NVIDIA driver", facts.nvidia_driver,
                            _why(facts, "nvidia", "no /sys/module/nvidia/version"))],
        "cuda_version": [("CUDA driver", cuda_version(facts.cuda_driver), _why(facts, "cuda", "no libcuda"))],
        "ofed_version": [("OFED/DOCA", facts.ofed, _why(facts, "ofed_info", "no ofed_info"))],
        "nic_firmware": [(f"{nic.name} firmware", nic.firmware, "no fw_ver in sysfs") for nic in facts.nics]
        or [("NIC firmware", None, "no InfiniBand device in /sys/class/infiniband")],
        "vbios_version": [(f"GPU {bus} VBIOS", version, "") for bus, version in sorted(facts.vbios.items())]
        or [("VBIOS", None, "no /proc/driver/nvidia/gpus/*/information")],
    }
    pins = {key: getattr(expect, key) for key in found if getattr(expect, key)}
    if not pins:
        return _not_asked(profile, "driver_version/cuda_version/ofed_version/nic_firmware/vbios_version",
                          "pinned versions")
    problems, seen = [], []
    for key, pattern in pins.items():
        for label, value, why in found[key]:
            if value is None:
                problems.append(f"{label} unknown ({why}), expected a match for {pattern!r}")
            elif not re.search(pattern, value):
                problems.append(f"{label} is {value}, expected a match for {pattern!r}")
            else:
                seen.append(f"{label} {value}")
    return Finding(problems=problems, note="; ".join(seen))


def container_toolkit(facts: ConfigFacts, expect: Expectations, profile: str) -> Finding:
    if not expect.container_toolkit:
        return _not_asked(profile, "container_toolkit", "the NVIDIA container toolkit")
    present = [name for name in CONTAINER_TOOLS if facts.container_tools.get(name)]
    if not present:
        return Finding(problems=["NVIDIA container toolkit not found (none of "
                                 f"{', '.join(CONTAINER_TOOLS)} in PATH), expected installed "
                                 "because customers run containers"])
    return Finding(note=f"{', '.join(present)}" + (f"; {facts.container_toolkit_version}"
                                                    if facts.container_toolkit_version else ""))
