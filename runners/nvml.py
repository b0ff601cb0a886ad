"""GPU facts through NVML: probe (runs the gpu_facts payload), parse, and pure evaluations.

Each evaluation takes parsed facts and the profile's Expectations and returns the problems
it found, as sentences naming the GPU (index and bus id), the expected and the found value.
An expectation the profile does not state is not checked.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from inventory.model import Expectations
from runners import payloads
from runners.parsing import ParseError, json_object
from runners.transport import Result, Transport

# NVML start-up on 8 GPUs without persistence mode can take many seconds; then torch's import and
# CUDA contexts for the short load under which the PCIe links are read
PROBE_TIMEOUT_S = 180
MIB = 2**20
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    serial: str
    vbios: str
    inforom: str
    bus_id: str
    memory_total_mib: Optional[int]
    ecc_current: Optional[bool]
    ecc_pending: Optional[bool]
    uncorrectable_volatile: Optional[int]
    uncorrectable_aggregate: Optional[int]
    correctable_volatile: Optional[int]
    correctable_aggregate: Optional[int]
    remap_pending: Optional[bool]  # None: NVML does not support row remapping on this GPU
    remap_failure: Optional[bool]
    retired_pending: Optional[bool]  # None: page retirement not supported (Hopper remaps rows)
    pcie_gen_current: Optional[int]
    pcie_gen_max: Optional[int]
    pcie_width_current: Optional[int]
    pcie_width_max: Optional[int]
    pcie_replay: Optional[int]
    pcie_gen_load: Optional[int]  # read while the GPU was busy; None: no load ran (no torch/CUDA)
    pcie_width_load: Optional[int]
    nvlink_active: Optional[int]  # None: NVML reports no NVLink at all on this GPU
    persistence: Optional[bool]
    mig_current: Optional[bool]
    compute_mode: Optional[str]
    power_limit_mw: Optional[int]
    power_limit_default_mw: Optional[int]
    temp_slowdown: Optional[int]
    temp_shutdown: Optional[int]
    clock_mem_max_mhz: Optional[int] = None  # with the bus width: the memory's peak bandwidth
    memory_bus_width: Optional[int] = None  # bits; None in dumps that predate it
    remapped_uncorrectable: Optional[int] = None  # rows remapped for uncorrectable errors, lifetime
    lost: str = ""  # why NVML could not reach this GPU at all (NVMLError_GpuIsLost: off the bus)

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id})" if self.bus_id else f"GPU {self.index}"


@dataclass(frozen=True)
class GpuFacts:
    available: bool
    reason: str  # why NVML is unavailable; "" when available
    driver: str = ""
    cuda_driver: Optional[int] = None
    gpus: list[Gpu] = field(default_factory=list)
    load_error: str = ""  # why the PCIe links could not be read under load ("" when they were)

    @property
    def reachable(self) -> list[Gpu]:
        """The GPUs NVML could read; a lost one is named by inventory_problems, not judged twice."""
        return [gpu for gpu in self.gpus if not gpu.lost]


def probe(transport: Transport) -> Result:
    return transport.run_script(payloads.load("gpu_facts"), timeout=PROBE_TIMEOUT_S)


def _value(raw: Any) -> Any:
    """None for NVML's {"error": ..., "msg": ...} stand-ins, the value otherwise."""
    return None if isinstance(raw, dict) and "error" in raw else raw


