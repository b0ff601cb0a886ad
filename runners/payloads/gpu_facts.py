"""Node-side: per-GPU facts through NVML (pynvml, from nvidia-ml-py) as one JSON object.

Runs with the node's own Python. Without pynvml, or without the NVIDIA driver's libnvidia-ml,
it prints {"available": false, "error": ..., "reason": ...} and exits 0: the suite decides from
the profile whether that is a skip (CPU-only) or a failure (GPU SKU).
A field NVML cannot give on this GPU is {"error": "NVMLError_NotSupported", "msg": ...}, never
a guess. The shape follows a pynvml dump recorded on an H200 (tests/data/h200-1gpu/nvml.json).
Where torch and CUDA are present, each GPU also gets `pcie_gen_load` and `pcie_width_load`, read
during a short load (top-level `pcie_load` says how long, or why not).
"""
import json
import os
import sys
import threading
import time

from .torch_import import import_torch

LOAD_SECONDS = 2.0  # busy time before the under-load PCIe reading, after every GPU has started
LOAD_START_TIMEOUT_S = 60.0  # CUDA contexts on 8 GPUs


def unavailable(error, reason):
    print(json.dumps({"available": False, "error": error, "reason": reason}))
    sys.exit(0)


try:
    import pynvml
except ImportError as exc:
    unavailable(type(exc).__name__,
                f"pynvml is not installed for {sys.executable} (pip install nvidia-ml-py): {exc}")


def text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def attempt(function, *args):
    """The call's value, or what NVML said instead (NotSupported on this GPU is common)."""
    try:
        return plain(function(*args))
    except pynvml.NVMLError as exc:
        return {"error": type(exc).__name__, "msg": str(exc)}


def plain(value):
    """JSON-ready: bytes to text, NVML structs to dicts, tuples to lists."""
    value = text(value)
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "_fields_"):
        return {name: plain(getattr(value, name)) for name, _ in value._fields_}
    return value


