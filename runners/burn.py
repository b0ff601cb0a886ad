"""GPU burn and GPU bandwidth: run the payloads, parse their JSON, judge with pure functions.

The parser also reads the trace recorded on an H200 (tests/data/h200-1gpu/burn.json: top-level
`gemm_tflops_windows` and `telemetry`) as a one-GPU burn, so the analysis is tested on real data.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from runners import payloads
from runners.nvml import Gpu, GpuFacts
from runners.parsing import ParseError, json_object
from runners.transport import Result, Transport

QUICK_SECONDS = 60
FULL_SECONDS = 600
SETUP_ALLOWANCE_S = 240  # torch import, CUDA context and inputs on 8 GPUs, the matmul phase's start
WARMUP_FRACTION = 0.1  # the first tenth of the windows runs before clocks settle at the power cap
# Operator policy: a GPU sustaining less than this fraction of its node's median is a straggler
# (in data-parallel training every step waits for the slowest GPU).
SLOWEST_OF_MEDIAN_MIN = 0.9

# NVML clocks-event reasons (nvml.h: nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*).
CLOCKS_EVENT_REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
    0x100: "display clock setting",
}
# Under full load the SW power cap is the normal limiter; these mean cooling or power delivery fails.
FAILING_REASONS = 0x8 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True)
class Sample:
    t: float
    phase: str
    temp_c: Optional[int]
    power_w: Optional[float]
    sm_mhz: Optional[int]
    reasons: Optional[int]
    pcie_gen: Optional[int] = None  # the running link under load; None in traces without it
    pcie_width: Optional[int] = None


@dataclass(frozen=True)
class GpuBurn:
    index: int
    name: str
    bus_id: str
    burn_windows: list[float]  # TFLOP/s per window of back-to-back GEMMs
    matmul_windows: list[float]  # TFLOP/s per window of the plain torch.matmul loop
    digests: list[tuple[int, str]]  # (window, digest of the product)
    telemetry: list[Sample]
    error: Optional[str]

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id})" if self.bus_id else f"GPU {self.index}"


@dataclass(frozen=True)
class BurnRun:
    available: bool
    reason: str
    dtype: str
    size: Optional[int]
    gpus: list[GpuBurn]
    telemetry_error: Optional[str]
    ok: bool  # the payload ran: available and no GPU reported an error
    cuda_visible_devices: Optional[str] = None  # as the payload saw it; None: not set


def run(transport: Transport, seconds: float = QUICK_SECONDS, *, extra: tuple[str, ...] = ()) -> Result:
    matmul_seconds = max(5.0, seconds / 10)
    argv = ["--seconds", f"{seconds:g}", "--matmul-seconds", f"{matmul_seconds:g}", *extra]
    return transport.run_script(payloads.load("gpu_burn"), argv,
                                timeout=seconds + matmul_seconds + SETUP_ALLOWANCE_S)


def _sample(raw: dict) -> Sample:
    def number(key):
        value = raw.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    power = number("power_mw")
    return Sample(t=float(raw.get("t", 0.0)), phase=str(raw.get("phase", "burn")), temp_c=number("temp"),
                  power_w=power / 1000 if power is not None else None, sm_mhz=number("sm_mhz"),
                  reasons=number("reasons"), pcie_gen=number("pcie_gen"), pcie_width=number("pcie_width"))


def _gpu(position: int, raw: dict) -> GpuBurn:
    windows = raw.get("gemm_tflops_windows")
    if not isinstance(windows, list):
        raise ParseError(f"GPU entry {position} has no gemm_tflops_windows list")
    return GpuBurn(
        index=int(raw.get("index", position)), name=str(raw.get("name", "")),
        bus_id=str(raw.get("bus_id", "")), burn_windows=[float(w) for w in windows],
        matmul_windows=[float(w) for w in raw.get("matmul_tflops_windows") or []],
        digests=[(int(d["window"]), str(d["digest"])) for d in raw.get("digests") or []],
        telemetry=[_sample(s) for s in raw.get("telemetry") or [] if isinstance(s, dict) and "error" not in s],
        error=raw.get("error"))


def parse_burn(text: str) -> BurnRun:
    data = json_object(text, "GPU burn output")
    if data.get("available") is False:
        return BurnRun(False, str(data.get("reason", "")), "", None, [], None, ok=False)
    if "gemm_tflops_windows" in data and "gpus" not in data:  # the trace recorded on one H200
        data = {"dtype": "bfloat16", "size": 8192, "gpus": [{"index": 0, **data}]}
    if not isinstance(data.get("gpus"), list) or not data["gpus"]:
        raise ParseError("GPU burn output has neither `available: false` nor a non-empty `gpus` list")
    gpus = [_gpu(position, raw) for position, raw in enumerate(data["gpus"])]
    return BurnRun(True, "", str(data.get("dtype", "")), data.get("size"), gpus,
                   data.get("telemetry_error"), ok=not any(gpu.error for gpu in gpus),
                   cuda_visible_devices=data.get("cuda_visible_devices"))


BANDWIDTH_TIMEOUT_S = 300  # torch start-up plus 3 x 21 copies of 1 GiB on each of 8 GPUs
BANDWIDTH_FIGURES = {"hbm_copy_tbps": ("HBM copy", "TB/s"), "h2d_gbps": ("pinned H2D", "GB/s"),
                     "d2h_gbps": ("pinned D2H", "GB/s")}


@dataclass(frozen=True)
class GpuBandwidth:
    index: int
    name: str
    hbm_copy_tbps: Optional[float]  # device-to-device copy, read + write counted
    h2d_gbps: Optional[float]  # pinned host to device
    d2h_gbps: Optional[float]  # device to pinned host
    error: Optional[str]
    bus_id: str = ""  # NVML's form, 00000000:19:00.0; "" from payloads that did not say
    host_numa: Optional[int] = None  # the NUMA node the pinned buffer was allocated on

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id})" if self.bus_id else f"GPU {self.index}"


@dataclass(frozen=True)
class BandwidthRun:
    available: bool
    reason: str
    gpus: list[GpuBandwidth]
    ok: bool
    cuda_visible_devices: Optional[str] = None

    def slowest(self, attribute: str) -> Optional[float]:
        """The lowest figure over the GPUs, or None when any GPU lacks it (a referenced metric fails)."""
        values = [getattr(gpu, attribute) for gpu in self.gpus]
        return None if not values or None in values else min(values)

    def per_gpu(self, attributes: Sequence[str], digits: int) -> str:
        """'0: 4.25, 1: 4.24' or, for two attributes, '0: 55.4/55.3'; '-' where a GPU has no figure;
        a GPU whose bus id the payload gave is named by it ('GPU 0 (00000000:19:00.0): 4.25')."""
        def shown(value: Optional[float]) -> str:
            return "-" if value is None else f"{value:.{digits}f}"

        return ", ".join(f"{gpu.label if gpu.bus_id else gpu.index}: "
                         + "/".join(shown(getattr(gpu, a)) for a in attributes) for gpu in self.gpus)


def bandwidth(transport: Transport, *, extra: tuple[str, ...] = ()) -> Result:
    return transport.run_script(payloads.load("gpu_bandwidth"), list(extra), timeout=BANDWIDTH_TIMEOUT_S)


def parse_bandwidth(text: str) -> BandwidthRun:
    data = json_object(text, "GPU bandwidth output")
    if data.get("available") is False:
        return BandwidthRun(False, str(data.get("reason", "")), [], ok=False)
    if not isinstance(data.get("gpus"), list) or not data["gpus"]:
        raise ParseError("GPU bandwidth output has neither `available: false` nor a `gpus` list")

    def figure(raw, key):
        value = raw.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def numa(raw):
        node = raw.get("host_numa")
        return node.get("node") if isinstance(node, dict) and isinstance(node.get("node"), int) else None

    for position, raw in enumerate(data["gpus"]):
        if not isinstance(raw, dict) or not (raw.get("error") or "hbm_copy_tbps" in raw):
            raise ParseError(f"GPU entry {position} has neither an error nor hbm_copy_tbps")
    gpus = [GpuBandwidth(int(raw.get("index", position)), str(raw.get("name", "")),
                         figure(raw, "hbm_copy_tbps"), figure(raw, "h2d_gbps"), figure(raw, "d2h_gbps"),
                         raw.get("error"), str(raw.get("bus_id") or ""), numa(raw))
            for position, raw in enumerate(data["gpus"])]
    return BandwidthRun(True, "", gpus, ok=not any(gpu.error for gpu in gpus),
                        cuda_visible_devices=data.get("cuda_visible_devices"))


# PCIe transfer rate per lane (GT/s) and line-code efficiency by generation (PCIe base spec:
# 8b/10b for Gen1-2, 128b/130b for Gen3-5, FLIT mode at 242/256 for Gen6).
PCIE_LANE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


def pcie_ceiling_gbps(generation: Optional[int], width: Optional[int]) -> Optional[float]:
    """The link's raw data rate in one direction, GB/s: no copy over it can be faster
    (Gen5 x16: 63.0; the recorded H200 copied 55.4)."""
    if generation not in PCIE_LANE_GTS or not width:
        return None
    return PCIE_LANE_GTS[generation] * PCIE_ENCODING[generation] * width / 8


def hbm_ceiling_tbps(memory_clock_max_mhz: Optional[int], bus_width_bits: Optional[int]) -> Optional[float]:
    """The memory's peak, TB/s: two transfers per clock over the bus (H200: 3201 MHz x 6144 bit =
    4.92, datasheet 4.8). A copy's read plus write cross the same bus, so the figure the payload
    counts (2 x bytes) cannot exceed it (the recorded H200 copied 4.25)."""
    if not memory_clock_max_mhz or not bus_width_bits:
        return None
    return memory_clock_max_mhz * 1e6 * 2 * bus_width_bits / 8 / 1e12


def ceilings(gpu: Optional[Gpu]) -> dict[str, Optional[float]]:
    """Per figure, the most the GPU's own hardware (as NVML describes it) can move."""
    if gpu is None:
        return dict.fromkeys(BANDWIDTH_FIGURES)
    link = pcie_ceiling_gbps(gpu.pcie_gen_max, gpu.pcie_width_max)
    return {"hbm_copy_tbps": hbm_ceiling_tbps(gpu.clock_mem_max_mhz, gpu.memory_bus_width),
            "h2d_gbps": link, "d2h_gbps": link}


