"""Node-side cuBLAS GEMM and cuFFT throughput through torch, every GPU in turn; prints one JSON line.

    python3 - [--gemm-size 8192] [--fft-shape 64,1024,1024] [--iters 10] [--windows 3]

Per GPU: GEMM TFLOP/s for bf16, fp16, tf32 (fp32 inputs with
torch.backends.cuda.matmul.allow_tf32 on), fp32 (allow_tf32 off) and fp64 on square n x n x n
shapes, 2 n^3 flop per GEMM; and batched 2D complex64 FFT GFLOP/s, 5 N log2(N) flop per
transform of N = nx * ny points (the usual FFT convention, as benchFFT and hpcc's FFT count).
Each figure is the best of `windows` timed windows of `iters` calls after a warm-up, timed with
CUDA events (the ceiling, as the recorded H200's perf.json). GPUs are measured one at a time,
so none shares the node's power or host with another while timed.

Sanity before figures: each GEMM's output is compared with a float64 product of the same
(rounded) inputs on a corner block, and each FFT is inverted and compared with its input;
relative errors are printed beside the figures for the harness to judge.

Without CUDA the same measurements run on the CPU with small shapes (fp32, fp64, FFT);
bf16, fp16 and tf32 are reported as not measured. Without torch: {"torch": null, ...}.

A GPU whose measurement raises (a CUDA error) gets the error in its own entry and the next GPU
is measured. CUDA_DEVICE_ORDER=PCI_BUS_ID is set before torch starts CUDA, so "GPU 3" is NVML's
GPU 3, and each entry carries its PCI bus id.
"""
import argparse
import json
import math
import os
import socket
import sys
import time

from .torch_import import import_torch

os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # before torch initialises CUDA: indices = NVML's

GPU_GEMM_SIZE = 8192
GPU_FFT_SHAPE = (64, 1024, 1024)  # batch, nx, ny: 512 MiB of complex64
CPU_GEMM_SIZE = 512
CPU_FFT_SHAPE = (8, 256, 256)
CHECK_BLOCK = 64  # the corner of the GEMM output compared with float64
DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64")
GPU_ONLY = ("bf16", "fp16", "tf32")  # reduced-precision tensor-core paths: meaningless on a CPU


def arguments():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gemm-size", type=int, default=None)
    parser.add_argument("--fft-shape", default=None, help="batch,nx,ny")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    return parser.parse_args()


class Timer:
    """Seconds of a block of device work: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, torch, device):
        self.torch, self.device = torch, device

    def seconds(self, work, iters):
        if self.device.type == "cuda":
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                work()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        started = time.perf_counter()
        for _ in range(iters):
            work()
        return time.perf_counter() - started


def best_rate(timer, work, flop, args):
    """flop/s of the fastest window, after a warm-up."""
    for _ in range(args.warmup):
        work()
    fastest = min(timer.seconds(work, args.iters) for _ in range(args.windows))
    return flop * args.iters / fastest


def gemm(torch, device, timer, name, n, args):
    """TFLOP/s of an n^3 GEMM in `name`'s precision, and its relative error on a corner block."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
             "fp32": torch.float32, "fp64": torch.float64}[name]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    generator = torch.Generator(device=device).manual_seed(1234)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    out = torch.empty(n, n, device=device, dtype=dtype)
    rate = best_rate(timer, lambda: torch.matmul(a, b, out=out), 2 * n ** 3, args)
    block = min(CHECK_BLOCK, n)
    reference = a[:block].double() @ b[:, :block].double()
    error = float(torch.linalg.norm(out[:block, :block].double() - reference)
                  / torch.linalg.norm(reference))
    a = b = out = None  # free the device memory before the next dtype
    return rate / 1e12, error


