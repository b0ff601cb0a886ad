"""Kernel-log scan: lines whose wording is public, with their sources, and dmesg read for real.

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

import pytest

from inventory.model import Node
from runners import kernel_log
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


def test_dmesg_here_is_read_or_skipped_with_a_reason():
    result = kernel_log.read(LocalTransport(Node("here", "here", "local")))
    reason = kernel_log.unreadable_reason(result)
    if reason is None:
        assert result.ok
        kernel_log.parse_kernel_log(result.stdout)
    else:
        assert "dmesg" in reason