def nvml_gpu(facts: GpuFacts, index: int, bus_id: str) -> Optional[Gpu]:
    """The NVML GPU a payload measured: by PCI bus id where both say it, else by index (the
    payloads set CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA's index is NVML's)."""
    if bus_id:
        for gpu in facts.gpus:
            if gpu.bus_id and gpu.bus_id.upper() == bus_id.upper():
                return gpu
        return None
    return next((gpu for gpu in facts.gpus if gpu.index == index), None)


def bandwidth_problems(run: BandwidthRun, attributes: Sequence[str], facts: GpuFacts,
                       limits: Optional[dict[str, Optional[float]]] = None) -> list[str]:
    """Why `attributes`' per-GPU figures cannot be trusted: a GPU's error, a missing figure, or one
    above what its hardware can move (NVML's memory clock and bus width, its PCIe link) or above
    `limits` (the profile's upper bound, per attribute). Events that saw no copy give launch
    times: absurdly high figures, which these bounds catch on every GPU, not just the slowest."""
    problems = [f"{gpu.label}: {gpu.error}" for gpu in run.gpus if gpu.error]
    for gpu in run.gpus:
        if gpu.error:
            continue
        hardware = ceilings(nvml_gpu(facts, gpu.index, gpu.bus_id))
        for attribute in attributes:
            what, unit = BANDWIDTH_FIGURES[attribute]
            value = getattr(gpu, attribute)
            if value is None or not math.isfinite(value) or value <= 0:
                problems.append(f"{gpu.label}: no {what} figure ({value})")
                continue
            for bound, source in ((hardware[attribute], "its hardware's peak"),
                                  ((limits or {}).get(attribute), "the profile's upper bound")):
                if bound is not None and value > bound:
                    problems.append(f"{gpu.label}: {what} {value:.2f} {unit} is above {source} "
                                    f"{bound:.2f} {unit}: the timing saw no copy (or a bad clock)")
                    break
    return problems


