"""InfiniBand HCAs and ports: `ibstat` on a node, and pure parsers for ibstat and ibv_devinfo text.

Both parsers give the same shape (HCAs, each with ports), so a check reads either. ibv_devinfo
without -v prints no rate and no physical state: those stay None. ibstat with no RDMA device
prints nothing and exits 0 (infiniband-diags 44.0 on Debian 12), so empty output means "no HCA",
which the suite decides on; the parser rejects it as not ibstat output.

The tools' own error lines (stderr, in a paste interleaved with stdout) are kept and fail the
parse's `ok` even when every port listed is Active: ibstat stops at the first CA it cannot stat
with `ibpanic: [pid] main: stat of IB device 'mlx5_8' failed: ...` (exit 255), and since
rdma-core 703b52c (2024-09) warns with `ibwarn: ...` and goes on (exit 0), so the CA is simply
missing from the list; ibv_devinfo prints "Failed to open device" and the like for a device it
cannot read and lists the others.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from inventory.model import Expectations
from runners import payloads
from runners.parsing import ParseError, json_object
from runners.transport import Result, Transport

STEP = "ibstat"  # the ibstat probe, run once per session and read by every HCA check
PROBE_TIMEOUT_S = 30
COMMAND_NOT_FOUND = 127  # what `timeout` (the transport's wrapper) exits when the tool is missing

_CA = re.compile(r"^CA '([^']+)'\s*$")
_PORT = re.compile(r"^\s+Port (\d+):\s*$")
_FIELD = re.compile(r"^\s+([A-Za-z][A-Za-z ]*?):\s*(.*?)\s*$")
_DEVINFO_HCA = re.compile(r"^hca_id:\s*(\S+)\s*$")
_DEVINFO_PORT = re.compile(r"^\s+port:\s*(\d+)\s*$")
_DEVINFO_FIELD = re.compile(r"^\s+(\w+):\s*(.*?)\s*$")
_DEVINFO_STATES = {"PORT_ACTIVE": "Active", "PORT_DOWN": "Down", "PORT_INIT": "Initializing",
                   "PORT_ARMED": "Armed", "PORT_ACTIVE_DEFER": "ActiveDefer"}
MELLANOX_VENDOR_ID = "0x02c9"
# infiniband-diags' IBPANIC/IBWARN/IBERROR prefixes (libibmad mad.h), ibstat's stat failure.
_IBSTAT_ERROR = re.compile(r"^\s*(?:ibpanic|ibwarn|iberror): |stat of IB device .* failed")
# ibv_devinfo's own messages on stderr (rdma-core libibverbs/examples/devinfo.c).
_DEVINFO_ERROR = re.compile(r"^\s*(?:Failed to |IB device '.*' wasn't found|No IB devices found|"
                            r"Invalid port requested for device)")


@dataclass
class IbPort:
    port: int
    state: Optional[str] = None  # Active, Down, Initializing, Armed
    physical_state: Optional[str] = None  # LinkUp, Polling, Disabled
    rate: Optional[float] = None  # Gb/s: NDR 400, HDR 200
    link_layer: Optional[str] = None  # InfiniBand or Ethernet

    @property
    def healthy(self) -> bool:
        return self.state == "Active" and self.physical_state in (None, "LinkUp")


@dataclass
class Hca:
    name: str
    ca_type: Optional[str] = None  # e.g. MT4129 (ConnectX-7)
    firmware: Optional[str] = None
    ports: list[IbPort] = field(default_factory=list)


@dataclass
class IbDevices:
    hcas: list[Hca]
    source: str  # ibstat or ibv_devinfo
    ok: bool  # at least one HCA, every port Active (and LinkUp where the tool says), no error line
    errors: list[str] = field(default_factory=list)  # the tool's own error lines, as written


def parse_ibstat(text: str) -> IbDevices:
    hcas: list[Hca] = []
    port: Optional[IbPort] = None
    errors = []
    for line in text.splitlines():
        if _IBSTAT_ERROR.search(line):
            errors.append(line.strip())
        elif match := _CA.match(line):
            hcas.append(Hca(match.group(1)))
            port = None
        elif not hcas:
            continue
        elif match := _PORT.match(line):
            port = IbPort(int(match.group(1)))
            hcas[-1].ports.append(port)
        elif match := _FIELD.match(line):
            key, value = match.groups()
            if port is None:
                if key == "CA type":
                    hcas[-1].ca_type = value
                elif key == "Firmware version":
                    hcas[-1].firmware = value
            elif key == "State":
                port.state = value
            elif key == "Physical state":
                port.physical_state = value
            elif key == "Rate":
                port.rate = _number(value, "Rate", line)
            elif key == "Link layer":
                port.link_layer = value
    if not hcas:
        raise ParseError("no \"CA '<name>'\" block: not ibstat output" + _said(errors))
    return IbDevices(hcas, "ibstat", _all_healthy(hcas) and not errors, errors)


def parse_ibv_devinfo(text: str) -> IbDevices:
    hcas: list[Hca] = []
    port: Optional[IbPort] = None
    vendor: dict[str, str] = {}
    errors = []
    for line in text.splitlines():
        if _DEVINFO_ERROR.match(line):
            errors.append(line.strip())
        elif match := _DEVINFO_HCA.match(line):
            hcas.append(Hca(match.group(1)))
            port = None
        elif not hcas:
            continue
        elif match := _DEVINFO_PORT.match(line):
            port = IbPort(int(match.group(1)))
            hcas[-1].ports.append(port)
        elif match := _DEVINFO_FIELD.match(line):
            key, value = match.groups()
            if port is None:
                if key == "fw_ver":
                    hcas[-1].firmware = value
                elif key == "vendor_id":
                    vendor[hcas[-1].name] = value
                elif key == "vendor_part_id" and vendor.get(hcas[-1].name) == MELLANOX_VENDOR_ID:
                    hcas[-1].ca_type = f"MT{value}"  # ibstat's CA type for NVIDIA/Mellanox HCAs
            elif key == "state":
                word = value.split()[0]
                port.state = _DEVINFO_STATES.get(word, word)
            elif key == "link_layer":
                port.link_layer = value
    if not hcas:
        raise ParseError("no 'hca_id:' block: not ibv_devinfo output" + _said(errors))
    return IbDevices(hcas, "ibv_devinfo", _all_healthy(hcas) and not errors, errors)


def _said(errors: list[str]) -> str:
    """The tool's first error line, for a text that lists no HCA."""
    return f" (the tool said: {errors[0]})" if errors else ""


