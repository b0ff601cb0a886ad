"""Node-side: back-to-back GEMMs on every GPU at once, NVML telemetry each second, SDC digests.

    python3 - [--seconds 60] [--matmul-seconds 10] [--size 8192] [--dtype bfloat16]
              [--device cuda|cpu] [--window 50] [--digest-every 4] < gpu_burn.py

Every GPU multiplies the same seeded inputs for --seconds, timing windows of --window GEMMs
(TFLOP/s per window); every --digest-every windows it takes a bit-exact digest of the product.
The same GEMM on the same inputs gives the same bits on GPUs of one model and software stack,
so digests that differ across GPUs or iterations are silent data corruption. Then a plain
torch.matmul loop runs for --matmul-seconds on every GPU (same heat, same power cap): the
burn's own overhead is judged against it. A GPU whose setup or GEMMs raise (a CUDA error) has
that error in its entry and drops out; the others run both phases. `--device cpu` runs the same code on the CPU with
tiny sizes, for the harness's own tests. Prints one JSON object; without torch or a GPU,
{"available": false, "reason": ...} and exit 0.
"""
import argparse
import json
import os
import sys
import threading
import time

from .torch_import import import_torch

os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # before torch starts CUDA: its indices = NVML's


def unavailable(reason):
    print(json.dumps({"available": False, "reason": reason}))
    sys.exit(0)


def arguments():
    parser = argparse.ArgumentParser(prog="gpu_burn")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--matmul-seconds", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--window", type=int, default=50, help="GEMMs per timed window")
    parser.add_argument("--digest-every", type=int, default=4, help="windows between digests")
    parser.add_argument("--sample-interval", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=20261130)
    return parser.parse_args()


args = arguments()
try:
    torch = import_torch()
except ImportError as exc:
    unavailable(f"torch is not installed for {sys.executable}: {exc}")

