"""Training: the DDP payload trains for real on CPUs (one node with two ranks, and across
namespace nodes through the torchrun launcher over SSH); the parser and analyses on real outputs;
faults: a rank killed mid-run and a node unreachable at launch, with nothing left running."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from nodes import ns_inventory, wait_for_no_leftovers

from handover.failures import SanityFailure
from inventory.model import Node
from runners import training
from runners.parsing import ParseError
from runners.ssh import SshTransport
from runners.transport import LocalTransport
from suites.checks import launch_failure

pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")

DATA = Path(__file__).parent / "data"
TRAINING = DATA / "training"
ONE_STEP_MODEL = replace(training.CPU_MODEL, steps=20)


# ---------------------------------------------------------------------------------------------
# Parser and analyses on real outputs


def real_report() -> training.TrainingReport:
    return training.parse_training((TRAINING / "cpu-2ranks.stdout").read_text())


def test_parser_reads_the_payload_line_among_torchruns_banners():
    report = real_report()
    assert report.ok and report.ranks == 2 and report.backend == "gloo" and report.device == "cpu"
    assert [rank.rank for rank in report.per_rank] == [0, 1]
    assert len(report.losses) == report.config["steps"] == 30
    assert report.tokens_per_step == 2 * 8 * 128 and report.tokens_per_s > 0
    assert all(len(rank.forward_times) == 30 for rank in report.per_rank)
    assert len(report.step_times()) == 29  # the warm-up step is left out


def test_parser_refuses_other_text():
    with pytest.raises(ParseError):
        training.parse_training((DATA / "iperf3" / os.listdir(DATA / "iperf3")[0]).read_text())


def test_a_report_missing_a_rank_is_not_ok():
    """Derived from the real output: rank 1's entry removed, as if it never reported."""
    data = json.loads((TRAINING / "cpu-2ranks.stdout").read_text().strip().splitlines()[-1])
    data["per_rank"] = data["per_rank"][:1]
    report = training.parse_training(json.dumps(data))
    assert not report.ok and training.why_not_sane(report, 2) == "1 of 2 rank(s) reported"


def test_the_recorded_losses_fall_and_a_flat_or_nan_loss_does_not():
    assert training.loss_falls(real_report().losses, 0.5) is None
    h200 = json.loads((DATA / "h200-1gpu" / "perf.json").read_text())["train_losses"]
    assert training.loss_falls(h200, 0.5) is None  # 10.38 -> 0.04 in 30 steps on one H200
    assert "fell from 6.26 to 6.1" in training.loss_falls([6.26, 6.2, 6.1], 0.5)
    assert "from step 2" in training.loss_falls([6.26, None, 1.0], 0.5)


def test_no_straggler_in_the_real_run_and_a_slow_rank_is_named():
    report = real_report()
    assert training.stragglers(report.per_rank, 0.5) == []
    slow = replace(report.per_rank[1], forward_times=[t * 3 for t in report.per_rank[1].forward_times])
    found = training.stragglers([report.per_rank[0], slow, replace(report.per_rank[0], rank=2)], 0.2)
    assert [(s.rank, s.host) for s in found] == [(1, slow.host)] and found[0].over > 1.5


def test_scaling_efficiency_and_percentile():
    assert training.scaling_efficiency(360.0, {"a": 100.0, "b": 90.0, "c": 110.0, "d": 100.0}) == 90.0
    steps = [0.05] * 98 + [0.07, 0.3]
    assert training.percentile(steps, 0.99) == 0.07  # nearest rank: the 99th of 100


def test_failed_ranks_names_the_killed_rank_first():
    failed = training.failed_ranks((TRAINING / "rank1-killed.stderr").read_text())
    assert [(f.rank, f.exit_code, f.root_cause) for f in failed] == [(1, -9, True), (0, -15, False)]
    assert failed[0].describe() == "rank 1 (local rank 1) on localhost (killed by signal 9)"


def test_root_cause_prefers_the_rank_that_died_over_those_torchrun_stopped():
    killed = (TRAINING / "rank1-killed.stderr").read_text()
    node, rank = training.root_cause({"gpu01": "no summary here", "gpu02": killed})
    assert node == "gpu02" and rank.rank == 1 and rank.exit_code == -9
    assert training.root_cause({"gpu01": "no summary"}) is None


def test_the_gpu_model_is_the_size_of_the_recorded_h200_run():
    """perf.json: 166.3M parameters, first loss 10.38 (ln 32000); the default GPU model matches."""
    config = training.GPU_MODEL
    blocks = config.layers * (12 * config.width ** 2 + 13 * config.width)
    embeddings = 2 * config.vocab * config.width + config.seq * config.width
    assert config.vocab == 32000 and 160e6 < blocks + embeddings < 172e6


# ---------------------------------------------------------------------------------------------
# Real runs


def local_transport() -> LocalTransport:
    return LocalTransport(Node(name="localhost", address="localhost", transport="local",
                               python=os.environ.get("HANDOVER_TEST_PYTHON", __import__("sys").executable)))


def test_two_ranks_on_one_node_train_and_round_trip_a_checkpoint(tmp_path):
    result = training.run_on_node(local_transport(), 2, ONE_STEP_MODEL, timeout=120,
                                  checkpoint_dir=str(tmp_path))
    assert result.ok, result.stderr[-2000:]
    report = training.parse_training(result.stdout)
    assert training.why_not_sane(report, 2) is None  # every rank, every step, the loss fell
    checkpoints = [rank.checkpoint for rank in report.per_rank]
    assert all(c.matches and not c.error and c.bytes > 1 << 20 for c in checkpoints)
    assert list(tmp_path.iterdir()) == []  # removed after the round trip


