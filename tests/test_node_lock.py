"""Node locks on real sshd nodes: a second run at once is refused by node and told which run holds
it; --busy-nodes wait and ignore; and a lock ends with its run, also when the harness is SIGKILLed."""
from __future__ import annotations

import html
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from nodes import ns_inventory, wait_for_no_leftovers

from handover.plugin import lock_lines
from reports.verdict import REASONS_SHOWN
from runners.fanout import close_everywhere
from runners.node_lock import NodeLock, NodeLocks, Owner
from runners.transport import make_transport

ROOT = Path(__file__).resolve().parent.parent
HOLDER_MARK = "handover-node-lock"  # the holder's $0, in its command line on the node
HOLDER = Owner(run_id="20260101T000000Z-0badcafe", started="2026-01-01T00:00:00+00:00",
               host="bastion.example", token="feedfacefeedface")


def acceptance_argv(inventory: Path, out: Path, key: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "--inventory", str(inventory), "--out", str(out),
            "--sign-key", str(key), "-p", "no:cacheprovider", "-m", "system", *extra]


def acceptance(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(acceptance_argv(*argv, **kwargs), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def ledger_of(out: Path) -> list[dict]:
    runs = list((out / "nscluster").glob("*/ledger.jsonl"))
    if not runs:
        return []
    return [json.loads(line) for line in runs[0].read_text().splitlines() if line.endswith("}")]


def results_of(out: Path) -> dict:
    return json.loads((out / "nscluster" / "latest" / "results.json").read_text())


@contextmanager
def locks_on(cluster, names: list[str]) -> Iterator[NodeLocks]:
    """Another run's NodeLocks over fresh connections to these nodes; released and the connections
    closed at the end (an open one would outlive the test's nodes)."""
    transports = {name: make_transport(cluster.node(name)) for name in names}
    locks = NodeLocks(HOLDER, transports)
    try:
        yield locks
    finally:
        locks.release()
        close_everywhere(transports.values())


@contextmanager
def held(cluster, names: list[str]) -> Iterator[NodeLocks]:
    """Another run's locks on these nodes, taken through the real transport."""
    with locks_on(cluster, names) as locks:
        assert {lock.state for lock in locks.take().values()} == {"held"}
        yield locks


@pytest.fixture
def two_nodes(ns_cluster_factory, tmp_path):
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    return inventory, ns_inventory(nodes, tmp_path / "copy.yaml"), nodes


def test_a_second_run_is_refused_by_node_and_sigkill_of_the_first_frees_its_locks(two_nodes, sign_key, tmp_path):
    inventory, cluster, nodes = two_nodes
    first = subprocess.Popen(acceptance_argv(inventory, tmp_path / "first", sign_key), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(e["type"] == "locks" for e in ledger_of(tmp_path / "first")):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never locked"
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)  # the first run, in the middle of its checks
        header = ledger_of(tmp_path / "first")[0]
        second = acceptance(inventory, tmp_path / "second", sign_key)
        assert second.returncode != 0
        holder = f"run {header['run_id']} (started {header['started']}, from host {socket.gethostname()})"
        for node in ("node1", "node2"):
            assert f"{node} is in use by {holder}" in second.stdout, second.stdout
        second_results = results_of(tmp_path / "second")
        checks = second_results["checks"]
        assert checks and {c["kind"] for c in checks} == {"busy"}
        assert second_results["run"]["unlocked"] == []  # refused, so not tested without a lock

        first.send_signal(signal.SIGKILL)
        first.wait()
        killed = time.monotonic()
        while True:  # the holders die with their SSH sessions: the nodes are free within seconds
            with locks_on(cluster, [node.name for node in cluster.nodes]) as locks:
                states = {lock.state for lock in locks.take().values()}
            if states == {"held"}:
                break
            assert time.monotonic() - killed < 15, states
            time.sleep(0.5)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    third = acceptance(inventory, tmp_path / "third", sign_key)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "verdict: CERTIFIED" in third.stdout
    # The refused run, resumed once the nodes are free, runs the checks it was refused (each
    # said "run again once it has ended"), rather than keeping them as done.
    second_dir = tmp_path / "second" / "nscluster" / "latest"
    resumed = acceptance(inventory, tmp_path / "second", sign_key, "--resume", str(second_dir))
    assert resumed.returncode == 0 and "verdict: CERTIFIED" in resumed.stdout, resumed.stdout + resumed.stderr
    assert not [c for c in results_of(tmp_path / "second")["checks"] if c["kind"] == "busy"]
    assert wait_for_no_leftovers(HOLDER_MARK, within_s=15, on=nodes) == []


def test_ignore_goes_on_and_the_ledger_says_who_else_was_there(two_nodes, sign_key, tmp_path):
    inventory, cluster, _ = two_nodes
    with held(cluster, ["node1"]):
        done = acceptance(inventory, tmp_path / "out", sign_key, "--busy-nodes", "ignore")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"handover: node1 is in use by {HOLDER.describe()}; checked anyway (--busy-nodes ignore)"
            in done.stdout)
    entry = next(e for e in ledger_of(tmp_path / "out") if e["type"] == "locks")
    assert entry["held"] == ["node2"] and list(entry["not_held"]) == ["node1"]
    assert HOLDER.run_id in entry["not_held"]["node1"] and entry["refused"] == entry["not_reached"] == []
    results = results_of(tmp_path / "out")
    assert results["verdict"]["status"] == "CERTIFIED"
    # The customer's report says so: node1's figures may include the other run's load.
    assert results["run"]["unlocked"] == [{"node": "node1", "reason": f"node1 is in use by {HOLDER.describe()}"}]
    report = (tmp_path / "out" / "nscluster" / "latest" / "report.html").read_text()
    assert "Nodes tested without their node lock" in report
    assert html.escape(f"node1 is in use by {HOLDER.describe()}") in report


def test_wait_takes_the_node_once_the_other_run_has_ended(two_nodes, sign_key, tmp_path):
    inventory, cluster, _ = two_nodes
    with held(cluster, ["node1", "node2"]) as locks:
        releaser = threading.Timer(3, locks.release)
        releaser.start()
        started = time.monotonic()
        try:
            done = acceptance(inventory, tmp_path / "out", sign_key, "--busy-nodes", "wait")
        finally:
            releaser.join()
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started >= 3
    entry = next(e for e in ledger_of(tmp_path / "out") if e["type"] == "locks")
    assert entry["held"] == ["node1", "node2"] and entry["not_held"] == {}
    assert results_of(tmp_path / "out")["run"]["unlocked"] == []
    assert "Nodes tested without their node lock" not in (
        tmp_path / "out" / "nscluster" / "latest" / "report.html").read_text()


def test_the_lock_file_names_its_owner_and_a_foreign_file_names_nobody():
    line = f"4242 {json.dumps(HOLDER.__dict__)}"
    assert Owner.parse(line) == HOLDER
    assert Owner.parse("") is None and Owner.parse("4242 not json") is None
    assert NodeLock("gpu01", "busy", owner=None).describe() == (
        "gpu01 is in use by another run (not yet named in its lock file)")


def test_nodes_not_locked_alike_are_one_line_in_a_fleet_and_a_line_each_otherwise():
    """A rack that refuses SSH: in a fleet one line names it by hostlist and the first node's
    words; a node busy otherwise keeps its line; past REASONS_SHOWN lines, the rest are counted.
    Below a fleet each node keeps its own line."""
    refused = {f"d{i:04d}": f"d{i:04d} not locked: d{i:04d} unreachable: Unable to connect to port 22 on "
                            f"10.0.3.{i} (after 3 tries)" for i in range(70)}
    notes = {**refused, "d0070": "d0070 not locked: no flock on the node"}
    assert lock_lines(notes, fleet=True) == [
        "d[0000-0069] (70 nodes): d0000 not locked: d0000 unreachable: Unable to connect to port 22 on "
        "10.0.3.0 (after 3 tries)", "d0070 not locked: no flock on the node"]
    each = lock_lines(notes, fleet=False)
    assert each[:REASONS_SHOWN] == list(notes.values())[:REASONS_SHOWN]
    assert each[REASONS_SHOWN:] == [f"... and {71 - REASONS_SHOWN} more nodes not locked (the ledger's locks "
                                    "entry names each)"]
    apart = {f"d{i:04d}": f"d{i:04d} not locked: reason {i}" for i in range(30)}
    assert lock_lines(apart, fleet=True)[-1].startswith(f"... and {30 - REASONS_SHOWN} more nodes not locked")
