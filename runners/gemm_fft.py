"""cuBLAS GEMM and cuFFT throughput per GPU through the node-side torch payload, and its pure parser.

The payload (runners/payloads/gemm_fft.py) measures every GPU in turn: GEMM TFLOP/s for bf16,
fp16, tf32, fp32 and fp64 (n x n x n, 2 n^3 flop) and batched 2D complex64 FFT GFLOP/s
(5 N log2 N flop per transform of N points), each with a numerical check beside it. Without
CUDA it measures the CPU with small shapes (fp32, fp64, FFT only). The parser judges the checks
(sanity) and leaves the figures to the suite.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from runners import payloads
from runners.parsing import ParseError
from runners.transport import Result, Transport

PAYLOAD = "gemm_fft"
DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64")
# Relative (Frobenius) error of a GEMM's corner block against float64 on the same rounded inputs.
# bf16/fp16 outputs round at 2^-8/2^-11 and tf32 rounds its inputs at 2^-11; fp32 and fp64
# accumulate over n terms at their own epsilon. Each bound is far above an honest result and
# far below garbage (a wrong kernel or corrupted data gives errors near 1).
GEMM_ERROR_LIMITS = {"bf16": 2e-2, "fp16": 1e-2, "tf32": 1e-2, "fp32": 1e-4, "fp64": 1e-10}
FFT_ERROR_LIMIT = 1e-3  # complex64 fft2 then ifft2 against the input
GPU_TIMEOUT_S = 900  # eight GPUs in turn, five 8192^3 GEMMs and one FFT each: under a minute at H200 rates
CPU_TIMEOUT_S = 300


@dataclass(frozen=True)
class DeviceFigures:
    """One GPU's (or the CPU's) figures; None where a precision was not measured, with why."""

    index: Optional[int]  # CUDA device index; None for the CPU
    name: str
    gemm_tflops: dict  # dtype -> TFLOP/s or None
    gemm_error: dict  # dtype -> relative error of the checked block
    not_measured: dict  # dtype -> reason
    fft_c64_gflops: Optional[float]
    fft_error: Optional[float]
    bus_id: str = ""  # NVML's form of the GPU's PCI address; "" for the CPU or older payloads
    error: str = ""  # why this GPU has no figures (its CUDA error); the others were measured

    @property
    def label(self) -> str:
        if self.index is None:
            return self.name
        known = ", ".join(part for part in (self.name, self.bus_id) if part)
        return f"GPU {self.index} ({known})" if known else f"GPU {self.index}"

    def problem(self, dtype: str) -> str:
        """Why this device's `dtype` GEMM figure cannot be trusted; '' when it can (or was
        rightly not measured); a GPU that failed says its error."""
        if self.error:
            return f"{self.label}: {self.error}"
        rate, error = self.gemm_tflops[dtype], self.gemm_error.get(dtype)
        if rate is None:
            if dtype in self.not_measured:
                return ""
            return f"{self.label}: {dtype} GEMM has no figure and no reason"
        if error is None or not error <= GEMM_ERROR_LIMITS[dtype]:
            return (f"{self.label}: {dtype} GEMM relative error {error} against float64, "
                    f"expected <= {GEMM_ERROR_LIMITS[dtype]:g}")
        if not rate > 0:
            return f"{self.label}: {dtype} GEMM rate {rate} TFLOP/s"
        return ""

    def fft_problem(self) -> str:
        if self.error:
            return f"{self.label}: {self.error}"
        if self.fft_c64_gflops is None or not self.fft_c64_gflops > 0:
            return f"{self.label}: no FFT figure"
        if self.fft_error is None or not self.fft_error <= FFT_ERROR_LIMIT:
            return (f"{self.label}: FFT round-trip relative error {self.fft_error}, "
                    f"expected <= {FFT_ERROR_LIMIT:g}")
        return ""


@dataclass(frozen=True)
class GemmFftReport:
    hostname: str
    torch: Optional[str]  # None: the node's python cannot import torch
    torch_error: Optional[str]
    device: Optional[str]  # "cuda" or "cpu"
    cuda: Optional[str]
    gemm_size: Optional[int]
    fft_shape: Optional[list]  # batch, nx, ny
    devices: list[DeviceFigures]
    problems: list[str] = field(default_factory=list)
    ok: bool = False

    def slowest(self, dtype: str) -> Optional[DeviceFigures]:
        """The device with the lowest GEMM figure in `dtype`; None when none measured it."""
        measured = [d for d in self.devices if d.gemm_tflops.get(dtype) is not None]
        return min(measured, key=lambda d: d.gemm_tflops[dtype]) if measured else None

    def slowest_fft(self) -> Optional[DeviceFigures]:
        measured = [d for d in self.devices if d.fft_c64_gflops is not None]
        return min(measured, key=lambda d: d.fft_c64_gflops or 0.0) if measured else None


def per_device(report: GemmFftReport, slowest: DeviceFigures, figure: Callable[[DeviceFigures], float],
               unit: str, digits: int) -> str:
    """'slowest GPU 3 (...): 771.2 TFLOP/s; all: GPU 0 (...) 778.1, ...', or the one device's."""
    def shown(device: DeviceFigures) -> str:
        return f"{figure(device):.{digits}g}"

    if len(report.devices) == 1:
        return f"{slowest.label}: {shown(slowest)} {unit}"
    return (f"slowest {slowest.label}: {shown(slowest)} {unit}; all: "
            + ", ".join(f"{device.label} {shown(device)}" for device in report.devices))


