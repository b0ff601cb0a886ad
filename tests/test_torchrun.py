"""TorchrunLauncher's argv (pure), and real torchrun launches of the collectives payload with gloo
over SSH on namespace nodes: two nodes, one node with two ranks, and a link cut mid-run."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from nodes import ns_inventory

from inventory.model import Node
from runners import collectives, torchrun
from runners.launchers import LaunchError
from runners.ssh import SshTransport
from runners.torchrun import TorchrunLauncher
from runners.transport import OWN_TEMP_PREFIX, TAG_VARIABLE, LocalTransport, Result, new_tag

pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")

DATA = Path(__file__).parent / "data"


def data_text(name: str) -> str:
    return (DATA / name).read_text()


def test_argv_has_the_c10d_rendezvous_on_the_first_host():
    launcher = TorchrunLauncher(rdzv_id="handover-run-abc123", port=29500, python="/opt/py/bin/python")
    argv = launcher.argv(["10.0.0.1", "10.0.0.2", "10.0.0.3"], 8, ["python3", "-c", "print(1)"])
    assert argv == ["/opt/py/bin/python", "-c", torchrun.OWN_LOG_DIR_SCRIPT, "--nnodes", "3",
                    "--nproc-per-node", "8", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "10.0.0.1:29500", "--rdzv-id", "handover-run-abc123",
                    "--rdzv-conf", "join_timeout=60,read_timeout=60", "--max-restarts", "0", "--no-python",
                    "python3", "-c", "print(1)"]
    assert launcher.starts_on == "every" and launcher.name == "torchrun"


def test_each_nodes_argv_says_whether_it_hosts_the_store_and_its_own_address():
    launcher = TorchrunLauncher(rdzv_id="handover-run-abc123", port=29500)
    hosts = ["10.0.0.1", "10.0.0.2"]
    first, second = (launcher.argv(hosts, 8, ["x"], on=host) for host in hosts)
    assert first[first.index("--rdzv-conf") + 1:first.index("--max-restarts")] == [
        "join_timeout=60,read_timeout=60,is_host=true", "--local-addr", "10.0.0.1"]
    assert second[second.index("--rdzv-conf") + 1:second.index("--max-restarts")] == [
        "join_timeout=60,read_timeout=60,is_host=false", "--local-addr", "10.0.0.2"]
    with pytest.raises(LaunchError, match="10.0.0.3 is not one of the hosts: 10.0.0.1, 10.0.0.2"):
        launcher.argv(hosts, 8, ["x"], on="10.0.0.3")


def test_argv_waits_the_rendezvous_timeout_for_every_node_to_join_and_to_reach_the_store():
    argv = TorchrunLauncher(join_timeout_s=300).argv(["10.0.0.1", "10.0.0.2"], 1, ["x"], on="10.0.0.2")
    assert argv[argv.index("--rdzv-conf") + 1] == "join_timeout=300,read_timeout=300,is_host=false"


def launch_with(stderr: dict[str, str], timeout_s: int = 5) -> torchrun.Launch:
    """A launch whose every torchrun failed with the given stderr; the first node failed first."""
    results = {node: Result(node, "torchrun", 1, "", text, 7.0) for node, text in stderr.items()}
    return torchrun.Launch(results, next(iter(stderr)), (), {}, "handover-run-abc", rendezvous_timeout_s=timeout_s)


def test_a_node_that_could_not_reach_the_rendezvous_store_is_the_cause_before_the_others():
    """Real torchrun stderr (tests/data/training): the rendezvous host waited in vain, a healthy
    node lost the store when that host ended, and the node that could not reach the store at all
    is the one to look at."""
    launch = launch_with({"n1": data_text("training/rendezvous-timeout.stderr"),
                          "n2": data_text("training/rendezvous-store-lost.stderr"),
                          "n3": data_text("training/rendezvous-store-unreached.stderr")})
    assert torchrun.rendezvous_cause(launch) == ("n3", (
        "n3: torchrun could not reach the rendezvous store of n1 on 127.0.0.1:29556 within "
        "launch.rendezvous_timeout_s (5 s) (RendezvousConnectionError)"))


def test_nodes_that_waited_in_vain_for_the_rendezvous_name_the_setting_to_raise():
    """The store's host waited for the others; a node that lost the store after it says less."""
    launch = launch_with({"n2": data_text("training/rendezvous-store-lost.stderr"),
                          "n1": data_text("training/rendezvous-timeout.stderr")}, timeout_s=60)
    assert torchrun.rendezvous_cause(launch) == ("n1", (
        "n1: not every node joined torchrun's rendezvous within launch.rendezvous_timeout_s (60 s) "
        "(RendezvousTimeoutError): one did not start torchrun or could not reach the store; raise it "
        "where nodes start slowly"))
    alone = launch_with({"n2": data_text("training/rendezvous-store-lost.stderr")})
    assert torchrun.rendezvous_cause(alone) == ("n2", (
        "n2: torchrun lost the rendezvous store (RendezvousConnectionError): the torchrun that held it "
        "ended first"))


