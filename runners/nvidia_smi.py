"""nvidia-smi -q -x: the driver's own view of every GPU, kept as evidence beside the NVML facts.

Values carry units as text ("143771 MiB", "16x", "700.00 W") and may be "N/A", "[N/A]" or
"Requested functionality has been deprecated": units are stripped and anything non-numeric is
missing (None). Field names differ between DTD v12 (R535) and v13 (R550+), e.g. v13 splits
`sram_uncorrectable` into `_parity` and `_secded`; both are read.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Optional

from inventory.model import Expectations
from runners.parsing import ParseError
from runners.transport import Result, Transport

QUERY_TIMEOUT_S = 60
# nvidia-smi's exit status mirrors NVML's return codes (nvidia-smi(1)).
EXIT_MEANINGS = {
    2: "invalid argument", 3: "not supported", 4: "no permission", 6: "no GPU found",
    8: "insufficient power", 9: "NVIDIA driver not loaded", 10: "interrupt issue",
    12: "NVML library not found", 14: "infoROM corrupted", 15: "GPU has fallen off the bus",
    255: "other error",
}

_UNCORRECTABLE = ("dram_uncorrectable", "sram_uncorrectable", "sram_uncorrectable_parity",
                  "sram_uncorrectable_secded")


@dataclass(frozen=True)
class SmiGpu:
    bus_id: str
    name: str
    uuid: str
    serial: str
    vbios: str
    memory_total_mib: Optional[int]
    ecc_mode: str  # "Enabled", "Disabled", or "N/A"
    ecc_uncorrectable_volatile: Optional[int]
    ecc_uncorrectable_aggregate: Optional[int]
    remap_pending: Optional[bool]  # None: not reported (N/A under MIG, or older GPUs)
    remap_failure: Optional[bool]
    pcie_gen_max: Optional[int]
    pcie_gen_current: Optional[int]
    pcie_width_max: Optional[int]
    pcie_width_current: Optional[int]
    pcie_replay: Optional[int]
    persistence_mode: str
    mig_mode: str
    power_limit_w: Optional[float]
    power_limit_default_w: Optional[float]


@dataclass(frozen=True)
class SmiReport:
    driver: str
    cuda: str
    attached_gpus: Optional[int]
    gpus: list[SmiGpu]
    ok: bool


def _text(element: Optional[ET.Element], path: str) -> str:
    found = element.find(path) if element is not None else None
    return (found.text or "").strip() if found is not None else ""


def _number(text: str) -> Optional[float]:
    match = re.match(r"^\s*(-?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def _integer(text: str) -> Optional[int]:
    value = _number(text)
    return int(value) if value is not None else None


def _yes_no(text: str) -> Optional[bool]:
    return {"yes": True, "no": False}.get(text.lower())


def _uncorrectable(ecc_errors: Optional[ET.Element], scope: str) -> Optional[int]:
    """Sum of the uncorrectable counters of one scope (volatile or aggregate); None if none read."""
    block = ecc_errors.find(scope) if ecc_errors is not None else None
    if block is None:
        return None
    values = [value for name in _UNCORRECTABLE if (value := _integer(_text(block, name))) is not None]
    return sum(values) if values else None


def _gpu(element: ET.Element) -> SmiGpu:
    remap = element.find("remapped_rows")
    power = element.find("gpu_power_readings")
    if power is None:
        power = element.find("power_readings")  # DTD v12 and older
    return SmiGpu(
        bus_id=element.get("id", ""),
        name=_text(element, "product_name"),
        uuid=_text(element, "uuid"),
        serial=_text(element, "serial"),
        vbios=_text(element, "vbios_version"),
        memory_total_mib=_integer(_text(element, "fb_memory_usage/total")),
        ecc_mode=_text(element, "ecc_mode/current_ecc") or "N/A",
        ecc_uncorrectable_volatile=_uncorrectable(element.find("ecc_errors"), "volatile"),
        ecc_uncorrectable_aggregate=_uncorrectable(element.find("ecc_errors"), "aggregate"),
        remap_pending=_yes_no(_text(remap, "remapped_row_pending")),
        remap_failure=_yes_no(_text(remap, "remapped_row_failure")),
        pcie_gen_max=_integer(_text(element, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
        pcie_gen_current=_integer(_text(element, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
        pcie_width_max=_integer(_text(element, "pci/pci_gpu_link_info/link_widths/max_link_width")),
        pcie_width_current=_integer(
            _text(element, "pci/pci_gpu_link_info/link_widths/current_link_width")),
        pcie_replay=_integer(_text(element, "pci/replay_counter")),
        persistence_mode=_text(element, "persistence_mode"),
        mig_mode=_text(element, "mig_mode/current_mig") or "N/A",
        power_limit_w=_number(_text(power, "current_power_limit")),
        power_limit_default_w=_number(_text(power, "default_power_limit")),
    )


def parse_nvidia_smi(text: str) -> SmiReport:
    """The `nvidia-smi -q -x` document; ok when it names a driver and every GPU has a UUID."""
    start = text.find("<?xml")
    if start < 0:
        start = text.find("<nvidia_smi_log")
    if start < 0:
        raise ParseError("no <nvidia_smi_log> XML document (expected `nvidia-smi -q -x` output)")
    try:
        root = ET.fromstring(text[start:].strip())
    except ET.ParseError as exc:
        raise ParseError(f"nvidia-smi XML is malformed: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"root element is <{root.tag}>, expected <nvidia_smi_log>")
    gpus = [_gpu(element) for element in root.findall("gpu")]
    driver = _text(root, "driver_version")
    ok = bool(driver) and bool(gpus) and all(gpu.uuid.startswith("GPU-") for gpu in gpus)
    return SmiReport(driver=driver, cuda=_text(root, "cuda_version"),
                     attached_gpus=_integer(_text(root, "attached_gpus")), gpus=gpus, ok=ok)


# ---------------------------------------------------------------- nvidia-smi topo -m

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELLS = re.compile(r"\t+| {2,}")
_DEVICE = re.compile(r"^(GPU|NIC)\d+$")


@dataclass(frozen=True)
class Topology:
    devices: list[str]  # matrix columns in order: GPU0.., NIC0..
    links: dict[str, dict[str, str]]  # row device -> column device -> X, NV18, PIX, NODE, SYS, ...
    numa_affinity: dict[str, str]  # GPU -> its NUMA Affinity cell ("" when not shown)
    nic_names: dict[str, str]  # NIC0 -> mlx5_0, from the NIC Legend
    ok: bool

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]


def topo(transport: Transport) -> Result:
    return transport.run(["nvidia-smi", "topo", "-m"], timeout=QUERY_TIMEOUT_S)


def parse_topo(text: str) -> Topology:
    """The connection matrix of `nvidia-smi topo -m` (or -mp); columns found by their headers."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines)
                      if re.search(r"\bGPU0\b", line) and "Affinity" in line), None)
    if header_at is None:
        raise ParseError("no topology header (GPU0 ... CPU Affinity): not `nvidia-smi topo -m` output")
    columns = [cell for cell in _CELLS.split(lines[header_at].strip()) if cell]
    devices = [cell for cell in columns if _DEVICE.match(cell)]
    extra = columns[len(devices):]
    links: dict[str, dict[str, str]] = {}
    numa: dict[str, str] = {}
    for line in lines[header_at + 1:]:
        cells = [cell.strip() for cell in _CELLS.split(line.strip())]
        if not cells or not _DEVICE.match(cells[0]):
            if links:
                break
            continue
        values = cells[1:1 + len(devices)]
        if len(values) < len(devices):
            raise ParseError(f"topology row {cells[0]} has {len(values)} of {len(devices)} cells")
        links[cells[0]] = dict(zip(devices, values, strict=True))
        attributes = dict(zip(extra, cells[1 + len(devices):], strict=False))
        if cells[0].startswith("GPU"):
            numa[cells[0]] = attributes.get("NUMA Affinity", "")
    nic_names = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), re.M))
    ok = bool(links) and all(links.get(d, {}).get(d) == "X" for d in devices if d in links)
    return Topology(devices, links, numa, nic_names, ok)


def nvlink_pair_problems(topology: Topology, expect: Expectations) -> list[str]:
    """Every GPU pair joined by the profile's bonded set of NVLinks (NV18 on HGX H100/H200)."""
    want = expect.nvlink_links
    if not want:
        return []
    problems = []
    count = expect.gpu_count
    if count is not None and len(topology.gpus) != count:
        problems.append(f"{len(topology.gpus)} GPU(s) in the topology matrix, expected {count}")
    for position, first in enumerate(topology.gpus):
        for second in topology.gpus[position + 1:]:
            link = topology.links.get(first, {}).get(second, "missing")
            if link != f"NV{want}":
                problems.append(f"{first}-{second}: {link}, expected NV{want}")
    return problems


PARSERS = {"nvidia-smi": parse_nvidia_smi, "nvidia-smi-topo": parse_topo}