def test_a_checkpoint_path_that_is_not_a_directory_is_reported_not_created(tmp_path):
    missing = tmp_path / "absent"
    result = training.run_on_node(local_transport(), 2, replace(ONE_STEP_MODEL, steps=2),
                                  timeout=120, checkpoint_dir=str(missing))
    report = training.parse_training(result.stdout)
    assert all("is not a directory" in rank.checkpoint.error for rank in report.per_rank)
    assert not missing.exists()


def test_a_checkpoint_that_fills_its_disk_fails_and_leaves_nothing_there(tiny_disk):
    """A 256 KiB tmpfs for a checkpoint of over a megabyte: the write fails, each rank says so,
    and the torn file goes (before, the end removed only a checkpoint written whole)."""
    result = training.run_on_node(local_transport(), 2, replace(ONE_STEP_MODEL, steps=2),
                                  timeout=120, checkpoint_dir=str(tiny_disk.path))
    report = training.parse_training(result.stdout)
    assert all(rank.checkpoint.error.startswith(f"writing {tiny_disk.path}/handover-checkpoint-")
               for rank in report.per_rank), [rank.checkpoint.error for rank in report.per_rank]
    assert list(tiny_disk.path.iterdir()) == []


def transports_of(cluster) -> dict:
    return {node.name: SshTransport(node) for node in cluster.nodes}


def test_two_nodes_train_together_over_ssh_and_share_the_checkpoint(ns_cluster, tmp_path):
    """torchrun on node1 and node2 (one rank each), c10d rendezvous on node1, gloo over eth0;
    rank 0 writes the checkpoint, the rank on the other node reads it back."""
    cluster = ns_inventory(ns_cluster, tmp_path / "cluster.yaml", nodes=["node1", "node2"])
    shared = tmp_path / "shared"
    shared.mkdir()
    transports = transports_of(cluster)
    try:
        launch = training.run_across(transports, {n.name: n.address for n in cluster.nodes}, 1,
                                     ONE_STEP_MODEL, timeout=120, checkpoint_dir=str(shared))
    finally:
        for transport in transports.values():
            transport.close()
    assert launch.ok, {node: r.explain() + r.stderr[-1500:] for node, r in launch.results.items()}
    report, result = training.report_of(launch)
    assert result.ok and training.why_not_sane(report, 2) is None
    assert report.hosts == ["node1", "node2"] and report.env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert all(rank.checkpoint.matches for rank in report.per_rank)
    assert list(shared.iterdir()) == []
    assert wait_for_no_leftovers(launch.marker) == []


def rank_in(namespace: str) -> tuple[int, int] | None:
    """(pid, rank) of a training payload process inside one node's network namespace (the nodes
    share this PID namespace with every other test's, so the network namespace tells ours)."""
    inode = os.stat(f"/run/netns/{namespace}").st_ino
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
            cmdline = (environ.parent / "cmdline").read_bytes()
            inside = os.stat(environ.parent / "ns" / "net").st_ino == inode
        except OSError:
            continue
        ranks = [v[5:] for v in variables if v.startswith(b"RANK=")]
        if inside and ranks and b"--vocab" in cmdline and b"--marker" in cmdline:
            return int(environ.parent.name), int(ranks[0])
    return None


def test_a_rank_killed_mid_run_fails_the_run_naming_it_and_nothing_is_left(ns_cluster_factory, tmp_path):
    """The rank on node2 (one rank per node) is sent SIGKILL mid-run."""
    nodes = ns_cluster_factory(2)
    cluster = ns_inventory(nodes, tmp_path / "cluster.yaml")
    transports = transports_of(cluster)
    killed = []

    def kill_the_rank_on_node2():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = rank_in(nodes.node("node2").namespace)
            if found:
                time.sleep(2)  # let it train a little
                os.kill(found[0], signal.SIGKILL)
                killed.append(found[1])
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_rank_on_node2, daemon=True)
    killer.start()
    try:
        launch = training.run_across(transports, {n.name: n.address for n in cluster.nodes}, 1,
                                     replace(training.CPU_MODEL, steps=100000), timeout=90)
    finally:
        for transport in transports.values():
            transport.close()
    killer.join(1)
    assert killed, "no rank started on node2"
    assert launch.first_failure is not None and not launch.ok
    with pytest.raises(SanityFailure, match=rf"rank {killed[0]} \(local rank 0\) on node2 \(killed by signal 9\) "
                                            r"failed first \(torchrun on node2\)"):
        launch_failure(launch, training.launch_cause(launch, 2))
    assert launch.leftovers == {}
    assert wait_for_no_leftovers(launch.marker) == []


def test_a_node_unreachable_at_launch_fails_fast_and_leaves_nothing(ns_cluster_factory, tmp_path):
    nodes = ns_cluster_factory(2)
    cluster = ns_inventory(nodes, tmp_path / "cluster.yaml")
    nodes.stop_sshd("node2")
    transports = transports_of(cluster)
    started = time.monotonic()
    try:
        launch = training.run_across(transports, {n.name: n.address for n in cluster.nodes}, 1,
                                     ONE_STEP_MODEL, timeout=120, join_timeout_s=60)
    finally:
        for transport in transports.values():
            transport.close()
    elapsed = time.monotonic() - started
    assert launch.first_failure == "node2" and launch.results["node2"].failure == "unreachable"
    assert "node1" in launch.killed  # its torchrun was waiting for node2 to join: stopped at once
    assert elapsed < 45, f"took {elapsed:.0f} s; the rendezvous waits 60 s"
    assert launch.leftovers == {}
    assert wait_for_no_leftovers(launch.marker) == []
