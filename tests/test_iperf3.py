"""iperf3: the -J parser on real 3.12 outputs, and a real pair run between namespace nodes."""
from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from nodes import ns_inventory, wait_for_no_leftovers

from inventory.loader import load_profile
from inventory.model import Node
from runners import iperf3, pairs
from runners.parsing import ParseError
from runners.transport import LocalTransport, Result, make_transport

DATA = Path(__file__).parent / "data" / "iperf3"
ROOT = Path(__file__).resolve().parent.parent


def parsed(name: str) -> iperf3.Iperf3Report:
    return iperf3.parse_iperf3((DATA / name).read_text())


def test_tcp_client_gives_received_rate_and_retransmits():
    report = parsed("local_iperf312_tcp_client_P2.json")
    assert report.bits_per_second == pytest.approx(8609731879.982027)
    assert report.retransmits == 10 and report.error is None and report.ok
    assert (report.role, report.protocol, report.version) == ("client", "TCP", "iperf 3.12")


def test_server_side_has_no_retransmits():
    report = parsed("local_iperf312_tcp_server.json")
    assert report.role == "server" and report.retransmits is None and report.ok


@pytest.mark.parametrize("name", ["local_iperf312_udp_client_1G.json", "local_iperf312_udp_server.json"])
def test_udp_reports_what_arrived_and_what_was_lost(name):
    """A lossy UDP run is a figure, not a failed tool: ok, with its loss said."""
    report = parsed(name)
    assert report.protocol == "UDP" and report.bits_per_second == pytest.approx(924281644.1798964)
    assert report.lost_percent == pytest.approx(7.2983, abs=1e-4) and report.ok
    assert parsed("local_iperf312_tcp_client_P2.json").lost_percent is None


def test_connection_refused_exits_0_but_is_an_error():
    assert (DATA / "local_iperf312_error_connection_refused.rc.txt").read_text().strip() == "0"
    report = parsed("local_iperf312_error_connection_refused.json")
    assert not report.ok and report.error == "unable to connect to server: Connection refused"
    assert report.bits_per_second is None


def test_server_address_in_use():
    report = parsed("local_iperf312_error_server_address_in_use.json")
    assert not report.ok and "Address already in use" in report.error and report.role == "unknown"


def test_a_client_that_cannot_make_its_stream_fails_its_own_node_not_the_link():
    """Real: a namespace node whose TMPDIR did not exist (iperf3 makes each stream's buffer file
    there). The pair fails saying so, and says nothing of the link: no suspect cable."""
    text = (DATA / "nsnode_iperf312_error_tmpdir_missing.json").read_text()
    client = Result("node2", "iperf3 --client 10.77.48.1 ...", 1, text, "", 0.1)
    run = pairs.PairRun("node1", "node2", 5301, client, None)
    report, why = iperf3.judge(run)
    assert report is not None and report.error == "unable to create a new stream: No such file or directory"
    assert why == ("node2 -> node1:5301: iperf3 error on node2 itself: unable to create a new stream: No such "
                   "file or directory (it makes each stream's buffer file in node2's TMPDIR)")
    tool = iperf3.Iperf3Tool(load_profile("cpu-only"))
    assert tool.outcome(run) is None
    refused = parsed("local_iperf312_error_connection_refused.json")
    assert refused.error and tool.outcome(pairs.PairRun("node1", "node2", 5301, Result(
        "node2", "iperf3", 0, (DATA / "local_iperf312_error_connection_refused.json").read_text(), "", 0.1),
        None)) == pairs.PairOutcome(False)


@pytest.mark.parametrize("text", ["", "iperf3: error - unable to connect", "{not json", "[1, 2]",
                                  '{"end": {}}'])
def test_not_iperf3_json(text):
    with pytest.raises(ParseError):
        iperf3.parse_iperf3(text)


