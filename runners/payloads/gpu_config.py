"""Node-side: GPU node configuration facts as one JSON object (stdlib only).

Reads what NVIDIA's validation guides look at before any benchmark: loaded modules, the
Fabric Manager service, nvidia-smi's fabric state, PCIe ACS control of every bridge (lspci -vvv),
the IOMMU set-up, CPU frequency governors, NUMA balancing, the NUMA node of every NVIDIA GPU and
InfiniBand device, driver / CUDA / OFED / firmware versions and the NVIDIA container toolkit.
A fact that cannot be read is null (or the tool's error text under "errors"), never a guess;
tool outputs are returned as text for the harness's pure parsers. Nothing is written.
"""
import ctypes
import glob
import json
import os
import shutil
import socket
import subprocess

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS_PREFIX = "0x03"  # 0x0300 VGA, 0x0302 3D controller: the GPUs, not NVSwitches/bridges
errors = {}


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def run(name, argv, timeout=60):
    """stdout of a tool, or None with the reason in errors[name]."""
    if shutil.which(argv[0]) is None:
        errors[name] = f"{argv[0]} not found in PATH"
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, errors="replace")
    except (OSError, subprocess.SubprocessError) as exc:
        errors[name] = f"{' '.join(argv)}: {exc}"
        return None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()
        errors[name] = f"{' '.join(argv)} exited {done.returncode}: {last[-1] if last else ''}"
        return done.stdout or None
    return done.stdout


def modules():
    text = read("/proc/modules")
    return None if text is None else [line.split()[0] for line in text.splitlines() if line.strip()]


def numa_node(device_dir):
    value = read(os.path.join(device_dir, "numa_node"))
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def gpus():
    found = []
    for device in sorted(glob.glob(os.path.join(PCI_DEVICES, "*"))):
        if read(os.path.join(device, "vendor")) != NVIDIA_VENDOR:
            continue
        if not (read(os.path.join(device, "class")) or "").startswith(DISPLAY_CLASS_PREFIX):
            continue
        found.append({"bus_id": os.path.basename(device), "numa_node": numa_node(device)})
    return found


def infiniband():
    found = []
    for device in sorted(glob.glob("/sys/class/infiniband/*")):
        found.append({"name": os.path.basename(device),
                      "numa_node": numa_node(os.path.join(device, "device")),
                      "fw_ver": read(os.path.join(device, "fw_ver")),
                      "board_id": read(os.path.join(device, "board_id"))})
    return found


def governors():
    paths = glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")
    return {os.path.basename(os.path.dirname(os.path.dirname(p))): read(p) for p in sorted(paths)}


def cuda_driver_version():
    """cuDriverGetVersion from libcuda (needs no GPU context), e.g. 13000 for CUDA 13.0."""
    try:
        library = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        errors["cuda"] = f"libcuda.so.1: {exc}"
        return None
    version = ctypes.c_int(0)
    status = library.cuDriverGetVersion(ctypes.byref(version))
    if status != 0:
        errors["cuda"] = f"cuDriverGetVersion returned {status}"
        return None
    return version.value


def vbios_versions():
    versions = {}
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        for line in (read(info) or "").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Video BIOS":
                versions[os.path.basename(os.path.dirname(info))] = value.strip()
    return versions


def container_toolkit():
    tools = {name: shutil.which(name) for name in
             ("nvidia-ctk", "nvidia-container-cli", "nvidia-container-runtime")}
    version = run("nvidia-ctk", ["nvidia-ctk", "--version"]) if tools["nvidia-ctk"] else None
    return {"tools": tools, "version": version}


def fabric_manager():
    if shutil.which("systemctl") is None:
        errors["fabricmanager"] = "systemctl not found in PATH"
        return None
    try:
        done = subprocess.run(["systemctl", "is-active", "nvidia-fabricmanager"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        errors["fabricmanager"] = str(exc)
        return None
    state = done.stdout.strip()  # is-active exits 3 when inactive: the word is the answer
    if not state:
        last = done.stderr.strip().splitlines()
        errors["fabricmanager"] = f"systemctl is-active nvidia-fabricmanager: {last[-1] if last else done.returncode}"
    return state or None


iommu_groups = glob.glob("/sys/kernel/iommu_groups/*/type")
facts = {
    "hostname": socket.gethostname(),
    "kernel_cmdline": read("/proc/cmdline"),
    "modules": modules(),
    "fabricmanager": fabric_manager(),
    "nvidia_smi_q": run("nvidia-smi", ["nvidia-smi", "-q"]) if shutil.which("nvidia-smi") else None,
    "lspci_vvv": run("lspci", ["lspci", "-vvv", "-D"]),
    "iommu_devices": sorted(os.listdir("/sys/class/iommu")) if os.path.isdir("/sys/class/iommu") else None,
    "iommu_group_types": sorted({read(path) for path in iommu_groups}),
    "cpu_governors": governors(),
    "numa_balancing": read("/proc/sys/kernel/numa_balancing"),
    "gpus": gpus(),
    "infiniband": infiniband(),
    "nvidia_driver": read("/sys/module/nvidia/version"),
    "cuda_driver": cuda_driver_version(),
    "vbios": vbios_versions(),
    "ofed_info": run("ofed_info", ["ofed_info", "-s"]),
    "container_toolkit": container_toolkit(),
    "is_root": os.geteuid() == 0,
}
if shutil.which("nvidia-smi") is None:
    errors["nvidia-smi"] = "nvidia-smi not found in PATH"
facts["errors"] = errors
print(json.dumps(facts))
