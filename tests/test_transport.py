"""The transports, local and ssh, against real processes and real sshd nodes.

One body per behaviour, run against both backends (as pytest-testinfra tests its backends).
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import paramiko
import pytest
from netns import BRIDGE_HOST_OCTET, SSH_PORT
from nodes import leftovers, ns_inventory, unique_sleep, wait_for_no_leftovers, wait_until

from inventory.model import Node
from runners import system
from runners.parsing import ParseError
from runners.transport import (
    LEASE_VARIABLE,
    OWN_TEMP_PREFIX,
    RECONNECT_AFTER_S,
    SILENCES_KEPT,
    LocalTransport,
    Loss,
    Silences,
    kill_argv,
    make_transport,
)


@pytest.fixture(params=["local", "ssh"])
def transport(request, tmp_path):
    if request.param == "local":
        node = Node("localhost", "localhost", "local", python=sys.executable)
    else:
        cluster = ns_inventory(request.getfixturevalue("ns_cluster"), tmp_path / "inv.yaml")
        node = cluster.nodes[0]
    transport = make_transport(node)
    yield transport
    transport.close()


def test_local_transport_does_not_import_ssh_libraries():
    code = ("import sys; from runners.transport import make_transport; from inventory.model import Node; "
            "t = make_transport(Node('n', 'n', 'local')); assert t.run(['true'], timeout=5).ok; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fabric', 'paramiko', 'invoke')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_argument_arrives_as_one_word(transport, tmp_path):
    canary = tmp_path / "pwned"
    words = ["a b", "$(touch " + str(canary) + ")", "'", '"', ";", "`id`", "*", "\\n", ""]
    result = transport.run(["printf", "<%s>\\n", *words], timeout=10)
    assert result.ok, result.explain()
    assert result.stdout.splitlines() == [f"<{w}>" for w in words]
    assert not canary.exists()


def test_result_carries_exit_code_streams_and_duration(transport):
    result = transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.ok and result.status == "exit-3" and not result.timed_out
    assert 0 < result.duration_s < 10
    assert "exited 3: err" in result.explain()


def test_payload_ships_through_stdin_and_runs_with_the_nodes_python(transport):
    result = system.probe(transport)
    assert result.ok, result.explain()
    facts = system.parse_system_facts(result.stdout)
    assert facts.logical_cpus >= 1 and facts.memory_total_kib > 0
    script = "import sys, json; print(json.dumps(sys.argv[1:]))"
    echoed = transport.run_script(script, ["x y", "--z"], timeout=10)
    assert json.loads(echoed.stdout) == ["x y", "--z"]


def test_the_programs_probe_looks_on_the_nodes_path(transport):
    """The general probe HPL and nccl-tests use: a path for what is installed, None for what is not."""
    result = system.probe_programs(transport, ["sh", "mpirun", "handover-not-a-program"])
    assert result.ok, result.explain()
    programs = system.parse_programs(result.stdout)
    assert programs.has("sh") and programs.has("mpirun") and programs.paths["sh"].endswith("/sh")
    assert not programs.has("handover-not-a-program") and programs.paths["handover-not-a-program"] is None
    assert programs.root  # the harness's tests run as root, locally and on the namespace nodes
    with pytest.raises(ParseError):
        system.parse_programs('{"programs": {}}')


NON_ROOT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/games"  # sshd's and Debian's PATH for a non-root user


@pytest.mark.parametrize("backend", ["local", "ssh"])
def test_a_tool_in_sbin_is_found_with_a_non_root_users_path(backend, request, monkeypatch, tmp_path):
    """ibstat and dmidecode (ip and lspci on RHEL) live in /usr/sbin, which a non-root user's
    PATH leaves out: such a tool was taken for not installed. Here the node's PATH is that PATH
    (its .bashrc sets it; locally, the harness's own); the user's directories still come first."""
    if backend == "local":
        monkeypatch.setenv("PATH", NON_ROOT_PATH)
        node = Node("localhost", "localhost", "local", python=sys.executable)
    else:
        nodes = request.getfixturevalue("ns_cluster_factory")(1)
        (nodes.workdir / "empty").write_text(f"PATH={NON_ROOT_PATH}\n")  # each node's root .bashrc
        node = ns_inventory(nodes, tmp_path / "inv.yaml").nodes[0]
    transport = make_transport(node)
    try:
        path = transport.run(["sh", "-c", 'printf %s "$PATH"'], timeout=10)
        assert path.stdout == NON_ROOT_PATH + ":/usr/sbin:/sbin", path.explain()
        found = system.probe_programs(transport, ["sshd"])  # the nodes' sshd: /usr/sbin/sshd
        assert system.parse_programs(found.stdout).paths["sshd"] == "/usr/sbin/sshd", found.explain()
    finally:
        transport.close()


def test_environment_values_are_quoted(transport):
    result = transport.run(["sh", "-c", 'printf "%s" "$GREETING"'], timeout=10,
                           env={"GREETING": "it's $(id) ; x"})
    assert result.stdout == "it's $(id) ; x"


def test_timeout_kills_the_whole_process_tree_on_the_node(transport):
    marker = unique_sleep()
    result = transport.run(["sh", "-c", f"{marker} & {marker} & {marker}"], timeout=2)
    assert result.timed_out and not result.ok and result.status == "timeout"
    assert 1.5 < result.duration_s < 10
    assert wait_for_no_leftovers(marker) == []


def test_kill_running_reaches_processes_that_left_the_process_group(transport):
    """What Ctrl-C does: even a setsid'd grandchild is found by its tag and killed."""
    marker = unique_sleep()
    finished = []
    worker = threading.Thread(target=lambda: finished.append(
        transport.run(["sh", "-c", f"setsid {marker} & {marker}"], timeout=60)))
    worker.start()
    def sleepers() -> list[str]:
        return [line for line in leftovers(marker) if line.split(None, 1)[1] == marker]

    deadline = time.monotonic() + 10
    while len(sleepers()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(sleepers()) == 2
    transport.kill_running()
    worker.join(20)
    assert finished and not finished[0].ok
    assert wait_for_no_leftovers(marker) == []


def test_a_kill_whose_proc_reads_hang_still_cleans_up_and_ends_within_its_bound(tmp_path):
    """A kill reads /proc/PID/environ, which waits for that process's memory map: a process stuck on
    a hung NFS mount held the kill's grep there, and a kill the harness gave up on stayed on the
    node for good. Each read has its own bound, so the kill goes on to remove what the tag left;
    the whole kill has one too. The made-up part: `grep` here is a program that hangs."""
    marker = unique_sleep()
    hanging = tmp_path / "bin"
    hanging.mkdir()
    (hanging / "grep").write_text(f"#!/bin/sh\nexec {marker}\n")
    (hanging / "grep").chmod(0o755)
    env = {**os.environ, "PATH": f"{hanging}:{os.environ['PATH']}"}
    left = Path(tempfile.gettempdir()) / f"{OWN_TEMP_PREFIX}0123abcd-left"
    left.mkdir()
    done = subprocess.run(kill_argv("0123abcd", root=False), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not left.exists(), done
    bounded = subprocess.run(kill_argv("0123abcd", root=False, bound_s=1), env=env, capture_output=True,
                             text=True, timeout=60)
    assert bounded.returncode == 124, bounded  # GNU timeout's: the kill's own bound ended it
    assert wait_for_no_leftovers(marker) == []


def own_temp_dirs(owner: str, within_s: float = 0) -> list[Path]:
    """Directories named after a tag or lease still there, waiting for them to go (the nodes
    share this machine's /tmp; an ssh session has no TMPDIR of its own)."""
    deadline = time.monotonic() + within_s
    while (found := list(Path(tempfile.gettempdir()).glob(f"{OWN_TEMP_PREFIX}{owner}-*"))) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def test_a_killed_command_gets_time_to_tidy_up_and_its_own_temporary_directories_go(transport, tmp_path):
    """TERM comes seconds before KILL, so a tool's handler that takes a while still runs; what
    a command that ignores TERM left behind is removed by name: the tag's directories with the
    command, the lease's when the connection closes (whatever ends it, a dead link included)."""
    tidied = tmp_path / "tidied"
    marker = unique_sleep()
    script = (f'for owner in "$HANDOVER_TAG" "$HANDOVER_LEASE"; do '
              f'mktemp -d "${{TMPDIR:-/tmp}}/{OWN_TEMP_PREFIX}$owner-XXXX"; done; '
              f'(trap "" TERM; exec {marker}) & trap "sleep 2; touch {tidied}; exit 143" TERM; '
              f'echo "$HANDOVER_TAG $HANDOVER_LEASE" > {tmp_path}/owners; while :; do sleep 0.1; done')
    finished = []
    worker = threading.Thread(target=lambda: finished.append(transport.run(["sh", "-c", script], timeout=60)))
    worker.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "owners").exists() or not leftovers(marker):
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.1)
    tag, lease = (tmp_path / "owners").read_text().split()
    assert own_temp_dirs(tag) and own_temp_dirs(lease)
    transport.kill_running()
    worker.join(20)
    assert finished and not finished[0].ok
    assert tidied.exists()  # its TERM handler ran to the end
    assert wait_for_no_leftovers(marker) == []  # what ignored TERM got KILL
    assert own_temp_dirs(tag) == [] and own_temp_dirs(lease)
    transport.close()
    assert own_temp_dirs(lease) == []


def test_closing_returns_once_the_node_has_tidied_up(transport, tmp_path):
    """The end of a run: close() ends the watchdog's input and waits for it, so when it returns
    the work still running has had its TERM grace and the lease's directories are gone; nothing
    that tears the node down next (a VM, a namespace, a reboot) can cut that cleanup short."""
    tidied = tmp_path / "tidied"
    script = (f'mktemp -d "${{TMPDIR:-/tmp}}/{OWN_TEMP_PREFIX}$HANDOVER_LEASE-XXXX"; '
              f'trap "sleep 2; touch {tidied}; exit 143" TERM; '
              f'echo "$HANDOVER_LEASE" > {tmp_path}/lease; while :; do sleep 0.1; done')
    worker = threading.Thread(target=lambda: transport.run(["sh", "-c", script], timeout=60), daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "lease").exists():
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.1)
    lease = (tmp_path / "lease").read_text().strip()
    assert own_temp_dirs(lease)
    transport.close()
    assert tidied.exists() and own_temp_dirs(lease) == []
    worker.join(20)


