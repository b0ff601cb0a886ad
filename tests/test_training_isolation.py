"""Bad-node isolation inside the DDP training across nodes, the pieces without nodes: the short
run's sanity, a run's outcome, the judgement with the verdict. The training suite's own test
(tests/test_training_suite.py) isolates a real slow node."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

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