def test_a_launch_whose_rendezvous_held_has_no_rendezvous_cause():
    """A rank killed mid-run (real stderr): the training's own root cause speaks, not this."""
    assert torchrun.rendezvous_cause(launch_with({"n1": data_text("training/rank1-killed.stderr"),
                                                  "n2": ""})) is None


def test_argv_brackets_ipv6_and_every_run_gets_its_own_id():
    argv = TorchrunLauncher(port=1).argv(["fe80::1"], 1, ["x"])
    assert argv[argv.index("--rdzv-endpoint") + 1] == "[fe80::1]:1"
    assert TorchrunLauncher().rdzv_id != TorchrunLauncher().rdzv_id


@pytest.mark.parametrize("hosts, ranks, command, message", [
    ([], 1, ["x"], "no hosts"), (["a", "a"], 1, ["x"], "listed twice"),
    (["a"], 0, ["x"], "at least 1"), (["a"], 1, [], "no command")])
def test_argv_refuses_what_torchrun_could_not_run(hosts, ranks, command, message):
    with pytest.raises(LaunchError, match=message):
        TorchrunLauncher().argv(hosts, ranks, command)


def test_rendezvous_id_must_be_one_plain_word():
    with pytest.raises(LaunchError, match="rendezvous id"):
        TorchrunLauncher(rdzv_id="a b").argv(["a"], 1, ["x"])


def test_socket_env_prefers_the_override_and_leaves_unknown_interfaces_alone():
    assert torchrun.socket_env({"a": "eth0", "b": None}) == {
        "a": {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}, "b": {}}
    assert torchrun.socket_env({"a": "eth0"}, "ib0")["a"]["GLOO_SOCKET_IFNAME"] == "ib0"


def test_leftover_pattern_does_not_match_its_own_command_line():
    argv = torchrun.leftover_argv("handover-run-0123")
    assert argv[-1] == "[h]andover-run-0123" and "handover-run-0123" not in " ".join(argv)


def processes(marker: str) -> list[str]:
    """Command lines carrying marker (the nodes share this PID namespace); '[x]yz' skips pgrep."""
    found = subprocess.run(torchrun.leftover_argv(marker), capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if line[:1].isdigit()]


def payload_workers(marker: str, on) -> int:
    """Ranks of the payload running on the nodes of `on` (workers start only once every node joined
    the rendezvous; another test may run its own payload on this machine at the same time)."""
    count = 0
    for pid in on.processes():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        payload = len(argv) > 2 and argv[1] == b"-c" and b"--sizes" in argv and b"--rdzv-id" not in argv
        if payload and any(marker.encode() in a for a in argv):
            count += 1
    return count


