"""A run across nodes that gives no figure, isolated on real namespace nodes (torchrun, gloo):
one node's firewall lets SSH through and nothing else, so every run with it hangs at the
rendezvous. The all-reduce (suites/test_collectives.py) and the DDP training
(suites/test_training.py) each find that node.

Apart from the timed group (tests/conftest.py): the bands admit any figure, so the healthy
runs pass however loaded the machine is, and most of the minutes are spent waiting.
"""
from __future__ import annotations

import re
import shutil

import pytest
from test_collectives import checks_of
from test_e2e import results_of, run_dir_of, run_suites

pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")

ANY_FIGURE = {"value": 0.002, "lower": -0.5, "source": "test: any figure the gloo all-reduce gives"}
ANY_EFFICIENCY = {"check": "training_scaling", "value": 0.2, "lower": -0.5, "unit": "%",
                  "source": "test: any scaling efficiency"}


DEAD_NODE = "node5"
# The namespace nodes start torchrun within seconds of each other: a rendezvous of 30 s (and runs
# cut at 30 s at the least) is ample for the healthy groups, and ends each run with the fenced
# node in half the default's minute.
QUICK_RENDEZVOUS = {
    "launch": {"rendezvous_timeout_s": 30},
    "expect": {"isolation_hang_floor_s": {"value": 30, "reason": "namespace nodes start torchrun in seconds"}}}
# The run's own failure, first in the log: torchrun's rendezvous, from the most telling node (the
# fenced one could not reach the store, where it said so before the launch was stopped).
RENDEZVOUS_FAILED = re.compile(r"node\d: (torchrun could not reach the rendezvous store of node1 on [\d.]+:\d+ within "
                               r"launch.rendezvous_timeout_s \(30 s\)|not every node joined torchrun's rendezvous "
                               r"within launch.rendezvous_timeout_s \(30 s\)|torchrun lost the rendezvous store)")


# A node's firewall drops every TCP segment from other hosts but its sshd's (nftables, in its
# namespace only); its own loopback is left alone, so it still runs on its own.
FENCE = """table inet handover_test_fence {
  chain input { type filter hook input priority 0; policy accept; iifname "lo" accept; tcp dport != 22 drop; }
}
"""


def assert_rendezvous_failed(log: str, fenced_node: str) -> None:
    """The run's own failure comes first in the log: its rendezvous failed, and a node that could
    not reach the store is the fenced one."""
    assert RENDEZVOUS_FAILED.match(log), log[:300]
    unreached = re.match(r"(node\d): torchrun could not reach", log)
    assert unreached is None or unreached[1] == fenced_node, log[:300]


def fenced(cluster, node: str):
    """node answers SSH, so its checks run, while its ranks can neither join a rendezvous nor
    answer one (FENCE): the classic node that stops a run across nodes without being unreachable."""
    cluster.firewall(node, FENCE)
    return cluster


@pytest.fixture(autouse=True)
def nft_installed():
    if shutil.which("nft") is None:
        pytest.skip("`nft` is not installed (apt-get install nftables; make setup does)")


@pytest.fixture
def six_nodes_one_dead_to_all_but_ssh(ns_cluster_factory):
    return fenced(ns_cluster_factory(6), DEAD_NODE)


def test_a_node_that_breaks_the_cluster_all_reduce_is_isolated_rather_than_the_launch_named(
        six_nodes_one_dead_to_all_but_ssh, sign_key, tmp_path):
    """The all-reduce across the six nodes gives no figure (node5 never joins), and the isolation
    finds node5 by the runs that give one without it; the runs with it hang at the rendezvous
    and are cut (or give up there first, as long)."""
    inventory = six_nodes_one_dead_to_all_but_ssh.write_inventory(tmp_path / "cluster.yaml", extra={
        "references": {"allreduce_busbw_cluster": ANY_FIGURE}, **QUICK_RENDEZVOUS})
    run_suites(inventory, tmp_path / "out", sign_key, "suites/test_collectives.py", "-m", "training",
               "-k", "allreduce_cluster", timeout=1500)
    cluster = checks_of(results_of(run_dir_of(tmp_path / "out", "nscluster")))[("allreduce_cluster", None)]
    message = cluster["message"]
    assert cluster["outcome"] == "failed" and cluster["kind"] in ("sanity", "timeout"), message
    assert message.startswith("the all-reduce across 6 nodes gave no figure; isolated node5 (cluster "
                              "node1..node6 (6 nodes) no figure (sanity); screen node4,node5,node6 no figure ("), \
        message
    assert re.findall(r"isolated (\w+)", message) == [DEAD_NODE], message
    # Each run with node5 waits for it at the rendezvous, and is cut as hung at the floor (30 s)
    # unless the rendezvous gives up first (also 30 s, from a few seconds later); healthy groups
    # took 9-10 s here.
    assert re.search(r"; confirm node5 with node\d no figure \(", message), message
    assert "band >= 0.001 GB/s; cleared 5 of 6 node(s)" in message and "not finished" not in message
    assert cluster["action"].startswith("take node5 out of the cluster's jobs and check each on its own")
    figures = {m["name"]: m["value"] for m in cluster["metrics"]}
    assert figures["isolated_nodes"] == 1 and figures["isolation_rounds"] >= 2
    assert_rendezvous_failed(cluster["log_excerpt"], DEAD_NODE)


def test_a_node_that_breaks_the_training_across_nodes_is_isolated_by_the_scaling_check(ns_cluster_factory,
                                                                                       sign_key, tmp_path):
    """Four nodes, node3 fenced: the DDP run on all nodes gives no figure, and training_scaling
    isolates node3 with DDP runs of a few steps on groups of nodes, its own runs the baseline."""
    nodes = fenced(ns_cluster_factory(4), "node3")
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml", extra={
        "references": {"scaling_efficiency": ANY_EFFICIENCY}, **QUICK_RENDEZVOUS})
    done = run_suites(inventory, tmp_path / "out", sign_key, "suites/test_training.py", "-m", "not full",
                      "-k", "training_scaling", timeout=1500)
    assert (tmp_path / "out" / "nscluster" / "latest").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    check = checks_of(results_of(run_dir_of(tmp_path / "out", "nscluster")))[("training_scaling", None)]
    message = check["message"]
    assert check["outcome"] == "failed" and check["kind"] in ("sanity", "timeout"), message
    assert message.startswith("the training across 4 nodes gave no figure; isolated node3 (cluster "
                              "node1,node2,node3,node4 no figure ("), message
    assert re.findall(r"isolated (\w+)", message) == ["node3"], message
    assert re.search(r"; confirm node3 with node\d no figure \(", message), message
    assert "band >= 0.1 %; cleared 3 of 4 node(s)" in message and "not finished" not in message
    assert check["action"].startswith("take node3 out of the cluster's jobs")
    assert_rendezvous_failed(check["log_excerpt"], "node3")
