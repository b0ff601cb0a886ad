"""Node-side: per GPU, HBM device-to-device copy bandwidth and pinned host<->device bandwidth.

    python3 - [--copy-mib 1024] [--pcie-mib 1024] [--iterations 20] [--device cuda|cpu] < gpu_bandwidth.py

Timed with CUDA events around --iterations copies after one warm-up copy; GPUs one after
another, so each host link is measured alone. The HBM figure counts read and write
(2 x bytes per copy), as the H200 fixture's hbm_copy_tbps_rw does. `--device cpu` runs the same
code on the CPU (perf_counter timing, unpinned memory) for the harness's own tests. Prints one
JSON object; without torch or a GPU, {"available": false, "reason": ...} and exit 0.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

MIB = 2**20


def unavailable(reason):
    print(json.dumps({"available": False, "reason": reason}))
    sys.exit(0)


parser = argparse.ArgumentParser(prog="gpu_bandwidth")
parser.add_argument("--copy-mib", type=int, default=1024)
parser.add_argument("--pcie-mib", type=int, default=1024)
parser.add_argument("--iterations", type=int, default=20)
parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
args = parser.parse_args()

try:
    import torch
except ImportError as exc:
    unavailable(f"torch is not installed for {sys.executable}: {exc}")
if args.device == "cuda" and not torch.cuda.is_available():
    unavailable(f"torch {torch.__version__} finds no CUDA device")


def timed_seconds(device, copy):
    """Seconds for --iterations calls of copy() after one warm-up call."""
    copy()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iterations):
            copy()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000
    started = time.perf_counter()
    for _ in range(args.iterations):
        copy()
    return time.perf_counter() - started


def measure(index, device):
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    entry = {"index": index, "name": name, "error": None}
    try:
        copy_bytes, pcie_bytes = args.copy_mib * MIB, args.pcie_mib * MIB
        source = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
        seconds = timed_seconds(device, lambda: target.copy_(source))
        entry["hbm_copy_tbps"] = 2 * copy_bytes * args.iterations / seconds / 1e12
        source = target = None  # free the device memory before the pinned copies
        pinned = device.type == "cuda"
        host = torch.empty(pcie_bytes, dtype=torch.uint8, pin_memory=pinned)
        on_device = torch.empty(pcie_bytes, dtype=torch.uint8, device=device)
        seconds = timed_seconds(device, lambda: on_device.copy_(host, non_blocking=pinned))
        entry["h2d_gbps"] = pcie_bytes * args.iterations / seconds / 1e9
        seconds = timed_seconds(device, lambda: host.copy_(on_device, non_blocking=pinned))
        entry["d2h_gbps"] = pcie_bytes * args.iterations / seconds / 1e9
    except Exception as exc:  # one failing GPU must not hide the others' figures
        entry["error"] = f"{type(exc).__name__}: {exc}"
    return entry


devices = ([torch.device("cuda", i) for i in range(torch.cuda.device_count())]
           if args.device == "cuda" else [torch.device("cpu")])
print(json.dumps({
    "available": True, "torch": torch.__version__, "device_type": devices[0].type,
    "copy_mib": args.copy_mib, "pcie_mib": args.pcie_mib, "iterations": args.iterations,
    "gpus": [measure(index, device) for index, device in enumerate(devices)],
}))