def wait_until_gone(marker: str, within_s: float) -> list[str]:
    deadline = time.monotonic() + within_s
    while (found := processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def log_dirs(marker: str, within_s: float = 0) -> list[Path]:
    """torchrun's log directories of this launch (named after its rendezvous id) still there,
    waiting for them to go: the nodes share this machine's /tmp."""
    deadline = time.monotonic() + within_s
    while (found := list(Path(tempfile.gettempdir()).glob(f"*/{marker}_*"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def transports_of(cluster) -> dict:
    return {node.name: SshTransport(node) for node in cluster.nodes}


def test_gloo_all_reduce_across_two_nodes_over_ssh(ns_cluster, tmp_path):
    """The torchrun launcher on two real sshd nodes: c10d rendezvous on node1, gloo over eth0."""
    cluster = ns_inventory(ns_cluster, tmp_path / "cluster.yaml", nodes=["node1", "node2"])
    transports = transports_of(cluster)
    try:
        launch = collectives.run_across(transports, {n.name: n.address for n in cluster.nodes}, 1,
                                        timeout=90)
    finally:
        for transport in transports.values():
            transport.close()
    assert launch.ok, {node: r.explain() + r.stderr[-1500:] for node, r in launch.results.items()}
    report, result = collectives.report_of(launch)
    assert report is not None and report.ok and result.node == "node1"
    assert report.ranks == 2 and sorted(report.hosts) == ["node1", "node2"]
    assert report.backend == "gloo" and report.env["GLOO_SOCKET_IFNAME"] == "eth0"
    largest = report.largest("all_reduce")
    assert largest.size == 64 << 20 and largest.wrong == 0 and largest.busbw > 0
    assert largest.busbw == pytest.approx(largest.algbw)  # 2(n-1)/n = 1 for two ranks
    assert not processes(launch.marker)
    assert log_dirs(launch.marker) == []


def test_nodes_whose_hostname_resolves_to_loopback_still_meet_at_the_first(ns_cluster_factory, tmp_path):
    """Debian's installer and cloud-init write `127.0.1.1 <hostname>` into /etc/hosts: torch then
    cannot tell from the hostname that the rendezvous address is the first node's own (no node
    would host the store), nor give the others an address for rank 0 but its hostname. Each node
    is told both (is_host, --local-addr), and the all-reduce runs."""
    nodes = ns_cluster_factory(2)
    with open(nodes.workdir / "hosts", "w") as hosts:  # in place: each node's /etc/hosts is bound to it
        hosts.write("127.0.0.1\tlocalhost\n127.0.1.1\tnode1 node2\n")
    cluster = ns_inventory(nodes, tmp_path / "cluster.yaml")
    transports = transports_of(cluster)
    try:
        launch = collectives.run_across(transports, {n.name: n.address for n in cluster.nodes}, 1,
                                        timeout=90, join_timeout_s=30)
    finally:
        for transport in transports.values():
            transport.close()
    assert launch.ok, {node: r.explain() + r.stderr[-1500:] for node, r in launch.results.items()}
    report, _ = collectives.report_of(launch)
    assert report is not None and report.ok and report.ranks == 2 and sorted(report.hosts) == ["node1", "node2"]


def test_two_ranks_on_one_node_over_ssh(ns_cluster, tmp_path):
    cluster = ns_inventory(ns_cluster, tmp_path / "cluster.yaml", nodes=["node3"])
    transport = SshTransport(cluster.nodes[0])
    try:
        result = collectives.run_on_node(transport, 2, timeout=90)
    finally:
        transport.close()
    assert result.ok, result.stderr[-2000:]
    report = collectives.parse_collectives(result.stdout)
    assert report.ok and report.ranks == 2 and report.hosts == ["node3", "node3"]
    assert report.largest("all_reduce").busbw > 0 and report.wrong == 0


def test_a_link_cut_mid_run_times_out_and_leaves_no_process(ns_cluster_factory, tmp_path):
    """node2's link goes down once torchrun runs on both nodes: rank 0 on node1 would wait
    forever; the node-side timeout ends it, the other launch is killed, nothing is left."""
    nodes = ns_cluster_factory(2)
    cluster = ns_inventory(nodes, tmp_path / "cluster.yaml")
    transports = transports_of(cluster)
    marker_seen = threading.Event()

    def cut_when_running():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if payload_workers(torchrun.MARKER_PREFIX, nodes) >= 2:
                marker_seen.set()
                nodes.link_down("node2")
                return
            time.sleep(0.1)

    cutter = threading.Thread(target=cut_when_running, daemon=True)
    cutter.start()
    try:
        launch = collectives.run_across(transports, {n.name: n.address for n in cluster.nodes}, 1,
                                        sizes=(64 << 20,), iters=200, timeout=12, join_timeout_s=10)
    finally:
        for transport in transports.values():
            transport.close()
    cutter.join(1)
    assert marker_seen.is_set(), {n: r.explain() + r.stderr[-800:] for n, r in launch.results.items()}
    assert launch.first_failure is not None and not launch.ok
    assert any(r.timed_out or r.failure for r in launch.results.values()), launch.results
    assert launch.leftovers == {}
    assert wait_until_gone(launch.marker, within_s=15) == []
    # node2's torchrun hung on the dead link until killed: its lease removed its log directory
    assert log_dirs(launch.marker, within_s=15) == []


def test_what_a_launch_leaves_is_reported_and_what_it_tagged_goes_with_its_directories(ns_cluster, tmp_path):
    """srun_across's sweep, however its step ended: a process still carrying the run's marker is
    reported and killed; one carrying only the launch's tag (a torchrun Slurm's KILL missed, deaf
    to TERM) is killed as well, and the temporary directory named after the tag goes with it."""
    cluster = ns_inventory(ns_cluster, tmp_path / "cluster.yaml", nodes=["node1"])
    marker, tag = torchrun.new_run_id(), new_tag()
    log_dir = Path(tempfile.mkdtemp(prefix=f"{OWN_TEMP_PREFIX}{tag}-torchrun-"))
    deaf = "trap '' TERM; while :; do sleep 0.2; done"
    rank = subprocess.Popen(["sh", "-c", deaf, marker], start_new_session=True)
    hung = subprocess.Popen(["sh", "-c", deaf, "hung-torchrun"], env={**os.environ, TAG_VARIABLE: tag},
                            start_new_session=True)
    transports = transports_of(cluster)
    try:
        leftovers = torchrun.find_leftovers(transports, marker, tag=tag, grace_s=1)
        ended = [process.wait(5) for process in (rank, hung)]
    finally:
        for transport in transports.values():
            transport.close()
        for process in (rank, hung):
            process.kill()
    gone = not log_dir.exists()
    shutil.rmtree(log_dir, ignore_errors=True)
    assert list(leftovers) == ["node1"] and marker in leftovers["node1"]
    assert ended == [-signal.SIGKILL, -signal.SIGKILL]
    assert gone


@pytest.mark.skipif(not socket.has_ipv6, reason="this Python has no IPv6")
def test_the_rendezvous_port_is_free_on_ipv6_and_ipv4_alike():
    """The c10d store listens on both families: the node's free port is asked of a dual-stack
    socket (an IPv4-only ask could name a port an IPv6 listener holds)."""
    holder = socket.socket(socket.AF_INET6)
    holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    holder.bind(("::1", 0))
    holder.listen()
    held = holder.getsockname()[1]
    transport = LocalTransport(Node("localhost", "localhost", "local", python=sys.executable))
    try:
        ports = {torchrun.free_port(transport) for _ in range(20)}
    finally:
        transport.close()
        holder.close()
    assert torchrun.DEFAULT_PORT not in ports and held not in ports
    for port in ports:
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family) as probe:
                probe.bind((address, port))
