"""Bad-node isolation inside the DDP training across nodes: the pieces without nodes (the short
run's sanity, a run's outcome, the judgement with the verdict), then the training suite on four
namespace nodes, one of them behind a slow link, as an operator meets it."""
from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from test_e2e import results_of, run_dir_of, run_suites

from handover.failures import CommandTimedOut, PerformanceFailure, SanityFailure
from inventory.loader import load_profile
from runners import isolation, training
from suites.checks import Metrics, band_low, isolation_outcome, judge_isolated

TRAINING = Path(__file__).parent / "data" / "training"


def test_a_short_run_is_sane_without_showing_that_it_learns():
    """Ten steps time the throughput but are too few to halve the loss; every rank and every
    step are still required."""
    report = training.parse_training((TRAINING / "cpu-2ranks.stdout").read_text())
    flat = replace(report, losses=[report.losses[0]] * len(report.losses))
    assert training.why_not_sane(flat, 2).startswith("the loss fell from 6.26 to 6.26 in 30 steps")
    assert training.why_not_sane(flat, 2, learning=False) is None
    assert training.why_not_sane(flat, 4, learning=False) == "2 of 4 rank(s) reported"


def test_a_run_without_a_figure_says_why_and_whether_the_budget_cut_it():
    assert isolation_outcome(87.5, None, 30, 600) == isolation.Outcome(87.5)
    timed_out = CommandTimedOut("node3: timed out after 30 s\nlog")
    assert isolation_outcome(None, timed_out, 30, 600) == isolation.Outcome(None, "node3: timed out after 30 s", True)
    assert not isolation_outcome(None, timed_out, 600, 600).cut  # its own timeout: says something
    assert not isolation_outcome(None, SanityFailure("rank 1 failed"), 30, 600).cut


def test_a_miss_carries_the_verdict_and_the_isolation_figures_are_judged():
    profile = load_profile("cpu-only")
    assert band_low(profile, "allreduce_busbw_cluster", "GB/s") == 0.05
    assert band_low(profile, "allreduce_busbw_cluster", "%") is None and band_low(profile, "nothing", "%") is None
    plan = isolation.Isolation(["a", "b"], 0.05, cluster=isolation.Outcome(0.01))
    rows: list[dict] = []
    metrics = Metrics("allreduce_cluster", profile, rows.extend)
    with pytest.raises(PerformanceFailure) as miss:
        judge_isolated(metrics, plan.verdict(), allreduce_busbw_cluster=(0.01, "GB/s"))
    assert str(miss.value).startswith("allreduce_busbw_cluster = 0.01 GB/s, expected >= 0.05 GB/s; "
                                      "no single node isolated; band >= 0.05 GB/s; cleared 0 of 2 node(s)")
    assert [row["name"] for row in rows] == ["allreduce_busbw_cluster", "isolation_time", "isolation_rounds",
                                             "isolated_nodes"]
    with pytest.raises(PerformanceFailure, match=r"^allreduce_busbw_cluster = 0.01 GB/s, expected >= 0.05 GB/s$"):
        judge_isolated(metrics, None, allreduce_busbw_cluster=(0.01, "GB/s"))


# ---------------------------------------------------------------------------------------------
# Four namespace nodes, one slow


SLOW_NODE = "node3"
# 20 Mbit/s into one node: a DDP step of the CPU model moves about 3 MB through each node's link,
# so the 4 nodes together measured 11-19 % and every pair with node3 14-24 %. Healthy, the 4
# together measured 92 %, pairs 56-116 % (2 shared cores, beside other work), and a healthy pair
# beside node3's 120-244 % (node3's ranks wait on the link and leave it the cores).
SLOW_RATE = "20mbit"
BAND = {"check": "training_scaling", "value": 80, "lower": -0.5, "upper": None, "unit": "%",
        "source": "test: 4 healthy namespace nodes measured 92 % together, 56-116 % in pairs"}


@pytest.fixture
def four_nodes_one_slow(ns_cluster_factory):
    """Four namespace nodes, node3's bridge-side veth limited by tbf."""
    pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")
    cluster = ns_cluster_factory(4)
    subprocess.run(["tc", "qdisc", "add", "dev", cluster.node(SLOW_NODE).veth_host, "root", "tbf",
                    "rate", SLOW_RATE, "burst", "32kbit", "latency", "50ms"], check=True)
    return cluster


def test_a_slow_node_is_isolated_inside_the_training_across_nodes(four_nodes_one_slow, sign_key, tmp_path):
    inventory = four_nodes_one_slow.write_inventory(tmp_path / "cluster.yaml",
                                                    extra={"references": {"scaling_efficiency": BAND}})
    run_suites(inventory, tmp_path / "out", sign_key, "suites/test_training.py", "-m", "not full",
               "-k", "training_scaling", timeout=900)
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    [check] = [c for c in results_of(run_dir)["checks"] if c["check"] == "training_scaling"]
    message = check["message"]
    assert (check["outcome"], check["kind"]) == ("failed", "performance"), message
    assert message.startswith("scaling_efficiency = ") and "expected >= 40 %" in message
    assert re.findall(r"isolated (\w+)", message) == [SLOW_NODE], message
    # Screened with node4, confirmed beside a node cleared by its group's (or a pair's) run.
    assert re.search(r"isolated node3 \(cluster node1,node2,node3,node4 \d+\.\d %; screen node3,node4 \d+\.\d %; "
                     r".*confirm node3 with node[124] \d+\.\d %\)", message), message
    assert "cleared 3 of 4 node(s)" in message and "not finished" not in message
    figures = {m["name"]: m["value"] for m in check["metrics"]}
    # Two rounds (screen, confirm); a third when a healthy pair beside other work misses the band
    # and the suspects are paired with each other first.
    assert figures["isolated_nodes"] == 1 and 2 <= figures["isolation_rounds"] <= 3
    assert figures["isolation_time"] <= isolation.DEFAULT_BUDGET_S  # cpu-only leaves the default
    [steps] = [s for s in check["series"] if s["name"] == "training isolation efficiency"]
    assert {"cluster", "screen", "confirm"} <= {line["label"] for line in steps["lines"]}
    assert steps["y_unit"] == "%"
    assert {"raw/training_isolation_round1/node1.command", "raw/training_isolation_round2/node3.command"} \
        <= set(check["raw"]) and (run_dir / "raw/training_isolation_round2/node3.command").is_file()
    page = (run_dir / "report.html").read_text()
    assert "training isolation efficiency" in page and "isolated node3" in page
