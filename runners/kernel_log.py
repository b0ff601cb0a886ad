"""Kernel log: NVIDIA Xid and NVSwitch SXid events, PCIe AER errors and degraded PCIe links.

Severities and actions follow NVIDIA's XID catalog ("Xid Errors", docs.nvidia.com/deploy/xid-errors):
`critical` means the GPU or node must not be handed over as is; `warning` means look before
handover (often an application's fault, or a correctable event); `info` is recorded only.

The same parser reads the node's log through the kernel_log payload and the excerpts operators
paste into `handover parse kernel-log` (any prefix dmesg, journalctl or syslog writes).
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
# Xids 144-150 are NVLink5 errors whose line says whether they are Fatal or Nonfatal
# (NVIDIA's catalog: NVLINK_SAW_ERROR ... NVLINK_MSE_ERROR, resolution WORKFLOW_NVLINK5_ERR).
NVLINK_XIDS = {144: "SAW", 145: "RLW", 146: "TLW", 147: "TREX", 148: "NVLPW_CTRL", 149: "NETIR",
               150: "MSE"}
NVLINK_XID_ACTION = ("fatal: reset the GPU (or reboot the node), check its NVLink connections and "
                     "run dcgmi diag -r 3 before handover; nonfatal: watch for recurrence on the link")

# What may stand before the kernel's own text on a pasted line, outermost first:
# `dmesg -x` facility and level ("kern  :err   : "); a date: `dmesg -T`/`--ctime`
# ("[Sun Feb 23 16:24:18 2025]"), ISO 8601 (`dmesg --time-format iso`, `journalctl -o short-iso`,
# rsyslog), syslog/`journalctl -k` ("Feb 14 05:03:41 host kernel: ", months as the locale writes
# them) or a bare "kernel: "; then dmesg's seconds since boot ("[ 1843.308145]", also after a
# syslog prefix) or `dmesg -H`'s relative time ("[  +0.000844]").
_DECODED_LEVEL = re.compile(r"^[a-z]+\s*:[a-z]+\s*: ")
_CTIME = re.compile(r"^\[(?P<time>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\] ?")
_ISO = re.compile(r"^(?P<time>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)"
                  r" (?:(?P<host>\S+) kernel: )?")
_SYSLOG = re.compile(r"^(?P<time>[A-Za-z]{3,5}\.? +\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d+)?) "
                     r"(?P<host>\S+) kernel: ")
_BARE_KERNEL = re.compile(r"^kernel: ")
_UPTIME = re.compile(r"^\[\s*(?P<uptime>\d+\.\d+)\] ?")
_RELATIVE = re.compile(r"^\[\s*\+\d+\.\d+\] ?")

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<device>[0-9A-Fa-f:.]+)\): (?P<code>\d+),\s*(?P<text>.*)")
# An SXid is printed as a headline ("..., Non-fatal, Link 44 <what>") and detail lines
# ("..., Severity 0 Engine instance 44 ..." and "..., Data {...}"), in either order; severity 0
# is non-fatal, 1 fatal (the nvswitch driver's NVSWITCH_ERROR_SEVERITY_TYPE).
_SXID = re.compile(r"nvidia-(?P<switch>nvswitch\d+): SXid \((?:PCI:)?(?P<device>[0-9A-Fa-f:.]+)\): "
                   r"(?P<code>\d+),\s*(?P<rest>.*)")
_SXID_HEADLINE = re.compile(r"(?P<severity>Non-fatal|Fatal),\s*(?P<text>(?:Link (?P<link>\d+))?.*)")
_SXID_SEVERITY = re.compile(r"Severity (?P<level>\d+) Engine instance (?P<instance>\d+)")
_AER = re.compile(r"PCIe Bus Error: severity=(?P<severity>[^,]+)|AER: (?P<summary>.*error.*received.*)")
_LINK_LIMITED = re.compile(r"available PCIe bandwidth, limited by|[Ll]ink (?:speed |width )?downgraded")
# Newer drivers also say it without an Xid, over several lines that each start with "NVRM:":
# "NVRM: The NVIDIA GPU 0000:b3:00.0" / "NVRM: (PCI ID: ...) installed in this system has" /
# "NVRM: fallen off the bus and is not responding to commands."; older ones in one line, and
# some repeat an Xid 79 as "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus." right after it.
_OFF_THE_BUS = re.compile(r"NVRM: .*fallen off the bus")
_NVRM_GPU = re.compile(r"NVRM: (?:The NVIDIA GPU|GPU at|GPU) (?:PCI:)?"
                       r"(?P<device>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")
_NVIDIA_TEXT = re.compile(r"NVRM: |nvidia-nvswitch\d+: ")


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
    time: Optional[str] = None  # the wall-clock time as the line writes it (dmesg -T, syslog)
    host: Optional[str] = None  # the host a syslog or journalctl line names


@dataclass(frozen=True)
class KernelLog:
    events: list[KernelEvent]
    lines: int
    ok: bool = field(init=False)  # no critical event

    def __post_init__(self):
        object.__setattr__(self, "ok", not any(event.severity == CRITICAL for event in self.events))


@dataclass(frozen=True)
class _Prefix:
    """What stood before the kernel's text on one line."""

    time: Optional[str]
    host: Optional[str]
    uptime_s: Optional[float]
    recognised: bool  # the line carries a kernel-log prefix


