"""The warning a session gives when this machine's neighbour table cannot hold an entry for every
node it reaches directly (runners/neighbours.py)."""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest
import yaml

from inventory.model import Node
from runners import ssh
from runners.neighbours import ENTRY_LIMITS, ROUTE_TABLES, on_link_networks

REPO = Path(__file__).resolve().parent.parent


def _iproute2_on_link(version: int) -> set[str]:
    """What `ip route` shows reached without a router, in the main table."""
    shown = json.loads(subprocess.run(["ip", "-j", f"-{version}", "route", "show"], capture_output=True,
                                      text=True, check=True).stdout)
    return {str(ipaddress.ip_network(route["dst"])) for route in shown
            if "gateway" not in route and "via" not in route and route["dst"] != "default"
            and route.get("type", "unicast") == "unicast" and route.get("dev") != "lo"}


def test_on_link_networks_are_the_routes_iproute2_shows_without_a_router(ns_cluster):
    for version in (4, 6):
        found = {str(network) for network in on_link_networks(ROUTE_TABLES[version].read_text(), version)}
        assert found == _iproute2_on_link(version), version
    cluster_network = ipaddress.ip_network(f"{ns_cluster.nodes[0].address}/24", strict=False)
    assert cluster_network in on_link_networks(ROUTE_TABLES[4].read_text(), 4)


def _collect(tmp_path: Path, sign_key: Path, nodes: list[dict], extra: dict) -> subprocess.CompletedProcess:
    """pytest --collect-only under a kernel whose neighbour table holds 16 entries: the limit
    is bind-mounted over its sysctl in a mount namespace of the run's own."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"cluster": "crowded", "profile": "cpu-only",
                                         "ssh": {"host_keys": "accept-new", **extra}, "nodes": nodes}))
    limit = tmp_path / "gc_thresh3"
    limit.write_text("16\n")
    pytest_argv = [sys.executable, "-m", "pytest", "--inventory", str(inventory), "--sign-key", str(sign_key),
                   "--collect-only", "-q"]
    script = 'mount --make-rprivate / && mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(limit), str(ENTRY_LIMITS[4]),
                           *pytest_argv], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_more_nodes_on_this_machines_network_than_its_neighbour_table_holds_is_said_first(
        tmp_path, sign_key, ns_cluster):
    network = ipaddress.ip_network(f"{ns_cluster.nodes[0].address}/24", strict=False)
    nodes = [{"name": f"n{index:02}", "address": str(address)}
             for index, address in enumerate(islice(network.hosts(), 20), 1)]
    crowded = _collect(tmp_path, sign_key, nodes, {})
    assert crowded.returncode == 0, crowded.stdout + crowded.stderr
    said = next((line for line in crowded.stdout.splitlines()
                 if line.startswith("warning: 20 nodes are on this machine's own networks (")), "")
    # the networks named are every on-link one: other tests' clusters may be up beside this one's
    assert (str(network) in said
            and "but its kernel keeps at most 16 neighbour entries (net.ipv4.neigh.default.gc_thresh3)" in said
            and "sysctl -w net.ipv4.neigh.default.gc_thresh1=32 net.ipv4.neigh.default.gc_thresh2=64 "
                "net.ipv4.neigh.default.gc_thresh3=128" in said), crowded.stdout

    behind_a_jump_host = _collect(tmp_path, sign_key, nodes, {"jump": str(network.network_address + 254)})
    few_on_link = _collect(tmp_path, sign_key, nodes[:16], {})
    routed = _collect(tmp_path, sign_key, [{"name": f"r{index:02}", "address": f"198.51.100.{index}"}
                                           for index in range(1, 21)], {})  # TEST-NET-2, via a router
    for quiet in (behind_a_jump_host, few_on_link, routed):
        assert quiet.returncode == 0 and "neighbour" not in quiet.stdout, quiet.stdout + quiet.stderr


def test_a_local_session_loads_no_ssh_library_for_the_check():
    code = ("import sys; from inventory.model import Node; from runners.neighbours import neighbour_table_warning; "
            "assert neighbour_table_warning([Node('n', 'n', 'local')]) is None; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fabric', 'paramiko', 'invoke')))")
    shown = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip() == "[]", shown.stdout + shown.stderr


@pytest.fixture
def ssh_config(tmp_path, monkeypatch):
    """Write ~/.ssh/config (HOME in tmp_path) for runners.ssh to read, its cache cleared around."""
    (tmp_path / ".ssh").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))

    def write(text: str) -> None:
        (tmp_path / ".ssh" / "config").write_text(text)
        ssh._ssh_config.cache_clear()

    yield write
    ssh._ssh_config.cache_clear()


def test_the_bastion_of_a_host_star_proxyjump_counts_as_reached_directly(ssh_config):
    """Under `Host *` ProxyJump bastion, the bastion itself is connected to directly (as ssh and
    the transport do), so it costs a neighbour entry; the nodes behind it do not."""
    ssh_config("Host gpu*\n  HostName %h.fabric\nHost *\n  ProxyJump ops@bastion:2222\n")
    assert ssh.direct_host(Node("bastion", "bastion", "ssh")) == "bastion"
    assert ssh.direct_host(Node("gpu001", "gpu001", "ssh")) is None


def test_a_jump_hop_at_an_ipv6_address_is_read_as_ssh_writes_it(ssh_config):
    """ProxyJump [2001:db8::1]:2222, as ssh -J and the inventory's ssh.jump take it: its host is
    the address inside the brackets (it raised ValueError, the port read from 'db8::1]:2222')."""
    ssh_config("Host *\n  ProxyJump ops@[2001:db8::1]:2222\n")
    assert ssh.direct_host(Node("bastion6", "2001:db8::1", "ssh")) == "2001:db8::1"
    assert ssh.direct_host(Node("gpu001", "gpu001", "ssh")) is None