if args.device == "cuda":
    if not torch.cuda.is_available():
        unavailable(f"torch {torch.__version__} finds no CUDA device")
    DEVICES = [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
else:
    DEVICES = [torch.device("cpu")]
DTYPE = getattr(torch, args.dtype)
BITS = {2: torch.int16, 4: torch.int32}[torch.empty((), dtype=DTYPE).element_size()]
FLOPS_PER_GEMM = 2 * args.size ** 3


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe(device):
    if device.type != "cuda":
        return "cpu", ""
    properties = torch.cuda.get_device_properties(device)
    bus = getattr(properties, "pci_bus_id", None)
    domain = getattr(properties, "pci_domain_id", 0)
    device_id = getattr(properties, "pci_device_id", 0)
    bus_id = f"{domain:08X}:{bus:02X}:{device_id:02X}.0" if bus is not None else ""
    return properties.name, bus_id


def digest(product, weights):
    """Bit-exact: the sum and a position-weighted sum of the result's raw bits."""
    bits = product.view(BITS).reshape(-1).to(torch.int64)
    plain = int(bits.sum().item()) & 0xFFFFFFFFFFFFFFFF
    weighted = int((bits * weights).sum().item()) & 0xFFFFFFFFFFFFFFFF
    return f"{plain:016x}{weighted:016x}"


class Worker:
    """One device: inputs made once from the shared seed, then timed GEMM windows."""

    def __init__(self, index, device):
        self.index, self.device = index, device
        self.name, self.bus_id = "", ""
        self.burn_windows, self.matmul_windows, self.digests = [], [], []
        self.error = None
        try:
            self.name, self.bus_id = describe(device)
            self.prepare()
        except Exception as exc:  # this GPU's CUDA error is this GPU's failure
            self.error = f"setup: {type(exc).__name__}: {exc}"

    def prepare(self):
        device = self.device
        generator = torch.Generator().manual_seed(args.seed)
        a = torch.randn(args.size, args.size, generator=generator)
        b = torch.randn(args.size, args.size, generator=generator)
        self.a, self.b = a.to(device=device, dtype=DTYPE), b.to(device=device, dtype=DTYPE)
        self.c = torch.empty(args.size, args.size, device=device, dtype=DTYPE)
        self.weights = (torch.arange(args.size * args.size, device=device, dtype=torch.int64)
                        % 65521) + 1

    def window_tflops(self, started):
        synchronize(self.device)
        tflops = FLOPS_PER_GEMM * args.window / (time.perf_counter() - started) / 1e12
        return float(f"{tflops:.6g}")  # significant digits: a slow device's rate never rounds to 0

    def burn(self, seconds):
        deadline, window = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            started = time.perf_counter()
            for _ in range(args.window):
                torch.matmul(self.a, self.b, out=self.c)
            if window % args.digest_every == 0:
                self.digests.append({"window": window, "digest": digest(self.c, self.weights)})
            self.burn_windows.append(self.window_tflops(started))
            window += 1

    def matmul(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            for _ in range(args.window):
                product = torch.matmul(self.a, self.b)
            del product
            self.matmul_windows.append(self.window_tflops(started))

    def run(self, phase, seconds, barrier):
        try:
            barrier.wait()
            getattr(self, phase)(seconds)
        except Exception as exc:  # a CUDA error on one GPU must not hide the others' results
            self.error = f"{phase}: {type(exc).__name__}: {exc}"


class Telemetry(threading.Thread):
    """NVML samples of every GPU each interval: temperature, power, clocks, reasons, and the
    PCIe link generation and width as they run under load."""

    def __init__(self, workers):
        super().__init__(daemon=True)
        self.workers, self.phase, self.error = workers, "setup", None
        self.samples = {worker.index: [] for worker in workers}
        self.stopped = threading.Event()
        self.started_at = time.monotonic()

    def handles(self, pynvml):
        handles = {}
        for worker in self.workers:
            try:
                try:
                    handles[worker.index] = pynvml.nvmlDeviceGetHandleByPciBusId(worker.bus_id)
                except pynvml.NVMLError:  # no bus id from torch: CUDA_DEVICE_ORDER makes indices agree
                    handles[worker.index] = pynvml.nvmlDeviceGetHandleByIndex(worker.index)
            except pynvml.NVMLError as exc:  # a lost GPU: no samples for it, the others sampled
                self.samples[worker.index].append({"t": 0.0, "phase": self.phase,
                                                   "error": f"{type(exc).__name__}: {exc}"})
        return handles

    def run(self):
        if DEVICES[0].type != "cuda":
            self.error = "no NVML telemetry on the CPU device"
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            handles = self.handles(pynvml)
        except Exception as exc:
            self.error = f"NVML telemetry unavailable: {type(exc).__name__}: {exc}"
            return
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        while not self.stopped.wait(args.sample_interval):
            now = round(time.monotonic() - self.started_at, 2)
            for index, handle in handles.items():
                try:
                    utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
                    self.samples[index].append({
                        "t": now, "phase": self.phase,
                        "temp": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                        "power_mw": pynvml.nvmlDeviceGetPowerUsage(handle),
                        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        "mem_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                        "util": {"gpu": utilization.gpu, "memory": utilization.memory},
                        "reasons": reasons(handle),
                        "pcie_gen": optional(pynvml, pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                        "pcie_width": optional(pynvml, pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle)})
                except pynvml.NVMLError as exc:
                    self.samples[index].append({"t": now, "phase": self.phase,
                                                "error": f"{type(exc).__name__}: {exc}"})
        pynvml.nvmlShutdown()


def optional(pynvml, getter, handle):
    """A reading some GPUs or drivers do not give (NotSupported): None instead of losing the sample."""
    try:
        return getter(handle)
    except pynvml.NVMLError:
        return None


def run_phase(workers, telemetry, phase, seconds):
    """The phase on every worker still without an error, all at once."""
    workers = [worker for worker in workers if worker.error is None]
    if not workers:
        return
    telemetry.phase = phase
    barrier = threading.Barrier(len(workers))
    threads = [threading.Thread(target=w.run, args=(phase, seconds, barrier)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


workers = [Worker(index, device) for index, device in enumerate(DEVICES)]
telemetry = Telemetry(workers)
telemetry.start()
run_phase(workers, telemetry, "burn", args.seconds)
run_phase(workers, telemetry, "matmul", args.matmul_seconds)
telemetry.stopped.set()
telemetry.join(timeout=10)
print(json.dumps({
    "available": True,
    "torch": torch.__version__,
    "device_type": DEVICES[0].type,
    "dtype": args.dtype,
    "size": args.size,
    "window_gemms": args.window,
    "digest_every": args.digest_every,
    "seconds": args.seconds,
    "matmul_seconds": args.matmul_seconds,
    "telemetry_error": telemetry.error,
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "gpus": [{"index": w.index, "name": w.name, "bus_id": w.bus_id,
              "gemm_tflops_windows": w.burn_windows, "matmul_tflops_windows": w.matmul_windows,
              "digests": w.digests, "telemetry": telemetry.samples[w.index], "error": w.error}
             for w in workers],
}))
