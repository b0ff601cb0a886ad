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
import subprocess
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
ROOT = Path(__file__).resolve().parent.parent


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


# ------------------------------------------------------------------ pasted excerpts (handover parse)
# Real kernel-log text from public repositories and issues: tests/data/kernel-log/PROVENANCE.md.


def excerpt(name: str) -> kernel_log.KernelLog:
    return kernel_log.parse_kernel_log_excerpt((DATA / name).read_text())


def test_dmesg_ctime_dates_with_repeated_gsp_timeouts():
    """Real `dmesg -T` (gpud testdata): five Xid 119 on one GPU among RPC history and a stack."""
    log = excerpt("gpud-testdata_dmesg-ctime_xid119_gsp-rpc-timeout.txt")
    assert [(e.code, e.device) for e in log.events] == [(119, "0000:9b:00")] * 5
    first = log.events[0]
    assert (first.time, first.uptime_s, first.severity) == ("Sun Feb 23 16:24:18 2025", None, "critical")
    assert log.events[-1].time == "Sun Feb 23 16:30:13 2025" and not log.ok


def test_sxid_lines_are_nvswitch_events_one_per_headline():
    """Real dmesg (NVIDIA/nvtrust#124): Data, Non-fatal and Severity 0 lines of three links."""
    log = excerpt("nvtrust-issue124_dmesg_sxid22013_nonfatal_with_detail_lines.txt")
    assert [(e.kind, e.code, e.device, e.severity) for e in log.events] == [
        ("sxid", 22013, "0000:04:00.0", "warning")] * 3
    assert [e.meaning for e in log.events] == [
        f"NVSwitch nvswitch3 Non-fatal: Link {link} Minion Link DLREQ interrupt" for link in (44, 45, 46)]
    assert not any(e.kind == "xid" for e in log.events) and log.ok


def test_xid79_with_fatal_sxids_and_a_severity_line_whose_headline_is_missing():
    """Real dmesg quoted in gpud's SXid README: Xid 79, its repeat without the number, and
    SXid 20034 Fatal on three switches; nvswitch2's link 60 shows only its Severity 1 line."""
    log = excerpt("gpud-sxid-readme_dmesg_xid79_and_sxid20034_fatal.txt")
    xids = [e for e in log.events if e.kind == "xid"]
    assert [(e.code, e.device, e.uptime_s) for e in xids] == [(79, "0000:91:00", 6781741.548779)]
    sxids = [e for e in log.events if e.kind == "sxid"]
    assert [(e.code, e.line.split(":")[0].split("] ")[1], e.severity) for e in sxids] == [
        (20034, "nvidia-nvswitch1", "critical"), (20034, "nvidia-nvswitch0", "critical"),
        (20034, "nvidia-nvswitch2", "critical"), (20034, "nvidia-nvswitch2", "critical"),
        (20034, "nvidia-nvswitch0", "critical")]
    assert "engine instance 60" in sxids[2].meaning and "Fatal/Non-fatal line is not" in sxids[2].meaning
    assert not log.ok


def test_an_sxid_data_line_alone_is_one_event_of_unknown_severity():
    """Real `dmesg -x --time-format iso` line quoted in leptonai/gpud#338."""
    [event] = excerpt("gpud-pr338_dmesg-decode-iso_sxid12028_data_line_only.txt").events
    assert (event.kind, event.code, event.device, event.severity) == ("sxid", 12028, "0000:84:00.0", "warning")
    assert event.time == "2025-01-25T10:34:54,859532+00:00" and "only its data line" in event.meaning


def test_aer_surprise_down_then_the_gpu_falls_off_the_bus():
    """Real dmesg (wilicc/gpu-burn#1): corrected AER, an uncorrected fatal one, then Xid 79."""
    log = excerpt("gpuburn-issue1_dmesg_aer_surprise_down_then_xid79.txt")
    assert [(e.kind, e.severity) for e in log.events] == [
        ("aer", "warning"), ("aer", "warning"), ("aer", "critical"), ("aer", "critical"),
        ("xid", "critical")]
    assert log.events[3].meaning == "PCIe AER: Uncorrected (Fatal)"
    assert (log.events[-1].code, log.events[-1].device) == (79, "0000:02:00") and not log.ok


