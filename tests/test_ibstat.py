"""ibstat and ibv_devinfo parsers, and what ibstat does here without an RDMA device.

Real HCA-bearing text: ibv_devinfo of 8x ConnectX-7, and ibstat of a B300 node with 4 ConnectX-7
ports up at 100 Gb/s and 7 ConnectX-8 ports down (a failing case for the GPU profiles); the
no-device case is a real run here. See tests/data/infiniband/PROVENANCE.md.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inventory.loader import load_profile
from inventory.model import Expectations, Node
from runners import ibstat
from runners.parsing import ParseError
from runners.transport import LocalTransport

DATA = Path(__file__).parent / "data" / "infiniband"
ROOT = Path(__file__).resolve().parent.parent


def test_ibv_devinfo_of_eight_connectx7():
    devices = ibstat.parse_ibv_devinfo((DATA / "deepep-issue397_ibv_devinfo_8xCX7-MT4129_IB.txt").read_text())
    assert [h.name for h in devices.hcas] == ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6",
                                              "mlx5_9", "mlx5_10", "mlx5_11"]
    assert {h.ca_type for h in devices.hcas} == {"MT4129"}
    assert {h.firmware for h in devices.hcas} == {"28.41.1000"}
    ports = [p for h in devices.hcas for p in h.ports]
    assert len(ports) == 8 and all(p.state == "Active" and p.link_layer == "InfiniBand" for p in ports)
    assert all(p.rate is None and p.physical_state is None for p in ports)  # plain ibv_devinfo
    assert devices.ok and devices.source == "ibv_devinfo"


def test_ibv_devinfo_with_a_port_down_is_not_ok():
    """DERIVED from the real file: the first port's state changed to PORT_DOWN (1)."""
    devices = ibstat.parse_ibv_devinfo((DATA / "derived_deepep-issue397_ibv_devinfo_first_port_DOWN.txt").read_text())
    assert devices.hcas[0].ports[0].state == "Down" and not devices.ok


XE9780 = "baeyunseon-xe9780_ibstat_4xCX7-MT4129-Rate100_7xMT4131-Down.txt"


def test_ibstat_of_a_real_node_with_eleven_hcas():
    """REAL ibstat (spaces where ibstat prints tabs, as pasted): every CA, type, firmware, port."""
    devices = ibstat.parse_ibstat((DATA / XE9780).read_text())
    names = [hca.name for hca in devices.hcas]
    assert names == ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5",
                     "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]  # ibstat's string order
    cx7 = [hca for hca in devices.hcas if hca.ca_type == "MT4129"]
    assert [hca.name for hca in cx7] == ["mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"]
    assert {hca.firmware for hca in cx7} == {"28.47.2526"}
    assert vars(cx7[0].ports[0]) == {"port": 1, "state": "Active", "physical_state": "LinkUp",
                                     "rate": 100.0, "link_layer": "InfiniBand"}
    down = [hca for hca in devices.hcas if hca.ca_type == "MT4131"]
    assert len(down) == 7 and {hca.firmware for hca in down} == {"40.46.5500"}
    assert {(p.state, p.physical_state, p.rate) for hca in down for p in hca.ports} == {("Down", "Disabled", 10.0)}
    assert not devices.ok and devices.source == "ibstat"


def test_ibstat_with_its_own_tab_indentation_reads_the_same():
    """DERIVED: the real file with ibstat's tabs in place of the paste's spaces."""
    spaces = ibstat.parse_ibstat((DATA / XE9780).read_text())
    tabs = ibstat.parse_ibstat((DATA / "derived_baeyunseon-xe9780_ibstat_tab-indented.txt").read_text())
    assert tabs == spaces


def test_rails_follow_the_hcas_in_natural_order_not_ibstats_string_order():
    devices = ibstat.parse_ibstat((DATA / XE9780).read_text())
    assert ibstat.natural_order(hca.name for hca in devices.hcas) == [f"mlx5_{i}" for i in range(11)]


def test_the_real_node_fails_an_ndr_profile_with_every_reason_named():
    """The real ibstat against the H100 profile's InfiniBand expectations (8x ConnectX-7 NDR 400)."""
    from runners.ibstat import port_problems

    expect = load_profile("h100-sxm-8gpu").expect
    problems = port_problems(ibstat.parse_ibstat((DATA / XE9780).read_text()), expect)
    assert problems[0] == "11 HCA(s), expected 8"
    assert "mlx5_0: CA type MT4131, expected MT4129" in problems
    assert "mlx5_0 port 1: Down/Disabled, expected Active/LinkUp" in problems
    assert "mlx5_2 port 1: rate 100.0 Gb/s, expected 400" in problems
    assert not any(problem.startswith("mlx5_2: CA type") for problem in problems)
    assert not any("link layer" in problem for problem in problems)


