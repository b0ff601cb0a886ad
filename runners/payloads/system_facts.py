"""Node-side: OS, kernel, CPU and memory facts as one JSON object on stdout (stdlib only)."""
import json
import os
import platform
import socket


def os_release():
    fields = {}
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    key, sep, value = line.strip().partition("=")
                    if sep:
                        fields[key] = value.strip().strip('"').strip("'")
            break
        except OSError:
            continue
    return fields


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model", "uarch"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_sockets():
    ids = set()
    base = "/sys/devices/system/cpu"
    for entry in os.listdir(base):
        path = os.path.join(base, entry, "topology", "physical_package_id")
        if entry.startswith("cpu") and os.path.exists(path):
            with open(path, encoding="ascii") as handle:
                ids.add(handle.read().strip())
    return len(ids) or None


def memory_total_kib():
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return None


release = os_release()
uname = os.uname()
print(json.dumps({
    "hostname": socket.gethostname(),
    "os_id": release.get("ID", ""),
    "os_version": release.get("VERSION_ID", ""),
    "os_pretty": release.get("PRETTY_NAME", ""),
    "kernel": uname.release,
    "arch": uname.machine,
    "cpu_model": cpu_model(),
    "cpu_sockets": cpu_sockets(),
    "logical_cpus": os.sysconf("SC_NPROCESSORS_ONLN"),
    "memory_total_kib": memory_total_kib(),
    "python": platform.python_version(),
}))
