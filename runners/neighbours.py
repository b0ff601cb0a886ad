"""Whether this machine's kernel can keep a neighbour (ARP, or NDP for IPv6) entry for every node
it reaches directly.

The kernel keeps at most net.ipv4.neigh.default.gc_thresh3 entries (1,024 by default) and refuses
new ones past that ("neighbour table overflow" in dmesg): with 1,024 namespace nodes on one bridge
here, 512 healthy nodes never answered a connect. A node behind a router or a jump host costs no
entry of its own, so only the nodes on this machine's own networks count.
"""
from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Iterable, Optional, Union

from inventory.model import Node

IpNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
IpAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

# A route's flags (linux/route.h, ipv6_route.h): reached through a router, unreachable, or
# one of this machine's own addresses (IPv6's table lists the local table's routes too).
NOT_ON_LINK = 0x0002 | 0x0200 | 0x80000000  # RTF_GATEWAY | RTF_REJECT | RTF_LOCAL
ROUTE_TABLES = {4: Path("/proc/net/route"), 6: Path("/proc/net/ipv6_route")}
ENTRY_LIMITS = {4: Path("/proc/sys/net/ipv4/neigh/default/gc_thresh3"),
                6: Path("/proc/sys/net/ipv6/neigh/default/gc_thresh3")}
FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}


def on_link_networks(route_table: str, version: int) -> list[IpNetwork]:
    """The networks a route table (/proc/net/route, /proc/net/ipv6_route) reaches without a
    router; loopback, local, default and multicast routes aside."""
    networks: list[IpNetwork] = []
    lines = route_table.splitlines()
    for line in lines[1:] if version == 4 else lines:  # IPv4's table has a header line
        fields = line.split()
        destination: IpAddress
        if version == 4 and len(fields) >= 8:
            iface, flags = fields[0], int(fields[3], 16)
            destination = ipaddress.IPv4Address(int.from_bytes(bytes.fromhex(fields[1]), "little"))
            prefix = bin(int.from_bytes(bytes.fromhex(fields[7]), "little")).count("1")
        elif version == 6 and len(fields) >= 10:
            iface, flags = fields[9], int(fields[8], 16)
            destination, prefix = ipaddress.IPv6Address(int(fields[0], 16)), int(fields[1], 16)
        else:
            continue
        network = ipaddress.ip_network(f"{destination}/{prefix}", strict=False)
        if not flags & NOT_ON_LINK and iface != "lo" and prefix and not network.is_multicast:
            networks.append(network)
    return networks


def neighbour_table_warning(nodes: Iterable[Node]) -> Optional[str]:
    """A line to say before the run when more nodes sit on this machine's own networks than its
    neighbour table holds; None otherwise. Below the limit nothing is resolved or read, and
    paramiko is not imported (a local run never loads the SSH libraries)."""
    ssh_nodes = [node for node in nodes if node.transport == "ssh"]
    limits = {version: _read_int(path) for version, path in ENTRY_LIMITS.items()}
    if all(limit is None or len(ssh_nodes) <= limit for limit in limits.values()):
        return None
    from runners.ssh import direct_host

    hosts = {host for host in map(direct_host, ssh_nodes) if host is not None}
    for version, limit in limits.items():
        if limit is None or len(hosts) <= limit:
            continue
        networks = on_link_networks(ROUTE_TABLES[version].read_text(), version)
        on_link = {address for address in (_address(host, version) for host in hosts)
                   if address is not None and any(address in network for network in networks)}
        if len(on_link) > limit:
            holding = [network for network in networks if any(address in network for address in on_link)]
            return _overflow(len(on_link), limit, version, holding)
    return None


def _overflow(nodes: int, limit: int, version: int, networks: list[IpNetwork]) -> str:
    """The warning, naming the networks the nodes are on (not every on-link one)."""
    room = 1 << (nodes - 1).bit_length()  # the next power of two, as the defaults are
    names = ", ".join(str(network) for network in networks)
    settings = " ".join(f"net.ipv{version}.neigh.default.gc_thresh{level}={room * factor}"
                        for level, factor in ((1, 1), (2, 2), (3, 4)))
    return (f"warning: {nodes} nodes are on this machine's own networks ({names}), but its kernel "
            f"keeps at most {limit} neighbour entries (net.ipv{version}.neigh.default.gc_thresh3): "
            f"past that, healthy nodes go unanswered. Raise the limits first (sysctl -w {settings}), "
            "or reach the nodes through a jump host (ssh.jump)")


def _address(host: str, version: int) -> Optional[IpAddress]:
    """The address ssh would connect to (its first), for this IP version; None if none."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            found = socket.getaddrinfo(host, None, FAMILIES[version], socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return None
        if not found:
            return None
        address = ipaddress.ip_address(str(found[0][4][0]).split("%")[0])
    return address if address.version == version else None


def _read_int(path: Path) -> Optional[int]:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None