def _int(raw: Any) -> Optional[int]:
    raw = _value(raw)
    return int(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else None


def _flag(raw: Any) -> Optional[bool]:
    raw = _value(raw)
    if isinstance(raw, bool):
        return raw
    return bool(raw) if isinstance(raw, int) else None


def _pair(raw: Any) -> tuple[Optional[bool], Optional[bool]]:
    """(current, pending) of NVML's ECC and MIG mode getters."""
    raw = _value(raw)
    if isinstance(raw, (list, tuple)) and len(raw) == 2:
        return _flag(raw[0]), _flag(raw[1])
    return None, None


def _remapped(raw: Any) -> tuple[Optional[bool], Optional[bool], Optional[int]]:
    """(pending, failure, rows remapped for uncorrectable errors) from a dict, a list, or the tuple
    text "(corr, unc, pending, failure)"."""
    raw = _value(raw)
    if isinstance(raw, dict):
        return _flag(raw.get("pending")), _flag(raw.get("failure")), _int(raw.get("uncorrectable"))
    if isinstance(raw, str):
        raw = [int(n) for n in re.findall(r"\d+", raw)]
    if isinstance(raw, list) and len(raw) == 4:
        return bool(raw[2]), bool(raw[3]), _int(raw[1])
    return None, None, None


def _nvlink_active(links: Any) -> Optional[int]:
    if not isinstance(links, list):
        return None
    states = [_value(link.get("state")) for link in links if isinstance(link, dict)]
    known = [state for state in states if state is not None]
    return sum(1 for state in known if state) if known else None


def _text(raw: Any) -> str:
    raw = _value(raw)
    return "" if raw is None else str(raw)


def _gpu(index: int, raw: dict) -> Gpu:
    memory = _value(raw.get("memory")) or {}
    pci = _value(raw.get("pci")) or {}
    ecc_current, ecc_pending = _pair(raw.get("ecc_mode"))
    mig_current, _ = _pair(raw.get("mig_mode"))
    remap_pending, remap_failure, remapped_uncorrectable = _remapped(raw.get("remapped_rows"))
    total = memory.get("total") if isinstance(memory, dict) else None
    compute = _int(raw.get("compute_mode"))
    return Gpu(
        index=int(raw.get("index", index)),
        name=_text(raw.get("name")),
        uuid=_text(raw.get("uuid")),
        serial=_text(raw.get("serial")),
        vbios=_text(raw.get("vbios")),
        inforom=_text(raw.get("inforom_image")),
        bus_id=str(pci.get("busId", "")) if isinstance(pci, dict) else "",
        memory_total_mib=int(total) // MIB if isinstance(total, int) else None,
        ecc_current=ecc_current,
        ecc_pending=ecc_pending,
        uncorrectable_volatile=_int(raw.get("ecc_dbe_volatile")),
        uncorrectable_aggregate=_int(raw.get("ecc_dbe_aggregate")),
        correctable_volatile=_int(raw.get("ecc_sbe_volatile")),
        correctable_aggregate=_int(raw.get("ecc_sbe_aggregate")),
        remap_pending=remap_pending,
        remap_failure=remap_failure,
        retired_pending=_flag(raw.get("retired_pending")),
        pcie_gen_current=_int(raw.get("pcie_gen_cur")),
        pcie_gen_max=_int(raw.get("pcie_gen_max")),
        pcie_width_current=_int(raw.get("pcie_width_cur")),
        pcie_width_max=_int(raw.get("pcie_width_max")),
        pcie_replay=_int(raw.get("pcie_replay")),
        pcie_gen_load=_int(raw.get("pcie_gen_load")),
        pcie_width_load=_int(raw.get("pcie_width_load")),
        nvlink_active=_nvlink_active(raw.get("nvlink")),
        persistence=_flag(raw.get("persistence")),
        mig_current=mig_current,
        compute_mode=COMPUTE_MODES.get(compute, str(compute)) if compute is not None else None,
        power_limit_mw=_int(raw.get("power_limit_mw")),
        power_limit_default_mw=_int(raw.get("power_limit_default_mw")),
        temp_slowdown=_int(raw.get("temp_slowdown")),
        temp_shutdown=_int(raw.get("temp_shutdown")),
        clock_mem_max_mhz=_int(raw.get("clock_mem_max")),
        memory_bus_width=_int(raw.get("memory_bus_width")),
        remapped_uncorrectable=remapped_uncorrectable,
        lost=f"{raw['error']}: {raw.get('msg', '')}" if isinstance(raw.get("error"), str) else "",
    )


def parse_gpu_facts(text: str) -> GpuFacts:
    data = json_object(text, "GPU facts")
    if data.get("available") is False:
        return GpuFacts(available=False, reason=f"NVML unavailable ({data.get('error')}): "
                                                f"{data.get('reason', '')}")
    if not isinstance(data.get("gpus"), list):
        raise ParseError("GPU facts have neither `available: false` nor a `gpus` list")
    gpus = [_gpu(index, raw) for index, raw in enumerate(data["gpus"])]
    load = data.get("pcie_load")
    load_error = (str(load.get("error") or "") if isinstance(load, dict)
                  else "the probe ran no load (no `pcie_load` in its output)")
    return GpuFacts(available=True, reason="", driver=_text(data.get("driver")),
                    cuda_driver=_int(data.get("cuda_driver")), gpus=gpus, load_error=load_error)


# ---------------------------------------------------------------- evaluations (pure)


def inventory_problems(facts: GpuFacts, expect: Expectations) -> list[str]:
    """GPU count and model as the profile says; a GPU NVML counts but cannot reach is named."""
    problems = [f"{gpu.label}: NVML cannot reach it ({gpu.lost})"
                + (": fallen off the bus (Xid 79)" if "gpuislost" in gpu.lost.lower() else "")
                for gpu in facts.gpus if gpu.lost]
    count = expect.gpu_count
    if count is not None and len(facts.gpus) != count:
        problems.append(f"{len(facts.gpus)} GPU(s) found, expected {count}")
    pattern = expect.gpu_model
    if pattern:
        for gpu in facts.reachable:
            if not re.search(pattern, gpu.name):
                problems.append(f"{gpu.label} is {gpu.name!r}, expected a match for {pattern!r}")
    return problems


def ecc_problems(facts: GpuFacts, expect: Expectations) -> tuple[list[str], list[str]]:
    """(problems, warnings): ECC on, no uncorrectable errors, no pending or failed row remap.

    Correctable errors above the profile's `ecc_correctable_max` are a warning, not a failure.
    Uncorrectable errors since the driver loaded (volatile) fail the GPU. The lifetime (aggregate)
    count fails it only where row remapping cannot vouch for the repair: NVIDIA's GPU Memory Error
    Management guide (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt: "Response to Uncorrectable
    Contained ECC Errors", "Row Remapping", "RMA Policy") says that from Ampere on, the row of an
    uncorrectable error is remapped in hardware at the next GPU reset, persistently and without a
    hole in memory, and that the RMA criterion is the row-remapping failure flag. So lifetime
    uncorrectable errors with rows remapped for them, no remap pending and no remap failure were
    repaired: a warning. Without a remapped row the errors were not repaired that way: a failure.
    """
    problems, warnings = [], []
    limit = expect.ecc_correctable_max
    for gpu in facts.reachable:
        if expect.ecc is not False:
            if gpu.ecc_current is not True:
                problems.append(f"{gpu.label}: ECC is {_state(gpu.ecc_current)}, expected enabled")
            elif gpu.ecc_pending is False:
                problems.append(f"{gpu.label}: ECC will be disabled at the next reset")
        if gpu.uncorrectable_volatile:
            problems.append(f"{gpu.label}: {gpu.uncorrectable_volatile} uncorrectable ECC error(s) (volatile)")
        lifetime = gpu.uncorrectable_aggregate
        if lifetime and remapped_cleanly(gpu):
            warnings.append(f"{gpu.label}: {lifetime} uncorrectable ECC error(s) in its lifetime (aggregate), "
                            f"{gpu.remapped_uncorrectable} row(s) remapped for them, no remap pending, no "
                            "remap failure: repaired in hardware (NVIDIA GPU Memory Error Management)")
        elif lifetime:
            problems.append(f"{gpu.label}: {lifetime} uncorrectable ECC error(s) (aggregate)"
                            + ("; NVML gives no row-remapping state" if gpu.remap_pending is None else ""))
        if gpu.remap_pending:
            problems.append(f"{gpu.label}: a row remap is pending (reset the GPU to apply it)")
        if gpu.remap_failure:
            problems.append(f"{gpu.label}: row remapping failed (RMA candidate)")
        if gpu.retired_pending:
            problems.append(f"{gpu.label}: page retirement is pending (reset the GPU)")
        correctable = gpu.correctable_aggregate
        if limit is not None and correctable is not None and correctable > limit:
            warnings.append(f"{gpu.label}: {correctable} correctable ECC errors (aggregate), "
                            f"above the profile's {limit}")
    return problems, warnings


def remapped_cleanly(gpu: Gpu) -> bool:
    """Rows were remapped for uncorrectable errors, nothing is pending and no remap ever failed."""
    return (gpu.remap_pending is False and gpu.remap_failure is False
            and bool(gpu.remapped_uncorrectable))


def pcie_problems(facts: GpuFacts, expect: Expectations) -> tuple[list[str], list[str]]:
    """(problems, notes): link capability as the profile says, and the link running at it.

    Links train down to a lower generation at idle to save power, so the running link is judged
    on the reading taken under load when there is one: below the maximum generation or width is
    a problem. Without one, the idle reading is judged: width below the maximum is a problem,
    generation below it only a note (it may read low). The first note says which reading it was.
    """
    problems, notes = [], []
    want_gen, want_width = expect.pcie_gen, expect.pcie_width
    loaded = [gpu for gpu in facts.reachable if gpu.pcie_gen_load is not None or gpu.pcie_width_load is not None]
    if facts.reachable:
        notes.append("running link read under load" if len(loaded) == len(facts.reachable) else
                     f"running link read at idle on {len(facts.reachable) - len(loaded)} GPU(s), where it "
                     f"may read low" + (f" ({facts.load_error})" if facts.load_error else ""))
    for gpu in facts.reachable:
        if want_gen is not None and gpu.pcie_gen_max != want_gen:
            problems.append(f"{gpu.label}: PCIe link at most Gen{gpu.pcie_gen_max}, "
                            f"expected Gen{want_gen}")
        if want_width is not None and gpu.pcie_width_max != want_width:
            problems.append(f"{gpu.label}: PCIe link at most x{gpu.pcie_width_max}, "
                            f"expected x{want_width}")
        gen, width = running_link(gpu)
        under_load = gpu.pcie_gen_load is not None or gpu.pcie_width_load is not None
        when = "under load" if under_load else "at idle"
        if width is not None and gpu.pcie_width_max is not None and width < gpu.pcie_width_max:
            problems.append(f"{gpu.label}: PCIe link running x{width} of x{gpu.pcie_width_max} {when}")
        if gen is not None and gpu.pcie_gen_max is not None and gen < gpu.pcie_gen_max:
            if under_load:
                problems.append(f"{gpu.label}: PCIe link running Gen{gen} of Gen{gpu.pcie_gen_max} "
                                "under load")
            else:
                notes.append(f"{gpu.label}: Gen{gen} at idle (idle links train down)")
        if gpu.pcie_replay:
            notes.append(f"WARNING: {gpu.label}: PCIe replay counter at {gpu.pcie_replay} "
                         "(link-level retries: a marginal link, riser or slot)")
    return problems, notes


def running_link(gpu: Gpu) -> tuple[Optional[int], Optional[int]]:
    """(generation, width) the link ran at: under load when read so, else at idle."""
    if gpu.pcie_gen_load is not None or gpu.pcie_width_load is not None:
        return gpu.pcie_gen_load, gpu.pcie_width_load
    return gpu.pcie_gen_current, gpu.pcie_width_current


def nvlink_problems(facts: GpuFacts, expect: Expectations) -> list[str]:
    want = expect.nvlink_links
    if not want:
        return []
    return [f"{gpu.label}: {gpu.nvlink_active or 0} active NVLink(s), expected {want}"
            for gpu in facts.reachable if (gpu.nvlink_active or 0) != want]


def mode_problems(facts: GpuFacts, expect: Expectations) -> list[str]:
    """Persistence, MIG and compute mode; enforced power limit at the default; thresholds set."""
    problems = []
    for gpu in facts.reachable:
        for label, want, found in (("persistence mode", expect.persistence_mode, gpu.persistence),
                                   ("MIG mode", expect.mig_mode, gpu.mig_current)):
            if want is not None and found is not want:
                problems.append(f"{gpu.label}: {label} is {_state(found)}, expected "
                                f"{_state(want)}")
        want_compute = expect.compute_mode
        if want_compute and gpu.compute_mode != want_compute:
            problems.append(f"{gpu.label}: compute mode is {gpu.compute_mode}, expected {want_compute}")
        if gpu.power_limit_mw != gpu.power_limit_default_mw or gpu.power_limit_mw is None:
            problems.append(f"{gpu.label}: enforced power limit {_watts(gpu.power_limit_mw)} differs "
                            f"from the default {_watts(gpu.power_limit_default_mw)}")
        if gpu.temp_slowdown is None or gpu.temp_shutdown is None:
            problems.append(f"{gpu.label}: temperature thresholds missing (slowdown "
                            f"{gpu.temp_slowdown}, shutdown {gpu.temp_shutdown})")
    return problems


def firmware_set(facts: GpuFacts) -> dict[str, str]:
    """What must be uniform across nodes: driver, and the VBIOS and InfoROM set of the GPUs."""
    return {"driver": facts.driver,
            "VBIOS": ",".join(sorted({gpu.vbios for gpu in facts.reachable})),
            "InfoROM": ",".join(sorted({gpu.inforom for gpu in facts.reachable}))}


def mixed_firmware_problems(facts: GpuFacts) -> list[str]:
    """GPUs of one node on different VBIOS or InfoROM versions, each version with its GPUs."""
    problems = []
    for label, version_of in (("VBIOS", lambda gpu: gpu.vbios), ("InfoROM", lambda gpu: gpu.inforom)):
        by_version: dict[str, list[int]] = {}
        for gpu in facts.reachable:
            by_version.setdefault(version_of(gpu), []).append(gpu.index)
        if len(by_version) > 1:
            problems.append(f"GPUs on different {label} versions: " + "; ".join(
                f"{version or 'unknown'} on GPU(s) {', '.join(map(str, indexes))}"
                for version, indexes in sorted(by_version.items())))
    return problems


def _state(value: Optional[bool]) -> str:
    return {True: "enabled", False: "disabled", None: "unknown"}[value]


def _watts(milliwatts: Optional[int]) -> str:
    return "unknown" if milliwatts is None else f"{milliwatts / 1000:g} W"


def ecc_action(problems: list[str]) -> str:
    """What the GPUs' ECC problems call for: a replacement (RMA) for uncorrectable errors or
    a failed row remap, a reset for pending remaps or retirements, a setting for ECC off."""
    words = " ".join(problems)
    if "uncorrectable" in words or "remapping failed" in words:
        return "drain the node and replace the GPU(s) named (RMA): uncorrectable memory errors do not heal"
    if "pending" in words:
        return "reset the GPU(s) named (nvidia-smi -r, or reboot) and re-run; if it comes back, replace the GPU (RMA)"
    return "enable ECC (nvidia-smi -e 1), reset the GPU(s) named, then re-run"