def test_handover_parse_iperf3_cli():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "iperf3",
                           str(DATA / "local_iperf312_error_connection_refused.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and '"ok": false' in done.stdout and "Connection refused" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "iperf3", str(DATA / "PROVENANCE.md")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not iperf3 output" in bad.stderr


def local() -> LocalTransport:
    return LocalTransport(Node("localhost", "localhost", "local"))


# The tests' ports lie below the ephemeral range (ip_local_port_range, 32768-60999 by default):
# an outgoing connection of a test beside them may hold a port of that range, and a server
# cannot listen on a port an established connection holds.


def test_pair_on_this_machine_measures_and_leaves_no_server():
    port = random.randint(28000, 28999)
    run = iperf3.run_pair(local(), local(), "127.0.0.1", port, seconds=1)
    report, why = iperf3.judge(run)
    assert why == "" and report.ok and report.bits_per_second > 0, run.client_result.stdout[-500:]
    assert run.server_result is not None and run.server_result.ok
    assert not wait_for_no_leftovers(f"--port {port}")


def test_a_server_that_cannot_listen_is_named_rather_than_its_refused_client():
    """A socket bound to the port (not listening) holds it, so the server cannot listen (exit 1,
    "Address already in use") and the client is refused; the pair says the server's reason.

    Bound with bind(), not taken by a connection's own connect(): the kernel may give a port that
    connections hold to another connect() as its source, and the client then once connected to
    itself (TCP simultaneous open) and read its own bytes ("received an unknown control message")."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        run = iperf3.run_pair(local(), local(), "127.0.0.1", port, seconds=1)
    finally:
        holder.close()
    report, why = iperf3.judge(run)
    assert report is not None and iperf3.REFUSED in (report.error or ""), run.client_result.stdout
    assert why == (f"localhost -> localhost:{port}: the iperf3 server on localhost could not listen: "
                   "unable to start listener for connections: Address already in use"), why
    assert not wait_for_no_leftovers(f"--port {port}")


def test_a_refused_client_says_the_servers_reason_or_the_firewall_that_refused_it():
    """The real refused client beside real server outputs: one that served another client (no
    server error to name: the client's stands), one that could not listen, and one that listened,
    unreached, until the pair ended it."""
    def output(node: str, exit_code: int, name: str) -> Result:
        return Result(node, "iperf3", exit_code, (DATA / name).read_text(), "", 0.1)

    refused = output("b", 0, "local_iperf312_error_connection_refused.json")
    served = output("a", 0, "local_iperf312_tcp_server.json")
    in_use = output("a", 1, "local_iperf312_error_server_address_in_use.json")
    assert iperf3.judge(pairs.PairRun("a", "b", 5301, refused, served))[1] == (
        "b -> a:5301: iperf3 error: unable to connect to server: Connection refused")
    assert iperf3.judge(pairs.PairRun("a", "b", 5301, refused, in_use))[1] == (
        "b -> a:5301: the iperf3 server on a could not listen: unable to start listener for connections: "
        "Address already in use")
    unreached = output("a", 1, "nsnode_iperf312_server_interrupted_unconnected.json")  # a firewall's REJECT
    assert iperf3.judge(pairs.PairRun("a", "b", 5301, refused, unreached))[1] == (
        "b -> a:5301: iperf3 error: unable to connect to server: Connection refused, while the iperf3 server on a "
        "ran throughout: a firewall rejects port 5301 on a or on the way, or the address the client was given is "
        "not a's")


def test_client_that_cannot_reach_the_server_fails_and_the_waiting_server_is_killed():
    """192.0.2.1 (TEST-NET-1) is never reachable: the client fails, the server waits in vain."""
    port = random.randint(24000, 24999)
    run = iperf3.run_pair(local(), local(), "192.0.2.1", port, seconds=1)
    report, why = iperf3.judge(run)
    assert "iperf3 error: unable to connect to server" in why and report is not None
    assert run.server_result is not None and not run.server_result.ok  # killed, not finished
    assert not run.server_result.timed_out  # by the pair, not by its own 60 s timeout
    assert not wait_for_no_leftovers(f"--port {port}")


# node2's firewall rejects TCP to the tests' ports (nftables' reject: the client's connect() reads
# "Connection refused" while its server listens), in its namespace only.
REJECTING = """table inet handover_test_reject {
  chain input { type filter hook input priority 0; policy accept; tcp dport 20000-31999 reject; }
}
"""


@pytest.mark.skipif(shutil.which("nft") is None, reason="`nft` is not installed (make setup installs nftables)")
def test_a_client_refused_while_its_server_runs_names_the_firewall(ns_cluster_factory, tmp_path):
    nodes = ns_cluster_factory(2)
    nodes.firewall("node2", REJECTING)
    transports = {node.name: make_transport(node) for node in ns_inventory(nodes, tmp_path / "c.yaml").nodes}
    port = random.randint(20000, 20999)
    try:
        run = iperf3.run_pair(transports["node2"], transports["node1"], nodes.node("node2").address, port, seconds=1)
    finally:
        for transport in transports.values():
            transport.close()
    assert iperf3.server_interrupted(run)
    assert iperf3.judge(run)[1] == (
        f"node1 -> node2:{port}: iperf3 error: unable to connect to server: Connection refused, while the iperf3 "
        f"server on node2 ran throughout: a firewall rejects port {port} on node2 or on the way, or the address "
        "the client was given is not node2's")


def test_client_that_times_out_gets_its_waiting_server_killed(ns_cluster_factory):
    """The generic pair runner's timeout path with real iperf3: the client connects to an
    address on a namespace bridge that no node holds, so connect() waits for ARP (about 3 s)
    past the client's 1 s limit; the server, still waiting, is killed when the pair returns."""
    silent = str(ns_cluster_factory(1).subnet[200])
    port = random.randint(30000, 30999)
    run = pairs.run_server_client(
        local(), local(), iperf3.server_argv(port),
        ["iperf3", "--client", silent, "--port", str(port), "--time", "1", "--json"],
        port=port, server_timeout=60, client_timeout=1, retry_while=lambda result: False,
        retry_s=0)
    assert run.client_result.timed_out, run.client_result
    assert run.server_result is not None and not run.server_result.ok  # killed, not finished
    assert not run.server_result.timed_out  # by the pair, not by its own 60 s timeout
    assert "timed out" in iperf3.judge(run)[1]
    assert not wait_for_no_leftovers(f"--port {port}")


def test_a_killed_server_leaves_the_other_rails_servers_on_its_node_running(ns_cluster_factory):
    """Every rail of a pair runs at once, each rail's server through the node's one transport.
    One rail's client times out (as in the test above) and its waiting server is killed: that
    kill took every command of the node's transport with it, the other rails' servers mid-run,
    so one bad rail failed them all. Only that rail's server goes now; the other one measures."""
    silent = str(ns_cluster_factory(1).subnet[200])
    server = local()
    stuck, measured = random.sample(range(32000, 32999), 2)
    runs = {}

    def rail(port: int, address: str, seconds: int, client_timeout: float) -> None:
        runs[port] = pairs.run_server_client(
            server, local(), iperf3.server_argv(port),
            iperf3.client_argv(address, port, seconds), port=port, server_timeout=60,
            client_timeout=client_timeout, retry_while=lambda result: iperf3.REFUSED in result.stdout,
            retry_s=iperf3.REFUSED_RETRY_S)

    rails = [threading.Thread(target=rail, args=(stuck, silent, 1, 1)),
             threading.Thread(target=rail, args=(measured, "127.0.0.1", 8, 30))]
    for thread in rails:
        thread.start()
    for thread in rails:
        thread.join()
    assert runs[stuck].client_result.timed_out and not runs[stuck].server_result.ok, runs[stuck]
    report, why = iperf3.judge(runs[measured])
    assert why == "" and report.ok, why
    assert runs[measured].server_result.ok, runs[measured].server_result
    assert not wait_for_no_leftovers(f"--port {stuck}") and not wait_for_no_leftovers(f"--port {measured}")


def test_all_pairs_in_rounds_on_namespace_nodes_with_a_link_cut_mid_round(ns_cluster_factory, tmp_path):
    """Four real nodes, all six pairs in three rounds; node3's link is cut while round 1 runs.

    node3's pairs fail, every other pair passes, and no iperf3 of this test is left anywhere
    (the nodes share this PID namespace, so pgrep on the host sees them all).
    """
    nodes = ns_cluster_factory(4)
    cluster = ns_inventory(nodes, tmp_path / "cluster.yaml")
    transports = {node.name: make_transport(node) for node in cluster.nodes}
    address = {node.name: node.address for node in cluster.nodes}
    base_port = random.randint(31000, 31900)
    rounds = pairs.circle_rounds(list(transports))
    cut = threading.Timer(0.7, nodes.link_down, args=("node3",))

    def run_pair(pair, port):
        server, client = pair
        return iperf3.run_pair(transports[server], transports[client], address[server], port, seconds=2)

    try:
        cut.start()
        started = time.monotonic()
        outcomes = pairs.run_rounds(rounds, base_port, run_pair)
        elapsed = time.monotonic() - started
    finally:
        cut.cancel()
        for transport in transports.values():
            transport.close()
    verdicts = {pair: iperf3.judge(run)[1] for pair, run in outcomes.items()}
    failed = {pair for pair, why in verdicts.items() if why}
    assert failed == {pair for pair in outcomes if "node3" in pair}, verdicts
    for pair in set(outcomes) - failed:
        assert iperf3.judge(outcomes[pair])[0].bits_per_second > 0
    attribution = pairs.attribute({pair: pair not in failed for pair in outcomes})
    assert list(attribution.suspect_nodes) == ["node3"] and not attribution.suspect_links
    assert elapsed < 90
    assert not wait_for_no_leftovers(f"--port {base_port}", within_s=40)
    assert not wait_for_no_leftovers(f"--port {base_port + 1}", within_s=5)
