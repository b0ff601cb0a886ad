"""Kernel-log scan: real dmesg lines (tests/data/kernel-log, PROVENANCE.md there), lines whose
wording is public, and the payload's dmesg-then-journalctl reading run for real here.

Sources of the lines below (none was captured on this machine):
- XID 79 and the `(0000:03:00): 14` form: examples quoted in leptonai/gpud's xid package
  (pkg/.../xid, comments citing NVIDIA's XID_Errors.pdf).
- XID 48/63/74/94/95/119/154: the `NVRM: Xid (PCI:dddd:bb:dd): N, pid=..., name=..., <text>` layout
  of those examples with each Xid's wording from NVIDIA's public XID catalog (docs.nvidia.com/deploy/xid-errors):
  composed, not captured.
- SXid: the `nvidia-nvswitchN: SXid (PCI:...): NNNNN, Non-fatal|Fatal, Link L ...` lines quoted in
  public NVSwitch tooling tests (e.g. "20009, Non-fatal, Link 28 RX Short Error Rate") and the
  driver's format string `"%s: SXid (PCI:" ... "): %05d, "`.
- AER and link-limited lines: composed from the Linux kernel's format strings
  (drivers/pci/pcie/aer.c "PCIe Bus Error: severity=%s, type=%s, (%s)", drivers/pci/pci.c
  "%u.%03u Gb/s available PCIe bandwidth, limited by %s x%d link at %s (capable of ...)").
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from inventory.model import Node
from runners import kernel_log, payloads
from runners.parsing import ParseError
from runners.transport import LocalTransport

LINES = {
    79: "[6085126.134786] NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    14: "[  12.000001] NVRM: Xid (0000:03:00): 14, Channel 00000001",
    48: "[  100.5] NVRM: Xid (PCI:0000:18:00): 48, pid=1234, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
    63: "NVRM: Xid (PCI:0000:18:00): 63, pid=1234, name=python, Row Remapper: New row marked for remapping, reset gpu to activate.",
    74: "NVRM: Xid (PCI:0000:2a:00): 74, pid=4321, name=pt_main_thread, NVLink: fatal error detected on link 3",
    94: "NVRM: Xid (PCI:0000:9b:00): 94, pid=77, name=python, Contained: SM (0x1). RST: No, D-RST: No",
    95: "NVRM: Xid (PCI:0000:9b:00): 95, pid=77, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "NVRM: Xid (PCI:0000:bb:00): 119, pid=2000, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU0 GSP!",
    154: "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
}
SXID_NONFATAL = "kernel: [123.456789] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28 RX Short Error Rate"
SXID_FATAL = "nvidia-nvswitch3: SXid (PCI:0000:59:00.0): 23001, Fatal, Link 12 Always Fatal"
AER_CORRECTED = "[  50.1] pcieport 0000:00:01.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
AER_FATAL = "[  50.2] pcieport 0000:00:03.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)"
LIMITED = "[   3.2] pci 0000:18:00.0: 63.012 Gb/s available PCIe bandwidth, limited by 8.0 GT/s PCIe x8 link at 0000:17:01.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)"


@pytest.mark.parametrize("code, severity", [(79, "critical"), (48, "critical"), (63, "warning"),
                                            (74, "critical"), (94, "warning"), (95, "critical"),
                                            (119, "critical"), (154, "critical"), (14, "warning")])
def test_xid_severity(code, severity):
    event = kernel_log.classify(LINES[code])
    assert (event.kind, event.code, event.severity) == ("xid", code, severity)
    assert event.action


def test_xid_device_uptime_and_meaning():
    event = kernel_log.classify(LINES[79])
    assert (event.device, event.uptime_s, event.meaning) == ("0000:05:00", 6085126.134786,
                                                             "GPU has fallen off the bus")
    assert "drain the node" in event.action
    assert kernel_log.classify(LINES[14]).meaning == "not in the harness's catalog"


def test_sxid_severity_from_fatal_word():
    nonfatal, fatal = kernel_log.classify(SXID_NONFATAL), kernel_log.classify(SXID_FATAL)
    assert (nonfatal.kind, nonfatal.code, nonfatal.severity, nonfatal.device) == (
        "sxid", 20009, "warning", "0000:c3:00.0")
    assert (fatal.code, fatal.severity) == (23001, "critical")


def test_aer_and_limited_links():
    assert kernel_log.classify(AER_CORRECTED).severity == "warning"
    fatal = kernel_log.classify(AER_FATAL)
    assert (fatal.kind, fatal.severity, fatal.device) == ("aer", "critical", "0000:00:03.1")
    limited = kernel_log.classify(LIMITED)
    assert (limited.kind, limited.device) == ("pcie-link", "0000:18:00.0")


def test_log_with_unrelated_lines():
    text = "\n".join(["[ 0.0] Linux version 6.1.0", LINES[63], "random line", AER_CORRECTED])
    log = kernel_log.parse_kernel_log(text)
    assert log.lines == 4 and [e.kind for e in log.events] == ["xid", "aer"] and log.ok
    assert not kernel_log.parse_kernel_log(text + "\n" + LINES[95]).ok


DATA = Path(__file__).parent / "data" / "kernel-log"


def read_here(*args: str, argv_prefix: tuple[str, ...] = ()):
    """The kernel_log payload run for real on this machine (as root, as the test runner is)."""
    transport = LocalTransport(Node("here", "here", "local"))
    return transport.run([*argv_prefix, "-", *args], stdin=payloads.load("kernel_log"), timeout=60)


def test_real_h200_nvrm_lines_are_not_events():
    log = kernel_log.parse_kernel_log((DATA / "h200_dmesg_nvrm_lines.txt").read_text())
    assert (log.lines, log.events, log.ok) == (3, [], True)


def test_real_local_dmesg_has_no_events():
    log = kernel_log.parse_kernel_log((DATA / "local_dmesg_boot_excerpt.txt").read_text())
    assert log.lines == 40 and log.events == []


def test_fallen_off_the_bus_over_three_lines_without_an_xid():
    """Real dmesg from NVIDIA/NVSentinel#155: the GPU is named two lines before the words."""
    log = kernel_log.parse_kernel_log(
        (DATA / "nvsentinel-issue155_dmesg_fallen_off_bus_without_xid.txt").read_text())
    [event] = log.events
    assert (event.kind, event.code, event.device, event.severity, event.uptime_s) == (
        "xid", 79, "0000:b3:00.0", "critical", 1843.308145)
    assert "without an Xid" in event.meaning and "drain the node" in event.action
    assert not log.ok