def fft(torch, device, timer, shape, args):
    """GFLOP/s of a batched 2D complex64 FFT (5 N log2 N per transform) and its round-trip error."""
    batch, nx, ny = shape
    generator = torch.Generator(device=device).manual_seed(1234)
    data = torch.randn(batch, nx, ny, device=device, dtype=torch.complex64, generator=generator)
    points = nx * ny
    flop = 5 * points * math.log2(points) * batch
    rate = best_rate(timer, lambda: torch.fft.fft2(data), flop, args)
    back = torch.fft.ifft2(torch.fft.fft2(data))
    error = float(torch.linalg.norm(back - data) / torch.linalg.norm(data))
    data = back = None  # free the device memory
    return rate / 1e9, error


def measure(torch, device, name, gemm_size, fft_shape, args):
    timer = Timer(torch, device)
    entry = {"index": device.index if device.type == "cuda" else None, "name": name,
             "gemm_tflops": {}, "gemm_error": {}, "not_measured": {}}
    for dtype in DTYPES:
        if device.type == "cpu" and dtype in GPU_ONLY:
            entry["gemm_tflops"][dtype] = None
            entry["not_measured"][dtype] = "not measured on CPU"
            continue
        rate, error = gemm(torch, device, timer, dtype, gemm_size, args)
        entry["gemm_tflops"][dtype], entry["gemm_error"][dtype] = rate, error
    entry["fft_c64_gflops"], entry["fft_error"] = fft(torch, device, timer, fft_shape, args)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def bus_id_of(torch, device):
    """NVML's form of the GPU's PCI address (00000000:19:00.0); '' where torch does not say."""
    properties = torch.cuda.get_device_properties(device)
    bus = getattr(properties, "pci_bus_id", None)
    if bus is None:
        return ""
    domain, slot = getattr(properties, "pci_domain_id", 0), getattr(properties, "pci_device_id", 0)
    return f"{domain:08X}:{bus:02X}:{slot:02X}.0"


def measure_device(torch, device, gemm_size, fft_shape, args):
    """One device's entry; its own error instead of figures when it fails (a GPU's CUDA error)."""
    gpu = device.type == "cuda"
    try:
        if gpu:
            torch.cuda.set_device(device)
        entry = measure(torch, device, torch.cuda.get_device_name(device) if gpu else "cpu",
                        gemm_size, fft_shape, args)
        entry["bus_id"] = bus_id_of(torch, device) if gpu else ""
        return entry
    except Exception as exc:  # one bad GPU is that GPU's failure; the next one is measured
        return {"index": device.index if gpu else None, "name": "" if gpu else "cpu", "bus_id": "",
                "gemm_tflops": {}, "gemm_error": {}, "not_measured": {},
                "error": f"{type(exc).__name__}: {exc}"}


def main():
    args = arguments()
    report = {"hostname": socket.gethostname(), "python": sys.executable, "torch": None,
              "cuda": None, "device": None, "devices": []}
    try:
        torch = import_torch()
    except ImportError as exc:
        report["torch_error"] = str(exc)
        print(json.dumps(report), flush=True)
        return
    report["torch"] = torch.__version__
    gpu = torch.cuda.is_available()
    gemm_size = args.gemm_size or (GPU_GEMM_SIZE if gpu else CPU_GEMM_SIZE)
    fft_shape = tuple(int(v) for v in args.fft_shape.split(",")) if args.fft_shape else (
        GPU_FFT_SHAPE if gpu else CPU_FFT_SHAPE)
    report.update(device="cuda" if gpu else "cpu", cuda=torch.version.cuda if gpu else None,
                  gemm_size=gemm_size, fft_shape=list(fft_shape), iters=args.iters,
                  windows=args.windows)
    if gpu:
        report["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        for index in range(torch.cuda.device_count()):
            report["devices"].append(measure_device(torch, torch.device("cuda", index), gemm_size,
                                                    fft_shape, args))
    else:
        report["threads"] = torch.get_num_threads()
        report["devices"].append(measure_device(torch, torch.device("cpu"), gemm_size, fft_shape, args))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # one line on stderr names the node and the failure
        print(f"gemm_fft payload on {socket.gethostname()}: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        sys.exit(1)