def test_xid79_repeated_on_the_next_line_without_the_number_is_one_event():
    """Real dmesg (NVIDIA/nvidia-docker#1553): Xid 79, then "GPU 0000:09:00.0: GPU has fallen
    off the bus.", then a corrected AER error much later."""
    log = excerpt("nvidia-docker-issue1553_dmesg_xid79_and_its_fallen_off_the_bus_line.txt")
    assert [(e.kind, e.code) for e in log.events] == [("xid", 79), ("aer", None), ("aer", None)]
    assert log.events[0].line.endswith("79, pid=0, GPU has fallen off the bus.")


def test_syslog_prefix_with_dmesg_seconds_inside():
    """Real syslog (pop-os/pop#3363): "Sep 19 16:18:02 bubz kernel: [68183.615790] ..."."""
    log = excerpt("pop-issue3363_syslog_aer_correctable.txt")
    assert len(log.events) == 6 and log.ok
    first = log.events[0]
    assert (first.time, first.host, first.uptime_s, first.device) == (
        "Sep 19 16:18:02", "bubz", 68183.61579, "0000:00:03.1")
    assert log.events[1].meaning == "PCIe AER: Correctable"


def test_journalctl_with_a_localized_month():
    """Real `journalctl` (hirschmann/nbfc#181): "jan. 29 20:50:17 kevin kernel: ..."."""
    log = excerpt("nbfc-issue181_journalctl_aer_corrected_localized_month.txt")
    assert [(e.kind, e.severity, e.time, e.host) for e in log.events] == [
        ("aer", "warning", "jan. 29 20:50:17", "kevin")] * 2


def test_dmesg_relative_times_and_an_uncorrected_fatal_error():
    """Real `dmesg -H` (rwth-i6/returnn#1500): relative times, no seconds since boot."""
    log = excerpt("returnn-issue1500_dmesg-reltime_aer_uncorrected_fatal.txt")
    assert [e.meaning for e in log.events] == ["PCIe AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0",
                                               "PCIe AER: Uncorrected (Fatal)"]
    assert all(e.uptime_s is None and e.severity == "critical" for e in log.events)


def test_kernel_prefixed_xid45_lines():
    """Real lines (NVIDIA/open-gpu-kernel-modules#1150): "kernel: NVRM: Xid (...): 45, ..."."""
    log = excerpt("opengpu-issue1150_kernel-prefix_xid45_after_xid149_145.txt")
    assert [e.code for e in log.events] == [45] * 7 and {e.severity for e in log.events} == {"info"}
    assert log.events[0].device == "0000:dc:00" and log.ok


def test_nvlink_xids_take_their_severity_from_the_line():
    """Real kmsg lines quoted in leptonai/gpud#1160 and #1174: Xid 144/145 Nonfatal, 149 Fatal."""
    log = excerpt("gpud-prs1160-1174_kmsg_nvlink_xid144_145_149.txt")
    assert [(e.code, e.severity) for e in log.events] == [
        (144, "warning"), (149, "critical"), (149, "critical"), (145, "warning")]
    assert log.events[1].meaning == "NVLink NETIR error (fatal)"


def test_a_healthy_journal_is_a_kernel_log_without_events():
    """Real `journalctl -o short-iso` (gpud testdata): kernel lines, none of them an event."""
    log = excerpt("gpud-testdata_journalctl-short-iso_peermem_no_gpu_events.txt")
    assert (log.lines, log.events, log.ok) == (47, [], True)
    assert kernel_log.parse_kernel_log_excerpt((DATA / "h200_dmesg_nvrm_lines.txt").read_text()).ok


def test_text_without_a_kernel_log_line_is_not_a_kernel_log():
    with pytest.raises(ParseError, match="no kernel-log line"):
        kernel_log.parse_kernel_log_excerpt("this is not the output of any tool\n")
    with pytest.raises(ParseError, match="no kernel-log line"):  # real: journalctl with no journal
        kernel_log.parse_kernel_log_excerpt((DATA / "local_journalctl_k_no_journal.stdout.txt").read_text())


def test_cli_parses_a_pasted_excerpt_with_ok():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "kernel-log",
                           str(DATA / "gpud-sxid-readme_dmesg_xid79_and_sxid20034_fatal.txt")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout)
    assert parsed["ok"] is False and parsed["events"][0]["code"] == 79
    assert {e["kind"] for e in parsed["events"]} == {"xid", "sxid"}
