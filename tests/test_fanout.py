"""Fan-out over real sshd nodes: a per-node map where a dead node is data, concurrency, deadline."""
from __future__ import annotations

import pytest
from nodes import ns_inventory, unique_sleep, wait_for_no_leftovers

from runners.fanout import fan_out
from runners.ssh import CONNECTS_AT_ONCE
from runners.transport import make_transport


@pytest.fixture
def transports_for():
    """transports_for(cluster) -> {node: transport}, all closed after the test: a connection
    left open would only find out, and say so, when the session's nodes go down at the end."""
    opened: list = []

    def make(cluster) -> dict:
        opened.extend(make_transport(node) for node in cluster.nodes)
        return {transport.node.name: transport for transport in opened[-len(cluster.nodes):]}

    yield make
    for transport in opened:
        transport.close()


def test_a_dead_node_is_an_entry_not_an_exception(ns_cluster_factory, transports_for, tmp_path):
    nodes = ns_cluster_factory(4)
    cluster = ns_inventory(nodes, tmp_path / "inv.yaml")
    nodes.stop_sshd("node3")
    results = fan_out(transports_for(cluster), lambda t: t.run(["hostname"], timeout=10), name="hostname")
    assert list(results) == ["node1", "node2", "node3", "node4"]
    assert {n: r.status for n, r in results.items()} == {
        "node1": "ok", "node2": "ok", "node3": "unreachable", "node4": "ok"}
    assert [results[n].stdout.strip() for n in ("node1", "node2", "node4")] == ["node1", "node2", "node4"]


def test_nodes_run_concurrently(ns_cluster, transports_for, tmp_path):
    """Every node's command was running at one moment: each says when it started and ended
    (the nodes share this machine's clock), and the latest start comes before the first end."""
    transports = transports_for(ns_inventory(ns_cluster, tmp_path / "inv.yaml"))
    fan_out(transports, lambda t: t.run(["true"], timeout=10))  # connect first
    spans = fan_out(transports, lambda t: t.run(["sh", "-c", "date +%s.%N; sleep 2; date +%s.%N"], timeout=30),
                    name="sleep")
    assert all(r.ok for r in spans.values()), spans
    started, ended = zip(*(map(float, r.stdout.split()) for r in spans.values()), strict=True)
    assert max(started) < min(ended), f"4 nodes' 2 s sleeps did not overlap: {spans}"


def test_past_64_nodes_every_node_runs_at_once_too(ns_cluster_factory, transports_for, tmp_path):
    """More nodes than SSH handshakes may run at once (CONNECTS_AT_ONCE, 64), and the fan-out once
    ran its steps on a pool of that size: 80 nodes' sleeps overlap all the same, where a pool of 64
    ran them in two waves (1,024 nodes' 60 s stress-ng would take 16 minutes)."""
    count = CONNECTS_AT_ONCE + 16
    transports = transports_for(ns_inventory(ns_cluster_factory(count), tmp_path / "inv.yaml"))
    connected = fan_out(transports, lambda t: t.run(["true"], timeout=60))
    assert [name for name, result in connected.items() if not result.ok] == []
    spans = fan_out(transports, lambda t: t.run(["sh", "-c", "date +%s.%N; sleep 3; date +%s.%N"], timeout=60),
                    name="sleep")
    assert all(r.ok for r in spans.values()), [r.explain() for r in spans.values() if not r.ok]
    started, ended = zip(*(map(float, r.stdout.split()) for r in spans.values()), strict=True)
    assert max(started) < min(ended), f"{count} nodes' 3 s sleeps did not overlap"


def test_deadline_turns_stragglers_into_timeouts_and_kills_them(ns_cluster, transports_for, tmp_path):
    cluster = ns_inventory(ns_cluster, tmp_path / "inv.yaml")
    marker = unique_sleep()
    seen = []

    def step(transport):
        argv = ["sh", "-c", marker] if transport.node.name == "node2" else ["true"]
        return transport.run(argv, timeout=120)

    results = fan_out(transports_for(cluster), step, name="straggler", deadline_s=3,
                      on_progress=lambda p: seen.append(p.line()))
    assert results["node2"].timed_out and "deadline" in results["node2"].detail
    assert all(results[n].ok for n in ("node1", "node3", "node4"))
    assert wait_for_no_leftovers(marker) == []
    assert any("3/4 nodes done" in line and "node2" in line for line in seen)


def test_a_step_that_raises_is_an_error_entry(tmp_path):
    from inventory.model import Node
    from runners.transport import LocalTransport

    transports = {"a": LocalTransport(Node("a", "a", "local")), "b": LocalTransport(Node("b", "b", "local"))}

    def step(transport):
        if transport.node.name == "b":
            raise ValueError("parser blew up")
        return transport.run(["true"], timeout=5)

    results = fan_out(transports, step)
    assert results["a"].ok
    assert results["b"].failure == "error" and "ValueError: parser blew up" in results["b"].detail


def test_progress_names_the_first_running_nodes_and_counts_the_failures_after_every_event():
    """What a terminal shows after each start and finish, in any order (a node started again
    too): the first four running nodes by name and the failures so far, as sorting the running
    nodes and counting every result would say."""
    import random

    from runners.fanout import Progress

    rng = random.Random(3)
    nodes = [f"node{i:02d}" for i in range(30)]
    progress = Progress(step="hostname", total=len(nodes))
    waiting, finished = rng.sample(nodes, len(nodes)), []
    while waiting or progress.running:
        if waiting and (not progress.running or rng.random() < 0.5):
            progress.start(waiting.pop())
        else:
            node = rng.choice(sorted(progress.running))
            progress.finish(node, "ok" if rng.random() < 0.7 else "unreachable")
            finished.append(node)
            if len(finished) == 5:
                progress.start(node)  # started again: running once, failures counted once
        first = sorted(progress.running)[:4]
        failed = sum(1 for status in progress.done.values() if status != "ok")
        line = progress.line()
        assert progress.failed == failed
        assert f"hostname: {len(progress.done)}/30 nodes done, {failed} failed, " in line
        if progress.running:
            assert line.endswith("; running: " + ", ".join(first) + (" ..." if len(progress.running) > 4 else ""))
        else:
            assert "running" not in line
    given = Progress(step="soak", total=3, done={"a": "ok", "b": "gone"}, running={"c"})
    assert given.failed == 1 and given.line().endswith("; running: c")