def test_other_text_is_not_ibstat_or_ibv_devinfo():
    with pytest.raises(ParseError, match="not ibstat output"):
        ibstat.parse_ibstat((DATA / "deepep-issue397_ibv_devinfo_8xCX7-MT4129_IB.txt").read_text())
    with pytest.raises(ParseError, match="not ibv_devinfo output"):
        ibstat.parse_ibv_devinfo((DATA / "local_ibv_devinfo_ERROR_no_device.stderr.txt").read_text())
    with pytest.raises(ParseError):
        ibstat.parse_ibstat((DATA / "local_ibstat_no_device.stdout.txt").read_text())


@pytest.mark.skipif(shutil.which("ibstat") is None, reason="infiniband-diags is not installed")
def test_ibstat_without_a_device_prints_nothing_and_is_recognised_for_real():
    result = ibstat.probe(LocalTransport(Node("localhost", "localhost", "local")))
    assert result.ok and ibstat.no_device(result) and not ibstat.tool_missing(result)


@pytest.mark.skipif(shutil.which("ibstat") != "/usr/sbin/ibstat", reason="ibstat is not in /usr/sbin here")
def test_ibstat_in_sbin_is_found_with_a_non_root_users_path(monkeypatch):
    """sshd gives a non-root user PATH=/usr/local/bin:/usr/bin:/bin:/usr/games: ibstat, in
    /usr/sbin, is still found, not reported as not installed."""
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/games")
    result = ibstat.probe(LocalTransport(Node("localhost", "localhost", "local")))
    assert result.ok and ibstat.no_device(result) and not ibstat.tool_missing(result), result.explain()
    assert result.command == "ibstat"


def test_a_missing_ibstat_is_told_apart_from_no_device():
    transport = LocalTransport(Node("localhost", "localhost", "local"))
    result = transport.run(["handover-no-such-tool-ibstat"], timeout=10)
    assert ibstat.tool_missing(result) and not ibstat.no_device(result)


