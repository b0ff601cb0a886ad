"""Kernel log: NVIDIA Xid and NVSwitch SXid events, PCIe AER errors and degraded PCIe links.

Severities and actions follow NVIDIA's XID catalog ("Xid Errors", docs.nvidia.com/deploy/xid-errors):
`critical` means the GPU or node must not be handed over as is; `warning` means look before
handover (often an application's fault, or a correctable event); `info` is recorded only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Optional

from runners import payloads
from runners.parsing import ParseError, json_object
from runners.transport import Result, Transport

READ_TIMEOUT_S = 60  # dmesg, then journalctl -k, each bounded to 20 s on the node
WINDOW_MARGIN_S = 5.0  # the run's window opens this much before its recorded start (SSH set-up)
CRITICAL, WARNING, INFO = "critical", "warning", "info"

# xid -> (what it is, severity, recommended action)
XID_CATALOG: dict[int, tuple[str, str, str]] = {
    13: ("graphics engine exception", WARNING,
         "usually an application fault; if it repeats with known-good code, run dcgmi diag -r 3"),
    31: ("GPU memory page fault", WARNING,
         "usually an illegal access by an application; if it repeats, run dcgmi diag -r 3"),
    32: ("invalid or corrupted push buffer stream", WARNING,
         "check the driver and PCIe link; run dcgmi diag -r 2"),
    43: ("GPU stopped processing", INFO, "an application was stopped; nothing to do unless it repeats"),
    45: ("preemptive cleanup after earlier errors", INFO, "look at the Xid that preceded it"),
    48: ("double-bit ECC error (DBE)", CRITICAL,
         "reset the GPU; if it recurs or remapping fails, RMA"),
    61: ("internal micro-controller breakpoint/warning", WARNING,
         "reset the GPU; report to NVIDIA if it recurs"),
    62: ("internal micro-controller halt", CRITICAL, "reset the GPU; if it recurs, RMA"),
    63: ("ECC page retirement or row-remap recording event", WARNING,
         "reset the GPU to apply the remap; check remapped rows in nvidia-smi -q"),
    64: ("ECC page retirement or row-remapper recording failure", CRITICAL,
         "the GPU could not record a remap: RMA"),
    68: ("video processor exception", WARNING, "reset the GPU if it recurs"),
    69: ("graphics engine class error", WARNING, "usually an application fault"),
    74: ("NVLink error", CRITICAL,
         "check the NVLink/NVSwitch connections and the fabric manager log; reset the GPUs; "
         "run dcgmi diag -r 3"),
    79: ("GPU has fallen off the bus", CRITICAL,
         "drain the node; check PCIe seating, risers and power; reset or power-cycle; RMA if it recurs"),
    92: ("high single-bit ECC error rate", WARNING, "watch the correctable counts; run dcgmi diag -r 3"),
    94: ("contained ECC error", WARNING,
         "the affected application was stopped; reset the GPU to remap the row"),
    95: ("uncontained ECC error", CRITICAL, "reset the GPU (all its work is lost); RMA if it recurs"),
    109: ("context switch timeout", WARNING, "usually an application fault; reset if it recurs"),
    119: ("GSP RPC timeout", CRITICAL, "reset the GPU or reboot the node; update the driver if it recurs"),
    120: ("GSP error", CRITICAL, "reset the GPU or reboot the node; report to NVIDIA if it recurs"),
    121: ("C2C link corrected error", WARNING, "watch for recurrence; reset if it repeats"),
    140: ("unrecovered ECC error", CRITICAL, "reset the GPU; RMA if it recurs"),
    154: ("GPU recovery action changed", CRITICAL,
         "do what the line says (GPU reset or node reboot required) before handover"),
}
UNKNOWN_XID = ("not in the harness's catalog", WARNING,
               "look it up in NVIDIA's Xid catalog before handover")

_TIMESTAMP = r"(?:\[\s*(?P<uptime>\d+\.\d+)\]\s*)?"
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<device>[0-9A-Fa-f:.]+)\): (?P<code>\d+),\s*(?P<text>.*)")
_SXID = re.compile(r"nvidia-(?P<switch>nvswitch\d+): SXid \((?:PCI:)?(?P<device>[0-9A-Fa-f:.]+)\): "
                   r"(?P<code>\d+),\s*(?P<severity>Non-fatal|Fatal)?,?\s*(?P<text>.*)")
_AER = re.compile(r"PCIe Bus Error: severity=(?P<severity>[^,]+)|AER: (?P<summary>.*error.*received.*)")
_LINK_LIMITED = re.compile(r"available PCIe bandwidth, limited by|[Ll]ink (?:speed |width )?downgraded")
_UPTIME = re.compile(r"^\s*\[\s*(\d+\.\d+)\]")
# Newer drivers also say it without an Xid, over several lines that each start with "NVRM:":
# "NVRM: The NVIDIA GPU 0000:b3:00.0" / "NVRM: (PCI ID: ...) installed in this system has" /
# "NVRM: fallen off the bus and is not responding to commands."; older ones in one line.
_OFF_THE_BUS = re.compile(r"NVRM: .*fallen off the bus")
_NVRM_GPU = re.compile(r"NVRM: (?:The NVIDIA GPU|GPU at) (?P<device>[0-9A-Fa-f]{4}:[0-9A-Fa-f:.]+)")


@dataclass(frozen=True)
class KernelEvent:
    kind: str  # xid, sxid, aer, pcie-link
    code: Optional[int]  # the Xid or SXid number
    device: str  # PCI address as the line gives it
    severity: str
    meaning: str
    action: str
    uptime_s: Optional[float]  # seconds since boot, when the line carries dmesg's timestamp
    line: str


@dataclass(frozen=True)
class KernelLog:
    events: list[KernelEvent]
    lines: int

    @property
    def ok(self) -> bool:
        return not any(event.severity == CRITICAL for event in self.events)


def read(transport: Transport, run_started: Optional[datetime] = None) -> Result:
    """This boot's kernel log through the kernel_log payload (dmesg, else journalctl -k).

    Runs as root where the node allows sudo (dmesg_restrict); `run_started` (aware, the harness's
    clock) marks where this acceptance run's window begins, a margin earlier.
    """
    argv = []
    if run_started is not None:
        ago = (datetime.now(timezone.utc) - run_started).total_seconds() + WINDOW_MARGIN_S
        argv = ["--run-started-ago", f"{max(0.0, ago):.1f}"]
    return transport.run_script(payloads.load("kernel_log"), argv, timeout=READ_TIMEOUT_S, root=True)


def _uptime(line: str) -> Optional[float]:
    match = _UPTIME.match(line)
    return float(match.group(1)) if match else None


def classify(line: str) -> Optional[KernelEvent]:
    """The event one kernel-log line reports, or None for an unrelated line."""
    match = _XID.search(line)
    if match:
        code = int(match["code"])
        meaning, severity, action = XID_CATALOG.get(code, UNKNOWN_XID)
        return KernelEvent("xid", code, match["device"], severity, meaning, action,
                           _uptime(line), line.strip())
    match = _SXID.search(line)
    if match:
        fatal = (match["severity"] or "").lower() == "fatal"
        return KernelEvent(
            "sxid", int(match["code"]), match["device"], CRITICAL if fatal else WARNING,
            f"NVSwitch {match['switch']} {match['severity'] or 'error'}: {match['text']}".strip(),
            "fatal SXid: reset the NVSwitch fabric (restart fabric manager or reboot) and check "
            "the links" if fatal else "non-fatal SXid: watch for recurrence on the same link",
            _uptime(line), line.strip())
    match = _AER.search(line)
    if match:
        severity_text = (match["severity"] or match["summary"] or "").strip()
        uncorrected = "Uncorrect" in severity_text or "Fatal" in severity_text
        return KernelEvent(
            "aer", None, _pci_address(line), CRITICAL if uncorrected else WARNING,
            f"PCIe AER: {severity_text}",
            "uncorrected PCIe error: reseat or replace the device or riser" if uncorrected
            else "corrected PCIe errors: check the link if they keep coming",
            _uptime(line), line.strip())
    if _OFF_THE_BUS.search(line):
        meaning, severity, action = XID_CATALOG[79]
        device = _NVRM_GPU.search(line)
        return KernelEvent("xid", 79, device["device"] if device else "", severity,
                           meaning + " (reported without an Xid number)", action, _uptime(line),
                           line.strip())
    if _LINK_LIMITED.search(line):
        return KernelEvent("pcie-link", None, _pci_address(line), WARNING,
                           "PCIe link below its capability",
                           "check the slot, riser and BIOS link settings of this device",
                           _uptime(line), line.strip())
    return None


def _pci_address(line: str) -> str:
    match = re.search(r"\b[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\b", line)
    return match.group(0) if match else ""


def parse_kernel_log(text: str) -> KernelLog:
    """Events in dmesg or `journalctl -k` text; empty text is an empty log, not an error."""
    if "\x00" in text:
        raise ParseError("binary data, not kernel log text")
    lines = text.splitlines()
    events, last_gpu, last_uptime = [], "", None
    for line in lines:
        named = _NVRM_GPU.search(line)
        if named:
            last_gpu = named["device"]
        elif "NVRM:" not in line:  # the driver's multi-line message ended
            last_gpu = ""
        last_uptime = _uptime(line) if _uptime(line) is not None else last_uptime
        event = classify(line)
        if event is None:
            continue
        if event.kind == "xid" and not event.device and last_gpu:  # the GPU named lines before
            event = replace(event, device=last_gpu)
        if event.uptime_s is None and line.startswith((" ", "\t")):  # dmesg's continuation lines
            event = replace(event, uptime_s=last_uptime)
        events.append(event)
    return KernelLog(events=events, lines=len(lines))


@dataclass(frozen=True)
class KernelRead:
    """What the kernel_log payload read, parsed, split at the start of this acceptance run."""

    source: Optional[str]  # dmesg, journalctl, or None when neither could read the log
    uptime_s: float  # the node's uptime when the log was read
    window_start_uptime_s: Optional[float]  # None when the run's start was not passed
    attempts: list[dict]
    log: KernelLog = field(default_factory=lambda: KernelLog(events=[], lines=0))

    @property
    def readable(self) -> bool:
        return self.source is not None

    def unreadable_reason(self) -> str:
        return "the kernel log could not be read: " + "; ".join(
            f"`{a.get('command')}`: {a.get('error') or 'exit ' + str(a.get('exit'))}"
            for a in self.attempts)

    def during_run(self) -> list[KernelEvent]:
        """Events logged since this acceptance run started."""
        start = self.window_start_uptime_s
        return [e for e in self.log.events
                if start is not None and e.uptime_s is not None and e.uptime_s >= start]

    def before_run(self) -> list[KernelEvent]:
        """Events since boot but before this run, and events the log gives no time for."""
        during = set(map(id, self.during_run()))
        return [e for e in self.log.events if id(e) not in during]


def parse_kernel_read(text: str) -> KernelRead:
    """The kernel_log payload's JSON."""
    data = json_object(text, "kernel log payload output")
    if not isinstance(data, dict) or "attempts" not in data or "uptime_s" not in data:
        raise ParseError("kernel log payload output lacks `attempts` and `uptime_s`")
    source = data.get("source")
    log = parse_kernel_log(str(data.get("text") or "")) if source else KernelLog(events=[], lines=0)
    start = data.get("window_start_uptime_s")
    return KernelRead(source=source, uptime_s=float(data["uptime_s"]),
                      window_start_uptime_s=float(start) if start is not None else None,
                      attempts=list(data["attempts"]), log=log)