def unmeasured_gpus(measured: Sequence[tuple[int, str]], facts: GpuFacts, what: str,
                    cuda_visible_devices: Optional[str]) -> list[str]:
    """The GPUs NVML lists that the payload did not measure, with what hides them: a GPU hidden by
    CUDA_VISIBLE_DEVICES or in MIG mode is left out of CUDA's list, never silently passed.
    `measured` is (index, bus id) per GPU the payload ran on."""
    if len(measured) >= len(facts.gpus):
        return []
    buses = {bus.upper() for _, bus in measured if bus}
    missing = [gpu for gpu in facts.gpus if gpu.bus_id.upper() not in buses] if len(buses) == len(measured) \
        else facts.gpus[len(measured):]
    why = []
    if cuda_visible_devices is not None:
        why.append(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} on the node")
    mig = [gpu.label for gpu in facts.gpus if gpu.mig_current]
    if mig:
        why.append(f"MIG mode on {', '.join(mig)}")
    return [f"NVML lists {len(facts.gpus)} GPU(s), the {what} ran on {len(measured)}: "
            f"{', '.join(gpu.label for gpu in missing)} not measured"
            + (f" ({'; '.join(why)})" if why else " (CUDA does not see them)")]


PARSERS = {"gpu-burn": parse_burn, "gpu-bandwidth": parse_bandwidth}


