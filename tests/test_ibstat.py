"""ibstat and ibv_devinfo parsers, and what ibstat does here without an RDMA device.

Real HCA-bearing text exists only for ibv_devinfo (8x ConnectX-7); the ibstat layout test uses a
CONSTRUCTED file (see tests/data/infiniband/PROVENANCE.md), the no-device case a real run.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inventory.model import Node
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


def test_ibstat_layout_constructed_from_the_documented_format():
    """CONSTRUCTED input (no real ibstat with HCAs was available): field names and indentation
    as tool-formats.md section 9 documents them."""
    devices = ibstat.parse_ibstat((DATA / "CONSTRUCTED_ibstat_layout_from_tool-formats-s9.txt").read_text())
    first, second = devices.hcas
    assert (first.name, first.ca_type, first.firmware) == ("mlx5_0", "MT4129", "28.41.1000")
    assert vars(first.ports[0]) == {"port": 1, "state": "Active", "physical_state": "LinkUp",
                                    "rate": 400.0, "link_layer": "InfiniBand"}
    assert (second.ports[0].state, second.ports[0].physical_state, second.ports[0].rate) == ("Down", "Polling", 10.0)
    assert not devices.ok and devices.source == "ibstat"


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


def test_a_missing_ibstat_is_told_apart_from_no_device():
    transport = LocalTransport(Node("localhost", "localhost", "local"))
    result = transport.run(["handover-no-such-tool-ibstat"], timeout=10)
    assert ibstat.tool_missing(result) and not ibstat.no_device(result)


@pytest.mark.parametrize("tool, name, expected", [
    ("ibv_devinfo", "deepep-issue397_ibv_devinfo_8xCX7-MT4129_IB.txt", '"ca_type": "MT4129"'),
    ("ibstat", "CONSTRUCTED_ibstat_layout_from_tool-formats-s9.txt", '"physical_state": "LinkUp"'),
])
def test_handover_parse_cli(tool, name, expected):
    done = subprocess.run([sys.executable, "-m", "reports.cli", "parse", tool, str(DATA / name)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and expected in done.stdout and '"hcas"' in done.stdout
    bad = subprocess.run([sys.executable, "-m", "reports.cli", "parse", tool, str(DATA / "PROVENANCE.md")],
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
    assert ibstat.counter_problems(found, {}) == ["mlx5_1 port 2: symbol_error = 3, limit 0"]
    assert ibstat.counter_problems(found, {"ib_symbol_errors_max": 5}) == []


def test_missing_or_unreadable_counters_are_problems_not_zeros(tmp_path):
    root = sysfs_tree(tmp_path / "infiniband", {("mlx5_0", 1): {"symbol_error": "garbage",
                                                                "link_downed": 1}})
    problems = ibstat.counter_problems(read_tree(root), {"ib_link_downed_max": 0})
    assert problems == ["mlx5_0 port 1: symbol_error is not a number",
                        "mlx5_0 port 1: link_downed = 1, limit 0",
                        "mlx5_0 port 1: port_rcv_errors is missing from sysfs"]


def test_no_sysfs_class_directory_means_no_device(tmp_path):
    found = read_tree(tmp_path / "absent")
    assert not found.present and found.ports == []
    with pytest.raises(ParseError):
        ibstat.parse_ib_counters("not json")