def _split(line: str) -> _Prefix:
    rest, time, host, recognised = line.strip(), None, None, False
    if match := _DECODED_LEVEL.match(rest):
        rest, recognised = rest[match.end():], True
    for pattern in (_CTIME, _ISO, _SYSLOG):
        if match := pattern.match(rest):
            time, recognised = match["time"], True
            host = match.groupdict().get("host")
            rest = rest[match.end():]
            break
    if match := _BARE_KERNEL.match(rest):
        rest, recognised = rest[match.end():], True
    uptime = None
    if match := _UPTIME.match(rest):
        uptime, rest, recognised = float(match["uptime"]), rest[match.end():], True
    elif match := _RELATIVE.match(rest):
        rest, recognised = rest[match.end():], True
    return _Prefix(time, host, uptime, recognised)


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


def _sxid_form(line: str) -> Optional[tuple[str, int, str, Optional[int]]]:
    """(switch, SXid, headline|severity|data, link or engine instance) of an SXid line."""
    match = _SXID.search(line)
    if not match:
        return None
    key = (match["switch"], int(match["code"]))
    if head := _SXID_HEADLINE.match(match["rest"]):
        return (*key, "headline", int(head["link"]) if head["link"] else None)
    if detail := _SXID_SEVERITY.match(match["rest"]):
        return (*key, "severity", int(detail["instance"]))
    return (*key, "data", None)


def classify(line: str) -> Optional[KernelEvent]:
    """The event one kernel-log line reports, or None for an unrelated line.

    The line may carry any prefix dmesg, journalctl or syslog writes (see _split).
    """
    prefix = _split(line)

    def event(kind: str, code: Optional[int], device: str, severity: str, meaning: str,
              action: str) -> KernelEvent:
        return KernelEvent(kind, code, device, severity, meaning, action, prefix.uptime_s,
                           line.strip(), prefix.time, prefix.host)

    match = _XID.search(line)
    if match:
        code = int(match["code"])
        if code in NVLINK_XIDS:
            fatal = re.search(r"\bFatal\b", match["text"]) is not None
            return event("xid", code, match["device"], CRITICAL if fatal else WARNING,
                         f"NVLink {NVLINK_XIDS[code]} error ({'fatal' if fatal else 'nonfatal'})",
                         NVLINK_XID_ACTION)
        meaning, severity, action = XID_CATALOG.get(code, UNKNOWN_XID)
        return event("xid", code, match["device"], severity, meaning, action)
    match = _SXID.search(line)
    if match:
        return _sxid_event(match, event)
    match = _AER.search(line)
    if match:
        severity_text = (match["severity"] or match["summary"] or "").strip()
        uncorrected = "Uncorrect" in severity_text or "Fatal" in severity_text
        return event(
            "aer", None, _pci_address(line), CRITICAL if uncorrected else WARNING,
            f"PCIe AER: {severity_text}",
            "uncorrected PCIe error: reseat or replace the device or riser" if uncorrected
            else "corrected PCIe errors: check the link if they keep coming")
    if _OFF_THE_BUS.search(line):
        meaning, severity, action = XID_CATALOG[79]
        device = _NVRM_GPU.search(line)
        return event("xid", 79, device["device"] if device else "", severity,
                     meaning + " (reported without an Xid number)", action)
    if _LINK_LIMITED.search(line):
        return event("pcie-link", None, _pci_address(line), WARNING,
                     "PCIe link below its capability",
                     "check the slot, riser and BIOS link settings of this device")
    return None