@pytest.mark.parametrize("tool, name, expected", [
    ("ibv_devinfo", "deepep-issue397_ibv_devinfo_8xCX7-MT4129_IB.txt", '"ca_type": "MT4129"'),
    ("ibstat", XE9780, '"physical_state": "LinkUp"'),
])
def test_handover_parse_cli(tool, name, expected):
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", tool, str(DATA / name)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and expected in done.stdout and '"hcas"' in done.stdout
    bad = subprocess.run([sys.executable, "-m", "handover.cli", "parse", tool, str(DATA / "PROVENANCE.md")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and f"not {tool} output" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def sysfs_tree(root: Path, counters: dict) -> Path:
    """CONSTRUCTED, not a capture: the kernel's sysfs layout and counter file names
    (<root>/<hca>/ports/<port>/counters/<name>, one integer per file, as in
    /sys/class/infiniband), built in a temporary directory with the given values."""
    for (hca, port), values in counters.items():
        directory = root / hca / "ports" / str(port) / "counters"
        directory.mkdir(parents=True)
        for name, value in values.items():
            (directory / name).write_text(f"{value}\n")
    return root


CLEAN = {"symbol_error": 0, "link_downed": 0, "port_rcv_errors": 0, "port_xmit_discards": 7}


def read_tree(root: Path) -> ibstat.IbCounters:
    """The node-side payload run for real on the tree, its JSON parsed."""
    result = ibstat.probe_counters(LocalTransport(Node("localhost", "localhost", "local")), str(root))
    assert result.ok, result.stderr
    return ibstat.parse_ib_counters(result.stdout)


def test_counters_of_every_port_are_read_from_a_sysfs_shaped_tree(tmp_path):
    root = sysfs_tree(tmp_path / "infiniband", {("mlx5_0", 1): CLEAN, ("mlx5_1", 1): CLEAN,
                                                ("mlx5_1", 2): {**CLEAN, "symbol_error": 3}})
    found = read_tree(root)
    assert found.present and [(p.hca, p.port) for p in found.ports] == [
        ("mlx5_0", "1"), ("mlx5_1", "1"), ("mlx5_1", "2")]
    assert found.ports[2].counters["symbol_error"] == 3 and found.ports[0].counters["port_xmit_discards"] == 7
    assert ibstat.counter_problems(found, Expectations()) == ["mlx5_1 port 2: symbol_error = 3, limit 0"]
    assert ibstat.counter_problems(found, Expectations(ib_symbol_errors_max=5)) == []


def test_missing_or_unreadable_counters_are_problems_not_zeros(tmp_path):
    root = sysfs_tree(tmp_path / "infiniband", {("mlx5_0", 1): {"symbol_error": "garbage",
                                                                "link_downed": 1}})
    problems = ibstat.counter_problems(read_tree(root), Expectations(ib_link_downed_max=0))
    assert problems == ["mlx5_0 port 1: symbol_error is not a number",
                        "mlx5_0 port 1: link_downed = 1, limit 0",
                        "mlx5_0 port 1: port_rcv_errors is missing from sysfs"]


def test_a_counter_at_its_ceiling_is_said_to_be_saturated(tmp_path):
    """IB PortCounters stop at their width (symbol_error 16 bits, link_downed 8) instead of wrapping:
    such a reading is a floor. The tree is derived from CLEAN with the ceilings written in."""
    root = sysfs_tree(tmp_path / "infiniband", {("mlx5_0", 1): {**CLEAN, "symbol_error": 65535, "link_downed": 254}})
    assert ibstat.counter_problems(read_tree(root), Expectations(ib_link_downed_max=300)) == [
        "mlx5_0 port 1: symbol_error = 65535, limit 0: saturated, it counts no further (that many errors or "
        "more since it was cleared)"]


def test_no_sysfs_class_directory_means_no_device(tmp_path):
    found = read_tree(tmp_path / "absent")
    assert not found.present and found.ports == []
    with pytest.raises(ParseError):
        ibstat.parse_ib_counters("not json")


# ------------------------------------------------------------------ the tools' own error lines

GPUD_IBPANIC = "gpud-testdata_ibstat-39.0_8xMT4124-Active_then_ibpanic_stat_failed.txt"


def test_ibpanic_after_eight_active_cas_fails_the_parse():
    """REAL ibstat (infiniband-diags 39.0, A100 node, gpud testdata): eight CAs Active/LinkUp at
    200, then ibpanic on the ninth, which is missing from the list."""
    devices = ibstat.parse_ibstat((DATA / GPUD_IBPANIC).read_text())
    assert [hca.name for hca in devices.hcas] == [f"mlx5_{i}" for i in range(8)]
    assert all(port.healthy for hca in devices.hcas for port in hca.ports)
    assert devices.errors == ["ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: "
                              "No such file or directory"]
    assert not devices.ok
    problems = ibstat.port_problems(devices, Expectations())
    assert problems == ["ibstat reported an error: " + devices.errors[0]]


def test_ibwarn_of_newer_ibstat_fails_the_parse_too():
    """DERIVED from the real file: its ibpanic line in the wording rdma-core 703b52c prints
    instead (IBWARN "stat of IB device '%s' failed", then it goes on and exits 0)."""
    name = "derived_gpud-testdata_ibstat_ibwarn_stat_failed_as_rdma-core-703b52c.txt"
    devices = ibstat.parse_ibstat((DATA / name).read_text())
    assert len(devices.hcas) == 8 and devices.errors[0].startswith("ibwarn: ") and not devices.ok


def test_an_error_line_alone_is_not_an_hca_list_but_says_what_the_tool_said():
    """REAL: ibstat here asked for a CA that is not there (stderr, exit 255), and the ibpanic
    line quoted in linux-rdma/rdma-core#239."""
    local = (DATA / "local_ibstat_named_device_ibpanic.stderr.txt").read_text()
    assert (DATA / "local_ibstat_named_device_ibpanic.rc.txt").read_text().strip() == "exit code: 255"
    with pytest.raises(ParseError, match=r"not ibstat output \(the tool said: ibpanic: \[\d+\] main: "
                                         r"'mlx5_0' IB device can't be found"):
        ibstat.parse_ibstat(local)
    with pytest.raises(ParseError, match="stat of IB device 'mlx5_1' failed: Invalid argument"):
        ibstat.parse_ibstat((DATA / "rdma-core-pr239_ibstat_ibpanic_stat_failed_invalid_argument.txt").read_text())


def test_ibv_devinfo_that_could_not_open_devices_fails_the_parse():
    """REAL ibv_devinfo (hustcat/k8s-rdma-device-plugin#8): one ConnectX-3 port Active among
    eight "Failed to open device" lines."""
    name = "k8s-rdma-device-plugin-issue8_ibv_devinfo_failed_to_open_device_around_an_active_port.txt"
    devices = ibstat.parse_ibv_devinfo((DATA / name).read_text())
    assert [(hca.name, hca.ca_type, port.state) for hca in devices.hcas for port in hca.ports] == [
        ("mlx4_2", "MT4100", "Active")]
    assert devices.errors == ["Failed to open device"] * 8 and not devices.ok
    with pytest.raises(ParseError, match=r"not ibv_devinfo output \(the tool said: Failed to get IB devices list"):
        ibstat.parse_ibv_devinfo((DATA / "local_ibv_devinfo_ERROR_no_device.stderr.txt").read_text())


def test_handover_parse_says_ok_false_for_a_list_with_an_error_line():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "ibstat", str(DATA / GPUD_IBPANIC)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and '"ok": false' in done.stdout and "ibpanic: [1400444]" in done.stdout