def test_the_watchdog_finds_temporary_directories_under_the_tmpdir_its_commands_had(transport, tmp_path):
    """A command's TMPDIR need not be the watchdog's (sudo resets it for a root watchdog,
    pam_tmpdir gives each user one): what a hung command made there goes when the connection
    closes, as it would from /tmp."""
    own_tmp = tmp_path / "own-tmp"
    own_tmp.mkdir()
    script = (f'mktemp -d "$TMPDIR/{OWN_TEMP_PREFIX}$HANDOVER_LEASE-XXXX" > {tmp_path}/made; '
              'trap "" TERM; while :; do sleep 0.1; done')
    worker = threading.Thread(target=lambda: transport.run(["sh", "-c", script], timeout=60,
                                                          env={"TMPDIR": str(own_tmp)}), daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "made").exists() or not (tmp_path / "made").read_text():
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.1)
    made = Path((tmp_path / "made").read_text().strip())
    assert made.parent == own_tmp and made.is_dir()
    transport.close()
    assert list(own_tmp.iterdir()) == []
    worker.join(20)


def test_a_root_watchdog_finds_what_a_command_that_died_by_itself_left_in_the_sessions_tmpdir(
        tmp_path, monkeypatch):
    """sudo resets TMPDIR for a root watchdog, and a command KILLed by its own timeout leaves no
    process to learn its TMPDIR from: the watchdog is told the session's before sudo starts it."""
    session_tmp = tmp_path / "session-tmp"
    session_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(session_tmp))
    transport = make_transport(Node("localhost", "localhost", "local", python=sys.executable, sudo=True))
    try:
        script = f'mktemp -d "$TMPDIR/{OWN_TEMP_PREFIX}$HANDOVER_LEASE-XXXX"; kill -KILL $$'
        result = transport.run(["sh", "-c", script], timeout=30)
        made = Path(result.stdout.strip())
        assert not result.ok and made.parent == session_tmp and made.is_dir(), result
    finally:
        transport.close()
    assert list(session_tmp.iterdir()) == []