def test_gpu_at_address_has_fallen_off_the_bus():
    log = kernel_log.parse_kernel_log((DATA / "bumblebee-issue554_dmesg_gpu_at_fallen_off_bus.txt").read_text())
    assert [(e.code, e.device, e.uptime_s) for e in log.events] == [
        (79, "0000:01:00.0", 49.261458), (79, "0000:01:00.0", 49.261472)]


def test_unreadable_log_says_why_for_each_command_in_order():
    """Real payload output as an unprivileged user here: dmesg_restrict, then no journal."""
    read = kernel_log.parse_kernel_read(
        (DATA / "local_payload_as_nobody_dmesg_restricted_no_journal.json").read_text())
    assert not read.readable and read.log.events == []
    reason = read.unreadable_reason()
    assert reason.index("`dmesg`: dmesg: read kernel buffer failed: Operation not permitted") \
        < reason.index("`journalctl -k -b -o short-monotonic --no-pager`: no kernel messages: "
                       "No journal files were found.")


def test_events_split_at_the_runs_start():
    """DERIVED: the real local dmesg excerpt (from 7611.77 s) with composed Xid lines appended:
    an Xid 48 at 7612.0 s (before the window, which opens at 7650 s), an Xid 95 at 7700.5 s
    (during) and an untimed Xid 63 (time unknown, so counted as earlier)."""
    text = (DATA / "local_dmesg_boot_excerpt.txt").read_text() + "\n".join([
        LINES[48].replace("[  100.5]", "[ 7612.000000]"),
        LINES[95].replace("NVRM:", "[ 7700.500000] NVRM:", 1),
        LINES[63]])
    output = {"source": "dmesg", "text": text, "uptime_s": 7800.0, "window_start_uptime_s": 7650.0,
              "attempts": [{"command": "dmesg", "exit": 0, "error": ""}]}
    read = kernel_log.parse_kernel_read(json.dumps(output))
    assert [e.code for e in read.during_run()] == [95]
    assert [e.code for e in read.before_run()] == [48, 63]
    no_window = kernel_log.parse_kernel_read(json.dumps({**output, "window_start_uptime_s": None}))
    assert no_window.during_run() == [] and len(no_window.before_run()) == 3


