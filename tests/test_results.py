"""What results.json decides once, for every rendering: the outliers among per-node figures and
the state of the cluster-wide checks."""
from __future__ import annotations

from pathlib import Path

import pytest

from reports.ledger import RunRecord
from reports.results import DEFAULT_OUTLIER_RULE, outliers, unlocked_nodes
from reports.verdict import cluster_status


def entry(node, value, *, check="stress_ng", name="stress_cpu_bogo_ops", band=(100.0, None),
          unit="bogo ops/s", outcome="passed") -> dict:
    metric = {"name": name, "value": value, "unit": unit, "band": list(band) if band else None}
    return {"check": check, "node": node, "outcome": outcome, "metrics": [metric]}


def test_a_node_far_below_its_peers_is_an_outlier_even_inside_its_band():
    checks = [entry(f"n{i}", 1000.0) for i in range(1, 6)] + [entry("n6", 800.0)]
    [found] = outliers(checks)
    assert found == {"check": "stress_ng", "metric": "stress_cpu_bogo_ops", "node": "n6", "value": 800.0,
                     "unit": "bogo ops/s", "median": 1000.0, "deviation": -0.2,
                     "rule": "robust z above 3.5 and more than 10% below the median of 6 nodes "
                             "(scaled MAD 0 bogo ops/s)",
                     "robust_z": None, "severity": "warning"}


def test_only_the_side_the_band_bounds_is_bad():
    faster = [entry(f"n{i}", 1000.0) for i in range(1, 5)] + [entry("n5", 1500.0)]
    assert outliers(faster) == []  # a floor: being fast is no fault
    latency = [entry(f"n{i}", 10.0, name="lat", band=(None, 20.0)) for i in range(1, 5)]
    slow, quick = entry("n5", 13.0, name="lat", band=(None, 20.0)), entry("n6", 5.0, name="lat", band=(None, 20.0))
    assert [o["node"] for o in outliers(latency + [slow, quick])] == ["n5"]


def test_two_sided_metrics_are_judged_on_both_sides_worst_first():
    """A band with both bounds, in a unit that is neither a rate nor a time: both sides are bad."""
    checks = [entry(f"n{i}", 50.0, band=(10.0, 90.0), unit="count") for i in range(1, 5)]
    checks += [entry("n5", 70.0, band=(10.0, 90.0), unit="count"), entry("n6", 38.0, band=(10.0, 90.0), unit="count")]
    found = outliers(checks)
    assert [(o["node"], o["deviation"]) for o in found] == [("n5", 0.4), ("n6", -0.24)]
    assert found[0]["rule"] == "robust z above 3.5 and more than 10% from the median of 6 nodes (scaled MAD 0 count)"
    unbounded = [{**c, "metrics": [{**c["metrics"][0], "band": None}]} for c in checks]
    assert outliers(unbounded) == []  # no band, and a count says nothing of which side is bad


def test_no_outliers_without_enough_nodes_or_a_median_or_a_node():
    assert outliers([entry("n1", 1000.0), entry("n2", 10.0)]) == []
    assert outliers([entry(f"n{i}", 0.0) for i in range(1, 4)] + [entry("n4", 5.0)]) == []
    cluster_and_pairs = [entry(None, v) for v in (1000.0, 1000.0, 1000.0, 10.0)]
    assert outliers(cluster_and_pairs) == []


def test_a_tight_fleet_flags_nothing():
    checks = [entry(f"n{i}", 1000.0 * (1 - DEFAULT_OUTLIER_RULE.min_deviation / 2) ** (i % 2)) for i in range(1, 17)]
    assert outliers(checks) == []


def test_unmeasured_and_non_numeric_figures_are_left_out():
    checks = [entry(f"n{i}", 1000.0) for i in range(1, 4)] + [entry("n4", None), entry("n5", float("nan"))]
    checks.append(entry("n6", True))
    assert outliers(checks) == []


@pytest.mark.parametrize("outcomes, status", [
    ([], None), (["passed"], "passed"), (["passed", "skipped"], "incomplete"),
    (["skipped", "failed"], "failed"), (["error"], "failed"),
])
def test_cluster_checks_status(outcomes, status):
    assert cluster_status([{"outcome": outcome} for outcome in outcomes]) == status


def test_unlocked_nodes_are_those_tested_without_their_lock_in_any_session():
    """A resumed run has a locks entry per session: a node tested unlocked in one stays listed
    (with its latest reason); a node refused as busy, or not reached at all, was not tested; an
    entry written before those were recorded cannot tell them from tested, and is left out."""
    record = RunRecord(Path("run"), header={"nodes": ["n1", "n2", "n3", "n4", "n5"]}, locks=[
        {"type": "locks", "held": ["n2"], "not_held": {"n1": "n1 is in use by run A", "n4": "n4: no flock",
                                                       "n5": "n5 not locked: n5 unreachable: lost at 10:00:03"},
         "refused": ["n4"], "not_reached": ["n5"]},
        {"type": "locks", "held": ["n1", "n4"], "not_held": {"n2": "n2 not locked: flock timed out"},
         "refused": [], "not_reached": []},
        {"type": "locks", "held": [], "not_held": {"n3": "n3 is in use by run B"}},  # before both
    ])
    assert unlocked_nodes(record) == [{"node": "n1", "reason": "n1 is in use by run A"},
                                      {"node": "n2", "reason": "n2 not locked: flock timed out"}]