def test_stopped_sshd_is_unreachable_not_an_exception(ns_cluster_factory, tmp_path):
    nodes = ns_cluster_factory(2)
    cluster = ns_inventory(nodes, tmp_path / "inv.yaml")
    nodes.stop_sshd("node2")
    result = make_transport(cluster.node("node2")).run(["true"], timeout=5)
    assert result.failure == "unreachable" and result.exit_code is None
    assert "node2 unreachable" in result.explain()


def test_dead_link_is_unreachable_within_the_connect_timeout(ns_cluster_factory, tmp_path):
    nodes = ns_cluster_factory(1)
    cluster = ns_inventory(nodes, tmp_path / "inv.yaml", extra={})
    node = dataclasses.replace(cluster.nodes[0],
                               ssh=dataclasses.replace(cluster.nodes[0].ssh, connect_timeout=2))
    nodes.link_down("node1")
    started = time.monotonic()
    result = make_transport(node).run(["true"], timeout=5)
    assert result.failure == "unreachable"
    assert time.monotonic() - started < 6


def test_a_loss_heard_since_is_due_at_once_until_its_try_and_never_once_its_tries_are_spent():
    now = time.time()
    loss = Loss(now, "no answer within the connect timeout (5 s)")
    assert not loss.due() and loss.next_try == now + RECONNECT_AFTER_S[0]
    heard = dataclasses.replace(loss, heard_at=now + 1)
    assert heard.due()
    tried = heard.tried(now + 2)  # the try failed: the next needs its time, or another knock
    assert tried.heard_at is None and not tried.due()
    spent = dataclasses.replace(loss, earlier=len(RECONNECT_AFTER_S), heard_at=now + 1)
    assert spent.next_try is None and not spent.due()