def nvlink_states(handle):
    """State of each NVLink until the first link NVML does not know (fewer links, or none)."""
    links = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = attempt(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        links.append({"link": link, "state": state})
        if isinstance(state, dict):
            break
    return links


def clocks_event_reasons(handle):
    getter = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return attempt(getter, handle)


def gpu(index):
    """The GPU's facts; a GPU NVML cannot even open (NVMLError_GpuIsLost: fallen off the bus) is
    {"index", "error", "msg"}, so the others keep theirs."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as exc:
        return {"index": index, "error": type(exc).__name__, "msg": str(exc)}
    remapped = attempt(pynvml.nvmlDeviceGetRemappedRows, handle)
    if isinstance(remapped, list):
        remapped = dict(zip(("correctable", "uncorrectable", "pending", "failure"), remapped))
    ecc_total = pynvml.nvmlDeviceGetTotalEccErrors
    return {
        "index": index,
        "name": attempt(pynvml.nvmlDeviceGetName, handle),
        "uuid": attempt(pynvml.nvmlDeviceGetUUID, handle),
        "serial": attempt(pynvml.nvmlDeviceGetSerial, handle),
        "board_part": attempt(pynvml.nvmlDeviceGetBoardPartNumber, handle),
        "vbios": attempt(pynvml.nvmlDeviceGetVbiosVersion, handle),
        "inforom_image": attempt(pynvml.nvmlDeviceGetInforomImageVersion, handle),
        "pci": attempt(pynvml.nvmlDeviceGetPciInfo, handle),
        "pcie_gen_cur": attempt(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "pcie_gen_max": attempt(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        "pcie_gen_gpu_max": attempt(pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle),
        "pcie_width_cur": attempt(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        "pcie_width_max": attempt(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        "pcie_replay": attempt(pynvml.nvmlDeviceGetPcieReplayCounter, handle),
        "memory": attempt(pynvml.nvmlDeviceGetMemoryInfo, handle),
        "ecc_mode": attempt(pynvml.nvmlDeviceGetEccMode, handle),
        "ecc_dbe_volatile": attempt(ecc_total, handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                    pynvml.NVML_VOLATILE_ECC),
        "ecc_sbe_volatile": attempt(ecc_total, handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                    pynvml.NVML_VOLATILE_ECC),
        "ecc_dbe_aggregate": attempt(ecc_total, handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                     pynvml.NVML_AGGREGATE_ECC),
        "ecc_sbe_aggregate": attempt(ecc_total, handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                     pynvml.NVML_AGGREGATE_ECC),
        "remapped_rows": remapped,
        "retired_pages_dbe": attempt(
            lambda h: len(pynvml.nvmlDeviceGetRetiredPages(
                h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)), handle),
        "retired_pending": attempt(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle),
        "temp_gpu": attempt(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
        "temp_slowdown": attempt(pynvml.nvmlDeviceGetTemperatureThreshold, handle,
                                 pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "temp_shutdown": attempt(pynvml.nvmlDeviceGetTemperatureThreshold, handle,
                                 pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        "temp_mem_max": attempt(pynvml.nvmlDeviceGetTemperatureThreshold, handle,
                                pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
        "power_usage_mw": attempt(pynvml.nvmlDeviceGetPowerUsage, handle),
        "power_limit_mw": attempt(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle),
        "power_limit_default_mw": attempt(pynvml.nvmlDeviceGetPowerManagementDefaultLimit, handle),
        "power_limit_range_mw": attempt(pynvml.nvmlDeviceGetPowerManagementLimitConstraints, handle),
        "clock_sm_max": attempt(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "clock_mem_max": attempt(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
        "memory_bus_width": attempt(pynvml.nvmlDeviceGetMemoryBusWidth, handle),
        "clock_sm_cur": attempt(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "clock_mem_cur": attempt(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
        "clocks_event_reasons": clocks_event_reasons(handle),
        "persistence": attempt(pynvml.nvmlDeviceGetPersistenceMode, handle),
        "compute_mode": attempt(pynvml.nvmlDeviceGetComputeMode, handle),
        "mig_mode": attempt(pynvml.nvmlDeviceGetMigMode, handle),
        "perf_state": attempt(pynvml.nvmlDeviceGetPerformanceState, handle),
        "utilization": attempt(pynvml.nvmlDeviceGetUtilizationRates, handle),
        "cuda_cc": attempt(pynvml.nvmlDeviceGetCudaComputeCapability, handle),
        "minor": attempt(pynvml.nvmlDeviceGetMinorNumber, handle),
        "nvlink": nvlink_states(handle),
    }


def pcie_under_load(count):
    """Current PCIe generation and width of every GPU read while torch keeps it busy.

    Links train down at idle, so the idle reading may be low on a healthy GPU. GEMMs and pinned
    host-to-device copies on every GPU at once for LOAD_SECONDS, then NVML is read while they run.
    Returns ({"seconds": ..., "error": ...}, {index: {"pcie_gen_load": ..., "pcie_width_load": ...}});
    without torch or CUDA the error says why and the suite judges the idle reading.
    """
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # before torch starts CUDA: its indices = NVML's
    try:
        torch = import_torch()
    except ImportError as exc:
        return {"seconds": 0, "error": f"torch is not installed for {sys.executable}: {exc}"}, {}
    except Exception as exc:  # a broken CUDA install can fail the import itself
        return {"seconds": 0, "error": f"torch cannot be imported: {type(exc).__name__}: {exc}"}, {}
    if not torch.cuda.is_available() or torch.cuda.device_count() != count:
        return {"seconds": 0, "error": f"torch {torch.__version__} sees {torch.cuda.device_count()} "
                                       f"CUDA device(s), NVML {count}"}, {}
    stop, errors = threading.Event(), {}
    started = [threading.Event() for _ in range(count)]

    def busy(index):
        try:
            device = torch.device("cuda", index)
            matrix = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
            host = torch.empty(64 * 2**20, dtype=torch.uint8).pin_memory()
            target = torch.empty(host.shape, dtype=torch.uint8, device=device)
            while not stop.is_set():
                for _ in range(8):
                    torch.matmul(matrix, matrix)
                target.copy_(host, non_blocking=True)
                torch.cuda.synchronize(device)
                started[index].set()
        except Exception as exc:  # one GPU's CUDA error must not hide the others' readings
            errors[index] = f"{type(exc).__name__}: {exc}"
            started[index].set()

    threads = [threading.Thread(target=busy, args=(index,), daemon=True) for index in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + LOAD_START_TIMEOUT_S
    for event in started:
        event.wait(max(0.0, deadline - time.monotonic()))
    time.sleep(LOAD_SECONDS)
    readings = {}
    for index in range(count):
        if index in errors or not started[index].is_set():
            error = errors.setdefault(index, f"not busy within {LOAD_START_TIMEOUT_S:g} s")
            readings[index] = {"pcie_gen_load": {"error": "load", "msg": error},
                               "pcie_width_load": {"error": "load", "msg": error}}
            continue
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:  # lost since the facts were read: this GPU's reading only
            errors[index] = f"{type(exc).__name__}: {exc}"
            continue
        readings[index] = {
            "pcie_gen_load": attempt(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            "pcie_width_load": attempt(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle)}
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    failed = "; ".join(f"GPU {index}: {error}" for index, error in sorted(errors.items()))
    return {"seconds": LOAD_SECONDS, "error": failed or None}, readings


try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:
    unavailable(type(exc).__name__, f"NVML cannot start: {exc}")

try:
    count = pynvml.nvmlDeviceGetCount()
    facts = {
        "available": True,
        "driver": attempt(pynvml.nvmlSystemGetDriverVersion),
        "nvml": attempt(pynvml.nvmlSystemGetNVMLVersion),
        "cuda_driver": attempt(pynvml.nvmlSystemGetCudaDriverVersion),
        "count": count,
        "gpus": [gpu(index) for index in range(count)],
    }
    try:
        facts["pcie_load"], readings = pcie_under_load(count)
    except Exception as exc:  # the facts above matter more than the under-load reading
        facts["pcie_load"], readings = {"seconds": 0, "error": f"{type(exc).__name__}: {exc}"}, {}
    for index, reading in readings.items():
        if "error" not in facts["gpus"][index]:
            facts["gpus"][index].update(reading)
finally:
    pynvml.nvmlShutdown()
print(json.dumps(facts))