def test_payload_output_that_is_not_the_payloads_is_a_parse_error():
    with pytest.raises(ParseError):
        kernel_log.parse_kernel_read((DATA / "local_dmesg_boot_excerpt.txt").read_text())
    with pytest.raises(ParseError):
        kernel_log.parse_kernel_read('{"source": "dmesg"}')


def test_dmesg_read_here_with_the_runs_window():
    """Real: this machine's dmesg through the payload, window opened 60 s (+ margin) ago."""
    started = datetime.now(timezone.utc) - timedelta(seconds=60)
    result = kernel_log.read(LocalTransport(Node("here", "here", "local")), started)
    assert result.ok, result.stderr
    read = kernel_log.parse_kernel_read(result.stdout)
    assert read.source == "dmesg" and read.attempts == [{"command": "dmesg", "exit": 0, "error": ""}]
    assert read.log.lines > 0
    opened_ago = read.uptime_s - read.window_start_uptime_s
    assert 60 + kernel_log.WINDOW_MARGIN_S <= opened_ago < 60 + kernel_log.WINDOW_MARGIN_S + 30


def test_journalctl_is_tried_when_dmesg_is_missing():
    """Real: no such dmesg program, then this VM's journalctl, which finds no journal."""
    result = read_here("--dmesg", "/nonexistent/dmesg", argv_prefix=(sys.executable,))
    read = kernel_log.parse_kernel_read(result.stdout)
    assert [a["command"].split()[0] for a in read.attempts] == ["/nonexistent/dmesg", "journalctl"]
    assert "not installed" in read.attempts[0]["error"]
    assert read.source is None and "journalctl" in read.unreadable_reason()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_unprivileged_user_falls_back_and_is_told_why():
    """Real: as nobody, dmesg_restrict refuses dmesg (skipped where dmesg_restrict is 0)."""
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict is 0 here: dmesg is readable by everyone")
    result = read_here(argv_prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                    "/usr/bin/python3"))
    read = kernel_log.parse_kernel_read(result.stdout)
    assert read.attempts[0]["exit"] == 1 and "Operation not permitted" in read.attempts[0]["error"]
    assert read.attempts[1]["command"].startswith("journalctl -k -b")
    if not read.readable:
        assert "No journal files were found" in read.unreadable_reason()


def test_a_gpu_named_before_an_unrelated_line_is_not_blamed():
    """DERIVED: the NVSentinel#155 lines with a real line of this VM's dmesg put between the
    line naming the GPU and the words "fallen off the bus": no device can be attributed."""
    first, *rest = (DATA / "nvsentinel-issue155_dmesg_fallen_off_bus_without_xid.txt").read_text().splitlines()
    unrelated = (DATA / "local_dmesg_boot_excerpt.txt").read_text().splitlines()[0]
    [event] = kernel_log.parse_kernel_log("\n".join([first, unrelated, *rest])).events
    assert (event.code, event.device) == (79, "")