def test_a_knock_hears_a_listening_port_and_not_a_refused_or_silent_one(ns_cluster_factory):
    """runners.ssh.knock: a TCP connect to each address at once, closed once made; a port nothing
    listens on refuses it, and one behind a dead link is silent for the whole wait."""
    from runners.ssh import knock

    nodes = ns_cluster_factory(2)
    nodes.link_down("node2")
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
        heard, refused = listening.getsockname(), closed.getsockname()
        up, down = (nodes.node("node1").address, SSH_PORT), (nodes.node("node2").address, SSH_PORT)
        try:
            assert knock([heard, refused, up, down], wait_s=2.0) == {heard, up}
        finally:
            nodes.link_up("node2")


def test_wrong_key_is_an_auth_failure(ns_cluster, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    node = ns_inventory(ns_cluster, tmp_path / "inv.yaml").nodes[0]
    node = dataclasses.replace(node, ssh=dataclasses.replace(node.ssh, identity_file=str(tmp_path / "other")))
    result = make_transport(node).run(["true"], timeout=5)
    assert result.failure == "auth", result


def test_unknown_host_key_is_refused_by_default(ns_cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    node = ns_inventory(ns_cluster, tmp_path / "inv.yaml", known_hosts=empty).nodes[0]
    result = make_transport(node).run(["true"], timeout=5)
    assert result.failure == "host-key", result
    assert empty.read_text() == ""


def test_accept_new_learns_unknown_hosts_but_refuses_changed_keys(ns_cluster, tmp_path):
    learned = tmp_path / "known_hosts"
    learned.write_text("")
    cluster = ns_inventory(ns_cluster, tmp_path / "inv.yaml", known_hosts=learned, host_keys="accept-new")
    first = cluster.nodes[0]
    learning = make_transport(first)
    try:
        assert learning.run(["true"], timeout=5).ok
    finally:
        learning.close()  # else its heartbeat says 'connection closed' when the session's nodes stop
    assert first.address in learned.read_text()
    # node2 presenting node1's key: rewrite the learned line to claim node2's address has it
    second = cluster.nodes[1]
    key_line = learned.read_text().split(None, 1)[1]
    learned.write_text(f"{second.address} {key_line}")
    result = make_transport(second).run(["true"], timeout=5)
    assert result.failure == "host-key", result


def test_local_transport_reports_a_missing_program():
    result = LocalTransport(Node("n", "n", "local")).run(["/nonexistent/tool"], timeout=5)
    assert not result.ok and result.exit_code == 127


def test_a_large_payload_ships_quickly(transport):
    """Payloads go through stdin in chunks; one byte per tick took 20 s for 2 KB once."""
    script = "# padding\n" * 20_000 + "print('shipped')\n"  # 200 KB
    started = time.monotonic()
    result = transport.run_script(script, timeout=30)
    assert result.stdout == "shipped\n"
    assert time.monotonic() - started < 5


def test_root_commands_go_through_sudo_when_the_inventory_says_so(transport):
    sudo_node = dataclasses.replace(transport.node, sudo=True)
    through_sudo = make_transport(sudo_node)
    try:
        result = through_sudo.run(["sh", "-c", 'echo "$(id -u) $SUDO_COMMAND"'], timeout=10, root=True)
        assert result.ok, result.explain()
        uid, command = result.stdout.strip().split(" ", 1)
        assert uid == "0" and "timeout" in command and "HANDOVER_TAG=" in command
        plain = through_sudo.run(["sh", "-c", 'echo "${SUDO_COMMAND:-none}"'], timeout=10)
        assert plain.stdout.strip() == "none"
        marker = unique_sleep()
        timed_out = through_sudo.run(["sh", "-c", f"{marker} & {marker}"], timeout=2, root=True)
        assert timed_out.timed_out
        assert wait_for_no_leftovers(marker) == []
    finally:
        through_sudo.close()


def test_jump_host_reaches_a_node_only_its_neighbours_can_resolve(ns_cluster, tmp_path):
    """node2 is a name only the nodes' /etc/hosts know, so only a hop through node1 gets there."""
    node1, node2 = ns_cluster.node("node1"), ns_cluster.node("node2")
    keys = {line.split()[0]: line.split(None, 1)[1] for line in ns_cluster.known_hosts.read_text().splitlines()}
    known = tmp_path / "known_hosts"
    known.write_text(f"{node1.address} {keys[node1.address]}\nnode2 {keys[node2.address]}\n")
    inventory = ns_cluster.write_inventory(tmp_path / "inv.yaml", known_hosts=known, extra={
        "nodes": [{"name": "node2", "address": "node2"}]})
    text = inventory.read_text().replace("connect_timeout: 5", f"connect_timeout: 5\n  jump: root@{node1.address}")
    inventory.write_text(text)
    from inventory.loader import load_inventory
    node = load_inventory(inventory).nodes[0]
    assert node.ssh.jump == f"root@{node1.address}"
    through = make_transport(node)
    try:
        result = through.run(["hostname"], timeout=10)
        assert result.ok and result.stdout.strip() == "node2", result.explain()
    finally:
        through.close()
    direct = make_transport(dataclasses.replace(node, ssh=dataclasses.replace(node.ssh, jump=None)))
    assert direct.run(["hostname"], timeout=10).failure == "unreachable"


def voluntary_switches(thread: threading.Thread) -> int:
    """How often a thread of this process went to sleep and woke again (the kernel's count)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_an_idle_connection_wakes_the_harness_for_its_heartbeats_only(ns_cluster, tmp_path):
    """paramiko's thread polls its socket every 0.1 s: over 1,024 idle connections that was
    10,000 wake-ups a second under the GIL, and the heartbeats starved. Once connected it wakes
    for data (a heartbeat's echo) or every IDLE_POLL_S, and a close still ends it at once."""
    import paramiko

    from runners.ssh import IDLE_POLL_S
    from runners.transport import HEARTBEAT_S

    before = set(threading.enumerate())
    transport = make_transport(ns_inventory(ns_cluster, tmp_path / "inv.yaml").nodes[0])
    try:
        assert transport.run(["true"], timeout=30).ok
        [connection] = [thread for thread in set(threading.enumerate()) - before
                        if isinstance(thread, paramiko.Transport)]
        woken = voluntary_switches(connection)
        time.sleep(2 * HEARTBEAT_S)
        woken = voluntary_switches(connection) - woken
        assert woken < 20, f"{woken} wake-ups in {2 * HEARTBEAT_S} s idle (0.1 s polls: 60)"
    finally:
        transport.close()
    connection.join(IDLE_POLL_S / 2)
    assert not connection.is_alive(), "the closed connection's thread waited out its poll"


def connections_from_harness(cluster, name: str) -> int:
    """SSH connections the node's sshd holds from this machine (the bridge's address)."""
    harness = str(cluster.subnet[BRIDGE_HOST_OCTET])
    listed = cluster.node_exec(name, ["ss", "-Htn", "state", "established", f"( sport = :{SSH_PORT} )"])
    return sum(1 for line in listed.stdout.splitlines() if line.split()[-1].rsplit(":", 1)[0] == harness)


def test_nodes_behind_a_jump_host_share_one_connection_to_it_closed_with_the_last(ns_cluster_factory,
                                                                                    tmp_path):
    """A bastion's sshd drops most of 64 handshakes at once (MaxStartups 10:30:100 by default),
    so 1,024 nodes behind it must not be 1,024 connections to it; nor may they stay open."""
    from inventory.loader import load_inventory
    from runners.fanout import close_everywhere, fan_out

    cluster = ns_cluster_factory(9)
    bastion = cluster.node("node1")
    behind = [name for name in cluster.node_names() if name != "node1"]
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", nodes=behind)
    inventory.write_text(inventory.read_text().replace(
        "connect_timeout: 5", f"connect_timeout: 5\n  jump: root@{bastion.address}"))
    transports = {node.name: make_transport(node) for node in load_inventory(inventory).nodes}
    try:
        answers = fan_out(transports, lambda t: t.run(["hostname"], timeout=30), name="hostname")
        assert {name: result.stdout.strip() for name, result in answers.items()} == {name: name for name in behind}
        assert connections_from_harness(cluster, "node1") == 1
        transports["node2"].close()
        assert transports["node3"].run(["true"], timeout=30).ok  # the others' chain stays open
    finally:
        close_everywhere(transports.values())
    assert wait_until(lambda: connections_from_harness(cluster, "node1") == 0, within_s=10), \
        "the jump host's connection outlived every node behind it"


def test_a_proxyjump_from_ssh_config_is_shared_too_and_skipped_by_its_own_hop(ns_cluster_factory, tmp_path,
                                                                              monkeypatch):
    """Operators put `Host * / ProxyJump bastion` in ~/.ssh/config rather than in an inventory."""
    from inventory.loader import load_inventory
    from runners.fanout import close_everywhere, fan_out
    from runners.ssh import _ssh_config

    cluster = ns_cluster_factory(5)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(f"Host *\n    ProxyJump root@{cluster.node('node1').address}\n")
    monkeypatch.setenv("HOME", str(home))
    _ssh_config.cache_clear()
    transports = {node.name: make_transport(node)
                  for node in load_inventory(cluster.write_inventory(tmp_path / "inv.yaml")).nodes}
    try:
        answers = fan_out(transports, lambda t: t.run(["hostname"], timeout=30), name="hostname")
        assert {name: result.stdout.strip() for name, result in answers.items()} == {
            name: name for name in cluster.node_names()}
        assert connections_from_harness(cluster, "node1") == 2  # node1 itself, and the chain for the others
    finally:
        close_everywhere(transports.values())
        _ssh_config.cache_clear()
    assert wait_until(lambda: connections_from_harness(cluster, "node1") == 0, within_s=10)


def public_key(tmp_path, name: str) -> str:
    """'ssh-ed25519 AAAA...' of a fresh key made by ssh-keygen."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    return " ".join((tmp_path / f"{name}.pub").read_text().split()[:2])


def test_known_hosts_are_read_once_and_found_by_plain_hashed_and_port_names(tmp_path):
    import os

    import paramiko

    from runners.ssh import KnownHosts

    first, second = public_key(tmp_path, "a"), public_key(tmp_path, "b")
    hashed = paramiko.HostKeys.hash_host("10.0.0.2")
    path = tmp_path / "known_hosts"
    path.write_text(f"# comment\n\n10.0.0.1,gpu01 {first}\n[10.0.0.1]:2222 {second}\n{hashed} {second}\n"
                    f"10.0.0.1 {second}\n")
    known = KnownHosts.of(str(path))

    def found(name: str) -> list[str]:
        return [f"{key.get_name()} {key.get_base64()}" for key in known.keys_of(name)]

    assert found("10.0.0.1") == [first, second] and found("gpu01") == [first]  # file order
    assert found("[10.0.0.1]:2222") == [second] and found("10.0.0.2") == [second]
    assert found("10.0.0.3") == [] and found("[10.0.0.2]:2222") == []
    assert KnownHosts.of(str(path)) is known  # unchanged on disk: not read again
    with path.open("a") as out:
        out.write(f"10.0.0.3 {first}\n")
    os.utime(path, ns=(0, 0))  # a change the size alone would not show is still seen: mtime
    again = KnownHosts.of(str(path))
    assert again is not known and [k.get_base64() for k in again.keys_of("10.0.0.3")] == [first.split()[1]]
    assert KnownHosts.of(str(tmp_path / "missing")).keys_of("10.0.0.1") == []


def test_a_command_runs_while_the_harness_holds_more_than_1024_descriptors(ns_cluster, tmp_path):
    """A thousand nodes are a thousand sockets: a command's wait must not use select(), which
    refuses descriptors past 1,024."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1400
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard limit on open files is {hard}, under {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        transport = make_transport(ns_inventory(ns_cluster, tmp_path / "inv.yaml").nodes[0])
        try:
            result = transport.run(["sh", "-c", "echo out; echo err >&2"], timeout=10)
        finally:
            transport.close()
        assert result.ok and (result.stdout, result.stderr) == ("out\n", "err\n"), result.explain()
    finally:
        for descriptor in held:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_learned_host_is_indexed_without_reading_the_file_again_unless_another_wrote_too(tmp_path):
    from runners.ssh import KnownHosts

    first, second = public_key(tmp_path, "a"), public_key(tmp_path, "b")
    path = tmp_path / "known_hosts"
    path.write_text(f"10.0.0.1 {first}\n")
    known = KnownHosts.of(str(path))
    line = f"10.0.0.2 {second}\n"
    with path.open("a") as out:
        out.write(line)
    known.learned(line)
    assert KnownHosts.of(str(path)) is known and len(known.keys_of("10.0.0.2")) == 1
    with path.open("a") as out:
        out.write(f"10.0.0.3 {first}\n10.0.0.4 {second}\n")  # another process's line, then ours
    known.learned(f"10.0.0.4 {second}\n")
    again = KnownHosts.of(str(path))
    assert again is not known and len(again.keys_of("10.0.0.3")) == 1


def test_a_watchdog_that_ends_while_the_connection_stands_is_started_again(ns_cluster, tmp_path):
    """The node-side watchdog kills our work and ends when the heartbeats stop for a while (a
    harness starved of CPU), or something kills it: the connection still stands, and without a
    watchdog a harness killed later would leave the node's commands to their own timeouts. It is
    started again on the same connection, for the same lease; and still ends with the transport."""
    transport = make_transport(ns_inventory(ns_cluster, tmp_path / "inv.yaml").nodes[0])
    try:
        assert transport.run(["true"], timeout=30).ok
        lease = transport._lease  # the connection's, whose tag every watchdog of it carries
        marker = f"{LEASE_VARIABLE}={lease.tag}"
        [first] = [line.split()[0] for line in leftovers(marker)]
        subprocess.run(["kill", "-KILL", first], check=True)
        assert wait_until(lambda: [line.split()[0] for line in leftovers(marker)] not in ([], [first]), 30)
        assert transport._lease is lease and transport.run(["true"], timeout=30).ok
    finally:
        transport.close()
    assert wait_for_no_leftovers(marker) == []


def connection_processes(pids: set[int]) -> list[int]:
    """Of `pids`, the sshd processes serving a connection (not the listener)."""
    found = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if command.startswith("sshd: ") and "[listener]" not in command and "/usr/sbin/sshd" not in command:
            found.append(pid)
    return found


def test_a_node_whose_sshd_stalls_before_the_watchdog_starts_is_unreachable_not_waited_for(ns_cluster, tmp_path,
                                                                                           monkeypatch):
    """paramiko waits for the answer to an exec request without bound, and the watchdog's comes
    before the heartbeat that finds a stalled node: a node's sshd stopped (SIGSTOP: a node stuck
    in a fork, a frozen VM) just after it took the connection held the harness for ever. The
    real sshd is stopped at that moment; the node is unreachable within the connect timeout."""
    node = ns_inventory(ns_cluster, tmp_path / "inv.yaml").nodes[0]
    stopped: list[int] = []
    execute = paramiko.Channel.exec_command

    def stall_then_execute(channel, command):  # the connection's first: the watchdog's
        if not stopped:
            stopped.extend(connection_processes(ns_cluster.processes()))
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
        return execute(channel, command)

    monkeypatch.setattr(paramiko.Channel, "exec_command", stall_then_execute)
    transport = make_transport(node)
    ran: list = []
    worker = threading.Thread(target=lambda: ran.append(transport.run(["true"], timeout=30)), daemon=True)
    try:
        worker.start()
        worker.join(120)  # a bound on the test, not a measure of the harness
        assert stopped and ran, "the run still waits on the stalled node"
        assert ran[0].failure == "unreachable" and "no answer within the connect timeout" in ran[0].detail, ran[0]
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        transport.close()


def test_a_closed_transport_starts_nothing_more_on_its_node(transport):
    """After the run's end closed it, a worker thread left behind (a fan-out's, after Ctrl-C)
    must not open a new connection and start commands nobody waits for or cleans up."""
    assert transport.run(["true"], timeout=30).ok
    transport.close()
    again = transport.run(["true"], timeout=30)
    assert (again.failure, again.detail) == ("error", "the run closed its connection to the node; "
                                                      "nothing more is started there")
    assert transport._lease is None  # no connection (and watchdog) was opened for it


def test_a_login_the_link_cut_short_is_unreachable_and_tried_again_not_an_auth_failure():
    """At 20% packet loss paramiko raised "Authentication timeout." (and may raise "transport
    shut down or saw EOF") mid-login: reported as an authentication failure, never retried, the
    operator sent to check keys on a node whose trouble was the network. A refused key stays auth."""
    from runners.ssh import _classify, _transient

    for words in ("Authentication timeout.", "Authentication failed: transport shut down or saw EOF"):
        cut = paramiko.AuthenticationException(words)
        failure, detail = _classify(cut, 5)
        assert (failure, detail) == ("unreachable", f"the login did not complete: {words} (a lossy or "
                                                    "overloaded link, or sshd)")
        assert _transient(cut, failure)
    refused = paramiko.AuthenticationException("Authentication failed.")
    assert _classify(refused, 5) == ("auth", "authentication failed: Authentication failed.")
    assert not _transient(refused, "auth")


def test_a_link_that_keeps_falling_silent_is_on_the_record_in_a_bounded_number_of_entries():
    """A link silent for a few seconds every minute of a 24-hour soak: 1,440 silences. The first
    SILENCES_KEPT are kept one by one, the rest as one entry saying how many, the longest, and
    from when to when; the report's rows stay a few per node."""
    silences = Silences()
    start = 1_800_000_000.0
    for minute in range(1440):
        since = start + 60 * minute
        silences.note(since, since + (9 if minute == 700 else 5), "no answer to SSH keepalives for 5 s")
    entries = silences.entries()
    assert len(entries) == SILENCES_KEPT + 1
    assert [back for _, back in entries[:SILENCES_KEPT]] == [start + 60 * m + 5 for m in range(SILENCES_KEPT)]
    rest, back = entries[-1]
    assert rest.reason == f"{1440 - SILENCES_KEPT} more silences of the link, the longest 9 s"
    assert rest.at == start + 60 * SILENCES_KEPT and back == start + 60 * 1439 + 5