def natural_order(names) -> list[str]:
    """HCA names with their numbers compared as numbers: mlx5_2 before mlx5_10.

    ibstat lists CAs in plain string order (mlx5_0, mlx5_1, mlx5_10, mlx5_2, ...), so on a node
    with more than ten HCAs its order is not the ports' order; rails follow this one.
    """
    return sorted(names, key=lambda name: [int(part) if part.isdigit() else part
                                           for part in re.split(r"(\d+)", name)])


def _number(value: str, what: str, line: str) -> float:
    try:
        return float(value.split()[0])
    except (ValueError, IndexError):
        raise ParseError(f"{what} is not a number: {line.strip()!r}") from None


def _all_healthy(hcas: list[Hca]) -> bool:
    return all(hca.ports and all(port.healthy for port in hca.ports) for hca in hcas)


PARSERS = {"ibstat": parse_ibstat, "ibv_devinfo": parse_ibv_devinfo}


def probe(transport: Transport) -> Result:
    """ibstat, which infiniband-diags installs in /usr/sbin (the transport looks there too)."""
    return transport.run(["ibstat"], timeout=PROBE_TIMEOUT_S)


def tool_missing(result: Result) -> bool:
    return result.exit_code == COMMAND_NOT_FOUND


def no_device(result: Result) -> bool:
    """ibstat ran, and found no HCA: empty output (and exit 0) on infiniband-diags 44."""
    return result.ok and not result.stdout.strip()


# ------------------------------------------------------------------------------ error counters

SYSFS_ROOT = "/sys/class/infiniband"
# The kernel's counter file names, and the Expectations field holding each one's limit.
ERROR_COUNTERS = {"symbol_error": "ib_symbol_errors_max", "link_downed": "ib_link_downed_max",
                  "port_rcv_errors": "ib_port_rcv_errors_max"}