def run(transport: Transport, *, gemm_size: Optional[int] = None,
        fft_shape: Optional[tuple[int, int, int]] = None, timeout: float = GPU_TIMEOUT_S) -> Result:
    """The payload on one node; sizes default to the payload's (large on GPUs, small on CPUs)."""
    args = []
    if gemm_size:
        args += ["--gemm-size", str(gemm_size)]
    if fft_shape:
        args += ["--fft-shape", ",".join(map(str, fft_shape))]
    return transport.run_script(payloads.load(PAYLOAD), args, timeout=timeout)


def _number(value) -> Optional[float]:
    return None if value is None else float(value)


def _device(entry: dict) -> DeviceFigures:
    tflops = {dtype: _number(entry["gemm_tflops"].get(dtype)) for dtype in DTYPES}
    return DeviceFigures(
        index=None if entry.get("index") is None else int(entry["index"]), name=str(entry["name"]),
        gemm_tflops=tflops,
        gemm_error={k: float(v) for k, v in (entry.get("gemm_error") or {}).items()},
        not_measured={k: str(v) for k, v in (entry.get("not_measured") or {}).items()},
        fft_c64_gflops=_number(entry.get("fft_c64_gflops")), fft_error=_number(entry.get("fft_error")),
        bus_id=str(entry.get("bus_id") or ""), error=str(entry.get("error") or ""))


def _problems(devices: list[DeviceFigures]) -> list[str]:
    """Why the figures cannot be trusted, in the report's words; empty when they can. A GPU that
    failed is named with its error, once."""
    found = [device.problem(dtype) for device in devices for dtype in DTYPES]
    found += [device.fft_problem() for device in devices]
    return [problem for problem in dict.fromkeys(found) if problem]


def parse_gemm_fft(text: str) -> GemmFftReport:
    """The payload's JSON line (the last one with 'devices'), checks judged into `problems`."""
    data = None
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                candidate = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(candidate, dict) and "devices" in candidate and "torch" in candidate:
                data = candidate
                break
    if data is None:
        raise ParseError("no JSON line with 'torch' and 'devices' (expected the gemm_fft "
                         "payload's output)")
    try:
        devices = [_device(entry) for entry in data["devices"]]
        report = GemmFftReport(
            hostname=str(data.get("hostname", "")), torch=data["torch"],
            torch_error=data.get("torch_error"), device=data.get("device"), cuda=data.get("cuda"),
            gemm_size=data.get("gemm_size"), fft_shape=data.get("fft_shape"), devices=devices)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ParseError(f"gemm_fft payload output lacks or mistypes {exc}") from None
    problems = _problems(devices)
    if report.torch is None:
        problems.insert(0, f"torch cannot be imported: {report.torch_error}")
    elif not devices:
        problems.insert(0, "no device measured")
    return replace(report, problems=problems, ok=not problems)


PARSERS = {"gemm-fft": parse_gemm_fft}
