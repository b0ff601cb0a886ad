"""The namespace nodes behave like real hosts: strict SSH, name resolution, breakable, no leftovers."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from netns import NamespaceCluster


def ssh(cluster: NamespaceCluster, address: str, command: str, *, known_hosts: Path | None = None,
        connect_timeout: int = 5) -> subprocess.CompletedProcess:
    """The OpenSSH client with strict host keys and nothing from the user's or system's config."""
    return subprocess.run(
        ["ssh", "-F", "/dev/null",
         "-i", str(cluster.identity_file), "-o", "IdentitiesOnly=yes",
         "-o", f"UserKnownHostsFile={known_hosts or cluster.known_hosts}",
         "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
         "-o", f"ConnectTimeout={connect_timeout}",
         f"root@{address}", command],
        capture_output=True, text=True, timeout=connect_timeout + 30,
    )


def leftovers(index: int) -> list[str]:
    """Namespaces and links of the cluster on 10.77.<index>.0/24 that still exist (netns.py naming)."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[0] for line in namespaces.splitlines()
             if line.startswith(f"hov{os.getpid()}-{index}-")]
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == f"hovbr{index}" or name.startswith(f"hov{index}n"):
            found.append(name)
    return found


def alive(pid: int) -> bool:
    """True for a running process; a zombie has already left its namespaces."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and alive(int(entry)):
                pids.append(int(entry))
    return pids


def test_every_node_answers_strict_ssh_with_its_own_hostname(ns_cluster):
    for node in ns_cluster.nodes:
        result = ssh(ns_cluster, node.address, "hostname")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == node.name


def test_node_names_resolve_on_the_nodes(ns_cluster):
    node1, node2 = ns_cluster.node("node1"), ns_cluster.node("node2")
    result = ssh(ns_cluster, node1.address, "getent hosts node2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:2] == [node2.address, "node2"]


def test_nodes_hide_host_shell_setup_without_changing_the_host(ns_cluster):
    node = ns_cluster.nodes[0]
    result = ssh(ns_cluster, node.address, "wc -c < /root/.bashrc; wc -c < /etc/resolv.conf")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "0"]

    def mounts(pid: str) -> dict[str, tuple[str, str, list[str]]]:
        """mount point -> (device, root, optional fields) from /proc/PID/mountinfo."""
        table = {}
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
            fields = line.split()
            optional = fields[6:fields.index("-")]
            table[fields[4]] = (fields[2], fields[3], optional)
        return table

    inside, host = mounts(str(node.sshd_pid)), mounts("self")
    for target in ("/root/.bashrc", "/etc/hosts", "/etc/resolv.conf"):
        device, root, optional = inside[target]
        assert not optional, f"{target} propagates ({optional}) instead of being private"
        assert host.get(target, (None, None))[:2] != (device, root), f"{target} bind mount leaked to the host"


def test_a_host_key_mismatch_is_refused(ns_cluster, tmp_path):
    node1, node2 = ns_cluster.node("node1"), ns_cluster.node("node2")
    node1_key = next(line for line in ns_cluster.known_hosts.read_text().splitlines()
                     if line.split()[0] == node1.address)
    swapped = tmp_path / "known_hosts"
    swapped.write_text(node1_key.replace(node1.address, node2.address, 1) + "\n")

    result = ssh(ns_cluster, node2.address, "hostname", known_hosts=swapped)
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr
    assert result.stdout == ""


def test_fabric_runs_and_puts_files_over_sftp(ns_cluster, tmp_path):
    import paramiko
    from fabric import Connection

    node = ns_cluster.node("node3")
    source = tmp_path / "payload.txt"
    source.write_text("from the harness\n")
    destination = tmp_path / "on-node3.txt"
    with Connection(node.address, user="root", connect_timeout=5,
                    connect_kwargs={"key_filename": str(ns_cluster.identity_file),
                                    "look_for_keys": False, "allow_agent": False}) as conn:
        conn.client.load_host_keys(str(ns_cluster.known_hosts))
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        assert conn.run("hostname", hide=True, in_stream=False).stdout.strip() == "node3"
        conn.put(str(source), str(destination))
        python = conn.run(f"{sys.executable} -c 'import sys; print(sys.prefix)'", hide=True,
                          in_stream=False).stdout.strip()
    assert destination.read_text() == "from the harness\n"
    assert python == sys.prefix


def test_inventory_lists_the_nodes_with_strict_keys(ns_cluster, tmp_path):
    path = ns_cluster.write_inventory(tmp_path / "inv.yaml", nodes=["node3", "node1"],
                                      extra={"scratch": [{"path": str(tmp_path)}]})
    data = yaml.safe_load(path.read_text())
    assert data == {
        "cluster": "nscluster",
        "profile": "cpu-only",
        "transport": "ssh",
        "ssh": {"user": "root", "port": 22, "identity_file": str(ns_cluster.identity_file),
                "known_hosts": str(ns_cluster.known_hosts), "host_keys": "strict", "connect_timeout": 5},
        "python": sys.executable,
        "nodes": [{"name": "node3", "address": ns_cluster.node("node3").address},
                  {"name": "node1", "address": ns_cluster.node("node1").address}],
        "scratch": [{"path": str(tmp_path)}],
    }


def test_a_second_cluster_gets_its_own_subnet_and_names(ns_cluster, ns_cluster_factory):
    other = ns_cluster_factory(2, prefix="peer")
    assert other.subnet != ns_cluster.subnet
    assert not {n.namespace for n in other.nodes} & {n.namespace for n in ns_cluster.nodes}
    assert not {n.veth_host for n in other.nodes} & {n.veth_host for n in ns_cluster.nodes}
    assert all(len(n.veth_host) <= 15 and n.namespace.startswith("hov") for n in other.nodes)
    result = ssh(other, other.node("peer2").address, "hostname")
    assert result.stdout.strip() == "peer2", result.stderr


def test_a_stopped_sshd_refuses_connections_while_the_others_answer(ns_cluster_factory):
    cluster = ns_cluster_factory(3)
    cluster.stop_sshd("node2")

    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((cluster.node("node2").address, 22), timeout=2).close()
    refused = ssh(cluster, cluster.node("node2").address, "hostname")
    assert refused.returncode == 255
    assert "Connection refused" in refused.stderr
    for name in ("node1", "node3"):
        assert ssh(cluster, cluster.node(name).address, "hostname").stdout.strip() == name


def test_a_downed_link_times_out_until_it_comes_back_up(ns_cluster_factory):
    cluster = ns_cluster_factory(2)
    node1 = cluster.node("node1")
    cluster.link_down("node1")

    began = time.monotonic()
    cut = ssh(cluster, node1.address, "hostname", connect_timeout=2)
    waited = time.monotonic() - began
    assert cut.returncode == 255
    assert "timed out" in cut.stderr
    assert waited >= 1.5
    assert ssh(cluster, cluster.node("node2").address, "hostname").stdout.strip() == "node2"

    cluster.link_up("node1")
    restored = ssh(cluster, node1.address, "hostname")
    assert restored.stdout.strip() == "node1", restored.stderr


def test_node_exec_runs_in_the_node_network_namespace(ns_cluster):
    node = ns_cluster.node("node2")
    result = ns_cluster.node_exec("node2", ["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
    assert result.returncode == 0, result.stderr
    assert f"inet {node.address}/" in result.stdout


def test_stop_leaves_no_sshd_namespace_or_link_even_with_sessions_open(ns_cluster_factory):
    cluster = ns_cluster_factory(3)
    index = cluster.subnet.network_address.packed[2]
    node1 = cluster.node("node1")
    session = subprocess.Popen(
        ["ssh", "-F", "/dev/null", "-i", str(cluster.identity_file), "-o", "IdentitiesOnly=yes",
         "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "StrictHostKeyChecking=yes",
         "-o", "BatchMode=yes", f"root@{node1.address}", "echo ready; exec sleep 300"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert session.stdout.readline().strip() == "ready"
        in_node1 = subprocess.run(["ip", "netns", "pids", node1.namespace],
                                  capture_output=True, text=True, check=True).stdout.split()
        session_pids = [int(pid) for pid in in_node1 if int(pid) != node1.sshd_pid]
        assert session_pids, "the open session should have processes in node1's namespace"
        sshd_pids = [node.sshd_pid for node in cluster.nodes]
        assert leftovers(index)

        cluster.stop()

        assert leftovers(index) == []
        assert [pid for pid in sshd_pids + session_pids if alive(pid)] == []
        assert processes_mentioning(str(cluster.workdir)) == []
        assert session.wait(timeout=10) != 0
        cluster.stop()  # a second stop finds nothing to do and does not raise
    finally:
        session.kill()
        session.wait()


def test_stop_tolerates_parts_that_are_already_gone(ns_cluster_factory):
    cluster = ns_cluster_factory(2)
    index = cluster.subnet.network_address.packed[2]
    node1, node2 = cluster.nodes
    subprocess.run(["ip", "netns", "del", node1.namespace], check=True)
    subprocess.run(["ip", "link", "del", node2.veth_host], check=True)
    cluster.stop_sshd("node2")

    cluster.stop()

    assert leftovers(index) == []
    assert not alive(node1.sshd_pid) and not alive(node2.sshd_pid)


def test_a_start_that_fails_midway_is_torn_down(ns_cluster, tmp_path):
    cluster = NamespaceCluster(tmp_path, 3)
    (tmp_path / "node2" / "sshd_config").mkdir(parents=True)  # written after the network exists

    with pytest.raises(IsADirectoryError):
        cluster.start()

    assert cluster.subnet is not None, "the failure should come after the network was made"
    assert leftovers(cluster.subnet.network_address.packed[2]) == []
    assert processes_mentioning(str(tmp_path)) == []
    assert ssh(ns_cluster, ns_cluster.node("node1").address, "hostname").stdout.strip() == "node1"