# ---------------------------------------------------------------- analysis (pure)


def sustained(windows: list[float]) -> Optional[float]:
    """Median TFLOP/s after the warm-up windows (bursts before the power cap bites)."""
    if not windows:
        return None
    skip = int(len(windows) * WARMUP_FRACTION) if len(windows) > 1 else 0
    return statistics.median(windows[skip:])


def decode_reasons(mask: int) -> list[str]:
    return [name for bit, name in CLOCKS_EVENT_REASONS.items() if mask & bit]


@dataclass(frozen=True)
class GpuSummary:
    index: int
    sustained_tflops: Optional[float]
    peak_tflops: Optional[float]
    matmul_tflops: Optional[float]
    burn_vs_matmul_pct: Optional[float]
    max_temp_c: Optional[int]
    max_power_w: Optional[float]
    median_sm_mhz: Optional[float]
    reasons_seen: dict[str, int]  # reason name -> samples during the burn with that bit set
    samples: int
    pcie_gen_min: Optional[int] = None  # the lowest running link during the burn (under load)
    pcie_width_min: Optional[int] = None
    label: str = ""  # "GPU 3 (00000000:3B:00.0)": the GPU's bus id where the payload gave it


@dataclass(frozen=True)
class BurnAnalysis:
    gpus: list[GpuSummary]
    median_tflops: Optional[float]
    min_tflops: Optional[float]
    min_burn_vs_matmul_pct: Optional[float]
    reference_digest: Optional[str]
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = []
        for gpu in self.gpus:
            text = f"{gpu.label or f'GPU {gpu.index}'}: {_fmt(gpu.sustained_tflops)} TFLOP/s"
            if gpu.burn_vs_matmul_pct is not None:
                text += f" ({gpu.burn_vs_matmul_pct:.1f}% of matmul)"
            if gpu.samples:
                text += (f", max {gpu.max_temp_c} C, {_fmt(gpu.max_power_w)} W, SM "
                         f"{_fmt(gpu.median_sm_mhz)} MHz")
            if gpu.pcie_gen_min is not None or gpu.pcie_width_min is not None:
                text += f", PCIe at least Gen{_fmt(gpu.pcie_gen_min)} x{_fmt(gpu.pcie_width_min)} under load"
            if gpu.reasons_seen:
                text += ", " + ", ".join(f"{name} x{count}" for name, count in gpu.reasons_seen.items())
            parts.append(text)
        return "; ".join(parts)


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def summarize(gpu: GpuBurn) -> GpuSummary:
    burn = [s for s in gpu.telemetry if s.phase == "burn"]
    reasons: Counter = Counter()
    for sample in burn:
        reasons.update(decode_reasons(sample.reasons or 0))
    rate, baseline = sustained(gpu.burn_windows), sustained(gpu.matmul_windows)
    temps = [s.temp_c for s in burn if s.temp_c is not None]
    powers = [s.power_w for s in burn if s.power_w is not None]
    clocks = [s.sm_mhz for s in burn if s.sm_mhz is not None]
    generations = [s.pcie_gen for s in burn if s.pcie_gen is not None]
    widths = [s.pcie_width for s in burn if s.pcie_width is not None]
    return GpuSummary(
        index=gpu.index, sustained_tflops=rate,
        peak_tflops=max(gpu.burn_windows) if gpu.burn_windows else None,
        matmul_tflops=baseline,
        burn_vs_matmul_pct=round(100 * rate / baseline, 2) if rate and baseline else None,
        max_temp_c=max(temps) if temps else None, max_power_w=max(powers) if powers else None,
        median_sm_mhz=statistics.median(clocks) if clocks else None,
        reasons_seen=dict(reasons), samples=len(burn),
        pcie_gen_min=min(generations) if generations else None,
        pcie_width_min=min(widths) if widths else None, label=gpu.label)


