"""Node-side: OS, kernel, CPU, memory and clock facts as one JSON object on stdout (stdlib only)."""
import ctypes
import ctypes.util
import json
import os
import platform
import socket

TIME_ERROR = 5  # adjtimex's answer for a clock that is not synchronized
STA_UNSYNC = 0x40


class Timex(ctypes.Structure):
    """The kernel's struct timex (linux/timex.h), read with adjtimex(2)'s modes 0: no change."""
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
                ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
                ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("reserved", ctypes.c_int * 11)]


def clock():
    """Whether the kernel's clock is synchronized, as NTP, chrony or PTP leave it and as
    timedatectl's "System clock synchronized" reads it, and the kernel's maximum error (us)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        timex = Timex()
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError) as error:
        return {"synced": None, "max_error_us": None, "unknown": "adjtimex: %s" % error}
    if state < 0:
        return {"synced": None, "max_error_us": None, "unknown": "adjtimex: %s" % os.strerror(ctypes.get_errno())}
    synced = state != TIME_ERROR and not timex.status & STA_UNSYNC
    return {"synced": synced, "max_error_us": timex.maxerror, "unknown": ""}


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
    "clock": clock(),
}))