# The PortCounters' widths (IBTA: 16, 8 or 4 bits): an error counter stops at its ceiling
# instead of wrapping, and sysfs reads it so.
LINK_COUNTER_CEILINGS = {"symbol_error": 0xFFFF, "link_error_recovery": 0xFF, "link_downed": 0xFF,
                         "port_rcv_errors": 0xFFFF, "port_rcv_remote_physical_errors": 0xFFFF,
                         "port_xmit_discards": 0xFFFF, "local_link_integrity_errors": 0xF,
                         "excessive_buffer_overrun_errors": 0xF}


@dataclass(frozen=True)
class PortCounters:
    hca: str
    port: str
    counters: dict  # kernel counter name -> value (None: the file could not be read as a number)


@dataclass(frozen=True)
class IbCounters:
    root: str
    present: bool  # the sysfs class directory exists (no RDMA driver: it does not)
    ports: list[PortCounters]


def probe_counters(transport: Transport, root: str = SYSFS_ROOT) -> Result:
    return transport.run_script(payloads.load("ib_counters"), [root], timeout=PROBE_TIMEOUT_S)


def parse_ib_counters(text: str) -> IbCounters:
    """The ib_counters payload's JSON: every port's counters."""
    data = json_object(text, "IB counters")
    if not isinstance(data, dict) or not isinstance(data.get("ports"), list):
        raise ParseError("IB counters: no 'ports' list")
    ports = []
    for entry in data["ports"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("counters"), dict):
            raise ParseError(f"IB counters: malformed port entry {entry!r}")
        ports.append(PortCounters(str(entry.get("hca")), str(entry.get("port")), entry["counters"]))
    return IbCounters(str(data.get("root")), bool(data.get("present")), ports)


def counter_problems(found: IbCounters, expect: Expectations) -> list[str]:
    """Error counters above the profile's limit (0 unless the profile says otherwise); one at its
    ceiling is said to be saturated, since its reading is a floor, not a count."""
    problems = []
    for port in found.ports:
        for counter, key in ERROR_COUNTERS.items():
            limit = getattr(expect, key) or 0
            value = port.counters.get(counter, "absent")
            where = f"{port.hca} port {port.port}: {counter}"
            if value == "absent":
                problems.append(f"{where} is missing from sysfs")
            elif value is None:
                problems.append(f"{where} is not a number")
            elif value > limit:
                saturated = value >= LINK_COUNTER_CEILINGS[counter]
                problems.append(f"{where} = {value}, limit {limit}" + (
                    ": saturated, it counts no further (that many errors or more since it was cleared)"
                    if saturated else ""))
    return problems


def port_problems(devices: IbDevices, expect: Expectations) -> list[str]:
    """Every way the HCAs differ from the profile's expect block, in words."""
    problems: list[str] = []
    count, ca_type = expect.ib_hcas, expect.ib_ca_type
    rate, layer = expect.ib_rate, expect.ib_link_layer
    problems.extend(f"{devices.source} reported an error: {error}" for error in devices.errors)
    if count is not None and len(devices.hcas) != count:
        problems.append(f"{len(devices.hcas)} HCA(s), expected {count}")
    for hca in devices.hcas:
        if ca_type and hca.ca_type != ca_type:
            problems.append(f"{hca.name}: CA type {hca.ca_type}, expected {ca_type}")
        if not hca.ports:
            problems.append(f"{hca.name}: no ports listed")
        for port in hca.ports:
            where = f"{hca.name} port {port.port}"
            if not port.healthy:
                problems.append(f"{where}: {port.state}/{port.physical_state}, expected Active/LinkUp")
            if rate is not None and port.rate != rate:
                problems.append(f"{where}: rate {port.rate} Gb/s, expected {rate:g}")
            if layer and port.link_layer != layer:
                problems.append(f"{where}: link layer {port.link_layer}, expected {layer}")
    return problems


# What a failed port or error counter calls for (the network suite's actions).
PORT_ACTION = ("a port down or at the wrong rate: reseat or replace its cable (and transceiver), check the switch "
               "port and the subnet manager, then re-run")
COUNTERS_ACTION = ("reseat or replace the cable of each port named, check its switch port, clear the counters "
                   "(perfquery -x) and re-run: errors that come back mean a bad cable, transceiver or HCA")