def throttle_problems(gpu: GpuBurn) -> list[str]:
    """Failing clocks-event reasons, each with how often and when it was first seen."""
    burn = [s for s in gpu.telemetry if s.phase == "burn" and s.reasons is not None]
    problems = []
    for bit, name in CLOCKS_EVENT_REASONS.items():
        if not bit & FAILING_REASONS:
            continue
        hits = [s for s in burn if s.reasons is not None and s.reasons & bit]
        if hits:
            problems.append(f"{gpu.label}: clocks-event reason {name} (0x{bit:x}) in "
                            f"{len(hits)} of {len(burn)} samples, first at t={hits[0].t:g} s "
                            f"({hits[0].temp_c} C, {_fmt(hits[0].power_w)} W)")
    return problems


def majority_digest(counts: Counter, gpus: Iterable[object]) -> tuple[Optional[str], list[str]]:
    """(the digest most checks gave, []), or (None, [why]) when two digests tie for most: the
    reference the same GEMM on the same inputs should give on every GPU of a node."""
    if not counts:
        return None, []
    ranked = counts.most_common(2)
    if len(ranked) == 2 and ranked[0][1] == ranked[1][1]:
        return None, [f"no majority result digest: {len(counts)} different digests in "
                      f"{sum(counts.values())} checks across GPUs {', '.join(map(str, gpus))} "
                      "(silent data corruption on at least one GPU)"]
    return ranked[0][0], []


def digest_problems(gpus: list[GpuBurn]) -> tuple[Optional[str], list[str]]:
    """(reference digest, problems): the majority digest over every GPU and window is the reference;
    a GPU with any other digest computed wrong bits (silent data corruption)."""
    reference, tie = majority_digest(Counter(digest for gpu in gpus for _, digest in gpu.digests),
                                     (gpu.index for gpu in gpus))
    if reference is None:
        return None, tie
    problems = []
    for gpu in gpus:
        bad = [window for window, digest in gpu.digests if digest != reference]
        if bad:
            problems.append(f"{gpu.label}: result differs bit for bit from the reference in "
                            f"{len(bad)} of {len(gpu.digests)} checks (windows "
                            f"{', '.join(map(str, bad[:5]))}{'...' if len(bad) > 5 else ''}): "
                            "silent data corruption")
    return reference, problems


def analyze(run: BurnRun) -> BurnAnalysis:
    summaries = [summarize(gpu) for gpu in run.gpus]
    rates = [s.sustained_tflops for s in summaries if s.sustained_tflops is not None]
    median = statistics.median(rates) if rates else None
    problems = [f"{gpu.label}: {gpu.error}" for gpu in run.gpus if gpu.error]
    for gpu in run.gpus:
        problems.extend(throttle_problems(gpu))
    for summary in summaries:
        if median and summary.sustained_tflops is not None \
                and summary.sustained_tflops < SLOWEST_OF_MEDIAN_MIN * median:
            problems.append(f"{summary.label}: {summary.sustained_tflops:.1f} TFLOP/s sustained, "
                            f"{100 * summary.sustained_tflops / median:.0f}% of the node median "
                            f"{median:.1f}; expected >= {100 * SLOWEST_OF_MEDIAN_MIN:.0f}%")
    reference, sdc = digest_problems(run.gpus)
    ratios = [s.burn_vs_matmul_pct for s in summaries if s.burn_vs_matmul_pct is not None]
    return BurnAnalysis(gpus=summaries, median_tflops=median, min_tflops=min(rates) if rates else None,
                        min_burn_vs_matmul_pct=min(ratios) if ratios else None,
                        reference_digest=reference, problems=problems + sdc)
