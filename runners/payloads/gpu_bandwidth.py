"""Node-side: per GPU, HBM device-to-device copy bandwidth and pinned host<->device bandwidth.

    python3 - [--copy-mib 1024] [--pcie-mib 1024] [--iterations 20] [--device cuda|cpu] < gpu_bandwidth.py

Timed with CUDA events around --iterations copies after one warm-up copy; GPUs one after
another, so each host link is measured alone. Each GPU's copies run under its own device
(torch.cuda.device) and its events are recorded on that GPU's current stream: events on another
GPU's stream would see none of the copies and time only their launch. The HBM figure counts read
and write (2 x bytes per copy), as the H200 fixture's hbm_copy_tbps_rw does.

Each GPU's pinned host buffer is allocated while this process runs on the CPUs of the GPU's NUMA
node (sysfs numa_node of its PCI bus id), so its pages are local to the GPU's root complex as a
NUMA-aware job's would be; the buffers are kept until every GPU is done, so torch's pinned-memory
cache cannot hand one GPU's pages to the next. `host_numa` says which node or why none.

CUDA_DEVICE_ORDER=PCI_BUS_ID is set before torch starts CUDA, so CUDA's index is NVML's; each
GPU's entry carries its PCI bus id. `--device cpu` runs the same code on the CPU (perf_counter
timing, unpinned memory) for the harness's own tests. Prints one JSON object; without torch or a
GPU, {"available": false, "reason": ...} and exit 0.
"""
import argparse
import json
import os
import sys
import time

from .torch_import import import_torch

os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # before torch initialises CUDA: indices = NVML's

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
    torch = import_torch()
except ImportError as exc:
    unavailable(f"torch is not installed for {sys.executable}: {exc}")
if args.device == "cuda" and not torch.cuda.is_available():
    unavailable(f"torch {torch.__version__} finds no CUDA device")


def bus_id_of(device):
    """NVML's form of the GPU's PCI address (00000000:19:00.0); '' where torch does not say."""
    properties = torch.cuda.get_device_properties(device)
    bus = getattr(properties, "pci_bus_id", None)
    if bus is None:
        return ""
    domain, slot = getattr(properties, "pci_domain_id", 0), getattr(properties, "pci_device_id", 0)
    return f"{domain:08X}:{bus:02X}:{slot:02X}.0"


def numa_cpus(bus_id):
    """(node, CPUs of that node) for the GPU's PCI device, or (None, why not)."""
    if not bus_id:
        return None, "no PCI bus id from torch"
    address = bus_id[-12:].lower()  # sysfs spells the domain with 4 digits: 0000:19:00.0
    try:
        with open(f"/sys/bus/pci/devices/{address}/numa_node") as handle:
            node = int(handle.read())
        if node < 0:
            return None, f"{address} has no NUMA node (numa_node {node})"
        with open(f"/sys/devices/system/node/node{node}/cpulist") as handle:
            ranges = handle.read().strip()
    except (OSError, ValueError) as exc:
        return None, f"NUMA node of {address} unknown: {exc}"
    cpus = set()
    for part in filter(None, ranges.split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return node, cpus


def pinned_near(device, nbytes):
    """(pinned host buffer, host_numa) with the buffer's pages faulted in on the GPU's NUMA node."""
    node, cpus = numa_cpus(bus_id_of(device))
    before = os.sched_getaffinity(0)
    if node is not None and not cpus & before:
        node, cpus = None, f"NUMA node {node}'s CPUs are outside this process's CPU set"
    if node is None:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), {"node": None, "why": cpus}
    try:
        os.sched_setaffinity(0, cpus & before)
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    finally:
        os.sched_setaffinity(0, before)
    return buffer, {"node": node, "why": ""}


def timed_seconds(device, copy):
    """Seconds for --iterations calls of copy() after one warm-up call, on `device` itself."""
    copy()
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        stream.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(args.iterations):
            copy()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1000
    started = time.perf_counter()
    for _ in range(args.iterations):
        copy()
    return time.perf_counter() - started


def rate(nbytes, seconds):
    """Bytes per second, or None for a time no copy can take (zero: the events saw nothing)."""
    return nbytes / seconds if seconds > 0 else None


def measure(index, device, kept):
    entry = {"index": index, "name": "cpu", "bus_id": "", "error": None}
    try:
        if device.type == "cuda":
            entry.update(name=torch.cuda.get_device_name(device), bus_id=bus_id_of(device))
        copy_bytes, pcie_bytes = args.copy_mib * MIB, args.pcie_mib * MIB
        source = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
        seconds = timed_seconds(device, lambda: target.copy_(source))
        hbm = rate(2 * copy_bytes * args.iterations, seconds)
        entry["hbm_copy_tbps"] = hbm / 1e12 if hbm else None
        source = target = None  # free the device memory before the pinned copies
        pinned = device.type == "cuda"
        if pinned:
            host, entry["host_numa"] = pinned_near(device, pcie_bytes)
            kept.append(host)
        else:
            host = torch.empty(pcie_bytes, dtype=torch.uint8)
        on_device = torch.empty(pcie_bytes, dtype=torch.uint8, device=device)
        for key, copy in (("h2d_gbps", lambda: on_device.copy_(host, non_blocking=pinned)),
                          ("d2h_gbps", lambda: host.copy_(on_device, non_blocking=pinned))):
            moved = rate(pcie_bytes * args.iterations, timed_seconds(device, copy))
            entry[key] = moved / 1e9 if moved else None
    except Exception as exc:  # one failing GPU must not hide the others' figures
        entry["error"] = f"{type(exc).__name__}: {exc}"
    return entry


def measure_all():
    if args.device == "cpu":
        return [measure(0, torch.device("cpu"), [])]
    kept, entries = [], []
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        try:
            with torch.cuda.device(device):
                entries.append(measure(index, device, kept))
        except Exception as exc:  # a GPU whose context cannot even be made current
            entries.append({"index": index, "name": "", "bus_id": "", "error": f"{type(exc).__name__}: {exc}"})
    return entries


print(json.dumps({
    "available": True, "torch": torch.__version__, "device_type": args.device,
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "copy_mib": args.copy_mib, "pcie_mib": args.pcie_mib, "iterations": args.iterations,
    "gpus": measure_all(),
}))