def _sxid_event(match: re.Match, event) -> KernelEvent:
    """An NVSwitch SXid line as an event: never a GPU Xid; its severity as the line gives it."""
    switch, code, rest = match["switch"], int(match["code"]), match["rest"]
    if head := _SXID_HEADLINE.match(rest):
        fatal = head["severity"] == "Fatal"
        meaning = f"NVSwitch {switch} {head['severity']}: {head['text']}".strip()
    elif detail := _SXID_SEVERITY.match(rest):
        fatal = detail["level"] == "1"
        meaning = (f"NVSwitch {switch} SXid {code}, {'fatal' if fatal else 'non-fatal'} (severity "
                   f"{detail['level']}), engine instance {detail['instance']}; its Fatal/Non-fatal "
                   "line is not in the text")
    else:
        return event("sxid", code, match["device"], WARNING,
                     f"NVSwitch {switch} SXid {code}: only its data line is in the text",
                     "find this SXid's Fatal/Non-fatal line (journalctl -k, the fabric manager "
                     "log) and look it up in NVIDIA's Fabric Manager guide before handover")
    return event("sxid", code, match["device"], CRITICAL if fatal else WARNING, meaning,
                 "fatal SXid: reset the NVSwitch fabric (restart fabric manager or reboot) and check "
                 "the links" if fatal else "non-fatal SXid: watch for recurrence on the same link")


def _pci_address(line: str) -> str:
    match = re.search(r"\b[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\b", line)
    return match.group(0) if match else ""


def _same_gpu(a: str, b: str) -> bool:
    """0000:91:00 (an Xid's address) and 0000:91:00.0 (the driver's other lines) are one GPU."""
    return a.split(".")[0].lower() == b.split(".")[0].lower()


def parse_kernel_log(text: str) -> KernelLog:
    """Events in dmesg, `journalctl -k` or syslog text; empty text is an empty log, not an error.

    One event per SXid headline (its Severity and Data lines are details of it; a detail line
    whose headline is not in the text is an event of its own), and one Xid 79 where the driver
    repeats it on the next line without the number.
    """
    if "\x00" in text:
        raise ParseError("binary data, not kernel log text")
    lines = text.splitlines()
    forms = [_sxid_form(line) for line in lines]
    headlines = {(s, c, n) for s, c, form, n in filter(None, forms) if form == "headline"}
    described = {(s, c) for s, c, form, _ in filter(None, forms) if form != "data"}
    events: list[KernelEvent] = []
    last_gpu, last_uptime, last_time, last_event_line = "", None, None, -2
    for number, (line, form) in enumerate(zip(lines, forms, strict=True)):
        prefix = _split(line)
        named = _NVRM_GPU.search(line)
        if named:
            last_gpu = named["device"]
        elif "NVRM:" not in line:  # the driver's multi-line message ended
            last_gpu = ""
        event = classify(line)
        continuation = prefix.uptime_s is None and prefix.time is None and line.startswith((" ", "\t"))
        last_uptime = prefix.uptime_s if prefix.uptime_s is not None else last_uptime
        last_time = prefix.time or last_time
        if event is None:
            continue
        if form is not None:
            switch, code, kind, instance = form
            if kind == "severity" and (switch, code, instance) in headlines:
                continue
            if kind == "data" and (switch, code) in described:
                continue
            described.add((switch, code))
        if event.kind == "xid" and not event.device and last_gpu:  # the GPU named lines before
            event = replace(event, device=last_gpu)
        if continuation:  # dmesg's continuation lines carry no time of their own
            event = replace(event, uptime_s=last_uptime, time=last_time)
        if (event.code == 79 and "without an Xid" in event.meaning and events
                and last_event_line == number - 1 and events[-1].code == 79
                and events[-1].kind == "xid" and _same_gpu(events[-1].device, event.device)):
            continue  # the driver's second line for the Xid 79 just reported
        events.append(event)
        last_event_line = number
    return KernelLog(events=events, lines=len(lines))


def parse_kernel_log_excerpt(text: str) -> KernelLog:
    """A kernel-log excerpt an operator pasted (`handover parse kernel-log`): dmesg with or
    without timestamps, `dmesg -T`, `journalctl -k`, syslog. Text in which no line looks like
    the kernel's is not one."""
    log = parse_kernel_log(text)
    if not log.events and not any(_split(line).recognised or _NVIDIA_TEXT.search(line)
                                  for line in text.splitlines()):
        raise ParseError("no kernel-log line: expected dmesg, journalctl -k or syslog lines "
                         "(a [seconds] or date prefix, `kernel:`) or NVRM/NVSwitch/AER lines")
    return log


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


PARSERS = {"kernel-log": parse_kernel_log_excerpt}


def kernel_action(events: list[KernelEvent]) -> str:
    """The recommended actions of NVIDIA's catalog for the events, once each: 'xid 79: ...'."""
    return "; ".join(dict.fromkeys(f"{e.kind}{f' {e.code}' if e.code is not None else ''}: {e.action}"
                                   for e in events))
